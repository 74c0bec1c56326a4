#include "engine/cuda/gpu_plan.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "core/data_type.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/normalization.h"
#include "engine/cuda/quantize.h"
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

// The most scratch one cuDNN convolution may take: its heuristics' best algorithm within
// it. Winograd and FFT algorithms want the most; implicit GEMM needs none.
constexpr size_t kCudnnWorkspaceLimit = size_t{256} << 20;

// A measured algorithm search times this many runs of each candidate back to back, after
// its first run (which checks that it runs) and one more that keeps the device busy while
// they are queued, so that the time is the device's and not the host's launches.
constexpr int kSearchRuns = 3;

// The device time of one of `runs` runs of `run` queued back to back on `stream` behind one
// untimed run, in ms: the time between two events around them, over `runs`.
StatusOr<double> TimeOfOneRun(int runs, cudaStream_t stream, const std::function<Status()>& run) {
  struct Events {
    cudaEvent_t begin = nullptr, end = nullptr;
    ~Events() {
      if (begin != nullptr) cudaEventDestroy(begin);
      if (end != nullptr) cudaEventDestroy(end);
    }
  } e;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e.begin), "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e.end), "cudaEventCreate"));
  RETURN_IF_ERROR(run());
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(e.begin, stream), "cudaEventRecord"));
  for (int r = 0; r < runs; ++r) RETURN_IF_ERROR(run());
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(e.end, stream), "cudaEventRecord"));
  RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(e.end), "cudaEventSynchronize"));
  float ms = 0;
  RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, e.begin, e.end), "cudaEventElapsedTime"));
  return static_cast<double>(ms) / runs;
}

}  // namespace

std::vector<std::string> GpuPlan::DescribeConvs() const {
  std::vector<std::string> lines;
  std::vector<const CudnnConv*> said;
  for (const auto& conv : convs_) {
    if (!conv || std::find(said.begin(), said.end(), conv.get()) != said.end()) continue;
    said.push_back(conv.get());
    std::string line = conv->options().what + ": algorithm " + std::to_string(conv->algorithm());
    if (conv->measured() > 0) {
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%.3f", conv->measured_ms());
      line += std::string(" (") + ms + " ms, the fastest of " + std::to_string(conv->measured()) +
              " run)";
    } else {
      line += " (chosen by cuDNN's heuristics)";
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

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
                                                   std::vector<ShardPlace> shards,
                                                   std::shared_ptr<CudnnHandle> cudnn) {
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
  const size_t flags = std::max<size_t>(l.flag_nodes.size(), 1);
  ASSIGN_OR_RETURN(plan->error_flag_, DeviceBuffer::Allocate(flags * sizeof(int32_t)));
  // Each slot's staging buffer: every input, every output and the flags, each 64-byte
  // aligned; its device buffers mirror the inputs' part and the rest.
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
  plan->staged_out_begin_ = staged;
  for (int v : l.outputs) plan->staged_outputs_.push_back(place(bytes_of(v)));
  plan->staged_flag_ = place(static_cast<int64_t>(flags * sizeof(int32_t)));
  plan->staged_bytes_ = staged;
  ASSIGN_OR_RETURN(Stream copy_in, Stream::Create());
  plan->copy_in_.emplace(std::move(copy_in));
  ASSIGN_OR_RETURN(Stream copy_out, Stream::Create());
  plan->copy_out_.emplace(std::move(copy_out));
  for (Slot& slot : plan->slots_) {
    ASSIGN_OR_RETURN(slot.staging, PinnedBuffer::Allocate(staged));
    ASSIGN_OR_RETURN(slot.in, DeviceBuffer::Allocate(plan->staged_out_begin_));
    ASSIGN_OR_RETURN(slot.out, DeviceBuffer::Allocate(staged - plan->staged_out_begin_));
    for (cudaEvent_t* timed :
         {&slot.started, &slot.in_ready, &slot.compute_began, &slot.computed, &slot.copied_out}) {
      RETURN_IF_ERROR(CudaStatus(cudaEventCreate(timed), "cudaEventCreate"));
    }
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming),
                               "cudaEventCreate"));
  }
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
  // cuDNN's convolutions, planned once the arena and the weights are on the device (a fused
  // convolution's candidates are tried there) and before the workspace they share with the
  // GEMMs (steps on the plan's stream run one at a time).
  size_t workspace_bytes = static_cast<size_t>(l.workspace_bytes);
  plan->convs_.resize(l.steps.size());
  std::map<std::string, std::shared_ptr<CudnnConv>> shared_convs;
  for (size_t i = 0; i < l.steps.size(); ++i) {
    const GpuStep& step = l.steps[i];
    if (step.kind != GpuStep::Kind::kConv) continue;
    if (!plan->cudnn_) plan->cudnn_ = cudnn;
    if (!plan->cudnn_) {
      auto handle = CudnnHandle::Create();
      if (!handle.ok()) return handle.status().WithPrefix("planning the convolutions on cuDNN");
      plan->cudnn_ = std::move(handle).value();
    }
    const CudnnConvOptions& c = step.conv;
    const Window2d& g = c.window;
    std::string key;
    for (int64_t v : {g.n,
                      g.c,
                      g.h,
                      g.w,
                      g.kh,
                      g.kw,
                      g.sh,
                      g.sw,
                      g.dh,
                      g.dw,
                      g.ph,
                      g.pw,
                      g.oh,
                      g.ow,
                      g.groups,
                      c.m,
                      static_cast<int64_t>(c.math),
                      static_cast<int64_t>(c.fused_bias_relu),
                      static_cast<int64_t>(c.residual),
                      static_cast<int64_t>(c.transposed),
                      static_cast<int64_t>(c.channels_last)})
      key += std::to_string(v) + ",";
    auto& shared = shared_convs[key];
    if (!shared) {
      // Candidates run on this step's own buffers (their bytes are whatever the arena holds;
      // the first batch overwrites them), each with scratch of its own. A fused
      // convolution's are run because cuDNN ranks algorithms for the plain convolution and
      // the fused call may refuse one; with a measured search, every candidate is run and
      // timed.
      const bool measure = c.search == CudnnAlgorithmSearch::kMeasured;
      CudnnTrial trial;
      if (c.fused_bias_relu || measure) {
        trial = [&](const CudnnConv& conv) -> StatusOr<double> {
          ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::Allocate(conv.workspace_bytes()));
          Status ran = plan->RunConv(i, conv, scratch.data(), stream.get());
          if (ran.ok()) ran = stream.Synchronize();
          if (!ran.ok() && ran.code() != StatusCode::kUnimplemented &&
              ran.code() != StatusCode::kResourceExhausted) {
            // An algorithm that fails to run (cuDNN's BAD_PARAM or EXECUTION_FAILED, say) is
            // passed over like one cuDNN refuses, unless the failure broke the device's
            // context (a sticky error: every later call fails too).
            // The failed launch's own error is cleared first; a sticky one stays.
            (void)cudaGetLastError();
            if (cudaStreamSynchronize(stream.get()) != cudaSuccess ||
                cudaGetLastError() != cudaSuccess)
              return ran;
            return Unimplemented("failed when run: " + ran.message());
          }
          RETURN_IF_ERROR(ran);
          if (!measure) return 0.0;
          return TimeOfOneRun(kSearchRuns, stream.get(),
                              [&] { return plan->RunConv(i, conv, scratch.data(), stream.get()); });
        };
      }
      auto conv = CudnnConv::Create(*plan->cudnn_, c, kCudnnWorkspaceLimit, trial);
      if (!conv.ok()) return conv.status().WithPrefix(c.what);
      shared = std::move(conv).value();
      workspace_bytes = std::max(workspace_bytes, shared->workspace_bytes());
    }
    plan->convs_[i] = shared;
  }
  ASSIGN_OR_RETURN(plan->workspace_, DeviceBuffer::Allocate(workspace_bytes));
  plan->gemms_.resize(l.steps.size());
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int, int, size_t, float, bool, int64_t,
                      int64_t, int64_t, int64_t>,
           std::shared_ptr<LtGemm>>
      shared_gemms;
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
      // One LtGemm for the steps of one shape and options (cuBLASLt's heuristic runs once).
      const GemmOptions& g = step.gemm;
      const auto key =
          std::make_tuple(g.m, g.n, g.k, g.transpose_w, static_cast<int>(g.epilogue),
                          static_cast<int>(g.math), g.workspace_bytes, g.alpha, g.fp32_output,
                          g.batch, g.x_batch_stride, g.w_batch_stride, g.y_batch_stride);
      auto& shared = shared_gemms[key];
      if (!shared) {
        ASSIGN_OR_RETURN(std::unique_ptr<LtGemm> created, LtGemm::Create(handle, g));
        shared = std::move(created);
      }
      plan->gemms_[i] = shared;
    }
  }
  // The host blobs may go once their copies have run.
  RETURN_IF_ERROR(stream.Synchronize());
  for (const Shard& shard : plan->shards_) RETURN_IF_ERROR(shard.stream->Synchronize());
  plan->lowering_.blobs.clear();
  return plan;
}

GpuPlan::~GpuPlan() {
  // Freed on the plan's device, whichever is current on this thread.
  DeviceScope scope(device_);
  // A batch still launched reads the slot's buffers and may yet call its on_done.
  for (Slot& slot : slots_) {
    if (!slot.busy) continue;
    (void)cudaEventSynchronize(slot.done);
    (void)WaitForCallback(slot);
  }
  for (size_t b = 0; b < blob_keys_.size(); ++b) {
    const int s = blob_shards_[b];
    (s >= 0 ? shards_[static_cast<size_t>(s)].weights : weights_)->Release(blob_keys_[b]);
  }
  for (Shard& shard : shards_)
    if (shard.joined != nullptr) cudaEventDestroy(shard.joined);
  if (forked_ != nullptr) cudaEventDestroy(forked_);
  for (Slot& slot : slots_) {
    if (slot.graph != nullptr) cudaGraphExecDestroy(slot.graph);
    for (cudaEvent_t e : {slot.started, slot.in_ready, slot.compute_began, slot.computed,
                          slot.copied_out, slot.done}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
}

Status GpuPlan::QueueCompute(const Slot& slot, cudaStream_t stream) {
  const GpuLowering& l = lowering_;
  auto copy = [&](void* to, const void* from, int64_t bytes) {
    return CudaStatus(
        cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
  };
  // Where a staging offset of the outputs' part lies in the slot's output buffer.
  auto out = [&](size_t staged) { return slot.out.as<char>() + (staged - staged_out_begin_); };
  RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(error_flag_.data(), 0, error_flag_.size_bytes(), stream), "cudaMemsetAsync"));
  for (size_t i = 0; i < l.inputs.size(); ++i) {
    const int v = l.inputs[i];
    if (l.values[v].home != GpuValue::Home::kArena || l.values[v].bytes == 0) continue;
    RETURN_IF_ERROR(copy(Address(v), slot.in.as<char>() + staged_inputs_[i], l.values[v].bytes));
  }
  for (size_t i = 0; i < l.steps.size(); ++i) {
    RETURN_IF_ERROR(l.steps[i].shard >= 0 ? RunShardStep(i, stream) : RunStep(i, stream));
  }
  // Every output, in the arena or a constant blob.
  for (size_t o = 0; o < l.outputs.size(); ++o) {
    const int v = l.outputs[o];
    if (l.values[v].home == GpuValue::Home::kNone || l.values[v].bytes == 0) continue;
    RETURN_IF_ERROR(copy(out(staged_outputs_[o]), Address(v), l.values[v].bytes));
  }
  return copy(out(staged_flag_), error_flag_.data(),
              static_cast<int64_t>(error_flag_.size_bytes()));
}

Status GpuPlan::QueueComputeAsGraph(Slot& slot, cudaStream_t stream) {
  if (slot.graph == nullptr) {
    // Capture: the copies and launches are recorded, not run, and become the graph
    // replayed below. The graph holds this slot's buffers' addresses: one per slot.
    RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                               "cudaStreamBeginCapture"));
    // The capture is ended whatever happens, an exception too: a stream left capturing
    // would fail every later batch.
    Status queued;
    try {
      queued = QueueCompute(slot, stream);
    } catch (...) {
      cudaGraph_t abandoned = nullptr;
      (void)cudaStreamEndCapture(stream, &abandoned);
      if (abandoned != nullptr) cudaGraphDestroy(abandoned);
      throw;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (queued.ok()) queued = CudaStatus(ended, "cudaStreamEndCapture");
    if (queued.ok()) {
      queued = CudaStatus(cudaGraphInstantiate(&slot.graph, graph, 0), "cudaGraphInstantiate");
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!queued.ok()) {
      // Nothing ran while capturing: run this step by step. Where that works, the capture
      // was at fault, and every batch after runs step by step too (graph_failure() says why,
      // for the instance's log); a step that fails either way is the batch's error alone,
      // and the next batch captures again.
      slot.graph = nullptr;
      (void)cudaGetLastError();
      Status direct = QueueCompute(slot, stream);
      if (direct.ok()) {
        graph_failed_ = true;
        graph_failure_ = std::move(queued);
      }
      return direct;
    }
  }
  return CudaStatus(cudaGraphLaunch(slot.graph, stream), "cudaGraphLaunch");
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

Status GpuPlan::RunConv(size_t i, const CudnnConv& conv, void* workspace,
                        cudaStream_t stream) const {
  const GpuStep& s = lowering_.steps[i];
  const float* bias =
      s.weight_slots[1] >= 0 ? reinterpret_cast<const float*>(Blob(s.weight_slots[1])) : nullptr;
  return conv
      .Run(*cudnn_, Address(s.in[0]), Blob(s.weight_slots[0]), bias,
           s.in[1] >= 0 ? Address(s.in[1]) : nullptr, Address(s.out), workspace, stream)
      .WithPrefix(s.conv.what);
}

Status GpuPlan::RunStep(size_t i, cudaStream_t stream) {
  const GpuStep& s = lowering_.steps[i];
  if (s.kind == GpuStep::Kind::kFork || s.kind == GpuStep::Kind::kJoin) {
    return RunShardStep(i, stream);
  }
  auto in = [&](size_t k) { return static_cast<const float*>(Address(s.in[k])); };
  float* y = s.out >= 0 ? static_cast<float*>(Address(s.out)) : nullptr;
  // The rounding a step also writes (GpuStep::half_out), or none: 16-bit, or an int8 copy.
  void* half = nullptr;
  RoundTo half_type = HalfType::kFp16;
  if (s.half_out >= 0) {
    const DataType dtype = lowering_.dtypes[s.half_out];
    if (dtype == DataType::kInt8) {
      half_type = RoundTo::Int8(s.int8_inv_scale, s.int8_zero_point);
    } else if (dtype == DataType::kFp16 || dtype == DataType::kBf16) {
      half_type = HalfOf(dtype);
    } else {
      return Internal("step " + std::to_string(i) + ": its rounding is neither 16-bit nor int8");
    }
    half = Address(s.half_out);
  }
  auto Elements = [&](int v) { return Product(lowering_.shapes[v]); };
  // GatherElements and ScatterElements: the indices' positions mapped onto data (s.dims).
  auto ElementsIndexOf = [&](const GpuStep& step) {
    internal::ElementsIndex index;
    const Shape& is = lowering_.shapes[step.in[1]];
    index.rank = static_cast<int>(is.size());
    index.axis = static_cast<int>(step.axis);
    index.axis_dim = step.dims[static_cast<size_t>(step.axis)];
    int64_t stride = 1;
    for (int d = index.rank - 1; d >= 0; --d) {
      index.idx_dims[d] = is[static_cast<size_t>(d)];
      index.data_strides[d] = stride;
      stride *= step.dims[static_cast<size_t>(d)];
    }
    return index;
  };
  switch (s.kind) {
    case GpuStep::Kind::kGemm: {
      const void* bias = s.weight_slots[1] >= 0 ? Blob(s.weight_slots[1]) : nullptr;
      // A constant weight is in its (transformed) blob; a computed B is a value.
      const void* b = s.weight_slots[0] >= 0 ? Blob(s.weight_slots[0]) : Address(s.in[1]);
      // Shards' products run concurrently: each has its own workspace.
      void* workspace =
          s.shard >= 0 ? shards_[static_cast<size_t>(s.shard)].workspace.data() : workspace_.data();
      // The rounding, if any, is of the activation's result, or an int8 product's copy (the
      // lowering gives a product with a residual none).
      if (half && s.gemm.math != GemmMath::kInt8 && (!s.post || s.in[3] >= 0))
        return Internal("step " + std::to_string(i) + ": a product rounds only its activation");
      if (half && s.in[3] >= 0)
        return Internal("step " + std::to_string(i) + ": a product with a residual rounds nothing");
      if (half && s.gemm.math == GemmMath::kInt8 && half_type.half)
        return Internal("step " + std::to_string(i) + ": an int8 product rounds to int8 only");
      if (s.gemm.math == GemmMath::kInt8) {
        // An int8 convolution's sums, which its epilogue step scales.
        if (s.out >= 0 && lowering_.dtypes[s.out] == DataType::kInt32)
          return gemms_[i]->Run(Address(s.in[0]), b, nullptr, Address(s.out), workspace, stream);
        // int32 sums into the scratch, then scaled back with the bias and any ReLU.
        if (s.scratch < 0 || s.weight_slots.size() < 3 || s.weight_slots[2] < 0)
          return Internal("step " + std::to_string(i) + ": an int8 product needs its sums' " +
                          "scratch and its scales");
        if ((s.out < 0 && !half) || (s.out < 0 && (s.post || s.in[3] >= 0)))
          return Internal("step " + std::to_string(i) + ": an int8 product with no output");
        auto* sums = static_cast<int32_t*>(Address(s.scratch));
        RETURN_IF_ERROR(gemms_[i]->Run(Address(s.in[0]), b, nullptr, sums, workspace, stream));
        // Its int8 copy, in this pass unless an activation follows (which then writes it).
        Int8Output q;
        if (half && !s.post) {
          q.values = static_cast<int8_t*>(half);
          q.inv_scale = half_type.inv_scale;
          q.zero_point = half_type.zero_point;
        }
        RETURN_IF_ERROR(DequantizeInt8(sums,
                                       reinterpret_cast<const float*>(Blob(s.weight_slots[2])),
                                       static_cast<const float*>(bias), y, s.gemm.batch * s.gemm.m,
                                       s.gemm.n, s.int8_relu, stream, q));
      } else {
        RETURN_IF_ERROR(gemms_[i]->Run(in(0), b, bias, y, workspace, stream));
      }
      if (s.post)
        RETURN_IF_ERROR(Unary(*s.post, y, y, Product(lowering_.shapes[s.out]), stream, s.alpha,
                              s.beta, half, half_type));
      if (s.in[3] >= 0) RETURN_IF_ERROR(Binary(BinaryOp::kAdd, y, in(3), y, s.residual, stream));
      return Status::Ok();
    }
    case GpuStep::Kind::kUnary:
      // With out -1 (16 bits alone), the element count is the rounding's.
      return Unary(s.unary, in(0), y, Product(lowering_.shapes[s.out >= 0 ? s.out : s.half_out]),
                   stream, s.alpha, s.beta, half, half_type);
    case GpuStep::Kind::kBinary: {
      const float* b =
          s.in[1] >= 0 ? in(1) : reinterpret_cast<const float*>(Blob(s.weight_slots[0]));
      return Binary(s.binary, in(0), b, y, s.broadcast, stream, half, half_type);
    }
    case GpuStep::Kind::kSoftmax:
      return SoftmaxLastAxis(in(0), y, s.dims, stream, s.log_softmax, half, half_type);
    case GpuStep::Kind::kLayerNorm: {
      const float* scale =
          s.in[1] >= 0 ? in(1) : reinterpret_cast<const float*>(Blob(s.weight_slots[0]));
      return LayerNormLastAxis(in(0), scale, s.in[2] >= 0 ? in(2) : nullptr, y, s.dims, s.epsilon,
                               stream, half, half_type);
    }
    case GpuStep::Kind::kTranspose:
      return Transpose(in(0), y, s.transpose, stream, half, half_type);
    case GpuStep::Kind::kGather:
      return Gather(in(0), static_cast<const int64_t*>(Address(s.in[1])), y, s.gather,
                    error_flag_.as<int32_t>() + s.flag, stream);
    case GpuStep::Kind::kSlice:
      return SliceAxis(in(0), y, s.dims, s.axis, s.start, s.length, stream);
    case GpuStep::Kind::kReduce:
      return ReduceAxes(s.reduce, in(0), y, s.dims, s.axis, s.length, stream, half, half_type);
    case GpuStep::Kind::kIm2Col:
      if (lowering_.dtypes[s.out] == DataType::kInt8 &&
          lowering_.dtypes[s.in[0]] == DataType::kInt8) {
        // From the int8 copy its writer made (GpuStep::half_out).
        return Im2ColFromInt8(static_cast<const int8_t*>(Address(s.in[0])),
                              static_cast<int8_t*>(Address(s.out)), s.window, s.zero_point, stream);
      }
      if (lowering_.dtypes[s.out] == DataType::kInt8)
        return Im2ColInt8(in(0), static_cast<int8_t*>(Address(s.out)), s.window, s.alpha,
                          s.zero_point, stream);
      if (lowering_.dtypes[s.out] != DataType::kFp32)
        return Im2ColHalf(HalfOf(lowering_.dtypes[s.out]), in(0), Address(s.out), s.window, stream);
      return Im2Col(in(0), y, s.window, stream);
    case GpuStep::Kind::kPool: {
      const DataType dtype = lowering_.dtypes[s.out];
      if (dtype == DataType::kFp32) return Pool2d(s.pool, in(0), y, s.window, stream);
      // A max pool between 16-bit convolutions (Lowerer::FuseRoundingsIntoEpilogues).
      if ((dtype != DataType::kFp16 && dtype != DataType::kBf16) || s.pool != PoolOp::kMax ||
          lowering_.dtypes[s.in[0]] != dtype)
        return Internal("step " + std::to_string(i) + ": a 16-bit pool must be a max pool of " +
                        "its own type");
      return MaxPool2dHalf(HalfOf(dtype), Address(s.in[0]), Address(s.out), s.window, stream,
                           s.channels_last);
    }
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
    case GpuStep::Kind::kLogical:
      return Logical(s.logical, static_cast<const uint8_t*>(Address(s.in[0])),
                     s.in.size() > 1 ? static_cast<const uint8_t*>(Address(s.in[1])) : nullptr,
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
    case GpuStep::Kind::kTopK: {
      const bool indices = lowering_.dtypes[s.out] == DataType::kInt64;
      return TopK(in(0), indices ? nullptr : y,
                  indices ? static_cast<int64_t*>(Address(s.out)) : nullptr, s.dims, s.axis,
                  s.length, s.arg_max, stream);
    }
    case GpuStep::Kind::kArgExtreme:
      return ArgExtreme(s.arg_max, s.select_last, in(0), static_cast<int64_t*>(Address(s.out)),
                        s.dims, s.axis, stream);
    case GpuStep::Kind::kToHalf: {
      // Channels last: x [n, c, h, w] into NHWC.
      const Shape& shape = lowering_.shapes[s.out];
      if (s.channels_last && shape.size() != 4)
        return Internal("step " + std::to_string(i) + ": channels last needs a rank of 4");
      return CastFloatToHalf(HalfOf(lowering_.dtypes[s.out]), in(0), Address(s.out), Product(shape),
                             stream, s.channels_last ? shape[1] : 0,
                             s.channels_last ? shape[2] * shape[3] : 0);
    }
    case GpuStep::Kind::kQuantize:
      return QuantizeInt8(in(0), static_cast<int8_t*>(Address(s.out)), Elements(s.out), s.alpha,
                          s.zero_point, stream);
    case GpuStep::Kind::kRoiAlign:
      return RoiAlign(in(0), in(1), static_cast<const int64_t*>(Address(s.in[2])), y, s.roi,
                      error_flag_.as<int32_t>() + s.flag, stream);
    case GpuStep::Kind::kGridSample:
      return GridSample(in(0), in(1), y, s.grid, stream);
    case GpuStep::Kind::kConv:
      return RunConv(i, *convs_[i], workspace_.data(), stream);
    case GpuStep::Kind::kConvEpilogue: {
      if (s.in[1] >= 0 && (lowering_.dtypes[s.in[1]] == DataType::kFp32
                               ? s.conv_epilogue.residual.has_value()
                               : !s.conv_epilogue.residual || HalfOf(lowering_.dtypes[s.in[1]]) !=
                                                                  *s.conv_epilogue.residual))
        return Internal("step " + std::to_string(i) + ": its residual's type is not its own");
      if (s.conv_epilogue.int32_sums != (lowering_.dtypes[s.in[0]] == DataType::kInt32))
        return Internal("step " + std::to_string(i) + ": its input's type is not its own");
      auto slot = [&](size_t k) {
        return k < s.weight_slots.size() && s.weight_slots[k] >= 0
                   ? reinterpret_cast<const float*>(Blob(s.weight_slots[k]))
                   : nullptr;
      };
      return ConvEpilogue(s.conv_epilogue, Address(s.in[0]), slot(0),
                          s.in[1] >= 0 ? Address(s.in[1]) : nullptr, y, stream, half, half_type,
                          slot(1));
    }
    case GpuStep::Kind::kIntCast:
      return CastIntegral(lowering_.dtypes[s.in[0]], lowering_.dtypes[s.out], Address(s.in[0]),
                          Address(s.out), Product(lowering_.shapes[s.out]), stream);
    case GpuStep::Kind::kFloatToInt:
      return CastFloatToInt(lowering_.dtypes[s.out] == DataType::kInt64, in(0), Address(s.out),
                            Product(lowering_.shapes[s.out]), stream);
    case GpuStep::Kind::kGatherElements:
      return CudaStatus(
          internal::LaunchGatherElements(
              DataTypeSize(lowering_.dtypes[s.in[0]]) == 8, Address(s.in[0]),
              static_cast<const int64_t*>(Address(s.in[1])), Address(s.out), ElementsIndexOf(s),
              Elements(s.in[1]), error_flag_.as<int32_t>() + s.flag, stream),
          "GatherElements kernel launch");
    case GpuStep::Kind::kGatherNd:
      return CudaStatus(
          internal::LaunchGatherNd(DataTypeSize(lowering_.dtypes[s.in[0]]) == 8, Address(s.in[0]),
                                   static_cast<const int64_t*>(Address(s.in[1])), Address(s.out),
                                   s.gather_nd, Elements(s.out), error_flag_.as<int32_t>() + s.flag,
                                   stream),
          "GatherND kernel launch");
    case GpuStep::Kind::kScatterElements:
    case GpuStep::Kind::kScatterNd: {
      // The output starts as the data (unless it is the data's own bytes).
      if (Address(s.out) != Address(s.in[0])) {
        const auto bytes = static_cast<size_t>(lowering_.values[s.out].bytes);
        RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(Address(s.out), Address(s.in[0]), bytes,
                                                   cudaMemcpyDeviceToDevice, stream),
                                   "cudaMemcpyAsync of a scatter's data"));
      }
      static_assert(static_cast<int>(internal::ScatterKernel::kMin) ==
                    static_cast<int>(ScatterReduction::kMin));
      const auto op = static_cast<internal::ScatterKernel>(s.scatter);
      const auto* indices = static_cast<const int64_t*>(Address(s.in[1]));
      auto* last = s.scratch >= 0 ? static_cast<int32_t*>(Address(s.scratch)) : nullptr;
      int32_t* flag = error_flag_.as<int32_t>() + s.flag;
      if (s.kind == GpuStep::Kind::kScatterElements) {
        return CudaStatus(
            internal::LaunchScatterElementsF32(op, indices, in(2), y, last, Elements(s.out),
                                               ElementsIndexOf(s), Elements(s.in[1]), flag, stream),
            "ScatterElements kernel launch");
      }
      const Shape& is = lowering_.shapes[s.in[1]];
      internal::ScatterNdIndex index;
      index.k = static_cast<int>(is.back());
      for (int d = 0; d < index.k; ++d) index.dims[d] = s.dims[static_cast<size_t>(d)];
      index.tuples = Product(is, 0, is.size() - 1);
      index.slice = Product(s.dims, static_cast<size_t>(index.k));
      return CudaStatus(internal::LaunchScatterNdF32(op, indices, in(2), y, last, Elements(s.out),
                                                     index, flag, stream),
                        "ScatterND kernel launch");
    }
    case GpuStep::Kind::kCumSum:
      return CudaStatus(
          internal::LaunchCumSum(lowering_.dtypes[s.in[0]] == DataType::kInt64, Address(s.in[0]),
                                 Address(s.out), s.dims[0], s.dims[1], s.dims[2], s.exclusive,
                                 s.reverse, stream),
          "CumSum kernel launch");
    case GpuStep::Kind::kTrilu:
      return CudaStatus(internal::LaunchTrilu(DataTypeSize(lowering_.dtypes[s.in[0]]) == 8,
                                              Address(s.in[0]), Address(s.out), s.dims[0],
                                              s.dims[1], s.dims[2], s.start, s.upper, stream),
                        "Trilu kernel launch");
    case GpuStep::Kind::kRnnStateIn:
      return RnnStateIn(s.in[0] >= 0 ? in(0) : nullptr, y, s.rnn, stream);
    case GpuStep::Kind::kRnnStateOut:
      return RnnStateOut(in(0), y, s.rnn, stream);
    case GpuStep::Kind::kGruReset:
      return GruReset(s.rnn, static_cast<float*>(Address(s.in[0])), in(1), in(2),
                      s.in[3] >= 0 ? static_cast<const int32_t*>(Address(s.in[3])) : nullptr, y,
                      stream);
    case GpuStep::Kind::kRnnCell: {
      auto optional = [&](size_t k) { return s.in[k] >= 0 ? in(k) : nullptr; };
      auto blob = [&](size_t k) {
        return s.weight_slots[k] >= 0 ? reinterpret_cast<const float*>(Blob(s.weight_slots[k]))
                                      : nullptr;
      };
      return RnnCell(s.rnn, in(0), in(1), s.length, optional(2), blob(0), blob(1),
                     s.in[5] >= 0 ? static_cast<const int32_t*>(Address(s.in[5])) : nullptr,
                     static_cast<float*>(Address(s.in[3])),
                     s.in[4] >= 0 ? static_cast<float*>(Address(s.in[4])) : nullptr,
                     s.out >= 0 ? y : nullptr, error_flag_.as<int32_t>() + s.flag, stream);
    }
    case GpuStep::Kind::kZero:
      return CudaStatus(cudaMemsetAsync(Address(s.out), 0,
                                        static_cast<size_t>(lowering_.values[s.out].bytes), stream),
                        "cudaMemsetAsync");
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

Status GpuPlan::CheckInputs(const std::vector<const Tensor*>& inputs, int64_t rows) const {
  const GpuLowering& l = lowering_;
  if (inputs.size() != l.inputs.size())
    return InvalidArgument("expected " + std::to_string(l.inputs.size()) + " inputs, got " +
                           std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int v = l.inputs[i];
    Shape want = l.shapes[v];
    if (rows >= 0) {
      if (want.empty() || rows > want[0]) {
        return InvalidArgument("input " + std::to_string(i) + " of planned shape " +
                               ShapeToString(want) + " cannot take a batch of " +
                               std::to_string(rows) + " rows");
      }
      want[0] = rows;
    }
    if (!inputs[i] || inputs[i]->dtype() != l.dtypes[v] || inputs[i]->shape() != want)
      return InvalidArgument("input " + std::to_string(i) + " does not have the planned dtype " +
                             std::string(DataTypeName(l.dtypes[v])) + " and shape " +
                             ShapeToString(want));
  }
  return Status::Ok();
}

int GpuPlan::free_slots() const {
  int free = 0;
  for (const Slot& slot : slots_) free += slot.busy ? 0 : 1;
  return free;
}

bool GpuPlan::graph_captured() const {
  if (graph_failed_) return false;
  for (const Slot& slot : slots_)
    if (slot.graph != nullptr) return true;
  return false;
}

void CUDART_CB GpuPlan::OnDone(cudaStream_t, cudaError_t, void* c) {
  Slot::Callback& callback = *static_cast<Slot::Callback*>(c);
  MutexLock lock(&callback.mu);
  // A wake-up (the pool's lock only, never this one); nothing may unwind into CUDA's thread.
  if (!callback.abandoned) {
    try {
      callback.on_done();
    } catch (...) {
    }
  }
  callback.pending = false;
  callback.cv.Signal();
}

bool GpuPlan::WaitForCallback(Slot& slot) {
  if (!slot.callback) return false;  // abandoned before
  Slot::Callback& callback = *slot.callback;
  {
    MutexLock lock(&callback.mu);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (callback.pending) {
      if (callback.cv.WaitUntil(&callback.mu, deadline) == std::cv_status::timeout) break;
    }
    if (!callback.pending) return true;
    callback.abandoned = true;
  }
  // The device may still run the callback, which reads this state: it is never freed.
  (void)slot.callback.release();
  return false;
}

Status GpuPlan::QueueSlot(Slot& slot, cudaStream_t compute, bool graph) {
  auto record = [](cudaEvent_t event, cudaStream_t stream) {
    return CudaStatus(cudaEventRecord(event, stream), "cudaEventRecord");
  };
  auto wait = [](cudaStream_t stream, cudaEvent_t event) {
    return CudaStatus(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
  };
  const cudaStream_t in = copy_in_->get(), out = copy_out_->get();
  RETURN_IF_ERROR(record(slot.started, in));
  if (staged_out_begin_ > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(slot.in.data(), slot.staging.data(),
                                               staged_out_begin_, cudaMemcpyHostToDevice, in),
                               "cudaMemcpyAsync of the inputs"));
  }
  RETURN_IF_ERROR(record(slot.in_ready, in));
  RETURN_IF_ERROR(wait(compute, slot.in_ready));
  // The arena is the plan's, not the slot's: after the other batch's compute, even if the
  // caller queued that on another stream.
  for (const Slot& other : slots_)
    if (&other != &slot && other.busy) RETURN_IF_ERROR(wait(compute, other.computed));
  RETURN_IF_ERROR(record(slot.compute_began, compute));
  RETURN_IF_ERROR(graph ? QueueComputeAsGraph(slot, compute) : QueueCompute(slot, compute));
  RETURN_IF_ERROR(record(slot.computed, compute));
  RETURN_IF_ERROR(wait(out, slot.computed));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(slot.staging.data() + staged_out_begin_, slot.out.data(),
                                 staged_bytes_ - staged_out_begin_, cudaMemcpyDeviceToHost, out),
                 "cudaMemcpyAsync of the outputs"));
  RETURN_IF_ERROR(record(slot.copied_out, out));
  if (slot.on_done) {
    if (!slot.callback) return Internal("a slot whose callback was abandoned was launched");
    Slot::Callback* callback = slot.callback.get();
    {
      MutexLock lock(&callback->mu);
      callback->pending = true;
      callback->on_done = slot.on_done;
    }
    const Status added = CudaStatus(cudaStreamAddCallback(out, &GpuPlan::OnDone, callback, 0),
                                    "cudaStreamAddCallback");
    if (!added.ok()) {
      MutexLock lock(&callback->mu);
      callback->pending = false;
      callback->on_done = nullptr;
    }
    RETURN_IF_ERROR(added);
  }
  return Status::Ok();
}

void GpuPlan::WaitForAll(cudaStream_t compute) {
  (void)cudaStreamSynchronize(compute);
  (void)copy_in_->Synchronize();
  (void)copy_out_->Synchronize();
  // The join made the compute stream wait for every shard, unless an error came first.
  for (const Shard& shard : shards_) {
    DeviceScope scope(shard.device);
    (void)shard.stream->Synchronize();
  }
}

StatusOr<int> GpuPlan::Launch(const std::vector<const Tensor*>& inputs, const Stream& compute,
                              std::function<void()> on_done, int64_t rows) {
  RETURN_IF_ERROR(CheckInputs(inputs, rows));
  int s = 0;
  while (s < kSlots && slots_[s].busy) ++s;
  if (s == kSlots) {
    return FailedPrecondition("the GPU plan's " + std::to_string(kSlots) +
                              " slots hold batches launched and not finished; finish one first");
  }
  Slot& slot = slots_[s];
  for (size_t i = 0; i < inputs.size(); ++i) {
    char* staged = slot.staging.data() + staged_inputs_[i];
    const size_t given = inputs[i]->byte_size();
    if (given > 0) std::memcpy(staged, inputs[i]->data(), given);
    // The planned rows past the batch's repeat its last row: they compute what a row of
    // the batch computes, so they raise no error flag a real row would not.
    const size_t planned = static_cast<size_t>(lowering_.values[lowering_.inputs[i]].bytes);
    if (rows >= 0 && planned > given) {
      const size_t row = rows > 0 ? given / static_cast<size_t>(rows) : 0;
      if (row == 0) {
        std::memset(staged + given, 0, planned - given);
      } else {
        for (size_t at = given; at + row <= planned; at += row)
          std::memcpy(staged + at, staged + given - row, row);
      }
    }
  }
  slot.rows = rows;
  // The first batch goes step by step (cuBLASLt and the kernels do their first-use set-up
  // outside any capture); each slot captures its graph at its first batch after that.
  const bool graph = lowering_.cuda_graph && !graph_failed_ && runs_++ > 0;
  slot.on_done = std::move(on_done);
  slot.error = Status::Ok();
  slot.compute = compute.get();
  Status queued;
  try {
    queued = QueueSlot(slot, compute.get(), graph);
  } catch (...) {
    // As for an error, below: nothing queued may still read the slot once it is free.
    WaitForAll(compute.get());
    slot.on_done = nullptr;
    throw;
  }
  if (!queued.ok()) {
    // What was queued reads the slot's buffers, which its next batch writes; on_done was
    // not queued (it comes last).
    WaitForAll(compute.get());
    slot.on_done = nullptr;
    // The inputs were checked above: a step that cannot be queued is the plan's fault, not
    // the request's, and must not read as a bad request (which the runtime answers by
    // retrying the batch's requests apart).
    if (queued.code() == StatusCode::kInvalidArgument)
      return Internal("a GPU plan step could not be queued: " + queued.message());
    return queued;
  }
  slot.busy = true;  // launched: from here on on_done will be called
  // Finish waits for `done`, which follows on_done too.
  if (Status recorded = CudaStatus(cudaEventRecord(slot.done, copy_out_->get()), "cudaEventRecord");
      !recorded.ok()) {
    WaitForAll(compute.get());
    slot.error = std::move(recorded);
  }
  return s;
}

Status GpuPlan::Finish(int s, std::vector<Tensor>* outputs) {
  if (s < 0 || s >= kSlots || !slots_[static_cast<size_t>(s)].busy) {
    return FailedPrecondition("slot " + std::to_string(s) +
                              " of the GPU plan holds no launched batch");
  }
  Slot& slot = slots_[static_cast<size_t>(s)];
  Status waited = CudaStatus(cudaEventSynchronize(slot.done), "cudaEventSynchronize");
  if (!waited.ok()) {
    // Every stream drained before the slot, and its on_done, are let go.
    WaitForAll(slot.compute);
  }
  // Its on_done has returned (done follows it, and after a device fault, the wait): the slot
  // is free. Unless the device never ran the callback: then the slot stays busy for good
  // (the callback may still come and read it), and so the plan is never evicted.
  if (!WaitForCallback(slot)) {
    return Internal(
        "the GPU never ran a batch's completion callback within a minute; its slot is "
        "abandoned (the device is likely lost: restart the server)" +
        (waited.ok() ? std::string() : ": " + waited.message()));
  }
  slot.busy = false;
  slot.on_done = nullptr;
  {
    MutexLock lock(&slot.callback->mu);
    slot.callback->on_done = nullptr;
  }
  const Status error = std::move(slot.error);
  slot.error = Status::Ok();
  RETURN_IF_ERROR(waited);
  RETURN_IF_ERROR(error);
  float ms = 0;
  last_device_ms_ =
      cudaEventElapsedTime(&ms, slot.compute_began, slot.computed) == cudaSuccess ? ms : 0;
  const GpuLowering& l = lowering_;
  const char* staging = slot.staging.data();
  outputs->clear();
  for (size_t o = 0; o < l.outputs.size(); ++o) {
    const int v = l.outputs[o];
    Shape shape = l.shapes[v];
    // A batch of fewer rows than planned: the first rows of each (batch-major) output.
    if (slot.rows >= 0 && !shape.empty()) shape[0] = std::min(shape[0], slot.rows);
    outputs->push_back(Tensor::Allocate(l.dtypes[v], shape));
    Tensor& t = outputs->back();
    // The compute copied every output, in the arena or a constant blob, out.
    if (t.byte_size() > 0 && l.values[v].home != GpuValue::Home::kNone)
      std::memcpy(t.mutable_data(), staging + staged_outputs_[o], t.byte_size());
  }
  // Each flagging step's own flag: the first raised names its node.
  for (size_t f = 0; f < l.flag_nodes.size(); ++f) {
    int32_t flag = 0;
    std::memcpy(&flag, staging + staged_flag_ + f * sizeof(int32_t), sizeof(flag));
    if (flag == 0) continue;
    const std::string& node = l.flag_nodes[f];
    if (flag & 1) return InvalidArgument(node + ": an index was out of range");
    if (flag & 2) return InvalidArgument(node + ": an integer division by zero");
    if (flag & 4) return InvalidArgument(node + ": a batch index was out of range");
    if (flag & 8) return InvalidArgument(node + ": a sequence length was outside [0, seq_length]");
    if (flag & 16) {
      return InvalidArgument(node +
                             ": a roi is not finite, or its bins span more than twice the input");
    }
    return Internal(node + ": its kernel raised error flag " + std::to_string(flag));
  }
  return Status::Ok();
}

Status GpuPlan::Run(const std::vector<const Tensor*>& inputs, const Stream& stream,
                    std::vector<Tensor>* outputs) {
  ASSIGN_OR_RETURN(const int slot, Launch(inputs, stream));
  return Finish(slot, outputs);
}

StatusOr<GpuPlan::PhaseMs> GpuPlan::RunTimingPhases(const std::vector<const Tensor*>& inputs,
                                                    const Stream& stream,
                                                    std::vector<Tensor>* outputs) {
  ASSIGN_OR_RETURN(const int s, Launch(inputs, stream));
  RETURN_IF_ERROR(Finish(s, outputs));
  // The slot's events keep this batch's times until its next Launch.
  const Slot& slot = slots_[static_cast<size_t>(s)];
  auto elapsed = [](cudaEvent_t from, cudaEvent_t to) -> StatusOr<double> {
    float ms = 0;
    RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, from, to), "cudaEventElapsedTime"));
    return static_cast<double>(ms);
  };
  PhaseMs phases;
  ASSIGN_OR_RETURN(phases.copy_in, elapsed(slot.started, slot.in_ready));
  ASSIGN_OR_RETURN(phases.compute, elapsed(slot.compute_began, slot.computed));
  ASSIGN_OR_RETURN(phases.copy_out, elapsed(slot.computed, slot.copied_out));
  return phases;
}

}  // namespace shoal::engine::cuda
