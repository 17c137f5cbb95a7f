#include "dtrain/torch/checkpoint.h"

#include <signal.h>

#include <atomic>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>

#include "checkpointer_impl.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"

// Note [Preemption]
// A spot machine gets SIGTERM some seconds to minutes before it goes; `launch` forwards it to
// every worker of its node. The handler a Checkpointer installs only sets a flag. At the next
// step boundary, preempted() combines the flags of all ranks with one MAX allreduce, so every
// rank sees the same answer at the same step even when the signal reached only one node (or
// reached the ranks at different moments): then they all save that step, wait until every node
// committed it, and the program returns kExitPreempted (75), which launch passes on when every
// worker exits with it. Rerunning the same command resumes from that step. The save must fit in
// launch's grace period (--grace-period, 30 s by default) before SIGKILL follows. A SIGTERM
// handler the program installed before the Checkpointer is still called, after the flag is set;
// the previous disposition comes back when the last Checkpointer goes.

// Note [A Checkpointer follows its group's epoch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under `launch --on-node-loss continue` the group re-forms in memory among the survivors of a
// lost node (ProcessGroup::reform): its rank and size change, its communicator is another one.
// What a Checkpointer learnt about the world at construction -- this rank and the world size,
// which node each rank is on and who writes its directory, the agreement's store keys sized for
// the old world, ZeRO's shard keepers -- is then stale; used as it is, the next save would wait
// for ranks that are gone. So every call that makes collectives (save, saveAsync, wait,
// preempted, restore) first compares the group's epoch with the one it placed the ranks in;
// when it moved, every survivor places them again (one allgather round and a fresh agreement
// prefix) and settles an asynchronous save still pending from the old world: its writers are
// waited for and the survivors agree on it among themselves. A node lost while it wrote leaves
// only a temporary file in its own directory (writeAndCommit renames after the fsync), which
// restores skip and its next save removes; its LATEST still names its last complete
// checkpoint; and the survivors' copies of that step are complete, each holding the whole
// replicated state and every old rank's own. The next save is one of the new world size. A
// node lost during a save's own collectives ends that call with MembershipChanged like any
// collective, and an agreement on the store never waits for a lost node past the abort (Note
// [Agreements a lost node cannot hold up], placement.cpp): call save() and saveAsync() inside
// TrainingState::tryStep's work, so that such a failure discards the step and the call is made
// again in the new world (docs/training.md, "Surviving a lost node").

namespace dtrain {

namespace {

std::atomic<bool> gStop{false};
std::mutex gSignalMutex;
int gSignalUsers = 0;
struct sigaction gPreviousTerm {};

// Sets the flag, then calls a handler the program had installed before (not the default action,
// which would end the process before the checkpoint).
void onTerm(int signo, siginfo_t* info, void* context) {
  gStop.store(true);
  if (gPreviousTerm.sa_flags & SA_SIGINFO) {
    if (gPreviousTerm.sa_sigaction) gPreviousTerm.sa_sigaction(signo, info, context);
  } else if (gPreviousTerm.sa_handler != SIG_DFL && gPreviousTerm.sa_handler != SIG_IGN) {
    gPreviousTerm.sa_handler(signo);
  }
}

void installTermHandler() {
  std::lock_guard<std::mutex> lock(gSignalMutex);
  if (gSignalUsers++ > 0) return;
  struct sigaction sa {};
  sa.sa_sigaction = onTerm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  ::sigaction(SIGTERM, &sa, &gPreviousTerm);
}

void uninstallTermHandler() {
  std::lock_guard<std::mutex> lock(gSignalMutex);
  if (--gSignalUsers > 0) return;
  ::sigaction(SIGTERM, &gPreviousTerm, nullptr);
}

std::string nodeDirectoryFor(const std::string& directory, int node) {
  size_t at = directory.find("{node}");
  if (at != std::string::npos) {
    return directory.substr(0, at) + std::to_string(node) + directory.substr(at + 6);
  }
  std::string d = directory;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d + "/node" + std::to_string(node);
}

// A Checkpointer built from a group registers into a TrainingState of its own.
std::shared_ptr<TrainingState> ownState(std::shared_ptr<ProcessGroup> group) {
  DTRAIN_CHECK_ARG(group != nullptr, "Checkpointer needs a process group");
  return std::make_shared<TrainingState>(std::move(group));
}

}  // namespace

bool stopRequested() { return gStop.load(); }
void requestStop() { gStop.store(true); }
void clearStopRequest() { gStop.store(false); }

Checkpointer::Impl::Impl(std::shared_ptr<ProcessGroup> group, const CheckpointOptions& opts,
                         state::Registry& registered)
    : options(opts),
      placement(std::move(group), options),
      dir(nodeDirectoryFor(options.directory, placement.nodeId)),
      ops(std::make_shared<checkpoint::FileOps>(fault::IoFaultInjector::fromEnv(placement.rank))),
      exchange(placement, registered, dir),
      saver(placement, exchange, registered, options, dir, ops),
      restorer(placement, saver, exchange, registered, options, dir, ops),
      epoch(placement.group->epoch()) {}

void Checkpointer::Impl::followEpoch() {
  const int now = placement.group->epoch();
  if (now == epoch) return;
  const int oldRank = placement.rank;
  const int oldWorld = placement.world;
  placement.refresh();
  exchange.reset();
  if (epoch < 0 && placement.writer) {
    // A rank that joined a running round: its node's directory, made here without an agreement
    // (the members make none now); a failure shows in the next save's.
    try {
      checkpoint::makeDirectories(*ops, dir);
    } catch (const std::exception& e) {
      DTRAIN_LOG(Error, "rank {}: {}", placement.rank, e.what());
    }
  }
  epoch = now;
  DTRAIN_LOG(Info,
             "rank {}/{}: the group re-formed in epoch {}: the checkpointer follows it (it was "
             "rank {}/{})",
             placement.rank, placement.world, now, oldRank, oldWorld);
  // An asynchronous save begun in the old world: agreed among the members left.
  saver.waitPending();
}

Checkpointer::Checkpointer(std::shared_ptr<ProcessGroup> group, CheckpointOptions options)
    : Checkpointer(ownState(std::move(group)), std::move(options)) {}

Checkpointer::Checkpointer(std::shared_ptr<TrainingState> state, CheckpointOptions options)
    : state_(std::move(state)), options_(std::move(options)) {
  DTRAIN_CHECK_ARG(state_ != nullptr, "Checkpointer needs a TrainingState");
  group_ = state_->group();
  DTRAIN_CHECK_ARG(!options_.directory.empty(),
                   "Checkpointer: CheckpointOptions::directory is empty. HINT: name a directory; "
                   "each node writes into <directory>/node<ID>");
  DTRAIN_CHECK_ARG(options_.keepLast >= 2,
                   "Checkpointer: keepLast {} must be at least 2 (a save in progress must never "
                   "leave fewer than one complete checkpoint besides it)",
                   options_.keepLast);
  DTRAIN_CHECK_ARG(options_.timeout.count() > 0, "Checkpointer: timeout must be positive");
  impl_ = std::make_unique<Impl>(group_, options_, state_->registry());
  Impl& m = *impl_;
  nodeDir_ = m.dir;
  auto handleTerm = [&] {
    if (!options_.handlePreemption) return;
    installTermHandler();
    m.signalInstalled = true;
  };
  if (group_->joinPending()) {
    // A rank taken into a running round (Note [Joining a running round] in
    // launcher/cluster/master/node_loss.h) makes no collective before the members have handed it
    // their state: it places the ranks at its first call after that, when the members place
    // them again after their re-form (followEpoch).
    m.epoch = -1;
    handleTerm();
    return;
  }
  m.placement.place();
  std::string error;
  if (m.placement.writer) {
    try {
      checkpoint::makeDirectories(*m.ops, nodeDir_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  m.placement.agree(error, "creating the checkpoint directory");
  handleTerm();
}

Checkpointer::~Checkpointer() {
  if (!impl_) return;
  if (impl_->saver.started()) {
    // Local only: a collective here could hang a rank that is unwinding from an error.
    std::string error = impl_->saver.collectLocal();
    if (!error.empty()) DTRAIN_LOG(Error, "rank {}: {}", impl_->placement.rank, error);
  }
  if (impl_->signalInstalled) uninstallTermHandler();
}

void Checkpointer::addModule(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  state_->addModule(name, std::move(module));
}

void Checkpointer::addOptimizer(const std::string& name, torch::optim::Optimizer& optimizer) {
  state_->addOptimizer(name, optimizer);
}

void Checkpointer::addScheduler(const std::string& name, torch::optim::LRScheduler& scheduler) {
  state_->addScheduler(name, scheduler);
}

void Checkpointer::addScaler(const std::string& name, GradScaler& scaler) {
  state_->addScaler(name, scaler);
}

void Checkpointer::addSampler(const std::string& name, DistributedSampler& sampler,
                              std::function<size_t()> consumed) {
  state_->addSampler(name, sampler, std::move(consumed));
}

void Checkpointer::setMetadata(const std::string& key, MetadataValue value) {
  state_->setMetadata(key, std::move(value));
}

std::optional<RestoredCheckpoint> Checkpointer::restore() {
  if (beforeJoinSettled("restore")) return std::nullopt;
  impl_->followEpoch();
  return impl_->restorer.restore();
}

// A rank taken into a running round holds nothing of its own to save before the members have
// handed it their state (its first tryStep), and they make no collective meanwhile: its calls
// before then are nothing (a stop request stays set for the next preempted()).
bool Checkpointer::beforeJoinSettled(const char* call) const {
  if (!group_->joinPending()) return false;
  DTRAIN_LOG(Warn,
             "rank {}: Checkpointer::{} before the first step of a rank taken into a running "
             "round does nothing (its state comes from the members at that step)",
             group_->rank(), call);
  return true;
}

void Checkpointer::save(int64_t step, int64_t epoch) {
  if (beforeJoinSettled("save")) return;
  impl_->followEpoch();
  impl_->saver.save(step, epoch, /*async=*/false);
}

void Checkpointer::saveAsync(int64_t step, int64_t epoch) {
  if (beforeJoinSettled("saveAsync")) return;
  impl_->followEpoch();
  impl_->saver.save(step, epoch, /*async=*/true);
}

void Checkpointer::wait() {
  if (beforeJoinSettled("wait")) return;
  impl_->followEpoch();
  impl_->saver.waitPending();
}

bool Checkpointer::preempted(int64_t step, int64_t epoch) {
  if (beforeJoinSettled("preempted")) return false;
  impl_->followEpoch();
  int64_t flag = stopRequested() ? 1 : 0;
  if (impl_->placement.world > 1) {
    at::Tensor t = at::full({1}, flag, at::kLong).to(group_->device());
    group_->allreduce(t, ReduceOp::Max);
    flag = t.cpu().item<int64_t>();
  }
  if (!flag) return false;
  if (impl_->placement.rank == 0) {
    DTRAIN_LOG(Warn,
               "rank 0: a stop was requested (SIGTERM or requestStop()) on {}; every rank "
               "checkpoints step {} and stops",
               stopRequested() ? "this rank" : "another rank", step);
  }
  save(step, epoch);
  return true;
}

std::vector<CheckpointWrite> Checkpointer::finishedWrites() {
  return impl_->saver.finishedWrites();
}

std::vector<int64_t> Checkpointer::committedSteps() const {
  impl_->saver.settleSaveThread();  // what the last commit left, pruned
  return checkpoint::listDirectory(nodeDir_).steps;
}

}  // namespace dtrain
