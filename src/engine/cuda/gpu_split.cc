// SplitForGpu (gpu_lowering.h): a model cut into a GPU stage and a CPU tail.
#include <algorithm>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "engine/cuda/gpu_lowering.h"
#include "engine/pipeline_split.h"

namespace shoal::engine::cuda {

namespace {

// `model`'s plan for `shapes`, as lowering takes it.
StatusOr<std::unique_ptr<Plan>> PrepareForGpu(const Model& model,
                                              const std::vector<Shape>& shapes) {
  dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  dnnl::stream cpu_stream(cpu);
  return Plan::Prepare(model.graph(), shapes, cpu, cpu_stream, model.weight_cache(),
                       GpuLoweringPlanOptions(), model.options().limits);
}

}  // namespace

StatusOr<GpuCpuSplit> SplitForGpu(const Model& model, const std::vector<Shape>& shapes,
                                  const GpuPlanOptions& options) {
  const Graph& graph = model.graph();
  ASSIGN_OR_RETURN(auto plan, PrepareForGpu(model, shapes));
  std::vector<int> refused;
  auto lowered = LowerPlan(graph, *plan, options, &refused);
  if (lowered.ok()) {
    return FailedPrecondition("every node of the model runs on the GPU path: it needs no CPU tail");
  }
  if (refused.empty()) return lowered.status();
  const int cut = *std::min_element(refused.begin(), refused.end());
  if (cut == 0) {
    return Unimplemented(
        "the GPU path cannot run the model's first node, so no part of it "
        "would run on the GPU: " +
        lowered.status().message());
  }
  auto cut_model = SplitModel(model, {0, cut});
  if (!cut_model.ok()) {
    return cut_model.status().WithPrefix("cutting the model before " + graph.Describe(cut) +
                                         " for a CPU tail");
  }
  ModelStages stages = std::move(cut_model).value();
  // The GPU stage at the same shapes: its inputs are the model's inputs it reads.
  std::map<std::string, Shape> by_name;
  for (size_t i = 0; i < graph.inputs.size() && i < shapes.size(); ++i)
    by_name[graph.values[graph.inputs[i]].name] = shapes[i];
  const Graph& first = stages.models[0]->graph();
  std::vector<Shape> first_shapes;
  for (int v : first.inputs) {
    auto it = by_name.find(first.values[v].name);
    if (it == by_name.end())
      return Internal("the GPU stage reads '" + first.values[v].name + "', not a model input");
    first_shapes.push_back(it->second);
  }
  ASSIGN_OR_RETURN(auto first_plan, PrepareForGpu(*stages.models[0], first_shapes));
  auto first_lowered = LowerPlan(first, *first_plan, options);
  if (!first_lowered.ok()) {
    return first_lowered.status().WithPrefix("the GPU stage (the nodes before " +
                                             graph.Describe(cut) + ")");
  }
  GpuCpuSplit split;
  split.cut = cut;
  split.gpu_stage = std::move(stages.models[0]);
  split.cpu_tail = std::move(stages.models[1]);
  std::sort(refused.begin(), refused.end());
  refused.erase(std::unique(refused.begin(), refused.end()), refused.end());
  for (int n : refused) split.cpu_nodes.push_back(graph.Describe(n));
  return split;
}

}  // namespace shoal::engine::cuda
