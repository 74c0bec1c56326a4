#include "runtime/model_stats.h"

#include "core/clock.h"

namespace shoal::runtime {

std::vector<double> Histogram::LatencyBoundsUs() {
  return {50,    100,    250,    500,    1000,    2500,    5000,    10000,   25000,
          50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000};
}

std::vector<double> Histogram::BatchSizeBounds() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

void ModelStats::RecordSuccess(int64_t e2e_ns, int64_t queue_ns, int64_t input_ns, int64_t infer_ns,
                               int64_t output_ns) {
  MutexLock lock(&mu_);
  s_.request_latency_us.Observe(static_cast<double>(e2e_ns) / 1000.0);
  s_.queue_latency_us.Observe(static_cast<double>(queue_ns) / 1000.0);
  s_.success.Add(e2e_ns);
  s_.queue.Add(queue_ns);
  s_.compute_input.Add(input_ns);
  s_.compute_infer.Add(infer_ns);
  s_.compute_output.Add(output_ns);
  s_.last_inference_ms = WallTimeMs();
}

void ModelStats::RecordCacheHit(int64_t e2e_ns, int64_t lookup_ns) {
  MutexLock lock(&mu_);
  s_.request_latency_us.Observe(static_cast<double>(e2e_ns) / 1000.0);
  s_.success.Add(e2e_ns);
  s_.cache_hit.Add(lookup_ns);
  s_.last_inference_ms = WallTimeMs();
}

void ModelStats::RecordCacheMiss(int64_t lookup_ns) {
  MutexLock lock(&mu_);
  s_.cache_miss.Add(lookup_ns);
}

void ModelStats::RecordFailure(int64_t e2e_ns) {
  MutexLock lock(&mu_);
  s_.fail.Add(e2e_ns);
}

void ModelStats::RecordExecution(int64_t batch_size, int64_t input_ns, int64_t infer_ns,
                                 int64_t output_ns) {
  MutexLock lock(&mu_);
  s_.inference_count += static_cast<uint64_t>(batch_size);
  s_.compute_latency_us.Observe(static_cast<double>(infer_ns) / 1000.0);
  s_.batch_size.Observe(static_cast<double>(batch_size));
  s_.execution_count += 1;
  BatchSizeStats& b = s_.batch_stats[batch_size];
  b.compute_input.Add(input_ns);
  b.compute_infer.Add(infer_ns);
  b.compute_output.Add(output_ns);
}

void ModelStats::Increment(uint64_t ModelStatsSnapshot::*field) {
  MutexLock lock(&mu_);
  ++(s_.*field);
}
void ModelStats::RecordRejectedQueueFull() { Increment(&ModelStatsSnapshot::rejected_queue_full); }
void ModelStats::RecordRejectedInvalid() { Increment(&ModelStatsSnapshot::rejected_invalid); }
void ModelStats::RecordTimedOut() { Increment(&ModelStatsSnapshot::timed_out); }
void ModelStats::RecordRejectedOverload() { Increment(&ModelStatsSnapshot::rejected_overload); }
void ModelStats::RecordDeadlineMissed() { Increment(&ModelStatsSnapshot::deadline_missed); }
void ModelStats::RecordPrecisionSwitch() { Increment(&ModelStatsSnapshot::precision_switches); }

void ModelStats::RecordPrecision(const std::string& tier) {
  MutexLock lock(&mu_);
  ++s_.precision_requests[tier];
}
void ModelStats::RecordCancelled() { Increment(&ModelStatsSnapshot::cancelled); }

ModelStatsSnapshot ModelStats::Snapshot() const {
  MutexLock lock(&mu_);
  return s_;
}

}  // namespace shoal::runtime
