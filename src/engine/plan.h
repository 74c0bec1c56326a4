// Plan: a graph prepared for one set of concrete input shapes. Internal to the engine;
// Session (model.h) caches plans by input shapes.
//
// Preparing walks the nodes in order, asks each operator for its output shapes and a
// Kernel (kernel.h), and evaluates at once every node whose inputs are all known
// (constants, and values computed only from shapes): such values become constants of
// the plan and their nodes never run again. What remains is a list of steps.
//
// Memory: every intermediate value gets a fixed offset in one aligned arena of
// arena_bytes(); graph outputs are allocated per run (they leave the engine with
// shared ownership), graph inputs are the caller's and plan constants are the plan's.
// Kernels whose output is a view of an input (Reshape...) take no memory, and a view's
// uses keep its source alive. Offsets come from the memory planner (memory_planner.h):
// values whose lifetimes (defining step to last use, in step order) do not overlap share
// bytes, and an element-wise kernel writes its output over an input
// (Kernel::inplace_input) when that input is an arena value read for the last time.
// The plan allocates its arena at its first run, unless its owner hands it one first
// (UseArena): a Session gives all its plans one arena, since it runs one at a time.
//
// Data-dependent shapes: an operator may mark an output whose shape it learns only when
// it runs (PrepareContext::out_dynamic: NonZero, NonMaxSuppression). Such a value, and
// every value computed from it (a node any of whose inputs is dynamic), is "dynamic": it
// takes no arena bytes, its node is prepared again at every run from the tensors its
// inputs then hold (inputs known at plan time are passed as data, and so are integer
// run-time inputs, which are small index and shape tensors), and its outputs are
// allocated per run. Everything else keeps its plan-time kernel and its arena offset;
// static values a dynamic step reads stay alive until that step. A dynamic node whose
// inputs are all known at plan time is evaluated then, like any other.
// What a dynamic step's preparation produced is cached per step, keyed by what it read
// (input dtypes and shapes, and the contents of the run-time integer inputs passed as
// data, up to kDynamicKeyDataBytes; internal/prepared_cache.h): a run that brings inputs
// seen in one of its last PlanLimits::dynamic_cache_entries keys reuses that kernel and prepares
// nothing (Plan::dynamic_stats counts both).
//
// Thread safety: a Plan is used by one thread at a time (its Session's).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/graph.h"
#include "engine/internal/prepared_cache.h"
#include "engine/kernel.h"

namespace shoal::engine {

// The most bytes of run-time data a dynamic step's cache key may hold: a step whose
// data inputs hold more is prepared at every run.
inline constexpr size_t kDynamicKeyDataBytes = 4096;

// How often a plan's dynamic steps were prepared at run time, and how often a run reused
// a cached preparation instead (plan.h above). Counted since the plan was prepared.
struct DynamicPrepareStats {
  int64_t prepares = 0;
  int64_t cache_hits = 0;
};

// What the memory planner decided for one plan. Counts only the arena's values
// (intermediates that are not views), all sizes 64-byte aligned.
struct PlanMemoryStats {
  int64_t planned_bytes = 0;         // the arena, allocated once with the plan
  int64_t liveness_bound_bytes = 0;  // most bytes live at one step: no arena can be smaller
  int64_t no_reuse_bytes = 0;        // one slot per value (no reuse)
  int inplace_count = 0;             // steps whose output took an input's bytes
};

// Where one arena value lives, for tests and debugging (Plan::DebugLayout).
struct PlanLayoutEntry {
  int value = -1;       // value index in the graph
  int64_t offset = 0;   // in the arena
  int64_t bytes = 0;    // unaligned
  int first_step = 0;   // step that defines it
  int last_step = 0;    // last step that reads it or a view of it; step_count() when a
                        // graph output views it (copied out after the last step)
  int inplace_of = -1;  // value whose bytes it took, else -1
};

struct PlanLimits {
  // Largest tensor a plan may create, in bytes (guards against shapes a model computes
  // from its input). Default 4 GiB.
  int64_t max_tensor_bytes = int64_t{4} << 30;
  // Preparations of a data-dependent step kept per step (see above), the least recently
  // used evicted first. Default 4; 0 prepares such steps at every run.
  int dynamic_cache_entries = 4;
  // Most iterations one Loop node may run (a model whose trip count or condition never
  // ends the loop, such as PyTorch's while loops exported with M = INT64_MAX, fails with
  // RESOURCE_EXHAUSTED naming the node instead of hanging). A Loop's scan outputs count
  // against max_tensor_bytes as they grow. Default 1 << 20.
  int64_t max_loop_iterations = int64_t{1} << 20;
};

// Estimated FLOPs of one node at the given value shapes: multiply-adds count 2 for Conv,
// ConvTranspose, MatMul and Gemm (fused forms included), plus one per output element of
// element-wise and normalisation operators (per input element for pools and reductions);
// 0 for data movement.
int64_t NodeFlops(const Graph& graph, const Node& node, const std::vector<Shape>& shapes);

class Plan {
 public:
  // `input_shapes` follows graph.inputs. Runs small constant computations on `stream`.
  // Subgraphs (control flow, ops/control_flow.cc) also pass `input_dtypes`, the types
  // their node feeds (a subgraph's file may not declare them), and `input_data`, per
  // input its data when it is the same at every run (null otherwise): such an input is
  // a plan constant, and each run must pass the same data for it.
  static StatusOr<std::unique_ptr<Plan>> Prepare(
      const Graph& graph, const std::vector<Shape>& input_shapes, const dnnl::engine& engine,
      dnnl::stream& stream, WeightCache* weights, const PlanOptions& options,
      const PlanLimits& limits, const std::vector<DataType>* input_dtypes = nullptr,
      const std::vector<const Tensor*>* input_data = nullptr);

  // Plans prepared so far in this process, subgraphs' included (tests check that a Loop
  // body is not prepared again per iteration or per run).
  static int64_t PreparedCount();

  // `inputs` follows graph.inputs and must have the prepared shapes (the caller keyed
  // the plan by them) and the graph's dtypes. Outputs follow graph.outputs.
  // `observer`, when set, sees every graph input and every value a step computes, right
  // after it is computed, in its plan layout (calibration, precision.h).
  using Observer = std::function<void(int value, const Tensor& data)>;
  Status Run(const std::vector<const Tensor*>& inputs, dnnl::stream& stream,
             std::vector<Tensor>* outputs, const Observer* observer = nullptr);

  // Dispatch-cost measurement (bench/engine/dispatch_benchmark.cc): runs the plan once
  // step by step, running each step that computes something `reps` more times by itself
  // right after it (its inputs warm in cache: the best its kernel does); per such step,
  // in step order, the median ms of those runs. A step's inputs may be overwritten by
  // the repetitions (in-place steps), so the outputs are not kept.
  StatusOr<std::vector<double>> TimeStepsAlone(const std::vector<const Tensor*>& inputs,
                                               dnnl::stream& stream, int reps);
  // Steps that run a prepared kernel at each run (not views, not skipped, not prepared
  // per run for a data-dependent shape).
  int kernel_steps() const;

  const std::vector<Shape>& shapes() const { return shapes_; }
  const std::vector<DataType>& dtypes() const { return dtypes_; }
  // Per value: its shape is known only at run time (shapes() holds no shape for it).
  const std::vector<char>& dynamic() const { return dynamic_; }
  const DynamicPrepareStats& dynamic_stats() const { return dynamic_stats_; }
  size_t step_count() const { return steps_.size(); }
  int64_t arena_bytes() const { return arena_bytes_; }
  // Binds the plan's intermediate values to `arena`, at least arena_bytes() long, for
  // every run to come (the plan keeps a reference). Plans that never run at the same time
  // may share one arena. Null unbinds them: the next run allocates the plan's own.
  Status UseArena(std::shared_ptr<Buffer> arena);
  const std::shared_ptr<Buffer>& arena() const { return arena_; }
  // Intermediate values kept in a oneDNN-chosen (blocked) layout between the operators
  // that accept it.
  int blocked_values() const { return blocked_values_; }
  // Of those, the values an int8 plan keeps quantised (s8/u8 with a scale) between
  // operators that read them so (PrepareContext::in_scales).
  int quantized_values() const { return quantized_values_; }
  int64_t planned_bytes() const { return memory_.planned_bytes; }
  int64_t liveness_bound_bytes() const { return memory_.liveness_bound_bytes; }
  int inplace_count() const { return memory_.inplace_count; }
  const PlanMemoryStats& memory_stats() const { return memory_; }
  // NodeFlops summed over the graph at this plan's shapes.
  int64_t EstimatedFlops() const;
  // Per step that runs a library kernel, in step order: the node's operator ("Conv", or
  // "domain.Op" outside ONNX's domain) and the implementation it runs
  // (Kernel::implementation).
  std::vector<std::pair<std::string, std::string>> Implementations() const;
  // What one step of the plan does, for an executor that lowers the plan onto another
  // device (engine/cuda/gpu_lowering.h): the node it runs, the values it reads and writes
  // (the node's, position for position, -1 where one is omitted), and how it runs.
  struct StepInfo {
    int node = 0;
    std::vector<int> inputs;
    std::vector<int> outputs;
    bool skip = false;     // every output is empty: nothing runs
    bool dynamic = false;  // prepared at every run (a data-dependent shape)
    int alias_input = -1;  // >= 0: output 0 is a view of that input's bytes; nothing runs
  };
  // Every step, in run order.
  std::vector<StepInfo> Steps() const;
  // The data of value `value` known when the plan was prepared (a constant, a value
  // folded for these shapes, or a view of one), else null.
  const Tensor* KnownData(int value) const {
    return known_.at(value).empty() ? nullptr : &known_[value];
  }
  // Every arena value with its bytes and lifetime, in no particular order.
  const std::vector<PlanLayoutEntry>& DebugLayout() const { return layout_; }
  // The layout a kernel left value `value` in (a convolution's channels-last or blocked
  // output); an empty desc (ndims 0) when the value is plain, as ONNX lays it out.
  const dnnl::memory::desc& ValueLayout(int value) const { return descs_.at(value); }

 private:
  struct Step {
    int node = 0;
    std::unique_ptr<Kernel> kernel;
    std::vector<int> inputs;   // value ids, -1 omitted
    std::vector<int> outputs;  // value ids, -1 omitted
    bool skip = false;         // all outputs empty: nothing to compute
    bool dynamic = false;      // reads a dynamic value: kernel is prepared at every run
    // Dynamic steps: their preparations by key (shallow const: RunDynamic fills it).
    std::unique_ptr<internal::PreparedCache> prepared;
    // &bindings_[v] per input and output (null where omitted), fixed by BindOnce.
    std::vector<const Tensor*> in_ptrs;
    std::vector<Tensor*> out_ptrs;
  };
  Plan(const Graph& graph) : graph_(&graph) {}
  // Steps of Prepare, in order.
  // Sizes the per-value tables; constants and graph inputs become defined.
  void InitValues(const std::vector<Shape>& input_shapes, const std::vector<DataType>* input_dtypes,
                  const std::vector<const Tensor*>* input_data, std::vector<char>* defined);
  // Node `n`'s inputs as prepared so far, and what it may do with its outputs (per value:
  // `any_layout`, `quantizable`). `all_known`: every input's data is known now.
  Status FillContext(int n, const std::vector<char>& defined, const std::vector<char>& any_layout,
                     const std::vector<char>& quantizable, PrepareContext* ctx,
                     bool* all_known) const;
  // Checks and keeps what node `n`'s operator decided for its outputs (shape, dtype,
  // layout, scale); they become defined.
  Status RecordOutputs(int n, const PrepareContext& ctx, const PlanLimits& limits,
                       std::vector<char>* defined);
  // When the operator computed every output already, they become plan constants: true.
  bool TakeComputedOutputs(const Node& node, const PrepareContext& ctx);
  // Node `n`'s kernel becomes a step, a view of its input, or (all inputs known) runs now
  // and its outputs become plan constants.
  Status AddStep(int n, std::unique_ptr<Kernel> kernel, bool all_known, dnnl::stream& stream);
  Status RunNow(const Step& step, dnnl::stream& stream);
  // When node `n` reads a dynamic value, adds it as a dynamic step (its outputs become
  // dynamic and defined): true.
  bool AddDynamicStep(int n, std::vector<char>* defined);
  // Prepares (or finds prepared) and runs a dynamic step from the tensors bound to its
  // inputs.
  Status RunDynamic(const Step& step, dnnl::stream& stream);
  // The dynamic step's preparation for the tensors now bound to its inputs.
  Status PrepareDynamic(const Step& step, dnnl::stream& stream,
                        internal::PreparedStep* prepared) const;
  // The cache key of what PrepareDynamic reads now; false when its data is too large.
  bool DynamicKey(const Step& step, std::string* key) const;
  Status AssignOffsets();
  // Binds constants for every run to come, and lists the values each run binds itself
  // (per_run_values_). Arena values are bound by UseArena.
  void BindOnce();
  // A run's first step: binds the arena values to an arena of the plan's own when no
  // arena was handed over.
  void EnsureArena();
  // Binds this run's inputs and allocates its outputs.
  void BindRun(const std::vector<const Tensor*>& inputs);
  // Bytes value `v` takes in memory: the one place that says how big a value is (its
  // oneDNN layout's size when blocked, which may pad channels to 16).
  int64_t ValueBytes(int v) const;

  const Graph* graph_;
  std::vector<Shape> shapes_;
  std::vector<DataType> dtypes_;
  std::vector<Tensor> known_;     // per value: data known at plan time, else empty
  std::vector<int> alias_of_;     // per value: value whose bytes it views, else -1
  std::vector<int64_t> offsets_;  // per value: arena offset, -1 when not in the arena
  std::vector<char> is_output_;
  std::vector<char> dynamic_;  // per value: shape known only at run time (see above)
  // For dynamic steps, prepared at run time.
  WeightCache* weights_ = nullptr;
  PlanOptions options_;
  PlanLimits limits_;
  std::vector<dnnl::memory::desc> descs_;  // per value: its layout when not plain
  std::vector<float> scales_;              // per value: its scale when quantised, else 0
  int blocked_values_ = 0;
  int quantized_values_ = 0;
  std::vector<Step> steps_;
  int64_t arena_bytes_ = 0;
  PlanMemoryStats memory_;
  std::vector<PlanLayoutEntry> layout_;
  std::shared_ptr<Buffer> arena_;
  std::vector<Tensor> bindings_;     // per value; constants and arena values kept bound
  std::vector<int> per_run_values_;  // values each run binds and unbinds
  DynamicPrepareStats dynamic_stats_;
};

}  // namespace shoal::engine
