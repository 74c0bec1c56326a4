// Launch geometry shared by the .cu files (nvcc only; see kernels.h for the contracts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda::internal {

// Threads per block of every element-wise and row kernel.
inline constexpr int kThreads = 256;

// Grid size for n elements with a grid-stride loop: enough blocks to fill the device,
// never more than the launch limit.
inline unsigned BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// Whether a launcher's optional rounding is malformed: `half` neither -1 nor a HalfKernel,
// a rounding with no buffer, or no output at all (y null without a rounding).
inline bool BadRounding(int half, const void* h, const void* y) {
  return half < -1 || half > static_cast<int>(HalfKernel::kBf16) || (half >= 0 && h == nullptr) ||
         (half < 0 && y == nullptr);
}

// Writes v rounded to nearest into h[i], as `half` (a HalfKernel) names h's type; nothing
// for -1. The optional 16-bit output of the convolution epilogue and the layer norm.
__device__ __forceinline__ void StoreRounded(int half, void* h, int64_t i, float v) {
  if (half == static_cast<int>(HalfKernel::kFp16)) {
    static_cast<__half*>(h)[i] = __float2half_rn(v);
  } else if (half == static_cast<int>(HalfKernel::kBf16)) {
    static_cast<__nv_bfloat16*>(h)[i] = __float2bfloat16_rn(v);
  }
}

// v * inv_scale clamped to [-127, 127] (zero_point 0) or [0, 255] (zero_point -128), rounded
// half to even, plus zero_point; a NaN becomes the low end (fmaxf first), as quantize.h's
// QuantizeValue computes it on the host.
__device__ __forceinline__ int8_t QuantizeS8(float v, float inv_scale, int zero_point) {
  const float lo = zero_point == 0 ? -127.f : 0.f, hi = zero_point == 0 ? 127.f : 255.f;
  return static_cast<int8_t>(__float2int_rn(fminf(fmaxf(v * inv_scale, lo), hi)) + zero_point);
}

}  // namespace shoal::engine::cuda::internal
