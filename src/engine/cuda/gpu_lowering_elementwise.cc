// LowerPlan (gpu_lowering.h) for the element-wise operators, casts, comparisons, Where,
// Mod, softmax, the normalisations and the reductions.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/data_type.h"
#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::cuda::internal {

using engine::internal::Product;

// ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare and ReduceL2
// over axes that sit next to each other.
Status Lowerer::LowerReduce(int n, ReduceOp op) {
  const Node& node = graph_.nodes[n];
  // The data and the result in fp32 (the axes, when an input, are int64).
  if (!IsFp32(node.inputs[0]) || !node.has_output(0) || !IsFp32(node.outputs[0]))
    return Fail(n, "only a reduction of fp32 data is on the GPU path so far");
  const Shape xs = ShapeOf(node.inputs[0]);
  const auto rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> axes = node.GetInts("axes");
  if (node.has_input(1)) {
    const Tensor* known = Known(node.inputs[1]);
    if (!known || known->dtype() != DataType::kInt64)
      return Fail(n, "axes computed at run time are not on the GPU path");
    auto v = known->values<int64_t>();
    axes.assign(v.begin(), v.end());
  }
  if (axes.empty()) {
    if (node.GetInt("noop_with_empty_axes", 0) != 0)
      return Fail(n, "a reduction over no axes is not on the GPU path");
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  for (int64_t& a : axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return Fail(n, "an axis out of range");
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (axes.back() - axes.front() + 1 != static_cast<int64_t>(axes.size()))
    return Fail(n,
                "a reduction over axes that are not next to each other is not on the GPU "
                "path yet");
  if (Product(xs, axes.front(), axes.back() + 1) == 0)
    return Fail(n, "a reduction over an empty axis");
  // Before opset 18 ReduceMin, ReduceProd, ReduceSumSquare and ReduceL2 take their axes as
  // an attribute (read above); keepdims changes only the output's shape, which the plan
  // has.
  GpuStep step = NewStep(GpuStep::Kind::kReduce, n);
  step.reduce = op;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.dims = xs;
  step.axis = axes.front();
  step.length = static_cast<int64_t>(axes.size());
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Cast to fp32 from int64, int32 or bool.
Status Lowerer::LowerCast(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0], y = node.outputs[0];
  const bool to_half = DtypeOf(y) == DataType::kFp16 || DtypeOf(y) == DataType::kBf16;
  if (to_half && DtypeOf(x) == DataType::kFp32) {
    // The kernel that rounds a mixed-precision product's input (an fp16 model's output).
    GpuStep step = NewStep(GpuStep::Kind::kToHalf, n);
    step.in = {x};
    step.out = y;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  const bool to_int = DtypeOf(y) == DataType::kInt64 || DtypeOf(y) == DataType::kInt32;
  if (to_int && DtypeOf(x) == DataType::kFp32) {
    GpuStep step = NewStep(GpuStep::Kind::kFloatToInt, n);
    step.in = {x};
    step.out = y;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  auto integral = [](DataType t) {
    return t == DataType::kInt64 || t == DataType::kInt32 || t == DataType::kBool;
  };
  if (integral(DtypeOf(y)) && (integral(DtypeOf(x)) || DtypeOf(x) == DataType::kFp32)) {
    GpuStep step = NewStep(GpuStep::Kind::kIntCast, n);
    step.in = {x};
    step.out = y;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  if (DtypeOf(y) != DataType::kFp32) {
    return Fail(n,
                "only a Cast to fp32, from fp32 to fp16, bf16, int64, int32 or bool, or among "
                "int64, int32 and bool is on the GPU path so far, not " +
                    std::string(DataTypeName(DtypeOf(x))) + " to " +
                    std::string(DataTypeName(DtypeOf(y))));
  }
  GpuStep step;
  step.kind = GpuStep::Kind::kCast;
  switch (DtypeOf(x)) {
    case DataType::kInt64:
      step.cast = CastSource::kInt64;
      break;
    case DataType::kInt32:
      step.cast = CastSource::kInt32;
      break;
    case DataType::kBool:
      step.cast = CastSource::kBool;
      break;
    case DataType::kFp16:
      step.cast = CastSource::kFp16;
      break;
    case DataType::kBf16:
      step.cast = CastSource::kBf16;
      break;
    default:
      return Fail(n, "a Cast from " + std::string(DataTypeName(DtypeOf(x))) +
                         " is not on the GPU path yet");
  }
  step.node = n;
  step.in = {x};
  step.out = y;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Clip: bounds from the min/max inputs (opset 11 on) or attributes, each known at load.
Status Lowerer::LowerClip(int n) {
  const Node& node = graph_.nodes[n];
  float lo = -FLT_MAX, hi = FLT_MAX;
  if (graph_.opset < 11) {
    lo = node.GetFloat("min", lo);
    hi = node.GetFloat("max", hi);
  } else {
    for (size_t i = 1; i <= 2; ++i) {
      if (!node.has_input(i)) continue;
      const Tensor* bound = Known(node.inputs[i]);
      if (!bound || bound->dtype() != DataType::kFp32 || bound->element_count() != 1)
        return Fail(n, "Clip bounds computed at run time are not on the GPU path");
      (i == 1 ? lo : hi) = bound->values<float>()[0];
    }
  }
  return LowerUnary(n, UnaryOp::kClip, lo, hi);
}

// BatchNormalization in inference (one output): x·a + b per channel, a = scale /
// sqrt(var + epsilon) and b = B - mean·a computed at lowering, as two broadcasting steps.
Status Lowerer::LowerBatchNorm(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  if (xs.size() < 2) return Fail(n, "the input needs a channel axis");
  const int64_t c = xs[1];
  const Tensor* t[4] = {};
  for (size_t i = 0; i < 4; ++i) {
    t[i] = node.has_input(i + 1) ? Known(node.inputs[i + 1]) : nullptr;
    if (!t[i] || t[i]->element_count() != c)
      return Fail(n,
                  "only constant scale, bias, mean and variance of one value per channel "
                  "are on the GPU path");
  }
  const float epsilon = node.GetFloat("epsilon", 1e-5f);
  Shape per_channel(xs.size() - 1, 1);
  per_channel[0] = c;
  Tensor a = Tensor::Allocate(DataType::kFp32, per_channel);
  Tensor b = Tensor::Allocate(DataType::kFp32, per_channel);
  for (int64_t k = 0; k < c; ++k) {
    const float scale = t[0]->values<float>()[k], bias = t[1]->values<float>()[k];
    const float mean = t[2]->values<float>()[k], var = t[3]->values<float>()[k];
    const float ak = scale / std::sqrt(var + epsilon);
    a.mutable_values<float>()[k] = ak;
    b.mutable_values<float>()[k] = bias - mean * ak;
  }
  std::string key = "bn";
  for (size_t i = 1; i <= 4; ++i) key += ":" + KeyOf(node.inputs[i]);
  key += "@" + std::to_string(epsilon);
  auto plan = PlanBroadcast(xs, per_channel);
  if (!plan.ok() || plan->out_dims != xs) return Fail(n, "the channels do not broadcast");
  for (int k = 0; k < 2; ++k) {
    GpuStep step = NewStep(GpuStep::Kind::kBinary, n);
    step.binary = k == 0 ? BinaryOp::kMul : BinaryOp::kAdd;
    step.in = {k == 0 ? node.inputs[0] : node.outputs[0], -1};
    step.weight_slots = {AddBlob(key + (k == 0 ? "*a" : "+b"), k == 0 ? a : b)};
    step.broadcast = *plan;
    step.out = node.outputs[0];
    out_.steps.push_back(std::move(step));
  }
  return Status::Ok();
}

Status Lowerer::LowerUnary(int n, UnaryOp op, float alpha, float beta) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  if (node.op_type == "Gelu" && node.GetString("approximate", "none") != "none")
    return Fail(n, "Gelu's tanh approximation outside a product is not on the GPU path yet");
  if (node.inputs.size() != 1 && op != UnaryOp::kClip) return Fail(n, "takes one input");
  GpuStep step = NewStep(GpuStep::Kind::kUnary, n);
  step.unary = op;
  step.alpha = alpha;
  step.beta = beta;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

StatusOr<GpuStep> Lowerer::BroadcastStep(int n, GpuStep::Kind kind) const {
  const Node& node = graph_.nodes[n];
  auto plan = PlanBroadcast(ShapeOf(node.inputs[0]), ShapeOf(node.inputs[1]));
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(node.outputs[0]))
    return Fail(n, "the broadcast shape differs from the planned output");
  GpuStep step = NewStep(kind, n);
  step.in = {node.inputs[0], node.inputs[1]};
  step.broadcast = std::move(plan).value();
  step.out = node.outputs[0];
  return step;
}

Status Lowerer::LowerBinary(int n, BinaryOp op) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const bool variadic = op == BinaryOp::kMax || op == BinaryOp::kMin;
  if (variadic && node.inputs.size() != 2 && !node.inputs.empty()) {
    // Max and Min of one or of three and more: input 0 broadcast into the output, then each
    // further input folded into it in place, as the CPU engine folds them.
    for (int v : node.inputs)
      if (v < 0) return Fail(n, "all inputs must be present");
    const Shape ys = ShapeOf(node.outputs[0]);
    RETURN_IF_ERROR(AddBroadcastCopy(n, ShapeOf(node.inputs[0]), ys, "a Max or Min"));
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      auto plan = PlanBroadcast(ys, ShapeOf(node.inputs[i]));
      if (!plan.ok()) return Fail(n, plan.status().message());
      if (plan->out_dims != ys)
        return Fail(n, "the broadcast shape differs from the planned output");
      GpuStep step = NewStep(GpuStep::Kind::kBinary, n);
      step.binary = op;
      step.in = {node.outputs[0], node.inputs[i]};
      step.out = node.outputs[0];
      step.broadcast = std::move(plan).value();
      out_.steps.push_back(std::move(step));
    }
    return Status::Ok();
  }
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "only two inputs are on the GPU path");
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kBinary));
  step.binary = op;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Softmax over the last axis, or (opset < 13) over the dimensions from `axis` on, which
// is the same row softmax over the flattened trailing dimensions.
Status Lowerer::LowerSoftmax(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  const int64_t rank = static_cast<int64_t>(xs.size());
  if (rank == 0) return Fail(n, "a scalar softmax");
  int64_t axis = node.GetInt("axis", graph_.opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  if (graph_.opset >= 13 && axis != rank - 1)
    return Fail(n, "softmax over an axis other than the last is not on the GPU path yet");
  GpuStep step = NewStep(GpuStep::Kind::kSoftmax, n);
  step.log_softmax = node.op_type == "LogSoftmax";
  step.in = {node.inputs[0]};
  step.dims = {Product(xs, 0, axis), Product(xs, axis)};
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// LayerNormalization normalises over the dimensions from `axis` on: one row each.
Status Lowerer::LowerLayerNorm(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  const int64_t rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  const int64_t row = Product(xs, axis);
  if (!node.has_input(1) || Product(ShapeOf(node.inputs[1])) != row)
    return Fail(n, "the scale must have one value per normalised element");
  if (node.has_input(2) && Product(ShapeOf(node.inputs[2])) != row)
    return Fail(n, "the bias must have one value per normalised element");
  GpuStep step = NewStep(GpuStep::Kind::kLayerNorm, n);
  step.in = {node.inputs[0], node.inputs[1], node.has_input(2) ? node.inputs[2] : -1};
  step.dims = {Product(xs, 0, axis), row};
  step.epsilon = node.GetFloat("epsilon", 1e-5f);
  if (!(step.epsilon > 0)) return Fail(n, "an epsilon <= 0 is not on the GPU path");
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Equal, Less, Greater, LessOrEqual, GreaterOrEqual of fp32 or int64 operands: ONNX bools.
Status Lowerer::LowerCompare(int n, CompareOp op) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes two inputs");
  RETURN_IF_ERROR(CheckPlain(n));
  const DataType dtype = DtypeOf(node.inputs[0]);
  if ((dtype != DataType::kFp32 && dtype != DataType::kInt64) || DtypeOf(node.inputs[1]) != dtype)
    return Fail(n, "only comparisons of fp32 or int64 operands are on the GPU path so far");
  if (DtypeOf(node.outputs[0]) != DataType::kBool) return Fail(n, "the output is not bool");
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kCompare));
  step.compare = op;
  step.int64_operands = dtype == DataType::kInt64;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerLogical(int n, LogicalOp op) {
  const Node& node = graph_.nodes[n];
  const size_t arity = op == LogicalOp::kNot ? 1 : 2;
  if (node.inputs.size() != arity) return Fail(n, "takes " + std::to_string(arity) + " input(s)");
  RETURN_IF_ERROR(CheckPlain(n));
  for (int v : node.inputs)
    if (v < 0 || DtypeOf(v) != DataType::kBool) return Fail(n, "its inputs must be bool");
  if (DtypeOf(node.outputs[0]) != DataType::kBool) return Fail(n, "the output is not bool");
  if (op == LogicalOp::kNot) {
    GpuStep step = NewStep(GpuStep::Kind::kLogical, n);
    step.logical = op;
    step.in = {node.inputs[0]};
    step.out = node.outputs[0];
    step.broadcast.elements = Product(ShapeOf(node.outputs[0]));
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kLogical));
  step.logical = op;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Where(cond, a, b) over fp32 a and b.
Status Lowerer::LowerWhere(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 3 || !node.has_input(0) || !node.has_input(1) || !node.has_input(2))
    return Fail(n, "takes three inputs");
  RETURN_IF_ERROR(CheckPlain(n));
  if (DtypeOf(node.inputs[0]) != DataType::kBool) return Fail(n, "the condition is not bool");
  if (!IsFp32(node.inputs[1]) || !IsFp32(node.inputs[2]) || !IsFp32(node.outputs[0]))
    return Fail(n, "only a Where choosing between fp32 values is on the GPU path so far");
  auto plan = PlanWhere(ShapeOf(node.inputs[0]), ShapeOf(node.inputs[1]), ShapeOf(node.inputs[2]));
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(node.outputs[0]))
    return Fail(n, "the broadcast shape differs from the planned output");
  GpuStep step = NewStep(GpuStep::Kind::kWhere, n);
  step.in = {node.inputs[0], node.inputs[1], node.inputs[2]};
  step.where = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Mod of two fp32 (fmod = 1, as ONNX asks) or two int64 operands, broadcast.
Status Lowerer::LowerMod(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes two inputs");
  RETURN_IF_ERROR(CheckPlain(n));
  const DataType dtype = DtypeOf(node.inputs[0]);
  if ((dtype != DataType::kFp32 && dtype != DataType::kInt64) || DtypeOf(node.inputs[1]) != dtype ||
      DtypeOf(node.outputs[0]) != dtype)
    return Fail(n, "only a Mod of fp32 or int64 values is on the GPU path so far");
  const bool fmod = node.GetInt("fmod", 0) != 0;
  if (dtype == DataType::kFp32 && !fmod) return Fail(n, "floating-point inputs need fmod = 1");
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kMod));
  step.flag = NewFlag(n);
  step.int64_operands = dtype == DataType::kInt64;
  step.fmod = fmod;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// ArgMax and ArgMin of fp32 data along one axis; keepdims changes only the shape.
Status Lowerer::LowerArgExtreme(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 1 || !IsFp32(node.inputs[0]))
    return Fail(n, "only an arg extreme of fp32 data is on the GPU path so far");
  RETURN_IF_ERROR(CheckPlain(n));
  if (DtypeOf(node.outputs[0]) != DataType::kInt64) return Fail(n, "the output is not int64");
  const Shape xs = ShapeOf(node.inputs[0]);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || xs[axis] == 0) return Fail(n, "an axis out of range or empty");
  GpuStep step = NewStep(GpuStep::Kind::kArgExtreme, n);
  step.arg_max = node.op_type == "ArgMax";
  step.select_last = node.GetInt("select_last_index", 0) != 0;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.dims = xs;
  step.axis = axis;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerTopK(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !IsFp32(node.inputs[0]))
    return Fail(n, "only a TopK of fp32 data is on the GPU path so far");
  RETURN_IF_ERROR(CheckPlainInputs(n));
  const auto k = node.has_input(1) ? KnownInts(node.inputs[1]) : std::nullopt;
  if (!k || k->size() != 1) return Fail(n, "a K computed at run time is not on the GPU path");
  const Shape xs = ShapeOf(node.inputs[0]);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "an axis out of range");
  if ((*k)[0] < 1 || (*k)[0] > xs[axis]) return Fail(n, "K must be in [1, the axis's length]");
  for (size_t o = 0; o < node.outputs.size() && o < 2; ++o) {
    const int v = node.outputs[o];
    if (v < 0) continue;
    if (DtypeOf(v) != (o == 0 ? DataType::kFp32 : DataType::kInt64))
      return Fail(n, "its outputs must be fp32 values and int64 indices");
    GpuStep step = NewStep(GpuStep::Kind::kTopK, n);
    step.in = {node.inputs[0]};
    step.out = v;
    step.dims = xs;
    step.axis = axis;
    step.length = (*k)[0];
    step.arg_max = node.GetInt("largest", 1) != 0;
    out_.steps.push_back(std::move(step));
  }
  return Status::Ok();
}

// InstanceNormalization and GroupNormalization: the row layer norm over each (item, group)
// with a scale of ones, then the constant scale and bias per channel or per group as two
// broadcasting steps, in place.
Status Lowerer::LowerGroupNorm(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const bool instance = node.op_type == "InstanceNormalization";
  const Shape xs = ShapeOf(node.inputs[0]);
  if (xs.size() < 2 || node.inputs.size() != 3)
    return Fail(n, "needs X (N, C, ...), scale and bias");
  const int64_t batch = xs[0], c = xs[1], spatial = Product(xs, 2);
  const int64_t groups = instance ? c : node.GetInt("num_groups", 0);
  if (groups <= 0 || c % groups != 0) return Fail(n, "num_groups must divide the channels");
  const Tensor* scale = Known(node.inputs[1]);
  const Tensor* bias = Known(node.inputs[2]);
  if (!scale || !bias || scale->element_count() != bias->element_count() ||
      (scale->element_count() != c && scale->element_count() != groups))
    return Fail(n,
                "only a constant scale and bias of one value per channel or per group are on "
                "the GPU path");
  const int64_t row = c / groups * spatial;
  if (batch * groups == 0 || row == 0) return Fail(n, "an empty normalisation");
  GpuStep norm = NewStep(GpuStep::Kind::kLayerNorm, n);
  norm.in = {node.inputs[0], -1, -1};
  Tensor ones = Tensor::Allocate(DataType::kFp32, {row});
  for (float& v : ones.mutable_values<float>()) v = 1.f;
  norm.weight_slots = {AddBlob("ones" + std::to_string(row), std::move(ones))};
  norm.dims = {batch * groups, row};
  norm.epsilon = node.GetFloat("epsilon", 1e-5f);
  if (!(norm.epsilon > 0)) return Fail(n, "an epsilon <= 0 is not on the GPU path");
  norm.out = node.outputs[0];
  out_.steps.push_back(std::move(norm));
  // The affine over [N, K, rest] with K the scale's length, one value per row of K.
  const int64_t k = scale->element_count();
  const Shape view = {batch, k, c * spatial / k};
  auto plan = PlanBroadcast(view, Shape{k, 1});
  if (!plan.ok()) return Fail(n, plan.status().message());
  for (int i = 0; i < 2; ++i) {
    GpuStep step = NewStep(GpuStep::Kind::kBinary, n);
    step.binary = i == 0 ? BinaryOp::kMul : BinaryOp::kAdd;
    step.in = {node.outputs[0], i == 0 ? node.inputs[1] : node.inputs[2]};
    step.broadcast = *plan;
    step.out = node.outputs[0];
    out_.steps.push_back(std::move(step));
  }
  return Status::Ok();
}

}  // namespace shoal::engine::cuda::internal
