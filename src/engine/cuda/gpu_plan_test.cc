#include "engine/cuda/gpu_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AFloat;
using engine::testing::AInt;
using engine::testing::AInts;
using engine::testing::AString;
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
                            GpuLoweringPlanOptions(), PlanLimits());
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

// Products whose alpha and beta are not 1: MatMul·0.5 + bias, ReLU (the optimiser fuses
// them into one shoal.FusedMatMul with alpha 0.5 and the bias divided by it), then
// Gemm(alpha 2, beta 0.5, transB) with a C row.
Graph ScaledProductsGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {4, 6});
  const int w = b.Constant("w", Random({6, 5}, 11));
  const int prod = b.Op("MatMul", "prod", {x, w});
  const int half = b.Constant("half", F32({}, {0.5f}));
  const int scaled = b.Op("Mul", "scaled", {prod, half});
  const int bias = b.Constant("bias", Random({5}, 12));
  const int biased = b.Op("Add", "biased", {scaled, bias});
  const int act = b.Op("Relu", "act", {biased});
  const int w2 = b.Constant("w2", Random({3, 5}, 13));
  const int c = b.Constant("c", Random({3}, 14));
  const int out = b.Op("Gemm", "out", {act, w2, c},
                       {{"alpha", AFloat(2.f)}, {"beta", AFloat(0.5f)}, {"transB", AInt(1)}});
  return b.Finish(out);
}

// A grouped convolution (2 groups, stride 2, padding 1) with a bias, then ReLU (fused by
// the optimiser), and a 3x3 average pool that counts the padding, with ceil_mode.
Graph GroupedConvGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {2, 4, 9, 9});
  const int w = b.Constant("w", Random({6, 2, 3, 3}, 21));
  const int bias = b.Constant("b", Random({6}, 22));
  const int conv = b.Op("Conv", "conv", {x, w, bias},
                        {{"group", AInt(2)},
                         {"strides", AInts({2, 2})},
                         {"pads", AInts({1, 1, 1, 1})},
                         {"kernel_shape", AInts({3, 3})}});
  const int act = b.Op("Relu", "act", {conv});
  const int pool = b.Op("AveragePool", "pool", {act},
                        {{"kernel_shape", AInts({3, 3})},
                         {"strides", AInts({2, 2})},
                         {"pads", AInts({1, 1, 1, 1})},
                         {"ceil_mode", AInt(1)},
                         {"count_include_pad", AInt(1)}});
  return b.Finish(pool);
}

// Six element-wise steps in a row on one [64, 64] input.
Graph ChainGraph() {
  GraphBuilder b;
  int v = b.Input("x", {64, 64});
  const char* ops[] = {"Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Abs"};
  for (int i = 0; i < 6; ++i) v = b.Op(ops[i], "y" + std::to_string(i), {v});
  return b.Finish(v);
}

// A wide computed input and a narrow product: [4, 512] -> Relu -> MatMul by [512, 96].
// Once the product's shards have read the Relu's output, its bytes are free for the
// arena's next values.
Graph WideIntoNarrowGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {4, 512});
  const int r = b.Op("Relu", "r", {x});
  const int w = b.Constant("w", Random({512, 96}, 31));
  const int y = b.Op("MatMul", "y", {r, w});
  return b.Finish(b.Op("Sigmoid", "s", {y}));
}

void ExpectAligned(const GpuLowering& l) {
  for (size_t v = 0; v < l.values.size(); ++v) {
    if (l.values[v].home != GpuValue::Home::kArena) continue;  // a weight's offset is its blob
    EXPECT_EQ(l.values[v].offset % static_cast<int64_t>(kGemmAlignmentBytes), 0) << "value " << v;
  }
}

// A model's reference inputs (models/<name>.b4.sht) and shapes, prepared for lowering.
struct WithReference {
  Prepared prepared;
  std::vector<Tensor> inputs;
};
WithReference PrepareWithReference(const std::string& name, const std::string& suffix = ".b4.sht") {
  WithReference r;
  const engine::testing::Reference ref = engine::testing::LoadReference(name + suffix);
  std::vector<Shape> shapes;
  for (const NamedTensor& t : ref.inputs) {
    r.inputs.push_back(t.tensor);
    shapes.push_back(t.tensor.shape());
  }
  r.prepared = Prepare(Model::Load(engine::testing::ModelPath(name + ".onnx")), shapes);
  return r;
}

const GpuStep* FirstStep(const GpuLowering& l, GpuStep::Kind kind) {
  for (const GpuStep& s : l.steps)
    if (s.kind == kind) return &s;
  return nullptr;
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

// ShuffleNet splits its channels with two Slices per block: strided copies.
TEST(LowerPlanTest, ShuffleNetsSlicesAreStridedCopies) {
  Prepared p =
      Prepare(Model::Load(engine::testing::ModelPath("shufflenet_op13.onnx")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  int slices = 0;
  for (const GpuStep& s : lowered->steps) {
    if (s.kind != GpuStep::Kind::kStridedSlice) continue;
    ++slices;
    EXPECT_EQ(s.slice.out_dims, lowered->shapes[s.out]);
    EXPECT_EQ(s.slice.elements, Elements(lowered->shapes[s.out]));
  }
  EXPECT_EQ(slices, 2);
}

// int64 ids [2, 6]: a strided Slice (every other column from 1), concatenated after the ids
// along the columns, then a Split along the rows (one output: a copy). The copies move
// int64 elements as pairs of 4-byte words.
Graph Int64CopiesGraph(DataType dtype = DataType::kInt64) {
  GraphBuilder b;
  const int ids = b.Input("ids", {2, 6}, dtype);
  const int starts = b.Constant("starts", I64({2}, {0, 1}));
  const int ends = b.Constant("ends", I64({2}, {2, 6}));
  const int axes = b.Constant("axes", I64({2}, {0, 1}));
  const int steps = b.Constant("steps", I64({2}, {1, 2}));
  const int sliced = b.Op("Slice", "sliced", {ids, starts, ends, axes, steps});
  const int joined = b.Op("Concat", "joined", {ids, sliced}, {{"axis", AInt(1)}});
  return b.Finish(b.Op("Split", "split", {joined}, {{"axis", AInt(0)}}));
}

// Slice, Concat and Split of int64 data lower onto the word-moving copies, each 8-byte
// element two words (a trailing axis of 2).
TEST(LowerPlanTest, Int64SliceConcatAndSplitMovePairsOfWords) {
  Prepared p = Prepare(Model::FromGraph(Int64CopiesGraph()), {{2, 6}});
  ASSERT_TRUE(p.plan);
  auto l = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  int slices = 0, places = 0, splits = 0;
  for (const GpuStep& s : l->steps) {
    if (s.kind == GpuStep::Kind::kStridedSlice) {
      ++slices;
      EXPECT_EQ(s.slice.out_dims, (std::vector<int64_t>{2, 3, 2}));
      EXPECT_EQ(s.slice.elements, 12);
    } else if (s.kind == GpuStep::Kind::kPlace) {
      ++places;
      EXPECT_EQ(s.words, 2);
      EXPECT_EQ(s.dims, (Shape{2, 9, 2}));
    } else if (s.kind == GpuStep::Kind::kSlice) {
      ++splits;
      EXPECT_EQ(s.dims, (Shape{2, 9, 2}));
      EXPECT_EQ(s.length, 2);
    }
  }
  EXPECT_EQ(slices, 1);
  EXPECT_EQ(places, 2);
  EXPECT_EQ(splits, 1);
  // int32 stays one word per element.
  Prepared i32 = Prepare(Model::FromGraph(Int64CopiesGraph(DataType::kInt32)), {{2, 6}});
  ASSERT_TRUE(i32.plan);
  auto l32 = LowerPlan(i32.model->graph(), *i32.plan);
  ASSERT_TRUE(l32.ok()) << l32.status().ToString();
  for (const GpuStep& s : l32->steps) {
    if (s.kind == GpuStep::Kind::kPlace) {
      EXPECT_EQ(s.words, 1);
    }
  }
}

// Expand of fp32 [3, 1] and of int64 [1, 4] (by a shape input) to [2, 3, 4]: one strided
// copy each, int64 in words.
Graph ExpandGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {3, 1});
  const int ids = b.Input("ids", {1, 4}, DataType::kInt64);
  const int shape = b.Constant("shape", I64({3}, {2, 3, 4}));
  const int ex = b.Op("Expand", "ex", {x, shape});
  const int ei = b.Op("Expand", "ei", {ids, shape});
  return b.Finish(std::vector<int>{ex, ei});
}

TEST(LowerPlanTest, ExpandIsAStridedCopyWithZeroStrides) {
  Prepared p = Prepare(Model::FromGraph(ExpandGraph()), {{3, 1}, {1, 4}});
  ASSERT_TRUE(p.plan);
  auto l = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->steps.size(), 2u);
  EXPECT_EQ(l->steps[0].kind, GpuStep::Kind::kStridedSlice);
  EXPECT_EQ(l->steps[0].slice.out_dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(l->steps[0].slice.index.in_strides[0], 0);
  EXPECT_EQ(l->steps[0].slice.index.in_strides[2], 0);
  EXPECT_EQ(l->steps[1].slice.out_dims, (std::vector<int64_t>{2, 3, 4, 2}));  // int64: words
  EXPECT_EQ(l->steps[1].slice.index.in_strides[3], 1);
  EXPECT_EQ(l->steps[1].slice.index.in_strides[2], 2);
}

// A recurrent test model's three GRUs have no GPU kernel yet: one line per node.
TEST(LowerPlanTest, AModelWithOperatorsItLacksIsRefusedNamingEveryNode) {
  WithReference gru = PrepareWithReference("rnn_graph_gru", ".full.sht");
  ASSERT_TRUE(gru.prepared.plan);
  auto lowered = LowerPlan(gru.prepared.model->graph(), *gru.prepared.plan);
  ASSERT_FALSE(lowered.ok());
  EXPECT_EQ(lowered.status().code(), StatusCode::kUnimplemented);
  const std::string& m = lowered.status().message();
  EXPECT_THAT(m, HasSubstr("the GPU path cannot run this model yet"));
  EXPECT_THAT(m, HasSubstr("node 'gru_lbr0' (GRU): the GPU path has no kernel"));
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 3) << m;
}

// The GridSample model lowers: each of its eight GridSamples (bilinear, nearest and bicubic,
// every padding mode, both alignments) one step with its geometry.
TEST(LowerPlanTest, EveryGridSampleIsOneStep) {
  WithReference r = PrepareWithReference("det_grid_sample_op17", ".a.sht");
  ASSERT_TRUE(r.prepared.plan);
  auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  int steps = 0;
  std::set<int> modes, paddings, alignments;
  for (const GpuStep& s : l->steps) {
    if (s.kind != GpuStep::Kind::kGridSample) continue;
    ++steps;
    modes.insert(s.grid.mode);
    paddings.insert(s.grid.padding);
    alignments.insert(s.grid.align_corners ? 1 : 0);
    EXPECT_FALSE(s.grid.volume);
    EXPECT_EQ(s.grid.c, 3);
    EXPECT_EQ(s.grid.h, 7);
    EXPECT_EQ(s.grid.w, 9);
    EXPECT_EQ(l->shapes[s.out], (Shape{s.grid.n, 3, s.grid.out_h, s.grid.out_w}));
  }
  EXPECT_EQ(steps, 8);
  // Volumes lower in the linear and nearest modes; cubic is refused there, as on the CPU.
  const engine::testing::Reference ref = engine::testing::LoadReference("gridsample_3d.sht");
  ASSERT_EQ(ref.inputs.size(), 2u);
  for (const char* mode : {"bilinear", "nearest"}) {
    GraphBuilder b;
    const int x = b.Input("x", ref.inputs[0].tensor.shape());
    const int grid = b.Input("grid", ref.inputs[1].tensor.shape());
    Graph g = b.Finish(b.Op("GridSample", "gs", {x, grid},
                            {{"mode", engine::testing::AString(mode)},
                             {"padding_mode", engine::testing::AString("reflection")}}));
    Prepared p = Prepare(Model::FromGraph(std::move(g)),
                         {ref.inputs[0].tensor.shape(), ref.inputs[1].tensor.shape()});
    ASSERT_TRUE(p.plan);
    auto v = LowerPlan(p.model->graph(), *p.plan);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_EQ(v->steps.size(), 1u);
    EXPECT_TRUE(v->steps[0].grid.volume);
    EXPECT_EQ(v->steps[0].grid.d, 4);
    EXPECT_EQ(v->steps[0].grid.out_d, 3);
    EXPECT_EQ(v->steps[0].grid.padding, 2);
  }
  EXPECT_EQ(modes, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(paddings, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(alignments, (std::set<int>{0, 1}));
}

// The RoiAlign models lower: each RoiAlign one step with its attributes (output size,
// sampling ratio, scale; output_half_pixel before opset 16, half_pixel from it), reading
// batch indices a Cast from fp32 to int64 wrote.
TEST(LowerPlanTest, RoiAlignAndItsBatchIndexCastLower) {
  for (const auto& [name, half_pixel] :
       {std::pair{"det_roi_align_op13", false}, std::pair{"det_roi_align_aligned_op17", true}}) {
    SCOPED_TRACE(name);
    WithReference r = PrepareWithReference(name, ".a.sht");
    ASSERT_TRUE(r.prepared.plan);
    auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    std::vector<const GpuStep*> rois;
    int casts = 0;
    for (const GpuStep& s : l->steps) {
      if (s.kind == GpuStep::Kind::kRoiAlign) rois.push_back(&s);
      if (s.kind == GpuStep::Kind::kFloatToInt) {
        ++casts;
        EXPECT_EQ(l->dtypes[s.out], DataType::kInt64);
      }
    }
    EXPECT_EQ(casts, 3);
    ASSERT_EQ(rois.size(), 3u);
    const int64_t sizes[3][2] = {{4, 4}, {3, 5}, {2, 3}};
    const int64_t ratios[3] = {2, 0, 0};
    const float scales[3] = {0.5f, 0.25f, 1.f};
    for (size_t i = 0; i < 3; ++i) {
      const RoiAlignGeometry& g = rois[i]->roi;
      EXPECT_EQ(g.out_h, sizes[i][0]);
      EXPECT_EQ(g.out_w, sizes[i][1]);
      EXPECT_EQ(g.sampling_ratio, ratios[i]);
      EXPECT_EQ(g.spatial_scale, scales[i]);
      EXPECT_EQ(g.half_pixel, half_pixel);
      EXPECT_FALSE(g.max);
      EXPECT_EQ(g.c, 4);
      EXPECT_EQ(g.h, 16);
      EXPECT_EQ(g.w, 20);
      EXPECT_EQ(l->dtypes[rois[i]->in[2]], DataType::kInt64);
      ASSERT_GE(rois[i]->flag, 0);
      EXPECT_THAT(l->flag_nodes[rois[i]->flag], HasSubstr("(RoiAlign)"));
    }
  }
}

// DenseNet: concatenations, batch normalisations outside a convolution (two broadcasting
// steps each) and a constant Pad lower too.
TEST(LowerPlanTest, ConcatBatchNormAndPadLower) {
  Prepared p =
      Prepare(Model::Load(engine::testing::ModelPath("densenet_op13.onnx")), {{2, 3, 32, 32}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  int places = 0, pads = 0, blob_binaries = 0;
  for (const GpuStep& s : lowered->steps) {
    places += s.kind == GpuStep::Kind::kPlace;
    pads += s.kind == GpuStep::Kind::kPad;
    blob_binaries += s.kind == GpuStep::Kind::kBinary && s.in[1] < 0;
  }
  EXPECT_GE(places, 12);  // six concatenations of at least two inputs
  EXPECT_EQ(pads, 1);
  EXPECT_EQ(blob_binaries, 2 * 6);  // six batch normalisations: a scale and a shift each
  ExpectAligned(*lowered);
}

// The example image classifier: four convolutions (im2col and a GEMM each), two max pools
// and the global average pool as a reduction.
TEST(LowerPlanTest, ConvolutionsBecomeIm2ColAndGemms) {
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

TEST(LowerPlanTest, AGroupedConvolutionIsABatchOfGemmsWithItsBiasAfter) {
  Prepared p = Prepare(Model::FromGraph(GroupedConvGraph()), {{2, 4, 9, 9}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  using K = GpuStep::Kind;
  std::vector<K> kinds;
  for (const GpuStep& s : lowered->steps) kinds.push_back(s.kind);
  EXPECT_EQ(kinds,
            (std::vector<K>{K::kIm2Col, K::kGemm, K::kTranspose, K::kBinary, K::kUnary, K::kPool}));
  const GpuStep& gemm = lowered->steps[1];
  EXPECT_EQ(gemm.gemm.batch, 2);
  EXPECT_EQ(gemm.gemm.m, 2 * 5 * 5);  // images x output positions
  EXPECT_EQ(gemm.gemm.n, 3);          // output channels per group
  EXPECT_EQ(gemm.gemm.k, 2 * 3 * 3);  // input channels per group x kernel
  EXPECT_EQ(gemm.gemm.epilogue, GemmEpilogue::kNone);
  EXPECT_TRUE(gemm.gemm.transpose_w);
  EXPECT_EQ(lowered->steps[5].pool, PoolOp::kAverageIncludePad);
  EXPECT_EQ(lowered->steps[5].window.oh, 3);  // ceil((5 + 2 - 3) / 2) + 1
}

// alpha and beta are folded into the uploaded weights and biases, under keys that say so.
TEST(LowerPlanTest, AlphaAndBetaAreFoldedIntoTheBlobs) {
  Prepared p = Prepare(Model::FromGraph(ScaledProductsGraph()), {{4, 6}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  ASSERT_EQ(lowered->steps.size(), 2u);
  const Graph& g = p.model->graph();
  auto key = [&](int64_t blob) { return lowered->blobs[blob].key; };
  EXPECT_EQ(key(lowered->steps[0].weight_slots[0]),
            "v" + std::to_string(g.FindValue("w")) + "*0.5");
  EXPECT_EQ(lowered->steps[0].gemm.epilogue, GemmEpilogue::kBiasRelu);
  EXPECT_EQ(key(lowered->steps[1].weight_slots[0]), "v" + std::to_string(g.FindValue("w2")) + "*2");
  EXPECT_EQ(key(lowered->steps[1].weight_slots[1]),
            "v" + std::to_string(g.FindValue("c")) + "*0.5");
  // The scaled copies hold the scaled values.
  const auto w2 = g.values[g.FindValue("w2")].constant.values<float>();
  const auto up = lowered->blobs[lowered->steps[1].weight_slots[0]].data.values<float>();
  ASSERT_EQ(up.size(), w2.size());
  for (size_t i = 0; i < w2.size(); ++i) EXPECT_EQ(up[i], 2.f * w2[i]);
}

// A value the CPU plan folds for the input shapes (here Cast(Shape(x)), [batch, 2] as
// floats) is a blob whose key names its shape and bytes, so a plan for another batch
// never takes the first plan's copy; a true constant keeps one key.
TEST(LowerPlanTest, AValueFoldedForTheShapesIsKeyedByItsContent) {
  GraphBuilder b;
  const int x = b.Input("x", {-1, 2});
  const int shape = b.Op("Shape", "shape", {x});
  const int as_float = b.Op("Cast", "as_float", {shape}, {{"to", AInt(1)}});
  const int sum = b.Op("Add", "sum", {x, as_float});
  const int k = b.Constant("k", F32({2}, {3.f, 4.f}));
  const int out = b.Op("Mul", "out", {sum, k});
  Graph graph = b.Finish(out);
  graph.values[x].shape = SymbolicShape{Dim{-1, "batch"}, Dim{2, ""}};
  auto model = Model::FromGraph(std::move(graph));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<std::string> folded, constant;
  for (int64_t batch : {1, 8}) {
    dnnl::stream stream(CpuEngine());
    auto plan = Plan::Prepare((*model)->graph(), {{batch, 2}}, CpuEngine(), stream,
                              (*model)->weight_cache(), GpuLoweringPlanOptions(), PlanLimits());
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    auto lowered = LowerPlan((*model)->graph(), **plan);
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
    ASSERT_EQ(lowered->blobs.size(), 2u);
    for (const auto& blob : lowered->blobs)
      (blob.key.find('@') != std::string::npos ? folded : constant).push_back(blob.key);
  }
  ASSERT_EQ(folded.size(), 2u);
  ASSERT_EQ(constant.size(), 2u);
  EXPECT_NE(folded[0], folded[1]);
  EXPECT_EQ(constant[0], constant[1]);
}

// Two batch sizes lower to the same blobs, so the plans of one instance share one copy
// of the weights on the device.
TEST(LowerPlanTest, PlansForOtherShapesNameTheSameBlobs) {
  Prepared one = Prepare(Model::Load(Example("recommender")), {{1, 64}});
  ASSERT_TRUE(one.plan);
  auto a = LowerPlan(one.model->graph(), *one.plan);
  dnnl::stream stream(CpuEngine());
  auto plan8 = Plan::Prepare(one.model->graph(), {{8, 64}}, CpuEngine(), stream,
                             one.model->weight_cache(), GpuLoweringPlanOptions(), PlanLimits());
  ASSERT_TRUE(plan8.ok());
  auto b = LowerPlan(one.model->graph(), **plan8);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->blobs.size(), b->blobs.size());
  for (size_t i = 0; i < a->blobs.size(); ++i) EXPECT_EQ(a->blobs[i].key, b->blobs[i].key);
}

TEST(LowerPlanTest, AnOperatorWithoutAKernelIsNamed) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 4});
  const int y = b.Op("Reciprocal", "inverted", {x});
  Prepared p = Prepare(Model::FromGraph(b.Finish(y)), {{4, 4}});
  ASSERT_TRUE(p.plan);
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_FALSE(lowered.ok());
  EXPECT_THAT(
      lowered.status().message(),
      HasSubstr("node 'inverted' (Reciprocal): the GPU path has no kernel for this operator"));
}

// Mixed precision: each product's input is rounded to 16 bits by a kToHalf step into a
// 16-bit temporary, the constant weights are stored in 16 bits under their own keys, the
// biases stay fp32, and the GEMMs write fp32.
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
  ASSERT_EQ(lowered->steps.size(), 8u);
  for (size_t i = 0; i < 8; i += 2) {
    const GpuStep& cast = lowered->steps[i];
    const GpuStep& gemm = lowered->steps[i + 1];
    ASSERT_EQ(cast.kind, K::kToHalf) << "step " << i;
    ASSERT_EQ(gemm.kind, K::kGemm) << "step " << i + 1;
    EXPECT_EQ(lowered->dtypes[cast.out], DataType::kFp16);
    EXPECT_EQ(lowered->shapes[cast.out], lowered->shapes[cast.in[0]]);
    EXPECT_EQ(gemm.in[0], cast.out);
    EXPECT_EQ(gemm.gemm.math, GemmMath::kFp16);
    EXPECT_TRUE(gemm.gemm.fp32_output);
    EXPECT_EQ(lowered->dtypes[gemm.out], DataType::kFp32);
    const GpuLowering::Blob& w = lowered->blobs[gemm.weight_slots[0]];
    EXPECT_EQ(w.data.dtype(), DataType::kFp16);
    EXPECT_THAT(w.key, ::testing::EndsWith("~fp16"));
    EXPECT_EQ(lowered->blobs[gemm.weight_slots[1]].data.dtype(), DataType::kFp32) << "bias";
  }
  // The first weight's values, rounded.
  const Tensor& w16 = lowered->blobs[lowered->steps[1].weight_slots[0]].data;
  const Tensor& w32 = fp32->blobs[fp32->steps[0].weight_slots[0]].data;
  ASSERT_EQ(w16.shape(), w32.shape());
  const auto* bits = static_cast<const uint16_t*>(w16.data());
  for (int64_t i = 0; i < 16; ++i)
    EXPECT_EQ(bits[i], FloatToFp16(w32.values<float>()[i])) << "element " << i;
  // Weights take half the bytes; the four biases are as before.
  int64_t bias_bytes = 0;
  for (const GpuStep& s : fp32->steps)
    bias_bytes += fp32->blobs[s.weight_slots[1]].data.byte_size();
  EXPECT_EQ(lowered->weight_bytes, (fp32->weight_bytes - bias_bytes) / 2 + bias_bytes);
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
  std::vector<int> halves;  // values kToHalf wrote
  int batched = 0;
  for (const GpuStep& s : attention->steps) {
    if (s.kind == GpuStep::Kind::kToHalf) halves.push_back(s.out);
    if (s.kind != GpuStep::Kind::kGemm) continue;
    for (int k : {0, 1}) {
      if (s.in[k] < 0) continue;
      EXPECT_NE(std::find(halves.begin(), halves.end(), s.in[k]), halves.end())
          << "a GEMM operand not rounded by a kToHalf step before it";
    }
    batched += s.gemm.batch > 1;
  }
  EXPECT_EQ(batched, 4);
  ExpectAligned(*attention);
}

// The decomposed BERT builds its attention mask with Equal on int64 values and applies it
// with Where: a comparison writing bools, then a Where per layer reading them.
TEST(LowerPlanTest, TheDecomposedBertsMaskIsAComparisonAndAWherePerLayer) {
  WithReference bert = PrepareWithReference("bert_decomposed_op13");
  ASSERT_TRUE(bert.prepared.plan);
  auto l = LowerPlan(bert.prepared.model->graph(), *bert.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  int compares = 0, wheres = 0;
  for (const GpuStep& s : l->steps) {
    if (s.kind == GpuStep::Kind::kCompare) {
      ++compares;
      EXPECT_EQ(s.compare, CompareOp::kEqual);
      EXPECT_TRUE(s.int64_operands);
      EXPECT_EQ(l->dtypes[s.out], DataType::kBool);
      EXPECT_EQ(s.broadcast.out_dims, l->shapes[s.out]);
    }
    if (s.kind == GpuStep::Kind::kWhere) {
      ++wheres;
      EXPECT_EQ(l->dtypes[s.in[0]], DataType::kBool);
      EXPECT_EQ(s.where.out_dims, l->shapes[s.out]);
      EXPECT_EQ(s.where.elements, Elements(l->shapes[s.out]));
    }
  }
  EXPECT_GE(compares, 1);
  EXPECT_EQ(wheres, 2);  // one per layer
  ExpectAligned(*l);
}

// The decoder's ConvTranspose (kernel 4, stride 2, pads 1) is one step holding its window:
// each spatial size doubles.
TEST(LowerPlanTest, ATransposedConvolutionIsOneStepWithItsWindow) {
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

// A Gather of int64 data (the recommender MLP picks its ids' columns) moves pairs of
// 4-byte words: the same kernel, twice the inner extent.
TEST(LowerPlanTest, AGatherOfInt64DataMovesPairsOfWords) {
  WithReference mlp = PrepareWithReference("mlp_op13");
  ASSERT_TRUE(mlp.prepared.plan);
  auto l = LowerPlan(mlp.prepared.model->graph(), *mlp.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  int int64_gathers = 0;
  for (const GpuStep& s : l->steps) {
    if (s.kind != GpuStep::Kind::kGather || l->dtypes[s.in[0]] != DataType::kInt64) continue;
    ++int64_gathers;
    EXPECT_EQ(s.gather.outer * s.gather.num_indices * s.gather.inner,
              2 * Elements(l->shapes[s.out]));
  }
  EXPECT_EQ(int64_gathers, 2);
  // Every gather has an error flag of its own, which names its node.
  std::set<int> slots;
  for (const GpuStep& s : l->steps) {
    if (s.kind != GpuStep::Kind::kGather) {
      EXPECT_EQ(s.flag, -1);
      continue;
    }
    ASSERT_GE(s.flag, 0);
    ASSERT_LT(static_cast<size_t>(s.flag), l->flag_nodes.size());
    EXPECT_TRUE(slots.insert(s.flag).second) << "slot " << s.flag << " shared";
    EXPECT_EQ(l->flag_nodes[s.flag], mlp.prepared.model->graph().Describe(s.node));
    EXPECT_THAT(l->flag_nodes[s.flag], HasSubstr("(Gather)"));
  }
  EXPECT_EQ(slots.size(), l->flag_nodes.size());
}

// Every Resize of the detection test model (nearest by sizes and scales, linear with
// half_pixel and align_corners, cubic, 1-D, trilinear over a volume) is one step with its
// tap tables as constants: one tap per axis for nearest, two for linear, four for cubic.
TEST(LowerPlanTest, EveryResizeIsOneStepReadingItsTapTables) {
  WithReference det = PrepareWithReference("det_resize_op13", ".a.sht");
  ASSERT_TRUE(det.prepared.plan);
  auto l = LowerPlan(det.prepared.model->graph(), *det.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const Graph& graph = det.prepared.model->graph();
  int resizes = 0;
  for (const GpuStep& s : l->steps) {
    if (s.kind != GpuStep::Kind::kResize) continue;
    ++resizes;
    const Node& node = graph.nodes[s.node];
    SCOPED_TRACE(node.name);
    EXPECT_EQ(s.resize.out_dims, l->shapes[s.out]);
    ASSERT_EQ(s.weight_slots.size(), 2u);
    EXPECT_EQ(l->blobs[s.weight_slots[0]].key.rfind("resize-idx#", 0), 0u);
    EXPECT_EQ(l->blobs[s.weight_slots[0]].data.dtype(), DataType::kInt64);
    EXPECT_EQ(l->blobs[s.weight_slots[1]].data.dtype(), DataType::kFp32);
    EXPECT_TRUE(s.resize.idx.empty());  // moved into the blobs
    const std::string mode = node.GetString("mode", "nearest");
    const int64_t want_taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
    int64_t most = 0;
    for (int d = 0; d < s.resize.index.rank; ++d) most = std::max(most, s.resize.index.taps[d]);
    EXPECT_EQ(most, want_taps);
  }
  EXPECT_EQ(resizes, 12);
}

// DepthToSpace in both modes and SpaceToDepth become one transpose each; GroupNormalization
// becomes a layer norm over each (item, group) with a scale of ones, then its affine.
TEST(LowerPlanTest, DepthAndSpaceAreTransposesAndGroupNormIsALayerNormAndItsAffine) {
  WithReference det = PrepareWithReference("det_graph_layout_norm", ".a.sht");
  ASSERT_TRUE(det.prepared.plan);
  auto l = LowerPlan(det.prepared.model->graph(), *det.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  int transposes = 0;
  for (const GpuStep& s : l->steps) transposes += s.kind == GpuStep::Kind::kTranspose;
  EXPECT_EQ(transposes, 3);
  const GpuStep* norm = FirstStep(*l, GpuStep::Kind::kLayerNorm);
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->in[1], -1);
  ASSERT_EQ(norm->weight_slots.size(), 1u);
  const Tensor& ones = l->blobs[norm->weight_slots[0]].data;
  // [batch, 8, 4, 6] in 2 groups: rows of 4·4·6 values.
  ASSERT_EQ(norm->dims.size(), 2u);
  EXPECT_EQ(norm->dims[1], 96);
  EXPECT_EQ(ones.element_count(), 96);
  EXPECT_EQ(ones.values<float>()[95], 1.f);
  EXPECT_NEAR(norm->epsilon, 1e-3f, 1e-9f);
}

// The U-Net's per-pixel class is an ArgMax over the channels, writing int64; the norm
// shuffle model's integer Mods keep their fmod flags.
// An fp16 model lowers: its input cast from fp16 to fp32 and its output rounded back
// (a kToHalf step writing the fp16 output); fp32 in between.
TEST(LowerPlanTest, AnFp16ModelCastsItsInputFromAndItsOutputTo16Bits) {
  for (const char* name : {"fp16_cnn", "fp16_transformer", "fp16_mixed"}) {
    SCOPED_TRACE(name);
    WithReference r = PrepareWithReference(name);
    ASSERT_TRUE(r.prepared.plan);
    auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    const Graph& g = r.prepared.model->graph();
    int from_half = 0, to_half = 0;
    for (const GpuStep& s : l->steps) {
      if (s.kind == GpuStep::Kind::kCast && s.cast == CastSource::kFp16) ++from_half;
      if (s.kind == GpuStep::Kind::kToHalf) {
        ++to_half;
        EXPECT_EQ(l->dtypes[s.out], DataType::kFp16);
        EXPECT_EQ(l->dtypes[s.in[0]], DataType::kFp32);
      }
    }
    const bool fp16_io = l->dtypes[g.inputs[0]] == DataType::kFp16;
    EXPECT_EQ(from_half >= 1, fp16_io || std::string(name) == "fp16_mixed");
    EXPECT_GE(to_half, 1);
    ExpectAligned(*l);
  }
}

TEST(LowerPlanTest, ArgMaxAndIntegerModLower) {
  WithReference unet = PrepareWithReference("det_unet_op13", ".a.sht");
  ASSERT_TRUE(unet.prepared.plan);
  auto l = LowerPlan(unet.prepared.model->graph(), *unet.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const GpuStep* arg = FirstStep(*l, GpuStep::Kind::kArgExtreme);
  ASSERT_NE(arg, nullptr);
  EXPECT_TRUE(arg->arg_max);
  EXPECT_FALSE(arg->select_last);
  EXPECT_EQ(arg->axis, 1);
  EXPECT_EQ(l->dtypes[arg->out], DataType::kInt64);
  WithReference shuffle = PrepareWithReference("det_norm_shuffle_op13", ".a.sht");
  ASSERT_TRUE(shuffle.prepared.plan);
  auto m = LowerPlan(shuffle.prepared.model->graph(), *shuffle.prepared.plan);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  int mods = 0, fmods = 0;
  for (const GpuStep& s : m->steps) {
    if (s.kind != GpuStep::Kind::kMod) continue;
    ++mods;
    fmods += s.fmod;
    EXPECT_TRUE(s.int64_operands);
  }
  EXPECT_EQ(mods, 3);
  EXPECT_EQ(fmods, 1);
}

// GatherElements of fp32 data [3, 4] along axis 0 by indices [2, 4], and of int64 data
// [3, 4] along axis -1 by indices [3, 2].
Graph GatherElementsGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {3, 4});
  const int idx = b.Input("idx", {2, 4}, DataType::kInt64);
  const int ids = b.Input("ids", {3, 4}, DataType::kInt64);
  const int idx2 = b.Input("idx2", {3, 2}, DataType::kInt64);
  const int g0 = b.Op("GatherElements", "g0", {x, idx}, {{"axis", AInt(0)}});
  const int g1 = b.Op("GatherElements", "g1", {ids, idx2}, {{"axis", AInt(-1)}});
  return b.Finish(std::vector<int>{g0, g1});
}
const std::vector<Shape> kGatherElementsShapes = {{3, 4}, {2, 4}, {3, 4}, {3, 2}};

// ScatterElements of fp32 data [4, 3] along axis 0 by indices [2, 3], and ScatterND of it
// by index tuples [3, 1] (whole rows), both under `reduction`.
Graph ScatterGraph(const std::string& reduction) {
  GraphBuilder b;
  const int data = b.Input("data", {4, 3});
  const int eidx = b.Input("eidx", {2, 3}, DataType::kInt64);
  const int eupd = b.Input("eupd", {2, 3});
  const int nidx = b.Input("nidx", {3, 1}, DataType::kInt64);
  const int nupd = b.Input("nupd", {3, 3});
  const int se = b.Op("ScatterElements", "se", {data, eidx, eupd},
                      {{"axis", AInt(0)}, {"reduction", AString(reduction)}});
  const int sn = b.Op("ScatterND", "sn", {data, nidx, nupd}, {{"reduction", AString(reduction)}});
  return b.Finish(std::vector<int>{se, sn});
}
const std::vector<Shape> kScatterShapes = {{4, 3}, {2, 3}, {2, 3}, {3, 1}, {3, 3}};

// CumSum of fp32 [2, 3, 4] along axis 1 (constant), along -1 exclusive and reversed, and of
// int64 [2, 5] along axis 1 reversed.
Graph CumSumGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 4});
  const int ids = b.Input("ids", {2, 5}, DataType::kInt64);
  const int one = b.Constant("one", I64({}, {1}));
  const int last = b.Constant("last", I64({}, {-1}));
  const int c0 = b.Op("CumSum", "c0", {x, one});
  const int c1 = b.Op("CumSum", "c1", {x, last}, {{"exclusive", AInt(1)}, {"reverse", AInt(1)}});
  const int c2 = b.Op("CumSum", "c2", {ids, one}, {{"reverse", AInt(1)}});
  return b.Finish(std::vector<int>{c0, c1, c2});
}
const std::vector<Shape> kCumSumShapes = {{2, 3, 4}, {2, 5}};

// Trilu of fp32 [2, 3, 4] (upper, no k; lower with k = 1) and of int64 [3, 3] (upper, k = -1).
Graph TriluGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 4});
  const int ids = b.Input("ids", {3, 3}, DataType::kInt64);
  const int one = b.Constant("one", I64({}, {1}));
  const int minus_one = b.Constant("minus_one", I64({}, {-1}));
  const int t0 = b.Op("Trilu", "t0", {x});
  const int t1 = b.Op("Trilu", "t1", {x, one}, {{"upper", AInt(0)}});
  const int t2 = b.Op("Trilu", "t2", {ids, minus_one});
  return b.Finish(std::vector<int>{t0, t1, t2});
}
const std::vector<Shape> kTriluShapes = {{2, 3, 4}, {3, 3}};

TEST(LowerPlanTest, GatherElementsIsOneStepWithAnErrorFlagNamingItsNode) {
  Prepared p = Prepare(Model::FromGraph(GatherElementsGraph()), kGatherElementsShapes);
  ASSERT_TRUE(p.plan);
  auto l = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->steps.size(), 2u);
  const Graph& g = p.model->graph();
  for (const GpuStep& s : l->steps) EXPECT_EQ(s.kind, GpuStep::Kind::kGatherElements);
  EXPECT_EQ(l->steps[0].axis, 0);
  EXPECT_EQ(l->steps[0].dims, (Shape{3, 4}));
  EXPECT_EQ(l->shapes[l->steps[0].out], (Shape{2, 4}));
  EXPECT_EQ(l->steps[1].axis, 1);  // -1, made non-negative
  EXPECT_EQ(l->dtypes[l->steps[1].in[0]], DataType::kInt64);
  EXPECT_EQ(l->dtypes[l->steps[1].out], DataType::kInt64);
  ASSERT_EQ(l->flag_nodes.size(), 2u);
  for (const GpuStep& s : l->steps) {
    ASSERT_GE(s.flag, 0);
    EXPECT_EQ(l->flag_nodes[s.flag], g.Describe(s.node));
    EXPECT_THAT(l->flag_nodes[s.flag], HasSubstr("(GatherElements)"));
  }
  EXPECT_NE(l->steps[0].flag, l->steps[1].flag);
  ExpectAligned(*l);
}

// Each scatter is one step reading data, indices and updates with its reduction and a flag of
// its own; with no reduction it has an int32 scratch of the data's shape in the arena, clear
// of every value the step reads and writes.
TEST(LowerPlanTest, ScattersAreOneStepEachWithScratchOnlyWithoutAReduction) {
  const std::pair<const char*, ScatterReduction> reductions[] = {{"none", ScatterReduction::kNone},
                                                                 {"add", ScatterReduction::kAdd},
                                                                 {"mul", ScatterReduction::kMul},
                                                                 {"max", ScatterReduction::kMax},
                                                                 {"min", ScatterReduction::kMin}};
  for (const auto& [name, reduction] : reductions) {
    SCOPED_TRACE(name);
    Prepared p = Prepare(Model::FromGraph(ScatterGraph(name)), kScatterShapes);
    ASSERT_TRUE(p.plan);
    auto l = LowerPlan(p.model->graph(), *p.plan);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ASSERT_EQ(l->steps.size(), 2u);
    EXPECT_EQ(l->steps[0].kind, GpuStep::Kind::kScatterElements);
    EXPECT_EQ(l->steps[0].axis, 0);
    EXPECT_EQ(l->steps[1].kind, GpuStep::Kind::kScatterNd);
    EXPECT_EQ(l->flag_nodes.size(), 2u);
    for (const GpuStep& s : l->steps) {
      EXPECT_EQ(s.scatter, reduction);
      EXPECT_EQ(s.dims, (Shape{4, 3}));
      ASSERT_EQ(s.in.size(), 3u);
      ASSERT_GE(s.flag, 0);
      EXPECT_EQ(l->flag_nodes[s.flag], p.model->graph().Describe(s.node));
      if (reduction != ScatterReduction::kNone) {
        EXPECT_EQ(s.scratch, -1);
        continue;
      }
      ASSERT_GE(s.scratch, 0);
      EXPECT_EQ(l->dtypes[s.scratch], DataType::kInt32);
      EXPECT_EQ(l->shapes[s.scratch], (Shape{4, 3}));
      const GpuValue& scratch = l->values[s.scratch];
      EXPECT_EQ(scratch.home, GpuValue::Home::kArena);
      EXPECT_EQ(scratch.bytes, 12 * 4);
      for (int v : {s.in[0], s.in[1], s.in[2], s.out}) {
        const GpuValue& other = l->values[v];
        EXPECT_TRUE(scratch.offset + scratch.bytes <= other.offset ||
                    other.offset + other.bytes <= scratch.offset)
            << "the scratch shares bytes with value " << v;
      }
    }
    ExpectAligned(*l);
  }
}

TEST(LowerPlanTest, CumSumIsOneStepOverItsConstantAxis) {
  Prepared p = Prepare(Model::FromGraph(CumSumGraph()), kCumSumShapes);
  ASSERT_TRUE(p.plan);
  auto l = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->steps.size(), 3u);
  for (const GpuStep& s : l->steps) {
    EXPECT_EQ(s.kind, GpuStep::Kind::kCumSum);
    EXPECT_EQ(s.in.size(), 1u);  // the axis is folded into the step, not read
    EXPECT_EQ(s.flag, -1);
  }
  EXPECT_EQ(l->steps[0].dims, (Shape{2, 3, 4}));
  EXPECT_FALSE(l->steps[0].exclusive);
  EXPECT_FALSE(l->steps[0].reverse);
  EXPECT_EQ(l->steps[1].dims, (Shape{6, 4, 1}));
  EXPECT_TRUE(l->steps[1].exclusive);
  EXPECT_TRUE(l->steps[1].reverse);
  EXPECT_EQ(l->steps[2].dims, (Shape{2, 5, 1}));
  EXPECT_FALSE(l->steps[2].exclusive);
  EXPECT_TRUE(l->steps[2].reverse);
  EXPECT_EQ(l->dtypes[l->steps[2].out], DataType::kInt64);
}

TEST(LowerPlanTest, TriluIsOneStepWithItsConstantK) {
  Prepared p = Prepare(Model::FromGraph(TriluGraph()), kTriluShapes);
  ASSERT_TRUE(p.plan);
  auto l = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->steps.size(), 3u);
  for (const GpuStep& s : l->steps) {
    EXPECT_EQ(s.kind, GpuStep::Kind::kTrilu);
    EXPECT_EQ(s.in.size(), 1u);
  }
  EXPECT_EQ(l->steps[0].dims, (Shape{2, 3, 4}));
  EXPECT_TRUE(l->steps[0].upper);
  EXPECT_EQ(l->steps[0].start, 0);
  EXPECT_FALSE(l->steps[1].upper);
  EXPECT_EQ(l->steps[1].start, 1);
  EXPECT_EQ(l->steps[2].dims, (Shape{1, 3, 3}));
  EXPECT_TRUE(l->steps[2].upper);
  EXPECT_EQ(l->steps[2].start, -1);
  EXPECT_EQ(l->dtypes[l->steps[2].out], DataType::kInt64);
}

// The detection test models' GatherElements, scatters, CumSums and Trilus lower; what is
// left is their NonZero, Einsum and run-time shapes.
TEST(LowerPlanTest, TheDetectionModelsLackNoneOfTheIndexingOperators) {
  for (const char* name : {"det_scatter_gather_op17", "det_tensor_ops_op17"}) {
    SCOPED_TRACE(name);
    WithReference r = PrepareWithReference(name, ".a.sht");
    ASSERT_TRUE(r.prepared.plan);
    auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan);
    ASSERT_FALSE(l.ok());
    const std::string& m = l.status().message();
    for (const char* op :
         {"(GatherElements)", "(ScatterElements)", "(ScatterND)", "(CumSum)", "(Trilu)"})
      EXPECT_THAT(m, ::testing::Not(HasSubstr(op))) << m;
    EXPECT_THAT(m, HasSubstr("(NonZero)"));
  }
}

// The columns [begin, end) of each row of a [rows, cols] fp32 tensor.
std::vector<float> ColumnsOf(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = begin; c < end; ++c) out.push_back(t.values<float>()[r * cols + c]);
  return out;
}

// Whether two arena values' bytes overlap.
bool Overlap(const GpuValue& a, const GpuValue& b) {
  return a.home == GpuValue::Home::kArena && b.home == GpuValue::Home::kArena &&
         a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// Tensor parallelism over two shards sharing the plan's memory: each product with at least
// min_columns output columns becomes a fork, one GEMM per shard holding its columns of the
// weight and the bias (the whole's, cut), a join and the columns placed into the output;
// the smaller products stay whole. Nothing a shard's step touches shares arena bytes with
// what another's does.
TEST(LowerPlanTest, TensorParallelismSplitsTheLargeProductsColumnWise) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(p.plan);
  auto whole = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  GpuPlanOptions options;
  options.tensor_parallel.shards = 2;
  options.tensor_parallel.min_columns = 100;
  auto split = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  using K = GpuStep::Kind;
  int expected_splits = 0;
  size_t at = 0;  // the split lowering's next step
  for (const GpuStep& w : whole->steps) {
    ASSERT_EQ(w.kind, K::kGemm);
    ASSERT_LT(at, split->steps.size());
    if (w.gemm.n < 100) {
      const GpuStep& same = split->steps[at++];
      EXPECT_EQ(same.kind, K::kGemm);
      EXPECT_EQ(same.shard, -1);
      EXPECT_EQ(same.gemm.n, w.gemm.n);
      continue;
    }
    SCOPED_TRACE("the product of " + std::to_string(w.gemm.n) + " columns");
    ++expected_splits;
    ASSERT_LE(at + 6, split->steps.size());
    EXPECT_EQ(split->steps[at].kind, K::kFork);
    const GpuStep& a = split->steps[at + 1];
    const GpuStep& b = split->steps[at + 2];
    EXPECT_EQ(split->steps[at + 3].kind, K::kJoin);
    ASSERT_EQ(a.kind, K::kGemm);
    ASSERT_EQ(b.kind, K::kGemm);
    EXPECT_EQ(a.shard, 0);
    EXPECT_EQ(b.shard, 1);
    EXPECT_EQ(a.in[0], w.in[0]);  // both read the whole input
    EXPECT_EQ(b.in[0], w.in[0]);
    EXPECT_EQ(a.gemm.n + b.gemm.n, w.gemm.n);
    EXPECT_EQ(a.gemm.n % 8, 0);
    EXPECT_EQ(a.gemm.epilogue, w.gemm.epilogue);
    // Each shard's weight and bias are the whole's columns.
    const Tensor& ww = whole->blobs[w.weight_slots[0]].data;
    const bool t = w.gemm.transpose_w;
    const Tensor& wa = split->blobs[a.weight_slots[0]].data;
    const Tensor& wb = split->blobs[b.weight_slots[0]].data;
    EXPECT_EQ(split->blobs[a.weight_slots[0]].shard, -1);
    if (!t) {
      EXPECT_EQ(ColumnsOf(wa, 0, a.gemm.n), ColumnsOf(ww, 0, a.gemm.n));
      EXPECT_EQ(ColumnsOf(wb, 0, b.gemm.n), ColumnsOf(ww, a.gemm.n, w.gemm.n));
    } else {
      ASSERT_EQ(wa.byte_size() + wb.byte_size(), ww.byte_size());
      EXPECT_EQ(std::memcmp(wa.data(), ww.data(), wa.byte_size()), 0);
      EXPECT_EQ(std::memcmp(wb.data(), static_cast<const char*>(ww.data()) + wa.byte_size(),
                            wb.byte_size()),
                0);
    }
    const Tensor& bias = whole->blobs[w.weight_slots[1]].data;
    const Tensor& ba = split->blobs[a.weight_slots[1]].data;
    const Tensor& bb = split->blobs[b.weight_slots[1]].data;
    ASSERT_EQ(ba.byte_size() + bb.byte_size(), bias.byte_size());
    EXPECT_EQ(std::memcmp(ba.data(), bias.data(), ba.byte_size()), 0);
    EXPECT_EQ(std::memcmp(bb.data(), static_cast<const char*>(bias.data()) + ba.byte_size(),
                          bb.byte_size()),
              0);
    EXPECT_THAT(split->blobs[b.weight_slots[0]].key, ::testing::HasSubstr("|cols "));
    // The columns placed into the output at their offsets.
    const GpuStep& pa = split->steps[at + 4];
    const GpuStep& pb = split->steps[at + 5];
    ASSERT_EQ(pa.kind, K::kPlace);
    ASSERT_EQ(pb.kind, K::kPlace);
    EXPECT_EQ(pa.in[0], a.out);
    EXPECT_EQ(pb.in[0], b.out);
    EXPECT_EQ(pa.out, w.out);
    EXPECT_EQ(pb.out, w.out);
    EXPECT_EQ(pa.start, 0);
    EXPECT_EQ(pb.start, a.gemm.n);
    EXPECT_EQ(pa.axis, 1);
    // Run concurrently: the two outputs, the input and the product's output all apart.
    const std::vector<int> apart = {a.out, b.out, w.in[0]};
    for (size_t i = 0; i < apart.size(); ++i)
      for (size_t j = i + 1; j < apart.size(); ++j)
        EXPECT_FALSE(Overlap(split->values[apart[i]], split->values[apart[j]]))
            << "values " << apart[i] << " and " << apart[j];
    at += 6;
    if (w.post) {  // the activation the epilogue lacks, on the whole output
      ASSERT_LT(at, split->steps.size());
      EXPECT_EQ(split->steps[at].kind, K::kUnary);
      EXPECT_EQ(split->steps[at].unary, *w.post);
      ++at;
    }
  }
  EXPECT_EQ(at, split->steps.size());
  EXPECT_GT(expected_splits, 0);
  EXPECT_LT(expected_splits, 4);  // the last product, of one column, stays whole
  EXPECT_EQ(split->split_products, expected_splits);
  EXPECT_EQ(split->shards, 2);
  EXPECT_EQ(split->shard_arena_bytes, (std::vector<int64_t>{0, 0}));
  ExpectAligned(*split);
}

// A shard with memory of its own (another device) copies the product's input into its
// arena, computes its columns there from weights kept on its device, and copies them back;
// in fp16, the input is rounded once, before the fork, and each shard's weight is stored
// 16-bit.
TEST(LowerPlanTest, AShardWithMemoryOfItsOwnCopiesItsInputInAndItsColumnsBack) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(p.plan);
  for (GemmMath math : {GemmMath::kFp32, GemmMath::kFp16}) {
    SCOPED_TRACE(math == GemmMath::kFp32 ? "fp32" : "fp16");
    GpuPlanOptions options;
    options.math = math;
    options.tensor_parallel.shards = 3;
    options.tensor_parallel.min_columns = 100;
    options.tensor_parallel.own_memory = {false, true, true};
    auto l = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    using K = GpuStep::Kind;
    const auto fork = std::find_if(l->steps.begin(), l->steps.end(),
                                   [](const GpuStep& s) { return s.kind == K::kFork; });
    ASSERT_NE(fork, l->steps.end());
    const size_t f = static_cast<size_t>(fork - l->steps.begin());
    if (math == GemmMath::kFp16) {
      ASSERT_GT(f, 0u);
      EXPECT_EQ(l->steps[f - 1].kind, K::kToHalf);  // rounded once for every shard
    }
    // Shard 0 shares the plan's memory: one GEMM. Shards 1 and 2: copy in, GEMM, copy out.
    ASSERT_LE(f + 9, l->steps.size());
    const GpuStep& g0 = l->steps[f + 1];
    EXPECT_EQ(g0.kind, K::kGemm);
    EXPECT_EQ(g0.shard, 0);
    int64_t columns = g0.gemm.n;
    for (int shard : {1, 2}) {
      SCOPED_TRACE("shard " + std::to_string(shard));
      const size_t i = f + 2 + 3 * static_cast<size_t>(shard - 1);
      const GpuStep& in = l->steps[i];
      const GpuStep& gemm = l->steps[i + 1];
      const GpuStep& out = l->steps[i + 2];
      ASSERT_EQ(in.kind, K::kCopy);
      ASSERT_EQ(gemm.kind, K::kGemm);
      ASSERT_EQ(out.kind, K::kCopy);
      EXPECT_EQ(in.shard, shard);
      EXPECT_EQ(gemm.shard, shard);
      EXPECT_EQ(out.shard, shard);
      EXPECT_EQ(in.in[0], g0.in[0]);
      EXPECT_EQ(gemm.in[0], in.out);
      EXPECT_EQ(out.in[0], gemm.out);
      const GpuValue& x = l->values[in.out];
      const GpuValue& y = l->values[gemm.out];
      EXPECT_EQ(x.home, GpuValue::Home::kShard);
      EXPECT_EQ(x.shard, shard);
      EXPECT_EQ(x.offset, 0);
      EXPECT_EQ(y.home, GpuValue::Home::kShard);
      EXPECT_EQ(y.shard, shard);
      EXPECT_GE(y.offset, x.bytes);
      EXPECT_LE(y.offset + y.bytes, l->shard_arena_bytes[static_cast<size_t>(shard)]);
      EXPECT_EQ(l->dtypes[in.out], l->dtypes[g0.in[0]]);
      EXPECT_EQ(l->values[out.out].home, GpuValue::Home::kArena);
      const GpuLowering::Blob& w = l->blobs[gemm.weight_slots[0]];
      EXPECT_EQ(w.shard, shard);
      EXPECT_EQ(l->blobs[gemm.weight_slots[1]].shard, shard);
      if (math == GemmMath::kFp16) {
        EXPECT_EQ(w.data.dtype(), DataType::kFp16);
        EXPECT_THAT(w.key, ::testing::EndsWith("~fp16"));
      }
      columns += gemm.gemm.n;
    }
    EXPECT_EQ(l->steps[f + 8].kind, K::kJoin);
    // The shards run concurrently: what any of them writes on the plan's device keeps clear
    // of the input shard 0 may still be reading, and of each other.
    std::vector<int> written;
    for (size_t i = f + 1; i < f + 8; ++i)
      if (l->values[l->steps[i].out].home == GpuValue::Home::kArena)
        written.push_back(l->steps[i].out);
    EXPECT_EQ(written.size(), 3u);  // shard 0's columns, and shards 1's and 2's copied back
    for (size_t i = 0; i < written.size(); ++i) {
      EXPECT_FALSE(Overlap(l->values[written[i]], l->values[g0.in[0]])) << "value " << written[i];
      for (size_t j = i + 1; j < written.size(); ++j)
        EXPECT_FALSE(Overlap(l->values[written[i]], l->values[written[j]]));
    }
    EXPECT_EQ(columns, l->steps[f + 9].dims[1]);  // the output's columns, all placed
    EXPECT_EQ(l->shard_arena_bytes[0], 0);
    EXPECT_GT(l->shard_arena_bytes[1], 0);
    EXPECT_GT(l->shard_arena_bytes[2], 0);
    ExpectAligned(*l);
  }
  // Where the input dies before the last shard's columns come back, they still do not take
  // its bytes: shard 0 may be reading them.
  Prepared wide = Prepare(Model::FromGraph(WideIntoNarrowGraph()), {{4, 512}});
  ASSERT_TRUE(wide.plan);
  GpuPlanOptions options;
  options.tensor_parallel.shards = 3;
  options.tensor_parallel.min_columns = 16;
  options.tensor_parallel.own_memory = {false, true, true};
  auto l = LowerPlan(wide.model->graph(), *wide.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->split_products, 1);
  int x = -1, written = 0;
  for (const GpuStep& step : l->steps) {
    if (step.kind == GpuStep::Kind::kGemm && step.shard == 0) x = step.in[0];
    if (step.shard < 0 || step.out < 0 || l->values[step.out].home != GpuValue::Home::kArena)
      continue;
    ASSERT_GE(x, 0);
    EXPECT_FALSE(Overlap(l->values[step.out], l->values[x])) << "value " << step.out;
    ++written;
  }
  EXPECT_EQ(written, 3);
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
    auto lowered = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
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
  }
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
  std::vector<int64_t> ids(2 * 32);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % 50);
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
      ExpectGpuMatchesCpu(text, {{I64({2, 32}, ids)}, {I64({2, 32}, ids)}, {I64({2, 32}, ids)}},
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
  }
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
