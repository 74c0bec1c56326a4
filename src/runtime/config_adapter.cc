#include "runtime/config_adapter.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "core/fp16.h"
#include "repository/model_config.h"

namespace shoal::runtime {
namespace {

backends::TensorSpec SpecFrom(const std::string& name, inference::DataType type,
                              const google::protobuf::RepeatedField<int64_t>& dims, bool optional) {
  backends::TensorSpec spec;
  spec.name = name;
  spec.dtype = repository::FromConfigDataType(type);
  spec.dims.assign(dims.begin(), dims.end());
  spec.optional = optional;
  return spec;
}

QueuePolicy PolicyFrom(const inference::ModelQueuePolicy& p) {
  QueuePolicy q;
  q.timeout_action = p.timeout_action() == inference::ModelQueuePolicy::DELAY
                         ? TimeoutAction::kDelay
                         : TimeoutAction::kReject;
  q.default_timeout_us = p.default_timeout_microseconds();
  q.allow_timeout_override = p.allow_timeout_override();
  q.max_queue_size = p.max_queue_size();
  return q;
}

// The value of a non-negative number parameter of the model's config, if present:
// int64_t ("250") or double ("99.9"); `kind` names what it must be in the error.
template <typename T>
StatusOr<std::optional<T>> NumberParameter(const inference::ModelConfig& config,
                                           const std::string& key, const char* kind) {
  auto it = config.parameters().find(key);
  if (it == config.parameters().end()) return std::optional<T>();
  const std::string& text = it->second.string_value();
  T value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !(value >= 0) ||
      !std::isfinite(static_cast<double>(value))) {
    return InvalidArgument("parameter '" + key + "' must be a non-negative " + kind + "; was '" +
                           text + "'");
  }
  return std::optional<T>(value);
}

StatusOr<std::optional<int64_t>> IntegerParameter(const inference::ModelConfig& config,
                                                  const std::string& key) {
  return NumberParameter<int64_t>(config, key, "integer");
}

StatusOr<std::optional<double>> DecimalParameter(const inference::ModelConfig& config,
                                                 const std::string& key) {
  return NumberParameter<double>(config, key, "number");
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// precision_ladder and its thresholds (docs/model-repository.md). Every tier after the
// first must be one the backend loads beside its default (the precision_tiers parameter).
Status ApplyPrecisionLadder(const inference::ModelConfig& config, ModelVersionOptions* o) {
  auto it = config.parameters().find("precision_ladder");
  if (it == config.parameters().end()) return Status::Ok();
  o->precision_ladder = SplitList(it->second.string_value());
  if (o->precision_ladder.size() < 2) {
    return InvalidArgument(
        "parameter 'precision_ladder' needs at least two tiers, dearest first "
        "(e.g. \"fp32,int8\"); was '" +
        it->second.string_value() + "'");
  }
  std::vector<std::string> loaded;
  if (auto t = config.parameters().find("precision_tiers"); t != config.parameters().end())
    loaded = SplitList(t->second.string_value());
  for (size_t i = 1; i < o->precision_ladder.size(); ++i) {
    const std::string& tier = o->precision_ladder[i];
    if (std::find(loaded.begin(), loaded.end(), tier) == loaded.end()) {
      return InvalidArgument("parameter 'precision_ladder' names tier '" + tier +
                             "', which parameter 'precision_tiers' does not load");
    }
  }
  const uint64_t slo = o->latency_slo_us;
  ASSIGN_OR_RETURN(auto above, IntegerParameter(config, "degrade_above_us"));
  o->degrade_above_us = above ? static_cast<uint64_t>(*above) : (slo > 0 ? slo / 2 : 50'000);
  ASSIGN_OR_RETURN(auto below, IntegerParameter(config, "restore_below_us"));
  o->restore_below_us = below ? static_cast<uint64_t>(*below) : o->degrade_above_us / 4;
  ASSIGN_OR_RETURN(auto after, IntegerParameter(config, "degrade_after_us"));
  o->degrade_after_us = after ? static_cast<uint64_t>(*after) : 200'000;
  if (o->restore_below_us >= o->degrade_above_us) {
    return InvalidArgument("parameter 'restore_below_us' (" + std::to_string(o->restore_below_us) +
                           ") must be below 'degrade_above_us' (" +
                           std::to_string(o->degrade_above_us) + ")");
  }
  return Status::Ok();
}

// shoal's scheduling extensions, given as config parameters (docs/model-repository.md):
// latency_slo_us, batching_policy, max_queue_wait_us, deadline_reserve_percent,
// admission_overrun_percentile, priority_aging_us.
Status ApplySchedulingParameters(const inference::ModelConfig& config, ModelVersionOptions* o) {
  ASSIGN_OR_RETURN(auto slo, IntegerParameter(config, "latency_slo_us"));
  if (slo) o->latency_slo_us = static_cast<uint64_t>(*slo);
  if (auto it = config.parameters().find("batching_policy"); it != config.parameters().end()) {
    const std::string& v = it->second.string_value();
    if (v == "slo") {
      o->batching.policy = BatchingPolicy::kSlo;
    } else if (v == "fixed_window") {
      o->batching.policy = BatchingPolicy::kFixedWindow;
    } else {
      return InvalidArgument("parameter 'batching_policy' must be 'slo' or 'fixed_window'; was '" +
                             v + "'");
    }
  }
  ASSIGN_OR_RETURN(auto wait, IntegerParameter(config, "max_queue_wait_us"));
  if (wait) {
    o->batching.max_queue_wait_us = *wait;
  } else if (slo && *slo > 0) {
    // Whoever waits longer than the SLO misses it anyway.
    o->batching.max_queue_wait_us = *slo;
  }
  ASSIGN_OR_RETURN(auto reserve, IntegerParameter(config, "deadline_reserve_percent"));
  if (reserve) {
    if (*reserve >= 100) {
      return InvalidArgument("parameter 'deadline_reserve_percent' must be below 100; was " +
                             std::to_string(*reserve));
    }
    o->batching.deadline_reserve = static_cast<double>(*reserve) / 100.0;
  }
  ASSIGN_OR_RETURN(auto percentile, DecimalParameter(config, "admission_overrun_percentile"));
  if (percentile) {
    if (*percentile >= 100 || (*percentile > 0 && *percentile < 50)) {
      return InvalidArgument(
          "parameter 'admission_overrun_percentile' must be 0 (learn nothing) or in [50, 100); "
          "was " +
          config.parameters().at("admission_overrun_percentile").string_value());
    }
    o->batching.overrun_quantile = *percentile / 100.0;
  }
  ASSIGN_OR_RETURN(auto aging, IntegerParameter(config, "priority_aging_us"));
  o->batching.priority_aging_us = aging ? static_cast<uint64_t>(*aging) : kDefaultPriorityAgingUs;
  return ApplyPrecisionLadder(config, o);
}

// A tensor of `shape` filled as a warmup input asks.
StatusOr<Tensor> WarmupTensor(DataType dtype, const Shape& shape,
                              const inference::ModelWarmup::Input& in, const std::string& model_dir,
                              int64_t batch_size) {
  ASSIGN_OR_RETURN(int64_t elements, ElementCount(shape, int64_t{1} << 28));
  if (dtype == DataType::kBytes) {
    // Empty strings for zero data; short decimal strings for random data.
    std::vector<std::string> values(static_cast<size_t>(elements));
    if (in.random_data()) {
      for (int64_t i = 0; i < elements; ++i) values[i] = std::to_string(i % 97);
    }
    if (in.input_data_type_case() == inference::ModelWarmup::Input::kInputDataFile) {
      return InvalidArgument("input_data_file is not supported for BYTES warmup inputs");
    }
    return Tensor::FromStrings(shape, values);
  }
  const size_t bytes = static_cast<size_t>(elements) * DataTypeSize(dtype);
  Tensor t = Tensor::Allocate(dtype, shape, bytes);
  if (in.random_data()) {
    std::mt19937 rng(42);
    auto* p = static_cast<unsigned char*>(t.mutable_data());
    if (dtype == DataType::kFp32) {
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (auto& v : t.mutable_values<float>()) v = u(rng);
    } else if (dtype == DataType::kFp64) {
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (auto& v : t.mutable_values<double>()) v = u(rng);
    } else if (dtype == DataType::kFp16 || dtype == DataType::kBf16) {
      // [0, 1) as for FP32, rounded to FP16, or truncated to BF16 (the top half of the
      // float's bits, as Triton's clients make BF16).
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      for (auto& v : t.mutable_values<uint16_t>()) {
        const float f = u(rng);
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof(bits));
        v = dtype == DataType::kFp16 ? FloatToFp16(f) : static_cast<uint16_t>(bits >> 16);
      }
    } else {
      // Small non-negative integers of any width (valid for bool too: 0 or 1).
      const size_t size = DataTypeSize(dtype);
      for (int64_t i = 0; i < elements; ++i) p[i * size] = static_cast<unsigned char>(rng() % 2);
    }
  } else if (in.input_data_type_case() == inference::ModelWarmup::Input::kInputDataFile) {
    const std::string path = model_dir + "/warmup/" + in.input_data_file();
    std::ifstream f(path, std::ios::binary);
    if (!f) return InvalidArgument("warmup data file '" + path + "' cannot be read");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string data = ss.str();
    // The file holds one sample; it is repeated for each batch item.
    const size_t per_item = bytes / static_cast<size_t>(std::max<int64_t>(batch_size, 1));
    if (data.size() != per_item) {
      return InvalidArgument("warmup data file '" + path + "' has " + std::to_string(data.size()) +
                             " bytes; one sample of shape " + ShapeToString(shape) + " needs " +
                             std::to_string(per_item));
    }
    for (int64_t i = 0; i < std::max<int64_t>(batch_size, 1); ++i) {
      std::memcpy(static_cast<char*>(t.mutable_data()) + i * per_item, data.data(), per_item);
    }
  }
  return t;
}

// The name, data type and dims that a config input and output (ModelInput, ModelOutput)
// both carry.
template <typename ConfigTensor>
void SetFromSpec(const backends::TensorSpec& spec, ConfigTensor* t) {
  t->set_name(spec.name);
  t->set_data_type(repository::ToConfigDataType(spec.dtype));
  for (int64_t d : spec.dims) t->add_dims(d);
}

}  // namespace

backends::ModelInfo ModelInfoFromConfig(const inference::ModelConfig& config,
                                        const std::string& model_dir, int64_t version) {
  backends::ModelInfo info;
  info.name = config.name();
  info.version = version;
  info.model_dir = model_dir;
  info.version_dir = model_dir + "/" + std::to_string(version);
  info.max_batch_size = config.max_batch_size();
  for (const auto& in : config.input())
    info.inputs.push_back(SpecFrom(in.name(), in.data_type(), in.dims(), in.optional()));
  for (const auto& out : config.output())
    info.outputs.push_back(SpecFrom(out.name(), out.data_type(), out.dims(), false));
  for (const auto& [key, value] : config.parameters()) info.parameters[key] = value.string_value();
  return info;
}

void CompleteConfig(const backends::ModelInfo& from_backend, inference::ModelConfig* config) {
  if (config->max_batch_size() == 0 && from_backend.max_batch_size > 0) {
    config->set_max_batch_size(from_backend.max_batch_size);
  }
  if (config->input_size() == 0) {
    for (const auto& spec : from_backend.inputs) {
      auto* in = config->add_input();
      SetFromSpec(spec, in);
      in->set_optional(spec.optional);
    }
  }
  if (config->output_size() == 0) {
    for (const auto& spec : from_backend.outputs) SetFromSpec(spec, config->add_output());
  }
}

StatusOr<std::string> BackendNameForConfig(const inference::ModelConfig& config) {
  if (!config.backend().empty()) return config.backend();
  if (config.platform() == repository::kOnnxPlatform) return std::string("onnx");
  if (config.platform() == repository::kEnsemblePlatform) {
    // The server runs ensembles itself (runtime/ensemble.h), without a backend.
    return InvalidArgument("model '" + config.name() + "' is an ensemble, which has no backend");
  }
  if (config.platform().empty()) {
    return InvalidArgument("model '" + config.name() + "' names neither a backend nor a platform");
  }
  return InvalidArgument(
      "model '" + config.name() + "' has platform '" + config.platform() +
      "', which shoal does not support (use backend: \"onnx\" or a plugin backend)");
}

StatusOr<ModelVersionOptions> VersionOptionsFromConfig(const inference::ModelConfig& config,
                                                       const std::string& model_dir,
                                                       int64_t version,
                                                       std::shared_ptr<ResponseCache> cache,
                                                       std::shared_ptr<Clock> clock,
                                                       const RequestLimits& limits) {
  ModelVersionOptions o;
  o.name = config.name();
  o.version = version;
  o.clock = std::move(clock);
  o.limits = limits;
  o.signature.max_batch_size = config.max_batch_size();
  for (const auto& in : config.input()) {
    o.signature.inputs.push_back(SpecFrom(in.name(), in.data_type(), in.dims(), in.optional()));
    if (in.has_reshape()) {
      o.signature.input_reshape[in.name()] =
          Shape(in.reshape().shape().begin(), in.reshape().shape().end());
    }
  }
  for (const auto& out : config.output()) {
    o.signature.outputs.push_back(SpecFrom(out.name(), out.data_type(), out.dims(), false));
    if (!out.label_filename().empty()) {
      auto labels =
          ReadLabelFile((std::filesystem::path(model_dir) / out.label_filename()).string());
      if (!labels.ok()) {
        return labels.status().WithPrefix("model '" + config.name() + "' output '" + out.name() +
                                          "' label_filename");
      }
      o.output_labels[out.name()] = std::move(labels).value();
    }
  }

  if (config.has_dynamic_batching()) {
    const auto& db = config.dynamic_batching();
    o.batching.max_batch_size = config.max_batch_size();
    o.batching.preferred_batch_sizes.assign(db.preferred_batch_size().begin(),
                                            db.preferred_batch_size().end());
    o.batching.max_queue_delay_us = db.max_queue_delay_microseconds();
    o.batching.priority_levels = static_cast<uint32_t>(db.priority_levels());
    o.batching.default_priority_level = static_cast<uint32_t>(db.default_priority_level());
    o.batching.default_queue_policy = PolicyFrom(db.default_queue_policy());
    for (const auto& [level, policy] : db.priority_queue_policy()) {
      o.batching.priority_queue_policy.emplace_back(static_cast<uint32_t>(level),
                                                    PolicyFrom(policy));
    }
    o.preserve_ordering = db.preserve_ordering();
  }
  RETURN_IF_ERROR(
      ApplySchedulingParameters(config, &o).WithPrefix("model '" + config.name() + "'"));

  // Tensor parallelism (docs/gpu.md): each GPU instance spans this many of its group's GPUs.
  auto tensor_parallel = IntegerParameter(config, "gpu_tensor_parallel");
  if (!tensor_parallel.ok())
    return tensor_parallel.status().WithPrefix("model '" + config.name() + "'");
  if (*tensor_parallel && (**tensor_parallel < 1 || **tensor_parallel > 16)) {
    return InvalidArgument("model '" + config.name() +
                           "': parameter 'gpu_tensor_parallel' must be from 1 to 16; was " +
                           std::to_string(**tensor_parallel));
  }
  const size_t span = *tensor_parallel ? static_cast<size_t>(**tensor_parallel) : 1;
  int index = 0;
  for (int g = 0; g < config.instance_group_size(); ++g) {
    const auto& group = config.instance_group(g);
    // KIND_GPU: `count` instances on each listed GPU, as Triton places them; no list
    // means GPU 0 (Triton: every GPU; the runtime does not query devices). The backend
    // says at CreateInstance whether it can run there. With gpu_tensor_parallel N, the
    // list is taken N GPUs at a time and `count` instances go on each N; a single GPU
    // takes every shard itself (on streams of its own).
    std::vector<std::vector<int>> spans = {{-1}};
    if (group.kind() == inference::ModelInstanceGroup::KIND_GPU) {
      std::vector<int> gpus(group.gpus().begin(), group.gpus().end());
      if (gpus.empty()) gpus.push_back(0);
      spans.clear();
      if (span > 1 && gpus.size() > 1) {
        if (gpus.size() % span != 0) {
          return InvalidArgument("model '" + config.name() + "': instance_group " +
                                 std::to_string(g) + " lists " + std::to_string(gpus.size()) +
                                 " GPUs, which gpu_tensor_parallel " + std::to_string(span) +
                                 " cannot take " + std::to_string(span) +
                                 " at a time: list a multiple of it, or one GPU");
        }
        for (size_t at = 0; at < gpus.size(); at += span)
          spans.emplace_back(gpus.begin() + static_cast<std::ptrdiff_t>(at),
                             gpus.begin() + static_cast<std::ptrdiff_t>(at + span));
      } else {
        for (int gpu : gpus) spans.push_back({gpu});
      }
    }
    const int count = repository::InstanceCount(group);
    for (const std::vector<int>& gpus : spans) {
      for (int i = 0; i < count; ++i, ++index) {
        backends::InstanceInfo info;
        info.name = config.name() + "_" + std::to_string(index);
        info.index = index;
        info.cpu_cores = repository::InstanceCores(config, g, i);
        info.threads = repository::GroupThreads(config, g);
        info.gpu = gpus[0];
        if (info.gpu >= 0) info.gpus = gpus;
        o.instances.push_back(std::move(info));
      }
    }
  }
  if (o.instances.empty()) o.instances.push_back({config.name() + "_0", 0, {}, 0, -1});

  if (config.response_cache().enable() && cache != nullptr) o.cache = std::move(cache);

  // Warmup: the configured samples, or one run per preferred/maximum batch size (zeros),
  // which may fail without failing the load.
  const int64_t max_batch = config.max_batch_size();
  for (const auto& w : config.model_warmup()) {
    WarmupSample sample;
    sample.name = w.name();
    sample.batch_size = std::max<int64_t>(w.batch_size(), 1);
    sample.count = static_cast<int>(std::max<uint32_t>(w.count(), 1));
    for (const auto& [name, in] : w.inputs()) {
      Shape shape(in.dims().begin(), in.dims().end());
      if (max_batch > 0) shape.insert(shape.begin(), sample.batch_size);
      auto t = WarmupTensor(repository::FromConfigDataType(in.data_type()), shape, in, model_dir,
                            sample.batch_size);
      if (!t.ok())
        return t.status().WithPrefix("model '" + config.name() + "' warmup '" + w.name() + "'");
      sample.inputs.push_back({name, std::move(t).value()});
    }
    o.warmup.push_back(std::move(sample));
  }
  if (config.model_warmup_size() == 0) {
    std::set<int64_t> sizes(o.batching.preferred_batch_sizes.begin(),
                            o.batching.preferred_batch_sizes.end());
    sizes.insert(max_batch > 0 ? max_batch : 1);
    for (int64_t n : sizes) {
      WarmupSample sample;
      sample.name = "default_batch_" + std::to_string(n);
      sample.batch_size = n;
      sample.required = false;  // nobody asked for it: a failure only warns (model_version.h)
      bool ok = true;
      for (const auto& spec : o.signature.inputs) {
        Shape shape = spec.dims;
        if (auto r = o.signature.input_reshape.find(spec.name);
            r != o.signature.input_reshape.end())
          shape = r->second;
        for (auto& d : shape) d = d < 0 ? 1 : d;  // variable dimensions warm up at 1
        if (max_batch > 0) shape.insert(shape.begin(), n);
        inference::ModelWarmup::Input zero;
        zero.set_zero_data(true);
        auto t = WarmupTensor(spec.dtype, shape, zero, model_dir, n);
        if (!t.ok()) {
          ok = false;
          break;
        }
        sample.inputs.push_back({spec.name, std::move(t).value()});
      }
      if (ok && !sample.inputs.empty()) o.warmup.push_back(std::move(sample));
    }
  }
  return o;
}

}  // namespace shoal::runtime
