#include "engine/cuda/layout.h"

#include <string>

#include "core/tensor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"

namespace shoal::engine::cuda {
StatusOr<TransposePlan> PlanTranspose(std::span<const int64_t> dims,
                                      std::span<const int64_t> perm) {
  const size_t rank = dims.size();
  std::vector<int64_t> p(perm.begin(), perm.end());
  if (p.empty()) {
    for (size_t i = 0; i < rank; ++i) p.push_back(static_cast<int64_t>(rank - 1 - i));
  }
  std::vector<bool> seen(rank, false);
  bool valid = p.size() == rank;
  for (size_t i = 0; valid && i < p.size(); ++i) {
    valid = p[i] >= 0 && p[i] < static_cast<int64_t>(rank) && !seen[p[i]];
    if (valid) seen[p[i]] = true;
  }
  if (!valid) {
    return InvalidArgument("perm " + ShapeToString(perm) + " is not a permutation of the " +
                           std::to_string(rank) + " axes of " + ShapeToString(dims));
  }
  for (int64_t d : dims) {
    if (d < 0) return InvalidArgument("transpose of shape " + ShapeToString(dims));
  }
  TransposePlan plan;
  plan.elements = 1;
  for (size_t i = 0; i < rank; ++i) {
    plan.out_dims.push_back(dims[p[i]]);
    plan.elements *= dims[p[i]];
  }
  std::vector<int64_t> in_strides(rank, 1);
  for (int d = static_cast<int>(rank) - 2; d >= 0; --d)
    in_strides[d] = in_strides[d + 1] * dims[d + 1];
  // Output axes i, i+1 that read input axes p[i], p[i]+1 in that order are one axis of the
  // product's size: the kernel walks fewer of them, and the rank limit applies to what is left.
  // Axes of size 1 drop out.
  std::vector<int64_t> out, strides;
  int64_t last_axis = -2;
  for (size_t i = 0; i < rank; ++i) {
    if (dims[p[i]] == 1) continue;
    if (!out.empty() && p[i] == last_axis + 1) {
      out.back() *= dims[p[i]];
      strides.back() = in_strides[p[i]];
    } else {
      out.push_back(dims[p[i]]);
      strides.push_back(in_strides[p[i]]);
    }
    last_axis = p[i];
  }
  if (out.size() > static_cast<size_t>(internal::kMaxRank)) {
    return InvalidArgument("transpose of " + ShapeToString(dims) + " by " + ShapeToString(p) +
                           " needs " + std::to_string(out.size()) +
                           " dimensions; the GPU kernels take at most " +
                           std::to_string(internal::kMaxRank));
  }
  plan.index.rank = static_cast<int>(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    plan.index.out_dims[i] = out[i];
    plan.index.in_strides[i] = strides[i];
  }
  return plan;
}

Status Transpose(const float* x, float* y, const TransposePlan& plan, cudaStream_t stream,
                 void* half, RoundTo half_type) {
  if (y == nullptr && half == nullptr) return InvalidArgument("transpose: no output");
  const auto bytes = static_cast<uint64_t>(plan.elements) * sizeof(float);
  if (BytesOverlap(x, bytes, y, y ? bytes : 0))
    return InvalidArgument("transpose: x and y overlap");
  RETURN_IF_ERROR(CheckRounding("transpose", half, x, y, plan.elements, half_type));
  return CudaStatus(
      internal::LaunchTransposeF32(x, y, plan.index, plan.elements, stream,
                                   half ? half_type.kernel() : internal::Rounding(), half),
      "transpose kernel launch");
}

StatusOr<GatherPlan> PlanGather(std::span<const int64_t> data_dims,
                                std::span<const int64_t> indices_dims, int64_t axis) {
  const auto rank = static_cast<int64_t>(data_dims.size());
  if (rank == 0 || axis < -rank || axis >= rank) {
    return InvalidArgument("gather axis " + std::to_string(axis) + " is outside the axes of " +
                           ShapeToString(data_dims));
  }
  if (axis < 0) axis += rank;
  GatherPlan plan;
  plan.outer = 1;
  plan.inner = 1;
  plan.num_indices = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (data_dims[d] < 0) return InvalidArgument("gather from shape " + ShapeToString(data_dims));
  }
  for (int64_t d = 0; d < axis; ++d) plan.outer *= data_dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) plan.inner *= data_dims[d];
  for (int64_t d : indices_dims) {
    if (d < 0)
      return InvalidArgument("gather with indices of shape " + ShapeToString(indices_dims));
    plan.num_indices *= d;
  }
  plan.axis_dim = data_dims[axis];
  plan.out_dims.assign(data_dims.begin(), data_dims.begin() + axis);
  plan.out_dims.insert(plan.out_dims.end(), indices_dims.begin(), indices_dims.end());
  plan.out_dims.insert(plan.out_dims.end(), data_dims.begin() + axis + 1, data_dims.end());
  return plan;
}

Status Gather(const float* data, const int64_t* indices, float* y, const GatherPlan& plan,
              int32_t* error_flag, cudaStream_t stream) {
  if (error_flag == nullptr) return InvalidArgument("gather needs an error flag in device memory");
  if (plan.axis_dim == 0 && plan.num_indices > 0 && plan.outer * plan.inner > 0) {
    return InvalidArgument("gather from an axis of size 0 with " +
                           std::to_string(plan.num_indices) +
                           " indices: every index is out of range");
  }
  return CudaStatus(internal::LaunchGatherF32(data, indices, y, plan.outer, plan.axis_dim,
                                              plan.inner, plan.num_indices, error_flag, stream),
                    "gather kernel launch");
}

Status SliceAxis(const float* x, float* y, std::span<const int64_t> dims, int64_t axis,
                 int64_t start, int64_t length, cudaStream_t stream) {
  const auto rank = static_cast<int64_t>(dims.size());
  if (axis < -rank || axis >= rank) {
    return InvalidArgument("slice axis " + std::to_string(axis) + " is outside the axes of " +
                           ShapeToString(dims));
  }
  if (axis < 0) axis += rank;
  if (start < 0 || length < 0 || start + length > dims[axis]) {
    return InvalidArgument("slice [" + std::to_string(start) + ", " +
                           std::to_string(start + length) + ") of axis " + std::to_string(axis) +
                           " of " + ShapeToString(dims));
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= dims[d];
  return CudaStatus(
      internal::LaunchSliceAxisF32(x, y, outer, dims[axis], start, length, inner, stream),
      "slice kernel launch");
}

StatusOr<SlicePlan> PlanSlice(std::span<const int64_t> dims, std::span<const int64_t> begin,
                              std::span<const int64_t> step, std::span<const int64_t> out_dims) {
  const size_t rank = dims.size();
  if (begin.size() != rank || step.size() != rank || out_dims.size() != rank ||
      rank > internal::kMaxRank) {
    return InvalidArgument("slice of " + ShapeToString(dims) + " into " + ShapeToString(out_dims) +
                           ": one begin and step per dimension, at most " +
                           std::to_string(internal::kMaxRank));
  }
  SlicePlan plan;
  plan.out_dims.assign(out_dims.begin(), out_dims.end());
  plan.index.rank = static_cast<int>(rank);
  plan.elements = 1;
  int64_t stride = 1;
  for (size_t d = rank; d-- > 0;) {
    const int64_t last = begin[d] + (out_dims[d] - 1) * step[d];
    if (step[d] == 0 || out_dims[d] < 0 ||
        (out_dims[d] > 0 && (begin[d] < 0 || begin[d] >= dims[d] || last < 0 || last >= dims[d]))) {
      return InvalidArgument("slice of axis " + std::to_string(d) + " of " + ShapeToString(dims) +
                             " from " + std::to_string(begin[d]) + " by " +
                             std::to_string(step[d]) + " for " + std::to_string(out_dims[d]) +
                             " elements reads outside it");
    }
    plan.index.out_dims[d] = out_dims[d];
    plan.index.in_strides[d] = stride * step[d];
    if (out_dims[d] > 0) plan.base += begin[d] * stride;
    plan.elements *= out_dims[d];
    stride *= dims[d];
  }
  return plan;
}

StatusOr<SlicePlan> PlanExpand(std::span<const int64_t> dims, std::span<const int64_t> out_dims) {
  const size_t rank = out_dims.size();
  if (dims.size() > rank || rank > internal::kMaxRank) {
    return InvalidArgument("expand of " + ShapeToString(dims) + " to " + ShapeToString(out_dims) +
                           ": at most " + std::to_string(internal::kMaxRank) +
                           " axes, and no fewer than the input's");
  }
  SlicePlan plan;
  plan.out_dims.assign(out_dims.begin(), out_dims.end());
  plan.index.rank = static_cast<int>(rank);
  plan.elements = 1;
  int64_t stride = 1;
  for (size_t d = rank; d-- > 0;) {
    const size_t lead = rank - dims.size();
    const int64_t in = d >= lead ? dims[d - lead] : 1;
    if (in != out_dims[d] && in != 1) {
      return InvalidArgument("expand of " + ShapeToString(dims) + " to " + ShapeToString(out_dims) +
                             ": axis " + std::to_string(d) + " is neither 1 nor the same");
    }
    plan.index.out_dims[d] = out_dims[d];
    plan.index.in_strides[d] = in == 1 ? 0 : stride;
    plan.elements *= out_dims[d];
    stride *= in;
  }
  return plan;
}

Status Slice(const float* x, float* y, const SlicePlan& plan, cudaStream_t stream) {
  return CudaStatus(
      internal::LaunchTransposeF32(x + plan.base, y, plan.index, plan.elements, stream),
      "slice kernel launch");
}

Status PlaceAxis(const float* x, float* y, std::span<const int64_t> x_dims,
                 std::span<const int64_t> y_dims, int64_t axis, int64_t start,
                 cudaStream_t stream) {
  const auto rank = static_cast<int64_t>(y_dims.size());
  bool ok = static_cast<int64_t>(x_dims.size()) == rank && axis >= -rank && axis < rank;
  if (ok && axis < 0) axis += rank;
  for (int64_t d = 0; ok && d < rank; ++d) ok = d == axis || x_dims[d] == y_dims[d];
  ok = ok && start >= 0 && start + x_dims[axis] <= y_dims[axis];
  if (!ok) {
    return InvalidArgument("cannot place " + ShapeToString(x_dims) + " at " +
                           std::to_string(start) + " along axis " + std::to_string(axis) + " of " +
                           ShapeToString(y_dims));
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= y_dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= y_dims[d];
  return CudaStatus(
      internal::LaunchPlaceAxisF32(x, y, outer, x_dims[axis], start, y_dims[axis], inner, stream),
      "place kernel launch");
}

StatusOr<PadPlan> PlanPad(std::span<const int64_t> dims, std::span<const int64_t> begin,
                          std::span<const int64_t> end, std::string_view mode) {
  const size_t rank = dims.size();
  if (begin.size() != rank || end.size() != rank || rank > internal::kMaxRank) {
    return InvalidArgument("pads for " + ShapeToString(dims) + " need one begin and one end per " +
                           "dimension, at most " + std::to_string(internal::kMaxRank));
  }
  PadPlan plan;
  plan.index.rank = static_cast<int>(rank);
  if (mode == "edge") {
    plan.index.mode = 1;
  } else if (mode == "reflect") {
    plan.index.mode = 2;
  } else if (mode != "constant") {
    return InvalidArgument("pad mode '" + std::string(mode) + "' is not constant, edge or reflect");
  }
  plan.elements = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (begin[d] < 0 || end[d] < 0 || dims[d] < 0)
      return InvalidArgument("negative pads (cropping) are not supported; pads of " +
                             ShapeToString(dims));
    const bool padded = begin[d] > 0 || end[d] > 0;
    if (plan.index.mode != 0 && padded && dims[d] == 0)
      return InvalidArgument(std::string(mode) + " padding of an empty axis of " +
                             ShapeToString(dims));
    if (plan.index.mode == 2 && padded && (begin[d] >= dims[d] || end[d] >= dims[d]))
      return InvalidArgument("reflect pads must be smaller than the axis; pads of " +
                             ShapeToString(dims));
    plan.out_dims.push_back(dims[d] + begin[d] + end[d]);
    plan.index.out_dims[d] = plan.out_dims.back();
    plan.index.in_dims[d] = dims[d];
    plan.index.begin[d] = begin[d];
    plan.elements *= plan.out_dims.back();
  }
  return plan;
}

Status Pad(const float* x, float* y, const PadPlan& plan, float value, cudaStream_t stream) {
  return CudaStatus(internal::LaunchPadF32(x, y, plan.index, value, plan.elements, stream),
                    "pad kernel launch");
}

StatusOr<ResizePlan> PlanResize(const std::vector<ResizeAxis>& axes) {
  if (axes.size() > static_cast<size_t>(internal::kMaxRank)) {
    return InvalidArgument("Resize of " + std::to_string(axes.size()) +
                           " axes; the GPU kernel takes at most " +
                           std::to_string(internal::kMaxRank));
  }
  ResizePlan plan;
  internal::ResizeIndex& index = plan.index;
  index.rank = static_cast<int>(axes.size());
  plan.elements = 1;
  int64_t combos = 1, stride = 1;
  for (size_t d = axes.size(); d-- > 0;) {
    const ResizeAxis& a = axes[d];
    const std::string which = "Resize axis " + std::to_string(d);
    if (a.in < 0 || a.out < 0 || a.taps < 1)
      return InvalidArgument(which + ": sizes must be >= 0 and taps >= 1");
    if (a.idx.size() != static_cast<size_t>(a.out * a.taps) || a.w.size() != a.idx.size())
      return InvalidArgument(which + ": the tables need out x taps entries");
    for (size_t e = 0; e < a.idx.size(); ++e) {
      const bool outside_mark = a.idx[e] == -1 && e % a.taps == 0;
      if (!outside_mark && (a.idx[e] < 0 || a.idx[e] >= a.in)) {
        return InvalidArgument(which + ": input coordinate " + std::to_string(a.idx[e]) +
                               " is outside its " + std::to_string(a.in) + " elements");
      }
    }
    combos *= a.taps;
    if (combos > 4096) return InvalidArgument("Resize needs more than 4096 taps per element");
    index.in_strides[d] = stride;
    stride *= a.in;
  }
  for (size_t d = 0; d < axes.size(); ++d) {
    const ResizeAxis& a = axes[d];
    index.out_dims[d] = a.out;
    index.taps[d] = a.taps;
    index.table_offset[d] = static_cast<int64_t>(plan.idx.size());
    plan.idx.insert(plan.idx.end(), a.idx.begin(), a.idx.end());
    plan.w.insert(plan.w.end(), a.w.begin(), a.w.end());
    plan.out_dims.push_back(a.out);
    plan.elements *= a.out;
  }
  return plan;
}

Status Resize(const float* x, float* y, const int64_t* idx, const float* w, const ResizePlan& plan,
              float extrapolation, cudaStream_t stream) {
  return CudaStatus(
      internal::LaunchResizeF32(x, y, idx, w, plan.index, extrapolation, plan.elements, stream),
      "resize kernel launch");
}

}  // namespace shoal::engine::cuda
