// int8 in the GPU plan's lowering (GpuPlanOptions::int8_calibration): which products and
// convolutions run as int8 GEMMs, what they read (one quantisation per value, im2col
// quantising), the weights and scales they are given, and which stay fp32 and why. Host
// only, runs everywhere; the kernels' arithmetic is checked against quantize.h's host
// reference on a device (quantize_test.cc, gemm_test.cc, gpu_plan_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/cuda/quantize.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::GraphBuilder;
using engine::testing::Random;
using ::testing::HasSubstr;

// How a kQuantize step quantises (the parts Int8ProductReference reads).
Int8Input InputOf(const GpuStep& quantize) {
  Int8Input in;
  in.inv_scale = quantize.alpha;
  in.scale = 1.f / quantize.alpha;
  in.zero_point = quantize.zero_point;
  return in;
}

std::vector<const GpuStep*> StepsOf(const GpuLowering& l, GpuStep::Kind kind) {
  std::vector<const GpuStep*> found;
  for (const GpuStep& s : l.steps)
    if (s.kind == kind) found.push_back(&s);
  return found;
}

// Two products of one input (TwoProductsOfOneInputGraph) prepared, and int8 options
// calibrated on four random batches in [-2, 3).
class LowerPlanInt8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    p = Prepare(Model::FromGraph(TwoProductsOfOneInputGraph()), {{32, 8}});
    ASSERT_TRUE(p.plan);
    options.int8_calibration = RandomInputRanges(*p.model, "x", {32, 8}, -2.f, 3.f);
  }
  Prepared p;
  GpuPlanOptions options;
};

TEST_F(LowerPlanInt8Test, ProductsQuantiseTheirInputOnceAndTheirWeightsPerColumn) {
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 2);
  EXPECT_THAT(l->fp32_products, ::testing::IsEmpty());
  // One quantisation of x, which both products read.
  const auto quantize = StepsOf(*l, GpuStep::Kind::kQuantize);
  ASSERT_EQ(quantize.size(), 1u);
  const int x = p.model->graph().inputs[0];
  EXPECT_EQ(quantize[0]->in[0], x);
  EXPECT_EQ(l->dtypes[quantize[0]->out], DataType::kInt8);
  const ValueRange& range = options.int8_calibration->at("x");
  const float sx = SymmetricScale(range.min, range.max);
  EXPECT_FLOAT_EQ(quantize[0]->alpha, 1.f / sx);

  const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
  ASSERT_EQ(gemms.size(), 2u);
  const Tensor w1 = Random({8, 24}, 71), b1 = Random({24}, 72), w2 = Random({16, 8}, 73);
  for (const GpuStep* g : gemms) {
    EXPECT_EQ(g->gemm.math, GemmMath::kInt8);
    EXPECT_TRUE(g->gemm.transpose_w);
    EXPECT_EQ(g->gemm.epilogue, GemmEpilogue::kNone);
    EXPECT_EQ(g->in[0], quantize[0]->out);
    ASSERT_GE(g->scratch, 0);
    EXPECT_EQ(l->dtypes[g->scratch], DataType::kInt32);
    int64_t sums = 1;
    for (int64_t d : l->shapes[g->scratch]) sums *= d;
    EXPECT_EQ(sums, g->gemm.m * g->gemm.n);
    ASSERT_EQ(g->weight_slots.size(), 3u);
    // The weight as QuantizeWeightColumns stores it, [n, k], whichever way the node holds it.
    const bool first = g->gemm.n == 24;
    const QuantizedWeight want = QuantizeWeightColumns(first ? w1 : w2, !first);
    const Tensor& stored = l->blobs[g->weight_slots[0]].data;
    ASSERT_EQ(stored.dtype(), DataType::kInt8);
    ASSERT_EQ(stored.shape(), (Shape{g->gemm.n, 8}));
    EXPECT_TRUE(std::equal(stored.values<int8_t>().begin(), stored.values<int8_t>().end(),
                           want.values.values<int8_t>().begin()));
    // Each column's scale is the input's times its own.
    const auto scales = l->blobs[g->weight_slots[2]].data.values<float>();
    ASSERT_EQ(static_cast<int64_t>(scales.size()), g->gemm.n);
    for (int64_t j = 0; j < g->gemm.n; ++j) EXPECT_FLOAT_EQ(scales[j], sx * want.scales[j]);
    // The first has its bias and ReLU in the scaling pass; the second neither.
    EXPECT_EQ(g->int8_relu, first);
    EXPECT_EQ(g->weight_slots[1] >= 0, first);
    if (first) {
      EXPECT_EQ(l->blobs[g->weight_slots[1]].data.values<float>()[3], b1.values<float>()[3]);
    }
  }
  ExpectAligned(*l);
}

// What the lowering stores, run by the host reference of the device's arithmetic, is the fp32
// model's result within int8's rounding: the weights' layout, the scales' composition and
// the bias all right.
TEST_F(LowerPlanInt8Test, TheStoredProductIsTheFp32ProductWithinInt8Rounding) {
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const Tensor x = Random({32, 8}, 901, -2.f, 3.f);  // one of RandomInputRanges' batches
  auto session = Session::Create(*p.model, engine::testing::Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*session)->Run({{"x", x}}, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  const auto xs = x.values<float>();
  const std::vector<float> xv(xs.begin(), xs.end());
  for (const GpuStep* g : StepsOf(*l, GpuStep::Kind::kGemm)) {
    QuantizedWeight w;
    w.values = l->blobs[g->weight_slots[0]].data;
    const auto sv = l->blobs[g->weight_slots[2]].data.values<float>();
    const std::vector<float> scale(sv.begin(), sv.end());
    const float* bias = g->weight_slots[1] >= 0
                            ? l->blobs[g->weight_slots[1]].data.values<float>().data()
                            : nullptr;
    const std::vector<float> y = Int8ProductReference(
        xv, g->gemm.m, g->gemm.k, InputOf(*StepsOf(*l, GpuStep::Kind::kQuantize)[0]), w, scale,
        bias, g->int8_relu);
    const Tensor& want = out[g->gemm.n == 24 ? 0 : 1].tensor;
    ASSERT_EQ(static_cast<int64_t>(y.size()), want.element_count());
    // Each term is off by at most |x|·sw/2 + |w|·sx/2 + sx·sw/4; over k = 8 terms of |x| <= 3
    // and |w| <= 1, well under 0.1.
    float largest = 0;
    for (size_t i = 0; i < y.size(); ++i)
      largest = std::max(largest, std::fabs(y[i] - want.values<float>()[i]));
    EXPECT_LT(largest, 0.1f) << "n = " << g->gemm.n;
    EXPECT_GT(largest, 0.f) << "int8 rounds; an exact match means fp32 ran";
  }
}

TEST(LowerPlanInt8GraphsTest, AProductInt8CannotTakeStaysFp32AndSaysWhy) {
  GraphBuilder b;
  const int x = b.Input("x", {32, 8});
  // n = 10: not a multiple of 8.
  const int narrow = b.Op("MatMul", "narrow", {x, b.Constant("w10", Random({8, 10}, 74))});
  // Both operands computed: attention's kind of product.
  const int square = b.Op("MatMul", "square", {x, b.Op("Transpose", "xt", {x})});
  // Its input, the Tanh's output, gets no range below.
  const int t = b.Op("Tanh", "t", {x});
  const int unranged = b.Op("MatMul", "unranged", {t, b.Constant("w8", Random({8, 8}, 75))});
  Prepared p =
      Prepare(Model::FromGraph(b.Finish(std::vector<int>{narrow, square, unranged})), {{32, 8}});
  ASSERT_TRUE(p.plan);
  auto ranges =
      std::make_shared<Calibration>(*RandomInputRanges(*p.model, "x", {32, 8}, -2.f, 3.f));
  ranges->erase("t");
  GpuPlanOptions options;
  options.int8_calibration = ranges;
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 0);
  ASSERT_EQ(l->fp32_products.size(), 3u);
  EXPECT_THAT(l->fp32_products[0], HasSubstr("k = 8 and n = 10 must be multiples of 8"));
  EXPECT_THAT(l->fp32_products[1], HasSubstr("int8 takes a constant 2-D weight"));
  EXPECT_THAT(l->fp32_products[2], HasSubstr("its input 't' has no calibrated range"));
  for (const GpuStep* g : StepsOf(*l, GpuStep::Kind::kGemm))
    EXPECT_EQ(g->gemm.math, GemmMath::kFp32);
  EXPECT_TRUE(StepsOf(*l, GpuStep::Kind::kQuantize).empty());
}

// In an identity block on cuDNN: the stem's 3 input channels (k = 27) keep it fp32 on cuDNN;
// the two 8-channel convolutions leave cuDNN for im2col quantising as it gathers and an
// int8 GEMM writing its int32 sums, and one epilogue each scales the sums, adds the bias,
// the activations and the residual and writes NCHW: no transpose, no other pass. The first's
// output, which only the second reads, is written in int8 alone, and the second gathers it.
TEST(LowerPlanInt8GraphsTest, ConvolutionsRunAsIm2ColInt8GemmsAndOneEpilogue) {
  Prepared p = Prepare(Model::FromGraph(IdentityBlockGraph(false, 8)), {{2, 3, 8, 8}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.conv = ConvEngine::kCudnn;
  options.int8_calibration = RandomInputRanges(*p.model, "x", {2, 3, 8, 8}, -2.f, 3.f);
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 2);
  ASSERT_EQ(l->fp32_products.size(), 1u);
  EXPECT_THAT(l->fp32_products[0], HasSubstr("k = c*kh*kw = 27"));
  ASSERT_EQ(StepsOf(*l, GpuStep::Kind::kConv).size(), 1u);  // the stem
  EXPECT_TRUE(StepsOf(*l, GpuStep::Kind::kTranspose).empty());
  EXPECT_TRUE(StepsOf(*l, GpuStep::Kind::kQuantize).empty());
  const auto cols = StepsOf(*l, GpuStep::Kind::kIm2Col);
  const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
  const auto epilogues = StepsOf(*l, GpuStep::Kind::kConvEpilogue);
  ASSERT_EQ(cols.size(), 2u);
  ASSERT_EQ(gemms.size(), 2u);
  ASSERT_EQ(epilogues.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(l->dtypes[cols[i]->out], DataType::kInt8);
    EXPECT_GT(cols[i]->alpha, 0.f);
    EXPECT_EQ(gemms[i]->in[0], cols[i]->out);
    EXPECT_EQ(gemms[i]->gemm.math, GemmMath::kInt8);
    EXPECT_EQ(gemms[i]->gemm.k, 72);
    EXPECT_EQ(l->blobs[gemms[i]->weight_slots[0]].data.shape(), (Shape{8, 72}));
    // Its sums, [n*oh*ow, m], are its output; the epilogue holds the scaling's blobs.
    EXPECT_EQ(l->dtypes[gemms[i]->out], DataType::kInt32);
    EXPECT_EQ(l->shapes[gemms[i]->out], (Shape{2 * 8 * 8, 8}));
    EXPECT_LT(gemms[i]->scratch, 0);
    EXPECT_EQ(gemms[i]->weight_slots[1], -1);
    EXPECT_EQ(gemms[i]->weight_slots[2], -1);
    const GpuStep& e = *epilogues[i];
    EXPECT_EQ(e.in[0], gemms[i]->out);
    EXPECT_TRUE(e.conv_epilogue.int32_sums);
    EXPECT_TRUE(e.conv_epilogue.source_channels_last);
    // Each reads a ReLU's output, never negative: zero point -128, so each has a bias blob
    // (its own bias less the zero point's share), and the scales.
    ASSERT_EQ(e.weight_slots.size(), 2u);
    EXPECT_GE(e.weight_slots[0], 0);
    ASSERT_GE(e.weight_slots[1], 0);
    EXPECT_EQ(l->blobs[e.weight_slots[1]].data.element_count(), 8);
    EXPECT_EQ(cols[i]->zero_point, -128);
  }
  // The first: its ReLU, and its output in int8 alone, which the second gathers.
  EXPECT_TRUE(epilogues[0]->conv_epilogue.act.has_value());
  EXPECT_EQ(epilogues[0]->in[1], -1);
  EXPECT_EQ(epilogues[0]->out, -1) << "nothing reads the first convolution's fp32 output";
  ASSERT_GE(epilogues[0]->half_out, 0);
  EXPECT_EQ(l->dtypes[epilogues[0]->half_out], DataType::kInt8);
  EXPECT_EQ(cols[1]->in[0], epilogues[0]->half_out);
  const ValueRange& a = options.int8_calibration->at("a.relu");
  EXPECT_EQ(a.min, 0.f);
  EXPECT_FLOAT_EQ(cols[1]->alpha, 255.f / a.max);
  EXPECT_EQ(epilogues[0]->int8_inv_scale, cols[1]->alpha);
  EXPECT_EQ(epilogues[0]->int8_zero_point, -128);
  // The second: the residual and the ReLU after it, fp32 into the graph's output.
  EXPECT_GE(epilogues[1]->in[1], 0) << "the residual";
  EXPECT_TRUE(epilogues[1]->conv_epilogue.post.has_value());
  EXPECT_EQ(epilogues[1]->out, p.model->graph().outputs[0]);
  EXPECT_EQ(epilogues[1]->half_out, -1);
  // The stem's output, which cuDNN writes, is quantised as the first convolution gathers it.
  EXPECT_EQ(l->dtypes[cols[0]->in[0]], DataType::kFp32);
  ExpectAligned(*l);
}

// Runs an int8 lowering's steps on the host as the device computes them (quantize.h's
// arithmetic; the epilogue's order, conv.h), for the step kinds an int8 chain of
// convolutions and products has: a ReLU, kQuantize, kIm2Col, kGemm in int8 and an epilogue of
// int32 sums. Returns the fp32 values of `output`.
std::vector<float> RunInt8OnHost(const GpuLowering& l, int input, const Tensor& x, int output) {
  std::map<int, std::vector<float>> f;
  std::map<int, std::vector<int8_t>> q;
  std::map<int, std::vector<int32_t>> sums;
  auto count = [&](int v) {
    int64_t c = 1;
    for (int64_t d : l.shapes[v]) c *= d;
    return static_cast<size_t>(c);
  };
  auto blob = [&](int64_t slot) {
    return slot >= 0 ? l.blobs[static_cast<size_t>(slot)].data.values<float>().data() : nullptr;
  };
  f[input].assign(x.values<float>().begin(), x.values<float>().end());
  // A value computed here, or a constant the lowering keeps in its blobs.
  auto value = [&](int v) -> std::vector<float> {
    if (auto it = f.find(v); it != f.end()) return it->second;
    EXPECT_EQ(l.values[v].home, GpuValue::Home::kWeights) << "value " << v << " never written";
    const auto w = l.blobs[static_cast<size_t>(l.values[v].offset)].data.values<float>();
    return {w.begin(), w.end()};
  };
  auto apply = [](UnaryOp op, float v) {
    EXPECT_TRUE(op == UnaryOp::kRelu || op == UnaryOp::kSigmoid);
    return op == UnaryOp::kRelu ? std::max(v, 0.f) : 1.f / (1.f + std::exp(-v));
  };
  // A step's results: into its fp32 output (unless -1), and quantised into its int8 copy.
  auto store = [&](const GpuStep& s, const std::vector<float>& y) {
    if (s.out >= 0) f[s.out] = y;
    if (s.half_out < 0) return;
    EXPECT_EQ(l.dtypes[s.half_out], DataType::kInt8);
    auto& copy = q[s.half_out];
    copy.clear();
    for (float v : y) copy.push_back(QuantizeValue(v, s.int8_inv_scale, s.int8_zero_point));
  };
  for (const GpuStep& s : l.steps) {
    switch (s.kind) {
      case GpuStep::Kind::kUnary: {
        std::vector<float> y = value(s.in[0]);
        for (float& v : y) v = apply(s.unary, v);
        store(s, y);
        break;
      }
      case GpuStep::Kind::kLayerNorm: {
        const std::vector<float> xv = value(s.in[0]), scale = value(s.in[1]),
                                 bias = s.in[2] >= 0 ? value(s.in[2]) : std::vector<float>();
        const size_t cols = static_cast<size_t>(s.dims.back());
        std::vector<float> y(xv.size());
        for (size_t r = 0; r < xv.size() / cols; ++r) {
          double mean = 0, var = 0;
          for (size_t c = 0; c < cols; ++c) mean += xv[r * cols + c];
          mean /= static_cast<double>(cols);
          for (size_t c = 0; c < cols; ++c)
            var += (xv[r * cols + c] - mean) * (xv[r * cols + c] - mean);
          var /= static_cast<double>(cols);
          for (size_t c = 0; c < cols; ++c)
            y[r * cols + c] = static_cast<float>((xv[r * cols + c] - mean) /
                                                     std::sqrt(var + s.epsilon) * scale[c] +
                                                 (bias.empty() ? 0.f : bias[c]));
        }
        store(s, y);
        break;
      }
      case GpuStep::Kind::kQuantize:
        for (float v : value(s.in[0])) q[s.out].push_back(QuantizeValue(v, s.alpha, s.zero_point));
        break;
      case GpuStep::Kind::kIm2Col: {
        EXPECT_EQ(l.dtypes[s.out], DataType::kInt8);
        const Window2d& g = s.window;
        const bool from_int8 = l.dtypes[s.in[0]] == DataType::kInt8;
        const std::vector<float> src = from_int8 ? std::vector<float>() : value(s.in[0]);
        auto& cols = q[s.out];
        for (int64_t row = 0; row < g.n * g.oh * g.ow; ++row) {
          const int64_t b = row / (g.oh * g.ow), oy = row / g.ow % g.oh, ox = row % g.ow;
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t iy = oy * g.sh - g.ph + ky * g.dh, ix = ox * g.sw - g.pw + kx * g.dw;
                const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
                const size_t at = static_cast<size_t>(((b * g.c + c) * g.h + iy) * g.w + ix);
                if (from_int8) {
                  cols.push_back(inside ? q.at(s.in[0])[at] : static_cast<int8_t>(s.zero_point));
                } else {
                  cols.push_back(QuantizeValue(inside ? src[at] : 0.f, s.alpha, s.zero_point));
                }
              }
        }
        break;
      }
      case GpuStep::Kind::kGemm: {
        EXPECT_EQ(s.gemm.math, GemmMath::kInt8);
        EXPECT_LT(s.in[3], 0) << "the host run has no product's residual";
        const auto w = l.blobs[static_cast<size_t>(s.weight_slots[0])].data.values<int8_t>();
        const std::vector<int8_t>& a = q.at(s.in[0]);
        const int64_t m = s.gemm.m, n = s.gemm.n, k = s.gemm.k;
        std::vector<int32_t> acc(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            int32_t sum = 0;
            for (int64_t t = 0; t < k; ++t) sum += int32_t{a[i * k + t]} * int32_t{w[j * k + t]};
            acc[static_cast<size_t>(i * n + j)] = sum;
          }
        if (l.dtypes[s.out] == DataType::kInt32) {
          sums[s.out] = std::move(acc);
          break;
        }
        const float* scale = blob(s.weight_slots[2]);
        const float* bias = blob(s.weight_slots[1]);
        std::vector<float> y(acc.size());
        for (size_t i = 0; i < acc.size(); ++i) {
          const size_t j = i % static_cast<size_t>(n);
          float v = static_cast<float>(acc[i]) * scale[j] + (bias ? bias[j] : 0.f);
          if (s.int8_relu) v = std::max(v, 0.f);
          if (s.post) v = apply(*s.post, v);  // its activation step, after the scaling
          y[i] = v;
        }
        store(s, y);
        break;
      }
      case GpuStep::Kind::kConvEpilogue: {
        const ConvEpilogueOptions& o = s.conv_epilogue;
        EXPECT_TRUE(o.int32_sums && o.source_channels_last);
        EXPECT_TRUE(!o.act || *o.act == UnaryOp::kRelu);
        EXPECT_TRUE(!o.post || *o.post == UnaryOp::kRelu);
        const std::vector<int32_t>& c = sums.at(s.in[0]);
        const std::vector<float> z = s.in[1] >= 0 ? value(s.in[1]) : std::vector<float>();
        const float* bias = blob(s.weight_slots[0]);
        const float* scale = blob(s.weight_slots[1]);
        const size_t total = static_cast<size_t>(o.n * o.m * o.spatial);
        if (s.out >= 0) f[s.out].assign(total, 0.f);
        if (s.half_out >= 0) q[s.half_out].assign(total, 0);
        for (int64_t b = 0; b < o.n; ++b)
          for (int64_t ch = 0; ch < o.m; ++ch)
            for (int64_t sp = 0; sp < o.spatial; ++sp) {
              const size_t nhwc = static_cast<size_t>((b * o.spatial + sp) * o.m + ch);
              const size_t nchw = static_cast<size_t>((b * o.m + ch) * o.spatial + sp);
              float v = static_cast<float>(c[nhwc]) * scale[ch];
              if (bias) v += bias[ch];
              if (o.act) v = std::max(v, 0.f);
              if (s.in[1] >= 0) v += z[nchw];
              if (o.post) v = std::max(v, 0.f);
              if (s.out >= 0) f[s.out][nchw] = v;
              if (s.half_out >= 0)
                q[s.half_out][nchw] = QuantizeValue(v, s.int8_inv_scale, s.int8_zero_point);
            }
        break;
      }
      default:
        ADD_FAILURE() << "the host run has no step of kind " << static_cast<int>(s.kind);
        return {};
    }
    if (s.out >= 0 && l.dtypes[s.out] == DataType::kFp32) {
      EXPECT_EQ(f[s.out].size(), count(s.out)) << "step of kind " << static_cast<int>(s.kind);
    }
  }
  return f.at(output);
}

// Runs `p`'s model on the CPU engine in fp32 and `l` (its int8 lowering) on the host as the
// device computes it, both on x (fed to the graph's one input), and expects the first
// output within int8's rounding of the fp32 result (5% of its largest value) and not equal
// to it (int8 rounds: an exact match means fp32 ran).
void ExpectHostRunNearFp32(const Prepared& p, const GpuLowering& l, const Tensor& x) {
  auto session = Session::Create(*p.model, engine::testing::Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<NamedTensor> want;
  const Graph& graph = p.model->graph();
  ASSERT_TRUE((*session)->Run({{graph.values[graph.inputs[0]].name, x}}, &want).ok());
  const std::vector<float> got = RunInt8OnHost(l, graph.inputs[0], x, graph.outputs[0]);
  ASSERT_EQ(static_cast<int64_t>(got.size()), want[0].tensor.element_count());
  float largest = 0, magnitude = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    largest = std::max(largest, std::fabs(got[i] - want[0].tensor.values<float>()[i]));
    magnitude = std::max(magnitude, std::fabs(want[0].tensor.values<float>()[i]));
  }
  EXPECT_LT(largest, 0.05f * magnitude) << "largest output " << magnitude;
  EXPECT_GT(largest, 0.f) << "int8 rounds; an exact match means fp32 ran";
}

// A chain of int8 convolutions on im2col, its first's output passed in int8 alone: what the
// lowering stores, run on the host as the device computes it, is the CPU engine's fp32
// result within int8's rounding (and not equal to it). So the sums' layout, the scales, the
// zero point in the padding of both gathers, the bias and the residual are all right.
TEST(LowerPlanInt8GraphsTest, AnInt8ChainOfConvolutionsIsTheFp32ModelWithinInt8Rounding) {
  Prepared p = Prepare(Model::FromGraph(Int8ConvChainGraph()), {{2, 8, 8, 8}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.conv = ConvEngine::kIm2Col;
  options.int8_calibration = RandomInputRanges(*p.model, "x", {2, 8, 8, 8}, -1.f, 1.f);
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 2);
  const auto cols = StepsOf(*l, GpuStep::Kind::kIm2Col);
  ASSERT_EQ(cols.size(), 2u);
  // r's ReLU step writes r in fp32 (the residual) and its int8 copy, which the first gathers;
  // the second gathers the first's epilogue's copy.
  const auto relu = StepsOf(*l, GpuStep::Kind::kUnary);
  ASSERT_EQ(relu.size(), 1u);
  EXPECT_GE(relu[0]->out, 0);
  ASSERT_GE(relu[0]->half_out, 0);
  EXPECT_EQ(cols[0]->in[0], relu[0]->half_out);
  EXPECT_EQ(l->dtypes[cols[1]->in[0]], DataType::kInt8);
  EXPECT_TRUE(StepsOf(*l, GpuStep::Kind::kQuantize).empty());

  const Tensor x = Random({2, 8, 8, 8}, 902, -1.f, 1.f);  // one of the calibration batches
  ExpectHostRunNearFp32(p, *l, x);
}

// An MLP: a product with its ReLU whose output another int8 product alone reads writes that
// output in int8 alone, in its scaling pass (no kQuantize of it); one whose output is also
// the graph's writes both. Either way the host run is the fp32 model within int8 rounding.
TEST(LowerPlanInt8GraphsTest, AProductReadOnlyByAnInt8ProductWritesItInInt8) {
  for (const bool hidden_is_output : {false, true}) {
    SCOPED_TRACE(hidden_is_output ? "the hidden layer is an output too" : "hidden layer alone");
    GraphBuilder b;
    const int x = b.Input("x", {32, 8});
    const int h = b.Op("Relu", "h",
                       {b.Op("Add", "h.add",
                             {b.Op("MatMul", "h.mm", {x, b.Constant("w1", Random({8, 16}, 81))}),
                              b.Constant("b1", Random({16}, 82))})});
    const int y = b.Op("MatMul", "y", {h, b.Constant("w2", Random({16, 8}, 83))});
    Graph graph = hidden_is_output ? b.Finish(std::vector<int>{y, h}) : b.Finish(y);
    Prepared p = Prepare(Model::FromGraph(std::move(graph)), {{32, 8}});
    ASSERT_TRUE(p.plan);
    GpuPlanOptions options;
    options.int8_calibration = RandomInputRanges(*p.model, "x", {32, 8}, -2.f, 3.f);
    auto l = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->int8_products, 2);
    const auto quantize = StepsOf(*l, GpuStep::Kind::kQuantize);
    ASSERT_EQ(quantize.size(), 1u) << "x's alone";
    EXPECT_EQ(quantize[0]->in[0], p.model->graph().inputs[0]);
    const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
    ASSERT_EQ(gemms.size(), 2u);
    const GpuStep& first = *gemms[0];
    EXPECT_TRUE(first.int8_relu);
    ASSERT_GE(first.half_out, 0);
    EXPECT_EQ(gemms[1]->in[0], first.half_out);
    const ValueRange& range = options.int8_calibration->at("h");
    EXPECT_FLOAT_EQ(first.int8_inv_scale, 255.f / range.max);
    EXPECT_EQ(first.int8_zero_point, -128);
    if (hidden_is_output) {
      EXPECT_GE(first.out, 0) << "h is the graph's second output";
    } else {
      EXPECT_EQ(first.out, -1);
    }
    EXPECT_EQ(gemms[1]->half_out, -1);

    const Tensor xt = Random({32, 8}, 903, -2.f, 3.f);  // one of the calibration batches
    ExpectHostRunNearFp32(p, *l, xt);
  }
}

// A product's activation step after its scaling (a Sigmoid) and a layer normalisation
// each write their result's int8 copy for the int8 product after them, beside the fp32
// (neither can write the copy alone); only the graph's input has a kQuantize. The host run
// is the fp32 model within int8's rounding.
TEST(LowerPlanInt8GraphsTest, AnActivationAndALayerNormWriteTheInt8CopyTheirProductReads) {
  GraphBuilder b;
  const int x = b.Input("x", {32, 16});
  const int s = b.Op("Sigmoid", "s",
                     {b.Op("Add", "s.add",
                           {b.Op("MatMul", "s.mm", {x, b.Constant("w1", Random({16, 32}, 91))}),
                            b.Constant("b1", Random({32}, 92))})});
  const int h = b.Op("MatMul", "h", {s, b.Constant("w2", Random({32, 16}, 93))});
  const int n = b.Op(
      "LayerNormalization", "n",
      {h, b.Constant("gamma", Random({16}, 94, 0.5f, 1.5f)), b.Constant("beta", Random({16}, 95))},
      {{"axis", engine::testing::AInt(-1)}});
  const int y = b.Op("MatMul", "y", {n, b.Constant("w3", Random({16, 8}, 96))});
  Prepared p = Prepare(Model::FromGraph(b.Finish(y)), {{32, 16}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.int8_calibration = RandomInputRanges(*p.model, "x", {32, 16}, -2.f, 2.f);
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 3);
  const auto quantize = StepsOf(*l, GpuStep::Kind::kQuantize);
  ASSERT_EQ(quantize.size(), 1u) << "x's alone";
  EXPECT_EQ(quantize[0]->in[0], p.model->graph().inputs[0]);
  const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
  const auto norms = StepsOf(*l, GpuStep::Kind::kLayerNorm);
  ASSERT_EQ(gemms.size(), 3u);
  ASSERT_EQ(norms.size(), 1u);
  // The Sigmoid follows the first product's scaling; its copy is what the second reads.
  ASSERT_TRUE(gemms[0]->post.has_value());
  EXPECT_EQ(*gemms[0]->post, UnaryOp::kSigmoid);
  ASSERT_GE(gemms[0]->half_out, 0);
  EXPECT_GE(gemms[0]->out, 0) << "the activation rewrites the product's fp32 output";
  EXPECT_EQ(gemms[1]->in[0], gemms[0]->half_out);
  // The layer norm reads the second's fp32 and writes the copy the third reads.
  ASSERT_GE(norms[0]->half_out, 0);
  EXPECT_GE(norms[0]->out, 0);
  EXPECT_EQ(gemms[2]->in[0], norms[0]->half_out);
  const ValueRange& range = options.int8_calibration->at("n");
  EXPECT_EQ(norms[0]->int8_zero_point, range.min >= 0 ? -128 : 0);

  const Tensor xt = Random({32, 16}, 901, -2.f, 2.f);  // one of the calibration batches
  ExpectHostRunNearFp32(p, *l, xt);
}

// A ReLU's output read by a product: quantised with zero point -128 over [0, max], its 256
// levels shifted into s8, the shift's share of the sums taken out of the stored bias; what
// the lowering stores, run by the host reference, is the fp32 product within the rounding
// of 256 levels.
TEST(LowerPlanInt8GraphsTest, AReluOutputIsQuantisedWithAllEightBits) {
  GraphBuilder b;
  const int x = b.Input("x", {32, 8});
  const int r = b.Op("Relu", "r", {x});
  const int y = b.Op("Add", "y",
                     {b.Op("MatMul", "rw", {r, b.Constant("w", Random({8, 16}, 79))}),
                      b.Constant("b", Random({16}, 80))});
  Prepared p = Prepare(Model::FromGraph(b.Finish(y)), {{32, 8}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.int8_calibration = RandomInputRanges(*p.model, "x", {32, 8}, -2.f, 3.f);
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  // The ReLU's step writes r's int8 copy alone (only the product reads r), no kQuantize.
  EXPECT_TRUE(StepsOf(*l, GpuStep::Kind::kQuantize).empty());
  const auto relu = StepsOf(*l, GpuStep::Kind::kUnary);
  ASSERT_EQ(relu.size(), 1u);
  EXPECT_EQ(relu[0]->out, -1);
  ASSERT_GE(relu[0]->half_out, 0);
  const ValueRange& range = options.int8_calibration->at("r");
  EXPECT_EQ(range.min, 0.f);
  EXPECT_EQ(relu[0]->int8_zero_point, -128);
  EXPECT_FLOAT_EQ(relu[0]->int8_inv_scale, 255.f / range.max);
  Int8Input copy;  // how r is quantised
  copy.inv_scale = relu[0]->int8_inv_scale;
  copy.scale = 1.f / copy.inv_scale;
  copy.zero_point = relu[0]->int8_zero_point;
  const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
  ASSERT_EQ(gemms.size(), 1u);
  const GpuStep& g = *gemms[0];
  QuantizedWeight w;
  w.values = l->blobs[g.weight_slots[0]].data;
  const auto sv = l->blobs[g.weight_slots[2]].data.values<float>();
  const std::vector<float> scale(sv.begin(), sv.end());
  const Tensor bias = Random({16}, 80);
  const std::vector<float> want_bias = Int8Bias(w, scale, -128, bias.values<float>().data());
  ASSERT_GE(g.weight_slots[1], 0);
  const auto stored = l->blobs[g.weight_slots[1]].data.values<float>();
  ASSERT_EQ(stored.size(), want_bias.size());
  for (size_t j = 0; j < want_bias.size(); ++j) EXPECT_FLOAT_EQ(stored[j], want_bias[j]);
  EXPECT_NE(stored[0], bias.values<float>()[0]) << "the zero point's share was taken out";

  const Tensor xt = Random({32, 8}, 902, -2.f, 3.f);  // one of RandomInputRanges' batches
  auto session = Session::Create(*p.model, engine::testing::Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*session)->Run({{"x", xt}}, &out).ok());
  // The reference quantises the product's input, the ReLU's output.
  std::vector<float> rv;
  for (float v : xt.values<float>()) rv.push_back(std::max(v, 0.f));
  const std::vector<float> got =
      Int8ProductReference(rv, g.gemm.m, g.gemm.k, copy, w, scale, stored.data(), g.int8_relu);
  float largest = 0;
  for (size_t i = 0; i < got.size(); ++i)
    largest = std::max(largest, std::fabs(got[i] - out[0].tensor.values<float>()[i]));
  // Over k = 8 terms of |x| <= 3, sx = 3/255 and |w| <= 1: under 0.05.
  EXPECT_LT(largest, 0.05f);
  EXPECT_GT(largest, 0.f);
}

// A product of fewer rows than int8_min_rows (17 by default) stays fp32, saying so; one
// whose k could overflow the int32 sums too.
TEST(LowerPlanInt8GraphsTest, FewRowsOrAHugeKStayFp32) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 8});
  const int y = b.Op("MatMul", "y", {x, b.Constant("w", Random({8, 8}, 76))});
  Prepared p = Prepare(Model::FromGraph(b.Finish(y)), {{4, 8}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.int8_calibration = RandomInputRanges(*p.model, "x", {4, 8}, -2.f, 3.f);
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 0);
  ASSERT_EQ(l->fp32_products.size(), 1u);
  EXPECT_THAT(l->fp32_products[0], HasSubstr("4 rows, fewer than the 17 an int8 product takes"));
  options.int8_min_rows = 4;
  l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->int8_products, 1);

  GraphBuilder huge;
  const int hx = huge.Input("x", {32, 133200});
  const int hy = huge.Op("MatMul", "y", {hx, huge.Constant("w", Random({133200, 8}, 77))});
  Prepared hp = Prepare(Model::FromGraph(huge.Finish(hy)), {{32, 133200}});
  ASSERT_TRUE(hp.plan);
  options.int8_calibration =
      std::make_shared<const Calibration>(Calibration{{"x", ValueRange{-1.f, 1.f}}});
  auto hl = LowerPlan(hp.model->graph(), *hp.plan, options);
  ASSERT_TRUE(hl.ok()) << hl.status().ToString();
  ASSERT_EQ(hl->fp32_products.size(), 1u);
  EXPECT_THAT(hl->fp32_products[0], HasSubstr("k = 133200 could overflow int8's int32 sums"));
}

// One constant read by a MatMul as [k, n] and by a Gemm with transB as [n, k]: each product
// gets the constant quantised along its own output columns, under keys of their own.
TEST(LowerPlanInt8GraphsTest, OneWeightReadInBothLayoutsIsQuantisedForEach) {
  GraphBuilder b;
  const int x = b.Input("x", {32, 8});
  const int w = b.Constant("w", Random({8, 8}, 78));
  const int a = b.Op("MatMul", "a", {x, w});
  const int t = b.Op("Gemm", "t", {x, w}, {{"transB", engine::testing::AInt(1)}});
  Prepared p = Prepare(Model::FromGraph(b.Finish(std::vector<int>{a, t})), {{32, 8}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.int8_calibration = RandomInputRanges(*p.model, "x", {32, 8}, -2.f, 3.f);
  auto l = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
  ASSERT_EQ(gemms.size(), 2u);
  ASSERT_NE(gemms[0]->weight_slots[0], gemms[1]->weight_slots[0]);
  ASSERT_NE(gemms[0]->weight_slots[2], gemms[1]->weight_slots[2]);
  const Tensor wt = Random({8, 8}, 78);
  for (const GpuStep* g : gemms) {
    const bool matmul = p.model->graph().nodes[g->node].op_type.find("MatMul") != std::string::npos;
    const QuantizedWeight want = QuantizeWeightColumns(wt, !matmul);
    const auto stored = l->blobs[g->weight_slots[0]].data.values<int8_t>();
    EXPECT_TRUE(std::equal(stored.begin(), stored.end(), want.values.values<int8_t>().begin()))
        << (matmul ? "the MatMul's" : "the Gemm's");
  }
}

TEST_F(LowerPlanInt8Test, Int8KeepsTheOtherProductsFp32AndIsNotAMath) {
  options.math = GemmMath::kFp16;
  auto mixed = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
  options.int8_calibration = nullptr;
  options.math = GemmMath::kInt8;
  auto as_math = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_FALSE(as_math.ok());
  EXPECT_EQ(as_math.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::engine::cuda
