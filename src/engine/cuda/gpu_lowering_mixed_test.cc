// Mixed precision (fp16 and bf16) in the GPU plan's lowering (gpu_lowering.h): what each
// product reads rounded to 16 bits, which step makes each rounding (a kToHalf step, or the
// step that wrote the value, in its own pass), and which fp32 results stay. Host only, runs
// everywhere; runs on a device are in gpu_plan_test.cc. Convolutions' roundings are in
// gpu_lowering_conv_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::GraphBuilder;
using engine::testing::Random;

// A product writes its output in 16 bits itself only when the next product's rounding is
// all that reads it: not when an activation runs after its epilogue (a Sigmoid), another
// step reads it too (an Add), it is a graph output, or a residual is added after it. Then
// it writes fp32 and a kToHalf step rounds what the next product reads, except after an
// activation, which rounds its own result for the next product in its pass (unless a
// residual is added after it).
Graph ProductThenProductGraph(const std::string& between) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 8});
  const int w1 = b.Constant("w1", Random({8, 16}, 81));
  const int b1 = b.Constant("b1", Random({16}, 82));
  const int w2 = b.Constant("w2", Random({16, 4}, 83));
  int y = b.Op("Add", "y", {b.Op("MatMul", "xw", {x, w1}), b1});
  std::vector<int> outputs;
  if (between == "sigmoid" || between == "sigmoid, residual") y = b.Op("Sigmoid", "act", {y});
  if (between == "residual" || between == "sigmoid, residual") {
    // A computed residual, which the optimiser fuses into a product.
    const int w3 = b.Constant("w3", Random({8, 16}, 84));
    y = b.Op("Add", "res", {y, b.Op("MatMul", "xv", {x, w3})});
  }
  if (between == "output") outputs.push_back(y);
  if (between == "another reader") outputs.push_back(b.Op("Neg", "neg", {y}));
  outputs.insert(outputs.begin(), b.Op("MatMul", "out", {y, w2}));
  return b.Finish(outputs);
}

TEST(LowerPlanTest, AProductKeepsItsFp32OutputUnlessOnlyTheNextProductReadsIt) {
  for (const char* between :
       {"nothing", "sigmoid", "residual", "sigmoid, residual", "output", "another reader"}) {
    SCOPED_TRACE(between);
    Prepared p = Prepare(Model::FromGraph(ProductThenProductGraph(between)), {{4, 8}});
    ASSERT_TRUE(p.plan);
    GpuPlanOptions options;
    options.math = GemmMath::kFp16;
    auto l = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    std::vector<const GpuStep*> gemms;
    int roundings = 0;
    for (const GpuStep& s : l->steps) {
      if (s.kind == GpuStep::Kind::kGemm) gemms.push_back(&s);
      roundings += s.kind == GpuStep::Kind::kToHalf;
    }
    const bool residual = std::string(between).find("residual") != std::string::npos;
    ASSERT_EQ(gemms.size(), residual ? 3u : 2u);
    const GpuStep* first = gemms[gemms.size() - 2];  // the product the last one reads
    const GpuStep* last = gemms.back();
    if (residual) {
      ASSERT_GE(first->in[3], 0) << "the optimiser did not fuse the residual";
    }
    if (std::string(between) == "sigmoid, residual") {
      // The residual is added after the activation: what the next product reads is the sum.
      ASSERT_TRUE(first->post.has_value()) << "the optimiser did not fuse the activation";
    }
    const bool fused = std::string(between) == "nothing";
    const bool activation = std::string(between) == "sigmoid";
    EXPECT_EQ(first->gemm.fp32_output, !fused);
    EXPECT_EQ(l->dtypes[first->out], fused ? DataType::kFp16 : DataType::kFp32);
    // x's, and the first product's output's unless it or its activation rounds it.
    EXPECT_EQ(roundings, fused || activation ? 1 : 2);
    EXPECT_EQ(first->half_out >= 0, activation);
    if (activation) {
      EXPECT_TRUE(first->post.has_value());
      EXPECT_EQ(last->in[0], first->half_out);
    }
    EXPECT_EQ(l->dtypes[last->in[0]], DataType::kFp16);
    EXPECT_TRUE(last->gemm.fp32_output);  // the graph's output
    for (const GpuStep* g : gemms) {
      if (g->post || g->in[3] >= 0) {
        EXPECT_TRUE(g->gemm.fp32_output);
      }
    }
    ExpectAligned(*l);
  }
}

// An element-wise activation or sum that only a product reads (Tanh of the input, or the
// input plus a broadcast constant, then MatMul) rounds its result for it in its own pass and
// writes no fp32, also when the product reads it through a Reshape (the rounding then has
// the view's shape); when the graph returns it too, it writes both. In fp32 and TF32 nothing
// is rounded.
TEST(LowerPlanTest, AnActivationRoundsItsResultForTheProductAfterIt) {
  for (const auto& [op, variant] :
       {std::pair{"Tanh", "alone"}, std::pair{"Tanh", "output"}, std::pair{"Tanh", "view"},
        std::pair{"Add", "alone"}, std::pair{"Add", "output"}, std::pair{"Add", "view"}}) {
    SCOPED_TRACE(std::string(op) + ", " + variant);
    const bool also_output = std::string(variant) == "output";
    Prepared p = Prepare(Model::FromGraph(ActivationThenProductGraph(variant, op)), {{4, 8}});
    ASSERT_TRUE(p.plan);
    const auto kind = std::string(op) == "Add" ? GpuStep::Kind::kBinary : GpuStep::Kind::kUnary;
    for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16, GemmMath::kTf32}) {
      GpuPlanOptions options;
      options.math = math;
      auto l = LowerPlan(p.model->graph(), *p.plan, options);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      ASSERT_EQ(l->steps.size(), 2u);
      ASSERT_EQ(l->steps[0].kind, kind);
      ASSERT_EQ(l->steps[1].kind, GpuStep::Kind::kGemm);
      const GpuStep& tanh = l->steps[0];
      const GpuStep& product = l->steps[1];
      if (math == GemmMath::kTf32) {
        EXPECT_EQ(tanh.half_out, -1);
        EXPECT_EQ(tanh.out, p.model->graph().nodes[tanh.node].outputs[0]);
        EXPECT_EQ(l->dtypes[product.in[0]], DataType::kFp32);
        continue;
      }
      ASSERT_GE(tanh.half_out, 0);
      EXPECT_EQ(l->dtypes[tanh.half_out], HalfDtypeOf(math));
      EXPECT_EQ(product.in[0], tanh.half_out);
      EXPECT_EQ(l->shapes[tanh.half_out],
                std::string(variant) == "view" ? Shape({2, 16}) : Shape({4, 8}));
      EXPECT_EQ(tanh.out, also_output ? p.model->graph().outputs[1] : -1);
      ExpectAligned(*l);
    }
  }
}

// A binary step that updates its output in place (Max of three: a copy, then two folds into
// it) and is the last to write what a product reads rounds it in its pass, and keeps its fp32
// result, which it reads itself.
TEST(LowerPlanTest, AnInPlaceBinaryStepRoundsItsResultAndKeepsIt) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 8}), y = b.Input("y", {4, 8}), z = b.Input("z", {4, 8});
  const int most = b.Op("Max", "most", {x, y, z});
  Graph g = b.Finish(b.Op("MatMul", "out", {most, b.Constant("w", Random({8, 4}, 87))}));
  Prepared p = Prepare(Model::FromGraph(std::move(g)), {{4, 8}, {4, 8}, {4, 8}});
  ASSERT_TRUE(p.plan);
  for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
    GpuPlanOptions options;
    options.math = math;
    auto l = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ASSERT_GE(l->steps.size(), 2u);
    const GpuStep& fold = l->steps[l->steps.size() - 2];
    const GpuStep& product = l->steps.back();
    ASSERT_EQ(fold.kind, GpuStep::Kind::kBinary);
    ASSERT_EQ(product.kind, GpuStep::Kind::kGemm);
    EXPECT_EQ(fold.in[0], fold.out);  // in place
    EXPECT_GE(fold.out, 0);
    ASSERT_GE(fold.half_out, 0);
    EXPECT_EQ(l->dtypes[fold.half_out], HalfDtypeOf(math));
    EXPECT_EQ(product.in[0], fold.half_out);
    for (const GpuStep& s : l->steps) EXPECT_NE(s.kind, GpuStep::Kind::kToHalf);
  }
}

// Mixed precision: the model's input is rounded to 16 bits by a kToHalf step into a 16-bit
// temporary, the constant weights are stored in 16 bits under their own keys. The
// recommender's products chain: each of the first three writes its output in 16 bits
// itself, with a 16-bit bias, for the next to read (no kToHalf between them); the last
// writes the fp32 output with its fp32 bias. The fp32 biases no product reads are not kept.
TEST(LowerPlanTest, MixedPrecisionRoundsEachProductsInputAndStoresWeightsIn16Bits) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(p.plan);
  auto fp32 = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
  GpuPlanOptions options;
  options.math = GemmMath::kFp16;
  auto lowered = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  using K = GpuStep::Kind;
  ASSERT_EQ(lowered->steps.size(), 5u);
  const GpuStep& cast = lowered->steps[0];
  ASSERT_EQ(cast.kind, K::kToHalf);
  EXPECT_EQ(lowered->dtypes[cast.out], DataType::kFp16);
  EXPECT_EQ(lowered->shapes[cast.out], lowered->shapes[cast.in[0]]);
  int operand = cast.out;
  for (size_t i = 1; i < 5; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const GpuStep& gemm = lowered->steps[i];
    ASSERT_EQ(gemm.kind, K::kGemm);
    EXPECT_EQ(gemm.in[0], operand);
    EXPECT_EQ(gemm.gemm.math, GemmMath::kFp16);
    const GpuLowering::Blob& w = lowered->blobs[gemm.weight_slots[0]];
    EXPECT_EQ(w.data.dtype(), DataType::kFp16);
    EXPECT_THAT(w.key, ::testing::EndsWith("~fp16"));
    const GpuLowering::Blob& bias = lowered->blobs[gemm.weight_slots[1]];
    const bool last = i == 4;
    EXPECT_EQ(gemm.gemm.fp32_output, last);
    EXPECT_EQ(lowered->dtypes[gemm.out], last ? DataType::kFp32 : DataType::kFp16);
    EXPECT_EQ(bias.data.dtype(), last ? DataType::kFp32 : DataType::kFp16);
    // The 16-bit bias is the fp32 one rounded.
    const Tensor& b32 = fp32->blobs[fp32->steps[i - 1].weight_slots[1]].data;
    ASSERT_EQ(bias.data.element_count(), b32.element_count());
    if (!last) {
      EXPECT_THAT(bias.key, ::testing::EndsWith("~fp16"));
      const auto* b16 = static_cast<const uint16_t*>(bias.data.data());
      for (int64_t k = 0; k < b32.element_count(); ++k)
        EXPECT_EQ(b16[k], FloatToFp16(b32.values<float>()[k])) << "bias element " << k;
    }
    EXPECT_EQ(lowered->shapes[gemm.out], fp32->shapes[fp32->steps[i - 1].out]);
    operand = gemm.out;
  }
  EXPECT_EQ(lowered->steps[4].out, p.model->graph().outputs[0]);
  // The first weight's values, rounded.
  const Tensor& w16 = lowered->blobs[lowered->steps[1].weight_slots[0]].data;
  const Tensor& w32 = fp32->blobs[fp32->steps[0].weight_slots[0]].data;
  ASSERT_EQ(w16.shape(), w32.shape());
  const auto* bits = static_cast<const uint16_t*>(w16.data());
  for (int64_t i = 0; i < 16; ++i)
    EXPECT_EQ(bits[i], FloatToFp16(w32.values<float>()[i])) << "element " << i;
  // Weights and the three rounded biases take half the bytes, the last bias as before;
  // eight blobs, as in fp32 (no fp32 bias left behind).
  int64_t bias_bytes = 0, last_bias = 0;
  for (const GpuStep& s : fp32->steps) {
    last_bias = fp32->blobs[s.weight_slots[1]].data.byte_size();
    bias_bytes += last_bias;
  }
  EXPECT_EQ(lowered->weight_bytes, (fp32->weight_bytes - last_bias) / 2 + last_bias);
  EXPECT_EQ(lowered->blobs.size(), fp32->blobs.size());
  int64_t counted = 0;
  for (const GpuLowering::Blob& b : lowered->blobs) counted += b.data.byte_size();
  EXPECT_EQ(counted, lowered->weight_bytes);
  EXPECT_GT(bias_bytes, last_bias);
  ExpectAligned(*lowered);
}

// A convolution's im2col writes the 16-bit columns itself; attention's products of two
// computed tensors round both.
TEST(LowerPlanTest, MixedPrecisionIm2ColWrites16BitColumnsAndBatchedProductsRoundBothOperands) {
  Prepared ic = Prepare(Model::Load(Example("image_classifier")), {{2, 3, 32, 32}});
  ASSERT_TRUE(ic.plan);
  GpuPlanOptions options;
  options.math = GemmMath::kBf16;
  auto conv = LowerPlan(ic.model->graph(), *ic.plan, options);
  ASSERT_TRUE(conv.ok()) << conv.status().ToString();
  int im2col = 0;
  for (size_t i = 0; i < conv->steps.size(); ++i) {
    const GpuStep& s = conv->steps[i];
    if (s.kind != GpuStep::Kind::kIm2Col) continue;
    ++im2col;
    EXPECT_EQ(conv->dtypes[s.out], DataType::kBf16);
    ASSERT_LT(i + 1, conv->steps.size());
    EXPECT_EQ(conv->steps[i + 1].kind, GpuStep::Kind::kGemm);
    EXPECT_EQ(conv->steps[i + 1].in[0], s.out);
    EXPECT_EQ(conv->blobs[conv->steps[i + 1].weight_slots[0]].data.dtype(), DataType::kBf16);
  }
  EXPECT_EQ(im2col, 4);
  ExpectAligned(*conv);

  Prepared text = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
  ASSERT_TRUE(text.plan);
  options.math = GemmMath::kFp16;
  auto attention = LowerPlan(text.model->graph(), *text.plan, options);
  ASSERT_TRUE(attention.ok()) << attention.status().ToString();
  // Every GEMM operand is a rounding made before it: by a kToHalf step, or by the step that
  // wrote the value, in the same pass (its half_out), which then needs no kToHalf step: a
  // layer normalisation, the feed-forward product whose exact GELU runs after its epilogue,
  // the transposes into and out of heads, the softmax of the scores, the pooling
  // ReduceMean and the sum of the embeddings. Each rounding is read; a step that rounds writes no
  // fp32 unless something else reads it.
  std::vector<int> halves;  // 16-bit values written so far
  std::set<int> read;
  std::map<GpuStep::Kind, int> by;  // roundings made in a step's own pass, by its kind
  int batched = 0, roundings = 0;
  for (const GpuStep& s : attention->steps) {
    if (s.kind == GpuStep::Kind::kToHalf) {
      halves.push_back(s.out);
      ++roundings;
    }
    if (s.half_out >= 0) {
      ++by[s.kind];
      EXPECT_EQ(attention->dtypes[s.half_out], DataType::kFp16);
      halves.push_back(s.half_out);
      if (s.kind == GpuStep::Kind::kLayerNorm || s.kind == GpuStep::Kind::kBinary) {
        EXPECT_GE(s.out, 0);  // its fp32 result stays: the residual reads it
      }
      if (s.kind == GpuStep::Kind::kTranspose || s.kind == GpuStep::Kind::kSoftmax ||
          s.kind == GpuStep::Kind::kReduce) {
        EXPECT_EQ(s.out, -1);  // only the products read them
      }
      if (s.kind == GpuStep::Kind::kGemm) {
        EXPECT_EQ(s.post, UnaryOp::kGelu);
        EXPECT_EQ(s.in[3], -1);
      }
    }
    if (s.kind != GpuStep::Kind::kGemm) continue;
    for (int k : {0, 1}) {
      if (s.in[k] < 0) continue;
      read.insert(s.in[k]);
      EXPECT_NE(std::find(halves.begin(), halves.end(), s.in[k]), halves.end())
          << "a GEMM operand not rounded before it";
    }
    batched += s.gemm.batch > 1;
    if (!s.gemm.fp32_output) halves.push_back(s.out);
  }
  for (int h : halves) EXPECT_TRUE(read.count(h)) << "a rounding nothing reads: " << h;
  EXPECT_EQ(batched, 4);
  using K = GpuStep::Kind;
  EXPECT_EQ(by[K::kLayerNorm], 3);  // the three LayerNormalizations, each before a product
  EXPECT_EQ(by[K::kGemm], 2);       // each layer's first feed-forward product
  EXPECT_EQ(by[K::kTranspose], 8);  // each layer's Q, K and V, and its heads' outputs
  EXPECT_EQ(by[K::kSoftmax], 2);    // each layer's attention weights
  EXPECT_EQ(by[K::kReduce], 1);     // the pooled features, for the classifier
  EXPECT_EQ(by[K::kBinary], 1);     // the embeddings' sum, which a residual reads in fp32 too
  EXPECT_EQ(by.size(), 6u);
  EXPECT_EQ(roundings, 0);

  int product_written = 0;
  for (const GpuStep& s : attention->steps)
    product_written += s.kind == GpuStep::Kind::kGemm && !s.gemm.fp32_output;
  EXPECT_EQ(product_written, 0);
  ExpectAligned(*attention);
}

}  // namespace
}  // namespace shoal::engine::cuda
