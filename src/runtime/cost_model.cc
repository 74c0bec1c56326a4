#include "runtime/cost_model.h"

#include <algorithm>
#include <cmath>

namespace shoal::runtime {

CostModel::CostModel(double prior_a_ns, double prior_b_ns, double decay)
    : decay_(decay), prior_a_(prior_a_ns), prior_b_(prior_b_ns), a_(prior_a_ns), b_(prior_b_ns) {}

void CostModel::Observe(int64_t batch_size, int64_t elapsed_ns) {
  const double n = static_cast<double>(std::max<int64_t>(batch_size, 1));
  double t = static_cast<double>(std::max<int64_t>(elapsed_ns, 0));
  // A one-off stall (the first run of a new input shape builds its plan; a burst of page
  // faults) must not make the instance look a hundred times slower for many runs: once
  // fitted, an observation counts at most kMaxJump times the prediction. A real slowdown
  // still shows within a few runs, each lifting the prediction by up to that factor.
  if (count_ > 0) t = std::min(t, kMaxJump * static_cast<double>(PredictNs(batch_size)));
  sw_ = sw_ * decay_ + 1;
  sn_ = sn_ * decay_ + n;
  snn_ = snn_ * decay_ + n * n;
  st_ = st_ * decay_ + t;
  snt_ = snt_ * decay_ + n * t;
  ++count_;
  Refit();
}

void CostModel::Refit() {
  const double mean_n = sn_ / sw_;
  const double mean_t = st_ / sw_;
  const double var_n = snn_ / sw_ - mean_n * mean_n;
  if (var_n > 1e-6 * std::max(1.0, mean_n * mean_n)) {
    double b = (snt_ / sw_ - mean_n * mean_t) / var_n;
    b = std::max(b, 0.0);
    double a = mean_t - b * mean_n;
    if (a < 0) {
      // Fit through the origin instead.
      a = 0;
      b = snt_ / snn_;
    }
    a_ = a;
    b_ = b;
    return;
  }
  // One batch size seen: keep the prior's shape, match the observed mean.
  const double prior_at_mean = prior_a_ + prior_b_ * mean_n;
  const double scale = prior_at_mean > 0 ? mean_t / prior_at_mean : 1.0;
  a_ = prior_a_ * scale;
  b_ = prior_b_ * scale;
}

int64_t CostModel::PredictNs(int64_t batch_size) const {
  return static_cast<int64_t>(std::llround(a_ + b_ * static_cast<double>(batch_size)));
}

}  // namespace shoal::runtime
