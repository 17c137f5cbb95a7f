#pragma once
// The benchmark's buffer: communicator-owned memory (host for Gloo, device for NCCL) filled with
// the closed-form contribution of a rank and checked after one allreduce.

#include <cstddef>
#include <memory>

#include "dtrain/comm/communicator.h"

namespace dtrain::bench {

class BenchBuffers {
 public:
  static std::unique_ptr<BenchBuffers> create(comm::Communicator& c, size_t maxBytes,
                                              comm::DataType dtype);
  virtual ~BenchBuffers() = default;

  virtual void* data() = 0;
  // Element i = rank + i % 5.
  virtual void fillContribution(int rank, size_t count) = 0;
  // Elements that differ from op over all ranks' contributions.
  virtual long countWrong(size_t count, int world, comm::ReduceOp op) = 0;
  // Waits until the device has finished (no-op on the host).
  virtual void synchronize() {}
};

// Host-side closed forms shared by both kinds of buffer.
void fillHost(void* data, comm::DataType dtype, int rank, size_t count);
long countWrongHost(const void* data, comm::DataType dtype, size_t count, int world,
                    comm::ReduceOp op);

}  // namespace dtrain::bench
