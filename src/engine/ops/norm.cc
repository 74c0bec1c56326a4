// Normalisation and softmax on oneDNN primitives: BatchNormalization (inference),
// LayerNormalization, Softmax, LogSoftmax.
#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

using dnnl::memory;

StatusOr<std::unique_ptr<Kernel>> Noop() {
  return MakeFn([](const RunContext&) { return Status::Ok(); });
}

// The inference primitive of normalisation `Fwd` (batch or layer) over `md`, with the
// node's epsilon and X bound from input 0; the caller binds the rest.
template <typename Fwd>
std::unique_ptr<DnnlKernel> NormKernel(PrepareContext& ctx, const memory::desc& md,
                                       dnnl::normalization_flags flags) {
  const auto& eng = *ctx.dnnl_engine;
  typename Fwd::desc d(dnnl::prop_kind::forward_inference, md,
                       ctx.node().GetFloat("epsilon", 1e-5f), flags);
  typename Fwd::primitive_desc pd(d, eng);
  auto k = std::make_unique<DnnlKernel>();
  k->primitive = Fwd(pd);
  k->BindInput(DNNL_ARG_SRC, md, eng, 0);
  return k;
}

StatusOr<std::unique_ptr<Kernel>> PrepareBatchNorm(PrepareContext& ctx) {
  if (ctx.num_inputs() != 5) return ctx.Error("needs X, scale, B, mean and var");
  for (size_t i = 0; i < 5; ++i) {
    if (!ctx.has_input(i) || ctx.in_dtypes[i] != DataType::kFp32)
      return ctx.Error("all inputs must be FP32");
  }
  const Shape& x = ctx.in_shapes[0];
  if (x.size() < 2 || x.size() > 5) return ctx.Error("X must be 2-D to 5-D");
  for (size_t i = 1; i < 5; ++i) {
    if (ctx.in_shapes[i] != Shape{x[1]})
      return ctx.Error("scale, B, mean and var must have shape [C]");
  }
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(x) == 0) return Noop();
  const auto& eng = *ctx.dnnl_engine;
  const auto md = PlainDesc(x, DataType::kFp32), c_md = PlainDesc({x[1]}, DataType::kFp32);
  const auto flags = dnnl::normalization_flags::use_global_stats |
                     dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  auto k = NormKernel<dnnl::batch_normalization_forward>(ctx, md, flags);
  k->BindInput(DNNL_ARG_SCALE, c_md, eng, 1);
  k->BindInput(DNNL_ARG_SHIFT, c_md, eng, 2);
  k->BindInput(DNNL_ARG_MEAN, c_md, eng, 3);
  k->BindInput(DNNL_ARG_VARIANCE, c_md, eng, 4);
  k->BindOutput(DNNL_ARG_DST, md, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

Status CheckBatchNorm(const Node& node, const Graph& graph) {
  if (node.GetInt("training_mode", 0) != 0 || node.has_output(1) || node.has_output(2)) {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) +
                           ": training mode (running mean/var outputs) is not supported");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PrepareLayerNorm(PrepareContext& ctx) {
  if (ctx.num_inputs() < 2 || !ctx.has_input(0) || !ctx.has_input(1))
    return ctx.Error("needs X and Scale");
  RETURN_IF_ERROR(CheckFp32Inputs(ctx));
  const Shape& x = ctx.in_shapes[0];
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", -1), static_cast<int64_t>(x.size()));
  if (!axis.ok() || x.empty())
    return ctx.Error("axis is out of range for shape " + ShapeToString(x));
  const int64_t outer = Product(x, 0, *axis), inner = Product(x, *axis);
  const Shape norm_shape(x.begin() + *axis, x.end());
  for (size_t i = 1; i < 3; ++i) {
    if (ctx.has_input(i) && Product(ctx.in_shapes[i]) != inner) {
      return ctx.Error("Scale and B must have the normalised shape " + ShapeToString(norm_shape) +
                       "; got " + ShapeToString(ctx.in_shapes[i]));
    }
  }
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(x) == 0) return Noop();
  const auto& eng = *ctx.dnnl_engine;
  const auto md = PlainDesc({outer, inner}, DataType::kFp32),
             c_md = PlainDesc({inner}, DataType::kFp32);
  auto flags = dnnl::normalization_flags::use_scale;
  if (ctx.has_input(2)) flags = flags | dnnl::normalization_flags::use_shift;
  auto k = NormKernel<dnnl::layer_normalization_forward>(ctx, md, flags);
  k->BindInput(DNNL_ARG_SCALE, c_md, eng, 1);
  if (ctx.has_input(2)) k->BindInput(DNNL_ARG_SHIFT, c_md, eng, 2);
  k->BindOutput(DNNL_ARG_DST, md, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

Status CheckLayerNorm(const Node& node, const Graph& graph) {
  if (node.has_output(1) || node.has_output(2)) {
    return InvalidArgument(graph.Describe(&node - graph.nodes.data()) +
                           ": outputs 'Mean' and 'InvStdDev' are not supported");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Kernel>> PrepareSoftmax(PrepareContext& ctx) {
  if (ctx.num_inputs() != 1 || ctx.in_dtypes[0] != DataType::kFp32)
    return ctx.Error("needs one FP32 input");
  const Shape& x = ctx.in_shapes[0];
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank == 0) return ctx.Error("input must have rank >= 1");
  const bool legacy = ctx.opset() < 13;  // coerces to 2-D at `axis`
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", legacy ? 1 : -1), rank);
  if (!axis.ok()) return ctx.Error(axis.status().message());
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = DataType::kFp32;
  if (Product(x) == 0) return Noop();
  Shape view = x;
  int dnnl_axis = static_cast<int>(*axis);
  if (legacy) {
    view = {Product(x, 0, *axis), Product(x, *axis)};
    dnnl_axis = 1;
  }
  const auto& eng = *ctx.dnnl_engine;
  const auto md = PlainDesc(view, DataType::kFp32);
  auto k = std::make_unique<DnnlKernel>();
  if (ctx.node().op_type == "LogSoftmax") {
    dnnl::logsoftmax_forward::primitive_desc pd(
        dnnl::logsoftmax_forward::desc(dnnl::prop_kind::forward_inference, md, dnnl_axis), eng);
    k->primitive = dnnl::logsoftmax_forward(pd);
  } else {
    dnnl::softmax_forward::primitive_desc pd(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, dnnl_axis), eng);
    k->primitive = dnnl::softmax_forward(pd);
  }
  k->BindInput(DNNL_ARG_SRC, md, eng, 0);
  k->BindOutput(DNNL_ARG_DST, md, eng, 0);
  return std::unique_ptr<Kernel>(std::move(k));
}

}  // namespace

void RegisterNormOps(std::vector<OpDef>* ops) {
  ops->push_back({"",
                  "BatchNormalization",
                  {"epsilon", "momentum", "training_mode", "spatial"},
                  CheckBatchNorm,
                  PrepareBatchNorm});
  ops->push_back({"",
                  "LayerNormalization",
                  {"axis", "epsilon", "stash_type"},
                  CheckLayerNorm,
                  PrepareLayerNorm});
  ops->push_back({"", "Softmax", {"axis"}, nullptr, PrepareSoftmax});
  ops->push_back({"", "LogSoftmax", {"axis"}, nullptr, PrepareSoftmax});
}

}  // namespace shoal::engine::internal
