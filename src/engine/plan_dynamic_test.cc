// Data-dependent steps of a plan (plan.h): their preparations are cached by what they
// read, so repeated input shapes prepare nothing, and results stay right as the shapes
// and the data change.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/model.h"
#include "engine/plan.h"
#include "engine/profile.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// x [6] -> NonZero -> [1, n] indices. Five dynamic steps read them: Cast (its input's
// data is part of its key), Sub and Relu (FP32 inputs: keyed by shape alone), Shape
// (computed by its preparation, keyed by its input's data) and Expand (keyed by the
// contents of its shape input, whose own shape [2] never changes).
class DynamicCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { Load(PlanLimits().dynamic_cache_entries); }

  void Load(int cache_entries) {
    session_.reset();  // before the model it runs
    GraphBuilder b;
    const int x = b.Input("x", {6});
    const int nz = b.Op("NonZero", "nz", {x});
    const int f = b.Op("Cast", "f", {nz}, {{"to", AInt(1)}});
    const int y = b.Op("Relu", "y", {b.Op("Sub", "d", {f, b.Constant("two", F32({}, {2}))})});
    const int e =
        b.Op("Expand", "e", {b.Constant("seven", F32({1}, {7})), b.Op("Shape", "s", {nz})});
    LoadOptions load;
    load.limits.dynamic_cache_entries = cache_entries;
    auto model = Model::FromGraph(b.Finish({y, e}), load);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
    auto session = Session::Create(*model_, Opts(1));
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    session_ = std::move(session).value();
  }

  // Runs on `x`; checks y = max(i - 2, 0) over the non-zero indices i and e = 7s.
  void RunAndCheck(const std::vector<float>& x) {
    std::vector<NamedTensor> outs;
    Status s = session_->Run({{"x", F32({6}, x)}}, &outs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<float> want_y;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != 0) want_y.push_back(std::max(static_cast<float>(i) - 2.f, 0.f));
    const int64_t n = static_cast<int64_t>(want_y.size());
    ASSERT_EQ(outs.size(), 2u);
    EXPECT_EQ(outs[0].tensor.shape(), (Shape{1, n}));
    EXPECT_THAT(Values(outs[0].tensor), ElementsAreArray(want_y));
    EXPECT_EQ(outs[1].tensor.shape(), (Shape{1, n}));
    EXPECT_THAT(Values(outs[1].tensor), ElementsAreArray(std::vector<float>(want_y.size(), 7)));
  }

  int64_t prepares() const { return session_->dynamic_stats().prepares; }
  int64_t hits() const { return session_->dynamic_stats().cache_hits; }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Session> session_;
};

TEST_F(DynamicCacheTest, RepeatedInputsPrepareNothingAndResultsFollowTheData) {
  const std::vector<float> a = {0, 1, 0, 3, 4, 0};  // indices 1, 3, 4
  RunAndCheck(a);
  EXPECT_EQ(prepares(), 5);
  EXPECT_EQ(hits(), 0);
  RunAndCheck(a);
  EXPECT_EQ(prepares(), 5);
  EXPECT_EQ(hits(), 5);
  // Three indices again, elsewhere: Sub, Relu and Expand see what they saw; Cast and
  // Shape see other indices.
  RunAndCheck({1, 0, 2, 0, 0, 5});  // 0, 2, 5
  EXPECT_EQ(prepares(), 7);
  EXPECT_EQ(hits(), 8);
  // One index: every key is new, Expand's only by its shape input's contents.
  RunAndCheck({0, 0, 0, 0, 9, 0});
  EXPECT_EQ(prepares(), 12);
  RunAndCheck(a);
  EXPECT_EQ(prepares(), 12);
  EXPECT_EQ(hits(), 13);
}

TEST_F(DynamicCacheTest, KeepsTheLastFewKeysPerStep) {
  ASSERT_EQ(PlanLimits().dynamic_cache_entries, 4) << "the counts below assume four entries";
  const std::vector<float> a = {0, 1, 0, 3, 4, 0};  // three indices
  RunAndCheck(a);
  // Four other counts: two, four, five and none (an empty [1, 0]) evict the three.
  for (const std::vector<float>& x : std::vector<std::vector<float>>{
           {1, 1, 0, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 0}, {0, 0, 0, 0, 0, 0}}) {
    RunAndCheck(x);
  }
  const int64_t before = prepares();
  EXPECT_EQ(before, 25);
  RunAndCheck(a);
  EXPECT_EQ(prepares(), before + 5);
  // The most recent four are still there.
  RunAndCheck({1, 1, 1, 1, 1, 0});
  EXPECT_EQ(prepares(), before + 5);
}

TEST_F(DynamicCacheTest, NoEntriesPreparesAtEveryRun) {
  Load(0);
  const std::vector<float> a = {0, 1, 0, 3, 4, 0};
  RunAndCheck(a);
  RunAndCheck(a);
  RunAndCheck({0, 0, 0, 0, 9, 0});
  EXPECT_EQ(prepares(), 15);
  EXPECT_EQ(hits(), 0);
}

// The operator profile (shoal inspect --profile) counts them over its timed runs, after
// one untimed run that prepared everything.
TEST_F(DynamicCacheTest, ProfileCountsReusedPreparations) {
  auto profile = ProfileOperators(*model_, {{"x", F32({6}, {0, 1, 0, 3, 4, 0})}}, 3, Opts(1));
  ASSERT_TRUE(profile.ok()) << profile.status().ToString();
  EXPECT_EQ(profile->dynamic.prepares, 0);
  EXPECT_EQ(profile->dynamic.cache_hits, 15);
}

// Model::NonBatchMajorOutputs: outputs whose first dimension is not the inputs' batch
// dimension, found by shape inference or, for a data-dependent shape, by its declaration.
TEST(BatchMajorTest, OutputsThatDoNotFollowTheBatchAreNamed) {
  auto resnet = Model::Load(ModelPath("resnet_op13.onnx"));
  ASSERT_TRUE(resnet.ok()) << resnet.status().ToString();
  EXPECT_TRUE((*resnet)->NonBatchMajorOutputs().empty());
  EXPECT_TRUE((*resnet)->outputs()[0].batch_major);
  auto nms = Model::Load(ModelPath("nms_batch.onnx"));
  ASSERT_TRUE(nms.ok()) << nms.status().ToString();
  EXPECT_TRUE((*nms)->batch_dim_symbolic());
  EXPECT_THAT((*nms)->NonBatchMajorOutputs(), ElementsAre("selected_indices"));
  auto flat = Model::Load(ModelPath("flatten_batch.onnx"));
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_THAT((*flat)->NonBatchMajorOutputs(), ElementsAre("y"));
}

}  // namespace
}  // namespace shoal::engine
