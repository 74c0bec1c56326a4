// Shape operators, computed by the engine: Flatten, Reshape, Squeeze, Unsqueeze,
// Identity and Dropout are views of their input (no copy); Shape and Size are known when
// the plan is prepared; Transpose is a oneDNN reorder for 4- and 1-byte elements (the
// engine's own loop otherwise); Concat, Split, Expand, Tile, ConstantOfShape and Range move bytes
// in the engine's own loops.
#include <cmath>
#include <cstring>
#include <optional>

#include "engine/internal/broadcast.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

Status NeedOne(PrepareContext& ctx) {
  if (ctx.num_inputs() < 1 || !ctx.has_input(0)) return ctx.Error("needs an input");
  return Status::Ok();
}

// The integer list in input `i` (must be known at plan time), or the attribute.
StatusOr<std::optional<std::vector<int64_t>>> IntsFromInputOrAttr(PrepareContext& ctx, size_t i,
                                                                  std::string_view attr) {
  if (ctx.has_input(i)) {
    if (!ctx.in_data[i]) {
      return ctx.Error("input " + std::to_string(i) +
                       " must be a constant or computed from shapes");
    }
    auto v = ReadInts(*ctx.in_data[i]);
    if (!v.ok()) return ctx.Error(v.status().message());
    return std::optional<std::vector<int64_t>>(*v);
  }
  if (const Attribute* a = ctx.node().attr(attr); a && a->kind == Attribute::Kind::kInts) {
    return std::optional<std::vector<int64_t>>(a->ints);
  }
  return std::optional<std::vector<int64_t>>();
}

// A target shape given as IntsFromInputOrAttr: required, with no negative dimension.
StatusOr<std::vector<int64_t>> ShapeFromInputOrAttr(PrepareContext& ctx, size_t i,
                                                    std::string_view attr) {
  ASSIGN_OR_RETURN(auto shape, IntsFromInputOrAttr(ctx, i, attr));
  if (!shape) return ctx.Error("needs a shape");
  for (int64_t d : *shape)
    if (d < 0) return ctx.Error("shape has a negative dimension");
  return *std::move(shape);
}

StatusOr<std::unique_ptr<Kernel>> View(PrepareContext& ctx, Shape out) {
  ctx.out_shapes[0] = std::move(out);
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  return MakeAlias(0);
}

StatusOr<std::unique_ptr<Kernel>> PrepareFlatten(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  const Shape& x = ctx.in_shapes[0];
  const int64_t r = static_cast<int64_t>(x.size());
  int64_t axis = ctx.node().GetInt("axis", 1);
  if (axis < -r || axis > r) return ctx.Error("axis " + std::to_string(axis) + " is out of range");
  if (axis < 0) axis += r;
  return View(ctx, {Product(x, 0, axis), Product(x, axis)});
}

StatusOr<std::unique_ptr<Kernel>> PrepareReshape(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ASSIGN_OR_RETURN(auto spec, IntsFromInputOrAttr(ctx, 1, "shape"));
  if (!spec) return ctx.Error("needs a shape");
  const Shape& x = ctx.in_shapes[0];
  const bool allow_zero = ctx.node().GetInt("allowzero", 0) != 0;
  Shape out = *spec;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0 && !allow_zero) {
      if (i >= x.size())
        return ctx.Error("shape copies dimension " + std::to_string(i) + " the input lacks");
      out[i] = x[i];
    }
    if (out[i] == -1) {
      if (infer >= 0) return ctx.Error("shape has more than one -1");
      infer = static_cast<int>(i);
    } else if (out[i] < 0) {
      return ctx.Error("shape has a negative dimension");
    } else {
      known *= out[i];
    }
  }
  const int64_t total = Product(x);
  if (infer >= 0) {
    if (known == 0 || total % known != 0) {
      return ctx.Error("cannot reshape " + ShapeToString(x) + " to " + ShapeToString(*spec));
    }
    out[infer] = total / known;
  }
  if (Product(out) != total)
    return ctx.Error("cannot reshape " + ShapeToString(x) + " to " + ShapeToString(*spec));
  return View(ctx, out);
}

StatusOr<std::unique_ptr<Kernel>> PrepareSqueeze(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ASSIGN_OR_RETURN(auto axes, IntsFromInputOrAttr(ctx, 1, "axes"));
  const Shape& x = ctx.in_shapes[0];
  std::vector<char> drop(x.size(), 0);
  if (axes && !axes->empty()) {
    for (int64_t a : *axes) {
      auto ax = NormalizeAxis(a, static_cast<int64_t>(x.size()));
      if (!ax.ok() || x.empty()) return ctx.Error("axis " + std::to_string(a) + " is out of range");
      if (x[*ax] != 1)
        return ctx.Error("cannot squeeze axis " + std::to_string(a) + " of size " +
                         std::to_string(x[*ax]));
      drop[*ax] = 1;
    }
  } else {
    for (size_t i = 0; i < x.size(); ++i) drop[i] = x[i] == 1;
  }
  Shape out;
  for (size_t i = 0; i < x.size(); ++i)
    if (!drop[i]) out.push_back(x[i]);
  return View(ctx, out);
}

StatusOr<std::unique_ptr<Kernel>> PrepareUnsqueeze(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ASSIGN_OR_RETURN(auto axes, IntsFromInputOrAttr(ctx, 1, "axes"));
  if (!axes) return ctx.Error("needs axes");
  const Shape& x = ctx.in_shapes[0];
  const int64_t r = static_cast<int64_t>(x.size() + axes->size());
  std::vector<char> insert(static_cast<size_t>(r), 0);
  for (int64_t a : *axes) {
    auto ax = NormalizeAxis(a, r);
    if (!ax.ok()) return ctx.Error("axis " + std::to_string(a) + " is out of range");
    if (insert[*ax]) return ctx.Error("axis " + std::to_string(a) + " appears twice");
    insert[*ax] = 1;
  }
  Shape out;
  size_t j = 0;
  for (int64_t i = 0; i < r; ++i) out.push_back(insert[i] ? 1 : x[j++]);
  return View(ctx, out);
}

StatusOr<std::unique_ptr<Kernel>> PrepareIdentity(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  if (ctx.node().op_type == "Dropout" && ctx.has_input(2)) {
    if (!ctx.in_data[2]) return ctx.Error("training_mode must be a constant");
    auto t = ReadScalar(*ctx.in_data[2]);
    if (!t.ok() || *t != 0) return ctx.Error("training mode is not supported");
  }
  if (ctx.out_shapes.size() > 1) {  // Dropout's mask, when asked for: all true
    ctx.out_shapes[1] = ctx.in_shapes[0];
    ctx.out_dtypes[1] = DataType::kBool;
  }
  return View(ctx, ctx.in_shapes[0]);
}

Status CheckDropout(const Node& node, const Graph& graph) {
  if (node.has_output(1)) {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) +
                           ": output 'mask' is not supported");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PrepareShape(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  const Shape& x = ctx.in_shapes[0];
  const int64_t r = static_cast<int64_t>(x.size());
  int64_t start = ctx.node().GetInt("start", 0), end = ctx.node().GetInt("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, start, r);
  std::vector<int64_t> dims(x.begin() + start, x.begin() + end);
  ctx.out_shapes[0] = {static_cast<int64_t>(dims.size())};
  ctx.out_dtypes[0] = DataType::kInt64;
  ctx.out_data[0] = Tensor::FromVector<int64_t>(DataType::kInt64, ctx.out_shapes[0], dims);
  return std::unique_ptr<Kernel>();
}

StatusOr<std::unique_ptr<Kernel>> PrepareSize(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ctx.out_shapes[0] = {};
  ctx.out_dtypes[0] = DataType::kInt64;
  ctx.out_data[0] = Tensor::FromVector<int64_t>(DataType::kInt64, {}, {Product(ctx.in_shapes[0])});
  return std::unique_ptr<Kernel>();
}

// Copies input into output where output index -> input offset uses `in_strides`.
StatusOr<std::unique_ptr<Kernel>> StridedCopy(DataType t, std::vector<int64_t> in_strides) {
  return MakeFn([t, in_strides](const RunContext& rc) {
    return DispatchBySize(t, [&]<typename T>() {
      const T* in = rc.inputs[0]->values<T>().data();
      T* out = rc.outputs[0]->mutable_values<T>().data();
      std::array<std::vector<int64_t>, 1> st{in_strides};
      BroadcastLoop<1>(rc.outputs[0]->shape(), st,
                       [&](int64_t o, const std::array<int64_t, 1>& off) { out[o] = in[off[0]]; });
    });
  });
}

// A transpose reduced to its essentials: the output's dims (the output is dense,
// row-major) and, per output axis, that axis's stride in the input. Axes of size 1 are
// dropped, and neighbouring output axes that are also neighbours, in order, in the input
// are merged: perm (2,0,1) on [2,3,4] becomes a [4,6] matrix with input strides (1,4),
// while perm (0,2,1,3) on [8,128,12,64] stays four axes.
struct CollapsedTranspose {
  std::vector<int64_t> dims;
  std::vector<int64_t> in_strides;
};

CollapsedTranspose Collapse(const Shape& out, const std::vector<int64_t>& in_strides) {
  CollapsedTranspose c;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 1) continue;
    if (!c.dims.empty() && c.in_strides.back() == in_strides[i] * out[i]) {
      c.dims.back() *= out[i];
      c.in_strides.back() = in_strides[i];
    } else {
      c.dims.push_back(out[i]);
      c.in_strides.push_back(in_strides[i]);
    }
  }
  if (c.dims.empty()) {  // one element
    c.dims.push_back(1);
    c.in_strides.push_back(1);
  }
  return c;
}

// A transpose as a oneDNN reorder from the input seen through permuted strides to the
// dense output: oneDNN's JIT reorder copies in cache-sized blocks on the session's
// threads. BERT-base at batch 8 (48 transposes of 3 MiB: attention's head split, K^T and
// head merge) spent 48 ms per inference in them with an element-by-element loop, 21 ms
// as reorders (of ~1 s; a tiled loop of our own took 26). The bytes must come out as they
// went in, so only reorders that move without converting are used: 4-byte elements go
// as f32 and 1-byte as u8. Not s32 or bf16: oneDNN's 8x8 register transpose passes
// other types through f32, which rounds large s32 values (and fp32 bit patterns read as
// s32) and flushes bf16/fp16 subnormals. Null for other element sizes (2 bytes; 8 bytes:
// shape tensors) and shapes oneDNN has no reorder for: the caller's loop copies those.
std::unique_ptr<Kernel> DnnlTranspose(PrepareContext& ctx, const CollapsedTranspose& c,
                                      DataType t) {
  using dt = dnnl::memory::data_type;
  dt type = dt::undef;
  switch (DataTypeSize(t)) {
    case 1:
      type = dt::u8;
      break;
    case 4:
      type = dt::f32;
      break;
    default:
      return nullptr;
  }
  if (c.dims.size() > DNNL_MAX_NDIMS) return nullptr;
  const dnnl::memory::dims dims(c.dims.begin(), c.dims.end());
  dnnl::memory::dims dense(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) dense[i] = dense[i + 1] * dims[i + 1];
  const auto& eng = *ctx.dnnl_engine;
  try {
    const dnnl::memory::desc from(dims, type,
                                  dnnl::memory::dims(c.in_strides.begin(), c.in_strides.end()));
    const dnnl::memory::desc to(dims, type, dense);
    dnnl::reorder::primitive_desc pd(eng, from, eng, to);
    auto k = std::make_unique<DnnlKernel>();
    k->primitive = dnnl::reorder(pd);
    k->BindInput(DNNL_ARG_FROM, from, eng, 0);
    k->BindOutput(DNNL_ARG_TO, to, eng, 0);
    return k;
  } catch (const dnnl::error&) {
    return nullptr;
  }
}

StatusOr<std::unique_ptr<Kernel>> PrepareTranspose(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  const Shape& x = ctx.in_shapes[0];
  const size_t r = x.size();
  std::vector<int64_t> perm = ctx.node().GetInts("perm", {});
  if (perm.empty())
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(r - 1 - i));
  if (perm.size() != r) return ctx.Error("perm must have one entry per dimension");
  std::vector<char> seen(r, 0);
  Shape out(r);
  std::vector<int64_t> in_strides(r), strides(r);
  for (size_t i = r; i-- > 0;) strides[i] = i + 1 < r ? strides[i + 1] * x[i + 1] : 1;
  for (size_t i = 0; i < r; ++i) {
    const int64_t p = perm[i];
    if (p < 0 || p >= static_cast<int64_t>(r) || seen[p])
      return ctx.Error("perm is not a permutation");
    seen[p] = 1;
    out[i] = x[p];
    in_strides[i] = strides[p];
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  if (Product(out) == 0) return MakeFn([](const RunContext&) { return Status::Ok(); });
  if (auto k = DnnlTranspose(ctx, Collapse(out, in_strides), ctx.in_dtypes[0])) {
    return std::unique_ptr<Kernel>(std::move(k));
  }
  return StridedCopy(ctx.in_dtypes[0], in_strides);
}

StatusOr<std::unique_ptr<Kernel>> PrepareExpand(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ASSIGN_OR_RETURN(const std::vector<int64_t> shape, ShapeFromInputOrAttr(ctx, 1, "shape"));
  auto out = BroadcastShapes(ctx.in_shapes[0], shape);
  if (!out.ok()) return ctx.Error(out.status().message());
  ctx.out_shapes[0] = *out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  return StridedCopy(ctx.in_dtypes[0], BroadcastStrides(ctx.in_shapes[0], *out));
}

StatusOr<std::unique_ptr<Kernel>> PrepareTile(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ASSIGN_OR_RETURN(auto repeats, IntsFromInputOrAttr(ctx, 1, "repeats"));
  const Shape& x = ctx.in_shapes[0];
  if (!repeats || repeats->size() != x.size())
    return ctx.Error("repeats must have one entry per dimension");
  Shape out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if ((*repeats)[i] < 0) return ctx.Error("repeats must be >= 0");
    out[i] = x[i] * (*repeats)[i];
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  const DataType t = ctx.in_dtypes[0];
  return MakeFn([t, x, out](const RunContext& rc) {
    return DispatchBySize(t, [&]<typename T>() {
      const T* in = rc.inputs[0]->values<T>().data();
      T* o = rc.outputs[0]->mutable_values<T>().data();
      const int64_t n = Product(out);
      const size_t r = out.size();
      std::vector<int64_t> idx(r, 0);
      for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        for (size_t d = 0; d < r; ++d) off = off * x[d] + idx[d] % x[d];
        o[i] = in[off];
        for (size_t d = r; d-- > 0;) {
          if (++idx[d] < out[d]) break;
          idx[d] = 0;
        }
      }
    });
  });
}

// Concat reads its inputs in any layout (OpDef::any_layout_inputs): a U-Net's skip
// connection and upsampled path arrive channels-last from their convolutions and stay
// so. Inputs of one type (f32, or bf16 in a bf16 plan) of which some are not plain
// concatenate on oneDNN's concat primitive (its output in their layout when every reader
// takes any layout), mixed ones too, in FP32; where oneDNN has no concat for them each
// is reordered into its slice of a plain FP32 output.
// Null when every input is plain: the byte loop as it is.
StatusOr<std::unique_ptr<Kernel>> ConcatInLayout(PrepareContext& ctx, const Shape& out,
                                                 int64_t axis) {
  if (ctx.in_dtypes[0] != DataType::kFp32) return std::unique_ptr<Kernel>();
  std::vector<dnnl::memory::desc> descs, plains;
  bool non_plain = false, one_type = true, empty = Product(out) == 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    plains.push_back(PlainDesc(ctx.in_shapes[i], DataType::kFp32));
    descs.push_back(ctx.InDesc(i, plains.back()));
    non_plain |= descs.back() != plains.back();
    one_type &= descs.back().data.data_type == descs[0].data.data_type;
    empty |= Product(ctx.in_shapes[i]) == 0;
  }
  if (!non_plain) return std::unique_ptr<Kernel>();
  const auto& eng = *ctx.dnnl_engine;
  const dnnl::memory::desc plain_out = PlainDesc(out, DataType::kFp32);
  std::optional<dnnl::concat::primitive_desc> concat;
  if (!empty) {
    // Inputs of one type (f32, or bf16 in a bf16 plan) concatenate in it, mixed ones (a
    // bf16 convolution's output beside an fp32 ConvTranspose's) in FP32; a plain output
    // is FP32 (oneDNN converts on the way).
    const auto dt = one_type ? static_cast<dnnl::memory::data_type>(descs[0].data.data_type)
                             : dnnl::memory::data_type::f32;
    const dnnl::memory::desc dst_any =
        ctx.out_any_layout[0] ? dnnl::memory::desc(ToDims(out), dt, dnnl::memory::format_tag::any)
                              : plain_out;
    try {
      concat.emplace(dst_any, static_cast<int>(axis), descs, eng);
    } catch (const dnnl::error&) {
    }
  }
  if (concat) {
    const dnnl::concat::primitive_desc& pd = *concat;
    dnnl::memory::desc dst_out = plain_out;
    if (ctx.out_any_layout[0] && pd.dst_desc() != plain_out) {
      dst_out = pd.dst_desc();
      ctx.out_descs[0] = dst_out;
    }
    auto k = std::make_unique<DnnlKernel>();
    k->primitive = dnnl::concat(pd);
    for (size_t i = 0; i < descs.size(); ++i)
      k->BindInput(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i), descs[i], eng, static_cast<int>(i));
    k->BindOutputAs(DNNL_ARG_DST, pd.dst_desc(), dst_out, eng, 0);
    return std::unique_ptr<Kernel>(std::move(k));
  }
  // Otherwise (mixed types oneDNN's concat refuses, or empty inputs): each input is
  // reordered straight into its slice of the plain FP32 output, converting on the way.
  struct Part {
    dnnl::memory::desc from, to;
    dnnl::reorder prim;
  };
  std::vector<std::optional<Part>> parts;
  dnnl::memory::dims offsets(out.size(), 0);
  for (size_t i = 0; i < descs.size(); ++i) {
    const Shape& shape = ctx.in_shapes[i];
    if (Product(shape) == 0) {
      parts.emplace_back();
      continue;
    }
    const dnnl::memory::desc sub = plain_out.submemory_desc(ToDims(shape), offsets);
    parts.push_back(
        Part{descs[i], sub, dnnl::reorder(dnnl::reorder::primitive_desc(eng, descs[i], eng, sub))});
    offsets[static_cast<size_t>(axis)] += shape[static_cast<size_t>(axis)];
  }
  return MakeFn([parts, eng](const RunContext& rc) -> Status {
    dnnl::stream local(eng);
    dnnl::stream& stream = rc.stream != nullptr ? *rc.stream : local;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i]) continue;
      dnnl::memory from(parts[i]->from, eng, const_cast<void*>(rc.inputs[i]->data()));
      dnnl::memory to(parts[i]->to, eng, rc.outputs[0]->mutable_data());
      parts[i]->prim.execute(stream, from, to);
    }
    stream.wait();
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareConcat(PrepareContext& ctx) {
  if (ctx.num_inputs() == 0) return ctx.Error("needs at least one input");
  if (!ctx.node().attr("axis")) return ctx.Error("attribute 'axis' is required");
  const Shape& first = ctx.in_shapes[0];
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(first.size()));
  if (!axis.ok() || first.empty())
    return ctx.Error("axis is out of range for " + ShapeToString(first));
  Shape out = first;
  out[*axis] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.in_shapes[i];
    if (!ctx.has_input(i) || ctx.in_dtypes[i] != ctx.in_dtypes[0] || s.size() != first.size()) {
      return ctx.Error("inputs must share data type and rank");
    }
    for (size_t d = 0; d < s.size(); ++d) {
      if (static_cast<int64_t>(d) != *axis && s[d] != first[d]) {
        return ctx.Error("input shapes " + ShapeToString(first) + " and " + ShapeToString(s) +
                         " differ off the axis");
      }
    }
    out[*axis] += s[*axis];
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = ctx.in_dtypes[0];
  ASSIGN_OR_RETURN(auto in_layout, ConcatInLayout(ctx, out, *axis));
  if (in_layout) return in_layout;
  const int64_t outer = Product(first, 0, *axis);
  const int64_t inner_bytes =
      Product(first, *axis + 1) * static_cast<int64_t>(DataTypeSize(ctx.in_dtypes[0]));
  const int64_t ax = *axis;
  return MakeFn([outer, inner_bytes, ax](const RunContext& rc) {
    char* o = static_cast<char*>(rc.outputs[0]->mutable_data());
    const int64_t out_row = rc.outputs[0]->shape()[ax] * inner_bytes;
    int64_t col = 0;
    for (const Tensor* in : rc.inputs) {
      const int64_t row = in->shape()[ax] * inner_bytes;
      const char* src = static_cast<const char*>(in->data());
      if (row > 0) {
        for (int64_t r = 0; r < outer; ++r) std::memcpy(o + r * out_row + col, src + r * row, row);
      }
      col += row;
    }
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareSplit(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  const Shape& x = ctx.in_shapes[0];
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(x.size()));
  if (!axis.ok() || x.empty()) return ctx.Error("axis is out of range for " + ShapeToString(x));
  const size_t n = ctx.out_shapes.size();
  // Opset 18's num_outputs: without `split`, ceil(d / n) per output, the last smaller.
  const int64_t num_outputs = ctx.node().GetInt("num_outputs", 0);
  if (num_outputs != 0 && num_outputs != static_cast<int64_t>(n))
    return ctx.Error("num_outputs is " + std::to_string(num_outputs) + " for " + std::to_string(n) +
                     " outputs");
  ASSIGN_OR_RETURN(auto split, IntsFromInputOrAttr(ctx, 1, "split"));
  if (split && num_outputs != 0) return ctx.Error("split and num_outputs are both given");
  std::vector<int64_t> sizes;
  if (split) {
    sizes = *split;
    if (sizes.size() != n)
      return ctx.Error("split has " + std::to_string(sizes.size()) + " entries for " +
                       std::to_string(n) + " outputs");
  } else {
    const int64_t d = x[*axis];
    const int64_t chunk = (d + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
    for (size_t i = 0; i < n; ++i)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, d - chunk * static_cast<int64_t>(i))));
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) return ctx.Error("split sizes must be >= 0");
    total += s;
  }
  if (total != x[*axis])
    return ctx.Error("split sizes do not add up to the axis (" + std::to_string(x[*axis]) + ")");
  for (size_t i = 0; i < n; ++i) {
    Shape s = x;
    s[*axis] = sizes[i];
    ctx.out_shapes[i] = s;
    ctx.out_dtypes[i] = ctx.in_dtypes[0];
  }
  const int64_t outer = Product(x, 0, *axis);
  const int64_t inner_bytes =
      Product(x, *axis + 1) * static_cast<int64_t>(DataTypeSize(ctx.in_dtypes[0]));
  const int64_t in_row = x[*axis] * inner_bytes;
  return MakeFn([outer, inner_bytes, in_row, sizes](const RunContext& rc) {
    const char* src = static_cast<const char*>(rc.inputs[0]->data());
    int64_t col = 0;
    for (size_t i = 0; i < rc.outputs.size(); ++i) {
      const int64_t row = sizes[i] * inner_bytes;
      if (rc.outputs[i] && row > 0) {
        char* o = static_cast<char*>(rc.outputs[i]->mutable_data());
        for (int64_t r = 0; r < outer; ++r) std::memcpy(o + r * row, src + r * in_row + col, row);
      }
      col += row;
    }
    return Status::Ok();
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareConstantOfShape(PrepareContext& ctx) {
  RETURN_IF_ERROR(NeedOne(ctx));
  ASSIGN_OR_RETURN(const std::vector<int64_t> shape, ShapeFromInputOrAttr(ctx, 0, ""));
  Tensor value = Tensor::FromVector<float>(DataType::kFp32, {1}, {0.f});
  if (const Attribute* a = ctx.node().attr("value")) {
    if (a->kind != Attribute::Kind::kTensor || a->t.element_count() != 1)
      return ctx.Error("value must be a one-element tensor");
    value = a->t;
  }
  ctx.out_shapes[0] = shape;
  ctx.out_dtypes[0] = value.dtype();
  Status ok = DispatchBySize(value.dtype(), []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  return MakeFn([value](const RunContext& rc) {
    return DispatchBySize(value.dtype(), [&]<typename T>() {
      auto out = rc.outputs[0]->mutable_values<T>();
      std::fill(out.begin(), out.end(), value.values<T>()[0]);
    });
  });
}

StatusOr<std::unique_ptr<Kernel>> PrepareRange(PrepareContext& ctx) {
  if (ctx.num_inputs() != 3) return ctx.Error("needs start, limit and delta");
  for (size_t i = 0; i < 3; ++i) {
    if (!ctx.in_data[i])
      return ctx.Error("start, limit and delta must be constants or computed from shapes");
    if (ctx.in_dtypes[i] != ctx.in_dtypes[0]) return ctx.Error("inputs must share a data type");
  }
  ASSIGN_OR_RETURN(double start, ReadScalar(*ctx.in_data[0]));
  ASSIGN_OR_RETURN(double limit, ReadScalar(*ctx.in_data[1]));
  ASSIGN_OR_RETURN(double delta, ReadScalar(*ctx.in_data[2]));
  if (delta == 0 || !std::isfinite(start) || !std::isfinite(limit) || !std::isfinite(delta)) {
    return ctx.Error("delta must be non-zero and all inputs finite");
  }
  const double count = std::max(0.0, std::ceil((limit - start) / delta));
  if (count > 1e12) return ctx.Error("range is too long");
  const DataType t = ctx.in_dtypes[0];
  ctx.out_shapes[0] = {static_cast<int64_t>(count)};
  ctx.out_dtypes[0] = t;
  Status ok = DispatchNumeric(t, []<typename T>() {});
  if (!ok.ok()) return ctx.Error(ok.message());
  return MakeFn([t](const RunContext& rc) {
    return DispatchNumeric(t, [&]<typename T>() {
      const T s = rc.inputs[0]->values<T>()[0], d = rc.inputs[2]->values<T>()[0];
      auto out = rc.outputs[0]->mutable_values<T>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(s + static_cast<T>(i) * d);
    });
  });
}

}  // namespace

void RegisterShapeOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "Flatten", {"axis"}, nullptr, PrepareFlatten});
  ops->push_back({"", "Reshape", {"allowzero"}, nullptr, PrepareReshape});
  ops->push_back({"", "Squeeze", {"axes"}, nullptr, PrepareSqueeze});
  ops->push_back({"", "Unsqueeze", {"axes"}, nullptr, PrepareUnsqueeze});
  ops->push_back({"", "Identity", {}, nullptr, PrepareIdentity});
  ops->push_back({"", "Dropout", {"ratio", "seed"}, CheckDropout, PrepareIdentity});
  ops->push_back({"", "Shape", {"start", "end"}, nullptr, PrepareShape});
  ops->push_back({"", "Size", {}, nullptr, PrepareSize});
  ops->push_back({"", "Transpose", {"perm"}, nullptr, PrepareTranspose});
  ops->push_back({"", "Expand", {}, nullptr, PrepareExpand});
  ops->push_back({"", "Tile", {}, nullptr, PrepareTile});
  ops->push_back({"", "Concat", {"axis"}, nullptr, PrepareConcat, ~0u});
  ops->push_back({"", "Split", {"axis", "split", "num_outputs"}, nullptr, PrepareSplit});
  ops->push_back({"", "ConstantOfShape", {"value"}, nullptr, PrepareConstantOfShape});
  ops->push_back({"", "Range", {}, nullptr, PrepareRange});
}

}  // namespace shoal::engine::internal
