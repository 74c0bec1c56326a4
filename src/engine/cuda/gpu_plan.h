// A model's plan on a CUDA device: the CPU engine's Plan for one set of input shapes
// (engine/plan.h), lowered onto the GPU path's kernels.
//
// The CPU plan does the work that does not depend on the device: it checks every node,
// infers every value's shape and dtype for these input shapes, and folds what the shapes
// decide (Shape -> Gather -> Concat -> Reshape chains) into constants. Lowering then walks
// its steps:
//   - a view (Reshape, Flatten, Squeeze, Unsqueeze, Identity) takes the bytes of the value
//     it views, as on the CPU;
//   - Gemm, MatMul and the optimiser's shoal.FusedGemm / shoal.FusedMatMul with a constant
//     weight become one cuBLASLt GEMM (gemm.h), A's leading dimensions folded into M. The
//     weight is uploaded with alpha folded in, the bias (beta·C for a Gemm) rides in the
//     epilogue with ReLU or tanh-GELU, Sigmoid, Tanh and erf-GELU follow as an element-wise
//     step, and a residual is added after;
//   - element-wise, broadcasting, Softmax, LayerNormalization, Transpose and Gather run
//     shoal's own kernels (elementwise.h, normalization.h, layout.h);
//   - anything else is refused at lowering with UNIMPLEMENTED naming every such node and
//     why, so a model that cannot run on the GPU fails when it loads, not when it serves.
//
// Memory: constants the steps read (weights, biases, embedding tables, mask constants)
// live in one device buffer uploaded once. Graph inputs, intermediates and graph outputs
// share one arena, their offsets from the engine's memory planner (memory_planner.h):
// values whose lifetimes do not overlap share bytes. Every offset is a multiple of
// kGemmAlignmentBytes, so any value may be a GEMM operand. Nothing is allocated per run.
//
// Lowering touches no device and is tested on machines without one; GpuPlan::Create
// allocates, uploads and plans the GEMMs, and Run queues the copies and kernels on a
// stream and waits for them. One GpuPlan per instance: Run is not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/conv.h"
#include "engine/cuda/device.h"
#include "engine/cuda/elementwise.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/layout.h"
#include "engine/cuda/reduce.h"
#include "engine/graph.h"
#include "engine/plan.h"

namespace shoal::engine::cuda {

struct GpuPlanOptions {
  // How the products are computed: kFp32 or kTf32 (values stay fp32 in memory; the
  // fp16/bf16 tiers need the other kernels in those types first).
  GemmMath math = GemmMath::kFp32;
  // Run the copies and the steps as a CUDA graph: the plan's first run goes step by step,
  // its second captures the graph and later runs replay it, so a run costs one launch
  // instead of one per kernel and copy (a plan's pointers, its staging buffer's included,
  // never change). A failed capture falls back to step by step for good.
  bool cuda_graph = true;
};

// Where a value's bytes are on the device.
struct GpuValue {
  enum class Home { kNone, kArena, kWeights };
  Home home = Home::kNone;  // kNone: no step reads or writes it
  int64_t offset = 0;       // kArena: its offset; kWeights: the index of its blob
  int64_t bytes = 0;        // its data, unpadded
};

// One kernel launch (or a GEMM with its follow-ups) of a lowered plan.
struct GpuStep {
  enum class Kind {
    kGemm,
    kUnary,
    kBinary,
    kSoftmax,
    kLayerNorm,
    kTranspose,
    kGather,
    kSlice,
    kReduce,
    kCast,
    kIm2Col,
    kPool,
    kPlace,
    kPad,
    kStridedSlice
  };
  Kind kind = Kind::kUnary;
  int node = -1;  // the graph node it runs
  // Values it reads, by kind: kGemm {x, w or -1, -1, residual or -1}; kUnary, kSoftmax,
  // kTranspose, kSlice, kReduce, kCast {x}; kBinary {a, b}; kLayerNorm {x, scale, bias or
  // -1}; kGather {data, indices}; kIm2Col, kPool {x}. A constant GEMM weight and the bias
  // are weight slots (`weight_slots`), not values, because they are stored transformed; so
  // is a kBinary's b when it is -1 (a grouped convolution's bias, shaped [m, 1, 1]). Values past
  // the graph's are the lowering's own temporaries (a transposed operand, a product before its
  // output transpose).
  std::vector<int> in;
  int out = -1;
  GemmOptions gemm;                  // kGemm
  std::optional<UnaryOp> post;       // kGemm: an activation the epilogue lacks
  BroadcastPlan residual;            // kGemm with a residual: its broadcast onto out
  UnaryOp unary = UnaryOp::kRelu;    // kUnary
  BinaryOp binary = BinaryOp::kAdd;  // kBinary
  BroadcastPlan broadcast;           // kBinary
  // kSoftmax, kLayerNorm: [rows, row length]; kSlice, kReduce: x's shape; kPlace: out's.
  std::vector<int64_t> dims;
  float epsilon = 0;        // kLayerNorm
  TransposePlan transpose;  // kTranspose
  GatherPlan gather;        // kGather
  // kGemm: the blobs of w and bias, or -1; kBinary: b's when in[1] is -1.
  std::vector<int64_t> weight_slots;
  // kSlice: x[.., start : start + length, ..] along `axis`; kPlace: x written into out at
  // [start, start + x's length) along `axis` (one of Concat's inputs); kReduce: axes
  // [axis, axis + length).
  int64_t axis = 0, start = 0, length = 0;
  ReduceOp reduce = ReduceOp::kSum;      // kReduce
  CastSource cast = CastSource::kInt64;  // kCast
  // kUnary, and kGemm's `post`: the activation's parameters (elementwise.h); kPad: the
  // padding value in alpha.
  float alpha = 0.f, beta = 0.f;
  PadPlan pad;                 // kPad
  SlicePlan slice;             // kStridedSlice (ONNX Slice)
  Window2d window;             // kIm2Col, kPool
  PoolOp pool = PoolOp::kMax;  // kPool
};

struct GpuLowering {
  std::vector<GpuStep> steps;
  std::vector<GpuValue> values;  // per value: the graph's, then the lowering's temporaries
  // The constants the steps read, each with a key that names its content, so the plans of
  // one model for other input shapes find the same device copy (GpuWeights): a graph
  // constant by its value ("v12"), a value the CPU plan folded for these shapes by its
  // value, shape and a hash of its bytes ("v40@[8,2]#9f3c..."), then any transformation
  // ("v12*0.5", ":chw"); "zeros64" for a zero bias.
  struct Blob {
    std::string key;
    Tensor data;
  };
  std::vector<Blob> blobs;
  int64_t weight_bytes = 0;  // the blobs' bytes
  int64_t arena_bytes = 0;
  int64_t workspace_bytes = 0;   // the GEMMs' shared scratch
  bool cuda_graph = true;        // GpuPlanOptions::cuda_graph
  std::vector<int> inputs;       // graph.inputs
  std::vector<int> outputs;      // graph.outputs
  std::vector<DataType> dtypes;  // per value, as `values`
  std::vector<Shape> shapes;
};

// The options of a CPU plan made to be lowered: fp32, every value in its plain layout.
inline PlanOptions GpuLoweringPlanOptions() {
  PlanOptions options;
  options.plain_layouts = true;
  return options;
}

// Lowers `plan`, prepared from `graph` with GpuLoweringPlanOptions(), onto the GPU
// path. Pure host work. UNIMPLEMENTED naming every node the GPU path cannot run yet, one
// per line ("node 'attn/MatMul' (shoal.FusedMatMul): a product of two computed tensors
// ..."); INTERNAL when the memory planner fails.
StatusOr<GpuLowering> LowerPlan(const Graph& graph, const Plan& plan,
                                const GpuPlanOptions& options = {});

// Device copies of one model's constants, shared by its GPU plans for every input shape
// (an instance's plan cache): each blob is uploaded once, by key, and kept for as long as
// the GpuWeights lives. One thread at a time, as the plans that share it.
class GpuWeights {
 public:
  // The device copy of `blob`, uploaded on `stream` the first time its key is asked for
  // (the caller synchronises the stream before `blob`'s host data goes); each Get is one
  // more user of it. INTERNAL when the key names a copy of another size.
  StatusOr<const void*> Get(const GpuLowering::Blob& blob, const Stream& stream);
  // One user fewer of `key`; its device copy is freed with the last (a plan evicted from
  // an instance's cache takes the copies only it used with it).
  void Release(const std::string& key);
  size_t count() const { return buffers_.size(); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Entry {
    DeviceBuffer buffer;
    int users = 0;
  };
  std::map<std::string, Entry> buffers_;
  int64_t bytes_ = 0;
};

class GpuPlan {
 public:
  // Allocates the arena and the GEMM workspace on the current device, finds or uploads
  // the weights in `weights` (a GpuWeights of its own when null) on `stream`, and plans
  // every GEMM. `handle` must outlive the plan.
  static StatusOr<std::unique_ptr<GpuPlan>> Create(GpuLowering lowering, const LtHandle& handle,
                                                   const Stream& stream,
                                                   std::shared_ptr<GpuWeights> weights = nullptr);

  ~GpuPlan();
  GpuPlan(const GpuPlan&) = delete;
  GpuPlan& operator=(const GpuPlan&) = delete;

  // `inputs` follow graph.inputs with the planned shapes and dtypes; `outputs` are
  // replaced by host tensors following graph.outputs. Copies the inputs into the plan's
  // pinned staging buffer, queues their copies to the device, every step and the outputs'
  // copies back (from the second run on as the plan's CUDA graph, when the lowering asked
  // for one), waits, and copies the outputs out of the staging buffer. INVALID_ARGUMENT for
  // an input of another shape or dtype, or a Gather index out of range (found after the run).
  Status Run(const std::vector<const Tensor*>& inputs, const Stream& stream,
             std::vector<Tensor>* outputs);

  const GpuLowering& lowering() const { return lowering_; }
  // Device time of the last Run's queued work (CUDA events around it), in ms.
  double last_device_ms() const { return last_device_ms_; }
  // Device memory the plan holds besides the shared weights: arena, workspace and flag.
  int64_t device_bytes() const {
    return static_cast<int64_t>(arena_.size_bytes() + workspace_.size_bytes() +
                                error_flag_.size_bytes());
  }

 private:
  GpuPlan() = default;
  // The device address of value `v` (its blob, or the arena's base plus its offset).
  void* Address(int v) const;
  const char* Blob(int64_t index) const { return static_cast<const char*>(blobs_[index]); }
  Status RunStep(size_t i, cudaStream_t stream);
  // The copies in, every step and the copies out, queued one by one (`Queue`), or as the
  // graph `Queue` was captured into.
  Status Queue(cudaStream_t stream);
  Status QueueAsGraph(cudaStream_t stream);

  GpuLowering lowering_;
  std::shared_ptr<GpuWeights> weights_;
  std::vector<const void*> blobs_;      // per blob of the lowering, its device copy
  std::vector<std::string> blob_keys_;  // and its key, released with the plan
  DeviceBuffer arena_, workspace_, error_flag_;
  // Pinned host memory the copies go through: each input, each output, the error flag.
  PinnedBuffer staging_;
  std::vector<size_t> staged_inputs_, staged_outputs_;  // offsets in staging_
  size_t staged_flag_ = 0;
  std::vector<std::unique_ptr<LtGemm>> gemms_;          // per step; null where no GEMM
  cudaGraphExec_t graph_ = nullptr;                     // the steps, once captured
  cudaEvent_t started_ = nullptr, finished_ = nullptr;  // around each run's queued work
  double last_device_ms_ = 0;
  int64_t runs_ = 0;           // the graph is captured at the second run, after a warm one
  bool graph_failed_ = false;  // capture failed once: the plan runs step by step
};

}  // namespace shoal::engine::cuda
