// The engine's public API: load an ONNX model once, run it from any number of sessions.
//
//   ASSIGN_OR_RETURN(auto model, Model::Load("resnet.onnx"));
//   ASSIGN_OR_RETURN(auto session, Session::Create(*model, {.threads = 2, .cpu_cores = {2, 3}}));
//   std::vector<NamedTensor> outputs;
//   RETURN_IF_ERROR(session->Run({{"input", tensor}}, &outputs));
//
// Model: immutable after Load (graph, weights, and a cache of weights reordered into
// oneDNN's layouts that every session shares). Load imports the file (onnx_importer.h),
// checks every node against the operator registry (unsupported operator, attribute or
// datatype: INVALID_ARGUMENT naming the node, the operator and what is missing), and
// infers shapes with the symbolic dimensions left symbolic: it prepares the graph for
// two different values of every symbolic input dimension, which also reorders the
// weights once. Share one Model between sessions by reference; it must outlive them.
//
// Session: what one model instance owns. Its own oneDNN engine and stream, its thread
// count and cores, and a cache of plans keyed by the concrete input shapes (the first
// Run with new shapes prepares a plan; later runs reuse its primitives). Its plans run
// one at a time, so they share one arena for their intermediate values, as large as the
// largest cached plan needs: caching a plan per batch size costs its kernels, not
// another arena. One thread at a time: Create and Run must be called from the same thread (the
// instance's), which Run pins with its OpenMP workers to `cpu_cores`. Two sessions on two threads
// are independent. Errors from Run: INVALID_ARGUMENT for inputs that do not match the model (name,
// dtype, rank, fixed dims), otherwise what a kernel returned.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/graph.h"
#include "engine/onnx_importer.h"
#include "engine/optimizer.h"
#include "engine/plan.h"
#include "engine/weight_cache.h"

namespace shoal::engine {

struct LoadOptions {
  ImportOptions import;
  OptimizeOptions optimize;  // graph rewrites before planning (optimizer.h)
  PlanLimits limits;
  PlanOptions plan;
};

// A model input or output as the model declares it, after shape inference.
struct TensorInfo {
  std::string name;
  DataType dtype = DataType::kInvalid;
  SymbolicShape shape;  // symbolic dims have value -1
  bool rank_known = true;
  // Outputs: the first dimension is the inputs' batch dimension (an input's symbolic
  // first dimension): inference found it equal to that dimension whatever its value, or,
  // for an output whose shape is known only at run time (Plan::dynamic), the model
  // declares it with that dimension's name. Always false for inputs.
  bool batch_major = false;
};

class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                               const LoadOptions& options = {});
  // Takes a graph built by hand or by a pass; runs the same checks as Load.
  static StatusOr<std::unique_ptr<Model>> FromGraph(Graph graph, const LoadOptions& options = {});
  ~Model();

  const Graph& graph() const { return graph_; }
  const std::vector<TensorInfo>& inputs() const { return inputs_; }
  const std::vector<TensorInfo>& outputs() const { return outputs_; }
  // True when every input's and output's first dimension is symbolic (a batch axis).
  bool batch_dim_symbolic() const;
  // The outputs that are not batch-major (TensorInfo::batch_major), in output order:
  // requests cannot be batched together on such a model, since a batch's outputs could
  // not be split back into each request's rows (NonMaxSuppression's [num_selected, 3],
  // a flattened [batch * k]).
  std::vector<std::string> NonBatchMajorOutputs() const;
  const LoadOptions& options() const { return options_; }
  WeightCache* weight_cache() const { return weights_.get(); }
  // What the graph optimiser did at load (node counts, fusions that fired).
  const OptimizeReport& optimize_report() const { return optimize_report_; }

 private:
  Model() = default;
  Status Infer();

  Graph graph_;
  LoadOptions options_;
  OptimizeReport optimize_report_;
  std::vector<TensorInfo> inputs_;
  std::vector<TensorInfo> outputs_;
  std::unique_ptr<WeightCache> weights_;
};

struct SessionOptions {
  // OpenMP threads used by this session's kernels. 0 (default): one per entry of
  // `cpu_cores`, or all available CPUs when `cpu_cores` is empty. Must be >= 0.
  int threads = 0;
  // Logical CPUs to pin to; worker i is pinned to cpu_cores[i % size]. Empty: no pinning.
  std::vector<int> cpu_cores;
  // Plans kept, least recently used evicted first; must be >= 1. A batching server sees
  // every batch size up to its maximum, each a plan: the onnx backend raises this to
  // cover them (onnx_backend.h), since a plan evicted and prepared again costs
  // milliseconds on the request path.
  int max_cached_plans = 64;
  // A plan whose estimated FLOPs (Plan::EstimatedFlops) are below this runs on one thread
  // whatever `threads` says: waking OpenMP workers for every operator costs more than
  // they save on so little work (a small MLP at a small batch). 0 turns this off.
  int64_t single_thread_below_flops = 4'000'000;
};

class Session {
 public:
  static StatusOr<std::unique_ptr<Session>> Create(const Model& model,
                                                   const SessionOptions& options = {});
  ~Session();

  // Inputs are matched by name; all graph inputs are required. Outputs follow the
  // model's output order and own their memory.
  Status Run(const std::vector<NamedTensor>& inputs, std::vector<NamedTensor>* outputs);
  // Run, showing `observer` every value as it is computed (Plan::Run).
  Status RunObserved(const std::vector<NamedTensor>& inputs, std::vector<NamedTensor>* outputs,
                     const Plan::Observer& observer);

  // The memory plan of the plan for inputs of these shapes (in the model's input
  // order), preparing and caching that plan as Run would; same thread rules as Run.
  // INVALID_ARGUMENT when the shapes do not fit the model.
  StatusOr<PlanMemoryStats> PlanStats(const std::vector<Shape>& input_shapes);

  // Plan::TimeStepsAlone on the plan for these inputs (dispatch-cost measurement,
  // bench/engine/dispatch_benchmark.cc): per step that runs a kernel, the median ms of
  // `reps` runs of it alone. Same thread rules as Run.
  StatusOr<std::vector<double>> TimeStepsAlone(const std::vector<NamedTensor>& inputs, int reps);

  int cached_plans() const { return static_cast<int>(plans_.size()); }
  // Bytes of the arena the cached plans share (0 before the first plan).
  int64_t arena_bytes() const { return arena_ ? static_cast<int64_t>(arena_->size()) : 0; }
  // Plans this session has prepared (evicted ones prepared again count again).
  int64_t plans_prepared() const { return plans_prepared_; }
  // Plan::dynamic_stats summed over the plans the session holds now: how often
  // data-dependent steps were prepared at run time, and how often a run reused a
  // preparation instead. Same thread rules as Run.
  DynamicPrepareStats dynamic_stats() const;
  int threads() const { return threads_; }
  // The threads the plan for these input shapes runs on (1 for a small plan, else
  // threads()); prepares and caches the plan as Run would.
  StatusOr<int> PlanThreads(const std::vector<Shape>& input_shapes);

 private:
  Session(const Model& model, const SessionOptions& options);
  Status SetUpThreads();
  struct CachedPlan {
    std::vector<Shape> shapes;
    std::unique_ptr<Plan> plan;
    int threads = 1;  // OpenMP threads its kernels were created for and run on
  };
  StatusOr<CachedPlan*> PlanFor(const std::vector<Shape>& shapes);
  // Binds a newly cached plan to the shared arena, reallocating it (and rebinding every
  // cached plan) when the largest plan now needs more, or less than half of it.
  Status ShareArena();
  // Inputs in the graph's order, checked against the model (Run's INVALID_ARGUMENTs).
  Status OrderInputs(const std::vector<NamedTensor>& inputs, std::vector<const Tensor*>* ordered,
                     std::vector<Shape>* shapes) const;
  Status CheckInputShapes(const std::vector<Shape>& input_shapes) const;
  // CheckInputShapes, thread set-up when called from a new thread, then PlanFor.
  StatusOr<CachedPlan*> PlanForShapes(const std::vector<Shape>& input_shapes);
  Status RunImpl(const std::vector<NamedTensor>& inputs, std::vector<NamedTensor>* outputs,
                 const Plan::Observer* observer);

  const Model& model_;
  SessionOptions options_;
  int threads_ = 1;
  std::thread::id owner_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  // LRU: most recently used at the front.
  std::list<CachedPlan> plans_;
  std::shared_ptr<Buffer> arena_;  // shared by plans_ (ShareArena)
  int64_t plans_prepared_ = 0;
  // RunImpl's per-run vectors, kept to save their allocations.
  std::vector<const Tensor*> run_ordered_;
  std::vector<Shape> run_shapes_;
  std::vector<Tensor> run_results_;
};

}  // namespace shoal::engine
