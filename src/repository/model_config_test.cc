#include "repository/model_config.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace shoal::repository {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kPath[] = "models/x/config.pbtxt";

// Every field shoal's ModelConfig defines, written the way Triton users write them.
constexpr char kFullConfig[] = R"cfg(
name: "x"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libshoal_custom.so"
version_policy: { specific: { versions: [ 1, 3 ] } }
max_batch_size: 8
input [
  {
    name: "image"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, -1, 224 ]
    is_shape_tensor: false
    allow_ragged_batch: true
    optional: true
    is_non_linear_format_io: false
  },
  {
    name: "scalar"
    data_type: TYPE_INT64
    dims: [ 1 ]
    reshape: { shape: [ ] }
  }
]
output [
  {
    name: "prob"
    data_type: TYPE_FP16
    dims: [ 1000 ]
    reshape: { shape: [ 10, 100 ] }
    label_filename: "labels.txt"
    is_shape_tensor: false
    is_non_linear_format_io: true
  }
]
optimization {
  graph: { level: 1 }
  priority: PRIORITY_MAX
  execution_accelerators {
    cpu_execution_accelerator: [
      { name: "openvino" parameters { key: "precision" value: "FP16" } }
    ]
    gpu_execution_accelerator: [ { name: "tensorrt" } ]
  }
  input_pinned_memory: { enable: false }
  output_pinned_memory: { enable: true }
  gather_kernel_buffer_threshold: 4
  eager_batching: true
}
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy: {
    timeout_action: DELAY
    default_timeout_microseconds: 5000
    allow_timeout_override: true
    max_queue_size: 64
  }
  priority_queue_policy: {
    key: 1
    value: { timeout_action: REJECT max_queue_size: 16 }
  }
}
instance_group [
  {
    name: "cpu_group"
    count: 2
    kind: KIND_CPU
    gpus: [ 0 ]
    profile: [ "p1" ]
    passive: false
    host_policy: "numa0"
    cpu_cores: [ 0, 1, 2, 3 ]
    threads: 2
  }
]
default_model_filename: "model.onnx"
cc_model_filenames { key: "7.5" value: "model_sm75.onnx" }
metric_tags { key: "team" value: "vision" }
parameters { key: "intra_op_threads" value: { string_value: "4" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 8
    count: 2
    inputs { key: "image" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } }
  },
  {
    name: "from_file"
    batch_size: 1
    inputs {
      key: "scalar"
      value: { data_type: TYPE_INT64 dims: [ 1 ] input_data_file: "scalar.bin" }
    }
  }
]
model_transaction_policy { decoupled: false }
response_cache { enable: true }
)cfg";

inference::ModelConfig MustParse(const std::string& text) {
  auto config = ParseModelConfig(text, kPath);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : inference::ModelConfig();
}

TEST(ParseModelConfigTest, FullTritonConfigParsesWithEveryValue) {
  const inference::ModelConfig c = MustParse(kFullConfig);
  EXPECT_EQ(c.name(), "x");
  EXPECT_EQ(c.platform(), "onnxruntime_onnx");
  EXPECT_EQ(c.backend(), "onnxruntime");
  EXPECT_EQ(c.runtime(), "libshoal_custom.so");
  ASSERT_TRUE(c.version_policy().has_specific());
  EXPECT_THAT(c.version_policy().specific().versions(), testing::ElementsAre(1, 3));
  EXPECT_EQ(c.max_batch_size(), 8);

  ASSERT_EQ(c.input_size(), 2);
  EXPECT_EQ(c.input(0).name(), "image");
  EXPECT_EQ(c.input(0).data_type(), inference::TYPE_FP32);
  EXPECT_EQ(FromConfigDataType(c.input(0).data_type()), DataType::kFp32);
  EXPECT_EQ(c.input(0).format(), inference::ModelInput::FORMAT_NCHW);
  EXPECT_THAT(c.input(0).dims(), testing::ElementsAre(3, -1, 224));
  EXPECT_TRUE(c.input(0).allow_ragged_batch());
  EXPECT_TRUE(c.input(0).optional());
  EXPECT_TRUE(c.input(1).has_reshape());
  EXPECT_EQ(c.input(1).reshape().shape_size(), 0);

  ASSERT_EQ(c.output_size(), 1);
  EXPECT_EQ(c.output(0).data_type(), inference::TYPE_FP16);
  EXPECT_THAT(c.output(0).reshape().shape(), testing::ElementsAre(10, 100));
  EXPECT_EQ(c.output(0).label_filename(), "labels.txt");
  EXPECT_TRUE(c.output(0).is_non_linear_format_io());

  const auto& opt = c.optimization();
  EXPECT_EQ(opt.graph().level(), 1);
  EXPECT_EQ(opt.priority(), inference::ModelOptimizationPolicy::PRIORITY_MAX);
  ASSERT_EQ(opt.execution_accelerators().cpu_execution_accelerator_size(), 1);
  const auto& accel = opt.execution_accelerators().cpu_execution_accelerator(0);
  EXPECT_EQ(accel.name(), "openvino");
  EXPECT_EQ(accel.parameters().at("precision"), "FP16");
  EXPECT_EQ(opt.execution_accelerators().gpu_execution_accelerator(0).name(), "tensorrt");
  EXPECT_FALSE(opt.input_pinned_memory().enable());
  EXPECT_TRUE(opt.output_pinned_memory().enable());
  EXPECT_EQ(opt.gather_kernel_buffer_threshold(), 4u);
  EXPECT_TRUE(opt.eager_batching());

  ASSERT_TRUE(c.has_dynamic_batching());
  const auto& db = c.dynamic_batching();
  EXPECT_THAT(db.preferred_batch_size(), testing::ElementsAre(4, 8));
  EXPECT_EQ(db.max_queue_delay_microseconds(), 100u);
  EXPECT_TRUE(db.preserve_ordering());
  EXPECT_EQ(db.priority_levels(), 3u);
  EXPECT_EQ(db.default_priority_level(), 2u);
  EXPECT_EQ(db.default_queue_policy().timeout_action(), inference::ModelQueuePolicy::DELAY);
  EXPECT_EQ(db.default_queue_policy().default_timeout_microseconds(), 5000u);
  EXPECT_TRUE(db.default_queue_policy().allow_timeout_override());
  EXPECT_EQ(db.default_queue_policy().max_queue_size(), 64u);
  ASSERT_EQ(db.priority_queue_policy().count(1), 1u);
  EXPECT_EQ(db.priority_queue_policy().at(1).max_queue_size(), 16u);

  ASSERT_EQ(c.instance_group_size(), 1);
  const auto& group = c.instance_group(0);
  EXPECT_EQ(group.name(), "cpu_group");
  EXPECT_EQ(group.count(), 2);
  EXPECT_EQ(group.kind(), inference::ModelInstanceGroup::KIND_CPU);
  EXPECT_THAT(group.gpus(), testing::ElementsAre(0));
  EXPECT_THAT(group.profile(), testing::ElementsAre("p1"));
  EXPECT_EQ(group.host_policy(), "numa0");
  // The old spelling of shoal's group settings, moved into parameters.
  EXPECT_EQ(c.parameters().at("shoal.instance_group.0.cpu_cores").string_value(), "0,1,2,3");
  EXPECT_EQ(c.parameters().at("shoal.instance_group.0.threads").string_value(), "2");

  EXPECT_EQ(c.default_model_filename(), "model.onnx");
  EXPECT_EQ(c.cc_model_filenames().at("7.5"), "model_sm75.onnx");
  EXPECT_EQ(c.metric_tags().at("team"), "vision");
  EXPECT_EQ(c.parameters().at("intra_op_threads").string_value(), "4");

  ASSERT_EQ(c.model_warmup_size(), 2);
  EXPECT_EQ(c.model_warmup(0).batch_size(), 8u);
  EXPECT_EQ(c.model_warmup(0).count(), 2u);
  EXPECT_TRUE(c.model_warmup(0).inputs().at("image").zero_data());
  EXPECT_EQ(c.model_warmup(1).inputs().at("scalar").input_data_file(), "scalar.bin");
  EXPECT_TRUE(c.has_model_transaction_policy());
  EXPECT_FALSE(c.model_transaction_policy().decoupled());
  EXPECT_TRUE(c.response_cache().enable());

  EXPECT_TRUE(ValidateModelConfig(c, kPath).ok()) << ValidateModelConfig(c, kPath).ToString();
}

// Every field of every message is one of Triton's (numbers below 100; shoal's settings
// are parameters), so the config JSON and the gRPC message stay within Triton's schema.
void ExpectOnlyTritonFieldNumbers(const google::protobuf::Descriptor* message,
                                  std::set<const google::protobuf::Descriptor*>* seen) {
  if (!seen->insert(message).second) return;
  for (int i = 0; i < message->field_count(); ++i) {
    const auto* field = message->field(i);
    EXPECT_LT(field->number(), 100) << field->full_name();
    if (field->message_type() != nullptr) ExpectOnlyTritonFieldNumbers(field->message_type(), seen);
  }
}

TEST(ParseModelConfigTest, SchemaHasNoFieldsBeyondTritons) {
  std::set<const google::protobuf::Descriptor*> seen;
  ExpectOnlyTritonFieldNumbers(inference::ModelConfig::descriptor(), &seen);
  EXPECT_GT(seen.size(), 10u);
  const auto* group = inference::ModelInstanceGroup::descriptor();
  EXPECT_EQ(group->FindFieldByName("cpu_cores"), nullptr);
  EXPECT_EQ(group->FindFieldByName("threads"), nullptr);
  const auto* config = inference::ModelConfig::descriptor();
  EXPECT_EQ(config->FindFieldByName("response_cache")->number(), 24);
  EXPECT_EQ(config->FindFieldByName("ensemble_scheduling")->number(), 15);
  EXPECT_EQ(config->FindFieldByName("sequence_batching"), nullptr);
}

TEST(ParseModelConfigTest, UnknownFieldNamesFileLineColumnAndField) {
  auto config = ParseModelConfig("name: \"x\"\nplatform: \"p\"\n    max_batch: 4\n", kPath);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(config.status().message(),
            "models/x/config.pbtxt:3:5: Message type \"inference.ModelConfig\" has no field "
            "named \"max_batch\".");
}

TEST(ParseModelConfigTest, ColumnCountsTabsAsProtobufDoes) {
  auto config = ParseModelConfig("name: \"x\"\n\tmax_batch: 4\n", kPath);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), StartsWith("models/x/config.pbtxt:2:9: "));
}

TEST(ParseModelConfigTest, SequenceBatchingIsRejectedByName) {
  auto config = ParseModelConfig("name: \"x\"\nsequence_batching { }\n", kPath);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              AllOf(StartsWith("models/x/config.pbtxt:2:1: "),
                    HasSubstr("has no field named \"sequence_batching\"")));
}

TEST(ParseModelConfigTest, SyntaxErrorNamesLineAndColumn) {
  auto config = ParseModelConfig("name: \"x\"\ninput [ { name: \"a\" dims: [ 1, ] } ]\n", kPath);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), StartsWith("models/x/config.pbtxt:2:"));
  EXPECT_THAT(config.status().message(), HasSubstr("Expected integer"));

  auto unterminated = ParseModelConfig("name: \"x\ninput { name: \"a\"", kPath);
  ASSERT_FALSE(unterminated.ok());
  EXPECT_THAT(unterminated.status().message(), StartsWith("models/x/config.pbtxt:1:"));
}

TEST(ParseModelConfigTest, UnknownEnumValueNamesValue) {
  auto config = ParseModelConfig("input { name: \"a\" data_type: TYPE_FLOAT }", kPath);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), AllOf(StartsWith("models/x/config.pbtxt:1:30: "),
                                               HasSubstr("TYPE_FLOAT"), HasSubstr("data_type")));
}

TEST(ParseModelConfigTest, TwoSchedulersAreRejected) {
  auto config = ParseModelConfig(
      "dynamic_batching { }\nensemble_scheduling { step { model_name: \"a\" } }\n", kPath);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              AllOf(StartsWith("models/x/config.pbtxt:2:"), HasSubstr("ensemble_scheduling"),
                    HasSubstr("dynamic_batching")));
}

void SetParameter(inference::ModelConfig& c, const std::string& key, const std::string& value) {
  (*c.mutable_parameters())[key].set_string_value(value);
}

// A small valid config every validation case starts from.
inference::ModelConfig ValidConfig() {
  return MustParse(R"cfg(
    name: "x"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    input { name: "in" data_type: TYPE_FP32 dims: [ 4 ] }
    output { name: "out" data_type: TYPE_FP32 dims: [ 2 ] }
    instance_group { count: 2 kind: KIND_CPU }
  )cfg");
}

struct RuleCase {
  std::string label;
  std::function<void(inference::ModelConfig&)> mutate;
  std::vector<std::string> expected;  // substrings of the message: field and value
};

class ValidationRuleTest : public testing::TestWithParam<RuleCase> {};

TEST_P(ValidationRuleTest, RejectsNamingFileFieldAndValue) {
  inference::ModelConfig config = ValidConfig();
  ASSERT_TRUE(ValidateModelConfig(config, kPath).ok());
  GetParam().mutate(config);
  const Status status = ValidateModelConfig(config, kPath);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), StartsWith(std::string(kPath) + ": "));
  for (const std::string& part : GetParam().expected) {
    EXPECT_THAT(status.message(), HasSubstr(part));
  }
}

using C = inference::ModelConfig;

INSTANTIATE_TEST_SUITE_P(
    Rules, ValidationRuleTest,
    testing::Values(
        RuleCase{"NegativeMaxBatch",
                 [](C& c) { c.set_max_batch_size(-3); },
                 {"models/x/config.pbtxt: max_batch_size must be >= 0; was -3"}},
        RuleCase{"EmptyName", [](C& c) { c.clear_name(); }, {"name must not be empty"}},
        RuleCase{"InputWithoutName",
                 [](C& c) { c.mutable_input(0)->clear_name(); },
                 {"input[0]: name must not be empty"}},
        RuleCase{"DuplicateOutput",
                 [](C& c) { *c.add_output() = c.output(0); },
                 {"output \"out\"", "unique", "used twice"}},
        RuleCase{"InvalidDataType",
                 [](C& c) { c.mutable_input(0)->set_data_type(inference::TYPE_INVALID); },
                 {"input \"in\": data_type must be set; was TYPE_INVALID"}},
        RuleCase{"UnknownDataTypeNumber",
                 [](C& c) { c.mutable_output(0)->set_data_type(inference::DataType(99)); },
                 {"output \"out\": data_type", "was 99"}},
        RuleCase{"EmptyDims",
                 [](C& c) { c.mutable_input(0)->clear_dims(); },
                 {"input \"in\": dims must not be empty", "was []"}},
        RuleCase{"ZeroDim",
                 [](C& c) { c.mutable_output(0)->add_dims(0); },
                 {"output \"out\": dims[1] must be >= 1 or -1; was 0"}},
        RuleCase{"NegativeDim",
                 [](C& c) { c.mutable_input(0)->set_dims(0, -2); },
                 {"input \"in\": dims[0] must be >= 1 or -1; was -2"}},
        RuleCase{"BadReshapeDim",
                 [](C& c) { c.mutable_input(0)->mutable_reshape()->add_shape(-5); },
                 {"input \"in\": reshape.shape[0] must be >= 1 or -1; was -5"}},
        RuleCase{"ReshapeElementCount",
                 [](C& c) { c.mutable_input(0)->mutable_reshape()->add_shape(3); },
                 {"input \"in\": reshape.shape [3]", "(3)", "dims [4] (4)"}},
        RuleCase{"PreferredBatchZero",
                 [](C& c) { c.mutable_dynamic_batching()->add_preferred_batch_size(0); },
                 {"dynamic_batching.preferred_batch_size[0] must be > 0; was 0"}},
        RuleCase{"PreferredBatchTooBig",
                 [](C& c) { c.mutable_dynamic_batching()->add_preferred_batch_size(16); },
                 {"dynamic_batching.preferred_batch_size[0] must be <= max_batch_size (8); "
                  "was 16"}},
        RuleCase{"DynamicBatchingWithoutBatching",
                 [](C& c) {
                   c.set_max_batch_size(0);
                   c.mutable_dynamic_batching();
                 },
                 {"dynamic_batching requires max_batch_size > 0; was 0"}},
        RuleCase{"DefaultPriorityWithoutLevels",
                 [](C& c) { c.mutable_dynamic_batching()->set_default_priority_level(2); },
                 {"dynamic_batching.default_priority_level must be 0 when priority_levels is "
                  "0; was 2"}},
        RuleCase{"DefaultPriorityOutOfRange",
                 [](C& c) {
                   c.mutable_dynamic_batching()->set_priority_levels(3);
                   c.mutable_dynamic_batching()->set_default_priority_level(4);
                 },
                 {"dynamic_batching.default_priority_level must be in 1..priority_levels (3); "
                  "was 4"}},
        RuleCase{"DefaultPriorityZeroWithLevels",
                 [](C& c) { c.mutable_dynamic_batching()->set_priority_levels(2); },
                 {"default_priority_level must be in 1..priority_levels (2); was 0"}},
        RuleCase{"PriorityPolicyKeyOutOfRange",
                 [](C& c) {
                   auto* db = c.mutable_dynamic_batching();
                   db->set_priority_levels(2);
                   db->set_default_priority_level(1);
                   (*db->mutable_priority_queue_policy())[5];
                 },
                 {"dynamic_batching.priority_queue_policy key must be in 1..priority_levels "
                  "(2); was 5"}},
        RuleCase{"NegativeInstanceCount",
                 [](C& c) { c.mutable_instance_group(0)->set_count(-1); },
                 {"instance_group[0].count must be >= 0; was -1"}},
        RuleCase{"NegativeGpuOrdinal",
                 [](C& c) {
                   c.mutable_instance_group(0)->set_kind(inference::ModelInstanceGroup::KIND_GPU);
                   c.mutable_instance_group(0)->add_gpus(-2);
                 },
                 {"instance_group[0].gpus must list device ordinals >= 0; was -2"}},
        RuleCase{"NegativeThreads",
                 [](C& c) { SetParameter(c, "shoal.instance_group.0.threads", "-2"); },
                 {"parameter \"shoal.instance_group.0.threads\" must be an integer >= 0; was "
                  "\"-2\""}},
        RuleCase{"NegativeCore",
                 [](C& c) { SetParameter(c, "shoal.instance_group.0.cpu_cores", "0,-4"); },
                 {"parameter \"shoal.instance_group.0.cpu_cores\"", "was \"-4\""}},
        RuleCase{"DuplicateCore",
                 [](C& c) { SetParameter(c, "shoal.instance_group.0.cpu_cores", "2-3,3"); },
                 {"must not list a core twice; was 3"}},
        RuleCase{"CoresDoNotSplit",
                 [](C& c) { SetParameter(c, "shoal.instance_group.0.cpu_cores", "0-2"); },
                 {"\"shoal.instance_group.0.cpu_cores\" must split evenly among count (2)",
                  "was [0, 1, 2]"}},
        RuleCase{"BackwardsRange",
                 [](C& c) { SetParameter(c, "shoal.instance_group.0.cpu_cores", "3-1"); },
                 {"core range \"3-1\" must not run backwards"}},
        RuleCase{"GroupParameterForMissingGroup",
                 [](C& c) { SetParameter(c, "shoal.instance_group.1.threads", "2"); },
                 {"\"shoal.instance_group.1.threads\" names instance_group[1], but the config "
                  "has 1 instance group(s)"}},
        RuleCase{"UnknownGroupSetting",
                 [](C& c) { SetParameter(c, "shoal.instance_group.0.cores", "1"); },
                 {"\"shoal.instance_group.0.cores\" must be"}},
        RuleCase{"SpecificVersionZero",
                 [](C& c) { c.mutable_version_policy()->mutable_specific()->add_versions(0); },
                 {"version_policy.specific.versions[0] must be > 0; was 0"}},
        RuleCase{"SpecificVersionsEmpty",
                 [](C& c) { c.mutable_version_policy()->mutable_specific(); },
                 {"version_policy.specific.versions must not be empty"}},
        RuleCase{"LatestZero",
                 [](C& c) { c.mutable_version_policy()->mutable_latest(); },
                 {"version_policy.latest.num_versions must be >= 1; was 0"}},
        RuleCase{"WarmupBatchTooBig",
                 [](C& c) {
                   auto* w = c.add_model_warmup();
                   w->set_name("w");
                   w->set_batch_size(9);
                 },
                 {"model_warmup \"w\": batch_size must be in 1..8", "was 9"}},
        RuleCase{"WarmupUnknownInput",
                 [](C& c) {
                   auto* w = c.add_model_warmup();
                   w->set_name("w");
                   w->set_batch_size(1);
                   auto& in = (*w->mutable_inputs())["nope"];
                   in.set_data_type(inference::TYPE_FP32);
                   in.set_random_data(true);
                 },
                 {"model_warmup \"w\" input \"nope\": the model declares no input named "
                  "\"nope\""}},
        RuleCase{"WarmupNoData",
                 [](C& c) {
                   auto* w = c.add_model_warmup();
                   w->set_name("w");
                   w->set_batch_size(1);
                   auto& in = (*w->mutable_inputs())["in"];
                   in.set_data_type(inference::TYPE_FP32);
                   in.add_dims(-1);
                 },
                 {"model_warmup \"w\" input \"in\": dims[0] must be >= 1; was -1",
                  "one of zero_data, random_data or input_data_file must be set"}},
        RuleCase{"WarmupFileOutsideTheModel",
                 [](C& c) {
                   auto* w = c.add_model_warmup();
                   w->set_name("w");
                   w->set_batch_size(1);
                   auto& in = (*w->mutable_inputs())["in"];
                   in.set_data_type(inference::TYPE_FP32);
                   in.add_dims(4);
                   in.set_input_data_file("../../secret.bin");
                 },
                 {"model_warmup \"w\" input \"in\": input_data_file must be a path inside the "
                  "model's warmup folder (relative, no '..'); was \"../../secret.bin\""}},
        RuleCase{"LabelFileOutsideTheModel",
                 [](C& c) { c.mutable_output(0)->set_label_filename("/etc/passwd"); },
                 {"label_filename must be a path inside the model's folder (relative, no "
                  "'..'); was \"/etc/passwd\""}},
        RuleCase{"LabelFileClimbingOut",
                 [](C& c) { c.mutable_output(0)->set_label_filename("labels/../../x.txt"); },
                 {"label_filename must be a path inside the model's folder"}},
        RuleCase{"NoPlatformOrBackend",
                 [](C& c) { c.clear_platform(); },
                 {"platform or backend must be set", "was neither"}},
        RuleCase{"EnsembleSchedulingOnOtherPlatform",
                 [](C& c) { c.mutable_ensemble_scheduling()->add_step()->set_model_name("a"); },
                 {"ensemble_scheduling requires platform \"ensemble\"; was "
                  "\"onnxruntime_onnx\""}},
        RuleCase{"EnsembleWithoutSteps",
                 [](C& c) { c.set_platform("ensemble"); },
                 {"platform \"ensemble\" requires ensemble_scheduling with at least one step; "
                  "was unset"}}),
    [](const testing::TestParamInfo<RuleCase>& info) { return info.param.label; });

TEST(ValidateModelConfigTest, ListsEveryBrokenRule) {
  inference::ModelConfig config = ValidConfig();
  config.set_max_batch_size(-1);
  config.mutable_input(0)->set_dims(0, 0);
  const Status status = ValidateModelConfig(config, kPath);
  EXPECT_THAT(status.message(), HasSubstr("max_batch_size must be >= 0; was -1\n"));
  EXPECT_THAT(status.message(), HasSubstr("\nmodels/x/config.pbtxt: input \"in\": dims[0]"));
}

TEST(ValidateModelConfigTest, FilesInsideTheModelFolderAreFine) {
  inference::ModelConfig config = ValidConfig();
  config.mutable_output(0)->set_label_filename("labels/classes..v2.txt");
  EXPECT_TRUE(ValidateModelConfig(config, kPath).ok())
      << ValidateModelConfig(config, kPath).ToString();
}

TEST(ValidateModelConfigTest, BackendAloneIsEnough) {
  inference::ModelConfig config = ValidConfig();
  config.clear_platform();
  config.set_backend("my_plugin");
  EXPECT_TRUE(ValidateModelConfig(config, kPath).ok());
}

// in -> [pre] -> mid -> [net] -> out
constexpr char kEnsemble[] = R"cfg(
  name: "pipe"
  platform: "ensemble"
  max_batch_size: 4
  input { name: "raw" data_type: TYPE_STRING dims: [ 1 ] }
  output { name: "scores" data_type: TYPE_FP32 dims: [ 10 ] }
  ensemble_scheduling {
    step {
      model_name: "pre"
      model_version: -1
      input_map { key: "bytes" value: "raw" }
      output_map { key: "tensor" value: "mid" }
    }
    step {
      model_name: "net"
      model_version: 2
      input_map { key: "x" value: "mid" }
      output_map { key: "y" value: "scores" }
    }
  }
)cfg";

Status ValidateEnsemble(const std::function<void(inference::ModelEnsembling&)>& mutate) {
  inference::ModelConfig config = MustParse(kEnsemble);
  mutate(*config.mutable_ensemble_scheduling());
  return ValidateModelConfig(config, kPath);
}

TEST(EnsembleValidationTest, ValidPipelinePasses) {
  const Status status = ValidateEnsemble([](auto&) {});
  EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST(EnsembleValidationTest, StepWithoutModelName) {
  const Status status = ValidateEnsemble([](auto& e) { e.mutable_step(1)->clear_model_name(); });
  EXPECT_THAT(status.message(), HasSubstr("ensemble_scheduling.step[1].model_name must not be "
                                          "empty"));
}

TEST(EnsembleValidationTest, EnsembleInputNotConsumed) {
  const Status status = ValidateEnsemble(
      [](auto& e) { (*e.mutable_step(0)->mutable_input_map())["bytes"] = "other"; });
  EXPECT_THAT(status.message(), HasSubstr("ensemble input \"raw\" must be consumed by a step's "
                                          "input_map"));
  EXPECT_THAT(status.message(), HasSubstr("reads tensor \"other\", which is neither"));
}

TEST(EnsembleValidationTest, EnsembleOutputNotProduced) {
  const Status status =
      ValidateEnsemble([](auto& e) { (*e.mutable_step(1)->mutable_output_map())["y"] = "unused"; });
  EXPECT_THAT(status.message(), HasSubstr("ensemble output \"scores\" must be produced by a "
                                          "step's output_map"));
}

TEST(EnsembleValidationTest, OutputProducedTwice) {
  const Status status = ValidateEnsemble(
      [](auto& e) { (*e.mutable_step(0)->mutable_output_map())["extra"] = "scores"; });
  EXPECT_THAT(status.message(),
              HasSubstr("ensemble tensor \"scores\" must be produced by one step; was by "
                        "[ensemble_scheduling.step[0] (model \"pre\"), "
                        "ensemble_scheduling.step[1] (model \"net\")]"));
}

TEST(EnsembleValidationTest, IntermediateProducedTwice) {
  const Status status = ValidateEnsemble([](auto& e) {
    auto* step = e.add_step();
    step->set_model_name("other");
    (*step->mutable_input_map())["a"] = "raw";
    (*step->mutable_output_map())["b"] = "mid";
  });
  EXPECT_THAT(status.message(), HasSubstr("ensemble tensor \"mid\" must be produced by one step"));
}

TEST(EnsembleValidationTest, ProducingAnEnsembleInputIsRejected) {
  const Status status =
      ValidateEnsemble([](auto& e) { (*e.mutable_step(1)->mutable_output_map())["z"] = "raw"; });
  EXPECT_THAT(status.message(), HasSubstr("ensemble tensor \"raw\" is an ensemble input but "
                                          "ensemble_scheduling.step[1] (model \"net\") also "
                                          "produces it"));
}

TEST(EnsembleValidationTest, CycleIsRejected) {
  // pre reads "loop" (made by net) as well as "raw": pre -> net -> pre.
  const Status status = ValidateEnsemble([](auto& e) {
    (*e.mutable_step(0)->mutable_input_map())["feedback"] = "loop";
    (*e.mutable_step(1)->mutable_output_map())["state"] = "loop";
  });
  EXPECT_THAT(status.message(),
              HasSubstr("ensemble_scheduling steps must form an acyclic graph; these steps are "
                        "on or behind a cycle: [ensemble_scheduling.step[0] (model \"pre\"), "
                        "ensemble_scheduling.step[1] (model \"net\")]"));
}

TEST(EnsembleValidationTest, StepRunningTheEnsembleItself) {
  const Status status =
      ValidateEnsemble([](auto& e) { e.mutable_step(1)->set_model_name("pipe"); });
  EXPECT_THAT(status.message(), HasSubstr("step[1] (model \"pipe\") must not run the ensemble "
                                          "itself"));
}

TEST(InstanceCoresTest, SplitRule) {
  inference::ModelConfig config;
  inference::ModelInstanceGroup& group = *config.add_instance_group();
  EXPECT_EQ(InstanceCount(group), 1);
  EXPECT_TRUE(InstanceCores(config, 0, 0).empty());

  group.set_count(2);
  SetParameter(config, InstanceGroupParameter(0, "cpu_cores"), "4-6, 7");
  EXPECT_EQ(InstanceCores(config, 0, 0), (std::vector<int>{4, 5}));
  EXPECT_EQ(InstanceCores(config, 0, 1), (std::vector<int>{6, 7}));
  EXPECT_TRUE(InstanceCores(config, 0, 2).empty());
  EXPECT_TRUE(InstanceCores(config, 0, -1).empty());
  EXPECT_TRUE(InstanceCores(config, 1, 0).empty()) << "no group 1";

  group.set_count(4);  // one core each
  EXPECT_EQ(InstanceCores(config, 0, 3), (std::vector<int>{7}));

  group.set_count(0);  // default one instance gets every core
  EXPECT_EQ(InstanceCores(config, 0, 0), (std::vector<int>{4, 5, 6, 7}));
}

TEST(InstanceGroupParameterTest, KeysListsAndThreads) {
  EXPECT_EQ(InstanceGroupParameter(3, "cpu_cores"), "shoal.instance_group.3.cpu_cores");
  EXPECT_EQ(*ParseCoreList("0-3,8, 10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  for (const char* bad : {"", "1,", "a", "-1", "1-", "2-1", "70000", "0-65536"}) {
    EXPECT_FALSE(ParseCoreList(bad).ok()) << bad;
  }
  inference::ModelConfig config;
  config.add_instance_group();
  EXPECT_EQ(GroupThreads(config, 0), 0);
  SetParameter(config, "shoal.instance_group.0.threads", "3");
  EXPECT_EQ(GroupThreads(config, 0), 3);
}

// The old spelling inside instance_group still loads, as parameters; the config then has
// only Triton's fields, so its JSON parses strictly (unknown fields refused) as
// inference.ModelConfig, the way Triton's tools parse it, and round-trips.
TEST(ParseModelConfigTest, OldGroupSpellingBecomesParametersAndJsonStaysInTritonsSchema) {
  auto c = ParseModelConfig(R"cfg(
    name: "x"
    backend: "onnx"
    instance_group [ { count: 2 kind: KIND_CPU cpu_cores: [ 0, 1 ] threads: 1 },
                     { count: 1 kind: KIND_CPU } ]
    parameters { key: "shoal.instance_group.1.cpu_cores" value { string_value: "4-5" } }
  )cfg",
                            kPath);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(ValidateModelConfig(*c, kPath).ok()) << ValidateModelConfig(*c, kPath).ToString();
  EXPECT_EQ(c->parameters().at("shoal.instance_group.0.cpu_cores").string_value(), "0,1");
  EXPECT_EQ(c->parameters().at("shoal.instance_group.0.threads").string_value(), "1");
  EXPECT_EQ(InstanceCores(*c, 0, 1), (std::vector<int>{1}));
  EXPECT_EQ(InstanceCores(*c, 1, 0), (std::vector<int>{4, 5}));
  EXPECT_EQ(GroupThreads(*c, 0), 1);

  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.always_print_primitive_fields = true;
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(*c, &json, print).ok());
  EXPECT_THAT(json, Not(HasSubstr("\"cpu_cores\"")));
  EXPECT_THAT(json, Not(HasSubstr("\"threads\"")));
  google::protobuf::util::JsonParseOptions strict;
  strict.ignore_unknown_fields = false;
  inference::ModelConfig back;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &back, strict);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString() << "\n" << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(back, *c));
}

TEST(ParseModelConfigTest, BothSpellingsForOneGroupAreRefused) {
  auto c = ParseModelConfig(R"cfg(
    name: "x"
    instance_group [ { count: 1 threads: 2 } ]
    parameters { key: "shoal.instance_group.0.threads" value { string_value: "4" } }
  )cfg",
                            kPath);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              AllOf(StartsWith(kPath), HasSubstr("instance_group[0] sets threads twice"),
                    HasSubstr("shoal.instance_group.0.threads")));
}

// Not a fuzzer: feeds every prefix of a real config and seeded random garbage to the
// parser and checks for errors with a well-formed message instead of crashes.
TEST(ParseModelConfigRobustnessTest, TruncatedAndGarbageInputGiveErrors) {
  const std::string full = kFullConfig;
  int failures = 0;
  for (size_t length = 0; length < full.size(); ++length) {
    auto config = ParseModelConfig(std::string_view(full).substr(0, length), kPath);
    if (config.ok()) {
      (void)ValidateModelConfig(*config, kPath);  // must not crash either
      continue;
    }
    ++failures;
    EXPECT_THAT(config.status().message(), StartsWith(std::string(kPath) + ":"));
  }
  EXPECT_GT(failures, static_cast<int>(full.size()) / 2);

  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]<>:,;\"'\\#-0123456789.eE_ abcxyzTYPE\n\t\x01\xff";
  for (int round = 0; round < 500; ++round) {
    std::string garbage;
    const size_t length = 1 + rng() % 200;
    for (size_t i = 0; i < length; ++i) {
      garbage += round % 2 ? static_cast<char>(rng() & 0xff) : alphabet[rng() % alphabet.size()];
    }
    garbage += "\n}";  // a stray brace on its own line: never valid at top level
    auto config = ParseModelConfig(garbage, kPath);
    ASSERT_FALSE(config.ok()) << garbage;
    EXPECT_THAT(config.status().message(), StartsWith(std::string(kPath) + ":"));
  }

  // Unterminated constructs at the end of large input.
  EXPECT_FALSE(ParseModelConfig("name: \"" + std::string(1 << 20, 'a'), kPath).ok());
  EXPECT_FALSE(ParseModelConfig("input { dims: [ " + std::string(1 << 20, '1'), kPath).ok());
  EXPECT_FALSE(ParseModelConfig(std::string(100000, '{'), kPath).ok());
}

}  // namespace
}  // namespace shoal::repository
