// OverrunEstimate: how late the batcher's admission predictions turn out, learned from the
// answers, so that admission keeps back as much of a request's time as its predictions
// have recently needed, and no more.
//
// Each observation is one answered request's overrun as a share of its time budget:
//   (answered_ns - predicted_finish_ns) / (deadline_ns - enqueued_ns),
// clamped to [-1, 1]: 0.1 means the answer came a tenth of the budget after the admission
// predicted it; a negative share, that it came early. The estimate is the q-quantile of
// the recent shares, from a histogram whose counts decay exponentially per observation
// (half of an observation's weight is gone `half_life` observations later), so it follows
// a change of machine load within a few thousand requests.
//
// Thread safety: none; the batcher's owner serialises calls.
#pragma once

#include <array>
#include <cstdint>

namespace shoal::runtime {

class OverrunEstimate {
 public:
  // `quantile` in (0, 1); `half_life` in observations (> 0); `min_weight`: until the
  // decayed count of observations reaches it, share() is 0 (too few to trust a tail).
  explicit OverrunEstimate(double quantile = 0.99, double half_life = 500, double min_weight = 200);

  void Observe(double share);
  // Recomputes share() from the histogram; call after a group of observations (a batch's
  // answers): the quantile is a scan over the buckets.
  void Refresh();
  // The q-quantile of the recent shares, as of the last Refresh (0 before enough).
  double share() const { return share_; }
  // Any quantile of the recent shares (a scan; share() is this at the configured q).
  double Quantile(double q) const;
  // The decayed count of observations.
  double weight() const { return total_ / weight_; }

  // A bucket is 0.25% of the budget wide; the buckets cover shares -1 .. 1.
  static constexpr int kBucketsPerUnit = 400;
  static constexpr int kBuckets = 2 * kBucketsPerUnit + 1;

 private:
  double quantile_, growth_, min_weight_;
  // Counts are kept scaled by weight_, which grows by `growth_` per observation: a new
  // observation adds weight_, so older ones shrink relative to it without touching them.
  double weight_ = 1.0;
  double total_ = 0.0;
  std::array<double, kBuckets> counts_{};
  double share_ = 0.0;
};

}  // namespace shoal::runtime
