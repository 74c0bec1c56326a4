#include "backends/plugin_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "shoal/backend_api.h"

namespace shoal::backends {
namespace {

using ::testing::HasSubstr;

std::string BinaryDir() {
  const char* dir = std::getenv("SHOAL_BINARY_DIR");
  return dir != nullptr ? dir : ".";
}
std::string PluginPath(const std::string& name) {
  return BinaryDir() + "/backends/libshoal_" + name + ".so";
}
std::string TestPluginPath(const std::string& name) {
  return BinaryDir() + "/backends_testdata/libshoal_test_" + name + ".so";
}

std::shared_ptr<Backend> OpenOrDie(const std::string& name, const std::string& path) {
  auto backend = PluginBackend::Open(name, path);
  EXPECT_TRUE(backend.ok()) << backend.status().ToString();
  return backend.ok() ? *backend : nullptr;
}

ModelInfo Info(const std::string& name, int max_batch_size,
               std::map<std::string, std::string> parameters = {}) {
  ModelInfo info;
  info.name = name;
  info.version = 1;
  info.model_dir = "/nonexistent/" + name;
  info.version_dir = info.model_dir + "/1";
  info.max_batch_size = max_batch_size;
  info.parameters = std::move(parameters);
  return info;
}

// A loaded model and one instance of it.
struct Loaded {
  std::shared_ptr<Backend> backend;
  std::unique_ptr<BackendModel> model;
  std::unique_ptr<BackendInstance> instance;
};

Loaded Load(const std::string& path, const ModelInfo& info) {
  Loaded l;
  l.backend = OpenOrDie(info.name, path);
  if (l.backend == nullptr) return l;
  auto model = l.backend->LoadModel(info);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return l;
  l.model = std::move(*model);
  auto instance = l.model->CreateInstance(InstanceInfo{info.name + "_0", 0, {}, 0, -1});
  EXPECT_TRUE(instance.ok()) << instance.status().ToString();
  if (instance.ok()) l.instance = std::move(*instance);
  return l;
}

ExecuteRequest Request(int64_t batch_size, std::vector<NamedTensor> inputs,
                       std::vector<std::string> requested = {}) {
  ExecuteRequest r;
  r.batch_size = batch_size;
  r.inputs = std::move(inputs);
  r.requested_outputs = std::move(requested);
  return r;
}

const Tensor* FindOutput(const std::vector<NamedTensor>& outputs, const std::string& name) {
  for (const NamedTensor& t : outputs) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  auto v = t.values<T>();
  return {v.begin(), v.end()};
}

TEST(PluginBackendTest, IdentityCopiesFp32) {
  Loaded l = Load(PluginPath("identity"), Info("identity", 8));
  ASSERT_NE(l.instance, nullptr);
  EXPECT_EQ(l.backend->name(), "identity");
  const std::vector<float> data = {1.5f, -2.f, 3.25f, 0.f, 7.f, -0.5f};
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(
      l.instance
          ->Execute(Request(3, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {3, 2}, data)}}),
                    &outputs)
          .ok());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, "OUTPUT0");
  EXPECT_EQ(outputs[0].tensor.dtype(), DataType::kFp32);
  EXPECT_EQ(outputs[0].tensor.shape(), (Shape{3, 2}));
  EXPECT_EQ(Values<float>(outputs[0].tensor), data);
}

// The plugin API has no device: a KIND_GPU instance is refused, naming the plugin.
TEST(PluginBackendTest, AGpuInstanceIsRefused) {
  auto backend = OpenOrDie("identity", PluginPath("identity"));
  ASSERT_NE(backend, nullptr);
  auto model = backend->LoadModel(Info("identity", 8));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto instance = (*model)->CreateInstance(InstanceInfo{"identity_0", 0, {}, 0, 1});
  ASSERT_FALSE(instance.ok());
  EXPECT_EQ(instance.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(instance.status().message().find(
                "plugin 'identity' cannot create instance 'identity_0' on GPU 1: plugin backends "
                "run KIND_CPU instances only"),
            std::string::npos)
      << instance.status().message();
}

TEST(PluginBackendTest, IdentityCopiesInt64AndSeveralInputs) {
  Loaded l = Load(PluginPath("identity"), Info("identity", 0));
  ASSERT_NE(l.instance, nullptr);
  const std::vector<int64_t> a = {INT64_MIN, -1, 0, INT64_MAX};
  const std::vector<int64_t> b = {42};
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(l.instance
                  ->Execute(Request(1, {{"INPUT0", Tensor::FromVector(DataType::kInt64, {2, 2}, a)},
                                        {"INPUT1", Tensor::FromVector(DataType::kInt64, {}, b)}}),
                            &outputs)
                  .ok());
  ASSERT_EQ(outputs.size(), 2u);
  const Tensor* out0 = FindOutput(outputs, "OUTPUT0");
  const Tensor* out1 = FindOutput(outputs, "OUTPUT1");
  ASSERT_NE(out0, nullptr);
  ASSERT_NE(out1, nullptr);
  EXPECT_EQ(out0->shape(), (Shape{2, 2}));
  EXPECT_EQ(Values<int64_t>(*out0), a);
  EXPECT_EQ(out1->shape(), Shape{});
  EXPECT_EQ(Values<int64_t>(*out1), b);
}

TEST(PluginBackendTest, IdentityCopiesBytes) {
  Loaded l = Load(PluginPath("identity"), Info("identity", 4));
  ASSERT_NE(l.instance, nullptr);
  const std::vector<std::string> strings = {"hello", "", std::string("a\0b", 3), "shoal"};
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(
      l.instance->Execute(Request(2, {{"INPUT0", Tensor::FromStrings({2, 2}, strings)}}), &outputs)
          .ok());
  ASSERT_EQ(outputs.size(), 1u);
  const Tensor& out = outputs[0].tensor;
  EXPECT_EQ(out.dtype(), DataType::kBytes);
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  auto elements = out.BytesElements();
  ASSERT_TRUE(elements.ok()) << elements.status().ToString();
  ASSERT_EQ(elements->size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i) EXPECT_EQ((*elements)[i], strings[i]);
}

TEST(PluginBackendTest, IdentityProducesOnlyRequestedOutputs) {
  Loaded l = Load(PluginPath("identity"), Info("identity", 0));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> inputs = {
      {"INPUT0", Tensor::FromVector(DataType::kInt32, {1}, std::vector<int32_t>{1})},
      {"INPUT1", Tensor::FromVector(DataType::kInt32, {1}, std::vector<int32_t>{2})}};
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(l.instance->Execute(Request(1, inputs, {"OUTPUT1"}), &outputs).ok());
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].name, "OUTPUT1");

  outputs.clear();
  Status s = l.instance->Execute(Request(1, inputs, {"OUTPUT7"}), &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("plugin 'identity'"));
  EXPECT_THAT(s.message(), HasSubstr("OUTPUT7"));
  EXPECT_TRUE(outputs.empty());
}

TEST(PluginBackendTest, AddSubFp32AndInt32) {
  Loaded l = Load(PluginPath("add_sub"), Info("add_sub", 8));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(
      l.instance
          ->Execute(
              Request(2, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {2, 2},
                                                        std::vector<float>{1, 2, 3, 4})},
                          {"INPUT1", Tensor::FromVector(DataType::kFp32, {2, 2},
                                                        std::vector<float>{0.5f, 5, -3, 10})}}),
              &outputs)
          .ok());
  ASSERT_NE(FindOutput(outputs, "OUTPUT0"), nullptr);
  ASSERT_NE(FindOutput(outputs, "OUTPUT1"), nullptr);
  EXPECT_EQ(Values<float>(*FindOutput(outputs, "OUTPUT0")), (std::vector<float>{1.5f, 7, 0, 14}));
  EXPECT_EQ(Values<float>(*FindOutput(outputs, "OUTPUT1")), (std::vector<float>{0.5f, -3, 6, -6}));

  outputs.clear();
  // INT32 wraps on overflow instead of being undefined behaviour.
  ASSERT_TRUE(
      l.instance
          ->Execute(
              Request(3,
                      {{"INPUT0", Tensor::FromVector(DataType::kInt32, {3},
                                                     std::vector<int32_t>{10, -4, INT32_MAX})},
                       {"INPUT1",
                        Tensor::FromVector(DataType::kInt32, {3}, std::vector<int32_t>{3, 6, 1})}},
                      {"OUTPUT0", "OUTPUT1"}),
              &outputs)
          .ok());
  EXPECT_EQ(FindOutput(outputs, "OUTPUT0")->dtype(), DataType::kInt32);
  EXPECT_EQ(Values<int32_t>(*FindOutput(outputs, "OUTPUT0")),
            (std::vector<int32_t>{13, 2, INT32_MIN}));
  EXPECT_EQ(Values<int32_t>(*FindOutput(outputs, "OUTPUT1")),
            (std::vector<int32_t>{7, -10, INT32_MAX - 1}));
}

TEST(PluginBackendTest, AddSubRejectsMismatchedShapesAndTypes) {
  Loaded l = Load(PluginPath("add_sub"), Info("add_sub", 0));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  Status s = l.instance->Execute(
      Request(1, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {4}, std::vector<float>(4))},
                  {"INPUT1", Tensor::FromVector(DataType::kFp32, {2, 2}, std::vector<float>(4))}}),
      &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("plugin 'add_sub'"));
  EXPECT_THAT(s.message(), HasSubstr("same shape; got [4] and [2,2]"));

  s = l.instance->Execute(
      Request(1, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {2}, std::vector<float>(2))},
                  {"INPUT1", Tensor::FromVector(DataType::kInt32, {2}, std::vector<int32_t>(2))}}),
      &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("both FP32 or both INT32"));
  EXPECT_TRUE(outputs.empty());
}

// A lower bound only: the sleep may take longer on a loaded machine, never shorter.
TEST(PluginBackendTest, CostModelTakesAtLeastAPlusBTimesN) {
  constexpr int64_t kA = 3000, kB = 500, kBatch = 4;
  Loaded l =
      Load(PluginPath("cost_model"),
           Info("cost_model", 8, {{"a_us", std::to_string(kA)}, {"b_us", std::to_string(kB)}}));
  ASSERT_NE(l.instance, nullptr);
  const std::vector<float> data = {1, 2, 3, 4};
  std::vector<NamedTensor> outputs;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      l.instance
          ->Execute(
              Request(kBatch, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {kBatch, 1}, data)}}),
              &outputs)
          .ok());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::microseconds(kA + kB * kBatch));
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(Values<float>(outputs[0].tensor), data);
}

TEST(PluginBackendTest, CostModelDefaultsAreOneMillisecondPlusHundredMicrosPerItem) {
  Loaded l = Load(PluginPath("cost_model"), Info("cost_model", 8));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      l.instance
          ->Execute(Request(2, {{"INPUT0", Tensor::FromVector(DataType::kInt32, {2},
                                                              std::vector<int32_t>{5, 6})}}),
                    &outputs)
          .ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::microseconds(1000 + 100 * 2));
}

TEST(PluginBackendTest, CostModelRejectsBadParameters) {
  auto backend = OpenOrDie("cost_model", PluginPath("cost_model"));
  ASSERT_NE(backend, nullptr);
  auto model = backend->LoadModel(Info("cost_model", 8, {{"b_us", "-5"}}));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("could not load model 'cost_model' version 1"));
  EXPECT_THAT(model.status().message(), HasSubstr("b_us must be a finite number >= 0; was '-5'"));
}

TEST(PluginBackendTest, CostModelFailOnValueSurfacesThePluginMessage) {
  Loaded l = Load(PluginPath("cost_model"),
                  Info("cost_model", 8, {{"a_us", "0"}, {"b_us", "0"}, {"fail_on_value", "13"}}));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(l.instance
                  ->Execute(Request(2, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {2},
                                                                      std::vector<float>{1, 2})}}),
                            &outputs)
                  .ok());
  outputs.clear();
  Status s = l.instance->Execute(
      Request(2, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {2}, std::vector<float>{1, 13})}}),
      &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "plugin 'cost_model': cost_model: input INPUT0 holds fail_on_value 13");
  EXPECT_TRUE(outputs.empty());
  // The instance keeps serving after a failure.
  ASSERT_TRUE(l.instance
                  ->Execute(Request(1, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {1},
                                                                      std::vector<float>{3})}}),
                            &outputs)
                  .ok());
}

TEST(PluginBackendTest, InstancesOfOneModelExecuteConcurrently) {
  auto backend = OpenOrDie("cost_model", PluginPath("cost_model"));
  ASSERT_NE(backend, nullptr);
  auto model = backend->LoadModel(Info("cost_model", 8, {{"a_us", "200"}, {"b_us", "10"}}));
  ASSERT_TRUE(model.ok());
  std::vector<std::thread> threads;
  std::vector<Status> results(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto instance =
          (*model)->CreateInstance(InstanceInfo{"m_" + std::to_string(i), i, {}, 0, -1});
      if (!instance.ok()) {
        results[i] = instance.status();
        return;
      }
      for (int k = 0; k < 20 && results[i].ok(); ++k) {
        const float v = static_cast<float>(i * 100 + k);
        std::vector<NamedTensor> outputs;
        results[i] = (*instance)->Execute(
            Request(1,
                    {{"INPUT0", Tensor::FromVector(DataType::kFp32, {1}, std::vector<float>{v})}}),
            &outputs);
        if (results[i].ok() && Values<float>(outputs.at(0).tensor) != std::vector<float>{v}) {
          results[i] = Internal("wrong output");
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(PluginBackendTest, ModelAndInstanceOutliveTheirBackend) {
  Loaded l = Load(PluginPath("identity"), Info("identity", 0));
  ASSERT_NE(l.instance, nullptr);
  l.backend.reset();  // the library must stay open for the model and instance
  std::vector<NamedTensor> outputs;
  ASSERT_TRUE(l.instance
                  ->Execute(Request(1, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {1},
                                                                      std::vector<float>{9})}}),
                            &outputs)
                  .ok());
  l.model.reset();  // the instance keeps its model's state
  ASSERT_TRUE(l.instance
                  ->Execute(Request(1, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {1},
                                                                      std::vector<float>{9})}}),
                            &outputs)
                  .ok());
  l.instance.reset();
  // Outputs are shoal's memory, valid after the library is closed.
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(Values<float>(outputs[1].tensor), std::vector<float>{9});
}

TEST(PluginBackendTest, MissingFileIsNotFound) {
  auto backend = PluginBackend::Open("nothing", BinaryDir() + "/backends/libshoal_nothing.so");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(backend.status().message(), HasSubstr("libshoal_nothing.so"));
  EXPECT_THAT(backend.status().message(), HasSubstr("does not exist"));
}

TEST(PluginBackendTest, NotALibraryCarriesDlerror) {
  const std::string path = ::testing::TempDir() + "/libshoal_not_elf.so";
  std::ofstream(path) << "this is not an ELF file\n";
  auto backend = PluginBackend::Open("not_elf", path);
  std::remove(path.c_str());
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(), HasSubstr("cannot load plugin library"));
  // dlerror() names the file and what is wrong with it.
  EXPECT_THAT(backend.status().message(), HasSubstr("libshoal_not_elf.so: "));
}

TEST(PluginBackendTest, AnotherMajorVersionIsRefusedNamingBothVersions) {
  auto backend = PluginBackend::Open("bad_version", TestPluginPath("bad_version"));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kFailedPrecondition);
  const std::string theirs = std::to_string(SHOAL_BACKEND_API_VERSION + 1) + ".4";
  const std::string ours = std::to_string(SHOAL_BACKEND_API_VERSION) + "." +
                           std::to_string(SHOAL_BACKEND_API_VERSION_MINOR);
  EXPECT_THAT(backend.status().message(),
              HasSubstr("built for backend API version " + theirs +
                        ", but this server implements version " + ours));
  EXPECT_THAT(backend.status().message(),
              HasSubstr("rebuild it against this server's shoal/backend_api.h"));
}

TEST(PluginBackendTest, ExamplesReportThisHeadersMinorVersion) {
  for (const char* name : {"identity", "add_sub", "cost_model"}) {
    auto backend = OpenOrDie(name, PluginPath(name));
    ASSERT_NE(backend, nullptr) << name;
    EXPECT_EQ(std::dynamic_pointer_cast<PluginBackend>(backend)->api_minor_version(),
              SHOAL_BACKEND_API_VERSION_MINOR)
        << name;
  }
}

// A plugin compiled against the frozen 1.0 header (testdata/backend_api_v1_0.h) loads, runs,
// and finds every field where 1.0 put it: the plugin spells out all it read, so a moved
// field or a changed array stride would show up in the string.
TEST(PluginBackendTest, PluginBuiltAgainstThe1_0HeaderLoadsAndReadsEveryField) {
  ModelInfo info = Info("old", 0, {{"alpha", "1"}, {"beta", "two"}});
  info.version = 7;
  info.version_dir = "/nonexistent/old/7";
  info.inputs = {TensorSpec{"INPUT0", DataType::kUint8, {2, -1}, false},
                 TensorSpec{"INPUT1", DataType::kInt32, {3}, true}};
  info.outputs = {TensorSpec{"SEEN", DataType::kBytes, {1}, false}};
  auto backend = OpenOrDie("old", TestPluginPath("v1_0"));
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(std::dynamic_pointer_cast<PluginBackend>(backend)->api_minor_version(), 0u);
  auto model = backend->LoadModel(info);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto instance = (*model)->CreateInstance(InstanceInfo{"old_1", 1, {2, 3}, 0, -1});
  ASSERT_TRUE(instance.ok()) << instance.status().ToString();

  std::vector<NamedTensor> outputs;
  Status s = (*instance)->Execute(
      Request(
          1,
          {{"INPUT0",
            Tensor::FromVector(DataType::kUint8, {2, 2}, std::vector<uint8_t>{1, 2, 3, 4})},
           {"INPUT1", Tensor::FromVector(DataType::kInt32, {3}, std::vector<int32_t>{1, 256, 2})}},
          {"SEEN"}),
      &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const Tensor* seen = FindOutput(outputs, "SEEN");
  ASSERT_NE(seen, nullptr);
  auto elements = seen->BytesElements();
  ASSERT_TRUE(elements.ok()) << elements.status().ToString();
  ASSERT_EQ(elements->size(), 1u);
  // Datatypes are numbers: UINT8 2, INT32 8, BYTES 13. INT32 {1, 256, 2} is 12 bytes
  // summing to 1 + 1 + 2.
  EXPECT_EQ((*elements)[0],
            "model old v7 batch 0 dir /nonexistent/old /nonexistent/old/7"
            " in INPUT0:2[2,-1] INPUT1:8[3]? out SEEN:13[1] params alpha=1 beta=two"
            " | instance old_1 #1 cores 2,3"
            " | batch 1 in INPUT0:2[2,2] 4B sum 10 INPUT1:8[3] 12B sum 4 req SEEN");
}

// A plugin built for a newer minor, whose structs are larger than this server's, loads;
// struct_size tells it which of its fields this server fills, so it defaults the rest.
TEST(PluginBackendTest, PluginOfANewerMinorLoadsAndSeesStructSizes) {
  Loaded l = Load(TestPluginPath("next_minor"), Info("next", 0));
  ASSERT_NE(l.instance, nullptr);
  EXPECT_EQ(std::dynamic_pointer_cast<PluginBackend>(l.backend)->api_minor_version(),
            SHOAL_BACKEND_API_VERSION_MINOR + 1);
  std::vector<NamedTensor> outputs;
  Status s = l.instance->Execute(Request(1, {}), &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const Tensor* seen = FindOutput(outputs, "OUTPUT0");
  ASSERT_NE(seen, nullptr);
  // Per struct: the struct_size this server set, then the next minor's field: -1, absent.
  EXPECT_EQ(Values<int64_t>(*seen), (std::vector<int64_t>{int64_t{sizeof(ShoalModelInfo)}, -1,
                                                          int64_t{sizeof(ShoalInstanceInfo)}, -1,
                                                          int64_t{sizeof(ShoalExecuteArgs)}, -1}));
}

TEST(PluginBackendTest, PluginOfANewerMinorWritesNoErrorFieldThisServerLacks) {
  Loaded l = Load(TestPluginPath("next_minor"), Info("next", 0, {{"fail", "1"}}));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  Status s = l.instance->Execute(Request(1, {}), &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "plugin 'next': next_minor: failing as asked (error struct_size " +
                             std::to_string(sizeof(ShoalError)) + ", no retry_after_ms)");
  EXPECT_TRUE(outputs.empty());
}

TEST(PluginBackendTest, MissingSymbolIsNamed) {
  auto backend = PluginBackend::Open("missing_execute", TestPluginPath("missing_execute"));
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(), HasSubstr("does not export shoal_instance_execute"));
}

// Each way a plugin can break the output rules becomes INTERNAL naming plugin and output.
struct MisbehaviourCase {
  std::string mode;
  std::string expected;
};

class MisbehavingPluginTest : public ::testing::TestWithParam<MisbehaviourCase> {};

TEST_P(MisbehavingPluginTest, ViolationIsInternalError) {
  Loaded l =
      Load(TestPluginPath("misbehaving"), Info("misbehaving", 8, {{"mode", GetParam().mode}}));
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  Status s = l.instance->Execute(
      Request(2, {{"INPUT0", Tensor::FromVector(DataType::kFp32, {2}, std::vector<float>(2))}},
              {"OUTPUT0"}),
      &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("plugin 'misbehaving'"));
  EXPECT_THAT(s.message(), HasSubstr(GetParam().expected));
  EXPECT_TRUE(outputs.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MisbehavingPluginTest,
    ::testing::Values(
        MisbehaviourCase{"unknown_dtype", "output 'OUTPUT0' has unknown datatype 99"},
        MisbehaviourCase{"wrong_size",
                         "output 'OUTPUT0' has byte size 7, but shape [2,2] of FP32 needs 16"},
        MisbehaviourCase{"bad_bytes", "output 'OUTPUT0' malformed BYTES data"},
        MisbehaviourCase{"wrong_batch", "first dimension must be the batch size 2"},
        MisbehaviourCase{"duplicate", "output 'OUTPUT0' was allocated twice"},
        MisbehaviourCase{"ignore_null", "output 'OUTPUT0' has byte size 3"},
        MisbehaviourCase{"missing", "output 'OUTPUT0' was requested but not produced"},
        MisbehaviourCase{"throw", "threw an exception: execute exploded"},
        MisbehaviourCase{"no_message", "failed without a message (returned 7, code 0)"}),
    [](const auto& info) { return info.param.mode; });

TEST(PluginBackendTest, AllDeclaredOutputsAreRequiredWhenNoneAreRequested) {
  ModelInfo info = Info("misbehaving", 0, {{"mode", "missing"}});
  info.outputs.push_back(TensorSpec{"OUTPUT0", DataType::kFp32, {2}, false});
  Loaded l = Load(TestPluginPath("misbehaving"), info);
  ASSERT_NE(l.instance, nullptr);
  std::vector<NamedTensor> outputs;
  Status s = l.instance->Execute(Request(1, {}), &outputs);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("output 'OUTPUT0' was requested but not produced"));
}

TEST(PluginBackendTest, LoadAndCreateErrorsCarryThePluginsCodeAndMessage) {
  auto backend = OpenOrDie("misbehaving", TestPluginPath("misbehaving"));
  ASSERT_NE(backend, nullptr);
  auto bad = backend->LoadModel(Info("m", 0, {{"mode", "bad_param"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "plugin 'misbehaving' could not load model 'm' version 1: mode bad_param rejected");

  auto model = backend->LoadModel(Info("m", 0, {{"mode", "throw"}}));
  ASSERT_TRUE(model.ok());
  EXPECT_TRUE((*model)->CreateInstance(InstanceInfo{"m_0", 0, {}, 0, -1}).ok());
  auto thrown = (*model)->CreateInstance(InstanceInfo{"m_1", 1, {0}, 0, -1});
  ASSERT_FALSE(thrown.ok());
  EXPECT_EQ(thrown.status().code(), StatusCode::kInternal);
  EXPECT_THAT(thrown.status().message(),
              HasSubstr("could not create instance 'm_1': threw an exception: create exploded"));
  EXPECT_EQ((*model)->info().name, "m");
}

}  // namespace
}  // namespace shoal::backends
