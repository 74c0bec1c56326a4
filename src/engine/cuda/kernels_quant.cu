// int8 quantisation kernels (see kernels.h for the contracts, quantize.h for the scheme).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

__global__ void QuantizeInt8(const float* __restrict__ x, int8_t* __restrict__ q, int64_t count,
                             float inv_scale, int zero_point) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    q[i] = QuantizeS8(x[i], inv_scale, zero_point);
  }
}

// Index as the convolution epilogue's: uint32_t where every index fits (a division in 32
// bits is several times faster than in 64), else int64_t.
template <typename Index>
__global__ void DequantizeInt8(const int32_t* __restrict__ acc, const float* __restrict__ scale,
                               const float* __restrict__ bias, float* __restrict__ y, Index n,
                               Index total, bool relu, int8_t* __restrict__ q, float q_inv_scale,
                               int q_zero_point) {
  for (Index i = blockIdx.x * Index{blockDim.x} + threadIdx.x; i < total;
       i += Index{gridDim.x} * blockDim.x) {
    const Index j = i % n;
    float v = static_cast<float>(acc[i]) * scale[j] + (bias != nullptr ? bias[j] : 0.f);
    if (relu && v < 0.f) v = 0.f;  // ReLU keeps a NaN, as the others do
    if (y != nullptr) y[i] = v;
    if (q != nullptr) q[i] = QuantizeS8(v, q_inv_scale, q_zero_point);
  }
}

}  // namespace

cudaError_t LaunchQuantizeInt8(const float* x, int8_t* q, int64_t count, float inv_scale,
                               int zero_point, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  QuantizeInt8<<<BlocksFor(count), kThreads, 0, stream>>>(x, q, count, inv_scale, zero_point);
  return cudaGetLastError();
}

cudaError_t LaunchDequantizeInt8(const int32_t* acc, const float* scale, const float* bias,
                                 float* y, int64_t rows, int64_t n, bool relu, cudaStream_t stream,
                                 int8_t* q, float q_inv_scale, int q_zero_point) {
  const int64_t total = rows * n;
  if (total <= 0) return cudaSuccess;
  if (y == nullptr && q == nullptr) return cudaErrorInvalidValue;
  (void)cudaGetLastError();
  const unsigned blocks = BlocksFor(total);
  // The largest index a thread computes: its last element plus one grid stride.
  if (total + int64_t{blocks} * kThreads < (int64_t{1} << 32)) {
    DequantizeInt8<uint32_t><<<blocks, kThreads, 0, stream>>>(
        acc, scale, bias, y, static_cast<uint32_t>(n), static_cast<uint32_t>(total), relu, q,
        q_inv_scale, q_zero_point);
  } else {
    DequantizeInt8<int64_t><<<blocks, kThreads, 0, stream>>>(acc, scale, bias, y, n, total, relu,
                                                             q, q_inv_scale, q_zero_point);
  }
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
