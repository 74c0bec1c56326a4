// Batcher<Task>: the dynamic batching policy of one model version, as a passive data
// structure. It holds queued tasks and, when asked, says which of them form the next
// batch or when to ask again. It owns no thread and reads no clock: the caller passes
// `now_ns` into every call. In the server a BatchScheduler drives it from one thread;
// tests drive it directly and step time, so batching behaviour is tested exactly.
//
// Semantics follow Triton's dynamic batcher for the same config fields:
//   - Priority levels 1..priority_levels, 1 the highest; a task's priority 0 means the
//     default level. Higher levels are always batched first; FIFO within a level.
//   - Per level queue policy: max_queue_size (0 = unbounded; a full level rejects at once
//     with RESOURCE_EXHAUSTED, retryable); a queue timeout (the task's own when
//     allow_timeout_override, else default_timeout_us; 0 = none). When it passes,
//     REJECT removes the task (TakeExpired returns it to be answered at that moment) and
//     DELAY moves it behind every non-delayed task of every level.
//   - A batch never mixes tasks with different shape_key (shape buckets) and never holds
//     more than max_batch_size items. Walking tasks in priority/FIFO order, the first task
//     fixes the bucket; tasks of other buckets are skipped (they wait for a later batch);
//     the walk stops at the first task of the bucket that does not fit.
//   - A batch is released at once when it is full (max_batch_size, or the largest
//     preferred size); otherwise when its oldest task has waited max_queue_delay_us
//     (releasing the largest preferred-size prefix if any, else everything); or when a
//     task's deadline minus the caller's execution estimate has arrived.
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
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace shoal::runtime {

enum class TimeoutAction { kReject, kDelay };

struct QueuePolicy {
  TimeoutAction timeout_action = TimeoutAction::kReject;
  uint64_t default_timeout_us = 0;  // 0 = no timeout
  bool allow_timeout_override = false;
  uint32_t max_queue_size = 0;  // 0 = unbounded
};

struct BatcherOptions {
  // Largest batch in items; 0 = no batching across requests: each task is its own
  // batch, whatever its size (the caller validates a task's size).
  int64_t max_batch_size = 0;
  // Batch sizes the backend prefers; each in 1..max_batch_size. Empty: none.
  std::vector<int64_t> preferred_batch_sizes;
  // How long the oldest task may wait for more to arrive, in microseconds. Default 0:
  // release whatever is queued as soon as an instance is free.
  uint64_t max_queue_delay_us = 0;
  // Number of priority levels; 0 behaves as 1.
  uint32_t priority_levels = 0;
  // The level of tasks with priority 0. Must be in 1..priority_levels when
  // priority_levels > 0; ignored otherwise.
  uint32_t default_priority_level = 0;
  QueuePolicy default_queue_policy;
  // Per-level overrides, index = level (1-based); levels not listed use the default.
  std::vector<std::pair<uint32_t, QueuePolicy>> priority_queue_policy;
};

template <typename Task>
class Batcher {
 public:
  // Rejects inconsistent options with a message naming the value.
  static StatusOr<std::unique_ptr<Batcher>> Create(BatcherOptions options);

  // Takes the task iff OK. Errors: INVALID_ARGUMENT (priority outside the levels, size
  // above max_batch_size), RESOURCE_EXHAUSTED (the level's queue is full).
  Status Enqueue(std::unique_ptr<Task>& task, int64_t now_ns);

  struct Decision {
    std::vector<std::unique_ptr<Task>> batch;  // empty: nothing to release now
    // When to call FormBatch again if nothing changes (max when the queue is empty).
    int64_t wake_at_ns = std::numeric_limits<int64_t>::max();
  };
  // Forms the next batch if one is due. `exec_estimate_ns` is the caller's estimate of
  // how long a batch takes, used for deadlines. `force` releases whatever is queued
  // (used when draining at shutdown).
  Decision FormBatch(int64_t now_ns, int64_t exec_estimate_ns = 0, bool force = false);

  // Applies queue timeouts at `now_ns`: returns the tasks to answer as timed out (REJECT)
  // and moves DELAY tasks behind the rest.
  std::vector<std::unique_ptr<Task>> TakeExpired(int64_t now_ns);
  // The earliest time at which TakeExpired has work (max if none).
  int64_t next_expiry_ns() const { return next_expiry_ns_; }

  // Removes and returns every queued task for which pred(task) is true (cancellation).
  template <typename Pred>
  std::vector<std::unique_ptr<Task>> RemoveIf(Pred pred);
  // Removes everything (shutdown without draining).
  std::vector<std::unique_ptr<Task>> TakeAll();

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Queued tasks at a level (1-based), delayed ones included.
  size_t level_size(uint32_t level) const;
  const BatcherOptions& options() const { return options_; }

 private:
  struct Entry {
    std::unique_ptr<Task> task;
    int64_t enqueue_ns;
    int64_t expire_ns;  // max when none
  };
  struct Level {
    QueuePolicy policy;
    std::deque<Entry> queue;
    std::deque<Entry> delayed;
  };

  explicit Batcher(BatcherOptions options);
  void RecomputeExpiry();
  // Queues in batching order: each level's main queue, then each level's delayed queue.
  std::vector<std::deque<Entry>*> QueuesInOrder();

  BatcherOptions options_;
  std::vector<Level> levels_;  // index 0 = level 1
  std::set<int64_t> preferred_;
  size_t size_ = 0;
  int64_t next_expiry_ns_ = std::numeric_limits<int64_t>::max();
};

// Implementation details follow.

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
  for (const auto& [level, policy] : o.priority_queue_policy) {
    if (level < 1 || level > levels) {
      return InvalidArgument("priority_queue_policy level must be in 1.." + std::to_string(levels) +
                             "; was " + std::to_string(level));
    }
  }
  return std::unique_ptr<Batcher>(new Batcher(std::move(o)));
}

template <typename Task>
Batcher<Task>::Batcher(BatcherOptions options) : options_(std::move(options)) {
  const uint32_t levels = std::max<uint32_t>(options_.priority_levels, 1);
  levels_ = std::vector<Level>(levels);
  for (Level& l : levels_) l.policy = options_.default_queue_policy;
  for (const auto& [level, policy] : options_.priority_queue_policy)
    levels_[level - 1].policy = policy;
  preferred_.insert(options_.preferred_batch_sizes.begin(), options_.preferred_batch_sizes.end());
}

template <typename Task>
Status Batcher<Task>::Enqueue(std::unique_ptr<Task>& task, int64_t now_ns) {
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
                           std::to_string(std::max<int64_t>(options_.max_batch_size, 1)));
  }
  Level& l = levels_[level - 1];
  if (l.policy.max_queue_size > 0 && l.queue.size() + l.delayed.size() >= l.policy.max_queue_size) {
    const std::string queue =  // a model without priority levels has just one
        levels > 1 ? "the queue for priority level " + std::to_string(level) : "the queue";
    return ResourceExhausted(queue + " is full (" + std::to_string(l.policy.max_queue_size) +
                             " requests); retry later");
  }
  uint64_t timeout_us = l.policy.default_timeout_us;
  if (l.policy.allow_timeout_override && task->timeout_us() > 0) timeout_us = task->timeout_us();
  int64_t expire_ns = std::numeric_limits<int64_t>::max();
  if (timeout_us > 0) expire_ns = now_ns + static_cast<int64_t>(timeout_us) * 1000;
  l.queue.push_back(Entry{std::move(task), now_ns, expire_ns});
  next_expiry_ns_ = std::min(next_expiry_ns_, expire_ns);
  ++size_;
  return Status::Ok();
}

template <typename Task>
std::vector<std::deque<typename Batcher<Task>::Entry>*> Batcher<Task>::QueuesInOrder() {
  std::vector<std::deque<Entry>*> out;
  for (Level& l : levels_) out.push_back(&l.queue);
  for (Level& l : levels_) out.push_back(&l.delayed);
  return out;
}

template <typename Task>
typename Batcher<Task>::Decision Batcher<Task>::FormBatch(int64_t now_ns, int64_t exec_estimate_ns,
                                                          bool force) {
  Decision d;
  if (size_ == 0) return d;
  auto queues = QueuesInOrder();
  if (options_.max_batch_size == 0) {
    // Not batching across requests: the head task alone, at once.
    for (auto* dq : queues) {
      if (dq->empty()) continue;
      d.batch.push_back(std::move(dq->front().task));
      dq->pop_front();
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
  int64_t oldest_ns = std::numeric_limits<int64_t>::max();
  int64_t earliest_deadline_ns = std::numeric_limits<int64_t>::max();
  const int64_t max_items = options_.max_batch_size > 0 ? options_.max_batch_size : 1;
  bool have_bucket = false;
  uint64_t bucket = 0;
  bool stop = false;
  for (size_t q = 0; q < queues.size() && !stop; ++q) {
    auto& dq = *queues[q];
    for (size_t i = 0; i < dq.size(); ++i) {
      const Task& t = *dq[i].task;
      if (!have_bucket) {
        bucket = t.shape_key();
        have_bucket = true;
      } else if (t.shape_key() != bucket) {
        continue;
      }
      if (total + t.batch_size() > max_items) {
        stop = true;
        break;
      }
      total += t.batch_size();
      picks.push_back({q, i});
      oldest_ns = std::min(oldest_ns, dq[i].enqueue_ns);
      if (t.deadline_ns() > 0)
        earliest_deadline_ns = std::min(earliest_deadline_ns, t.deadline_ns());
      if (preferred_.count(total)) {
        best_preferred_picks = picks.size();
        best_preferred_total = total;
      }
      if (total == max_items) {
        stop = true;
        break;
      }
    }
  }

  size_t release = 0;
  const int64_t largest_preferred = preferred_.empty() ? 0 : *preferred_.rbegin();
  const int64_t delay_ns = static_cast<int64_t>(options_.max_queue_delay_us) * 1000;
  const bool delay_passed = now_ns - oldest_ns >= delay_ns;
  const bool deadline_due = earliest_deadline_ns != std::numeric_limits<int64_t>::max() &&
                            earliest_deadline_ns - exec_estimate_ns <= now_ns;
  if (total == max_items || options_.max_batch_size == 0) {
    release = picks.size();
  } else if (largest_preferred > 0 && best_preferred_total == largest_preferred) {
    release = best_preferred_picks;
  } else if (force || delay_passed || deadline_due) {
    release =
        best_preferred_picks > 0 && !force && !deadline_due ? best_preferred_picks : picks.size();
  } else {
    d.wake_at_ns = oldest_ns + delay_ns;
    if (earliest_deadline_ns != std::numeric_limits<int64_t>::max()) {
      d.wake_at_ns = std::min(d.wake_at_ns, earliest_deadline_ns - exec_estimate_ns);
    }
    return d;
  }

  // Move the released picks out, then erase them (highest index first per queue).
  picks.resize(release);
  d.batch.reserve(release);
  for (const Pick& p : picks) d.batch.push_back(std::move((*queues[p.queue])[p.index].task));
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
std::vector<std::unique_ptr<Task>> Batcher<Task>::TakeExpired(int64_t now_ns) {
  std::vector<std::unique_ptr<Task>> out;
  if (now_ns < next_expiry_ns_) return out;
  for (Level& l : levels_) {
    for (auto it = l.queue.begin(); it != l.queue.end();) {
      if (it->expire_ns > now_ns) {
        ++it;
        continue;
      }
      if (l.policy.timeout_action == TimeoutAction::kReject) {
        out.push_back(std::move(it->task));
        --size_;
      } else {
        it->expire_ns = std::numeric_limits<int64_t>::max();
        l.delayed.push_back(std::move(*it));
      }
      it = l.queue.erase(it);
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
size_t Batcher<Task>::level_size(uint32_t level) const {
  if (level < 1 || level > levels_.size()) return 0;
  return levels_[level - 1].queue.size() + levels_[level - 1].delayed.size();
}

template <typename Task>
void Batcher<Task>::RecomputeExpiry() {
  next_expiry_ns_ = std::numeric_limits<int64_t>::max();
  for (const Level& l : levels_) {
    for (const Entry& e : l.queue) next_expiry_ns_ = std::min(next_expiry_ns_, e.expire_ns);
  }
}

}  // namespace shoal::runtime
