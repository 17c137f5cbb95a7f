// The shared-memory backend's multi-input reductions (shm_kernels.h) against a plain reference:
// every dtype and op, 1-9 inputs, odd lengths, the output aliasing an input; float16 and bfloat16
// accumulated in float32 and rounded once; integer sums wrapping; NaN propagating through max/min.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "half.h"
#include "shm_kernels.h"
#include "typed_buffer.h"

namespace dtrain::comm::shm_kernels_test {
namespace {

using testing::TypedBuffer;

template <typename A>
A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return a + b;
    case ReduceOp::Max: return (a != a || a > b) ? a : b;
    case ReduceOp::Min: return (a != a || a < b) ? a : b;
  }
  return a;
}

// The value the kernel must produce at element i, computed the slow way, as raw bits.
std::vector<uint8_t> reference(const std::vector<std::vector<uint8_t>>& in, DataType dtype,
                               ReduceOp op, size_t count) {
  const size_t e = elementSize(dtype);
  const int n = static_cast<int>(in.size());
  std::vector<uint8_t> out(count * e);
  for (size_t i = 0; i < count; ++i) {
    auto at = [&](int k) { return in[k].data() + i * e; };
    uint8_t* o = out.data() + i * e;
    auto viaFloat = [&](auto toFloat, auto fromFloat) {
      float acc = toFloat(*reinterpret_cast<const uint16_t*>(at(0)));
      for (int k = 1; k < n; ++k)
        acc = combine(op, acc, toFloat(*reinterpret_cast<const uint16_t*>(at(k))));
      if (op == ReduceOp::Avg) acc /= static_cast<float>(n);
      const uint16_t r = fromFloat(acc);
      std::memcpy(o, &r, 2);
    };
    auto native = [&](auto zero) {
      using T = decltype(zero);
      T acc;
      std::memcpy(&acc, at(0), sizeof(T));
      for (int k = 1; k < n; ++k) {
        T v;
        std::memcpy(&v, at(k), sizeof(T));
        if constexpr (std::is_integral_v<T>) {
          using U = std::make_unsigned_t<T>;
          acc = (op == ReduceOp::Sum || op == ReduceOp::Avg)
                    ? static_cast<T>(static_cast<U>(acc) + static_cast<U>(v))
                    : combine(op, acc, v);
        } else {
          acc = combine(op, acc, v);
        }
      }
      if (op == ReduceOp::Avg) acc = static_cast<T>(acc / static_cast<T>(n));
      std::memcpy(o, &acc, sizeof(T));
    };
    switch (dtype) {
      case DataType::Float32: native(0.0f); break;
      case DataType::Float64: native(0.0); break;
      case DataType::Int32: native(int32_t{0}); break;
      case DataType::Int64: native(int64_t{0}); break;
      case DataType::UInt8: native(uint8_t{0}); break;
      case DataType::Int8: native(int8_t{0}); break;
      case DataType::Float16: viaFloat(halfToFloat, floatToHalf); break;
      case DataType::BFloat16: viaFloat(bf16ToFloat, floatToBf16); break;
    }
  }
  return out;
}

std::vector<uint8_t> randomInput(DataType dtype, size_t count, std::mt19937& rng, bool nan) {
  TypedBuffer t(dtype, count);
  std::uniform_real_distribution<double> real(-100, 100);
  std::uniform_int_distribution<int64_t> integer(-1000000000000, 1000000000000);
  const bool floating = dtype == DataType::Float32 || dtype == DataType::Float64 ||
                        dtype == DataType::Float16 || dtype == DataType::BFloat16;
  std::vector<uint8_t> out(count * elementSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    if (floating) {
      t.set(i, nan && i % 97 == 5 ? std::numeric_limits<double>::quiet_NaN() : real(rng) / 3.0);
    } else {
      const int64_t v = integer(rng);
      std::memcpy(out.data() + i * elementSize(dtype), &v, elementSize(dtype));  // wraps on purpose
    }
  }
  if (floating) std::memcpy(out.data(), t.data(), out.size());
  return out;
}

bool sameElement(const uint8_t* a, const uint8_t* b, DataType dtype) {
  if (std::memcmp(a, b, elementSize(dtype)) == 0) return true;
  TypedBuffer ta(dtype, 1), tb(dtype, 1);
  std::memcpy(ta.data(), a, elementSize(dtype));
  std::memcpy(tb.data(), b, elementSize(dtype));
  return std::isnan(ta.get(0)) && std::isnan(tb.get(0));  // any NaN is a NaN
}

TEST(ShmKernels, EveryDtypeOpAndInputCountMatchesTheReference) {
  std::mt19937 rng(11);
  const DataType dtypes[] = {DataType::Float32,  DataType::Float64, DataType::Float16,
                             DataType::BFloat16, DataType::Int32,   DataType::Int64,
                             DataType::UInt8,    DataType::Int8};
  for (DataType dtype : dtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      for (int n = 1; n <= 9; ++n) {
        for (size_t count : {size_t(1), size_t(15), size_t(2053)}) {
          for (bool inPlace : {false, true}) {
            std::vector<std::vector<uint8_t>> in;
            for (int k = 0; k < n; ++k)
              in.push_back(randomInput(dtype, count, rng, op != ReduceOp::Sum));
            const auto want = reference(in, dtype, op, count);
            std::vector<uint8_t> out(count * elementSize(dtype) + 1, 0xEE);
            std::vector<const void*> ptrs;
            for (auto& v : in) ptrs.push_back(v.data());
            void* dst = inPlace ? in[n / 2].data() : out.data();
            shm::reduceInputs(dst, ptrs.data(), n, count, dtype, op);
            const uint8_t* got = static_cast<const uint8_t*>(dst);
            for (size_t i = 0; i < count; ++i) {
              ASSERT_TRUE(sameElement(got + i * elementSize(dtype),
                                      want.data() + i * elementSize(dtype), dtype))
                  << fmt::format("{} {} n={} count={} inPlace={} element {}", dataTypeName(dtype),
                                 reduceOpName(op), n, count, inPlace, i);
            }
            if (!inPlace) {
              EXPECT_EQ(out.back(), 0xEE) << "wrote past the end";
            }
          }
        }
      }
    }
  }
}

TEST(ShmKernels, HalfTypesRoundOnceAfterAFloatSum) {
  // 2048 + 1 + 1 in float16: pairwise rounding loses both ones (2049 is not a float16), one
  // rounding of the float32 sum keeps them.
  const uint16_t a = floatToHalf(2048.0f), b = floatToHalf(1.0f);
  const uint16_t in[3][1] = {{a}, {b}, {b}};
  const void* ptrs[3] = {in[0], in[1], in[2]};
  uint16_t out = 0;
  shm::reduceInputs(&out, ptrs, 3, 1, DataType::Float16, ReduceOp::Sum);
  EXPECT_EQ(halfToFloat(out), 2050.0f);
}

}  // namespace
}  // namespace dtrain::comm::shm_kernels_test
