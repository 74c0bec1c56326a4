#include "engine/cuda/gpu_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "engine/cuda/test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AFloat;
using engine::testing::AInt;
using engine::testing::AInts;
using engine::testing::F32;
using engine::testing::GraphBuilder;
using engine::testing::I64;
using engine::testing::Random;
using ::testing::HasSubstr;

// A model with the CPU engine's plan for one set of input shapes, as lowering takes it.
struct Prepared {
  std::unique_ptr<Model> model;
  std::unique_ptr<Plan> plan;
};

dnnl::engine& CpuEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

Prepared Prepare(StatusOr<std::unique_ptr<Model>> model, const std::vector<Shape>& shapes) {
  Prepared p;
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return p;
  p.model = std::move(model).value();
  dnnl::stream stream(CpuEngine());
  auto plan = Plan::Prepare(p.model->graph(), shapes, CpuEngine(), stream, p.model->weight_cache(),
                            PlanOptions(), PlanLimits());
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (plan.ok()) p.plan = std::move(plan).value();
  return p;
}

std::string Example(const std::string& model) {
  return engine::testing::SourceDir() + "/examples/models/" + model + "/1/model.onnx";
}

// Embedding lookup, layer norm, a product with bias and ReLU (fused by the optimiser),
// a transpose, a softmax over the last axis, a reshape (a view of the softmax's bytes)
// and a scaling by a constant: one of every kind of GPU step.
Graph EveryKindGraph() {
  GraphBuilder b;
  const int ids = b.Input("ids", {2, 4}, DataType::kInt64);
  const int table = b.Constant("table", Random({10, 8}, 1));
  const int emb = b.Op("Gather", "emb", {table, ids}, {{"axis", AInt(0)}});
  const int scale = b.Constant("scale", Random({8}, 2, 0.5f, 1.5f));
  const int shift = b.Constant("shift", Random({8}, 3));
  const int norm = b.Op("LayerNormalization", "norm", {emb, scale, shift},
                        {{"axis", AInt(-1)}, {"epsilon", AFloat(1e-5f)}});
  const int w = b.Constant("w", Random({8, 6}, 4));
  const int prod = b.Op("MatMul", "prod", {norm, w});
  const int bias = b.Constant("bias", Random({6}, 5));
  const int biased = b.Op("Add", "biased", {prod, bias});
  const int act = b.Op("Relu", "act", {biased});
  const int t = b.Op("Transpose", "t", {act}, {{"perm", AInts({0, 2, 1})}});
  const int sm = b.Op("Softmax", "sm", {t}, {{"axis", AInt(-1)}});
  const int flat_shape = b.Constant("flat_shape", I64({2}, {2, 24}));
  const int flat = b.Op("Reshape", "flat", {sm, flat_shape});  // a view: no step
  const int half = b.Constant("half", F32({1}, {0.5f}));
  const int out = b.Op("Mul", "out", {flat, half});
  return b.Finish(out);
}

// Six element-wise steps in a row on one [64, 64] input.
Graph ChainGraph() {
  GraphBuilder b;
  int v = b.Input("x", {64, 64});
  const char* ops[] = {"Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Abs"};
  for (int i = 0; i < 6; ++i) v = b.Op(ops[i], "y" + std::to_string(i), {v});
  return b.Finish(v);
}

void ExpectAligned(const GpuLowering& l) {
  for (size_t v = 0; v < l.values.size(); ++v) {
    if (l.values[v].home == GpuValue::Home::kNone) continue;
    EXPECT_EQ(l.values[v].offset % static_cast<int64_t>(kGemmAlignmentBytes), 0) << "value " << v;
  }
  for (const auto& blob : l.blobs)
    EXPECT_EQ(blob.offset % static_cast<int64_t>(kGemmAlignmentBytes), 0);
}

// ---- Lowering: host only, runs everywhere ----

TEST(LowerPlanTest, TheRecommenderBecomesFourGemmsWithTheirActivations) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  ASSERT_EQ(lowered->steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const GpuStep& s = lowered->steps[i];
    EXPECT_EQ(s.kind, GpuStep::Kind::kGemm);
    EXPECT_EQ(s.gemm.m, 8);
    if (i + 1 < 4) {
      EXPECT_EQ(s.gemm.epilogue, GemmEpilogue::kBiasRelu) << "layer " << i;
      EXPECT_FALSE(s.post.has_value());
      EXPECT_EQ(s.gemm.n, lowered->steps[i + 1].gemm.k);
    } else {
      // Sigmoid has no cuBLASLt epilogue: the bias rides in it, the sigmoid follows.
      EXPECT_EQ(s.gemm.epilogue, GemmEpilogue::kBias);
      ASSERT_TRUE(s.post.has_value());
      EXPECT_EQ(*s.post, UnaryOp::kSigmoid);
      EXPECT_EQ(s.gemm.n, 1);
    }
  }
  EXPECT_EQ(lowered->steps[0].gemm.k, 64);
  // Four weights and four biases, uploaded once; input and output in the arena.
  EXPECT_EQ(lowered->blobs.size(), 8u);
  EXPECT_GT(lowered->weight_bytes, 0);
  const Graph& g = p.model->graph();
  EXPECT_EQ(lowered->values[g.inputs[0]].home, GpuValue::Home::kArena);
  EXPECT_EQ(lowered->values[g.outputs[0]].home, GpuValue::Home::kArena);
  EXPECT_EQ(lowered->values[g.outputs[0]].bytes, 8 * 4);
  ExpectAligned(*lowered);
}

TEST(LowerPlanTest, OneOfEveryKindInGraphOrder) {
  Prepared p = Prepare(Model::FromGraph(EveryKindGraph()), {{2, 4}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  using K = GpuStep::Kind;
  std::vector<K> kinds;
  for (const GpuStep& s : lowered->steps) kinds.push_back(s.kind);
  EXPECT_EQ(kinds, (std::vector<K>{K::kGather, K::kLayerNorm, K::kGemm, K::kTranspose, K::kSoftmax,
                                   K::kBinary}));
  const GpuStep& gemm = lowered->steps[2];
  EXPECT_EQ(gemm.gemm.m, 8);  // [2, 4] rows of A folded into M
  EXPECT_EQ(gemm.gemm.k, 8);
  EXPECT_EQ(gemm.gemm.n, 6);
  EXPECT_EQ(gemm.gemm.epilogue, GemmEpilogue::kBiasRelu);
  EXPECT_EQ(lowered->steps[4].dims, (std::vector<int64_t>{12, 4}));
  EXPECT_EQ(lowered->steps[1].dims, (std::vector<int64_t>{8, 8}));
  // The table, scale, shift, weight, bias and the constant 0.5 are weights; the ids
  // input is an int64 arena value. The reshape's shape is read by no GPU step.
  EXPECT_EQ(lowered->blobs.size(), 6u);
  const Graph& g = p.model->graph();
  EXPECT_EQ(lowered->values[g.inputs[0]].bytes, 2 * 4 * 8);
  // The Mul reads the reshaped softmax where the softmax wrote it.
  const int sm = g.FindValue("sm"), flat = g.FindValue("flat");
  EXPECT_EQ(lowered->values[flat].home, GpuValue::Home::kArena);
  EXPECT_EQ(lowered->values[flat].offset, lowered->values[sm].offset);
  EXPECT_EQ(lowered->steps[5].in[0], flat);
  ExpectAligned(*lowered);
}

TEST(LowerPlanTest, ValuesWhoseLifetimesDoNotOverlapShareTheArena) {
  Prepared p = Prepare(Model::FromGraph(ChainGraph()), {{64, 64}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  ASSERT_EQ(lowered->steps.size(), 6u);
  // At every step one value is read and one written: two slots, not seven.
  EXPECT_EQ(lowered->arena_bytes, 2 * 64 * 64 * 4);
  EXPECT_TRUE(lowered->blobs.empty());
}

// The example text classifier: two attention layers. Their score and context products are
// batched GEMMs over the heads, reading Q, K and V through Transpose steps into
// temporaries; the fused QKV projection's Split is three slices; the mean over the
// sequence is a reduction.
TEST(LowerPlanTest, AttentionBecomesBatchedGemmsOverTheHeads) {
  Prepared p = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  const size_t graph_values = p.model->graph().values.size();
  int batched = 0, slices = 0, reductions = 0, temporaries = 0;
  for (const GpuStep& s : lowered->steps) {
    if (s.kind == GpuStep::Kind::kGemm && s.gemm.batch > 1) {
      ++batched;
      EXPECT_EQ(s.weight_slots[0], -1) << "a computed B is read where it is";
      EXPECT_EQ(s.gemm.y_batch_stride, s.gemm.m * s.gemm.n);
      EXPECT_EQ(s.gemm.batch % 2, 0) << "batch 2 times the heads";
    }
    slices += s.kind == GpuStep::Kind::kSlice;
    reductions += s.kind == GpuStep::Kind::kReduce;
    temporaries += s.out >= static_cast<int>(graph_values);
  }
  EXPECT_EQ(batched, 4);  // scores and context, two layers
  EXPECT_EQ(slices, 6);   // Q, K and V, two layers
  EXPECT_EQ(reductions, 1);
  EXPECT_GT(temporaries, 0);
  EXPECT_EQ(lowered->values.size(), lowered->shapes.size());
  for (size_t v = graph_values; v < lowered->values.size(); ++v)
    EXPECT_EQ(lowered->values[v].home, GpuValue::Home::kArena) << "temporary " << v;
  ExpectAligned(*lowered);
}

// The example image classifier's convolutions and pools have no GPU kernels yet: one line
// per node.
TEST(LowerPlanTest, AModelWithConvolutionsIsRefusedNamingEveryNode) {
  Prepared p = Prepare(Model::Load(Example("image_classifier")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_FALSE(lowered.ok());
  EXPECT_EQ(lowered.status().code(), StatusCode::kUnimplemented);
  const std::string& m = lowered.status().message();
  EXPECT_THAT(m, HasSubstr("the GPU path cannot run this model yet"));
  EXPECT_THAT(m, HasSubstr("(shoal.FusedConv): the GPU path has no kernel"));
  EXPECT_THAT(m, HasSubstr("(MaxPool)"));
  // Four convolutions, two max pools, one global average pool.
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 7) << m;
}

TEST(LowerPlanTest, AnOperatorWithoutAKernelIsNamed) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 4});
  const int y = b.Op("Floor", "floored", {x});
  Prepared p = Prepare(Model::FromGraph(b.Finish(y)), {{4, 4}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_FALSE(lowered.ok());
  EXPECT_THAT(lowered.status().message(),
              HasSubstr("node 'floored' (Floor): the GPU path has no kernel for this operator"));
}

TEST(LowerPlanTest, HalfPrecisionValuesAreRefused) {
  Prepared p = Prepare(Model::FromGraph(ChainGraph()), {{64, 64}});
  ASSERT_TRUE(p.plan);
  GpuPlanOptions options;
  options.math = GemmMath::kFp16;
  auto lowered = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_FALSE(lowered.ok());
  EXPECT_EQ(lowered.status().code(), StatusCode::kInvalidArgument);
}

// ---- Runs: need a device ----

class GpuPlanTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    auto handle = LtHandle::Create();
    ASSERT_TRUE(handle.ok()) << handle.status().ToString();
    handle_ = std::move(handle).value();
    auto stream = Stream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    run_stream_.emplace(std::move(stream).value());
  }

  // Runs `p` on the CPU engine and on the GPU with the same inputs; expects the outputs
  // within `tolerance` of each output's scale.
  void ExpectGpuMatchesCpu(Prepared& p, const std::vector<Tensor>& inputs, GemmMath math,
                           float tolerance) {
    ASSERT_TRUE(p.plan);
    std::vector<const Tensor*> in;
    for (const Tensor& t : inputs) in.push_back(&t);
    dnnl::stream cpu_stream(CpuEngine());
    std::vector<Tensor> cpu;
    ASSERT_TRUE(p.plan->Run(in, cpu_stream, &cpu).ok());
    GpuPlanOptions options;
    options.math = math;
    auto lowered = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    auto gpu_plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
    ASSERT_TRUE(gpu_plan.ok()) << gpu_plan.status().ToString();
    std::vector<Tensor> gpu;
    // Twice: the second run finds the arena as the first left it.
    for (int run = 0; run < 2; ++run) {
      const Status ran = (*gpu_plan)->Run(in, *run_stream_, &gpu);
      ASSERT_TRUE(ran.ok()) << ran.ToString();
      ASSERT_EQ(gpu.size(), cpu.size());
      for (size_t o = 0; o < cpu.size(); ++o) {
        ASSERT_EQ(gpu[o].shape(), cpu[o].shape());
        const float scale = std::max(1.f, engine::testing::MaxAbs(cpu[o]));
        EXPECT_LE(engine::testing::MaxAbsDiff(gpu[o], cpu[o]), tolerance * scale)
            << "output " << o << ", run " << run;
      }
    }
  }

  std::unique_ptr<LtHandle> handle_;
  std::optional<Stream> run_stream_;
};

TEST_F(GpuPlanTest, TheRecommenderMatchesTheCpuEngine) {
  for (int64_t batch : {1, 8, 64}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Prepared p = Prepare(Model::Load(Example("recommender")), {{batch, 64}});
    ExpectGpuMatchesCpu(p, {Random({batch, 64}, 7)}, GemmMath::kFp32, 1e-5f);
    ExpectGpuMatchesCpu(p, {Random({batch, 64}, 8)}, GemmMath::kTf32, 1e-2f);
  }
}

TEST_F(GpuPlanTest, OneOfEveryKindMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(EveryKindGraph()), {{2, 4}});
  ExpectGpuMatchesCpu(p, {I64({2, 4}, {0, 3, 9, -1, 5, 5, 2, -10})}, GemmMath::kFp32, 1e-5f);
}

TEST_F(GpuPlanTest, TheChainMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(ChainGraph()), {{64, 64}});
  ExpectGpuMatchesCpu(p, {Random({64, 64}, 9, -3.f, 3.f)}, GemmMath::kFp32, 1e-6f);
}

// Token ids in [0, vocab) and an attention mask with padding at the end of the second row.
TEST_F(GpuPlanTest, TheTextClassifierMatchesTheCpuEngine) {
  std::vector<int64_t> ids(2 * 32);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 50);
  Prepared p = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
  ExpectGpuMatchesCpu(p, {I64({2, 32}, ids)}, GemmMath::kFp32, 1e-4f);
  ExpectGpuMatchesCpu(p, {I64({2, 32}, ids)}, GemmMath::kTf32, 2e-2f);
}

// The committed BERT encoder (LayerNormalization form) on its reference inputs: the
// attention mask is cast to fp32 and added to the scores.
TEST_F(GpuPlanTest, BertMatchesTheCpuEngineOnItsReferenceInputs) {
  for (const char* file : {"bert_layernorm_op17.b1.sht", "bert_layernorm_op17.b4.sht"}) {
    SCOPED_TRACE(file);
    const engine::testing::Reference ref = engine::testing::LoadReference(file);
    ASSERT_FALSE(ref.inputs.empty());
    std::vector<Shape> shapes;
    std::vector<Tensor> inputs;
    auto model = Model::Load(engine::testing::ModelPath("bert_layernorm_op17.onnx"));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (int v : (*model)->graph().inputs) {
      for (const NamedTensor& t : ref.inputs) {
        if (t.name != (*model)->graph().values[v].name) continue;
        shapes.push_back(t.tensor.shape());
        inputs.push_back(t.tensor);
      }
    }
    ASSERT_EQ(inputs.size(), (*model)->graph().inputs.size());
    Prepared p = Prepare(std::move(model), shapes);
    ExpectGpuMatchesCpu(p, inputs, GemmMath::kFp32, 1e-4f);
  }
}

TEST_F(GpuPlanTest, AnIndexOutOfRangeAndAWrongShapeAreErrors) {
  Prepared p = Prepare(Model::FromGraph(EveryKindGraph()), {{2, 4}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  auto gpu_plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
  ASSERT_TRUE(gpu_plan.ok()) << gpu_plan.status().ToString();
  std::vector<Tensor> out;
  const Tensor bad_index = I64({2, 4}, {0, 1, 2, 10, 0, 0, 0, 0});
  Status ran = (*gpu_plan)->Run({&bad_index}, *run_stream_, &out);
  EXPECT_EQ(ran.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(ran.message(), HasSubstr("Gather index"));
  const Tensor bad_shape = I64({1, 4}, {0, 1, 2, 3});
  ran = (*gpu_plan)->Run({&bad_shape}, *run_stream_, &out);
  EXPECT_EQ(ran.code(), StatusCode::kInvalidArgument);
  // A good run after both.
  const Tensor good = I64({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  ran = (*gpu_plan)->Run({&good}, *run_stream_, &out);
  EXPECT_TRUE(ran.ok()) << ran.ToString();
}

}  // namespace
}  // namespace shoal::engine::cuda
