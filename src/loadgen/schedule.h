// ArrivalSchedule: the send times of an open-loop load (--request-rate-range): evenly
// spaced (constant), a Poisson process (exponential gaps with the same mean), or on/off
// bursts (Poisson at rate / on_fraction during the first on_fraction of every period,
// nothing in the rest; the same mean rate). Times are absolute nanoseconds on the driver's
// clock; fractions of a nanosecond are carried, so a constant schedule does not drift
// over millions of requests.
//
// Deterministic for a given seed. Not thread-safe.
#pragma once

#include <cstdint>
#include <random>

#include "loadgen/options.h"

namespace shoal::loadgen {

class ArrivalSchedule {
 public:
  // rate_per_s > 0. The first send is at start_ns. period_ns > 0 and on_fraction in
  // (0, 1] are used by kBurst only.
  ArrivalSchedule(int64_t start_ns, double rate_per_s, Distribution distribution, uint64_t seed,
                  int64_t period_ns = 1'000'000'000, double on_fraction = 1.0);

  // The scheduled time of the next send (not yet consumed).
  int64_t next_ns() const { return static_cast<int64_t>(next_ns_); }
  // Consumes the next send time and returns it.
  int64_t Pop();

 private:
  double mean_gap_ns_;
  Distribution distribution_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> exponential_{1.0};
  double start_ns_;
  double period_ns_;
  double on_ns_;        // kBurst: the sending part of a period
  double on_clock_ns_;  // kBurst: time counted on the "on" parts only, since start
  double next_ns_;
};

}  // namespace shoal::loadgen
