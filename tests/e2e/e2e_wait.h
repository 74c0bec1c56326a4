// Bounded waits on what a running `shoal serve` reports, so that end-to-end tests wait for
// events instead of sleeping and hoping (CI runs them on a noisy two-core VM):
//
//   HttpTestClient metrics("127.0.0.1", metrics_port);
//   ASSERT_TRUE(WaitUntil([&] { return InFlight(metrics, "held") == 2; }));
//
// Every wait gives up after 20 s, so a broken assumption fails the test instead of hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "server/http_test_client.h"

namespace shoal::e2e {

// Polls `done` until it returns true (then true) or `timeout_ms` passes (then false).
template <typename Pred>
bool WaitUntil(Pred done, int timeout_ms = 20000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The value of the sample `series` (e.g. `shoal_queue_depth{model="m",version="1"}`) in a
// scrape of the metrics endpoint, or -1 when the scrape fails or has no such sample.
inline double MetricSample(shoal::testing::HttpTestClient& metrics, const std::string& series) {
  const shoal::testing::HttpReply r = metrics.Get("/metrics");
  if (r.status != 200) return -1;
  const std::string line = "\n" + series + " ";
  const size_t at = r.body.find(line);
  if (at == std::string::npos) return -1;
  return std::strtod(r.body.c_str() + at + line.size(), nullptr);
}

// Requests version 1 of `model` has accepted and not yet answered (queued or executing),
// or -1 when the metrics endpoint does not say.
inline int64_t InFlight(shoal::testing::HttpTestClient& metrics, const std::string& model) {
  return static_cast<int64_t>(
      MetricSample(metrics, "shoal_requests_in_flight{model=\"" + model + "\",version=\"1\"}"));
}

// Executions that the instances of version 1 of `model` have recorded (their
// shoal_instance_executions_total, summed), or -1 when the metrics endpoint does not say. An
// instance records a run after the run's answers are sent, and its cost model learns the run's
// time then: a test that needs the server to know a run's time waits for this.
inline int64_t InstanceExecutions(shoal::testing::HttpTestClient& metrics,
                                  const std::string& model) {
  const shoal::testing::HttpReply r = metrics.Get("/metrics");
  if (r.status != 200) return -1;
  const std::string prefix =
      "\nshoal_instance_executions_total{model=\"" + model + "\",version=\"1\",";
  double total = 0;
  bool found = false;
  for (size_t at = r.body.find(prefix); at != std::string::npos; at = r.body.find(prefix, at + 1)) {
    const size_t value = r.body.find("} ", at);
    if (value == std::string::npos) return -1;
    total += std::strtod(r.body.c_str() + value + 2, nullptr);
    found = true;
  }
  return found ? static_cast<int64_t>(total) : -1;
}

}  // namespace shoal::e2e
