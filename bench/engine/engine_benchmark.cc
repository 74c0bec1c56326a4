// Engine benchmark: shoal's ONNX engine on the models bench/engine/export_models.py writes
// (ResNet-50, MobileNetV2, BERT-base at sequence 128, VAE, MLP recommender), at batch 1
// and 8, one Session with THREADS threads. Each timed run repeats Session::Run until it
// lasts MIN_SECONDS; the figure is the median items/s over RUNS runs after warm-up.
// GFLOP/s uses the FLOPs per sample that `shoal inspect` estimates (engine/inspect.h).
// A model that fails to load or run is reported with the engine's error; the rest go on.
// bench/engine/run.sh runs this beside PyTorch and prints the ratios.
//
// Usage: engine_benchmark --dir DIR [--models a,b,...] [--threads 2] [--runs 5]
//                         [--min-seconds 0.5] [--json OUT.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/inspect.h"
#include "engine/model.h"

namespace fs = std::filesystem;
using namespace shoal;
using namespace shoal::engine;

namespace {

const int kBatches[] = {1, 8};

struct Options {
  std::string dir;
  std::vector<std::string> models = {"resnet50", "mobilenet_v2", "bert_base", "vae", "mlp"};
  int threads = 2;
  int runs = 5;
  double min_seconds = 0.5;
  std::string json;
};

struct Result {
  std::string model;
  int batch = 0;
  double items_per_s = 0;  // 0: failed
  std::string error;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '|', '/');
  return s;
}

// Estimated FLOPs per sample from InspectModel's report; 0 when unknown.
double FlopsPerSample(const std::string& path) {
  auto report = InspectModel(path);
  if (!report.ok()) return 0;
  const std::string key = "estimated FLOPs per sample: ";
  size_t at = report->find(key);
  if (at == std::string::npos) return 0;
  size_t open = report->find('(', at), close = report->find(')', at);
  if (open == std::string::npos || close == std::string::npos) return 0;
  return std::atof(report->substr(open + 1, close - open - 1).c_str());
}

// Random inputs at `batch`: floats ~ N(0, 1); integer inputs 1 (valid token / row ids and
// an all-ones attention mask); bools true.
StatusOr<std::vector<NamedTensor>> MakeInputs(const Model& model, int batch, std::mt19937& rng) {
  std::vector<NamedTensor> out;
  std::normal_distribution<float> normal;
  for (const TensorInfo& in : model.inputs()) {
    if (!in.rank_known) return InvalidArgument("input " + in.name + " has unknown rank");
    Shape shape;
    for (size_t i = 0; i < in.shape.size(); ++i) {
      const Dim& d = in.shape[i];
      if (d.known())
        shape.push_back(d.value);
      else if (i == 0)
        shape.push_back(batch);
      else
        return InvalidArgument("input " + in.name + " has a symbolic dimension other than batch");
    }
    Tensor t = Tensor::Allocate(in.dtype, shape);
    switch (in.dtype) {
      case DataType::kFp32:
        for (float& v : t.mutable_values<float>()) v = normal(rng);
        break;
      case DataType::kInt64:
        for (int64_t& v : t.mutable_values<int64_t>()) v = 1;
        break;
      case DataType::kInt32:
        for (int32_t& v : t.mutable_values<int32_t>()) v = 1;
        break;
      case DataType::kBool:
        for (bool& v : t.mutable_values<bool>()) v = true;
        break;
      default:
        return InvalidArgument("input " + in.name + ": unsupported dtype " +
                               std::string(DataTypeName(in.dtype)));
    }
    out.push_back({in.name, std::move(t)});
  }
  return out;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median items/s; 0 and `error` set on failure.
double TimeBatch(Session& session, const std::vector<NamedTensor>& inputs, int batch,
                 const Options& o, std::string* error) {
  std::vector<NamedTensor> outputs;
  auto run = [&]() -> bool {
    outputs.clear();
    Status s = session.Run(inputs, &outputs);
    if (!s.ok()) *error = s.ToString();
    return s.ok();
  };
  if (!run() || !run()) return 0;  // warm-up: the first run prepares the plan
  auto t0 = std::chrono::steady_clock::now();
  if (!run()) return 0;
  double per_call = std::max(Seconds(t0, std::chrono::steady_clock::now()), 1e-6);
  int iters = std::max(1, static_cast<int>(o.min_seconds / per_call + 0.999));
  std::vector<double> rates;
  for (int r = 0; r < o.runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      if (!run()) return 0;
    rates.push_back(batch * iters / Seconds(start, std::chrono::steady_clock::now()));
  }
  std::sort(rates.begin(), rates.end());
  size_t n = rates.size();
  return n % 2 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
}

std::vector<Result> BenchModel(const std::string& name, const Options& o, double* flops) {
  std::vector<Result> results;
  auto fail_all = [&](const std::string& error) {
    for (int b : kBatches) results.push_back({name, b, 0, error});
    return results;
  };
  const std::string path = (fs::path(o.dir) / (name + ".onnx")).string();
  if (!fs::exists(path)) return fail_all("missing " + path);
  try {
    auto load_start = std::chrono::steady_clock::now();
    auto model = Model::Load(path);
    if (!model.ok()) return fail_all("load: " + model.status().ToString());
    double load_s = Seconds(load_start, std::chrono::steady_clock::now());
    *flops = FlopsPerSample(path);
    SessionOptions session_options;
    session_options.threads = o.threads;
    auto session = Session::Create(**model, session_options);
    if (!session.ok()) return fail_all("session: " + session.status().ToString());
    std::fprintf(stderr, "%s: loaded in %.1f s, %.3g GFLOP per sample\n", name.c_str(), load_s,
                 *flops / 1e9);
    std::mt19937 rng(1234);
    for (int b : kBatches) {
      Result r{name, b, 0, ""};
      auto inputs = MakeInputs(**model, b, rng);
      if (!inputs.ok())
        r.error = inputs.status().ToString();
      else
        r.items_per_s = TimeBatch(**session, *inputs, b, o, &r.error);
      if (r.items_per_s == 0 && r.error.empty()) r.error = "no figure";
      std::fprintf(
          stderr, "%s: batch %d: shoal %s\n", name.c_str(), b,
          r.error.empty() ? (std::to_string(r.items_per_s) + " items/s").c_str() : r.error.c_str());
      results.push_back(r);
    }
  } catch (const std::exception& e) {
    if (results.empty()) return fail_all(std::string("exception: ") + e.what());
    for (int b : kBatches)
      if (std::none_of(results.begin(), results.end(),
                       [&](const Result& r) { return r.batch == b; }))
        results.push_back({name, b, 0, std::string("exception: ") + e.what()});
  }
  return results;
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: engine_benchmark --dir DIR [--models a,b,...] [--threads N] [--runs N] "
               "[--min-seconds S] [--json OUT.json]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) Usage();
    std::string v = argv[++i];
    if (a == "--dir")
      o.dir = v;
    else if (a == "--models")
      o.models = Split(v);
    else if (a == "--threads")
      o.threads = std::atoi(v.c_str());
    else if (a == "--runs")
      o.runs = std::max(1, std::atoi(v.c_str()));
    else if (a == "--min-seconds")
      o.min_seconds = std::atof(v.c_str());
    else if (a == "--json")
      o.json = v;
    else
      Usage();
  }
  if (o.dir.empty()) Usage();

  std::vector<Result> all;
  std::vector<std::pair<std::string, double>> flops;
  for (const std::string& name : o.models) {
    double f = 0;
    auto r = BenchModel(name, o, &f);
    flops.push_back({name, f});
    all.insert(all.end(), r.begin(), r.end());
  }

  std::printf("| model | batch | shoal items/s | shoal GFLOP/s |\n|---|---|---|---|\n");
  for (const Result& r : all) {
    double f = 0;
    for (const auto& [n, v] : flops)
      if (n == r.model) f = v;
    if (!r.error.empty())
      std::printf("| %s | %d | failed: %s | |\n", r.model.c_str(), r.batch,
                  OneLine(r.error).c_str());
    else if (f > 0)
      std::printf("| %s | %d | %.2f | %.1f |\n", r.model.c_str(), r.batch, r.items_per_s,
                  r.items_per_s * f / 1e9);
    else
      std::printf("| %s | %d | %.2f | ? |\n", r.model.c_str(), r.batch, r.items_per_s);
  }

  if (!o.json.empty()) {
    std::ofstream j(o.json);
    j << "{\"threads\": " << o.threads << ", \"results\": [";
    for (size_t i = 0; i < all.size(); ++i) {
      const Result& r = all[i];
      double f = 0;
      for (const auto& [n, v] : flops)
        if (n == r.model) f = v;
      j << (i ? ",\n  " : "\n  ") << "{\"model\": \"" << JsonEscape(r.model)
        << "\", \"batch\": " << r.batch << ", \"items_per_s\": " << r.items_per_s
        << ", \"flops_per_item\": " << f << ", \"error\": \"" << JsonEscape(r.error) << "\"}";
    }
    j << "\n]}\n";
  }
  return 0;
}
