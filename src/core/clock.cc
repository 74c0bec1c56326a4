#include "core/clock.h"

#include <algorithm>
#include <chrono>

namespace shoal {

std::shared_ptr<Clock> Clock::Real() {
  static const std::shared_ptr<Clock> clock = std::make_shared<RealClock>();
  return clock;
}

int64_t RealClock::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t FakeClock::NowNs() const {
  MutexLock lock(&mu_);
  return now_ns_;
}

int FakeClock::Subscribe(std::function<void()> on_advance) {
  MutexLock lock(&mu_);
  subscribers_.emplace_back(next_id_, std::move(on_advance));
  return next_id_++;
}

void FakeClock::Unsubscribe(int id) {
  MutexLock lock(&mu_);
  std::erase_if(subscribers_, [id](const auto& s) { return s.first == id; });
}

void FakeClock::AdvanceNs(int64_t ns) {
  std::vector<std::function<void()>> to_call;
  {
    MutexLock lock(&mu_);
    now_ns_ += ns;
    for (const auto& s : subscribers_) to_call.push_back(s.second);
  }
  // Called without the lock so a subscriber may read the clock.
  for (auto& f : to_call) f();
}

int64_t WallTimeMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace shoal
