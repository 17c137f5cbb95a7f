#pragma once
// C10dPeer: PyTorch's own C++ c10d::ProcessGroupGloo (from the libtorch this build links), run by
// the benchmark's ranks themselves on the same tensors' worth of data, interleaved with dtrain's
// allreduce size by size. Unlike TorchPeer (torch.distributed from Python), nothing of CPython is
// in its times, so the ratio to it is the ratio of the two C++ implementations. The header is
// torch-free; in a build without the peer start() says why and returns null.

#include <cstddef>
#include <memory>
#include <string>

#include "dtrain/base/store.h"
#include "dtrain/comm/communicator.h"

namespace dtrain::bench {

class C10dPeer {
 public:
  struct Result {
    double medianUs = 0;  // this rank's per-iteration median
    long wrong = 0;       // elements that differ from the closed form after one checked allreduce
  };

  // Collective: every rank calls it. Rank 0 hosts a c10d::TCPStore on a free loopback port and
  // publishes the port in `store`; then every rank creates a ProcessGroupGloo on loopback. Null,
  // with the reason on stderr from rank 0, when this build has no peer (no libtorch, no Gloo, or a
  // libtorch with its own Gloo: benchmarks/allreduce/allreduce.cmake) or c10d's Gloo does not take
  // `dtype` / `op`.
  static std::unique_ptr<C10dPeer> start(store::Store& store, int rank, int world,
                                         comm::DataType dtype, comm::ReduceOp op, size_t maxBytes);
  virtual ~C10dPeer() = default;

  // Collective: one size, `warmup` untimed then `iters` timed allreduce()->wait() calls.
  virtual Result run(size_t bytes, int warmup, int iters) = 0;
};

}  // namespace dtrain::bench
