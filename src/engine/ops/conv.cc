// Convolution, transposed convolution and pooling, on oneDNN primitives (and the
// engine's own loop for max pooling of quantised values). Activations between these
// operators may stay in the layout a convolution picks (channels-last or blocked), and
// in an int8 plan quantised to s8/u8 (kernel.h); every other reader gets plain NCHW
// fp32. Constant weights are reordered once into the primitive's preferred layout
// through the model's WeightCache.
#include <algorithm>
#include <optional>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

using dnnl::memory;

// Window geometry of one spatial axis.
struct Window {
  int64_t in = 0, kernel = 1, stride = 1, dilation = 1, pad_begin = 0, pad_end = 0, out = 0;
  int64_t extent() const { return (kernel - 1) * dilation + 1; }
};

Status CheckAutoPad(const Node& node, const Graph& graph) {
  const std::string p = node.GetString("auto_pad", "NOTSET");
  if (p != "NOTSET" && p != "VALID" && p != "SAME_UPPER" && p != "SAME_LOWER") {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) + ": auto_pad '" + p +
                           "' is not supported");
  }
  return Status::Ok();
}

// Reads kernel_shape/strides/dilations/pads/auto_pad for `spatial` axes of input
// `in_shape` (N, C, spatial...). Computes forward (conv/pool) output sizes.
StatusOr<std::vector<Window>> ForwardWindows(PrepareContext& ctx, const Shape& in_shape,
                                             const Shape& kernel, bool ceil_mode) {
  const Node& node = ctx.node();
  const size_t k = kernel.size();
  auto strides = node.GetInts("strides", std::vector<int64_t>(k, 1));
  auto dilations = node.GetInts("dilations", std::vector<int64_t>(k, 1));
  auto pads = node.GetInts("pads", std::vector<int64_t>(2 * k, 0));
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (strides.size() != k || dilations.size() != k || pads.size() != 2 * k) {
    return ctx.Error("strides, dilations and pads must have one entry per spatial axis (pads two)");
  }
  std::vector<Window> w(k);
  for (size_t i = 0; i < k; ++i) {
    Window& a = w[i];
    a.in = in_shape[2 + i];
    a.kernel = kernel[i];
    a.stride = strides[i];
    a.dilation = dilations[i];
    if (a.kernel < 1 || a.stride < 1 || a.dilation < 1)
      return ctx.Error("kernel, strides and dilations must be >= 1");
    if (auto_pad == "VALID") {
      a.pad_begin = a.pad_end = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t out = (a.in + a.stride - 1) / a.stride;
      const int64_t total = std::max<int64_t>(0, (out - 1) * a.stride + a.extent() - a.in);
      a.pad_begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      a.pad_end = total - a.pad_begin;
    } else {
      a.pad_begin = pads[i];
      a.pad_end = pads[i + k];
    }
    if (a.pad_begin < 0 || a.pad_end < 0) return ctx.Error("negative pads are not supported");
    const int64_t span = a.in + a.pad_begin + a.pad_end - a.extent();
    if (span < 0) return ctx.Error("the window is larger than the padded input");
    a.out = (ceil_mode ? (span + a.stride - 1) / a.stride : span / a.stride) + 1;
    // As PyTorch and ONNX Runtime: the last window must start inside the input or the
    // left padding.
    if (ceil_mode && (a.out - 1) * a.stride >= a.in + a.pad_begin) --a.out;
  }
  return w;
}

memory::dims Dims(const std::vector<Window>& w, int64_t Window::*field) {
  memory::dims d;
  for (const Window& a : w) d.push_back(a.*field);
  return d;
}

memory::dims Dilates(const std::vector<Window>& w) {
  memory::dims d;
  for (const Window& a : w) d.push_back(a.dilation - 1);  // oneDNN counts from 0
  return d;
}

// oneDNN's right padding that yields exactly `out` outputs.
memory::dims PadRight(const std::vector<Window>& w) {
  memory::dims d;
  for (const Window& a : w) d.push_back((a.out - 1) * a.stride + a.extent() - a.in - a.pad_begin);
  return d;
}

StatusOr<std::unique_ptr<Kernel>> Noop() {
  return MakeFn([](const RunContext&) { return Status::Ok(); });
}

// ---- Conv (and shoal.FusedConv) ----

// A convolution's shapes, checked against each other: X [N, C, in...],
// W [M, C/group, kernel...], Y [N, M, out...].
struct ConvShapes {
  int64_t group = 1, c = 0, m = 0;  // groups, input channels C, output channels M
  Shape kernel;                     // W's spatial dimensions
  Shape wdims;                      // oneDNN's logical weights: [G, M/G, C/G, kernel...]
                                    // when grouped, else W's shape
  std::vector<Window> w;
  Shape y;
};

StatusOr<ConvShapes> CheckConvShapes(PrepareContext& ctx) {
  if (ctx.num_inputs() < 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs X and W");
  const Shape& x = ctx.in_shapes[0];
  const Shape& wt = ctx.in_shapes[1];
  if (ctx.in_dtypes[0] != DataType::kFp32 || ctx.in_dtypes[1] != DataType::kFp32) {
    return ctx.Error("only FP32 is supported");
  }
  if (x.size() < 3 || x.size() > 5 || wt.size() != x.size()) {
    return ctx.Error("X must be 3-D to 5-D and W of the same rank; got " + ShapeToString(x) +
                     " and " + ShapeToString(wt));
  }
  ConvShapes s;
  s.group = ctx.node().GetInt("group", 1);
  s.c = x[1];
  s.m = wt[0];
  if (s.group < 1 || s.c % s.group != 0 || s.m % s.group != 0 || wt[1] != s.c / s.group) {
    return ctx.Error("channels do not match: X " + ShapeToString(x) + ", W " + ShapeToString(wt) +
                     ", group " + std::to_string(s.group));
  }
  s.kernel.assign(wt.begin() + 2, wt.end());
  if (ctx.node().GetInts("kernel_shape", s.kernel) != s.kernel)
    return ctx.Error("kernel_shape does not match W");
  ASSIGN_OR_RETURN(s.w, ForwardWindows(ctx, x, s.kernel, false));
  if (ctx.has_input(2) && ctx.in_shapes[2] != Shape{s.m}) return ctx.Error("B must have shape [M]");
  s.y = {x[0], s.m};
  for (const Window& a : s.w) s.y.push_back(a.out);
  s.wdims = wt;
  if (s.group > 1) {
    s.wdims = {s.group, s.m / s.group};
    s.wdims.insert(s.wdims.end(), wt.begin() + 1, wt.end());
  }
  return s;
}

// Element types and scales under the plan's precision tier (precision.h): bf16
// activations and weights between convolutions; or int8 source (quantised with the
// calibrated scale on the way in, unless it arrives quantised) and weights (per output
// channel), accumulating in int32, with FP32 out, or s8/u8 out when every reader takes
// it so (PrepareContext::out_quantizable).
struct ConvTypes {
  bool int8 = false;
  float src_scale = 1.f;  // int8: the source's real value per step
  bool src_unsigned = false;
  bool int8_out = false;  // the output is stored quantised
  float out_scale = 0.f;  // int8_out: the output's real value per step
  bool out_unsigned = false;
  memory::data_type src_dt = memory::data_type::f32;
  memory::data_type w_dt = memory::data_type::f32;
  memory::data_type dst_dt = memory::data_type::f32;
};

// `src_in`: the source's layout as its producer left it.
ConvTypes ChooseConvTypes(const PrepareContext& ctx, bool const_w, const memory::desc& src_in) {
  ConvTypes t;
  const float in_scale = ctx.InScale(0);  // > 0: the source arrives as s8/u8
  t.int8 = const_w && (!ctx.has_input(2) || ctx.in_data[2]);
  if (t.int8 && in_scale > 0.f) {
    t.src_scale = in_scale;
    t.src_unsigned = src_in.data.data_type == dnnl_u8;
  } else if (t.int8) {
    t.int8 = QuantizeInput(ctx, 0, &t.src_scale, &t.src_unsigned);
  }
  // The output is stored quantised when the activation commutes with a positive scale
  // (none, Relu, LeakyRelu: then the scale folds into the output scales) and no
  // residual is added (its bytes are FP32).
  const std::string act = ctx.node().GetString("activation", "");
  t.int8_out = t.int8 && !ctx.has_input(3) &&
               (act.empty() || act == "Relu" || act == "LeakyRelu") &&
               ctx.node().GetString("post_activation", "").empty() &&
               QuantizeOutput(ctx, 0, &t.out_scale, &t.out_unsigned);
  const auto act_dt = const_w ? ComputeType(ctx) : memory::data_type::f32;
  t.src_dt = t.int8 ? (t.src_unsigned ? memory::data_type::u8 : memory::data_type::s8) : act_dt;
  t.w_dt = t.int8 ? memory::data_type::s8 : act_dt;
  t.dst_dt = t.int8_out ? (t.out_unsigned ? memory::data_type::u8 : memory::data_type::s8)
             : t.int8   ? memory::data_type::f32
                        : act_dt;
  return t;
}

// Fused post-ops (shoal.FusedConv, see optimizer.h): activation, residual add,
// activation.
struct ConvPostOps {
  dnnl::post_ops po;
  memory::desc res_md;   // the residual's layout; empty without a residual
  bool use_sum = false;  // the residual add is the sum post-op, else a binary one
};

// `out_free`: the output may take any layout (PrepareContext::out_any_layout).
StatusOr<ConvPostOps> FusedPostOps(PrepareContext& ctx, const Shape& y, const memory::desc& dst_md,
                                   bool out_free) {
  const Node& node = ctx.node();
  ConvPostOps p;
  RETURN_IF_ERROR(AppendActivation(node, "activation", &p.po));
  // The residual add is oneDNN's sum post-op (accumulate into the destination, which
  // starts as the residual: in place when the plan allows, else copied), which its
  // brgemm kernels support; a binary post-op would push them to slower ones, so it is
  // used only when the destination cannot take the residual's layout.
  if (ctx.has_input(3)) {
    if (ctx.in_shapes[3] != y) return ctx.Error("the residual must have the output's shape");
    p.res_md = ctx.InDesc(3, dst_md);
    // The destination takes the residual's layout; sum needs the output in it too.
    p.use_sum = out_free || p.res_md == dst_md;
    if (!p.use_sum)
      p.po.append_binary(dnnl::algorithm::binary_add, p.res_md);
    else
      p.po.append_sum(1.f);
  }
  RETURN_IF_ERROR(AppendActivation(node, "post_activation", &p.po));
  return p;
}

// Int8 weights, quantised per output channel, and the output scales that take the
// int32 sums to real values (or to the output's steps when it stays quantised).
void QuantizeConvWeights(const Tensor& w, int64_t m, const ConvTypes& t, Tensor* w_q,
                         std::vector<float>* w_scales, dnnl::primitive_attr* attr) {
  QuantizeWeights(w, m, true, w_q, w_scales);
  std::vector<float> out_scales(m);
  for (int64_t o = 0; o < m; ++o)
    out_scales[o] = t.src_scale * (*w_scales)[o] / (t.int8_out ? t.out_scale : 1.f);
  attr->set_output_scales(1 << 1, out_scales);  // per output channel
}

using ConvPd = dnnl::convolution_forward::primitive_desc;

bool WantsWinograd(const PrepareContext& ctx) {
  return ctx.options && ctx.options->conv_algorithm == ConvAlgorithm::kWinograd;
}

// Makes the primitive descriptor of one convolution for a given source and destination
// layout and algorithm; throws dnnl::error when oneDNN has no kernel for it.
struct ConvPdFactory {
  const std::vector<Window>& w;
  const memory::desc& w_desc;
  const memory::desc& b_md;
  const dnnl::primitive_attr& attr;
  const dnnl::engine& eng;

  ConvPd operator()(const memory::desc& s, const memory::desc& dd,
                    dnnl::algorithm alg = dnnl::algorithm::convolution_direct) const {
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, s, w_desc, b_md, dd,
                                      Dims(w, &Window::stride), Dilates(w),
                                      Dims(w, &Window::pad_begin), PadRight(w));
    return ConvPd(d, attr, eng);
  }
};

// The source and destination layouts a direct convolution may read and write.
struct ConvLayouts {
  memory::desc src_free, dst_free;  // the primitive's choice
  // (source, destination) pairs, best first: read the source in its producer's layout
  // (no reorder) and write PlanOptions::conv_layout's layout; then let the primitive pick
  // the source layout; then let it pick both.
  std::vector<std::pair<memory::desc, memory::desc>> candidates;
};

ConvLayouts ConvLayoutCandidates(const PrepareContext& ctx, const ConvShapes& s, const ConvTypes& t,
                                 const memory::desc& src_in, bool const_w, bool out_free) {
  const Shape& x = ctx.in_shapes[0];
  const auto src_md = PlainDesc(x, DataType::kFp32), dst_md = PlainDesc(s.y, DataType::kFp32);
  // The source arrives in whatever layout its producer chose (PrepareContext::in_descs)
  // and is reordered when that differs. A source with few channels (the first layer's
  // image) stays plain: oneDNN has direct kernels for it, and padding 3 channels to 16
  // would waste the work. Weights computed at run time keep everything plain FP32.
  const bool keep_src = src_in.data.format_kind == dnnl_blocked && src_in != src_md &&
                        static_cast<memory::data_type>(src_in.data.data_type) == t.src_dt;
  const memory::desc src_any =
      keep_src || (s.c < 8 && t.src_dt == memory::data_type::f32) || !const_w
          ? (ctx.InScale(0) > 0.f && !t.int8 ? src_md : src_in)
          : memory::desc(ToDims(x), t.src_dt, memory::format_tag::any);
  // The layout PlanOptions::conv_layout asks for: channels-last (nhwc), where oneDNN 2.6's
  // brgemm convolutions run, or nChw16c, its jit:avx512_core kernels' layout. Only fp32
  // 2-D convolutions with at least 16 output channels take the blocked one, and of grouped
  // ones only depthwise convolutions and groups of whole 16-channel blocks (oneDNN's
  // blocked kernels take no others); the library's own choice is a fallback candidate.
  const bool whole_blocks = s.group == 1 || (s.group == s.c && s.group == s.m) ||
                            ((s.c / s.group) % 16 == 0 && (s.m / s.group) % 16 == 0);
  const bool blocked = ctx.options && ctx.options->conv_layout == ConvLayout::kBlocked &&
                       x.size() == 4 && s.m >= 16 && whole_blocks &&
                       t.src_dt == memory::data_type::f32 && t.dst_dt == memory::data_type::f32 &&
                       !t.int8;
  const auto last_tag = blocked         ? memory::format_tag::aBcd16b
                        : x.size() == 4 ? memory::format_tag::acdb
                        : x.size() == 5 ? memory::format_tag::acdeb
                                        : memory::format_tag::acb;
  const memory::desc dst_any = !const_w ? dst_md : memory::desc(ToDims(s.y), t.dst_dt, last_tag);
  ConvLayouts l;
  l.src_free = memory::desc(ToDims(x), t.src_dt, memory::format_tag::any);
  l.dst_free = memory::desc(ToDims(s.y), t.dst_dt, memory::format_tag::any);
  l.candidates = {{src_any, dst_any}};
  // Under Winograd, an image layer (few channels, read plain) writes nChw16c, the layout
  // the Winograd kernels after it read: oneDNN's direct kernel for that takes 20 us on a
  // 3x32x32 image where channels-last and the reorders on both sides take 44.
  if (WantsWinograd(ctx) && const_w && out_free && s.c < 8 && x.size() == 4 &&
      t.src_dt == memory::data_type::f32) {
    l.candidates.insert(l.candidates.begin(), {src_any, memory::desc(ToDims(s.y), t.dst_dt,
                                                                     memory::format_tag::aBcd16b)});
  }
  if (const_w) {
    l.candidates.push_back({l.src_free, dst_any});
    l.candidates.push_back({src_any, l.dst_free});
    l.candidates.push_back({l.src_free, l.dst_free});
  }
  return l;
}

// Winograd (PlanOptions::conv_algorithm): fewer multiplications for fp32 3x3 stride-1
// convolutions, in oneDNN's blocked layouts. Below 16 input channels its transforms
// cost more than they save (the first layer's image), so those stay direct, as does
// every shape oneDNN has no Winograd kernel for: then nullopt.
std::optional<ConvPd> TryWinograd(const PrepareContext& ctx, const ConvPdFactory& make_pd,
                                  const ConvShapes& s, const ConvTypes& t, bool const_w,
                                  const memory::desc& src_in, const memory::desc& src_free,
                                  const memory::desc& dst) {
  if (!WantsWinograd(ctx) || !const_w || t.int8 || t.src_dt != memory::data_type::f32 ||
      s.group != 1 || s.c < 16 || s.kernel != Shape{3, 3} ||
      !std::all_of(s.w.begin(), s.w.end(),
                   [](const Window& a) { return a.stride == 1 && a.dilation == 1; })) {
    return std::nullopt;
  }
  // The source as its producer left it when the kernel reads that, else reordered.
  // (A quantised source is never read as it is here: Winograd runs in fp32.)
  for (const memory::desc& src : {ctx.InScale(0) > 0.f ? src_free : src_in, src_free}) {
    try {
      return make_pd(src, dst, dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
      // No Winograd kernel for this case: next source layout, else direct.
    }
  }
  return std::nullopt;
}

// Direct: the first candidate that is not oneDNN's reference implementation, else the
// first that builds. `residual`, when set, is the destination layout of every
// candidate. When every candidate fails, the last one's error propagates.
std::optional<ConvPd> FindDirect(
    const ConvPdFactory& make_pd,
    const std::vector<std::pair<memory::desc, memory::desc>>& candidates,
    const memory::desc* residual) {
  std::optional<ConvPd> pd;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& [s, d] = candidates[i];
    try {
      auto cand = make_pd(s, residual ? *residual : d);
      const bool ref = std::string(cand.impl_info_str()).rfind("ref", 0) == 0;
      if (!pd || !ref) pd = cand;
      if (!ref) break;
    } catch (const dnnl::error&) {
      if (i + 1 == candidates.size() && !pd) throw;
    }
  }
  return pd;
}

// oneDNN applies the output scales to the sum with the bias: an int8 convolution gets
// bias / scale, fixed in the kernel.
void BindConvBias(PrepareContext& ctx, DnnlKernel* k, const ConvTypes& t,
                  const std::vector<float>& w_scales, const memory::desc& b_md, int64_t m) {
  const auto& eng = *ctx.dnnl_engine;
  if (!t.int8) {
    k->BindInput(DNNL_ARG_BIAS, b_md, eng, 2);
    return;
  }
  Tensor scaled = Tensor::Allocate(DataType::kFp32, {m});
  auto b = ctx.in_data[2]->values<float>();
  for (int64_t o = 0; o < m; ++o)
    scaled.mutable_values<float>()[o] = b[o] / (t.src_scale * w_scales[o]);
  k->BindFixed(DNNL_ARG_BIAS, memory(b_md, eng, scaled.mutable_data()), scaled.buffer());
}

// The residual: a binary post-op's second source, or (sum) the destination's starting
// bytes, in place when the plan allows.
Status BindConvResidual(PrepareContext& ctx, DnnlKernel* k, const ConvPostOps& post,
                        const ConvPd& pd, const memory::desc& dst_out) {
  if (!post.use_sum) {
    const bool has_post = !ctx.node().GetString("post_activation", "").empty();
    k->BindInput(
        DNNL_ARG_ATTR_MULTIPLE_POST_OP(post.po.len() - 1 - (has_post ? 1 : 0)) | DNNL_ARG_SRC_1,
        post.res_md, *ctx.dnnl_engine, 3);
    return Status::Ok();
  }
  // The destination is the residual's layout (FusedPostOps), so bytes copy as they are.
  if (pd.dst_desc() != post.res_md || dst_out != pd.dst_desc())
    return ctx.Error("internal: the residual's layout differs from the destination's");
  k->prefill_from = 3;
  k->inplace = 3;
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PrepareConv(PrepareContext& ctx) {
  ASSIGN_OR_RETURN(const ConvShapes s, CheckConvShapes(ctx));
  ctx.out_shapes[0] = s.y;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(s.y) == 0) return Noop();

  const auto& eng = *ctx.dnnl_engine;
  const Shape& x = ctx.in_shapes[0];
  const bool has_bias = ctx.has_input(2), has_residual = ctx.has_input(3);
  const auto src_md = PlainDesc(x, DataType::kFp32), dst_md = PlainDesc(s.y, DataType::kFp32);
  const auto w_plain = PlainDesc(s.wdims, DataType::kFp32);
  const memory::desc b_md = has_bias ? PlainDesc({s.m}, DataType::kFp32) : memory::desc();
  const memory::desc src_in = ctx.InDesc(0, src_md);
  const float in_scale = ctx.InScale(0);  // > 0: the source arrives as s8/u8
  // Weights computed at run time must be read as they are: then everything stays plain
  // FP32.
  const bool const_w = ctx.in_data[1] != nullptr;
  const bool out_free = !ctx.out_any_layout.empty() && ctx.out_any_layout[0];
  const ConvTypes t = ChooseConvTypes(ctx, const_w, src_in);
  const memory::desc w_desc =
      const_w ? memory::desc(ToDims(s.wdims), t.w_dt, memory::format_tag::any) : w_plain;
  ASSIGN_OR_RETURN(const ConvPostOps post, FusedPostOps(ctx, s.y, dst_md, out_free));
  dnnl::primitive_attr attr;
  attr.set_post_ops(post.po);
  Tensor w_q;  // int8 weights
  std::vector<float> w_scales;
  if (t.int8) QuantizeConvWeights(*ctx.in_data[1], s.m, t, &w_q, &w_scales, &attr);

  // Winograd first when asked for, else the first direct candidate that is not oneDNN's
  // reference implementation.
  const ConvPdFactory make_pd{s.w, w_desc, b_md, attr, eng};
  const ConvLayouts layouts = ConvLayoutCandidates(ctx, s, t, src_in, const_w, out_free);
  std::optional<ConvPd> pd =
      TryWinograd(ctx, make_pd, s, t, const_w, src_in, layouts.src_free,
                  has_residual ? post.res_md : (out_free ? layouts.dst_free : dst_md));
  if (!pd) pd = FindDirect(make_pd, layouts.candidates, has_residual ? &post.res_md : nullptr);
  if (!pd) return ctx.Error("oneDNN has no convolution for these shapes");

  // The destination stays in the primitive's layout when every reader accepts any,
  // else it is reordered to plain.
  memory::desc dst_out = dst_md;
  if (out_free && pd->dst_desc() != dst_md) {
    dst_out = pd->dst_desc();
    ctx.out_descs[0] = dst_out;
  }
  if (t.int8_out) ctx.out_scales[0] = t.out_scale;
  auto k = std::make_unique<DnnlKernel>();
  k->primitive = dnnl::convolution_forward(*pd);
  // The source on its way in: quantised with this convolution's scale, or dequantised
  // when it arrives quantised but the convolution runs in FP32.
  const float src_factor = in_scale > 0.f ? (t.int8 ? 1.f : in_scale)
                           : t.int8       ? 1.f / t.src_scale
                                          : 1.f;
  k->BindInputAs(DNNL_ARG_SRC, src_in, pd->src_desc(), eng, 0, src_factor);
  if (t.int8) {
    RETURN_IF_ERROR(BindWeightsData(ctx, k.get(), DNNL_ARG_WEIGHTS, 1, w_q,
                                    PlainDesc(s.wdims, DataType::kInt8), pd->weights_desc()));
  } else {
    RETURN_IF_ERROR(BindWeights(ctx, k.get(), DNNL_ARG_WEIGHTS, 1, w_plain, pd->weights_desc()));
  }
  if (has_bias) BindConvBias(ctx, k.get(), t, w_scales, b_md, s.m);
  if (has_residual) RETURN_IF_ERROR(BindConvResidual(ctx, k.get(), post, *pd, dst_out));
  k->BindOutputAs(DNNL_ARG_DST, pd->dst_desc(), dst_out, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

// ---- ConvTranspose ----

// Reads strides/dilations/pads/output_padding/output_shape/auto_pad of a transposed
// convolution over input `x` (N, C, spatial...) and computes its output windows, with
// oneDNN's right padding per axis in `pad_r` (oneDNN has no output_padding: it is
// negative right padding).
Status TransposedWindows(PrepareContext& ctx, const Shape& x, const Shape& kernel,
                         std::vector<Window>* w, memory::dims* pad_r) {
  const Node& node = ctx.node();
  const size_t k = x.size() - 2;
  auto strides = node.GetInts("strides", std::vector<int64_t>(k, 1));
  auto dilations = node.GetInts("dilations", std::vector<int64_t>(k, 1));
  auto pads = node.GetInts("pads", std::vector<int64_t>(2 * k, 0));
  auto out_pad = node.GetInts("output_padding", std::vector<int64_t>(k, 0));
  auto out_shape = node.GetInts("output_shape", {});
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (strides.size() != k || dilations.size() != k || pads.size() != 2 * k || out_pad.size() != k ||
      (!out_shape.empty() && out_shape.size() != k)) {
    return ctx.Error(
        "strides, dilations, pads, output_padding and output_shape must match the spatial rank");
  }
  w->assign(k, Window{});
  for (size_t i = 0; i < k; ++i) {
    Window& a = (*w)[i];
    a.in = x[2 + i];
    a.kernel = kernel[i];
    a.stride = strides[i];
    a.dilation = dilations[i];
    if (a.stride < 1 || a.dilation < 1) return ctx.Error("strides and dilations must be >= 1");
    const int64_t full = a.stride * (a.in - 1) + out_pad[i] + a.extent();
    if (!out_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      a.out = out_shape.empty() ? a.in * a.stride : out_shape[i];
      const int64_t total = std::max<int64_t>(0, full - a.out);
      const bool upper = auto_pad != "SAME_LOWER";
      a.pad_begin = upper ? total / 2 : total - total / 2;
      a.pad_end = total - a.pad_begin;
    } else {
      if (auto_pad != "VALID") {
        a.pad_begin = pads[i];
        a.pad_end = pads[i + k];
      }
      a.out = full - a.pad_begin - a.pad_end;
    }
    if (a.pad_begin < 0 || a.pad_end < 0 || a.out < 1)
      return ctx.Error("pads and output_shape give no output");
    pad_r->push_back(a.pad_end - out_pad[i]);
  }
  return Status::Ok();
}

// oneDNN's logical weights are [G,] O, I, spatial; ONNX stores [G*I/G], O/G, spatial:
// the plain FP32 layout of ONNX's bytes seen as oneDNN's dimensions.
memory::desc TransposedWeightsDesc(const Shape& kernel, int64_t group, int64_t og, int64_t ig) {
  memory::dims wdims, wstrides;
  const int64_t sp = Product(kernel);
  if (group > 1) {
    wdims = {group, og, ig};
    wstrides = {ig * og * sp, sp, og * sp};
  } else {
    wdims = {og, ig};
    wstrides = {sp, og * sp};
  }
  for (size_t i = 0; i < kernel.size(); ++i) {
    wdims.push_back(kernel[i]);
    wstrides.push_back(Product(kernel, i + 1));
  }
  return memory::desc(wdims, memory::data_type::f32, wstrides);
}

StatusOr<std::unique_ptr<Kernel>> PrepareConvTranspose(PrepareContext& ctx) {
  if (ctx.num_inputs() < 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs X and W");
  const Node& node = ctx.node();
  const Shape& x = ctx.in_shapes[0];
  const Shape& wt = ctx.in_shapes[1];
  if (ctx.in_dtypes[0] != DataType::kFp32 || ctx.in_dtypes[1] != DataType::kFp32) {
    return ctx.Error("only FP32 is supported");
  }
  if (x.size() < 3 || x.size() > 5 || wt.size() != x.size())
    return ctx.Error("X must be 3-D to 5-D and W of the same rank");
  const int64_t group = node.GetInt("group", 1);
  const int64_t c = x[1];
  if (group < 1 || wt[0] != c || c % group != 0)
    return ctx.Error("W's first dimension must equal X's channels");
  const int64_t m = wt[1] * group;
  Shape kernel(wt.begin() + 2, wt.end());
  if (node.GetInts("kernel_shape", kernel) != kernel)
    return ctx.Error("kernel_shape does not match W");
  std::vector<Window> w;
  memory::dims pad_r;
  RETURN_IF_ERROR(TransposedWindows(ctx, x, kernel, &w, &pad_r));
  const bool has_bias = ctx.has_input(2);
  if (has_bias && ctx.in_shapes[2] != Shape{m}) return ctx.Error("B must have shape [M]");
  Shape y{x[0], m};
  for (const Window& a : w) y.push_back(a.out);
  ctx.out_shapes[0] = y;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(y) == 0) return Noop();

  const auto& eng = *ctx.dnnl_engine;
  const memory::desc w_plain = TransposedWeightsDesc(kernel, group, m / group, c / group);
  const memory::desc w_any(w_plain.dims(), memory::data_type::f32, memory::format_tag::any);
  const auto src_md = PlainDesc(x, DataType::kFp32), dst_md = PlainDesc(y, DataType::kFp32);
  const memory::desc b_md = has_bias ? PlainDesc({m}, DataType::kFp32) : memory::desc();
  // The source arrives in any layout (its producer's), the destination goes out in any
  // layout when every reader takes one (a U-Net's skip Concat does): oneDNN then picks
  // its jit deconvolution in a blocked or channels-last layout, reordering at the edges,
  // where plain NCHW on both sides leaves it only x64:gemm. Both plain otherwise.
  const memory::desc src_in = ctx.InDesc(0, src_md);
  auto make_pd = [&](const memory::desc& src, const memory::desc& dst) {
    dnnl::deconvolution_forward::desc d(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, src, w_any, b_md,
        dst, Dims(w, &Window::stride), Dilates(w), Dims(w, &Window::pad_begin), pad_r);
    return dnnl::deconvolution_forward::primitive_desc(d, eng);
  };
  auto pd = make_pd(src_md, dst_md);
  if (ctx.out_any_layout[0] || src_in != src_md) {
    // Channels-last first, then oneDNN's own choice; a candidate only counts when it is not
    // the plain gemm or reference kernel. Channels-last also where the convolutions around
    // it are blocked (PlanOptions::conv_layout): a U-Net ran slower with a blocked
    // ConvTranspose, whose Concat with the blocked skip path took 3x as long.
    const auto last = x.size() == 4   ? memory::format_tag::acdb
                      : x.size() == 5 ? memory::format_tag::acdeb
                                      : memory::format_tag::acb;
    const memory::desc any_src(ToDims(x), memory::data_type::f32, memory::format_tag::any);
    const memory::desc last_dst(ToDims(y), memory::data_type::f32, last);
    const memory::desc any_dst(ToDims(y), memory::data_type::f32, memory::format_tag::any);
    const memory::desc plain_or(ctx.out_any_layout[0] ? any_dst : dst_md);
    const std::pair<memory::desc, memory::desc> candidates[] = {
        {memory::desc(ToDims(x), memory::data_type::f32, last),
         ctx.out_any_layout[0] ? last_dst : dst_md},
        {any_src, plain_or}};
    for (const auto& [s, dd] : candidates) {
      try {
        auto cand = make_pd(s, dd);
        const std::string impl = cand.impl_info_str();
        if (impl.find("gemm") == std::string::npos && impl.rfind("ref", 0) != 0) {
          pd = cand;
          break;
        }
      } catch (const dnnl::error&) {
      }
    }
  }
  memory::desc dst_out = dst_md;
  if (ctx.out_any_layout[0] && pd.dst_desc() != dst_md) {
    dst_out = pd.dst_desc();
    ctx.out_descs[0] = dst_out;
  }
  auto kern = std::make_unique<DnnlKernel>();
  kern->primitive = dnnl::deconvolution_forward(pd);
  kern->BindInputAs(DNNL_ARG_SRC, src_in, pd.src_desc(), eng, 0);
  RETURN_IF_ERROR(BindWeights(ctx, kern.get(), DNNL_ARG_WEIGHTS, 1, w_plain, pd.weights_desc()));
  if (has_bias) kern->BindInput(DNNL_ARG_BIAS, b_md, eng, 2);
  kern->BindOutputAs(DNNL_ARG_DST, pd.dst_desc(), dst_out, eng, 0);
  return std::unique_ptr<Kernel>(std::move(kern));
}

// 2-D max pooling of a quantised (s8/u8) channels-last tensor, [N, H, W, C] in memory.
// oneDNN 2.6's int8 pooling moves about a fifth of the bytes per second its fp32 one
// does on such tensors (24 us for an 8x32x32x32 2x2 pool where this loop takes 10).
// Bytes compare as unsigned after XOR with `flip` (0x80 for s8, which orders signed
// bytes; 0 for u8), 16 channels at a time (PreparePool takes it for 16 channels or more;
// the rest of C, byte by byte).
void MaxPoolChannelsLast(const uint8_t* in, uint8_t* out, const Shape& x, const Shape& y,
                         const std::vector<Window>& w, uint8_t flip) {
  const int64_t n = x[0], c = x[1], h = x[2], wd = x[3], oh = y[2], ow = y[3];
  const Window &wh = w[0], &ww = w[1];
  // Waking a second thread costs a few microseconds: not worth it on small tensors.
#pragma omp parallel for collapse(2) if (n * c * h * wd >= (int64_t{1} << 16))
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < oh; ++i) {
      const int64_t h0 = i * wh.stride - wh.pad_begin;
      const int64_t h_lo = std::max<int64_t>(h0, 0), h_hi = std::min(h0 + wh.kernel, h);
      for (int64_t j = 0; j < ow; ++j) {
        uint8_t* o = out + ((b * oh + i) * ow + j) * c;
        const int64_t w0 = j * ww.stride - ww.pad_begin;
        const int64_t w_lo = std::max<int64_t>(w0, 0), w_hi = std::min(w0 + ww.kernel, wd);
        auto at = [&](int64_t r, int64_t q) { return in + ((b * h + r) * wd + q) * c; };
        int64_t k0 = 0;
#if defined(__SSE2__)
        const __m128i flip16 = _mm_set1_epi8(static_cast<char>(flip));
        for (; k0 + 16 <= c; k0 += 16) {
          __m128i acc = _mm_setzero_si128();  // the lowest value, flipped
          for (int64_t r = h_lo; r < h_hi; ++r) {
            for (int64_t q = w_lo; q < w_hi; ++q) {
              const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at(r, q) + k0));
              acc = _mm_max_epu8(acc, _mm_xor_si128(v, flip16));
            }
          }
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + k0), _mm_xor_si128(acc, flip16));
        }
#endif
        for (; k0 < c; ++k0) {
          uint8_t acc = 0;
          for (int64_t r = h_lo; r < h_hi; ++r)
            for (int64_t q = w_lo; q < w_hi; ++q)
              acc = std::max<uint8_t>(acc, static_cast<uint8_t>(at(r, q)[k0] ^ flip));
          o[k0] = static_cast<uint8_t>(acc ^ flip);
        }
      }
    }
  }
}

StatusOr<std::unique_ptr<Kernel>> PreparePool(PrepareContext& ctx) {
  const Node& node = ctx.node();
  const std::string& op = node.op_type;
  if (ctx.num_inputs() != 1 || ctx.in_dtypes[0] != DataType::kFp32)
    return ctx.Error("needs one FP32 input");
  const Shape& x = ctx.in_shapes[0];
  if (x.size() < 3 || x.size() > 5)
    return ctx.Error("input must be 3-D to 5-D; got " + ShapeToString(x));
  const bool global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
  const bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
  std::vector<Window> w;
  if (global) {
    for (size_t i = 2; i < x.size(); ++i) w.push_back(Window{x[i], x[i], 1, 1, 0, 0, 1});
  } else {
    auto kernel = node.GetInts("kernel_shape", {});
    if (kernel.size() != x.size() - 2)
      return ctx.Error("kernel_shape must have one entry per spatial axis");
    ASSIGN_OR_RETURN(w, ForwardWindows(ctx, x, kernel, node.GetInt("ceil_mode", 0) != 0));
  }
  Shape y{x[0], x[1]};
  for (const Window& a : w) y.push_back(a.out);
  ctx.out_shapes[0] = y;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(y) == 0 || Product(x) == 0) return Noop();
  const auto a = is_max ? dnnl::algorithm::pooling_max
                 : node.GetInt("count_include_pad", 0)
                     ? dnnl::algorithm::pooling_avg_include_padding
                     : dnnl::algorithm::pooling_avg_exclude_padding;
  const auto& eng = *ctx.dnnl_engine;
  const auto src_plain = PlainDesc(x, DataType::kFp32), dst_md = PlainDesc(y, DataType::kFp32);
  // Pools in its source's layout (a convolution's blocked output stays blocked); the
  // result is reordered to plain only when a reader needs plain.
  const auto src_md = ctx.InDesc(0, src_plain);
  // An int8 plan's source may arrive quantised: only to max pooling (which commutes with
  // the scale) whose output stays quantised too (OpDef::quantized_passthrough).
  const float in_scale = ctx.InScale(0);
  const bool keep_quantized = in_scale > 0.f;
  if (keep_quantized && (!is_max || !ctx.out_quantizable[0]))
    return ctx.Error("internal: a quantised source whose pooled output cannot stay quantised");
  if (keep_quantized && x.size() == 4 && x[1] >= 16 &&
      src_md == memory::desc(ToDims(x), static_cast<memory::data_type>(src_md.data.data_type),
                             memory::format_tag::acdb) &&
      std::all_of(w.begin(), w.end(), [](const Window& a) { return a.dilation == 1; })) {
    ctx.out_descs[0] = memory::desc(
        ToDims(y), static_cast<memory::data_type>(src_md.data.data_type), memory::format_tag::acdb);
    ctx.out_scales[0] = in_scale;
    const uint8_t flip = src_md.data.data_type == dnnl_u8 ? 0 : 0x80;
    return MakeFn([x, y, w, flip](const RunContext& rc) {
      MaxPoolChannelsLast(static_cast<const uint8_t*>(rc.inputs[0]->data()),
                          static_cast<uint8_t*>(rc.outputs[0]->mutable_data()), x, y, w, flip);
      return Status::Ok();
    });
  }
  const memory::desc dst_any(ToDims(y), static_cast<memory::data_type>(src_md.data.data_type),
                             memory::format_tag::any);
  auto make_pd = [&](const memory::desc& src) {
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, a, src, dst_any,
                                     Dims(w, &Window::stride), Dims(w, &Window::kernel), Dilates(w),
                                     Dims(w, &Window::pad_begin), PadRight(w));
    return dnnl::pooling_v2_forward::primitive_desc(d, eng);
  };
  memory::desc pool_src = src_md;
  auto pd = make_pd(pool_src);
  // A plain 4-D source (its value also feeds a reader that needs plain: a U-Net's skip
  // connection into Concat) is pooled channels-last through a reordered copy when oneDNN
  // has no jit kernel for it in plain NCHW: for 16 or 32 channels oneDNN 2.6 takes its
  // simple_nchw loop, 5.8 ms for a 16x256x256 2x2 max pool where the reorder and the jit
  // kernel take 2.
  const std::string plain_impl = pd.impl_info_str();
  if (!global && src_md == src_plain && x.size() == 4 &&
      (plain_impl.rfind("simple", 0) == 0 || plain_impl.rfind("ref", 0) == 0)) {
    pool_src = memory::desc(ToDims(x), memory::data_type::f32, memory::format_tag::acdb);
    pd = make_pd(pool_src);
  }
  memory::desc dst_out = dst_md;
  if (ctx.out_any_layout[0] && pd.dst_desc() != dst_md) {
    dst_out = pd.dst_desc();
    ctx.out_descs[0] = dst_out;
  }
  if (keep_quantized) ctx.out_scales[0] = in_scale;
  auto k = std::make_unique<DnnlKernel>();
  k->primitive = dnnl::pooling_v2_forward(pd);
  k->BindInputAs(DNNL_ARG_SRC, src_md, pool_src, eng, 0);
  k->BindOutputAs(DNNL_ARG_DST, pd.dst_desc(), dst_out, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

Status CheckMaxPool(const Node& node, const Graph& graph) {
  RETURN_IF_ERROR(CheckAutoPad(node, graph));
  if (node.has_output(1)) {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) +
                           ": output 'Indices' is not supported");
  }
  if (node.GetInt("storage_order", 0) != 0) {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) +
                           ": storage_order 1 is not supported");
  }
  return Status::Ok();
}

}  // namespace

void RegisterConvOps(std::vector<OpDef>* ops) {
  // Convolutions and max pooling read an int8 plan's quantised values (kernel.h).
  ops->push_back({"",
                  "Conv",
                  {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"},
                  CheckAutoPad,
                  PrepareConv,
                  0b1,
                  0b1});
  // Conv with post-ops (optimizer.h): X, W, B (optional), residual (optional).
  std::vector<std::string_view> fused = {"auto_pad",     "dilations", "group",
                                         "kernel_shape", "pads",      "strides"};
  for (auto a : ActivationAttributes(true)) fused.push_back(a);
  ops->push_back({"shoal", "FusedConv", fused, CheckAutoPad, PrepareConv, 0b1001, 0b1});
  ops->push_back({"",
                  "ConvTranspose",
                  {"auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                   "output_shape", "pads", "strides"},
                  CheckAutoPad,
                  PrepareConvTranspose,
                  0b1});
  ops->push_back(
      {"",
       "MaxPool",
       {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"},
       CheckMaxPool,
       PreparePool,
       0b1,
       0b1,
       true});
  ops->push_back({"",
                  "AveragePool",
                  {"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"},
                  CheckAutoPad,
                  PreparePool,
                  0b1});
  ops->push_back({"", "GlobalAveragePool", {}, nullptr, PreparePool, 0b1});
  ops->push_back({"", "GlobalMaxPool", {}, nullptr, PreparePool, 0b1, 0b1, true});
}

}  // namespace shoal::engine::internal
