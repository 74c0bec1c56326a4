// What the queue worker does with each outcome, and how many entries it reads. Pure
// decisions, tested without Redis or a runtime.
//
// Dispositions (docs/worker.md, "Retries and dead letters"):
//   OK                                      -> answer: write the result, acknowledge
//   RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED   -> the runtime could not run it within its
//                                              SLO here and now: retry here after a
//                                              back-off, without a new delivery (at most
//                                              kMaxLocalRetries times, then as below)
//   UNAVAILABLE, CANCELLED, INTERNAL        -> transient: leave it pending, unacknowledged,
//                                              so that a worker claims it after the idle
//                                              time (a new delivery); once it was delivered
//                                              max_deliveries times, dead-letter it
//   anything else (INVALID_ARGUMENT,        -> it can never succeed: dead-letter it, with
//   NOT_FOUND, ...)                            an error result when it has a request id
// A dead-lettered entry is acknowledged, and its error result is written like any other.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace shoal::worker {

enum class Disposition { kAnswer, kRetryHere, kRetryLater, kDeadLetter };

inline constexpr int kMaxLocalRetries = 20;

// `deliveries`: this delivery included (1: the first). `local_retries`: times it was
// already retried here after RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED on this delivery.
Disposition Decide(StatusCode outcome, int64_t deliveries, int local_retries,
                   int64_t max_deliveries);

// True when an entry read or claimed with `deliveries` must not run again: it was
// delivered more than max_deliveries times without an answer (a worker died on it each
// time, or it failed transiently each time). It goes to the dead-letter stream.
inline bool DeliveriesExhausted(int64_t deliveries, int64_t max_deliveries) {
  return deliveries > max_deliveries;
}

// Back-off before retry number `local_retries` (1-based) here: 5 ms doubling to 640 ms.
int64_t LocalRetryDelayMs(int local_retries);

// How many entries the worker may hold (read and not yet acknowledged or released): an
// additive-increase / multiplicative-decrease window between 1 and `max`. The runtime's
// admission refuses work it predicts cannot finish within the model's SLO, and a request
// that waited past its deadline times out; each such answer halves the window, and each
// window's worth of answered requests widens it by one. So the worker reads only what
// the runtime can run within its SLO, and leaves the rest in the stream for other
// workers. Not thread-safe (the worker guards it).
class CapacityWindow {
 public:
  explicit CapacityWindow(int64_t max) : max_(max < 1 ? 1 : max), limit_(max_) {}
  int64_t limit() const { return limit_; }
  int64_t max() const { return max_; }
  void OnAnswered();
  void OnOverloaded();

 private:
  const int64_t max_;
  int64_t limit_;
  int64_t credit_ = 0;
};

}  // namespace shoal::worker
