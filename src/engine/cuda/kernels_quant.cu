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

__global__ void DequantizeInt8(const int32_t* __restrict__ acc, const float* __restrict__ scale,
                               const float* __restrict__ bias, float* __restrict__ y,
                               int64_t n, int64_t total, bool relu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i % n;
    float v = static_cast<float>(acc[i]) * scale[j] + (bias != nullptr ? bias[j] : 0.f);
    y[i] = relu && v < 0.f ? 0.f : v;  // ReLU keeps a NaN, as the others do
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
                                 float* y, int64_t rows, int64_t n, bool relu,
                                 cudaStream_t stream) {
  const int64_t total = rows * n;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  DequantizeInt8<<<BlocksFor(total), kThreads, 0, stream>>>(acc, scale, bias, y, n, total, relu);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
