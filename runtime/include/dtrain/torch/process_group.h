#pragma once
// ProcessGroup: the training program's handle on the job: its rank, the world, and collectives on
// tensors. Created by dtrain::init() (dtrain/torch/init.h) from the launcher's environment,
// or directly
// over a Communicator (tests, ranks as threads). A thin facade: it checks tensors, maps dtypes and
// hands raw buffers to the Communicator; non-contiguous tensors go through a contiguous copy that
// is written back when the collective has finished. Async forms keep their tensors alive until
// the Work is waited on (or dropped).

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "dtrain/comm/communicator.h"
#include "dtrain/comm/world.h"

namespace dtrain {

using comm::ReduceOp;

class ProcessGroup {
 public:
  ProcessGroup(std::shared_ptr<comm::Communicator> communicator, int localRank, c10::Device device);
  // What init() builds: the group owns the world (store, hosted store server) and shuts it down.
  ProcessGroup(comm::World world, c10::Device device);
  ~ProcessGroup();

  int rank() const { return communicator_->rank(); }
  int size() const { return communicator_->size(); }
  int localRank() const { return localRank_; }
  // cuda:LOCAL_RANK for NCCL, cpu for Gloo.
  c10::Device device() const { return device_; }
  const char* backend() const { return communicator_->backendName(); }
  comm::Communicator& communicator() { return *communicator_; }
  const std::shared_ptr<comm::Communicator>& communicatorPtr() const { return communicator_; }
  // The job's store (keys of this restart round), when created by init(); null otherwise.
  std::shared_ptr<store::Store> store() const;

  // In place on `tensor` (any layout; on this group's device: for CUDA, the same index). Bool
  // tensors: Sum is a logical or (reduced as Max, as c10d does), Min/Max and/or; Avg is refused.
  void allreduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  std::shared_ptr<comm::Work> allreduceAsync(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  void broadcast(at::Tensor& tensor, int root = 0);
  std::shared_ptr<comm::Work> broadcastAsync(at::Tensor& tensor, int root = 0);
  // Returns size() tensors shaped like `input`, rank r's at index r.
  std::vector<at::Tensor> allgather(const at::Tensor& input);
  // `input` has size() * output.numel() elements;
  // `output` receives op over all ranks' block rank().
  void reduceScatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::Sum);
  void barrier();
  // Small host values -- steps, lengths, headers -- on a group of any backend, as
  // torch.distributed's broadcast_object_list moves its sizes: a CUDA group's collectives take
  // no host tensor, so `host` (a CPU tensor) travels on device() and comes back into it; a CPU
  // group uses it as it is. allgatherHost returns size() CPU tensors, rank r's at index r.
  void broadcastHost(at::Tensor& host, int root = 0);
  std::vector<at::Tensor> allgatherHost(const at::Tensor& host);

  // Subgroups, as torch.distributed.new_group: collective over this group (every rank calls
  // them, in the same order); ranks outside the new group get nullptr. The new group runs its
  // collectives independently of this one (tensor- and pipeline-parallel jobs use both at once)
  // and on the same device; see Communicator::newGroup / split.
  //   auto tp = pg->newGroup({0, 1});              // ranks 0 and 1, ranked by their rank here
  //   auto row = pg->split(pg->rank() / 2);        // ranks with the same color form a group
  std::shared_ptr<ProcessGroup> newGroup(const std::vector<int>& ranks,
                                         const comm::GroupOptions& options = {});
  std::shared_ptr<ProcessGroup> split(int color, int key = -1,
                                      const comm::GroupOptions& options = {});

  // Node loss (`launch --on-node-loss continue`, docs/training.md "Surviving a lost node"): the
  // membership epoch this group's communicator belongs to -- 0 from init(), +1 at each re-form --
  // and whether it re-forms at all (only a group init() made, under that mode).
  int epoch() const { return world_ ? world_->epoch : 0; }
  bool reformsOnNodeLoss() const { return world_ && comm::reformsOnNodeLoss(*world_); }
  // After a collective failed: comm::reformWorld (dtrain/comm/world.h) -- waits for the
  // launcher's next epoch and replaces the communicator by one among its members: rank() and
  // size() change, communicator() is another object (do not keep references to it across a
  // step). Subgroups made before are not re-formed: the new epoch aborted them with the world
  // (a collective on one fails naming it); make them again. Collective over the new members;
  // false when no new epoch came (rethrow what failed). TrainingState::tryStep() calls it.
  bool reform();
  // This rank was started in a running round (`launch --on-node-join live`) and has not been
  // handed the members' state yet: TrainingState::tryStep does that first (settleJoin()), and
  // DistributedDataParallel leaves its broadcast of the parameters until then.
  bool joinPending() const { return world_ && world_->joinPending; }
  // Such a rank has no communicator until it is admitted among the members (comm::admitWorld):
  // its collectives are refused until then, so that the members train on while it starts
  // (docs/design.md, "Node loss"). TrainingState::tryStep admits it first; a no-op after.
  void admit();
  void settleJoin() {
    if (world_) world_->joinPending = false;
  }
  // A step boundary (comm::stepBoundary): true when a node taken into the running round is ready
  // and this group has not re-formed with it yet -- the members re-form before the step rather
  // than discard it. TrainingState::tryStep calls it before a step's work.
  bool stepBoundary() { return world_ && comm::stepBoundary(*world_); }
  // Whether the next stepBoundary() re-forms (comm::joinReady). Not collective.
  bool joinReady() const { return world_ && comm::joinReady(*world_); }

  // Idempotent; collectives after it fail. When rank 0 hosts the store (srun/mpirun), every rank
  // meets at a barrier first, so call it on every rank.
  void shutdown();

 private:
  comm::CallOptions callOptions(const at::Tensor& tensor, bool synchronous) const;
  std::shared_ptr<comm::Work> startAllreduce(at::Tensor& tensor, ReduceOp op, bool synchronous);
  std::shared_ptr<comm::Work> startBroadcast(at::Tensor& tensor, int root, bool synchronous);
  void checkTensor(const at::Tensor& tensor, const char* what) const;

  std::shared_ptr<comm::Communicator> communicator_;
  int localRank_;
  c10::Device device_;
  std::unique_ptr<comm::World> world_;  // set by init()
};

// Maps a tensor's scalar type to the Communicator's; throws InvalidArgument for unsupported ones.
comm::DataType toDataType(const at::Tensor& tensor);

// The op a reduction of `type` runs with: bool travels as uint8, where Sum would leave 2 in bool
// memory, so Sum becomes Max (logical or) and Avg is refused, as in c10d. Others unchanged.
ReduceOp reduceOpFor(at::ScalarType type, ReduceOp op);

// Throws InvalidArgument, naming both devices, unless a tensor on `tensor` may go through a group
// working on `group`: the same device type and, when the group's device has an index, the same
// index (a cuda:1 tensor would otherwise reach a cuda:0 communicator). `what`: the operation.
void checkTensorDevice(const c10::Device& tensor, const c10::Device& group, const char* backend,
                       const char* what);

}  // namespace dtrain
