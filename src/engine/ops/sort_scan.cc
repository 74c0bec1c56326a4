// The engine's own loops for TopK, CumSum and Mod. TopK's k known when the plan is
// prepared fixes its output shape; a k known only at run time makes its outputs dynamic
// (PrepareContext::out_dynamic), allocated when it runs.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

// An integer input that must be known when the plan is prepared (a constant, or computed
// from shapes).
StatusOr<std::vector<int64_t>> PlanTimeInts(const PrepareContext& ctx, size_t input,
                                            const char* what) {
  if (!ctx.has_input(input) || ctx.in_data[input] == nullptr)
    return ctx.Error(std::string(what) + " must be known when the plan is prepared");
  auto v = ReadInts(*ctx.in_data[input]);
  if (!v.ok()) return ctx.Error(std::string(what) + ": " + v.status().message());
  return v;
}

StatusOr<std::unique_ptr<Kernel>> PrepareTopK(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0)) return ctx.Error("needs X and K");
  const Shape& x = ctx.in_shapes[0];
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", -1), static_cast<int64_t>(x.size()));
  if (!axis.ok() || x.empty()) return ctx.Error("axis is out of range for " + ShapeToString(x));
  if (!ctx.has_input(1)) return ctx.Error("needs K");
  if (Product(ctx.in_shapes[1]) != 1) return ctx.Error("K must hold one value");
  const int64_t dim = x[*axis];
  const bool largest = ctx.node().GetInt("largest", 1) != 0;
  const int64_t outer = Product(x, 0, *axis), inner = Product(x, *axis + 1);
  const DataType dtype = ctx.in_dtypes[0];
  Status ok = DispatchNumeric(dtype, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  ctx.out_dtypes[0] = dtype;
  if (ctx.out_shapes.size() > 1) ctx.out_dtypes[1] = DataType::kInt64;
  const std::string who = ctx.graph->Describe(ctx.node_index);
  auto check_k = [who, dim](int64_t k) -> Status {
    if (k < 0 || k > dim)
      return InvalidArgument(who + ": K is " + std::to_string(k) + "; the axis has " +
                             std::to_string(dim));
    return Status::Ok();
  };
  const int64_t axis_index = *axis;
  int64_t plan_k = -1;  // known when the plan is prepared, else -1
  if (ctx.in_data[1] != nullptr) {
    ASSIGN_OR_RETURN(auto ks, PlanTimeInts(ctx, 1, "K"));
    RETURN_IF_ERROR(check_k(ks[0]));
    plan_k = ks[0];
    Shape out = x;
    out[axis_index] = plan_k;
    ctx.out_shapes[0] = out;
    if (ctx.out_shapes.size() > 1) ctx.out_shapes[1] = out;
  } else {
    if (!IsInteger(ctx.in_dtypes[1])) return ctx.Error("K must be an integer");
    for (size_t o = 0; o < ctx.out_dynamic.size(); ++o) ctx.out_dynamic[o] = 1;
  }
  return MakeFn([=](const RunContext& rc) -> Status {
    int64_t k = plan_k;
    if (k < 0) {
      // K arrives with the run: the outputs take their shape from it.
      ASSIGN_OR_RETURN(auto ks, ReadInts(*rc.inputs[1]));
      k = ks[0];
      RETURN_IF_ERROR(check_k(k));
      Shape out = x;
      out[axis_index] = k;
      *rc.outputs[0] = Tensor::Allocate(dtype, out);
      if (rc.outputs.size() > 1 && rc.outputs[1])
        *rc.outputs[1] = Tensor::Allocate(DataType::kInt64, out);
    }
    return DispatchNumeric(dtype, [&]<typename T>() {
      const T* src = static_cast<const T*>(rc.inputs[0]->data());
      T* values = static_cast<T*>(rc.outputs[0]->mutable_data());
      int64_t* indices = rc.outputs.size() > 1 && rc.outputs[1]
                             ? rc.outputs[1]->mutable_values<int64_t>().data()
                             : nullptr;
      std::vector<int64_t> order(static_cast<size_t>(dim));
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          const T* s = src + o * dim * inner + i;
          std::iota(order.begin(), order.end(), 0);
          // Equal values keep the lower index first, as ONNX asks. A NaN counts as larger
          // than every number (as NumPy and PyTorch sort it), so the order stays a strict
          // weak one that partial_sort needs: NaNs come first among the largest, last among
          // the smallest.
          auto above = [](T va, T vb) {  // va > vb, a NaN above every number
            if (va != va) return vb == vb;
            return vb == vb && va > vb;
          };
          auto before = [&](int64_t a, int64_t b) {
            const T va = s[a * inner], vb = s[b * inner];
            if (above(va, vb)) return largest;
            if (above(vb, va)) return !largest;
            return a < b;
          };
          std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
          for (int64_t j = 0; j < k; ++j) {
            const int64_t at = (o * k + j) * inner + i;
            values[at] = s[order[j] * inner];
            if (indices) indices[at] = order[j];
          }
        }
      }
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareCumSum(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0)) return ctx.Error("needs x and axis");
  const Shape& x = ctx.in_shapes[0];
  ASSIGN_OR_RETURN(auto axes, PlanTimeInts(ctx, 1, "axis"));
  if (axes.size() != 1) return ctx.Error("axis must hold one value");
  auto axis = NormalizeAxis(axes[0], static_cast<int64_t>(x.size()));
  if (!axis.ok() || x.empty()) return ctx.Error("axis is out of range for " + ShapeToString(x));
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const bool exclusive = ctx.node().GetInt("exclusive", 0) != 0;
  const bool reverse = ctx.node().GetInt("reverse", 0) != 0;
  const int64_t outer = Product(x, 0, *axis), dim = x[*axis], inner = Product(x, *axis + 1);
  const DataType dtype = ctx.in_dtypes[0];
  Status ok = DispatchNumeric(dtype, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  return MakeFn([=](const RunContext& rc) -> Status {
    return DispatchNumeric(dtype, [&]<typename T>() {
      const T* src = static_cast<const T*>(rc.inputs[0]->data());
      T* dst = static_cast<T*>(rc.outputs[0]->mutable_data());
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          T sum = T(0);
          for (int64_t s = 0; s < dim; ++s) {
            const int64_t j = reverse ? dim - 1 - s : s;
            const int64_t at = (o * dim + j) * inner + i;
            if (exclusive) {
              dst[at] = sum;
              sum += src[at];
            } else {
              sum += src[at];
              dst[at] = sum;
            }
          }
        }
      }
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareMod(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs A and B");
  if (ctx.in_dtypes[0] != ctx.in_dtypes[1]) return ctx.Error("A and B must have the same type");
  const DataType dtype = ctx.in_dtypes[0];
  const bool fmod = ctx.node().GetInt("fmod", 0) != 0;
  if (IsFloat(dtype) && !fmod) return ctx.Error("floating-point inputs need fmod = 1");
  if (!IsFloat(dtype) && !IsInteger(dtype))
    return ctx.Error("unsupported data type " + std::string(DataTypeName(dtype)));
  Status ok = DispatchNumeric(dtype, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  auto out = BroadcastShapes(ctx.in_shapes[0], ctx.in_shapes[1]);
  if (!out.ok()) return ctx.Error(out.status().message());
  ctx.out_shapes[0] = *out;
  ctx.out_dtypes[0] = dtype;
  const Shape shape = *out;
  const auto sa = BroadcastStrides(ctx.in_shapes[0], shape);
  const auto sb = BroadcastStrides(ctx.in_shapes[1], shape);
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([=](const RunContext& rc) -> Status {
    bool by_zero = false;
    Status s = DispatchNumeric(dtype, [&]<typename T>() {
      const T* a = static_cast<const T*>(rc.inputs[0]->data());
      const T* b = static_cast<const T*>(rc.inputs[1]->data());
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      ForEachBroadcast(shape, sa, sb, [&](int64_t io, int64_t ia, int64_t ib) {
        const T x = a[ia], y = b[ib];
        if constexpr (std::is_floating_point_v<T>) {
          o[io] = std::fmod(x, y);
        } else {
          if (y == 0) {
            by_zero = true;
            o[io] = 0;
            return;
          }
          T r = static_cast<T>(x % y);
          // fmod = 0: the result takes the divisor's sign (Python's %).
          if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
          o[io] = r;
        }
      });
    });
    if (!s.ok()) return s;
    if (by_zero) return InvalidArgument(who + ": integer modulo by zero");
    return Status::Ok();
  });
}

}  // namespace

void RegisterSortScanOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "TopK", {"axis", "largest", "sorted"}, nullptr, PrepareTopK});
  ops->push_back({"", "CumSum", {"exclusive", "reverse"}, nullptr, PrepareCumSum});
  ops->push_back({"", "Mod", {"fmod"}, nullptr, PrepareMod});
}

}  // namespace shoal::engine::internal
