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

#include "runtime/infer_request.h"
#include "runtime/response_cache.h"

namespace shoal::runtime {

enum class RequestState : int { kReceived, kQueued, kExecuting, kDone };

class RequestControl final : public RequestHandle {
 public:
  explicit RequestControl(std::function<void()> on_cancel) : on_cancel_(std::move(on_cancel)) {}

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
};

struct RequestTask {
  InferRequest request;
  InferCallback callback;
  std::shared_ptr<RequestControl> control;
  int64_t items = 1;
  uint64_t key = 0;
  int64_t received_ns = 0;
  int64_t enqueued_ns = 0;
  bool cache_leader = false;
  CacheKey cache_key;

  // Batcher interface.
  int64_t batch_size() const { return items; }
  uint64_t shape_key() const { return key; }
  uint32_t priority() const { return request.priority; }
  uint64_t timeout_us() const { return request.timeout_us; }
  int64_t deadline_ns() const { return request.deadline_ns; }
  bool best_effort() const { return request.best_effort; }
};

}  // namespace shoal::runtime
