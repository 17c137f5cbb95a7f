#include "bench_buffers.h"

#include <cstdint>
#include <cstring>

#include "dtrain/config.h"
#include "half.h"

namespace dtrain::bench {

namespace {

double expected(comm::ReduceOp op, comm::DataType dtype, int n, size_t i) {
  const double m = static_cast<double>(i % 5);
  const double sum = n * (n - 1) / 2.0 + n * m;
  const bool integer = dtype == comm::DataType::Int32 || dtype == comm::DataType::Int64;
  switch (op) {
    case comm::ReduceOp::Sum: return sum;
    case comm::ReduceOp::Avg:
      return integer ? static_cast<double>(static_cast<int64_t>(sum / n)) : sum / n;
    case comm::ReduceOp::Max: return (n - 1) + m;
    case comm::ReduceOp::Min: return m;
  }
  return 0;
}

template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(p) + i * sizeof(T), sizeof(T));
  return v;
}

double get(const void* data, comm::DataType dtype, size_t i) {
  switch (dtype) {
    case comm::DataType::Float32: return load<float>(data, i);
    case comm::DataType::Float64: return load<double>(data, i);
    case comm::DataType::Float16: return comm::halfToFloat(load<uint16_t>(data, i));
    case comm::DataType::BFloat16: return comm::bf16ToFloat(load<uint16_t>(data, i));
    case comm::DataType::Int32: return load<int32_t>(data, i);
    case comm::DataType::Int64: return static_cast<double>(load<int64_t>(data, i));
    default: return 0;
  }
}

class HostBuffers final : public BenchBuffers {
 public:
  HostBuffers(comm::Communicator& c, size_t bytes, comm::DataType dtype)
      : buffer_(c.allocate(bytes)), dtype_(dtype) {}
  void* data() override { return buffer_->data(); }
  void fillContribution(int rank, size_t count) override { fillHost(data(), dtype_, rank, count); }
  long countWrong(size_t count, int world, comm::ReduceOp op) override {
    return countWrongHost(data(), dtype_, count, world, op);
  }

 private:
  std::shared_ptr<comm::Buffer> buffer_;
  comm::DataType dtype_;
};

}  // namespace

void fillHost(void* data, comm::DataType dtype, int rank, size_t count) {
  uint8_t* p = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < count; ++i) {
    const double v = rank + static_cast<double>(i % 5);
    switch (dtype) {
      case comm::DataType::Float32: {
        float f = static_cast<float>(v);
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case comm::DataType::Float64: std::memcpy(p + 8 * i, &v, 8); break;
      case comm::DataType::Float16: {
        uint16_t h = comm::floatToHalf(static_cast<float>(v));
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case comm::DataType::BFloat16: {
        uint16_t h = comm::floatToBf16(static_cast<float>(v));
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case comm::DataType::Int32: {
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(p + 4 * i, &x, 4);
        break;
      }
      case comm::DataType::Int64: {
        int64_t x = static_cast<int64_t>(v);
        std::memcpy(p + 8 * i, &x, 8);
        break;
      }
      default: break;
    }
  }
}

long countWrongHost(const void* data, comm::DataType dtype, size_t count, int world,
                    comm::ReduceOp op) {
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (get(data, dtype, i) != expected(op, dtype, world, i)) ++wrong;
  }
  return wrong;
}

#if !DTRAIN_WITH_NCCL
std::unique_ptr<BenchBuffers> createDeviceBuffers(comm::Communicator&, size_t, comm::DataType) {
  return nullptr;
}
#else
std::unique_ptr<BenchBuffers> createDeviceBuffers(comm::Communicator& c, size_t bytes,
                                                  comm::DataType dtype);
#endif

std::unique_ptr<BenchBuffers> BenchBuffers::create(comm::Communicator& c, size_t maxBytes,
                                                   comm::DataType dtype) {
  if (c.deviceStream() != nullptr) return createDeviceBuffers(c, maxBytes, dtype);
  return std::make_unique<HostBuffers>(c, maxBytes, dtype);
}

}  // namespace dtrain::bench
