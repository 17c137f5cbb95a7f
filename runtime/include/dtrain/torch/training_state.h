#pragma once
// TrainingState: what a job's state is -- its modules, optimizers, LR schedulers, GradScalers,
// samplers and metadata -- registered once, and where each step begins. A program builds one,
// registers its state into it, and gives it to whatever keeps that state: a Checkpointer built
// from it saves and restores what was registered here.
//
//   auto state = std::make_shared<dtrain::TrainingState>(group);
//   state->addModule("model", net);
//   state->addOptimizer("optimizer", optimizer);
//   state->addSampler("sampler", sampler);
//   dtrain::Checkpointer checkpointer(state, {"checkpoints"});
//   for (int64_t step = start; step < steps; ++step) {
//     state->beginStep(step);
//     ...train one step...
//   }
//
// Every rank's own random generators (CPU, and CUDA where there is one) are always part of it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace torch::optim {
class Optimizer;
class LRScheduler;
}  // namespace torch::optim

namespace dtrain {

class ProcessGroup;
class GradScaler;
class DistributedSampler;

namespace state {
struct Registry;
struct Rollback;
}  // namespace state

// User metadata kept with the state: key -> string, number or tensor (on the CPU).
using MetadataValue = std::variant<std::string, double, int64_t, at::Tensor>;

class TrainingState {
 public:
  explicit TrainingState(std::shared_ptr<ProcessGroup> group);
  ~TrainingState();
  TrainingState(const TrainingState&) = delete;
  TrainingState& operator=(const TrainingState&) = delete;

  // What the state is, under a name unique per kind. Register the same things in the same order
  // on every rank, before anything restores into them; they must outlive every user of the state.
  void addModule(const std::string& name, std::shared_ptr<torch::nn::Module> module);
  template <typename Impl>
  void addModule(const std::string& name, const torch::nn::ModuleHolder<Impl>& module) {
    addModule(name, std::static_pointer_cast<torch::nn::Module>(module.ptr()));
  }
  // A ShardedOptimizer (ZeRO, any stage) is kept as each rank's shard records, never gathered;
  // at stage 3 so are the parameters its marked units free.
  void addOptimizer(const std::string& name, torch::optim::Optimizer& optimizer);
  void addScheduler(const std::string& name, torch::optim::LRScheduler& scheduler);
  void addScaler(const std::string& name, GradScaler& scaler);
  // The sampler's position kept is what it handed out, unless `consumed` is given: then the
  // position after the samples training has consumed -- `consumed()` is the number of this rank's
  // samples (entries of sampler.indices()) trained on since setEpoch() or a restore. A loader
  // that prefetches (torch::data::make_data_loader with workers > 0 asks for 2 x workers batches
  // ahead) needs it, or a resume skips what was prefetched:
  //   size_t consumed = 0;   // reset to 0 at setEpoch() and after a restore
  //   state->addSampler("data", sampler, [&] { return consumed; });
  //   for (auto& batch : *loader) { ...train...; consumed += batch.data.size(0); }
  void addSampler(const std::string& name, DistributedSampler& sampler,
                  std::function<size_t()> consumed = nullptr);

  // User metadata: set before a save, read after a restore. Values are replicated (rank 0's).
  void setMetadata(const std::string& key, MetadataValue value);
  const std::map<std::string, MetadataValue>& metadata() const;

  // The step boundary: call it on every rank where step `step` begins, before its work. The
  // runtime keys its per-step behaviour on it; today that is DTRAIN_FAULT's process-level faults
  // (exit, signal, abort, hang, stop, slow: docs/design.md, "Fault injection") whose rank is
  // this group's rank and whose step is `step`. Not collective.
  void beginStep(int64_t step);
  // Steps as transactions, for a job that survives a lost node (`launch --on-node-loss
  // continue`; docs/training.md, "Surviving a lost node"). Runs `work` -- everything of the step
  // that communicates: forward, backward with DDP's gradient sync, GradScaler's unscale, clipping
  // -- and returns true when it finished: then apply the step (optimizer, scheduler, scaler
  // update). When a collective in it failed because a node was lost, the step is discarded on
  // every survivor and false comes back once the group re-formed among them: the registered
  // modules' gradients dropped, the state of a member that had applied one step more handed to
  // the others (all members equal), every registered sampler re-sharded for the new world at the
  // position where the step to run begins; run step currentStep() again, with the new
  // group->size() (and DDP, which re-makes its buckets at its next forward). A node taken into
  // the running round (`launch --on-node-join live`) costs no step: the step in flight finishes,
  // and the next tryStep re-forms with the newcomer before running anything, hands it the state
  // and returns false without running `work` -- run currentStep() at the new size, the same way
  // (docs/design.md, "Node loss"; a rank that reaches no step boundary within DTRAIN_JOIN_WAIT
  // seconds, 20 by default, has its step cut short as for a loss):
  //
  //   for (int64_t step = start; step < steps;) {
  //     state->beginStep(step);
  //     if (!state->tryStep([&] { ...forward, backward...; })) {
  //       step = state->currentStep();
  //       continue;
  //     }
  //     optimizer.step();
  //     ++step;
  //   }
  //
  // Under ZeRO (a ShardedOptimizer registered, any stage) the optimizer's step has
  // collectives of its own: run it inside `work`. Each rank's sharded state is then mirrored on
  // another node every setMirrorInterval() steps, at the start of the step (docs/design.md
  // "Sharded state across a lost node"), with a copy of the replicated state; after a loss
  // every survivor rolls back to the newest generation whose blocks all survived -- up to that
  // many steps -- re-sharded for the new world, and currentStep() is that generation's step.
  // A node taken into the running round re-shards the members' own blocks of the step about to
  // run for the larger world, the newcomer receiving its blocks and the replicated state (when
  // the join cut a step short instead, the members roll back as after a loss).
  //
  // Anything else -- an error of the program's own, a failure the launcher did not decide to
  // survive, a failure under ZeRO before its first mirror, of shards that are not mirrored (said
  // in one line at the first step), or of blocks no survivor holds (a rank and the rank keeping
  // its mirror both lost) -- propagates, and the launcher's restart path takes over. Outside
  // that mode it is work() and true.
  bool tryStep(const std::function<void()>& work);
  // Collectives between steps that a lost or joining node may cut short -- a progress report's
  // allreduce, an evaluation -- where nothing is to be discarded: runs `work` and returns true;
  // false when, under `--on-node-loss continue`, the group's communicator failed or was aborted
  // meanwhile (the next tryStep re-forms the group and settles), and without running `work` on a
  // rank taken into a running round before its first tryStep. Anything else propagates; outside
  // that mode it is work() and true.
  bool tryCollective(const std::function<void()>& work);
  // ZeRO under `--on-node-loss continue`: mirror the sharded state every `steps`
  // steps (>= 1; 10 by default). Fewer: less lost on a loss, more traffic per step (each rank's
  // sharded state, once, to one rank). Not collective; the same on every rank.
  void setMirrorInterval(int64_t steps);
  // The step of the last beginStep() -- after tryStep() returned false, the step to run -- -1
  // before the first.
  int64_t currentStep() const { return step_; }
  // ZeRO: the last restore of the sharded state in memory (after a loss, or a join): the step of
  // the generation restored, the payload bytes this rank sent to re-shard it (every piece of
  // every block once, from the rank that provides it to its new owner: docs/design.md "Sharded
  // state across a lost node"), and its seconds; step -1 before any.
  struct ShardRestore {
    int64_t step = -1;
    uint64_t bytesSent = 0;
    double seconds = 0;
  };
  const ShardRestore& lastShardRestore() const { return lastRestore_; }

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  // What was registered, for the runtime's consumers of the state (the Checkpointer); its type
  // is internal to the library.
  state::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  // ZeRO under node loss: the mirrors' schedule and the replicated state's copies.
  void refreshMirrors();
  int64_t restoreShards(const std::exception* failure);  // null: a join at a boundary
  // A rank taken into a running round under ZeRO: its blocks and the replicated state from the
  // members, who restore theirs (restoreShards) at the same time; the generation's step.
  int64_t joinShards();
  // `e` is a failure a re-form follows: under the mode, the group's communicator or a subgroup
  // made from it failed (a program's own error with every collective healthy is none). A
  // MembershipChanged from a subgroup made before the last re-form throws InvalidArgument.
  bool membershipChanged(const std::exception& e) const;
  // After a re-form: the members settle on one state and step (docs/design.md, "Node loss"),
  // re-forming and settling again when a newer epoch cuts that short (a rank cut short while it
  // received a state is handed a whole one then); the step every member runs next.
  int64_t settle();

  std::unique_ptr<state::Registry> registry_;
  std::unique_ptr<state::Rollback> rollback_;
  int64_t step_ = -1;
  int64_t mirrorInterval_ = 10;
  ShardRestore lastRestore_;
};

}  // namespace dtrain
