#include "engine/cuda/elementwise.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/tensor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device.h"

namespace shoal::engine::cuda {
Status CheckInt8Copy(std::string_view what, const void* half, const RoundTo& to) {
  if (half && !to.half &&
      (!std::isfinite(to.inv_scale) || !(to.inv_scale > 0.f) ||
       (to.zero_point != 0 && to.zero_point != -128))) {
    return InvalidArgument(std::string(what) +
                           ": its int8 copy needs a finite positive inverse scale and a zero "
                           "point of 0 or -128; was " +
                           std::to_string(to.inv_scale) + " and " + std::to_string(to.zero_point));
  }
  return Status::Ok();
}

Status CheckRounding(std::string_view what, const void* half, const float* x, const float* y,
                     int64_t n, const RoundTo& to) {
  RETURN_IF_ERROR(CheckInt8Copy(what, half, to));
  // Each thread reads x and writes y and half: half's bytes must be neither's.
  const auto elements = static_cast<uint64_t>(n);
  const uint64_t half_bytes = half ? elements * to.bytes() : 0;
  if (BytesOverlap(half, half_bytes, x, elements * sizeof(float)) ||
      BytesOverlap(half, half_bytes, y, y ? elements * sizeof(float) : 0)) {
    return InvalidArgument(std::string(what) + ": its " + (to.half ? "16-bit" : "int8") +
                           " output overlaps x or y");
  }
  return Status::Ok();
}

Status Unary(UnaryOp op, const float* x, float* y, int64_t n, cudaStream_t stream, float alpha,
             float beta, void* half, RoundTo half_type) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  if (y == nullptr && half == nullptr) return InvalidArgument("unary: no output");
  RETURN_IF_ERROR(CheckRounding("unary", half, x, y, n, half_type));
  return CudaStatus(
      internal::LaunchUnaryF32(static_cast<internal::UnaryKernel>(op), x, y, n, alpha, beta, stream,
                               half ? half_type.kernel() : internal::Rounding(), half),
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
              cudaStream_t stream, void* half, RoundTo half_type) {
  if (y == nullptr && half == nullptr) return InvalidArgument("binary: no output");
  RETURN_IF_ERROR(CheckInt8Copy("binary", half, half_type));
  if (half != nullptr && plan.elements > 0) {
    // An operand's bytes reach as far as its last element's offset in the broadcast.
    auto extent = [&](const int64_t* strides) {
      uint64_t last = 0;
      for (int d = 0; d < plan.index.rank; ++d)
        last += static_cast<uint64_t>(plan.index.out_dims[d] - 1) * strides[d];
      return (last + 1) * sizeof(float);
    };
    const uint64_t half_bytes = static_cast<uint64_t>(plan.elements) * half_type.bytes();
    if (BytesOverlap(half, half_bytes, a, extent(plan.index.a_strides)) ||
        BytesOverlap(half, half_bytes, b, extent(plan.index.b_strides)) ||
        BytesOverlap(half, half_bytes, y, y ? static_cast<uint64_t>(plan.elements) * 4 : 0)) {
      return InvalidArgument("binary: its 16-bit or int8 output overlaps a, b or y");
    }
  }
  return CudaStatus(internal::LaunchBinaryF32(
                        static_cast<internal::BinaryKernel>(op), a, b, y, plan.index, plan.elements,
                        stream, half ? half_type.kernel() : internal::Rounding(), half),
                    "binary kernel launch");
}

Status Mod(bool int64_operands, bool fmod, const void* a, const void* b, void* y,
           const BroadcastPlan& plan, int32_t* error_flag, cudaStream_t stream) {
  return CudaStatus(internal::LaunchModulo(int64_operands, fmod, a, b, y, plan.index, plan.elements,
                                           error_flag, stream),
                    "mod kernel launch");
}

Status Compare(CompareOp op, bool int64_operands, const void* a, const void* b, uint8_t* y,
               const BroadcastPlan& plan, cudaStream_t stream) {
  return CudaStatus(
      internal::LaunchCompare(static_cast<internal::CompareKernel>(op), int64_operands, a, b, y,
                              plan.index, plan.elements, stream),
      "comparison kernel launch");
}

Status Logical(LogicalOp op, const uint8_t* a, const uint8_t* b, uint8_t* y,
               const BroadcastPlan& plan, cudaStream_t stream) {
  if ((op == LogicalOp::kNot) != (b == nullptr))
    return InvalidArgument("logical: Not takes one operand, And, Or and Xor two");
  return CudaStatus(internal::LaunchLogical(static_cast<internal::LogicalKernel>(op), a, b, y,
                                            plan.index, plan.elements, stream),
                    "logical kernel launch");
}

StatusOr<WherePlan> PlanWhere(std::span<const int64_t> cond_dims, std::span<const int64_t> a_dims,
                              std::span<const int64_t> b_dims) {
  const std::span<const int64_t> operands[3] = {cond_dims, a_dims, b_dims};
  size_t rank = 0;
  for (const auto& dims : operands) rank = std::max(rank, dims.size());
  // Each operand aligned from the innermost dimension; a missing one counts as 1.
  std::vector<std::vector<int64_t>> aligned;
  for (const auto& dims : operands) {
    std::vector<int64_t> a(rank, 1);
    std::copy(dims.begin(), dims.end(), a.begin() + (rank - dims.size()));
    aligned.push_back(std::move(a));
  }
  WherePlan plan;
  plan.out_dims.assign(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    for (const auto& a : aligned) {
      const int64_t e = a[d];
      if (e < 0 || (e != 1 && plan.out_dims[d] != 1 && e != plan.out_dims[d])) {
        return InvalidArgument("shapes " + ShapeToString(cond_dims) + ", " + ShapeToString(a_dims) +
                               " and " + ShapeToString(b_dims) + " do not broadcast");
      }
      if (e != 1) plan.out_dims[d] = e;
    }
  }
  plan.elements = 1;
  for (int64_t d : plan.out_dims) plan.elements *= d;
  // Dimensions of size 1 drop out; the rest keep their order.
  std::vector<size_t> kept;
  for (size_t d = 0; d < rank; ++d)
    if (plan.out_dims[d] != 1) kept.push_back(d);
  if (kept.size() > static_cast<size_t>(internal::kMaxRank)) {
    return InvalidArgument(
        "Where over " + ShapeToString(plan.out_dims) + " needs " + std::to_string(kept.size()) +
        " dimensions; the GPU kernels take at most " + std::to_string(internal::kMaxRank));
  }
  internal::WhereIndex& index = plan.index;
  index.rank = static_cast<int>(kept.size());
  int64_t* strides[3] = {index.cond_strides, index.a_strides, index.b_strides};
  for (int k = 0; k < 3; ++k) {
    // The operand's element stride of each output dimension (its row-major strides, 0
    // where it is broadcast).
    int64_t stride = 1;
    std::vector<int64_t> own(rank, 0);
    for (size_t d = rank; d-- > 0;) {
      own[d] = aligned[k][d] == 1 ? 0 : stride;
      stride *= aligned[k][d];
    }
    for (size_t i = 0; i < kept.size(); ++i) strides[k][i] = own[kept[i]];
  }
  for (size_t i = 0; i < kept.size(); ++i) index.out_dims[i] = plan.out_dims[kept[i]];
  return plan;
}

Status Where(const uint8_t* cond, const float* a, const float* b, float* y, const WherePlan& plan,
             cudaStream_t stream) {
  return CudaStatus(internal::LaunchWhereF32(cond, a, b, y, plan.index, plan.elements, stream),
                    "where kernel launch");
}

Status SoftmaxLastAxis(const float* x, float* y, std::span<const int64_t> dims, cudaStream_t stream,
                       bool log, void* half, RoundTo half_type) {
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
  if (y == nullptr && half == nullptr) return InvalidArgument("softmax: no output");
  RETURN_IF_ERROR(CheckRounding("softmax", half, x, y, rows * cols, half_type));
  return CudaStatus(
      internal::LaunchSoftmaxRowsF32(x, y, rows, cols, log, stream,
                                     half ? half_type.kernel() : internal::Rounding(), half),
      "softmax kernel launch");
}

Status CastToFloat(CastSource from, const void* x, float* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  return CudaStatus(
      internal::LaunchCastToF32(static_cast<internal::CastKernel>(from), x, y, n, stream),
      "cast kernel launch");
}

Status CastFloatToInt(bool to64, const float* x, void* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  return CudaStatus(internal::LaunchCastF32ToInt(to64, x, y, n, stream), "cast kernel launch");
}

Status CastIntegral(DataType from, DataType to, const void* x, void* y, int64_t n,
                    cudaStream_t stream) {
  auto kind = [](DataType t) -> std::optional<internal::IntCastType> {
    switch (t) {
      case DataType::kInt64:
        return internal::IntCastType::kInt64;
      case DataType::kInt32:
        return internal::IntCastType::kInt32;
      case DataType::kBool:
        return internal::IntCastType::kBool;
      case DataType::kFp32:
        return internal::IntCastType::kFp32;
      default:
        return std::nullopt;
    }
  };
  const auto f = kind(from), t = kind(to);
  if (!f || !t || t == internal::IntCastType::kFp32 ||
      (f == internal::IntCastType::kFp32 && t != internal::IntCastType::kBool))
    return InvalidArgument("integral cast from " + std::string(DataTypeName(from)) + " to " +
                           std::string(DataTypeName(to)) + " is not one this kernel makes");
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  return CudaStatus(internal::LaunchCastIntegral(*f, *t, x, y, n, stream), "cast kernel launch");
}

Status CastFloatToHalf(HalfType to, const float* x, void* y, int64_t n, cudaStream_t stream,
                       int64_t channels, int64_t spatial) {
  if (n < 0) return InvalidArgument("element count must not be negative; was " + std::to_string(n));
  if (channels < 0 || (channels > 0 && (spatial <= 0 || n % (channels * spatial) != 0))) {
    return InvalidArgument("cast to channels last: " + std::to_string(channels) + " channels of " +
                           std::to_string(spatial) + " positions do not divide " +
                           std::to_string(n) + " elements");
  }
  return CudaStatus(internal::LaunchCastF32ToHalf(static_cast<internal::HalfKernel>(to), x, y, n,
                                                  stream, channels, spatial),
                    "cast kernel launch");
}

}  // namespace shoal::engine::cuda
