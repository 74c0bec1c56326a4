// VersionOptionsFromConfig's instances: the instance groups' settings, given as
// parameters (or in config.pbtxt's deprecated spelling), reach each instance; and its
// warmup samples' random data.
#include "runtime/config_adapter.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/fp16.h"
#include "repository/model_config.h"

namespace shoal::runtime {
namespace {

constexpr char kPath[] = "m/config.pbtxt";

StatusOr<ModelVersionOptions> OptionsFor(const std::string& text) {
  ASSIGN_OR_RETURN(inference::ModelConfig config, repository::ParseModelConfig(text, kPath));
  RETURN_IF_ERROR(repository::ValidateModelConfig(config, kPath));
  return VersionOptionsFromConfig(config, "/nonexistent", 1, nullptr, Clock::Real(),
                                  RequestLimits());
}

TEST(ConfigAdapterTest, GroupParametersPinAndSizeEachInstance) {
  auto o = OptionsFor(R"(
    name: "m"
    backend: "identity"
    max_batch_size: 1
    input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
    model_warmup [ { name: "w" batch_size: 1
                     inputs { key: "I" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
    instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU cpu_cores: [ 6 ] } ]
    parameters { key: "shoal.instance_group.0.cpu_cores" value { string_value: "0-3" } }
    parameters { key: "shoal.instance_group.0.threads" value { string_value: "2" } }
  )");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->instances.size(), 3u);
  EXPECT_EQ(o->instances[0].cpu_cores, (std::vector<int>{0, 1}));
  EXPECT_EQ(o->instances[1].cpu_cores, (std::vector<int>{2, 3}));
  EXPECT_EQ(o->instances[0].threads, 2);
  EXPECT_EQ(o->instances[1].threads, 2);
  EXPECT_EQ(o->instances[2].name, "m_2");
  EXPECT_EQ(o->instances[2].cpu_cores, (std::vector<int>{6}));  // the deprecated spelling
  EXPECT_EQ(o->instances[2].threads, 0);
}

// GPU instances are not served yet: the load fails and says so, whatever the build.
// KIND_GPU places `count` instances on each listed GPU (Triton's meaning), GPU 0 when the
// group lists none; KIND_CPU instances carry no GPU. Whether the backend can run there is
// its own answer at CreateInstance.
TEST(ConfigAdapterTest, GpuInstanceGroupsPlaceCountInstancesOnEachListedGpu) {
  auto o = OptionsFor(R"(
    name: "m"
    backend: "identity"
    max_batch_size: 1
    input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { count: 2 kind: KIND_GPU gpus: [ 1, 3 ] },
                     { count: 1 kind: KIND_GPU },
                     { count: 1 kind: KIND_CPU } ]
  )");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  std::vector<int> gpus;
  std::vector<std::string> names;
  for (const auto& info : o->instances) {
    gpus.push_back(info.gpu);
    names.push_back(info.name);
  }
  EXPECT_EQ(gpus, (std::vector<int>{1, 1, 3, 3, 0, -1}));
  EXPECT_EQ(names, (std::vector<std::string>{"m_0", "m_1", "m_2", "m_3", "m_4", "m_5"}));
}

// gpu_tensor_parallel N takes a group's GPUs N at a time: `count` instances on each N,
// the first of them its `gpu`; a group of one GPU keeps every shard on it; a list N does
// not divide, and an N out of range, are refused naming what to change.
TEST(ConfigAdapterTest, TensorParallelInstancesSpanTheirGroupsGpusNAtATime) {
  const std::string base = R"(
    name: "m"
    backend: "identity"
    max_batch_size: 1
    input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
  )";
  auto o = OptionsFor(base + R"(
    instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1, 2, 3 ] },
                     { count: 1 kind: KIND_GPU gpus: [ 5 ] },
                     { count: 1 kind: KIND_CPU } ]
    parameters { key: "gpu_tensor_parallel" value { string_value: "2" } }
  )");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  std::vector<int> gpu;
  std::vector<std::vector<int>> spans;
  for (const auto& info : o->instances) {
    gpu.push_back(info.gpu);
    spans.push_back(info.gpus);
  }
  EXPECT_EQ(gpu, (std::vector<int>{0, 0, 2, 2, 5, -1}));
  EXPECT_EQ(spans, (std::vector<std::vector<int>>{{0, 1}, {0, 1}, {2, 3}, {2, 3}, {5}, {}}));

  // Without the parameter, each instance spans its own GPU only.
  auto plain = OptionsFor(base + "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 1, 3 ] } ]");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_EQ(plain->instances.size(), 2u);
  EXPECT_EQ(plain->instances[1].gpus, (std::vector<int>{3}));

  auto uneven = OptionsFor(base + R"(
    instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0, 1, 2 ] } ]
    parameters { key: "gpu_tensor_parallel" value { string_value: "2" } }
  )");
  ASSERT_FALSE(uneven.ok());
  EXPECT_EQ(uneven.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(uneven.status().message().find("lists 3 GPUs"), std::string::npos)
      << uneven.status().ToString();
  for (const char* bad : {"0", "17", "two"}) {
    auto refused = OptionsFor(base + "instance_group [ { count: 1 kind: KIND_GPU } ]\n" +
                              "parameters { key: \"gpu_tensor_parallel\" value { string_value: \"" +
                              bad + "\" } }");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("gpu_tensor_parallel"), std::string::npos)
        << refused.status().ToString();
  }
}

// random_data gives FP16 and BF16 inputs values in [0, 1) as for FP32, not bit patterns
// (which for FP16 would be tiny subnormals).
TEST(ConfigAdapterTest, RandomWarmupDataForHalfTypesIsBetweenZeroAndOne) {
  for (const char* type : {"TYPE_FP16", "TYPE_BF16"}) {
    SCOPED_TRACE(type);
    const std::string t = type;
    auto o = OptionsFor(
        "name: \"m\"\nbackend: \"identity\"\nmax_batch_size: 2\n"
        "input [ { name: \"I\" data_type: " +
        t +
        " dims: [ 64 ] } ]\n"
        "output [ { name: \"O\" data_type: " +
        t +
        " dims: [ 64 ] } ]\n"
        "model_warmup [ { name: \"w\" batch_size: 2 inputs { key: \"I\" value { data_type: " +
        t + " dims: [ 64 ] random_data: true } } } ]\n");
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    ASSERT_EQ(o->warmup.size(), 1u);
    const Tensor& in = o->warmup[0].inputs[0].tensor;
    ASSERT_EQ(in.shape(), (Shape{2, 64}));
    float lo = 1, hi = 0;
    for (uint16_t h : in.values<uint16_t>()) {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float bf;
      std::memcpy(&bf, &bits, sizeof(bf));
      const float f = t == "TYPE_FP16" ? Fp16ToFloat(h) : bf;
      lo = std::min(lo, f);
      hi = std::max(hi, f);
    }
    EXPECT_GE(lo, 0.f);
    EXPECT_LE(hi, 1.f);
    EXPECT_GT(hi - lo, 0.5f);  // spread over the range, not one value
  }
}

}  // namespace
}  // namespace shoal::runtime
