#include "loadgen/schedule.h"

namespace shoal::loadgen {

ArrivalSchedule::ArrivalSchedule(int64_t start_ns, double rate_per_s, Distribution distribution,
                                 uint64_t seed)
    : mean_gap_ns_(1e9 / rate_per_s),
      distribution_(distribution),
      rng_(seed),
      next_ns_(static_cast<double>(start_ns)) {}

int64_t ArrivalSchedule::Pop() {
  const int64_t now = next_ns();
  next_ns_ +=
      distribution_ == Distribution::kPoisson ? mean_gap_ns_ * exponential_(rng_) : mean_gap_ns_;
  return now;
}

}  // namespace shoal::loadgen
