#include "engine/cuda/gpu_plan_test_util.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/gpu_lowering.h"
#include "engine/precision.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {

using engine::testing::AFloat;
using engine::testing::AInt;
using engine::testing::AInts;
using engine::testing::AString;
using engine::testing::F32;
using engine::testing::GraphBuilder;
using engine::testing::I64;
using engine::testing::Random;

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

void ExpectAligned(const GpuLowering& l) {
  for (size_t v = 0; v < l.values.size(); ++v) {
    if (l.values[v].home != GpuValue::Home::kArena) continue;  // a weight's offset is its blob
    EXPECT_EQ(l.values[v].offset % static_cast<int64_t>(kGemmAlignmentBytes), 0) << "value " << v;
  }
}

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

Graph EinsumAttentionGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 5, 8});
  const int k = b.Op("Mul", "k", {x, b.Constant("k_scale", Random({8}, 61))});
  const int v = b.Op("Add", "v", {x, b.Constant("v_shift", Random({8}, 62))});
  const int scores = b.Op("Einsum", "scores", {x, k}, {{"equation", AString("bhqd,bhkd->bhqk")}});
  const int weights = b.Op("Softmax", "weights", {scores}, {{"axis", AInt(-1)}});
  const int out = b.Op("Einsum", "out", {weights, v}, {{"equation", AString("bhqk,bhkd->bhqd")}});
  return b.Finish(out);
}

Graph MoreOperatorsGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 4, 5});
  const int soft = b.Op("Softplus", "soft", {x});
  const int inv = b.Op("Reciprocal", "inv", {soft});
  const int elu = b.Op("Elu", "elu", {x}, {{"alpha", AFloat(0.5f)}});
  const int prelu =
      b.Op("PRelu", "prelu", {elu, b.Constant("slope", F32({3, 1, 1}, {0.1f, -0.5f, 2.f}))});
  const int sum = b.Op("Add", "sum", {inv, prelu});
  const int logp = b.Op("LogSoftmax", "logp", {sum}, {{"axis", AInt(-1)}});
  const int l2 = b.Op("ReduceL2", "l2", {logp}, {{"axes", AInts({3})}, {"keepdims", AInt(0)}});
  const int sq = b.Op("ReduceSumSquare", "sq", {sum}, {{"axes", AInts({1, 2})}});
  const int lo = b.Op("ReduceMin", "lo", {sum}, {{"axes", AInts({0})}, {"keepdims", AInt(0)}});
  const int prod = b.Op("ReduceProd", "prod", {inv}, {{"axes", AInts({3})}, {"keepdims", AInt(0)}});
  const int tiled = b.Op("Tile", "tiled", {x, b.Constant("reps", I64({4}, {1, 2, 1, 3}))});
  const int cast = b.Op("Cast", "cast", {x}, {{"to", AInt(7)}});
  const int ids = b.Op("Tile", "ids", {cast, b.Constant("reps2", I64({4}, {2, 1, 1, 1}))});
  const int pos = b.Op("Greater", "pos", {x, b.Constant("zero", F32({}, {0.f}))});
  const int low =
      b.Op("Less", "low", {x, b.Constant("half", F32({5}, {0.5f, 0.f, -0.5f, 1.f, 2.f}))});
  const int both = b.Op("And", "both", {pos, low});
  const int either = b.Op("Or", "either", {pos, low});
  const int one = b.Op("Xor", "one", {pos, low});
  const int neg = b.Op("Not", "not", {pos});
  const int picked =
      b.Op("GatherND", "picked", {x, b.Constant("tuples", I64({2, 2}, {0, 2, 1, -1}))});
  const int rowpick = b.Op("GatherND", "rowpick", {x, b.Constant("rows", I64({2, 1}, {2, 0}))},
                           {{"batch_dims", AInt(1)}});
  const int edge =
      b.Op("Pad", "edge", {x, b.Constant("pads_e", I64({8}, {0, 1, 2, 0, 0, 0, 1, 3}))},
           {{"mode", AString("edge")}});
  // Opset 18's axes: pads for axes 3, 1 and 2 only.
  const int mirror = b.Op("Pad", "mirror",
                          {x, b.Constant("pads_r", I64({6}, {1, 0, 3, 4, 2, 0})), -1,
                           b.Constant("pad_axes", I64({3}, {-1, 1, 2}))},
                          {{"mode", AString("reflect")}});
  const int i32 = b.Op("Cast", "i32", {ids}, {{"to", AInt(6)}});
  const int back = b.Op("Cast", "back", {i32}, {{"to", AInt(7)}});
  const int flag = b.Op("Cast", "flag", {pos}, {{"to", AInt(7)}});
  const int nz = b.Op("Cast", "nz", {x}, {{"to", AInt(9)}});
  const int nb = b.Op("Cast", "nb", {ids}, {{"to", AInt(9)}});
  const int top3 =
      b.Op("Max", "top3", {x, inv, b.Constant("floor", F32({5}, {0.f, 0.5f, 1.f, -1.f, 2.f}))});
  const int low2 = b.Op("TopK", "low2", {x, b.Constant("k", I64({1}, {2}))},
                        {{"axis", AInt(1)}, {"largest", AInt(0)}});
  std::vector<int> outputs = {logp, l2, sq, lo, prod, tiled, ids, both, either, one, neg, picked};
  for (int v : {rowpick, edge, mirror, back, flag, nz, nb, top3, low2}) outputs.push_back(v);
  Graph g = b.Finish(outputs);
  const int low2_at = g.AddValue("low2_at");  // TopK's indices, its second output
  g.values[low2_at].producer = static_cast<int>(g.nodes.size()) - 1;
  g.nodes.back().outputs.push_back(low2_at);
  g.outputs.push_back(low2_at);
  return g;
}

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

namespace {

// A 3x3 convolution of `in` (c channels) to m, padded by 1, with a bias: its weight
// Random({m, c, 3, 3}, seed) and bias Random({m}, seed + 1).
int Conv3x3(GraphBuilder& b, const std::string& name, int in, int64_t c, int64_t m, uint64_t seed) {
  const int w = b.Constant(name + ".w", Random({m, c, 3, 3}, seed));
  const int bias = b.Constant(name + ".b", Random({m}, seed + 1));
  return b.Op("Conv", name, {in, w, bias},
              {{"pads", AInts({1, 1, 1, 1})}, {"kernel_shape", AInts({3, 3})}});
}

}  // namespace

Graph IdentityBlockGraph(bool y_also_read, int64_t channels) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 8, 8});
  const int y = b.Op("Relu", "stem.relu", {Conv3x3(b, "stem", x, 3, channels, 31)});
  const int a = b.Op("Relu", "a.relu", {Conv3x3(b, "a", y, channels, channels, 33)});
  const int sum = b.Op("Add", "add", {Conv3x3(b, "b", a, channels, channels, 35), y});
  const int out = b.Op("Relu", "out", {sum});
  if (!y_also_read) return b.Finish(out);
  return b.Finish(std::vector<int>{out, b.Op("Sigmoid", "sig", {y})});
}

Graph Int8ConvChainGraph() {
  GraphBuilder b;
  const int r = b.Op("Relu", "r", {b.Input("x", {2, 8, 8, 8})});
  const int a = b.Op("Relu", "a.relu", {Conv3x3(b, "a", r, 8, 8, 37)});
  const int sum = b.Op("Add", "add", {Conv3x3(b, "b", a, 8, 8, 39), r});
  return b.Finish(b.Op("Relu", "out", {sum}));
}

Graph PoolBetweenConvsGraph(const std::string& variant) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3, 8, 8});
  const int y = b.Op("Relu", "y", {Conv3x3(b, "a", x, 3, 4, 41)});
  const int pooled = b.Op(
      variant == "average" ? "AveragePool" : "MaxPool", "pool", {y},
      {{"kernel_shape", AInts({3, 3})}, {"strides", AInts({2, 2})}, {"pads", AInts({1, 1, 1, 1})}});
  const int out = Conv3x3(b, "b", pooled, 4, 4, 43);
  if (variant == "pooled_output") return b.Finish(std::vector<int>{out, pooled});
  if (variant == "y_output") return b.Finish(std::vector<int>{out, y});
  if (variant == "product")
    return b.Finish(
        std::vector<int>{out, b.Op("MatMul", "xw", {x, b.Constant("w", Random({8, 5}, 45))})});
  return b.Finish(out);
}

Graph ReshapeBetweenConvsGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {1, 4, 8, 8});
  const int y = b.Op("Relu", "y", {Conv3x3(b, "a", x, 4, 16, 47)});
  const int shape = b.Constant("shape", I64({4}, {1, 4, 16, 16}));
  const int viewed = b.Op("Reshape", "viewed", {y, shape});
  return b.Finish(Conv3x3(b, "b", viewed, 4, 4, 49));
}

Graph ActivationThenProductGraph(const std::string& variant, const std::string& op) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 8});
  const int act = op == "Add" ? b.Op("Add", "act", {x, b.Constant("shift", Random({8}, 86))})
                              : b.Op(op, "act", {x});
  int operand = act;
  if (variant == "view") {  // [4, 8] read as [2, 16], by a [16, 4] weight
    const int shape = b.Constant("shape", I64({2}, {2, 16}));
    operand = b.Op("Reshape", "rows", {act, shape});
  }
  const int64_t k = variant == "view" ? 16 : 8;
  const int out = b.Op("MatMul", "out", {operand, b.Constant("w", Random({k, 4}, 85))});
  return variant == "output" ? b.Finish(std::vector<int>{out, act}) : b.Finish(out);
}

Graph ChainGraph() {
  GraphBuilder b;
  int v = b.Input("x", {64, 64});
  const char* ops[] = {"Relu", "Tanh", "Sigmoid", "Exp", "Neg", "Abs"};
  for (int i = 0; i < 6; ++i) v = b.Op(ops[i], "y" + std::to_string(i), {v});
  return b.Finish(v);
}

WithReference PrepareWithReference(const std::string& name, const std::string& suffix) {
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

Graph Int64CopiesGraph(DataType dtype) {
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

Graph ExpandGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {3, 1});
  const int ids = b.Input("ids", {1, 4}, DataType::kInt64);
  const int shape = b.Constant("shape", I64({3}, {2, 3, 4}));
  const int ex = b.Op("Expand", "ex", {x, shape});
  const int ei = b.Op("Expand", "ei", {ids, shape});
  return b.Finish(std::vector<int>{ex, ei});
}

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

Graph TwoProductsOfOneInputGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {32, 8});
  const int w1 = b.Constant("w1", Random({8, 24}, 71));
  const int b1 = b.Constant("b1", Random({24}, 72));
  const int w2 = b.Constant("w2", Random({16, 8}, 73));
  const int y1 = b.Op("Relu", "y1", {b.Op("Add", "xw1b", {b.Op("MatMul", "xw1", {x, w1}), b1})});
  const int y2 = b.Op("Gemm", "y2", {x, w2}, {{"transB", AInt(1)}});
  return b.Finish(std::vector<int>{y1, y2});
}

std::shared_ptr<const Calibration> RandomInputRanges(const Model& model, const std::string& name,
                                                     const Shape& shape, float lo, float hi) {
  std::vector<std::vector<NamedTensor>> batches;
  for (uint32_t seed = 901; seed <= 904; ++seed)
    batches.push_back({{name, Random(shape, seed, lo, hi)}});
  auto ranges = Calibrate(model, batches);
  EXPECT_TRUE(ranges.ok()) << ranges.status().ToString();
  return std::make_shared<const Calibration>(ranges.ok() ? *ranges : Calibration{});
}

}  // namespace shoal::engine::cuda
