#pragma once
// A byte buffer holding `count` elements of a Communicator DataType, read and written as doubles:
// lets one test body cover every dtype with closed-form expected values.

#include <cstdint>
#include <cstring>
#include <vector>

#include "dtrain/comm/communicator.h"
#include "half.h"

namespace dtrain::testing {

class TypedBuffer {
 public:
  TypedBuffer(comm::DataType dtype, size_t count)
      : dtype_(dtype), count_(count), bytes_(count * comm::elementSize(dtype) + 1) {}

  void* data() { return bytes_.data(); }
  size_t count() const { return count_; }

  void set(size_t i, double v) {
    uint8_t* p = bytes_.data() + i * comm::elementSize(dtype_);
    switch (dtype_) {
      case comm::DataType::Float32: store(p, static_cast<float>(v)); break;
      case comm::DataType::Float64: store(p, v); break;
      case comm::DataType::Float16: store(p, comm::floatToHalf(static_cast<float>(v))); break;
      case comm::DataType::BFloat16: store(p, comm::floatToBf16(static_cast<float>(v))); break;
      case comm::DataType::Int32: store(p, static_cast<int32_t>(v)); break;
      case comm::DataType::Int64: store(p, static_cast<int64_t>(v)); break;
      case comm::DataType::UInt8: store(p, static_cast<uint8_t>(v)); break;
      case comm::DataType::Int8: store(p, static_cast<int8_t>(v)); break;
    }
  }

  double get(size_t i) const {
    const uint8_t* p = bytes_.data() + i * comm::elementSize(dtype_);
    switch (dtype_) {
      case comm::DataType::Float32: return load<float>(p);
      case comm::DataType::Float64: return load<double>(p);
      case comm::DataType::Float16: return comm::halfToFloat(load<uint16_t>(p));
      case comm::DataType::BFloat16: return comm::bf16ToFloat(load<uint16_t>(p));
      case comm::DataType::Int32: return load<int32_t>(p);
      case comm::DataType::Int64: return static_cast<double>(load<int64_t>(p));
      case comm::DataType::UInt8: return load<uint8_t>(p);
      case comm::DataType::Int8: return load<int8_t>(p);
    }
    return 0;
  }

  // The guard byte after the last element: collectives must never write it.
  uint8_t guard() const { return bytes_.back(); }
  void setGuard(uint8_t v) { bytes_.back() = v; }

 private:
  template <typename T>
  static void store(uint8_t* p, T v) {
    std::memcpy(p, &v, sizeof(T));
  }
  template <typename T>
  static T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }

  comm::DataType dtype_;
  size_t count_;
  std::vector<uint8_t> bytes_;
};

inline bool isInteger(comm::DataType d) {
  return d == comm::DataType::Int32 || d == comm::DataType::Int64 || d == comm::DataType::UInt8 ||
         d == comm::DataType::Int8;
}

constexpr comm::DataType kAllDtypes[] = {comm::DataType::Float32, comm::DataType::Float64,
                                         comm::DataType::Float16, comm::DataType::BFloat16,
                                         comm::DataType::Int32,   comm::DataType::Int64};
constexpr comm::ReduceOp kAllOps[] = {comm::ReduceOp::Sum, comm::ReduceOp::Avg, comm::ReduceOp::Max,
                                      comm::ReduceOp::Min};

// Closed form: rank r contributes r + (i % 5) at element i.
inline double contribution(int rank, size_t i) { return rank + static_cast<double>(i % 5); }

inline double expectedReduce(comm::ReduceOp op, comm::DataType dtype, int size, size_t i) {
  const double m = static_cast<double>(i % 5);
  const double sum = size * (size - 1) / 2.0 + size * m;
  switch (op) {
    case comm::ReduceOp::Sum: return sum;
    case comm::ReduceOp::Avg: {
      double avg = sum / size;
      return isInteger(dtype) ? static_cast<double>(static_cast<int64_t>(avg)) : avg;
    }
    case comm::ReduceOp::Max: return (size - 1) + m;
    case comm::ReduceOp::Min: return m;
  }
  return 0;
}

}  // namespace dtrain::testing
