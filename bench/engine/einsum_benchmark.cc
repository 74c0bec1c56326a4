// Einsum benchmark: what rewriting a product written as an Einsum into a MatMul saves
// (einsum_rewrite.h) against the Einsum kernel's loop over every label assignment.
//
//   einsum_benchmark
//
// Four Einsums at BERT-base's sizes, each a one-node model built in code: attention's
// scores "bhqd,bhkd->bhqk" and its weighted sum "bhqk,bhkd->bhqd" (batch 1, 12 heads,
// 128 tokens, 64 per head), a 768x768 weight applied to the last axis, "bsd,de->bse"
// (128 tokens), and the heads merged by the output projection, "bhnd,hde->bne" (two
// contraction labels); the weights are constants. Each is loaded twice: with the
// optimiser's fusions off (the Einsum kernel, as before the rewrite) and on (the
// rewrite, then the usual product fusions). Both run on one thread, interleaved over
// ROUNDS rounds; each side runs for at least 0.2 s per round. Prints the median time
// per run of each side, their ratio, and the largest difference of their outputs
// against the output's largest magnitude.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/model.h"

using namespace shoal;
using namespace shoal::engine;

namespace {

constexpr int kRounds = 5;
constexpr double kMinRoundSeconds = 0.2;

Tensor RandomTensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor t = Tensor::Allocate(DataType::kFp32, shape);
  for (float& x : t.mutable_values<float>()) x = u(rng);
  return t;
}

struct Case {
  const char* what;
  const char* equation;
  Shape a, b;
  bool constant_b;
};

Graph Build(const Case& c) {
  Graph g;
  g.opset = 17;
  const int a = g.AddValue("a", DataType::kFp32);
  g.values[a].shape = KnownShape(c.a);
  g.inputs = {a};
  const int b = g.AddValue("b", DataType::kFp32);
  g.values[b].shape = KnownShape(c.b);
  if (c.constant_b) {
    g.values[b].constant = RandomTensor(c.b, 2);
  } else {
    g.inputs.push_back(b);
  }
  Node node;
  node.op_type = "Einsum";
  node.name = "y";
  node.inputs = {a, b};
  Attribute eq;
  eq.kind = Attribute::Kind::kString;
  eq.s = c.equation;
  node.attributes["equation"] = eq;
  const int y = g.AddValue("y");
  g.values[y].producer = 0;
  node.outputs = {y};
  g.nodes.push_back(std::move(node));
  g.outputs = {y};
  return g;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Side {
  std::unique_ptr<Model> model;
  std::unique_ptr<Session> session;
  std::vector<double> us;  // per round: the mean time per run
  Tensor out;
};

bool Load(const Case& c, bool rewrite, Side* s) {
  LoadOptions load;
  load.optimize.fuse = rewrite;
  auto model = Model::FromGraph(Build(c), load);
  if (!model.ok()) {
    std::printf("%s: load failed: %s\n", c.what, model.status().ToString().c_str());
    return false;
  }
  s->model = std::move(model).value();
  SessionOptions so;
  so.threads = 1;
  auto session = Session::Create(*s->model, so);
  if (!session.ok()) {
    std::printf("%s: %s\n", c.what, session.status().ToString().c_str());
    return false;
  }
  s->session = std::move(session).value();
  return true;
}

// Runs until kMinRoundSeconds have passed; returns the mean µs per run.
double Round(Side& s, const std::vector<NamedTensor>& in) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int runs = 0;
  double elapsed = 0;
  std::vector<NamedTensor> out;
  do {
    if (!s.session->Run(in, &out).ok()) return -1;
    ++runs;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < kMinRoundSeconds);
  s.out = out[0].tensor;
  return elapsed * 1e6 / runs;
}

}  // namespace

int main() {
  const Case cases[] = {
      {"attention scores", "bhqd,bhkd->bhqk", {1, 12, 128, 64}, {1, 12, 128, 64}, false},
      {"attention weighted sum", "bhqk,bhkd->bhqd", {1, 12, 128, 128}, {1, 12, 128, 64}, false},
      {"weight on the last axis", "bsd,de->bse", {1, 128, 768}, {768, 768}, true},
      {"heads merged by a weight", "bhnd,hde->bne", {1, 12, 128, 64}, {12, 64, 768}, true},
  };
  std::printf("%-24s %-16s %14s %14s %8s %12s  %s\n", "einsum", "equation", "kernel us",
              "rewritten us", "ratio", "max diff", "rewritten graph");
  for (const Case& c : cases) {
    Side loop, product;
    if (!Load(c, false, &loop) || !Load(c, true, &product)) return 1;
    std::vector<NamedTensor> in = {{"a", RandomTensor(c.a, 1)}};
    if (!c.constant_b) in.push_back({"b", RandomTensor(c.b, 2)});
    for (int r = 0; r < kRounds; ++r) {
      loop.us.push_back(Round(loop, in));
      product.us.push_back(Round(product, in));
    }
    float diff = 0, scale = 0;
    for (int64_t i = 0; i < loop.out.element_count(); ++i) {
      diff =
          std::max(diff, std::fabs(loop.out.values<float>()[i] - product.out.values<float>()[i]));
      scale = std::max(scale, std::fabs(loop.out.values<float>()[i]));
    }
    const double l = Median(loop.us), p = Median(product.us);
    std::printf("%-24s %-16s %14.1f %14.1f %7.1fx %12.2g  %s\n", c.what, c.equation, l, p, l / p,
                scale > 0 ? diff / scale : diff,
                product.model->optimize_report().Summary().c_str());
  }
  return 0;
}
