// StepReport: the figures of one load level, summarised from the driver's windows, and
// the writers for every output shoal bench produces: the Markdown-style table on stdout,
// CSV (-f), JSON (--json) and an SVG latency-vs-throughput plot (--svg).
//
// A step's figures come from its last three windows merged (all of them when fewer ran),
// as perf_analyzer reports its stable windows. Latencies are in microseconds; rates are
// per second of window time. Server figures are means per request over the same windows,
// from the difference of the statistics taken at their boundaries.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/driver.h"

namespace shoal::loadgen {

struct StepReport {
  bool open_loop = false;
  double load = 0;  // concurrency, or offered requests/s
  int64_t windows = 0;
  bool stable = false;
  double duration_s = 0;

  int64_t requests = 0;  // successful
  double requests_per_s = 0;
  double inferences_per_s = 0;  // requests_per_s * batch size
  double goodput_per_s = 0;     // successful requests within the SLO, per second
  double latency_avg_us = 0;
  double latency_p50_us = 0;
  double latency_p90_us = 0;
  double latency_p95_us = 0;
  double latency_p99_us = 0;
  double latency_p999_us = 0;
  double latency_max_us = 0;
  double latency_us = 0;  // the --percentile (or the average): the "latency" column

  std::map<std::string, int64_t> errors;
  int64_t errors_total = 0;
  // How fast the errors of each code were answered (a refusal's 429 should be at once).
  struct ErrorLatency {
    double p50_us = 0;
    double p99_us = 0;
    double max_us = 0;
  };
  std::map<std::string, ErrorLatency> error_latency;
  // The same from the actual send, without the client's lag behind its schedule.
  std::map<std::string, ErrorLatency> error_latency_from_send;
  double latency_from_send_p50_us = 0;
  double latency_from_send_p99_us = 0;
  double latency_from_send_p999_us = 0;
  double goodput_from_send_per_s = 0;  // within the SLO when timed from the actual send
  // Open loop: how far behind schedule requests were sent.
  double send_lag_p50_us = 0;
  double send_lag_p99_us = 0;
  int64_t sent = 0;
  int64_t late_sends = 0;
  int64_t capacity_waits = 0;
  double max_send_lag_us = 0;
  int64_t undrained = 0;

  double client_cpu_us_per_request = 0;  // this process's CPU time / requests completed

  std::optional<ServerStats> server;  // the difference over the windows
  double server_queue_us = 0;
  double server_compute_input_us = 0;
  double server_compute_infer_us = 0;
  double server_compute_output_us = 0;
  double server_batch_size = 0;  // inference_count / execution_count
};

struct ReportContext {
  std::string model;
  std::string protocol;  // "http" / "grpc"
  std::string url;
  int64_t batch_size = 1;
  std::optional<double> percentile;
  double latency_threshold_ms = 0;
  int64_t measurement_interval_ms = 0;
};

StepReport Summarize(const StepResult& step, const ReportContext& context);

// The name of the latency column: "p95 latency" or "avg latency".
std::string LatencyColumnName(const std::optional<double>& percentile);
std::string FormatTable(const std::vector<StepReport>& steps, const ReportContext& context);
std::string FormatCsv(const std::vector<StepReport>& steps, const ReportContext& context);
std::string FormatJson(const std::vector<StepReport>& steps, const ReportContext& context);
// Latency (ms, p50 and p99 lines) against throughput (inferences/s), one point per step.
std::string FormatSvg(const std::vector<StepReport>& steps, const ReportContext& context);

}  // namespace shoal::loadgen
