// Element-wise operators: unary math and activations, binary arithmetic and
// comparisons with numpy broadcasting, variadic Min/Max, Where, Not, Cast, Clip.
// fp32 math runs on oneDNN eltwise/binary primitives; integer, boolean and the
// broadcast patterns oneDNN's binary cannot take (src0 broadcast for Sub/Div) run in
// the engine's own loops.
//
// In place (Kernel::inplace_input): every kernel here that writes output element i from
// input element i, or from element i of an input with the output's shape and dtype,
// offers that input: oneDNN eltwise (dst == src) and binary (dst == src0), and the loops
// below, which read element i before writing element i. Cast, variadic Min/Max (they
// write the output before reading later inputs) and comparisons (whose output elements
// are smaller) offer none.
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/fp16.h"
#include "engine/internal/broadcast.h"
#include "engine/internal/onnx_dtype.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

using alg = dnnl::algorithm;

// Like DispatchNumeric, with bool treated as uint8.
template <typename Fn>
Status DispatchAll(DataType t, Fn&& fn) {
  if (t == DataType::kBool) {
    fn.template operator()<uint8_t>();
    return Status::Ok();
  }
  return DispatchNumeric(t, std::forward<Fn>(fn));
}

StatusOr<std::unique_ptr<Kernel>> Noop() {
  return MakeFn([](const RunContext&) { return Status::Ok(); });
}

StatusOr<std::unique_ptr<Kernel>> DnnlEltwise(PrepareContext& ctx, alg a, float alpha, float beta) {
  const Shape& s = ctx.in_shapes[0];
  if (Product(s) == 0) return Noop();
  auto md = PlainDesc(s, DataType::kFp32);
  const auto& eng = *ctx.dnnl_engine;
  dnnl::eltwise_forward::primitive_desc pd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, a, md, alpha, beta), eng);
  auto k = std::make_unique<DnnlKernel>();
  k->primitive = dnnl::eltwise_forward(pd);
  k->inplace = 0;
  k->BindInput(DNNL_ARG_SRC, md, eng, 0);
  k->BindOutput(DNNL_ARG_DST, md, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

template <typename T, typename F>
StatusOr<std::unique_ptr<Kernel>> OwnUnary(F f) {
  return MakeInplaceFn(0, [f](const RunContext& rc) {
    const T* x = rc.inputs[0]->values<T>().data();
    T* y = rc.outputs[0]->mutable_values<T>().data();
    const int64_t n = rc.outputs[0]->element_count();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
    return Status::Ok();
  });
}

// ---- unary ----
struct UnarySpec {
  std::string_view op;
  std::vector<std::string_view> attrs;
  bool ints_ok;  // Abs, Neg, Relu also take signed integers
};

const UnarySpec kUnary[] = {
    {"Relu", {}, true},       {"LeakyRelu", {"alpha"}, false},
    {"Sigmoid", {}, false},   {"Tanh", {}, false},
    {"Exp", {}, false},       {"Log", {}, false},
    {"Sqrt", {}, false},      {"Abs", {}, true},
    {"Neg", {}, true},        {"Reciprocal", {}, false},
    {"Erf", {}, false},       {"HardSigmoid", {"alpha", "beta"}, false},
    {"HardSwish", {}, false}, {"Gelu", {"approximate"}, false},
    {"Floor", {}, false},     {"Ceil", {}, false},
    {"Softplus", {}, false},  {"Elu", {"alpha"}, false},
};

StatusOr<std::unique_ptr<Kernel>> PrepareUnary(PrepareContext& ctx) {
  const Node& node = ctx.node();
  const std::string& op = node.op_type;
  if (ctx.num_inputs() != 1 || !ctx.has_input(0)) return ctx.Error("needs exactly one input");
  const DataType t = ctx.in_dtypes[0];
  ctx.out_dtypes[0] = t;
  ctx.out_shapes[0] = ctx.in_shapes[0];
  if (t == DataType::kFp32) {
    if (op == "Relu") return DnnlEltwise(ctx, alg::eltwise_relu, 0.f, 0.f);
    if (op == "LeakyRelu")
      return DnnlEltwise(ctx, alg::eltwise_relu, node.GetFloat("alpha", 0.01f), 0.f);
    if (op == "Sigmoid") return DnnlEltwise(ctx, alg::eltwise_logistic, 0.f, 0.f);
    if (op == "Tanh") return DnnlEltwise(ctx, alg::eltwise_tanh, 0.f, 0.f);
    if (op == "Exp") return DnnlEltwise(ctx, alg::eltwise_exp, 0.f, 0.f);
    if (op == "Log") return DnnlEltwise(ctx, alg::eltwise_log, 0.f, 0.f);
    if (op == "Sqrt") return DnnlEltwise(ctx, alg::eltwise_sqrt, 0.f, 0.f);
    if (op == "Abs") return DnnlEltwise(ctx, alg::eltwise_abs, 0.f, 0.f);
    if (op == "Neg") return DnnlEltwise(ctx, alg::eltwise_linear, -1.f, 0.f);
    if (op == "Reciprocal") return DnnlEltwise(ctx, alg::eltwise_pow, 1.f, -1.f);
    if (op == "HardSwish") return DnnlEltwise(ctx, alg::eltwise_hardswish, 0.f, 0.f);
    if (op == "Elu") return DnnlEltwise(ctx, alg::eltwise_elu, node.GetFloat("alpha", 1.f), 0.f);
    if (op == "Softplus") return DnnlEltwise(ctx, alg::eltwise_soft_relu, 0.f, 0.f);
    if (op == "Gelu") {
      return DnnlEltwise(ctx,
                         node.GetString("approximate", "none") == "tanh" ? alg::eltwise_gelu_tanh
                                                                         : alg::eltwise_gelu_erf,
                         0.f, 0.f);
    }
    if (op == "Erf") return OwnUnary<float>([](float x) { return std::erf(x); });
    if (op == "Floor") return OwnUnary<float>([](float x) { return std::floor(x); });
    if (op == "Ceil") return OwnUnary<float>([](float x) { return std::ceil(x); });
    if (op == "HardSigmoid") {
      const float a = node.GetFloat("alpha", 0.2f), b = node.GetFloat("beta", 0.5f);
      return OwnUnary<float>([a, b](float x) { return std::max(0.f, std::min(1.f, a * x + b)); });
    }
  }
  const bool int_ok = t == DataType::kInt64 || t == DataType::kInt32 || t == DataType::kInt8;
  if (int_ok && (op == "Abs" || op == "Neg" || op == "Relu")) {
    StatusOr<std::unique_ptr<Kernel>> k = Internal("unreachable");
    RETURN_IF_ERROR(DispatchNumeric(t, [&]<typename T>() {
      if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
        // Wrap-around for the most negative value, as numpy does; no signed overflow.
        using U = std::make_unsigned_t<T>;
        if (op == "Abs")
          k = OwnUnary<T>([](T x) { return x < 0 ? static_cast<T>(U(0) - static_cast<U>(x)) : x; });
        if (op == "Neg")
          k = OwnUnary<T>([](T x) { return static_cast<T>(U(0) - static_cast<U>(x)); });
        if (op == "Relu") k = OwnUnary<T>([](T x) { return x < 0 ? T(0) : x; });
      }
    }));
    return k;
  }
  return ctx.Error("data type " + std::string(DataTypeName(t)) + " is not supported");
}

// ---- binary ----
bool IsComparison(std::string_view op) {
  return op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" ||
         op == "GreaterOrEqual";
}
bool IsLogical(std::string_view op) { return op == "And" || op == "Or" || op == "Xor"; }

template <typename T>
T IntDiv(T a, T b) {
  if (b == 0) return 0;  // ONNX leaves it undefined; never trap
  if constexpr (std::is_signed_v<T>) {
    if (a == std::numeric_limits<T>::min() && b == T(-1)) return a;
  }
  return static_cast<T>(a / b);
}

template <typename T, typename R, typename Op>
void ApplyBinary(const Tensor& a, const Tensor& b, Tensor* out, Op op) {
  const T* pa = a.values<T>().data();
  const T* pb = b.values<T>().data();
  R* po = out->mutable_values<R>().data();
  const Shape& os = out->shape();
  if (a.shape() == os && b.shape() == os) {
    const int64_t n = Product(os);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) po[i] = op(pa[i], pb[i]);
    return;
  }
  std::array<std::vector<int64_t>, 2> st{BroadcastStrides(a.shape(), os),
                                         BroadcastStrides(b.shape(), os)};
  BroadcastLoop<2>(os, st, [&](int64_t o, const std::array<int64_t, 2>& off) {
    po[o] = op(pa[off[0]], pb[off[1]]);
  });
}

template <typename T>
Status RunOwnBinary(const std::string& op, const Tensor& a, const Tensor& b, Tensor* out) {
  if (op == "Add")
    ApplyBinary<T, T>(a, b, out, [](T x, T y) { return static_cast<T>(x + y); });
  else if (op == "Sub")
    ApplyBinary<T, T>(a, b, out, [](T x, T y) { return static_cast<T>(x - y); });
  else if (op == "Mul")
    ApplyBinary<T, T>(a, b, out, [](T x, T y) { return static_cast<T>(x * y); });
  else if (op == "Div") {
    if constexpr (std::is_integral_v<T>)
      ApplyBinary<T, T>(a, b, out, IntDiv<T>);
    else
      ApplyBinary<T, T>(a, b, out, [](T x, T y) { return x / y; });
  } else if (op == "Min")
    ApplyBinary<T, T>(a, b, out, [](T x, T y) { return std::min(x, y); });
  else if (op == "Max")
    ApplyBinary<T, T>(a, b, out, [](T x, T y) { return std::max(x, y); });
  else if (op == "Equal")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x == y); });
  else if (op == "Less")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x < y); });
  else if (op == "Greater")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x > y); });
  else if (op == "LessOrEqual")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x <= y); });
  else if (op == "GreaterOrEqual")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x >= y); });
  else if (op == "And")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x && y); });
  else if (op == "Or")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(x || y); });
  else if (op == "Xor")
    ApplyBinary<T, uint8_t>(a, b, out, [](T x, T y) { return uint8_t(!x != !y); });
  else if (op == "PRelu")
    ApplyBinary<T, T>(a, b, out, [](T x, T s) { return x < 0 ? static_cast<T>(x * s) : x; });
  else
    return InvalidArgument("no implementation of " + op);
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PreparePow(PrepareContext& ctx, const Shape& out) {
  const DataType t = ctx.in_dtypes[0];
  ctx.out_dtypes[0] = t;
  if (t != DataType::kFp32 && t != DataType::kFp64) {
    return ctx.Error("base of data type " + std::string(DataTypeName(t)) + " is not supported");
  }
  if (t == DataType::kFp32 && ctx.in_data[1] && ctx.in_data[1]->element_count() == 1 &&
      ctx.in_shapes[0] == out) {
    ASSIGN_OR_RETURN(double e, ReadScalar(*ctx.in_data[1]));
    return DnnlEltwise(ctx, alg::eltwise_pow, 1.f, static_cast<float>(e));
  }
  const DataType et = ctx.in_dtypes[1];
  // The exponent is converted into a temporary first; a base with the output's shape is
  // read at the output's index.
  const int inplace = ctx.in_shapes[0] == out ? 0 : -1;
  return MakeInplaceFn(inplace, [t, et](const RunContext& rc) -> Status {
    const Tensor& a = *rc.inputs[0];
    const Tensor& b = *rc.inputs[1];
    Tensor* o = rc.outputs[0];
    // Convert the exponent to the base's type, then broadcast.
    Tensor e = Tensor::Allocate(t, b.shape());
    RETURN_IF_ERROR(DispatchAll(et, [&]<typename E>() {
      auto src = b.values<E>();
      if (t == DataType::kFp32)
        for (size_t i = 0; i < src.size(); ++i)
          e.mutable_values<float>()[i] = static_cast<float>(src[i]);
      else
        for (size_t i = 0; i < src.size(); ++i)
          e.mutable_values<double>()[i] = static_cast<double>(src[i]);
    }));
    if (t == DataType::kFp32)
      ApplyBinary<float, float>(a, e, o, [](float x, float y) { return std::pow(x, y); });
    else
      ApplyBinary<double, double>(a, e, o, [](double x, double y) { return std::pow(x, y); });
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareBinary(PrepareContext& ctx) {
  const std::string op = ctx.node().op_type;
  if (ctx.num_inputs() != 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs two inputs");
  auto out = BroadcastShapes(ctx.in_shapes[0], ctx.in_shapes[1]);
  if (!out.ok()) return ctx.Error(out.status().message());
  if (op == "PRelu" && *out != ctx.in_shapes[0])
    return ctx.Error("slope must broadcast to the input's shape");
  ctx.out_shapes[0] = *out;
  if (op == "Pow") return PreparePow(ctx, *out);
  const DataType t = ctx.in_dtypes[0];
  if (ctx.in_dtypes[1] != t) {
    return ctx.Error("inputs have different data types (" + std::string(DataTypeName(t)) + " and " +
                     std::string(DataTypeName(ctx.in_dtypes[1])) + ")");
  }
  if (IsLogical(op) && t != DataType::kBool) return ctx.Error("inputs must be BOOL");
  const bool to_bool = IsComparison(op) || IsLogical(op);
  ctx.out_dtypes[0] = to_bool ? DataType::kBool : t;
  if (t == DataType::kBool && !to_bool) return ctx.Error("BOOL inputs are not supported");

  static const std::pair<std::string_view, alg> kDnnl[] = {
      {"Add", alg::binary_add}, {"Sub", alg::binary_sub}, {"Mul", alg::binary_mul},
      {"Div", alg::binary_div}, {"Min", alg::binary_min}, {"Max", alg::binary_max}};
  if (t == DataType::kFp32 && Product(*out) > 0) {
    for (const auto& [name, a] : kDnnl) {
      if (name != op) continue;
      const bool commutative = op == "Add" || op == "Mul" || op == "Min" || op == "Max";
      int src0 = -1;
      if (ctx.in_shapes[0] == *out)
        src0 = 0;
      else if (commutative && ctx.in_shapes[1] == *out)
        src0 = 1;
      if (src0 < 0) break;
      Shape s1 = ctx.in_shapes[1 - src0];
      s1.insert(s1.begin(), out->size() - s1.size(), 1);
      const auto md0 = PlainDesc(*out, t), md1 = PlainDesc(s1, t);
      const auto& eng = *ctx.dnnl_engine;
      dnnl::binary::primitive_desc pd(dnnl::binary::desc(a, md0, md1, md0), eng);
      auto k = std::make_unique<DnnlKernel>();
      k->primitive = dnnl::binary(pd);
      k->inplace = src0;
      k->BindInput(DNNL_ARG_SRC_0, md0, eng, src0);
      k->BindInput(DNNL_ARG_SRC_1, md1, eng, 1 - src0);
      k->BindOutput(DNNL_ARG_DST, md0, eng, 0);
      return std::unique_ptr<Kernel>(std::move(k));
    }
  }
  Status supported = DispatchAll(t, []<typename T>() {});
  if (!supported.ok()) return ctx.Error(supported.message());
  // ApplyBinary reads an input with the output's shape at the output's index.
  int inplace = -1;
  if (ctx.out_dtypes[0] == t)
    inplace = ctx.in_shapes[0] == *out ? 0 : ctx.in_shapes[1] == *out ? 1 : -1;
  return MakeInplaceFn(inplace, [op, t](const RunContext& rc) {
    return DispatchAll(t, [&]<typename T>() {
      Status s = RunOwnBinary<T>(op, *rc.inputs[0], *rc.inputs[1], rc.outputs[0]);
      (void)s;  // op names were validated in prepare
    });
  });
}

// Min/Max with any number of inputs (1 or more), all broadcast together.
StatusOr<std::unique_ptr<Kernel>> PrepareVariadic(PrepareContext& ctx) {
  const std::string op = ctx.node().op_type;
  if (ctx.num_inputs() == 2) return PrepareBinary(ctx);
  if (ctx.num_inputs() == 0) return ctx.Error("needs at least one input");
  Shape out = ctx.in_shapes[0];
  const DataType t = ctx.in_dtypes[0];
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i) || ctx.in_dtypes[i] != t)
      return ctx.Error("all inputs must be present and share a data type");
    auto b = BroadcastShapes(out, ctx.in_shapes[i]);
    if (!b.ok()) return ctx.Error(b.status().message());
    out = *b;
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = t;
  Status supported = DispatchNumeric(t, []<typename T>() {});
  if (!supported.ok()) return ctx.Error(supported.message());
  return MakeFn([op, t](const RunContext& rc) {
    Tensor* o = rc.outputs[0];
    return DispatchNumeric(t, [&]<typename T>() {
      // Start from input 0 broadcast to the output, then fold each further input in.
      Tensor zero = Tensor::Allocate(t, {});
      ApplyBinary<T, T>(*rc.inputs[0], zero, o, [](T x, T) { return x; });
      for (size_t i = 1; i < rc.inputs.size(); ++i) {
        Tensor acc = *o;
        if (op == "Min")
          ApplyBinary<T, T>(acc, *rc.inputs[i], o, [](T x, T y) { return std::min(x, y); });
        else
          ApplyBinary<T, T>(acc, *rc.inputs[i], o, [](T x, T y) { return std::max(x, y); });
      }
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareWhere(PrepareContext& ctx) {
  if (ctx.num_inputs() != 3) return ctx.Error("needs three inputs");
  for (size_t i = 0; i < 3; ++i)
    if (!ctx.has_input(i)) return ctx.Error("needs three inputs");
  if (ctx.in_dtypes[0] != DataType::kBool) return ctx.Error("condition must be BOOL");
  if (ctx.in_dtypes[1] != ctx.in_dtypes[2]) return ctx.Error("X and Y must share a data type");
  auto s = BroadcastShapes(ctx.in_shapes[0], ctx.in_shapes[1]);
  if (s.ok()) s = BroadcastShapes(*s, ctx.in_shapes[2]);
  if (!s.ok()) return ctx.Error(s.status().message());
  ctx.out_shapes[0] = *s;
  ctx.out_dtypes[0] = ctx.in_dtypes[1];
  const DataType t = ctx.in_dtypes[1];
  // X or Y with the output's shape is read at the output's index.
  const int inplace = ctx.in_shapes[1] == *s ? 1 : ctx.in_shapes[2] == *s ? 2 : -1;
  return MakeInplaceFn(inplace, [t](const RunContext& rc) {
    const Shape& os = rc.outputs[0]->shape();
    std::array<std::vector<int64_t>, 3> st{BroadcastStrides(rc.inputs[0]->shape(), os),
                                           BroadcastStrides(rc.inputs[1]->shape(), os),
                                           BroadcastStrides(rc.inputs[2]->shape(), os)};
    return DispatchBySize(t, [&]<typename T>() {
      const uint8_t* c = rc.inputs[0]->values<uint8_t>().data();
      const T* x = rc.inputs[1]->values<T>().data();
      const T* y = rc.inputs[2]->values<T>().data();
      T* o = rc.outputs[0]->mutable_values<T>().data();
      BroadcastLoop<3>(os, st, [&](int64_t i, const std::array<int64_t, 3>& off) {
        o[i] = c[off[0]] ? x[off[1]] : y[off[2]];
      });
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareNot(PrepareContext& ctx) {
  if (ctx.num_inputs() != 1 || ctx.in_dtypes[0] != DataType::kBool)
    return ctx.Error("needs one BOOL input");
  ctx.out_shapes[0] = ctx.in_shapes[0];
  ctx.out_dtypes[0] = DataType::kBool;
  return OwnUnary<uint8_t>([](uint8_t x) { return uint8_t(!x); });
}

template <typename To, typename From>
To CastValue(From x) {
  if constexpr (std::is_same_v<To, uint8_t> && std::is_same_v<From, uint8_t>) {
    return x;
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    // Out-of-range float to integer is undefined in C++; saturate (NaN -> 0).
    if (!(x == x)) return 0;
    const From lo = static_cast<From>(std::numeric_limits<To>::min());
    const From hi = static_cast<From>(std::numeric_limits<To>::max());
    if (x <= lo) return std::numeric_limits<To>::min();
    if (x >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(x);
  } else {
    return static_cast<To>(x);
  }
}

// Cast to or from FP16 goes through float: FP16 <-> FP32 in bulk (core/fp16.h), other
// types by converting each element to float first (exact for every FP16 value; an
// integer beyond 2^24 rounds once more than a direct conversion would, which FP16's
// range, 65504, makes moot).
StatusOr<std::unique_ptr<Kernel>> PrepareCastFp16(PrepareContext& ctx, DataType from, DataType to) {
  const DataType other = from == DataType::kFp16 ? to : from;
  if (!DispatchAll(other, []<typename T>() {}).ok()) {
    return ctx.Error("cast from " + std::string(DataTypeName(from)) + " to " +
                     std::string(DataTypeName(to)) + " is not supported");
  }
  if (from == DataType::kFp16 && to == DataType::kFp32) {
    return MakeFn([](const RunContext& rc) {
      auto src = rc.inputs[0]->values<uint16_t>();
      Fp16ToFloat(src.data(), rc.outputs[0]->mutable_values<float>().data(), src.size());
      return Status::Ok();
    });
  }
  if (from == DataType::kFp32 && to == DataType::kFp16) {
    return MakeFn([](const RunContext& rc) {
      auto src = rc.inputs[0]->values<float>();
      FloatToFp16(src.data(), rc.outputs[0]->mutable_values<uint16_t>().data(), src.size());
      return Status::Ok();
    });
  }
  const bool to_bool = to == DataType::kBool, from_bool = from == DataType::kBool;
  return MakeFn([from, other, to_bool, from_bool](const RunContext& rc) {
    return DispatchAll(other, [&]<typename T>() {
      if (from == DataType::kFp16) {
        auto src = rc.inputs[0]->values<uint16_t>();
        auto dst = rc.outputs[0]->mutable_values<T>();
        for (size_t i = 0; i < dst.size(); ++i) {
          const float x = Fp16ToFloat(src[i]);
          dst[i] = to_bool ? T(x != 0.f) : CastValue<T>(x);
        }
      } else {
        auto src = rc.inputs[0]->values<T>();
        auto dst = rc.outputs[0]->mutable_values<uint16_t>();
        for (size_t i = 0; i < dst.size(); ++i) {
          dst[i] = FloatToFp16(from_bool ? (src[i] ? 1.f : 0.f) : static_cast<float>(src[i]));
        }
      }
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareCast(PrepareContext& ctx) {
  if (ctx.num_inputs() != 1) return ctx.Error("needs one input");
  auto to = DataTypeFromOnnx(ctx.node().GetInt("to", 0));
  if (!to) return ctx.Error("attribute 'to' names an unknown data type");
  const DataType from = ctx.in_dtypes[0];
  ctx.out_shapes[0] = ctx.in_shapes[0];
  ctx.out_dtypes[0] = *to;
  if (from == *to) return MakeAlias(0);
  if (from == DataType::kFp16 || *to == DataType::kFp16) return PrepareCastFp16(ctx, from, *to);
  Status ok = DispatchAll(*to, []<typename T>() {});
  if (ok.ok()) ok = DispatchAll(from, []<typename T>() {});
  if (!ok.ok()) {
    return ctx.Error("cast from " + std::string(DataTypeName(from)) + " to " +
                     std::string(DataTypeName(*to)) + " is not supported");
  }
  const bool to_bool = *to == DataType::kBool;
  const DataType target = *to;
  return MakeFn([from, target, to_bool](const RunContext& rc) {
    return DispatchAll(from, [&]<typename F>() {
      Status s = DispatchAll(target, [&]<typename T>() {
        auto src = rc.inputs[0]->values<F>();
        auto dst = rc.outputs[0]->mutable_values<T>();
        for (size_t i = 0; i < dst.size(); ++i) {
          dst[i] = to_bool ? T(src[i] != F(0)) : CastValue<T>(src[i]);
        }
      });
      (void)s;
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareClip(PrepareContext& ctx) {
  if (ctx.num_inputs() < 1 || !ctx.has_input(0)) return ctx.Error("needs an input");
  const DataType t = ctx.in_dtypes[0];
  ctx.out_shapes[0] = ctx.in_shapes[0];
  ctx.out_dtypes[0] = t;
  double lo = -std::numeric_limits<double>::infinity(),
         hi = std::numeric_limits<double>::infinity();
  for (size_t i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    if (!ctx.in_data[i])
      return ctx.Error("min and max must be constants (or computed from shapes)");
    auto v = ReadScalar(*ctx.in_data[i]);
    if (!v.ok()) return ctx.Error(v.status().message());
    (i == 1 ? lo : hi) = *v;
  }
  if (t == DataType::kFp32) {
    const float flo = std::isinf(lo) ? -std::numeric_limits<float>::max() : static_cast<float>(lo);
    const float fhi = std::isinf(hi) ? std::numeric_limits<float>::max() : static_cast<float>(hi);
    return DnnlEltwise(ctx, alg::eltwise_clip_v2, flo, fhi);
  }
  StatusOr<std::unique_ptr<Kernel>> k =
      ctx.Error("data type " + std::string(DataTypeName(t)) + " is not supported");
  Status s = DispatchNumeric(t, [&]<typename T>() {
    k = OwnUnary<T>([lo, hi](T x) {
      const double d = static_cast<double>(x);
      return d < lo ? static_cast<T>(lo) : d > hi ? static_cast<T>(hi) : x;
    });
  });
  (void)s;
  return k;
}

}  // namespace

void RegisterElementwiseOps(std::vector<OpDef>* ops) {
  for (const UnarySpec& u : kUnary) ops->push_back({"", u.op, u.attrs, nullptr, PrepareUnary});
  for (std::string_view op : {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
                              "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "PRelu"}) {
    ops->push_back({"", op, {}, nullptr, PrepareBinary});
  }
  ops->push_back({"", "Min", {}, nullptr, PrepareVariadic});
  ops->push_back({"", "Max", {}, nullptr, PrepareVariadic});
  ops->push_back({"", "Where", {}, nullptr, PrepareWhere});
  ops->push_back({"", "Not", {}, nullptr, PrepareNot});
  ops->push_back({"", "Cast", {"to", "saturate"}, nullptr, PrepareCast});
  ops->push_back({"", "Clip", {}, nullptr, PrepareClip});
}

}  // namespace shoal::engine::internal
