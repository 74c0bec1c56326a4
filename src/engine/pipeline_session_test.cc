// PipelineSession on a committed model (models/resnet_op17.onnx): micro-batched runs
// through stage threads against the PyTorch reference and the whole model; input errors;
// the micro-batch tuner on synthetic run times; sharing cores among stages.
#include "engine/pipeline_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace shoal::engine::testing;

TEST(SplitCoresTest, SharesCoresInOrder) {
  EXPECT_THAT(SplitCores({0, 1, 2, 3}, 2), ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  EXPECT_THAT(SplitCores({0, 1, 2}, 2), ElementsAre(ElementsAre(0, 1), ElementsAre(2)));
  EXPECT_THAT(SplitCores({5}, 3), ElementsAre(ElementsAre(5), ElementsAre(5), ElementsAre(5)));
  EXPECT_THAT(SplitCores({}, 2), ElementsAre(ElementsAre(), ElementsAre()));
}

// Synthetic time of a batch in m micro-batches: the bubble shrinks as 1/m, the fixed
// cost per micro-batch grows with m. Fastest at m = 3 (20, 13, 12, 12.5, 13.6, ...).
double SyntheticSeconds(int m) { return 18.0 / m + 2.0 * m; }

TEST(MicroBatchTunerTest, SettlesOnTheFastestCount) {
  MicroBatchTuner tuner(2);
  EXPECT_EQ(tuner.Current(8), 4);  // starts at min(batch, 2 * stages)
  EXPECT_EQ(tuner.Choose(1), 1);
  for (int i = 0; i < 400; ++i) {
    const int m = tuner.Choose(8);
    ASSERT_GE(m, 1);
    ASSERT_LE(m, 8);
    tuner.Observe(8, m, SyntheticSeconds(m));
  }
  EXPECT_EQ(tuner.Current(8), 3);
  // Batch sizes are tuned apart; a batch of 2 never goes beyond 2.
  for (int i = 0; i < 50; ++i) {
    const int m = tuner.Choose(2);
    ASSERT_LE(m, 2);
    tuner.Observe(2, m, SyntheticSeconds(m));
  }
  EXPECT_EQ(tuner.Current(2), 2);
}

TEST(MicroBatchTunerTest, ClimbsUpFromBelowTheBest) {
  MicroBatchTuner tuner(1);
  EXPECT_EQ(tuner.Current(8), 2);
  for (int i = 0; i < 400; ++i) {
    const int m = tuner.Choose(8);
    tuner.Observe(8, m, SyntheticSeconds(m));
  }
  EXPECT_EQ(tuner.Current(8), 3);
}

class PipelineSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = Model::Load(ModelPath("resnet_op17.onnx"));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
    std::vector<double> ones(model_->graph().nodes.size(), 1.0);
    auto starts = BalanceStages(ones, 2);
    ASSERT_TRUE(starts.ok());
    auto stages = SplitModel(*model_, *starts);
    ASSERT_TRUE(stages.ok()) << stages.status().ToString();
    stages_ = std::move(stages).value();
  }
  PipelineOptions Options(int micro_batches) {
    PipelineOptions o;
    o.threads_per_stage = 1;
    o.micro_batches = micro_batches;
    return o;
  }
  std::unique_ptr<Model> model_;
  ModelStages stages_;
};

void ExpectClose(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    ASSERT_EQ(got[i].tensor.shape(), want[i].tensor.shape()) << want[i].name;
    const float scale = std::max(MaxAbs(want[i].tensor), 1e-6f);
    EXPECT_LE(MaxAbsDiff(got[i].tensor, want[i].tensor), 1e-4f * scale) << want[i].name;
  }
}

TEST_F(PipelineSessionTest, MicroBatchedRunsMatchTheReferenceAndTheWholeModel) {
  const Reference ref = LoadReference("resnet_op17.b4.sht");
  auto whole = Session::Create(*model_, Opts(1));
  ASSERT_TRUE(whole.ok());
  std::vector<NamedTensor> want;
  ASSERT_TRUE((*whole)->Run(ref.inputs, &want).ok());
  for (int m : {1, 2, 3, 4, 0}) {
    SCOPED_TRACE("micro-batches " + std::to_string(m));
    auto p = PipelineSession::Create(*model_, stages_, Options(m));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ((*p)->stages(), 2);
    for (int run = 0; run < 3; ++run) {
      std::vector<NamedTensor> got;
      Status s = (*p)->Run(ref.inputs, &got);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ExpectClose(got, want);
      ExpectClose(got, ref.outputs);
    }
    if (m > 0) {
      EXPECT_EQ((*p)->last_micro_batches(), m);
    }
    const StagePipelineStats stats = (*p)->stats();
    EXPECT_EQ(stats.items, m > 0 ? 3 * m : stats.items);
    EXPECT_GE(stats.bubble_ratio(), 0.0);
    EXPECT_LE(stats.bubble_ratio(), 1.0);
  }
}

TEST_F(PipelineSessionTest, BatchOfOneRunsAsOneMicroBatch) {
  const Reference ref = LoadReference("resnet_op17.b1.sht");
  auto p = PipelineSession::Create(*model_, stages_, Options(4));
  ASSERT_TRUE(p.ok());
  std::vector<NamedTensor> got;
  ASSERT_TRUE((*p)->Run(ref.inputs, &got).ok());
  EXPECT_EQ((*p)->last_micro_batches(), 1);
  ExpectClose(got, ref.outputs);
}

TEST_F(PipelineSessionTest, BadInputsFailCleanlyAndTheSessionGoesOn) {
  const Reference ref = LoadReference("resnet_op17.b4.sht");
  auto p = PipelineSession::Create(*model_, stages_, Options(2));
  ASSERT_TRUE(p.ok());
  std::vector<NamedTensor> got;
  Status missing = (*p)->Run({}, &got);
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("is missing"));
  // Wrong channel count: the first stage's Session refuses it, naming the stage.
  std::vector<NamedTensor> bad = {{ref.inputs[0].name, Random({4, 1, 8, 8}, 1)}};
  Status wrong = (*p)->Run(bad, &got);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("pipeline stage 1 of 2"));
  ASSERT_TRUE((*p)->Run(ref.inputs, &got).ok());
  ExpectClose(got, ref.outputs);
}

TEST_F(PipelineSessionTest, RejectsBadOptions) {
  PipelineOptions o = Options(-1);
  EXPECT_FALSE(PipelineSession::Create(*model_, stages_, o).ok());
  o = Options(0);
  o.stage_cores = {{0}};
  EXPECT_FALSE(PipelineSession::Create(*model_, stages_, o).ok());
}

}  // namespace
}  // namespace shoal::engine
