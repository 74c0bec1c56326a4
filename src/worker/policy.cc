#include "worker/policy.h"

#include <algorithm>

namespace shoal::worker {

Disposition Decide(StatusCode outcome, int64_t deliveries, int local_retries,
                   int64_t max_deliveries) {
  switch (outcome) {
    case StatusCode::kOk:
      return Disposition::kAnswer;
    case StatusCode::kResourceExhausted:
    case StatusCode::kDeadlineExceeded:
      if (local_retries < kMaxLocalRetries) return Disposition::kRetryHere;
      [[fallthrough]];
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled:
    case StatusCode::kInternal:
      return deliveries >= max_deliveries ? Disposition::kDeadLetter : Disposition::kRetryLater;
    default:
      return Disposition::kDeadLetter;
  }
}

int64_t LocalRetryDelayMs(int local_retries) {
  const int shift = std::clamp(local_retries - 1, 0, 7);
  return int64_t{5} << shift;
}

void CapacityWindow::OnAnswered() {
  if (limit_ >= max_) return;
  if (++credit_ >= limit_) {
    credit_ = 0;
    ++limit_;
  }
}

void CapacityWindow::OnOverloaded() {
  limit_ = std::max<int64_t>(1, limit_ / 2);
  credit_ = 0;
}

}  // namespace shoal::worker
