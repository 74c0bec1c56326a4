// Data-dependent steps benchmark: what caching their run-time preparation saves
// (plan.h, PlanLimits::dynamic_cache_entries; issue 21).
//
//   dynamic_prepare_benchmark
//
// A detection-style tail built in code: scores [64] select rows by NonZero(scores > t),
// Gather picks those rows of features [64, 256], then MatMul 256x256, Relu, MatMul
// 256x64. Every step after NonZero is prepared at run time (its shapes depend on the
// data), oneDNN primitives included. The same model is loaded twice, with the cache off
// (every run prepares, as before the cache) and on (default entries), and run on one
// thread, interleaved over ROUNDS rounds of REPS runs each: with the same selection every
// run, and with the selection cycling through three counts (all cached after the first
// pass). Prints the median per-run time of each and the ratio, side by side.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/model.h"

using namespace shoal;
using namespace shoal::engine;

namespace {

constexpr int kRounds = 11;
constexpr int kReps = 100;
constexpr int64_t kRows = 64, kFeatures = 256, kHidden = 256, kOut = 64;

Tensor RandomTensor(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t = Tensor::Allocate(DataType::kFp32, shape);
  for (float& x : t.mutable_values<float>()) x = u(rng);
  return t;
}

// Appends a node of `op` reading `inputs`; returns its output value.
int AddNode(Graph& g, const std::string& op, const std::string& out, std::vector<int> inputs,
            std::map<std::string, Attribute> attrs = {}) {
  Node node;
  node.op_type = op;
  node.name = out;
  node.inputs = std::move(inputs);
  for (auto& [k, a] : attrs) node.attributes.emplace(k, std::move(a));
  const int v = g.AddValue(out);
  g.values[v].producer = static_cast<int>(g.nodes.size());
  node.outputs.push_back(v);
  g.nodes.push_back(std::move(node));
  return v;
}

int AddConstant(Graph& g, const std::string& name, Tensor t) {
  const int v = g.AddValue(name, t.dtype());
  g.values[v].shape = KnownShape(t.shape());
  g.values[v].constant = std::move(t);
  return v;
}

Graph BuildTail() {
  Graph g;
  g.opset = 17;
  const int scores = g.AddValue("scores", DataType::kFp32);
  g.values[scores].shape = KnownShape({kRows});
  const int features = g.AddValue("features", DataType::kFp32);
  g.values[features].shape = KnownShape({kRows, kFeatures});
  g.inputs = {scores, features};
  Tensor t = Tensor::Allocate(DataType::kFp32, {});
  t.mutable_values<float>()[0] = 0.f;
  const int keep = AddNode(g, "Greater", "keep", {scores, AddConstant(g, "t", std::move(t))});
  const int nz = AddNode(g, "NonZero", "nz", {keep});
  Tensor flat = Tensor::Allocate(DataType::kInt64, {1});
  flat.mutable_values<int64_t>()[0] = -1;
  const int rows = AddNode(g, "Reshape", "rows", {nz, AddConstant(g, "flat", std::move(flat))});
  Attribute axis;
  axis.kind = Attribute::Kind::kInt;
  axis.i = 0;
  const int picked = AddNode(g, "Gather", "picked", {features, rows}, {{"axis", axis}});
  const int h = AddNode(g, "MatMul", "h",
                        {picked, AddConstant(g, "w1", RandomTensor({kFeatures, kHidden}, 1))});
  const int r = AddNode(g, "Relu", "r", {h});
  const int y =
      AddNode(g, "MatMul", "y", {r, AddConstant(g, "w2", RandomTensor({kHidden, kOut}, 2))});
  g.outputs = {y};
  return g;
}

// Scores with the first `selected` rows above the threshold.
Tensor Scores(int selected) {
  Tensor s = Tensor::Allocate(DataType::kFp32, {kRows});
  auto v = s.mutable_values<float>();
  for (int64_t i = 0; i < kRows; ++i) v[i] = i < selected ? 1.f : -1.f;
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Subject {
  std::unique_ptr<Model> model;
  std::unique_ptr<Session> session;
};

bool Load(int entries, Subject* s) {
  LoadOptions load;
  load.limits.dynamic_cache_entries = entries;
  auto model = Model::FromGraph(BuildTail(), load);
  if (!model.ok()) {
    std::printf("load failed: %s\n", model.status().ToString().c_str());
    return false;
  }
  s->model = std::move(model).value();
  SessionOptions so;
  so.threads = 1;
  auto session = Session::Create(*s->model, so);
  if (!session.ok()) return false;
  s->session = std::move(session).value();
  return true;
}

// Median µs of one run over REPS runs cycling through `counts`.
double TimeRuns(Session& session, const std::vector<std::vector<NamedTensor>>& inputs) {
  std::vector<NamedTensor> out;
  std::vector<double> us;
  for (int i = 0; i < kReps; ++i) {
    const auto& in = inputs[static_cast<size_t>(i) % inputs.size()];
    const auto a = std::chrono::steady_clock::now();
    if (!session.Run(in, &out).ok()) return -1;
    const auto b = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  return Median(us);
}

}  // namespace

int main() {
  Subject off, on;
  if (!Load(0, &off) || !Load(PlanLimits().dynamic_cache_entries, &on)) return 1;
  const Tensor features = RandomTensor({kRows, kFeatures}, 3);
  auto inputs = [&](std::vector<int> counts) {
    std::vector<std::vector<NamedTensor>> all;
    for (int c : counts) all.push_back({{"scores", Scores(c)}, {"features", features}});
    return all;
  };
  struct Case {
    const char* name;
    std::vector<std::vector<NamedTensor>> inputs;
  };
  const std::vector<Case> cases = {{"same selection (12 rows)", inputs({12})},
                                   {"cycling 4, 12, 24 rows", inputs({4, 12, 24})}};
  std::printf(
      "data-dependent tail: NonZero -> Gather -> MatMul %lldx%lld -> Relu -> MatMul "
      "%lldx%lld, one thread, median of %d rounds x %d runs\n",
      static_cast<long long>(kFeatures), static_cast<long long>(kHidden),
      static_cast<long long>(kHidden), static_cast<long long>(kOut), kRounds, kReps);
  std::printf("%-28s %16s %16s %8s %22s\n", "case", "prepared us/run", "cached us/run", "ratio",
              "cached: prepares/hits");
  for (const Case& c : cases) {
    std::vector<double> a, b;
    TimeRuns(*off.session, c.inputs);  // warm-up: plans and caches filled
    TimeRuns(*on.session, c.inputs);
    const DynamicPrepareStats before = on.session->dynamic_stats();
    for (int r = 0; r < kRounds; ++r) {
      a.push_back(TimeRuns(*off.session, c.inputs));
      b.push_back(TimeRuns(*on.session, c.inputs));
    }
    const DynamicPrepareStats after = on.session->dynamic_stats();
    const double ma = Median(a), mb = Median(b);
    char counts[64];
    std::snprintf(counts, sizeof counts, "%lld/%lld",
                  static_cast<long long>(after.prepares - before.prepares),
                  static_cast<long long>(after.cache_hits - before.cache_hits));
    std::printf("%-28s %16.1f %16.1f %7.2fx %22s\n", c.name, ma, mb, mb > 0 ? ma / mb : 0.0,
                counts);
  }
  return 0;
}
