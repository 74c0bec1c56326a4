// Launch geometry shared by the .cu files (nvcc only; see kernels.h for the contracts).
#pragma once

#include <cstdint>

namespace shoal::engine::cuda::internal {

// Threads per block of every element-wise and row kernel.
inline constexpr int kThreads = 256;

// Grid size for n elements with a grid-stride loop: enough blocks to fill the device,
// never more than the launch limit.
inline unsigned BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace shoal::engine::cuda::internal
