// LowerPlan (gpu_lowering.h) for int8 (GpuPlanOptions::int8_calibration): which products
// and convolutions run as int8 GEMMs, their inputs' quantisation, and the int8 GEMM step
// with its weights, scales and bias (quantize.h has the arithmetic).
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/cuda/quantize.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::cuda::internal {

using engine::internal::Product;

namespace {

// What an int8 product's k and n must be multiples of. cuBLASLt documents 4 for its int8
// kernels on plain layouts (gemm.h checks that); 8, as PyTorch's _int_mm asks of the same
// cuBLASLt calls, keeps off shapes it is known to lack kernels for. Real layers' widths are
// multiples of 8 anyway.
constexpr int64_t kInt8Multiple = 8;

}  // namespace

Int8Input Lowerer::Int8ProductInput(int n, int x, int64_t rows, int64_t k, int64_t cols,
                                    bool convolution, const std::string& refused) {
  std::string why = refused;
  if (why.empty() && (k % kInt8Multiple != 0 || cols % kInt8Multiple != 0)) {
    why = convolution ? "k = c*kh*kw = " + std::to_string(k) + " and its " + std::to_string(cols) +
                            " output channels"
                      : "k = " + std::to_string(k) + " and n = " + std::to_string(cols);
    why += " must be multiples of 8 for cuBLASLt's int8 kernels";
  }
  if (why.empty() && rows < options_.int8_min_rows) {
    why = std::to_string(rows) + (rows == 1 ? " row" : " rows") + ", fewer than the " +
          std::to_string(options_.int8_min_rows) + " an int8 product takes (int8_min_rows)";
  }
  // 128 * 127 * k must fit the int32 sums (an input's -128, a weight's ±127).
  constexpr int64_t kMostK = std::numeric_limits<int32_t>::max() / (128 * 127);
  if (why.empty() && k > kMostK) {
    why = "k = " + std::to_string(k) + " could overflow int8's int32 sums (at most " +
          std::to_string(kMostK) + ")";
  }
  Int8Input in;
  if (why.empty()) in = Int8InputOf(x, &why);
  if (in.scale == 0) KeptFp32(n, why);
  return in;
}

Int8Input Lowerer::Int8InputOf(int v, std::string* why) const {
  const Calibration& ranges = *options_.int8_calibration;
  // The value's own range, or, for a view, its owner's (the same numbers).
  auto it = ranges.find(graph_.values[v].name);
  if (it == ranges.end() && Owner(v) != v) it = ranges.find(graph_.values[Owner(v)].name);
  if (it == ranges.end()) {
    *why = "its input '" + graph_.values[v].name + "' has no calibrated range";
    return {};
  }
  const Int8Input in = Int8InputFor(it->second.min, it->second.max);
  if (in.scale == 0) {
    *why = "its input '" + graph_.values[v].name + "' ranged over [" +
           std::to_string(it->second.min) + ", " + std::to_string(it->second.max) +
           "] in calibration, which gives no int8 scale";
  }
  return in;
}

int Lowerer::Int8Operand(int n, int v, const Int8Input& in) {
  // As GemmOperand's roundings: every writer of v runs before its first reader, and the
  // int8 copy is a temporary only this step writes.
  if (auto it = quantized_.find(v); it != quantized_.end()) return it->second;
  const Shape shape = ShapeOf(v);  // a copy: NewTemp may move the shapes
  GpuStep step = NewStep(GpuStep::Kind::kQuantize, n);
  step.in = {v};
  step.out = NewTemp(shape, DataType::kInt8);
  step.alpha = in.inv_scale;
  step.zero_point = in.zero_point;
  out_.steps.push_back(step);
  quantized_[v] = step.out;
  return step.out;
}

Lowerer::Int8Scaling Lowerer::AddInt8Gemm(GpuStep step, const Tensor& w, bool transposed,
                                          const std::string& w_key, const Tensor* bias,
                                          const std::string& b_key, const Int8Input& in, int out) {
  GemmOptions& g = step.gemm;
  const bool sums_only = out_.dtypes[out] == DataType::kInt32;
  step.int8_relu =
      !sums_only && (g.epilogue == GemmEpilogue::kRelu || g.epilogue == GemmEpilogue::kBiasRelu);
  QuantizedWeight q = QuantizeWeightColumns(w, transposed);
  // Each column's scale times the input's: one multiplication per output in the pass after.
  std::vector<float> scale(static_cast<size_t>(g.n));
  for (int64_t j = 0; j < g.n; ++j) scale[j] = in.scale * q.scales[static_cast<size_t>(j)];
  // The bias, less the zero point's share of the sums (quantize.h's Int8Bias).
  const std::vector<float> shifted =
      Int8Bias(q, scale, in.zero_point, bias ? bias->values<float>().data() : nullptr);
  char hex[32];
  // (The scale, which the blobs depend on; two scales may share one rounded inverse.)
  std::snprintf(hex, sizeof(hex), "%a", static_cast<double>(in.scale));
  g.math = GemmMath::kInt8;
  g.transpose_w = true;
  g.epilogue = GemmEpilogue::kNone;
  g.fp32_output = false;
  g.alpha = 1.f;
  // The layout read is in the keys: one constant may feed a product that reads it [k, n] and
  // another that reads it [n, k] (Gemm's transB), each quantised along its own columns.
  const std::string int8_key = w_key + (transposed ? "~int8" : "~int8 of [k,n]");
  int64_t bias_slot = -1;
  if (in.zero_point != 0) {
    // Depends on the weight, the input's scale and the bias.
    bias_slot = AddBlob(int8_key + " bias/" + hex + "/" + (bias ? b_key : std::string("none")),
                        Tensor::FromVector(DataType::kFp32, {g.n}, shifted));
  } else if (bias) {
    bias_slot = AddBlob(b_key, *bias);
  }
  const Int8Scaling scaling{bias_slot, AddBlob(int8_key + " scales/" + hex,
                                               Tensor::FromVector(DataType::kFp32, {g.n}, scale))};
  step.weight_slots = {AddBlob(int8_key, std::move(q.values)), -1, -1};
  if (!sums_only) {
    step.weight_slots[1] = scaling.bias;
    step.weight_slots[2] = scaling.scales;
    step.scratch = NewTemp({g.batch * g.m * g.n}, DataType::kInt32);
  }
  step.out = out;
  ++out_.int8_products;
  out_.steps.push_back(std::move(step));
  return scaling;
}

void Lowerer::KeepValuesInt8() {
  std::vector<GpuStep>& steps = out_.steps;
  const int num_steps = static_cast<int>(steps.size());
  std::vector<bool> drop(steps.size(), false);
  std::map<int, int> renamed;  // a dropped kQuantize's output -> the int8 copy read instead
  std::vector<int> writers;    // the steps given an int8 copy
  for (int c = 0; c < num_steps; ++c) {
    GpuStep& s = steps[c];
    const bool quantize = s.kind == GpuStep::Kind::kQuantize;
    const bool cols = s.kind == GpuStep::Kind::kIm2Col && out_.dtypes[s.out] == DataType::kInt8 &&
                      out_.dtypes[s.in[0]] == DataType::kFp32;
    if ((!quantize && !cols) || s.shard >= 0) continue;
    const int x = s.in[0];
    const int at = LastWriter(x, c);
    if (at < 0) continue;
    GpuStep& w = steps[at];
    // w writes all of x's bytes in one pass: x, or a view of all of them (a Flatten's: the
    // same values in the same order, so quantising them in w's order is quantising x).
    if (w.shard >= 0 || w.out < 0 || Owner(w.out) != w.out || Owner(x) != w.out ||
        Product(ShapeOf(x)) != Product(ShapeOf(w.out)) || out_.dtypes[w.out] != DataType::kFp32)
      continue;
    // The steps whose kernels can write their result's int8 copy in the same pass, at the
    // result's own index: as for the 16-bit roundings (FuseRoundingsIntoEpilogues), and an
    // int8 product scaling its sums. A product's activation step writes it after the GEMM.
    const bool can = (w.kind == GpuStep::Kind::kConvEpilogue && !w.conv_epilogue.source) ||
                     (w.kind == GpuStep::Kind::kGemm && w.in[3] < 0 &&
                      (w.post || (w.gemm.math == GemmMath::kInt8 && w.scratch >= 0))) ||
                     (w.kind == GpuStep::Kind::kLayerNorm && w.weight_slots.empty()) ||
                     w.kind == GpuStep::Kind::kUnary || w.kind == GpuStep::Kind::kBinary ||
                     w.kind == GpuStep::Kind::kSoftmax || w.kind == GpuStep::Kind::kTranspose ||
                     w.kind == GpuStep::Kind::kReduce;
    if (!can) continue;
    if (w.half_out >= 0) {
      // One copy per value: x has one range, so its readers quantise it alike.
      if (out_.dtypes[w.half_out] != DataType::kInt8 || w.int8_inv_scale != s.alpha ||
          w.int8_zero_point != s.zero_point)
        continue;
    } else {
      const Shape shape = ShapeOf(w.out);  // a copy: NewTemp may move the shapes
      w.half_out = quantize ? s.out : NewTemp(shape, DataType::kInt8);
      w.int8_inv_scale = s.alpha;
      w.int8_zero_point = s.zero_point;
      writers.push_back(at);
    }
    if (quantize) {
      if (w.half_out != s.out) renamed[s.out] = w.half_out;
      drop[c] = true;
    } else {
      s.in[0] = w.half_out;
    }
  }
  for (GpuStep& s : steps)
    for (int& u : s.in)
      if (auto it = renamed.find(u); it != renamed.end()) u = it->second;
  // A writer whose fp32 result nothing reads now (its own in-place read counts: an fp32
  // epilogue reads what it rewrites) writes the int8 copy alone, where its kernel can: not
  // a product with an activation step (which rewrites the GEMM's output), nor a layer norm.
  for (int at : writers) {
    GpuStep& w = steps[at];
    const bool alone = w.kind == GpuStep::Kind::kConvEpilogue ||
                       (w.kind == GpuStep::Kind::kGemm && !w.post) || RoundsAlone(w.kind);
    if (alone && !ReadBesides(w.out, -1, -1, drop)) w.out = -1;
  }
  DropSteps(drop);
}

}  // namespace shoal::engine::cuda::internal

namespace shoal::engine::cuda {

std::string Int8Summary(const GpuLowering& l) {
  const size_t all = static_cast<size_t>(l.int8_products) + l.fp32_products.size();
  return std::to_string(l.int8_products) + " of " + std::to_string(all) +
         " products and convolutions in int8";
}

}  // namespace shoal::engine::cuda
