// KIND_GPU instances of the onnx backend: the model's plans lowered onto a CUDA device
// (engine/cuda/gpu_plan.h), built only with SHOAL_CUDA (docs/gpu.md).
//
// An instance owns a CUDA stream and a cuBLASLt handle on its GPU, one device copy of the
// model's constants (engine::cuda::GpuWeights), and a cache of GPU plans keyed by the
// input shapes (the least recently used evicted past kMaxGpuPlans, or past the model's
// batch buckets and two more), each prepared by the CPU engine for those shapes and then
// lowered; every plan reads the one copy of the weights, so a new batch size costs an
// arena and its GEMMs' planning, not the weights. A batching model's batch runs on the
// plan of its batch bucket (batch_buckets.h; config `gpu_batch_buckets`), so a
// work-conserving batcher's every size from 1 to max_batch_size needs only a few plans.
// CreateInstance lowers the plan for the inputs' smallest shapes (symbolic dimensions 1) at once,
// so a model the GPU path cannot run fails its load, naming every node it lacks, instead of its
// first request; a batching model whose inputs have no other symbolic dimension gets every
// bucket's plan then too, so no batch waits for a plan's creation. Inputs and outputs stay host
// tensors, copied through each plan's pinned staging buffers.
//
// The instance pipelines (pipeline_depth() 2; backend.h's Launch and Finish): Launch stages
// a batch into a free slot of its plan and queues its input copy, its compute on the
// instance's stream and its output copy, and returns; Finish waits for the oldest launched
// batch and copies its outputs out. So while one batch computes, the next one's inputs copy
// in and the last one's outputs copy out (GpuPlan, double buffered). Batches compute one
// after another on the instance's stream, in launch order. Execute launches its batch and
// waits for that batch alone: a batch launched before it stays launched, its outputs kept
// in its slot for its own Finish. A plan holding a launched batch is never evicted from the
// cache. The device time in device_stats() is the batches' compute, not their copies
// (which overlap other batches' compute).
//
// `gpu_cpu_tail: true`: a model the GPU path cannot run whole is cut before the first node
// it refuses (engine::cuda::SplitForGpu); the instance runs the part before on the GPU as
// above and the rest on the CPU engine in Finish (or Execute), after the GPU part. With
// batch buckets, only when every output of the GPU part is batch-major (else a plan per
// batch size, so no row is trimmed from a value that is not one row per request).
//
// The config parameter `gpu_precision` picks how the products (GEMMs, convolutions) run:
// `fp32` (the default), `tf32` (tensor cores, 10-bit mantissas), or `fp16` / `bf16` (mixed
// precision: weights stored in 16 bits, each product's input rounded to 16 bits, fp32
// accumulation and output; every other operator stays fp32), or `int8` (the products int8
// can take quantised, engine/cuda/quantize.h, the rest fp32). A reduced tier is measured at
// load against the CPU engine's fp32 on the calibration inputs (GpuAccuracyCheck) and
// refused beyond the config's bounds, as the CPU tiers are. A request whose `precision`
// parameter names another tier is INVALID_ARGUMENT.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/device_memory.h"
#include "core/status.h"
#include "engine/model.h"
#include "engine/precision.h"

namespace shoal::backends {

inline constexpr size_t kMaxGpuPlans = 8;

// How a 16-bit GPU tier is judged when an instance loads: it runs `batches` (calibration
// inputs) on the GPU and on the CPU engine in fp32, and `judge` gets the comparison
// (refusing the tier, or logging its figures). No batches: no check.
struct GpuAccuracyCheck {
  std::vector<std::vector<NamedTensor>> batches;
  std::function<Status(const engine::TierAccuracy&)> judge;
  // gpu_precision int8: the ranges (engine::Calibrate on the fp32 model, over `batches`)
  // its products' inputs are quantised with; required for int8, unused by the others.
  std::shared_ptr<const engine::Calibration> int8_ranges;
};

// True when this shoal was built with the CUDA path.
bool GpuInstancesBuilt();

// What the GPU instances of one model share: one device copy of its weights per GPU, so
// `count: N` instances on a GPU hold the weights once. Made with the model, outlives its
// instances; thread-safe (instances are created on their own threads).
class GpuModelState;
std::shared_ptr<GpuModelState> NewGpuModelState();

// An instance of `model` on GPU info.gpu, created on the instance's thread (which it
// makes current on that device). `parameters` are the model config's, `max_batch_size`
// its (0: the model does not batch, and batches are never padded); `shared`, the
// model's GpuModelState (null: the instance's weights are its own). INVALID_ARGUMENT
// for a bad `gpu_precision` or `gpu_batch_buckets` or a GPU that does not exist,
// UNAVAILABLE when there is no
// usable CUDA device, FAILED_PRECONDITION when shoal was built without CUDA (or `check`
// refused the tier), UNIMPLEMENTED when the GPU path cannot run the model (and
// `gpu_cpu_tail` is not set). `cpu` is how a CPU tail's Session runs (the model's
// threads, the group's cores), as a CPU instance's would.
StatusOr<std::unique_ptr<BackendInstance>> CreateGpuInstance(
    const engine::Model& model, const InstanceInfo& info,
    const std::map<std::string, std::string>& parameters, int64_t max_batch_size = 0,
    const GpuAccuracyCheck& check = {}, GpuModelState* shared = nullptr,
    const engine::SessionOptions& cpu = {});

// What the GPU path makes of `model` at batch `batch` (its first symbolic dimension; the
// others 1), for `shoal inspect --gpu`: whether it lowers whole (its steps, convolutions on
// cuDNN or im2col, weight and arena bytes), or the nodes it lacks and where gpu_cpu_tail
// would cut. Host work only: no device needed. FAILED_PRECONDITION in a build without the
// CUDA path; the model's own errors (a plan that cannot be prepared) otherwise.
StatusOr<std::string> DescribeGpuPath(const engine::Model& model, int64_t batch = 1);

// How CUDA shared-memory regions are opened in this build (the server's SharedMemoryManager
// takes it): CUDA IPC handles (engine/cuda/ipc_memory.h) with the CUDA path, none without.
DeviceMemoryOpener CudaIpcOpener();

}  // namespace shoal::backends
