// VersionOptionsFromConfig's instances: the instance groups' settings, given as
// parameters (or in config.pbtxt's deprecated spelling), reach each instance.
#include "runtime/config_adapter.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace shoal::runtime
