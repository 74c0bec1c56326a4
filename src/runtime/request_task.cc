#include "runtime/request_task.h"

namespace shoal::runtime {

bool RequestControl::Allowed(RequestState from, RequestState to) {
  switch (from) {
    case RequestState::kReceived:
      return to == RequestState::kQueued || to == RequestState::kDone;
    case RequestState::kQueued:
      return to == RequestState::kExecuting || to == RequestState::kDone;
    case RequestState::kExecuting:
      return to == RequestState::kDone;
    case RequestState::kDone:
      return false;
  }
  return false;
}

bool RequestControl::Transition(RequestState from, RequestState to) {
  if (!Allowed(from, to)) return false;
  return state_.compare_exchange_strong(from, to, std::memory_order_acq_rel);
}

bool RequestControl::Finish() {
  RequestState cur = state_.load(std::memory_order_acquire);
  while (cur != RequestState::kDone) {
    if (state_.compare_exchange_weak(cur, RequestState::kDone, std::memory_order_acq_rel))
      return true;
  }
  return false;
}

void RequestControl::Cancel() {
  if (cancel_.exchange(true, std::memory_order_acq_rel)) return;
  if (state() == RequestState::kQueued && on_cancel_) on_cancel_();
}

}  // namespace shoal::runtime
