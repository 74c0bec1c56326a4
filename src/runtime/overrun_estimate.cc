#include "runtime/overrun_estimate.h"

#include <algorithm>
#include <cmath>

namespace shoal::runtime {

OverrunEstimate::OverrunEstimate(double quantile, double half_life, double min_weight)
    : quantile_(quantile), growth_(std::exp2(1.0 / half_life)), min_weight_(min_weight) {}

void OverrunEstimate::Observe(double share) {
  if (std::isnan(share)) return;
  share = std::clamp(share, -1.0, 1.0);
  const int bucket = static_cast<int>(std::lround((share + 1.0) * kBucketsPerUnit));
  weight_ *= growth_;
  counts_[static_cast<size_t>(bucket)] += weight_;
  total_ += weight_;
  if (weight_ > 1e100) {
    // Rescale before the weights overflow; the ratios, and so the estimate, are unchanged.
    for (double& c : counts_) c /= weight_;
    total_ /= weight_;
    weight_ = 1.0;
  }
}

void OverrunEstimate::Refresh() { share_ = weight() < min_weight_ ? 0.0 : Quantile(quantile_); }

double OverrunEstimate::Quantile(double q) const {
  // From the top: the share below which q of the weight lies.
  const double above = (1.0 - q) * total_;
  double seen = 0.0;
  int b = kBuckets - 1;
  for (; b > 0; --b) {
    seen += counts_[static_cast<size_t>(b)];
    if (seen > above) break;
  }
  return static_cast<double>(b) / kBucketsPerUnit - 1.0;
}

}  // namespace shoal::runtime
