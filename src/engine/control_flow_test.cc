// If and Loop: PyTorch's exports of scripted control flow and hand-built graphs
// (models/generate_control_flow.py) against their references, with and without the
// graph optimiser; how the importer makes outer-scope reads explicit; and load errors.
#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <fstream>
#include <iterator>
#include <limits>
#include <memory>

#include "engine/onnx_importer.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::HasSubstr;
using namespace shoal::engine::testing;

struct Case {
  std::string model;
  std::vector<std::string> refs;  // reference suffixes, run in this order by one session
};

class ControlFlowModelTest : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

// Each session runs its references in turn and then the first again, so a plan (and its
// subgraphs' plans) is reused across inputs that take other branches and trip counts.
TEST_P(ControlFlowModelTest, MatchesReference) {
  const auto& [c, optimize] = GetParam();
  LoadOptions load;
  load.optimize.enabled = optimize;
  auto model = Model::Load(ModelPath(c.model + ".onnx"), load);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<std::string> order = c.refs;
  order.push_back(c.refs.front());
  for (const std::string& r : order) {
    SCOPED_TRACE(c.model + "." + r);
    ExpectMatchesReference(**session, LoadReference(c.model + "." + r + ".sht"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ControlFlowModelTest,
    ::testing::Combine(::testing::Values(Case{"cf_script_op13", {"a", "b"}},
                                         Case{"cf_script_op17", {"a", "b"}},
                                         Case{"cf_detect_op13", {"a", "b"}},
                                         Case{"cf_detect_op17", {"a", "b"}},
                                         Case{"cf_graph_loop_scan", {"m4", "m0"}},
                                         Case{"cf_graph_while", {"long", "never"}},
                                         Case{"cf_graph_if", {"then", "else"}},
                                         Case{"cf_graph_nested", {"then", "else"}}),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::get<0>(info.param).model + (std::get<1>(info.param) ? "_optimized" : "_plain");
    });

// A Loop body that reads outer values by name takes them as explicit inputs, and an If
// inside it passes a value two scopes out through the body; outer constants are copied in.
TEST(ControlFlowImportTest, OuterValuesBecomeInputs) {
  auto graph = ImportOnnxFile(ModelPath("cf_graph_loop_scan.onnx"));
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  ASSERT_EQ(graph->nodes.size(), 1u);
  const Node& loop = graph->nodes[0];
  ASSERT_EQ(loop.op_type, "Loop");
  const int x = graph->FindValue("x"), w = graph->FindValue("w");
  // M, no condition, x carried, then the body's reads: w (Add) and x (the If).
  EXPECT_EQ(loop.inputs, (std::vector<int>{graph->FindValue("M"), -1, x, w, x}));
  const Attribute* body_attr = loop.attr("body");
  ASSERT_NE(body_attr, nullptr);
  ASSERT_EQ(body_attr->kind, Attribute::Kind::kGraph);
  const Graph& body = *body_attr->g;
  EXPECT_EQ(body.captures, 2);
  ASSERT_EQ(body.inputs.size(), 5u);  // i, cond, acc, w, x
  EXPECT_EQ(body.values[body.inputs[3]].name, "w");
  EXPECT_EQ(body.values[body.inputs[4]].name, "x");
  // "two" is an outer initialiser: a constant of the body, no input.
  const int two = body.FindValue("two");
  ASSERT_GE(two, 0);
  EXPECT_TRUE(body.values[two].is_constant());
  const Node* if_node = nullptr;
  for (const Node& n : body.nodes)
    if (n.op_type == "If") if_node = &n;
  ASSERT_NE(if_node, nullptr);
  ASSERT_EQ(if_node->inputs.size(), 3u);  // condition, y (body value), x (from the body input)
  EXPECT_EQ(if_node->inputs[2], body.inputs[4]);
  EXPECT_EQ(body.values[if_node->inputs[1]].name, "y");
  // Both branches list both values; each reads one of them... and x.
  EXPECT_EQ(if_node->attr("then_branch")->g->captures, 2);
  EXPECT_EQ(if_node->attr("else_branch")->g->captures, 2);
}

// A name no scope defines is an import error naming the Loop, its body and the node.
TEST(ControlFlowImportTest, UnknownNameInABodyNamesTheLoop) {
  std::ifstream in(ModelPath("cf_graph_loop_scan.onnx"), std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(bytes));
  onnx::NodeProto* loop = m.mutable_graph()->mutable_node(0);
  loop->set_name("the_loop");
  onnx::GraphProto* body = loop->mutable_attribute(0)->mutable_g();
  ASSERT_EQ(body->node(0).op_type(), "Add");
  body->mutable_node(0)->set_input(1, "nowhere");
  auto graph = ImportOnnxBytes(m.SerializeAsString(), "");
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(graph.status().message(), HasSubstr("node 'the_loop' (Loop): subgraph 'body'"));
  EXPECT_THAT(graph.status().message(), HasSubstr("input 'nowhere' is not produced"));
}

// The rest of a graph with control flow keeps the memory planner: values before the
// Loop live in the arena, and the Loop's data-dependent outputs do not.
TEST(ControlFlowPlanTest, ArenaForTheRestOfTheGraph) {
  auto model = Model::Load(ModelPath("cf_detect_op17.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  auto plan = Plan::Prepare((*model)->graph(), {{12, 4}, {12, 3}}, engine, stream,
                            (*model)->weight_cache(), PlanOptions(), PlanLimits());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_GT((*plan)->arena_bytes(), 0);
  const Graph& g = (*model)->graph();
  const int dets = g.outputs[0];
  EXPECT_TRUE((*plan)->dynamic()[dets]);
  for (const PlanLayoutEntry& e : (*plan)->DebugLayout()) EXPECT_FALSE((*plan)->dynamic()[e.value]);
}

// A Loop body is prepared with its node's plan and then only run: later runs of the
// same input shapes, whatever their trip counts, prepare nothing.
TEST(ControlFlowPlanTest, BodyIsPlannedOnceNotPerIterationOrRun) {
  auto model = Model::Load(ModelPath("cf_graph_loop_scan.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  const Reference m4 = LoadReference("cf_graph_loop_scan.m4.sht");
  const Reference m0 = LoadReference("cf_graph_loop_scan.m0.sht");
  ExpectMatchesReference(**session, m4);  // prepares the session's plan, and the body's within it
  const int64_t prepared = Plan::PreparedCount();
  ExpectMatchesReference(**session, m4);
  ExpectMatchesReference(**session, m0);
  ExpectMatchesReference(**session, m4);
  EXPECT_EQ(Plan::PreparedCount(), prepared);
}

// ---- Graphs built by hand ----

// A branch that reads outer value `x` (its one capture) through `op` with `other`.
std::shared_ptr<Graph> CapturingBranch(const std::string& op, Tensor other) {
  GraphBuilder b;
  const int x = b.Input("x", {2});
  const int c = b.Constant("other", std::move(other));
  const int out = b.Op(op, "branch_out", {x, c});
  Graph g = b.Finish(out);
  g.captures = 1;
  return std::make_shared<Graph>(std::move(g));
}

// A branch that cannot be prepared for the plan's shapes (a [2] + [3] Add) fails only
// the runs that take it, naming the If, the branch and the node.
TEST(ControlFlowRunTest, UnpreparableBranchFailsOnlyWhenTaken) {
  GraphBuilder b;
  const int cond = b.Input("cond", {}, DataType::kBool);
  const int x = b.Input("x", {2});
  Attribute then_branch, else_branch;
  then_branch.kind = else_branch.kind = Attribute::Kind::kGraph;
  then_branch.g = CapturingBranch("Add", F32({3}, {1, 2, 3}));
  else_branch.g = CapturingBranch("Mul", F32({1}, {10}));
  const int out =
      b.Op("If", "choose", {cond, x}, {{"then_branch", then_branch}, {"else_branch", else_branch}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> outputs;
  Status s = (*session)->Run({{"cond", Bool({}, {0})}, {"x", F32({2}, {1.5f, -2.f})}}, &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Values(outputs[0].tensor), (std::vector<float>{15.f, -20.f}));
  s = (*session)->Run({{"cond", Bool({}, {1})}, {"x", F32({2}, {1.5f, -2.f})}}, &outputs);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("node 'choose' (If): subgraph 'then_branch'"));
  EXPECT_THAT(s.message(), HasSubstr("node 'branch_out' (Add)"));
}

std::shared_ptr<Graph> Branch(const std::string& op, int outputs = 1) {
  GraphBuilder b;
  const int c = b.Constant("c_" + op, F32({1}, {1.f}));
  std::vector<int> outs;
  for (int i = 0; i < outputs; ++i) outs.push_back(b.Op(op, "o_" + op + std::to_string(i), {c}));
  return std::make_shared<Graph>(b.Finish(outs));
}

Attribute AGraph(std::shared_ptr<Graph> g) {
  Attribute a;
  a.kind = Attribute::Kind::kGraph;
  a.g = std::move(g);
  return a;
}

TEST(ControlFlowLoadTest, UnsupportedOperatorInABranchNamesBothNodes) {
  GraphBuilder b;
  const int cond = b.Input("cond", {}, DataType::kBool);
  const int out =
      b.Op("If", "choose", {cond},
           {{"then_branch", AGraph(Branch("Relu"))}, {"else_branch", AGraph(Branch("FancyOp"))}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("node 'choose' (If)"));
  EXPECT_THAT(model.status().message(), HasSubstr("else_branch"));
  EXPECT_THAT(model.status().message(), HasSubstr("operator 'FancyOp' is not supported"));
}

TEST(ControlFlowLoadTest, BranchOutputCountsMustMatchTheNode) {
  GraphBuilder b;
  const int cond = b.Input("cond", {}, DataType::kBool);
  const int out = b.Op(
      "If", "choose", {cond},
      {{"then_branch", AGraph(Branch("Relu", 2))}, {"else_branch", AGraph(Branch("Relu", 1))}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("node 'choose' (If): a branch has 2 outputs"));
}

TEST(ControlFlowLoadTest, MissingBranchIsAnError) {
  GraphBuilder b;
  const int cond = b.Input("cond", {}, DataType::kBool);
  const int out = b.Op("If", "choose", {cond}, {{"then_branch", AGraph(Branch("Relu"))}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("needs then_branch and else_branch"));
}

// body(i, cond, v) -> (cond, v + 1)
std::shared_ptr<Graph> CounterBody() {
  GraphBuilder b;
  b.Input("i", {}, DataType::kInt64);
  const int cond = b.Input("cond_in", {}, DataType::kBool);
  const int v = b.Input("v_in", {1});
  const int one = b.Constant("one", F32({1}, {1.f}));
  const int c = b.Op("Identity", "cond_out", {cond});
  const int next = b.Op("Add", "v_out", {v, one});
  return std::make_shared<Graph>(b.Finish({c, next}));
}

TEST(ControlFlowLoadTest, LoopWithoutTripCountOrConditionNeverEnds) {
  GraphBuilder b;
  const int v = b.Input("v", {1});
  const int out = b.Op("Loop", "forever", {-1, -1, v}, {{"body", AGraph(CounterBody())}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("node 'forever' (Loop): has neither"));
}

TEST(ControlFlowLoadTest, LoopBodyInputsMustMatchCarriedValues) {
  GraphBuilder b;
  const int m = b.Input("m", {}, DataType::kInt64);
  const int v = b.Input("v", {1});
  const int out = b.Op("Loop", "loop", {m, -1, v, v}, {{"body", AGraph(CounterBody())}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("node 'loop' (Loop): the body takes 3 inputs"));
}

// The hand-built counter runs: M = 5 iterations of v + 1.
TEST(ControlFlowRunTest, CounterLoopOnAHandBuiltGraph) {
  GraphBuilder b;
  const int m = b.Input("m", {}, DataType::kInt64);
  const int v = b.Input("v", {1});
  const int out = b.Op("Loop", "loop", {m, -1, v}, {{"body", AGraph(CounterBody())}});
  auto model = Model::FromGraph(b.Finish(out), LoadOptions());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  for (int64_t trips : {5, 0, 2}) {
    std::vector<NamedTensor> outputs;
    Status s = (*session)->Run({{"m", I64({}, {trips})}, {"v", F32({1}, {0.5f})}}, &outputs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(Values(outputs[0].tensor), std::vector<float>{0.5f + static_cast<float>(trips)});
  }
}

// ---- Limits and folding ----

// A Loop with a constant trip count of 1e12, no condition and scan output i (a hostile
// model): once hung the load (folded or probed at plan time) and grew memory.
constexpr const char* kHugeLoop = R"pb(
  ir_version: 8
  opset_import { domain: "" version: 17 }
  graph {
    name: "g"
    initializer {
      name: "M"
      data_type: 7
      dims: []
      int64_data: 1000000000000
    }
    input {
      name: "x"
      type {
        tensor_type {
          elem_type: 1
          shape { dim { dim_value: 1 } }
        }
      }
    }
    node {
      op_type: "Loop"
      input: "M"
      input: ""
      output: "scan"
      name: "loop"
      attribute {
        name: "body"
        type: GRAPH
        g {
          name: "body"
          input {
            name: "i"
            type {
              tensor_type {
                elem_type: 7
                shape {}
              }
            }
          }
          input {
            name: "c"
            type {
              tensor_type {
                elem_type: 9
                shape {}
              }
            }
          }
          node { op_type: "Identity" input: "c" output: "c_out" }
          node { op_type: "Identity" input: "i" output: "i_out" }
          output {
            name: "c_out"
            type {
              tensor_type {
                elem_type: 9
                shape {}
              }
            }
          }
          output {
            name: "i_out"
            type {
              tensor_type {
                elem_type: 7
                shape {}
              }
            }
          }
        }
      }
    }
    node { op_type: "Identity" input: "x" output: "y" }
    output {
      name: "scan"
      type {
        tensor_type {
          elem_type: 7
          shape { dim { dim_param: "n" } }
        }
      }
    }
    output {
      name: "y"
      type {
        tensor_type {
          elem_type: 1
          shape { dim { dim_value: 1 } }
        }
      }
    }
  })pb";

// A constant Loop (M = 3) carrying an empty float, with scan output i = 0, 1, 2: folding
// used to skip the run (first output empty) and fold the scan as a scalar 0.
constexpr const char* kEmptyFirstOutputLoop = R"pb(
  ir_version: 8
  opset_import { domain: "" version: 17 }
  graph {
    name: "g"
    initializer {
      name: "M"
      data_type: 7
      dims: []
      int64_data: 3
    }
    initializer {
      name: "e"
      data_type: 1
      dims: [ 0 ]
    }
    input {
      name: "x"
      type {
        tensor_type {
          elem_type: 1
          shape { dim { dim_value: 1 } }
        }
      }
    }
    node {
      op_type: "Loop"
      input: "M"
      input: ""
      input: "e"
      output: "e_out"
      output: "scan"
      name: "loop"
      attribute {
        name: "body"
        type: GRAPH
        g {
          name: "body"
          input {
            name: "i"
            type {
              tensor_type {
                elem_type: 7
                shape {}
              }
            }
          }
          input {
            name: "c"
            type {
              tensor_type {
                elem_type: 9
                shape {}
              }
            }
          }
          input {
            name: "ein"
            type {
              tensor_type {
                elem_type: 1
                shape { dim { dim_value: 0 } }
              }
            }
          }
          node { op_type: "Identity" input: "c" output: "c_out" }
          node { op_type: "Identity" input: "ein" output: "eo" }
          node { op_type: "Identity" input: "i" output: "i_out" }
          output {
            name: "c_out"
            type {
              tensor_type {
                elem_type: 9
                shape {}
              }
            }
          }
          output {
            name: "eo"
            type {
              tensor_type {
                elem_type: 1
                shape { dim { dim_value: 0 } }
              }
            }
          }
          output {
            name: "i_out"
            type {
              tensor_type {
                elem_type: 7
                shape {}
              }
            }
          }
        }
      }
    }
    node { op_type: "Identity" input: "x" output: "y" }
    output {
      name: "scan"
      type { tensor_type { elem_type: 7 } }
    }
    output {
      name: "y"
      type {
        tensor_type {
          elem_type: 1
          shape { dim { dim_value: 1 } }
        }
      }
    }
  })pb";

StatusOr<std::unique_ptr<Model>> LoadText(const char* text, const LoadOptions& load) {
  onnx::ModelProto m;
  if (!google::protobuf::TextFormat::ParseFromString(text, &m))
    return InvalidArgument("bad text proto");
  ASSIGN_OR_RETURN(Graph g, ImportOnnxBytes(m.SerializeAsString(), ""));
  return Model::FromGraph(std::move(g), load);
}

Status RunWithX(const Model& model, std::vector<NamedTensor>* outputs) {
  auto session = Session::Create(model, Opts(1));
  if (!session.ok()) return session.status();
  return (*session)->Run({{"x", F32({1}, {1.f})}}, outputs);
}

TEST(ControlFlowLimitsTest, HugeConstantLoopLoadsAndStopsAtTheIterationCap) {
  for (bool optimize : {false, true}) {
    SCOPED_TRACE(optimize);
    LoadOptions load;
    load.optimize.enabled = optimize;
    load.limits.max_loop_iterations = 1000;
    auto model = LoadText(kHugeLoop, load);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    std::vector<NamedTensor> outputs;
    Status s = RunWithX(**model, &outputs);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("node 'loop' (Loop): runs more than 1000 iterations"));
    EXPECT_THAT(s.message(), HasSubstr("max_loop_iterations"));
  }
}

TEST(ControlFlowLimitsTest, ScanOutputsCountAgainstMaxTensorBytes) {
  LoadOptions load;
  load.limits.max_tensor_bytes = 800;  // 100 int64 rows
  auto model = LoadText(kHugeLoop, load);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<NamedTensor> outputs;
  Status s = RunWithX(**model, &outputs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("node 'loop' (Loop): scan output 0 grows past 800 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("in iteration 100"));
}

// Run time: a trip count of INT64_MAX (PyTorch's while loops) stops at the cap; a count
// within it runs.
TEST(ControlFlowLimitsTest, RunTimeTripCountStopsAtTheIterationCap) {
  GraphBuilder b;
  const int m = b.Input("m", {}, DataType::kInt64);
  const int v = b.Input("v", {1});
  const int out = b.Op("Loop", "loop", {m, -1, v}, {{"body", AGraph(CounterBody())}});
  LoadOptions load;
  load.limits.max_loop_iterations = 50;
  auto model = Model::FromGraph(b.Finish(out), load);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> outputs;
  Status s = (*session)->Run({{"m", I64({}, {50})}, {"v", F32({1}, {0.f})}}, &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Values(outputs[0].tensor), std::vector<float>{50.f});
  s = (*session)->Run(
      {{"m", I64({}, {std::numeric_limits<int64_t>::max()})}, {"v", F32({1}, {0.f})}}, &outputs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("node 'loop' (Loop): runs more than 50 iterations"));
}

TEST(ControlFlowFoldTest, LoopWithAnEmptyFirstOutputKeepsItsScanOutput) {
  for (bool optimize : {false, true}) {
    SCOPED_TRACE(optimize);
    LoadOptions load;
    load.optimize.enabled = optimize;
    auto model = LoadText(kEmptyFirstOutputLoop, load);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    std::vector<NamedTensor> outputs;
    Status s = RunWithX(**model, &outputs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(outputs[0].name, "scan");
    ASSERT_EQ(outputs[0].tensor.shape(), (Shape{3}));
    EXPECT_EQ(IntValues(outputs[0].tensor), (std::vector<int64_t>{0, 1, 2}));
  }
}

// Subgraphs are planned under the model's limits: a branch making a [8, 2] float (64
// bytes) cannot be prepared under max_tensor_bytes 32, and fails the runs that take it.
TEST(ControlFlowLimitsTest, BranchesArePlannedUnderTheModelsLimits) {
  GraphBuilder b;
  const int cond = b.Input("cond", {}, DataType::kBool);
  const int x = b.Input("x", {2});
  const int out = b.Op(
      "If", "choose", {cond, x},
      {{"then_branch", AGraph(CapturingBranch("Add", F32({8, 2}, std::vector<float>(16, 1.f))))},
       {"else_branch", AGraph(CapturingBranch("Mul", F32({1}, {10})))}});
  LoadOptions load;
  load.limits.max_tensor_bytes = 32;
  auto model = Model::FromGraph(b.Finish(out), load);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> outputs;
  Status s = (*session)->Run({{"cond", Bool({}, {0})}, {"x", F32({2}, {1.5f, -2.f})}}, &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Values(outputs[0].tensor), (std::vector<float>{15.f, -20.f}));
  for (int i = 0; i < 2; ++i) {  // the stored error, each time
    s = (*session)->Run({{"cond", Bool({}, {1})}, {"x", F32({2}, {1.5f, -2.f})}}, &outputs);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("node 'choose' (If): subgraph 'then_branch'"));
  }
}

}  // namespace
}  // namespace shoal::engine
