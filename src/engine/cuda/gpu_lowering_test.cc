// The GPU plan's lowering (gpu_lowering.h): host only, runs everywhere. Runs of the lowered
// plans on a device are in gpu_plan_test.cc.
#include "engine/cuda/gpu_lowering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/cuda/test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AInt;
using engine::testing::AString;
using engine::testing::F32;
using engine::testing::GraphBuilder;
using engine::testing::Random;
using ::testing::HasSubstr;

const GpuStep* FirstStep(const GpuLowering& l, GpuStep::Kind kind) {
  for (const GpuStep& s : l.steps)
    if (s.kind == kind) return &s;
  return nullptr;
}

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

// Einsums that are products lower, as the products the optimiser made of them: the
// scores and the weighted sum are batched GEMMs over batch and heads.
TEST(LowerPlanTest, AttentionWrittenAsEinsumsBecomesBatchedGemms) {
  Prepared p = Prepare(Model::FromGraph(EinsumAttentionGraph()), {{2, 3, 5, 8}});
  ASSERT_TRUE(p.plan);
  for (const Node& n : p.model->graph().nodes) EXPECT_NE(n.op_type, "Einsum");
  auto lowered = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  std::vector<int64_t> batches;
  for (const GpuStep& s : lowered->steps)
    if (s.kind == GpuStep::Kind::kGemm) batches.push_back(s.gemm.batch);
  EXPECT_EQ(batches, (std::vector<int64_t>{6, 6}));
  ExpectAligned(*lowered);
}

// Softplus, Reciprocal, Elu, PRelu, LogSoftmax, ReduceL2, ReduceSumSquare, ReduceMin and
// ReduceProd lower onto the element-wise, softmax and reduction kernels; Tile (fp32 and int64)
// onto one strided copy; And, Or, Xor and Not onto the logical kernel.
TEST(LowerPlanTest, MoreElementWiseSoftmaxAndReductionOperatorsLower) {
  Prepared p = Prepare(Model::FromGraph(MoreOperatorsGraph()), {{2, 3, 4, 5}});
  ASSERT_TRUE(p.plan);
  const Graph& g = p.model->graph();
  auto l = LowerPlan(g, *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::map<std::string, const GpuStep*> by_node;
  for (const GpuStep& s : l->steps) by_node[g.nodes[s.node].name] = &s;
  ASSERT_EQ(by_node.size(), 30u);
  // Max of three: x copied into the output, then inv and the row folded in, in place.
  std::vector<GpuStep::Kind> max_steps;
  for (const GpuStep& s : l->steps)
    if (g.nodes[s.node].name == "top3") max_steps.push_back(s.kind);
  EXPECT_EQ(max_steps,
            (std::vector<GpuStep::Kind>{GpuStep::Kind::kStridedSlice, GpuStep::Kind::kBinary,
                                        GpuStep::Kind::kBinary}));
  for (const char* cast : {"i32", "back", "flag", "nz", "nb"})
    EXPECT_EQ(by_node[cast]->kind, GpuStep::Kind::kIntCast) << cast;
  ASSERT_EQ(by_node["edge"]->kind, GpuStep::Kind::kPad);
  EXPECT_EQ(by_node["edge"]->pad.index.mode, 1);
  EXPECT_EQ(by_node["mirror"]->pad.index.mode, 2);
  EXPECT_EQ(by_node["mirror"]->pad.out_dims, (std::vector<int64_t>{2, 5, 7, 10}));
  EXPECT_EQ(by_node["soft"]->unary, UnaryOp::kSoftplus);
  EXPECT_EQ(by_node["inv"]->unary, UnaryOp::kReciprocal);
  EXPECT_EQ(by_node["elu"]->unary, UnaryOp::kElu);
  EXPECT_FLOAT_EQ(by_node["elu"]->alpha, 0.5f);
  EXPECT_EQ(by_node["prelu"]->kind, GpuStep::Kind::kBinary);
  EXPECT_EQ(by_node["prelu"]->binary, BinaryOp::kPRelu);
  EXPECT_EQ(by_node["logp"]->kind, GpuStep::Kind::kSoftmax);
  EXPECT_TRUE(by_node["logp"]->log_softmax);
  const std::pair<const char*, ReduceOp> reductions[] = {{"l2", ReduceOp::kL2},
                                                         {"sq", ReduceOp::kSumSquare},
                                                         {"lo", ReduceOp::kMin},
                                                         {"prod", ReduceOp::kProd}};
  for (const auto& [name, op] : reductions) {
    ASSERT_EQ(by_node[name]->kind, GpuStep::Kind::kReduce) << name;
    EXPECT_EQ(by_node[name]->reduce, op) << name;
  }
  EXPECT_EQ(by_node["sq"]->axis, 1);
  EXPECT_EQ(by_node["sq"]->length, 2);
  // x [2, 3, 4, 5] as [2, 1, 3, 4, 1, 5] read onto [2, 2, 3, 4, 3, 5] (the unit axes stride 0).
  ASSERT_EQ(by_node["tiled"]->kind, GpuStep::Kind::kStridedSlice);
  EXPECT_EQ(Elements(by_node["tiled"]->slice.out_dims), 2 * 6 * 4 * 15);
  ASSERT_EQ(by_node["ids"]->kind, GpuStep::Kind::kStridedSlice);  // int64: pairs of words
  EXPECT_EQ(Elements(by_node["ids"]->slice.out_dims), 4 * 3 * 4 * 5 * 2);
  const std::pair<const char*, LogicalOp> logic[] = {{"both", LogicalOp::kAnd},
                                                     {"either", LogicalOp::kOr},
                                                     {"one", LogicalOp::kXor},
                                                     {"not", LogicalOp::kNot}};
  for (const auto& [name, op] : logic) {
    ASSERT_EQ(by_node[name]->kind, GpuStep::Kind::kLogical) << name;
    EXPECT_EQ(by_node[name]->logical, op) << name;
  }
  EXPECT_EQ(by_node["not"]->in.size(), 1u);
  EXPECT_EQ(by_node["not"]->broadcast.elements, 2 * 3 * 4 * 5);
  EXPECT_EQ(by_node["both"]->broadcast.elements, 2 * 3 * 4 * 5);
  // GatherND: two tuples of two into x's [2, 3] leading axes, slices of 4 x 5; with
  // batch_dims 1, one tuple per batch row into its 3 rows.
  ASSERT_EQ(by_node["picked"]->kind, GpuStep::Kind::kGatherNd);
  EXPECT_EQ(by_node["picked"]->gather_nd.k, 2);
  EXPECT_EQ(by_node["picked"]->gather_nd.dims[1], 3);
  EXPECT_EQ(by_node["picked"]->gather_nd.per_batch, 2);
  EXPECT_EQ(by_node["picked"]->gather_nd.slice, 20);
  EXPECT_GE(by_node["picked"]->flag, 0);
  EXPECT_EQ(by_node["rowpick"]->gather_nd.k, 1);
  EXPECT_EQ(by_node["rowpick"]->gather_nd.dims[0], 3);
  EXPECT_EQ(by_node["rowpick"]->gather_nd.per_batch, 1);
  EXPECT_EQ(by_node["rowpick"]->gather_nd.batch_stride, 60);
  // TopK: one step per output, the values' and the indices'.
  int topk = 0;
  for (const GpuStep& s : l->steps) {
    if (s.kind != GpuStep::Kind::kTopK) continue;
    ++topk;
    EXPECT_EQ(s.axis, 1);
    EXPECT_EQ(s.length, 2);
    EXPECT_FALSE(s.arg_max);
  }
  EXPECT_EQ(topk, 2);
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

// A control-flow test model's If has no GPU kernel yet, and the Add after it reads what
// the If made at run time: one line per node.
TEST(LowerPlanTest, AModelWithOperatorsItLacksIsRefusedNamingEveryNode) {
  WithReference cf = PrepareWithReference("cf_graph_if", ".then.sht");
  ASSERT_TRUE(cf.prepared.plan);
  auto lowered = LowerPlan(cf.prepared.model->graph(), *cf.prepared.plan);
  ASSERT_FALSE(lowered.ok());
  EXPECT_EQ(lowered.status().code(), StatusCode::kUnimplemented);
  const std::string& m = lowered.status().message();
  EXPECT_THAT(m, HasSubstr("the GPU path cannot run this model yet"));
  EXPECT_THAT(m, HasSubstr("(If): the GPU path has no kernel"));
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 2) << m;
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
  // In every tier: mixed precision rounds some biases to 16 bits, the same ones at every size.
  for (GemmMath math : {GemmMath::kFp32, GemmMath::kFp16, GemmMath::kBf16}) {
    SCOPED_TRACE(static_cast<int>(math));
    GpuPlanOptions options;
    options.math = math;
    Prepared one = Prepare(Model::Load(Example("recommender")), {{1, 64}});
    ASSERT_TRUE(one.plan);
    auto a = LowerPlan(one.model->graph(), *one.plan, options);
    dnnl::stream stream(CpuEngine());
    auto plan8 = Plan::Prepare(one.model->graph(), {{8, 64}}, CpuEngine(), stream,
                               one.model->weight_cache(), GpuLoweringPlanOptions(), PlanLimits());
    ASSERT_TRUE(plan8.ok());
    auto b = LowerPlan(one.model->graph(), **plan8, options);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->blobs.size(), b->blobs.size());
    for (size_t i = 0; i < a->blobs.size(); ++i) EXPECT_EQ(a->blobs[i].key, b->blobs[i].key);
  }
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

// The detection test models' GatherElements, scatters, CumSums and Trilus lower, and the
// tensor-ops model's four Einsums (rewritten as products, transposes and sums by the
// optimiser); what is left is their NonZero and run-time shapes.
TEST(LowerPlanTest, TheDetectionModelsLackNoneOfTheIndexingOperators) {
  for (const char* name : {"det_scatter_gather_op17", "det_tensor_ops_op17"}) {
    SCOPED_TRACE(name);
    WithReference r = PrepareWithReference(name, ".a.sht");
    ASSERT_TRUE(r.prepared.plan);
    auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan);
    ASSERT_FALSE(l.ok());
    const std::string& m = l.status().message();
    for (const char* op : {"(GatherElements)", "(ScatterElements)", "(ScatterND)", "(CumSum)",
                           "(Trilu)", "(Einsum)", "(MatMul)", "(ReduceSum)"})
      EXPECT_THAT(m, ::testing::Not(HasSubstr(op))) << m;
    EXPECT_THAT(m, HasSubstr("(NonZero)"));
  }
}

}  // namespace
}  // namespace shoal::engine::cuda
