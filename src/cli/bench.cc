#include "cli/bench.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "loadgen/bench.h"
#include "loadgen/options.h"

namespace shoal::cli {
namespace {

struct BenchFlags {
  loadgen::BenchOptions options;
  std::string protocol = "http";
  std::vector<std::string> shapes;
  std::string concurrency_range;
  std::string request_rate_range;
  std::string distribution = "constant";
  std::optional<double> percentile;  // unset: the average
};

// Stores a parsed flag value in `*out`, or prints the parse error and returns false.
template <typename T>
bool Parsed(StatusOr<T> value, T* out) {
  if (!value.ok()) {
    std::fprintf(stderr, "shoal bench: %s\n", value.status().message().c_str());
    return false;
  }
  *out = std::move(value).value();
  return true;
}

int Bench(BenchFlags& f) {
  loadgen::BenchOptions& o = f.options;
  o.protocol = f.protocol == "grpc" ? loadgen::Protocol::kGrpc : loadgen::Protocol::kHttp;
  o.distribution = f.distribution == "poisson" ? loadgen::Distribution::kPoisson
                   : f.distribution == "burst" ? loadgen::Distribution::kBurst
                                               : loadgen::Distribution::kConstant;
  o.percentile = f.percentile;
  for (const std::string& s : f.shapes) {
    loadgen::ShapeOverride shape;
    if (!Parsed(loadgen::ParseShape(s), &shape)) return 1;
    o.shapes.push_back(std::move(shape));
  }
  if (!f.concurrency_range.empty() &&
      !Parsed(loadgen::ParseIntRange(f.concurrency_range), &o.concurrency)) {
    return 1;
  }
  if (!f.request_rate_range.empty() &&
      !Parsed(loadgen::ParseRateRange(f.request_rate_range), &o.request_rates)) {
    return 1;
  }
  return loadgen::RunBench(o, stdout, stderr);
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  loadgen::BenchOptions& o = f->options;
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Load-test a model on a running server over HTTP or gRPC (perf_analyzer's options): "
      "throughput, latency percentiles, goodput, errors, server queue/compute split");
  bench->add_option("-m,--model", o.model, "Model name")->required();
  bench->add_option("-x,--model-version", o.model_version, "Model version (-1: the latest)")
      ->capture_default_str();
  bench->add_option("-u,--url", o.url,
                    "Server HOST:PORT (default localhost:8000 for http, localhost:8001 for grpc)");
  bench->add_option("-i,--protocol", f->protocol, "http or grpc")
      ->capture_default_str()
      ->check(CLI::IsMember({"http", "grpc"}));
  bench->add_option("-b,--batch-size", o.batch_size, "Batch size of each request")
      ->capture_default_str();
  bench->add_option("--shape", f->shapes,
                    "NAME:D1,D2,... an input's dims without the batch axis (needed for -1 dims; "
                    "repeatable)");
  bench
      ->add_option("--input-data", o.input_data,
                   "random, zero, or a JSON file {\"data\":[{\"NAME\":[values...]},...]} "
                   "(one batch element per entry)")
      ->capture_default_str();
  bench->add_option("--concurrency-range", f->concurrency_range,
                    "START[:END[:STEP]] closed loop: requests kept outstanding (default 1)");
  bench->add_option("--request-rate-range", f->request_rate_range,
                    "START[:END[:STEP]] open loop: requests per second");
  bench
      ->add_option("--request-distribution", f->distribution,
                   "Open loop send times: constant, poisson, or burst (on/off: Poisson at "
                   "rate / on-fraction for the first on-fraction of every period, then silence)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "poisson", "burst"}));
  bench
      ->add_option("--burst-period-ms", o.burst_period_ms,
                   "burst: the period of the on/off pattern, ms")
      ->capture_default_str();
  bench
      ->add_option("--burst-on-fraction", o.burst_on_fraction,
                   "burst: the share of each period that sends, (0, 1]")
      ->capture_default_str();
  bench
      ->add_option("-p,--measurement-interval", o.measurement_interval_ms,
                   "One measurement window, ms")
      ->capture_default_str();
  bench->add_option("--warmup", o.warmup_ms, "Load before the first window, not measured (ms)")
      ->capture_default_str();
  bench
      ->add_option("--max-trials", o.max_trials,
                   "Most windows per load level before giving up on stability")
      ->capture_default_str();
  bench
      ->add_option("-s,--stability-percentage", o.stability_percentage,
                   "Windows agree when within this % of their mean (throughput and latency)")
      ->capture_default_str();
  bench->add_option("--percentile", f->percentile,
                    "Latency percentile for stability and the latency column (default: average)");
  bench
      ->add_option("-l,--latency-threshold", o.latency_threshold_ms,
                   "SLO in ms: goodput counts requests within it (0: none)")
      ->capture_default_str();
  bench
      ->add_option("--max-inflight", o.max_inflight,
                   "Open loop: most requests in flight (HTTP connections)")
      ->capture_default_str();
  bench
      ->add_option("--late-threshold-us", o.late_threshold_us,
                   "Open loop: a send this far behind schedule counts as late")
      ->capture_default_str();
  bench->add_option("--seed", o.seed, "Seed of random input data and Poisson arrivals")
      ->capture_default_str();
  bench->add_option("-f,--latency-report-file", o.csv_file, "Write the results as CSV");
  bench->add_option("--json", o.json_file, "Write the results as JSON");
  bench->add_option("--svg", o.svg_file, "Plot latency (p50, p99) against throughput as SVG");
  bench->callback([f] { std::exit(Bench(*f)); });
}

}  // namespace shoal::cli
