// The Backend interface: what the runtime needs from anything that executes a model.
//
// Three objects, three lifetimes:
//   Backend          one per kind ("identity" plugin, "onnx"), shared by every model of
//                    that kind; found by name in a BackendRegistry.
//   BackendModel     one per loaded model version: LoadModel reads the version's files.
//   BackendInstance  one per instance of a model version: CreateInstance allocates what
//                    one concurrent execution needs (threads, scratch, weights copies).
// Release is destruction: the runtime destroys instances before their model, and a
// model before its backend.
//
// Threading contract (the runtime guarantees it; backends may rely on it):
//   - LoadModel runs on the loading thread; several models may load concurrently.
//   - CreateInstance, warmup and every Execute of an instance run on that instance's
//     own thread, pinned to its cores when the config names cores.
//   - Execute is never called concurrently for one instance; it may be for two
//     instances of the same model, so shared model state must be read-only or locked.
//   - When Execute returns an error, the runtime answers every request of the batch
//     with that error (as INTERNAL unless the code says otherwise) and keeps serving.
//     A backend must not throw; exceptions are caught at the boundary and become
//     INTERNAL errors.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal::backends {

// A tensor in a model's signature. `dims` excludes the batch dimension when the model
// batches (max_batch_size > 0); -1 marks a variable dimension.
struct TensorSpec {
  std::string name;
  DataType dtype = DataType::kInvalid;
  Shape dims;
  bool optional = false;
};

// What a backend is told about the model version it loads.
struct ModelInfo {
  std::string name;
  int64_t version = 0;
  std::string model_dir;    // <repo>/<model>
  std::string version_dir;  // <repo>/<model>/<version>
  int max_batch_size = 0;   // 0: the model does not batch; inputs carry no batch dim
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::map<std::string, std::string> parameters;  // config `parameters`, string values
};

struct InstanceInfo {
  std::string name;            // "<model>_<index>"
  int index = 0;               // 0-based across the model's instances
  std::vector<int> cpu_cores;  // empty: not pinned
  // Intra-op threads this instance may use (the group's `threads` setting); 0: the
  // backend's own default for the model.
  int threads = 0;
  // A KIND_GPU instance: the CUDA device ordinal it runs on (one of its group's `gpus`);
  // -1 for a KIND_CPU instance. A backend that cannot run on it refuses CreateInstance.
  int gpu = -1;
  // A KIND_GPU instance: every GPU it spans, `gpu` first. More than one with tensor
  // parallelism (the model's `gpu_tensor_parallel`), whose shards go on these in turn;
  // otherwise {gpu}. Empty for a KIND_CPU instance.
  std::vector<int> gpus{};
};

// One execution. When the model batches, every input's first dimension is
// `batch_size`, and every output's first dimension must be too.
struct ExecuteRequest {
  int64_t batch_size = 1;
  std::vector<NamedTensor> inputs;
  // Outputs to produce; empty means all of the model's outputs. A backend may produce
  // more; the runtime drops what was not asked for.
  std::vector<std::string> requested_outputs;
  // The model variant the batch's requests asked for with the request parameter
  // `precision` ("bf16", "int8"...); empty: the model's default. Requests that ask for
  // different variants never share a batch. A backend without variants may ignore it;
  // the onnx backend answers INVALID_ARGUMENT for a tier it has not loaded.
  std::string variant;
};

// What an instance on a GPU reports about it (BackendInstance::device_stats).
struct DeviceStats {
  int gpu = -1;              // the CUDA ordinal; -1: the instance runs on CPUs
  int64_t memory_bytes = 0;  // device memory the instance holds besides the shared weights
  // Per GPU the instance uses (its own, and with tensor parallelism the others it spans):
  // the model's weights there, one copy shared by all its instances on that GPU.
  std::map<int, int64_t> shared_weights_bytes;
  int64_t device_used_bytes = 0;   // the whole device's memory in use, when last seen
  int64_t device_total_bytes = 0;  // the device's memory
  int64_t busy_ns = 0;             // device time of its batches (CUDA events), in total
  // The device's utilisation, 0..100, as NVML last sampled it (every process's kernels);
  // -1 where NVML is not there.
  int utilization_percent = -1;
  // The process's context on the device is lost (a sticky CUDA error: an illegal address, a
  // kernel that faulted): the instance can never run again, nor can any other on that
  // device, until the process restarts. The runtime then reports the model unavailable and
  // the server not live (runtime/server.h).
  bool context_lost = false;
};

class BackendInstance {
 public:
  virtual ~BackendInstance() = default;
  // Runs one batch and appends the outputs. See the threading contract above.
  virtual Status Execute(const ExecuteRequest& request, std::vector<NamedTensor>* outputs) = 0;
  // For an instance that runs its model as a pipeline of stages (the onnx backend's
  // `pipeline_stages`): the share of its stages' time spent idle while the pipeline held
  // work, 0..1, since the instance was created. -1 (the default) for any other instance.
  // Called on the instance's thread between executions.
  virtual double pipeline_bubble_ratio() const { return -1; }
  // For an instance on a GPU: its device's figures, as of its last execution (gpu -1, the
  // default, for any other instance). Called on the instance's thread between executions
  // (a pipelining instance's: between its calls, batches may be launched).
  virtual DeviceStats device_stats() const { return {}; }
  // One-time set-ups this instance has done so far, such as a plan prepared for input
  // shapes it had not run before (0, the default: none it reports). A batch during which
  // the count grew ran slow for a reason that will not come again, so the runtime teaches
  // neither its cost model nor admission's reserve from it. Called on the instance's
  // thread, as device_stats() is.
  virtual int64_t setups() const { return 0; }

  // Pipelined execution, for an instance whose device runs one batch while its thread
  // prepares the next and answers the last (a GPU instance: the next batch's input copies
  // overlap this one's compute, its output copies the next one's). How many batches it
  // takes launched and not yet finished, fixed for the instance's life; 1 (the default):
  // Launch and Finish are never called, only Execute.
  virtual int pipeline_depth() const { return 1; }
  // Queues the batch's work and returns before it has run, keeping no reference into
  // `request` (its tensors may be freed once Launch returns; a backend that reads one
  // later, a GPU instance's CPU tail, keeps its buffer by shared ownership). Once Launch has
  // returned OK, `on_done` is called exactly once, whether the work succeeds or fails, from any
  // thread (a CUDA stream callback, say) and without any lock of the runtime's held, when the
  // batch's work has ended, and it has returned before that batch's Finish returns. It is
  // a wake-up only: Finish waits in any case. When Launch returns an error nothing was
  // launched and `on_done` is never called. The runtime keeps at most pipeline_depth()
  // batches launched and not finished, finishes them in the order it launched them, and
  // may call Execute in between while fewer than pipeline_depth() are outstanding: its
  // work runs after theirs and it returns without their Finish. device_stats() and
  // pipeline_bubble_ratio() may be called while batches are launched. Instance thread only.
  virtual Status Launch(const ExecuteRequest& request, std::function<void()> on_done) {
    (void)request;
    (void)on_done;
    return Unimplemented("this instance does not pipeline");
  }
  // Waits for the oldest launched batch and appends its outputs, or returns its error;
  // either way the batch is done with.
  virtual Status Finish(std::vector<NamedTensor>* outputs) {
    (void)outputs;
    return Unimplemented("this instance does not pipeline");
  }
};

class BackendModel {
 public:
  virtual ~BackendModel() = default;
  // Called on the new instance's own thread.
  virtual StatusOr<std::unique_ptr<BackendInstance>> CreateInstance(const InstanceInfo& info) = 0;
  // The model's signature as the backend knows it (for completing a partial config).
  // The default returns what it was loaded with.
  virtual ModelInfo info() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual StatusOr<std::unique_ptr<BackendModel>> LoadModel(const ModelInfo& info) = 0;
};

}  // namespace shoal::backends
