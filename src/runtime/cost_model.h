// CostModel: an online estimate of how long an instance takes for a batch of n items,
// t(n) = a + b·n, fitted by exponentially weighted least squares over observed runs.
//
// Used by the instance pool to send a batch to the instance expected to finish it
// first. Before any observation it predicts from the prior (a, b) it was given; with
// observations at one batch size only, it keeps the prior's split between a and b but
// scales both to match. a and b never go negative.
//
// Thread safety: none; the instance pool guards it.
#pragma once

#include <cstdint>

namespace shoal::runtime {

class CostModel {
 public:
  // `decay` in (0, 1]: weight kept by old observations at each new one.
  explicit CostModel(double prior_a_ns = 100'000, double prior_b_ns = 10'000, double decay = 0.95);
  // Once fitted, one observation counts at most this many times the prediction.
  static constexpr double kMaxJump = 8.0;

  void Observe(int64_t batch_size, int64_t elapsed_ns);
  int64_t PredictNs(int64_t batch_size) const;
  double a_ns() const { return a_; }
  double b_ns() const { return b_; }
  int64_t observations() const { return count_; }

 private:
  void Refit();
  double decay_;
  double prior_a_, prior_b_;
  double a_, b_;
  // Weighted sums: w, n, n², t, n·t.
  double sw_ = 0, sn_ = 0, snn_ = 0, st_ = 0, snt_ = 0;
  int64_t count_ = 0;
};

// How fast a model version runs, over all its instances, as the instance pool currently
// estimates it: a batch of n items takes a_ns + b_ns·n on one of `instances` instances,
// and the instances are busy for backlog_ns more, on average, with work already handed
// to them. The batcher plans with it.
struct ServiceEstimate {
  double a_ns = 0;
  double b_ns = 0;
  int instances = 1;
  int64_t backlog_ns = 0;
  int idle_instances = 1;  // instances running nothing right now
  int64_t PredictNs(int64_t items) const {
    return static_cast<int64_t>(a_ns + b_ns * static_cast<double>(items));
  }
};

}  // namespace shoal::runtime
