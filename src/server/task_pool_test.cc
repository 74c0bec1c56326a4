#include "server/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

namespace shoal::server {
namespace {

// A latch the test opens once: tasks that wait on it hold their worker.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(TaskPoolTest, RunsEveryTaskOnItsWorkers) {
  TaskPool pool(3, "pool");
  EXPECT_EQ(pool.threads(), 3);
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  std::atomic<int> ran{0}, refused{0};
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(pool.Submit(
        [&] {
          std::lock_guard<std::mutex> lock(mu);
          ran_on.insert(std::this_thread::get_id());
          ++ran;
        },
        [&] { ++refused; }));
  }
  while (pool.started() < 100) std::this_thread::yield();
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(ran_on.count(std::this_thread::get_id()), 0u) << "tasks run on the workers";
}

TEST(TaskPoolTest, TasksRunConcurrentlyOnSeveralThreads) {
  TaskPool pool(2, "pool");
  // Two tasks that each wait for the other: they finish only if both run at once.
  std::atomic<int> arrived{0};
  Gate both;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.Submit(
        [&] {
          if (++arrived == 2) both.Open();
          both.Wait();
        },
        [] {}));
  }
  both.Wait();
  pool.Shutdown();
  EXPECT_EQ(pool.started(), 2);
}

TEST(TaskPoolTest, ShutdownRefusesWhatIsQueuedAndLaterSubmissions) {
  TaskPool pool(1, "pool");
  Gate started, release;
  std::atomic<int> ran{0}, refused{0};
  ASSERT_TRUE(pool.Submit(
      [&] {
        started.Open();
        release.Wait();
        ++ran;
      },
      [&] { ++refused; }));
  started.Wait();  // the only worker is busy: the next two stay queued
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(pool.Submit([&] { ++ran; }, [&] { ++refused; }));
  EXPECT_EQ(pool.queued(), 2);
  std::thread stopper([&] { pool.Shutdown(); });
  // Shutdown refuses the queued tasks at once, then waits for the running one.
  while (refused.load() < 2) std::this_thread::yield();
  EXPECT_EQ(ran.load(), 0);
  release.Open();
  stopper.join();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(refused.load(), 2);
  EXPECT_EQ(pool.started(), 1);
  bool called = false;
  EXPECT_FALSE(pool.Submit([&] { called = true; }, [&] { called = true; }));
  EXPECT_FALSE(called) << "a refused submission runs neither function";
  pool.Shutdown();  // idempotent
}

}  // namespace
}  // namespace shoal::server
