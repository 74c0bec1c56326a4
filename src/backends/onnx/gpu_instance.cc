#include "backends/onnx/gpu_instance.h"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <exception>
#include <list>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/onnx/batch_buckets.h"
#include "core/log_text.h"
#include "core/mutex.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/cudnn.h"
#include "engine/cuda/device.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/gpu_plan.h"
#include "engine/cuda/ipc_memory.h"
#include "engine/cuda/nvml.h"
#include "engine/plan.h"
#include "engine/precision.h"

namespace shoal::backends {

class GpuModelState {
 public:
  // The model's weights on `device`, made on first use.
  std::shared_ptr<engine::cuda::GpuWeights> WeightsOn(int device) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto& weights = weights_[device];
    if (!weights) weights = std::make_shared<engine::cuda::GpuWeights>();
    return weights;
  }

 private:
  Mutex mu_;
  std::map<int, std::shared_ptr<engine::cuda::GpuWeights>> weights_ GUARDED_BY(mu_);
};

std::shared_ptr<GpuModelState> NewGpuModelState() { return std::make_shared<GpuModelState>(); }

namespace {

using engine::cuda::GemmMath;

class GpuInstance : public BackendInstance {
 public:
  // `plan_options`: how each plan is lowered (the tier's math, tensor parallelism, and the
  // convolutions' engine, algorithm search and layout), as the config's parameters say.
  GpuInstance(const engine::Model& model, int gpu, engine::cuda::GpuPlanOptions plan_options,
              std::string tier, std::vector<engine::cuda::ShardPlace> shards,
              std::shared_ptr<engine::cuda::GpuWeights> weights,
              std::unique_ptr<engine::cuda::LtHandle> handle, engine::cuda::Stream stream,
              int depth, std::vector<int64_t> buckets, bool conv_fallback,
              engine::cuda::GpuCpuSplit split, std::unique_ptr<engine::Session> tail)
      : stage_(std::move(split.gpu_stage)),
        model_(stage_ ? *stage_ : model),
        whole_(model),
        tail_model_(std::move(split.cpu_tail)),
        tail_(std::move(tail)),
        gpu_(gpu),
        plan_options_(std::move(plan_options)),
        conv_fallback_(conv_fallback),
        tier_(std::move(tier)),
        depth_(depth),
        shards_(std::move(shards)),
        stream_(std::move(stream)),
        handle_(std::move(handle)),
        weights_(std::move(weights)),
        cpu_engine_(dnnl::engine::kind::cpu, 0),
        cpu_stream_(cpu_engine_),
        buckets_(std::move(buckets)),
        max_plans_(std::max(kMaxGpuPlans, buckets_.size() + 2)) {
    launched_.reserve(engine::cuda::GpuPlan::kSlots);
  }

  Status Execute(const ExecuteRequest& request, std::vector<NamedTensor>* outputs) override {
    try {
      RETURN_IF_ERROR(CheckVariant(request));
      return Run(request.inputs, outputs);
    } catch (const std::exception& e) {
      return Internal(std::string("onnx backend (GPU): ") + e.what());
    }
  }

  // The config's gpu_pipeline_depth: 2 (the default) overlaps a batch's copies with the
  // compute of the one before; 1 runs each batch alone (Execute only).
  int pipeline_depth() const override { return depth_; }

  Status Launch(const ExecuteRequest& request, std::function<void()> on_done) override {
    if (launched_.size() >= static_cast<size_t>(pipeline_depth())) {
      return FailedPrecondition(std::to_string(launched_.size()) +
                                " batches are launched and not finished; finish one first");
    }
    try {
      RETURN_IF_ERROR(CheckVariant(request));
      ASSIGN_OR_RETURN(Launched batch, LaunchBatch(request.inputs, std::move(on_done)));
      launched_.push_back(std::move(batch));  // reserved: does not allocate
      return Status::Ok();
    } catch (const std::exception& e) {
      return Internal(std::string("onnx backend (GPU): ") + e.what());
    }
  }

  Status Finish(std::vector<NamedTensor>* outputs) override {
    if (launched_.empty()) return FailedPrecondition("no batch is launched");
    Launched oldest = std::move(launched_.front());
    launched_.erase(launched_.begin());
    try {
      return FinishBatch(std::move(oldest), outputs);
    } catch (const std::exception& e) {
      return Internal(std::string("onnx backend (GPU): ") + e.what());
    }
  }

  // One batch, synchronously: launched, and its own slot finished. A batch launched before
  // stays launched (its outputs wait in its slot for its Finish); stream order ran it first.
  Status Run(const std::vector<NamedTensor>& named, std::vector<NamedTensor>* outputs) {
    ASSIGN_OR_RETURN(Launched batch, LaunchBatch(named, nullptr));
    return FinishBatch(std::move(batch), outputs);
  }

  // What its GPU plans run: the model, or with a CPU tail its GPU stage.
  const engine::Model& gpu_model() const { return model_; }

  // The plans it made (lowered and created on the device), at creation and since.
  int64_t setups() const override { return plans_made_; }

  // The batching model's batch buckets (empty: a plan per batch size).
  const std::vector<int64_t>& buckets() const { return buckets_; }

  // Forgets the device time measured so far (the load-time accuracy check's); the memory
  // figures stay.
  void ResetDeviceStats() { stats_.busy_ns = 0; }

  DeviceStats device_stats() const override {
    DeviceStats stats = stats_;
    stats.gpu = gpu_;
    // The weights are the model's on each GPU, shared with its other instances there: the
    // instance's own GPU and, with tensor parallelism, those its shards run on.
    stats.shared_weights_bytes = {{gpu_, weights_->bytes()}};
    for (const engine::cuda::ShardPlace& p : shards_)
      if (p.weights) stats.shared_weights_bytes[p.device] = p.weights->bytes();
    stats.memory_bytes = 0;
    for (const Cached& c : plans_) stats.memory_bytes += c.plan->device_bytes();
    // A sticky error is what every call on the context returns now (a busy stream is only
    // not ready).
    stats.context_lost = engine::cuda::ContextLost(cudaStreamQuery(stream_.get()));
    return stats;
  }

  // The plan for these input shapes: cached, or prepared by the CPU engine, lowered and
  // created on the device now.
  StatusOr<engine::cuda::GpuPlan*> PlanFor(const std::vector<Shape>& shapes) {
    for (auto it = plans_.begin(); it != plans_.end(); ++it) {
      if (it->shapes != shapes) continue;
      plans_.splice(plans_.begin(), plans_, it);
      return plans_.front().plan.get();
    }
    const engine::LoadOptions& load = model_.options();
    ASSIGN_OR_RETURN(auto cpu_plan,
                     engine::Plan::Prepare(model_.graph(), shapes, cpu_engine_, cpu_stream_,
                                           model_.weight_cache(),
                                           engine::cuda::GpuLoweringPlanOptions(), load.limits));
    engine::cuda::GpuPlanOptions options = plan_options_;
    ASSIGN_OR_RETURN(auto lowered, engine::cuda::LowerPlan(model_.graph(), *cpu_plan, options));
    if (plans_.size() >= max_plans_) {
      // Room first, so that the device never holds the whole cache and the new plan: the
      // least recently used plan with no batch launched and unfinished (whose work still
      // reads its buffers). With at most pipeline_depth() launched, there is one.
      for (auto it = plans_.end(); it != plans_.begin();) {
        --it;
        if (it->plan->free_slots() < engine::cuda::GpuPlan::kSlots) continue;
        said_graph_failure_.erase(it->plan.get());
        plans_.erase(it);
        break;
      }
    }
    // Which products int8 took in a lowering (GpuPlanOptions::int8_calibration).
    auto int8_summary = [](const engine::cuda::GpuLowering& l) {
      std::string kept;
      for (const std::string& why : l.fp32_products) kept += (kept.empty() ? "" : "; ") + why;
      return engine::cuda::Int8Summary(l) + (kept.empty() ? "" : ", kept fp32: " + kept);
    };
    // Whether a lowering runs convolutions on cuDNN channels last; and the instance's one
    // cuDNN handle, made with the first plan that needs it.
    bool channels_last = false;
    auto create = [&](engine::cuda::GpuLowering l) {
      bool needs_cudnn = false;
      channels_last = false;
      for (const engine::cuda::GpuStep& s : l.steps) {
        if (s.kind != engine::cuda::GpuStep::Kind::kConv) continue;
        needs_cudnn = true;
        channels_last = channels_last || s.conv.channels_last;
      }
      if (needs_cudnn && !cudnn_) {
        auto made = engine::cuda::CudnnHandle::Create();
        if (made.ok()) cudnn_ = std::move(made).value();
      }
      return engine::cuda::GpuPlan::Create(std::move(l), *handle_, stream_, weights_, shards_,
                                           cudnn_);
    };
    std::string int8_used = options.int8_calibration ? int8_summary(lowered) : "";
    // After a plan the device could not make: lowered again with `options` as changed, and
    // made.
    auto again = [&]() -> StatusOr<std::unique_ptr<engine::cuda::GpuPlan>> {
      channels_last = false;  // until a lowering says otherwise
      ASSIGN_OR_RETURN(auto relowered, engine::cuda::LowerPlan(model_.graph(), *cpu_plan, options));
      if (options.int8_calibration) int8_used = int8_summary(relowered);
      return create(std::move(relowered));
    };
    auto created = create(std::move(lowered));
    auto cannot_plan = [](const Status& s) {
      return s.code() == StatusCode::kUnimplemented || s.code() == StatusCode::kUnavailable;
    };
    // The fallbacks for what this device cannot plan, each taken once, in this order, and
    // looked at again after every re-lowering: one refusal can hide another (GpuPlan::Create
    // plans the cuDNN convolutions before the GEMMs).
    for (bool changed = true; changed && !created.ok() && cannot_plan(created.status());) {
      changed = false;
      const std::string why = created.status().ToString();
      if (options.int8_calibration && why.find(" int8 GEMM") != std::string::npos) {
        // An int8 product cuBLASLt has no kernel for (gemm.cc names such a GEMM's math in its
        // error): every product fp32 (int8's convolutions back on cuDNN).
        spdlog::warn("GPU {}: a plan's products run fp32, not int8: {}", gpu_, why);
        options.int8_calibration = nullptr;
        int8_used.clear();
        changed = true;
      } else if (channels_last && options.channels_last) {
        // A convolution cuDNN cannot run channels last on this device: the plan NCHW.
        spdlog::warn("GPU {}: a plan's convolutions run NCHW, not channels last: {}", gpu_, why);
        options.channels_last = false;
        changed = true;
      } else if (conv_fallback_ && options.conv == engine::cuda::ConvEngine::kCudnn) {
        // gpu_convolution "auto": a convolution cuDNN cannot plan on this device keeps the
        // plan on im2col.
        spdlog::warn("GPU {}: a plan's convolutions fall back to im2col: {}", gpu_, why);
        options.conv = engine::cuda::ConvEngine::kIm2Col;
        changed = true;
      }
      if (changed) created = again();
    }
    ASSIGN_OR_RETURN(auto plan, std::move(created));
    if (!int8_used.empty() && int8_used != said_int8_) {
      // What int8 took in the plan made, when it differs from the last plan's (a batch of
      // few rows keeps more products fp32 than a large one).
      std::string at;
      for (const Shape& shape : shapes) at += (at.empty() ? "" : ", ") + ShapeToString(shape);
      spdlog::info("GPU {}: gpu_precision int8 at input shapes {}: {}", gpu_, at,
                   LogSafe(int8_used));
      said_int8_ = int8_used;
    }
    if (spdlog::should_log(spdlog::level::debug)) {
      for (const std::string& line : plan->DescribeConvs())
        spdlog::debug("GPU {}: {}", gpu_, LogSafe(line));
    }
    plans_.push_front({shapes, std::move(plan)});
    ++plans_made_;
    return plans_.front().plan.get();
  }

 private:
  // A batch launched on a plan's slot.
  struct Launched {
    engine::cuda::GpuPlan* plan = nullptr;
    int slot = 0;
    // With a CPU tail: the request's inputs it reads (views, not copies).
    std::vector<NamedTensor> tail_inputs;
  };

  Status CheckVariant(const ExecuteRequest& request) const {
    if (request.variant.empty() || request.variant == tier_) return Status::Ok();
    return InvalidArgument("precision '" + request.variant +
                           "' is not loaded for this model's GPU instances (they run " + tier_ +
                           "; the config parameter gpu_precision picks fp32, tf32, fp16, bf16 or "
                           "int8)");
  }

  // The plan for the batch's shapes, and the batch launched on it.
  StatusOr<Launched> LaunchBatch(const std::vector<NamedTensor>& named,
                                 std::function<void()> on_done) {
    // The instance's thread made its GPU current when it created the instance; say it
    // again, in case a runtime ever runs an instance from another thread.
    RETURN_IF_ERROR(engine::cuda::CudaStatus(cudaSetDevice(gpu_), "cudaSetDevice"));
    const engine::Graph& graph = model_.graph();
    std::vector<const Tensor*> inputs;
    std::vector<Shape> shapes;
    for (int v : graph.inputs) {
      const std::string& name = graph.values[v].name;
      const Tensor* found = nullptr;
      for (const NamedTensor& t : named)
        if (t.name == name) found = &t.tensor;
      if (!found) return InvalidArgument("input '" + name + "' is missing");
      inputs.push_back(found);
      shapes.push_back(found->shape());
    }
    RETURN_IF_ERROR(CheckInputs(inputs));
    // A batching model's batch of n rows runs on the plan of its bucket (every input's
    // first dimension is the batch), and only its n rows come back.
    int64_t rows = -1;
    // (Every input batch-major: a rank-0 input has no rows, and keeps to a plan of its own.)
    const bool batch_major = std::none_of(shapes.begin(), shapes.end(),
                                          [](const Shape& shape) { return shape.empty(); });
    if (!buckets_.empty() && !shapes.empty() && batch_major) {
      const int64_t n = shapes[0][0];
      const int64_t bucket = BucketFor(buckets_, n);
      if (bucket != n) {
        rows = n;
        for (Shape& shape : shapes) shape[0] = bucket;
      }
    }
    ASSIGN_OR_RETURN(engine::cuda::GpuPlan * plan, PlanFor(shapes));
    Launched launched{plan, 0, {}};
    if (tail_) {
      // The model's inputs the tail reads (views: their buffers are reference-counted); the
      // rest of its inputs come from the GPU stage. One missing is refused before the GPU
      // runs anything.
      const engine::Graph& tail = tail_model_->graph();
      for (const engine::TensorInfo& info : whole_.inputs()) {
        bool read = false;
        for (int v : tail.inputs) read = read || tail.values[v].name == info.name;
        if (!read) continue;
        const NamedTensor* found = nullptr;
        for (const NamedTensor& t : named)
          if (t.name == info.name) found = &t;
        if (!found) return InvalidArgument("input '" + info.name + "' is missing");
        launched.tail_inputs.push_back(*found);
      }
    }
    ASSIGN_OR_RETURN(launched.slot, plan->Launch(inputs, stream_, std::move(on_done), rows));
    return launched;
  }

  // Waits for a launched batch, frees its slot, counts it in the stats and appends its
  // outputs.
  Status FinishBatch(Launched batch, std::vector<NamedTensor>* outputs) {
    std::vector<Tensor> results;
    const Status finished = batch.plan->Finish(batch.slot, &results);
    if (!batch.plan->graph_failure().ok() && said_graph_failure_.insert(batch.plan).second) {
      // Once per plan: it runs step by step from now on, and why is worth knowing.
      spdlog::warn("GPU {}: a plan runs step by step, not as a CUDA graph: {}", gpu_,
                   LogSafe(batch.plan->graph_failure().ToString()));
    }
    RETURN_IF_ERROR(finished);
    // Its compute only: the copies overlap other batches' compute.
    stats_.busy_ns += static_cast<int64_t>(batch.plan->last_device_ms() * 1e6);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      stats_.device_used_bytes = static_cast<int64_t>(total - free);
      stats_.device_total_bytes = static_cast<int64_t>(total);
    }
    // NVML's utilisation, asked at most once a second (NVML samples over about that).
    const auto now = std::chrono::steady_clock::now();
    if (now - last_nvml_ >= std::chrono::seconds(1)) {
      last_nvml_ = now;
      auto nvml = engine::cuda::Nvml::Get();
      auto u = nvml.ok() ? (*nvml)->Utilization(gpu_)
                         : StatusOr<engine::cuda::GpuUtilization>(nvml.status());
      stats_.utilization_percent = u.ok() ? u->gpu_percent : -1;
    }
    const engine::Graph& graph = model_.graph();
    if (!tail_) {
      for (size_t o = 0; o < results.size(); ++o)
        outputs->push_back({graph.values[graph.outputs[o]].name, std::move(results[o])});
      return Status::Ok();
    }
    // The CPU tail, on the GPU stage's outputs and the request's inputs it reads; then the
    // model's outputs, in its order, from either stage.
    std::vector<NamedTensor> staged = std::move(batch.tail_inputs);
    for (size_t o = 0; o < results.size(); ++o)
      staged.push_back({graph.values[graph.outputs[o]].name, std::move(results[o])});
    const engine::Graph& tail = tail_model_->graph();
    std::vector<NamedTensor> tail_in, tail_out;
    for (int v : tail.inputs) {
      for (const NamedTensor& t : staged) {
        if (t.name != tail.values[v].name) continue;
        tail_in.push_back(t);
        break;
      }
    }
    RETURN_IF_ERROR(tail_->Run(tail_in, &tail_out).WithPrefix("the model's CPU tail"));
    const engine::Graph& whole = whole_.graph();
    for (int v : whole.outputs) {
      const std::string& name = whole.values[v].name;
      const NamedTensor* found = nullptr;
      for (const NamedTensor& t : tail_out)
        if (t.name == name) found = &t;
      for (const NamedTensor& t : staged)
        if (!found && t.name == name) found = &t;
      if (!found) return Internal("output '" + name + "' came from neither the GPU nor the CPU");
      outputs->push_back(*found);
    }
    return Status::Ok();
  }

  // The model's dtypes, ranks and fixed dimensions.
  Status CheckInputs(const std::vector<const Tensor*>& inputs) const {
    const auto& infos = model_.inputs();
    for (size_t i = 0; i < inputs.size() && i < infos.size(); ++i) {
      const engine::TensorInfo& info = infos[i];
      const Tensor& t = *inputs[i];
      if (t.dtype() != info.dtype) {
        return InvalidArgument("input '" + info.name + "' has data type " +
                               std::string(DataTypeName(t.dtype())) + "; the model's is " +
                               std::string(DataTypeName(info.dtype)));
      }
      if (!info.rank_known) continue;
      bool ok = t.shape().size() == info.shape.size();
      for (size_t d = 0; ok && d < info.shape.size(); ++d)
        ok = !info.shape[d].known() || info.shape[d].value == t.shape()[d];
      if (!ok) {
        return InvalidArgument("input '" + info.name + "' has shape " + ShapeToString(t.shape()) +
                               "; the model's is " + engine::SymbolicShapeToString(info.shape));
      }
    }
    return Status::Ok();
  }

  struct Cached {
    std::vector<Shape> shapes;
    std::unique_ptr<engine::cuda::GpuPlan> plan;
  };
  // gpu_cpu_tail: the model's GPU stage (owned), which model_ then names, and its CPU tail.
  std::unique_ptr<engine::Model> stage_;
  const engine::Model& model_;  // what the GPU plans run: the model, or its GPU stage
  const engine::Model& whole_;  // the model: the outputs an answer gives
  std::unique_ptr<engine::Model> tail_model_;
  std::unique_ptr<engine::Session> tail_;  // null without a tail
  int gpu_;
  engine::cuda::GpuPlanOptions plan_options_;  // tensor_parallel.shards 1: none split
  bool conv_fallback_;     // gpu_convolution "auto": im2col where cuDNN cannot plan
  std::string said_int8_;  // the int8 products of the last plan that logged them (PlanFor)
  std::string tier_;
  int depth_;                                     // pipeline_depth(): 1 or GpuPlan::kSlots
  std::vector<engine::cuda::ShardPlace> shards_;  // where each shard runs
  // Declared before the handles bound to it, so destroyed after them.
  engine::cuda::Stream stream_;
  std::unique_ptr<engine::cuda::LtHandle> handle_;
  // The cuDNN handle of the instance's plans, made with the first plan that has a cuDNN
  // convolution (a plan whose handle cannot be made makes its own, and fails saying why).
  std::shared_ptr<engine::cuda::CudnnHandle> cudnn_;
  // The model's constants on the device, one copy shared by the plans of every shape (and
  // by the model's other instances on this GPU).
  std::shared_ptr<engine::cuda::GpuWeights> weights_;
  dnnl::engine cpu_engine_;  // prepares the CPU plans that are lowered
  dnnl::stream cpu_stream_;
  // A batching model's batch buckets (ascending; empty: a plan per batch size).
  std::vector<int64_t> buckets_;
  size_t max_plans_;         // plans_ kept at most
  std::list<Cached> plans_;  // most recently used first
  // The plans whose failed capture the log has told (FinishBatch), forgotten when evicted.
  std::set<const engine::cuda::GpuPlan*> said_graph_failure_;
  int64_t plans_made_ = 0;
  // Batches launched and not finished, oldest first; capacity pipeline_depth(), reserved.
  std::vector<Launched> launched_;
  DeviceStats stats_;  // device time and memory, as of the last batch
  std::chrono::steady_clock::time_point last_nvml_{};  // when NVML was last asked
};

}  // namespace

bool GpuInstancesBuilt() { return true; }

namespace {

// A positive integer parameter, or `fallback` when the config has none.
StatusOr<int64_t> PositiveParameter(const std::map<std::string, std::string>& parameters,
                                    const std::string& key, int64_t fallback, int64_t most) {
  auto it = parameters.find(key);
  if (it == parameters.end()) return fallback;
  int64_t value = 0;
  const std::string& text = it->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 1 ||
      value > most) {
    return InvalidArgument("parameter " + key + " must be an integer from 1 to " +
                           std::to_string(most) + "; was '" + text + "'");
  }
  return value;
}

}  // namespace

StatusOr<std::unique_ptr<BackendInstance>> CreateGpuInstance(
    const engine::Model& model, const InstanceInfo& info,
    const std::map<std::string, std::string>& parameters, int64_t max_batch_size,
    const GpuAccuracyCheck& check, GpuModelState* shared, const engine::SessionOptions& cpu) {
  auto weights_on = [shared](int device) {
    return shared ? shared->WeightsOn(device) : std::make_shared<engine::cuda::GpuWeights>();
  };
  const std::string where = "GPU " + std::to_string(info.gpu);
  GemmMath math = GemmMath::kFp32;
  std::string tier = "fp32";
  if (auto it = parameters.find("gpu_precision"); it != parameters.end()) {
    // int8 is fp32's plan with its products quantised where they can be (int8_ranges).
    static const std::pair<const char*, GemmMath> kTiers[] = {{"fp32", GemmMath::kFp32},
                                                              {"tf32", GemmMath::kTf32},
                                                              {"fp16", GemmMath::kFp16},
                                                              {"bf16", GemmMath::kBf16},
                                                              {"int8", GemmMath::kFp32}};
    bool known = false;
    for (const auto& [name, m] : kTiers) {
      if (it->second != name) continue;
      math = m;
      tier = name;
      known = true;
    }
    if (!known) {
      return InvalidArgument(
          "parameter gpu_precision must be fp32, tf32, fp16, bf16 or int8; was '" + it->second +
          "'");
    }
  }
  if (tier == "int8" && !check.int8_ranges) {
    return InvalidArgument(where + ": gpu_precision int8 needs the calibration inputs' ranges " +
                           "(the model's calibration_file)");
  }
  // Convolutions: on cuDNN where it loads ("auto"), or as the config says.
  engine::cuda::ConvEngine conv = engine::cuda::ConvEngine::kIm2Col;
  bool conv_fallback = false;
  {
    auto it = parameters.find("gpu_convolution");
    const std::string choice = it == parameters.end() ? "auto" : it->second;
    if (choice != "auto" && choice != "cudnn" && choice != "im2col") {
      return InvalidArgument("parameter gpu_convolution must be auto, cudnn or im2col; was '" +
                             choice + "'");
    }
    auto cudnn = engine::cuda::Cudnn::Get();
    if (choice == "cudnn" && !cudnn.ok())
      return cudnn.status().WithPrefix("parameter gpu_convolution is cudnn");
    if (choice != "im2col" && cudnn.ok()) conv = engine::cuda::ConvEngine::kCudnn;
    conv_fallback = choice == "auto";
    static std::once_flag said;
    std::call_once(said, [&] {
      if (cudnn.ok()) {
        spdlog::info("cuDNN {} loaded for GPU convolutions", (*cudnn)->version());
      } else {
        spdlog::info("GPU convolutions on im2col and cuBLASLt: {}", cudnn.status().ToString());
      }
    });
  }
  auto conv_search = engine::cuda::CudnnAlgorithmSearch::kMeasured;
  if (auto it = parameters.find("gpu_convolution_algorithm"); it != parameters.end()) {
    if (it->second == "heuristic") {
      conv_search = engine::cuda::CudnnAlgorithmSearch::kHeuristic;
    } else if (it->second != "measured") {
      return InvalidArgument(
          "parameter gpu_convolution_algorithm must be measured or heuristic; was '" + it->second +
          "'");
    }
  }
  bool channels_last = true;
  if (auto it = parameters.find("gpu_convolution_layout"); it != parameters.end()) {
    if (it->second != "channels_last" && it->second != "nchw") {
      return InvalidArgument(
          "parameter gpu_convolution_layout must be channels_last or nchw; was '" + it->second +
          "'");
    }
    channels_last = it->second == "channels_last";
  }
  bool cpu_tail = false;
  if (auto it = parameters.find("gpu_cpu_tail"); it != parameters.end()) {
    if (it->second != "true" && it->second != "false") {
      return InvalidArgument("parameter gpu_cpu_tail must be true or false; was '" + it->second +
                             "'");
    }
    cpu_tail = it->second == "true";
  }
  // Tensor parallelism: the large products split into `shards`, which go on the GPUs the
  // instance spans in turn (every one on its own GPU when it spans one).
  engine::cuda::TensorParallelOptions tensor_parallel;
  ASSIGN_OR_RETURN(const int64_t shards,
                   PositiveParameter(parameters, "gpu_tensor_parallel", 1, 16));
  ASSIGN_OR_RETURN(
      tensor_parallel.min_columns,
      PositiveParameter(parameters, "gpu_tensor_parallel_min_columns", 1024, int64_t{1} << 40));
  tensor_parallel.shards = static_cast<int>(shards);
  // Batches in flight per instance: 2 overlaps one's copies with the other's compute.
  ASSIGN_OR_RETURN(const int64_t depth,
                   PositiveParameter(parameters, "gpu_pipeline_depth",
                                     engine::cuda::GpuPlan::kSlots, engine::cuda::GpuPlan::kSlots));
  // A batching model's batches run on the plans of a few batch sizes.
  std::vector<int64_t> buckets;
  if (auto it = parameters.find("gpu_batch_buckets"); max_batch_size > 0) {
    ASSIGN_OR_RETURN(
        buckets, ParseBatchBuckets(it != parameters.end() ? it->second : "auto", max_batch_size));
  } else if (it != parameters.end() && it->second != "auto" && it->second != "exact") {
    return InvalidArgument(
        "parameter gpu_batch_buckets needs a model that batches "
        "(max_batch_size > 0); was '" +
        it->second + "'");
  }
  const std::vector<int> span = info.gpus.empty() ? std::vector<int>{info.gpu} : info.gpus;
  auto devices = engine::cuda::ListDevices();
  if (!devices.ok()) return devices.status().WithPrefix(where + ": no usable CUDA device");
  for (int gpu : span) {
    if (gpu < 0 || gpu >= static_cast<int>(devices->size())) {
      return InvalidArgument("GPU " + std::to_string(gpu) + ": this machine has " +
                             std::to_string(devices->size()) + " GPU" +
                             (devices->size() == 1 ? "" : "s") +
                             " (ordinals from 0); instance_group's gpus must name one of them");
    }
  }
  std::vector<engine::cuda::ShardPlace> places;
  if (shards > 1) {
    // One copy of the weights per device the shards use besides the instance's own.
    std::map<int, std::shared_ptr<engine::cuda::GpuWeights>> weights;
    for (int64_t s = 0; s < shards; ++s) {
      engine::cuda::ShardPlace place;
      place.device = span[static_cast<size_t>(s) % span.size()];
      const bool own = place.device != info.gpu;
      if (own) {
        auto& w = weights[place.device];
        if (!w) w = weights_on(place.device);
        place.weights = w;
      }
      tensor_parallel.own_memory.push_back(own);
      places.push_back(std::move(place));
    }
  }
  RETURN_IF_ERROR(
      engine::cuda::CudaStatus(cudaSetDevice(info.gpu), "cudaSetDevice").WithPrefix(where));
  // NVML, for the utilisation metric, loaded now: its first initialisation can take a while
  // (without the driver's persistence mode), which no request should wait for.
  (void)engine::cuda::Nvml::Get();
  ASSIGN_OR_RETURN(auto handle, engine::cuda::LtHandle::Create());
  ASSIGN_OR_RETURN(auto stream, engine::cuda::Stream::Create());
  // The smallest shapes of `inputs` (symbolic dimensions 1), whether every rank is known,
  // and whether every dimension but the batch is.
  // (An input of unknown rank has no smallest shape: such a model is lowered at its first
  // batch, or at the calibration inputs' shapes below.)
  bool ranks_known = true, rows_fixed = true;
  auto smallest = [&](const std::vector<engine::TensorInfo>& inputs) {
    std::vector<Shape> shapes;
    ranks_known = rows_fixed = true;
    for (const engine::TensorInfo& t : inputs) {
      ranks_known = ranks_known && t.rank_known;
      rows_fixed = rows_fixed && !t.shape.empty();
      Shape shape;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        rows_fixed = rows_fixed && (d == 0 || t.shape[d].known());
        shape.push_back(t.shape[d].known() ? t.shape[d].value : 1);
      }
      shapes.push_back(std::move(shape));
    }
    return shapes;
  };
  std::vector<Shape> shapes = smallest(model.inputs());
  // gpu_cpu_tail: the model from the first node the GPU path cannot run on the CPU engine.
  engine::cuda::GpuCpuSplit split;
  std::unique_ptr<engine::Session> tail;
  engine::cuda::GpuPlanOptions plan_options;
  plan_options.math = math;
  plan_options.tensor_parallel = tensor_parallel;
  plan_options.conv = conv;
  plan_options.conv_search = conv_search;
  plan_options.channels_last = channels_last;
  if (tier == "int8") plan_options.int8_calibration = check.int8_ranges;
  if (cpu_tail) {
    if (!ranks_known) {
      return InvalidArgument(where + ": parameter gpu_cpu_tail needs every input's rank known");
    }
    auto cut = engine::cuda::SplitForGpu(model, shapes, plan_options);
    if (cut.ok()) {
      split = std::move(cut).value();
      auto session = engine::Session::Create(*split.cpu_tail, cpu);
      if (!session.ok()) return session.status().WithPrefix(where + ": the CPU tail");
      tail = std::move(session).value();
      std::string nodes;
      for (const std::string& n : split.cpu_nodes) nodes += (nodes.empty() ? "" : "; ") + n;
      spdlog::info(
          "{}: the model runs on the GPU up to node {} of {}, then on the CPU (the GPU "
          "path cannot run: {})",
          where, split.cut, model.graph().nodes.size(), LogSafe(nodes));
      // Batch buckets trim every output of the GPU part to the batch's rows: only right
      // when each is one row per request.
      if (!buckets.empty() && !split.gpu_stage->NonBatchMajorOutputs().empty()) {
        std::string names;
        for (const std::string& n : split.gpu_stage->NonBatchMajorOutputs())
          names += (names.empty() ? "" : ", ") + n;
        spdlog::info(
            "{}: a plan per batch size, not batch buckets: the GPU part's outputs {} "
            "are not batch-major",
            where, LogSafe(names));
        buckets.clear();
      }
    } else if (cut.status().code() != StatusCode::kFailedPrecondition) {
      return cut.status().WithPrefix(where + ": parameter gpu_cpu_tail");
    }
  }
  auto instance = std::make_unique<GpuInstance>(
      model, info.gpu, plan_options, tier, std::move(places), weights_on(info.gpu),
      std::move(handle), std::move(stream), static_cast<int>(depth), std::move(buckets),
      conv_fallback, std::move(split), std::move(tail));
  // The smallest shapes of what runs on the GPU: a model the GPU path cannot run fails
  // here, at load.
  shapes = smallest(instance->gpu_model().inputs());
  try {
    if (ranks_known) {
      auto plan = instance->PlanFor(shapes);
      if (plan.status().code() == StatusCode::kUnimplemented && !cpu_tail &&
          plan.status().message().find("the GPU path cannot run this model") != std::string::npos) {
        return Unimplemented(where + ": " + plan.status().message() +
                             "\n(the config parameter gpu_cpu_tail: true runs the model from "
                             "the first of these nodes on the CPU)");
      }
      if (!plan.ok()) return plan.status().WithPrefix(where);
    }
    // A batching model's bucket plans, made now, so that no batch makes one on the request
    // path (when the inputs' other dimensions are fixed, the buckets are all the shapes).
    if (ranks_known && rows_fixed && max_batch_size > 0) {
      for (int64_t bucket : instance->buckets()) {
        for (Shape& shape : shapes) shape[0] = bucket;
        auto plan = instance->PlanFor(shapes);
        if (!plan.ok()) return plan.status().WithPrefix(where);
      }
    }
    if (!check.batches.empty() && check.judge) {
      // The tier against the CPU engine's fp32 on the calibration inputs. Those batches'
      // plans stay in the instance's cache; their device time is not the model's serving.
      auto cpu = engine::Session::Create(model);
      if (!cpu.ok()) return cpu.status().WithPrefix(where + ": the fp32 reference");
      auto accuracy = engine::CompareRunners(
          [&](const std::vector<NamedTensor>& in, std::vector<NamedTensor>* out) {
            return (*cpu)->Run(in, out);
          },
          [&](const std::vector<NamedTensor>& in, std::vector<NamedTensor>* out) {
            return instance->Run(in, out);
          },
          check.batches);
      if (!accuracy.ok()) return accuracy.status().WithPrefix(where + ": measuring " + tier);
      RETURN_IF_ERROR(check.judge(*accuracy));
      instance->ResetDeviceStats();
    }
  } catch (const std::exception& e) {
    return Internal(where + ": " + e.what());
  }
  return std::unique_ptr<BackendInstance>(std::move(instance));
}

StatusOr<std::string> DescribeGpuPath(const engine::Model& model, int64_t batch) {
  std::vector<Shape> shapes;
  for (const engine::TensorInfo& t : model.inputs()) {
    if (!t.rank_known) {
      return std::string(
          "GPU path: an input of unknown rank; a GPU instance lowers the model at its first "
          "batch\n");
    }
    Shape shape;
    for (size_t d = 0; d < t.shape.size(); ++d)
      shape.push_back(t.shape[d].known() ? t.shape[d].value
                      : d == 0           ? std::max<int64_t>(batch, 1)
                                         : 1);
    shapes.push_back(std::move(shape));
  }
  dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  dnnl::stream cpu_stream(cpu);
  ASSIGN_OR_RETURN(auto plan, engine::Plan::Prepare(
                                  model.graph(), shapes, cpu, cpu_stream, model.weight_cache(),
                                  engine::cuda::GpuLoweringPlanOptions(), model.options().limits));
  auto cudnn = engine::cuda::Cudnn::Get();
  engine::cuda::GpuPlanOptions options;
  options.conv = cudnn.ok() ? engine::cuda::ConvEngine::kCudnn : engine::cuda::ConvEngine::kIm2Col;
  std::vector<int> refused;
  auto lowered = engine::cuda::LowerPlan(model.graph(), *plan, options, &refused);
  std::string text = "GPU path (batch " + std::to_string(std::max<int64_t>(batch, 1)) +
                     ", gpu_precision fp32, gpu_convolution auto):\n";
  text += cudnn.ok() ? "  cuDNN " + (*cudnn)->version() + " loaded: convolutions on cuDNN\n"
                     : "  " + cudnn.status().message() + ": convolutions on im2col\n";
  if (lowered.ok()) {
    int gemms = 0, on_cudnn = 0, on_im2col = 0;
    for (const engine::cuda::GpuStep& step : lowered->steps) {
      gemms += step.kind == engine::cuda::GpuStep::Kind::kGemm;
      on_cudnn += step.kind == engine::cuda::GpuStep::Kind::kConv;
      on_im2col += step.kind == engine::cuda::GpuStep::Kind::kIm2Col;
    }
    text += "  lowers whole: " + std::to_string(lowered->steps.size()) + " steps (" +
            std::to_string(gemms) + " GEMMs; convolutions: " + std::to_string(on_cudnn) +
            " on cuDNN, " + std::to_string(on_im2col) + " on im2col); weights " +
            std::to_string(lowered->weight_bytes) + " bytes, arena " +
            std::to_string(lowered->arena_bytes) + " bytes\n";
    // What gpu_precision int8 would take, its ranges from inputs made up here (random
    // floating-point values in [-1, 1), integers 1): which products are int8 depends on their
    // shapes, and on a range only where a value is always 0.
    const std::vector<NamedTensor> inputs = engine::MadeUpInputs(model, shapes);
    auto ranges = engine::Calibrate(model, {inputs});
    if (!ranges.ok()) {
      text += "  in int8: not said, calibrating failed: " + ranges.status().message() + "\n";
      return text;
    }
    options.int8_calibration =
        std::make_shared<const engine::Calibration>(std::move(ranges).value());
    auto int8 = engine::cuda::LowerPlan(model.graph(), *plan, options);
    if (!int8.ok()) {
      text += "  in int8: not said, lowering failed: " + int8.status().message() + "\n";
      return text;
    }
    text += "  in int8 (gpu_precision int8): " + engine::cuda::Int8Summary(*int8) +
            (int8->fp32_products.empty() ? "\n" : "; kept fp32:\n");
    for (const std::string& why : int8->fp32_products) text += "    " + why + "\n";
    if (int8->fp32_products.size() > 0 && shapes.size() > 0 && !shapes[0].empty() &&
        shapes[0][0] < engine::cuda::GpuPlanOptions().int8_min_rows) {
      text += "    (products of few rows stay fp32: --batch N says what a batch of N takes)\n";
    }
    return text;
  }
  if (refused.empty()) return lowered.status();
  text += "  cannot run whole (a KIND_GPU instance is refused); the nodes it lacks:\n";
  std::sort(refused.begin(), refused.end());
  refused.erase(std::unique(refused.begin(), refused.end()), refused.end());
  // The first dozen: after a NonZero, every node that follows is refused too.
  constexpr size_t kListed = 12;
  for (size_t i = 0; i < refused.size() && i < kListed; ++i)
    text += "    " + model.graph().Describe(refused[i]) + "\n";
  if (refused.size() > kListed)
    text += "    and " + std::to_string(refused.size() - kListed) + " more\n";
  auto split = engine::cuda::SplitForGpu(model, shapes, options);
  if (split.ok()) {
    text += "  with gpu_cpu_tail: true, nodes 0-" + std::to_string(split->cut - 1) + " of " +
            std::to_string(model.graph().nodes.size()) + " run on the GPU and the rest, from " +
            model.graph().Describe(split->cut) + ", on the CPU\n";
  } else {
    text += "  gpu_cpu_tail cannot help: " + split.status().message() + "\n";
  }
  return text;
}

DeviceMemoryOpener CudaIpcOpener() { return engine::cuda::IpcMemoryOpener(); }

}  // namespace shoal::backends
