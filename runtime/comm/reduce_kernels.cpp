#include "reduce_kernels.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "dtrain/base/error.h"
#include "half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dtrain::comm {

namespace {

template <typename T>
struct SumOp {
  static T apply(T a, T b) { return a + b; }
};

// NaN-propagating for floating point, like torch.maximum / torch.minimum.
template <typename T>
struct MaxOp {
  static T apply(T a, T b) { return (a != a || a > b) ? a : b; }
};

template <typename T>
struct MinOp {
  static T apply(T a, T b) { return (a != a || a < b) ? a : b; }
};

template <typename T, template <typename> class Op>
void reduceNative(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op<T>::apply(x[i], y[i]);
}

// Integer sums wrap around (two's complement) like torch's, without signed-overflow UB.
template <typename T>
void sumInteger(void* out, const void* a, const void* b, size_t n) {
  using U = std::make_unsigned_t<T>;
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(static_cast<U>(x[i]) + static_cast<U>(y[i]));
}

// bfloat16: widen to float, reduce, round back (each step rounds, as torch does on the CPU).
template <template <typename> class Op>
void reduceBf16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = floatToBf16(Op<float>::apply(bf16ToFloat(x[i]), bf16ToFloat(y[i])));
  }
}

template <template <typename> class Op>
void reduceHalfPortable(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = floatToHalf(Op<float>::apply(halfToFloat(x[i]), halfToFloat(y[i])));
  }
}

#if defined(__x86_64__)
// float16 with the F16C conversion instructions (8 lanes at a time), when the CPU has them.
template <template <typename> class Op>
__attribute__((target("avx,f16c"))) void reduceHalfF16c(void* out, const void* a, const void* b,
                                                        size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 fx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    __m256 fy = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    __m256 r;
    if constexpr (std::is_same_v<Op<float>, SumOp<float>>) {
      r = _mm256_add_ps(fx, fy);
    } else {
      // Element-wise through the scalar op keeps the NaN rule in one place.
      alignas(32) float lx[8], ly[8];
      _mm256_store_ps(lx, fx);
      _mm256_store_ps(ly, fy);
      for (int k = 0; k < 8; ++k) lx[k] = Op<float>::apply(lx[k], ly[k]);
      r = _mm256_load_ps(lx);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if (i < n) reduceHalfPortable<Op>(o + i, x + i, y + i, n - i);
}

bool haveF16c() {
  static const bool have = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return have;
}
#endif

template <template <typename> class Op>
ReduceFn halfKernel() {
#if defined(__x86_64__)
  if (haveF16c()) return &reduceHalfF16c<Op>;
#endif
  return &reduceHalfPortable<Op>;
}

template <template <typename> class Op>
ReduceFn kernelFor(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return &reduceNative<float, Op>;
    case DataType::Float64: return &reduceNative<double, Op>;
    case DataType::Float16: return halfKernel<Op>();
    case DataType::BFloat16: return &reduceBf16<Op>;
    case DataType::Int32: return &reduceNative<int32_t, Op>;
    case DataType::Int64: return &reduceNative<int64_t, Op>;
    case DataType::UInt8: return &reduceNative<uint8_t, Op>;
    case DataType::Int8: return &reduceNative<int8_t, Op>;
  }
  return nullptr;
}

ReduceFn sumKernel(DataType dtype) {
  switch (dtype) {
    case DataType::Int32: return &sumInteger<int32_t>;
    case DataType::Int64: return &sumInteger<int64_t>;
    case DataType::UInt8: return &sumInteger<uint8_t>;
    case DataType::Int8: return &sumInteger<int8_t>;
    default: return kernelFor<SumOp>(dtype);
  }
}

template <typename T>
void divideNative(void* data, size_t n, int divisor) {
  T* p = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void divide16(void* data, size_t n, int divisor) {
  uint16_t* p = static_cast<uint16_t*>(data);
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) p[i] = FromFloat(ToFloat(p[i]) / d);
}

}  // namespace

ReduceFn reduceFunction(DataType dtype, ReduceOp op) {
  ReduceFn fn = nullptr;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: fn = sumKernel(dtype); break;
    case ReduceOp::Max: fn = kernelFor<MaxOp>(dtype); break;
    case ReduceOp::Min: fn = kernelFor<MinOp>(dtype); break;
  }
  DTRAIN_CHECK_ARG(fn != nullptr, "no reduction kernel for {} {}", reduceOpName(op),
                   dataTypeName(dtype));
  return fn;
}

void divideInPlace(void* data, size_t count, DataType dtype, int divisor) {
  switch (dtype) {
    case DataType::Float32: return divideNative<float>(data, count, divisor);
    case DataType::Float64: return divideNative<double>(data, count, divisor);
    case DataType::Float16: return divide16<halfToFloat, floatToHalf>(data, count, divisor);
    case DataType::BFloat16: return divide16<bf16ToFloat, floatToBf16>(data, count, divisor);
    case DataType::Int32: return divideNative<int32_t>(data, count, divisor);
    case DataType::Int64: return divideNative<int64_t>(data, count, divisor);
    case DataType::UInt8: return divideNative<uint8_t>(data, count, divisor);
    case DataType::Int8: return divideNative<int8_t>(data, count, divisor);
  }
}

}  // namespace dtrain::comm
