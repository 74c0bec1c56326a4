// A lowered model plan (gpu_lowering.h) on a CUDA device: GpuPlan::Create allocates its
// arena, finds or uploads its weights (GpuWeights, shared by an instance's plans) and plans
// its GEMMs; Run copies the inputs in through pinned memory, runs the steps (as a CUDA
// graph from the second run on) and copies the outputs out. Nothing is allocated per run.
// One GpuPlan per instance: Run is not thread-safe.
//
// A tensor-parallel plan (TensorParallelOptions) also owns, per shard, a stream on the
// shard's device, a GEMM workspace, the arena of a shard with memory of its own, and the
// events that fork the shards from the plan's stream and join them back; its CUDA graph
// spans every shard's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/device.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/gpu_lowering.h"

namespace shoal::engine::cuda {

// Device copies of one model's constants on one device, shared by its GPU plans for every
// input shape and by every instance of the model on that device: each blob is uploaded
// once, by key, and freed with its last user. Thread-safe: instances create and drop
// their plans on their own threads.
class GpuWeights {
 public:
  // The device copy of `blob`, on the current device, uploaded on `stream` the first time
  // its key is asked for and complete when Get returns (another instance may read it at
  // once); each Get is one more user of it. INTERNAL when the key names a copy of another
  // size.
  StatusOr<const void*> Get(const GpuLowering::Blob& blob, const Stream& stream) EXCLUDES(mu_);
  // One user fewer of `key`; its device copy is freed with the last (a plan evicted from
  // an instance's cache takes the copies only it used with it).
  void Release(const std::string& key) EXCLUDES(mu_);
  size_t count() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return buffers_.size();
  }
  int64_t bytes() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return bytes_;
  }

 private:
  struct Entry {
    DeviceBuffer buffer;
    int users = 0;
  };
  mutable Mutex mu_;
  std::map<std::string, Entry> buffers_ GUARDED_BY(mu_);
  int64_t bytes_ GUARDED_BY(mu_) = 0;
};

// Where one shard of a tensor-parallel plan runs.
struct ShardPlace {
  int device = -1;  // its CUDA ordinal; -1: the plan's device
  // The device copies of the weights on that device, shared by the plans (and instances)
  // there; null: the plan's own on its device, a new one on another.
  std::shared_ptr<GpuWeights> weights;
};

class GpuPlan {
 public:
  // Allocates the arena and the GEMM workspace on the current device, finds or uploads
  // the weights in `weights` (a GpuWeights of its own when null) on `stream`, and plans
  // every GEMM. `handle` must outlive the plan. A tensor-parallel lowering's shards run
  // where `shards` says (the rest, or all when it is shorter, on the plan's device); a shard
  // the lowering gave memory of its own must be on another device than the plan's only
  // when `shards` says so (on the same device its copies are plain device copies).
  static StatusOr<std::unique_ptr<GpuPlan>> Create(GpuLowering lowering, const LtHandle& handle,
                                                   const Stream& stream,
                                                   std::shared_ptr<GpuWeights> weights = nullptr,
                                                   std::vector<ShardPlace> shards = {});

  ~GpuPlan();
  GpuPlan(const GpuPlan&) = delete;
  GpuPlan& operator=(const GpuPlan&) = delete;

  // `inputs` follow graph.inputs with the planned shapes and dtypes; `outputs` are
  // replaced by host tensors following graph.outputs. Copies the inputs into the plan's
  // pinned staging buffer, queues their copies to the device, every step and the outputs'
  // copies back (from the second run on as the plan's CUDA graph, when the lowering asked
  // for one), waits, and copies the outputs out of the staging buffer. INVALID_ARGUMENT for
  // an input of another shape or dtype, or (found after the run, naming the node) a Gather
  // index or a RoiAlign batch index out of range, or an integer Mod by zero.
  Status Run(const std::vector<const Tensor*>& inputs, const Stream& stream,
             std::vector<Tensor>* outputs);

  // Where one run's device time goes: its input copies, its steps, its output copies (and
  // the error flag's), in ms, each timed with CUDA events.
  struct PhaseMs {
    double copy_in = 0, compute = 0, copy_out = 0;
  };
  // Runs as Run does, but step by step with events between the phases, and returns their
  // times (a benchmark's breakdown: how much a batch's copies could hide behind another's
  // compute). The outputs are those of Run.
  StatusOr<PhaseMs> RunTimingPhases(const std::vector<const Tensor*>& inputs, const Stream& stream,
                                    std::vector<Tensor>* outputs);

  const GpuLowering& lowering() const { return lowering_; }
  // Whether the plan's CUDA graph has been captured (from its second run on; false for good
  // when the lowering asked for none or a capture failed and it runs step by step).
  bool graph_captured() const { return graph_ != nullptr; }
  // Device time of the last Run's queued work (CUDA events around it), in ms.
  double last_device_ms() const { return last_device_ms_; }
  // Device memory the plan holds besides the shared weights: arena, workspace and flag.
  // A tensor-parallel plan's shard buffers count here too, on whichever device they are.
  int64_t device_bytes() const {
    size_t bytes = arena_.size_bytes() + workspace_.size_bytes() + error_flag_.size_bytes();
    for (const Shard& s : shards_) bytes += s.arena.size_bytes() + s.workspace.size_bytes();
    return static_cast<int64_t>(bytes);
  }

 private:
  GpuPlan() = default;
  // A tensor-parallel shard: where it runs and what it owns there.
  struct Shard {
    int device = 0;
    std::shared_ptr<GpuWeights> weights;  // where its blobs are
    std::unique_ptr<LtHandle> handle;     // on another device than the plan's
    std::optional<Stream> stream;
    DeviceBuffer arena, workspace;
    cudaEvent_t joined = nullptr;  // recorded on its stream at each kJoin
  };
  // Steps of shard `s` run with its device current and on its stream.
  Status RunShardStep(size_t i, cudaStream_t stream);
  // The device address of value `v` (its blob, or the arena's base plus its offset).
  void* Address(int v) const;
  const char* Blob(int64_t index) const { return static_cast<const char*>(blobs_[index]); }
  Status RunStep(size_t i, cudaStream_t stream);
  // The copies in, every step and the copies out, queued one by one (`Queue`), or as the
  // graph `Queue` was captured into.
  Status Queue(cudaStream_t stream);
  // INVALID_ARGUMENT unless `inputs` are the planned ones (count, dtype, shape).
  Status CheckInputs(const std::vector<const Tensor*>& inputs) const;
  // Run's body: the inputs staged, everything queued (as the graph when `graph`), waited
  // for, the outputs and the error flag read.
  Status RunQueued(const std::vector<const Tensor*>& inputs, const Stream& stream,
                   std::vector<Tensor>* outputs, bool graph);
  Status QueueAsGraph(cudaStream_t stream);

  GpuLowering lowering_;
  std::shared_ptr<GpuWeights> weights_;
  std::vector<const void*> blobs_;      // per blob of the lowering, its device copy
  std::vector<std::string> blob_keys_;  // and its key, released with the plan
  std::vector<int> blob_shards_;        // and its shard (-1: the plan's weights)
  int device_ = 0;                      // the plan's device
  std::vector<Shard> shards_;           // a tensor-parallel plan's shards
  cudaEvent_t forked_ = nullptr;        // recorded on the plan's stream at each kFork
  DeviceBuffer arena_, workspace_, error_flag_;
  // Pinned host memory the copies go through: each input, each output, the error flag.
  PinnedBuffer staging_;
  std::vector<size_t> staged_inputs_, staged_outputs_;  // offsets in staging_
  size_t staged_flag_ = 0;
  std::vector<std::unique_ptr<LtGemm>> gemms_;          // per step; null where no GEMM
  cudaGraphExec_t graph_ = nullptr;                     // the steps, once captured
  cudaEvent_t started_ = nullptr, finished_ = nullptr;  // around each run's queued work
  // RunTimingPhases: recorded after the input copies and after the steps (else null).
  cudaEvent_t copied_in_ = nullptr, computed_ = nullptr;
  double last_device_ms_ = 0;
  int64_t runs_ = 0;           // the graph is captured at the second run, after a warm one
  bool graph_failed_ = false;  // capture failed once: the plan runs step by step
};

}  // namespace shoal::engine::cuda
