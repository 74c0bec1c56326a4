#include "backends/onnx/onnx_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "backends/backend_registry.h"
#include "backends/onnx/gpu_instance.h"
#include "core/log_text.h"
#include "engine/model.h"
#include "engine/pipeline_session.h"
#include "engine/pipeline_split.h"
#include "engine/precision.h"
#include "engine/profile.h"

namespace shoal::backends {
namespace {

// The items of a comma-separated parameter, spaces around each trimmed; an empty item
// (",," or a trailing comma) is kept as "" for the caller to refuse or skip.
std::vector<std::string> SplitCommaList(const std::string& list) {
  std::vector<std::string> items;
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    items.push_back(std::move(item));
    start = end + 1;
  }
  return items;
}

namespace fs = std::filesystem;

Shape DimsOf(const engine::TensorInfo& t, bool batching) {
  Shape dims;
  for (size_t d = batching ? 1 : 0; d < t.shape.size(); ++d)
    dims.push_back(t.shape[d].known() ? t.shape[d].value : -1);
  return dims;
}

// Completes `specs` (from the config) with the model's tensors `model`.
Status Complete(const char* kind, const std::vector<engine::TensorInfo>& model, bool batching,
                std::vector<TensorSpec>* specs) {
  for (const TensorSpec& s : *specs) {
    bool found = false;
    for (const auto& t : model) found |= t.name == s.name;
    if (!found)
      return InvalidArgument(std::string("config ") + kind + " '" + s.name + "' is not an " + kind +
                             " of the model");
  }
  std::vector<TensorSpec> out;
  for (const auto& t : model) {
    TensorSpec spec;
    for (const TensorSpec& s : *specs) {
      if (s.name == t.name) spec = s;
    }
    spec.name = t.name;
    if (spec.dtype == DataType::kInvalid) {
      spec.dtype = t.dtype;
    } else if (spec.dtype != t.dtype) {
      return InvalidArgument(std::string("config ") + kind + " '" + t.name + "' has data type " +
                             std::string(DataTypeName(spec.dtype)) + "; the model's is " +
                             std::string(DataTypeName(t.dtype)));
    }
    if (t.rank_known) {
      const Shape dims = DimsOf(t, batching);
      if (spec.dims.empty()) {
        spec.dims = dims;
      } else {
        bool ok = spec.dims.size() == dims.size();
        for (size_t d = 0; ok && d < dims.size(); ++d) ok = dims[d] < 0 || spec.dims[d] == dims[d];
        if (!ok) {
          return InvalidArgument(std::string("config ") + kind + " '" + t.name + "' has dims " +
                                 ShapeToString(spec.dims) + "; the model's are " +
                                 ShapeToString(dims) +
                                 (batching ? " (batch dimension excluded)" : ""));
        }
      }
    }
    out.push_back(std::move(spec));
  }
  *specs = std::move(out);
  return Status::Ok();
}

// Why a model with outputs that are not batch-major (engine::Model::NonBatchMajorOutputs)
// cannot take max_batch_size > 0: a batch's rows could not be given back per request.
std::string NotBatchMajorMessage(const engine::Model& model, int max_batch_size,
                                 const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& name : names) {
    for (const engine::TensorInfo& t : model.outputs()) {
      if (t.name != name) continue;
      if (!list.empty()) list += ", ";
      list += "'" + name + "' " + engine::SymbolicShapeToString(t.shape);
    }
  }
  return "max_batch_size is " + std::to_string(max_batch_size) + " but output" +
         (names.size() > 1 ? "s " : " ") + list + (names.size() > 1 ? " are" : " is") +
         " not batch-major (the first dimension is not the inputs' batch dimension), so "
         "requests cannot be batched together: set max_batch_size to 0 and remove "
         "dynamic_batching to serve the model one request at a time";
}

// One model per precision tier the config loads (engine/precision.h); `default_tier`
// serves requests that name none.
struct Tiers {
  std::string default_tier = "fp32";
  std::map<std::string, std::unique_ptr<engine::Model>> models;
};

class OnnxInstance : public BackendInstance {
 public:
  OnnxInstance(std::map<std::string, std::unique_ptr<engine::Session>> sessions,
               std::string default_tier)
      : sessions_(std::move(sessions)), default_tier_(std::move(default_tier)) {}

  Status Execute(const ExecuteRequest& request, std::vector<NamedTensor>* outputs) override {
    const std::string& tier = request.variant.empty() ? default_tier_ : request.variant;
    auto it = sessions_.find(tier);
    if (it == sessions_.end()) {
      std::string loaded;
      for (const auto& [name, session] : sessions_) loaded += (loaded.empty() ? "" : ", ") + name;
      return InvalidArgument("precision '" + tier + "' is not loaded for this model (loaded: " +
                             loaded + "; the config's precision_tiers parameter adds tiers)");
    }
    try {
      std::vector<NamedTensor> results;
      RETURN_IF_ERROR(it->second->Run(request.inputs, &results));
      for (auto& r : results) outputs->push_back(std::move(r));
      return Status::Ok();
    } catch (const std::exception& e) {
      return Internal(std::string("onnx backend: ") + e.what());
    }
  }

  // The plans its sessions prepared (a new batch size's, or one evicted and prepared again).
  int64_t setups() const override {
    int64_t prepared = 0;
    for (const auto& [tier, session] : sessions_) prepared += session->plans_prepared();
    return prepared;
  }

 private:
  std::map<std::string, std::unique_ptr<engine::Session>> sessions_;
  std::string default_tier_;
};

// An instance of a model split into pipeline stages: its batches run through a
// PipelineSession, one stage thread per share of the instance's cores.
class PipelinedInstance : public BackendInstance {
 public:
  explicit PipelinedInstance(std::unique_ptr<engine::PipelineSession> pipeline)
      : pipeline_(std::move(pipeline)) {}

  Status Execute(const ExecuteRequest& request, std::vector<NamedTensor>* outputs) override {
    if (!request.variant.empty() && request.variant != "fp32") {
      return InvalidArgument("precision '" + request.variant +
                             "' is not loaded for this model (loaded: fp32; a pipelined model "
                             "runs fp32 only)");
    }
    try {
      std::vector<NamedTensor> results;
      RETURN_IF_ERROR(pipeline_->Run(request.inputs, &results));
      for (auto& r : results) outputs->push_back(std::move(r));
      return Status::Ok();
    } catch (const std::exception& e) {
      return Internal(std::string("onnx backend: ") + e.what());
    }
  }

  double pipeline_bubble_ratio() const override { return pipeline_->stats().bubble_ratio(); }

 private:
  std::unique_ptr<engine::PipelineSession> pipeline_;
};

// A tier's calibration inputs (the config's calibration_file, calibration.npz by default,
// in the version folder or the model's), split into batches; INVALID_ARGUMENT naming the
// file when there is none.
StatusOr<std::vector<std::vector<NamedTensor>>> CalibrationBatches(const ModelInfo& info,
                                                                   const engine::Model& fp32,
                                                                   const std::string& tier);
// INVALID_ARGUMENT when max_abs_diff or min_top1_agreement is malformed, before any tier
// is measured.
Status CheckTierBounds(const ModelInfo& info);
// Refuses (FAILED_PRECONDITION) a tier whose accuracy against fp32 is beyond the config's
// max_abs_diff or min_top1_agreement, and logs its figures when it passes. `what` names the
// tier ("precision bf16"), `detail` follows the figures.
Status JudgeTier(const ModelInfo& info, const std::string& what, const engine::TierAccuracy& acc,
                 const std::string& detail);

// What the config's pipeline_* parameters ask for (see onnx_backend.h).
struct PipelineConfig {
  int stages = 1;  // 1: the model runs whole
  std::vector<std::string> boundaries;
  int micro_batches = 0;  // 0: adaptive
};

class OnnxModel : public BackendModel {
 public:
  OnnxModel(Tiers tiers, ModelInfo info, engine::SessionOptions session,
            std::unique_ptr<engine::ModelStages> stages = nullptr, PipelineConfig pipeline = {})
      : tiers_(std::move(tiers)),
        info_(std::move(info)),
        session_(std::move(session)),
        stages_(std::move(stages)),
        pipeline_(std::move(pipeline)) {}

  StatusOr<std::unique_ptr<BackendInstance>> CreateInstance(const InstanceInfo& info) override {
    if (info.gpu >= 0) {
      if (stages_) {
        return InvalidArgument("instance '" + info.name +
                               "': a model split into pipeline stages (pipeline_stages) runs on "
                               "CPUs only; use kind: KIND_CPU");
      }
      // Every tier holds the same graph; a GPU plan is lowered from its fp32 plan.
      auto fp32 = tiers_.models.find("fp32");
      const engine::Model& model =
          *(fp32 != tiers_.models.end() ? fp32 : tiers_.models.begin())->second;
      // The 16-bit tiers are measured against the CPU engine's fp32 on the calibration
      // inputs when each instance loads, and refused beyond the config's bounds.
      GpuAccuracyCheck check;
      auto precision = info_.parameters.find("gpu_precision");
      if (precision != info_.parameters.end() &&
          (precision->second == "fp16" || precision->second == "bf16" ||
           precision->second == "int8")) {
        const std::string tier = "gpu_precision " + precision->second;
        if (fp32 == tiers_.models.end()) {
          return InvalidArgument(tier +
                                 " is measured against the model in fp32, which this config "
                                 "does not load (precision names another tier): add fp32 to "
                                 "precision_tiers");
        }
        RETURN_IF_ERROR(CheckTierBounds(info_));
        ASSIGN_OR_RETURN(check.batches, CalibrationBatches(info_, model, tier));
        const bool int8 = precision->second == "int8";
        if (int8) {
          // The ranges, measured once for the model's GPU instances.
          std::lock_guard<std::mutex> lock(gpu_int8_mutex_);
          if (!gpu_int8_ranges_) {
            auto ranges = engine::Calibrate(model, check.batches);
            if (!ranges.ok()) return ranges.status().WithPrefix(tier + ": calibrating");
            gpu_int8_ranges_ =
                std::make_shared<const engine::Calibration>(std::move(ranges).value());
          }
          check.int8_ranges = gpu_int8_ranges_;
        }
        check.judge = [this, tier, int8, gpu = info.gpu](const engine::TierAccuracy& acc) {
          return JudgeTier(
              info_, tier + " on GPU " + std::to_string(gpu), acc,
              int8 ? "products in int8 where they can be (the log names those "
                     "kept fp32), every other operator fp32"
                   : "products in " + tier.substr(tier.size() - 4) + ", every other operator fp32");
        };
      }
      // A CPU tail (gpu_cpu_tail) runs as a CPU instance of the group would.
      engine::SessionOptions cpu = session_;
      cpu.cpu_cores = info.cpu_cores;
      if (info.threads > 0) cpu.threads = info.threads;
      return CreateGpuInstance(model, info, info_.parameters, info_.max_batch_size, check,
                               gpu_state_.get(), cpu);
    }
    if (stages_) return CreatePipelined(info);
    engine::SessionOptions options = session_;
    options.cpu_cores = info.cpu_cores;
    if (info.threads > 0) options.threads = info.threads;  // the group's, over the model's
    std::map<std::string, std::unique_ptr<engine::Session>> sessions;
    for (const auto& [tier, model] : tiers_.models) {
      ASSIGN_OR_RETURN(sessions[tier], engine::Session::Create(*model, options));
    }
    return std::unique_ptr<BackendInstance>(
        new OnnxInstance(std::move(sessions), tiers_.default_tier));
  }

  ModelInfo info() const override { return info_; }

 private:
  StatusOr<std::unique_ptr<BackendInstance>> CreatePipelined(const InstanceInfo& info) {
    const int k = static_cast<int>(stages_->models.size());
    engine::PipelineOptions options;
    options.session = session_;
    options.micro_batches = pipeline_.micro_batches;
    options.stage_cores = engine::SplitCores(info.cpu_cores, k);
    const int threads = info.threads > 0 ? info.threads : session_.threads;
    if (threads > 0) options.threads_per_stage = std::max(1, threads / k);
    ASSIGN_OR_RETURN(auto pipeline,
                     engine::PipelineSession::Create(*tiers_.models.at("fp32"), *stages_, options));
    return std::unique_ptr<BackendInstance>(new PipelinedInstance(std::move(pipeline)));
  }

  Tiers tiers_;
  ModelInfo info_;
  engine::SessionOptions session_;  // all but cpu_cores (and threads), set per instance
  std::unique_ptr<engine::ModelStages> stages_;  // set when the model runs as a pipeline
  PipelineConfig pipeline_;
  // Its GPU instances' weights, one copy per GPU (null without the CUDA path).
  std::shared_ptr<GpuModelState> gpu_state_ = NewGpuModelState();
  // gpu_precision int8: the calibration ranges, measured by the first GPU instance.
  std::mutex gpu_int8_mutex_;
  std::shared_ptr<const engine::Calibration> gpu_int8_ranges_;
};

// Parameter `key`, when the config sets it, into *out: a whole number in [min, max].
Status IntegerParameter(const ModelInfo& info, const std::string& key, int min, int max, int* out) {
  auto it = info.parameters.find(key);
  if (it == info.parameters.end()) return Status::Ok();
  try {
    size_t used = 0;
    const long v = std::stol(it->second, &used);
    if (used == it->second.size() && v >= min && v <= max) {
      *out = static_cast<int>(v);
      return Status::Ok();
    }
  } catch (const std::exception&) {
  }
  return InvalidArgument("parameter " + key + " must be a whole number from " +
                         std::to_string(min) + " to " + std::to_string(max) + "; was '" +
                         it->second + "'");
}

// Reads pipeline_stages, pipeline_stage_boundaries and pipeline_micro_batches.
StatusOr<PipelineConfig> ReadPipelineConfig(const ModelInfo& info) {
  PipelineConfig c;
  auto integer = [&](const std::string& key, int min, int* out) {
    return IntegerParameter(info, key, min, 1024, out);
  };
  RETURN_IF_ERROR(integer("pipeline_stages", 1, &c.stages));
  if (auto it = info.parameters.find("pipeline_micro_batches");
      it != info.parameters.end() && it->second != "auto") {
    RETURN_IF_ERROR(integer("pipeline_micro_batches", 1, &c.micro_batches));
  }
  if (auto it = info.parameters.find("pipeline_stage_boundaries"); it != info.parameters.end()) {
    const std::string& list = it->second;
    for (std::string& name : SplitCommaList(list)) {
      if (name.empty()) {
        return InvalidArgument("parameter pipeline_stage_boundaries has an empty node name: '" +
                               list + "'");
      }
      c.boundaries.push_back(std::move(name));
    }
    const int k = static_cast<int>(c.boundaries.size()) + 1;
    if (info.parameters.count("pipeline_stages") && c.stages != k) {
      return InvalidArgument("parameter pipeline_stages is " + std::to_string(c.stages) + " but " +
                             "pipeline_stage_boundaries names " +
                             std::to_string(c.boundaries.size()) + " boundaries (" +
                             std::to_string(k) + " stages)");
    }
    c.stages = k;
  }
  return c;
}

// Zero inputs of `batch` rows (other symbolic dims 1) to time the model on.
std::vector<NamedTensor> ProfileInputs(const engine::Model& model, int64_t batch) {
  std::vector<NamedTensor> inputs;
  for (const engine::TensorInfo& t : model.inputs()) {
    Shape shape;
    for (size_t d = 0; d < t.shape.size(); ++d)
      shape.push_back(t.shape[d].known() ? t.shape[d].value : d == 0 ? batch : 1);
    inputs.push_back(NamedTensor{t.name, Tensor::Allocate(t.dtype, shape)});
  }
  return inputs;
}

// The stages the config asks for: the cut named by pipeline_stage_boundaries, or else
// the one that balances the per-node times measured on one thread at `batch` rows.
StatusOr<std::unique_ptr<engine::ModelStages>> SplitForConfig(const ModelInfo& info,
                                                              const engine::Model& model,
                                                              const PipelineConfig& config,
                                                              int64_t batch) {
  std::vector<int> starts;
  std::vector<double> costs;
  if (!config.boundaries.empty()) {
    ASSIGN_OR_RETURN(starts, engine::StageStartsFromNames(model.graph(), config.boundaries));
  } else {
    const int nodes = static_cast<int>(model.graph().nodes.size());
    if (config.stages > nodes) {
      return InvalidArgument("parameter pipeline_stages (" + std::to_string(config.stages) +
                             ") is larger than the model's node count (" + std::to_string(nodes) +
                             ")");
    }
    engine::SessionOptions one;
    one.threads = 1;
    ASSIGN_OR_RETURN(auto profile,
                     engine::ProfileOperators(model, ProfileInputs(model, batch), 3, one));
    costs = profile.node_ms;
    ASSIGN_OR_RETURN(starts, engine::BalanceStages(costs, config.stages));
  }
  ASSIGN_OR_RETURN(engine::ModelStages stages, engine::SplitModel(model, starts, costs));
  std::string plan;
  for (size_t s = 0; s < stages.models.size(); ++s) {
    plan += (s ? ", " : "") + std::to_string(stages.models[s]->graph().nodes.size()) + " nodes";
    if (!stages.costs.empty()) plan += fmt::format(" ({:.2f} ms)", stages.costs[s]);
  }
  spdlog::info("model '{}' version {}: {} pipeline stages: {}", LogSafe(info.name), info.version,
               stages.models.size(), plan);
  return std::make_unique<engine::ModelStages>(std::move(stages));
}

StatusOr<double> NumberParameter(const ModelInfo& info, const std::string& key, double fallback) {
  auto it = info.parameters.find(key);
  if (it == info.parameters.end()) return fallback;
  try {
    size_t used = 0;
    const double v = std::stod(it->second, &used);
    if (used == it->second.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  return InvalidArgument("parameter " + key + " must be a number >= 0; was '" + it->second + "'");
}

// Loads the `precision` variant of the model at `path`, measures it against the fp32
// model on the calibration inputs, and refuses it beyond the configured bounds.
StatusOr<std::unique_ptr<engine::Model>> LoadVariant(const ModelInfo& info, const std::string& path,
                                                     const engine::Model& fp32_model,
                                                     engine::Precision precision) {
  const engine::Model* fp32 = &fp32_model;
  const std::string tier(engine::PrecisionName(precision));
  RETURN_IF_ERROR(engine::CheckPrecision(precision));
  RETURN_IF_ERROR(CheckTierBounds(info));
  ASSIGN_OR_RETURN(auto batches, CalibrationBatches(info, *fp32, "precision " + tier));
  engine::LoadOptions options = fp32->options();  // the same conv_algorithm
  options.plan.precision = precision;
  if (precision == engine::Precision::kInt8) {
    ASSIGN_OR_RETURN(auto table, engine::Calibrate(*fp32, batches));
    options.plan.calibration = std::make_shared<const engine::Calibration>(std::move(table));
  }
  // Operators the tier does not make faster stay fp32 (engine/precision.h): timed at
  // batch 1 and at the calibration batch size, unless the config turns that off.
  bool select = true;
  if (auto it = info.parameters.find("tier_operator_selection"); it != info.parameters.end()) {
    if (it->second != "true" && it->second != "false")
      return InvalidArgument("parameter tier_operator_selection must be true or false; was '" +
                             it->second + "'");
    select = it->second == "true";
  }
  std::vector<std::vector<NamedTensor>> timed;
  if (select) {
    ASSIGN_OR_RETURN(timed, engine::ServedTierTimingInputs(*fp32, batches));
  }
  ASSIGN_OR_RETURN(engine::TierSelection selection,
                   engine::LoadServedTier(*fp32, path, options, timed));
  std::unique_ptr<engine::Model> variant = std::move(selection.model);
  ASSIGN_OR_RETURN(engine::TierAccuracy acc, engine::CompareTiers(*fp32, *variant, batches));
  RETURN_IF_ERROR(JudgeTier(info, "precision " + tier, acc, selection.ToString(precision)));
  return variant;
}

StatusOr<std::vector<std::vector<NamedTensor>>> CalibrationBatches(const ModelInfo& info,
                                                                   const engine::Model& fp32,
                                                                   const std::string& tier) {
  // The file the config names, relative to the version folder and then the model folder;
  // calibration.npz by default.
  std::string file = "calibration.npz";
  if (auto it = info.parameters.find("calibration_file"); it != info.parameters.end())
    file = it->second;
  if (file.empty() || fs::path(file).is_absolute() || file.find("..") != std::string::npos)
    return InvalidArgument("calibration_file '" + file + "' must be a relative file name");
  std::string cal_path;
  for (const std::string& dir : {info.version_dir, info.model_dir}) {
    if (!dir.empty() && fs::is_regular_file(fs::path(dir) / file)) {
      cal_path = (fs::path(dir) / file).string();
      break;
    }
  }
  if (cal_path.empty()) {
    return InvalidArgument(tier + " needs calibration inputs: put '" + file +
                           "' (an .npz with one array per model input, samples first) in the "
                           "model's folder or its version folder");
  }
  const int64_t batch = info.max_batch_size > 0 ? std::min(info.max_batch_size, 32) : 8;
  return engine::ReadCalibrationInputs(fp32, cal_path, batch);
}

Status CheckTierBounds(const ModelInfo& info) {
  ASSIGN_OR_RETURN(double max_diff, NumberParameter(info, "max_abs_diff", -1));
  (void)max_diff;
  ASSIGN_OR_RETURN(double min_top1, NumberParameter(info, "min_top1_agreement", -1));
  if (min_top1 > 1) return InvalidArgument("parameter min_top1_agreement is a fraction (0..1)");
  return Status::Ok();
}

Status JudgeTier(const ModelInfo& info, const std::string& what, const engine::TierAccuracy& acc,
                 const std::string& detail) {
  RETURN_IF_ERROR(CheckTierBounds(info));
  ASSIGN_OR_RETURN(double max_diff, NumberParameter(info, "max_abs_diff", -1));
  ASSIGN_OR_RETURN(double min_top1, NumberParameter(info, "min_top1_agreement", -1));
  const std::string figures = what + " against fp32: " + acc.ToString() + "; " + detail;
  // Whatever the bounds (or none), a tier that turns finite outputs into NaN or infinity
  // is broken, not less accurate (an fp16 overflow, say).
  if (acc.non_finite > 0) return FailedPrecondition(figures + "; refused: outputs not finite");
  if (max_diff >= 0 && acc.max_abs_diff > max_diff) {
    return FailedPrecondition(figures + "; refused: max |diff| is above max_abs_diff " +
                              std::to_string(max_diff));
  }
  if (min_top1 >= 0 && acc.top1_agreement >= 0 && acc.top1_agreement < min_top1) {
    return FailedPrecondition(figures + "; refused: top-1 agreement is below min_top1_agreement " +
                              std::to_string(min_top1));
  }
  spdlog::info("model '{}' version {}: {}", LogSafe(info.name), info.version, figures);
  return Status::Ok();
}

// The tiers the config asks for: `precision` (the default tier, fp32 when absent) and
// every tier listed in `precision_tiers` (comma-separated), which requests select with
// their own `precision` parameter.
StatusOr<Tiers> LoadTiers(const ModelInfo& info, const std::string& path,
                          std::unique_ptr<engine::Model> fp32) {
  Tiers tiers;
  std::vector<std::string> names;
  if (auto p = info.parameters.find("precision"); p != info.parameters.end()) {
    tiers.default_tier = p->second;
  }
  names.push_back(tiers.default_tier);
  if (auto p = info.parameters.find("precision_tiers"); p != info.parameters.end()) {
    for (std::string& name : SplitCommaList(p->second)) {
      if (!name.empty()) names.push_back(std::move(name));
    }
  }
  for (const std::string& name : names) {
    if (tiers.models.count(name)) continue;
    auto precision = engine::ParsePrecision(name);
    if (!precision.ok()) return precision.status().WithPrefix("parameter precision");
    if (*precision == engine::Precision::kFp32) continue;  // added last: variants compare to it
    ASSIGN_OR_RETURN(tiers.models[name], LoadVariant(info, path, *fp32, *precision));
  }
  const bool keep_fp32 = std::find(names.begin(), names.end(), "fp32") != names.end();
  if (keep_fp32) tiers.models["fp32"] = std::move(fp32);
  return tiers;
}

class OnnxBackend : public Backend {
 public:
  std::string name() const override { return "onnx"; }

  StatusOr<std::unique_ptr<BackendModel>> LoadModel(const ModelInfo& info) override {
    try {
      return LoadModelImpl(info);
    } catch (const std::exception& e) {
      return Internal(std::string("onnx backend: ") + e.what());
    }
  }

 private:
  StatusOr<std::unique_ptr<BackendModel>> LoadModelImpl(const ModelInfo& info) {
    std::string file = "model.onnx";
    if (auto it = info.parameters.find("default_model_filename"); it != info.parameters.end())
      file = it->second;
    if (file.empty() || fs::path(file).is_absolute() || file.find("..") != std::string::npos) {
      return InvalidArgument("default_model_filename '" + file + "' must be a plain file name");
    }
    int threads = 0;
    if (auto it = info.parameters.find("intra_op_thread_count"); it != info.parameters.end()) {
      try {
        threads = std::stoi(it->second);
      } catch (const std::exception&) {
        threads = -1;
      }
      if (threads < 0)
        return InvalidArgument("intra_op_thread_count must be a number >= 0; was '" + it->second +
                               "'");
    }
    engine::SessionOptions session;
    session.threads = threads;
    ASSIGN_OR_RETURN(const double small,
                     NumberParameter(info, "single_thread_below_flops",
                                     static_cast<double>(session.single_thread_below_flops)));
    if (small > 1e18) {  // NumberParameter has refused negatives
      return InvalidArgument("single_thread_below_flops must be at most 1e18; was '" +
                             info.parameters.at("single_thread_below_flops") + "'");
    }
    session.single_thread_below_flops = static_cast<int64_t>(small);
    const std::string path = (fs::path(info.version_dir) / file).string();
    engine::LoadOptions load;
    if (auto it = info.parameters.find("conv_algorithm"); it != info.parameters.end()) {
      auto algorithm = engine::ParseConvAlgorithm(it->second);
      if (!algorithm.ok()) return algorithm.status().WithPrefix("parameter conv_algorithm");
      load.plan.conv_algorithm = *algorithm;
    }
    if (auto it = info.parameters.find("conv_layout"); it != info.parameters.end()) {
      auto layout = engine::ParseConvLayout(it->second);
      if (!layout.ok()) return layout.status().WithPrefix("parameter conv_layout");
      load.plan.conv_layout = *layout;
    }
    ASSIGN_OR_RETURN(auto model, engine::Model::Load(path, load));
    ASSIGN_OR_RETURN(Tiers tiers, LoadTiers(info, path, std::move(model)));
    const engine::Model* any = tiers.models.begin()->second.get();

    ModelInfo done = info;
    const bool config_lists_tensors = !info.inputs.empty() || !info.outputs.empty();
    const std::vector<std::string> not_batch_major = any->NonBatchMajorOutputs();
    if (done.max_batch_size == 0 && !config_lists_tensors && any->batch_dim_symbolic() &&
        not_batch_major.empty()) {
      done.max_batch_size = kDefaultMaxBatchSize;
    }
    const bool batching = done.max_batch_size > 0;
    if (batching && !any->batch_dim_symbolic()) {
      return InvalidArgument(
          "max_batch_size is " + std::to_string(done.max_batch_size) +
          " but the model's first dimension is not a batch dimension (not symbolic in every "
          "input and output)");
    }
    if (batching && !not_batch_major.empty()) {
      return InvalidArgument(NotBatchMajorMessage(*any, done.max_batch_size, not_batch_major));
    }
    // Every batch size up to the maximum gets a plan of its own, and one prepared again
    // after its eviction costs milliseconds on the request path: cache them all.
    session.max_cached_plans = std::max(kMinCachedPlans, done.max_batch_size + 16);
    RETURN_IF_ERROR(
        IntegerParameter(info, "max_cached_plans", 1, 1 << 20, &session.max_cached_plans));
    RETURN_IF_ERROR(Complete("input", any->inputs(), batching, &done.inputs));
    RETURN_IF_ERROR(Complete("output", any->outputs(), batching, &done.outputs));
    ASSIGN_OR_RETURN(PipelineConfig pipeline, ReadPipelineConfig(info));
    std::unique_ptr<engine::ModelStages> stages;
    if (pipeline.stages > 1) {
      if (tiers.models.size() != 1 || !tiers.models.count("fp32")) {
        return InvalidArgument(
            "pipeline_stages runs the fp32 model only; it cannot be combined with other "
            "precision tiers");
      }
      auto split = SplitForConfig(info, *tiers.models.at("fp32"), pipeline,
                                  std::max(1, done.max_batch_size));
      if (!split.ok()) return split.status().WithPrefix("pipeline_stages");
      stages = std::move(split).value();
    }
    return std::unique_ptr<BackendModel>(new OnnxModel(std::move(tiers), std::move(done),
                                                       std::move(session), std::move(stages),
                                                       std::move(pipeline)));
  }
};

}  // namespace

std::shared_ptr<Backend> MakeOnnxBackend() { return std::make_shared<OnnxBackend>(); }

void RegisterOnnxBackend(BackendRegistry* registry) {
  registry->Register(MakeOnnxBackend());
  registry->RegisterAlias("onnxruntime_onnx", "onnx");
}

}  // namespace shoal::backends
