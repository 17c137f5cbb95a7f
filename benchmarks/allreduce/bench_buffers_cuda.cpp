// Device buffers for the NCCL mode of allreduce_bench: filled and checked through host copies.
#include <cuda_runtime.h>

#include <vector>

#include "bench_buffers.h"
#include "dtrain/base/error.h"

namespace dtrain::bench {

namespace {

void check(cudaError_t rc, const char* what) {
  DTRAIN_CHECK(rc == cudaSuccess, "allreduce_bench: {}: {}", what, cudaGetErrorString(rc));
}

class DeviceBuffers final : public BenchBuffers {
 public:
  DeviceBuffers(comm::Communicator& c, size_t bytes, comm::DataType dtype)
      : buffer_(c.allocate(bytes)), dtype_(dtype), host_(bytes) {}
  void* data() override { return buffer_->data(); }
  void fillContribution(int rank, size_t count) override {
    fillHost(host_.data(), dtype_, rank, count);
    check(
        cudaMemcpy(data(), host_.data(), count * comm::elementSize(dtype_), cudaMemcpyHostToDevice),
        "cudaMemcpy to the device");
  }
  long countWrong(size_t count, int world, comm::ReduceOp op) override {
    synchronize();
    check(
        cudaMemcpy(host_.data(), data(), count * comm::elementSize(dtype_), cudaMemcpyDeviceToHost),
        "cudaMemcpy from the device");
    return countWrongHost(host_.data(), dtype_, count, world, op);
  }
  void synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

 private:
  std::shared_ptr<comm::Buffer> buffer_;
  comm::DataType dtype_;
  std::vector<uint8_t> host_;
};

}  // namespace

std::unique_ptr<BenchBuffers> createDeviceBuffers(comm::Communicator& c, size_t bytes,
                                                  comm::DataType dtype) {
  return std::make_unique<DeviceBuffers>(c, bytes, dtype);
}

}  // namespace dtrain::bench
