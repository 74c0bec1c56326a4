// Plan: a graph prepared for one set of concrete input shapes. Internal to the engine;
// Session (model.h) caches plans by input shapes.
//
// Preparing walks the nodes in order, asks each operator for its output shapes and a
// Kernel (kernel.h), and evaluates at once every node whose inputs are all known
// (constants, and values computed only from shapes): such values become constants of
// the plan and their nodes never run again. What remains is a list of steps.
//
// Memory: every intermediate value gets a fixed offset in one arena allocated with the
// plan; graph outputs are allocated per run (they leave the engine with shared
// ownership). Kernels whose output is a view of an input (Reshape...) take no memory.
// Part 2's memory planner only changes how offsets are assigned (AssignOffsets).
//
// Thread safety: a Plan is used by one thread at a time (its Session's).
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/graph.h"
#include "engine/kernel.h"

namespace shoal::engine {

struct PlanLimits {
  // Largest tensor a plan may create, in bytes (guards against shapes a model computes
  // from its input). Default 4 GiB.
  int64_t max_tensor_bytes = int64_t{4} << 30;
};

class Plan {
 public:
  // `input_shapes` follows graph.inputs. Runs small constant computations on `stream`.
  static StatusOr<std::unique_ptr<Plan>> Prepare(const Graph& graph,
                                                 const std::vector<Shape>& input_shapes,
                                                 const dnnl::engine& engine, dnnl::stream& stream,
                                                 WeightCache* weights, const PlanOptions& options,
                                                 const PlanLimits& limits);

  // `inputs` follows graph.inputs and must have the prepared shapes (the caller keyed
  // the plan by them) and the graph's dtypes. Outputs follow graph.outputs.
  Status Run(const std::vector<const Tensor*>& inputs, dnnl::stream& stream,
             std::vector<Tensor>* outputs);

  const std::vector<Shape>& shapes() const { return shapes_; }
  const std::vector<DataType>& dtypes() const { return dtypes_; }
  size_t step_count() const { return steps_.size(); }
  int64_t arena_bytes() const { return arena_bytes_; }
  // Intermediate values kept in a oneDNN-chosen (blocked) layout between the operators
  // that accept it.
  int blocked_values() const { return blocked_values_; }

 private:
  struct Step {
    int node = 0;
    std::unique_ptr<Kernel> kernel;
    std::vector<int> inputs;   // value ids, -1 omitted
    std::vector<int> outputs;  // value ids, -1 omitted
    bool skip = false;         // all outputs empty: nothing to compute
  };
  Plan(const Graph& graph) : graph_(&graph) {}
  void AssignOffsets();
  // Bytes value `v` takes in memory (its layout's size; padded for blocked layouts).
  int64_t ValueBytes(int v) const;

  const Graph* graph_;
  std::vector<Shape> shapes_;
  std::vector<DataType> dtypes_;
  std::vector<Tensor> known_;     // per value: data known at plan time, else empty
  std::vector<int> alias_of_;     // per value: value whose bytes it views, else -1
  std::vector<int64_t> offsets_;  // per value: arena offset, -1 when not in the arena
  std::vector<char> is_output_;
  std::vector<dnnl::memory::desc> descs_;  // per value: its layout when not plain
  int blocked_values_ = 0;
  std::vector<Step> steps_;
  int64_t arena_bytes_ = 0;
  std::shared_ptr<Buffer> arena_;
  std::vector<Tensor> bindings_;  // per value, reset every run
};

}  // namespace shoal::engine
