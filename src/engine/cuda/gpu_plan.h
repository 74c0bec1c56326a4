// A lowered model plan (gpu_lowering.h) on a CUDA device: GpuPlan::Create allocates its
// arena, finds or uploads its weights (GpuWeights, shared by an instance's plans) and plans
// its GEMMs. No device or pinned memory is allocated per batch.
//
// Batches run double buffered: a plan has kSlots (2) slots, each with its own pinned
// staging buffer, device input and output buffers, CUDA graph and events, so that one
// batch's copies overlap another's compute. Launch stages a batch into a free slot and
// queues it on three streams without waiting:
//   copy-in (the plan's own)   the inputs, staging -> the slot's device input buffer;
//   compute (the caller's)     after the copy-in: the inputs into the arena, every step
//                              (as the slot's CUDA graph from the plan's second batch on),
//                              the outputs and error flags into the slot's output buffer;
//   copy-out (the plan's own)  after the compute: the output buffer -> staging, then the
//                              batch's `on_done`.
// Finish waits for the slot's batch, copies its outputs out and frees the slot. Run is
// Launch and Finish of one batch. Only the compute touches the arena, so batches of one
// plan (and of the plans sharing a compute stream) compute one after another, in launch
// order, whatever order their slots are finished in; a slot is reused only after its
// Finish, which waited for all of its batch's work.
//
// Threading: one GpuPlan per instance; Launch, Finish and Run are called from one thread at
// a time. `on_done` runs on a CUDA thread.
//
// A tensor-parallel plan (TensorParallelOptions) also owns, per shard, a stream on the
// shard's device, a GEMM workspace, the arena of a shard with memory of its own, and the
// events that fork the shards from the compute stream and join them back, inside each
// batch's compute; its CUDA graphs span every shard's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/cudnn.h"
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
  // every GEMM and cuDNN convolution (on `cudnn`, below; UNAVAILABLE without cuDNN,
  // UNIMPLEMENTED when cuDNN has no algorithm for one, naming its node). `handle` must outlive the
  // plan. A tensor-parallel lowering's shards run where `shards` says (the rest, or all when it is
  // shorter, on the plan's device); a shard the lowering gave memory of its own must be on another
  // device than the plan's only when `shards` says so (on the same device its copies are plain
  // device copies).
  // `cudnn`: the cuDNN handle its convolutions run with, shared by an instance's plans (they
  // run on one thread); null: a handle of its own, made when it has a cuDNN convolution.
  static StatusOr<std::unique_ptr<GpuPlan>> Create(GpuLowering lowering, const LtHandle& handle,
                                                   const Stream& stream,
                                                   std::shared_ptr<GpuWeights> weights = nullptr,
                                                   std::vector<ShardPlace> shards = {},
                                                   std::shared_ptr<CudnnHandle> cudnn = nullptr);

  ~GpuPlan();
  GpuPlan(const GpuPlan&) = delete;
  GpuPlan& operator=(const GpuPlan&) = delete;

  // Batches a plan holds launched and not finished at once.
  static constexpr int kSlots = 2;

  // Stages `inputs` (following graph.inputs with the planned shapes and dtypes) into a free
  // slot and queues the batch (see the top of this file) with its compute on `compute`, a
  // stream of the plan's device (current), normally the same for every batch (a batch's
  // compute waits for the other slot's in any case). Returns the slot, for Finish.
  // `on_done`, when given, is called once on a CUDA thread when the batch's work has ended
  // (its outputs are in the slot's staging buffer); it must not call CUDA and should return
  // at once: it holds up the plan's later copies out. INVALID_ARGUMENT for an input of
  // another shape or dtype; FAILED_PRECONDITION when every slot holds a batch not finished
  // yet. On an error nothing is left queued, no slot is taken and `on_done` is never called.
  // `rows` >= 0: a batch of fewer rows than planned (a batching model's plan for a batch
  // bucket, backends/onnx/batch_buckets.h). Every input then has `rows` in its first
  // dimension, at most the planned one, and the planned shape otherwise; the plan's other
  // rows repeat the batch's last row, and Finish gives back the outputs' first `rows` rows
  // (the other rows raise no error flag that a row of the batch would not). Only for
  // graphs whose every input and output is batch-major (no row reads another).
  StatusOr<int> Launch(const std::vector<const Tensor*>& inputs, const Stream& compute,
                       std::function<void()> on_done = nullptr, int64_t rows = -1);
  // Waits for the batch launched into `slot`, replaces `outputs` with host tensors
  // following graph.outputs, and frees the slot (on an error too). Slots may be finished in
  // any order; each waits only for its own batch. INVALID_ARGUMENT (naming the node) when
  // the batch raised a Gather index or a RoiAlign batch index out of range, or an integer
  // Mod by zero; FAILED_PRECONDITION for a slot that holds no launched batch.
  Status Finish(int slot, std::vector<Tensor>* outputs);
  // Slots free for a Launch: kSlots less the batches launched and not finished.
  int free_slots() const;

  // One batch, synchronously: Launch with compute on `stream`, then Finish. As Launch, it
  // needs a free slot.
  Status Run(const std::vector<const Tensor*>& inputs, const Stream& stream,
             std::vector<Tensor>* outputs);

  // Where one batch's device time goes, in ms, from its slot's CUDA events: its input
  // copy (copy-in stream), its compute (the arena's copies in and out, every step), its
  // output copy (from the end of the compute to the end of the copy out).
  struct PhaseMs {
    double copy_in = 0, compute = 0, copy_out = 0;
  };
  // Runs as Run does (the same outputs, as a CUDA graph when Run would be) and returns the
  // batch's phases: a benchmark's breakdown of how much of a batch's copies could hide
  // behind another batch's compute.
  StatusOr<PhaseMs> RunTimingPhases(const std::vector<const Tensor*>& inputs, const Stream& stream,
                                    std::vector<Tensor>* outputs);

  const GpuLowering& lowering() const { return lowering_; }
  // One line per cuDNN convolution of a shape of its own, as its algorithm was chosen:
  // "node 'conv1' (Conv): algorithm 1 (0.112 ms, the fastest of 6 run)", or "...: algorithm
  // 1 (chosen by cuDNN's heuristics)". For the log, and the benchmark.
  std::vector<std::string> DescribeConvs() const;
  // Whether the plan replays CUDA graphs: from its second batch on, unless the lowering
  // asked for none or a capture failed (then it runs step by step for good). Each slot
  // captures its own graph at its first batch after the plan's first.
  bool graph_captured() const;
  // Why a capture failed (the capture's, the instantiation's or a step's error), or OK.
  const Status& graph_failure() const { return graph_failure_; }
  // The compute time (compute_began -> computed) of the last finished batch, in ms: its
  // share of the device's busy time. The copies are left out, since they overlap other
  // batches' compute and would be counted twice.
  double last_device_ms() const { return last_device_ms_; }
  // Device memory the plan holds besides the shared weights: arena, workspace, flags and
  // each slot's input and output buffers. A tensor-parallel plan's shard buffers count here
  // too, on whichever device they are.
  int64_t device_bytes() const {
    size_t bytes = arena_.size_bytes() + workspace_.size_bytes() + error_flag_.size_bytes();
    for (const Slot& slot : slots_) bytes += slot.in.size_bytes() + slot.out.size_bytes();
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
  // Step i, a kConv, as `conv` runs it with `workspace` (its node named in an error).
  Status RunConv(size_t i, const CudnnConv& conv, void* workspace, cudaStream_t stream) const;
  // One batch in flight: its host and device buffers, its graph and the events that order
  // and time its work. The staging buffer holds each input at staged_inputs_, each output
  // at staged_outputs_ and the error flags at staged_flag_; `in` mirrors its inputs'
  // part, `out` its outputs' and flags' part (from staged_out_begin_ on).
  struct Slot {
    PinnedBuffer staging;
    DeviceBuffer in, out;
    cudaGraphExec_t graph = nullptr;  // the compute of this slot, once captured
    // started and in_ready around the copy in; compute_began and computed around the
    // compute; copied_out after the copy out; done after on_done too (what Finish waits for).
    cudaEvent_t started = nullptr, in_ready = nullptr, compute_began = nullptr, computed = nullptr,
                copied_out = nullptr, done = nullptr;
    std::function<void()> on_done;  // kept alive until its stream callback has run
    // What the stream callback reads: its own allocation, so that a callback the device never
    // ran can be abandoned, and leaked, rather than freed under it (WaitForCallback).
    struct Callback {
      // Whether on_done's stream callback is queued and has not returned. After a device
      // fault CUDA's synchronisation returns at once, while the callback may still be about
      // to run: Finish, a failed Launch and the destructor wait for this as well.
      Mutex mu;
      CondVar cv;
      bool pending GUARDED_BY(mu) = false;
      // Given up on: a late callback calls no on_done (its batch has been answered).
      bool abandoned GUARDED_BY(mu) = false;
      std::function<void()> on_done GUARDED_BY(mu);
    };
    std::unique_ptr<Callback> callback = std::make_unique<Callback>();
    bool busy = false;               // launched and not finished
    int64_t rows = -1;               // Launch's `rows`: the outputs' first dimension, or -1
    cudaStream_t compute = nullptr;  // the compute stream it was launched on
    Status error;                    // an error found after the batch was launched
  };
  // The stream callback queued after a slot's copy out: calls its on_done. A stream
  // callback (unlike a host function) runs even after a device error, with the error in
  // `status`, so the caller is always woken.
  static void CUDART_CB OnDone(cudaStream_t stream, cudaError_t status, void* slot);
  // Waits until `slot`'s stream callback, if one was queued, has returned: true, or false
  // after a minute without it (a device that never runs it is broken past saving). Then the
  // callback's state is abandoned (a late callback calls nothing) and leaked, since the
  // callback may still come and read it, and the slot must stay busy.
  static bool WaitForCallback(Slot& slot);
  // A slot's compute, queued step by step on `stream`: the flags cleared, the inputs from
  // `in` into the arena, every step, the outputs and flags into `out`.
  Status QueueCompute(const Slot& slot, cudaStream_t stream);
  // The same as the slot's CUDA graph, captured at its first use.
  Status QueueComputeAsGraph(Slot& slot, cudaStream_t stream);
  // Launch's queueing into `slot`, up to its on_done (not `done`); on an error, what was
  // queued may still be running, and on_done was not queued.
  Status QueueSlot(Slot& slot, cudaStream_t compute, bool graph);
  // Waits for everything queued on the plan's streams, `compute` and the shards'.
  void WaitForAll(cudaStream_t compute);
  // INVALID_ARGUMENT unless `inputs` are the planned ones (count, dtype, shape; with
  // `rows` >= 0, that many rows in the first dimension, at most the planned ones).
  Status CheckInputs(const std::vector<const Tensor*>& inputs, int64_t rows) const;

  GpuLowering lowering_;
  std::shared_ptr<GpuWeights> weights_;
  std::vector<const void*> blobs_;      // per blob of the lowering, its device copy
  std::vector<std::string> blob_keys_;  // and its key, released with the plan
  std::vector<int> blob_shards_;        // and its shard (-1: the plan's weights)
  int device_ = 0;                      // the plan's device
  std::vector<Shard> shards_;           // a tensor-parallel plan's shards
  cudaEvent_t forked_ = nullptr;        // recorded on the compute stream at each kFork
  DeviceBuffer arena_, workspace_, error_flag_;
  std::vector<size_t> staged_inputs_, staged_outputs_;  // offsets in each slot's staging
  size_t staged_flag_ = 0;
  size_t staged_out_begin_ = 0;  // where the outputs' part starts; the inputs' ends
  size_t staged_bytes_ = 0;      // the whole staging buffer
  // Per step; null where no GEMM. Steps of one shape and options share one (a recurrent
  // operator's step-by-step products).
  std::vector<std::shared_ptr<LtGemm>> gemms_;
  // kConv steps: the plan's cuDNN handle, and per step (null for the others) its convolution,
  // shared by the steps of one shape and options.
  std::shared_ptr<CudnnHandle> cudnn_;
  std::vector<std::shared_ptr<CudnnConv>> convs_;
  std::optional<Stream> copy_in_, copy_out_;  // the plan's copy streams
  std::array<Slot, kSlots> slots_;
  double last_device_ms_ = 0;
  int64_t runs_ = 0;           // graphs are captured from the second batch on, after a warm one
  bool graph_failed_ = false;  // a capture failed once: the plan runs step by step
  Status graph_failure_;       // why
};

}  // namespace shoal::engine::cuda
