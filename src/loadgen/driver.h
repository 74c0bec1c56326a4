// RunStep: drives one load level (one concurrency, or one request rate) through a
// Transport and measures it in windows, like one step of perf_analyzer.
//
// Closed loop (concurrency N): N requests are always outstanding; each completion starts
// the next at once. Latency runs from the actual send.
// Open loop (rate R): sends follow an ArrivalSchedule. Latency runs from each request's
// *scheduled* send time, so a stalled client or server cannot hide the requests it
// delayed (no coordinated omission). Beside it each window keeps the time from the
// actual send and each send's lag behind its schedule, so what the client's own lateness
// added can be told apart from what the server took. A send that happens more than
// late_threshold_ns after its schedule counts as late; one that finds capacity() requests in flight
// waits in a backlog (counted too) and is sent as soon as a request finishes.
//
// Timeline: warmup_ns of load, unmeasured; then windows of window_ns. Each completion is
// counted in the window its reply arrived in. After each window from the third on, the
// last three are compared: when their throughputs and latencies (the percentile, or the
// average) all lie within stability_percentage of their mean, the step is stable and
// stops; otherwise it stops after max_windows. Then sending stops and the requests in
// flight are drained (not counted), so the transport is idle for the next step.
//
// The sampler is called at every window boundary (and at the first window's start) on
// the driver's thread; the report uses it for CPU time and server statistics deltas.
//
// Single-threaded: everything runs on the caller's thread, which waits only inside
// Transport::Wait. The clock is injected; with a FakeClock the fake transport moves it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "loadgen/histogram.h"
#include "loadgen/options.h"
#include "loadgen/server_stats.h"
#include "loadgen/transport.h"

namespace shoal::loadgen {

struct StepConfig {
  bool open_loop = false;
  int64_t concurrency = 1;  // closed loop: requests outstanding (<= transport capacity)
  double rate_per_s = 0;    // open loop: requests per second (> 0)
  Distribution distribution = Distribution::kConstant;
  int64_t burst_period_ns = 2'000'000'000;  // kBurst (options.h)
  double burst_on_fraction = 0.25;
  uint64_t seed = 1;
  int64_t warmup_ns = 0;
  int64_t window_ns = 5'000'000'000;
  int64_t min_windows = 3;
  int64_t max_windows = 10;
  double stability_percentage = 10;
  std::optional<double> percentile;  // unset: the average latency drives stability
  int64_t late_threshold_ns = 1'000'000;
  size_t payload_count = 1;  // payloads are used round-robin
  int64_t drain_timeout_ns = 30'000'000'000;
};

// What the sampler reports at a window boundary.
struct Sample {
  int64_t cpu_ns = 0;  // this process's user + system CPU time
  std::optional<ServerStats> server;
};
using Sampler = std::function<Sample()>;

struct Window {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  Histogram latency_ns;
  // How long the requests answered with an error took, by Transport::CodeName: a 429
  // refusal should be fast, a 504 comes after a wait.
  std::map<std::string, Histogram> error_latency_ns;
  // The same, from each request's actual send rather than its schedule (closed loop: the
  // two are equal): the server and the network without the client's own lag.
  Histogram latency_from_send_ns;
  std::map<std::string, Histogram> error_latency_from_send_ns;
  // Open loop: how far behind its schedule each request was sent.
  Histogram send_lag_ns;
  int64_t ok = 0;
  std::map<std::string, int64_t> errors;  // by Transport::CodeName
  int64_t sent = 0;
  int64_t late_sends = 0;      // open loop: sent > late_threshold_ns behind schedule
  int64_t capacity_waits = 0;  // open loop: sends that found no free slot
  int64_t max_send_lag_ns = 0;
  Sample start_sample;
  Sample end_sample;

  int64_t errors_total() const;
  double duration_s() const { return static_cast<double>(end_ns - start_ns) / 1e9; }
};

struct StepResult {
  StepConfig config;
  std::vector<Window> windows;  // every measured window, in order
  bool stable = false;
  int64_t undrained = 0;  // requests still in flight when the drain timed out
  Status status;          // a transport failure that stopped the step early
};

StepResult RunStep(Transport& transport, const Clock& clock, const StepConfig& config,
                   const Sampler& sampler);

// The latency figure that drives stability: the percentile, or the mean (ns).
double StabilityLatencyNs(const Histogram& h, const std::optional<double>& percentile);

}  // namespace shoal::loadgen
