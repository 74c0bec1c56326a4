// InstanceNormalization and GroupNormalization (opset 18: scale and bias per group; opset
// 21's per-channel scale and bias are taken too) as the engine's own loop: statistics in
// double over each (batch item, group), FP32 in and out.
#include <cmath>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

StatusOr<std::unique_ptr<Kernel>> PrepareGroupNorm(PrepareContext& ctx) {
  const bool instance = ctx.node().op_type == "InstanceNormalization";
  if (ctx.num_inputs() != 3 || !ctx.has_input(0) || !ctx.has_input(1) || !ctx.has_input(2))
    return ctx.Error("needs X, scale and bias");
  RETURN_IF_ERROR(CheckFp32Inputs(ctx));
  const Shape& x = ctx.in_shapes[0];
  if (x.size() < 2) return ctx.Error("X must have rank >= 2 (N, C, ...)");
  const int64_t N = x[0], C = x[1], spatial = Product(x, 2);
  const int64_t G = instance ? C : ctx.node().GetInt("num_groups", 0);
  if (G <= 0 || C % G != 0)
    return ctx.Error("num_groups must divide the " + std::to_string(C) + " channels; was " +
                     std::to_string(G));
  const int64_t scale_n = Product(ctx.in_shapes[1]), bias_n = Product(ctx.in_shapes[2]);
  if ((scale_n != C && scale_n != G) || bias_n != scale_n)
    return ctx.Error("scale and bias must have one value per channel or per group");
  const bool per_channel = scale_n == C;
  ctx.out_shapes[0] = x;
  ctx.out_dtypes[0] = DataType::kFp32;
  const float eps = ctx.node().GetFloat("epsilon", 1e-5f);
  const int64_t per_group = C / G;
  return MakeFn([=](const RunContext& rc) -> Status {
    const float* in = static_cast<const float*>(rc.inputs[0]->data());
    const float* scale = static_cast<const float*>(rc.inputs[1]->data());
    const float* bias = static_cast<const float*>(rc.inputs[2]->data());
    float* out = static_cast<float*>(rc.outputs[0]->mutable_data());
    const int64_t group_size = per_group * spatial;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t base = (n * C + g * per_group) * spatial;
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < group_size; ++i) sum += in[base + i];
        const double mean = group_size ? sum / static_cast<double>(group_size) : 0.0;
        for (int64_t i = 0; i < group_size; ++i) {
          const double d = in[base + i] - mean;
          sq += d * d;
        }
        const double var = group_size ? sq / static_cast<double>(group_size) : 0.0;
        const double inv = 1.0 / std::sqrt(var + eps);
        for (int64_t c = 0; c < per_group; ++c) {
          const int64_t ch = g * per_group + c;
          const float s = scale[per_channel ? ch : g], b = bias[per_channel ? ch : g];
          const int64_t at = base + c * spatial;
          for (int64_t i = 0; i < spatial; ++i)
            out[at + i] = static_cast<float>((in[at + i] - mean) * inv) * s + b;
        }
      }
    }
    return Status::Ok();
  });
}

}  // namespace

void RegisterGroupNormOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "InstanceNormalization", {"epsilon"}, nullptr, PrepareGroupNorm});
  ops->push_back({"",
                  "GroupNormalization",
                  {"epsilon", "num_groups", "stash_type"},
                  nullptr,
                  PrepareGroupNorm});
}

}  // namespace shoal::engine::internal
