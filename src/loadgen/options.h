// BenchOptions: what `shoal bench` was asked to do, and the parsers for the option
// values that have a syntax of their own (shapes, ranges, host:port). The names follow
// Triton's perf_analyzer so its users feel at home; src/cli/bench.cc maps flags here.
//
// ValidateBenchOptions rejects contradictory or out-of-range values with a message that
// names the value; it never rewrites them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace shoal::loadgen {

enum class Protocol { kHttp, kGrpc };
// kBurst: on/off. Each burst_period_ms starts with an "on" part of burst_on_fraction of
// it, with Poisson arrivals at rate / burst_on_fraction, then sends nothing for the rest:
// the same mean rate, delivered in bursts.
enum class Distribution { kConstant, kPoisson, kBurst };

// --shape NAME:D1,D2,...: the dims of one input, without the batch axis.
struct ShapeOverride {
  std::string name;
  std::vector<int64_t> dims;
};

struct HostPort {
  std::string host;
  int port = 0;
};

struct BenchOptions {
  std::string model;
  int64_t model_version = -1;  // -1: the server's latest
  Protocol protocol = Protocol::kHttp;
  // HOST:PORT; empty means localhost:8000 (HTTP) or localhost:8001 (gRPC).
  std::string url;
  // Inputs per request along the batch axis (>= 1; > 1 needs a model that batches).
  int64_t batch_size = 1;
  std::vector<ShapeOverride> shapes;
  // "random", "zero", or the path of a JSON file (see input_data.h).
  std::string input_data = "random";
  // Exactly one of these is non-empty after ValidateBenchOptions: closed-loop
  // concurrencies (outstanding requests), or open-loop rates (requests/s).
  std::vector<int64_t> concurrency;
  std::vector<double> request_rates;
  Distribution distribution = Distribution::kConstant;
  int64_t burst_period_ms = 2000;   // kBurst: the period of the on/off pattern, > 0
  double burst_on_fraction = 0.25;  // kBurst: the share of each period that sends, (0, 1]
  // One measurement window, ms (default 5000). Windows repeat until the last three agree
  // within stability_percentage (throughput and latency), or max_trials windows ran.
  int64_t measurement_interval_ms = 5000;
  int64_t warmup_ms = 1000;  // load before the first window, not measured
  double stability_percentage = 10;
  int64_t max_trials = 10;
  // The latency percentile that drives stability and the "latency" column; unset: the
  // average, as in perf_analyzer.
  std::optional<double> percentile;
  // SLO in ms for goodput (requests/s completing within it); 0: none.
  double latency_threshold_ms = 0;
  // Open loop: the most requests in flight (HTTP: connections). A send that finds none
  // free waits, is counted late, and its latency still runs from its scheduled time.
  int64_t max_inflight = 256;
  // Open loop: a send later than this behind its schedule counts as late (µs).
  int64_t late_threshold_us = 1000;
  uint64_t seed = 1;  // random input data and Poisson arrivals
  std::string csv_file;
  std::string json_file;
  std::string svg_file;
};

// "image:1,8,8" -> {"image", {1, 8, 8}}. Dims must be positive integers.
StatusOr<ShapeOverride> ParseShape(std::string_view text);
// "START[:END[:STEP]]", END inclusive, STEP defaults to 1. Values > 0, END >= START.
StatusOr<std::vector<int64_t>> ParseIntRange(std::string_view text);
StatusOr<std::vector<double>> ParseRateRange(std::string_view text);
// "host:port" or "[v6addr]:port"; a missing port takes default_port.
StatusOr<HostPort> ParseHostPort(std::string_view text, int default_port);

// Checks the options; fills the default concurrency (1) when no range was given.
Status ValidateBenchOptions(BenchOptions* options);

}  // namespace shoal::loadgen
