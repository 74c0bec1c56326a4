// Transpose, Gather and layer normalisation kernels (see kernels.h for the contracts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

__global__ void TransposeF32(const float* __restrict__ x, float* __restrict__ y,
                             TransposeIndex index, int64_t n, Rounding half, void* __restrict__ h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, from = 0;
    for (int d = index.rank - 1; d >= 0; --d) {
      from += (rest % index.out_dims[d]) * index.in_strides[d];
      rest /= index.out_dims[d];
    }
    const float v = x[from];
    if (y != nullptr) y[i] = v;
    StoreRounded(half, h, i, v);
  }
}

__global__ void GatherF32(const float* __restrict__ data, const int64_t* __restrict__ indices,
                          float* __restrict__ y, int64_t axis_dim, int64_t inner,
                          int64_t num_indices, int64_t n, int32_t* error_flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % inner;
    const int64_t j = (i / inner) % num_indices;
    const int64_t o = i / (inner * num_indices);
    int64_t k = indices[j];
    if (k < 0) k += axis_dim;
    if (k < 0 || k >= axis_dim) {
      atomicOr(error_flag, 1);
      y[i] = 0.f;
      continue;
    }
    y[i] = data[(o * axis_dim + k) * inner + c];
  }
}

__global__ void ResizeF32(const float* __restrict__ x, float* __restrict__ y,
                          const int64_t* __restrict__ idx, const float* __restrict__ w,
                          ResizeIndex index, float extrapolation, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    // Each axis's first entry for this element's coordinate, and how many combinations.
    int64_t entry[kMaxRank];
    int64_t rest = i, combos = 1;
    bool outside = false;
    for (int d = index.rank - 1; d >= 0; --d) {
      const int64_t c = rest % index.out_dims[d];
      rest /= index.out_dims[d];
      entry[d] = index.table_offset[d] + c * index.taps[d];
      outside = outside || idx[entry[d]] < 0;
      combos *= index.taps[d];
    }
    if (outside) {
      y[i] = extrapolation;
      continue;
    }
    float acc = 0.f;
    for (int64_t k = 0; k < combos; ++k) {
      int64_t left = k, from = 0;
      float weight = 1.f;
      for (int d = index.rank - 1; d >= 0; --d) {
        const int64_t e = entry[d] + left % index.taps[d];
        left /= index.taps[d];
        weight *= w[e];
        from += idx[e] * index.in_strides[d];
      }
      if (weight != 0.f) acc += weight * x[from];
    }
    y[i] = acc;
  }
}

__global__ void PadF32(const float* __restrict__ x, float* __restrict__ y, PadIndex index,
                       float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, from = 0, stride = 1;
    bool inside = true;
    for (int d = index.rank - 1; d >= 0; --d) {
      int64_t c = rest % index.out_dims[d] - index.begin[d];
      rest /= index.out_dims[d];
      const int64_t n_d = index.in_dims[d];
      if (c < 0 || c >= n_d) {
        if (index.mode == 1) {
          c = c < 0 ? 0 : n_d - 1;
        } else if (index.mode == 2) {
          c = c < 0 ? -c : 2 * (n_d - 1) - c;
        } else {
          inside = false;
        }
      }
      from += c * stride;
      stride *= index.in_dims[d];
    }
    y[i] = inside ? x[from] : value;
  }
}

// Sum of `value` over the block, returned to every thread. `scratch` holds kThreads floats.
__device__ float BlockSum(float value, float* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();  // scratch is reused by the next call
  return total;
}

// One block per row; two passes over the row (mean, then the variance about it), which
// keeps the precision a one-pass sum of squares loses when the mean is large.
__global__ void LayerNormF32(const float* x, const float* __restrict__ scale,
                             const float* __restrict__ bias, float* y, int64_t cols,
                             float epsilon, void* h, Rounding half) {
  __shared__ float scratch[kThreads];
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += row[c];
  const float mean = BlockSum(sum, scratch) / static_cast<float>(cols);
  float squares = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = row[c] - mean;
    squares += d * d;
  }
  const float variance = BlockSum(squares, scratch) / static_cast<float>(cols);
  const float inv = rsqrtf(variance + epsilon);
  const int64_t at = blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (row[c] - mean) * inv * scale[c];
    if (bias != nullptr) v += bias[c];
    out[c] = v;
    StoreRounded(half, h, at + c, v);
  }
}

}  // namespace

cudaError_t LaunchTransposeF32(const float* x, float* y, const TransposeIndex& index, int64_t n,
                               cudaStream_t stream, Rounding half, void* h) {
  if (n <= 0) return cudaSuccess;
  if (BadRounding(half, h, y)) return cudaErrorInvalidValue;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  TransposeF32<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, index, n, half, h);
  return cudaGetLastError();
}

cudaError_t LaunchPadF32(const float* x, float* y, const PadIndex& index, float value, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  PadF32<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, index, value, n);
  return cudaGetLastError();
}

cudaError_t LaunchGatherF32(const float* data, const int64_t* indices, float* y, int64_t outer,
                            int64_t axis_dim, int64_t inner, int64_t num_indices,
                            int32_t* error_flag, cudaStream_t stream) {
  const int64_t n = outer * num_indices * inner;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  GatherF32<<<BlocksFor(n), kThreads, 0, stream>>>(data, indices, y, axis_dim, inner, num_indices,
                                                   n, error_flag);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormF32(const float* x, const float* scale, const float* bias, float* y,
                               int64_t rows, int64_t cols, float epsilon, cudaStream_t stream,
                               void* h, Rounding half) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (BadRounding(half, h, y) || y == nullptr) return cudaErrorInvalidValue;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  LayerNormF32<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, scale, bias, y, cols,
                                                                     epsilon, h, half);
  return cudaGetLastError();
}

cudaError_t LaunchResizeF32(const float* x, float* y, const int64_t* idx, const float* w,
                            const ResizeIndex& index, float extrapolation, int64_t n,
                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  ResizeF32<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, idx, w, index, extrapolation, n);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
