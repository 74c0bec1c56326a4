#include "loadgen/schedule.h"

#include <cmath>

namespace shoal::loadgen {

ArrivalSchedule::ArrivalSchedule(int64_t start_ns, double rate_per_s, Distribution distribution,
                                 uint64_t seed, int64_t period_ns, double on_fraction)
    : mean_gap_ns_(1e9 / rate_per_s),
      distribution_(distribution),
      rng_(seed),
      start_ns_(static_cast<double>(start_ns)),
      period_ns_(static_cast<double>(period_ns)),
      on_ns_(static_cast<double>(period_ns) * on_fraction),
      on_clock_ns_(0),
      next_ns_(static_cast<double>(start_ns)) {
  // During the on parts the rate is rate / on_fraction, so the gaps shrink alike.
  if (distribution_ == Distribution::kBurst) mean_gap_ns_ *= on_fraction;
}

int64_t ArrivalSchedule::Pop() {
  const int64_t now = next_ns();
  switch (distribution_) {
    case Distribution::kConstant:
      next_ns_ += mean_gap_ns_;
      break;
    case Distribution::kPoisson:
      next_ns_ += mean_gap_ns_ * exponential_(rng_);
      break;
    case Distribution::kBurst: {
      // Poisson on a clock that runs only while "on", mapped back to wall time.
      on_clock_ns_ += mean_gap_ns_ * exponential_(rng_);
      const double periods = std::floor(on_clock_ns_ / on_ns_);
      next_ns_ = start_ns_ + periods * period_ns_ + (on_clock_ns_ - periods * on_ns_);
      break;
    }
  }
  return now;
}

}  // namespace shoal::loadgen
