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

// Writes v rounded to nearest into h[i], as `half` (a HalfKernel) names h's type; nothing
// for -1. The optional 16-bit output of the convolution epilogue and the layer norm.
__device__ __forceinline__ void StoreRounded(int half, void* h, int64_t i, float v) {
  if (half == static_cast<int>(HalfKernel::kFp16)) {
    static_cast<__half*>(h)[i] = __float2half_rn(v);
  } else if (half == static_cast<int>(HalfKernel::kBf16)) {
    static_cast<__nv_bfloat16*>(h)[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace shoal::engine::cuda::internal
