// Cutting a model into pipeline stages: the balanced cut from per-node costs, the cut
// from node names, and the stage models on a committed model (models/resnet_op17.onnx)
// run one after another against its PyTorch reference.
#include "engine/pipeline_split.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace shoal::engine::testing;

TEST(BalanceStagesTest, EqualCostsSplitEvenly) {
  auto starts = BalanceStages({1, 1, 1, 1, 1, 1}, 3);
  ASSERT_TRUE(starts.ok()) << starts.status().ToString();
  EXPECT_THAT(*starts, ElementsAre(0, 2, 4));
}

TEST(BalanceStagesTest, MinimisesTheCostliestStage) {
  // One heavy node alone; the rest share the second stage.
  auto a = BalanceStages({9, 1, 1, 1, 1, 1}, 2);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(*a, ElementsAre(0, 1));
  // 3+3 | 2+2+2 | 6: largest stage 6, which no other cut beats.
  auto b = BalanceStages({3, 3, 2, 2, 2, 6}, 3);
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(*b, ElementsAre(0, 2, 5));
  // Zero-cost nodes still land in exactly one stage each.
  auto c = BalanceStages({0, 0, 0}, 3);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(*c, ElementsAre(0, 1, 2));
}

TEST(BalanceStagesTest, RejectsBadCounts) {
  auto more = BalanceStages({1, 1}, 3);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(more.status().message(), HasSubstr("at most the model's node count (2)"));
  EXPECT_FALSE(BalanceStages({1, 1}, 0).ok());
  EXPECT_FALSE(BalanceStages({1, -1}, 1).ok());
}

class ResnetSplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::Load(ModelPath("resnet_op17.onnx"));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
  }
  std::unique_ptr<Model> model_;
};

TEST_F(ResnetSplitTest, StartsFromNodeNames) {
  const Graph& g = model_->graph();
  ASSERT_GT(g.nodes.size(), 6u);
  const std::string a = g.nodes[3].name, b = g.nodes[6].name;
  ASSERT_FALSE(a.empty());
  auto starts = StageStartsFromNames(g, {a, b});
  ASSERT_TRUE(starts.ok()) << starts.status().ToString();
  EXPECT_THAT(*starts, ElementsAre(0, 3, 6));

  auto unknown = StageStartsFromNames(g, {a, "no_such_node"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'no_such_node' is not a node"));
  auto reversed = StageStartsFromNames(g, {b, a});
  ASSERT_FALSE(reversed.ok());
  EXPECT_THAT(reversed.status().message(), HasSubstr("out of graph order"));
  auto first = StageStartsFromNames(g, {g.nodes[0].name});
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(first.status().message(), HasSubstr("first stage would be empty"));
}

TEST_F(ResnetSplitTest, EveryNodeInExactlyOneStageAndCutsAreConsistent) {
  const Graph& g = model_->graph();
  std::vector<double> ones(g.nodes.size(), 1.0);
  auto starts = BalanceStages(ones, 3);
  ASSERT_TRUE(starts.ok());
  auto stages = SplitModel(*model_, *starts, ones);
  ASSERT_TRUE(stages.ok()) << stages.status().ToString();
  ASSERT_EQ(stages->models.size(), 3u);
  EXPECT_EQ(stages->costs.size(), 3u);
  // Nodes: the stages' nodes, concatenated, are the model's, in order.
  std::vector<std::string> names;
  for (const auto& m : stages->models)
    for (const Node& n : m->graph().nodes) names.push_back(n.name + "/" + n.op_type);
  ASSERT_EQ(names.size(), g.nodes.size());
  for (size_t n = 0; n < g.nodes.size(); ++n)
    EXPECT_EQ(names[n], g.nodes[n].name + "/" + g.nodes[n].op_type);
  // Cut tensors: every stage input is a model input or an earlier stage's output; every
  // stage output but the model's is read later; the last stage yields the model output.
  std::set<std::string> available;
  for (const TensorInfo& in : model_->inputs()) available.insert(in.name);
  for (size_t s = 0; s < stages->models.size(); ++s) {
    const Model& m = *stages->models[s];
    EXPECT_TRUE(m.batch_dim_symbolic()) << "stage " << s + 1;
    for (const TensorInfo& in : m.inputs())
      EXPECT_TRUE(available.count(in.name)) << "stage " << s + 1 << " input " << in.name;
    for (const TensorInfo& out : m.outputs()) available.insert(out.name);
  }
  for (const TensorInfo& out : model_->outputs()) {
    bool in_last = false;
    for (const TensorInfo& o : stages->models.back()->outputs()) in_last |= o.name == out.name;
    EXPECT_TRUE(in_last) << out.name;
  }
}

TEST_F(ResnetSplitTest, StagesRunInTurnMatchTheReference) {
  std::vector<double> ones(model_->graph().nodes.size(), 1.0);
  for (int k : {2, 4}) {
    SCOPED_TRACE("stages " + std::to_string(k));
    auto starts = BalanceStages(ones, k);
    ASSERT_TRUE(starts.ok());
    auto stages = SplitModel(*model_, *starts);
    ASSERT_TRUE(stages.ok()) << stages.status().ToString();
    const Reference ref = LoadReference("resnet_op17.b4.sht");
    std::map<std::string, Tensor> env;
    for (const NamedTensor& in : ref.inputs) env[in.name] = in.tensor;
    for (const auto& m : stages->models) {
      auto session = Session::Create(*m, Opts(kTestThreads));
      ASSERT_TRUE(session.ok()) << session.status().ToString();
      std::vector<NamedTensor> ins, outs;
      for (const TensorInfo& info : m->inputs()) ins.push_back({info.name, env.at(info.name)});
      Status s = (*session)->Run(ins, &outs);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (NamedTensor& o : outs) env[o.name] = o.tensor;
    }
    for (const NamedTensor& want : ref.outputs) {
      ASSERT_TRUE(env.count(want.name)) << want.name;
      const Tensor& got = env[want.name];
      ASSERT_EQ(got.shape(), want.tensor.shape());
      const float scale = std::max(MaxAbs(want.tensor), 1e-6f);
      EXPECT_LE(MaxAbsDiff(got, want.tensor), 1e-4f * scale) << want.name;
    }
  }
}

TEST_F(ResnetSplitTest, RejectsBadStarts) {
  const int n = static_cast<int>(model_->graph().nodes.size());
  EXPECT_FALSE(SplitModel(*model_, {1}).ok());
  EXPECT_FALSE(SplitModel(*model_, {0, 5, 5}).ok());
  EXPECT_FALSE(SplitModel(*model_, {0, n}).ok());
}

}  // namespace
}  // namespace shoal::engine
