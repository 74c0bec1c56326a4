// im2col, pooling and transposed-convolution kernels (see kernels.h for the contracts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

// The value stored for v in a column of type T.
template <typename T>
__device__ T ColumnValue(float v);
template <>
__device__ float ColumnValue<float>(float v) {
  return v;
}
template <>
__device__ __half ColumnValue<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 ColumnValue<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void Im2Col(const float* __restrict__ x, T* __restrict__ cols, Window2d g,
                       int64_t total) {
  const int64_t cg = g.c / g.groups;
  const int64_t kg = cg * g.kh * g.kw;
  const int64_t rows = g.n * g.oh * g.ow;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t kk = i % kg;
    const int64_t row = (i / kg) % rows;
    const int64_t group = i / (kg * rows);
    const int64_t c = group * cg + kk / (g.kh * g.kw);
    const int64_t ky = (kk / g.kw) % g.kh;
    const int64_t kx = kk % g.kw;
    const int64_t ox = row % g.ow;
    const int64_t oy = (row / g.ow) % g.oh;
    const int64_t b = row / (g.ow * g.oh);
    const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
    const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
    cols[i] = ColumnValue<T>(iy >= 0 && iy < g.h && ix >= 0 && ix < g.w
                                 ? x[((b * g.c + c) * g.h + iy) * g.w + ix]
                                 : 0.f);
  }
}

__global__ void Pool2dF32(PoolKernel op, const float* __restrict__ x, float* __restrict__ y,
                          Window2d g, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ox = i % g.ow;
    const int64_t oy = (i / g.ow) % g.oh;
    const int64_t plane = i / (g.ow * g.oh);  // b * c + channel
    const float* in = x + plane * g.h * g.w;
    float best = -FLT_MAX, sum = 0.f;
    int64_t inside = 0;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
        if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
        const float v = in[iy * g.w + ix];
        best = fmaxf(best, v);
        sum += v;
        ++inside;
      }
    }
    if (inside == 0) {
      y[i] = 0.f;
    } else if (op == PoolKernel::kMax) {
      y[i] = best;
    } else {
      // Counting the padding divides by the whole window, as the CPU engine (oneDNN's
      // avg_include_padding) does, also where a ceil_mode window runs past the padding.
      y[i] = sum / static_cast<float>(op == PoolKernel::kAverage ? inside : g.kh * g.kw);
    }
  }
}

// One thread per output element: it gathers the inputs that reach it, instead of each input
// scattering into the outputs it reaches (no atomics, and every output written once).
__global__ void ConvTransposeF32(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ bias, float* __restrict__ y, Window2d g,
                                 int64_t m, int64_t total) {
  const int64_t cg = g.c / g.groups, mg = m / g.groups;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ox = i % g.ow;
    const int64_t oy = (i / g.ow) % g.oh;
    const int64_t oc = (i / (g.ow * g.oh)) % m;
    const int64_t b = i / (g.ow * g.oh * m);
    const int64_t group = oc / mg, om = oc % mg;
    float sum = bias != nullptr ? bias[oc] : 0.f;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t ty = oy + g.ph - ky * g.dh;
      if (ty < 0 || ty % g.sh != 0) continue;
      const int64_t iy = ty / g.sh;
      if (iy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t tx = ox + g.pw - kx * g.dw;
        if (tx < 0 || tx % g.sw != 0) continue;
        const int64_t ix = tx / g.sw;
        if (ix >= g.w) continue;
        for (int64_t c = group * cg; c < (group + 1) * cg; ++c) {
          sum +=
              x[((b * g.c + c) * g.h + iy) * g.w + ix] * w[((c * mg + om) * g.kh + ky) * g.kw + kx];
        }
      }
    }
    y[i] = sum;
  }
}

}  // namespace

cudaError_t LaunchConvTransposeF32(const float* x, const float* w, const float* bias, float* y,
                                   const Window2d& g, int64_t m, cudaStream_t stream) {
  const int64_t total = g.n * m * g.oh * g.ow;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  ConvTransposeF32<<<BlocksFor(total), kThreads, 0, stream>>>(x, w, bias, y, g, m, total);
  return cudaGetLastError();
}

cudaError_t LaunchIm2ColF32(const float* x, float* cols, const Window2d& g, cudaStream_t stream) {
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  Im2Col<float><<<BlocksFor(total), kThreads, 0, stream>>>(x, cols, g, total);
  return cudaGetLastError();
}

cudaError_t LaunchIm2ColHalf(HalfKernel to, const float* x, void* cols, const Window2d& g,
                             cudaStream_t stream) {
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  if (to == HalfKernel::kFp16) {
    Im2Col<__half>
        <<<BlocksFor(total), kThreads, 0, stream>>>(x, static_cast<__half*>(cols), g, total);
  } else {
    Im2Col<__nv_bfloat16>
        <<<BlocksFor(total), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(cols), g, total);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPool2dF32(PoolKernel op, const float* x, float* y, const Window2d& g,
                            cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  Pool2dF32<<<BlocksFor(total), kThreads, 0, stream>>>(op, x, y, g, total);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
