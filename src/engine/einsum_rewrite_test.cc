#include "engine/einsum_rewrite.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;
using ::testing::ElementsAre;

// The optimised model's node types, in order ("Transpose", "shoal.FusedMatMul"...).
std::vector<std::string> NodeTypes(const Model& m) {
  std::vector<std::string> types;
  for (const Node& n : m.graph().nodes) types.push_back(n.qualified_type());
  return types;
}

struct Compared {
  std::vector<std::string> types;  // the optimised graph's nodes
  OptimizeReport report;
  float max_diff = -1;  // against the Einsum kernel (the graph unoptimised)
  float scale = 0;      // max |output|
};

// Builds `eq` over inputs of the given shapes (random values; the first may pass through
// a Relu first, leaving its type for the rewrite to trace), runs it optimised and as
// imported, and compares.
Compared RunBothWays(const std::string& eq, const std::vector<Shape>& shapes,
                     bool through_relu = false, bool constant_b = false) {
  GraphBuilder b;
  std::vector<int> in;
  std::vector<NamedTensor> feeds;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    Tensor t = Random(shapes[i], static_cast<uint32_t>(11 + i));
    if (i == 1 && constant_b) {
      in.push_back(b.Constant(name, t));
      continue;
    }
    in.push_back(b.Input(name, shapes[i]));
    feeds.push_back({name, t});
  }
  if (through_relu) in[0] = b.Op("Relu", "r", {in[0]});
  const int y = b.Op("Einsum", "y", in, {{"equation", AString(eq)}});
  const Graph g = b.Finish({y});
  Compared c;
  LoadOptions plain;
  plain.optimize.enabled = false;
  auto reference = Model::FromGraph(g, plain);
  auto optimised = Model::FromGraph(g);
  EXPECT_TRUE(reference.ok()) << reference.status().ToString();
  EXPECT_TRUE(optimised.ok()) << optimised.status().ToString();
  if (!reference.ok() || !optimised.ok()) return c;
  c.types = NodeTypes(**optimised);
  c.report = (*optimised)->optimize_report();
  auto sa = Session::Create(**reference, Opts(1));
  auto sb = Session::Create(**optimised, Opts(1));
  std::vector<NamedTensor> oa, ob;
  Status s = (*sa)->Run(feeds, &oa);
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = (*sb)->Run(feeds, &ob);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (oa.size() != 1 || ob.size() != 1) return c;
  EXPECT_EQ(oa[0].tensor.shape(), ob[0].tensor.shape()) << eq;
  EXPECT_EQ(ob[0].name, "y");
  c.max_diff = MaxAbsDiff(oa[0].tensor, ob[0].tensor);
  for (int64_t i = 0; i < oa[0].tensor.element_count(); ++i)
    c.scale = std::max(c.scale, std::fabs(oa[0].tensor.values<float>()[i]));
  return c;
}

int Rewritten(const Compared& c) {
  auto it = c.report.fusions.find("Einsum as MatMul");
  return it == c.report.fusions.end() ? 0 : it->second;
}

// Within 1e-5 of the output's scale: a product summed in another order.
void ExpectSameValues(const Compared& c, const std::string& eq) {
  EXPECT_GT(c.scale, 0.f) << eq;
  EXPECT_GE(c.max_diff, 0.f) << eq;
  EXPECT_LE(c.max_diff, 1e-5f * std::max(1.f, c.scale)) << eq;
}

TEST(EinsumRewriteTest, AttentionScoresBecomeOneProductReadingKTransposedThroughStrides) {
  const std::string eq = "bhqd,bhkd->bhqk";
  Compared c = RunBothWays(eq, {{2, 3, 5, 8}, {2, 3, 7, 8}});
  EXPECT_EQ(Rewritten(c), 1) << c.report.Summary();
  // The Transpose the rewrite put before B became the product's b_perm.
  EXPECT_THAT(c.types, ElementsAre("shoal.FusedMatMul")) << c.report.Summary();
  ExpectSameValues(c, eq);
}

TEST(EinsumRewriteTest, ProductsInEveryLayoutAnswerAsTheEinsumKernel) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij,jk->ik", {{4, 6}, {6, 5}}},                    // a plain product
      {"ij,jk", {{4, 6}, {6, 5}}},                        // the same, implicit output
      {"ik,jk->ij", {{4, 6}, {5, 6}}},                    // B transposed
      {"ki,kj->ij", {{6, 4}, {6, 5}}},                    // A transposed
      {"ij,jk->ki", {{4, 6}, {6, 5}}},                    // the output transposed
      {"bhqk,bhkd->bhqd", {{2, 3, 5, 7}, {2, 3, 7, 8}}},  // attention's weighted sum
      {"bqd,bkd->bkq", {{3, 5, 8}, {3, 7, 8}}},           // batch first, output permuted
      {"qbd,bkd->bqk", {{5, 3, 8}, {3, 7, 8}}},           // the batch label elsewhere in A
      {"bhqd,bkhd->bqhk", {{2, 3, 5, 8}, {2, 7, 3, 8}}},  // heads in the middle
      {"bsd,de->bse", {{2, 5, 8}, {8, 6}}},               // a weight applied to the last axis
      {"sbd,ed->bse", {{5, 2, 8}, {6, 8}}},               // ... transposed, with A permuted
      {"BQd,BKd->BQK", {{2, 5, 8}, {2, 7, 8}}},           // capital letters
  };
  for (const Case& k : cases) {
    Compared c = RunBothWays(k.eq, k.shapes);
    EXPECT_EQ(Rewritten(c), 1) << k.eq << ": " << c.report.Summary();
    for (const std::string& t : c.types) EXPECT_NE(t, "Einsum") << k.eq;
    ExpectSameValues(c, k.eq);
  }
}

TEST(EinsumRewriteTest, AConstantWeightIsTransposedOnceAtLoad) {
  const std::string eq = "bsd,ed->bse";
  Compared c = RunBothWays(eq, {{2, 5, 8}, {6, 8}}, /*through_relu=*/false, /*constant_b=*/true);
  EXPECT_EQ(Rewritten(c), 1) << c.report.Summary();
  // The weight's Transpose folded into a constant; the product alone is left.
  EXPECT_THAT(c.types, ElementsAre("MatMul")) << c.report.Summary();
  EXPECT_GE(c.report.folded_nodes, 1);
  ExpectSameValues(c, eq);
}

TEST(EinsumRewriteTest, AnOperandsTypeIsTracedThroughTheNodesThatKeepIt) {
  // The Relu's output has no type in the graph; its input is fp32.
  const std::string eq = "bqd,bkd->bqk";
  Compared c = RunBothWays(eq, {{3, 5, 8}, {3, 7, 8}}, /*through_relu=*/true);
  EXPECT_EQ(Rewritten(c), 1) << c.report.Summary();
  ExpectSameValues(c, eq);
}

TEST(EinsumRewriteTest, SumsDotAndOuterProductsAndOneOperandAreRewrittenToo) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"bij,bij->b", {{2, 3, 4}, {2, 3, 4}}},                // a dot product over two labels
      {"i,i->", {{6}, {6}}},                                 // ... to a scalar
      {"ij,j->i", {{4, 6}, {6}}},                            // no label of B's own
      {"j,jk->k", {{6}, {6, 5}}},                            // no label of A's own
      {"i,j->ij", {{4}, {5}}},                               // no contraction: an outer product
      {"bi,bj->bji", {{3, 4}, {3, 5}}},                      // ... batched, transposed
      {"ij,jk->i", {{4, 6}, {6, 5}}},                        // k summed in B alone
      {"ijx,jk->ik", {{4, 6, 3}, {6, 5}}},                   // x summed in A alone
      {"bqd,bkd->qk", {{3, 5, 8}, {3, 7, 8}}},               // the batch summed with d
      {"bhnd,hde->bne", {{2, 3, 5, 4}, {3, 4, 6}}},          // heads merged into a projection
      {"bnhd,bhde->bne", {{2, 5, 3, 4}, {2, 3, 4, 6}}},      // ... batched
      {"bij->bji", {{2, 3, 4}}},                             // one operand: a transpose
      {"ij->i", {{4, 6}}},                                   // ... a sum
      {"ijk->ki", {{4, 6, 3}}},                              // ... both
      {"...ij,jk->...ik", {{2, 4, 6}, {6, 5}}},              // an ellipsis of A's own
      {"...d,de->...e", {{2, 3, 4}, {4, 6}}},                // ... two dims of it
      {"...qd,...kd->...qk", {{2, 3, 5, 4}, {2, 3, 7, 4}}},  // ... in both: batch
      {"...qd,...kd", {{3, 5, 4}, {3, 7, 4}}},               // ... implicit: ellipsis first
      {"b...d,b...d->b...", {{2, 3, 4}, {2, 3, 4}}},         // ... in the middle, a dot product
      {"...ij->...ji", {{2, 3, 4, 5}}},                      // ... one operand
      {"...ij,...jk->...ik", {{2, 4, 6}, {1, 6, 5}}},        // ... a batch of 1 in B broadcast
      {"bhqd,bhkd->bhqk", {{2, 3, 5, 8}, {2, 1, 7, 8}}},     // one K head for all (broadcast)
      {"bij,bjk->bki", {{1, 4, 6}, {3, 6, 5}}},              // a batch of 1 in A, permuted out
      {"ba", {{4, 6}}},                                      // ... implicit: a transpose
  };
  for (const Case& k : cases) {
    Compared c = RunBothWays(k.eq, k.shapes);
    EXPECT_EQ(Rewritten(c), 1) << k.eq << ": " << c.report.Summary();
    for (const std::string& t : c.types) EXPECT_NE(t, "Einsum") << k.eq;
    ExpectSameValues(c, k.eq);
  }
}

// Before opset 13, ReduceSum takes its axes as an attribute.
TEST(EinsumRewriteTest, ASumTakesItsAxesAsTheOpsetDoes) {
  for (int64_t opset : {11, 13, 17}) {
    GraphBuilder b;
    const int x = b.Input("x", {4, 6, 3});
    const int w = b.Input("w", {6, 5});
    const int y = b.Op("Einsum", "y", {x, w}, {{"equation", AString("ijx,jk->ik")}});
    Graph g = b.Finish(y);
    g.opset = opset;
    ASSERT_EQ(RewriteEinsumsAsProducts(&g), 1);
    ASSERT_EQ(g.nodes[0].op_type, "ReduceSum");
    EXPECT_EQ(g.nodes[0].inputs.size(), opset >= 13 ? 2u : 1u) << opset;
    EXPECT_EQ(g.nodes[0].attr("axes") != nullptr, opset < 13) << opset;
    auto model = Model::FromGraph(g);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto session = Session::Create(**model, Opts(1));
    ASSERT_TRUE(session.ok());
    std::vector<NamedTensor> out;
    const Tensor xs = Random({4, 6, 3}, 1), ws = Random({6, 5}, 2);
    ASSERT_TRUE((*session)->Run({{"x", xs}, {"w", ws}}, &out).ok()) << opset;
    // y[i][k] = sum over j of (sum over x of X[i][j][x]) * W[j][k]
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 5; ++k) {
        double want = 0;
        for (int j = 0; j < 6; ++j) {
          double s = 0;
          for (int z = 0; z < 3; ++z) s += xs.values<float>()[(i * 6 + j) * 3 + z];
          want += s * ws.values<float>()[j * 5 + k];
        }
        EXPECT_NEAR(out[0].tensor.values<float>()[i * 5 + k], want, 1e-5) << opset;
      }
  }
}

TEST(EinsumRewriteTest, EquationsThatAreNoProductStayOnTheEinsumKernel) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij->ij", {{4, 6}}},                               // one operand, copied
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},         // three
      {"...ij,...jk->...ik", {{3, 2, 4, 6}, {2, 6, 5}}},  // ellipses of 2 and 1 dims
      {"iij,jk->ik", {{3, 3, 4}, {4, 2}}},                // a diagonal
      {"ij,jkl->ikl", {{4, 6}, {6, 2, 3}}},               // two labels of B's own
      {"bmpk,bkn->bmpn", {{2, 3, 4, 5}, {2, 5, 6}}},      // two of A's own beside a batch
      {"bqi,bki->bqk", {{3, 5, 8}, {3, 7, 1}}},           // the contraction label broadcast
  };
  for (const Case& k : cases) {
    Compared c = RunBothWays(k.eq, k.shapes);
    EXPECT_EQ(Rewritten(c), 0) << k.eq << ": " << c.report.Summary();
    EXPECT_NE(std::find(c.types.begin(), c.types.end(), "Einsum"), c.types.end()) << k.eq;
    EXPECT_EQ(c.max_diff, 0.f) << k.eq;  // the same kernel both ways
  }
}

TEST(EinsumRewriteTest, OperandsNotKnownToBeFp32StayOnTheEinsumKernel) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 6}, DataType::kInt64);
  const int w = b.Input("w", {6, 5}, DataType::kInt64);
  const int y = b.Op("Einsum", "y", {x, w}, {{"equation", AString("ij,jk->ik")}});
  // A Cast to int64 of an fp32 input: traced, and not fp32.
  const int f = b.Input("f", {4, 6});
  const int ci = b.Op("Cast", "ci", {f}, {{"to", AInt(7)}});
  const int z = b.Op("Einsum", "z", {ci, w}, {{"equation", AString("ij,jk->ik")}});
  // An operator whose output type the rewrite does not trace.
  const int u = b.Op("Unknown", "u", {f});
  const int v =
      b.Op("Einsum", "v", {u, b.Input("g", {6, 5})}, {{"equation", AString("ij,jk->ik")}});
  Graph g = b.Finish({y, z, v});
  // Their ranks are known: only the types stand in the way.
  g.values[ci].shape = KnownShape({4, 6});
  g.values[u].shape = KnownShape({4, 6});
  EXPECT_EQ(RewriteEinsumsAsProducts(&g), 0);
  int einsums = 0;
  for (const Node& n : g.nodes) einsums += n.op_type == "Einsum";
  EXPECT_EQ(einsums, 3);
}

TEST(EinsumRewriteTest, OperandsOfUnknownOrOtherRankStayOnTheEinsumKernel) {
  GraphBuilder b;
  const int x = b.Input("x", {4, 6});
  const int w = b.Input("w", {6, 5});
  const int r = b.Op("Relu", "r", {x});  // its shape unknown to the graph
  const int y = b.Op("Einsum", "y", {r, w}, {{"equation", AString("ij,jk->ik")}});
  const int z = b.Op("Einsum", "z", {x, w}, {{"equation", AString("ijl,jk->ik")}});
  Graph g = b.Finish({y, z});
  g.values[r].dtype = DataType::kFp32;
  EXPECT_EQ(RewriteEinsumsAsProducts(&g), 0);
  // Loaded, the probe plans stop at the mismatched term, and the kernel names it.
  auto model = Model::FromGraph(std::move(g));
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), ::testing::HasSubstr("does not match input rank"));
}

// A contraction label whose extent one operand does not give (a dim of no symbol) may be a
// 1 the kernel broadcasts: left on the kernel. With one symbol on both sides it is the same
// extent, and rewritten.
TEST(EinsumRewriteTest, AContractionLabelOfUnprovenExtentStaysOnTheKernel) {
  for (const char* symbol : {"", "d"}) {
    GraphBuilder b;
    const int x = b.Input("x", {4, 6});
    const int w = b.Input("w", {6, 5});
    const int y = b.Op("Einsum", "y", {x, w}, {{"equation", AString("ij,jk->ik")}});
    Graph g = b.Finish(y);
    (*g.values[x].shape)[1] = Dim{-1, symbol};
    (*g.values[w].shape)[0] = Dim{-1, symbol};
    EXPECT_EQ(RewriteEinsumsAsProducts(&g), std::string(symbol).empty() ? 0 : 1) << symbol;
  }
}

// A batch of 0 rows: the reshapes name their sizes (a -1 cannot be inferred beside a 0), and
// the output is empty, as the kernel's.
TEST(EinsumRewriteTest, AnEmptyBatchGivesAnEmptyOutput) {
  GraphBuilder b;
  const int x = b.Input("x", {0, 3, 4});
  const int w = b.Input("w", {0, 4});
  const int y = b.Op("Einsum", "y", {x, w}, {{"equation", AString("bnd,bd->bn")}});
  auto model = Model::FromGraph(b.Finish(y));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->optimize_report().fusions.count("Einsum as MatMul"), 1u);
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  const Status s = (*session)->Run({{"x", Random({0, 3, 4}, 1)}, {"w", Random({0, 4}, 2)}}, &out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out[0].tensor.shape(), (Shape{0, 3}));
}

// With constant folding off, a constant weight's Transpose stays a node; the product pass
// must not read the constant through strides (the strided product takes computed operands).
TEST(EinsumRewriteTest, AnUnfoldedWeightTransposeStaysANode) {
  GraphBuilder b;
  const int x = b.Input("x", {3, 5, 4});
  const int w = b.Constant("w", Random({3, 6, 4}, 9));
  const int y = b.Op("Einsum", "y", {x, w}, {{"equation", AString("hnd,hed->hne")}});
  const Graph g = b.Finish(y);
  LoadOptions no_folding;
  no_folding.optimize.fold_constants = false;
  LoadOptions plain;
  plain.optimize.enabled = false;
  auto rewritten = Model::FromGraph(g, no_folding);
  auto reference = Model::FromGraph(g, plain);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status().ToString();
  ASSERT_TRUE(reference.ok());
  auto sa = Session::Create(**rewritten, Opts(1));
  auto sb = Session::Create(**reference, Opts(1));
  ASSERT_TRUE(sa.ok() && sb.ok());
  std::vector<NamedTensor> oa, ob;
  const Tensor in = Random({3, 5, 4}, 10);
  const Status ran = (*sa)->Run({{"x", in}}, &oa);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ASSERT_TRUE((*sb)->Run({{"x", in}}, &ob).ok());
  EXPECT_LE(MaxAbsDiff(oa[0].tensor, ob[0].tensor), 1e-5f);
}

// Two Einsums with one node name: every new value still has a name of its own (the int8
// tier keys its calibration by value name).
TEST(EinsumRewriteTest, NewValuesHaveNamesOfTheirOwn) {
  GraphBuilder b;
  const int q = b.Input("q", {2, 5, 8});
  const int k = b.Input("k", {2, 7, 8});
  const int s1 = b.Op("Einsum", "s1", {q, k}, {{"equation", AString("bqd,bkd->bkq")}});
  const int s2 = b.Op("Einsum", "s2", {q, k}, {{"equation", AString("bqd,bkd->bkq")}});
  Graph g = b.Finish({s1, s2});
  for (Node& n : g.nodes) n.name = "same";
  ASSERT_EQ(RewriteEinsumsAsProducts(&g), 2);
  std::set<std::string> names;
  for (const Value& v : g.values) EXPECT_TRUE(names.insert(v.name).second) << v.name;
}

TEST(EinsumRewriteTest, TheRewrittenGraphKeepsProducersAndOrder) {
  GraphBuilder b;
  const int q = b.Input("q", {2, 5, 8});
  const int k = b.Input("k", {2, 7, 8});
  const int s = b.Op("Einsum", "s", {q, k}, {{"equation", AString("bqd,bkd->bkq")}});
  const int y = b.Op("Relu", "y", {s});
  Graph g = b.Finish({y});
  ASSERT_EQ(RewriteEinsumsAsProducts(&g), 1);
  ASSERT_TRUE(g.Validate().ok()) << g.Validate().ToString();
  std::vector<std::string> types;
  for (const Node& n : g.nodes) types.push_back(n.op_type);
  EXPECT_THAT(types, ElementsAre("Transpose", "MatMul", "Transpose", "Relu"));
  // The Einsum's output value and name are the last Transpose's, and it is named "s".
  EXPECT_EQ(g.values[s].producer, 2);
  EXPECT_EQ(g.nodes[2].name, "s");
  EXPECT_EQ(g.nodes[3].inputs[0], s);
  // The product's shape is [b, q, k], from the operands' shapes.
  const int product = g.nodes[1].outputs[0];
  ASSERT_TRUE(g.values[product].shape.has_value());
  EXPECT_EQ(SymbolicShapeToString(*g.values[product].shape), "[2,5,7]");
}

}  // namespace
}  // namespace shoal::engine
