// Parsing and validating a model's config.pbtxt (Triton text format of
// inference.ModelConfig, see model_config.proto).
//
// Use ParseModelConfig + ValidateModelConfig when you hold the text of one config; use
// ScanRepository / ScanModel (repository.h) to read a whole model folder, which also
// fills in what the folder implies (the model name, a platform inferred from model.onnx)
// before validating.
//
// All functions are thread-safe and pure but for one side effect: ParseModelConfig logs
// (spdlog) a deprecation warning, once per process, when a config uses the old spelling
// of shoal's instance-group extensions (below). Every error is kInvalidArgument and its message
// starts with the `path` the caller passed (only used for messages; nothing is read from it), then
// names the field and the offending value, e.g.
//   models/x/config.pbtxt:3:5: Message type "inference.ModelConfig" has no field named "max_batch"
//   models/x/config.pbtxt: max_batch_size must be >= 0; was -3
// When a config breaks several rules, the message lists each on its own line.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/data_type.h"
#include "core/status.h"
#include "repository/model_config.pb.h"

namespace shoal::repository {

// The platform given to models whose folder holds model.onnx but names none.
inline constexpr std::string_view kOnnxPlatform = "onnxruntime_onnx";
// The platform of pipelines of models (ensemble_scheduling).
inline constexpr std::string_view kEnsemblePlatform = "ensemble";

// Parses config.pbtxt text. Syntax errors, unknown fields (including Triton features
// shoal does not implement, such as sequence_batching) and unknown enum values give
// kInvalidArgument "path:line:column: <protobuf's description>" (1-based line and
// column). Does not validate; call ValidateModelConfig next.
//
// Old spelling: `cpu_cores: [...]` and `threads: N` inside an instance_group (shoal's
// fields before they became parameters) are still read, and moved into the parameters
// InstanceGroupParameter names (cores as a comma-separated list); a config that sets
// both spellings for one group is kInvalidArgument.
StatusOr<inference::ModelConfig> ParseModelConfig(std::string_view text, const std::string& path);

// Parses a config in Triton's JSON form of inference.ModelConfig (the `config` parameter
// of a model load request: field names as in the .proto, 64-bit integers as numbers or
// strings). Unknown fields and malformed JSON give kInvalidArgument "path: <reason>".
// Does not validate; ScanModel with the override validates it like a config.pbtxt.
StatusOr<inference::ModelConfig> ParseModelConfigJson(std::string_view json,
                                                      const std::string& path);

// shoal's per-group settings live in the model's `parameters` map, which keeps the config
// within Triton's ModelConfig schema: the key "shoal.instance_group.<group_index>.<setting>"
// for setting
//   "cpu_cores"  logical CPUs the group's instances are pinned to: numbers and inclusive
//                ranges, comma-separated ("0-3,8,9"); split among the instances as
//                InstanceCores says;
//   "threads"    intra-op threads per instance (0: one per pinned core, or the backend's
//                default), overriding the onnx backend's intra_op_thread_count.
std::string InstanceGroupParameter(int group_index, std::string_view setting);
// The group's cores (empty when unset or malformed; ValidateModelConfig reports the
// latter), and its threads per instance (0 when unset or malformed).
std::vector<int> GroupCpuCores(const inference::ModelConfig& config, int group_index);
int GroupThreads(const inference::ModelConfig& config, int group_index);
// Parses a core list as in the cpu_cores parameter; kInvalidArgument naming the bad item.
StatusOr<std::vector<int>> ParseCoreList(std::string_view text);

// Checks the rules protobuf cannot express (full list in model_config.cc):
//   * name non-empty; max_batch_size >= 0;
//   * each input/output: non-empty unique name, data_type set, non-empty dims unless it
//     has a reshape, every dim >= 1 or -1, reshape consistent with dims;
//   * dynamic_batching needs max_batch_size > 0; preferred_batch_size in 1..max_batch_size;
//     default_priority_level in 1..priority_levels (0 when priority_levels is 0);
//     priority_queue_policy keys in 1..priority_levels;
//   * instance_group: count >= 0; its parameters (InstanceGroupParameter): cpu_cores a
//     valid list of unique cores that splits among the instances (see InstanceCores),
//     threads an integer >= 0; every "shoal.instance_group." key names an existing group
//     and a known setting;
//   * version_policy: latest.num_versions >= 1, specific versions >= 1 and not empty;
//   * model_warmup: named, batch_size in 1..max(max_batch_size, 1), inputs with data_type,
//     dims >= 1 and a data source, naming declared inputs when inputs are declared;
//   * platform "ensemble": ensemble_scheduling with >= 1 step, each with model_name;
//     every ensemble input consumed, every ensemble output produced by exactly one step,
//     no tensor produced twice, every step input available, steps acyclic;
//     ensemble_scheduling on a non-ensemble platform is rejected;
//   * any other config names a platform or a backend.
// Returns OK or kInvalidArgument listing every broken rule.
Status ValidateModelConfig(const inference::ModelConfig& config, const std::string& path);

// Instances the group creates: count, or 1 when count is 0.
int InstanceCount(const inference::ModelInstanceGroup& group);

// The CPU cores instance `instance_index` (0-based, within group `group_index`) is
// pinned to, from the group's cpu_cores parameter: empty when the group lists no cores;
// one core each when the list has InstanceCount() entries; otherwise the instance's
// contiguous slice of size() / InstanceCount() cores. Meant for validated configs; for an
// index outside the group or the config returns empty.
std::vector<int> InstanceCores(const inference::ModelConfig& config, int group_index,
                               int instance_index);

// inference::DataType and shoal::DataType share their numbers.
inline DataType FromConfigDataType(inference::DataType type) { return static_cast<DataType>(type); }
inline inference::DataType ToConfigDataType(DataType type) {
  return static_cast<inference::DataType>(type);
}

}  // namespace shoal::repository
