// LowerPlan (gpu_lowering.h) for int8 (GpuPlanOptions::int8_calibration): which products
// and convolutions run as int8 GEMMs, their inputs' quantisation, and the int8 GEMM step
// with its weights, scales and bias (quantize.h has the arithmetic).
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/cuda/quantize.h"

namespace shoal::engine::cuda::internal {
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

void Lowerer::AddInt8Gemm(GpuStep step, const Tensor& w, bool transposed, const std::string& w_key,
                          const Tensor* bias, const std::string& b_key, const Int8Input& in,
                          int out) {
  GemmOptions& g = step.gemm;
  step.int8_relu = g.epilogue == GemmEpilogue::kRelu || g.epilogue == GemmEpilogue::kBiasRelu;
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
  step.weight_slots = {
      AddBlob(int8_key, std::move(q.values)), bias_slot,
      AddBlob(int8_key + " scales/" + hex, Tensor::FromVector(DataType::kFp32, {g.n}, scale))};
  step.scratch = NewTemp({g.batch * g.m * g.n}, DataType::kInt32);
  step.out = out;
  ++out_.int8_products;
  out_.steps.push_back(std::move(step));
}

}  // namespace shoal::engine::cuda::internal

namespace shoal::engine::cuda {

std::string Int8Summary(const GpuLowering& l) {
  const size_t all = static_cast<size_t>(l.int8_products) + l.fp32_products.size();
  return std::to_string(l.int8_products) + " of " + std::to_string(all) +
         " products and convolutions in int8";
}

}  // namespace shoal::engine::cuda
