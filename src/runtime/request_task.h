// RequestTask: one request inside a model version, from validation to its answer.
//
// State machine (RequestControl::Transition rejects anything else):
//
//   kReceived ──▶ kQueued ──▶ kExecuting ──▶ kDone
//       │            │                        ▲
//       └────────────┴────────────────────────┘
//   kReceived → kDone: invalid, rejected, cache hit or joined result, shutting down
//   kQueued   → kDone: queue timeout (REJECT), cancelled, shut down without draining
//
// kDone is entered exactly once, by whoever answers; the callback is called only by
// that winner, which is how "every request is answered exactly once" is enforced.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/mutex.h"
#include "runtime/infer_request.h"
#include "runtime/response_cache.h"

namespace shoal::runtime {

enum class RequestState : int { kReceived, kQueued, kExecuting, kDone };

class RequestControl final : public RequestHandle {
 public:
  // `on_cancel` runs on the first Cancel while the request is queued, or, with
  // `notify_while_executing` (ensembles: their DAG runs while the request executes), also
  // while it executes.
  explicit RequestControl(std::function<void()> on_cancel, bool notify_while_executing = false)
      : on_cancel_(std::move(on_cancel)), notify_while_executing_(notify_while_executing) {}

  // Moves from `from` to `to` if that is an allowed transition and the current state
  // is `from`. Returns false otherwise (someone else won, or the move is illegal).
  bool Transition(RequestState from, RequestState to);
  // Moves to kDone from any state but kDone. True for exactly one caller.
  bool Finish();
  RequestState state() const { return state_.load(std::memory_order_acquire); }

  void Cancel() override;
  bool cancel_requested() const { return cancel_.load(std::memory_order_acquire); }

  static bool Allowed(RequestState from, RequestState to);

 private:
  std::atomic<RequestState> state_{RequestState::kReceived};
  std::atomic<bool> cancel_{false};
  std::function<void()> on_cancel_;  // pokes the scheduler; set once at construction
  const bool notify_while_executing_;
};

// Forwards a cancel to a handle that exists only later: an ensemble's DAG run, started
// after validation and the cache lookup. A cancel before Set reaches the handle at Set.
class CancelForwarder {
 public:
  void Cancel() EXCLUDES(mu_);
  void Set(std::shared_ptr<RequestHandle> target) EXCLUDES(mu_);

 private:
  Mutex mu_;
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::shared_ptr<RequestHandle> target_ GUARDED_BY(mu_);
};

struct RequestTask {
  InferRequest request;
  InferCallback callback;
  std::shared_ptr<RequestControl> control;
  int64_t items = 1;
  uint64_t key = 0;
  int64_t received_ns = 0;
  int64_t enqueued_ns = 0;
  // The finish the batcher's admission predicted (0: none); its error teaches admission.
  int64_t predicted_finish_ns = 0;
  bool cache_leader = false;
  CacheKey cache_key;
  // Ensembles only: where the request's control sends a cancel (to the DAG run).
  std::shared_ptr<CancelForwarder> forward_cancel;

  // Batcher interface.
  int64_t batch_size() const { return items; }
  uint64_t shape_key() const { return key; }
  uint32_t priority() const { return request.priority; }
  uint64_t timeout_us() const { return request.timeout_us; }
  int64_t deadline_ns() const { return request.deadline_ns; }
  bool best_effort() const { return request.best_effort; }
};

}  // namespace shoal::runtime
