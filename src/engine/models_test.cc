// End-to-end correctness: every committed model (models/generate.py) against PyTorch's
// outputs at batch 1 and batch 4, the trained digit classifier's held-out accuracy,
// external data, plan caching and concurrent sessions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>

#include <cmath>
#include <map>
#include <thread>

#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::HasSubstr;
using namespace shoal::engine::testing;

class ModelFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelFamilyTest, MatchesPyTorchAtBatch1And4) {
  auto model = Model::Load(ModelPath(GetParam() + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->batch_dim_symbolic());
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (const char* batch : {".b1.sht", ".b4.sht"}) {
    SCOPED_TRACE(GetParam() + batch);
    ExpectMatchesReference(**session, LoadReference(GetParam() + batch));
  }
  EXPECT_EQ((*session)->cached_plans(), 2);
}

std::vector<std::string> AllModels() {
  std::vector<std::string> names;
  for (const char* family :
       {"resnet", "mobilenet_v2", "mobilenet_v3", "efficientnet", "squeezenet", "shufflenet",
        "densenet", "mlp", "bert_layernorm", "bert_decomposed", "vae"}) {
    for (const char* opset : {"_op13", "_op17"}) names.push_back(std::string(family) + opset);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Models, ModelFamilyTest, ::testing::ValuesIn(AllModels()),
                         [](const auto& info) { return info.param; });

TEST(ModelInfoTest, BertHasSymbolicBatchAndSequence) {
  auto model = Model::Load(ModelPath("bert_layernorm_op17.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const auto& in = (*model)->inputs();
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].dtype, DataType::kInt64);
  EXPECT_EQ(SymbolicShapeToString(in[0].shape), "[batch,sequence]");
  const auto& out = (*model)->outputs();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype, DataType::kFp32);
  EXPECT_EQ(SymbolicShapeToString(out[0].shape), "[batch,sequence,32]");
  EXPECT_EQ(SymbolicShapeToString(out[1].shape), "[batch,32]");
}

TEST(ModelInfoTest, BertRunsAtAnotherSequenceLength) {
  auto model = Model::Load(ModelPath("bert_decomposed_op13.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> outputs;
  Tensor ids = I64({2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  Tensor mask = I64({2, 5}, {1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  ASSERT_TRUE((*session)->Run({{"input_ids", ids}, {"attention_mask", mask}}, &outputs).ok());
  EXPECT_EQ(outputs[0].tensor.shape(), (Shape{2, 5, 32}));
}

TEST(DigitsTest, TrainedClassifierKeepsItsHeldOutAccuracy) {
  auto tensors = ReadTensorFile(ModelPath("digits.test.sht"));
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  Tensor images, labels, torch_logits;
  float torch_accuracy = 0;
  for (auto& t : *tensors) {
    if (t.name == "in:image") images = t.tensor;
    if (t.name == "labels") labels = t.tensor;
    if (t.name == "out:logits") torch_logits = t.tensor;
    if (t.name == "torch_accuracy") torch_accuracy = t.tensor.values<float>()[0];
  }
  ASSERT_EQ(images.shape().size(), 4u);
  auto model = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE((*session)->Run({{"image", images}}, &outputs).ok());
  const Tensor& logits = outputs[0].tensor;
  ASSERT_EQ(logits.shape(), (Shape{images.shape()[0], 10}));
  EXPECT_LE(MaxAbsDiff(logits, torch_logits), 1e-4f * MaxAbs(torch_logits));
  int correct = 0;
  const int64_t n = images.shape()[0];
  for (int64_t i = 0; i < n; ++i) {
    auto row = logits.values<float>().subspan(static_cast<size_t>(i * 10), 10);
    const int64_t pred = std::max_element(row.begin(), row.end()) - row.begin();
    correct += pred == labels.values<int64_t>()[i];
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(n);
  EXPECT_GE(accuracy, 0.95) << correct << " of " << n;
  EXPECT_NEAR(accuracy, torch_accuracy, 1.0 / static_cast<double>(n) + 1e-9);
}

TEST(ExternalDataTest, LoadsTensorsFromTheFileNextToTheModel) {
  auto model = Model::Load(ModelPath("mlp_external.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  ExpectMatchesReference(**session, LoadReference("mlp_external.b2.sht"));
}

TEST(SessionTest, RejectsInputsThatDoNotMatchTheModel) {
  auto model = Model::Load(ModelPath("resnet_op13.onnx"));
  ASSERT_TRUE(model.ok());
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  EXPECT_THAT((*session)->Run({{"input", Random({1, 4, 32, 32}, 1)}}, &out).message(),
              HasSubstr("expects [batch,3,"));
  EXPECT_THAT((*session)->Run({{"nope", Random({1, 3, 32, 32}, 1)}}, &out).message(),
              HasSubstr("no input named"));
  EXPECT_THAT((*session)->Run({}, &out).message(), HasSubstr("is missing"));
  EXPECT_THAT((*session)->Run({{"input", I64({1}, {1})}}, &out).message(),
              HasSubstr("must be FP32"));
  EXPECT_FALSE(Session::Create(**model, Opts(-1)).ok());
  EXPECT_FALSE(Session::Create(**model, Opts(0, {}, 0)).ok());
}

// PlanLimits::max_tensor_bytes is in bytes: an FP32 input may hold a quarter as many
// elements (it used to be taken as an element count, allowing 4x the limit). The model
// reduces its input, so only the input check can catch an input over the limit.
TEST(SessionTest, InputSizeLimitIsInBytes) {
  LoadOptions load;
  load.limits.max_tensor_bytes = 48;  // 12 FP32 elements
  auto at_limit = RunOp("ReduceSum", {{F32({4, 3}, std::vector<float>(12, 1))}},
                        {{"axes", AInts({1})}}, 1, 11, load);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status().ToString();
  auto over = RunOp("ReduceSum", {{F32({5, 3}, std::vector<float>(15, 1))}}, {{"axes", AInts({1})}},
                    1, 11, load);
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(over.status().message(), HasSubstr("has more than 12 elements"));
}

TEST(SessionTest, PlanCacheEvictsLeastRecentlyUsed) {
  auto model = Model::Load(ModelPath("mlp_op13.onnx"));
  ASSERT_TRUE(model.ok());
  auto session = Session::Create(**model, Opts(1, {}, 2));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  for (int64_t b : {1, 2, 1, 3, 4}) {
    ASSERT_TRUE((*session)
                    ->Run({{"dense", Random({b, 8}, 1)},
                           {"ids", I64({b, 2}, std::vector<int64_t>(2 * b, 1))}},
                          &out)
                    .ok());
    EXPECT_EQ(out[0].tensor.shape(), (Shape{b, 1}));
  }
  EXPECT_EQ((*session)->cached_plans(), 2);
}

// A batching server runs every batch size, each its own plan: the cached plans share
// one arena, as large as the largest needs, grown and shrunk as plans come and go, and a
// plan bound to an arena that was replaced computes what a session of its own does.
TEST(SessionTest, CachedPlansShareOneArenaSizedByTheLargest) {
  auto model = Model::Load(ModelPath("resnet_op13.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string name = (*model)->inputs()[0].name;
  auto input = [&](int64_t batch) {
    Shape shape{batch};
    for (size_t d = 1; d < (*model)->inputs()[0].shape.size(); ++d)
      shape.push_back((*model)->inputs()[0].shape[d].value);
    return Random(shape, static_cast<uint32_t>(batch));
  };
  // Each batch size alone, on a session of its own: the reference output and arena.
  std::map<int64_t, Tensor> want;
  std::map<int64_t, int64_t> own_arena;
  for (int64_t b : {1, 2, 8}) {
    auto alone = Session::Create(**model, Opts(1));
    ASSERT_TRUE(alone.ok());
    std::vector<NamedTensor> out;
    ASSERT_TRUE((*alone)->Run({{name, input(b)}}, &out).ok());
    want[b] = out[0].tensor;
    own_arena[b] = (*alone)->arena_bytes();
    auto stats = (*alone)->PlanStats({input(b).shape()});
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(own_arena[b], stats->planned_bytes);
  }
  ASSERT_GT(own_arena[8], 2 * std::max(own_arena[1], own_arena[2]))
      << "the test needs batch 8's arena to dwarf the others'";

  auto session = Session::Create(**model, Opts(1, {}, 2));
  ASSERT_TRUE(session.ok());
  // After each run: the batch, what the cached plans need, and the plans prepared so far.
  struct Step {
    int64_t batch, arena, prepared;
  };
  const std::vector<Step> steps = {
      {1, own_arena[1], 1},
      {8, own_arena[8], 2},                          // grown: plan 1 rebound to it
      {1, own_arena[8], 2},                          // cached, on the grown arena
      {2, std::max(own_arena[1], own_arena[2]), 3},  // 8 evicted: shrunk
      {8, own_arena[8], 4},                          // 1 evicted, 8 prepared again
      {2, own_arena[8], 4},
  };
  for (const Step& step : steps) {
    SCOPED_TRACE("batch " + std::to_string(step.batch));
    std::vector<NamedTensor> out;
    ASSERT_TRUE((*session)->Run({{name, input(step.batch)}}, &out).ok());
    EXPECT_LE(MaxAbsDiff(out[0].tensor, want[step.batch]), 1e-6f);
    EXPECT_EQ((*session)->arena_bytes(), step.arena);
    EXPECT_EQ((*session)->plans_prepared(), step.prepared);
    EXPECT_EQ((*session)->cached_plans(), std::min<int>(2, static_cast<int>(step.prepared)));
  }
}

TEST(SessionTest, PlansBelowTheFlopThresholdRunOnOneThreadWithTheSameResults) {
  auto model = Model::Load(ModelPath("mlp_op13.onnx"));
  ASSERT_TRUE(model.ok());
  const std::vector<NamedTensor> in = {{"dense", Random({3, 8}, 7)},
                                       {"ids", I64({3, 2}, {1, 2, 3, 4, 5, 6})}};
  const std::vector<Shape> shapes = {{3, 8}, {3, 2}};
  std::vector<std::vector<NamedTensor>> outs(2);
  const int64_t thresholds[2] = {1, int64_t{1} << 50};  // every plan is large; every one small
  const int want_threads[2] = {kTestThreads, 1};
  for (int i = 0; i < 2; ++i) {
    SessionOptions o = Opts(kTestThreads);
    o.single_thread_below_flops = thresholds[i];
    auto session = Session::Create(**model, o);
    ASSERT_TRUE(session.ok());
    auto threads = (*session)->PlanThreads(shapes);
    ASSERT_TRUE(threads.ok()) << threads.status().ToString();
    EXPECT_EQ(*threads, want_threads[i]) << "threshold " << thresholds[i];
    ASSERT_TRUE((*session)->Run(in, &outs[i]).ok());
    EXPECT_EQ((*session)->cached_plans(), 1) << "PlanThreads caches the plan Run uses";
  }
  ASSERT_EQ(outs[0].size(), 1u);
  ASSERT_EQ(outs[1].size(), 1u);
  EXPECT_LE(MaxAbsDiff(outs[0][0].tensor, outs[1][0].tensor), 1e-5f);
  SessionOptions bad = Opts(1);
  bad.single_thread_below_flops = -1;
  EXPECT_FALSE(Session::Create(**model, bad).ok());
}

TEST(SessionTest, WeightsAreReorderedOnceAtLoadAndShared) {
  auto model = Model::Load(ModelPath("resnet_op13.onnx"));
  ASSERT_TRUE(model.ok());
  const size_t at_load = (*model)->weight_cache()->size();
  EXPECT_GT(at_load, 0u);
  const Reference ref = LoadReference("resnet_op13.b1.sht");
  for (int i = 0; i < 2; ++i) {
    auto session = Session::Create(**model, Opts(1));
    ASSERT_TRUE(session.ok());
    ExpectMatchesReference(**session, ref);
    EXPECT_EQ((*model)->weight_cache()->size(), at_load);
  }
}

TEST(SessionTest, PinsItsThreadAndSetsItsThreadCount) {
  auto model = Model::Load(ModelPath("mlp_op13.onnx"));
  ASSERT_TRUE(model.ok());
  const int core = AvailableCpuCount() - 1;
  std::thread([&] {
    auto session = Session::Create(**model, Opts(1, {core}));
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    EXPECT_EQ((*session)->threads(), 1);
    EXPECT_EQ(omp_get_max_threads(), 1);  // what oneDNN's OpenMP runtime sizes its teams by
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    EXPECT_EQ(CPU_COUNT(&set), 1);
    EXPECT_TRUE(CPU_ISSET(core, &set));
  }).join();
  if (kTestThreads == 1 || core == 0) return;
  std::thread([&] {
    auto session = Session::Create(**model, Opts(0, {0, core}));
    ASSERT_TRUE(session.ok());
    EXPECT_EQ((*session)->threads(), 2);  // one per core by default
    EXPECT_FALSE(Session::Create(**model, Opts(0, {100000})).ok());
  }).join();
}

TEST(SessionTest, TwoSessionsOnTwoThreadsShareOneModel) {
  auto model = Model::Load(ModelPath("resnet_op17.onnx"));
  ASSERT_TRUE(model.ok());
  const Reference ref = LoadReference("resnet_op17.b4.sht");
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto session = Session::Create(**model, Opts(1, {i % AvailableCpuCount()}));
      ASSERT_TRUE(session.ok()) << session.status().ToString();
      for (int r = 0; r < 3; ++r) ExpectMatchesReference(**session, ref);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace shoal::engine
