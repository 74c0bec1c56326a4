#include "engine/profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "engine/inspect.h"
#include "engine/pipeline_split.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;
using ::testing::HasSubstr;

// With a clock that advances 1 ms per reading, each step's time is exactly the readings
// it spans: the bookkeeping (graph inputs reset the interval, one entry per node, the
// rest outside) is checked without timing anything real.
TEST(ProfileTest, GivesEachStepTheIntervalItEnds) {
  GraphBuilder gb;
  const int x = gb.Input("x", {16, 16});
  const int y = gb.Input("y", {4});
  const int w = gb.Constant("w", Random({16, 16}, 7));
  const int mm = gb.Op("MatMul", "mm", {x, w});
  const int neg = gb.Op("Neg", "neg", {y});
  const int r = gb.Op("Relu", "r", {mm});
  auto model = Model::FromGraph(gb.Finish({r, neg}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<NamedTensor> inputs = {{"x", Random({16, 16}, 1)}, {"y", Random({4}, 2)}};
  double clock = 0;
  int readings = 0;
  auto profile = ProfileOperators(**model, inputs, 3, Opts(kTestThreads), [&] {
    ++readings;
    return clock += 1;
  });
  ASSERT_TRUE(profile.ok()) << profile.status().ToString();
  // Per run: start, x, y, the fused product, Neg, end.
  EXPECT_EQ(readings, 3 * 6);
  EXPECT_EQ(profile->runs, 3);
  EXPECT_EQ(profile->threads, kTestThreads);
  ASSERT_EQ(profile->operators.size(), 2u);
  for (const OperatorTime& t : profile->operators) {
    EXPECT_EQ(t.nodes, 1) << t.op_type;
    EXPECT_DOUBLE_EQ(t.ms_per_run, 1.0) << t.op_type;  // its step's own interval
  }
  std::map<std::string, int> types;
  for (const OperatorTime& t : profile->operators) ++types[t.op_type];
  EXPECT_EQ(types.count("Neg"), 1u);
  EXPECT_EQ(types.count("shoal.FusedMatMul"), 1u);  // MatMul + Relu, fused at load
  EXPECT_DOUBLE_EQ(profile->ms_per_run, 5.0);
  EXPECT_DOUBLE_EQ(profile->outside_ms_per_run, 3.0);  // start to y, and Neg to the end
}

// Constant-folded nodes never run, so they are not in the profile; every node that
// does run is, once.
TEST(ProfileTest, CountsEveryNodeThatRuns) {
  auto model = Model::Load(SourceDir() + "/models/resnet_op13.onnx");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<NamedTensor> inputs = {{"input", Random({2, 3, 32, 32}, 3)}};
  auto profile = ProfileOperators(**model, inputs, 2, Opts(kTestThreads));
  ASSERT_TRUE(profile.ok()) << profile.status().ToString();
  std::map<std::string, int> in_graph;
  for (const Node& n : (*model)->graph().nodes) ++in_graph[n.qualified_type()];
  int convs = 0;
  double sum = 0;
  for (size_t i = 0; i < profile->operators.size(); ++i) {
    const OperatorTime& t = profile->operators[i];
    sum += t.ms_per_run;
    if (i > 0) {
      EXPECT_GE(profile->operators[i - 1].ms_per_run, t.ms_per_run);
    }
    ASSERT_EQ(in_graph.count(t.op_type), 1u) << t.op_type;
    EXPECT_LE(t.nodes, in_graph[t.op_type]) << t.op_type;
    if (t.op_type.find("Conv") != std::string::npos) {
      EXPECT_EQ(t.nodes, in_graph[t.op_type]) << t.op_type;  // a convolution always runs
      convs += t.nodes;
    }
  }
  EXPECT_GT(convs, 0);
  EXPECT_LE(sum, profile->ms_per_run * (1 + 1e-9));  // steps happen within their run
  EXPECT_NEAR(sum + profile->outside_ms_per_run, profile->ms_per_run, 1e-9);
  // Per node: one entry per node of the optimised graph, adding up to the operators'.
  ASSERT_EQ(profile->node_ms.size(), (*model)->graph().nodes.size());
  double node_sum = 0;
  for (double ms : profile->node_ms) {
    EXPECT_GE(ms, 0);
    node_sum += ms;
  }
  EXPECT_NEAR(node_sum, sum, 1e-9);
}

TEST(ProfileTest, RefusesBadArguments) {
  auto model = Model::Load(SourceDir() + "/models/resnet_op13.onnx");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<NamedTensor> inputs = {{"input", Random({1, 3, 32, 32}, 3)}};
  auto zero = ProfileOperators(**model, inputs, 0, Opts(kTestThreads));
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  const std::vector<NamedTensor> wrong = {{"input", Random({1, 4, 32, 32}, 3)}};
  EXPECT_FALSE(ProfileOperators(**model, wrong, 1, Opts(kTestThreads)).ok());
}

TEST(ProfileTest, InspectPrintsTheProfile) {
  InspectOptions options;
  options.batch = 2;
  options.profile_runs = 2;
  options.profile_threads = kTestThreads;
  auto report = InspectModel(SourceDir() + "/models/resnet_op13.onnx", options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(*report, HasSubstr("time per operator (batch 2, 2 runs, "));
  EXPECT_THAT(*report, HasSubstr("Conv  "));
  EXPECT_THAT(*report, HasSubstr("(outside operators)  "));
  options.profile_runs = -1;
  EXPECT_FALSE(InspectModel(SourceDir() + "/models/resnet_op13.onnx", options).ok());
}

TEST(ProfileTest, InspectPrintsABalancedPipelineCutByName) {
  InspectOptions options;
  options.profile_runs = 2;
  options.profile_threads = kTestThreads;
  options.pipeline_stages = 3;
  const std::string path = SourceDir() + "/models/resnet_op13.onnx";
  auto report = InspectModel(path, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(*report, HasSubstr("pipeline stages (3, balanced on the times above):"));
  EXPECT_THAT(*report, HasSubstr("  stage 3  nodes "));
  // The printed names are a cut the backend's pipeline_stage_boundaries accepts.
  const std::string key = "pipeline_stage_boundaries: \"";
  const size_t at = report->find(key);
  ASSERT_NE(at, std::string::npos) << *report;
  const size_t end = report->find('"', at + key.size());
  const std::string list = report->substr(at + key.size(), end - at - key.size());
  const size_t comma = list.find(',');
  ASSERT_NE(comma, std::string::npos) << list;
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok());
  auto starts =
      StageStartsFromNames((*model)->graph(), {list.substr(0, comma), list.substr(comma + 1)});
  ASSERT_TRUE(starts.ok()) << starts.status().ToString();
  EXPECT_EQ(starts->size(), 3u);
  options.pipeline_stages = -1;
  EXPECT_FALSE(InspectModel(path, options).ok());
}

}  // namespace
}  // namespace shoal::engine
