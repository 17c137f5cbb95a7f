// Reduction kernels and the float16/bfloat16 conversions behind them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <immintrin.h>

#include "half.h"
#include "reduce_kernels.h"

namespace dtrain::comm::reduce_kernels_test {
namespace {

__attribute__((target("f16c"))) uint16_t hardwareFloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hardwareHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

bool sameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

TEST(HalfConversion, EveryHalfWidensLikeTheHardware) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C to compare with";
  for (uint32_t h = 0; h < 65536; ++h) {
    float ours = halfToFloat(static_cast<uint16_t>(h));
    float hw = hardwareHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(ours)) << h;
    } else {
      ASSERT_TRUE(sameBits(ours, hw)) << "half 0x" << std::hex << h;
    }
  }
}

TEST(HalfConversion, NarrowingRoundsLikeTheHardware) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C to compare with";
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  // Random bit patterns cover every exponent (subnormals, overflow, NaN); the halfway points
  // between neighbouring halves check round-to-nearest-even.
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, sizeof(f));
    uint16_t hw = hardwareFloatToHalf(f);
    uint16_t ours = floatToHalf(f);
    if (std::isnan(f)) {
      ASSERT_EQ(ours & 0x7c00, 0x7c00);
      ASSERT_NE(ours & 0x03ff, 0);
    } else {
      ASSERT_EQ(ours, hw) << "float bits 0x" << std::hex << u;
    }
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    float mid =
        (halfToFloat(static_cast<uint16_t>(h)) + halfToFloat(static_cast<uint16_t>(h + 1))) / 2;
    ASSERT_EQ(floatToHalf(mid), hardwareFloatToHalf(mid)) << "halfway above 0x" << std::hex << h;
  }
}

TEST(Bf16Conversion, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::nanf("")))));
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(floatToBf16(f), b) << "round trip of 0x" << std::hex << b;
    }
  }
}

template <typename T>
std::vector<T> apply(DataType dtype, ReduceOp op, std::vector<T> a, const std::vector<T>& b) {
  reduceFunction(dtype, op)(a.data(), a.data(), b.data(), a.size());
  return a;
}

TEST(ReduceKernels, MaxAndMinPropagateNaN) {
  const float nan = std::nanf("");
  auto mx = apply<float>(DataType::Float32, ReduceOp::Max, {1, nan, 3}, {nan, 2, 1});
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_TRUE(std::isnan(mx[1]));
  EXPECT_EQ(mx[2], 3);
  auto mn = apply<float>(DataType::Float32, ReduceOp::Min, {1, nan, 3}, {nan, 2, 1});
  EXPECT_TRUE(std::isnan(mn[0]));
  EXPECT_TRUE(std::isnan(mn[1]));
  EXPECT_EQ(mn[2], 1);
}

TEST(ReduceKernels, IntegerSumsWrapAround) {
  auto s = apply<int32_t>(DataType::Int32, ReduceOp::Sum, {std::numeric_limits<int32_t>::max()},
                          {1});
  EXPECT_EQ(s[0], std::numeric_limits<int32_t>::min());
}

TEST(ReduceKernels, HalfSumOverManyLanesMatchesScalar) {
  // 37 elements: four 8-lane blocks and a scalar tail.
  std::vector<uint16_t> a(37), b(37);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = floatToHalf(0.1f * i);
    b[i] = floatToHalf(1000.0f - i);
  }
  auto sum = apply<uint16_t>(DataType::Float16, ReduceOp::Sum, a, b);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(sum[i], floatToHalf(halfToFloat(a[i]) + halfToFloat(b[i]))) << i;
  }
}

TEST(ReduceKernels, AverageTruncatesIntegersAndDividesFloats) {
  std::vector<int64_t> ints{7, -7, 8};
  divideInPlace(ints.data(), ints.size(), DataType::Int64, 2);
  EXPECT_EQ(ints, (std::vector<int64_t>{3, -3, 4}));
  std::vector<uint16_t> bf{floatToBf16(3.0f)};
  divideInPlace(bf.data(), 1, DataType::BFloat16, 4);
  EXPECT_EQ(bf16ToFloat(bf[0]), 0.75f);
}

}  // namespace
}  // namespace dtrain::comm::reduce_kernels_test
