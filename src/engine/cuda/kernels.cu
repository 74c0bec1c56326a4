// shoal's own CUDA kernels (see kernels.h for the contract). fp32, except the convolution
// epilogue, which also reads a 16-bit convolution's output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

__device__ __forceinline__ float ApplyUnary(UnaryKernel op, float x, float alpha, float beta) {
  switch (op) {
    case UnaryKernel::kRelu:
      // A NaN passes through, as the CPU engine's (oneDNN's) ReLU lets it.
      return x > 0.f || x != x ? x : 0.f;
    case UnaryKernel::kSigmoid:
      return 1.f / (1.f + expf(-x));
    case UnaryKernel::kTanh:
      return tanhf(x);
    case UnaryKernel::kExp:
      return expf(x);
    case UnaryKernel::kLog:
      return logf(x);
    case UnaryKernel::kNeg:
      return -x;
    case UnaryKernel::kAbs:
      return fabsf(x);
    case UnaryKernel::kSqrt:
      return sqrtf(x);
    case UnaryKernel::kErf:
      return erff(x);
    // The exact (erf) form, as ONNX's Gelu with approximate="none".
    case UnaryKernel::kGelu:
      return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case UnaryKernel::kLeakyRelu:
      return x >= 0.f ? x : alpha * x;
    case UnaryKernel::kClip:  // alpha the lower bound, beta the upper
      return fminf(fmaxf(x, alpha), beta);
    case UnaryKernel::kHardSigmoid:
      return fminf(fmaxf(alpha * x + beta, 0.f), 1.f);
    case UnaryKernel::kHardSwish:
      return x * fminf(fmaxf(x / 6.f + 0.5f, 0.f), 1.f);
    case UnaryKernel::kFloor:
      return floorf(x);
    case UnaryKernel::kCeil:
      return ceilf(x);
    case UnaryKernel::kReciprocal:
      return 1.f / x;
    case UnaryKernel::kSoftplus:  // log(1 + e^x), exact in fp32 past 20
      return x > 20.f ? x : log1pf(expf(x));
    case UnaryKernel::kElu:
      return x > 0.f ? x : alpha * (expf(x) - 1.f);
  }
  return x;
}

__device__ __forceinline__ float ApplyBinary(BinaryKernel op, float a, float b) {
  switch (op) {
    case BinaryKernel::kAdd:
      return a + b;
    case BinaryKernel::kSub:
      return a - b;
    case BinaryKernel::kMul:
      return a * b;
    case BinaryKernel::kDiv:
      return a / b;
    case BinaryKernel::kMax:
      return fmaxf(a, b);
    case BinaryKernel::kMin:
      return fminf(a, b);
    case BinaryKernel::kPow:
      return powf(a, b);
    case BinaryKernel::kPRelu:  // b the slope
      return a < 0.f ? a * b : a;
  }
  return a;
}

// The elements of a and b that output element i reads under `index`.
__device__ __forceinline__ void BroadcastOffsets(const BroadcastIndex& index, int64_t i,
                                                 int64_t* ia, int64_t* ib) {
  int64_t rest = i;
  *ia = 0;
  *ib = 0;
  for (int d = index.rank - 1; d >= 0; --d) {
    const int64_t coord = rest % index.out_dims[d];
    rest /= index.out_dims[d];
    *ia += coord * index.a_strides[d];
    *ib += coord * index.b_strides[d];
  }
}

__global__ void UnaryF32(UnaryKernel op, const float* x, float* y, int64_t n, float alpha,
                         float beta) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = ApplyUnary(op, x[i], alpha, beta);
  }
}

// The same, also (or only, y null) writing the result rounded into h.
__global__ void UnaryRounding(UnaryKernel op, const float* x, float* y, int64_t n, float alpha,
                              float beta, Rounding half, void* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = ApplyUnary(op, x[i], alpha, beta);
    if (y != nullptr) y[i] = v;
    StoreRounded(half, h, i, v);
  }
}

__global__ void BinaryF32(BinaryKernel op, const float* a, const float* b, float* y,
                          BroadcastIndex index, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t ia, ib;
    BroadcastOffsets(index, i, &ia, &ib);
    y[i] = ApplyBinary(op, a[ia], b[ib]);
  }
}

// The same, also (or only, y null) writing the result rounded into h.
__global__ void BinaryRounding(BinaryKernel op, const float* a, const float* b, float* y,
                               BroadcastIndex index, int64_t n, Rounding half, void* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t ia, ib;
    BroadcastOffsets(index, i, &ia, &ib);
    const float v = ApplyBinary(op, a[ia], b[ib]);
    if (y != nullptr) y[i] = v;
    StoreRounded(half, h, i, v);
  }
}

template <typename T>
__device__ __forceinline__ bool ApplyCompare(CompareKernel op, T a, T b) {
  switch (op) {
    case CompareKernel::kEqual:
      return a == b;
    case CompareKernel::kLess:
      return a < b;
    case CompareKernel::kGreater:
      return a > b;
    case CompareKernel::kLessOrEqual:
      return a <= b;
    case CompareKernel::kGreaterOrEqual:
      return a >= b;
  }
  return false;
}

template <typename T>
__global__ void CompareKernelT(CompareKernel op, const T* a, const T* b, uint8_t* y,
                               BroadcastIndex index, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t ia, ib;
    BroadcastOffsets(index, i, &ia, &ib);
    y[i] = ApplyCompare(op, a[ia], b[ib]) ? 1 : 0;
  }
}

__global__ void LogicalU8(LogicalKernel op, const uint8_t* a, const uint8_t* b, uint8_t* y,
                          BroadcastIndex index, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (op == LogicalKernel::kNot) {
      y[i] = a[i] == 0 ? 1 : 0;
      continue;
    }
    int64_t ia, ib;
    BroadcastOffsets(index, i, &ia, &ib);
    const bool p = a[ia] != 0, q = b[ib] != 0;
    y[i] = (op == LogicalKernel::kAnd  ? p && q
            : op == LogicalKernel::kOr ? p || q
                                       : p != q)
               ? 1
               : 0;
  }
}

__global__ void ModuloF32(const float* a, const float* b, float* y, BroadcastIndex index,
                          int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t ia, ib;
    BroadcastOffsets(index, i, &ia, &ib);
    y[i] = fmodf(a[ia], b[ib]);
  }
}

__global__ void ModuloI64(bool fmod, const int64_t* a, const int64_t* b, int64_t* y,
                          BroadcastIndex index, int64_t n, int32_t* error_flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t ia, ib;
    BroadcastOffsets(index, i, &ia, &ib);
    const int64_t x = a[ia], m = b[ib];
    if (m == 0) {
      atomicOr(error_flag, 2);
      y[i] = 0;
      continue;
    }
    int64_t r = x % m;
    if (!fmod && r != 0 && ((r < 0) != (m < 0))) r += m;
    y[i] = r;
  }
}

__global__ void WhereF32(const uint8_t* cond, const float* a, const float* b, float* y,
                         WhereIndex index, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, ic = 0, ia = 0, ib = 0;
    for (int d = index.rank - 1; d >= 0; --d) {
      const int64_t coord = rest % index.out_dims[d];
      rest /= index.out_dims[d];
      ic += coord * index.cond_strides[d];
      ia += coord * index.a_strides[d];
      ib += coord * index.b_strides[d];
    }
    y[i] = cond[ic] != 0 ? a[ia] : b[ib];
  }
}

// One block per row: the row's maximum, then the sum of exp(x - max), each reduced in
// shared memory, then the quotients. Subtracting the maximum keeps exp finite.
__global__ void SoftmaxRowsF32(const float* x, float* y, int64_t cols, bool log, Rounding half,
                               void* h) {
  __shared__ float scratch[kThreads];
  const float* row = x + blockIdx.x * cols;
  float* out = y != nullptr ? y + blockIdx.x * cols : nullptr;
  const int64_t first = blockIdx.x * cols;  // the row's first element, in h
  // Writes column c's result: into y, and rounded into h.
  auto store = [&](int64_t c, float v) {
    if (out != nullptr) out[c] = v;
    StoreRounded(half, h, first + c, v);
  };
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  scratch[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s)
      scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  const float row_max = scratch[0];
  __syncthreads();
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(row[c] - row_max);
  scratch[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  if (log) {
    const float log_sum = logf(scratch[0]);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store(c, row[c] - row_max - log_sum);
    return;
  }
  const float inv = 1.f / scratch[0];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) store(c, expf(row[c] - row_max) * inv);
}

// A convolution's epilogue (kernels.h): c and y may be the same buffer (fp32).
__device__ __forceinline__ float SourceValue(const float* c, int64_t i) { return c[i]; }
__device__ __forceinline__ float SourceValue(const __half* c, int64_t i) {
  return __half2float(c[i]);
}
__device__ __forceinline__ float SourceValue(const __nv_bfloat16* c, int64_t i) {
  return __bfloat162float(c[i]);
}
// An int8 GEMM's sums, scaled by the caller.
__device__ __forceinline__ float SourceValue(const int32_t* c, int64_t i) {
  return static_cast<float>(c[i]);
}

// The residual's element i, as its type (a ConvEpilogueKernel::residual) says.
__device__ __forceinline__ float ResidualValue(int type, const void* z, int64_t i) {
  if (type == static_cast<int>(HalfKernel::kFp16))
    return SourceValue(static_cast<const __half*>(z), i);
  if (type == static_cast<int>(HalfKernel::kBf16))
    return SourceValue(static_cast<const __nv_bfloat16*>(z), i);
  return static_cast<const float*>(z)[i];
}

// Index: uint32_t where every index fits (the channel's division in 32 bits, which the GPU
// does several times faster than in 64), else int64_t.
// The threads walk c's layout (NCHW, or NHWC where c is channels last), so that its reads
// and the writes in its layout are in order; an operand in the other layout is indexed
// through the element's batch, channel and position.
template <typename T, typename Index>
__global__ void ConvEpilogue(ConvEpilogueKernel e, const T* c, const float* __restrict__ bias,
                             const void* __restrict__ z, float* y, void* h,
                             const float* __restrict__ scale) {
  const auto elements = static_cast<Index>(e.elements);
  const auto spatial = static_cast<Index>(e.spatial), channels = static_cast<Index>(e.channels);
  const bool mixed = e.source_channels_last || e.residual_channels_last || e.half_channels_last;
  for (Index i = blockIdx.x * Index{blockDim.x} + threadIdx.x; i < elements;
       i += Index{gridDim.x} * blockDim.x) {
    Index channel, nchw = i, nhwc = i;
    if (!mixed) {
      channel = (i / spatial) % channels;
    } else if (e.source_channels_last) {
      channel = i % channels;
      const Index pixel = i / channels, b = pixel / spatial;  // pixel: b * spatial + s
      nchw = (b * channels + channel) * spatial + (pixel - b * spatial);
    } else {
      const Index plane = i / spatial, b = plane / channels;  // plane: b * channels + channel
      channel = plane - b * channels;
      nhwc = (b * spatial + (i - plane * spatial)) * channels + channel;
    }
    float v = SourceValue(c, i);
    // int8 sums: scaled as DequantizeInt8 scales them, then the bias (the zero point's share
    // already taken out of it).
    if constexpr (std::is_same_v<T, int32_t>) v *= scale[channel];
    if (bias != nullptr) v += bias[channel];
    if (e.has_act) v = ApplyUnary(e.act, v, e.act_alpha, e.act_beta);
    if (z != nullptr) v += ResidualValue(e.residual, z, e.residual_channels_last ? nhwc : nchw);
    if (e.has_post) v = ApplyUnary(e.post, v, e.post_alpha, e.post_beta);
    if (y != nullptr) y[nchw] = v;
    StoreRounded(e.half, h, e.half_channels_last ? nhwc : nchw, v);
  }
}

}  // namespace

cudaError_t LaunchUnaryF32(UnaryKernel op, const float* x, float* y, int64_t n, float alpha,
                           float beta, cudaStream_t stream, Rounding half, void* h) {
  if (n <= 0) return cudaSuccess;
  if (BadRounding(half, h, y)) return cudaErrorInvalidValue;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (half.kind < 0) {
    UnaryF32<<<BlocksFor(n), kThreads, 0, stream>>>(op, x, y, n, alpha, beta);
  } else {
    UnaryRounding<<<BlocksFor(n), kThreads, 0, stream>>>(op, x, y, n, alpha, beta, half, h);
  }
  return cudaGetLastError();
}

cudaError_t LaunchConvEpilogue(const ConvEpilogueKernel& e, const void* c, const float* bias,
                               const void* z, float* y, void* h, cudaStream_t stream,
                               const float* scale) {
  if (e.elements <= 0) return cudaSuccess;
  if (BadRounding(e.half, h, y) || e.residual < -1 || e.residual > 1 ||
      (e.source_channels_last && e.source < 0) || (e.residual_channels_last && e.residual < 0) ||
      (e.half_channels_last && e.half.kind < 0) || (e.source == kInt32Sums && scale == nullptr) ||
      e.source < -1 || e.source > kInt32Sums)
    return cudaErrorInvalidValue;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  const unsigned blocks = BlocksFor(e.elements);
  // The largest index a thread computes: its last element plus one grid stride.
  const bool narrow = e.elements + int64_t{blocks} * kThreads < (int64_t{1} << 32);
  auto launch = [&](const auto* source) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(source)>>;
    if (narrow) {
      ConvEpilogue<T, uint32_t><<<blocks, kThreads, 0, stream>>>(e, source, bias, z, y, h, scale);
    } else {
      ConvEpilogue<T, int64_t><<<blocks, kThreads, 0, stream>>>(e, source, bias, z, y, h, scale);
    }
  };
  if (e.source == kInt32Sums) {
    launch(static_cast<const int32_t*>(c));
  } else if (e.source == static_cast<int>(HalfKernel::kFp16)) {
    launch(static_cast<const __half*>(c));
  } else if (e.source == static_cast<int>(HalfKernel::kBf16)) {
    launch(static_cast<const __nv_bfloat16*>(c));
  } else {
    launch(static_cast<const float*>(c));
  }
  return cudaGetLastError();
}

cudaError_t LaunchBinaryF32(BinaryKernel op, const float* a, const float* b, float* y,
                            const BroadcastIndex& index, int64_t n, cudaStream_t stream, Rounding half,
                            void* h) {
  if (n <= 0) return cudaSuccess;
  if (BadRounding(half, h, y)) return cudaErrorInvalidValue;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (half.kind < 0) {
    BinaryF32<<<BlocksFor(n), kThreads, 0, stream>>>(op, a, b, y, index, n);
  } else {
    BinaryRounding<<<BlocksFor(n), kThreads, 0, stream>>>(op, a, b, y, index, n, half, h);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCompare(CompareKernel op, bool int64_operands, const void* a, const void* b,
                          uint8_t* y, const BroadcastIndex& index, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (int64_operands) {
    CompareKernelT<<<BlocksFor(n), kThreads, 0, stream>>>(
        op, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b), y, index, n);
  } else {
    CompareKernelT<<<BlocksFor(n), kThreads, 0, stream>>>(
        op, static_cast<const float*>(a), static_cast<const float*>(b), y, index, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLogical(LogicalKernel op, const uint8_t* a, const uint8_t* b, uint8_t* y,
                          const BroadcastIndex& index, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  LogicalU8<<<BlocksFor(n), kThreads, 0, stream>>>(op, a, b, y, index, n);
  return cudaGetLastError();
}

cudaError_t LaunchModulo(bool int64_operands, bool fmod, const void* a, const void* b, void* y,
                         const BroadcastIndex& index, int64_t n, int32_t* error_flag,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (int64_operands) {
    ModuloI64<<<BlocksFor(n), kThreads, 0, stream>>>(
        fmod, static_cast<const int64_t*>(a), static_cast<const int64_t*>(b),
        static_cast<int64_t*>(y), index, n, error_flag);
  } else {
    ModuloF32<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const float*>(a),
                                                     static_cast<const float*>(b),
                                                     static_cast<float*>(y), index, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchWhereF32(const uint8_t* cond, const float* a, const float* b, float* y,
                           const WhereIndex& index, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  WhereF32<<<BlocksFor(n), kThreads, 0, stream>>>(cond, a, b, y, index, n);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxRowsF32(const float* x, float* y, int64_t rows, int64_t cols, bool log,
                                 cudaStream_t stream, Rounding half, void* h) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (BadRounding(half, h, y)) return cudaErrorInvalidValue;
  // Rows beyond the grid's first dimension would need a loop; 2^31-1 rows is far more
  // than any batch the engine plans.
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  SoftmaxRowsF32<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, y, cols, log, half, h);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
