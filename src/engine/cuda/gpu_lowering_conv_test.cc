// Convolutions in the GPU plan's lowering (gpu_lowering.h): on im2col and cuBLASLt GEMMs
// (the default), on cuDNN (GpuPlanOptions::conv = kCudnn), and transposed. Host only, runs
// everywhere, with or without cuDNN (lowering never loads it). Runs on a device are in
// gpu_plan_test.cc and cudnn_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AInts;
using engine::testing::AString;
using engine::testing::GraphBuilder;
using engine::testing::Random;
using K = GpuStep::Kind;

const GpuStep* FirstStep(const GpuLowering& l, GpuStep::Kind kind) {
  for (const GpuStep& s : l.steps)
    if (s.kind == kind) return &s;
  return nullptr;
}

// What a mixed-precision plan's roundings to 16 bits look like: each value is rounded once,
// by a kToHalf step, by the epilogue that wrote it (GpuStep::half_out) or by a max pool of
// 16-bit values; each cuDNN convolution, and each such pool, reads the rounding of its
// input, made before it, and so does each epilogue that reads its residual in 16 bits; an
// epilogue that stopped writing fp32 rounds instead, and nothing reads its fp32 result, nor
// the fp32 output of a pool in 16 bits.
struct Roundings {
  int steps = 0;      // kToHalf
  int fused = 0;      // epilogues with half_out
  int dropped = 0;    // epilogues writing 16 bits alone
  int pools = 0;      // max pools of 16-bit values
  int residuals = 0;  // epilogues reading their residual in 16 bits
};
Roundings CheckRoundings(const Graph& g, const GpuLowering& l, DataType half) {
  Roundings r;
  // Whatever a step reads, and every graph output, has bytes: a value an epilogue stopped
  // writing has none, and neither do its views.
  for (const GpuStep& s : l.steps)
    for (int v : s.in)
      if (v >= 0) {
        EXPECT_NE(l.values[v].home, GpuValue::Home::kNone) << "value " << v;
      }
  for (int v : g.outputs) EXPECT_NE(l.values[v].home, GpuValue::Home::kNone) << "output " << v;
  std::map<int, int> rounding_of;  // fp32 value -> its 16-bit rounding
  std::set<int> read;
  for (const GpuStep& s : l.steps)
    for (int v : s.in)
      if (v >= 0) read.insert(v);
  for (const GpuStep& s : l.steps) {
    if (s.kind == K::kToHalf) {
      ++r.steps;
      EXPECT_TRUE(rounding_of.emplace(s.in[0], s.out).second) << "value " << s.in[0];
    }
    if (s.kind == K::kConvEpilogue && s.half_out >= 0) {
      ++r.fused;
      const int y = g.nodes[s.node].outputs[0];
      EXPECT_EQ(l.dtypes[s.half_out], half);
      EXPECT_TRUE(rounding_of.emplace(y, s.half_out).second) << "value " << y;
      if (s.out < 0) {
        ++r.dropped;
        EXPECT_TRUE(s.conv_epilogue.source.has_value());
        EXPECT_FALSE(read.count(y)) << g.nodes[s.node].name;
        EXPECT_EQ(std::count(g.outputs.begin(), g.outputs.end(), y), 0);
      } else {
        EXPECT_EQ(s.out, y);
      }
    } else if (s.kind == K::kConvEpilogue) {
      EXPECT_GE(s.out, 0);
    }
    if (s.kind == K::kConvEpilogue && s.in[1] >= 0) {
      const Node& node = g.nodes[s.node];
      EXPECT_EQ(l.dtypes[s.in[1]] != DataType::kFp32, s.conv_epilogue.residual.has_value());
      if (s.conv_epilogue.residual) {
        ++r.residuals;
        EXPECT_EQ(l.dtypes[s.in[1]], half);
        EXPECT_TRUE(rounding_of.count(node.inputs[3]))
            << node.name << " reads no rounding of its residual made before it";
        if (rounding_of.count(node.inputs[3])) {
          EXPECT_EQ(s.in[1], rounding_of[node.inputs[3]]);
        }
      }
    }
    if (s.kind == K::kPool && l.dtypes[s.out] != DataType::kFp32) {
      ++r.pools;
      const Node& node = g.nodes[s.node];
      EXPECT_EQ(s.pool, PoolOp::kMax) << node.name;
      EXPECT_EQ(l.dtypes[s.out], half);
      EXPECT_TRUE(rounding_of.count(node.inputs[0])) << node.name << " reads no rounding before it";
      if (rounding_of.count(node.inputs[0])) {
        EXPECT_EQ(s.in[0], rounding_of[node.inputs[0]]);
      }
      EXPECT_TRUE(rounding_of.emplace(node.outputs[0], s.out).second) << node.name;
      EXPECT_FALSE(read.count(node.outputs[0])) << node.name;
      EXPECT_EQ(std::count(g.outputs.begin(), g.outputs.end(), node.outputs[0]), 0);
    }
    if (s.kind == K::kConv) {
      const Node& node = g.nodes[s.node];
      EXPECT_TRUE(rounding_of.count(node.inputs[0])) << node.name << " reads no rounding before it";
      if (rounding_of.count(node.inputs[0])) {
        EXPECT_EQ(s.in[0], rounding_of[node.inputs[0]]);
      }
    }
  }
  return r;
}

// What a plan's channels-last values look like (GpuLowering::channels_last): each is a 16-bit
// value of rank 4 that no graph input or output names; every step that reads one reads it
// channels last (a convolution's x, a 16-bit pool's x, an epilogue's c or 16-bit residual);
// a convolution's x and y, and a pool's x and y, share a layout; a channels-last
// convolution's weight is the blob stored [m, kh, kw, c/groups]; every step's flags match
// its operands' layouts; and no fp32 value is channels last.
struct ChannelsLastCount {
  int convs = 0;   // convolutions running NHWC
  int values = 0;  // values stored channels last
};
ChannelsLastCount CheckChannelsLast(const Graph& g, const GpuLowering& l) {
  ChannelsLastCount c;
  for (size_t v = 0; v < l.channels_last.size(); ++v) {
    if (!l.channels_last[v]) continue;
    ++c.values;
    EXPECT_EQ(l.shapes[v].size(), 4u) << "value " << v;
    EXPECT_TRUE(l.dtypes[v] == DataType::kFp16 || l.dtypes[v] == DataType::kBf16) << "value " << v;
    EXPECT_EQ(std::count(g.inputs.begin(), g.inputs.end(), static_cast<int>(v)), 0);
    EXPECT_EQ(std::count(g.outputs.begin(), g.outputs.end(), static_cast<int>(v)), 0);
  }
  for (const GpuStep& s : l.steps) {
    const std::string& name = g.nodes[s.node].name;
    for (size_t k = 0; k < s.in.size(); ++k) {
      if (!l.ChannelsLast(s.in[k])) continue;
      const bool reads_it =
          (s.kind == K::kConv && k == 0 && s.conv.channels_last) ||
          (s.kind == K::kPool && k == 0 && s.channels_last) ||
          (s.kind == K::kConvEpilogue && ((k == 0 && s.conv_epilogue.source_channels_last) ||
                                          (k == 1 && s.conv_epilogue.residual_channels_last)));
      EXPECT_TRUE(reads_it) << name << " reads a channels-last value as NCHW";
    }
    switch (s.kind) {
      case K::kConv: {
        EXPECT_EQ(s.conv.channels_last, l.ChannelsLast(s.in[0])) << name;
        EXPECT_EQ(s.conv.channels_last, l.ChannelsLast(s.out)) << name;
        const std::string& key = l.blobs[static_cast<size_t>(s.weight_slots[0])].key;
        EXPECT_EQ(key.size() > 5 && key.compare(key.size() - 5, 5, "~nhwc") == 0,
                  s.conv.channels_last)
            << name << ": " << key;
        c.convs += s.conv.channels_last;
        break;
      }
      case K::kConvEpilogue:
        if (l.ChannelsLast(s.half_out)) {
          // Laid out by the epilogue's own [n, m, spatial]: not a view's other shape.
          EXPECT_EQ(l.shapes[s.half_out], l.shapes[s.in[0]]) << name;
        }
        EXPECT_EQ(s.conv_epilogue.source_channels_last, l.ChannelsLast(s.in[0])) << name;
        EXPECT_EQ(s.conv_epilogue.residual_channels_last, l.ChannelsLast(s.in[1])) << name;
        EXPECT_EQ(s.conv_epilogue.half_channels_last, l.ChannelsLast(s.half_out)) << name;
        EXPECT_FALSE(l.ChannelsLast(s.out)) << name;
        break;
      case K::kPool:
        EXPECT_EQ(s.channels_last, l.ChannelsLast(s.out)) << name;
        EXPECT_EQ(l.ChannelsLast(s.in[0]), l.ChannelsLast(s.out)) << name;
        break;
      case K::kToHalf:
        EXPECT_EQ(s.channels_last, l.ChannelsLast(s.out)) << name;
        EXPECT_FALSE(l.ChannelsLast(s.in[0])) << name;
        break;
      default:
        EXPECT_FALSE(l.ChannelsLast(s.out)) << name;
        EXPECT_FALSE(l.ChannelsLast(s.half_out)) << name;
        EXPECT_FALSE(s.channels_last) << name;
    }
  }
  return c;
}

// The example image classifier: four convolutions (im2col and a GEMM each), two max pools
// and the global average pool as a reduction.
TEST(LowerConvTest, ConvolutionsBecomeIm2ColAndGemms) {
  Prepared p = Prepare(Model::Load(Example("image_classifier")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  int im2col = 0, pools = 0, reductions = 0;
  for (const GpuStep& s : lowered->steps) {
    if (s.kind == GpuStep::Kind::kIm2Col) {
      ++im2col;
      EXPECT_EQ(s.window.groups, 1);
      EXPECT_EQ(s.window.n, 2);
    }
    pools += s.kind == GpuStep::Kind::kPool;
    reductions += s.kind == GpuStep::Kind::kReduce;
  }
  EXPECT_EQ(im2col, 4);
  EXPECT_EQ(pools, 2);
  EXPECT_EQ(reductions, 1);
  ExpectAligned(*lowered);
}

TEST(LowerConvTest, AGroupedConvolutionIsABatchOfGemmsWithItsBiasAfter) {
  Prepared p = Prepare(Model::FromGraph(GroupedConvGraph()), {{2, 4, 9, 9}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  std::vector<K> kinds;
  for (const GpuStep& s : lowered->steps) kinds.push_back(s.kind);
  EXPECT_EQ(kinds,
            (std::vector<K>{K::kIm2Col, K::kGemm, K::kTranspose, K::kConvEpilogue, K::kPool}));
  const GpuStep& gemm = lowered->steps[1];
  EXPECT_EQ(gemm.gemm.batch, 2);
  EXPECT_EQ(gemm.gemm.m, 2 * 5 * 5);  // images x output positions
  EXPECT_EQ(gemm.gemm.n, 3);          // output channels per group
  EXPECT_EQ(gemm.gemm.k, 2 * 3 * 3);  // input channels per group x kernel
  EXPECT_EQ(gemm.gemm.epilogue, GemmEpilogue::kNone);
  EXPECT_TRUE(gemm.gemm.transpose_w);
  // The bias and ReLU after the transpose, in one pass in place: y = relu(y + bias).
  const GpuStep& after = lowered->steps[3];
  const int y = lowered->steps[2].out;
  EXPECT_EQ(after.in, (std::vector<int>{y, -1}));
  EXPECT_EQ(after.out, y);
  EXPECT_FALSE(after.conv_epilogue.source.has_value());
  EXPECT_EQ(after.conv_epilogue.act, UnaryOp::kRelu);
  EXPECT_FALSE(after.conv_epilogue.post.has_value());
  EXPECT_EQ(after.conv_epilogue.n, 2);
  EXPECT_EQ(after.conv_epilogue.m, 6);
  EXPECT_EQ(after.conv_epilogue.spatial, 5 * 5);
  ASSERT_GE(after.weight_slots[0], 0);
  const Tensor& bias = lowered->blobs[static_cast<size_t>(after.weight_slots[0])].data;
  ASSERT_EQ(bias.element_count(), 6);
  const Tensor want = Random({6}, 22);  // GroupedConvGraph's bias
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(bias.values<float>()[i], want.values<float>()[i]);
  EXPECT_EQ(lowered->steps[4].pool, PoolOp::kAverageIncludePad);
  EXPECT_EQ(lowered->steps[4].window.oh, 3);  // ceil((5 + 2 - 3) / 2) + 1
}

// On im2col, ResNet's Conv+Add+Relu is a GEMM with its bias in the epilogue, then one
// epilogue step in place for the rest: the residual, then the ReLU after it.
TEST(LowerConvTest, AResidualAndItsReluFollowTheGemmInOneStep) {
  Prepared p =
      Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  int with_residual = 0;
  for (const GpuStep& s : lowered->steps) {
    EXPECT_NE(s.kind, K::kUnary);
    EXPECT_NE(s.kind, K::kBinary);
    if (s.kind != K::kConvEpilogue) continue;
    const Node& node = p.model->graph().nodes[s.node];
    ++with_residual;
    ASSERT_TRUE(node.has_input(3)) << node.name;
    EXPECT_EQ(s.in, (std::vector<int>{node.outputs[0], node.inputs[3]}));
    EXPECT_EQ(s.out, node.outputs[0]);
    EXPECT_FALSE(s.conv_epilogue.source.has_value());
    EXPECT_FALSE(s.conv_epilogue.act.has_value());
    EXPECT_EQ(s.conv_epilogue.post, UnaryOp::kRelu);
    EXPECT_EQ(s.weight_slots[0], -1);  // the GEMM's epilogue added the bias
  }
  EXPECT_EQ(with_residual, 2);
}

// The decoder's ConvTranspose (kernel 4, stride 2, pads 1) is one step holding its window:
// each spatial size doubles.
TEST(LowerConvTest, ATransposedConvolutionIsOneStepWithItsWindow) {
  Prepared p = Prepare(Model::Load(Example("decoder")), {{2, 16}});
  ASSERT_TRUE(p.plan);
  auto l = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const GpuStep* s = FirstStep(*l, GpuStep::Kind::kConvTranspose);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->window.kh, 4);
  EXPECT_EQ(s->window.sh, 2);
  EXPECT_EQ(s->window.ph, 1);
  EXPECT_EQ(s->window.ph_end, 1);
  EXPECT_EQ(s->window.oh, 2 * s->window.h);
  EXPECT_EQ(s->window.ow, 2 * s->window.w);
  EXPECT_EQ(l->shapes[s->out], (Shape{2, s->length, s->window.oh, s->window.ow}));
  ASSERT_EQ(s->in.size(), 3u);
  EXPECT_GE(s->in[2], 0);  // its bias
  // The VAE's decoder has output_padding 1: its output is one row and column larger.
  WithReference vae = PrepareWithReference("vae_op13");
  ASSERT_TRUE(vae.prepared.plan);
  auto v = LowerPlan(vae.prepared.model->graph(), *vae.prepared.plan);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const GpuStep* t = FirstStep(*v, GpuStep::Kind::kConvTranspose);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->window.oh, 2 * t->window.h);  // 2(h-1) + 3 + 1 - 2
}

GpuPlanOptions OnCudnn(GemmMath math = GemmMath::kFp32) {
  GpuPlanOptions options;
  options.math = math;
  options.conv = ConvEngine::kCudnn;
  return options;
}

std::vector<K> Kinds(const GpuLowering& l) {
  std::vector<K> kinds;
  for (const GpuStep& s : l.steps) kinds.push_back(s.kind);
  return kinds;
}

// The image classifier's four convolutions each carry their ReLU (Conv+Relu fused by the
// optimiser): on cuDNN one fused step each, reading the input and writing the output in
// place of im2col, a GEMM and a transpose.
TEST(LowerConvOnCudnnTest, AConvAndItsReluAreOneFusedStep) {
  Prepared p = Prepare(Model::Load(Example("image_classifier")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan, OnCudnn());
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  int convs = 0;
  for (const GpuStep& s : lowered->steps) {
    EXPECT_NE(s.kind, K::kIm2Col);
    if (s.kind != K::kConv) continue;
    ++convs;
    const Node& node = p.model->graph().nodes[s.node];
    EXPECT_EQ(node.op_type, "FusedConv");
    EXPECT_TRUE(s.conv.fused_bias_relu);
    EXPECT_FALSE(s.conv.residual);
    EXPECT_EQ(s.conv.math, GemmMath::kFp32);
    EXPECT_EQ(s.in[0], node.inputs[0]);
    EXPECT_EQ(s.in[1], -1);
    EXPECT_EQ(s.out, node.outputs[0]);
    EXPECT_EQ(s.conv.window.n, 2);
    EXPECT_EQ(s.conv.m, lowered->shapes[node.outputs[0]][1]);
    EXPECT_EQ(lowered->shapes[node.outputs[0]],
              (Shape{2, s.conv.m, s.conv.window.oh, s.conv.window.ow}));
    EXPECT_TRUE(CheckCudnnConv(s.conv).ok());
    EXPECT_NE(s.conv.what.find("FusedConv"), std::string::npos) << s.conv.what;
    // The weight as stored (fp32, [m, c, kh, kw]) and the bias.
    const GpuLowering::Blob& w = lowered->blobs[static_cast<size_t>(s.weight_slots[0])];
    EXPECT_EQ(w.data.dtype(), DataType::kFp32);
    EXPECT_EQ(w.data.shape()[0], s.conv.m);
    ASSERT_GE(s.weight_slots[1], 0);
    EXPECT_EQ(lowered->blobs[static_cast<size_t>(s.weight_slots[1])].data.element_count(),
              s.conv.m);
  }
  EXPECT_EQ(convs, 4);
  ExpectAligned(*lowered);
}

// ResNet's convolution, residual and ReLU (Conv+Add+Relu) fuse too, reading the residual as
// z; its plain convolutions are one unfused step each.
TEST(LowerConvOnCudnnTest, ResNetsResidualAndReluFuseIntoItsConvolution) {
  Prepared p =
      Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan, OnCudnn(GemmMath::kTf32));
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  int with_residual = 0, fused = 0, plain = 0;
  for (const GpuStep& s : lowered->steps) {
    EXPECT_NE(s.kind, K::kIm2Col);
    if (s.kind != K::kConv) continue;
    const Node& node = p.model->graph().nodes[s.node];
    EXPECT_EQ(s.conv.math, GemmMath::kTf32);
    if (s.conv.residual) {
      ++with_residual;
      EXPECT_TRUE(s.conv.fused_bias_relu);
      EXPECT_EQ(s.in[1], node.inputs[3]);
      EXPECT_EQ(node.GetString("post_activation", ""), "Relu");
    } else if (s.conv.fused_bias_relu) {
      ++fused;
      EXPECT_EQ(node.GetString("activation", ""), "Relu");
    } else {
      ++plain;
      EXPECT_EQ(node.op_type, "Conv");
      EXPECT_EQ(s.weight_slots[1], -1);
    }
  }
  // `shoal inspect`: Conv+Add+Relu x2, Conv+Relu x4, and the shortcut's 1x1 convolution.
  EXPECT_EQ(with_residual, 2);
  EXPECT_EQ(fused, 4);
  EXPECT_EQ(plain, 1);
  // Nothing after the fused convolutions: no activation and no addition, and one epilogue:
  // the shortcut's bias (its batch normalisation, folded), alone.
  int epilogues = 0;
  for (const GpuStep& s : lowered->steps) {
    EXPECT_NE(s.kind, K::kUnary);
    EXPECT_NE(s.kind, K::kBinary);
    if (s.kind != K::kConvEpilogue) continue;
    ++epilogues;
    EXPECT_EQ(s.in[0], s.out);  // in place on the convolution's fp32 output
    EXPECT_FALSE(s.conv_epilogue.source.has_value());
    EXPECT_EQ(s.in[1], -1);
    EXPECT_GE(s.weight_slots[0], 0);
    EXPECT_FALSE(s.conv_epilogue.act.has_value());
    EXPECT_FALSE(s.conv_epilogue.post.has_value());
  }
  EXPECT_EQ(epilogues, 1);
}

// In fp16 and bf16 cuDNN reads and writes 16 bits: x rounded first, the weight stored in 16
// bits; one epilogue pass casts the output back to fp32 with the bias and ReLU (cuDNN fuses
// them in fp32 alone). The image classifier's first convolution feeds the second alone: its
// epilogue rounds for it and writes no fp32. The next two feed max pools, which pool their
// 16-bit roundings for the next convolutions, so they write no fp32 either. The last feeds
// the global pool in fp32; kToHalf steps round the image and the Gemm's input.
TEST(LowerConvOnCudnnTest, MixedPrecisionConvolvesIn16BitsAndAddsTheBiasAfter) {
  for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
    SCOPED_TRACE(math == GemmMath::kFp16 ? "fp16" : "bf16");
    const DataType half = HalfDtypeOf(math);
    Prepared p = Prepare(Model::Load(Example("image_classifier")), {{2, 3, 32, 32}});
    ASSERT_TRUE(p.plan);
    auto lowered = LowerPlan(p.model->graph(), *p.plan, OnCudnn(math));
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    const std::vector<K> kinds = Kinds(*lowered);
    int convs = 0;
    for (size_t i = 0; i < kinds.size(); ++i) {
      if (kinds[i] != K::kConv) continue;
      ++convs;
      const GpuStep& s = lowered->steps[i];
      EXPECT_FALSE(s.conv.fused_bias_relu);
      EXPECT_EQ(s.conv.math, math);
      ASSERT_LT(i + 1, kinds.size());
      // A 16-bit x -> kConv -> kConvEpilogue: y = relu(float(16-bit output) + bias).
      EXPECT_EQ(lowered->dtypes[s.in[0]], half);
      EXPECT_EQ(lowered->dtypes[s.out], half);
      EXPECT_EQ(lowered->blobs[static_cast<size_t>(s.weight_slots[0])].data.dtype(), half);
      EXPECT_EQ(s.weight_slots[1], -1);
      const GpuStep& after = lowered->steps[i + 1];
      EXPECT_EQ(after.kind, K::kConvEpilogue);
      EXPECT_EQ(after.conv_epilogue.source, HalfOf(HalfDtypeOf(math)));
      EXPECT_EQ(after.in, (std::vector<int>{s.out, -1}));
      const int y = p.model->graph().nodes[s.node].outputs[0];
      if (after.out >= 0) {
        EXPECT_EQ(after.out, y);
      }
      EXPECT_EQ(lowered->dtypes[y], DataType::kFp32);
      EXPECT_EQ(after.conv_epilogue.act, UnaryOp::kRelu);
      EXPECT_FALSE(after.conv_epilogue.post.has_value());
      ASSERT_GE(after.weight_slots[0], 0);
      EXPECT_EQ(lowered->blobs[static_cast<size_t>(after.weight_slots[0])].data.dtype(),
                DataType::kFp32);
      if (i + 2 < kinds.size()) {
        EXPECT_NE(kinds[i + 2], K::kBinary);
        EXPECT_NE(kinds[i + 2], K::kUnary);
      }
    }
    EXPECT_EQ(convs, 4);
    const Roundings r = CheckRoundings(p.model->graph(), *lowered, half);
    EXPECT_EQ(r.steps, 1);  // the image: the global pool rounds the Gemm's input
    EXPECT_EQ(r.fused, 3);
    EXPECT_EQ(r.dropped, 3);
    EXPECT_EQ(r.pools, 2);
    // Every 16-bit value between the convolutions is channels last, the image's rounding
    // and the pooled values among them; the last convolution's epilogue writes fp32 NCHW.
    const ChannelsLastCount cl = CheckChannelsLast(p.model->graph(), *lowered);
    EXPECT_EQ(cl.convs, 4);
    // The convolutions' inputs (the image's rounding, the first epilogue's, the two pools'
    // outputs), their four 16-bit outputs, and the pools' inputs (two epilogues' roundings).
    EXPECT_EQ(cl.values, 4 + 4 + 2);
    ExpectAligned(*lowered);
  }
}

// In mixed precision a value read by several convolutions is rounded to 16 bits once: the
// block input that ResNet's downsampling block feeds both its first convolution and its
// shortcut, and every reader after the first takes the same 16-bit temporary; where a
// convolution's epilogue wrote the value, that epilogue rounds it. Each convolution's
// epilogue takes what cuDNN does not fuse in 16 bits, the residual included.
TEST(LowerConvOnCudnnTest, AValueReadByTwoConvolutionsIsRoundedOnce) {
  Prepared p =
      Prepare(Model::Load(engine::testing::ModelPath("resnet_op13.onnx")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
    auto lowered = LowerPlan(p.model->graph(), *p.plan, OnCudnn(math));
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    std::set<int> conv_inputs;
    int convs = 0;
    const std::vector<GpuStep>& steps = lowered->steps;
    for (size_t i = 0; i < steps.size(); ++i) {
      const GpuStep& s = steps[i];
      if (s.kind != K::kConv) continue;
      ++convs;
      const Node& node = p.model->graph().nodes[s.node];
      conv_inputs.insert(node.inputs[0]);
      // Its epilogue casts its 16-bit output into y, with the bias, and with the residual
      // (in 16 bits: CheckRoundings) and the ReLU after it where there is one.
      ASSERT_LT(i + 1, steps.size());
      const GpuStep& after = steps[i + 1];
      EXPECT_EQ(after.kind, K::kConvEpilogue) << node.name;
      EXPECT_EQ(after.in[0], s.out);
      EXPECT_TRUE(after.conv_epilogue.source.has_value());
      EXPECT_GE(after.weight_slots[0], 0) << node.name;
      if (node.has_input(3)) {
        EXPECT_GE(after.in[1], 0);
        EXPECT_FALSE(after.conv_epilogue.act.has_value());
        EXPECT_EQ(after.conv_epilogue.post, UnaryOp::kRelu);
      } else {
        EXPECT_EQ(after.in[1], -1);
        EXPECT_FALSE(after.conv_epilogue.post.has_value());
      }
    }
    // Seven convolutions, six inputs (the shortcut shares its block's), the classifier's Gemm
    // and two residuals: each rounding made once (CheckRoundings). A kToHalf step rounds the
    // image alone (the global average pool rounds the Gemm's input). The stem's epilogue rounds for
    // its max pool, which pools 16-bit values for the first block's convolution and, as its
    // residual, for its last epilogue; the epilogues of both blocks' first convolutions, of the
    // second layer's middle one, of the first block's last (read by the next block's first
    // convolution and its shortcut) and of the shortcut (the second block's residual) round
    // their outputs too, and none of those six writes fp32.
    EXPECT_EQ(convs, 7);
    EXPECT_EQ(conv_inputs.size(), 6u);
    const Roundings r = CheckRoundings(p.model->graph(), *lowered, HalfDtypeOf(math));
    EXPECT_EQ(r.steps, 1);
    EXPECT_EQ(r.fused, 6);
    EXPECT_EQ(r.dropped, 6);
    EXPECT_EQ(r.pools, 1);
    EXPECT_EQ(r.residuals, 2);
    // All seven convolutions run channels last, their residuals read so too.
    const ChannelsLastCount cl = CheckChannelsLast(p.model->graph(), *lowered);
    EXPECT_EQ(cl.convs, 7);
    int residuals = 0;
    for (const GpuStep& s : steps) residuals += s.conv_epilogue.residual_channels_last;
    EXPECT_EQ(residuals, 2);
    ExpectAligned(*lowered);
  }
}

// ResNet's identity block: its input y is its first convolution's operand and its residual.
// The stem's epilogue rounds y once; the block's first convolution and its last epilogue (the
// residual, added after the cast) both read that rounding, so no fp32 y is written, and
// neither is the block's middle value, which only its second convolution reads. The
// block's output, the graph's, is written in fp32 alone.
TEST(LowerConvOnCudnnTest, AResidualIsReadInSixteenBitsFromTheRoundingItsWriterMakes) {
  Prepared p = Prepare(Model::FromGraph(IdentityBlockGraph()), {{2, 3, 8, 8}});
  ASSERT_TRUE(p.plan);
  const Graph& g = p.model->graph();
  for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
    const DataType half = HalfDtypeOf(math);
    auto lowered = LowerPlan(g, *p.plan, OnCudnn(math));
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    std::map<std::string, const GpuStep*> epilogue_of;  // by node name
    for (const GpuStep& s : lowered->steps)
      if (s.kind == K::kConvEpilogue) epilogue_of[g.nodes[s.node].name] = &s;
    ASSERT_EQ(epilogue_of.size(), 3u);
    const GpuStep* stem = epilogue_of["stem"];
    const GpuStep* last = nullptr;
    for (const auto& [name, s] : epilogue_of)
      if (s->in[1] >= 0) last = s;
    ASSERT_TRUE(stem && last);
    EXPECT_GE(stem->half_out, 0);
    EXPECT_EQ(stem->out, -1);
    EXPECT_EQ(last->in[1], stem->half_out);
    EXPECT_EQ(last->conv_epilogue.residual, HalfOf(HalfDtypeOf(math)));
    EXPECT_EQ(last->half_out, -1);  // the graph's output, read by nothing after
    EXPECT_EQ(last->out, g.outputs[0]);
    const Roundings r = CheckRoundings(g, *lowered, half);
    EXPECT_EQ(r.steps, 1);    // the input
    EXPECT_EQ(r.fused, 2);    // the stem's and the block's first convolution's
    EXPECT_EQ(r.dropped, 2);  // both: only 16-bit readers read them
    EXPECT_EQ(r.residuals, 1);
    ExpectAligned(*lowered);
  }
  // Where a Sigmoid reads y too, its fp32 stays, and the residual reads it: rounding it would
  // change the result and save nothing. Likewise on im2col, whose epilogues run in place on
  // fp32 and whose next im2col reads fp32.
  Prepared out =
      Prepare(Model::FromGraph(IdentityBlockGraph(/*y_also_read=*/true)), {{2, 3, 8, 8}});
  ASSERT_TRUE(out.plan);
  auto kept = LowerPlan(out.model->graph(), *out.plan, OnCudnn(GemmMath::kFp16));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  GpuPlanOptions im2col_options;
  im2col_options.math = GemmMath::kFp16;
  auto im2col = LowerPlan(g, *p.plan, im2col_options);
  ASSERT_TRUE(im2col.ok()) << im2col.status().ToString();
  for (const GpuLowering* l : {&*kept, &*im2col}) {
    int residuals = 0;  // read by an epilogue, or by the GEMM of an im2col convolution
    for (const GpuStep& s : l->steps) {
      const int z = s.kind == K::kConvEpilogue ? s.in[1] : s.kind == K::kGemm ? s.in[3] : -1;
      if (z < 0) continue;
      ++residuals;
      EXPECT_FALSE(s.conv_epilogue.residual.has_value());
      EXPECT_EQ(l->dtypes[z], DataType::kFp32);
    }
    EXPECT_EQ(residuals, 1) << (l == &*kept ? "on cuDNN" : "on im2col");
  }
  EXPECT_EQ(CheckRoundings(out.model->graph(), *kept, DataType::kFp16).residuals, 0);
  // In TF32 the residual is fp32, fused into the convolution as before.
  auto tf32 = LowerPlan(g, *p.plan, OnCudnn(GemmMath::kTf32));
  ASSERT_TRUE(tf32.ok()) << tf32.status().ToString();
  for (const GpuStep& s : tf32->steps) {
    EXPECT_EQ(s.half_out, -1);
    if (s.kind == K::kConvEpilogue) {
      EXPECT_FALSE(s.conv_epilogue.residual.has_value());
    }
  }
}

// Two convolutions, the first's output y read by the second and also as `also` says: as a
// graph output, or through a view (Flatten) by a Sigmoid whose output is the graph's.
Graph TwoConvsGraph(const std::string& also) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 6, 6});
  auto conv = [&](const std::string& name, int in, int c, uint64_t seed) {
    return b.Op("Conv", name,
                {in, b.Constant(name + ".w", Random({4, c, 3, 3}, seed)),
                 b.Constant(name + ".b", Random({4}, seed + 1))},
                {{"pads", AInts({1, 1, 1, 1})}, {"kernel_shape", AInts({3, 3})}});
  };
  const int y = b.Op("Relu", "y", {conv("a", x, 3, 71)});
  const int second = conv("b", y, 4, 73);
  if (also == "output") return b.Finish(std::vector<int>{second, y});
  const int flat = b.Op("Flatten", "flat", {y});
  return b.Finish(std::vector<int>{second, b.Op("Sigmoid", "sig", {flat})});
}

// The first convolution's epilogue rounds y for the second in the same pass, and keeps
// writing its fp32 result when the graph returns y or a view of it is read.
TEST(LowerConvOnCudnnTest, AnEpilogueKeepsItsFp32ResultForAGraphOutputOrAView) {
  for (const char* also : {"output", "view"}) {
    SCOPED_TRACE(also);
    Prepared p = Prepare(Model::FromGraph(TwoConvsGraph(also)), {{2, 3, 6, 6}});
    ASSERT_TRUE(p.plan);
    const Graph& g = p.model->graph();
    auto lowered = LowerPlan(g, *p.plan, OnCudnn(GemmMath::kFp16));
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    const Roundings r = CheckRoundings(g, *lowered, DataType::kFp16);
    EXPECT_EQ(r.steps, 1);  // the input
    EXPECT_EQ(r.fused, 1);  // y, for the second convolution
    EXPECT_EQ(r.dropped, 0);
    const GpuStep* first = FirstStep(*lowered, K::kConvEpilogue);
    ASSERT_NE(first, nullptr);
    EXPECT_GE(first->half_out, 0);
    EXPECT_EQ(first->out, g.nodes[first->node].outputs[0]);
  }
}

// A max pool between two 16-bit convolutions pools the first one's rounding, which that
// convolution's epilogue writes, into the rounding the second reads: no kToHalf step is
// left but the input's. It stays fp32 when its output is also the graph's (then it is
// rounded by a step of its own), and for an average (the average of 16-bit values is not
// the rounding of the fp32 average). When y itself is also the graph's, the epilogue keeps
// writing it and the pool still reads the rounding.
TEST(LowerConvOnCudnnTest, AMaxPoolBetweenConvolutionsPoolsTheir16BitValues) {
  struct Case {
    const char* variant;
    int steps, fused, dropped, pools;
  };
  for (const Case& c : {Case{"plain", 1, 1, 1, 1}, Case{"y_output", 1, 1, 0, 1},
                        Case{"pooled_output", 2, 0, 0, 0}, Case{"average", 2, 0, 0, 0}}) {
    SCOPED_TRACE(c.variant);
    Prepared p = Prepare(Model::FromGraph(PoolBetweenConvsGraph(c.variant)), {{2, 3, 8, 8}});
    ASSERT_TRUE(p.plan);
    const Graph& g = p.model->graph();
    for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
      const DataType half = HalfDtypeOf(math);
      auto lowered = LowerPlan(g, *p.plan, OnCudnn(math));
      ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
      EXPECT_EQ(Kinds(*lowered),
                c.pools == 1 ? (std::vector<K>{K::kToHalf, K::kConv, K::kConvEpilogue, K::kPool,
                                               K::kConv, K::kConvEpilogue})
                             : (std::vector<K>{K::kToHalf, K::kConv, K::kConvEpilogue, K::kPool,
                                               K::kToHalf, K::kConv, K::kConvEpilogue}));
      const Roundings r = CheckRoundings(g, *lowered, half);
      EXPECT_EQ(r.steps, c.steps);
      EXPECT_EQ(r.fused, c.fused);
      EXPECT_EQ(r.dropped, c.dropped);
      EXPECT_EQ(r.pools, c.pools);
      const GpuStep* pool = FirstStep(*lowered, K::kPool);
      ASSERT_NE(pool, nullptr);
      EXPECT_EQ(lowered->dtypes[pool->in[0]], c.pools == 1 ? half : DataType::kFp32);
      EXPECT_EQ(lowered->dtypes[pool->out], c.pools == 1 ? half : DataType::kFp32);
      ExpectAligned(*lowered);
    }
    // fp32 and TF32 round nothing: the pool stays fp32.
    auto tf32 = LowerPlan(g, *p.plan, OnCudnn(GemmMath::kTf32));
    ASSERT_TRUE(tf32.ok()) << tf32.status().ToString();
    const GpuStep* pool = FirstStep(*tf32, K::kPool);
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(tf32->dtypes[pool->out], DataType::kFp32);
  }
}

// In fp16 and bf16 on cuDNN, the 16-bit values passed between convolutions and the max pool
// between them are channels last, and the convolutions run NHWC with their weights stored
// [m, kh, kw, c/groups]. A rounding that a product reads too (the input's, in "product")
// stays NCHW, and so does the convolution reading it, whose epilogue then writes the pool's
// operand channels last from its NCHW output. gpu_convolution_layout nchw, TF32 and im2col
// make nothing channels last.
TEST(LowerConvOnCudnnTest, SixteenBitValuesBetweenConvolutionsAreChannelsLast) {
  for (const char* variant : {"plain", "product"}) {
    SCOPED_TRACE(variant);
    const bool product = std::string(variant) == "product";
    Prepared p = Prepare(Model::FromGraph(PoolBetweenConvsGraph(variant)), {{2, 3, 8, 8}});
    ASSERT_TRUE(p.plan);
    const Graph& g = p.model->graph();
    for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
      auto lowered = LowerPlan(g, *p.plan, OnCudnn(math));
      ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
      const ChannelsLastCount cl = CheckChannelsLast(g, *lowered);
      std::vector<const GpuStep*> convs, epilogues;
      const GpuStep* cast = nullptr;
      for (const GpuStep& s : lowered->steps) {
        if (s.kind == K::kConv) convs.push_back(&s);
        if (s.kind == K::kConvEpilogue) epilogues.push_back(&s);
        if (s.kind == K::kToHalf) cast = &s;
      }
      ASSERT_EQ(convs.size(), 2u);
      ASSERT_EQ(epilogues.size(), 2u);
      ASSERT_NE(cast, nullptr);
      EXPECT_EQ(cl.convs, product ? 1 : 2);
      EXPECT_EQ(convs[0]->conv.channels_last, !product);
      EXPECT_TRUE(convs[1]->conv.channels_last);
      EXPECT_EQ(cast->channels_last, !product);
      EXPECT_EQ(epilogues[0]->conv_epilogue.source_channels_last, !product);
      EXPECT_TRUE(epilogues[0]->conv_epilogue.half_channels_last);
      const GpuStep* pool = FirstStep(*lowered, K::kPool);
      ASSERT_NE(pool, nullptr);
      EXPECT_TRUE(pool->channels_last);
      // The second convolution's weight, Random({4, 4, 3, 3}, 43) rounded, moved channels
      // last; its NCHW blob is not kept.
      const Tensor w = Random({4, 4, 3, 3}, 43);
      const GpuLowering::Blob& blob =
          lowered->blobs[static_cast<size_t>(convs[1]->weight_slots[0])];
      ASSERT_EQ(blob.data.dtype(), HalfDtypeOf(math));
      const auto* moved = static_cast<const uint16_t*>(blob.data.data());
      const float* from = w.values<float>().data();
      for (int64_t o = 0; o < 4; ++o)
        for (int64_t ch = 0; ch < 4; ++ch)
          for (int64_t k = 0; k < 9; ++k) {
            const float v = from[(o * 4 + ch) * 9 + k];
            ASSERT_EQ(moved[(o * 9 + k) * 4 + ch],
                      math == GemmMath::kFp16 ? FloatToFp16(v) : FloatToBf16(v))
                << o << "," << ch << "," << k;
          }
      for (const GpuLowering::Blob& b : lowered->blobs)
        EXPECT_EQ(b.key + "~nhwc" == blob.key, false) << "the NCHW blob is kept: " << b.key;
      ExpectAligned(*lowered);

      GpuPlanOptions nchw = OnCudnn(math);
      nchw.channels_last = false;
      auto plain = LowerPlan(g, *p.plan, nchw);
      ASSERT_TRUE(plain.ok()) << plain.status().ToString();
      EXPECT_EQ(CheckChannelsLast(g, *plain).values, 0);
      auto im2col = LowerPlan(g, *p.plan, [&] {
        GpuPlanOptions o;
        o.math = math;
        return o;
      }());
      ASSERT_TRUE(im2col.ok()) << im2col.status().ToString();
      EXPECT_EQ(CheckChannelsLast(g, *im2col).values, 0);
    }
    auto tf32 = LowerPlan(g, *p.plan, OnCudnn(GemmMath::kTf32));
    ASSERT_TRUE(tf32.ok()) << tf32.status().ToString();
    EXPECT_EQ(CheckChannelsLast(g, *tf32).convs, 0);
    EXPECT_TRUE(tf32->channels_last.empty());
  }
}

// A convolution reading, through a Reshape to another 4-D shape, the output of one before
// it: the first epilogue's rounding has the view's shape, so it stays NCHW (its NHWC order
// would not be the view's), and the second convolution with it; the first convolution still
// runs channels last, its epilogue reading NHWC and writing that rounding NCHW.
TEST(LowerConvOnCudnnTest, ARoundingOfAReshapedViewStaysNchw) {
  Prepared p = Prepare(Model::FromGraph(ReshapeBetweenConvsGraph()), {{1, 4, 8, 8}});
  ASSERT_TRUE(p.plan);
  const Graph& g = p.model->graph();
  for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
    auto lowered = LowerPlan(g, *p.plan, OnCudnn(math));
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    CheckChannelsLast(g, *lowered);
    std::vector<const GpuStep*> convs;
    const GpuStep* first_epilogue = nullptr;
    for (const GpuStep& s : lowered->steps) {
      if (s.kind == K::kConv) convs.push_back(&s);
      if (s.kind == K::kConvEpilogue && !first_epilogue) first_epilogue = &s;
    }
    ASSERT_EQ(convs.size(), 2u);
    ASSERT_NE(first_epilogue, nullptr);
    EXPECT_TRUE(convs[0]->conv.channels_last);
    EXPECT_FALSE(convs[1]->conv.channels_last);
    ASSERT_GE(first_epilogue->half_out, 0) << "the rounding is not made in the epilogue's pass";
    EXPECT_EQ(lowered->shapes[first_epilogue->half_out], Shape({1, 4, 16, 16}));
    EXPECT_TRUE(first_epilogue->conv_epilogue.source_channels_last);
    EXPECT_FALSE(first_epilogue->conv_epilogue.half_channels_last);
  }
}

// A grouped convolution on cuDNN is one step with its groups (no batch of GEMMs), its bias
// and ReLU fused.
TEST(LowerConvOnCudnnTest, AGroupedConvolutionIsOneStepWithItsGroups) {
  Prepared p = Prepare(Model::FromGraph(GroupedConvGraph()), {{2, 4, 9, 9}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan, OnCudnn());
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  EXPECT_EQ(Kinds(*lowered), (std::vector<K>{K::kConv, K::kPool}));
  const GpuStep& conv = lowered->steps[0];
  EXPECT_EQ(conv.conv.window.groups, 2);
  EXPECT_EQ(conv.conv.m, 6);
  EXPECT_EQ(conv.conv.window.sh, 2);
  EXPECT_EQ(conv.conv.window.ph, 1);
  EXPECT_TRUE(conv.conv.fused_bias_relu);
}

// A ConvTranspose on cuDNN is one transposed step (its weight as stored, [c, m/groups, kh,
// kw]) and its bias added after; the decoder's (kernel 4, stride 2, pads 1) and the VAE's
// (output_padding 1) both map back onto their inputs. The 16-bit tiers run it in TF32.
TEST(LowerConvOnCudnnTest, ATransposedConvolutionIsATransposedStepAndItsBias) {
  Prepared p = Prepare(Model::Load(Example("decoder")), {{2, 16}});
  ASSERT_TRUE(p.plan);
  for (GemmMath math : {GemmMath::kFp32, GemmMath::kFp16}) {
    auto l = LowerPlan(p.model->graph(), *p.plan, OnCudnn(math));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(FirstStep(*l, K::kConvTranspose), nullptr);
    int transposed = 0;
    for (size_t i = 0; i < l->steps.size(); ++i) {
      const GpuStep& s = l->steps[i];
      if (s.kind != K::kConv) continue;
      const Node& node = p.model->graph().nodes[s.node];
      // The decoder's last layer is a plain convolution, on cuDNN too.
      EXPECT_EQ(s.conv.transposed, node.op_type == "ConvTranspose") << node.op_type;
      if (!s.conv.transposed) continue;
      ++transposed;
      EXPECT_FALSE(s.conv.fused_bias_relu);
      EXPECT_EQ(s.conv.math, math == GemmMath::kFp32 ? GemmMath::kFp32 : GemmMath::kTf32);
      EXPECT_EQ(s.in[0], node.inputs[0]);
      EXPECT_EQ(s.out, node.outputs[0]);
      EXPECT_EQ(s.conv.window.kh, 4);
      EXPECT_EQ(s.conv.window.oh, 2 * s.conv.window.h);
      EXPECT_TRUE(CheckCudnnConv(s.conv).ok());
      const Tensor& w = l->blobs[static_cast<size_t>(s.weight_slots[0])].data;
      EXPECT_EQ(w.dtype(), DataType::kFp32);
      EXPECT_EQ(w.shape()[0], s.conv.window.c);
      EXPECT_EQ(w.shape()[1], s.conv.m / s.conv.window.groups);
      // Its bias, in place, right after: a [m, 1, 1] blob broadcast over y.
      ASSERT_LT(i + 1, l->steps.size());
      const GpuStep& bias = l->steps[i + 1];
      EXPECT_EQ(bias.kind, K::kBinary);
      EXPECT_EQ(bias.out, s.out);
      EXPECT_EQ(bias.in[0], s.out);
      EXPECT_EQ(bias.in[1], -1);
      EXPECT_EQ(l->blobs[static_cast<size_t>(bias.weight_slots[0])].data.shape(),
                (Shape{s.conv.m, 1, 1}));
    }
    EXPECT_GE(transposed, 1);
  }
  WithReference vae = PrepareWithReference("vae_op13");
  ASSERT_TRUE(vae.prepared.plan);
  auto v = LowerPlan(vae.prepared.model->graph(), *vae.prepared.plan, OnCudnn());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(FirstStep(*v, K::kConvTranspose), nullptr);
  const GpuStep* t = nullptr;
  for (const GpuStep& s : v->steps)
    if (!t && s.kind == K::kConv && s.conv.transposed) t = &s;
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->conv.window.oh, 2 * t->conv.window.h);  // 2(h-1) + 3 + 1 - 2
}

// What cuDNN cannot take keeps to im2col, in the same plan as convolutions that go to
// cuDNN: SAME_UPPER with an even kernel pads one more row and column at the end than at
// the start.
TEST(LowerConvOnCudnnTest, PadsThatDifferAtTheEndsKeepToIm2Col) {
  GraphBuilder b;
  const int x = b.Input("x", {1, 3, 8, 8});
  const int w1 = b.Constant("w1", Random({4, 3, 2, 2}, 61));
  const int w2 = b.Constant("w2", Random({5, 4, 3, 3}, 62));
  const int even = b.Op("Conv", "even", {x, w1}, {{"auto_pad", AString("SAME_UPPER")}});
  const int odd = b.Op("Conv", "odd", {even, w2}, {{"pads", AInts({1, 1, 1, 1})}});
  Prepared p = Prepare(Model::FromGraph(b.Finish(odd)), {{1, 3, 8, 8}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan, OnCudnn());
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  EXPECT_EQ(Kinds(*lowered), (std::vector<K>{K::kIm2Col, K::kGemm, K::kTranspose, K::kConv}));
  EXPECT_EQ(lowered->steps[0].window.ph, 0);
  EXPECT_EQ(lowered->steps[0].window.ph_end, 1);
  EXPECT_FALSE(lowered->steps[3].conv.fused_bias_relu);  // no bias, no ReLU
  // And the default stays im2col throughout.
  auto im2col = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(im2col.ok()) << im2col.status().ToString();
  EXPECT_EQ(Kinds(*im2col), (std::vector<K>{K::kIm2Col, K::kGemm, K::kTranspose, K::kIm2Col,
                                            K::kGemm, K::kTranspose}));
}

}  // namespace
}  // namespace shoal::engine::cuda
