// Batcher<Task>: the dynamic batching policy of one model version, as a passive data
// structure. It holds queued tasks and, when asked, says which of them form the next
// batch or when to ask again. It owns no thread and reads no clock: the caller passes
// `now_ns` into every call, and tells it how fast the model's instances are
// (set_service). In the server a ModelVersion drives it under its lock; tests drive it
// directly and step time, so batching behaviour is tested exactly.
//
// Two policies (BatchingPolicy), chosen per model:
//
// kSlo (the default): latency is what it schedules for.
//   - Admission: Enqueue predicts the request's wait (the items queued at its level and
//     above, run in full batches by the instances, after the work they already hold) and
//     its finish (wait + the run of the batch it will join: the items ahead that do not
//     fill a batch, itself, and what the measured arrival rate brings during the wait, up
//     to max_batch_size). It keeps in reserve a share of the time left to the deadline:
//     deadline_reserve (25%), or how late its predictions have recently run, as a share of
//     their tasks' time, when that is more (the overrun_quantile, 99%, of what
//     ObserveAnswer reports; OverrunEstimate; at most kMaxReserve). It refuses
//     with RESOURCE_EXHAUSTED at once, with a retry hint (the predicted time to drain the
//     queue), when the finish is past the rest of the time, or the wait past
//     max_queue_wait_us. best_effort tasks skip this.
//   - Order: within a level, earliest deadline first. A task without a deadline is
//     ordered as if its deadline were no_deadline_horizon_us after its arrival (so a
//     stream of tasks with deadlines cannot starve it) but is never expired by it.
//   - A queued task whose deadline can no longer be met (deadline minus its own
//     predicted run time, at enqueue) leaves through TakeExpired with kDeadline and is
//     never executed.
//   - Except a probe: a task that finds the model idle (nothing queued, an instance free) is
//     admitted, and neither expired nor left out of a batch for its deadline, whatever
//     the prediction: so a stale estimate is always refreshed by a run.
//   - Batch formation is work-conserving: a batch of what is queued (in order, up to
//     max_batch_size) is released as soon as an instance asks, never held back for more.
//     Waiting would only delay the tasks already queued, and it is not needed for
//     throughput: what arrives during a run is queued when an instance is free again, so
//     batches grow with the arrival rate by themselves (with one instance and t(n) = a + b·n
//     they settle near n = λa / (1 - λb)). max_queue_delay_us bounds nothing more here.
//   - The target batch is the smallest size whose throughput (instances · n / t(n)) covers
//     the measured arrival rate with `throughput_headroom` to spare: 1 under light load,
//     growing toward max_batch_size under heavy load. The arrival rate is an
//     exponentially decayed count over arrival_window_us. It bounds the two deadline
//     rules that follow.
//   - A batch is never grown past the target to a size whose predicted finish misses the
//     deadline of a task in it: the walk stops at the first task that would do so. A task
//     that would miss its deadline even in a batch of the target size is left out of
//     every batch (it expires unrun): under overload, shrinking batches to save the
//     tightest deadline would fall behind the arrivals and make every request late. When
//     that would leave out every queued task, none is left out: something always runs,
//     so a stale estimate cannot stop the model.
//   - Aging: with priority_aging_us > 0, a task that has waited that long at its level
//     moves up one level (and again after each further interval), so a task of level L
//     competes at level 1 after (L-1)·priority_aging_us at most; from there it waits only
//     behind level-1 tasks ordered before it.
//
// kFixedWindow: Triton's dynamic batcher for the same config fields, for users who want
// its exact behaviour: FIFO within a level, higher levels strictly first, no admission
// by predicted wait, deadlines ignored, and a batch that is not full waits until its
// oldest task has waited max_queue_delay_us (releasing the largest preferred-size
// prefix if any, else everything). Aging applies if configured.
//
// Common to both:
//   - Priority levels 1..priority_levels, 1 the highest; a task's priority 0 means the
//     default level.
//   - Per level queue policy: max_queue_size (0 = unbounded; a full level rejects at once
//     with RESOURCE_EXHAUSTED, retryable); a queue timeout (the task's own when
//     allow_timeout_override, else default_timeout_us; 0 = none). When it passes,
//     REJECT removes the task (TakeExpired returns it with kQueueTimeout) and DELAY moves
//     it behind every non-delayed task of every level.
//   - A batch never mixes tasks with different shape_key (shape buckets) and never holds
//     more than max_batch_size items. Walking tasks in order, the first task fixes the
//     bucket; tasks of other buckets are skipped (they wait for a later batch); the walk
//     stops at the first task of the bucket that does not fit.
//   - A batch is released at once when it is full (max_batch_size, or the largest
//     preferred size).
//   - max_batch_size == 0 (no dynamic batching): each task is its own batch.
// Bound: a task that is not timed out waits at most max_queue_delay_us after an
// instance is free and it is at the head of its bucket's walk.
//
// Ownership: Enqueue takes the task iff it returns OK (the caller's pointer is then
// null); every task leaves through FormBatch, TakeExpired, RemoveIf or TakeAll.
// Thread safety: none; the caller serialises all calls.
//
// Task requirements:
//   int64_t batch_size() const;  // items this task adds to a batch (>= 1)
//   uint64_t shape_key() const;  // equal keys may share a batch
//   uint32_t priority() const;   // 0 = default level
//   uint64_t timeout_us() const; // requested queue timeout, 0 = none
//   int64_t deadline_ns() const; // absolute deadline on the caller's clock, 0 = none
//   bool best_effort() const;    // offline work: no admission by predicted wait
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/cost_model.h"
#include "runtime/overrun_estimate.h"

namespace shoal::runtime {

enum class TimeoutAction { kReject, kDelay };
enum class BatchingPolicy { kSlo, kFixedWindow };

struct QueuePolicy {
  TimeoutAction timeout_action = TimeoutAction::kReject;
  uint64_t default_timeout_us = 0;  // 0 = no timeout
  bool allow_timeout_override = false;
  uint32_t max_queue_size = 0;  // 0 = unbounded
};

struct BatcherOptions {
  BatchingPolicy policy = BatchingPolicy::kSlo;
  // Largest batch in items; 0 = no batching across requests: each task is its own
  // batch, whatever its size (the caller validates a task's size).
  int64_t max_batch_size = 0;
  // Batch sizes the backend prefers; each in 1..max_batch_size. Empty: none.
  std::vector<int64_t> preferred_batch_sizes;
  // The longest the oldest task may wait for more to arrive, in microseconds. Default 0:
  // release whatever is queued as soon as an instance is free. Under kSlo an upper
  // bound: the batch is released earlier once it reaches the target size.
  uint64_t max_queue_delay_us = 0;
  // Number of priority levels; 0 behaves as 1.
  uint32_t priority_levels = 0;
  // The level of tasks with priority 0. Must be in 1..priority_levels when
  // priority_levels > 0; ignored otherwise.
  uint32_t default_priority_level = 0;
  QueuePolicy default_queue_policy;
  // Per-level overrides, index = level (1-based); levels not listed use the default.
  std::vector<std::pair<uint32_t, QueuePolicy>> priority_queue_policy;
  // A task moves up one level after waiting this long at its level (microseconds);
  // 0 = never (strict priority).
  uint64_t priority_aging_us = 0;
  // kSlo: refuse a task whose predicted queue wait exceeds this (microseconds), whatever
  // its deadline; this is what bounds the queue when requests carry no deadline.
  // kAutoQueueWait (the default): the larger of 1 s and 10 runs of a full batch.
  // 0 = no bound.
  static constexpr int64_t kAutoQueueWait = -1;
  int64_t max_queue_wait_us = kAutoQueueWait;
  // kSlo: where a task without a deadline sorts among tasks with deadlines.
  uint64_t no_deadline_horizon_us = 1'000'000;
  // kSlo: the time constant of the arrival-rate estimate.
  uint64_t arrival_window_us = 100'000;
  // kSlo: how much throughput above the arrival rate the target batch must give (>= 1).
  double throughput_headroom = 1.2;
  // kSlo: the least share of a task's remaining time to its deadline that admission keeps
  // in reserve, for the prediction's error and the time outside the server (0..1).
  double deadline_reserve = 0.25;
  // kSlo: when admission's predictions have recently run later than deadline_reserve, it
  // keeps that share in reserve instead: this quantile of the overruns that ObserveAnswer
  // reports (OverrunEstimate). 0 = learn nothing, keep deadline_reserve.
  double overrun_quantile = 0.99;
};

enum class ExpiryReason { kQueueTimeout, kDeadline };
// Why Enqueue refused a task with RESOURCE_EXHAUSTED.
enum class RejectReason { kNone, kQueueFull, kOverload };

template <typename Task>
class Batcher {
 public:
  // Rejects inconsistent options with a message naming the value.
  static StatusOr<std::unique_ptr<Batcher>> Create(BatcherOptions options);

  // Takes the task iff OK. Errors: INVALID_ARGUMENT (priority outside the levels, size
  // above max_batch_size), RESOURCE_EXHAUSTED with a retry hint (the level's queue is
  // full; kSlo: the predicted finish is past the deadline or the wait past
  // max_queue_wait_us).
  // `reason`, when given, says which refusal it was.
  // `predicted_finish_ns`, when given, receives the admitted task's predicted finish (for
  // ObserveAnswer; 0 when the task has no deadline or is best effort).
  Status Enqueue(std::unique_ptr<Task>& task, int64_t now_ns, RejectReason* reason = nullptr,
                 int64_t* predicted_finish_ns = nullptr);

  // kSlo: an answered task's record against its admission (its enqueue time, the finish
  // Enqueue predicted, its deadline, when it was answered). Call RefreshOverrun after a
  // group of them (a batch's answers).
  void ObserveAnswer(int64_t enqueued_ns, int64_t predicted_finish_ns, int64_t deadline_ns,
                     int64_t answered_ns);
  void RefreshOverrun() { overrun_.Refresh(); }
  // kSlo: the share of a task's time left that admission keeps in reserve now: the larger
  // of deadline_reserve and the learned overrun, the latter at most kMaxReserve. 0 under
  // kFixedWindow.
  double admission_reserve() const;
  // However late predictions have run, the learned reserve leaves a quarter of the time
  // usable: requests are still admitted behind a short queue, and their answers keep the
  // estimate current.
  static constexpr double kMaxReserve = 0.75;

  // The caller's current estimate of the instances; used by every later call.
  void set_service(const ServiceEstimate& service) { service_ = service; }
  const ServiceEstimate& service() const { return service_; }

  struct Decision {
    std::vector<std::unique_ptr<Task>> batch;  // empty: nothing to release now
    // When to call FormBatch again if nothing changes (max when the queue is empty).
    int64_t wake_at_ns = std::numeric_limits<int64_t>::max();
  };
  // Forms the next batch if one is due (call it when an instance is free). `force`
  // releases whatever is queued (used when draining at shutdown).
  Decision FormBatch(int64_t now_ns, bool force = false);

  struct Expired {
    std::unique_ptr<Task> task;
    ExpiryReason reason;
  };
  // Applies queue timeouts and deadlines at `now_ns`: returns the tasks to answer now
  // and moves DELAY tasks behind the rest.
  std::vector<Expired> TakeExpired(int64_t now_ns);
  // The earliest time at which TakeExpired has work (max if none).
  int64_t next_expiry_ns() const { return next_expiry_ns_; }

  // Removes and returns every queued task for which pred(task) is true (cancellation).
  template <typename Pred>
  std::vector<std::unique_ptr<Task>> RemoveIf(Pred pred);
  // Removes everything (shutdown without draining).
  std::vector<std::unique_ptr<Task>> TakeAll();

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Items (not tasks) queued.
  int64_t queued_items() const;
  // Queued tasks at a level (1-based), delayed ones included.
  size_t level_size(uint32_t level) const;
  const BatcherOptions& options() const { return options_; }
  // kSlo: the measured arrival rate (items per second) and the batch size it calls for.
  double arrival_rate_per_s(int64_t now_ns) const;
  int64_t target_batch(int64_t now_ns) const;
  // The predicted time (ns from now) until everything queued has run.
  int64_t PredictDrainNs() const;

 private:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  struct Entry {
    std::unique_ptr<Task> task;
    int64_t enqueue_ns;
    int64_t order_ns;        // position within its level (FIFO or deadline)
    int64_t expire_ns;       // queue timeout; kNever when none
    int64_t doomed_ns;       // its deadline can no longer be met; kNever when none
    int64_t level_since_ns;  // when it reached its current level (aging)
    bool probe = false;      // found the model idle: runs whatever the prediction
  };
  struct Level {
    QueuePolicy policy;
    std::deque<Entry> queue;    // sorted by order_ns, FIFO among equals
    std::deque<Entry> delayed;  // FIFO
    int64_t items = 0;          // in queue and delayed
  };

  explicit Batcher(BatcherOptions options);
  bool slo() const { return options_.policy == BatchingPolicy::kSlo; }
  int64_t max_items() const { return options_.max_batch_size > 0 ? options_.max_batch_size : 1; }
  // Predicted ns for `items` queued items to run in full batches on every instance.
  int64_t RunAheadNs(int64_t items) const;
  // The queue wait bound in ns (0 = none), kAutoQueueWait resolved.
  int64_t MaxQueueWaitNs() const;
  static void InsertOrdered(std::deque<Entry>& dq, Entry e);
  void Promote(int64_t now_ns);
  void RecomputeExpiry();
  // Queues in batching order: each level's main queue, then each level's delayed queue.
  std::vector<std::deque<Entry>*> QueuesInOrder();
  Level& LevelOf(const std::deque<Entry>* dq);

  BatcherOptions options_;
  ServiceEstimate service_;
  std::vector<Level> levels_;  // index 0 = level 1
  std::set<int64_t> preferred_;
  size_t size_ = 0;
  int64_t next_expiry_ns_ = kNever;
  // Exponentially decayed count of arrived items, as of arrivals_at_ns_.
  double arrivals_ = 0;
  int64_t arrivals_at_ns_ = 0;
  OverrunEstimate overrun_;
};

// Implementation details follow.

namespace batcher_internal {
inline std::string Ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", static_cast<double>(ns) / 1e6);
  return buf;
}
}  // namespace batcher_internal

template <typename Task>
StatusOr<std::unique_ptr<Batcher<Task>>> Batcher<Task>::Create(BatcherOptions o) {
  if (o.max_batch_size < 0) {
    return InvalidArgument("max_batch_size must be >= 0; was " + std::to_string(o.max_batch_size));
  }
  for (int64_t p : o.preferred_batch_sizes) {
    if (p <= 0 || p > std::max<int64_t>(o.max_batch_size, 1) || (o.max_batch_size == 0 && p != 1)) {
      return InvalidArgument("preferred_batch_size must be in 1..max_batch_size (" +
                             std::to_string(o.max_batch_size) + "); was " + std::to_string(p));
    }
  }
  const uint32_t levels = std::max<uint32_t>(o.priority_levels, 1);
  if (o.priority_levels > 0 &&
      (o.default_priority_level < 1 || o.default_priority_level > o.priority_levels)) {
    return InvalidArgument("default_priority_level must be in 1.." +
                           std::to_string(o.priority_levels) + "; was " +
                           std::to_string(o.default_priority_level));
  }
  for (const auto& lp : o.priority_queue_policy) {
    if (lp.first < 1 || lp.first > levels) {
      return InvalidArgument("priority_queue_policy level must be in 1.." + std::to_string(levels) +
                             "; was " + std::to_string(lp.first));
    }
  }
  if (!(o.throughput_headroom >= 1.0)) {
    return InvalidArgument("throughput_headroom must be >= 1; was " +
                           std::to_string(o.throughput_headroom));
  }
  if (o.arrival_window_us == 0) return InvalidArgument("arrival_window_us must be > 0; was 0");
  if (!(o.deadline_reserve >= 0 && o.deadline_reserve < 1)) {
    return InvalidArgument("deadline_reserve must be in [0, 1); was " +
                           std::to_string(o.deadline_reserve));
  }
  if (!(o.overrun_quantile >= 0 && o.overrun_quantile < 1)) {
    return InvalidArgument("overrun_quantile must be in [0, 1); was " +
                           std::to_string(o.overrun_quantile));
  }
  if (o.max_queue_wait_us < 0 && o.max_queue_wait_us != BatcherOptions::kAutoQueueWait) {
    return InvalidArgument("max_queue_wait_us must be >= 0; was " +
                           std::to_string(o.max_queue_wait_us));
  }
  return std::unique_ptr<Batcher>(new Batcher(std::move(o)));
}

template <typename Task>
Batcher<Task>::Batcher(BatcherOptions options)
    : options_(std::move(options)),
      overrun_(options_.overrun_quantile > 0 ? options_.overrun_quantile : 0.5) {
  const uint32_t levels = std::max<uint32_t>(options_.priority_levels, 1);
  levels_ = std::vector<Level>(levels);
  for (Level& l : levels_) l.policy = options_.default_queue_policy;
  for (const auto& lp : options_.priority_queue_policy) levels_[lp.first - 1].policy = lp.second;
  preferred_.insert(options_.preferred_batch_sizes.begin(), options_.preferred_batch_sizes.end());
}

template <typename Task>
int64_t Batcher<Task>::RunAheadNs(int64_t items) const {
  const double per_item = service_.a_ns / static_cast<double>(max_items()) + service_.b_ns;
  return service_.backlog_ns + static_cast<int64_t>(per_item * static_cast<double>(items) /
                                                    std::max(service_.instances, 1));
}

template <typename Task>
int64_t Batcher<Task>::MaxQueueWaitNs() const {
  if (options_.max_queue_wait_us != BatcherOptions::kAutoQueueWait)
    return options_.max_queue_wait_us * 1000;
  return std::max<int64_t>(1'000'000'000, 10 * service_.PredictNs(max_items()));
}

template <typename Task>
int64_t Batcher<Task>::PredictDrainNs() const {
  return RunAheadNs(queued_items());
}

template <typename Task>
Status Batcher<Task>::Enqueue(std::unique_ptr<Task>& task, int64_t now_ns, RejectReason* reason,
                              int64_t* predicted_finish_ns) {
  if (reason != nullptr) *reason = RejectReason::kNone;
  if (predicted_finish_ns != nullptr) *predicted_finish_ns = 0;
  const uint32_t levels = static_cast<uint32_t>(levels_.size());
  uint32_t level = task->priority();
  if (level == 0) {
    level = options_.priority_levels > 0 ? options_.default_priority_level : 1;
  } else if (level > levels) {
    return InvalidArgument("priority " + std::to_string(level) +
                           " is outside the model's levels 1.." + std::to_string(levels));
  }
  const int64_t items = task->batch_size();
  if (items < 1 || (options_.max_batch_size > 0 && items > options_.max_batch_size)) {
    return InvalidArgument("batch size " + std::to_string(items) + " is outside 1.." +
                           std::to_string(max_items()));
  }
  Level& l = levels_[level - 1];
  const auto drain_ms = [&] { return (PredictDrainNs() + 999'999) / 1'000'000; };
  if (l.policy.max_queue_size > 0 && l.queue.size() + l.delayed.size() >= l.policy.max_queue_size) {
    if (reason != nullptr) *reason = RejectReason::kQueueFull;
    const std::string which =
        levels > 1 ? "the queue for priority level " + std::to_string(level) : "the queue";
    return ResourceExhausted(which + " is full (" + std::to_string(l.policy.max_queue_size) +
                             " requests); retry after " + std::to_string(drain_ms()) + " ms")
        .WithRetryAfterMs(drain_ms());
  }
  const int64_t deadline = task->deadline_ns();
  // A task that finds the model idle (nothing queued, an instance free) runs at once,
  // whatever the prediction says: it cannot be served sooner, and its run refreshes
  // a cost estimate that may be stale (one slow first run must not make every later
  // request look hopeless, refused or expired unrun, with nothing ever running again).
  const bool probe = slo() && size_ == 0 && service_.idle_instances > 0;
  int64_t finish = now_ns + service_.PredictNs(items);  // a probe's
  if (slo() && !task->best_effort() && !probe) {
    int64_t ahead = 0;
    for (uint32_t i = 0; i < level; ++i) ahead += levels_[i].items;
    // Under a backlog the queue leaves in full batches: those ahead of this task's batch
    // run first, then the batch it joins, which takes as long as its size says, not as
    // long as this task alone. That batch holds the rest of the items ahead and what
    // arrives before it leaves (at the measured arrival rate, over the wait): under
    // overload it is full. Counting only the items ahead made every admitted task's
    // finish up to t(full) - t(1) later than predicted.
    const int64_t full = max_items();
    const int64_t batches_ahead = ahead / full;
    const int64_t wait = service_.backlog_ns +
                         batches_ahead * service_.PredictNs(full) / std::max(service_.instances, 1);
    const double joining = arrival_rate_per_s(now_ns) / 1e9 * static_cast<double>(wait);
    const int64_t own_batch =
        ahead % full + items + static_cast<int64_t>(std::min(joining, static_cast<double>(full)));
    const int64_t own_batch_capped = std::min(full, own_batch);
    finish = now_ns + wait + service_.PredictNs(own_batch_capped);
    std::string why;
    const double reserve = admission_reserve();
    const int64_t usable =
        deadline - static_cast<int64_t>(reserve * static_cast<double>(deadline - now_ns));
    if (deadline > 0 && finish > usable) {
      why = "predicted to answer in " + batcher_internal::Ms(finish - now_ns) +
            ", too late for the request's deadline (" + batcher_internal::Ms(deadline - now_ns) +
            " left, " + std::to_string(static_cast<int>(std::lround(reserve * 100))) +
            "% of it kept in reserve for late predictions and the time outside the server)";
    } else if (const int64_t bound = MaxQueueWaitNs(); bound > 0 && wait > bound) {
      why = "the predicted queue wait of " + batcher_internal::Ms(wait) + " exceeds the bound of " +
            batcher_internal::Ms(bound);
    }
    if (!why.empty()) {
      if (reason != nullptr) *reason = RejectReason::kOverload;
      return ResourceExhausted("overloaded: " + why + "; retry after " +
                               std::to_string(drain_ms()) + " ms")
          .WithRetryAfterMs(drain_ms());
    }
  }
  // The arrival rate counts the items admitted (a refused task returned above): it is
  // the load the queue must serve.
  const double tau = static_cast<double>(options_.arrival_window_us) * 1000.0;
  if (now_ns > arrivals_at_ns_) {
    arrivals_ *= std::exp(-static_cast<double>(now_ns - arrivals_at_ns_) / tau);
    arrivals_at_ns_ = now_ns;
  }
  arrivals_ += static_cast<double>(items);

  uint64_t timeout_us = l.policy.default_timeout_us;
  if (l.policy.allow_timeout_override && task->timeout_us() > 0) timeout_us = task->timeout_us();
  if (predicted_finish_ns != nullptr && slo() && deadline > 0 && !task->best_effort())
    *predicted_finish_ns = finish;
  Entry e{nullptr, now_ns, now_ns, kNever, kNever, now_ns, false};
  if (timeout_us > 0) e.expire_ns = now_ns + static_cast<int64_t>(timeout_us) * 1000;
  if (slo()) {
    e.order_ns = deadline > 0
                     ? deadline
                     : now_ns + static_cast<int64_t>(options_.no_deadline_horizon_us) * 1000;
    if (deadline > 0 && !probe) e.doomed_ns = deadline - service_.PredictNs(items);
    e.probe = probe;
  }
  e.task = std::move(task);
  next_expiry_ns_ = std::min({next_expiry_ns_, e.expire_ns, e.doomed_ns});
  InsertOrdered(l.queue, std::move(e));
  l.items += items;
  ++size_;
  return Status::Ok();
}

template <typename Task>
double Batcher<Task>::admission_reserve() const {
  if (!slo()) return 0.0;  // no admission by prediction
  const double learned = options_.overrun_quantile > 0 ? overrun_.share() : 0.0;
  return std::max(options_.deadline_reserve, std::min(learned, kMaxReserve));
}

template <typename Task>
void Batcher<Task>::ObserveAnswer(int64_t enqueued_ns, int64_t predicted_finish_ns,
                                  int64_t deadline_ns, int64_t answered_ns) {
  if (!slo() || options_.overrun_quantile <= 0 || predicted_finish_ns <= 0 ||
      deadline_ns <= enqueued_ns)
    return;
  overrun_.Observe(static_cast<double>(answered_ns - predicted_finish_ns) /
                   static_cast<double>(deadline_ns - enqueued_ns));
}

template <typename Task>
void Batcher<Task>::InsertOrdered(std::deque<Entry>& dq, Entry e) {
  // Arrivals mostly come in order: check the back first.
  if (dq.empty() || dq.back().order_ns <= e.order_ns) {
    dq.push_back(std::move(e));
    return;
  }
  auto it = std::upper_bound(dq.begin(), dq.end(), e.order_ns,
                             [](int64_t v, const Entry& x) { return v < x.order_ns; });
  dq.insert(it, std::move(e));
}

template <typename Task>
void Batcher<Task>::Promote(int64_t now_ns) {
  const int64_t step = static_cast<int64_t>(options_.priority_aging_us) * 1000;
  if (step <= 0 || levels_.size() < 2) return;
  // From the lowest level up, so a task that waited several intervals climbs several.
  for (size_t i = levels_.size() - 1; i >= 1; --i) {
    Level& from = levels_[i];
    Level& to = levels_[i - 1];
    for (auto it = from.queue.begin(); it != from.queue.end();) {
      if (now_ns - it->level_since_ns < step) {
        ++it;
        continue;
      }
      Entry e = std::move(*it);
      it = from.queue.erase(it);
      e.level_since_ns += step;
      const int64_t n = e.task->batch_size();
      from.items -= n;
      to.items += n;
      InsertOrdered(to.queue, std::move(e));
    }
  }
}

template <typename Task>
std::vector<std::deque<typename Batcher<Task>::Entry>*> Batcher<Task>::QueuesInOrder() {
  std::vector<std::deque<Entry>*> out;
  out.reserve(2 * levels_.size());
  for (Level& l : levels_) out.push_back(&l.queue);
  for (Level& l : levels_) out.push_back(&l.delayed);
  return out;
}

template <typename Task>
typename Batcher<Task>::Level& Batcher<Task>::LevelOf(const std::deque<Entry>* dq) {
  for (Level& l : levels_) {
    if (&l.queue == dq || &l.delayed == dq) return l;
  }
  return levels_.front();  // unreachable: every queue belongs to a level
}

template <typename Task>
double Batcher<Task>::arrival_rate_per_s(int64_t now_ns) const {
  const double tau = static_cast<double>(options_.arrival_window_us) * 1000.0;
  const double decayed =
      arrivals_ *
      std::exp(-static_cast<double>(std::max<int64_t>(now_ns - arrivals_at_ns_, 0)) / tau);
  return decayed / tau * 1e9;
}

template <typename Task>
int64_t Batcher<Task>::target_batch(int64_t now_ns) const {
  if (max_items() <= 1) return 1;
  // Throughput with batches of n: instances·n / (a + b·n) items per ns. The target is the
  // smallest n for which that covers the arrival rate with headroom.
  const double rate = arrival_rate_per_s(now_ns) / 1e9 * options_.throughput_headroom;
  const double m = std::max(service_.instances, 1);
  const double spare = m - rate * service_.b_ns;
  if (spare <= 0) return max_items();
  const double n = std::ceil(rate * service_.a_ns / spare);
  if (!(n < static_cast<double>(max_items()))) return max_items();
  return std::max<int64_t>(1, static_cast<int64_t>(n));
}

template <typename Task>
typename Batcher<Task>::Decision Batcher<Task>::FormBatch(int64_t now_ns, bool force) {
  Decision d;
  if (size_ == 0) return d;
  Promote(now_ns);
  auto queues = QueuesInOrder();
  const auto take = [&](size_t q, size_t index) {
    auto& dq = *queues[q];
    Level& l = LevelOf(&dq);
    l.items -= dq[index].task->batch_size();
    d.batch.push_back(std::move(dq[index].task));
  };
  if (options_.max_batch_size == 0) {
    // Not batching across requests: the head task alone, at once.
    for (size_t q = 0; q < queues.size(); ++q) {
      if (queues[q]->empty()) continue;
      take(q, 0);
      queues[q]->pop_front();
      --size_;
      RecomputeExpiry();
      if (size_ > 0) d.wake_at_ns = now_ns;
      return d;
    }
  }

  // Walk in order, collecting the candidate: (queue, index) of each member.
  struct Pick {
    size_t queue;
    size_t index;
  };
  std::vector<Pick> picks;
  int64_t total = 0;
  size_t best_preferred_picks = 0;  // longest prefix whose size is a preferred size
  int64_t best_preferred_total = 0;
  int64_t oldest_ns = kNever;
  int64_t earliest_deadline_ns = kNever;
  const int64_t max = max_items();
  // kSlo: the batch size the arrival rate needs. A task that cannot meet its deadline even
  // in a batch that small is left out (it expires unrun at its doomed time): shrinking
  // every batch to save the tightest deadline would fall behind the load and make
  // everyone late. But never every task: if all would be left out (the estimate may be
  // stale), the walk is made again without that rule, so something runs and the estimate
  // is refreshed.
  const int64_t target = slo() ? target_batch(now_ns) : max;
  const int64_t needed_ns = slo() ? service_.PredictNs(target) : 0;
  bool skipped = false;
  for (int pass = 0; pass < 2 && picks.empty(); ++pass) {
    const bool may_skip = slo() && !force && pass == 0;
    if (pass == 1 && !skipped) break;
    bool have_bucket = false;
    uint64_t bucket = 0;
    bool stop = false;
    for (size_t q = 0; q < queues.size() && !stop; ++q) {
      auto& dq = *queues[q];
      for (size_t i = 0; i < dq.size(); ++i) {
        const Task& t = *dq[i].task;
        if (may_skip && !dq[i].probe && t.deadline_ns() > 0 &&
            now_ns + needed_ns > t.deadline_ns()) {
          skipped = true;
          continue;
        }
        if (!have_bucket) {
          bucket = t.shape_key();
          have_bucket = true;
        } else if (t.shape_key() != bucket) {
          continue;
        }
        if (total + t.batch_size() > max) {
          stop = true;
          break;
        }
        const int64_t deadline = t.deadline_ns() > 0 ? t.deadline_ns() : kNever;
        const int64_t new_earliest = std::min(earliest_deadline_ns, deadline);
        if (slo() && total >= target && new_earliest != kNever &&
            now_ns + service_.PredictNs(total + t.batch_size()) > new_earliest &&
            now_ns + service_.PredictNs(total) <= earliest_deadline_ns) {
          // Growing the batch past the target would make a member miss its deadline; the
          // smaller one meets every member's and still keeps up with the load.
          stop = true;
          break;
        }
        total += t.batch_size();
        picks.push_back({q, i});
        oldest_ns = std::min(oldest_ns, dq[i].enqueue_ns);
        earliest_deadline_ns = new_earliest;
        if (preferred_.count(total)) {
          best_preferred_picks = picks.size();
          best_preferred_total = total;
        }
        if (total == max) {
          stop = true;
          break;
        }
      }
    }
  }

  size_t release = 0;
  const int64_t largest_preferred = preferred_.empty() ? 0 : *preferred_.rbegin();
  const int64_t delay_ns = static_cast<int64_t>(options_.max_queue_delay_us) * 1000;
  const bool delay_passed = now_ns - oldest_ns >= delay_ns;
  if (picks.empty()) return d;
  if (total == max) {
    release = picks.size();
  } else if (largest_preferred > 0 && best_preferred_total == largest_preferred) {
    release = best_preferred_picks;
  } else if (force) {
    release = picks.size();
  } else if (delay_passed || slo()) {
    // kSlo releases at once, whatever the size: the caller asks only when an instance is
    // free, and an idle instance that waits for more only delays the tasks already
    // queued. Nor does waiting keep up with the load: what arrives during this run is
    // queued when the instance is free again and leaves in the next batch, so batch sizes
    // grow with the arrival rate by themselves, up to max_batch_size.
    // The largest preferred-size prefix if there is one worth sending, else everything.
    release = best_preferred_picks > 0 && (!slo() || best_preferred_total >= target)
                  ? best_preferred_picks
                  : picks.size();
  } else {
    d.wake_at_ns = oldest_ns + delay_ns;
    return d;
  }

  // Move the released picks out, then erase them (highest index first per queue).
  picks.resize(release);
  d.batch.reserve(release);
  for (const Pick& p : picks) take(p.queue, p.index);
  for (auto it = picks.rbegin(); it != picks.rend(); ++it) {
    auto& dq = *queues[it->queue];
    dq.erase(dq.begin() + static_cast<std::ptrdiff_t>(it->index));
  }
  size_ -= release;
  RecomputeExpiry();
  if (size_ > 0) d.wake_at_ns = now_ns;  // more may be ready: ask again
  return d;
}

template <typename Task>
std::vector<typename Batcher<Task>::Expired> Batcher<Task>::TakeExpired(int64_t now_ns) {
  std::vector<Expired> out;
  if (now_ns < next_expiry_ns_) return out;
  for (Level& l : levels_) {
    for (auto it = l.queue.begin(); it != l.queue.end();) {
      const bool doomed = it->doomed_ns <= now_ns;
      if (!doomed && it->expire_ns > now_ns) {
        ++it;
        continue;
      }
      if (doomed || l.policy.timeout_action == TimeoutAction::kReject) {
        l.items -= it->task->batch_size();
        out.push_back(
            {std::move(it->task), doomed ? ExpiryReason::kDeadline : ExpiryReason::kQueueTimeout});
        --size_;
      } else {
        it->expire_ns = kNever;
        l.delayed.push_back(std::move(*it));
      }
      it = l.queue.erase(it);
    }
    for (auto it = l.delayed.begin(); it != l.delayed.end();) {
      if (it->doomed_ns > now_ns) {
        ++it;
        continue;
      }
      l.items -= it->task->batch_size();
      out.push_back({std::move(it->task), ExpiryReason::kDeadline});
      --size_;
      it = l.delayed.erase(it);
    }
  }
  RecomputeExpiry();
  return out;
}

template <typename Task>
template <typename Pred>
std::vector<std::unique_ptr<Task>> Batcher<Task>::RemoveIf(Pred pred) {
  std::vector<std::unique_ptr<Task>> out;
  for (Level& l : levels_) {
    for (auto* dq : {&l.queue, &l.delayed}) {
      for (auto it = dq->begin(); it != dq->end();) {
        if (pred(*it->task)) {
          l.items -= it->task->batch_size();
          out.push_back(std::move(it->task));
          it = dq->erase(it);
          --size_;
        } else {
          ++it;
        }
      }
    }
  }
  RecomputeExpiry();
  return out;
}

template <typename Task>
std::vector<std::unique_ptr<Task>> Batcher<Task>::TakeAll() {
  return RemoveIf([](const Task&) { return true; });
}

template <typename Task>
int64_t Batcher<Task>::queued_items() const {
  int64_t n = 0;
  for (const Level& l : levels_) n += l.items;
  return n;
}

template <typename Task>
size_t Batcher<Task>::level_size(uint32_t level) const {
  if (level < 1 || level > levels_.size()) return 0;
  return levels_[level - 1].queue.size() + levels_[level - 1].delayed.size();
}

template <typename Task>
void Batcher<Task>::RecomputeExpiry() {
  next_expiry_ns_ = kNever;
  for (const Level& l : levels_) {
    for (const Entry& e : l.queue)
      next_expiry_ns_ = std::min({next_expiry_ns_, e.expire_ns, e.doomed_ns});
    for (const Entry& e : l.delayed) next_expiry_ns_ = std::min(next_expiry_ns_, e.doomed_ns);
  }
}

}  // namespace shoal::runtime
