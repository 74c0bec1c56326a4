// Reductions over a set of axes: ReduceMean, ReduceSum, ReduceMax, ReduceMin,
// ReduceProd, ReduceSumSquare, ReduceL2. FP32 Mean/Sum/Max/Min run on oneDNN's
// reduction primitive; other types and empty inputs in the engine's own loop. ArgMax and
// ArgMin (one axis, int64 indices) are the engine's own loop.
#include <cmath>
#include <limits>

#include "engine/internal/broadcast.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

// The axes to reduce: from input 1 when given (opset 18, ReduceSum from 13), else the
// `axes` attribute; empty means all (or none, with noop_with_empty_axes).
StatusOr<std::vector<int64_t>> ReduceAxes(const PrepareContext& ctx) {
  std::vector<int64_t> axes = ctx.node().GetInts("axes", {});
  if (ctx.has_input(1)) {
    if (!ctx.in_data[1]) return ctx.Error("axes must be a constant or computed from shapes");
    auto v = ReadInts(*ctx.in_data[1]);
    if (!v.ok()) return ctx.Error(v.status().message());
    axes = *v;
  }
  return axes;
}

// FP32 Mean/Sum/Max/Min on oneDNN's reduction primitive, from `x` to `kept` (x with the
// reduced axes at 1).
StatusOr<std::unique_ptr<Kernel>> DnnlReduceKernel(const PrepareContext& ctx, const std::string& op,
                                                   const Shape& x, const Shape& kept) {
  const auto a = op == "ReduceMean"  ? dnnl::algorithm::reduction_mean
                 : op == "ReduceSum" ? dnnl::algorithm::reduction_sum
                 : op == "ReduceMax" ? dnnl::algorithm::reduction_max
                                     : dnnl::algorithm::reduction_min;
  const auto& eng = *ctx.dnnl_engine;
  const auto src = PlainDesc(x, DataType::kFp32), dst = PlainDesc(kept, DataType::kFp32);
  dnnl::reduction::primitive_desc pd(dnnl::reduction::desc(a, src, dst, 0.f, 0.f), eng);
  auto k = std::make_unique<DnnlKernel>();
  k->primitive = dnnl::reduction(pd);
  k->BindInput(DNNL_ARG_SRC, src, eng, 0);
  k->BindOutput(DNNL_ARG_DST, dst, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

// The engine's own loop: walks the input once, accumulating into the output through
// strides that are zero on the reduced axes. `count`: input elements per output element.
StatusOr<std::unique_ptr<Kernel>> LoopReduceKernel(std::string op, DataType t, Shape x,
                                                   std::vector<int64_t> out_strides,
                                                   int64_t count) {
  return MakeFn([op = std::move(op), t, x = std::move(x), out_strides = std::move(out_strides),
                 count](const RunContext& rc) {
    return DispatchNumeric(t, [&]<typename T>() {
      using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
      const T* in = rc.inputs[0]->values<T>().data();
      T* o = rc.outputs[0]->mutable_values<T>().data();
      const int64_t n_out = rc.outputs[0]->element_count();
      Acc init = 0;
      if (op == "ReduceMax") init = std::numeric_limits<T>::lowest();
      if (op == "ReduceMin") init = std::numeric_limits<T>::max();
      if (op == "ReduceProd") init = 1;
      std::vector<Acc> acc(static_cast<size_t>(n_out), init);
      std::array<std::vector<int64_t>, 1> st{out_strides};
      BroadcastLoop<1>(x, st, [&](int64_t i, const std::array<int64_t, 1>& off) {
        Acc& a = acc[static_cast<size_t>(off[0])];
        const Acc v = static_cast<Acc>(in[i]);
        if (op == "ReduceMax")
          a = std::max(a, v);
        else if (op == "ReduceMin")
          a = std::min(a, v);
        else if (op == "ReduceProd")
          a = static_cast<Acc>(a * v);
        else if (op == "ReduceSumSquare" || op == "ReduceL2")
          a = static_cast<Acc>(a + v * v);
        else
          a = static_cast<Acc>(a + v);
      });
      for (int64_t j = 0; j < n_out; ++j) {
        Acc a = acc[static_cast<size_t>(j)];
        if (op == "ReduceMean") {
          if constexpr (std::is_floating_point_v<T>)
            a = count ? a / static_cast<Acc>(count) : std::nan("");
          else
            a = count ? static_cast<Acc>(a / count) : 0;
        }
        if (op == "ReduceL2") a = static_cast<Acc>(std::sqrt(static_cast<double>(a)));
        o[j] = static_cast<T>(a);
      }
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareReduce(PrepareContext& ctx) {
  const Node& node = ctx.node();
  const std::string op = node.op_type;
  if (ctx.num_inputs() < 1 || !ctx.has_input(0)) return ctx.Error("needs data");
  const Shape& x = ctx.in_shapes[0];
  const int64_t r = static_cast<int64_t>(x.size());
  ASSIGN_OR_RETURN(const std::vector<int64_t> axes, ReduceAxes(ctx));
  const bool keep = node.GetInt("keepdims", 1) != 0;
  const DataType t = ctx.in_dtypes[0];
  ctx.out_dtypes[0] = t;
  if (axes.empty() && node.GetInt("noop_with_empty_axes", 0) != 0) {
    ctx.out_shapes[0] = x;
    return MakeAlias(0);
  }
  std::vector<char> reduced(x.size(), axes.empty() ? 1 : 0);
  for (int64_t a : axes) {
    auto ax = NormalizeAxis(a, r);
    if (!ax.ok() || r == 0) return ctx.Error("axis " + std::to_string(a) + " is out of range");
    reduced[*ax] = 1;
  }
  Shape kept, out;
  int64_t count = 1;
  for (size_t i = 0; i < x.size(); ++i) {
    kept.push_back(reduced[i] ? 1 : x[i]);
    if (reduced[i]) count *= x[i];
    if (!reduced[i] || keep) out.push_back(reduced[i] ? 1 : x[i]);
  }
  ctx.out_shapes[0] = out;
  if (Product(out) == 0) return MakeFn([](const RunContext&) { return Status::Ok(); });
  // oneDNN rejects a reduction that reduces nothing (all reduced axes of size 1).
  const bool dnnl_ok =
      t == DataType::kFp32 && Product(x) > Product(kept) &&
      (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin");
  if (dnnl_ok) return DnnlReduceKernel(ctx, op, x, kept);
  Status ok = DispatchNumeric(t, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  return LoopReduceKernel(op, t, x, BroadcastStrides(kept, x), count);
}

// ArgMax / ArgMin along one axis: int64 indices, the first extreme (the last with
// select_last_index). The loop walks the reduced axis outermost within each outer slice,
// so that it reads the input in order and compares `inner` contiguous values at a time.
StatusOr<std::unique_ptr<Kernel>> PrepareArgExtreme(PrepareContext& ctx) {
  const Node& node = ctx.node();
  if (ctx.num_inputs() != 1 || !ctx.has_input(0)) return ctx.Error("needs data");
  const Shape& x = ctx.in_shapes[0];
  const int64_t r = static_cast<int64_t>(x.size());
  auto axis = NormalizeAxis(node.GetInt("axis", 0), r);
  if (!axis.ok() || r == 0) return ctx.Error("axis is out of range for " + ShapeToString(x));
  const int64_t ax = *axis;
  const int64_t dim = x[ax];
  if (dim == 0) return ctx.Error("cannot take the arg extreme of an empty axis");
  const bool keep = node.GetInt("keepdims", 1) != 0;
  const bool last = node.GetInt("select_last_index", 0) != 0;
  const bool is_max = node.op_type == "ArgMax";
  const DataType t = ctx.in_dtypes[0];
  Status ok = DispatchNumeric(t, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  Shape out;
  for (int64_t i = 0; i < r; ++i) {
    if (i != ax)
      out.push_back(x[i]);
    else if (keep)
      out.push_back(1);
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = DataType::kInt64;
  const int64_t outer = Product(x, 0, ax), inner = Product(x, ax + 1);
  return MakeFn([=](const RunContext& rc) -> Status {
    return DispatchNumeric(t, [&]<typename T>() {
      const T* in = rc.inputs[0]->values<T>().data();
      int64_t* idx = rc.outputs[0]->mutable_values<int64_t>().data();
      if (inner == 1) {  // the last axis (a detector's best class): one scan per row
        for (int64_t o = 0; o < outer; ++o) {
          const T* s = in + o * dim;
          T b = s[0];
          int64_t at = 0;
          for (int64_t k = 1; k < dim; ++k) {
            const T v = s[k];
            if (is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b)) {
              b = v;
              at = k;
            }
          }
          idx[o] = at;
        }
        return;
      }
      std::vector<T> best(static_cast<size_t>(inner));
      for (int64_t o = 0; o < outer; ++o) {
        const T* s = in + o * dim * inner;
        int64_t* d = idx + o * inner;
        std::copy(s, s + inner, best.begin());
        std::fill(d, d + inner, 0);
        for (int64_t k = 1; k < dim; ++k) {
          const T* row = s + k * inner;
          for (int64_t i = 0; i < inner; ++i) {
            const T v = row[i];
            T& b = best[static_cast<size_t>(i)];
            const bool better = is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
            if (better) {
              b = v;
              d[i] = k;
            }
          }
        }
      }
    });
  });
}

}  // namespace

void RegisterReduceOps(std::vector<OpDef>* ops) {
  for (std::string_view op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                              "ReduceSumSquare", "ReduceL2"}) {
    ops->push_back({"", op, {"axes", "keepdims", "noop_with_empty_axes"}, nullptr, PrepareReduce});
  }
  for (std::string_view op : {"ArgMax", "ArgMin"})
    ops->push_back({"", op, {"axis", "keepdims", "select_last_index"}, nullptr, PrepareArgExtreme});
}

}  // namespace shoal::engine::internal
