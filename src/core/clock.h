// Clock: where every scheduling component gets the time, so tests can step it.
//
// The batcher, admission and cache never read the system clock; they ask a Clock.
// RealClock reads std::chrono::steady_clock. FakeClock only moves when a test calls
// Advance(), and tells its subscribers, so a thread that waits for a time point can be
// woken by the test instead of by the passage of real time.
//
// Thread safety: all methods are safe to call from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/mutex.h"

namespace shoal {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds since an arbitrary epoch.
  virtual int64_t NowNs() const = 0;
  // True when time only moves by Advance(): waiters must not use real timeouts.
  virtual bool is_fake() const { return false; }
  // Called (from the advancing thread) whenever fake time moves; no-op for real clocks.
  // Returns an id for Unsubscribe.
  virtual int Subscribe(std::function<void()> on_advance) { return -1; }
  virtual void Unsubscribe(int id) {}

  // The process-wide real clock.
  static std::shared_ptr<Clock> Real();
};

class RealClock final : public Clock {
 public:
  int64_t NowNs() const override;
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 1'000'000'000) : now_ns_(start_ns) {}
  int64_t NowNs() const override;
  bool is_fake() const override { return true; }
  int Subscribe(std::function<void()> on_advance) override;
  void Unsubscribe(int id) override;

  void AdvanceNs(int64_t ns);
  void AdvanceUs(int64_t us) { AdvanceNs(us * 1000); }
  void AdvanceMs(int64_t ms) { AdvanceNs(ms * 1'000'000); }

 private:
  mutable Mutex mu_;
  int64_t now_ns_ GUARDED_BY(mu_);
  int next_id_ GUARDED_BY(mu_) = 0;
  std::vector<std::pair<int, std::function<void()>>> subscribers_ GUARDED_BY(mu_);
};

// Wall-clock milliseconds since the Unix epoch (for "last_inference" style fields).
int64_t WallTimeMs();

}  // namespace shoal
