#include "engine/inspect.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "engine/model.h"
#include "engine/pipeline_split.h"

namespace shoal::engine {
namespace {

std::string Human(double flops) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (flops >= 1000 && u < 4) {
    flops /= 1000;
    ++u;
  }
  std::ostringstream s;
  s.precision(3);
  s << flops << " " << units[u] << "FLOP";
  return s.str();
}

void PrintTensors(std::ostringstream& out, const char* title, const std::vector<TensorInfo>& list) {
  out << title << ":\n";
  for (const auto& t : list) {
    out << "  " << t.name << "  " << DataTypeName(t.dtype) << "  "
        << (t.rank_known ? SymbolicShapeToString(t.shape) : std::string("(rank unknown)")) << "\n";
  }
}

// "activation memory (batch 1): planned 1.2 MiB, liveness bound ...".
std::string MemoryLine(int64_t batch, const PlanMemoryStats& m) {
  auto human = [](int64_t bytes) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(bytes < (int64_t{10} << 20) ? 2 : 1);
    if (bytes < (1 << 20))
      s << static_cast<double>(bytes) / 1024 << " KiB";
    else
      s << static_cast<double>(bytes) / (1 << 20) << " MiB";
    return s.str();
  };
  std::ostringstream out;
  out << "activation memory (batch " << batch << "): planned " << human(m.planned_bytes)
      << ", liveness bound " << human(m.liveness_bound_bytes) << " (ratio " << std::fixed
      << std::setprecision(3)
      << (m.liveness_bound_bytes > 0
              ? static_cast<double>(m.planned_bytes) / static_cast<double>(m.liveness_bound_bytes)
              : 1.0)
      << "), " << m.inplace_count << " in-place; no reuse " << human(m.no_reuse_bytes) << "\n";
  return out.str();
}

// Per operator type (qualified): how many nodes, and for the unsupported ones how many
// with the first reason.
struct OperatorCensus {
  std::map<std::string, int> histogram;
  std::map<std::string, std::pair<int, std::string>> unsupported;  // op -> count, first reason
};

OperatorCensus CountOperators(const Graph& graph) {
  OperatorCensus census;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const std::string op = node.qualified_type();
    ++census.histogram[op];
    Status s = CheckNode(graph, static_cast<int>(n));
    if (!s.ok()) {
      auto& u = census.unsupported[op];
      if (u.first++ == 0) u.second = s.message();
    }
  }
  return census;
}

// The graph's declared inputs or outputs (`values`), for a model that does not load.
std::vector<TensorInfo> DeclaredTensors(const Graph& graph, const std::vector<int>& values) {
  std::vector<TensorInfo> list;
  for (int v : values) {
    TensorInfo t{
        graph.values[v].name, graph.values[v].dtype, {}, graph.values[v].shape.has_value()};
    if (t.rank_known) t.shape = *graph.values[v].shape;
    list.push_back(t);
  }
  return list;
}

void PrintOperators(std::ostringstream& out, const OperatorCensus& census) {
  std::vector<std::pair<int, std::string>> sorted;
  for (const auto& [op, count] : census.histogram) sorted.push_back({-count, op});
  std::sort(sorted.begin(), sorted.end());
  out << "operators:\n";
  for (const auto& [neg, op] : sorted) out << "  " << op << "  " << -neg << "\n";

  out << "unsupported operators:";
  if (census.unsupported.empty())
    out << " none\n";
  else
    out << "\n";
  for (const auto& [op, u] : census.unsupported)
    out << "  " << op << "  " << u.first << "  (" << u.second << ")\n";
}

// Input shapes with the first dimension of every input at `batch` where it is symbolic,
// and every other symbolic dimension at 1.
std::vector<Shape> ShapesAt(const std::vector<TensorInfo>& inputs, int64_t batch) {
  std::vector<Shape> shapes;
  for (const auto& in : inputs) {
    Shape s;
    for (size_t d = 0; d < in.shape.size(); ++d)
      s.push_back(in.shape[d].known() ? in.shape[d].value : d == 0 ? batch : 1);
    shapes.push_back(s);
  }
  return shapes;
}

// Prints the estimated FLOPs, the activation memory and the oneDNN kernels of a plan at
// batch 1, and the activation memory at `batch` when it is above 1. False when the
// batch-1 plan cannot be prepared (then only that is printed).
bool PrintPlans(std::ostringstream& out, const Model& m, const std::vector<TensorInfo>& inputs,
                int64_t batch) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  auto prepare = [&](int64_t b) -> StatusOr<std::unique_ptr<Plan>> {
    const std::vector<Shape> shapes = ShapesAt(inputs, b);
    try {
      return Plan::Prepare(m.graph(), shapes, eng, stream, m.weight_cache(), m.options().plan,
                           m.options().limits);
    } catch (const std::exception& e) {
      return Internal(e.what());
    }
  };
  // FLOPs from a plan at batch 1 (every symbolic dimension set to 1).
  StatusOr<std::unique_ptr<Plan>> plan = prepare(1);
  if (!plan.ok()) {
    out << "estimated FLOPs per sample: unknown (" << plan.status().message() << ")\n";
    return false;
  }
  const int64_t flops = (*plan)->EstimatedFlops();
  out << "estimated FLOPs per sample: " << Human(static_cast<double>(flops)) << " (" << flops
      << ")\n";
  out << MemoryLine(1, (*plan)->memory_stats());
  std::map<std::pair<std::string, std::string>, int> kernels;  // (operator, impl) -> nodes
  for (const auto& entry : (*plan)->Implementations()) ++kernels[entry];
  out << "oneDNN kernels (batch 1):" << (kernels.empty() ? " none\n" : "\n");
  for (const auto& [key, count] : kernels)
    out << "  " << key.first << "  " << key.second << "  " << count << "\n";
  if (batch > 1) {
    plan = prepare(batch);
    if (plan.ok())
      out << MemoryLine(batch, (*plan)->memory_stats());
    else
      out << "activation memory (batch " << batch << "): unknown (" << plan.status().message()
          << ")\n";
  }
  return true;
}

// Where a run's time goes, per operator type (InspectOptions::profile_runs).
void PrintProfile(std::ostringstream& out, const Model& m, const std::vector<TensorInfo>& inputs,
                  const InspectOptions& options) {
  const int64_t batch = std::max<int64_t>(1, options.batch);
  const std::vector<Shape> shapes = ShapesAt(inputs, batch);
  std::vector<NamedTensor> feed;
  for (size_t i = 0; i < inputs.size(); ++i)
    feed.push_back({inputs[i].name, Tensor::Allocate(inputs[i].dtype, shapes[i])});
  SessionOptions so;
  so.threads = options.profile_threads;
  auto profile = ProfileOperators(m, feed, options.profile_runs, so);
  if (!profile.ok()) {
    out << "time per operator: unknown (" << profile.status().message() << ")\n";
    return;
  }
  out << std::fixed << std::setprecision(3) << "time per operator (batch " << batch << ", "
      << profile->runs << " runs, " << profile->threads
      << " threads, zero inputs): " << profile->ms_per_run << " ms per run\n";
  auto line = [&](const std::string& what, int nodes, double ms) {
    out << "  " << what << "  ";
    if (nodes > 0) out << nodes << (nodes == 1 ? " node  " : " nodes  ");
    out << std::setprecision(3) << ms << " ms  " << std::setprecision(1)
        << (profile->ms_per_run > 0 ? 100 * ms / profile->ms_per_run : 0.0) << "%\n";
  };
  for (const OperatorTime& t : profile->operators) line(t.op_type, t.nodes, t.ms_per_run);
  line("(outside operators)", 0, profile->outside_ms_per_run);
  if (profile->dynamic.prepares + profile->dynamic.cache_hits > 0) {
    out << "  data-dependent steps: " << profile->dynamic.prepares << " prepared, "
        << profile->dynamic.cache_hits << " reused a cached preparation\n";
  }
  if (options.pipeline_stages < 1) return;
  // The cut the onnx backend's pipeline_stages would pick from these times, and the
  // names that pin it (pipeline_stage_boundaries).
  auto starts = BalanceStages(profile->node_ms, options.pipeline_stages);
  if (!starts.ok()) {
    out << "pipeline stages: " << starts.status().message() << "\n";
    return;
  }
  const Graph& g = m.graph();
  out << "pipeline stages (" << options.pipeline_stages << ", balanced on the times above):\n";
  std::string names;
  for (size_t s = 0; s < starts->size(); ++s) {
    const int begin = (*starts)[s];
    const int end = s + 1 < starts->size() ? (*starts)[s + 1] : static_cast<int>(g.nodes.size());
    double ms = 0;
    for (int n = begin; n < end; ++n) ms += profile->node_ms[static_cast<size_t>(n)];
    out << "  stage " << s + 1 << "  nodes " << begin << ".." << end - 1 << "  from "
        << g.Describe(begin) << "  " << std::setprecision(3) << ms << " ms\n";
    if (s > 0) names += (s > 1 ? "," : "") + g.nodes[static_cast<size_t>(begin)].name;
  }
  if (starts->size() > 1) out << "  pipeline_stage_boundaries: \"" << names << "\"\n";
}

}  // namespace

StatusOr<std::string> InspectModel(const std::string& path, const InspectOptions& options,
                                   InspectSummary* summary) {
  if (options.batch < 0)
    return InvalidArgument("batch must be >= 0; was " + std::to_string(options.batch));
  if (options.pipeline_stages < 0) {
    return InvalidArgument("pipeline_stages must be >= 0; was " +
                           std::to_string(options.pipeline_stages));
  }
  if (options.profile_runs < 0 || options.profile_threads < 0)
    return InvalidArgument("profile runs and threads must be >= 0");
  ASSIGN_OR_RETURN(Graph graph, ImportOnnxFile(path));
  std::ostringstream out;
  out << "model: " << path << "\n";
  out << "opset: " << graph.opset << "\n";
  out << "nodes: " << graph.nodes.size() << "\n";

  const OperatorCensus census = CountOperators(graph);
  LoadOptions load;
  load.plan.conv_algorithm = options.conv_algorithm;
  load.plan.conv_layout = options.conv_layout;
  auto model = census.unsupported.empty() ? Model::FromGraph(graph, load)
                                          : StatusOr<std::unique_ptr<Model>>(Internal("skipped"));
  const std::vector<TensorInfo> inputs =
      model.ok() ? (*model)->inputs() : DeclaredTensors(graph, graph.inputs);
  const std::vector<TensorInfo> outputs =
      model.ok() ? (*model)->outputs() : DeclaredTensors(graph, graph.outputs);
  PrintTensors(out, "inputs", inputs);
  PrintTensors(out, "outputs", outputs);
  if (model.ok()) {
    const std::vector<std::string> not_batch_major = (*model)->NonBatchMajorOutputs();
    out << "batching: ";
    if (!(*model)->batch_dim_symbolic()) {
      out << "no\n";
    } else if (!not_batch_major.empty()) {
      out << "no (output '" << not_batch_major.front() << "' is not batch-major)\n";
    } else {
      out << "yes (first dimension symbolic)\n";
    }
    out << "optimised graph: " << (*model)->optimize_report().Summary() << "\n";
  }
  PrintOperators(out, census);
  if (summary != nullptr) {
    summary->unsupported_operator_types = static_cast<int>(census.unsupported.size());
    summary->loads = census.unsupported.empty() && model.ok();
  }
  if (!census.unsupported.empty() || !model.ok()) {
    if (!model.ok() && census.unsupported.empty())
      out << "load error: " << model.status().message() << "\n";
    out << "estimated FLOPs per sample: unknown (the model does not load)\n";
    return out.str();
  }
  if (!PrintPlans(out, **model, inputs, options.batch)) return out.str();
  if (options.profile_runs > 0) PrintProfile(out, **model, inputs, options);
  return out.str();
}

}  // namespace shoal::engine
