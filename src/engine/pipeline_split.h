// Pipeline stages: a model cut into K contiguous runs of nodes, each a Model of its own.
//
// A stage is the nodes [starts[s], starts[s+1]) of the optimised graph (Model::graph(),
// topological order). A value read by a stage and produced outside it (a graph input or
// an earlier stage's value) becomes an input of that stage's graph; a value a stage
// produces that a later stage reads, or that is a graph output, becomes an output of it.
// Constants (weights) are shared by reference, never copied. Stage inputs get the dtype
// and the shape the whole model's plan gives them, with dimensions that follow a symbolic
// input dimension (the batch) left symbolic, so every stage batches as the model does.
//
// Choosing the cut: BalanceStages splits per-node costs (times from ProfileOperators'
// node_ms, or NodeFlops) so that the costliest stage is as cheap as it can be;
// StageStartsFromNames takes the cut from node names (the first node of every stage
// after the first). PipelineSession (pipeline_session.h) runs the stages.
//
// Limits: a value whose data a plan computes from shapes alone (Shape -> Gather ->
// Reshape chains) becomes a run-time input when it crosses a cut, which an operator that
// needs it at plan time refuses; SplitModel then fails with that stage's error, naming
// the stage, and another cut is needed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/graph.h"
#include "engine/model.h"

namespace shoal::engine {

// Start node of each of `stages` stages (starts[0] == 0, strictly increasing, every
// stage non-empty) minimising the largest stage's summed cost; among equal maxima the
// earliest cut wins. INVALID_ARGUMENT when stages < 1, stages > costs.size(), or a
// cost is negative or not finite.
StatusOr<std::vector<int>> BalanceStages(const std::vector<double>& costs, int stages);

// Start nodes from the names of the nodes that begin stages 2..K, in graph order.
// INVALID_ARGUMENT for an unknown or empty name (the message names it), a name given
// twice or out of graph order, or the graph's first node (stage 1 would be empty).
StatusOr<std::vector<int>> StageStartsFromNames(const Graph& graph,
                                                const std::vector<std::string>& names);

// The stage graphs for `starts` (as BalanceStages returns). `shapes` and `dtypes` are
// per value of `graph` (a stage input's declared shape and type); values they leave
// kInvalid must not cross a cut. INVALID_ARGUMENT for bad starts, or a graph output that
// no node produces.
StatusOr<std::vector<Graph>> SplitGraph(const Graph& graph, const std::vector<int>& starts,
                                        const std::vector<SymbolicShape>& shapes,
                                        const std::vector<DataType>& dtypes);

struct ModelStages {
  std::vector<int> starts;                     // first node of each stage
  std::vector<std::unique_ptr<Model>> models;  // one per stage, loaded unoptimised
  // Per stage: cost summed over its nodes, as given to SplitModel (empty when none).
  std::vector<double> costs;
};

// Cuts `model` at `starts`: probes every value's shape by preparing the whole model at
// two sizes of each symbolic input dimension, splits (SplitGraph), and loads each stage
// with the model's options (the graph is already optimised, so no rewrites run again).
// `node_costs` (optional, per node) only fills ModelStages::costs. Errors: SplitGraph's,
// and a stage that does not load (prefixed "pipeline stage N of K").
StatusOr<ModelStages> SplitModel(const Model& model, const std::vector<int>& starts,
                                 const std::vector<double>& node_costs = {});

}  // namespace shoal::engine
