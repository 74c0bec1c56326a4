#include "backends/onnx/onnx_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "backends/backend_registry.h"
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

TEST_F(OnnxBackendTest, ExecuteMatchesTheReference) {
  auto model = MakeOnnxBackend()->LoadModel(Info());
  ASSERT_TRUE(model.ok());
  auto instance = (*model)->CreateInstance(InstanceInfo{"resnet_0", 0, {}});
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
  info.parameters["default_model_filename"] = "../x.onnx";
  EXPECT_FALSE(MakeOnnxBackend()->LoadModel(info).ok());
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
