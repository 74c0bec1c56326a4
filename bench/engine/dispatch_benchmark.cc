// Dispatch benchmark: what the engine spends outside its kernels on small models at
// batch 1, where per-operator overhead dominates (issue 21, small-model latency).
//
//   dispatch_benchmark [MODEL.onnx ...]   (default: the example digits CNN and
//                                          recommender MLP, run from the repository root)
//
// Per model, on one thread, fp32, batch 1 (random inputs; int64 inputs are zeros):
// - run: the median time of one Session::Run over ROUNDS rounds of REPS runs each;
// - alone: the sum over the plan's steps of each step's kernel run by itself
//   (Session::TimeStepsAlone: median of REPS back-to-back runs, its inputs warm), the
//   closest the engine gets to the primitives' standalone times;
// - per-op overhead: (run - alone) / steps, and the ratio run / alone.
// Both are measured in the same rounds, interleaved, so the machine's drift between
// minutes cancels in the ratio; each figure is the median over the rounds.
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

constexpr int kRounds = 15;
constexpr int kReps = 200;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<NamedTensor> RandomInputs(const Model& model) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<NamedTensor> out;
  for (const TensorInfo& in : model.inputs()) {
    Shape s;
    for (size_t d = 0; d < in.shape.size(); ++d)
      s.push_back(in.shape[d].known() ? in.shape[d].value : 1);
    Tensor t = Tensor::Allocate(in.dtype, s);
    if (in.dtype == DataType::kFp32)
      for (float& x : t.mutable_values<float>()) x = u(rng);
    out.push_back({in.name, std::move(t)});
  }
  return out;
}

int Bench(const std::string& path) {
  auto model = Model::Load(path);
  if (!model.ok()) {
    std::printf("%-40s load failed: %s\n", path.c_str(), model.status().ToString().c_str());
    return 1;
  }
  SessionOptions so;
  so.threads = 1;
  auto session = Session::Create(**model, so);
  if (!session.ok()) return 1;
  const auto inputs = RandomInputs(**model);
  std::vector<NamedTensor> outputs;
  for (int i = 0; i < 50; ++i)
    if (!(*session)->Run(inputs, &outputs).ok()) {
      std::printf("%-40s run failed\n", path.c_str());
      return 1;
    }
  std::vector<double> run_us, alone_us, ratio;
  size_t steps = 0;
  for (int r = 0; r < kRounds; ++r) {
    std::vector<double> one;
    for (int i = 0; i < kReps; ++i) {
      const auto a = std::chrono::steady_clock::now();
      (void)(*session)->Run(inputs, &outputs);
      const auto b = std::chrono::steady_clock::now();
      one.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    auto alone = (*session)->TimeStepsAlone(inputs, kReps);
    if (!alone.ok()) {
      std::printf("%-40s %s\n", path.c_str(), alone.status().ToString().c_str());
      return 1;
    }
    double sum = 0;
    for (double ms : *alone) sum += ms * 1000;
    steps = alone->size();
    run_us.push_back(Median(one));
    alone_us.push_back(sum);
    ratio.push_back(Median(one) / sum);
  }
  const double run = Median(run_us), alone = Median(alone_us);
  std::printf("%-40s %6zu %10.1f %10.1f %12.2f %8.2fx\n", path.c_str(), steps, run, alone,
              steps ? (run - alone) / static_cast<double>(steps) : 0.0, Median(ratio));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) models.push_back(argv[i]);
  if (models.empty())
    models = {"examples/models/digits/1/model.onnx", "examples/models/recommender/1/model.onnx"};
  std::printf("batch 1, fp32, 1 thread; medians over %d rounds of %d runs\n", kRounds, kReps);
  std::printf("%-40s %6s %10s %10s %12s %9s\n", "model", "steps", "run us", "alone us",
              "overhead/op", "run/alone");
  int rc = 0;
  for (const std::string& m : models) rc |= Bench(m);
  return rc;
}
