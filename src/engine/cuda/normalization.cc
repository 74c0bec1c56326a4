#include "engine/cuda/normalization.h"

#include <cstdint>
#include <string>

#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

Status LayerNormLastAxis(const float* x, const float* scale, const float* bias, float* y,
                         std::span<const int64_t> dims, float epsilon, cudaStream_t stream,
                         void* half, RoundTo half_type) {
  if (dims.empty()) return InvalidArgument("layer normalisation needs at least one dimension");
  if (!(epsilon > 0.f)) {
    return InvalidArgument("layer normalisation's epsilon must be positive; was " +
                           std::to_string(epsilon));
  }
  int64_t rows = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 0) return InvalidArgument("layer normalisation of a negative dimension");
    if (d + 1 < dims.size()) rows *= dims[d];
  }
  if (rows > 0x7fffffff) {
    return InvalidArgument("layer normalisation of more than 2^31-1 rows");
  }
  // The rounding's bytes must not be x's or y's: each thread reads x and writes y and half.
  RETURN_IF_ERROR(CheckRounding("layer normalisation", half, x, y, rows * dims.back(), half_type));
  return CudaStatus(
      internal::LaunchLayerNormF32(x, scale, bias, y, rows, dims.back(), epsilon, stream, half,
                                   half ? half_type.kernel() : internal::Rounding()),
      "layer normalisation kernel launch");
}

}  // namespace shoal::engine::cuda
