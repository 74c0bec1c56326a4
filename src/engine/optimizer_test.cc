#include "engine/optimizer.h"

#include <gtest/gtest.h>

#include "engine/model.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;

using Builder = GraphBuilder;

// Runs `graph` optimised and as imported on the same inputs; returns the report and
// the largest output difference.
struct Compared {
  OptimizeReport report;
  float max_diff = -1;
};
Compared RunBothWays(const Graph& graph, const std::vector<NamedTensor>& inputs) {
  Compared c;
  LoadOptions plain;
  plain.optimize.enabled = false;
  auto a = Model::FromGraph(graph, plain);
  auto b = Model::FromGraph(graph);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!a.ok() || !b.ok()) return c;
  c.report = (*b)->optimize_report();
  auto sa = Session::Create(**a, Opts(1));
  auto sb = Session::Create(**b, Opts(1));
  std::vector<NamedTensor> oa, ob;
  EXPECT_TRUE((*sa)->Run(inputs, &oa).ok());
  Status s = (*sb)->Run(inputs, &ob);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok() || oa.size() != ob.size()) return c;
  c.max_diff = 0;
  for (size_t i = 0; i < oa.size(); ++i)
    c.max_diff = std::max(c.max_diff, MaxAbsDiff(oa[i].tensor, ob[i].tensor));
  return c;
}

int Fired(const OptimizeReport& r, const std::string& what) {
  auto it = r.fusions.find(what);
  return it == r.fusions.end() ? 0 : it->second;
}

TEST(OptimizerTest, BatchNormFoldsIntoTheConvolutionAndReluFuses) {
  Builder b;
  const int x = b.Input("x", {2, 3, 8, 8});
  const int w = b.Constant("w", Random({4, 3, 3, 3}, 1));
  const int bias = b.Constant("b", Random({4}, 2));
  const int conv = b.Op("Conv", "conv", {x, w, bias}, {{"pads", AInts({1, 1, 1, 1})}});
  const int bn = b.Op(
      "BatchNormalization", "bn",
      {conv, b.Constant("scale", Random({4}, 3, 0.5f, 2.f)), b.Constant("shift", Random({4}, 4)),
       b.Constant("mean", Random({4}, 5)), b.Constant("var", Random({4}, 6, 0.1f, 2.f))});
  const int y = b.Op("Relu", "y", {bn});
  Compared c = RunBothWays(b.Finish({y}), {{"x", Random({2, 3, 8, 8}, 7)}});
  EXPECT_EQ(Fired(c.report, "Conv+BatchNormalization"), 1) << c.report.Summary();
  EXPECT_EQ(Fired(c.report, "Conv+Relu"), 1) << c.report.Summary();
  EXPECT_EQ(c.report.nodes_before, 3);
  EXPECT_EQ(c.report.nodes_after, 1);
  EXPECT_GE(c.max_diff, 0.f);
  EXPECT_LT(c.max_diff, 1e-4f);
}

TEST(OptimizerTest, ResidualAddFusesOnlyWithAMatchingShape) {
  Builder b;
  const int x = b.Input("x", {1, 4, 6, 6});
  const int w = b.Constant("w", Random({4, 4, 1, 1}, 1));
  const int conv = b.Op("Conv", "conv", {x, w});
  const int sum = b.Op("Add", "sum", {conv, x});
  const int y = b.Op("Relu", "y", {sum});
  // A broadcast add (a [4,1,1] constant) stays separate.
  const int conv2 = b.Op("Conv", "conv2", {y, b.Constant("w2", Random({4, 4, 1, 1}, 2))});
  const int z = b.Op("Add", "z", {conv2, b.Constant("c", Random({4, 1, 1}, 3))});
  Compared c = RunBothWays(b.Finish({z}), {{"x", Random({1, 4, 6, 6}, 4)}});
  EXPECT_EQ(Fired(c.report, "Conv+Add+Relu"), 1) << c.report.Summary();
  EXPECT_EQ(c.report.nodes_after, 3) << c.report.Summary();
  EXPECT_LT(c.max_diff, 1e-4f);
}

TEST(OptimizerTest, AGraphOutputIsNeverFusedAway) {
  Builder b;
  const int x = b.Input("x", {1, 2, 4, 4});
  const int conv = b.Op("Conv", "conv", {x, b.Constant("w", Random({2, 2, 1, 1}, 1))});
  const int y = b.Op("Relu", "y", {conv});
  Compared c = RunBothWays(b.Finish({conv, y}), {{"x", Random({1, 2, 4, 4}, 2)}});
  EXPECT_TRUE(c.report.fusions.empty()) << c.report.Summary();
  EXPECT_EQ(c.report.nodes_after, 2);
  EXPECT_EQ(c.max_diff, 0.f);
}

TEST(OptimizerTest, ConstantsFoldAndDeadNodesGo) {
  Builder b;
  const int x = b.Input("x", {2, 3});
  const int k = b.Op(
      "Add", "k", {b.Constant("a", F32({3}, {1, 2, 3})), b.Constant("c", F32({3}, {10, 20, 30}))});
  const int y = b.Op("Mul", "y", {x, k});
  b.Op("Neg", "unused", {x});  // read by nothing
  // Shape of a value whose dimensions are all known folds to a constant.
  const int shape = b.Op("Shape", "shape", {x});
  const int r = b.Op("Reshape", "r", {y, shape});
  Compared c = RunBothWays(b.Finish({r}), {{"x", Random({2, 3}, 1)}});
  EXPECT_EQ(c.report.folded_nodes, 2) << c.report.Summary();
  EXPECT_EQ(c.report.removed_nodes, 1) << c.report.Summary();
  EXPECT_EQ(c.report.nodes_after, 2);
  EXPECT_EQ(c.max_diff, 0.f);
}

TEST(OptimizerTest, GeluAndLayerNormPatternsAreRecognised) {
  Builder b;
  const int x = b.Input("x", {2, 5, 8});
  auto scalar = [&](const std::string& n, float v) { return b.Constant(n, F32({}, {v})); };
  // GELU as PyTorch exports it.
  const int d = b.Op("Div", "d", {x, scalar("sqrt2", 1.4142135f)});
  const int e = b.Op("Erf", "e", {d});
  const int a = b.Op("Add", "a", {e, scalar("one", 1.f)});
  const int m = b.Op("Mul", "m", {x, a});
  const int g = b.Op("Mul", "g", {m, scalar("half", 0.5f)});
  // Layer normalisation written out.
  const int mean = b.Op("ReduceMean", "mean", {g}, {{"axes", AInts({-1})}});
  const int diff = b.Op("Sub", "diff", {g, mean});
  const int sq = b.Op("Pow", "sq", {diff, scalar("two", 2.f)});
  const int var = b.Op("ReduceMean", "var", {sq}, {{"axes", AInts({-1})}});
  const int ve = b.Op("Add", "ve", {var, scalar("eps", 1e-5f)});
  const int sd = b.Op("Sqrt", "sd", {ve});
  const int norm = b.Op("Div", "norm", {diff, sd});
  const int scaled = b.Op("Mul", "scaled", {norm, b.Constant("gamma", Random({8}, 1))});
  const int y = b.Op("Add", "y", {scaled, b.Constant("beta", Random({8}, 2))});
  Compared c = RunBothWays(b.Finish({y}), {{"x", Random({2, 5, 8}, 3, -3.f, 3.f)}});
  EXPECT_EQ(Fired(c.report, "Gelu(erf pattern)"), 1) << c.report.Summary();
  EXPECT_EQ(Fired(c.report, "LayerNormalization(pattern)"), 1) << c.report.Summary();
  EXPECT_EQ(c.report.nodes_after, 2) << c.report.Summary();
  EXPECT_LT(c.max_diff, 1e-4f);
}

// An FP16 export holds sqrt(2) rounded to FP16 (1.4140625); it is still GELU.
TEST(OptimizerTest, GeluPatternTakesSqrt2RoundedToFp16) {
  for (bool divide : {true, false}) {
    SCOPED_TRACE(divide ? "x / sqrt(2)" : "x * sqrt(0.5)");
    Builder b;
    const int x = b.Input("x", {2, 5, 8});
    auto scalar = [&](const std::string& n, float v) { return b.Constant(n, F32({}, {v})); };
    const int d = divide ? b.Op("Div", "d", {x, scalar("sqrt2", 1.4140625f)})
                         : b.Op("Mul", "d", {x, scalar("rsqrt2", 0.70703125f)});
    const int e = b.Op("Erf", "e", {d});
    const int a = b.Op("Add", "a", {e, scalar("one", 1.f)});
    const int m = b.Op("Mul", "m", {x, a});
    const int g = b.Op("Mul", "g", {m, scalar("half", 0.5f)});
    Compared c = RunBothWays(b.Finish({g}), {{"x", Random({2, 5, 8}, 3, -3.f, 3.f)}});
    EXPECT_EQ(Fired(c.report, "Gelu(erf pattern)"), 1) << c.report.Summary();
    EXPECT_LT(c.max_diff, 1e-3f);
  }
  // Further from sqrt(2) than FP16's rounding and Near's 1e-4: not GELU.
  Builder b;
  const int x = b.Input("x", {4});
  const int d = b.Op("Div", "d", {x, b.Constant("k", F32({}, {1.4136f}))});
  const int e = b.Op("Erf", "e", {d});
  const int a = b.Op("Add", "a", {e, b.Constant("one", F32({}, {1.f}))});
  const int m = b.Op("Mul", "m", {x, a});
  const int g = b.Op("Mul", "g", {m, b.Constant("half", F32({}, {0.5f}))});
  Compared c = RunBothWays(b.Finish({g}), {{"x", Random({4}, 4)}});
  EXPECT_EQ(Fired(c.report, "Gelu(erf pattern)"), 0) << c.report.Summary();
}

TEST(OptimizerTest, MatMulTakesScaleBiasActivationAndResidual) {
  Builder b;
  const int x = b.Input("x", {3, 4, 8});
  const int mm = b.Op("MatMul", "mm", {x, b.Constant("w", Random({8, 8}, 1))});
  const int s = b.Op("Div", "s", {mm, b.Constant("k", F32({}, {2.f}))});
  const int bias = b.Op("Add", "bias", {s, b.Constant("b", Random({8}, 2))});
  const int act = b.Op("Relu", "act", {bias});
  const int y = b.Op("Add", "y", {act, x});
  Compared c = RunBothWays(b.Finish({y}), {{"x", Random({3, 4, 8}, 3)}});
  EXPECT_EQ(Fired(c.report, "MatMul+Scale+Add(bias)+Relu+Add"), 1) << c.report.Summary();
  EXPECT_EQ(c.report.nodes_after, 1);
  EXPECT_LT(c.max_diff, 1e-5f);
}

// Attention as exported: Q, K and V split into heads by Reshape + Transpose, the heads
// merged back by Transpose + Reshape. The four Transposes become strides of the two
// products; one whose value another node also reads stays. The mask, [batch, 1, 1, keys],
// is added by the scores' product as a broadcast post-op.
TEST(OptimizerTest, TransposesAroundAttentionProductsBecomeStrides) {
  for (const bool k_shared : {false, true}) {
    Builder b;
    const int x = b.Input("x", {2, 5, 12});
    const int mask = b.Input("mask", {2, 1, 1, 5});
    const int heads = b.Constant("heads", I64({4}, {2, 5, 3, 4}));
    auto split = [&](const std::string& name, std::vector<int64_t> perm) {
      const int r = b.Op("Reshape", name + "_r", {x, heads});
      return b.Op("Transpose", name, {r}, {{"perm", AInts(std::move(perm))}});
    };
    const int q = split("q", {0, 2, 1, 3}), k = split("k", {0, 2, 3, 1});
    const int v = split("v", {0, 2, 1, 3});
    const int scores = b.Op("MatMul", "scores", {q, k});
    const int scaled = b.Op("Mul", "scaled", {scores, b.Constant("s", F32({}, {0.5f}))});
    const int masked = b.Op("Add", "masked", {scaled, mask});
    const int att = b.Op("Softmax", "att", {masked}, {{"axis", AInt(-1)}});
    const int ctx = b.Op("MatMul", "ctx", {att, v});
    const int merged = b.Op("Transpose", "merged", {ctx}, {{"perm", AInts({0, 2, 1, 3})}});
    const int y = b.Op("Reshape", "y", {merged, b.Constant("flat", I64({3}, {2, 5, 12}))});
    std::vector<int> outputs = {y};
    if (k_shared) outputs.push_back(b.Op("Neg", "k_neg", {k}));
    Compared c = RunBothWays(b.Finish(outputs),
                             {{"x", Random({2, 5, 12}, 5)}, {"mask", Random({2, 1, 1, 5}, 6)}});
    EXPECT_EQ(Fired(c.report, "attention scores (MatMul+Scale+Add(broadcast))"), 1)
        << c.report.Summary();
    EXPECT_EQ(
        Fired(c.report, k_shared ? "Transpose into MatMul (A)" : "Transpose into MatMul (A, B)"), 1)
        << c.report.Summary();
    EXPECT_EQ(Fired(c.report, "Transpose into MatMul (B, output)"), 1) << c.report.Summary();
    EXPECT_GE(c.max_diff, 0.f);
    EXPECT_LT(c.max_diff, 1e-5f);
  }
}

// Real exports: fusions fire and outputs match the unoptimised graph.
TEST(OptimizerTest, ExportedModelsKeepTheirOutputs) {
  struct Case {
    std::string model;
    std::string fusion;
  };
  for (const Case& k : std::vector<Case>{{"resnet_op17", "Conv+Add+Relu"},
                                         {"mobilenet_v3_op17", "Conv+HardSwish"},
                                         {"bert_decomposed_op17", "LayerNormalization(pattern)"},
                                         {"bert_layernorm_op17", "MatMul+Add(bias)+Gelu"},
                                         {"bert_layernorm_op13", "Transpose into MatMul (A, B)"}}) {
    auto graph = ImportOnnxFile(ModelPath(k.model + ".onnx"));
    ASSERT_TRUE(graph.ok()) << k.model;
    std::vector<NamedTensor> inputs;
    for (int v : graph->inputs) {
      const Value& in = graph->values[v];
      Shape s;
      for (size_t i = 0; i < in.shape->size(); ++i)
        s.push_back((*in.shape)[i].known() ? (*in.shape)[i].value : (i == 0 ? 2 : 6));
      if (in.dtype == DataType::kFp32) {
        inputs.push_back({in.name, Random(s, 1)});
      } else {
        Tensor t = Tensor::Allocate(in.dtype, s);
        for (auto& e : t.mutable_values<int64_t>()) e = 1;
        inputs.push_back({in.name, t});
      }
    }
    Compared c = RunBothWays(*graph, inputs);
    EXPECT_GE(Fired(c.report, k.fusion), 1) << k.model << ": " << c.report.Summary();
    EXPECT_LT(c.report.nodes_after, c.report.nodes_before) << k.model;
    EXPECT_GE(c.max_diff, 0.f) << k.model;
    EXPECT_LT(c.max_diff, 1e-4f) << k.model;
  }
}

}  // namespace
}  // namespace shoal::engine
