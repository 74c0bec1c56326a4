#include "engine/cuda/reduce.h"

#include <string>

#include "core/tensor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

Status ReduceAxes(ReduceOp op, const float* x, float* y, std::span<const int64_t> dims,
                  int64_t first, int64_t count, cudaStream_t stream, void* half,
                  RoundTo half_type) {
  const auto rank = static_cast<int64_t>(dims.size());
  if (count < 1 || first < 0 || first + count > rank) {
    return InvalidArgument("reduce axes [" + std::to_string(first) + ", " +
                           std::to_string(first + count) + ") of " + ShapeToString(dims));
  }
  int64_t outer = 1, r = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (dims[d] < 0) return InvalidArgument("reduce over shape " + ShapeToString(dims));
    (d < first ? outer : d < first + count ? r : inner) *= dims[d];
  }
  if (r == 0) return InvalidArgument("reduce over an empty axis of " + ShapeToString(dims));
  if (y == nullptr && half == nullptr) return InvalidArgument("reduce: no output");
  // Each thread reads x and writes y and half: half's bytes must be neither's.
  const auto out = static_cast<uint64_t>(outer * inner);
  RETURN_IF_ERROR(CheckInt8Copy("reduce", half, half_type));
  const uint64_t half_bytes = half ? out * half_type.bytes() : 0;
  if (BytesOverlap(half, half_bytes, x, out * static_cast<uint64_t>(r) * sizeof(float)) ||
      BytesOverlap(half, half_bytes, y, y ? out * sizeof(float) : 0)) {
    return InvalidArgument("reduce: its 16-bit or int8 output overlaps x or y");
  }
  return CudaStatus(internal::LaunchReduceMiddleF32(
                        static_cast<internal::ReduceKernel>(op), x, y, outer, r, inner, stream,
                        half ? half_type.kernel() : internal::Rounding(), half),
                    "reduce kernel launch");
}

Status TopK(const float* x, float* values, int64_t* indices, std::span<const int64_t> dims,
            int64_t axis, int64_t k, bool largest, cudaStream_t stream) {
  const auto rank = static_cast<int64_t>(dims.size());
  if (axis < 0 || axis >= rank)
    return InvalidArgument("TopK along axis " + std::to_string(axis) + " of " +
                           ShapeToString(dims));
  int64_t outer = 1, r = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (dims[d] < 0) return InvalidArgument("TopK over shape " + ShapeToString(dims));
    (d < axis ? outer : d == axis ? r : inner) *= dims[d];
  }
  if (k < 1 || k > r)
    return InvalidArgument("TopK: k is " + std::to_string(k) + "; the axis has " +
                           std::to_string(r));
  return CudaStatus(
      internal::LaunchTopKF32(x, values, indices, outer, r, inner, k, largest, stream),
      "TopK kernel launch");
}

Status ArgExtreme(bool is_max, bool last, const float* x, int64_t* y, std::span<const int64_t> dims,
                  int64_t axis, cudaStream_t stream) {
  const auto rank = static_cast<int64_t>(dims.size());
  if (axis < 0 || axis >= rank) {
    return InvalidArgument("arg extreme along axis " + std::to_string(axis) + " of " +
                           ShapeToString(dims));
  }
  int64_t outer = 1, r = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (dims[d] < 0) return InvalidArgument("arg extreme over shape " + ShapeToString(dims));
    (d < axis ? outer : d == axis ? r : inner) *= dims[d];
  }
  if (r == 0) return InvalidArgument("arg extreme over an empty axis of " + ShapeToString(dims));
  return CudaStatus(
      internal::LaunchArgExtremeMiddleF32(is_max, last, x, y, outer, r, inner, stream),
      "arg extreme kernel launch");
}

}  // namespace shoal::engine::cuda
