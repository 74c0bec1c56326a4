#include "repository/model_config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "core/log_text.h"

namespace shoal::repository {

static_assert(static_cast<int>(inference::TYPE_FP32) == static_cast<int>(DataType::kFp32));
static_assert(static_cast<int>(inference::TYPE_STRING) == static_cast<int>(DataType::kBytes));
static_assert(static_cast<int>(inference::TYPE_BF16) == static_cast<int>(DataType::kBf16));

namespace {

// Messages beyond this many are summarised, so a pathological config cannot produce an
// unbounded error text.
constexpr size_t kMaxProblems = 32;

template <typename... Args>
std::string Cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

std::string Quote(std::string_view s) { return Cat('"', s, '"'); }

template <typename Container>
std::string ListText(const Container& values) {
  std::ostringstream out;
  out << '[';
  bool first = true;
  for (const auto& v : values) {
    out << (first ? "" : ", ") << v;
    first = false;
  }
  out << ']';
  return out.str();
}

// Collects one line per broken rule, each starting with the config's path.
class Problems {
 public:
  explicit Problems(const std::string& path) : path_(path) {}

  template <typename... Args>
  void Add(const Args&... args) {
    ++count_;
    if (lines_.size() < kMaxProblems) lines_.push_back(Cat(path_, ": ", args...));
  }

  Status ToStatus() const {
    if (lines_.empty()) return Status::Ok();
    std::string message;
    for (const std::string& line : lines_) {
      if (!message.empty()) message += '\n';
      message += line;
    }
    if (count_ > lines_.size()) {
      message += Cat('\n', path_, ": ... and ", count_ - lines_.size(), " more problems");
    }
    return InvalidArgument(std::move(message));
  }

 private:
  const std::string& path_;
  std::vector<std::string> lines_;
  size_t count_ = 0;
};

// The tokenizer's column: tabs advance to the next multiple of 8.
constexpr int kTabWidth = 8;

// Collects protobuf's parse errors as "line:column: description", 1-based.
class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit ParseErrors(std::string_view text) : text_(text) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (lines_.size() >= kMaxProblems) return;
    column = PointAtName(line, column, message);
    lines_.push_back(Cat(line + 1, ':', column + 1, ": ", message));
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}

  Status ToStatus(const std::string& path) const {
    if (lines_.empty()) return InvalidArgument(Cat(path, ": cannot parse config"));
    std::string message;
    for (const std::string& line : lines_) {
      if (!message.empty()) message += '\n';
      message += Cat(path, ':', line);
    }
    return InvalidArgument(std::move(message));
  }

 private:
  // protobuf reports an unknown field or enum value at the token after it; move the
  // column back to the start of the name when it is on the same line.
  int PointAtName(int line, int column, const std::string& message) const {
    std::string name;
    for (std::string_view marker : {"has no field named \"", "Unknown enumeration value of \""}) {
      const size_t at = message.find(marker);
      if (at == std::string::npos) continue;
      const size_t begin = at + marker.size();
      const size_t end = message.find('"', begin);
      if (end != std::string::npos) name = message.substr(begin, end - begin);
      break;
    }
    if (name.empty()) return column;
    size_t line_start = 0;
    for (int i = 0; i < line; ++i) {
      line_start = text_.find('\n', line_start);
      if (line_start == std::string_view::npos) return column;
      ++line_start;
    }
    std::string_view text = text_.substr(line_start);
    text = text.substr(0, text.find('\n'));
    // Byte offset of each tokenizer column on this line, up to the reported one.
    std::vector<int> columns;
    int col = 0;
    size_t limit = 0;
    for (; limit < text.size() && col < column; ++limit) {
      columns.push_back(col);
      col = text[limit] == '\t' ? col + kTabWidth - col % kTabWidth : col + 1;
    }
    const size_t found = text.substr(0, limit).rfind(name);
    if (found == std::string_view::npos) return column;
    return columns[found];
  }

  std::string_view text_;
  std::vector<std::string> lines_;
};

bool IsValidDim(int64_t dim) { return dim >= 1 || dim == -1; }

// Product of the dims; nullopt when one is variable (-1) or invalid, or on overflow.
template <typename Dims>
std::optional<int64_t> ElementCount(const Dims& dims) {
  int64_t count = 1;
  for (int64_t d : dims) {
    if (d < 1 || count > INT64_MAX / d) return std::nullopt;
    count *= d;
  }
  return count;
}

std::string TensorLabel(std::string_view kind, int index, const std::string& name) {
  return name.empty() ? Cat(kind, '[', index, ']') : Cat(kind, ' ', Quote(name));
}

template <typename Tensor>
void CheckTensors(const google::protobuf::RepeatedPtrField<Tensor>& tensors, std::string_view kind,
                  Problems& problems) {
  std::set<std::string> seen;
  for (int i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string where = TensorLabel(kind, i, t.name());
    if (t.name().empty()) {
      problems.Add(where, ": name must not be empty");
    } else if (!seen.insert(t.name()).second) {
      problems.Add(where, ": name must be unique among the ", kind, "s; was used twice");
    }
    if (t.data_type() == inference::TYPE_INVALID) {
      problems.Add(where, ": data_type must be set; was TYPE_INVALID");
    } else if (!inference::DataType_IsValid(t.data_type())) {
      problems.Add(where, ": data_type must be a known type; was ", t.data_type());
    }
    if (t.dims_size() == 0 && !t.has_reshape()) {
      problems.Add(where, ": dims must not be empty (a scalar is dims: [ 1 ] with reshape: ",
                   "{ shape: [ ] }); was []");
    }
    for (int j = 0; j < t.dims_size(); ++j) {
      if (!IsValidDim(t.dims(j))) {
        problems.Add(where, ": dims[", j, "] must be >= 1 or -1; was ", t.dims(j));
      }
    }
    if (!t.has_reshape()) continue;
    const auto& shape = t.reshape().shape();
    for (int j = 0; j < shape.size(); ++j) {
      if (!IsValidDim(shape[j])) {
        problems.Add(where, ": reshape.shape[", j, "] must be >= 1 or -1; was ", shape[j]);
      }
    }
    const auto from = ElementCount(t.dims());
    const auto to = ElementCount(shape);
    if (from && to && *from != *to) {
      problems.Add(where, ": reshape.shape ", ListText(shape), " must hold as many elements (", *to,
                   ") as dims ", ListText(t.dims()), " (", *from, ")");
    }
  }
}

void CheckDynamicBatching(const inference::ModelConfig& config, Problems& problems) {
  if (!config.has_dynamic_batching()) return;
  const auto& db = config.dynamic_batching();
  const int32_t max_batch = config.max_batch_size();
  if (max_batch <= 0) {
    problems.Add("dynamic_batching requires max_batch_size > 0; was ", max_batch);
  }
  for (int i = 0; i < db.preferred_batch_size_size(); ++i) {
    const int32_t size = db.preferred_batch_size(i);
    if (size <= 0) {
      problems.Add("dynamic_batching.preferred_batch_size[", i, "] must be > 0; was ", size);
    } else if (max_batch > 0 && size > max_batch) {
      problems.Add("dynamic_batching.preferred_batch_size[", i, "] must be <= max_batch_size (",
                   max_batch, "); was ", size);
    }
  }
  const uint64_t levels = db.priority_levels();
  const uint64_t default_level = db.default_priority_level();
  if (levels == 0 && default_level != 0) {
    problems.Add("dynamic_batching.default_priority_level must be 0 when priority_levels is 0; ",
                 "was ", default_level);
  } else if (levels > 0 && (default_level < 1 || default_level > levels)) {
    problems.Add("dynamic_batching.default_priority_level must be in 1..priority_levels (", levels,
                 "); was ", default_level);
  }
  std::set<uint64_t> keys;
  for (const auto& [level, policy] : db.priority_queue_policy()) keys.insert(level);
  for (uint64_t level : keys) {
    if (level < 1 || level > levels) {
      problems.Add("dynamic_batching.priority_queue_policy key must be in 1..priority_levels (",
                   levels, "); was ", level);
    }
  }
}

constexpr std::string_view kGroupParameterPrefix = "shoal.instance_group.";

// Checks the "shoal.instance_group.*" parameters: known settings of existing groups, with
// valid values.
void CheckInstanceGroupParameters(const inference::ModelConfig& config, Problems& problems) {
  for (const auto& [key, value] : config.parameters()) {
    if (key.rfind(kGroupParameterPrefix, 0) != 0) continue;
    const std::string_view rest = std::string_view(key).substr(kGroupParameterPrefix.size());
    const size_t dot = rest.find('.');
    int index = -1;
    const std::string_view number = rest.substr(0, dot == std::string_view::npos ? 0 : dot);
    auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), index);
    const std::string_view setting =
        dot == std::string_view::npos ? std::string_view() : rest.substr(dot + 1);
    if (number.empty() || ec != std::errc() || ptr != number.data() + number.size() ||
        (setting != "cpu_cores" && setting != "threads")) {
      problems.Add("parameter ", Quote(key), " must be ", Quote(kGroupParameterPrefix),
                   "<group index>.cpu_cores or .threads");
      continue;
    }
    if (index < 0 || index >= config.instance_group_size()) {
      problems.Add("parameter ", Quote(key), " names instance_group[", index,
                   "], but the config has ", config.instance_group_size(), " instance group(s)");
      continue;
    }
    const std::string& text = value.string_value();
    if (setting == "threads") {
      int threads = -1;
      auto [tptr, tec] = std::from_chars(text.data(), text.data() + text.size(), threads);
      if (text.empty() || tec != std::errc() || tptr != text.data() + text.size() || threads < 0) {
        problems.Add("parameter ", Quote(key), " must be an integer >= 0; was ", Quote(text));
      }
      continue;
    }
    auto cores = ParseCoreList(text);
    if (!cores.ok()) {
      problems.Add("parameter ", Quote(key), ": ", cores.status().message());
      continue;
    }
    std::set<int> seen;
    for (int core : *cores) {
      if (!seen.insert(core).second) {
        problems.Add("parameter ", Quote(key), " must not list a core twice; was ", core, " again");
        break;
      }
    }
    const auto& group = config.instance_group(index);
    const int instances = InstanceCount(group);
    if (group.count() >= 0 && cores->size() % static_cast<size_t>(instances) != 0) {
      problems.Add("parameter ", Quote(key), " must split evenly among count (", instances,
                   ") instances: one core each, or a multiple of ", instances, " cores; was ",
                   ListText(*cores));
    }
  }
}

void CheckInstanceGroups(const inference::ModelConfig& config, Problems& problems) {
  for (int i = 0; i < config.instance_group_size(); ++i) {
    const auto& group = config.instance_group(i);
    const std::string where = Cat("instance_group[", i, ']');
    if (group.count() < 0) problems.Add(where, ".count must be >= 0; was ", group.count());
    for (int gpu : group.gpus())
      if (gpu < 0) problems.Add(where, ".gpus must list device ordinals >= 0; was ", gpu);
  }
  CheckInstanceGroupParameters(config, problems);
}

// config.pbtxt's old spelling of the group extensions: the schema of ModelConfig with
// ModelInstanceGroup's former fields cpu_cores (100) and threads (101) put back, built
// once into a pool of its own. Its messages have inference.ModelConfig's names, so parse
// errors read the same.
struct LegacySchema {
  google::protobuf::DescriptorPool pool;
  google::protobuf::DynamicMessageFactory factory;
  const google::protobuf::Message* prototype = nullptr;
  const google::protobuf::FieldDescriptor* instance_group = nullptr;
  const google::protobuf::FieldDescriptor* cpu_cores = nullptr;
  const google::protobuf::FieldDescriptor* threads = nullptr;
};

const LegacySchema& Legacy() {
  static const LegacySchema* const schema = [] {
    using google::protobuf::FieldDescriptorProto;
    auto* s = new LegacySchema();
    google::protobuf::FileDescriptorProto file;
    inference::ModelConfig::descriptor()->file()->CopyTo(&file);
    for (auto& message : *file.mutable_message_type()) {
      if (message.name() != "ModelInstanceGroup") continue;
      auto* reserved = message.mutable_reserved_range();
      for (int i = reserved->size() - 1; i >= 0; --i) {
        if (reserved->Get(i).start() >= 100) reserved->DeleteSubrange(i, 1);
      }
      auto* cores = message.add_field();
      cores->set_name("cpu_cores");
      cores->set_json_name("cpuCores");
      cores->set_number(100);
      cores->set_label(FieldDescriptorProto::LABEL_REPEATED);
      cores->set_type(FieldDescriptorProto::TYPE_INT32);
      auto* threads = message.add_field();
      threads->set_name("threads");
      threads->set_json_name("threads");
      threads->set_number(101);
      threads->set_label(FieldDescriptorProto::LABEL_OPTIONAL);
      threads->set_type(FieldDescriptorProto::TYPE_INT32);
    }
    const google::protobuf::FileDescriptor* built = s->pool.BuildFile(file);
    if (built == nullptr) return s;  // prototype stays null: ParseModelConfig says so
    const auto* config = built->FindMessageTypeByName("ModelConfig");
    const auto* group = built->FindMessageTypeByName("ModelInstanceGroup");
    s->prototype = s->factory.GetPrototype(config);
    s->instance_group = config->FindFieldByName("instance_group");
    s->cpu_cores = group->FindFieldByName("cpu_cores");
    s->threads = group->FindFieldByName("threads");
    return s;
  }();
  return *schema;
}

// Moves the old-spelling group settings of `legacy` into `config`'s parameters; reports
// whether there were any.
StatusOr<bool> MoveLegacyGroupSettings(const google::protobuf::Message& legacy,
                                       const std::string& path, inference::ModelConfig* config) {
  const LegacySchema& schema = Legacy();
  const auto* reflection = legacy.GetReflection();
  bool found = false;
  for (int i = 0; i < reflection->FieldSize(legacy, schema.instance_group); ++i) {
    const auto& group = reflection->GetRepeatedMessage(legacy, schema.instance_group, i);
    const auto* g = group.GetReflection();
    std::vector<std::pair<std::string, std::string>> moved;
    if (const int n = g->FieldSize(group, schema.cpu_cores); n > 0) {
      std::string list;
      for (int j = 0; j < n; ++j) {
        list += (j ? "," : "") + std::to_string(g->GetRepeatedInt32(group, schema.cpu_cores, j));
      }
      moved.emplace_back("cpu_cores", std::move(list));
    }
    if (const int threads = g->GetInt32(group, schema.threads); threads != 0) {
      moved.emplace_back("threads", std::to_string(threads));
    }
    for (auto& [setting, value] : moved) {
      const std::string key = InstanceGroupParameter(i, setting);
      if (config->parameters().count(key) != 0) {
        return InvalidArgument(Cat(path, ": instance_group[", i, "] sets ", setting,
                                   " twice: as the deprecated field and as parameter ", Quote(key),
                                   "; keep the parameter"));
      }
      (*config->mutable_parameters())[key].set_string_value(std::move(value));
      found = true;
    }
  }
  return found;
}

void CheckVersionPolicy(const inference::ModelConfig& config, Problems& problems) {
  const auto& policy = config.version_policy();
  if (policy.has_latest() && policy.latest().num_versions() == 0) {
    problems.Add("version_policy.latest.num_versions must be >= 1; was 0");
  }
  if (policy.has_specific()) {
    const auto& versions = policy.specific().versions();
    if (versions.empty()) problems.Add("version_policy.specific.versions must not be empty");
    for (int i = 0; i < versions.size(); ++i) {
      if (versions[i] <= 0) {
        problems.Add("version_policy.specific.versions[", i, "] must be > 0; was ", versions[i]);
      }
    }
  }
}

// A file a config names (label_filename, a warmup's input_data_file) must stay inside the
// model's folder: a config can come from the network (a load with a config override), and
// the server reads these files and, for labels, sends their contents to clients.
bool IsContainedRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    if (path.substr(start, end - start) == "..") return false;
    start = end + 1;
  }
  return true;
}

void CheckFileNames(const inference::ModelConfig& config, Problems& problems) {
  for (int i = 0; i < config.output_size(); ++i) {
    const auto& output = config.output(i);
    if (!output.label_filename().empty() && !IsContainedRelativePath(output.label_filename())) {
      problems.Add(TensorLabel("output", i, output.name()),
                   ": label_filename must be a path inside the model's folder (relative, no "
                   "'..'); was ",
                   Quote(output.label_filename()));
    }
  }
  for (int i = 0; i < config.model_warmup_size(); ++i) {
    const auto& warmup = config.model_warmup(i);
    for (const auto& [name, input] : warmup.inputs()) {
      if (input.input_data_type_case() == inference::ModelWarmup::Input::kInputDataFile &&
          !IsContainedRelativePath(input.input_data_file())) {
        problems.Add(TensorLabel("model_warmup", i, warmup.name()), " input ", Quote(name),
                     ": input_data_file must be a path inside the model's warmup folder "
                     "(relative, no '..'); was ",
                     Quote(input.input_data_file()));
      }
    }
  }
}

void CheckWarmup(const inference::ModelConfig& config, Problems& problems) {
  std::map<std::string, inference::DataType> declared;
  for (const auto& input : config.input()) declared.emplace(input.name(), input.data_type());
  const int64_t max_batch = std::max<int64_t>(config.max_batch_size(), 1);
  for (int i = 0; i < config.model_warmup_size(); ++i) {
    const auto& warmup = config.model_warmup(i);
    const std::string where = TensorLabel("model_warmup", i, warmup.name());
    if (warmup.name().empty()) problems.Add(where, ": name must not be empty");
    if (warmup.batch_size() < 1 || warmup.batch_size() > max_batch) {
      problems.Add(where, ": batch_size must be in 1..", max_batch,
                   " (max_batch_size, or 1 without batching); was ", warmup.batch_size());
    }
    const std::map<std::string, inference::ModelWarmup::Input> inputs(warmup.inputs().begin(),
                                                                      warmup.inputs().end());
    for (const auto& [name, input] : inputs) {
      const std::string at = Cat(where, " input ", Quote(name));
      if (input.data_type() == inference::TYPE_INVALID ||
          !inference::DataType_IsValid(input.data_type())) {
        problems.Add(at, ": data_type must be a known type; was ",
                     inference::DataType_Name(input.data_type()));
      }
      for (int j = 0; j < input.dims_size(); ++j) {
        if (input.dims(j) < 1) {
          problems.Add(at, ": dims[", j, "] must be >= 1; was ", input.dims(j));
        }
      }
      if (input.input_data_type_case() == inference::ModelWarmup::Input::INPUT_DATA_TYPE_NOT_SET) {
        problems.Add(at, ": one of zero_data, random_data or input_data_file must be set");
      }
      if (!declared.empty()) {
        auto it = declared.find(name);
        if (it == declared.end()) {
          problems.Add(at, ": the model declares no input named ", Quote(name));
        } else if (it->second != input.data_type()) {
          problems.Add(at, ": data_type must match the input's ",
                       inference::DataType_Name(it->second), "; was ",
                       inference::DataType_Name(input.data_type()));
        }
      }
    }
  }
}

std::string StepLabel(const inference::ModelEnsembling& ensemble, int index) {
  return Cat("ensemble_scheduling.step[", index, "] (model ",
             Quote(ensemble.step(index).model_name()), ')');
}

// Which steps produce and consume each ensemble tensor (sorted maps: stable messages).
struct EnsembleTensors {
  std::set<std::string> inputs;  // the ensemble's own inputs
  std::map<std::string, std::vector<int>> producers;
  std::map<std::string, std::vector<int>> consumers;
};

// Checks each step on its own and records the tensors it reads and writes.
void CheckEnsembleSteps(const inference::ModelConfig& config, EnsembleTensors& tensors,
                        Problems& problems) {
  const auto& ensemble = config.ensemble_scheduling();
  for (int i = 0; i < ensemble.step_size(); ++i) {
    const auto& step = ensemble.step(i);
    const std::string where = StepLabel(ensemble, i);
    if (step.model_name().empty()) {
      problems.Add("ensemble_scheduling.step[", i, "].model_name must not be empty");
    } else if (step.model_name() == config.name()) {
      problems.Add(where, " must not run the ensemble itself");
    }
    if (step.model_version() < -1) {
      problems.Add(where, ".model_version must be >= -1 (-1 = latest); was ", step.model_version());
    }
    const std::map<std::string, std::string> inputs(step.input_map().begin(),
                                                    step.input_map().end());
    const std::map<std::string, std::string> outputs(step.output_map().begin(),
                                                     step.output_map().end());
    for (const auto& [model_tensor, tensor] : inputs) {
      if (tensor.empty()) {
        problems.Add(where, ".input_map[", Quote(model_tensor), "] must name a tensor; was \"\"");
      } else {
        tensors.consumers[tensor].push_back(i);
      }
    }
    for (const auto& [model_tensor, tensor] : outputs) {
      if (tensor.empty()) {
        problems.Add(where, ".output_map[", Quote(model_tensor), "] must name a tensor; was \"\"");
      } else {
        tensors.producers[tensor].push_back(i);
      }
    }
  }
}

// Every tensor has one source (an ensemble input or one step), every ensemble output is
// produced, every ensemble input is read, and every tensor read has a source.
void CheckEnsembleDataFlow(const inference::ModelConfig& config, const EnsembleTensors& tensors,
                           Problems& problems) {
  const auto& ensemble = config.ensemble_scheduling();
  for (const auto& [tensor, by] : tensors.producers) {
    if (tensors.inputs.count(tensor) != 0) {
      problems.Add("ensemble tensor ", Quote(tensor), " is an ensemble input but ",
                   StepLabel(ensemble, by[0]), " also produces it");
    } else if (by.size() > 1) {
      std::vector<std::string> labels;
      for (int step : by) labels.push_back(StepLabel(ensemble, step));
      problems.Add("ensemble tensor ", Quote(tensor), " must be produced by one step; was by ",
                   ListText(labels));
    }
  }
  for (const auto& output : config.output()) {
    if (!output.name().empty() && tensors.producers.count(output.name()) == 0) {
      problems.Add("ensemble output ", Quote(output.name()),
                   " must be produced by a step's output_map; no step produces it");
    }
  }
  for (const std::string& input : tensors.inputs) {
    if (!input.empty() && tensors.consumers.count(input) == 0) {
      problems.Add("ensemble input ", Quote(input),
                   " must be consumed by a step's input_map; no step reads it");
    }
  }
  for (const auto& [tensor, by] : tensors.consumers) {
    if (tensors.inputs.count(tensor) == 0 && tensors.producers.count(tensor) == 0) {
      problems.Add(StepLabel(ensemble, by[0]), " reads tensor ", Quote(tensor),
                   ", which is neither an ensemble input nor produced by any step");
    }
  }
}

// Kahn's algorithm on step -> step edges (producer feeds consumer); steps left over are
// on a cycle or behind one.
void CheckEnsembleAcyclic(const inference::ModelEnsembling& ensemble,
                          const EnsembleTensors& tensors, Problems& problems) {
  const int steps = ensemble.step_size();
  std::vector<std::set<int>> next(steps);
  std::vector<int> pending_inputs(steps, 0);
  for (const auto& [tensor, by] : tensors.consumers) {
    auto produced = tensors.producers.find(tensor);
    if (produced == tensors.producers.end() || tensors.inputs.count(tensor) != 0) continue;
    for (int from : produced->second) {
      for (int to : by) {
        if (next[from].insert(to).second) ++pending_inputs[to];
      }
    }
  }
  std::vector<int> ready;
  for (int i = 0; i < steps; ++i) {
    if (pending_inputs[i] == 0) ready.push_back(i);
  }
  int ordered = 0;
  while (!ready.empty()) {
    const int step = ready.back();
    ready.pop_back();
    ++ordered;
    for (int to : next[step]) {
      if (--pending_inputs[to] == 0) ready.push_back(to);
    }
  }
  if (ordered < steps) {
    std::vector<std::string> labels;
    for (int i = 0; i < steps; ++i) {
      if (pending_inputs[i] > 0) labels.push_back(StepLabel(ensemble, i));
    }
    problems.Add("ensemble_scheduling steps must form an acyclic graph; these steps are on or ",
                 "behind a cycle: ", ListText(labels));
  }
}

void CheckEnsemble(const inference::ModelConfig& config, Problems& problems) {
  EnsembleTensors tensors;
  for (const auto& input : config.input()) tensors.inputs.insert(input.name());
  CheckEnsembleSteps(config, tensors, problems);
  CheckEnsembleDataFlow(config, tensors, problems);
  CheckEnsembleAcyclic(config.ensemble_scheduling(), tensors, problems);
}

}  // namespace

StatusOr<inference::ModelConfig> ParseModelConfigJson(std::string_view json,
                                                      const std::string& path) {
  inference::ModelConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), &config, options);
  if (!status.ok()) {
    return InvalidArgument(path +
                           ": not a valid model config in JSON: " + std::string(status.message()));
  }
  return config;
}

StatusOr<inference::ModelConfig> ParseModelConfig(std::string_view text, const std::string& path) {
  if (text.size() > static_cast<size_t>(INT_MAX)) {
    return InvalidArgument(Cat(path, ": config is ", text.size(), " bytes; too large to parse"));
  }
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  ParseErrors errors(text);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  const LegacySchema& legacy_schema = Legacy();
  if (legacy_schema.prototype == nullptr) {
    return Internal("cannot build the config.pbtxt schema with the deprecated group fields");
  }
  // Parsed with the old spelling allowed, then carried over by field number: what the
  // old fields held is moved into parameters, and only Triton's schema remains.
  std::unique_ptr<google::protobuf::Message> legacy(legacy_schema.prototype->New());
  if (!parser.Parse(&input, legacy.get())) return errors.ToStatus(path);
  inference::ModelConfig config;
  if (!config.ParseFromString(legacy->SerializeAsString())) {
    return Internal(Cat(path, ": cannot convert the parsed config"));
  }
  config.DiscardUnknownFields();
  ASSIGN_OR_RETURN(const bool moved, MoveLegacyGroupSettings(*legacy, path, &config));
  static std::atomic<bool> warned{false};
  if (moved && !warned.exchange(true)) {
    spdlog::warn(
        "{}: instance_group fields cpu_cores and threads are deprecated (Triton's schema has no "
        "such fields); write them as parameters, e.g. parameters {{ key: "
        "\"shoal.instance_group.0.cpu_cores\" value {{ string_value: \"0-3\" }} }} "
        "(docs/model-repository.md). Read as such this time; this warning is shown once",
        LogSafe(path));
  }
  return config;
}

std::string InstanceGroupParameter(int group_index, std::string_view setting) {
  return Cat(kGroupParameterPrefix, group_index, '.', setting);
}

StatusOr<std::vector<int>> ParseCoreList(std::string_view text) {
  // A CPU id above this is surely a typo, and a range up to it stays a small allocation.
  constexpr int kMaxCore = 65535;
  std::vector<int> cores;
  auto number = [&](std::string_view item, std::string_view part) -> StatusOr<int> {
    int v = -1;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size() || v < 0 ||
        v > kMaxCore) {
      return InvalidArgument(Cat("core list items must be cores 0..", kMaxCore,
                                 " or ranges a-b of them; was ", Quote(item)));
    }
    return v;
  };
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(begin, end - begin);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    const size_t dash = item.find('-', 1);  // a leading '-' is a negative number: refused
    ASSIGN_OR_RETURN(const int first, number(item, item.substr(0, dash)));
    int last = first;
    if (dash != std::string_view::npos) {
      ASSIGN_OR_RETURN(last, number(item, item.substr(dash + 1)));
      if (last < first) {
        return InvalidArgument(Cat("core range ", Quote(item), " must not run backwards"));
      }
    }
    for (int core = first; core <= last; ++core) cores.push_back(core);
    if (cores.size() > static_cast<size_t>(kMaxCore) + 1) {
      return InvalidArgument("core list names more cores than there can be");
    }
    begin = end + 1;
  }
  return cores;
}

std::vector<int> GroupCpuCores(const inference::ModelConfig& config, int group_index) {
  auto it = config.parameters().find(InstanceGroupParameter(group_index, "cpu_cores"));
  if (it == config.parameters().end()) return {};
  auto cores = ParseCoreList(it->second.string_value());
  return cores.ok() ? std::move(cores).value() : std::vector<int>();
}

int GroupThreads(const inference::ModelConfig& config, int group_index) {
  auto it = config.parameters().find(InstanceGroupParameter(group_index, "threads"));
  if (it == config.parameters().end()) return 0;
  const std::string& text = it->second.string_value();
  int threads = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), threads);
  return ec == std::errc() && ptr == text.data() + text.size() && threads > 0 ? threads : 0;
}

Status ValidateModelConfig(const inference::ModelConfig& config, const std::string& path) {
  Problems problems(path);
  if (config.name().empty()) problems.Add("name must not be empty");
  if (config.max_batch_size() < 0) {
    problems.Add("max_batch_size must be >= 0; was ", config.max_batch_size());
  }
  CheckTensors(config.input(), "input", problems);
  CheckTensors(config.output(), "output", problems);
  CheckDynamicBatching(config, problems);
  CheckInstanceGroups(config, problems);
  CheckVersionPolicy(config, problems);
  CheckWarmup(config, problems);
  CheckFileNames(config, problems);

  const bool is_ensemble = config.platform() == kEnsemblePlatform;
  if (is_ensemble) {
    if (!config.has_ensemble_scheduling() || config.ensemble_scheduling().step_size() == 0) {
      problems.Add("platform \"ensemble\" requires ensemble_scheduling with at least one step; ",
                   "was ", config.has_ensemble_scheduling() ? "0 steps" : "unset");
    } else {
      CheckEnsemble(config, problems);
    }
  } else if (config.has_ensemble_scheduling()) {
    problems.Add("ensemble_scheduling requires platform \"ensemble\"; was ",
                 Quote(config.platform()));
  } else if (config.platform().empty() && config.backend().empty()) {
    problems.Add("platform or backend must be set (e.g. platform: \"", kOnnxPlatform,
                 "\"); was neither");
  }
  return problems.ToStatus();
}

int InstanceCount(const inference::ModelInstanceGroup& group) {
  return group.count() > 0 ? group.count() : 1;
}

std::vector<int> InstanceCores(const inference::ModelConfig& config, int group_index,
                               int instance_index) {
  if (group_index < 0 || group_index >= config.instance_group_size()) return {};
  const int instances = InstanceCount(config.instance_group(group_index));
  const std::vector<int> cores = GroupCpuCores(config, group_index);
  if (cores.empty() || instance_index < 0 || instance_index >= instances) return {};
  const size_t per_instance = cores.size() / static_cast<size_t>(instances);
  if (per_instance == 0) return {};  // unvalidated group with fewer cores than instances
  const auto begin = cores.begin() + static_cast<ptrdiff_t>(instance_index * per_instance);
  return std::vector<int>(begin, begin + static_cast<ptrdiff_t>(per_instance));
}

}  // namespace shoal::repository
