// Slice, reduction and cast kernels (see kernels.h for the contracts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

__global__ void SliceAxisF32(const float* __restrict__ x, float* __restrict__ y, int64_t axis_in,
                             int64_t start, int64_t axis_out, int64_t inner, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % inner;
    const int64_t a = (i / inner) % axis_out;
    const int64_t o = i / (inner * axis_out);
    y[i] = x[(o * axis_in + start + a) * inner + c];
  }
}

__global__ void PlaceAxisF32(const float* __restrict__ x, float* __restrict__ y, int64_t axis_in,
                             int64_t start, int64_t axis_out, int64_t inner, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % inner;
    const int64_t a = (i / inner) % axis_in;
    const int64_t o = i / (inner * axis_in);
    y[(o * axis_out + start + a) * inner + c] = x[i];
  }
}

// One thread per output element, walking its r inputs (strided by `inner`, so adjacent
// threads read adjacent addresses).
__global__ void ReduceMiddleF32(ReduceKernel op, const float* __restrict__ x, float* __restrict__ y,
                                int64_t r, int64_t inner, int64_t n, Rounding half, void* __restrict__ h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % inner;
    const int64_t o = i / inner;
    const float* p = x + o * r * inner + c;
    const bool squares = op == ReduceKernel::kSumSquare || op == ReduceKernel::kL2;
    float acc = squares ? p[0] * p[0] : p[0];
    for (int64_t j = 1; j < r; ++j) {
      const float v = p[j * inner];
      switch (op) {
        case ReduceKernel::kMax:
          acc = fmaxf(acc, v);
          break;
        case ReduceKernel::kMin:
          acc = fminf(acc, v);
          break;
        case ReduceKernel::kProd:
          acc *= v;
          break;
        case ReduceKernel::kSumSquare:
        case ReduceKernel::kL2:
          acc += v * v;
          break;
        default:
          acc += v;
      }
    }
    const float v = op == ReduceKernel::kMean ? acc / static_cast<float>(r)
                    : op == ReduceKernel::kL2   ? sqrtf(acc)
                                                : acc;
    if (y != nullptr) y[i] = v;
    StoreRounded(half, h, i, v);
  }
}

// One thread per output element, as ReduceMiddleF32; the comparisons are the CPU
// engine's, so a NaN never replaces the best so far.
__global__ void ArgExtremeMiddleF32(bool is_max, bool last, const float* __restrict__ x,
                                    int64_t* __restrict__ y, int64_t r, int64_t inner, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % inner;
    const int64_t o = i / inner;
    const float* p = x + o * r * inner + c;
    float best = p[0];
    int64_t at = 0;
    for (int64_t j = 1; j < r; ++j) {
      const float v = p[j * inner];
      const bool better = is_max ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
      if (better) {
        best = v;
        at = j;
      }
    }
    y[i] = at;
  }
}

template <typename T>
__global__ void CastToF32(const T* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = static_cast<float>(x[i]);
  }
}

__global__ void F32ToFp16(const float* __restrict__ x, __half* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2half_rn(x[i]);
  }
}

__global__ void F32ToBf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16_rn(x[i]);
  }
}

__device__ __forceinline__ void Round(float v, __half* y) { *y = __float2half_rn(v); }
__device__ __forceinline__ void Round(float v, __nv_bfloat16* y) { *y = __float2bfloat16_rn(v); }

// y [b, spatial, channels] = x [b, channels, spatial] rounded: one thread per element of y,
// so the writes are in order and the reads stride over x's planes.
template <typename T>
__global__ void F32ToHalfChannelsLast(const float* __restrict__ x, T* __restrict__ y, int64_t n,
                                      int64_t channels, int64_t spatial) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ch = i % channels, bs = i / channels;
    const int64_t b = bs / spatial, s = bs - b * spatial;
    Round(x[(b * channels + ch) * spatial + s], y + i);
  }
}

// The CPU engine's CastValue: NaN 0, saturated at the type's bounds `least` and `most`
// (as floats, lo and hi), else truncated. The bounds come from the host: numeric_limits is
// not callable in device code.
template <typename T>
__global__ void F32ToInt(const float* __restrict__ x, T* __restrict__ y, int64_t n, T least,
                         T most) {
  const float lo = static_cast<float>(least), hi = static_cast<float>(most);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    y[i] = !(v == v) ? T(0) : v <= lo ? least : v >= hi ? most : static_cast<T>(v);
  }
}

__global__ void BoolToF32(const uint8_t* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = x[i] != 0 ? 1.f : 0.f;
  }
}

}  // namespace

cudaError_t LaunchSliceAxisF32(const float* x, float* y, int64_t outer, int64_t axis_in,
                               int64_t start, int64_t axis_out, int64_t inner,
                               cudaStream_t stream) {
  const int64_t n = outer * axis_out * inner;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  SliceAxisF32<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, axis_in, start, axis_out, inner, n);
  return cudaGetLastError();
}

cudaError_t LaunchPlaceAxisF32(const float* x, float* y, int64_t outer, int64_t axis_in,
                               int64_t start, int64_t axis_out, int64_t inner,
                               cudaStream_t stream) {
  const int64_t n = outer * axis_in * inner;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  PlaceAxisF32<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, axis_in, start, axis_out, inner, n);
  return cudaGetLastError();
}

namespace {

// Whether position a comes before position b in TopK's order.
// va > vb, a NaN above every number: the CPU engine's TopK order (ops/sort_scan.cc).
__device__ __forceinline__ bool TopKAbove(float va, float vb) {
  if (va != va) return vb == vb;
  return vb == vb && va > vb;
}

__device__ __forceinline__ bool TopKBefore(const float* s, int64_t inner, int64_t a, int64_t b,
                                           bool largest) {
  const float va = s[a * inner], vb = s[b * inner];
  if (TopKAbove(va, vb)) return largest;
  if (TopKAbove(vb, va)) return !largest;
  return a < b;
}

// Pass j picks the first position (in TopK's order) that comes after pass j-1's pick.
__global__ void TopKF32(const float* __restrict__ x, float* __restrict__ values,
                        int64_t* __restrict__ indices, int64_t r, int64_t inner, int64_t k,
                        bool largest, int64_t rows) {
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = row / inner, i = row % inner;
    const float* s = x + o * r * inner + i;
    int64_t prev = -1;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t a = 0; a < r; ++a) {
        if (prev >= 0 && !TopKBefore(s, inner, prev, a, largest)) continue;
        if (best < 0 || TopKBefore(s, inner, a, best, largest)) best = a;
      }
      if (best < 0) best = 0;  // not reached: the order is total, and k is at most r
      const int64_t at = (o * k + j) * inner + i;
      if (values) values[at] = s[best * inner];
      if (indices) indices[at] = best;
      prev = best;
    }
  }
}

}  // namespace

cudaError_t LaunchTopKF32(const float* x, float* values, int64_t* indices, int64_t outer, int64_t r,
                          int64_t inner, int64_t k, bool largest, cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows <= 0 || k <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  TopKF32<<<BlocksFor(rows), kThreads, 0, stream>>>(x, values, indices, r, inner, k, largest, rows);
  return cudaGetLastError();
}

namespace {

template <typename F, typename T>
__global__ void CastIntegralKernel(const F* __restrict__ x, T* __restrict__ y, int64_t n,
                                   bool to_bool) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // A bool (uint8_t here) is 0 or 1 whatever nonzero byte holds it.
    if constexpr (std::is_same_v<F, uint8_t>) {
      y[i] = T(x[i] != 0 ? 1 : 0);
    } else {
      y[i] = to_bool ? T(x[i] != F(0) ? 1 : 0) : static_cast<T>(x[i]);
    }
  }
}

template <typename F>
cudaError_t CastFrom(IntCastType to, const F* x, void* y, int64_t n, cudaStream_t stream) {
  switch (to) {
    case IntCastType::kInt64:
      CastIntegralKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<int64_t*>(y), n,
                                                                false);
      break;
    case IntCastType::kInt32:
      CastIntegralKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<int32_t*>(y), n,
                                                                false);
      break;
    case IntCastType::kBool:
      CastIntegralKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<uint8_t*>(y), n,
                                                                true);
      break;
    case IntCastType::kFp32:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCastIntegral(IntCastType from, IntCastType to, const void* x, void* y, int64_t n,
                               cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  switch (from) {
    case IntCastType::kInt64:
      return CastFrom(to, static_cast<const int64_t*>(x), y, n, stream);
    case IntCastType::kInt32:
      return CastFrom(to, static_cast<const int32_t*>(x), y, n, stream);
    case IntCastType::kBool:
      return CastFrom(to, static_cast<const uint8_t*>(x), y, n, stream);
    case IntCastType::kFp32:
      if (to != IntCastType::kBool) return cudaErrorInvalidValue;
      return CastFrom(to, static_cast<const float*>(x), y, n, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchReduceMiddleF32(ReduceKernel op, const float* x, float* y, int64_t outer,
                                  int64_t r, int64_t inner, cudaStream_t stream, Rounding half,
                                  void* h) {
  const int64_t n = outer * inner;
  if (n <= 0 || r <= 0) return cudaSuccess;
  if (BadRounding(half, h, y)) return cudaErrorInvalidValue;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  ReduceMiddleF32<<<BlocksFor(n), kThreads, 0, stream>>>(op, x, y, r, inner, n, half, h);
  return cudaGetLastError();
}

cudaError_t LaunchCastToF32(CastKernel from, const void* x, float* y, int64_t n,
                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  switch (from) {
    case CastKernel::kInt64:
      CastToF32<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const int64_t*>(x), y, n);
      break;
    case CastKernel::kInt32:
      CastToF32<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const int32_t*>(x), y, n);
      break;
    case CastKernel::kBool:
      BoolToF32<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const uint8_t*>(x), y, n);
      break;
    case CastKernel::kFp16:
      CastToF32<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const __half*>(x), y, n);
      break;
    case CastKernel::kBf16:
      CastToF32<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), y, n);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchCastF32ToHalf(HalfKernel to, const float* x, void* y, int64_t n,
                                cudaStream_t stream, int64_t channels, int64_t spatial) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  if (channels > 0) {
    if (spatial <= 0 || n % (channels * spatial) != 0) return cudaErrorInvalidValue;
    if (to == HalfKernel::kFp16) {
      F32ToHalfChannelsLast<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<__half*>(y), n,
                                                                   channels, spatial);
    } else {
      F32ToHalfChannelsLast<<<BlocksFor(n), kThreads, 0, stream>>>(
          x, static_cast<__nv_bfloat16*>(y), n, channels, spatial);
    }
    return cudaGetLastError();
  }
  if (to == HalfKernel::kFp16) {
    F32ToFp16<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<__half*>(y), n);
  } else {
    F32ToBf16<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y), n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCastF32ToInt(bool to64, const float* x, void* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  if (to64) {
    F32ToInt<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<int64_t*>(y), n,
                                                    std::numeric_limits<int64_t>::min(),
                                                    std::numeric_limits<int64_t>::max());
  } else {
    F32ToInt<<<BlocksFor(n), kThreads, 0, stream>>>(x, static_cast<int32_t*>(y), n,
                                                    std::numeric_limits<int32_t>::min(),
                                                    std::numeric_limits<int32_t>::max());
  }
  return cudaGetLastError();
}

cudaError_t LaunchArgExtremeMiddleF32(bool is_max, bool last, const float* x, int64_t* y,
                                      int64_t outer, int64_t r, int64_t inner,
                                      cudaStream_t stream) {
  const int64_t n = outer * inner;
  if (n <= 0 || r <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  ArgExtremeMiddleF32<<<BlocksFor(n), kThreads, 0, stream>>>(is_max, last, x, y, r, inner, n);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
