#include "shm_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtrain/base/error.h"
#include "half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define DTRAIN_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

#define DTRAIN_INLINE inline __attribute__((always_inline))

namespace dtrain::comm::shm {

// Note [Reduction kernels]
// Every kernel is a template over the element type and the operation, instantiated twice: inside
// a function compiled for AVX2 + F16C (picked at run time when the CPU has them) and inside a
// plain one. The templates are always inlined, so each copy is compiled for its caller's
// instruction set. float32 and float64 with 2-4 inputs (the common case) take one fused loop per
// element that the compiler vectorises (`ivdep`: the output may be exactly one of the inputs, which
// is no loop-carried dependence); everything else goes through a float accumulator block of 1024
// elements that stays in L1, so each input is still read from memory once.

namespace {

constexpr size_t kBlock = 1024;

template <typename T>
DTRAIN_INLINE T addWrap(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));  // wraps, like torch's
  } else {
    return a + b;
  }
}

struct SumOp {
  template <typename A>
  static DTRAIN_INLINE A apply(A a, A b) {
    return addWrap(a, b);
  }
};
// NaN-propagating, like torch.maximum / torch.minimum.
struct MaxOp {
  template <typename A>
  static DTRAIN_INLINE A apply(A a, A b) {
    return (a != a || a > b) ? a : b;
  }
};
struct MinOp {
  template <typename A>
  static DTRAIN_INLINE A apply(A a, A b) {
    return (a != a || a < b) ? a : b;
  }
};

// Element type T accumulated as A.
template <typename T>
struct Native {
  using A = T;
  static DTRAIN_INLINE A load(T v) { return v; }
  static DTRAIN_INLINE T store(A v) { return v; }
};

struct Bf16 {
  using A = float;
  static DTRAIN_INLINE float load(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
  // Round to nearest even, NaN kept quiet; branch-free so it vectorises (same as floatToBf16).
  static DTRAIN_INLINE uint16_t store(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
  }
};

template <typename A>
DTRAIN_INLINE A finishAvg(A sum, int n) {
  return sum / static_cast<A>(n);
}

// out[i] = op over N inputs, fused: one loop, each input read once.
template <bool Avx, typename Cv, typename Op, int N, bool Avg, typename T>
DTRAIN_INLINE void fused(T* out, const T* const* in, size_t count, int n) {
  const T* s[N];
  for (int k = 0; k < N; ++k) s[k] = in[k];
#pragma GCC ivdep
  for (size_t i = 0; i < count; ++i) {
    typename Cv::A a = Cv::load(s[0][i]);
    for (int k = 1; k < N; ++k) a = Op::apply(a, Cv::load(s[k][i]));
    if constexpr (Avg) a = finishAvg(a, n);
    out[i] = Cv::store(a);
  }
}

#if defined(__x86_64__)
DTRAIN_AVX2 void halfToFloatAvx2(float* dst, const uint16_t* src, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < m; ++i) dst[i] = halfToFloat(src[i]);
}
DTRAIN_AVX2 void floatToHalfAvx2(uint16_t* dst, const float* src, size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < m; ++i) dst[i] = floatToHalf(src[i]);
}
#endif

// Loads m elements of `src` widened into `acc`.
template <bool Avx, typename Cv, typename T>
DTRAIN_INLINE void loadBlock(typename Cv::A* acc, const T* src, size_t m) {
#pragma GCC ivdep
  for (size_t i = 0; i < m; ++i) acc[i] = Cv::load(src[i]);
}

// acc[i] = acc[i] op widen(src[i]).
template <bool Avx, typename Cv, typename Op, typename T>
DTRAIN_INLINE void combineBlock(typename Cv::A* acc, const T* src, size_t m) {
#pragma GCC ivdep
  for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], Cv::load(src[i]));
}

template <bool Avx, typename Cv, typename T>
DTRAIN_INLINE void storeBlock(T* dst, const typename Cv::A* acc, size_t m) {
#pragma GCC ivdep
  for (size_t i = 0; i < m; ++i) dst[i] = Cv::store(acc[i]);
}

// Any number of inputs through an L1-resident accumulator block.
template <bool Avx, typename Cv, typename Op, bool Avg, typename T>
DTRAIN_INLINE void blocked(T* out, const T* const* in, int n, size_t count) {
  using A = typename Cv::A;
  alignas(64) A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    loadBlock<Avx, Cv>(acc, in[0] + base, m);
    for (int k = 1; k < n; ++k) combineBlock<Avx, Cv, Op>(acc, in[k] + base, m);
    if constexpr (Avg) {
#pragma GCC ivdep
      for (size_t i = 0; i < m; ++i) acc[i] = finishAvg(acc[i], n);
    }
    storeBlock<Avx, Cv>(out + base, acc, m);
  }
}

// float16: widened block by block (F16C when compiled for it), reduced in float32, rounded once.
template <bool Avx, typename Op, bool Avg>
DTRAIN_INLINE void blockedHalf(uint16_t* out, const uint16_t* const* in, int n, size_t count) {
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    for (int k = 0; k < n; ++k) {
      float* dst = k == 0 ? acc : tmp;
#if defined(__x86_64__)
      if constexpr (Avx) {
        halfToFloatAvx2(dst, in[k] + base, m);
      } else
#endif
      {
        for (size_t i = 0; i < m; ++i) dst[i] = halfToFloat(in[k][base + i]);
      }
      if (k > 0) combineBlock<Avx, Native<float>, Op>(acc, tmp, m);
    }
    if constexpr (Avg) {
#pragma GCC ivdep
      for (size_t i = 0; i < m; ++i) acc[i] = finishAvg(acc[i], n);
    }
#if defined(__x86_64__)
    if constexpr (Avx) {
      floatToHalfAvx2(out + base, acc, m);
      continue;
    }
#endif
    for (size_t i = 0; i < m; ++i) out[base + i] = floatToHalf(acc[i]);
  }
}

template <bool Avx, typename Cv, typename Op, bool Avg, typename T>
DTRAIN_INLINE void reduceTyped(void* out, const void* const* in, int n, size_t count) {
  T* o = static_cast<T*>(out);
  const T* const* s = reinterpret_cast<const T* const*>(in);
  if constexpr (std::is_floating_point_v<T>) {
    switch (n) {
      case 2: return fused<Avx, Cv, Op, 2, Avg>(o, s, count, n);
      case 3: return fused<Avx, Cv, Op, 3, Avg>(o, s, count, n);
      case 4: return fused<Avx, Cv, Op, 4, Avg>(o, s, count, n);
      default: break;
    }
  }
  blocked<Avx, Cv, Op, Avg>(o, s, n, count);
}

template <bool Avx, typename Op, bool Avg>
DTRAIN_INLINE void reduceOp(void* out, const void* const* in, int n, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::Float32:
      return reduceTyped<Avx, Native<float>, Op, Avg, float>(out, in, n, count);
    case DataType::Float64:
      return reduceTyped<Avx, Native<double>, Op, Avg, double>(out, in, n, count);
    case DataType::Int32:
      return reduceTyped<Avx, Native<int32_t>, Op, Avg, int32_t>(out, in, n, count);
    case DataType::Int64:
      return reduceTyped<Avx, Native<int64_t>, Op, Avg, int64_t>(out, in, n, count);
    case DataType::UInt8:
      return reduceTyped<Avx, Native<uint8_t>, Op, Avg, uint8_t>(out, in, n, count);
    case DataType::Int8:
      return reduceTyped<Avx, Native<int8_t>, Op, Avg, int8_t>(out, in, n, count);
    case DataType::BFloat16: return reduceTyped<Avx, Bf16, Op, Avg, uint16_t>(out, in, n, count);
    case DataType::Float16:
      return blockedHalf<Avx, Op, Avg>(static_cast<uint16_t*>(out),
                                       reinterpret_cast<const uint16_t* const*>(in), n, count);
  }
}

template <bool Avx>
DTRAIN_INLINE void reduceAny(void* out, const void* const* in, int n, size_t count, DataType dtype,
                             ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return reduceOp<Avx, SumOp, false>(out, in, n, count, dtype);
    case ReduceOp::Avg: return reduceOp<Avx, SumOp, true>(out, in, n, count, dtype);
    case ReduceOp::Max: return reduceOp<Avx, MaxOp, false>(out, in, n, count, dtype);
    case ReduceOp::Min: return reduceOp<Avx, MinOp, false>(out, in, n, count, dtype);
  }
}

void reducePlain(void* out, const void* const* in, int n, size_t count, DataType dtype,
                 ReduceOp op) {
  reduceAny<false>(out, in, n, count, dtype, op);
}

#if defined(__x86_64__)
DTRAIN_AVX2 void reduceVector(void* out, const void* const* in, int n, size_t count, DataType dtype,
                              ReduceOp op) {
  reduceAny<true>(out, in, n, count, dtype, op);
}

bool haveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  return have;
}
#endif

}  // namespace

bool vectorKernels() {
#if defined(__x86_64__)
  return haveAvx2();
#else
  return false;
#endif
}

void reduceInputs(void* out, const void* const* in, int n, size_t count, DataType dtype,
                  ReduceOp op) {
  DTRAIN_CHECK(n >= 1, "reduceInputs: no inputs");
  if (count == 0) return;
  if (n == 1) {
    if (out != in[0]) std::memmove(out, in[0], count * elementSize(dtype));
    return;
  }
#if defined(__x86_64__)
  if (haveAvx2()) return reduceVector(out, in, n, count, dtype, op);
#endif
  reducePlain(out, in, n, count, dtype, op);
}

}  // namespace dtrain::comm::shm
