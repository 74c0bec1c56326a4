// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with Clang
// thread-safety annotations (core/thread_annotations.h), so members marked
// GUARDED_BY(mu_) are checked by the compiler.
//
// libstdc++'s std::mutex and std::lock_guard carry no annotations, so the analysis cannot
// tell that a std::lock_guard holds a mutex. These wrappers add nothing else: same size,
// same cost, same semantics as the std types they wrap (non-recursive, not fair).
//
//   Mutex mu_;
//   CondVar cv_;
//   bool ready_ GUARDED_BY(mu_) = false;
//
//   void Wait() EXCLUDES(mu_) {
//     MutexLock lock(&mu_);
//     while (!ready_) cv_.Wait(&mu_);  // a loop, not a predicate lambda: the analysis
//   }                                  // checks the condition with the lock held
//
// Predicate lambdas are not used because the analysis checks a lambda's body on its own,
// where it cannot know that the lock is held.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/thread_annotations.h"

namespace shoal {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() {
    mu_.lock();
    SetOwner();
  }
  void Unlock() RELEASE() {
    ClearOwner();
    mu_.unlock();
  }
  [[nodiscard]] bool TryLock() TRY_ACQUIRE(true) {
    if (!mu_.try_lock()) return false;
    SetOwner();
    return true;
  }
  // Tells the analysis that the calling thread holds this mutex, for code it cannot
  // follow (a callback run under the lock). Debug builds abort if the caller does not.
  void AssertHeld() const ASSERT_CAPABILITY(this);

 private:
  friend class CondVar;
  void SetOwner() {
#ifndef NDEBUG
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
  }
  void ClearOwner() {
#ifndef NDEBUG
    owner_.store(std::thread::id(), std::memory_order_relaxed);
#endif
  }

  std::mutex mu_;
#ifndef NDEBUG
  std::atomic<std::thread::id> owner_{};
#endif
};

// Holds a Mutex from construction to destruction. Unlock() and Lock() release it and take
// it again inside the scope (to run callbacks without the lock); the destructor releases
// it only if held.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable used with a Mutex. Every wait must be called with the mutex held
// and returns with it held; as with std::condition_variable, wakeups may be spurious, so
// wait in a loop that rechecks the condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    mu->ClearOwner();
    cv_.wait(lock);
    mu->SetOwner();
    lock.release();  // the caller still holds mu
  }
  // std::cv_status::timeout when `deadline` passed without a wakeup.
  template <class Clock, class Duration>
  std::cv_status WaitUntil(Mutex* mu, const std::chrono::time_point<Clock, Duration>& deadline)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    mu->ClearOwner();
    const std::cv_status status = cv_.wait_until(lock, deadline);
    mu->SetOwner();
    lock.release();
    return status;
  }
  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex* mu, const std::chrono::duration<Rep, Period>& timeout)
      REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// Implementation details follow.

inline void Mutex::AssertHeld() const {
#ifndef NDEBUG
  if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
    std::abort();
  }
#endif
}

}  // namespace shoal
