#include "core/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace shoal {
namespace {

// Whether another thread can take `mu` right now (try_lock from the owner is undefined).
bool FreeForOthers(Mutex& mu) {
  bool taken = false;
  std::thread other([&] {
    if (mu.TryLock()) {
      taken = true;
      mu.Unlock();
    }
  });
  other.join();
  return taken;
}

TEST(MutexTest, MutexLockHoldsForItsScopeAndCanReleaseEarly) {
  Mutex mu;
  EXPECT_TRUE(FreeForOthers(mu));
  {
    MutexLock lock(&mu);
    EXPECT_FALSE(FreeForOthers(mu));
    lock.Unlock();
    EXPECT_TRUE(FreeForOthers(mu));
    lock.Lock();
    EXPECT_FALSE(FreeForOthers(mu));
  }
  EXPECT_TRUE(FreeForOthers(mu));
  {
    MutexLock lock(&mu);
    lock.Unlock();
  }  // released early: the destructor must not unlock again
  EXPECT_TRUE(FreeForOthers(mu));
}

class Flag {
 public:
  void Set(int value) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    value_ = value;
    cv_.SignalAll();
  }
  int WaitForValue() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (value_ == 0) cv_.Wait(&mu_);
    mu_.AssertHeld();  // Wait returns with the mutex held by this thread
    return value_;
  }
  std::cv_status WaitBriefly() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const std::cv_status status = cv_.WaitFor(&mu_, std::chrono::milliseconds(1));
    mu_.AssertHeld();
    return status;
  }
  bool held_by_others() { return !FreeForOthers(mu_); }

 private:
  Mutex mu_;
  CondVar cv_;
  int value_ GUARDED_BY(mu_) = 0;
};

TEST(CondVarTest, WaitReturnsOnceSignalledWithTheMutexHeld) {
  Flag flag;
  std::thread setter([&] { flag.Set(7); });
  EXPECT_EQ(flag.WaitForValue(), 7);
  setter.join();
  EXPECT_FALSE(flag.held_by_others());
}

TEST(CondVarTest, WaitForTimesOutWithoutASignal) {
  Flag flag;
  std::cv_status status = std::cv_status::no_timeout;
  // A spurious wakeup also returns no_timeout: wait again until the timeout shows.
  for (int i = 0; i < 1000 && status == std::cv_status::no_timeout; ++i)
    status = flag.WaitBriefly();
  EXPECT_EQ(status, std::cv_status::timeout);
  EXPECT_FALSE(flag.held_by_others());
}

#ifndef NDEBUG
TEST(MutexDeathTest, AssertHeldAbortsWhenTheCallerDoesNotHoldIt) {
  Mutex mu;
  EXPECT_DEATH(mu.AssertHeld(), "");
  MutexLock lock(&mu);
  mu.AssertHeld();  // held: no abort
}
#endif

}  // namespace
}  // namespace shoal
