#include "engine/profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "engine/inspect.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;
using ::testing::HasSubstr;

// A 384x384x384 matrix product (113 MFLOP) beside a Neg of 4 numbers: the time must land
// on the MatMul, by orders of magnitude, and every node must be counted once.
TEST(ProfileTest, AttributesTimeToTheStepThatSpentIt) {
  GraphBuilder gb;
  const int x = gb.Input("x", {384, 384});
  const int y = gb.Input("y", {4});
  const int w = gb.Constant("w", Random({384, 384}, 7));
  const int mm = gb.Op("MatMul", "mm", {x, w});
  const int small = gb.Op("Neg", "small", {y});
  const int r = gb.Op("Relu", "r", {mm});
  Graph g = gb.Finish(r);
  g.outputs.push_back(small);
  auto model = Model::FromGraph(std::move(g));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<NamedTensor> inputs = {{"x", Random({384, 384}, 1)}, {"y", Random({4}, 2)}};
  auto profile = ProfileOperators(**model, inputs, 5, Opts(kTestThreads));
  ASSERT_TRUE(profile.ok()) << profile.status().ToString();
  EXPECT_EQ(profile->runs, 5);
  EXPECT_EQ(profile->threads, kTestThreads);

  std::map<std::string, OperatorTime> by_type;
  double sum = 0;
  for (const OperatorTime& t : profile->operators) {
    by_type[t.op_type] = t;
    sum += t.ms_per_run;
  }
  // The optimiser fuses MatMul + Relu; whatever it names the result, one node holds the
  // product and there is one Neg.
  ASSERT_EQ(by_type.count("Neg"), 1u);
  EXPECT_EQ(by_type["Neg"].nodes, 1);
  const OperatorTime& top = profile->operators.front();
  EXPECT_THAT(top.op_type, HasSubstr("MatMul"));
  EXPECT_EQ(top.nodes, 1);
  EXPECT_GT(top.ms_per_run, 20 * by_type["Neg"].ms_per_run);
  for (size_t i = 1; i < profile->operators.size(); ++i)
    EXPECT_GE(profile->operators[i - 1].ms_per_run, profile->operators[i].ms_per_run);
  EXPECT_GT(profile->ms_per_run, 0);
  EXPECT_LE(sum, profile->ms_per_run * (1 + 1e-9));
  EXPECT_NEAR(sum + profile->outside_ms_per_run, profile->ms_per_run, 1e-6);
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
  for (const Node& n : (*model)->graph().nodes)
    ++in_graph[(n.domain.empty() ? "" : n.domain + ".") + n.op_type];
  int convs = 0;
  for (const OperatorTime& t : profile->operators) {
    ASSERT_EQ(in_graph.count(t.op_type), 1u) << t.op_type;
    EXPECT_LE(t.nodes, in_graph[t.op_type]) << t.op_type;
    if (t.op_type.find("Conv") != std::string::npos) {
      EXPECT_EQ(t.nodes, in_graph[t.op_type]) << t.op_type;  // a convolution always runs
      convs += t.nodes;
    }
  }
  EXPECT_GT(convs, 0);
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

}  // namespace
}  // namespace shoal::engine
