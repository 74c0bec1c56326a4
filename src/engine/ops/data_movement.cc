// The engine's own loops for DepthToSpace, SpaceToDepth, Trilu, GatherND, ScatterND and
// ScatterElements (any element type; the scatters' add/mul/max/min reductions on the
// numeric types DispatchNumeric covers).
#include <algorithm>
#include <cstring>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

// out[n, c, h, w] of DepthToSpace / SpaceToDepth as an index into the NCHW input.
StatusOr<std::unique_ptr<Kernel>> PrepareDepthSpace(PrepareContext& ctx) {
  if (ctx.num_inputs() != 1 || !ctx.has_input(0)) return ctx.Error("needs one input");
  const Shape& x = ctx.in_shapes[0];
  if (x.size() != 4) return ctx.Error("input must be 4-D (NCHW); got " + ShapeToString(x));
  const int64_t b = ctx.node().GetInt("blocksize", 0);
  if (b <= 0) return ctx.Error("blocksize must be positive");
  const bool to_space = ctx.node().op_type == "DepthToSpace";
  const bool crd = ctx.node().GetString("mode", "DCR") == "CRD";
  const int64_t N = x[0], C = x[1], H = x[2], W = x[3];
  Shape out;
  if (to_space) {
    if (C % (b * b) != 0) return ctx.Error("channels must be a multiple of blocksize^2");
    out = {N, C / (b * b), H * b, W * b};
  } else {
    if (H % b != 0 || W % b != 0)
      return ctx.Error("height and width must be multiples of blocksize");
    out = {N, C * b * b, H / b, W / b};
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  // Source element of every output element, in output order.
  std::vector<int64_t> src(static_cast<size_t>(Product(out)));
  size_t at = 0;
  for (int64_t n = 0; n < out[0]; ++n)
    for (int64_t c = 0; c < out[1]; ++c)
      for (int64_t h = 0; h < out[2]; ++h)
        for (int64_t w = 0; w < out[3]; ++w) {
          int64_t ic, ih, iw;
          if (to_space) {
            const int64_t bh = h % b, bw = w % b, cc = out[1];
            ic = crd ? (c * b + bh) * b + bw : (bh * b + bw) * cc + c;
            ih = h / b;
            iw = w / b;
          } else {
            const int64_t blk = c / C, ch = c % C;  // channel = (bh * b + bw) * C + ch
            ic = ch;
            ih = h * b + blk / b;
            iw = w * b + blk % b;
          }
          src[at++] = ((n * C + ic) * H + ih) * W + iw;
        }
  const DataType dtype = ctx.in_dtypes[0];
  return MakeFn([src = std::move(src), dtype](const RunContext& rc) -> Status {
    return DispatchBySize(dtype, [&]<typename T>() {
      const T* in = static_cast<const T*>(rc.inputs[0]->data());
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      for (size_t i = 0; i < src.size(); ++i) o[i] = in[src[i]];
    });
  });
}

Status CheckDepthSpace(const Node& node, const Graph& graph) {
  const std::string mode = node.GetString("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") {
    return InvalidArgument(graph.Describe(static_cast<int>(&node - graph.nodes.data())) +
                           ": mode must be DCR or CRD; was '" + mode + "'");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PrepareTrilu(PrepareContext& ctx) {
  if (!ctx.has_input(0)) return ctx.Error("needs an input");
  const Shape& x = ctx.in_shapes[0];
  if (x.size() < 2) return ctx.Error("input must have rank >= 2");
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const bool upper = ctx.node().GetInt("upper", 1) != 0;
  const int64_t rows = x[x.size() - 2], cols = x.back(), mats = Product(x, 0, x.size() - 2);
  const DataType dtype = ctx.in_dtypes[0];
  const bool has_k = ctx.has_input(1);
  return MakeFn([=](const RunContext& rc) -> Status {
    int64_t k = 0;
    if (has_k) {
      auto v = ReadInts(*rc.inputs[1]);
      if (!v.ok() || v->size() != 1) return InvalidArgument("Trilu: k must be one integer");
      k = (*v)[0];
    }
    return DispatchBySize(dtype, [&]<typename T>() {
      const T* in = static_cast<const T*>(rc.inputs[0]->data());
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      for (int64_t m = 0; m < mats; ++m)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t at = (m * rows + i) * cols + j;
            const bool keep = upper ? j - i >= k : j - i <= k;
            o[at] = keep ? in[at] : T(0);
          }
    });
  });
}

// Reduction of ScatterND / ScatterElements.
enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

StatusOr<Reduction> ParseReduction(const Node& node) {
  const std::string r = node.GetString("reduction", "none");
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  return InvalidArgument("reduction must be none, add, mul, max or min; was '" + r + "'");
}

Status CheckScatter(const Node& node, const Graph& graph) {
  auto r = ParseReduction(node);
  if (!r.ok())
    return InvalidArgument(graph.Describe(static_cast<int>(&node - graph.nodes.data())) + ": " +
                           r.status().message());
  return Status::Ok();
}

// Copies `count` elements from `src` into `dst` under `red`, as type T.
template <typename T>
void Combine(T* dst, const T* src, int64_t count, Reduction red) {
  for (int64_t i = 0; i < count; ++i) {
    switch (red) {
      case Reduction::kNone:
        dst[i] = src[i];
        break;
      case Reduction::kAdd:
        dst[i] = static_cast<T>(dst[i] + src[i]);
        break;
      case Reduction::kMul:
        dst[i] = static_cast<T>(dst[i] * src[i]);
        break;
      case Reduction::kMax:
        dst[i] = std::max(dst[i], src[i]);
        break;
      case Reduction::kMin:
        dst[i] = std::min(dst[i], src[i]);
        break;
    }
  }
}

// Runs `fn.template operator()<T>()` with T the element type: by size for kNone (data
// movement only), else numeric.
template <typename Fn>
Status DispatchScatter(DataType t, Reduction red, Fn&& fn) {
  if (red == Reduction::kNone) return DispatchBySize(t, fn);
  return DispatchNumeric(t, fn);
}

StatusOr<std::unique_ptr<Kernel>> PrepareGatherND(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs data and indices");
  const Shape& x = ctx.in_shapes[0];
  const Shape& idx = ctx.in_shapes[1];
  const int64_t bd = ctx.node().GetInt("batch_dims", 0);
  const int64_t r = static_cast<int64_t>(x.size()), q = static_cast<int64_t>(idx.size());
  if (q < 1 || r < 1) return ctx.Error("data and indices must have rank >= 1");
  const int64_t k = idx.back();
  if (bd < 0 || bd >= std::min(q, r) || k < 1 || k > r - bd)
    return ctx.Error("indices' last dimension and batch_dims do not fit data " + ShapeToString(x));
  for (int64_t i = 0; i < bd; ++i)
    if (x[i] != idx[i]) return ctx.Error("batch dimensions of data and indices differ");
  Shape out(idx.begin(), idx.end() - 1);
  out.insert(out.end(), x.begin() + bd + k, x.end());
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const int64_t batches = Product(x, 0, bd);
  const int64_t per_batch = Product(idx, bd, q - 1);  // index tuples per batch
  const int64_t slice = Product(x, bd + k);           // elements per gathered slice
  const int64_t batch_stride = Product(x, bd);
  std::vector<int64_t> dims(x.begin() + bd, x.begin() + bd + k);
  const DataType dtype = ctx.in_dtypes[0];
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([=](const RunContext& rc) -> Status {
    auto ind = ReadInts(*rc.inputs[1]);
    if (!ind.ok()) return ind.status();
    std::vector<int64_t>& tuples = *ind;
    for (size_t i = 0; i < tuples.size(); ++i) {
      const int64_t d = dims[i % k];
      int64_t& v = tuples[i];
      if (v < -d || v >= d)
        return InvalidArgument(who + ": index " + std::to_string(v) +
                               " is out of range for a dimension of " + std::to_string(d));
      if (v < 0) v += d;
    }
    return DispatchBySize(dtype, [&]<typename T>() {
      const T* in = static_cast<const T*>(rc.inputs[0]->data());
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      for (int64_t b = 0; b < batches; ++b)
        for (int64_t t = 0; t < per_batch; ++t) {
          const int64_t* tuple = tuples.data() + (b * per_batch + t) * k;
          int64_t off = 0;
          for (int64_t j = 0; j < k; ++j) off = off * dims[j] + tuple[j];
          std::memcpy(o + (b * per_batch + t) * slice, in + b * batch_stride + off * slice,
                      sizeof(T) * slice);
        }
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareScatterND(PrepareContext& ctx) {
  if (ctx.num_inputs() != 3 || !ctx.has_input(0) || !ctx.has_input(1) || !ctx.has_input(2))
    return ctx.Error("needs data, indices and updates");
  auto red = ParseReduction(ctx.node());
  if (!red.ok()) return ctx.Error(red.status().message());
  const Shape& x = ctx.in_shapes[0];
  const Shape& idx = ctx.in_shapes[1];
  const Shape& upd = ctx.in_shapes[2];
  const int64_t r = static_cast<int64_t>(x.size()), q = static_cast<int64_t>(idx.size());
  if (q < 1 || r < 1) return ctx.Error("data and indices must have rank >= 1");
  const int64_t k = idx.back();
  if (k < 1 || k > r) return ctx.Error("indices' last dimension must be in [1, rank of data]");
  Shape want(idx.begin(), idx.end() - 1);
  want.insert(want.end(), x.begin() + k, x.end());
  if (upd != want)
    return ctx.Error("updates must have shape " + ShapeToString(want) + "; got " +
                     ShapeToString(upd));
  if (ctx.in_dtypes[2] != ctx.in_dtypes[0]) return ctx.Error("updates must have data's type");
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const int64_t tuples_n = Product(idx, 0, q - 1), slice = Product(x, k);
  std::vector<int64_t> dims(x.begin(), x.begin() + k);
  const DataType dtype = ctx.in_dtypes[0];
  const Reduction reduction = *red;
  Status ok = DispatchScatter(dtype, reduction, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([=](const RunContext& rc) -> Status {
    auto ind = ReadInts(*rc.inputs[1]);
    if (!ind.ok()) return ind.status();
    std::vector<int64_t> offsets(static_cast<size_t>(tuples_n));
    for (int64_t t = 0; t < tuples_n; ++t) {
      int64_t off = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t v = (*ind)[t * k + j];
        if (v < -dims[j] || v >= dims[j])
          return InvalidArgument(who + ": index " + std::to_string(v) +
                                 " is out of range for a dimension of " + std::to_string(dims[j]));
        off = off * dims[j] + (v < 0 ? v + dims[j] : v);
      }
      offsets[t] = off * slice;
    }
    std::memcpy(rc.outputs[0]->mutable_data(), rc.inputs[0]->data(), rc.inputs[0]->byte_size());
    return DispatchScatter(dtype, reduction, [&]<typename T>() {
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      const T* u = static_cast<const T*>(rc.inputs[2]->data());
      for (int64_t t = 0; t < tuples_n; ++t)
        Combine(o + offsets[t], u + t * slice, slice, reduction);
    });
  });
}

// GatherElements (torch.gather): out[p] = data[p with the axis coordinate replaced by
// indices[p]]; indices may be smaller than data in every dimension but the axis.
StatusOr<std::unique_ptr<Kernel>> PrepareGatherElements(PrepareContext& ctx) {
  if (ctx.num_inputs() != 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs data and indices");
  const Shape& x = ctx.in_shapes[0];
  const Shape& idx = ctx.in_shapes[1];
  if (!IsInteger(ctx.in_dtypes[1])) return ctx.Error("indices must be integers");
  if (idx.size() != x.size() || x.empty())
    return ctx.Error("indices must have the rank of data, at least 1");
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(x.size()));
  if (!axis.ok()) return ctx.Error("axis is out of range for " + ShapeToString(x));
  for (size_t i = 0; i < x.size(); ++i)
    if (static_cast<int64_t>(i) != *axis && idx[i] > x[i])
      return ctx.Error("indices " + ShapeToString(idx) + " do not fit data " + ShapeToString(x));
  ctx.out_shapes[0] = idx;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const DataType dtype = ctx.in_dtypes[0];
  Status sized = DispatchBySize(dtype, []<typename T>() {});
  if (!sized.ok()) return ctx.Error(sized.message());
  const int64_t a = *axis;
  const std::vector<int64_t> xs = BroadcastStrides(x, x);
  const Shape ishape = idx;
  const int64_t dim = x[a];
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([=](const RunContext& rc) -> Status {
    auto ind = ReadInts(*rc.inputs[1]);
    if (!ind.ok()) return ind.status();
    // Source offset in data of every output element.
    std::vector<int64_t> source(ind->size());
    const size_t rank = ishape.size();
    std::vector<int64_t> pos(rank, 0);
    for (size_t e = 0; e < ind->size(); ++e) {
      int64_t v = (*ind)[e];
      if (v < -dim || v >= dim)
        return InvalidArgument(who + ": index " + std::to_string(v) +
                               " is out of range for a dimension of " + std::to_string(dim));
      if (v < 0) v += dim;
      int64_t off = 0;
      for (size_t i = 0; i < rank; ++i) off += (static_cast<int64_t>(i) == a ? v : pos[i]) * xs[i];
      source[e] = off;
      for (size_t i = rank; i-- > 0;) {
        if (++pos[i] < ishape[i]) break;
        pos[i] = 0;
      }
    }
    return DispatchBySize(dtype, [&]<typename T>() {
      const T* in = static_cast<const T*>(rc.inputs[0]->data());
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      for (size_t e = 0; e < source.size(); ++e) o[e] = in[source[e]];
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareScatterElements(PrepareContext& ctx) {
  if (ctx.num_inputs() != 3 || !ctx.has_input(0) || !ctx.has_input(1) || !ctx.has_input(2))
    return ctx.Error("needs data, indices and updates");
  auto red = ParseReduction(ctx.node());
  if (!red.ok()) return ctx.Error(red.status().message());
  const Shape& x = ctx.in_shapes[0];
  const Shape& idx = ctx.in_shapes[1];
  if (ctx.in_shapes[2] != idx) return ctx.Error("updates must have the shape of indices");
  if (idx.size() != x.size()) return ctx.Error("indices must have the rank of data");
  if (ctx.in_dtypes[2] != ctx.in_dtypes[0]) return ctx.Error("updates must have data's type");
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(x.size()));
  if (!axis.ok() || x.empty()) return ctx.Error("axis is out of range for " + ShapeToString(x));
  // Along the axis, indices may be longer than data (many updates to one element, as
  // torch.scatter_add into a smaller tensor); elsewhere they must fit.
  for (size_t i = 0; i < x.size(); ++i)
    if (static_cast<int64_t>(i) != *axis && idx[i] > x[i])
      return ctx.Error("indices must not be larger than data in any dimension but the axis");
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const DataType dtype = ctx.in_dtypes[0];
  const Reduction reduction = *red;
  Status ok = DispatchScatter(dtype, reduction, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  const int64_t a = *axis;
  const std::vector<int64_t> xs = BroadcastStrides(x, x), is = BroadcastStrides(idx, idx);
  const Shape ishape = idx, xshape = x;
  const std::string who = ctx.graph->Describe(ctx.node_index);
  return MakeFn([=](const RunContext& rc) -> Status {
    auto ind = ReadInts(*rc.inputs[1]);
    if (!ind.ok()) return ind.status();
    // Target offset in data of every update element.
    std::vector<int64_t> target(ind->size());
    const size_t rank = ishape.size();
    std::vector<int64_t> pos(rank, 0);
    for (size_t e = 0; e < ind->size(); ++e) {
      int64_t v = (*ind)[e];
      const int64_t d = xshape[a];
      if (v < -d || v >= d)
        return InvalidArgument(who + ": index " + std::to_string(v) +
                               " is out of range for a dimension of " + std::to_string(d));
      if (v < 0) v += d;
      int64_t off = 0;
      for (size_t i = 0; i < rank; ++i)
        off += (static_cast<int64_t>(i) == a ? v : pos[i]) * (xs[i] ? xs[i] : 0);
      target[e] = off;
      for (size_t i = rank; i-- > 0;) {
        if (++pos[i] < ishape[i]) break;
        pos[i] = 0;
      }
    }
    std::memcpy(rc.outputs[0]->mutable_data(), rc.inputs[0]->data(), rc.inputs[0]->byte_size());
    return DispatchScatter(dtype, reduction, [&]<typename T>() {
      T* o = static_cast<T*>(rc.outputs[0]->mutable_data());
      const T* u = static_cast<const T*>(rc.inputs[2]->data());
      for (size_t e = 0; e < target.size(); ++e) Combine(o + target[e], u + e, 1, reduction);
    });
  });
}

}  // namespace

void RegisterDataMovementOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "DepthToSpace", {"blocksize", "mode"}, CheckDepthSpace, PrepareDepthSpace});
  ops->push_back({"", "SpaceToDepth", {"blocksize"}, nullptr, PrepareDepthSpace});
  ops->push_back({"", "Trilu", {"upper"}, nullptr, PrepareTrilu});
  ops->push_back({"", "GatherND", {"batch_dims"}, nullptr, PrepareGatherND});
  ops->push_back({"", "GatherElements", {"axis"}, nullptr, PrepareGatherElements});
  ops->push_back({"", "ScatterND", {"reduction"}, CheckScatter, PrepareScatterND});
  ops->push_back(
      {"", "ScatterElements", {"axis", "reduction"}, CheckScatter, PrepareScatterElements});
}

}  // namespace shoal::engine::internal
