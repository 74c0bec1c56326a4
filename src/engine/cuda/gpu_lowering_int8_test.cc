// int8 in the GPU plan's lowering (GpuPlanOptions::int8_calibration): which products and
// convolutions run as int8 GEMMs, what they read (one quantisation per value, im2col
// quantising), the weights and scales they are given, and which stay fp32 and why. Host
// only, runs everywhere; the kernels' arithmetic is checked against quantize.h's host
// reference on a device (quantize_test.cc, gemm_test.cc, gpu_plan_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
// int8 GEMM, the second's residual and ReLU after, as in fp32.
TEST(LowerPlanInt8GraphsTest, ConvolutionsRunAsQuantisingIm2ColAndInt8Gemms) {
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
  const auto cols = StepsOf(*l, GpuStep::Kind::kIm2Col);
  ASSERT_EQ(cols.size(), 2u);
  const auto gemms = StepsOf(*l, GpuStep::Kind::kGemm);
  ASSERT_EQ(gemms.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(l->dtypes[cols[i]->out], DataType::kInt8);
    EXPECT_GT(cols[i]->alpha, 0.f);
    EXPECT_EQ(gemms[i]->in[0], cols[i]->out);
    EXPECT_EQ(gemms[i]->gemm.math, GemmMath::kInt8);
    EXPECT_EQ(gemms[i]->gemm.k, 72);
    EXPECT_EQ(l->blobs[gemms[i]->weight_slots[0]].data.shape(), (Shape{8, 72}));
  }
  // The first's ReLU is in its scaling pass; the second's residual and ReLU in an epilogue.
  EXPECT_TRUE(gemms[0]->int8_relu);
  EXPECT_FALSE(gemms[1]->int8_relu);
  const auto epilogues = StepsOf(*l, GpuStep::Kind::kConvEpilogue);
  ASSERT_EQ(epilogues.size(), 1u);
  EXPECT_GE(epilogues[0]->in[1], 0) << "the residual";
  // Each reads a ReLU's output, never negative: 256 levels, zero point -128, the scale from
  // its range.
  const ValueRange& a = options.int8_calibration->at("a.relu");
  EXPECT_EQ(a.min, 0.f);
  EXPECT_FLOAT_EQ(cols[1]->alpha, 255.f / a.max);
  EXPECT_EQ(cols[0]->zero_point, -128);
  EXPECT_EQ(cols[1]->zero_point, -128);
  // So each has a bias blob, its own bias (or none) less the zero point's share.
  EXPECT_GE(gemms[0]->weight_slots[1], 0);
  EXPECT_GE(gemms[1]->weight_slots[1], 0);
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
  const auto quantize = StepsOf(*l, GpuStep::Kind::kQuantize);
  ASSERT_EQ(quantize.size(), 1u);
  const ValueRange& range = options.int8_calibration->at("r");
  EXPECT_EQ(range.min, 0.f);
  EXPECT_EQ(quantize[0]->zero_point, -128);
  EXPECT_FLOAT_EQ(quantize[0]->alpha, 255.f / range.max);
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
  const std::vector<float> got = Int8ProductReference(rv, g.gemm.m, g.gemm.k, InputOf(*quantize[0]),
                                                      w, scale, stored.data(), g.int8_relu);
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
