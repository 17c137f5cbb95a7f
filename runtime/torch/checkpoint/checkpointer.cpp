#include "dtrain/torch/checkpoint.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/version.h>

#include "shard_entries.h"
#include "checkpointer_impl.h"
#include "dtrain/base/error.h"
#include "dtrain/base/logging.h"
#include "dtrain/base/store.h"
#include "dtrain/torch/zero.h"
#include "env_contract.h"
#include "parse_int.h"

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

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int64_t n = 0;
  return v && *v && parseInt64(v, &n) && n >= 0 ? static_cast<int>(n) : fallback;
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

bool allHostContiguous(const std::vector<checkpoint::Item>& items) {
  for (const auto& item : items) {
    if (item.tensor.defined() && (!item.tensor.device().is_cpu() || !item.tensor.is_contiguous())) {
      return false;
    }
  }
  return true;
}

const void* hostData(const checkpoint::Item& item) {
  if (item.spec.kind == checkpoint::Kind::String || item.spec.kind == checkpoint::Kind::Bytes) {
    return item.bytes.empty() ? nullptr : item.bytes.data();
  }
  return item.tensor.numel() ? item.tensor.data_ptr() : nullptr;
}

}  // namespace

bool stopRequested() { return gStop.load(); }
void requestStop() { gStop.store(true); }
void clearStopRequest() { gStop.store(false); }

Checkpointer::Impl::Impl(Checkpointer& o, std::shared_ptr<ProcessGroup> g,
                         const CheckpointOptions& opts)
    : owner(o), group(std::move(g)), options(opts) {
  rank = group->rank();
  world = group->size();
  // The node's stable id (env::kNodeId), which an elastic re-rendezvous does not change, so the
  // node keeps its directory; GROUP_RANK where the launcher exports none (torchrun).
  nodeId = options.nodeId >= 0 ? options.nodeId
                               : envInt(env::kNodeId, envInt(env::kGroupRank, 0));
  localRank = options.localRank >= 0 ? options.localRank : group->localRank();
  ops = std::make_shared<checkpoint::FileOps>(fault::IoFaultInjector::fromEnv(rank));
  scratch = std::make_shared<std::vector<uint8_t>>();
}

std::vector<int64_t> Checkpointer::Impl::allgather(int64_t value) {
  if (world == 1) return {value};
  at::Tensor t = at::full({1}, value, at::kLong).to(group->device());
  std::vector<int64_t> out;
  for (const auto& v : group->allgather(t)) out.push_back(v.cpu().item<int64_t>());
  return out;
}

std::vector<std::vector<uint8_t>> Checkpointer::Impl::allgatherBytes(const std::vector<uint8_t>& mine) {
  if (world == 1) return {mine};
  auto lengths = allgather(static_cast<int64_t>(mine.size()));
  int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  at::Tensor buf = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  if (!mine.empty()) std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  auto all = group->allgather(buf.to(group->device()));
  std::vector<std::vector<uint8_t>> out;
  for (int r = 0; r < world; ++r) {
    at::Tensor host = all[r].cpu();
    const auto* p = host.data_ptr<uint8_t>();
    out.emplace_back(p, p + lengths[r]);
  }
  return out;
}

checkpoint::Millis Checkpointer::Impl::deadline() const {
  const checkpoint::Millis grace = std::clamp<checkpoint::Millis>(
      options.timeout / 2, std::chrono::seconds(1), std::chrono::seconds(60));
  return options.timeout + grace;
}

void Checkpointer::Impl::agree(const std::string& error, const std::string& what) {
  throwIfFailed(agreement->exchange(error.empty() ? 0 : 1, deadline(), what), 1, error, what);
}

void Checkpointer::Impl::throwIfFailed(const std::vector<checkpoint::Report>& reports,
                                       int64_t code, const std::string& mine,
                                       const std::string& what) {
  std::vector<std::string> others;
  bool any = false;
  for (const auto& r : reports) {
    if (r.code != code) continue;
    any = true;
    if (r.rank != rank) {
      others.push_back(fmt::format("rank {} (node {})", r.rank, nodeOf.empty() ? 0 : nodeOf[r.rank]));
    }
  }
  if (!any) return;
  auto list = [](const std::vector<std::string>& names) {
    if (names.size() < 2) return names.empty() ? std::string() : names[0];
    return fmt::format("{} and {}",
                       fmt::join(std::vector<std::string>(names.begin(), names.end() - 1), ", "),
                       names.back());
  };
  if (!mine.empty()) {
    DTRAIN_THROW(CheckpointError, "rank {}/{}: {} failed: {}{}", rank, world, what, mine,
                 others.empty() ? "" : fmt::format(" (it failed on {} too)", list(others)));
  }
  DTRAIN_THROW(CheckpointError, "rank {}/{}: {} failed on {}; see the error there", rank, world,
               what, list(others));
}

std::string Checkpointer::Impl::collectLocal() {
  try {
    thread.wait(options.timeout);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool Checkpointer::Impl::settleSaveThread() {
  if (thread.settle(options.timeout)) return true;
  DTRAIN_LOG(Warn, "rank {}: pruning old checkpoints in {} has not ended within {} ms", rank, dir,
             options.timeout.count());
  return false;
}

void Checkpointer::Impl::waitPending() {
  if (pendingStep < 0) return;
  std::string error = pendingError;
  if (started && error.empty()) error = collectLocal();
  started = false;
  int64_t step = pendingStep;
  pendingStep = -1;
  pendingError.clear();
  agree(error, fmt::format("the checkpoint of step {}", step));
  if (sharded()) moveLatestEverywhere(step);
  committedStep = step;
}

void Checkpointer::Impl::settleShardedParameters() {
  for (const auto& s : registry.sharded) s.optimizer->waitForParameters();
}

// A save, on every rank, in four steps:
//   1. agree: the previous asynchronous save is confirmed on every node (or its error thrown);
//      a step that every node holds already is done;
//   2. gather: every rank's own state goes to its node's writer (one allgather);
//   3. write and commit: the writer writes `step-N` on the save thread
//      (checkpoint::writeAndCommit), then, once the waiter has been released, prunes;
//   4. agree again that every node committed (Note [Checkpoint agreement]): at once for save(),
//      at the next save, wait() or preempted() for saveAsync().
void Checkpointer::Impl::save(int64_t step, int64_t epoch, bool async) {
  DTRAIN_CHECK_ARG(step >= 0 && epoch >= 0, "Checkpointer: step {} and epoch {} must be >= 0", step,
                   epoch);
  if (started && idleClassSaves && thread.running()) {
    // See Note [Background saves yield].
    idleClassSaves = false;
    DTRAIN_LOG(Info, "rank {}: the asynchronous save of step {} was still running when the save "
               "of step {} began: this machine leaves its idle-class thread too little CPU, so "
               "later asynchronous saves run at nice +10", rank, pendingStep, step);
  }
  waitPending();
  settleShardedParameters();
  if (step == committedStep) {
    // saveAsync(S) then preempted(S), or save(S) right after restoring S: every node holds S
    // complete, and writing it again would only spend the grace period (and rename over it).
    DTRAIN_LOG(Info, "rank {}: step {} is committed on every node already; not writing it again",
               rank, step);
    return;
  }
  auto blobs = allgatherBytes(checkpoint::encodeRankState(registry));
  if (sharded()) shards = exchangeShards();  // See Note [Sharded checkpoint files].
  const std::string error = writer ? startWrite(step, epoch, async, blobs) : std::string();
  pendingStep = step;
  pendingError = error;
  if (!async) waitPending();
}

std::string Checkpointer::Impl::startWrite(int64_t step, int64_t epoch, bool async,
                                           const std::vector<std::vector<uint8_t>>& blobs) {
  if (!thread.idle() && !thread.running()) {
    // A save that timed out earlier has finished since: collect it before starting another.
    std::string late = collectLocal();
    DTRAIN_LOG(Warn, "rank {}: a save that timed out earlier has ended{}", rank,
               late.empty() ? " successfully" : ": " + late);
  }
  if (thread.running()) {
    // An earlier save timed out and is still stuck in the kernel: its buffer is not free.
    return fmt::format("an earlier save into {} is still running (it timed out and never "
                       "finished); not starting another. HINT: check the disk or filesystem",
                       dir);
  }
  if (!settleSaveThread()) {
    return fmt::format("deleting old checkpoints in {} after the last save has not ended within "
                       "{} ms; not starting another. HINT: check the disk or filesystem",
                       dir, options.timeout.count());
  }
  try {
    auto items = itemsToSave(blobs);
    std::vector<checkpoint::EntrySpec> specs;
    for (const auto& item : items) specs.push_back(item.spec);
    auto layout = std::make_shared<checkpoint::Layout>(checkpoint::planLayout(
        step, epoch, static_cast<uint32_t>(world), TORCH_VERSION, specs));
    const bool snapshot = async || !allHostContiguous(items);
    // Note [Hashing beside the write]: a second thread only when the caller waits for the save.
    const auto hashing = async ? checkpoint::Hashing::Inline : checkpoint::Hashing::Beside;
    startSaveThread(step, snapshot ? snapshotWrite(layout, items, hashing)
                                   : directWrite(layout, items), async);
    started = true;
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::vector<checkpoint::Item> Checkpointer::Impl::itemsToSave(
    const std::vector<std::vector<uint8_t>>& blobs) {
  auto items = checkpoint::replicatedItems(registry, owner.metadata_);
  for (int r = 0; r < world; ++r) {
    auto own = checkpoint::rankItems(static_cast<uint32_t>(r), blobs[r]);
    items.insert(items.end(), std::make_move_iterator(own.begin()),
                 std::make_move_iterator(own.end()));
  }
  if (sharded()) {
    auto replicated = checkpoint::shardedReplicatedItems(registry.sharded);
    items.insert(items.end(), std::make_move_iterator(replicated.begin()),
                 std::make_move_iterator(replicated.end()));
    const checkpoint::ModuleShards freed = checkpoint::moduleShards(registry);
    for (const auto& [owner, blob] : std::exchange(shards, {})) {
      auto kept = checkpoint::shardItems(static_cast<uint32_t>(owner),
                                         static_cast<uint32_t>(world), blob, freed);
      items.insert(items.end(), std::make_move_iterator(kept.begin()),
                   std::make_move_iterator(kept.end()));
    }
  }
  return items;
}

Checkpointer::Impl::FileWrite Checkpointer::Impl::snapshotWrite(
    const std::shared_ptr<checkpoint::Layout>& layout, const std::vector<checkpoint::Item>& items,
    checkpoint::Hashing hashing) {
  // Snapshot into the reused region: the training thread's only cost of an async save.
  // The region starts where its bulk can be written with O_DIRECT (Note [Direct writes]).
  const uint64_t bytes =
      std::max<uint64_t>(layout->header.dataSize, 1) + checkpoint::kDirectAlignment;
  if (!region.defined() || static_cast<uint64_t>(region.numel()) < bytes) {
    auto options = at::TensorOptions().dtype(at::kByte);
    region = at::empty({static_cast<int64_t>(bytes + bytes / 8)}, options);
    if (group->device().is_cuda()) region = region.pin_memory();
    region.zero_();  // pre-fault: first touch of fresh pages is what costs
  }
  uint8_t* base = checkpoint::directRegionStart(static_cast<uint8_t*>(region.data_ptr()),
                                                layout->header.dataOffset);
  at::NoGradGuard noGrad;
  auto copy = [&](size_t i) {
    const auto& e = layout->entries[i];
    uint8_t* dst = base + (e.offset - layout->header.dataOffset);
    uint64_t next = i + 1 < items.size() ? layout->entries[i + 1].offset : layout->header.manifestOffset;
    const at::Tensor& t = items[i].tensor;
    if (t.defined() && !(t.device().is_cpu() && t.is_contiguous())) {
      at::from_blob(dst, t.sizes(), t.options().device(at::kCPU)).copy_(t);
    } else if (e.size) {
      std::memcpy(dst, hostData(items[i]), e.size);
    }
    std::memset(dst + e.size, 0, next - e.offset - e.size);
  };
  if (allHostContiguous(items)) {
    // Training waits for this copy: spread it over the program's thread budget.
    checkpoint::forEachSpread(
        items.size(), [&](size_t i) { return layout->entries[i].size; }, copy);
  } else {
    for (size_t i = 0; i < items.size(); ++i) copy(i);
  }
  at::Tensor keep = region;
  auto ops_ = ops;
  return [ops_, layout, keep, base, hashing](const std::string& tmp,
                                             checkpoint::SaveProgress* progress) {
    checkpoint::writeCheckpointFileFromRegion(*ops_, tmp, *layout, base, progress, hashing);
  };
}

Checkpointer::Impl::FileWrite Checkpointer::Impl::directWrite(
    const std::shared_ptr<checkpoint::Layout>& layout, std::vector<checkpoint::Item>& items) {
  auto held = std::make_shared<std::vector<checkpoint::Item>>(std::move(items));
  auto ops_ = ops;
  auto scratch_ = scratch;
  return [ops_, layout, held, scratch_](const std::string& tmp, checkpoint::SaveProgress* progress) {
    checkpoint::EntryData data;
    for (const auto& item : *held) data.push_back(hostData(item));
    checkpoint::writeCheckpointFile(*ops_, tmp, *layout, data, *scratch_, progress);
  };
}

void Checkpointer::Impl::startSaveThread(int64_t step, FileWrite write, bool background) {
  auto ops_ = ops;
  std::string dir_ = dir;
  int keep = options.keepLast;
  auto log = writes;
  const bool latest = !sharded();  // a sharded save moves LATEST after the agreement
  const bool idle = background && idleClassSaves;
  auto job = [ops_, dir_, step, write, log, background, idle,
              latest](checkpoint::SaveProgress& progress) {
    // See Note [Background saves yield].
    const bool ranIdle = idle && checkpoint::moveThisThreadToIdleClass();
    if (background && !ranIdle) checkpoint::lowerThisThreadsPriority();
    const auto begin = std::chrono::steady_clock::now();
    checkpoint::writeAndCommit(
        *ops_, dir_, step, [&](const std::string& tmp) { write(tmp, &progress); }, &progress,
        latest);
    CheckpointWrite done;
    done.step = step;
    done.idleClass = ranIdle;
    done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    std::error_code ec;
    const auto size = std::filesystem::file_size(dir_ + "/" + checkpoint::stepFileName(step), ec);
    done.bytes = ec ? 0 : static_cast<uint64_t>(size);
    std::lock_guard<std::mutex> lock(log->mutex);
    log->finished.push_back(done);
  };
  // Pruning is nobody's wait: it runs after the commit has released save(), wait() or the next
  // save's agreement (Note [Checkpoint directory], step 4).
  auto prune = [dir_, keep, step] { checkpoint::pruneCheckpoints(dir_, keep, step); };
  thread.start(fmt::format("the checkpoint of step {} into {}", step, dir), job, prune);
}

void Checkpointer::Impl::place() {
  auto nodes = allgather(nodeId);
  auto locals = allgather(localRank);
  nodeOf.assign(nodes.begin(), nodes.end());
  for (int r = 0; r < world; ++r) {
    if (locals[r] != 0) continue;
    auto [it, fresh] = writerOf.emplace(static_cast<int>(nodes[r]), r);
    DTRAIN_CHECK_ARG(fresh, "Checkpointer: ranks {} and {} both say they are local rank 0 of node {}",
                     it->second, r, nodes[r]);
  }
  for (int r = 0; r < world; ++r) {
    DTRAIN_CHECK_ARG(writerOf.count(static_cast<int>(nodes[r])),
                     "Checkpointer: node {} (rank {}) has no local rank 0 to write its checkpoints. "
                     "HINT: {} (or GROUP_RANK) and LOCAL_RANK must describe the job as launch sets "
                     "them",
                     nodes[r], r, env::kNodeId);
  }
  writer = localRank == 0;
  // One key prefix per Checkpointer of the job: rank 0 draws it from the store, the others learn
  // it here; no store on rank 0 (a group made over a bare communicator): the collectives.
  auto store = options.store ? options.store : group->store();
  const int64_t drawn = store && rank == 0 ? store->add("checkpoint/instances", 1) : 0;
  const int64_t instance = allgather(drawn)[0];
  if (instance > 0) {
    DTRAIN_CHECK_ARG(store != nullptr,
                     "Checkpointer: rank 0 agrees through a store and rank {} has none. HINT: "
                     "pass the same CheckpointOptions::store on every rank",
                     rank);
    agreement = std::make_unique<checkpoint::StoreAgreement>(
        store, fmt::format("checkpoint/{}", instance), rank, world);
  } else {
    agreement = collectiveAgreement(group);
  }
}

Checkpointer::Checkpointer(std::shared_ptr<ProcessGroup> group, CheckpointOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  DTRAIN_CHECK_ARG(group_ != nullptr, "Checkpointer needs a process group");
  DTRAIN_CHECK_ARG(!options_.directory.empty(),
                   "Checkpointer: CheckpointOptions::directory is empty. HINT: name a directory; "
                   "each node writes into <directory>/node<ID>");
  DTRAIN_CHECK_ARG(options_.keepLast >= 2,
                   "Checkpointer: keepLast {} must be at least 2 (a save in progress must never "
                   "leave fewer than one complete checkpoint besides it)",
                   options_.keepLast);
  DTRAIN_CHECK_ARG(options_.timeout.count() > 0, "Checkpointer: timeout must be positive");
  impl_ = std::make_unique<Impl>(*this, group_, options_);
  Impl& m = *impl_;
  m.place();
  nodeDir_ = nodeDirectoryFor(options_.directory, m.nodeId);
  m.dir = nodeDir_;
  std::string error;
  if (m.writer) {
    try {
      checkpoint::makeDirectories(*m.ops, nodeDir_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  m.agree(error, "creating the checkpoint directory");
  if (options_.handlePreemption) {
    installTermHandler();
    m.signalInstalled = true;
  }
}

Checkpointer::~Checkpointer() {
  if (!impl_) return;
  if (impl_->started) {
    // Local only: a collective here could hang a rank that is unwinding from an error.
    std::string error = impl_->collectLocal();
    if (!error.empty()) DTRAIN_LOG(Error, "rank {}: {}", impl_->rank, error);
  }
  if (impl_->signalInstalled) uninstallTermHandler();
}

void Checkpointer::addModule(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  DTRAIN_CHECK_ARG(module != nullptr, "Checkpointer::addModule(\"{}\"): null module", name);
  for (const auto& m : impl_->registry.modules) {
    DTRAIN_CHECK_ARG(m.first != name, "Checkpointer: a module named \"{}\" is registered already", name);
  }
  impl_->registry.modules.emplace_back(name, std::move(module));
}

void Checkpointer::addOptimizer(const std::string& name, torch::optim::Optimizer& optimizer) {
  for (const auto& m : impl_->registry.optimizers) {
    DTRAIN_CHECK_ARG(m.first != name, "Checkpointer: an optimizer named \"{}\" is registered already", name);
  }
  for (const auto& m : impl_->registry.sharded) {
    DTRAIN_CHECK_ARG(m.name != name, "Checkpointer: an optimizer named \"{}\" is registered already", name);
  }
  // Sharded state is saved as shard records, never gathered (Note [Sharded checkpoint files]);
  // at stage 3 so are the parameters its units free (Note [Stage-3 checkpoints]).
  if (auto* zero = dynamic_cast<ShardedOptimizer*>(&optimizer)) {
    impl_->registry.sharded.push_back({name, zero});
    checkpoint::addShardedParams(impl_->registry, name, *zero);
    return;
  }
  impl_->registry.optimizers.emplace_back(name, &optimizer);
}

void Checkpointer::addScheduler(const std::string& name, torch::optim::LRScheduler& scheduler) {
  for (const auto& m : impl_->registry.schedulers) {
    DTRAIN_CHECK_ARG(m.first != name, "Checkpointer: a scheduler named \"{}\" is registered already", name);
  }
  impl_->registry.schedulers.emplace_back(name, &scheduler);
}

void Checkpointer::addScaler(const std::string& name, GradScaler& scaler) {
  for (const auto& m : impl_->registry.scalers) {
    DTRAIN_CHECK_ARG(m.first != name, "Checkpointer: a scaler named \"{}\" is registered already", name);
  }
  impl_->registry.scalers.emplace_back(name, &scaler);
}

void Checkpointer::addSampler(const std::string& name, DistributedSampler& sampler,
                              std::function<size_t()> consumed) {
  for (const auto& m : impl_->registry.samplers) {
    DTRAIN_CHECK_ARG(m.name != name, "Checkpointer: a sampler named \"{}\" is registered already",
                     name);
  }
  impl_->registry.samplers.push_back({name, &sampler, std::move(consumed)});
}

void Checkpointer::setMetadata(const std::string& key, MetadataValue value) {
  DTRAIN_CHECK_ARG(!key.empty(), "Checkpointer::setMetadata: empty key");
  if (auto* t = std::get_if<at::Tensor>(&value)) {
    DTRAIN_CHECK_ARG(t->defined(), "Checkpointer::setMetadata(\"{}\"): undefined tensor", key);
    value = t->detach().cpu().contiguous();
  }
  metadata_[key] = std::move(value);
}

std::optional<RestoredCheckpoint> Checkpointer::restore() { return impl_->restore(); }

void Checkpointer::save(int64_t step, int64_t epoch) { impl_->save(step, epoch, /*async=*/false); }

void Checkpointer::saveAsync(int64_t step, int64_t epoch) { impl_->save(step, epoch, /*async=*/true); }

void Checkpointer::wait() { impl_->waitPending(); }

bool Checkpointer::preempted(int64_t step, int64_t epoch) {
  int64_t flag = stopRequested() ? 1 : 0;
  if (impl_->world > 1) {
    at::Tensor t = at::full({1}, flag, at::kLong).to(group_->device());
    group_->allreduce(t, ReduceOp::Max);
    flag = t.cpu().item<int64_t>();
  }
  if (!flag) return false;
  if (impl_->rank == 0) {
    DTRAIN_LOG(Warn, "rank 0: a stop was requested (SIGTERM or requestStop()) on {}; every rank "
               "checkpoints step {} and stops", stopRequested() ? "this rank" : "another rank", step);
  }
  save(step, epoch);
  return true;
}

std::vector<CheckpointWrite> Checkpointer::finishedWrites() {
  std::lock_guard<std::mutex> lock(impl_->writes->mutex);
  return std::exchange(impl_->writes->finished, {});
}

std::vector<int64_t> Checkpointer::committedSteps() const {
  impl_->settleSaveThread();  // what the last commit left, pruned
  return checkpoint::listDirectory(nodeDir_).steps;
}

}  // namespace dtrain
