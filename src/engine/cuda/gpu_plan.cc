#include "engine/cuda/gpu_plan.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/data_type.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/normalization.h"
#include "engine/internal/op_util.h"
#include "engine/memory_planner.h"

namespace shoal::engine::cuda {

using engine::internal::Product;

StatusOr<const void*> GpuWeights::Get(const GpuLowering::Blob& blob, const Stream& stream) {
  MutexLock lock(&mu_);
  auto it = buffers_.find(blob.key);
  if (it == buffers_.end()) {
    Entry entry;
    ASSIGN_OR_RETURN(entry.buffer, DeviceBuffer::Allocate(blob.data.byte_size()));
    if (blob.data.byte_size() > 0) {
      // Complete before anyone gets the pointer: the next to ask may be another
      // instance, whose stream does not wait for this one.
      RETURN_IF_ERROR(
          CopyToDevice(entry.buffer.data(), blob.data.data(), blob.data.byte_size(), stream));
      RETURN_IF_ERROR(stream.Synchronize());
    }
    bytes_ += static_cast<int64_t>(blob.data.byte_size());
    it = buffers_.emplace(blob.key, std::move(entry)).first;
  } else if (it->second.buffer.size_bytes() != blob.data.byte_size()) {
    return Internal("weights key '" + blob.key + "' names " +
                    std::to_string(it->second.buffer.size_bytes()) + " bytes, not " +
                    std::to_string(blob.data.byte_size()));
  }
  ++it->second.users;
  return static_cast<const void*>(it->second.buffer.data());
}

void GpuWeights::Release(const std::string& key) {
  MutexLock lock(&mu_);
  auto it = buffers_.find(key);
  if (it == buffers_.end() || --it->second.users > 0) return;
  bytes_ -= static_cast<int64_t>(it->second.buffer.size_bytes());
  buffers_.erase(it);
}

namespace {

// The kernels' name for a mixed-precision operand's dtype (kFp16 or kBf16).
HalfType HalfOf(DataType dtype) {
  return dtype == DataType::kFp16 ? HalfType::kFp16 : HalfType::kBf16;
}

}  // namespace

void* GpuPlan::Address(int v) const {
  const GpuValue& value = lowering_.values[v];
  if (value.home == GpuValue::Home::kWeights) return const_cast<char*>(Blob(value.offset));
  if (value.home == GpuValue::Home::kShard)
    return shards_[static_cast<size_t>(value.shard)].arena.as<char>() + value.offset;
  return arena_.as<char>() + value.offset;
}

StatusOr<std::unique_ptr<GpuPlan>> GpuPlan::Create(GpuLowering lowering, const LtHandle& handle,
                                                   const Stream& stream,
                                                   std::shared_ptr<GpuWeights> weights,
                                                   std::vector<ShardPlace> shards) {
  std::unique_ptr<GpuPlan> plan(new GpuPlan());
  plan->lowering_ = std::move(lowering);
  plan->weights_ = weights ? std::move(weights) : std::make_shared<GpuWeights>();
  const GpuLowering& l = plan->lowering_;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&plan->device_), "cudaGetDevice"));
  if (l.shards > 1) {
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&plan->forked_, cudaEventDisableTiming),
                               "cudaEventCreate"));
    plan->shards_.resize(static_cast<size_t>(l.shards));
  }
  for (size_t s = 0; s < plan->shards_.size(); ++s) {
    Shard& shard = plan->shards_[s];
    const ShardPlace place = s < shards.size() ? shards[s] : ShardPlace{};
    shard.device = place.device < 0 ? plan->device_ : place.device;
    const bool here = shard.device == plan->device_;
    shard.weights = place.weights ? place.weights
                    : here        ? plan->weights_
                                  : std::make_shared<GpuWeights>();
    const std::string where =
        "tensor-parallel shard " + std::to_string(s) + " on GPU " + std::to_string(shard.device);
    // A shard on another device reads and writes only its own memory: its product's input
    // and columns are copied (lowered with own_memory).
    const bool own = s < l.shard_own_memory.size() && l.shard_own_memory[s];
    if (!here && !own) {
      return InvalidArgument(where + ": lowered to share the plan's memory on GPU " +
                             std::to_string(plan->device_) +
                             "; a shard on another GPU needs TensorParallelOptions::own_memory");
    }
    DeviceScope scope(shard.device);
    RETURN_IF_ERROR(scope.status().WithPrefix(where));
    if (!here) {
      ASSIGN_OR_RETURN(shard.handle, LtHandle::Create());
      // Direct copies between the devices where the hardware has them; without, CUDA
      // stages them through the host.
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, shard.device, plan->device_) == cudaSuccess && can) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(plan->device_, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
          return CudaStatus(e, "cudaDeviceEnablePeerAccess").WithPrefix(where);
        (void)cudaGetLastError();
      }
    }
    ASSIGN_OR_RETURN(Stream stream, Stream::Create());
    shard.stream.emplace(std::move(stream));
    const int64_t arena = s < l.shard_arena_bytes.size() ? l.shard_arena_bytes[s] : 0;
    ASSIGN_OR_RETURN(shard.arena, DeviceBuffer::Allocate(static_cast<size_t>(arena)));
    ASSIGN_OR_RETURN(shard.workspace, DeviceBuffer::Allocate(l.workspace_bytes));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&shard.joined, cudaEventDisableTiming),
                               "cudaEventCreate"));
  }
  ASSIGN_OR_RETURN(plan->arena_, DeviceBuffer::Allocate(l.arena_bytes));
  ASSIGN_OR_RETURN(plan->workspace_, DeviceBuffer::Allocate(l.workspace_bytes));
  const size_t flags = std::max<size_t>(l.flag_nodes.size(), 1);
  ASSIGN_OR_RETURN(plan->error_flag_, DeviceBuffer::Allocate(flags * sizeof(int32_t)));
  // The staging buffer: every input, every output and the flag, each 64-byte aligned.
  size_t staged = 0;
  auto place = [&](int64_t bytes) {
    const size_t at = staged;
    staged += static_cast<size_t>(ArenaAlignedBytes(bytes));
    return at;
  };
  auto bytes_of = [&](int v) {
    return Product(l.shapes[v]) * static_cast<int64_t>(DataTypeSize(l.dtypes[v]));
  };
  for (int v : l.inputs) plan->staged_inputs_.push_back(place(bytes_of(v)));
  for (int v : l.outputs) plan->staged_outputs_.push_back(place(bytes_of(v)));
  plan->staged_flag_ = place(static_cast<int64_t>(flags * sizeof(int32_t)));
  ASSIGN_OR_RETURN(plan->staging_, PinnedBuffer::Allocate(staged));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&plan->started_), "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&plan->finished_), "cudaEventCreate"));
  for (const GpuLowering::Blob& blob : l.blobs) {
    const void* device = nullptr;
    if (blob.shard >= 0 && static_cast<size_t>(blob.shard) < plan->shards_.size()) {
      // Uploaded on its shard's device and stream.
      Shard& shard = plan->shards_[static_cast<size_t>(blob.shard)];
      DeviceScope scope(shard.device);
      RETURN_IF_ERROR(scope.status());
      ASSIGN_OR_RETURN(device, shard.weights->Get(blob, *shard.stream));
      plan->blob_shards_.push_back(blob.shard);
    } else {
      ASSIGN_OR_RETURN(device, plan->weights_->Get(blob, stream));
      plan->blob_shards_.push_back(-1);
    }
    plan->blobs_.push_back(device);
    plan->blob_keys_.push_back(blob.key);
  }
  plan->gemms_.resize(l.steps.size());
  for (size_t i = 0; i < l.steps.size(); ++i) {
    const GpuStep& step = l.steps[i];
    if (step.kind != GpuStep::Kind::kGemm) continue;
    if (step.shard >= 0) {
      // Planned on its shard's device, with that device's handle.
      const Shard& shard = plan->shards_.at(static_cast<size_t>(step.shard));
      DeviceScope scope(shard.device);
      RETURN_IF_ERROR(scope.status());
      ASSIGN_OR_RETURN(plan->gemms_[i],
                       LtGemm::Create(shard.handle ? *shard.handle : handle, step.gemm));
    } else {
      ASSIGN_OR_RETURN(plan->gemms_[i], LtGemm::Create(handle, step.gemm));
    }
  }
  // The host blobs may go once their copies have run.
  RETURN_IF_ERROR(stream.Synchronize());
  for (const Shard& shard : plan->shards_) RETURN_IF_ERROR(shard.stream->Synchronize());
  plan->lowering_.blobs.clear();
  return plan;
}

GpuPlan::~GpuPlan() {
  for (size_t b = 0; b < blob_keys_.size(); ++b) {
    const int s = blob_shards_[b];
    (s >= 0 ? shards_[static_cast<size_t>(s)].weights : weights_)->Release(blob_keys_[b]);
  }
  for (Shard& shard : shards_)
    if (shard.joined != nullptr) cudaEventDestroy(shard.joined);
  if (forked_ != nullptr) cudaEventDestroy(forked_);
  if (graph_ != nullptr) cudaGraphExecDestroy(graph_);
  if (copied_in_ != nullptr) cudaEventDestroy(copied_in_);
  if (computed_ != nullptr) cudaEventDestroy(computed_);
  if (started_ != nullptr) cudaEventDestroy(started_);
  if (finished_ != nullptr) cudaEventDestroy(finished_);
}

Status GpuPlan::Queue(cudaStream_t stream) {
  const GpuLowering& l = lowering_;
  auto copy = [&](void* to, const void* from, int64_t bytes, cudaMemcpyKind kind) {
    return CudaStatus(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), kind, stream),
                      "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
  };
  RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(error_flag_.data(), 0, error_flag_.size_bytes(), stream), "cudaMemsetAsync"));
  for (size_t i = 0; i < l.inputs.size(); ++i) {
    const int v = l.inputs[i];
    if (l.values[v].home != GpuValue::Home::kArena || l.values[v].bytes == 0) continue;
    RETURN_IF_ERROR(copy(Address(v), staging_.data() + staged_inputs_[i], l.values[v].bytes,
                         cudaMemcpyHostToDevice));
  }
  if (copied_in_ != nullptr)
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(copied_in_, stream), "cudaEventRecord"));
  for (size_t i = 0; i < l.steps.size(); ++i) {
    RETURN_IF_ERROR(l.steps[i].shard >= 0 ? RunShardStep(i, stream) : RunStep(i, stream));
  }
  if (computed_ != nullptr)
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(computed_, stream), "cudaEventRecord"));
  for (size_t o = 0; o < l.outputs.size(); ++o) {
    const int v = l.outputs[o];
    if (l.values[v].home == GpuValue::Home::kNone || l.values[v].bytes == 0) continue;
    RETURN_IF_ERROR(copy(staging_.data() + staged_outputs_[o], Address(v), l.values[v].bytes,
                         cudaMemcpyDeviceToHost));
  }
  return copy(staging_.data() + staged_flag_, error_flag_.data(),
              static_cast<int64_t>(error_flag_.size_bytes()), cudaMemcpyDeviceToHost);
}

Status GpuPlan::QueueAsGraph(cudaStream_t stream) {
  if (graph_ == nullptr) {
    // Capture: the copies and launches are recorded, not run, and become the graph
    // replayed below.
    RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                               "cudaStreamBeginCapture"));
    Status queued = Queue(stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (queued.ok()) queued = CudaStatus(ended, "cudaStreamEndCapture");
    if (queued.ok()) {
      queued = CudaStatus(cudaGraphInstantiate(&graph_, graph, 0), "cudaGraphInstantiate");
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!queued.ok()) {
      // Nothing ran while capturing: run this once step by step, and every run after.
      graph_ = nullptr;
      graph_failed_ = true;
      (void)cudaGetLastError();
      return Queue(stream);
    }
  }
  return CudaStatus(cudaGraphLaunch(graph_, stream), "cudaGraphLaunch");
}

Status GpuPlan::RunShardStep(size_t i, cudaStream_t stream) {
  const GpuStep& s = lowering_.steps[i];
  switch (s.kind) {
    case GpuStep::Kind::kFork:
      // Recorded on the plan's stream, waited for on each shard's (each with its device
      // current: a stream's calls are made on its own device).
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(forked_, stream), "cudaEventRecord"));
      for (const Shard& shard : shards_) {
        DeviceScope scope(shard.device);
        RETURN_IF_ERROR(scope.status());
        RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(shard.stream->get(), forked_, 0),
                                   "cudaStreamWaitEvent"));
      }
      return Status::Ok();
    case GpuStep::Kind::kJoin:
      for (const Shard& shard : shards_) {
        DeviceScope scope(shard.device);
        RETURN_IF_ERROR(scope.status());
        RETURN_IF_ERROR(
            CudaStatus(cudaEventRecord(shard.joined, shard.stream->get()), "cudaEventRecord"));
      }
      for (const Shard& shard : shards_) {
        RETURN_IF_ERROR(
            CudaStatus(cudaStreamWaitEvent(stream, shard.joined, 0), "cudaStreamWaitEvent"));
      }
      return Status::Ok();
    default:
      break;
  }
  const Shard& shard = shards_.at(static_cast<size_t>(s.shard));
  DeviceScope scope(shard.device);
  RETURN_IF_ERROR(scope.status());
  return RunStep(i, shard.stream->get());
}

Status GpuPlan::RunStep(size_t i, cudaStream_t stream) {
  const GpuStep& s = lowering_.steps[i];
  if (s.kind == GpuStep::Kind::kFork || s.kind == GpuStep::Kind::kJoin) {
    return RunShardStep(i, stream);
  }
  auto in = [&](size_t k) { return static_cast<const float*>(Address(s.in[k])); };
  float* y = static_cast<float*>(Address(s.out));
  switch (s.kind) {
    case GpuStep::Kind::kGemm: {
      const void* bias = s.weight_slots[1] >= 0 ? Blob(s.weight_slots[1]) : nullptr;
      // A constant weight is in its (transformed) blob; a computed B is a value.
      const void* b = s.weight_slots[0] >= 0 ? Blob(s.weight_slots[0]) : Address(s.in[1]);
      // Shards' products run concurrently: each has its own workspace.
      void* workspace =
          s.shard >= 0 ? shards_[static_cast<size_t>(s.shard)].workspace.data() : workspace_.data();
      RETURN_IF_ERROR(gemms_[i]->Run(in(0), b, bias, y, workspace, stream));
      const int64_t n = Product(lowering_.shapes[s.out]);
      if (s.post) RETURN_IF_ERROR(Unary(*s.post, y, y, n, stream, s.alpha, s.beta));
      if (s.in[3] >= 0) RETURN_IF_ERROR(Binary(BinaryOp::kAdd, y, in(3), y, s.residual, stream));
      return Status::Ok();
    }
    case GpuStep::Kind::kUnary:
      return Unary(s.unary, in(0), y, Product(lowering_.shapes[s.out]), stream, s.alpha, s.beta);
    case GpuStep::Kind::kBinary: {
      const float* b =
          s.in[1] >= 0 ? in(1) : reinterpret_cast<const float*>(Blob(s.weight_slots[0]));
      return Binary(s.binary, in(0), b, y, s.broadcast, stream);
    }
    case GpuStep::Kind::kSoftmax:
      return SoftmaxLastAxis(in(0), y, s.dims, stream);
    case GpuStep::Kind::kLayerNorm: {
      const float* scale =
          s.in[1] >= 0 ? in(1) : reinterpret_cast<const float*>(Blob(s.weight_slots[0]));
      return LayerNormLastAxis(in(0), scale, s.in[2] >= 0 ? in(2) : nullptr, y, s.dims, s.epsilon,
                               stream);
    }
    case GpuStep::Kind::kTranspose:
      return Transpose(in(0), y, s.transpose, stream);
    case GpuStep::Kind::kGather:
      return Gather(in(0), static_cast<const int64_t*>(Address(s.in[1])), y, s.gather,
                    error_flag_.as<int32_t>() + s.flag, stream);
    case GpuStep::Kind::kSlice:
      return SliceAxis(in(0), y, s.dims, s.axis, s.start, s.length, stream);
    case GpuStep::Kind::kReduce:
      return ReduceAxes(s.reduce, in(0), y, s.dims, s.axis, s.length, stream);
    case GpuStep::Kind::kIm2Col:
      if (lowering_.dtypes[s.out] != DataType::kFp32)
        return Im2ColHalf(HalfOf(lowering_.dtypes[s.out]), in(0), Address(s.out), s.window, stream);
      return Im2Col(in(0), y, s.window, stream);
    case GpuStep::Kind::kPool:
      return Pool2d(s.pool, in(0), y, s.window, stream);
    case GpuStep::Kind::kPlace: {
      Shape x_dims = lowering_.shapes[s.in[0]];
      if (s.words > 1) x_dims.push_back(s.words);  // an 8-byte element's two words
      return PlaceAxis(in(0), y, x_dims, s.dims, s.axis, s.start, stream);
    }
    case GpuStep::Kind::kPad:
      return Pad(in(0), y, s.pad, s.alpha, stream);
    case GpuStep::Kind::kStridedSlice:
      return Slice(in(0), y, s.slice, stream);
    case GpuStep::Kind::kCast:
      return CastToFloat(s.cast, Address(s.in[0]), y, Product(lowering_.shapes[s.out]), stream);
    case GpuStep::Kind::kCompare:
      return Compare(s.compare, s.int64_operands, Address(s.in[0]), Address(s.in[1]),
                     static_cast<uint8_t*>(Address(s.out)), s.broadcast, stream);
    case GpuStep::Kind::kWhere:
      return Where(static_cast<const uint8_t*>(Address(s.in[0])), in(1), in(2), y, s.where, stream);
    case GpuStep::Kind::kConvTranspose:
      return ConvTranspose2d(in(0), in(1), s.in[2] >= 0 ? in(2) : nullptr, y, s.window, s.length,
                             stream);
    case GpuStep::Kind::kResize:
      return Resize(in(0), y, reinterpret_cast<const int64_t*>(Blob(s.weight_slots[0])),
                    reinterpret_cast<const float*>(Blob(s.weight_slots[1])), s.resize, s.alpha,
                    stream);
    case GpuStep::Kind::kMod:
      return Mod(s.int64_operands, s.fmod, Address(s.in[0]), Address(s.in[1]), Address(s.out),
                 s.broadcast, error_flag_.as<int32_t>() + s.flag, stream);
    case GpuStep::Kind::kArgExtreme:
      return ArgExtreme(s.arg_max, s.select_last, in(0), static_cast<int64_t*>(Address(s.out)),
                        s.dims, s.axis, stream);
    case GpuStep::Kind::kToHalf:
      return CastFloatToHalf(HalfOf(lowering_.dtypes[s.out]), in(0), Address(s.out),
                             Product(lowering_.shapes[s.out]), stream);
    case GpuStep::Kind::kRoiAlign:
      return RoiAlign(in(0), in(1), static_cast<const int64_t*>(Address(s.in[2])), y, s.roi,
                      error_flag_.as<int32_t>() + s.flag, stream);
    case GpuStep::Kind::kGridSample:
      return GridSample(in(0), in(1), y, s.grid, stream);
    case GpuStep::Kind::kFloatToInt:
      return CastFloatToInt(lowering_.dtypes[s.out] == DataType::kInt64, in(0), Address(s.out),
                            Product(lowering_.shapes[s.out]), stream);
    case GpuStep::Kind::kCopy: {
      // Between a shard's device and the plan's (or within one device, where a shard with
      // memory of its own shares the plan's device). Unified addressing finds both devices
      // from the pointers; unlike cudaMemcpyPeerAsync, this is captured into a CUDA graph.
      const auto bytes = static_cast<size_t>(lowering_.values[s.in[0]].bytes);
      return CudaStatus(
          cudaMemcpyAsync(Address(s.out), Address(s.in[0]), bytes, cudaMemcpyDefault, stream),
          "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes between devices");
    }
    case GpuStep::Kind::kFork:
    case GpuStep::Kind::kJoin:
      break;  // RunShardStep's
  }
  return Internal("unknown GPU step kind");
}

Status GpuPlan::CheckInputs(const std::vector<const Tensor*>& inputs) const {
  const GpuLowering& l = lowering_;
  if (inputs.size() != l.inputs.size())
    return InvalidArgument("expected " + std::to_string(l.inputs.size()) + " inputs, got " +
                           std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int v = l.inputs[i];
    if (!inputs[i] || inputs[i]->dtype() != l.dtypes[v] || inputs[i]->shape() != l.shapes[v])
      return InvalidArgument("input " + std::to_string(i) + " does not have the planned dtype " +
                             std::string(DataTypeName(l.dtypes[v])) + " and shape " +
                             ShapeToString(l.shapes[v]));
  }
  return Status::Ok();
}

Status GpuPlan::Run(const std::vector<const Tensor*>& inputs, const Stream& stream,
                    std::vector<Tensor>* outputs) {
  RETURN_IF_ERROR(CheckInputs(inputs));
  const GpuLowering& l = lowering_;
  // The first run goes step by step (cuBLASLt and the kernels do their first-use set-up
  // outside any capture); the second captures the graph, which later runs replay.
  const bool graph = l.cuda_graph && !graph_failed_ && runs_++ > 0;
  return RunQueued(inputs, stream, outputs, graph);
}

StatusOr<GpuPlan::PhaseMs> GpuPlan::RunTimingPhases(const std::vector<const Tensor*>& inputs,
                                                    const Stream& stream,
                                                    std::vector<Tensor>* outputs) {
  if (copied_in_ == nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&copied_in_), "cudaEventCreate"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&computed_), "cudaEventCreate"));
  }
  // Step by step: the events are recorded between the phases.
  RETURN_IF_ERROR(CheckInputs(inputs));
  Status ran = RunQueued(inputs, stream, outputs, /*graph=*/false);
  PhaseMs phases;
  float a = 0, b = 0, c = 0;
  if (ran.ok()) {
    ran = CudaStatus(cudaEventElapsedTime(&a, started_, copied_in_), "cudaEventElapsedTime");
    if (ran.ok())
      ran = CudaStatus(cudaEventElapsedTime(&b, copied_in_, computed_), "cudaEventElapsedTime");
    if (ran.ok())
      ran = CudaStatus(cudaEventElapsedTime(&c, computed_, finished_), "cudaEventElapsedTime");
  }
  // Later runs (and captures) record nothing between the phases.
  cudaEventDestroy(copied_in_);
  cudaEventDestroy(computed_);
  copied_in_ = computed_ = nullptr;
  RETURN_IF_ERROR(ran);
  phases.copy_in = a;
  phases.compute = b;
  phases.copy_out = c;
  return phases;
}

Status GpuPlan::RunQueued(const std::vector<const Tensor*>& inputs, const Stream& stream,
                          std::vector<Tensor>* outputs, bool graph) {
  const GpuLowering& l = lowering_;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]->byte_size() > 0)
      std::memcpy(staging_.data() + staged_inputs_[i], inputs[i]->data(), inputs[i]->byte_size());
  }
  Status queued = CudaStatus(cudaEventRecord(started_, stream.get()), "cudaEventRecord");
  if (queued.ok()) queued = graph ? QueueAsGraph(stream.get()) : Queue(stream.get());
  if (queued.ok()) queued = CudaStatus(cudaEventRecord(finished_, stream.get()), "cudaEventRecord");
  // Wait even after an error: what was queued may still read the staging buffer and the
  // arena, which the next run writes.
  Status waited = stream.Synchronize();
  // The join made the plan's stream wait for every shard, unless an error came first.
  for (const Shard& shard : shards_) {
    DeviceScope scope(shard.device);
    if (const Status s = shard.stream->Synchronize(); waited.ok()) waited = s;
  }
  RETURN_IF_ERROR(queued);
  RETURN_IF_ERROR(waited);
  float ms = 0;
  last_device_ms_ = cudaEventElapsedTime(&ms, started_, finished_) == cudaSuccess ? ms : 0;
  outputs->clear();
  for (size_t o = 0; o < l.outputs.size(); ++o) {
    const int v = l.outputs[o];
    outputs->push_back(Tensor::Allocate(l.dtypes[v], l.shapes[v]));
    Tensor& t = outputs->back();
    // Queue copied every output, in the arena or a constant blob, into the staging buffer.
    if (t.byte_size() > 0 && l.values[v].home != GpuValue::Home::kNone)
      std::memcpy(t.mutable_data(), staging_.data() + staged_outputs_[o], t.byte_size());
  }
  // Each flagging step's own slot: the first raised names its node.
  for (size_t slot = 0; slot < l.flag_nodes.size(); ++slot) {
    int32_t flag = 0;
    std::memcpy(&flag, staging_.data() + staged_flag_ + slot * sizeof(int32_t), sizeof(flag));
    if (flag == 0) continue;
    const std::string& node = l.flag_nodes[slot];
    if (flag & 1) return InvalidArgument(node + ": an index was out of range");
    if (flag & 2) return InvalidArgument(node + ": an integer division by zero");
    if (flag & 4) return InvalidArgument(node + ": a batch index was out of range");
    return Internal(node + ": its kernel raised error flag " + std::to_string(flag));
  }
  return Status::Ok();
}

}  // namespace shoal::engine::cuda
