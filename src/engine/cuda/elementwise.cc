#include "engine/cuda/elementwise.h"

#include <algorithm>
#include <string>

#include "core/tensor.h"
#include "engine/cuda/cuda_status.h"

namespace shoal::engine::cuda {
Status Unary(UnaryOp op, const float* x, float* y, int64_t n, cudaStream_t stream, float alpha,
             float beta) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  return CudaStatus(internal::LaunchUnaryF32(static_cast<internal::UnaryKernel>(op), x, y, n, alpha,
                                             beta, stream),
                    "unary kernel launch");
}

StatusOr<BroadcastPlan> PlanBroadcast(std::span<const int64_t> a_dims,
                                      std::span<const int64_t> b_dims) {
  const size_t rank = std::max(a_dims.size(), b_dims.size());
  BroadcastPlan plan;
  plan.out_dims.assign(rank, 1);
  // Aligned from the innermost dimension; a missing one counts as 1.
  std::vector<int64_t> a(rank, 1), b(rank, 1);
  std::copy(a_dims.begin(), a_dims.end(), a.begin() + (rank - a_dims.size()));
  std::copy(b_dims.begin(), b_dims.end(), b.begin() + (rank - b_dims.size()));
  for (size_t d = 0; d < rank; ++d) {
    if (a[d] < 0 || b[d] < 0 || (a[d] != b[d] && a[d] != 1 && b[d] != 1)) {
      return InvalidArgument("shapes " + ShapeToString(a_dims) + " and " + ShapeToString(b_dims) +
                             " do not broadcast");
    }
    plan.out_dims[d] = a[d] == 1 ? b[d] : a[d];
  }
  plan.elements = 1;
  for (int64_t d : plan.out_dims) plan.elements *= d;
  // Merge adjacent output dimensions along which each input is either broadcast in both or
  // in neither: fewer dimensions, fewer divisions per element, and the rank limit applies
  // only to what is left. Dimensions of size 1 drop out.
  struct Dim {
    int64_t out, a, b;  // extents; an input's extent is 1 where it is broadcast
  };
  std::vector<Dim> merged;
  for (size_t d = 0; d < rank; ++d) {
    if (plan.out_dims[d] == 1) continue;
    const Dim dim{plan.out_dims[d], a[d], b[d]};
    if (!merged.empty()) {
      Dim& last = merged.back();
      const bool a_same = (last.a == 1) == (dim.a == 1);
      const bool b_same = (last.b == 1) == (dim.b == 1);
      if (a_same && b_same) {
        last.out *= dim.out;
        last.a *= dim.a;
        last.b *= dim.b;
        continue;
      }
    }
    merged.push_back(dim);
  }
  if (merged.size() > static_cast<size_t>(internal::kMaxRank)) {
    return InvalidArgument("broadcast of " + ShapeToString(a_dims) + " and " +
                           ShapeToString(b_dims) + " needs " + std::to_string(merged.size()) +
                           " dimensions; the GPU kernels take at most " +
                           std::to_string(internal::kMaxRank));
  }
  internal::BroadcastIndex& index = plan.index;
  index.rank = static_cast<int>(merged.size());
  int64_t a_stride = 1, b_stride = 1;
  for (int d = index.rank - 1; d >= 0; --d) {
    index.out_dims[d] = merged[d].out;
    index.a_strides[d] = merged[d].a == 1 ? 0 : a_stride;
    index.b_strides[d] = merged[d].b == 1 ? 0 : b_stride;
    a_stride *= merged[d].a;
    b_stride *= merged[d].b;
  }
  return plan;
}

Status Binary(BinaryOp op, const float* a, const float* b, float* y, const BroadcastPlan& plan,
              cudaStream_t stream) {
  return CudaStatus(internal::LaunchBinaryF32(static_cast<internal::BinaryKernel>(op), a, b, y,
                                              plan.index, plan.elements, stream),
                    "binary kernel launch");
}

Status SoftmaxLastAxis(const float* x, float* y, std::span<const int64_t> dims,
                       cudaStream_t stream) {
  if (dims.empty()) return InvalidArgument("softmax needs at least one dimension");
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < dims.size(); ++d) {
    if (dims[d] < 0) return InvalidArgument("softmax of shape " + ShapeToString(dims));
    rows *= dims[d];
  }
  const int64_t cols = dims.back();
  if (cols < 0) return InvalidArgument("softmax of shape " + ShapeToString(dims));
  if (rows > 0x7fffffff) {
    return InvalidArgument("softmax of shape " + ShapeToString(dims) +
                           " has more than 2^31-1 rows");
  }
  return CudaStatus(internal::LaunchSoftmaxRowsF32(x, y, rows, cols, stream),
                    "softmax kernel launch");
}

Status CastToFloat(CastSource from, const void* x, float* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  return CudaStatus(
      internal::LaunchCastToF32(static_cast<internal::CastKernel>(from), x, y, n, stream),
      "cast kernel launch");
}

Status CastFloatToHalf(HalfType to, const float* x, void* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  return CudaStatus(
      internal::LaunchCastF32ToHalf(static_cast<internal::HalfKernel>(to), x, y, n, stream),
      "cast kernel launch");
}

}  // namespace shoal::engine::cuda
