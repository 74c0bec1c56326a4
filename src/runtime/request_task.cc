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
  const RequestState s = state();
  if (on_cancel_ &&
      (s == RequestState::kQueued || (notify_while_executing_ && s == RequestState::kExecuting))) {
    on_cancel_();
  }
}

void CancelForwarder::Cancel() {
  std::shared_ptr<RequestHandle> target;
  {
    MutexLock lock(&mu_);
    cancelled_ = true;
    target = target_;
  }
  if (target) target->Cancel();
}

void CancelForwarder::Set(std::shared_ptr<RequestHandle> target) {
  bool cancelled;
  {
    MutexLock lock(&mu_);
    target_ = target;
    cancelled = cancelled_;
  }
  if (cancelled && target) target->Cancel();
}

}  // namespace shoal::runtime
