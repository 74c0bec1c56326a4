#include "backends/onnx/onnx_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "backends/backend_registry.h"
#include "backends/onnx/batch_buckets.h"
#include "backends/onnx/gpu_instance.h"
#include "core/npy.h"
#include "engine/precision.h"
#include "engine/test_util.h"

namespace shoal::backends {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace shoal::engine::testing;

// A model repository entry <tmp>/<name>/1/model.onnx holding one of models/.
class OnnxBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("shoal_onnx_backend_test_" + std::to_string(::getpid()));
    fs::create_directories(root_ / "resnet" / "1");
    fs::copy_file(SourceDir() + "/models/resnet_op13.onnx", root_ / "resnet" / "1" / "model.onnx",
                  fs::copy_options::overwrite_existing);
  }
  void TearDown() override { fs::remove_all(root_); }

  ModelInfo Info() const {
    ModelInfo info;
    info.name = "resnet";
    info.version = 1;
    info.model_dir = (root_ / "resnet").string();
    info.version_dir = (root_ / "resnet" / "1").string();
    return info;
  }

  fs::path root_;
};

TEST_F(OnnxBackendTest, MissingConfigIsCompletedFromTheModel) {
  auto model = MakeOnnxBackend()->LoadModel(Info());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const ModelInfo info = (*model)->info();
  EXPECT_EQ(info.max_batch_size, kDefaultMaxBatchSize);
  ASSERT_EQ(info.inputs.size(), 1u);
  EXPECT_EQ(info.inputs[0].name, "input");
  EXPECT_EQ(info.inputs[0].dtype, DataType::kFp32);
  EXPECT_EQ(info.inputs[0].dims, (Shape{3, 32, 32}));
  ASSERT_EQ(info.outputs.size(), 1u);
  EXPECT_EQ(info.outputs[0].name, "logits");
  EXPECT_EQ(info.outputs[0].dims, (Shape{10}));
}

TEST_F(OnnxBackendTest, PartialConfigIsFilledAndContradictionsRejected) {
  ModelInfo partial = Info();
  partial.max_batch_size = 8;
  partial.inputs.push_back(TensorSpec{"input", DataType::kInvalid, {}, false});
  auto model = MakeOnnxBackend()->LoadModel(partial);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->info().max_batch_size, 8);
  EXPECT_EQ((*model)->info().inputs[0].dtype, DataType::kFp32);
  EXPECT_EQ((*model)->info().outputs.size(), 1u);

  ModelInfo wrong_type = partial;
  wrong_type.inputs[0].dtype = DataType::kInt64;
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(wrong_type).status().message(),
              HasSubstr("has data type INT64"));
  ModelInfo wrong_dims = partial;
  wrong_dims.inputs[0].dims = {3, 64, 64};
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(wrong_dims).status().message(),
              HasSubstr("has dims [3,64,64]"));
  ModelInfo unknown = partial;
  unknown.outputs.push_back(TensorSpec{"nope", DataType::kFp32, {1}, false});
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(unknown).status().message(),
              HasSubstr("'nope' is not an output"));
}

TEST_F(OnnxBackendTest, UnbatchedConfigKeepsFullShapes) {
  ModelInfo info = Info();
  info.inputs.push_back(TensorSpec{"input", DataType::kFp32, {}, false});
  auto model = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->info().max_batch_size, 0);
  EXPECT_EQ((*model)->info().inputs[0].dims, (Shape{-1, 3, 32, 32}));
}

// An instance counts the plans it prepared (setups()): a batch size it had not run adds
// one, a cached size none, and a size evicted from the cache one again when it comes back.
TEST_F(OnnxBackendTest, AnInstanceCountsThePlansItPrepared) {
  ModelInfo info = Info();
  info.parameters["max_cached_plans"] = "2";
  auto model = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto instance = (*model)->CreateInstance(InstanceInfo{"resnet_0", 0, {}, 0, -1});
  ASSERT_TRUE(instance.ok()) << instance.status().ToString();
  EXPECT_EQ((*instance)->setups(), 0);
  const std::pair<int64_t, int64_t> steps[] = {{1, 1}, {2, 2}, {1, 2}, {3, 3}, {2, 4}};
  for (const auto& [batch, setups] : steps) {
    ExecuteRequest request;
    request.batch_size = batch;
    request.inputs.push_back({"input", Random({batch, 3, 32, 32}, 5)});
    std::vector<NamedTensor> outputs;
    ASSERT_TRUE((*instance)->Execute(request, &outputs).ok());
    EXPECT_EQ((*instance)->setups(), setups) << "after batch " << batch;
  }
}

TEST_F(OnnxBackendTest, ExecuteMatchesTheReference) {
  auto model = MakeOnnxBackend()->LoadModel(Info());
  ASSERT_TRUE(model.ok());
  auto instance = (*model)->CreateInstance(InstanceInfo{"resnet_0", 0, {}, 0, -1});
  ASSERT_TRUE(instance.ok()) << instance.status().ToString();
  auto ref = ReadTensorFile(SourceDir() + "/models/resnet_op13.b4.sht");
  ASSERT_TRUE(ref.ok());
  ExecuteRequest request;
  request.batch_size = 4;
  Tensor want;
  for (auto& t : *ref) {
    if (t.name == "in:input") request.inputs.push_back({"input", t.tensor});
    if (t.name == "out:logits") want = t.tensor;
  }
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE((*instance)->Execute(request, &outputs).ok());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, "logits");
  EXPECT_LE(MaxAbsDiff(outputs[0].tensor, want), 1e-4f * MaxAbs(want));
  request.inputs[0].tensor = Random({4, 3, 16, 16}, 1);
  EXPECT_EQ((*instance)->Execute(request, &outputs).code(), StatusCode::kInvalidArgument);
}

TEST_F(OnnxBackendTest, MissingFileAndBadParameters) {
  ModelInfo info = Info();
  info.version_dir = (root_ / "resnet" / "2").string();
  EXPECT_EQ(MakeOnnxBackend()->LoadModel(info).status().code(), StatusCode::kNotFound);
  info = Info();
  info.parameters["intra_op_thread_count"] = "many";
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(),
              HasSubstr("intra_op_thread_count"));
  info = Info();
  info.parameters["single_thread_below_flops"] = "-5";
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(),
              HasSubstr("single_thread_below_flops"));
  for (const char* plans : {"0", "-1", "lots", "2000000"}) {
    info = Info();
    info.parameters["max_cached_plans"] = plans;
    EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(),
                HasSubstr("max_cached_plans must be a whole number from 1 to 1048576"))
        << plans;
  }
  info = Info();
  info.parameters["max_cached_plans"] = "1";
  EXPECT_TRUE(MakeOnnxBackend()->LoadModel(info).ok());
  info = Info();
  info.parameters["default_model_filename"] = "../x.onnx";
  EXPECT_FALSE(MakeOnnxBackend()->LoadModel(info).ok());
  info = Info();
  info.parameters["conv_algorithm"] = "fft";
  auto refused = MakeOnnxBackend()->LoadModel(info);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("conv_algorithm must be direct or winograd"));
  info = Info();
  info.parameters["conv_layout"] = "nhwc";
  refused = MakeOnnxBackend()->LoadModel(info);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("conv_layout must be blocked or channels_last; was 'nhwc'"));
  info = Info();
  info.parameters["conv_layout"] = "channels_last";
  EXPECT_TRUE(MakeOnnxBackend()->LoadModel(info).ok());
}

// The trained digits classifier with calibration inputs (100 held-out images) beside it.
class OnnxTierTest : public OnnxBackendTest {
 protected:
  void SetUp() override {
    OnnxBackendTest::SetUp();
    fs::create_directories(root_ / "digits" / "1");
    fs::copy_file(SourceDir() + "/models/digits.onnx", root_ / "digits" / "1" / "model.onnx",
                  fs::copy_options::overwrite_existing);
    auto tensors = ReadTensorFile(SourceDir() + "/models/digits.test.sht");
    ASSERT_TRUE(tensors.ok());
    for (auto& t : *tensors) {
      if (t.name == "in:image") images_ = t.tensor;
      if (t.name == "labels") labels_ = t.tensor;
    }
    Shape s = images_.shape();
    s[0] = 100;
    Tensor first = Tensor::Allocate(DataType::kFp32, s);
    std::memcpy(first.mutable_data(), images_.data(), first.byte_size());
    ASSERT_TRUE(WriteNpz((root_ / "digits" / "calibration.npz").string(), {{"image", first}}).ok());
  }
  ModelInfo Digits(const std::string& precision) const {
    ModelInfo info;
    info.name = "digits";
    info.version = 1;
    info.model_dir = (root_ / "digits").string();
    info.version_dir = (root_ / "digits" / "1").string();
    info.max_batch_size = 64;
    info.parameters["precision"] = precision;
    // These tests judge the tiers' arithmetic: no operator may fall back to fp32 for
    // speed (TierSelectionLoadsATierNoSlowerThanFp32 turns that on).
    info.parameters["tier_operator_selection"] = "false";
    return info;
  }
  // Held-out accuracy of a loaded model over all 450 images.
  double Accuracy(BackendModel& model) {
    auto instance = model.CreateInstance(InstanceInfo{"digits_0", 0, {}, 0, -1});
    EXPECT_TRUE(instance.ok());
    ExecuteRequest request;
    request.batch_size = images_.shape()[0];
    request.inputs.push_back({"image", images_});
    std::vector<NamedTensor> out;
    EXPECT_TRUE((*instance)->Execute(request, &out).ok());
    int correct = 0;
    for (int64_t i = 0; i < request.batch_size; ++i) {
      auto row = out[0].tensor.values<float>().subspan(static_cast<size_t>(i * 10), 10);
      correct +=
          std::max_element(row.begin(), row.end()) - row.begin() == labels_.values<int64_t>()[i];
    }
    return static_cast<double>(correct) / static_cast<double>(request.batch_size);
  }
  Tensor images_, labels_;
};

TEST_F(OnnxTierTest, Int8LoadsWithinItsBoundAndKeepsAccuracy) {
  auto fp32 = MakeOnnxBackend()->LoadModel(Digits("fp32"));
  ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
  ModelInfo info = Digits("int8");
  info.parameters["min_top1_agreement"] = "0.95";
  auto int8 = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(int8.ok()) << int8.status().ToString();
  EXPECT_GE(Accuracy(**int8), Accuracy(**fp32) - 0.02);
}

TEST_F(OnnxTierTest, AVariantBeyondItsBoundIsRefusedWithTheFigure) {
  ModelInfo info = Digits("int8");
  info.parameters["max_abs_diff"] = "0";
  auto refused = MakeOnnxBackend()->LoadModel(info);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("precision int8 against fp32: max |diff| "));
  EXPECT_THAT(refused.status().message(), HasSubstr("top-1 agreement"));
  EXPECT_THAT(refused.status().message(), HasSubstr("refused"));
}

TEST_F(OnnxTierTest, RequestsPickATierThatTheConfigLoaded) {
  ModelInfo info = Digits("fp32");
  info.parameters["precision_tiers"] = "int8";
  auto model = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto instance = (*model)->CreateInstance(InstanceInfo{"digits_0", 0, {}, 0, -1});
  ASSERT_TRUE(instance.ok());
  ExecuteRequest request;
  request.batch_size = images_.shape()[0];
  request.inputs.push_back({"image", images_});
  std::vector<NamedTensor> fp32, int8, again;
  ASSERT_TRUE((*instance)->Execute(request, &fp32).ok());
  request.variant = "int8";
  ASSERT_TRUE((*instance)->Execute(request, &int8).ok());
  const float diff = MaxAbsDiff(fp32[0].tensor, int8[0].tensor);
  EXPECT_GT(diff, 0.f) << "the int8 tier ran fp32";
  EXPECT_LT(diff, 0.1f * MaxAbs(fp32[0].tensor));
  request.variant = "fp32";
  ASSERT_TRUE((*instance)->Execute(request, &again).ok());
  EXPECT_EQ(MaxAbsDiff(fp32[0].tensor, again[0].tensor), 0.f);
  request.variant = "bf16";
  Status s = (*instance)->Execute(request, &again);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'bf16' is not loaded"));
  EXPECT_THAT(s.message(), HasSubstr("fp32, int8"));
}

// Whether the int8 digits classifier pays at batch 1 depends on the machine (it does not
// where the issue measured it); the selection logic itself is tested with made-up
// timings in engine_precision_test. Here: the load goes through it, and the tier it keeps
// is either int8 within its bound or, where int8 did not pay, exactly fp32's arithmetic.
TEST_F(OnnxTierTest, TierSelectionLoadsATierNoSlowerThanFp32) {
  ModelInfo info = Digits("fp32");
  info.parameters["precision_tiers"] = "int8";
  info.parameters["tier_operator_selection"] = "true";
  auto model = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto instance = (*model)->CreateInstance(InstanceInfo{"digits_0", 0, {}, 0, -1});
  ASSERT_TRUE(instance.ok());
  ExecuteRequest request;
  request.batch_size = images_.shape()[0];
  request.inputs.push_back({"image", images_});
  std::vector<NamedTensor> fp32, int8;
  ASSERT_TRUE((*instance)->Execute(request, &fp32).ok());
  request.variant = "int8";
  ASSERT_TRUE((*instance)->Execute(request, &int8).ok());
  EXPECT_LT(MaxAbsDiff(fp32[0].tensor, int8[0].tensor), 0.1f * MaxAbs(fp32[0].tensor));
  info.parameters["tier_operator_selection"] = "maybe";
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(),
              HasSubstr("tier_operator_selection must be true or false"));
}

TEST_F(OnnxTierTest, BadTierParametersAndMissingCalibrationFail) {
  ModelInfo info = Digits("fp8");
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(),
              HasSubstr("fp32, bf16 or int8"));
  info = Digits("int8");
  info.parameters["min_top1_agreement"] = "99";
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(), HasSubstr("fraction"));
  info = Digits("int8");
  info.parameters["calibration_file"] = "missing.npz";
  EXPECT_THAT(MakeOnnxBackend()->LoadModel(info).status().message(),
              HasSubstr("needs calibration inputs"));
}

TEST_F(OnnxTierTest, Bf16LoadsWhereTheCpuHasIt) {
  ModelInfo info = Digits("bf16");
  info.parameters["min_top1_agreement"] = "0.95";
  auto bf16 = MakeOnnxBackend()->LoadModel(info);
  if (!engine::CheckPrecision(engine::Precision::kBf16).ok()) {
    EXPECT_EQ(bf16.status().code(), StatusCode::kFailedPrecondition);
    return;
  }
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  EXPECT_GE(Accuracy(**bf16), 0.9);
}

TEST(OnnxBackendRegistryTest, TritonPlatformNameFindsTheBackend) {
  BackendRegistry registry;
  RegisterOnnxBackend(&registry);
  auto by_alias = registry.Find("onnxruntime_onnx", "");
  ASSERT_TRUE(by_alias.ok()) << by_alias.status().ToString();
  EXPECT_EQ((*by_alias)->name(), "onnx");
  auto by_name = registry.Find("onnx", "");
  ASSERT_TRUE(by_name.ok());
  EXPECT_EQ(by_name->get(), by_alias->get());
}

}  // namespace
}  // namespace shoal::backends

namespace shoal::backends {
namespace {

// pipeline_stages: the model runs as stages on their own threads (engine/pipeline_session.h).
class OnnxPipelineTest : public OnnxBackendTest {
 protected:
  ModelInfo Pipelined(std::map<std::string, std::string> parameters) const {
    ModelInfo info = Info();
    info.parameters = std::move(parameters);
    return info;
  }
  static void ExpectRunsLikeReference(BackendModel& model) {
    auto instance = model.CreateInstance(InstanceInfo{"resnet_0", 0, {}, 2, -1});
    ASSERT_TRUE(instance.ok()) << instance.status().ToString();
    const Reference ref = LoadReference("resnet_op13.b4.sht");
    for (int run = 0; run < 2; ++run) {
      ExecuteRequest request;
      request.batch_size = 4;
      request.inputs = ref.inputs;
      std::vector<NamedTensor> outputs;
      Status s = (*instance)->Execute(request, &outputs);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(outputs.size(), ref.outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i) {
        EXPECT_EQ(outputs[i].name, ref.outputs[i].name);
        const float scale = std::max(MaxAbs(ref.outputs[i].tensor), 1e-6f);
        EXPECT_LE(MaxAbsDiff(outputs[i].tensor, ref.outputs[i].tensor), 1e-4f * scale);
      }
    }
    const double bubble = (*instance)->pipeline_bubble_ratio();
    EXPECT_GE(bubble, 0.0);
    EXPECT_LE(bubble, 1.0);
  }
};

TEST_F(OnnxPipelineTest, AutoBalancedStagesMatchTheReference) {
  auto model = MakeOnnxBackend()->LoadModel(
      Pipelined({{"pipeline_stages", "3"}, {"pipeline_micro_batches", "2"}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->info().max_batch_size, kDefaultMaxBatchSize);
  ExpectRunsLikeReference(**model);
  auto adaptive = MakeOnnxBackend()->LoadModel(
      Pipelined({{"pipeline_stages", "2"}, {"pipeline_micro_batches", "auto"}}));
  ASSERT_TRUE(adaptive.ok()) << adaptive.status().ToString();
  ExpectRunsLikeReference(**adaptive);
}

TEST_F(OnnxPipelineTest, StagesCutAtNamedNodes) {
  auto whole = engine::Model::Load((root_ / "resnet" / "1" / "model.onnx").string());
  ASSERT_TRUE(whole.ok());
  const auto& nodes = (*whole)->graph().nodes;
  ASSERT_GT(nodes.size(), 10u);
  const std::string names = nodes[4].name + ", " + nodes[9].name;
  auto model = MakeOnnxBackend()->LoadModel(Pipelined({{"pipeline_stage_boundaries", names}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ExpectRunsLikeReference(**model);
  // pipeline_stages, when given too, must agree with the names.
  auto agree = MakeOnnxBackend()->LoadModel(
      Pipelined({{"pipeline_stages", "3"}, {"pipeline_stage_boundaries", names}}));
  EXPECT_TRUE(agree.ok()) << agree.status().ToString();
}

TEST_F(OnnxPipelineTest, WholeModelInstancesReportNoBubble) {
  auto model = MakeOnnxBackend()->LoadModel(Info());
  ASSERT_TRUE(model.ok());
  auto instance = (*model)->CreateInstance(InstanceInfo{"resnet_0", 0, {}, 1, -1});
  ASSERT_TRUE(instance.ok());
  EXPECT_EQ((*instance)->pipeline_bubble_ratio(), -1);
}

TEST_F(OnnxPipelineTest, BadPipelineParametersAreRefusedByName) {
  struct Case {
    std::map<std::string, std::string> parameters;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"pipeline_stages", "0"}}, "pipeline_stages must be a whole number from 1 to 1024"},
      {{{"pipeline_stages", "two"}}, "was 'two'"},
      {{{"pipeline_stages", "4x"}}, "was '4x'"},
      {{{"pipeline_stages", "1000"}}, "larger than the model's node count"},
      {{{"pipeline_stages", "2"}, {"pipeline_micro_batches", "0"}},
       "pipeline_micro_batches must be a whole number from 1"},
      {{{"pipeline_stage_boundaries", "no_such_node"}}, "'no_such_node' is not a node"},
      {{{"pipeline_stage_boundaries", "a,,b"}}, "empty node name"},
      {{{"pipeline_stages", "2"}, {"pipeline_stage_boundaries", "a,b"}},
       "pipeline_stages is 2 but pipeline_stage_boundaries names 2 boundaries"},
  };
  for (const Case& c : cases) {
    auto model = MakeOnnxBackend()->LoadModel(Pipelined(c.parameters));
    ASSERT_FALSE(model.ok()) << c.message;
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(model.status().message(), HasSubstr(c.message));
  }
}

// Models whose outputs are not batch-major (models/generate_sampling.py): batching is
// refused by name, and without it they serve.
class NotBatchMajorTest : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(root_); }

  ModelInfo Install(const std::string& file, int max_batch_size) {
    const std::string name = file.substr(0, file.find('.'));
    fs::create_directories(root_ / name / "1");
    fs::copy_file(SourceDir() + "/models/" + file, root_ / name / "1" / "model.onnx",
                  fs::copy_options::overwrite_existing);
    ModelInfo info;
    info.name = name;
    info.version = 1;
    info.model_dir = (root_ / name).string();
    info.version_dir = (root_ / name / "1").string();
    info.max_batch_size = max_batch_size;
    return info;
  }

  fs::path root_ =
      fs::temp_directory_path() / ("shoal_not_batch_major_test_" + std::to_string(::getpid()));
};

TEST_F(NotBatchMajorTest, BatchingIsRefusedNamingTheOutput) {
  auto nms = MakeOnnxBackend()->LoadModel(Install("nms_batch.onnx", 4));
  ASSERT_FALSE(nms.ok());
  EXPECT_EQ(nms.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(nms.status().message(), HasSubstr("max_batch_size is 4 but output "
                                                "'selected_indices' [num_selected,3] is not "
                                                "batch-major"));
  EXPECT_THAT(nms.status().message(), HasSubstr("set max_batch_size to 0"));
  // [4 * batch]: symbolic, but not the batch dimension.
  auto flat = MakeOnnxBackend()->LoadModel(Install("flatten_batch.onnx", 2));
  ASSERT_FALSE(flat.ok());
  EXPECT_THAT(flat.status().message(), HasSubstr("output 'y'"));
}

TEST_F(NotBatchMajorTest, UnbatchedItServesAndIsNotBatchedAutomatically) {
  auto model = MakeOnnxBackend()->LoadModel(Install("nms_batch.onnx", 0));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->info().max_batch_size, 0);  // the config said nothing: not batched
  auto instance = (*model)->CreateInstance(InstanceInfo{"nms_0", 0, {}, 0, -1});
  ASSERT_TRUE(instance.ok()) << instance.status().ToString();
  // Two images of six boxes; in each, boxes 0 and 1 overlap (IoU 0.81), the others are
  // apart.
  std::vector<float> boxes, scores;
  for (int b = 0; b < 2; ++b) {
    for (float x : {0.f, 0.f, 10.f, 10.f, 0.f, 0.f, 9.f, 9.f, 20.f, 20.f, 30.f, 30.f})
      boxes.push_back(x);
    for (int i = 0; i < 3; ++i)
      for (float x : {100.f, 100.f, 101.f, 101.f}) boxes.push_back(x + static_cast<float>(i) * 5);
    for (float x : {0.9f, 0.8f, 0.7f, 0.3f, 0.2f, 0.1f}) scores.push_back(x);
  }
  ExecuteRequest request;
  request.batch_size = 1;
  request.inputs.push_back({"boxes", F32({2, 6, 4}, boxes)});
  request.inputs.push_back({"scores", F32({2, 1, 6}, scores)});
  std::vector<NamedTensor> outputs;
  Status s = (*instance)->Execute(request, &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, "selected_indices");
  // Three per image at most (the model's limit): boxes 0, 2 and 3 by score, box 1
  // suppressed by box 0.
  EXPECT_EQ(outputs[0].tensor.shape(), (Shape{6, 3}));
  EXPECT_THAT(IntValues(outputs[0].tensor),
              ::testing::ElementsAre(0, 0, 0, 0, 0, 2, 0, 0, 3, 1, 0, 0, 1, 0, 2, 1, 0, 3));
}

// ---- KIND_GPU instances (gpu_instance.h) ----

// The example recommender, loaded from the repository's examples with no config.
ModelInfo ExampleInfo(const std::string& name, std::map<std::string, std::string> parameters = {}) {
  ModelInfo info;
  info.name = name;
  info.version = 1;
  info.model_dir = SourceDir() + "/examples/models/" + name;
  info.version_dir = info.model_dir + "/1";
  info.parameters = std::move(parameters);
  return info;
}

InstanceInfo OnGpu(int gpu) {
  InstanceInfo info{"m_0", 0, {}, 0, gpu};
  return info;
}

// Where the GPU instance cannot be: built without CUDA, or no device here (these build
// machines). Records why and returns true when the test should stop.
bool NoGpuHere(const Status& created) {
  if (!GpuInstancesBuilt()) {
    EXPECT_EQ(created.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(created.message(), HasSubstr("built without the CUDA path"));
    EXPECT_THAT(created.message(), HasSubstr("docs/gpu.md"));
    return true;
  }
  if (created.code() == StatusCode::kUnavailable) {
    EXPECT_THAT(created.message(), HasSubstr("GPU 0: no usable CUDA device"));
    return true;
  }
  return false;
}

TEST(OnnxBackendGpuTest, AGpuInstanceAnswersAsTheCpuInstanceDoes) {
  auto model = MakeOnnxBackend()->LoadModel(ExampleInfo("recommender"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto gpu = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(gpu.status())) GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {}, 0, -1});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  // A new shape, another, a cached one, the first again: new rows every time, so a cached
  // plan that kept a run's bytes would show.
  const int64_t batches[] = {1, 5, 4, 5, 1};
  for (uint32_t i = 0; i < 5; ++i) {
    const int64_t batch = batches[i];
    ExecuteRequest request;
    request.batch_size = batch;
    request.inputs.push_back({"features", Random({batch, 64}, 100 + i)});
    std::vector<NamedTensor> on_gpu, on_cpu;
    Status ran = (*gpu)->Execute(request, &on_gpu);
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    ASSERT_TRUE((*cpu)->Execute(request, &on_cpu).ok());
    ASSERT_EQ(on_gpu.size(), 1u);
    EXPECT_EQ(on_gpu[0].name, "score");
    EXPECT_EQ(on_gpu[0].tensor.shape(), (Shape{batch, 1}));
    EXPECT_LE(MaxAbsDiff(on_gpu[0].tensor, on_cpu[0].tensor), 1e-5f) << "batch " << batch;
  }
  ExecuteRequest int8;
  int8.batch_size = 1;
  int8.variant = "int8";
  int8.inputs.push_back({"features", Random({1, 64}, 1)});
  std::vector<NamedTensor> out;
  const Status refused = (*gpu)->Execute(int8, &out);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("GPU instances"));
  ExecuteRequest wrong;
  wrong.batch_size = 1;
  wrong.inputs.push_back({"features", Random({1, 63}, 1)});
  EXPECT_EQ((*gpu)->Execute(wrong, &out).code(), StatusCode::kInvalidArgument);
}

// Runs `request` on a GPU instance and on a CPU instance of one model and expects the same
// answer: the same outputs by name and shape, fp32 within `tolerance` of each output's
// scale (at least 1), every other type bit for bit.
void ExpectSameAnswer(BackendInstance& gpu, BackendInstance& cpu, const ExecuteRequest& request,
                      float tolerance) {
  std::vector<NamedTensor> on_gpu, on_cpu;
  const Status ran = gpu.Execute(request, &on_gpu);
  ASSERT_TRUE(ran.ok()) << ran.ToString();
  ASSERT_TRUE(cpu.Execute(request, &on_cpu).ok());
  ASSERT_EQ(on_gpu.size(), on_cpu.size());
  for (size_t o = 0; o < on_cpu.size(); ++o) {
    EXPECT_EQ(on_gpu[o].name, on_cpu[o].name);
    ASSERT_EQ(on_gpu[o].tensor.shape(), on_cpu[o].tensor.shape()) << on_cpu[o].name;
    ASSERT_EQ(on_gpu[o].tensor.dtype(), on_cpu[o].tensor.dtype()) << on_cpu[o].name;
    if (on_cpu[o].tensor.dtype() == DataType::kFp32) {
      EXPECT_LE(MaxAbsDiff(on_gpu[o].tensor, on_cpu[o].tensor),
                tolerance * std::max(1.f, MaxAbs(on_cpu[o].tensor)))
          << on_cpu[o].name;
    } else {
      EXPECT_EQ(on_gpu[o].tensor.bytes(), on_cpu[o].tensor.bytes()) << on_cpu[o].name;
    }
  }
}

// The image classifier's convolutions on cuDNN (the default where it loads, and asked for)
// and on im2col answer as the CPU instance does.
TEST(OnnxBackendGpuTest, ConvolutionsOnCudnnAndOnIm2ColAnswerAsTheCpuInstanceDoes) {
  for (const char* conv : {"auto", "cudnn", "im2col"}) {
    SCOPED_TRACE(conv);
    auto model =
        MakeOnnxBackend()->LoadModel(ExampleInfo("image_classifier", {{"gpu_convolution", conv}}));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto gpu = (*model)->CreateInstance(OnGpu(0));
    if (NoGpuHere(gpu.status()))
      GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    auto cpu = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {}, 0, -1});
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    for (int64_t batch : {1, 3}) {
      SCOPED_TRACE(batch);
      ExecuteRequest request;
      request.batch_size = batch;
      request.inputs.push_back({"image", Random({batch, 3, 32, 32}, 300 + batch, 0.f, 1.f)});
      ExpectSameAnswer(**gpu, **cpu, request, 1e-4f);
    }
  }
}

// gpu_tensor_parallel 2 on one GPU: the recommender's products of 1024 and 512 columns
// split in two, each half on a stream of its own; the answers are the CPU instance's.
TEST(OnnxBackendGpuTest, ATensorParallelGpuInstanceAnswersAsTheCpuInstanceDoes) {
  auto model = MakeOnnxBackend()->LoadModel(ExampleInfo(
      "recommender", {{"gpu_tensor_parallel", "2"}, {"gpu_tensor_parallel_min_columns", "256"}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto gpu = (*model)->CreateInstance(InstanceInfo{"m_0", 0, {}, 0, 0, {0}});
  if (NoGpuHere(gpu.status())) GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {}, 0, -1});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  for (int64_t batch : {1, 7, 7}) {
    ExecuteRequest request;
    request.batch_size = batch;
    request.inputs.push_back({"features", Random({batch, 64}, 300 + static_cast<uint32_t>(batch))});
    std::vector<NamedTensor> on_gpu, on_cpu;
    const Status ran = (*gpu)->Execute(request, &on_gpu);
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    ASSERT_TRUE((*cpu)->Execute(request, &on_cpu).ok());
    ASSERT_EQ(on_gpu.size(), 1u);
    EXPECT_LE(MaxAbsDiff(on_gpu[0].tensor, on_cpu[0].tensor), 1e-5f) << "batch " << batch;
  }
}

// Two instances of one model on one GPU hold its weights once: each reports the same shared
// copy, its own memory (its plans) apart from it, and both answer as the CPU does.
TEST(OnnxBackendGpuTest, InstancesOnOneGpuShareTheModelsWeights) {
  auto model = MakeOnnxBackend()->LoadModel(ExampleInfo("recommender"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto a = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(a.status())) GTEST_SKIP() << "no GPU instance here: " << a.status().ToString();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {}, 0, 0});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto cpu = (*model)->CreateInstance(InstanceInfo{"m_2", 2, {}, 0, -1});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ExecuteRequest request;
  request.batch_size = 3;
  request.inputs.push_back({"features", Random({3, 64}, 400)});
  std::vector<NamedTensor> on_a, on_b, on_cpu;
  ASSERT_TRUE((*a)->Execute(request, &on_a).ok());
  ASSERT_TRUE((*b)->Execute(request, &on_b).ok());
  ASSERT_TRUE((*cpu)->Execute(request, &on_cpu).ok());
  EXPECT_LE(MaxAbsDiff(on_a[0].tensor, on_cpu[0].tensor), 1e-5f);
  EXPECT_LE(MaxAbsDiff(on_b[0].tensor, on_cpu[0].tensor), 1e-5f);
  const DeviceStats sa = (*a)->device_stats(), sb = (*b)->device_stats();
  ASSERT_EQ(sa.shared_weights_bytes.size(), 1u);        // GPU 0 only
  EXPECT_GT(sa.shared_weights_bytes.at(0), 6'000'000);  // four weights and biases, fp32
  EXPECT_EQ(sb.shared_weights_bytes, sa.shared_weights_bytes);
  EXPECT_GT(sa.memory_bytes, 0);  // its plans' arenas and workspaces
  a->reset();                     // the survivor's copy stays
  EXPECT_EQ((*b)->device_stats().shared_weights_bytes, sb.shared_weights_bytes);
  // A tensor-parallel instance on GPU 0 alone: its shards' columns are the same model's
  // weights on GPU 0, reported under it once.
  auto tp = MakeOnnxBackend()->LoadModel(ExampleInfo(
      "recommender", {{"gpu_tensor_parallel", "2"}, {"gpu_tensor_parallel_min_columns", "256"}}));
  ASSERT_TRUE(tp.ok()) << tp.status().ToString();
  auto split = (*tp)->CreateInstance(InstanceInfo{"t_0", 0, {}, 0, 0, {0}});
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  std::vector<NamedTensor> split_out;
  ASSERT_TRUE((*split)->Execute(request, &split_out).ok());
  EXPECT_EQ((*split)->device_stats().shared_weights_bytes.size(), 1u);
  std::vector<NamedTensor> again;
  ASSERT_TRUE((*b)->Execute(request, &again).ok());
  EXPECT_LE(MaxAbsDiff(again[0].tensor, on_cpu[0].tensor), 1e-5f);
}

// A GPU instance pipelines two batches (backend.h's Launch and Finish). Each answer is bit
// for bit what Execute of that batch alone gives: A launched, C executed while A is
// outstanding (as the runtime may), then A finished; A and B launched, then finished in
// order; A launched, then a batch of a new shape (a new plan, made while A is in flight)
// launched; A launched, then batches of nine other shapes executed, evicting every other
// plan from the cache but A's. Each on_done is called once, before its Finish returns; a
// third launch, a launch of another precision tier and a Finish with nothing launched are
// refused, and a refused launch's on_done is never called.
TEST(OnnxBackendGpuTest, AGpuInstancePipelinesTwoBatches) {
  auto model = MakeOnnxBackend()->LoadModel(ExampleInfo("recommender"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto created = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(created.status()))
    GTEST_SKIP() << "no GPU instance here: " << created.status().ToString();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  BackendInstance& gpu = **created;
  EXPECT_EQ(gpu.pipeline_depth(), 2);
  auto request = [](int64_t batch, uint32_t seed) {
    ExecuteRequest r;
    r.batch_size = batch;
    r.inputs.push_back({"features", Random({batch, 64}, seed)});
    return r;
  };
  const ExecuteRequest a = request(4, 500), b = request(4, 501), c = request(4, 502),
                       d = request(9, 503);
  // Each alone, the reference (a plan's first batch runs step by step, later ones as CUDA
  // graphs: the same kernels, the same bits).
  std::map<const ExecuteRequest*, Tensor> alone;
  auto execute_alone = [&](const ExecuteRequest& r) {
    std::vector<NamedTensor> out;
    const Status ran = gpu.Execute(r, &out);
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    ASSERT_EQ(out.size(), 1u);
    alone[&r] = std::move(out[0].tensor);
  };
  for (const ExecuteRequest* r : {&a, &b, &c}) execute_alone(*r);
  auto expect_answer = [&](const std::vector<NamedTensor>& out, const ExecuteRequest& r,
                           const char* what) {
    ASSERT_EQ(out.size(), 1u) << what;
    EXPECT_EQ(out[0].name, "score") << what;
    const Tensor& want = alone.at(&r);
    ASSERT_EQ(out[0].tensor.shape(), want.shape()) << what;
    EXPECT_EQ(std::memcmp(out[0].tensor.data(), want.data(), want.byte_size()), 0) << what;
  };
  std::atomic<int> woken{0}, woken_refused{0};
  auto wake = [&] { ++woken; };
  // A launched, C executed beside it, A finished.
  {
    ASSERT_TRUE(gpu.Launch(a, wake).ok());
    std::vector<NamedTensor> out_c, out_a;
    const Status executed = gpu.Execute(c, &out_c);
    ASSERT_TRUE(executed.ok()) << executed.ToString();
    expect_answer(out_c, c, "C executed while A is launched");
    const Status finished = gpu.Finish(&out_a);
    ASSERT_TRUE(finished.ok()) << finished.ToString();
    EXPECT_EQ(woken.load(), 1);
    expect_answer(out_a, a, "A finished after C");
  }
  // A and B launched, a third refused, both finished in order.
  {
    ASSERT_TRUE(gpu.Launch(a, wake).ok());
    ASSERT_TRUE(gpu.Launch(b, wake).ok());
    EXPECT_EQ(gpu.Launch(c, [&] { ++woken_refused; }).code(), StatusCode::kFailedPrecondition);
    std::vector<NamedTensor> first, second;
    Status finished = gpu.Finish(&first);
    ASSERT_TRUE(finished.ok()) << finished.ToString();
    EXPECT_GE(woken.load(), 2);
    finished = gpu.Finish(&second);
    ASSERT_TRUE(finished.ok()) << finished.ToString();
    EXPECT_EQ(woken.load(), 3);
    expect_answer(first, a, "A, finished first");
    expect_answer(second, b, "B, finished second");
  }
  // Two plans in flight: A, and D of a new shape.
  {
    ASSERT_TRUE(gpu.Launch(a, wake).ok());
    ASSERT_TRUE(gpu.Launch(d, wake).ok());
    std::vector<NamedTensor> first, second;
    ASSERT_TRUE(gpu.Finish(&first).ok());
    ASSERT_TRUE(gpu.Finish(&second).ok());
    EXPECT_EQ(woken.load(), 5);
    execute_alone(d);
    expect_answer(first, a, "A beside D");
    expect_answer(second, d, "D beside A");
  }
  // A's plan survives the cache's evictions while A is launched.
  {
    ASSERT_TRUE(gpu.Launch(a, wake).ok());
    for (int64_t batch = 10; batch < 10 + static_cast<int64_t>(kMaxGpuPlans) + 1; ++batch) {
      std::vector<NamedTensor> out;
      const Status ran = gpu.Execute(request(batch, 600), &out);
      ASSERT_TRUE(ran.ok()) << "batch " << batch << ": " << ran.ToString();
    }
    std::vector<NamedTensor> out_a;
    const Status finished = gpu.Finish(&out_a);
    ASSERT_TRUE(finished.ok()) << finished.ToString();
    EXPECT_EQ(woken.load(), 6);
    expect_answer(out_a, a, "A after the evictions");
  }
  // Refusals launch nothing.
  ExecuteRequest int8 = request(4, 504);
  int8.variant = "int8";
  EXPECT_EQ(gpu.Launch(int8, [&] { ++woken_refused; }).code(), StatusCode::kInvalidArgument);
  std::vector<NamedTensor> none;
  EXPECT_EQ(gpu.Finish(&none).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(woken_refused.load(), 0);
  EXPECT_EQ(woken.load(), 6);
}

// gpu_pipeline_depth 1: the instance runs each batch alone, through Execute only.
TEST(OnnxBackendGpuTest, PipelineDepthOneTurnsPipeliningOff) {
  auto model =
      MakeOnnxBackend()->LoadModel(ExampleInfo("recommender", {{"gpu_pipeline_depth", "1"}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto created = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(created.status()))
    GTEST_SKIP() << "no GPU instance here: " << created.status().ToString();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ((*created)->pipeline_depth(), 1);
  ExecuteRequest r;
  r.batch_size = 2;
  r.inputs.push_back({"features", Random({2, 64}, 7)});
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*created)->Execute(r, &out).ok());
  EXPECT_EQ(out.size(), 1u);
}

// The tensor-parallel, pipelining and batch-bucket parameters are checked for form, with or
// without a device.
TEST(OnnxBackendGpuTest, GpuParametersAreCheckedForForm) {
  for (const auto& [key, value] :
       {std::pair{"gpu_tensor_parallel", "0"}, std::pair{"gpu_tensor_parallel", "32"},
        std::pair{"gpu_tensor_parallel_min_columns", "many"}, std::pair{"gpu_pipeline_depth", "0"},
        std::pair{"gpu_pipeline_depth", "3"}, std::pair{"gpu_batch_buckets", "4,2"},
        std::pair{"gpu_batch_buckets", "1,8"}, std::pair{"gpu_convolution", "winograd"},
        std::pair{"gpu_convolution_algorithm", "fastest"},
        std::pair{"gpu_convolution_layout", "nhwc"}, std::pair{"gpu_cpu_tail", "yes"}}) {
    SCOPED_TRACE(std::string(key) + " " + value);
    auto model = MakeOnnxBackend()->LoadModel(ExampleInfo("recommender", {{key, value}}));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto gpu = (*model)->CreateInstance(OnGpu(0));
    ASSERT_FALSE(gpu.ok());
    if (!GpuInstancesBuilt()) {
      EXPECT_EQ(gpu.status().code(), StatusCode::kFailedPrecondition);
      continue;
    }
    EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(gpu.status().message(), HasSubstr(std::string("parameter ") + key));
  }
}

// A batching model's batch of n rows runs on the plan of its batch bucket, made when the
// instance was: every size from 1 to max_batch_size answers as the CPU does with n rows,
// and none adds a plan (the instance's device memory stays). With gpu_batch_buckets
// "exact" a size of its own does.
TEST(OnnxBackendGpuTest, EveryBatchSizeRunsOnItsBucketsPlan) {
  for (const char* buckets : {"auto", "exact"}) {
    SCOPED_TRACE(buckets);
    ModelInfo info = ExampleInfo("recommender", {{"gpu_batch_buckets", buckets}});
    info.max_batch_size = 32;
    auto model = MakeOnnxBackend()->LoadModel(info);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto gpu = (*model)->CreateInstance(OnGpu(0));
    if (NoGpuHere(gpu.status()))
      GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    auto cpu = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {}, 0, -1});
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    auto run = [&](int64_t batch) {
      ExecuteRequest request;
      request.batch_size = batch;
      request.inputs.push_back(
          {"features", Random({batch, 64}, 700 + static_cast<uint32_t>(batch))});
      std::vector<NamedTensor> on_gpu, on_cpu;
      const Status ran = (*gpu)->Execute(request, &on_gpu);
      ASSERT_TRUE(ran.ok()) << ran.ToString();
      ASSERT_TRUE((*cpu)->Execute(request, &on_cpu).ok());
      ASSERT_EQ(on_gpu.size(), 1u);
      EXPECT_EQ(on_gpu[0].tensor.shape(), (Shape{batch, 1}));
      EXPECT_LE(MaxAbsDiff(on_gpu[0].tensor, on_cpu[0].tensor), 1e-5f) << "batch " << batch;
    };
    const int64_t created = (*gpu)->device_stats().memory_bytes;
    for (int64_t b : DefaultBatchBuckets(32)) run(b);
    const int64_t memory = (*gpu)->device_stats().memory_bytes;
    if (std::string(buckets) == "auto") {
      EXPECT_EQ(memory, created) << "every bucket's plan was made with the instance";
      // Largest first: each batch finds a larger one's rows in its plan's buffers.
      for (int64_t b = 32; b >= 1; --b) run(b);
      EXPECT_EQ((*gpu)->device_stats().memory_bytes, memory);
    } else {
      // A plan of its own for 3 rows, in place of the least recently used (batch 1's).
      run(3);
      EXPECT_GT((*gpu)->device_stats().memory_bytes, memory) << "batch 3's own plan";
    }
  }
}

TEST(OnnxBackendGpuTest, GpuPrecisionMustNameAGpuTier) {
  auto model =
      MakeOnnxBackend()->LoadModel(ExampleInfo("recommender", {{"gpu_precision", "int4"}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto gpu = (*model)->CreateInstance(OnGpu(0));
  ASSERT_FALSE(gpu.ok());
  if (!GpuInstancesBuilt()) {
    EXPECT_EQ(gpu.status().code(), StatusCode::kFailedPrecondition);
    return;
  }
  EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu.status().message(),
              HasSubstr("gpu_precision must be fp32, tf32, fp16, bf16 or int8; was 'int4'"));
}

// A 16-bit or int8 GPU tier is measured at load (and int8 calibrated), so it needs
// calibration inputs as the CPU tiers do; asked for without them, the instance is refused
// naming the file, with or without CUDA.
TEST(OnnxBackendGpuTest, AReducedGpuTierNeedsCalibrationInputs) {
  for (const std::string tier : {"bf16", "int8"}) {
    SCOPED_TRACE(tier);
    auto model = MakeOnnxBackend()->LoadModel(
        ExampleInfo("recommender", {{"gpu_precision", tier}, {"calibration_file", "missing.npz"}}));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto gpu = (*model)->CreateInstance(OnGpu(0));
    ASSERT_FALSE(gpu.ok());
    EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(gpu.status().message(), HasSubstr("gpu_precision " + tier +
                                                  " needs calibration inputs: put 'missing.npz'"));
  }
}

TEST(OnnxBackendGpuTest, AModelTheGpuPathCannotRunFailsWhenItsInstanceIsCreated) {
  // A control-flow test model with an If, which has no GPU kernel yet.
  ModelInfo info;
  info.name = "cf_graph_if";
  info.version = 1;
  info.model_dir = SourceDir() + "/models";
  info.version_dir = info.model_dir;
  info.parameters = {{"default_model_filename", "cf_graph_if.onnx"}};
  auto model = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto gpu = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(gpu.status())) GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(gpu.status().message(), HasSubstr("the GPU path cannot run this model yet"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("(If)"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("gpu_cpu_tail: true"));
}

// A test model from models/, loaded with `parameters`.
ModelInfo TestModelInfo(const std::string& name, std::map<std::string, std::string> parameters) {
  ModelInfo info;
  info.name = name;
  info.version = 1;
  info.model_dir = SourceDir() + "/models";
  info.version_dir = info.model_dir;
  info.parameters = std::move(parameters);
  info.parameters["default_model_filename"] = name + ".onnx";
  return info;
}

// gpu_cpu_tail: a detector's backbone on the GPU, its NMS and what follows on the CPU,
// answering as a CPU instance does on both reference inputs.
TEST(OnnxBackendGpuTest, ACpuTailRunsWhatTheGpuPathCannot) {
  // Without the parameter the detector is refused, naming its NonMaxSuppression.
  auto whole = MakeOnnxBackend()->LoadModel(TestModelInfo("det_detector_op13", {}));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto refused = (*whole)->CreateInstance(OnGpu(0));
  if (NoGpuHere(refused.status()))
    GTEST_SKIP() << "no GPU instance here: " << refused.status().ToString();
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(refused.status().message(), HasSubstr("NonMaxSuppression"));
  auto model =
      MakeOnnxBackend()->LoadModel(TestModelInfo("det_detector_op13", {{"gpu_cpu_tail", "true"}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto gpu = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(gpu.status())) GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {}, 0, -1});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  for (const char* ref : {".a.sht", ".b.sht"}) {
    const engine::testing::Reference r =
        engine::testing::LoadReference(std::string("det_detector_op13") + ref);
    SCOPED_TRACE(ref);
    ExecuteRequest request;
    request.batch_size = r.inputs.empty() ? 0 : r.inputs[0].tensor.shape()[0];
    request.inputs = r.inputs;
    ExpectSameAnswer(**gpu, **cpu, request, 1e-4f);
  }
}

// `shoal inspect --gpu`: what the GPU path makes of a model, on the host.
TEST(OnnxBackendGpuTest, DescribeGpuPathSaysWhatRunsOnTheGpu) {
  auto rec = engine::Model::Load(SourceDir() + "/examples/models/recommender/1/model.onnx");
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  auto text = DescribeGpuPath(**rec, 32);
  if (!GpuInstancesBuilt()) {
    EXPECT_EQ(text.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(text.status().message(), HasSubstr("without the CUDA path"));
    return;
  }
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_THAT(*text, HasSubstr("GPU path (batch 32"));
  EXPECT_THAT(*text, HasSubstr("lowers whole: "));
  EXPECT_THAT(*text, HasSubstr("(4 GEMMs"));
  // Three of the four products in int8; the last, of one output column, fp32.
  EXPECT_THAT(*text, HasSubstr("in int8 (gpu_precision int8): 3 of 4 products and convolutions"));
  EXPECT_THAT(*text, HasSubstr("n = 1 must be multiples of 8"));
  EXPECT_THAT(*text, ::testing::Not(HasSubstr("--batch N")));
  // At batch 1 every product has too few rows, and the text says how to ask about more.
  text = DescribeGpuPath(**rec, 1);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_THAT(*text, HasSubstr("0 of 4 products and convolutions"));
  EXPECT_THAT(*text, HasSubstr("1 row, fewer than the 17"));
  EXPECT_THAT(*text, HasSubstr("--batch N says what a batch of N takes"));
  auto det = engine::Model::Load(SourceDir() + "/models/det_detector_op13.onnx");
  ASSERT_TRUE(det.ok()) << det.status().ToString();
  text = DescribeGpuPath(**det);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_THAT(*text, HasSubstr("cannot run whole"));
  EXPECT_THAT(*text, HasSubstr("(NonZero)"));
  EXPECT_THAT(*text, HasSubstr("with gpu_cpu_tail: true, nodes 0-"));
}

TEST(OnnxBackendGpuTest, AGpuTheMachineLacksIsNamed) {
  auto model = MakeOnnxBackend()->LoadModel(ExampleInfo("recommender"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto probe = (*model)->CreateInstance(OnGpu(0));
  if (NoGpuHere(probe.status()))
    GTEST_SKIP() << "no GPU instance here: " << probe.status().ToString();
  auto gpu = (*model)->CreateInstance(OnGpu(4096));
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu.status().message(), HasSubstr("instance_group's gpus must name one of them"));
}

// A pipelined model's instances stay on CPUs.
TEST(OnnxBackendGpuTest, APipelinedModelRefusesGpuInstances) {
  auto model = MakeOnnxBackend()->LoadModel(ExampleInfo("recommender", {{"pipeline_stages", "2"}}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto gpu = (*model)->CreateInstance(OnGpu(0));
  ASSERT_FALSE(gpu.ok());
  EXPECT_THAT(gpu.status().message(), HasSubstr("runs on CPUs only"));
}

// Checked before any device is asked, with or without CUDA: a 16-bit GPU tier needs the
// fp32 model as its reference, and well-formed bounds.
TEST_F(OnnxTierTest, A16BitGpuTierNeedsTheFp32ModelAndWellFormedBounds) {
  ModelInfo info = Digits("int8");
  info.parameters["gpu_precision"] = "fp16";
  auto int8_only = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(int8_only.ok()) << int8_only.status().ToString();
  auto refused = (*int8_only)->CreateInstance(OnGpu(0));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("add fp32 to precision_tiers"));

  info = Digits("fp32");
  info.parameters["gpu_precision"] = "bf16";
  info.parameters["min_top1_agreement"] = "2";
  auto bad_bound = MakeOnnxBackend()->LoadModel(info);
  ASSERT_TRUE(bad_bound.ok()) << bad_bound.status().ToString();
  auto malformed = (*bad_bound)->CreateInstance(OnGpu(0));
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("min_top1_agreement is a fraction"));
}

// The digits classifier's GPU tiers against the CPU engine's fp32 on its calibration
// images: within the configured top-1 bound they load and answer like fp32; with a bound no
// 16-bit or int8 tier can meet they are refused with their figures.
TEST_F(OnnxTierTest, GpuReducedTiersAreMeasuredAtLoadAndRefusedBeyondTheirBounds) {
  for (const char* tier : {"fp16", "bf16", "int8"}) {
    SCOPED_TRACE(tier);
    ModelInfo info = Digits("fp32");
    info.parameters["gpu_precision"] = tier;
    // int8 to the CPU int8 tier's bound (Int8LoadsWithinItsBoundAndKeepsAccuracy), the
    // 16-bit tiers to a tighter one.
    const bool int8 = std::string(tier) == "int8";
    info.parameters["min_top1_agreement"] = int8 ? "0.95" : "0.97";
    auto model = MakeOnnxBackend()->LoadModel(info);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto gpu = (*model)->CreateInstance(OnGpu(0));
    if (NoGpuHere(gpu.status()))
      GTEST_SKIP() << "no GPU instance here: " << gpu.status().ToString();
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    auto cpu = (*model)->CreateInstance(InstanceInfo{"digits_1", 1, {}, 0, -1});
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    ExecuteRequest request;
    request.batch_size = images_.shape()[0];
    request.inputs.push_back({"image", images_});
    request.variant = tier;
    std::vector<NamedTensor> on_gpu, on_cpu;
    Status ran = (*gpu)->Execute(request, &on_gpu);
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    request.variant.clear();
    ASSERT_TRUE((*cpu)->Execute(request, &on_cpu).ok());
    ASSERT_EQ(on_gpu.size(), 1u);
    int agree = 0;
    for (int64_t i = 0; i < request.batch_size; ++i) {
      auto a = on_gpu[0].tensor.values<float>().subspan(static_cast<size_t>(i * 10), 10);
      auto b = on_cpu[0].tensor.values<float>().subspan(static_cast<size_t>(i * 10), 10);
      agree += std::max_element(a.begin(), a.end()) - a.begin() ==
               std::max_element(b.begin(), b.end()) - b.begin();
    }
    EXPECT_GE(agree, request.batch_size * (int8 ? 95 : 97) / 100);

    info.parameters["max_abs_diff"] = "1e-9";
    auto strict = MakeOnnxBackend()->LoadModel(info);
    ASSERT_TRUE(strict.ok()) << strict.status().ToString();
    auto refused = (*strict)->CreateInstance(OnGpu(0));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr(std::string("gpu_precision ") + tier +
                                                      " on GPU 0 against fp32: max |diff|"));
    EXPECT_THAT(refused.status().message(), HasSubstr("refused: max |diff| is above max_abs_diff"));
  }
}

}  // namespace
}  // namespace shoal::backends
