// MatMul (numpy batched semantics) and Gemm on oneDNN's matmul primitive. A constant
// right-hand side is reordered once into the primitive's preferred layout.
#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

using dnnl::memory;

StatusOr<std::unique_ptr<Kernel>> Noop() {
  return MakeFn([](const RunContext&) { return Status::Ok(); });
}

// The precision tier of a product with a constant right-hand side (precision.h): bf16
// source and weights, or int8 (source quantised with its calibrated scale on the way
// in, weights per output column), FP32 out either way.
struct ProductTier {
  bool int8 = false;
  float src_scale = 1.f;
  memory::data_type src_dt = memory::data_type::f32, w_dt = memory::data_type::f32;
  Tensor w_q;
  std::vector<float> out_scales;  // int8: alpha * source scale * weight scale, per column
};

// `b_rows_are_n`: the constant's rows are the N columns (Gemm with transB). `bias` (the
// additive term after alpha, per column; null when none) must be constant for int8.
ProductTier SetUpTier(const PrepareContext& ctx, bool const_b, bool b_2d, int64_t n,
                      bool b_rows_are_n, float alpha, bool bias_ok) {
  ProductTier t;
  if (!const_b) return t;
  bool is_unsigned = false;
  if (b_2d && bias_ok && QuantizeInput(ctx, 0, &t.src_scale, &is_unsigned)) {
    t.int8 = true;
    t.src_dt = is_unsigned ? memory::data_type::u8 : memory::data_type::s8;
    t.w_dt = memory::data_type::s8;
    std::vector<float> w_scales;
    QuantizeWeights(*ctx.in_data[1], n, b_rows_are_n, &t.w_q, &w_scales);
    t.out_scales.resize(n);
    for (int64_t j = 0; j < n; ++j) t.out_scales[j] = alpha * t.src_scale * w_scales[j];
    return t;
  }
  t.src_dt = t.w_dt = ComputeType(ctx);
  return t;
}

// The bias oneDNN adds before the output scales, per column: `add[j]` is what must be
// added after the scales.
Tensor ScaledBias(const std::vector<float>& add, const std::vector<float>& scales,
                  const Shape& shape) {
  Tensor t = Tensor::Allocate(DataType::kFp32, shape);
  auto v = t.mutable_values<float>();
  for (size_t j = 0; j < add.size(); ++j) v[j] = add[j] / scales[j];
  return t;
}

// ---- MatMul (and shoal.FusedMatMul) ----

// [..., M, K] x [..., K, N] = [..., M, N] as oneDNN's matmul sees a MatMul.
struct MatMulDims {
  Shape a, b, c;      // source, weights, destination
  int64_t n = 0;      // columns
  bool b_2d = false;  // B is one [K, N] matrix: A's batch folds into M
};

// `a` and `b` with vectors made matrices; `batch`: their batch dimensions, broadcast.
// `fold`: A's batch may fold into M when B is one matrix (false: the product stays
// batched, as a broadcast addend needs).
StatusOr<MatMulDims> DnnlMatMulDims(const PrepareContext& ctx, const Shape& a, const Shape& b,
                                    const Shape& batch, bool fold = true) {
  const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  const Shape a_batch(a.begin(), a.end() - 2), b_batch(b.begin(), b.end() - 2);
  MatMulDims d;
  d.n = n;
  d.b_2d = fold && (b_batch.empty() || Product(b_batch) == 1);
  if (d.b_2d) {
    // [..., M, K] x [K, N]: fold A's batch into M, one 2-D product.
    d.a = {Product(batch) * m, k};
    d.b = {k, n};
    d.c = {Product(batch) * m, n};
    if (Product(a_batch) != Product(batch)) {  // A's batch broadcasts against B's size-1 batch
      return ctx.Error("unsupported broadcast");
    }
  } else {
    const size_t r = batch.size() + 2;
    d.a = a;
    d.b = b;
    d.a.insert(d.a.begin(), r - a.size(), 1);
    d.b.insert(d.b.begin(), r - b.size(), 1);
    d.c = batch;
    d.c.push_back(m);
    d.c.push_back(n);
  }
  return d;
}

// The bias of a shoal.FusedMatMul: an int8 product's is fixed in the kernel, divided
// by the output scales (oneDNN applies them to the sum with the bias).
void BindMatMulBias(PrepareContext& ctx, DnnlKernel* kern, const ProductTier& tier, float alpha,
                    const memory::desc& bias_md) {
  const auto& eng = *ctx.dnnl_engine;
  if (!tier.int8) {
    kern->BindInput(DNNL_ARG_BIAS, bias_md, eng, 2);
    return;
  }
  // The given bias is already divided by alpha (optimizer.h).
  auto b = ctx.in_data[2]->values<float>();
  std::vector<float> add(b.begin(), b.end());
  for (float& v : add) v *= alpha;
  Tensor scaled = ScaledBias(add, tier.out_scales, ctx.in_shapes[2]);
  kern->BindFixed(DNNL_ARG_BIAS, memory(bias_md, eng, scaled.mutable_data()), scaled.buffer());
}

// The matmul primitive src_inner x wdesc (+ bias) -> dst under `attr`, shared by MatMul
// and Gemm. A is bound from input 0, laid out as `src` (scaled into int8 on the way when
// the tier quantises); B from input 1, laid out as `wplain`, or as `wplain_s8` when the
// tier holds it quantised. The caller binds the bias, post-op inputs and output.
StatusOr<std::unique_ptr<DnnlKernel>> ProductKernel(
    PrepareContext& ctx, const ProductTier& tier, const dnnl::primitive_attr& attr,
    const memory::desc& src, const memory::desc& src_inner, const memory::desc& wplain,
    const memory::desc& wplain_s8, const memory::desc& wdesc, const memory::desc& bias,
    const memory::desc& dst) {
  const auto& eng = *ctx.dnnl_engine;
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_inner, wdesc, bias, dst), attr, eng);
  auto kern = std::make_unique<DnnlKernel>();
  kern->primitive = dnnl::matmul(pd);
  kern->BindInputAs(DNNL_ARG_SRC, src, pd.src_desc(), eng, 0,
                    tier.int8 ? 1.f / tier.src_scale : 1.f);
  if (tier.int8) {
    RETURN_IF_ERROR(BindWeightsData(ctx, kern.get(), DNNL_ARG_WEIGHTS, 1, tier.w_q, wplain_s8,
                                    pd.weights_desc()));
  } else {
    RETURN_IF_ERROR(BindWeights(ctx, kern.get(), DNNL_ARG_WEIGHTS, 1, wplain, pd.weights_desc()));
  }
  return kern;
}

// `addend` has `out`'s rank and each of its dimensions is 1 or `out`'s.
bool Broadcasts(const Shape& addend, const Shape& out) {
  if (addend.size() != out.size()) return false;
  for (size_t i = 0; i < out.size(); ++i)
    if (addend[i] != 1 && addend[i] != out[i]) return false;
  return true;
}

// Strides of A, B and the result as the matmul sees them, where a Transpose was absorbed
// into a shoal.FusedMatMul (a_perm, b_perm, c_perm); empty: row-major.
struct MatMulViews {
  memory::dims a, b, c;
};

memory::desc ViewDesc(const Shape& shape, const memory::dims& strides) {
  return strides.empty() ? PlainDesc(shape, DataType::kFp32)
                         : memory::desc(ToDims(shape), memory::data_type::f32, strides);
}

// The matmul primitive for `d`, with shoal.FusedMatMul's post-ops (optimizer.h):
// output scale, bias [N], activation, residual add (of shape `out`).
StatusOr<std::unique_ptr<Kernel>> MatMulKernel(PrepareContext& ctx, const MatMulDims& d,
                                               const Shape& out, const MatMulViews& views = {}) {
  const Node& node = ctx.node();
  const auto& eng = *ctx.dnnl_engine;
  const auto src = ViewDesc(d.a, views.a), wplain = ViewDesc(d.b, views.b);
  const auto dst = ViewDesc(d.c, views.c);
  const bool const_b = ctx.in_data[1] != nullptr;
  const float alpha = node.GetFloat("alpha", 1.f);
  const ProductTier tier =
      SetUpTier(ctx, const_b, d.b_2d, d.n, false, alpha, !ctx.has_input(2) || ctx.in_data[2]);
  const memory::desc wdesc =
      const_b ? memory::desc(ToDims(d.b), tier.w_dt, memory::format_tag::any) : wplain;
  const memory::desc src_inner =
      views.a.empty() || tier.src_dt != memory::data_type::f32 ? PlainDesc(d.a, tier.src_dt) : src;
  dnnl::primitive_attr attr;
  if (tier.int8)
    attr.set_output_scales(1 << (d.c.size() - 1), tier.out_scales);
  else if (alpha != 1.f)
    attr.set_output_scales(0, {alpha});
  memory::desc bias_md;
  const bool has_bias = ctx.has_input(2);
  if (has_bias) {
    if (ctx.in_dtypes[2] != DataType::kFp32 || Product(ctx.in_shapes[2]) != d.n)
      return ctx.Error("the bias must have N elements");
    Shape bshape(d.c.size(), 1);
    bshape.back() = d.n;
    bias_md = PlainDesc(bshape, DataType::kFp32);
  }
  dnnl::post_ops po;
  RETURN_IF_ERROR(AppendActivation(node, "activation", &po));
  const bool has_residual = ctx.has_input(3);
  // The residual, or an addend that broadcasts onto the product (attention's mask).
  memory::desc addend = dst;
  if (has_residual) {
    if (!views.c.empty()) return ctx.Error("a residual with c_perm is not supported");
    if (ctx.in_shapes[3] != out) {
      if (!Broadcasts(ctx.in_shapes[3], out) || d.c.size() != out.size())
        return ctx.Error("the residual must have the output's shape or broadcast onto it");
      addend = PlainDesc(ctx.in_shapes[3], DataType::kFp32);
    }
    po.append_binary(dnnl::algorithm::binary_add, addend);
  }
  attr.set_post_ops(po);
  ASSIGN_OR_RETURN(auto kern, ProductKernel(ctx, tier, attr, src, src_inner, wplain,
                                            PlainDesc(d.b, DataType::kInt8), wdesc, bias_md, dst));
  if (has_bias) BindMatMulBias(ctx, kern.get(), tier, alpha, bias_md);
  if (has_residual) {
    kern->BindInput(DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len() - 1) | DNNL_ARG_SRC_1, addend, eng, 3);
  }
  kern->BindOutput(DNNL_ARG_DST, dst, eng, 0);
  return std::unique_ptr<Kernel>(std::move(kern));
}

// Dense row-major strides of `s`.
memory::dims DenseStrides(const Shape& s) {
  memory::dims st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// `perm` checked as a permutation of `rank` axes.
bool IsPermutation(const std::vector<int64_t>& perm, size_t rank) {
  if (perm.size() != rank) return false;
  std::vector<char> seen(rank, 0);
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[p]) return false;
    seen[p] = 1;
  }
  return true;
}

// A shoal.FusedMatMul that absorbed Transposes (optimizer.h: a_perm, b_perm on its
// inputs, c_perm on its output): the batched product of the transposed views, read and
// written in place through strides, with no copy.
StatusOr<std::unique_ptr<Kernel>> PrepareStridedMatMul(PrepareContext& ctx) {
  const Node& node = ctx.node();
  const std::vector<int64_t> perms[3] = {node.GetInts("a_perm"), node.GetInts("b_perm"),
                                         node.GetInts("c_perm")};
  const Shape& a_in = ctx.in_shapes[0];
  const Shape& b_in = ctx.in_shapes[1];
  const size_t r = a_in.size();
  if (r < 3 || b_in.size() != r)
    return ctx.Error("a_perm/b_perm/c_perm need A and B of one rank >= 3");
  if (ctx.in_data[1] != nullptr) return ctx.Error("a_perm/b_perm/c_perm need a computed B");
  MatMulViews views;
  MatMulDims d;
  // The view of input i through its perm, and its strides.
  auto view = [&](int i, const Shape& in, Shape* shape, memory::dims* strides) -> Status {
    if (perms[i].empty()) {
      *shape = in;
      return Status::Ok();
    }
    if (!IsPermutation(perms[i], r)) return ctx.Error("a_perm/b_perm is not a permutation");
    const memory::dims dense = DenseStrides(in);
    shape->resize(r);
    strides->resize(r);
    for (size_t k = 0; k < r; ++k) {
      (*shape)[k] = in[perms[i][k]];
      (*strides)[k] = dense[perms[i][k]];
    }
    return Status::Ok();
  };
  RETURN_IF_ERROR(view(0, a_in, &d.a, &views.a));
  RETURN_IF_ERROR(view(1, b_in, &d.b, &views.b));
  const int64_t m = d.a[r - 2], k = d.a[r - 1], n = d.b[r - 1];
  if (d.b[r - 2] != k || !std::equal(d.a.begin(), d.a.end() - 2, d.b.begin())) {
    return ctx.Error("the transposed views do not multiply: " + ShapeToString(d.a) + " x " +
                     ShapeToString(d.b));
  }
  d.n = n;
  d.c.assign(d.a.begin(), d.a.end() - 2);
  d.c.push_back(m);
  d.c.push_back(n);
  Shape out = d.c;
  if (!perms[2].empty()) {
    if (!IsPermutation(perms[2], r)) return ctx.Error("c_perm is not a permutation");
    // The output is the product transposed by c_perm: product axis c_perm[i] is output
    // axis i, with that axis's stride.
    for (size_t i = 0; i < r; ++i) out[i] = d.c[perms[2][i]];
    const memory::dims dense = DenseStrides(out);
    views.c.resize(r);
    for (size_t i = 0; i < r; ++i) views.c[perms[2][i]] = dense[i];
  }
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(out) == 0) return Noop();
  if (k == 0) return ctx.Error("K = 0 is not supported with a_perm/b_perm/c_perm");
  return MatMulKernel(ctx, d, out, views);
}

StatusOr<std::unique_ptr<Kernel>> PrepareMatMul(PrepareContext& ctx) {
  const bool fused = !ctx.node().domain.empty();
  if ((fused ? ctx.num_inputs() < 2 : ctx.num_inputs() != 2) || !ctx.has_input(0) ||
      !ctx.has_input(1))
    return ctx.Error("needs two inputs");
  if (ctx.in_dtypes[0] != DataType::kFp32 || ctx.in_dtypes[1] != DataType::kFp32) {
    return ctx.Error("only FP32 is supported");
  }
  if (fused &&
      (ctx.node().attr("a_perm") || ctx.node().attr("b_perm") || ctx.node().attr("c_perm")))
    return PrepareStridedMatMul(ctx);
  Shape a = ctx.in_shapes[0], b = ctx.in_shapes[1];
  if (a.empty() || b.empty()) return ctx.Error("inputs must have rank >= 1");
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
  if (b[b.size() - 2] != k) {
    return ctx.Error("inner dimensions differ: " + ShapeToString(ctx.in_shapes[0]) + " x " +
                     ShapeToString(ctx.in_shapes[1]));
  }
  auto batch = BroadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  if (!batch.ok()) return ctx.Error(batch.status().message());
  Shape out = *batch;
  if (!a_vec) out.push_back(m);
  if (!b_vec) out.push_back(n);
  ctx.out_shapes[0] = out;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(out) == 0) return Noop();
  if (k == 0) {
    // An empty inner dimension: every output is an empty sum. Arena outputs hold
    // whatever an earlier value left, so the kernel writes the zeros itself.
    return MakeFn([](const RunContext& rc) {
      std::fill_n(static_cast<float*>(rc.outputs[0]->mutable_data()),
                  rc.outputs[0]->element_count(), 0.f);
      return Status::Ok();
    });
  }
  const bool broadcast_addend =
      fused && ctx.has_input(3) && ctx.in_shapes[3] != out && !a_vec && !b_vec;
  ASSIGN_OR_RETURN(const MatMulDims d, DnnlMatMulDims(ctx, a, b, *batch, !broadcast_addend));
  return MatMulKernel(ctx, d, out);
}

// ---- Gemm (and shoal.FusedGemm) ----

// A Gemm's attributes and shapes, checked: A' [M, K] x B' [K, N] (' when transposed),
// plus C broadcast to [M, N].
struct GemmShapes {
  bool ta = false, tb = false;  // transA, transB
  float alpha = 1.f, beta = 1.f;
  int64_t m = 0, k = 0, n = 0;
  bool has_c = false;  // C is given and beta != 0
  Shape c2;            // has_c: C's shape as a matrix
};

StatusOr<GemmShapes> CheckGemmShapes(const PrepareContext& ctx) {
  const Node& node = ctx.node();
  if (ctx.num_inputs() < 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs A and B");
  RETURN_IF_ERROR(CheckFp32Inputs(ctx));
  const Shape& a = ctx.in_shapes[0];
  const Shape& b = ctx.in_shapes[1];
  if (a.size() != 2 || b.size() != 2) return ctx.Error("A and B must be 2-D");
  GemmShapes g;
  g.ta = node.GetInt("transA", 0) != 0;
  g.tb = node.GetInt("transB", 0) != 0;
  g.alpha = node.GetFloat("alpha", 1.f);
  g.beta = node.GetFloat("beta", 1.f);
  g.m = g.ta ? a[1] : a[0];
  g.k = g.ta ? a[0] : a[1];
  const int64_t kb = g.tb ? b[1] : b[0];
  g.n = g.tb ? b[0] : b[1];
  if (g.k != kb)
    return ctx.Error("inner dimensions differ: " + ShapeToString(a) + " x " + ShapeToString(b));
  g.has_c = ctx.has_input(2) && g.beta != 0.f;
  if (g.has_c) {
    const Shape& c = ctx.in_shapes[2];
    if (c.size() > 2) return ctx.Error("C must have rank <= 2");
    g.c2 = c;
    g.c2.insert(g.c2.begin(), 2 - c.size(), 1);
    if ((g.c2[0] != 1 && g.c2[0] != g.m) || (g.c2[1] != 1 && g.c2[1] != g.n)) {
      return ctx.Error("C of shape " + ShapeToString(c) + " does not broadcast to [" +
                       std::to_string(g.m) + "," + std::to_string(g.n) + "]");
    }
    if (g.beta != 1.f && !ctx.in_data[2]) return ctx.Error("beta != 1 needs a constant C");
  }
  return g;
}

// C, the additive term, as the primitive's bias. oneDNN applies the output scales to the
// whole sum: an int8 product gets beta * C divided by its scales, per column; an FP32
// one C * beta / alpha, fixed in the kernel unless that factor is 1.
void BindGemmC(PrepareContext& ctx, DnnlKernel* kern, const GemmShapes& g, const ProductTier& tier,
               const memory::desc& bias) {
  const auto& eng = *ctx.dnnl_engine;
  if (tier.int8) {
    auto cv = ctx.in_data[2]->values<float>();
    std::vector<float> add(g.n);
    for (int64_t j = 0; j < g.n; ++j) add[j] = g.beta * cv[g.c2[1] == 1 ? 0 : j];
    Tensor scaled = ScaledBias(add, tier.out_scales, g.c2);
    kern->BindFixed(DNNL_ARG_BIAS, memory(bias, eng, scaled.mutable_data()), scaled.buffer());
    return;
  }
  const float c_scale = g.beta / g.alpha;
  if (c_scale == 1.f) {
    kern->BindInput(DNNL_ARG_BIAS, bias, eng, 2);
    return;
  }
  Tensor scaled = Tensor::Allocate(DataType::kFp32, g.c2);
  auto src_c = ctx.in_data[2]->values<float>();
  for (size_t i = 0; i < src_c.size(); ++i) scaled.mutable_values<float>()[i] = src_c[i] * c_scale;
  kern->BindFixed(DNNL_ARG_BIAS, memory(bias, eng, scaled.mutable_data()), scaled.buffer());
}

StatusOr<std::unique_ptr<Kernel>> PrepareGemm(PrepareContext& ctx) {
  ASSIGN_OR_RETURN(const GemmShapes g, CheckGemmShapes(ctx));
  const int64_t m = g.m, k = g.k, n = g.n;
  ctx.out_shapes[0] = {m, n};
  ctx.out_dtypes[0] = DataType::kFp32;
  if (m == 0 || n == 0) return Noop();
  if (k == 0) return ctx.Error("K = 0 is not supported");

  const auto& eng = *ctx.dnnl_engine;
  const memory::desc src({m, k}, memory::data_type::f32,
                         g.ta ? memory::dims{1, m} : memory::dims{k, 1});
  const memory::desc wplain({k, n}, memory::data_type::f32,
                            g.tb ? memory::dims{1, k} : memory::dims{n, 1});
  const memory::desc dst = PlainDesc({m, n}, DataType::kFp32);
  const bool const_b = ctx.in_data[1] != nullptr;
  // int8 needs the additive term per column and constant: C of shape [N] or [1, N].
  const bool c_per_column = !g.has_c || (ctx.in_data[2] && g.c2[0] == 1 && g.c2[1] == n);
  const ProductTier tier = SetUpTier(ctx, const_b, true, n, g.tb, g.alpha, c_per_column);
  const memory::desc wdesc =
      const_b ? memory::desc({k, n}, tier.w_dt, memory::format_tag::any) : wplain;
  const memory::desc src_inner = PlainDesc({m, k}, tier.src_dt);
  const memory::desc bias = g.has_c ? PlainDesc(g.c2, DataType::kFp32) : memory::desc();
  dnnl::primitive_attr attr;
  if (tier.int8)
    attr.set_output_scales(1 << 1, tier.out_scales);
  else if (g.alpha != 1.f)
    attr.set_output_scales(0, {g.alpha});
  dnnl::post_ops po;  // shoal.FusedGemm: Gemm + activation
  RETURN_IF_ERROR(AppendActivation(ctx.node(), "activation", &po));
  attr.set_post_ops(po);
  const memory::desc wplain_s8({k, n}, memory::data_type::s8,
                               g.tb ? memory::dims{1, k} : memory::dims{n, 1});
  ASSIGN_OR_RETURN(auto kern, ProductKernel(ctx, tier, attr, src, src_inner, wplain, wplain_s8,
                                            wdesc, bias, dst));
  if (g.has_c) BindGemmC(ctx, kern.get(), g, tier, bias);
  kern->BindOutput(DNNL_ARG_DST, dst, eng, 0);
  return std::unique_ptr<Kernel>(std::move(kern));
}

}  // namespace

void RegisterMatMulOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "MatMul", {}, nullptr, PrepareMatMul});
  ops->push_back({"", "Gemm", {"alpha", "beta", "transA", "transB"}, nullptr, PrepareGemm});
  // Fused forms (optimizer.h). FusedMatMul: A, B, bias (optional), residual (optional).
  std::vector<std::string_view> mm = {"alpha", "a_perm", "b_perm", "c_perm"};
  for (auto a : ActivationAttributes(false)) mm.push_back(a);
  ops->push_back({"shoal", "FusedMatMul", mm, nullptr, PrepareMatMul});
  std::vector<std::string_view> gemm = {"alpha", "beta", "transA", "transB"};
  for (auto a : ActivationAttributes(false)) gemm.push_back(a);
  ops->push_back({"shoal", "FusedGemm", gemm, nullptr, PrepareGemm});
}

}  // namespace shoal::engine::internal
