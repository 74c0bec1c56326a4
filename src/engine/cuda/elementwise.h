// Element-wise operators, NumPy-broadcasting binary operators and row softmax on a CUDA
// stream: the first of shoal's own kernels for the GPU path (the engine's ops/ run the
// same operators on the CPU; the tests compare these with host references).
//
// Tensors are dense, row-major fp32 in device memory; shapes are given outermost first,
// as in ONNX. Each call validates its shapes on the host and returns InvalidArgument,
// naming them, before anything is queued; otherwise the kernel is queued on `stream` and
// the call returns at once (a launch error is returned, a run error shows on the stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/data_type.h"
#include "core/status.h"
#include "engine/cuda/kernels.h"

namespace shoal::engine::cuda {

// Some take parameters: LeakyRelu alpha (x < 0 gives alpha·x), Clip alpha and beta (the
// lower and upper bounds), HardSigmoid alpha and beta (clamp(alpha·x + beta, 0, 1)), Elu
// alpha; HardSwish none (x·clamp(x/6 + 1/2, 0, 1)). The others ignore them.
enum class UnaryOp {
  kRelu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kNeg,
  kAbs,
  kSqrt,
  kErf,
  kGelu,
  kLeakyRelu,
  kClip,
  kHardSigmoid,
  kHardSwish,
  kFloor,
  kCeil,
  kReciprocal,
  kSoftplus,  // log(1 + e^x)
  kElu        // alpha the scale of the negative side: x > 0 ? x : alpha·(e^x - 1)
};
// kPRelu: b is the slope where a is negative (ONNX PRelu), a otherwise.
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMax, kMin, kPow, kPRelu };

// The 16-bit floating-point types of a mixed-precision plan's GEMM operands.
enum class HalfType { kFp16, kBf16 };
// The kernels' name for a 16-bit value's dtype (kFp16, else kBf16).
inline HalfType HalfOf(DataType dtype) {
  return dtype == DataType::kFp16 ? HalfType::kFp16 : HalfType::kBf16;
}

// What a step also writes beside (or instead of) its fp32 result, in the same pass
// (GpuStep::half_out): the result rounded to a 16-bit type, which a mixed-precision plan's
// next product reads, or quantised to int8, the int8 copy an int8 plan's products read
// (quantize.h's q(v, 1 / inv_scale, zero_point)). A HalfType converts to its rounding.
struct RoundTo {
  RoundTo(HalfType t) : half(t) {}  // NOLINT(google-explicit-constructor)
  static RoundTo Int8(float inv_scale, int zero_point) {
    RoundTo r(HalfType::kFp16);
    r.half.reset();
    r.inv_scale = inv_scale;
    r.zero_point = zero_point;
    return r;
  }
  std::optional<HalfType> half;  // none: int8
  float inv_scale = 0;
  int zero_point = 0;
  uint64_t bytes() const { return half ? 2 : 1; }  // per element
  internal::Rounding kernel() const {
    return half ? internal::Rounding(static_cast<int>(*half))
                : internal::Rounding(inv_scale, zero_point);
  }
};

// With `half` an int8 copy (`to` not 16-bit): InvalidArgument naming `what` unless its
// inverse scale is a finite positive number and its zero point 0 or -128.
Status CheckInt8Copy(std::string_view what, const void* half, const RoundTo& to);

// The kernels that also write their result rounded (`half`, rounded as `to` says, or null)
// refuse one whose bytes overlap x's or y's (n fp32 elements each; y may be null), and an
// int8 copy whose inverse scale is not a finite positive number or whose zero point is
// neither 0 nor -128: InvalidArgument naming `what`.
Status CheckRounding(std::string_view what, const void* half, const float* x, const float* y,
                     int64_t n, const RoundTo& to = HalfType::kFp16);

// y = op(x) over n elements; x and y may be the same buffer. With `half` (null: none), the
// result is also written rounded to `half_type` there, in the same pass (a mixed-precision
// plan's next product reads it), and y may be null (16 bits alone). InvalidArgument for a
// negative n, no output at all, or a half that overlaps x or y.
Status Unary(UnaryOp op, const float* x, float* y, int64_t n, cudaStream_t stream,
             float alpha = 0.f, float beta = 0.f, void* half = nullptr,
             RoundTo half_type = HalfType::kFp16);

// The output shape and index tables of a broadcast of a_dims against b_dims (NumPy's
// rule: dimensions aligned from the innermost, each pair equal or one of them 1).
// InvalidArgument when they do not broadcast, or when the output has more than
// internal::kMaxRank dimensions after merging.
struct BroadcastPlan {
  std::vector<int64_t> out_dims;  // the result's shape, as ONNX gives it
  int64_t elements = 0;
  internal::BroadcastIndex index;  // what the kernel walks (adjacent dimensions merged)
};
StatusOr<BroadcastPlan> PlanBroadcast(std::span<const int64_t> a_dims,
                                      std::span<const int64_t> b_dims);

// y = a op b, broadcast as PlanBroadcast says; y holds plan.elements values. y may be a
// or b when that operand has the output's shape; it must not overlap them otherwise. With
// `half`, the result is also written rounded there, as Unary writes it (y may be null);
// InvalidArgument for no output, or a half that overlaps a, b or y.
Status Binary(BinaryOp op, const float* a, const float* b, float* y, const BroadcastPlan& plan,
              cudaStream_t stream, void* half = nullptr, RoundTo half_type = HalfType::kFp16);

// Comparisons with NumPy broadcasting (PlanBroadcast), writing ONNX bools (one byte, 1 or
// 0): a and b are fp32, or int64 when `int64_operands`. y must not overlap a or b.
enum class CompareOp { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual };

// And, Or, Xor of two bool tensors broadcast by `plan`, or Not of one (b null; `plan` then
// needs only its element count): bools of one byte, nonzero true, written 0 or 1.
enum class LogicalOp { kAnd, kOr, kXor, kNot };
Status Logical(LogicalOp op, const uint8_t* a, const uint8_t* b, uint8_t* y,
               const BroadcastPlan& plan, cudaStream_t stream);
Status Compare(CompareOp op, bool int64_operands, const void* a, const void* b, uint8_t* y,
               const BroadcastPlan& plan, cudaStream_t stream);

// Mod with NumPy broadcasting over fp32 (C's fmod, whatever `fmod` says: ONNX asks 1 for
// floats) or int64 operands (`fmod`: the dividend's sign, else the divisor's). An int64
// divisor of 0 writes 0 and sets *error_flag (device memory, zeroed by the caller) bit 2.
// y must not overlap a or b unless it is one with the output's shape.
Status Mod(bool int64_operands, bool fmod, const void* a, const void* b, void* y,
           const BroadcastPlan& plan, int32_t* error_flag, cudaStream_t stream);

// Where(cond, a, b) with the three operands broadcast against each other (NumPy's rule).
// InvalidArgument when they do not broadcast or the output has more than
// internal::kMaxRank dimensions.
struct WherePlan {
  std::vector<int64_t> out_dims;
  int64_t elements = 0;
  internal::WhereIndex index;
};
StatusOr<WherePlan> PlanWhere(std::span<const int64_t> cond_dims, std::span<const int64_t> a_dims,
                              std::span<const int64_t> b_dims);
// y = cond ? a : b over fp32 a and b, cond one byte per element; y must not overlap cond,
// and may be a or b only where that operand has the output's shape.
Status Where(const uint8_t* cond, const float* a, const float* b, float* y, const WherePlan& plan,
             cudaStream_t stream);

// Softmax along the last of `dims` (ONNX Softmax with axis -1), x and y of that shape; with
// `log`, LogSoftmax. With `half` (null: none), the result is also written rounded to
// `half_type` there, in the same pass, and y may be null (16 bits alone). InvalidArgument
// for bad dims, no output at all, or a half that overlaps x or y.
Status SoftmaxLastAxis(const float* x, float* y, std::span<const int64_t> dims, cudaStream_t stream,
                       bool log = false, void* half = nullptr, RoundTo half_type = HalfType::kFp16);

// y = float(x) over n elements: Cast to fp32 from int64, int32 or bool (one byte each; any
// value but 0 is 1), or, exactly, from fp16 or bf16. x and y must not overlap.
enum class CastSource { kInt64, kInt32, kBool, kFp16, kBf16 };
Status CastToFloat(CastSource from, const void* x, float* y, int64_t n, cudaStream_t stream);

// y = x rounded to `to` (round to nearest even; fp16 overflows to infinity) over n
// elements, 2 bytes each in y. x and y must not overlap. With `channels` > 0, x is
// [n / (channels·spatial), channels, spatial] (NCHW) and y gets its values channels last,
// [.., spatial, channels] (NHWC); InvalidArgument when those do not divide n.
Status CastFloatToHalf(HalfType to, const float* x, void* y, int64_t n, cudaStream_t stream,
                       int64_t channels = 0, int64_t spatial = 0);

// y = x truncated toward zero into int64 (`to64`) or int32 over n elements, saturating at
// the type's bounds, NaN to 0, as the CPU engine casts. x and y must not overlap.
Status CastFloatToInt(bool to64, const float* x, void* y, int64_t n, cudaStream_t stream);

// y = x cast among int64, int32 and bool, or from fp32 to bool, over n elements, as the CPU
// engine casts (to bool: nonzero is 1; int64 to int32 keeps the low 32 bits). x and y must
// not overlap. InvalidArgument for other types.
Status CastIntegral(DataType from, DataType to, const void* x, void* y, int64_t n,
                    cudaStream_t stream);

}  // namespace shoal::engine::cuda
