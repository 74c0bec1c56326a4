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

// Whether a launcher's optional rounding is malformed: a kind neither -1, a HalfKernel nor
// kInt8Copy, a rounding with no buffer, or no output at all (y null without a rounding).
inline bool BadRounding(const Rounding& half, const void* h, const void* y) {
  return half.kind < -1 || half.kind > kInt8Copy || (half.kind >= 0 && h == nullptr) ||
         (half.kind < 0 && y == nullptr);
}

// v * inv_scale clamped to [-127, 127] (zero_point 0) or [0, 255] (zero_point -128), rounded
// half to even, plus zero_point; a NaN becomes the low end (fmaxf first), as quantize.h's
// QuantizeValue computes it on the host.
__device__ __forceinline__ int8_t QuantizeS8(float v, float inv_scale, int zero_point) {
  const float lo = zero_point == 0 ? -127.f : 0.f, hi = zero_point == 0 ? 127.f : 255.f;
  return static_cast<int8_t>(__float2int_rn(fminf(fmaxf(v * inv_scale, lo), hi)) + zero_point);
}

// Writes v into h[i] as `r` says (Rounding): rounded to nearest as a 16-bit type, or
// quantised to int8; nothing for kind -1. The optional second output of the kernels that
// take a Rounding.
__device__ __forceinline__ void StoreRounded(const Rounding& r, void* h, int64_t i, float v) {
  if (r.kind == static_cast<int>(HalfKernel::kFp16)) {
    static_cast<__half*>(h)[i] = __float2half_rn(v);
  } else if (r.kind == static_cast<int>(HalfKernel::kBf16)) {
    static_cast<__nv_bfloat16*>(h)[i] = __float2bfloat16_rn(v);
  } else if (r.kind == kInt8Copy) {
    static_cast<int8_t*>(h)[i] = QuantizeS8(v, r.inv_scale, r.zero_point);
  }
}

}  // namespace shoal::engine::cuda::internal
