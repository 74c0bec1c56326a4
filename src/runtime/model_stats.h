// ModelStats: the counters of one model version, with every field of Triton's
// statistics extension (what GET /v2/models/{m}/stats and the ModelStatistics RPC
// return), plus what the metrics exporter needs for its gauges.
//
// Semantics (as Triton's):
//   success/fail  count and total end-to-end ns of answered requests; success includes
//                 cache hits.
//   queue         ns between enqueue and the start of the batch's execution.
//   compute_*     ns of merging inputs, running the backend, scattering outputs; a
//                 request is charged its batch's full time.
//   cache_hit/miss count and ns spent looking up the cache.
//   inference_count  batch items executed (cache hits excluded);
//   execution_count  backend executions.
//   batch_stats   per batch size: executions and compute times.
// Thread safety: all methods are safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/mutex.h"

namespace shoal::runtime {

struct Duration {
  uint64_t count = 0;
  uint64_t ns = 0;
  void Add(int64_t d) {
    ++count;
    ns += static_cast<uint64_t>(d < 0 ? 0 : d);
  }
};

// A Prometheus-style histogram: cumulative counts for fixed upper bounds, plus sum and
// count. Bounds are fixed at construction; values above the last bound count in +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}
  void Observe(double value) {
    size_t i = 0;
    while (i < bounds_.size() && value > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += value;
    ++count_;
  }
  const std::vector<double>& bounds() const { return bounds_; }
  // Non-cumulative count per bucket; the last one is +Inf.
  const std::vector<uint64_t>& bucket_counts() const { return counts_; }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

  // Latency buckets in microseconds, 50 us .. 10 s.
  static std::vector<double> LatencyBoundsUs();
  // Batch size buckets: 1, 2, 4, ... 1024.
  static std::vector<double> BatchSizeBounds();

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct BatchSizeStats {
  Duration compute_input, compute_infer, compute_output;
};

struct ModelStatsSnapshot {
  int64_t last_inference_ms = 0;  // wall clock, 0 if none
  uint64_t inference_count = 0;
  uint64_t execution_count = 0;
  Duration success, fail, queue, compute_input, compute_infer, compute_output, cache_hit,
      cache_miss;
  std::map<int64_t, BatchSizeStats> batch_stats;
  // Outcomes beyond Triton's fields, for metrics.
  uint64_t rejected_queue_full = 0, rejected_invalid = 0, timed_out = 0, cancelled = 0;
  // Refused at admission because the predicted wait missed the deadline or the bound;
  // dropped unrun because the deadline could no longer be met.
  uint64_t rejected_overload = 0, deadline_missed = 0;
  // The precision ladder: requests answered per tier (models with a ladder, or requests
  // that chose a tier), and how often the ladder moved.
  std::map<std::string, uint64_t> precision_requests;
  uint64_t precision_switches = 0;
  // Histograms for the metrics exporter (microseconds; batch size in items).
  Histogram request_latency_us{Histogram::LatencyBoundsUs()};  // end to end, successes
  Histogram queue_latency_us{Histogram::LatencyBoundsUs()};
  Histogram compute_latency_us{Histogram::LatencyBoundsUs()};  // per execution, infer only
  Histogram batch_size{Histogram::BatchSizeBounds()};
};

class ModelStats {
 public:
  // A request answered OK after running. Times in ns.
  void RecordSuccess(int64_t e2e_ns, int64_t queue_ns, int64_t input_ns, int64_t infer_ns,
                     int64_t output_ns);
  void RecordCacheHit(int64_t e2e_ns, int64_t lookup_ns);
  void RecordCacheMiss(int64_t lookup_ns);
  void RecordFailure(int64_t e2e_ns);
  void RecordExecution(int64_t batch_size, int64_t input_ns, int64_t infer_ns, int64_t output_ns);
  void RecordRejectedQueueFull();
  void RecordRejectedInvalid();
  void RecordTimedOut();
  void RecordRejectedOverload();
  void RecordDeadlineMissed();
  void RecordCancelled();
  void RecordPrecision(const std::string& tier);
  void RecordPrecisionSwitch();
  ModelStatsSnapshot Snapshot() const;

 private:
  // Adds one to the outcome counter `field` of s_.
  void Increment(uint64_t ModelStatsSnapshot::*field);

  mutable Mutex mu_;
  ModelStatsSnapshot s_ GUARDED_BY(mu_);
};

}  // namespace shoal::runtime
