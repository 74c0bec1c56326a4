#include "engine/profile.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace shoal::engine {

StatusOr<OperatorProfile> ProfileOperators(const Model& model,
                                           const std::vector<NamedTensor>& inputs, int runs,
                                           const SessionOptions& options) {
  return ProfileOperators(model, inputs, runs, options, [] {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  });
}

StatusOr<OperatorProfile> ProfileOperators(const Model& model,
                                           const std::vector<NamedTensor>& inputs, int runs,
                                           const SessionOptions& options,
                                           const std::function<double()>& now_ms) {
  if (runs < 1) return InvalidArgument("runs must be >= 1; was " + std::to_string(runs));
  const Graph& graph = model.graph();
  std::vector<int> producer(graph.values.size(), -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (int v : graph.nodes[n].outputs)
      if (v >= 0) producer[v] = static_cast<int>(n);

  ASSIGN_OR_RETURN(auto session, Session::Create(model, options));
  std::vector<NamedTensor> outputs;
  RETURN_IF_ERROR(session->Run(inputs, &outputs));  // prepares the plan
  std::vector<Shape> shapes;
  for (const TensorInfo& info : model.inputs()) {
    for (const NamedTensor& in : inputs)
      if (in.name == info.name) shapes.push_back(in.tensor.shape());
  }

  const DynamicPrepareStats dynamic_before = session->dynamic_stats();
  std::vector<double> node_ms(graph.nodes.size(), 0);
  std::vector<char> ran(graph.nodes.size(), 0);
  double total_ms = 0;
  for (int r = 0; r < runs; ++r) {
    const double start = now_ms();
    double last = start;
    int last_node = -1;
    // Called for each graph input, then for each output of each step as it completes.
    // A step with several outputs is seen several times in a row: only its first
    // sighting ends its time.
    auto observer = [&](int value, const Tensor&) {
      const double now = now_ms();
      const int node = producer[static_cast<size_t>(value)];
      if (node < 0) {  // a graph input, seen just before the first step
        last = now;
        return;
      }
      if (node == last_node) return;
      node_ms[static_cast<size_t>(node)] += now - last;
      ran[static_cast<size_t>(node)] = 1;
      last = now;
      last_node = node;
    };
    RETURN_IF_ERROR(session->RunObserved(inputs, &outputs, observer));
    total_ms += now_ms() - start;
  }

  OperatorProfile profile;
  profile.runs = runs;
  profile.dynamic.prepares = session->dynamic_stats().prepares - dynamic_before.prepares;
  profile.dynamic.cache_hits = session->dynamic_stats().cache_hits - dynamic_before.cache_hits;
  ASSIGN_OR_RETURN(profile.threads, session->PlanThreads(shapes));
  std::map<std::string, OperatorTime> by_type;
  double steps_ms = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (!ran[n]) continue;
    const Node& node = graph.nodes[n];
    const std::string type = node.qualified_type();
    OperatorTime& t = by_type[type];
    t.op_type = type;
    ++t.nodes;
    t.ms_per_run += node_ms[n] / runs;
    steps_ms += node_ms[n] / runs;
  }
  for (auto& [type, t] : by_type) profile.operators.push_back(t);
  std::sort(profile.operators.begin(), profile.operators.end(),
            [](const OperatorTime& a, const OperatorTime& b) {
              return a.ms_per_run != b.ms_per_run ? a.ms_per_run > b.ms_per_run
                                                  : a.op_type < b.op_type;
            });
  profile.node_ms.resize(node_ms.size());
  for (size_t n = 0; n < node_ms.size(); ++n) profile.node_ms[n] = node_ms[n] / runs;
  profile.ms_per_run = total_ms / runs;
  profile.outside_ms_per_run = std::max(0.0, profile.ms_per_run - steps_ms);
  return profile;
}

}  // namespace shoal::engine
