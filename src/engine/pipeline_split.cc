#include "engine/pipeline_split.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

namespace shoal::engine {

StatusOr<std::vector<int>> BalanceStages(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1)
    return InvalidArgument("pipeline stages must be >= 1; was " + std::to_string(stages));
  if (stages > n) {
    return InvalidArgument("pipeline stages (" + std::to_string(stages) +
                           ") must be at most the model's node count (" + std::to_string(n) + ")");
  }
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const double c = costs[static_cast<size_t>(i)];
    if (!(c >= 0) || !std::isfinite(c))
      return InvalidArgument("node cost " + std::to_string(i) + " must be finite and >= 0");
    prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + c;
  }
  const double kInf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest largest-stage cost of the first i nodes in k stages;
  // from[k][i]: where its last stage starts.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, kInf));
  std::vector<std::vector<int>> from(static_cast<size_t>(stages) + 1,
                                     std::vector<int>(static_cast<size_t>(n) + 1, -1));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n - (stages - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double prev = best[static_cast<size_t>(k) - 1][static_cast<size_t>(j)];
        if (prev == kInf) continue;
        const double v =
            std::max(prev, prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(j)]);
        if (v < best[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = v;
          from[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<int> starts(static_cast<size_t>(stages), 0);
  int end = n;
  for (int k = stages; k >= 1; --k) {
    const int j = from[static_cast<size_t>(k)][static_cast<size_t>(end)];
    starts[static_cast<size_t>(k) - 1] = j;
    end = j;
  }
  return starts;
}

StatusOr<std::vector<int>> StageStartsFromNames(const Graph& graph,
                                                const std::vector<std::string>& names) {
  std::vector<int> starts = {0};
  for (const std::string& name : names) {
    if (name.empty()) return InvalidArgument("pipeline stage boundary names an empty node");
    int found = -1;
    for (size_t n = 0; n < graph.nodes.size() && found < 0; ++n)
      if (graph.nodes[n].name == name) found = static_cast<int>(n);
    if (found < 0) {
      return InvalidArgument(
          "pipeline stage boundary '" + name +
          "' is not a node of the optimised graph (`shoal inspect MODEL --profile 3 "
          "--stages K` prints the names of a balanced cut)");
    }
    if (found == 0) {
      return InvalidArgument("pipeline stage boundary '" + name +
                             "' is the graph's first node: the first stage would be empty");
    }
    if (found <= starts.back()) {
      return InvalidArgument("pipeline stage boundary '" + name +
                             "' is given twice or out of graph order");
    }
    starts.push_back(found);
  }
  return starts;
}

namespace {

Status CheckStarts(const std::vector<int>& starts, size_t nodes) {
  if (starts.empty() || starts[0] != 0)
    return InvalidArgument("the first stage must start at node 0");
  for (size_t s = 1; s < starts.size(); ++s) {
    if (starts[s] <= starts[s - 1] || starts[s] >= static_cast<int>(nodes))
      return InvalidArgument("stage " + std::to_string(s + 1) + " would be empty or out of order");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<Graph>> SplitGraph(const Graph& graph, const std::vector<int>& starts,
                                        const std::vector<SymbolicShape>& shapes,
                                        const std::vector<DataType>& dtypes) {
  RETURN_IF_ERROR(CheckStarts(starts, graph.nodes.size()));
  const size_t nv = graph.values.size();
  if (shapes.size() != nv || dtypes.size() != nv)
    return InvalidArgument("SplitGraph needs a shape and a dtype per value");
  const int k = static_cast<int>(starts.size());
  auto stage_of = [&](int node) {
    return static_cast<int>(std::upper_bound(starts.begin(), starts.end(), node) - starts.begin()) -
           1;
  };
  // The last stage that reads each value (graph outputs count as read after the last).
  std::vector<int> last_reader(nv, -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (int v : graph.nodes[n].inputs)
      if (v >= 0) last_reader[v] = std::max(last_reader[v], stage_of(static_cast<int>(n)));
  }
  std::vector<char> is_output(nv, 0);
  for (int v : graph.outputs) {
    if (graph.values[v].producer < 0 || graph.values[v].is_constant()) {
      return InvalidArgument("graph output '" + graph.values[v].name +
                             "' is not computed by a node; a model that passes an input or a "
                             "constant through cannot be split");
    }
    is_output[v] = 1;
  }
  std::vector<Graph> out(static_cast<size_t>(k));
  for (int s = 0; s < k; ++s) {
    Graph& g = out[static_cast<size_t>(s)];
    g.name = graph.name + "/stage" + std::to_string(s + 1);
    g.opset = graph.opset;
    std::map<int, int> ids;  // value in `graph` -> value in `g`
    const int begin = starts[static_cast<size_t>(s)];
    const int end =
        s + 1 < k ? starts[static_cast<size_t>(s) + 1] : static_cast<int>(graph.nodes.size());
    auto map_value = [&](int v, bool as_input) -> StatusOr<int> {
      if (v < 0) return -1;
      if (auto it = ids.find(v); it != ids.end()) return it->second;
      const Value& src = graph.values[static_cast<size_t>(v)];
      const int id = static_cast<int>(g.values.size());
      Value copy;
      copy.name = src.name;
      copy.dtype = src.dtype;
      copy.shape = src.shape;
      if (src.is_constant()) {
        copy.constant = src.constant;  // shares the buffer
      } else if (as_input) {
        if (dtypes[static_cast<size_t>(v)] == DataType::kInvalid) {
          return InvalidArgument("value '" + src.name + "' crosses into stage " +
                                 std::to_string(s + 1) + " but its type is unknown");
        }
        copy.dtype = dtypes[static_cast<size_t>(v)];
        copy.shape = shapes[static_cast<size_t>(v)];
        g.inputs.push_back(id);
      }
      g.values.push_back(std::move(copy));
      ids[v] = id;
      return id;
    };
    for (int n = begin; n < end; ++n) {
      const Node& node = graph.nodes[static_cast<size_t>(n)];
      Node copy = node;
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        ASSIGN_OR_RETURN(copy.inputs[i], map_value(node.inputs[i], /*as_input=*/true));
      }
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        const int v = node.outputs[o];
        if (v >= 0 && graph.values[static_cast<size_t>(v)].is_constant()) {
          copy.outputs[o] = -1;  // a Constant's value: every reader has it as a constant
          continue;
        }
        ASSIGN_OR_RETURN(copy.outputs[o], map_value(v, /*as_input=*/false));
        if (copy.outputs[o] >= 0)
          g.values[static_cast<size_t>(copy.outputs[o])].producer =
              static_cast<int>(g.nodes.size());
      }
      g.nodes.push_back(std::move(copy));
    }
    // Outputs: values made here that a later stage reads or the model returns, in value
    // order.
    for (const auto& [v, id] : ids) {
      if (g.values[static_cast<size_t>(id)].producer < 0) continue;
      if (is_output[static_cast<size_t>(v)] || last_reader[static_cast<size_t>(v)] > s)
        g.outputs.push_back(id);
    }
  }
  return out;
}

StatusOr<ModelStages> SplitModel(const Model& model, const std::vector<int>& starts,
                                 const std::vector<double>& node_costs) {
  const Graph& g = model.graph();
  RETURN_IF_ERROR(CheckStarts(starts, g.nodes.size()));
  // Probe: two plans with different sizes for every symbolic input dimension.
  std::vector<Shape> probes[2];
  std::map<std::pair<int64_t, int64_t>, std::string> input_symbols;
  int next = 0;
  for (const TensorInfo& in : model.inputs()) {
    if (!in.rank_known)
      return InvalidArgument("input '" + in.name + "' has no known rank; cannot split the model");
    for (int p = 0; p < 2; ++p) probes[p].emplace_back();
    for (const Dim& d : in.shape) {
      if (d.known()) {
        for (int p = 0; p < 2; ++p) probes[p].back().push_back(d.value);
        continue;
      }
      const int64_t a = 2 + next, b = 7 + 2 * next;
      ++next;
      probes[0].back().push_back(a);
      probes[1].back().push_back(b);
      input_symbols[{a, b}] = d.symbol;
    }
  }
  std::vector<Shape> value_shapes[2];
  std::vector<DataType> dtypes;
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    for (int p = 0; p < 2; ++p) {
      WeightCache scratch;
      ASSIGN_OR_RETURN(auto plan, Plan::Prepare(g, probes[p], engine, stream, &scratch,
                                                model.options().plan, model.options().limits));
      value_shapes[p] = plan->shapes();
      dtypes = plan->dtypes();
    }
  } catch (const dnnl::error& e) {
    return Internal(std::string("oneDNN error while probing the model's shapes: ") + e.what());
  }
  std::vector<SymbolicShape> shapes(g.values.size());
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Shape& a = value_shapes[0][v];
    const Shape& b = value_shapes[1][v];
    if (a.size() != b.size()) {
      dtypes[v] = DataType::kInvalid;  // rank changes with the input: not a stage input
      continue;
    }
    for (size_t d = 0; d < a.size(); ++d) {
      if (a[d] == b[d]) {
        shapes[v].push_back(Dim{a[d], ""});
      } else if (auto it = input_symbols.find({a[d], b[d]}); it != input_symbols.end()) {
        shapes[v].push_back(Dim{-1, it->second});
      } else {
        shapes[v].push_back(Dim{-1, "~" + std::to_string(a[d]) + "/" + std::to_string(b[d])});
      }
    }
  }
  ASSIGN_OR_RETURN(std::vector<Graph> graphs, SplitGraph(g, starts, shapes, dtypes));
  ModelStages stages;
  stages.starts = starts;
  LoadOptions options = model.options();
  options.optimize.enabled = false;
  const int k = static_cast<int>(graphs.size());
  for (int s = 0; s < k; ++s) {
    auto stage = Model::FromGraph(std::move(graphs[static_cast<size_t>(s)]), options);
    if (!stage.ok()) {
      return stage.status().WithPrefix("pipeline stage " + std::to_string(s + 1) + " of " +
                                       std::to_string(k));
    }
    stages.models.push_back(std::move(stage).value());
  }
  if (node_costs.size() == g.nodes.size()) {
    stages.costs.assign(static_cast<size_t>(k), 0);
    for (size_t n = 0; n < node_costs.size(); ++n) {
      const int s =
          static_cast<int>(std::upper_bound(starts.begin(), starts.end(), static_cast<int>(n)) -
                           starts.begin()) -
          1;
      stages.costs[static_cast<size_t>(s)] += node_costs[n];
    }
  }
  return stages;
}

}  // namespace shoal::engine
