#pragma once
// Checkpointer: crash-safe checkpoints of a data-parallel job, and resume after a crash, a
// restart by `launch --max-restarts`, or a spot preemption (SIGTERM).
//
//   auto state = std::make_shared<dtrain::TrainingState>(group);  // what the job's state is
//   state->addModule("model", net);
//   state->addOptimizer("optimizer", optimizer);
//   state->addScaler("scaler", scaler);
//   state->addSampler("sampler", sampler);
//   dtrain::Checkpointer checkpointer(state, {"checkpoints"});   // directory; keepLast 3
//   int64_t start = 0;
//   if (auto restored = checkpointer.restore()) start = restored->step + 1;   // collective
//   for (int64_t step = start; step < steps; ++step) {
//     state->beginStep(step);
//     ...train one step...
//     if (step % 100 == 0) checkpointer.saveAsync(step);       // or save(step): collective
//     if (checkpointer.preempted(step)) return dtrain::kExitPreempted;  // SIGTERM: saved, exit 75
//   }
//
// What a checkpoint holds -- what a TrainingState registered (dtrain/torch/training_state.h; a
// Checkpointer built from a group has a TrainingState of its own): the registered modules'
// parameters and buffers; optimizers' state (SGD momentum; Adam/AdamW moments and step counts;
// Adagrad, RMSprop) and learning rates; LR schedulers' positions; GradScalers; samplers'
// positions; user metadata (key -> string, number or tensor); the step and epoch; and every
// rank's own state -- its CPU (and CUDA) random generators and its samplers' positions --
// gathered into it.
//
// Where and how (docs/design.md "Checkpoints"): each node's local
// rank 0 writes a complete copy into its own directory, `<directory>/node<ID>`, ID being the
// node's stable id (DTRAIN_NODE_ID, which launch exports; GROUP_RANK without it), so no shared
// filesystem is needed, nodes sharing one never write the same file, and a node keeps its
// directory when an elastic job re-forms: `step-N.tmp`, fsync, rename to `step-N`, fsync the
// directory, then `LATEST` the same way; the ranks then confirm through the job's store that
// every node committed. Old checkpoints beyond keepLast are deleted only after a new commit, once
// save() has returned. The file format (one file, a versioned header, a checksummed manifest,
// aligned data) is documented in docs/checkpoint-format.md and is read back straight
// into the existing tensors.
//
// restore() is collective: the ranks agree on the newest step that verifies on at least one
// node; nodes without it (a spot machine that came back with an empty disk) get a copy written
// locally; then every rank reads its node's copy. A different world size is refused with both
// sizes named unless CheckpointOptions::allowWorldSizeChange (the sampler's global cursor keeps
// the data exact; see dtrain/torch/distributed_sampler.h).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

// dtrain::kExitPreempted (75): what a program returns after preempted() saw SIGTERM and saved.
#include "dtrain/base/exit_codes.h"
#include "dtrain/torch/training_state.h"

namespace torch::optim {
class Optimizer;
class LRScheduler;
}  // namespace torch::optim

namespace dtrain::store {
class Store;
}  // namespace dtrain::store

namespace dtrain {

class ProcessGroup;
class GradScaler;
class DistributedSampler;

constexpr int kDefaultKeepLast = 3;
constexpr std::chrono::milliseconds kDefaultCheckpointTimeout{std::chrono::minutes(10)};

struct CheckpointOptions {
  CheckpointOptions() = default;
  CheckpointOptions(std::string dir) : directory(std::move(dir)) {}  // NOLINT: implicit on purpose

  // Required. Each node writes into `<directory>/node<ID>`; a directory containing "{node}" has it
  // replaced by the node's id instead (e.g. "/local/ckpt-{node}").
  std::string directory;
  // Committed checkpoints kept per node (never below 2: a save in progress never leaves fewer
  // than one complete checkpoint besides it).
  int keepLast = kDefaultKeepLast;
  // Restore a checkpoint written at another world size (the data cursor is re-sharded).
  bool allowWorldSizeChange = false;
  // Install a SIGTERM handler that only sets a flag; preempted() turns it into a checkpoint at a
  // step boundary every rank agrees on. See docs/design.md "Preemption".
  bool handlePreemption = true;
  // The longest a save, its commit or a restore may take before it fails with a TimeoutError
  // saying what it was doing (docs/design.md "Checkpoints"); the ranks wait this long (and a
  // grace) for each other's outcome, whatever the collectives' own timeout.
  std::chrono::milliseconds timeout = kDefaultCheckpointTimeout;
  // The node this rank runs on and its rank there; -1: DTRAIN_NODE_ID (GROUP_RANK when it is
  // absent, as under torchrun) and the group's local rank, what `launch` sets. Tests running
  // several "nodes" in one process set them.
  int nodeId = -1;
  int localRank = -1;
  // Where the ranks agree on each save's outcome (docs/design.md "Checkpoints"). Null: the
  // group's store, which dtrain::init() connects; a group without one agrees through its
  // collectives, each given `timeout` as its own.
  std::shared_ptr<store::Store> store;
};

// What restore() found and loaded.
struct RestoredCheckpoint {
  int64_t step = 0;
  int64_t epoch = 0;
  int savedWorldSize = 0;
  std::string path;             // the file this rank read
  bool copiedFromPeer = false;  // this node lacked it and received a copy
  // The last damage the restore passed over: a damaged file, or a sharded step some rank's
  // shards of which are intact nowhere (that step and rank named); empty when it met none.
  std::string skipped;
};

// A checkpoint this rank wrote to its node's directory: what a save cost the disk (for a
// saveAsync, the part that runs in the background while training goes on).
struct CheckpointWrite {
  int64_t step = 0;
  double seconds = 0;  // writing the file, fsync, rename and LATEST: until committed on this node
  uint64_t bytes = 0;  // the file's size
  // The save thread ran in the idle scheduling class: an asynchronous save, until training once
  // found one still running at its next save; then nice +10 (docs/training.md, "Asynchronous
  // saves").
  bool idleClass = false;
};

class Checkpointer {
 public:
  // Collective (the ranks exchange their node placement). Creates this node's directory. Saves
  // and restores what `state` holds, over its group.
  Checkpointer(std::shared_ptr<TrainingState> state, CheckpointOptions options);
  // The same with a TrainingState of its own, which add*() and setMetadata() below fill.
  Checkpointer(std::shared_ptr<ProcessGroup> group, CheckpointOptions options);
  // Waits for an asynchronous save still running (bounded by options.timeout).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // What it saves and restores: the TrainingState it was built from, or its own.
  TrainingState& state() { return *state_; }

  // Register into state(), as TrainingState's calls of the same names do (their rules are
  // there, dtrain/torch/training_state.h): what goes into a checkpoint. Before restore(); what
  // is registered must outlive the Checkpointer. A ShardedOptimizer (ZeRO) is saved as each
  // rank's shard records, never gathered.
  void addModule(const std::string& name, std::shared_ptr<torch::nn::Module> module);
  template <typename Impl>
  void addModule(const std::string& name, const torch::nn::ModuleHolder<Impl>& module) {
    addModule(name, std::static_pointer_cast<torch::nn::Module>(module.ptr()));
  }
  void addOptimizer(const std::string& name, torch::optim::Optimizer& optimizer);
  void addScheduler(const std::string& name, torch::optim::LRScheduler& scheduler);
  void addScaler(const std::string& name, GradScaler& scaler);
  void addSampler(const std::string& name, DistributedSampler& sampler,
                  std::function<size_t()> consumed = nullptr);
  void setMetadata(const std::string& key, MetadataValue value);
  const std::map<std::string, MetadataValue>& metadata() const { return state_->metadata(); }

  // Loads the newest checkpoint that verifies on any node into everything registered; nullopt
  // (on every rank) when there is none. Collective. Throws CheckpointError for a world-size
  // mismatch or when no node holds a readable copy of any checkpoint that exists.
  std::optional<RestoredCheckpoint> restore();

  // Saves the state after step `step` and returns once every node committed it. Collective. A
  // step every node committed already (the last one saved, or the one restored) is not written
  // again: saveAsync(step) followed by preempted(step) writes once.
  void save(int64_t step, int64_t epoch = 0);
  // Snapshots now (a copy into a reused host buffer) and writes in the background; training goes
  // on. A second save first waits for this one. Collective.
  void saveAsync(int64_t step, int64_t epoch = 0);
  // Waits for the asynchronous save and confirms that every node committed it; rethrows its error.
  // Collective; a no-op when none is pending.
  void wait();

  // The step boundary: true on every rank when any rank received SIGTERM (or requestStop() was
  // called) -- then a checkpoint of `step` has been committed and the program should return
  // kExitPreempted. Collective when the world has more than one rank (one small allreduce).
  bool preempted(int64_t step, int64_t epoch = 0);

  // The checkpoints whose write finished on this rank since the last call, oldest first: each
  // node's writer (its local rank 0) writes, the other ranks get none. Not collective and cheap
  // (a lock and a move), so a training loop can ask every step: an asynchronous save shows up
  // as soon as its background write ends, before wait() or the next save confirms it.
  std::vector<CheckpointWrite> finishedWrites();

  // A rank taken into a running round (`launch --on-node-join live`, docs/training.md "Surviving a
  // lost node"): until its first TrainingState::tryStep has settled with the members, restore()
  // gives nothing and save(), saveAsync(), wait() and preempted() do nothing (preempted() is
  // false), without a collective.

  // This node's directory.
  const std::string& nodeDirectory() const { return nodeDir_; }
  // Steps committed in this node's directory, newest first.
  std::vector<int64_t> committedSteps() const;

  struct Impl;

 private:
  // True (after saying so) when `call` comes before a joining rank's first step settled.
  bool beforeJoinSettled(const char* call) const;
  std::shared_ptr<TrainingState> state_;
  std::shared_ptr<ProcessGroup> group_;
  CheckpointOptions options_;
  std::string nodeDir_;
  std::unique_ptr<Impl> impl_;
};

// Set by the SIGTERM handler a Checkpointer installs (and by requestStop(), e.g. from the
// program's own stop condition): read by preempted(). clearStopRequest() is for tests.
bool stopRequested();
void requestStop();
void clearStopRequest();

// Writes the tensors of module `module` (a name given to addModule) of the checkpoint at `path`
// as a state_dict that Python's torch.load reads (`format` "pickle", torch::pickle_save) or that
// C++ torch::load(module, path) reads ("libtorch", a torch::serialize archive). Throws
// CheckpointError for a damaged file or an unknown module name (listing the known ones).
void exportStateDict(const std::string& path, const std::string& to, const std::string& module = "",
                     const std::string& format = "pickle");
// The same from `paths`: the first is read; the others, the same step's files on other nodes,
// give the ranges of ZeRO stage-3 parameters it lacks (with three or more nodes each node's file
// holds its own ranks' shards and the next node's only).
void exportStateDict(const std::vector<std::string>& paths, const std::string& to,
                     const std::string& module = "", const std::string& format = "pickle");

}  // namespace dtrain
