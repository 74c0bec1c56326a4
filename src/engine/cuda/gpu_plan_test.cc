// GPU plans (gpu_plan.h) run on a device, against the CPU engine; they skip where there is
// none. The host-only lowering checks are in gpu_lowering_test.cc.
#include "engine/cuda/gpu_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/cuda/quantize.h"
#include "engine/cuda/test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/precision.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AInt;
using engine::testing::AString;
using engine::testing::F32;
using engine::testing::GraphBuilder;
using engine::testing::I64;
using engine::testing::Random;
using ::testing::HasSubstr;

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

  // Runs `p` on the GPU once per entry of `runs` (each the inputs of one run, in graph
  // order) and expects each run's outputs within `tolerance` of that run's outputs on the
  // CPU engine, relative to each output's scale. Later runs find the arena as the one
  // before left it, so a step that read stale bytes shows.
  void ExpectGpuMatchesCpu(Prepared& p, const std::vector<std::vector<Tensor>>& runs, GemmMath math,
                           float tolerance, std::shared_ptr<GpuWeights> weights = nullptr,
                           bool cuda_graph = true, const TensorParallelOptions& tp = {}) {
    ASSERT_TRUE(p.plan);
    GpuPlanOptions options;
    options.math = math;
    options.cuda_graph = cuda_graph;
    options.tensor_parallel = tp;
    options.conv = conv_;
    options.channels_last = channels_last_;
    options.int8_calibration = int8_;
    auto lowered = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    if (int8_) {
      // A test of int8 plans that ran no int8 product would prove nothing.
      EXPECT_GT(lowered->int8_products, 0);
    }
    if (tp.shards > 1) {
      // Nor would a test of tensor parallelism that split nothing.
      EXPECT_GT(lowered->split_products, 0);
      EXPECT_EQ(lowered->shards, tp.shards);
    }
    if (conv_ == ConvEngine::kCudnn) {
      // A test of cuDNN's plans that ran none would prove nothing.
      EXPECT_TRUE(std::any_of(lowered->steps.begin(), lowered->steps.end(),
                              [](const GpuStep& s) { return s.kind == GpuStep::Kind::kConv; }));
    }
    auto gpu_plan =
        GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_, std::move(weights));
    ASSERT_TRUE(gpu_plan.ok()) << gpu_plan.status().ToString();
    GpuPlan* plan = gpu_plan->get();
    dnnl::stream cpu_stream(CpuEngine());
    for (size_t run = 0; run < runs.size(); ++run) {
      std::vector<const Tensor*> in;
      for (const Tensor& t : runs[run]) in.push_back(&t);
      std::vector<Tensor> cpu, gpu;
      ASSERT_TRUE(p.plan->Run(in, cpu_stream, &cpu).ok());
      const Status ran = (*gpu_plan)->Run(in, *run_stream_, &gpu);
      ASSERT_TRUE(ran.ok()) << ran.ToString();
      ASSERT_EQ(gpu.size(), cpu.size());
      for (size_t o = 0; o < cpu.size(); ++o) {
        ASSERT_EQ(gpu[o].shape(), cpu[o].shape());
        ASSERT_EQ(gpu[o].dtype(), cpu[o].dtype());
        if (cpu[o].dtype() == DataType::kFp16 || cpu[o].dtype() == DataType::kBf16) {
          // An fp16 model's output: both sides rounded from fp32 sums in another order,
          // so one 16-bit step apart at most, within the tolerance beside it.
          const bool fp16 = cpu[o].dtype() == DataType::kFp16;
          const auto* g = static_cast<const uint16_t*>(gpu[o].data());
          const auto* c = static_cast<const uint16_t*>(cpu[o].data());
          float scale = 1.f, worst = 0.f;
          const size_t count = cpu[o].byte_size() / 2;
          for (size_t i = 0; i < count; ++i)
            scale = std::max(scale, std::fabs(fp16 ? Fp16ToFloat(c[i]) : Bf16ToFloat(c[i])));
          for (size_t i = 0; i < count; ++i) {
            const float a = fp16 ? Fp16ToFloat(g[i]) : Bf16ToFloat(g[i]);
            const float b = fp16 ? Fp16ToFloat(c[i]) : Bf16ToFloat(c[i]);
            worst = std::max(worst, std::isnan(a - b) ? INFINITY : std::fabs(a - b));
          }
          EXPECT_LE(worst, tolerance * scale) << "output " << o << ", run " << run;
          continue;
        }
        if (cpu[o].dtype() != DataType::kFp32) {  // int64 (ArgMax, Mod) and bools: exact
          ASSERT_EQ(gpu[o].byte_size(), cpu[o].byte_size());
          EXPECT_EQ(std::memcmp(gpu[o].data(), cpu[o].data(), cpu[o].byte_size()), 0)
              << "output " << o << ", run " << run;
          continue;
        }
        const float scale = std::max(1.f, engine::testing::MaxAbs(cpu[o]));
        EXPECT_LE(engine::testing::MaxAbsDiff(gpu[o], cpu[o]), tolerance * scale)
            << "output " << o << ", run " << run;
      }
      // From the second run on, a plan that asked for a CUDA graph replays one: a capture
      // that failed (and fell back to step by step) shows here.
      if (run >= 1) {
        EXPECT_EQ(plan->graph_captured(), cuda_graph) << "run " << run;
      }
    }
  }

  // `p`'s plan lowered with the default options and created on the device; null, with the
  // failure recorded, when either fails.
  std::unique_ptr<GpuPlan> CreatePlan(const Prepared& p) {
    EXPECT_TRUE(p.plan);
    if (!p.plan) return nullptr;
    auto lowered = LowerPlan(p.model->graph(), *p.plan);
    EXPECT_TRUE(lowered.ok()) << lowered.status().ToString();
    if (!lowered.ok()) return nullptr;
    auto plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? std::move(plan).value() : nullptr;
  }

  std::unique_ptr<LtHandle> handle_;
  std::optional<Stream> run_stream_;
  ConvEngine conv_ = ConvEngine::kIm2Col;    // how ExpectGpuMatchesCpu's plans convolve
  bool channels_last_ = true;                // GpuPlanOptions::channels_last
  std::shared_ptr<const Calibration> int8_;  // GpuPlanOptions::int8_calibration
};

TEST_F(GpuPlanTest, TheRecommenderMatchesTheCpuEngine) {
  for (int64_t batch : {1, 8, 64}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Prepared p = Prepare(Model::Load(Example("recommender")), {{batch, 64}});
    ExpectGpuMatchesCpu(p, {{Random({batch, 64}, 7)}, {Random({batch, 64}, 70)}}, GemmMath::kFp32,
                        1e-5f);
    ExpectGpuMatchesCpu(p, {{Random({batch, 64}, 8)}, {Random({batch, 64}, 80)}}, GemmMath::kTf32,
                        1e-2f);
  }
}

TEST_F(GpuPlanTest, OneOfEveryKindMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(EveryKindGraph()), {{2, 4}});
  ExpectGpuMatchesCpu(
      p, {{I64({2, 4}, {0, 3, 9, -1, 5, 5, 2, -10})}, {I64({2, 4}, {7, 7, 1, 0, -3, 4, 8, 2})}},
      GemmMath::kFp32, 1e-5f);
}

TEST_F(GpuPlanTest, TheChainMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(ChainGraph()), {{64, 64}});
  ExpectGpuMatchesCpu(p, {{Random({64, 64}, 9, -3.f, 3.f)}, {Random({64, 64}, 90, -3.f, 3.f)}},
                      GemmMath::kFp32, 1e-6f);
}

// Token ids in [0, vocab) and an attention mask with padding at the end of the second row.
TEST_F(GpuPlanTest, TheTextClassifierMatchesTheCpuEngine) {
  std::vector<int64_t> ids(2 * 32), other(2 * 32);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 37) % 50);
    other[i] = static_cast<int64_t>((i * 11 + 5) % 997);
  }
  Prepared p = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
  ExpectGpuMatchesCpu(p, {{I64({2, 32}, ids)}, {I64({2, 32}, other)}}, GemmMath::kFp32, 1e-4f);
  ExpectGpuMatchesCpu(p, {{I64({2, 32}, ids)}, {I64({2, 32}, other)}}, GemmMath::kTf32, 2e-2f);
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
    // A second run with each int64 input's values rotated by one place (the same ids and
    // mask values, elsewhere).
    std::vector<Tensor> rotated;
    for (const Tensor& t : inputs) {
      std::vector<int64_t> v = engine::testing::IntValues(t);
      std::rotate(v.begin(), v.begin() + 1, v.end());
      rotated.push_back(I64(t.shape(), v));
    }
    Prepared p = Prepare(std::move(model), shapes);
    ExpectGpuMatchesCpu(p, {inputs, rotated}, GemmMath::kFp32, 1e-4f);
  }
}

TEST_F(GpuPlanTest, ScaledProductsMatchTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(ScaledProductsGraph()), {{4, 6}});
  ExpectGpuMatchesCpu(p, {{Random({4, 6}, 31)}, {Random({4, 6}, 32)}}, GemmMath::kFp32, 1e-5f);
}

TEST_F(GpuPlanTest, AttentionWrittenAsEinsumsMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(EinsumAttentionGraph()), {{2, 3, 5, 8}});
  ExpectGpuMatchesCpu(p, {{Random({2, 3, 5, 8}, 63)}, {Random({2, 3, 5, 8}, 64)}}, GemmMath::kFp32,
                      1e-5f);
}

TEST_F(GpuPlanTest, MoreElementWiseSoftmaxAndReductionOperatorsMatchTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(MoreOperatorsGraph()), {{2, 3, 4, 5}});
  ExpectGpuMatchesCpu(
      p, {{Random({2, 3, 4, 5}, 71, -3.f, 3.f)}, {Random({2, 3, 4, 5}, 72, -3.f, 3.f)}},
      GemmMath::kFp32, 1e-5f);
}

TEST_F(GpuPlanTest, AGroupedConvolutionAndAPoolMatchTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(GroupedConvGraph()), {{2, 4, 9, 9}});
  ExpectGpuMatchesCpu(p, {{Random({2, 4, 9, 9}, 41)}, {Random({2, 4, 9, 9}, 42)}}, GemmMath::kFp32,
                      1e-5f);
}

TEST_F(GpuPlanTest, TheImageClassifierAndResNetMatchTheCpuEngine) {
  Prepared ic = Prepare(Model::Load(Example("image_classifier")), {{3, 3, 32, 32}});
  ExpectGpuMatchesCpu(
      ic, {{Random({3, 3, 32, 32}, 51, 0.f, 1.f)}, {Random({3, 3, 32, 32}, 52, 0.f, 1.f)}},
      GemmMath::kFp32, 1e-4f);
  Prepared resnet =
      Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
  ExpectGpuMatchesCpu(resnet, {{Random({2, 3, 32, 32}, 53)}, {Random({2, 3, 32, 32}, 54)}},
                      GemmMath::kFp32, 1e-4f);
}

// Convolutions on cuDNN: fused with their bias and ReLU (the image classifier's), with
// ResNet's residual and ReLU, grouped and depthwise (the grouped graph, the MobileNets),
// dilated and strided, transposed (the decoder's and the VAE's), in every tier, as CUDA
// graphs and step by step. Where a window has pads that differ at the two ends, the plan
// keeps im2col for it, alongside.
TEST_F(GpuPlanTest, ConvolutionsOnCudnnMatchTheCpuEngine) {
  conv_ = ConvEngine::kCudnn;
  for (const auto& [math, tolerance] :
       {std::pair{GemmMath::kFp32, 1e-4f}, std::pair{GemmMath::kTf32, 1e-2f},
        std::pair{GemmMath::kFp16, 2e-2f}, std::pair{GemmMath::kBf16, 8e-2f}}) {
    SCOPED_TRACE(static_cast<int>(math));
    Prepared ic = Prepare(Model::Load(Example("image_classifier")), {{3, 3, 32, 32}});
    ExpectGpuMatchesCpu(
        ic, {{Random({3, 3, 32, 32}, 151, 0.f, 1.f)}, {Random({3, 3, 32, 32}, 152, 0.f, 1.f)}},
        math, tolerance);
    Prepared resnet =
        Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
    ExpectGpuMatchesCpu(resnet, {{Random({2, 3, 32, 32}, 153)}, {Random({2, 3, 32, 32}, 154)}},
                        math, tolerance);
    Prepared grouped = Prepare(Model::FromGraph(GroupedConvGraph()), {{2, 4, 9, 9}});
    ExpectGpuMatchesCpu(grouped, {{Random({2, 4, 9, 9}, 155)}}, math, tolerance);
    // A value a convolution reads and the block's last epilogue adds as its residual (in 16
    // bits in fp16 and bf16), and, read by another step too, in fp32.
    for (bool y_also_read : {false, true}) {
      Prepared block = Prepare(Model::FromGraph(IdentityBlockGraph(y_also_read)), {{2, 3, 8, 8}});
      ExpectGpuMatchesCpu(block, {{Random({2, 3, 8, 8}, 161)}, {Random({2, 3, 8, 8}, 162)}}, math,
                          tolerance);
    }
    // A max pool between convolutions, of 16-bit values in fp16 and bf16 (channels last); and
    // of fp32 ones when the pool's output is the graph's too. With a product reading the
    // input's rounding as well, the first convolution runs NCHW and its epilogue writes the
    // rounding the pool reads channels last.
    for (const char* variant : {"plain", "y_output", "pooled_output", "product"}) {
      SCOPED_TRACE(variant);
      Prepared pooled = Prepare(Model::FromGraph(PoolBetweenConvsGraph(variant)), {{2, 3, 8, 8}});
      ExpectGpuMatchesCpu(pooled, {{Random({2, 3, 8, 8}, 163)}}, math, tolerance);
    }
    // A convolution reading the one before it through a Reshape to another 4-D shape (its
    // rounding NCHW, the first convolution channels last).
    Prepared reshaped = Prepare(Model::FromGraph(ReshapeBetweenConvsGraph()), {{1, 4, 8, 8}});
    ExpectGpuMatchesCpu(reshaped, {{Random({1, 4, 8, 8}, 164)}}, math, tolerance);
  }
  Prepared resnet =
      Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
  ExpectGpuMatchesCpu(resnet, {{Random({2, 3, 32, 32}, 156)}, {Random({2, 3, 32, 32}, 157)}},
                      GemmMath::kFp32, 1e-4f, nullptr, /*cuda_graph=*/false);
  // The 16-bit tiers with every value NCHW (gpu_convolution_layout nchw), as above channels
  // last.
  channels_last_ = false;
  for (const auto& [math, tolerance] :
       {std::pair{GemmMath::kFp16, 2e-2f}, std::pair{GemmMath::kBf16, 8e-2f}}) {
    ExpectGpuMatchesCpu(resnet, {{Random({2, 3, 32, 32}, 158)}}, math, tolerance);
    Prepared pooled = Prepare(Model::FromGraph(PoolBetweenConvsGraph("plain")), {{2, 3, 8, 8}});
    ExpectGpuMatchesCpu(pooled, {{Random({2, 3, 8, 8}, 159)}}, math, tolerance);
  }
  channels_last_ = true;
  for (const char* name : {"densenet_op13", "mobilenet_v2_op13", "mobilenet_v3_op13",
                           "efficientnet_op13", "squeezenet_op13", "shufflenet_op13"}) {
    SCOPED_TRACE(name);
    const engine::testing::Reference ref =
        engine::testing::LoadReference(std::string(name) + ".b4.sht");
    const Tensor& x = ref.inputs[0].tensor;
    Prepared p =
        Prepare(Model::Load(engine::testing::ModelPath(std::string(name) + ".onnx")), {x.shape()});
    ExpectGpuMatchesCpu(p, {{x}, {Random(x.shape(), 158)}}, GemmMath::kFp32, 1e-4f);
  }
  // Transposed convolutions as cuDNN's backward data: the decoder's (kernel 4, stride 2) in
  // fp32 and, as the 16-bit tiers run them, TF32; the VAE's with output_padding 1.
  for (const auto& [math, tolerance] :
       {std::pair{GemmMath::kFp32, 1e-4f}, std::pair{GemmMath::kFp16, 2e-2f}}) {
    Prepared decoder = Prepare(Model::Load(Example("decoder")), {{8, 16}});
    ExpectGpuMatchesCpu(decoder, {{Random({8, 16}, 159)}, {Random({8, 16}, 160)}}, math, tolerance);
  }
  WithReference vae = PrepareWithReference("vae_op13");
  ExpectGpuMatchesCpu(vae.prepared, {vae.inputs}, GemmMath::kFp32, 1e-4f);
}

// Mixed precision against the fp32 CPU engine, within each 16-bit type's rounding: fp16
// keeps 11 significant bits, bf16 8, so bf16's bound is the wider.
TEST_F(GpuPlanTest, MixedPrecisionPlansStayWithinTheirTypesRounding) {
  for (const auto& [math, tolerance] :
       {std::pair{GemmMath::kFp16, 2e-2f}, std::pair{GemmMath::kBf16, 8e-2f}}) {
    SCOPED_TRACE(math == GemmMath::kFp16 ? "fp16" : "bf16");
    Prepared rec = Prepare(Model::Load(Example("recommender")), {{8, 64}});
    ExpectGpuMatchesCpu(rec, {{Random({8, 64}, 101)}, {Random({8, 64}, 102)}}, math, tolerance);
    std::vector<int64_t> ids(2 * 32);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 50);
    Prepared text = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
    ExpectGpuMatchesCpu(text, {{I64({2, 32}, ids)}}, math, tolerance);
    Prepared ic = Prepare(Model::Load(Example("image_classifier")), {{3, 3, 32, 32}});
    ExpectGpuMatchesCpu(
        ic, {{Random({3, 3, 32, 32}, 103, 0.f, 1.f)}, {Random({3, 3, 32, 32}, 104, 0.f, 1.f)}},
        math, tolerance);
    Prepared resnet =
        Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
    ExpectGpuMatchesCpu(resnet, {{Random({2, 3, 32, 32}, 105)}}, math, tolerance);
    // A grouped convolution (its batch strides leave later groups only 4-byte aligned in
    // 16 bits) and products with alpha and beta folded into 16-bit weights.
    Prepared grouped = Prepare(Model::FromGraph(GroupedConvGraph()), {{2, 4, 9, 9}});
    ExpectGpuMatchesCpu(grouped, {{Random({2, 4, 9, 9}, 106)}}, math, tolerance);
    Prepared scaled = Prepare(Model::FromGraph(ScaledProductsGraph()), {{4, 6}});
    ExpectGpuMatchesCpu(scaled, {{Random({4, 6}, 107)}}, math, tolerance);
    // An activation, or a broadcast sum, that rounds its result for the product after it,
    // writing 16 bits alone, or its fp32 result too when that is also an output, or for a
    // product reading it through a Reshape.
    for (const char* op : {"Tanh", "Add"}) {
      for (const char* variant : {"alone", "output", "view"}) {
        Prepared act = Prepare(Model::FromGraph(ActivationThenProductGraph(variant, op)), {{4, 8}});
        ExpectGpuMatchesCpu(act, {{Random({4, 8}, 108)}}, math, tolerance);
      }
    }
  }
}

// int8 plans: each int8 product is the host reference of quantize.h on the plan's own
// weights and scales (up to the device's fused multiply-add), and whole models stay within
// int8's rounding of the CPU engine's fp32, with convolutions on im2col and beside cuDNN.
TEST_F(GpuPlanTest, Int8PlansMatchTheirHostReferenceAndStayNearFp32) {
  Prepared two = Prepare(Model::FromGraph(TwoProductsOfOneInputGraph()), {{32, 8}});
  ASSERT_TRUE(two.plan);
  GpuPlanOptions options;
  options.int8_calibration = RandomInputRanges(*two.model, "x", {32, 8}, -2.f, 3.f);
  auto lowered = LowerPlan(two.model->graph(), *two.plan, options);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  const GpuLowering l = *lowered;
  auto plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const Tensor x = Random({32, 8}, 905, -2.5f, 3.5f);  // past the calibrated range: clamps
  std::vector<Tensor> out;
  ASSERT_TRUE((*plan)->Run({&x}, *run_stream_, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  const std::vector<float> xv(x.values<float>().begin(), x.values<float>().end());
  Int8Input input;  // how x is quantised
  int quantisations = 0;
  for (const GpuStep& s : l.steps) {
    if (s.kind != GpuStep::Kind::kQuantize) continue;
    input.inv_scale = s.alpha;
    input.scale = 1.f / s.alpha;
    input.zero_point = s.zero_point;
    ++quantisations;
  }
  ASSERT_EQ(quantisations, 1);
  int checked = 0;
  for (const GpuStep& g : l.steps) {
    if (g.kind != GpuStep::Kind::kGemm) continue;
    ASSERT_EQ(g.gemm.math, GemmMath::kInt8);
    QuantizedWeight w;
    w.values = l.blobs[g.weight_slots[0]].data;
    const auto sv = l.blobs[g.weight_slots[2]].data.values<float>();
    const float* bias =
        g.weight_slots[1] >= 0 ? l.blobs[g.weight_slots[1]].data.values<float>().data() : nullptr;
    const std::vector<float> want =
        Int8ProductReference(xv, g.gemm.m, g.gemm.k, input, w,
                             std::vector<float>(sv.begin(), sv.end()), bias, g.int8_relu);
    const auto got = out[g.gemm.n == 24 ? 0 : 1].values<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.f, std::fabs(want[i]))) << "at " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 2);

  Prepared rec = Prepare(Model::Load(Example("recommender")), {{32, 64}});
  ASSERT_TRUE(rec.plan);
  int8_ = RandomInputRanges(*rec.model, rec.model->inputs()[0].name, {32, 64}, -1.f, 1.f);
  ExpectGpuMatchesCpu(rec, {{Random({32, 64}, 901)}, {Random({32, 64}, 106)}}, GemmMath::kFp32,
                      0.1f);
  for (ConvEngine conv : {ConvEngine::kIm2Col, ConvEngine::kCudnn}) {
    SCOPED_TRACE(conv == ConvEngine::kCudnn ? "beside cuDNN" : "im2col");
    conv_ = conv;
    Prepared ic = Prepare(Model::Load(Example("image_classifier")), {{3, 3, 32, 32}});
    ASSERT_TRUE(ic.plan);
    int8_ = RandomInputRanges(*ic.model, ic.model->inputs()[0].name, {3, 3, 32, 32}, 0.f, 1.f);
    ExpectGpuMatchesCpu(ic, {{Random({3, 3, 32, 32}, 902, 0.f, 1.f)}}, GemmMath::kFp32, 0.1f);
    Prepared block = Prepare(Model::FromGraph(IdentityBlockGraph(false, 8)), {{2, 3, 8, 8}});
    ASSERT_TRUE(block.plan);
    int8_ = RandomInputRanges(*block.model, "x", {2, 3, 8, 8}, -1.f, 1.f);
    ExpectGpuMatchesCpu(block, {{Random({2, 3, 8, 8}, 903, -1.f, 1.f)}}, GemmMath::kFp32, 0.1f);
  }
  // A transformer: its layer norms, activations and attention outputs write the int8 copies
  // its products read (Lowerer::KeepValuesInt8), calibrated on its two token batches.
  {
    std::vector<int64_t> ids(2 * 32), other(2 * 32);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 37) % 50);
      other[i] = static_cast<int64_t>((i * 11 + 5) % 997);
    }
    Prepared text = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
    ASSERT_TRUE(text.plan);
    const std::string name = text.model->inputs()[0].name;
    auto ranges =
        Calibrate(*text.model, {{{name, I64({2, 32}, ids)}}, {{name, I64({2, 32}, other)}}});
    ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
    int8_ = std::make_shared<const Calibration>(std::move(ranges).value());
    ExpectGpuMatchesCpu(text, {{I64({2, 32}, ids)}, {I64({2, 32}, other)}}, GemmMath::kFp32, 0.1f);
  }
  // Values passed between int8 convolutions in int8 alone (Lowerer::KeepValuesInt8). Both of
  // its convolutions are int8, so on im2col whatever the engine: none is left for cuDNN.
  conv_ = ConvEngine::kIm2Col;
  Prepared chain = Prepare(Model::FromGraph(Int8ConvChainGraph()), {{2, 8, 8, 8}});
  ASSERT_TRUE(chain.plan);
  int8_ = RandomInputRanges(*chain.model, "x", {2, 8, 8, 8}, -1.f, 1.f);
  ExpectGpuMatchesCpu(chain, {{Random({2, 8, 8, 8}, 904, -1.f, 1.f)}}, GemmMath::kFp32, 0.1f);
}

// Plans for two batch sizes sharing one GpuWeights upload the recommender's eight blobs
// once.
TEST_F(GpuPlanTest, PlansOfOneInstanceShareTheirWeights) {
  auto weights = std::make_shared<GpuWeights>();
  Prepared one = Prepare(Model::Load(Example("recommender")), {{1, 64}});
  Prepared eight = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(one.plan && eight.plan);
  auto create = [&](Prepared& p) {
    auto lowered = LowerPlan(p.model->graph(), *p.plan);
    EXPECT_TRUE(lowered.ok()) << lowered.status().ToString();
    auto plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_, weights);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? std::move(plan).value() : nullptr;
  };
  auto a = create(one);
  ASSERT_TRUE(a);
  const int64_t bytes = weights->bytes();
  EXPECT_EQ(weights->count(), 8u);
  EXPECT_GT(bytes, 6'000'000);
  auto b = create(eight);
  ASSERT_TRUE(b);
  EXPECT_EQ(weights->count(), 8u);  // the second plan found every blob
  EXPECT_EQ(weights->bytes(), bytes);
  std::vector<Tensor> out;
  const Tensor x = Random({8, 64}, 61);
  ASSERT_TRUE(b->Run({&x}, *run_stream_, &out).ok());
  a.reset();
  EXPECT_EQ(weights->count(), 8u);  // still used by the second
  b.reset();
  EXPECT_EQ(weights->count(), 0u);  // freed with their last user
  EXPECT_EQ(weights->bytes(), 0);
}

// Two instances' threads, each with its own handle and stream, create and run plans for
// different batch sizes at once from one GpuWeights: the recommender's eight blobs are
// uploaded once, and each plan answers as the CPU engine does (an upload another thread
// read before it was complete would show).
TEST_F(GpuPlanTest, InstancesOnTwoThreadsShareOneUploadOfTheWeights) {
  auto weights = std::make_shared<GpuWeights>();
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  auto instance = [&](int64_t batch, uint32_t seed, std::string* error) {
    if (cudaSetDevice(device) != cudaSuccess) return void(*error = "cudaSetDevice");
    auto handle = LtHandle::Create();
    auto stream = Stream::Create();
    if (!handle.ok() || !stream.ok()) return void(*error = "handle or stream");
    Prepared p = Prepare(Model::Load(Example("recommender")), {{batch, 64}});
    if (!p.plan) return void(*error = "CPU plan");
    auto lowered = LowerPlan(p.model->graph(), *p.plan);
    if (!lowered.ok()) return void(*error = lowered.status().ToString());
    auto plan = GpuPlan::Create(std::move(lowered).value(), **handle, *stream, weights);
    if (!plan.ok()) return void(*error = plan.status().ToString());
    // The same eight keys at every batch size: never a second copy.
    if (weights->count() != 8u) return void(*error = std::to_string(weights->count()) + " blobs");
    for (uint32_t run = 0; run < 20; ++run) {
      const Tensor x = Random({batch, 64}, seed + run);
      std::vector<Tensor> gpu, cpu;
      dnnl::stream cpu_stream(CpuEngine());
      if (!p.plan->Run({&x}, cpu_stream, &cpu).ok()) return void(*error = "CPU run");
      const Status ran = (*plan)->Run({&x}, *stream, &gpu);
      if (!ran.ok()) return void(*error = ran.ToString());
      if (engine::testing::MaxAbsDiff(gpu[0], cpu[0]) > 1e-5f)
        return void(*error = "run " + std::to_string(run) + " differs from the CPU engine");
    }
  };
  std::string error_a, error_b;
  std::thread a(instance, 16, 500u, &error_a), b(instance, 3, 600u, &error_b);
  a.join();
  b.join();
  EXPECT_EQ(error_a, "");
  EXPECT_EQ(error_b, "");
  EXPECT_EQ(weights->count(), 0u);  // both plans gone, every copy freed with them
}

// A run timed phase by phase gives the copies' and the steps' device times and the same
// outputs as a plain run; plain runs (as a captured graph) go on after it.
TEST_F(GpuPlanTest, ARunTimedByPhaseSaysWhereItsTimeGoes) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{64, 64}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  auto plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const Tensor x = Random({64, 64}, 81);
  std::vector<Tensor> plain, timed;
  ASSERT_TRUE((*plan)->Run({&x}, *run_stream_, &plain).ok());
  auto phases = (*plan)->RunTimingPhases({&x}, *run_stream_, &timed);
  ASSERT_TRUE(phases.ok()) << phases.status().ToString();
  EXPECT_GT(phases->copy_in, 0.0);
  EXPECT_GT(phases->compute, 0.0);
  EXPECT_GT(phases->copy_out, 0.0);
  EXPECT_LE(phases->copy_in + phases->compute + phases->copy_out, 1000.0);
  // The device time a batch counts is its compute alone.
  EXPECT_DOUBLE_EQ((*plan)->last_device_ms(), phases->compute);
  ASSERT_EQ(timed.size(), 1u);
  EXPECT_EQ(engine::testing::MaxAbsDiff(timed[0], plain[0]), 0.f);
  for (int run = 0; run < 3; ++run) {  // captured at the second plain run, then replayed
    std::vector<Tensor> again;
    ASSERT_TRUE((*plan)->Run({&x}, *run_stream_, &again).ok());
    EXPECT_EQ(engine::testing::MaxAbsDiff(again[0], plain[0]), 0.f) << "run " << run;
  }
  const Tensor wrong = Random({8, 64}, 82);
  EXPECT_EQ((*plan)->RunTimingPhases({&wrong}, *run_stream_, &timed).status().code(),
            StatusCode::kInvalidArgument);
}

// Whether two host tensors hold the same bytes.
bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.byte_size()) == 0;
}

// Double buffering: two batches launched into both slots before either is finished answer as
// each run alone, bit for bit (the same kernels run), at the plan's first batches (the first
// step by step, the second capturing its slot's graph), its next (the other slot capturing)
// and later ones (both replaying), finished in launch order or the other way. A third launch
// while both slots are busy is refused, and its on_done never called; each on_done is called
// once, before its Finish returns. A synchronous run goes through the slot left free while
// a batch is launched.
TEST_F(GpuPlanTest, TwoBatchesInFlightAnswerAsEachRunAlone) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{64, 64}});
  std::unique_ptr<GpuPlan> created = CreatePlan(p);
  ASSERT_TRUE(created);
  GpuPlan& plan = *created;
  const Tensor a = Random({64, 64}, 91), b = Random({64, 64}, 92), c = Random({64, 64}, 93);
  std::atomic<int> done_a{0}, done_b{0}, done_refused{0};
  std::vector<std::vector<Tensor>> pipelined_a, pipelined_b;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    EXPECT_EQ(plan.free_slots(), GpuPlan::kSlots);
    auto slot_a = plan.Launch({&a}, *run_stream_, [&] { ++done_a; });
    ASSERT_TRUE(slot_a.ok()) << slot_a.status().ToString();
    auto slot_b = plan.Launch({&b}, *run_stream_, [&] { ++done_b; });
    ASSERT_TRUE(slot_b.ok()) << slot_b.status().ToString();
    EXPECT_NE(*slot_a, *slot_b);
    EXPECT_EQ(plan.free_slots(), 0);
    const auto refused = plan.Launch({&c}, *run_stream_, [&] { ++done_refused; });
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    std::vector<Tensor> out_a, out_b;
    if (round % 2 == 0) {
      const Status finished = plan.Finish(*slot_a, &out_a);
      ASSERT_TRUE(finished.ok()) << finished.ToString();
      EXPECT_EQ(done_a.load(), round + 1);
    }
    const Status finished_b = plan.Finish(*slot_b, &out_b);
    ASSERT_TRUE(finished_b.ok()) << finished_b.ToString();
    EXPECT_EQ(done_b.load(), round + 1);
    if (round % 2 == 1) {
      const Status finished = plan.Finish(*slot_a, &out_a);
      ASSERT_TRUE(finished.ok()) << finished.ToString();
    }
    EXPECT_EQ(done_a.load(), round + 1);
    // A slot finished is free, and is not finished twice.
    EXPECT_EQ(plan.Finish(*slot_a, &out_a).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(plan.free_slots(), GpuPlan::kSlots);
    if (round >= 1) {
      EXPECT_TRUE(plan.graph_captured());
    }
    pipelined_a.push_back(std::move(out_a));
    pipelined_b.push_back(std::move(out_b));
  }
  EXPECT_EQ(done_refused.load(), 0);
  // One batch launched, a synchronous run beside it, then the launched one finished.
  auto slot_c = plan.Launch({&c}, *run_stream_);
  ASSERT_TRUE(slot_c.ok()) << slot_c.status().ToString();
  EXPECT_EQ(plan.free_slots(), 1);
  std::vector<Tensor> alone_a, alone_b, alone_c, out_c;
  Status ran = plan.Run({&a}, *run_stream_, &alone_a);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ran = plan.Finish(*slot_c, &out_c);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ran = plan.Run({&b}, *run_stream_, &alone_b);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ran = plan.Run({&c}, *run_stream_, &alone_c);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ASSERT_EQ(alone_a.size(), 1u);
  ASSERT_EQ(alone_b.size(), 1u);
  EXPECT_FALSE(SameBytes(alone_a[0], alone_b[0]));  // a batch mixed up with the other shows
  ASSERT_EQ(out_c.size(), 1u);
  EXPECT_TRUE(SameBytes(out_c[0], alone_c[0]));
  for (size_t round = 0; round < pipelined_a.size(); ++round) {
    ASSERT_EQ(pipelined_a[round].size(), 1u);
    ASSERT_EQ(pipelined_b[round].size(), 1u);
    EXPECT_TRUE(SameBytes(pipelined_a[round][0], alone_a[0])) << "round " << round;
    EXPECT_TRUE(SameBytes(pipelined_b[round][0], alone_b[0])) << "round " << round;
  }
  // And the CPU engine's answer.
  dnnl::stream cpu_stream(CpuEngine());
  std::vector<Tensor> cpu;
  ASSERT_TRUE(p.plan->Run({&b}, cpu_stream, &cpu).ok());
  EXPECT_LE(engine::testing::MaxAbsDiff(alone_b[0], cpu[0]), 1e-5f);
}

// An error flag is its slot's: with two batches in flight, a Gather index out of range in
// one fails that batch's Finish, naming the node, and the other's answers as it does alone,
// whichever was launched first, step by step and as CUDA graphs. Both slots are free after.
TEST_F(GpuPlanTest, AnErrorFlagIsReportedByItsOwnSlotOnly) {
  Prepared p = Prepare(Model::FromGraph(EveryKindGraph()), {{2, 4}});
  std::unique_ptr<GpuPlan> created = CreatePlan(p);
  ASSERT_TRUE(created);
  GpuPlan& plan = *created;
  const Tensor good = I64({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor bad = I64({2, 4}, {0, 1, 2, 10, 0, 0, 0, 0});
  std::vector<std::vector<Tensor>> answers;
  for (int round = 0; round < 4; ++round) {
    const bool bad_first = round % 2 == 0;
    SCOPED_TRACE("round " + std::to_string(round) + (bad_first ? ", bad first" : ", good first"));
    auto first = plan.Launch({bad_first ? &bad : &good}, *run_stream_);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    auto second = plan.Launch({bad_first ? &good : &bad}, *run_stream_);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    std::vector<Tensor> out_first, out_second;
    const Status finished_first = plan.Finish(*first, &out_first);
    const Status finished_second = plan.Finish(*second, &out_second);
    const Status& failed = bad_first ? finished_first : finished_second;
    const Status& answered = bad_first ? finished_second : finished_first;
    EXPECT_EQ(failed.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(failed.message(), HasSubstr("(Gather): an index was out of range"));
    ASSERT_TRUE(answered.ok()) << answered.ToString();
    answers.push_back(std::move(bad_first ? out_second : out_first));
    EXPECT_EQ(plan.free_slots(), GpuPlan::kSlots);
  }
  std::vector<Tensor> alone;
  const Status ran = plan.Run({&good}, *run_stream_, &alone);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ASSERT_EQ(alone.size(), 1u);
  for (size_t round = 0; round < answers.size(); ++round) {
    ASSERT_EQ(answers[round].size(), 1u);
    EXPECT_TRUE(SameBytes(answers[round][0], alone[0])) << "round " << round;
  }
}

// The same plan run step by step and as a CUDA graph (the first run goes step by step, the
// second captures the graph, the third replays it, each with new inputs in the same
// arena).
TEST_F(GpuPlanTest, StepByStepAndAsACudaGraphBothMatchTheCpuEngine) {
  Prepared p = Prepare(Model::Load(Example("image_classifier")), {{2, 3, 32, 32}});
  const std::vector<std::vector<Tensor>> runs = {{Random({2, 3, 32, 32}, 71, 0.f, 1.f)},
                                                 {Random({2, 3, 32, 32}, 72, 0.f, 1.f)},
                                                 {Random({2, 3, 32, 32}, 73, 0.f, 1.f)}};
  for (bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "CUDA graph" : "step by step");
    ExpectGpuMatchesCpu(p, runs, GemmMath::kFp32, 1e-4f, nullptr, graph);
  }
}

// Tensor parallelism on one GPU: three shards on streams of their own, sharing the plan's
// memory or each with its own (as on another device: copies in and out, weights apart), step
// by step and as a CUDA graph (three runs: step by step, captured, replayed), in fp32 and
// fp16, answer as the CPU engine does. The recommender's products carry a bias and ReLU or
// a following sigmoid; the text classifier's a residual.
TEST_F(GpuPlanTest, TensorParallelPlansOnOneGpuMatchTheCpuEngine) {
  // Three different inputs in a row, so that a shard reading the run before's input shows.
  std::vector<std::vector<int64_t>> ids(3, std::vector<int64_t>(2 * 32));
  for (size_t r = 0; r < ids.size(); ++r)
    for (size_t i = 0; i < ids[r].size(); ++i)
      ids[r][i] = static_cast<int64_t>((i * 37 + r * 11) % 50);
  for (const std::vector<bool>& own : {std::vector<bool>{}, std::vector<bool>{false, true, true}}) {
    SCOPED_TRACE(own.empty() ? "shared memory" : "memory of their own");
    TensorParallelOptions tp;
    tp.shards = 3;
    tp.min_columns = 16;
    tp.own_memory = own;
    for (bool graph : {false, true}) {
      SCOPED_TRACE(graph ? "CUDA graph" : "step by step");
      Prepared rec = Prepare(Model::Load(Example("recommender")), {{8, 64}});
      ExpectGpuMatchesCpu(rec,
                          {{Random({8, 64}, 111)}, {Random({8, 64}, 112)}, {Random({8, 64}, 113)}},
                          GemmMath::kFp32, 1e-5f, nullptr, graph, tp);
      Prepared text = Prepare(Model::Load(Example("text_classifier")), {{2, 32}});
      ExpectGpuMatchesCpu(text,
                          {{I64({2, 32}, ids[0])}, {I64({2, 32}, ids[1])}, {I64({2, 32}, ids[2])}},
                          GemmMath::kFp32, 1e-4f, nullptr, graph, tp);
    }
    Prepared rec = Prepare(Model::Load(Example("recommender")), {{8, 64}});
    ExpectGpuMatchesCpu(rec, {{Random({8, 64}, 114)}, {Random({8, 64}, 115)}}, GemmMath::kFp16,
                        2e-2f, nullptr, true, tp);
  }
}

// Concat, standalone BatchNormalization and Pad (DenseNet), Clip as ReLU6 (MobileNet V2),
// HardSigmoid and HardSwish (MobileNet V3), Slice (ShuffleNet's channel split), on their
// reference inputs.
TEST_F(GpuPlanTest, DenseNetAndMobileNetsMatchTheCpuEngine) {
  for (const char* name : {"densenet_op13", "mobilenet_v2_op13", "mobilenet_v3_op13",
                           "efficientnet_op13", "squeezenet_op13", "shufflenet_op13"}) {
    SCOPED_TRACE(name);
    const engine::testing::Reference ref =
        engine::testing::LoadReference(std::string(name) + ".b4.sht");
    ASSERT_EQ(ref.inputs.size(), 1u);
    const Tensor& x = ref.inputs[0].tensor;
    Prepared p =
        Prepare(Model::Load(engine::testing::ModelPath(std::string(name) + ".onnx")), {x.shape()});
    ExpectGpuMatchesCpu(p, {{x}, {Random(x.shape(), 81)}}, GemmMath::kFp32, 1e-4f);
  }
}

// Each model on its reference inputs, then on others: float inputs drawn anew, integer
// ones (token ids, masks, row ids) reversed, so they stay valid.
TEST_F(GpuPlanTest, TheDecomposedBertTheMlpAndTheVaeMatchTheCpuEngine) {
  for (const char* name : {"bert_decomposed_op13", "bert_decomposed_op17", "mlp_op13", "mlp_op17",
                           "vae_op13", "vae_op17"}) {
    SCOPED_TRACE(name);
    WithReference r = PrepareWithReference(name);
    std::vector<Tensor> other;
    for (const Tensor& t : r.inputs) {
      if (t.dtype() == DataType::kFp32) {
        other.push_back(Random(t.shape(), 91));
      } else {
        ASSERT_EQ(t.dtype(), DataType::kInt64);
        auto v = t.values<int64_t>();
        other.push_back(I64(t.shape(), std::vector<int64_t>(v.rbegin(), v.rend())));
      }
    }
    ExpectGpuMatchesCpu(r.prepared, {r.inputs, other}, GemmMath::kFp32, 1e-4f);
  }
}

// Both RoiAlign models (both coordinate modes, a fixed and an adaptive sampling grid) on
// their two reference inputs; then rois naming an image the batch lacks are an error, as
// on the CPU, and the next run is fine.
TEST_F(GpuPlanTest, RoiAlignMatchesTheCpuEngine) {
  for (const char* name : {"det_roi_align_op13", "det_roi_align_aligned_op17"}) {
    SCOPED_TRACE(name);
    WithReference a = PrepareWithReference(name, ".a.sht");
    WithReference b = PrepareWithReference(name, ".b.sht");
    ExpectGpuMatchesCpu(a.prepared, {a.inputs}, GemmMath::kFp32, 1e-5f);
    ExpectGpuMatchesCpu(b.prepared, {b.inputs}, GemmMath::kFp32, 1e-5f);
    ASSERT_TRUE(a.prepared.plan);
    auto lowered = LowerPlan(a.prepared.model->graph(), *a.prepared.plan);
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    auto plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    // rois [R, 5], each row's batch index first: the first names image 1000.
    std::vector<float> rows(a.inputs[1].values<float>().begin(), a.inputs[1].values<float>().end());
    rows[0] = 1000.f;
    const Tensor bad = Tensor::FromVector<float>(DataType::kFp32, a.inputs[1].shape(), rows);
    std::vector<Tensor> out;
    const Status refused = (*plan)->Run({&a.inputs[0], &bad}, *run_stream_, &out);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(), HasSubstr("(RoiAlign): a batch index was out of range"));
    const std::vector<const Tensor*> good = {&a.inputs[0], &a.inputs[1]};
    EXPECT_TRUE((*plan)->Run(good, *run_stream_, &out).ok());
    // A box far past the input: the model with an adaptive sampling grid refuses it, as the
    // CPU engine does, and the one with a fixed grid samples it; the next run is fine.
    rows.assign(a.inputs[1].values<float>().begin(), a.inputs[1].values<float>().end());
    rows[3] = rows[4] = 1e9f;  // row 0's x2 and y2
    const Tensor huge = Tensor::FromVector<float>(DataType::kFp32, a.inputs[1].shape(), rows);
    std::vector<Tensor> cpu_out;
    dnnl::stream cpu_stream(CpuEngine());
    const Status on_cpu = a.prepared.plan->Run({&a.inputs[0], &huge}, cpu_stream, &cpu_out);
    const Status on_gpu = (*plan)->Run({&a.inputs[0], &huge}, *run_stream_, &out);
    EXPECT_EQ(on_gpu.ok(), on_cpu.ok()) << on_gpu.ToString() << " / " << on_cpu.ToString();
    if (!on_gpu.ok()) {
      EXPECT_THAT(on_gpu.message(), HasSubstr("(RoiAlign): a roi is not finite"));
    }
    EXPECT_TRUE((*plan)->Run(good, *run_stream_, &out).ok());
  }
}

// Every recurrent test model: the graph models on their full and ragged sequence_lens (one
// plan, both runs), PyTorch's at batch 1 and 4; then a sequence length past the sequence is
// refused naming the node, and the next run is fine.
TEST_F(GpuPlanTest, TheRecurrentModelsMatchTheCpuEngine) {
  for (const char* name : {"rnn_graph_gru", "rnn_graph_lstm", "rnn_graph_layout1"}) {
    SCOPED_TRACE(name);
    WithReference full = PrepareWithReference(name, ".full.sht");
    WithReference ragged = PrepareWithReference(name, ".ragged.sht");
    ExpectGpuMatchesCpu(full.prepared, {full.inputs, ragged.inputs, full.inputs}, GemmMath::kFp32,
                        1e-4f);
  }
  WithReference rnn = PrepareWithReference("rnn_graph_rnn", ".sht");
  ExpectGpuMatchesCpu(rnn.prepared, {rnn.inputs, rnn.inputs}, GemmMath::kFp32, 1e-4f);
  for (const char* name : {"rnn_gru_bi2_op17", "rnn_lstm_bi2_op13", "rnn_lstm_classifier_op17",
                           "rnn_lstm_state_op17", "rnn_rnn_relu_op13", "rnn_rnn_tanh_bi_op17"}) {
    SCOPED_TRACE(name);
    for (const char* suffix : {".b1.sht", ".b4.sht"}) {
      WithReference r = PrepareWithReference(name, suffix);
      ExpectGpuMatchesCpu(r.prepared, {r.inputs, r.inputs}, GemmMath::kFp32, 1e-4f);
    }
  }
  WithReference gru = PrepareWithReference("rnn_graph_gru", ".ragged.sht");
  ASSERT_TRUE(gru.prepared.plan);
  auto lowered = LowerPlan(gru.prepared.model->graph(), *gru.prepared.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  auto plan = GpuPlan::Create(std::move(lowered).value(), *handle_, *run_stream_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // Inputs x, seq_lens (int32), h0.
  ASSERT_EQ(gru.inputs.size(), 3u);
  std::vector<int32_t> lens(gru.inputs[1].values<int32_t>().begin(),
                            gru.inputs[1].values<int32_t>().end());
  lens[0] = 9;  // of 5 steps
  const Tensor bad = Tensor::FromVector<int32_t>(DataType::kInt32, gru.inputs[1].shape(), lens);
  std::vector<Tensor> out;
  const Status refused = (*plan)->Run({&gru.inputs[0], &bad, &gru.inputs[2]}, *run_stream_, &out);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("(GRU): a sequence length was outside"));
  EXPECT_TRUE(
      (*plan)->Run({&gru.inputs[0], &gru.inputs[1], &gru.inputs[2]}, *run_stream_, &out).ok());
}

// The GridSample model on both reference inputs; then GridSample on volumes in every linear
// and nearest mode, padding and alignment (PyTorch's reference inputs), and grids with NaN
// and infinite coordinates on a plane and a volume, against the CPU engine.
TEST_F(GpuPlanTest, GridSampleMatchesTheCpuEngine) {
  for (const char* suffix : {".a.sht", ".b.sht"}) {
    WithReference r = PrepareWithReference("det_grid_sample_op17", suffix);
    ExpectGpuMatchesCpu(r.prepared, {r.inputs}, GemmMath::kFp32, 1e-5f);
  }
  const engine::testing::Reference ref = engine::testing::LoadReference("gridsample_3d.sht");
  ASSERT_EQ(ref.inputs.size(), 2u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const char* mode : {"bilinear", "nearest"}) {
    for (const char* pad : {"zeros", "border", "reflection"}) {
      for (int64_t align : {0, 1}) {
        SCOPED_TRACE(std::string(mode) + " " + pad + " " + std::to_string(align));
        GraphBuilder b;
        const int x = b.Input("x", ref.inputs[0].tensor.shape());
        const int grid = b.Input("grid", ref.inputs[1].tensor.shape());
        Graph g = b.Finish(b.Op("GridSample", "gs", {x, grid},
                                {{"mode", engine::testing::AString(mode)},
                                 {"padding_mode", engine::testing::AString(pad)},
                                 {"align_corners", AInt(align)}}));
        Prepared p = Prepare(Model::FromGraph(std::move(g)),
                             {ref.inputs[0].tensor.shape(), ref.inputs[1].tensor.shape()});
        ExpectGpuMatchesCpu(p, {{ref.inputs[0].tensor, ref.inputs[1].tensor}}, GemmMath::kFp32,
                            1e-5f);
        // A volume read at non-finite coordinates: outside (zeros), or clamped by border.
        GraphBuilder vb;
        const int vx = vb.Input("x", {1, 1, 1, 2, 2});
        const int vg = vb.Input("grid", {1, 1, 1, 2, 3});
        Graph vgraph = vb.Finish(vb.Op("GridSample", "gs", {vx, vg},
                                       {{"mode", engine::testing::AString(mode)},
                                        {"padding_mode", engine::testing::AString(pad)},
                                        {"align_corners", AInt(align)}}));
        Prepared v =
            Prepare(Model::FromGraph(std::move(vgraph)), {{1, 1, 1, 2, 2}, {1, 1, 1, 2, 3}});
        ExpectGpuMatchesCpu(
            v, {{F32({1, 1, 1, 2, 2}, {1, 2, 3, 4}), F32({1, 1, 1, 2, 3}, {nan, 0, 0, 0, 0, inf})}},
            GemmMath::kFp32, 1e-6f);
      }
    }
  }
  for (const char* mode : {"bilinear", "nearest", "bicubic"}) {
    SCOPED_TRACE(std::string(mode) + " on a plane at non-finite coordinates");
    GraphBuilder b;
    const int x = b.Input("x", {1, 1, 2, 2});
    const int grid = b.Input("grid", {1, 1, 4, 2});
    Graph g =
        b.Finish(b.Op("GridSample", "gs", {x, grid}, {{"mode", engine::testing::AString(mode)}}));
    Prepared p = Prepare(Model::FromGraph(std::move(g)), {{1, 1, 2, 2}, {1, 1, 4, 2}});
    ExpectGpuMatchesCpu(
        p,
        {{F32({1, 1, 2, 2}, {1, 2, 3, 4}), F32({1, 1, 4, 2}, {nan, 0, 0, nan, inf, 0, -inf, nan})}},
        GemmMath::kFp32, 1e-6f);
  }
}

TEST_F(GpuPlanTest, ExpandMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(ExpandGraph()), {{3, 1}, {1, 4}});
  ExpectGpuMatchesCpu(p,
                      {{Random({3, 1}, 121), I64({1, 4}, {1, -(int64_t{1} << 40), INT64_MAX, 7})},
                       {Random({3, 1}, 122), I64({1, 4}, {4, 3, 2, 1})}},
                      GemmMath::kFp32, 0.f);
}

// int64 (values past 32 bits, negative ones) and int32 through Slice, Concat and Split:
// exactly the CPU engine's.
TEST_F(GpuPlanTest, IntegerSliceConcatAndSplitMatchTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(Int64CopiesGraph()), {{2, 6}});
  ExpectGpuMatchesCpu(p,
                      {{I64({2, 6}, {0, 1, -2, int64_t{1} << 40, 5, -(int64_t{1} << 50), 7, 8, 9,
                                     10, INT64_MAX, INT64_MIN})},
                       {I64({2, 6}, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22})}},
                      GemmMath::kFp32, 0.f);
  Prepared q = Prepare(Model::FromGraph(Int64CopiesGraph(DataType::kInt32)), {{2, 6}});
  Tensor ids = Tensor::FromVector<int32_t>(DataType::kInt32, {2, 6},
                                           {0, 1, -2, 3, 4, -5, 6, 7, 8, 9, 10, INT32_MIN});
  ExpectGpuMatchesCpu(q, {{ids}, {ids}}, GemmMath::kFp32, 0.f);
}

// The fp16 models (their inputs, weights and outputs fp16; the engine computes in fp32
// between a Cast from fp16 and one back) on both reference inputs.
TEST_F(GpuPlanTest, TheFp16ModelsMatchTheCpuEngine) {
  for (const char* name : {"fp16_cnn", "fp16_mixed", "fp16_transformer"}) {
    SCOPED_TRACE(name);
    for (const char* suffix : {".b1.sht", ".b4.sht"}) {
      WithReference r = PrepareWithReference(name, suffix);
      ExpectGpuMatchesCpu(r.prepared, {r.inputs, r.inputs}, GemmMath::kFp32, 2e-3f);
    }
  }
}

// Each on its two reference inputs, which share their shapes.
TEST_F(GpuPlanTest, EveryResizeModeMatchesTheCpuEngine) {
  for (const char* name :
       {"det_resize_op13", "det_resize_op17", "resize_from_shape_op13", "resize_from_shape_op17"}) {
    SCOPED_TRACE(name);
    WithReference a = PrepareWithReference(name, ".a.sht");
    WithReference b = PrepareWithReference(name, ".b.sht");
    ASSERT_EQ(a.inputs.size(), b.inputs.size());
    for (size_t i = 0; i < a.inputs.size(); ++i)
      ASSERT_EQ(a.inputs[i].shape(), b.inputs[i].shape());
    ExpectGpuMatchesCpu(a.prepared, {a.inputs, b.inputs}, GemmMath::kFp32, 1e-5f);
  }
}

// Instance and group normalisation, DepthToSpace and SpaceToDepth, Floor, integer Mod,
// ArgMax, ConvTranspose and Resize together (the U-Net), each on its two reference inputs.
TEST_F(GpuPlanTest, TheDetectionLayoutAndNormModelsMatchTheCpuEngine) {
  for (const char* name : {"det_graph_layout_norm", "det_norm_shuffle_op13",
                           "det_norm_shuffle_op17", "det_unet_op13", "det_unet_op17"}) {
    SCOPED_TRACE(name);
    WithReference a = PrepareWithReference(name, ".a.sht");
    WithReference b = PrepareWithReference(name, ".b.sht");
    ASSERT_EQ(a.inputs.size(), b.inputs.size());
    for (size_t i = 0; i < a.inputs.size(); ++i)
      ASSERT_EQ(a.inputs[i].shape(), b.inputs[i].shape());
    ExpectGpuMatchesCpu(a.prepared, {a.inputs, b.inputs}, GemmMath::kFp32, 1e-4f);
  }
}

TEST_F(GpuPlanTest, TheDecoderMatchesTheCpuEngine) {
  for (int64_t batch : {1, 8}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Prepared p = Prepare(Model::Load(Example("decoder")), {{batch, 16}});
    ExpectGpuMatchesCpu(p, {{Random({batch, 16}, 61)}, {Random({batch, 16}, 62)}}, GemmMath::kFp32,
                        1e-4f);
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
  EXPECT_THAT(ran.message(), HasSubstr("(Gather): an index was out of range"));
  const Tensor bad_shape = I64({1, 4}, {0, 1, 2, 3});
  ran = (*gpu_plan)->Run({&bad_shape}, *run_stream_, &out);
  EXPECT_EQ(ran.code(), StatusCode::kInvalidArgument);
  // A good run after both.
  const Tensor good = I64({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  ran = (*gpu_plan)->Run({&good}, *run_stream_, &out);
  EXPECT_TRUE(ran.ok()) << ran.ToString();
}

// GatherElements of fp32 and int64 data (values past 32 bits), negative indices included,
// exactly the CPU engine's; an index out of range fails the run naming the node, and the
// next run is fine.
TEST_F(GpuPlanTest, GatherElementsMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(GatherElementsGraph()), kGatherElementsShapes);
  const Tensor ids = I64({3, 4}, {0, 1, -2, int64_t{1} << 40, 5, -(int64_t{1} << 50), 7, 8, 9, 10,
                                  INT64_MAX, INT64_MIN});
  ExpectGpuMatchesCpu(p,
                      {{Random({3, 4}, 131), I64({2, 4}, {0, -1, 2, 1, -3, 0, 1, 2}), ids,
                        I64({3, 2}, {3, -4, 0, 1, 2, -1})},
                       {Random({3, 4}, 132), I64({2, 4}, {2, 2, 2, 2, 0, -2, -3, -1}), ids,
                        I64({3, 2}, {-1, -1, 0, 0, 3, 2})}},
                      GemmMath::kFp32, 0.f);
  std::unique_ptr<GpuPlan> plan = CreatePlan(p);
  ASSERT_TRUE(plan);
  const Tensor x = Random({3, 4}, 133), idx2 = I64({3, 2}, {0, 1, 2, 3, 0, 1});
  const Tensor bad = I64({2, 4}, {0, 1, 2, 3, 0, 0, 0, 0});  // 3 is past axis 0's 3 rows
  const Tensor good = I64({2, 4}, {0, 1, 2, -3, 0, 0, 0, 0});
  std::vector<Tensor> out;
  Status ran = plan->Run({&x, &bad, &ids, &idx2}, *run_stream_, &out);
  EXPECT_EQ(ran.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(ran.message(), HasSubstr("node 'g0' (GatherElements): an index was out of range"));
  ran = plan->Run({&x, &good, &ids, &idx2}, *run_stream_, &out);
  EXPECT_TRUE(ran.ok()) << ran.ToString();
}

// ScatterElements and ScatterND under every reduction, with duplicate indices (one given as
// a negative index): with none, the last update in row-major order wins, exactly as on the
// CPU, run after run; add and mul may sum in another order, so within a small tolerance;
// max and min exactly. An index out of range fails the run naming the node.
TEST_F(GpuPlanTest, ScattersMatchTheCpuEngine) {
  for (const char* reduction : {"none", "add", "mul", "max", "min"}) {
    SCOPED_TRACE(reduction);
    Prepared p = Prepare(Model::FromGraph(ScatterGraph(reduction)), kScatterShapes);
    const std::string r = reduction;
    const float tolerance = r == "add" || r == "mul" ? 1e-6f : 0.f;
    std::vector<std::vector<Tensor>> runs;
    for (uint32_t seed : {141u, 142u, 143u}) {
      runs.push_back({Random({4, 3}, seed), I64({2, 3}, {1, 1, -1, 1, 0, 3}),
                      Random({2, 3}, seed + 10), I64({3, 1}, {2, -2, 0}),
                      Random({3, 3}, seed + 20)});
    }
    // Every update to one element: rows 0 and -4 of the data.
    runs.push_back({Random({4, 3}, 144), I64({2, 3}, {0, 0, 0, -4, -4, -4}), Random({2, 3}, 154),
                    I64({3, 1}, {-4, 0, 0}), Random({3, 3}, 164)});
    ExpectGpuMatchesCpu(p, runs, GemmMath::kFp32, tolerance);
  }
  Prepared p = Prepare(Model::FromGraph(ScatterGraph("none")), kScatterShapes);
  std::unique_ptr<GpuPlan> plan = CreatePlan(p);
  ASSERT_TRUE(plan);
  const Tensor data = Random({4, 3}, 145), eupd = Random({2, 3}, 146), nupd = Random({3, 3}, 147);
  const Tensor eidx = I64({2, 3}, {0, 1, 2, 3, 2, 1}), nidx = I64({3, 1}, {0, 1, 2});
  const Tensor bad_eidx = I64({2, 3}, {0, 1, 2, 4, 2, 1}), bad_nidx = I64({3, 1}, {0, -5, 2});
  std::vector<Tensor> out;
  Status ran = plan->Run({&data, &bad_eidx, &eupd, &nidx, &nupd}, *run_stream_, &out);
  EXPECT_EQ(ran.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(ran.message(), HasSubstr("(ScatterElements): an index was out of range"));
  ran = plan->Run({&data, &eidx, &eupd, &bad_nidx, &nupd}, *run_stream_, &out);
  EXPECT_EQ(ran.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(ran.message(), HasSubstr("(ScatterND): an index was out of range"));
  ran = plan->Run({&data, &eidx, &eupd, &nidx, &nupd}, *run_stream_, &out);
  EXPECT_TRUE(ran.ok()) << ran.ToString();
}

// CumSum inclusive and exclusive, forward and reversed, fp32 (summed in the CPU's order) and
// int64 (values past 32 bits).
TEST_F(GpuPlanTest, CumSumMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(CumSumGraph()), kCumSumShapes);
  ExpectGpuMatchesCpu(p,
                      {{Random({2, 3, 4}, 151), I64({2, 5}, {1, -(int64_t{1} << 40), 3,
                                                             int64_t{1} << 50, 5, 6, 7, 8, 9, 10})},
                       {Random({2, 3, 4}, 152, -100.f, 100.f),
                        I64({2, 5}, {-1, -2, -3, -4, -5, 0, 0, 0, 0, int64_t{1} << 33})}},
                      GemmMath::kFp32, 1e-6f);
}

// Trilu upper and lower with k 0, 1 and -1, over a batch of fp32 matrices and int64 ones,
// bit for bit.
TEST_F(GpuPlanTest, TriluMatchesTheCpuEngine) {
  Prepared p = Prepare(Model::FromGraph(TriluGraph()), kTriluShapes);
  ExpectGpuMatchesCpu(
      p,
      {{Random({2, 3, 4}, 161), I64({3, 3}, {1, 2, 3, INT64_MAX, 5, 6, 7, 8, INT64_MIN})},
       {Random({2, 3, 4}, 162), I64({3, 3}, {9, 8, 7, 6, 5, 4, 3, 2, 1})}},
      GemmMath::kFp32, 0.f);
}

}  // namespace
}  // namespace shoal::engine::cuda
