// Data movement on a CUDA stream: Transpose with any permutation, Gather along any axis,
// one output of Split (a slice along an axis), Slice, Concat's pieces, Pad and Resize, as
// ONNX defines them (the CPU engine's
// ops/data_movement.cc and ops/indexing.cc).
//
// Shapes are validated on the host, before anything is queued, with InvalidArgument
// naming them. Tensors are dense row-major fp32 in device memory; Gather's indices are
// int64 in device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/cuda/elementwise.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

struct TransposePlan {
  std::vector<int64_t> out_dims;  // dims[perm[i]]
  int64_t elements = 0;
  internal::TransposeIndex index;  // what the kernel walks (axes that stay together merged)
};
// `perm` must hold each of 0..rank-1 once; empty means reversed, as ONNX's default.
StatusOr<TransposePlan> PlanTranspose(std::span<const int64_t> dims, std::span<const int64_t> perm);
// x and y must not overlap. With `half` (null: none), the result is also written rounded to
// `half_type` there, in the same pass, and y may be null (16 bits alone); InvalidArgument for
// no output at all or a half that overlaps x or y.
Status Transpose(const float* x, float* y, const TransposePlan& plan, cudaStream_t stream,
                 void* half = nullptr, RoundTo half_type = HalfType::kFp16);

struct GatherPlan {
  std::vector<int64_t> out_dims;  // data.dims[:axis] + indices.dims + data.dims[axis+1:]
  int64_t outer = 0, axis_dim = 0, inner = 0, num_indices = 0;
};
// `axis` in [-rank, rank) of data_dims.
StatusOr<GatherPlan> PlanGather(std::span<const int64_t> data_dims,
                                std::span<const int64_t> indices_dims, int64_t axis);
// y = Gather(data, indices); y must not overlap data. An index outside [-axis_dim, axis_dim) cannot
// be reported by the kernel as it runs: it writes zeros there and sets *error_flag (device memory,
// an int32 the caller zeroes before the run and reads after it) to 1.
Status Gather(const float* data, const int64_t* indices, float* y, const GatherPlan& plan,
              int32_t* error_flag, cudaStream_t stream);

// y = x[..., start : start + length, ...] along `axis` of x's `dims` (one of Split's
// outputs); y must not overlap x. InvalidArgument for an axis outside dims or a range
// outside [0, dims[axis]].
Status SliceAxis(const float* x, float* y, std::span<const int64_t> dims, int64_t axis,
                 int64_t start, int64_t length, cudaStream_t stream);

// Slice with steps (ONNX Slice, its starts already clamped as ONNX says): y (out_dims) is
// x (dims) read from `begin[d]` by `step[d]` along each dimension; a negative step walks
// backwards. Runs on the transpose kernel: a slice is a strided view copied dense.
// InvalidArgument for ranks that differ or exceed internal::kMaxRank, a zero step, or
// an element read outside x.
struct SlicePlan {
  std::vector<int64_t> out_dims;
  int64_t elements = 0;
  int64_t base = 0;  // x's element that y[0] reads
  internal::TransposeIndex index;
};
StatusOr<SlicePlan> PlanSlice(std::span<const int64_t> dims, std::span<const int64_t> begin,
                              std::span<const int64_t> step, std::span<const int64_t> out_dims);
Status Slice(const float* x, float* y, const SlicePlan& plan, cudaStream_t stream);
// ONNX Expand as a strided copy (run by Slice): x (dims) broadcast to out_dims by NumPy's
// rule, dims aligned at the right, an axis of 1 read with stride 0. InvalidArgument when
// dims does not broadcast to out_dims exactly, or for more than internal::kMaxRank axes.
StatusOr<SlicePlan> PlanExpand(std::span<const int64_t> dims, std::span<const int64_t> out_dims);

// Writes x (x_dims) into y at positions [start, start + x_dims[axis]) along `axis` of
// y_dims (one of Concat's inputs); the other dimensions must be equal. InvalidArgument
// otherwise, or for a range outside y's axis.
Status PlaceAxis(const float* x, float* y, std::span<const int64_t> x_dims,
                 std::span<const int64_t> y_dims, int64_t axis, int64_t start, cudaStream_t stream);

// Padding (ONNX Pad): y = x with `begin[d]` elements before and `end[d]` after each
// dimension d: `value` in mode "constant", the edge's element in "edge", the elements
// mirrored about the edge in "reflect" (as the CPU engine pads). Pads must be >= 0 (a
// negative pad crops: not supported), at most internal::kMaxRank dimensions; edge needs a
// non-empty axis where it pads and reflect pads smaller than the axis.
struct PadPlan {
  std::vector<int64_t> out_dims;
  int64_t elements = 0;
  internal::PadIndex index;
};
StatusOr<PadPlan> PlanPad(std::span<const int64_t> dims, std::span<const int64_t> begin,
                          std::span<const int64_t> end, std::string_view mode = "constant");
Status Pad(const float* x, float* y, const PadPlan& plan, float value, cudaStream_t stream);

// Resize from per-axis taps (the CPU engine's, engine/internal/resize.h): axis d of the
// input has `in` elements and of the output `out`; output coordinate o reads input
// coordinates idx[o·taps + t] with weights w[o·taps + t] for t < taps (an unused entry
// weighs 0), or is `outside` the crop when its first idx is -1.
struct ResizeAxis {
  int64_t in = 0, out = 0, taps = 1;
  std::vector<int64_t> idx;
  std::vector<float> w;
};
struct ResizePlan {
  std::vector<int64_t> out_dims;
  int64_t elements = 0;
  internal::ResizeIndex index;
  // Every axis's taps, one after the other (index.table_offset): uploaded once, as
  // constants, and passed to Resize.
  std::vector<int64_t> idx;
  std::vector<float> w;
};
// InvalidArgument for tables of the wrong length, an index outside its axis (other than an
// outside mark), more than internal::kMaxRank axes, or more than 4096 tap combinations per
// element.
StatusOr<ResizePlan> PlanResize(const std::vector<ResizeAxis>& axes);
// y = Resize(x) from the plan's tables, uploaded to `idx` and `w`; y must not overlap x.
Status Resize(const float* x, float* y, const int64_t* idx, const float* w, const ResizePlan& plan,
              float extrapolation, cudaStream_t stream);

}  // namespace shoal::engine::cuda
