// ArrivalSchedule: the send times of an open-loop load (--request-rate-range), either
// evenly spaced (constant) or a Poisson process (exponential gaps with the same mean).
// Times are absolute nanoseconds on the driver's clock; fractions of a nanosecond are
// carried, so a constant schedule does not drift over millions of requests.
//
// Deterministic for a given seed. Not thread-safe.
#pragma once

#include <cstdint>
#include <random>

#include "loadgen/options.h"

namespace shoal::loadgen {

class ArrivalSchedule {
 public:
  // rate_per_s > 0. The first send is at start_ns.
  ArrivalSchedule(int64_t start_ns, double rate_per_s, Distribution distribution, uint64_t seed);

  // The scheduled time of the next send (not yet consumed).
  int64_t next_ns() const { return static_cast<int64_t>(next_ns_); }
  // Consumes the next send time and returns it.
  int64_t Pop();

 private:
  double mean_gap_ns_;
  Distribution distribution_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> exponential_{1.0};
  double next_ns_;
};

}  // namespace shoal::loadgen
