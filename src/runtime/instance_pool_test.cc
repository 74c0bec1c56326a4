#include "runtime/instance_pool.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/testing/fake_backend.h"
#include "runtime/testing/wait_until.h"

namespace shoal::runtime {
namespace {

using testing::FakeBackendModel;
using testing::FakeBackendState;
using testing::WaitUntil;

class InstancePoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<InstancePool> Make(int n, int64_t idle_spin_us = 50,
                                     std::vector<int> cores = {}) {
    InstancePool::Options o;
    o.model = &model_;
    for (int i = 0; i < n; ++i) o.instances.push_back({"inst_" + std::to_string(i), i, cores});
    o.clock = clock_;
    o.idle_spin_us = idle_spin_us;
    o.prior_a_ns = 1000;
    o.prior_b_ns = 100;
    auto pool = InstancePool::Create(std::move(o));
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    return std::move(pool).value();
  }
  // Runs a job of `n` items on instance `i` that takes `ns` of fake time.
  void RunJob(InstancePool& pool, int i, int64_t n, int64_t ns) {
    auto idle_periods = [&] {
      const InstanceStats s = pool.Stats()[static_cast<size_t>(i)];
      return s.idle_spins + s.idle_sleeps;
    };
    // A new instance's thread reaches its idle loop once before its first job (nothing else
    // submits here): wait for that, so `before` is not read just ahead of it.
    while (idle_periods() == 0 && pool.Stats()[static_cast<size_t>(i)].executions == 0)
      std::this_thread::yield();
    const int64_t before = idle_periods();
    std::promise<void> done;
    pool.Submit(i, PoolJob{n, [&, n, ns](backends::BackendInstance&, int) {
                             clock_->AdvanceNs(ns);
                             done.set_value();
                             return n;
                           }});
    done.get_future().wait();
    // Wait until the instance recorded the job and went idle again: not only no job left
    // (busy_count), but its thread back in its idle loop (a spin or a sleep begun), so that
    // the next job finds it idle rather than in the moment between the two.
    while (pool.busy_count() > 0 || idle_periods() <= before) std::this_thread::yield();
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<FakeBackendState> state_ = std::make_shared<FakeBackendState>();
  FakeBackendModel model_{state_};
};

TEST_F(InstancePoolTest, CreatesEveryInstanceOnItsOwnThreadBeforeReturning) {
  auto pool = Make(3);
  EXPECT_EQ(state_->instances_created(), 3);
  EXPECT_EQ(pool->size(), 3);
  EXPECT_TRUE(pool->HasIdle());
}

TEST_F(InstancePoolTest, IdleInstancesTieToTheLowestIndex) {
  auto pool = Make(2);
  EXPECT_EQ(pool->Choose(4), 0);
}

TEST_F(InstancePoolTest, BatchGoesToTheInstanceThatWillFinishFirst) {
  auto pool = Make(2);
  // Teach the pool that instance 0 is 5x slower than instance 1.
  for (int n : {1, 4, 8}) {
    RunJob(*pool, 0, n, 5 * (1000 + 100 * n));
    RunJob(*pool, 1, n, 1000 + 100 * n);
  }
  EXPECT_EQ(pool->Choose(8), 1);
  auto stats = pool->Stats();
  EXPECT_NEAR(stats[0].cost_b_ns, 500, 5);
  EXPECT_NEAR(stats[1].cost_b_ns, 100, 1);
  EXPECT_EQ(stats[0].executions, 3);
}

TEST_F(InstancePoolTest, PrefersABusyFastInstanceOverAnIdleVerySlowOne) {
  auto pool = Make(2);
  for (int n : {1, 8}) {
    RunJob(*pool, 0, n, 100 * (1000 + 100 * n));  // very slow
    RunJob(*pool, 1, n, 1000 + 100 * n);
  }
  // Occupy instance 1 with a job that blocks until released.
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> started;
  pool->Submit(1, PoolJob{1, [&, released](backends::BackendInstance&, int) {
                            started.set_value();
                            released.wait();
                            return int64_t{1};
                          }});
  started.get_future().wait();
  // Instance 1 finishes its job (1.1 us) and then 8 items (1.8 us) long before instance 0
  // could do 8 items (180 us).
  EXPECT_EQ(pool->Choose(8), 1);
  pool->Submit(1, PoolJob{8, [](backends::BackendInstance&, int) { return int64_t{8}; }});
  // Now instance 1 has a pending job too: only instance 0 can take more.
  EXPECT_EQ(pool->Choose(8), 0);
  release.set_value();
}

TEST_F(InstancePoolTest, FailingInstanceCreationFailsThePoolNamingTheInstance) {
  InstancePool::Options o;
  o.model = &model_;
  o.instances = {{"good", 0, {}}, {"bad", 1, {}}};
  o.on_ready = [](backends::BackendInstance&, const backends::InstanceInfo& info) {
    return info.name == "bad" ? Internal("boom") : Status::Ok();
  };
  auto pool = InstancePool::Create(std::move(o));
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("instance bad"), std::string::npos);
  EXPECT_NE(pool.status().message().find("boom"), std::string::npos);
}

TEST_F(InstancePoolTest, PinningToANonexistentCoreFails) {
  InstancePool::Options o;
  o.model = &model_;
  o.instances = {{"pinned", 0, {100000}}};
  auto pool = InstancePool::Create(std::move(o));
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("100000"), std::string::npos);
}

// Pins the calling thread to one core for its lifetime; restores the old mask after.
class ScopedPin {
 public:
  explicit ScopedPin(int core) {
    pthread_getaffinity_np(pthread_self(), sizeof(old_), &old_);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    ok_ = pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
  }
  ~ScopedPin() { pthread_setaffinity_np(pthread_self(), sizeof(old_), &old_); }
  bool ok() const { return ok_; }

 private:
  cpu_set_t old_;
  bool ok_ = false;
};

bool HaveCores(std::initializer_list<int> cores) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return false;
  for (int c : cores) {
    if (!CPU_ISSET(c, &set)) return false;
  }
  return true;
}

TEST_F(InstancePoolTest, AJobSubmittedFromAnotherCoreWhileTheInstanceSpinsNeedsNoWake) {
  if (!HaveCores({0, 1})) GTEST_SKIP() << "needs cores 0 and 1";
  ScopedPin pin(0);
  ASSERT_TRUE(pin.ok());
  // A bound far longer than the test: every idle period ends with a job caught spinning.
  auto pool = Make(1, /*idle_spin_us=*/60'000'000, /*cores=*/{1});
  for (int i = 0; i < 20; ++i) RunJob(*pool, 0, 1, 1000);
  const InstanceStats s = pool->Stats()[0];
  EXPECT_EQ(s.executions, 20);
  EXPECT_GE(s.idle_spins, 20);
  EXPECT_EQ(s.idle_sleeps, 0);
}

TEST_F(InstancePoolTest, JobsAnInstanceDispatchesToItselfDoNotStopItsSpin) {
  if (!HaveCores({0, 1})) GTEST_SKIP() << "needs cores 0 and 1";
  ScopedPin pin(0);
  ASSERT_TRUE(pin.ok());
  InstancePool::Options o;
  o.model = &model_;
  o.instances = {{"inst_0", 0, {1}}};
  o.clock = clock_;
  o.idle_spin_us = 60'000'000;
  // As a model version does when its instance goes idle with work queued: the instance's
  // own thread submits the next job, from its own core, once in every two idle periods.
  InstancePool* raw = nullptr;
  std::atomic<int> self_submits{0};
  std::atomic<bool> own_turn{false};
  o.on_idle = [&] {
    if (raw == nullptr || !own_turn.exchange(false)) return;
    ++self_submits;
    raw->Submit(0, PoolJob{1, [](backends::BackendInstance&, int) { return int64_t{1}; }});
  };
  auto created = InstancePool::Create(std::move(o));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto pool = std::move(created).value();
  raw = pool.get();
  for (int i = 0; i < 10; ++i) {
    own_turn = true;
    RunJob(*pool, 0, 1, 1000);  // then the instance submits one job to itself
  }
  while (pool->busy_count() > 0 || self_submits < 10) std::this_thread::yield();
  const InstanceStats s = pool->Stats()[0];
  EXPECT_EQ(s.executions, 20);
  // Every job from this thread (core 0) was caught spinning: the self-submitted ones
  // (core 1) did not count as submitters on the instance's core.
  EXPECT_EQ(s.idle_sleeps, 0);
}

TEST_F(InstancePoolTest, AnInstanceWhoseJobsComeLaterThanTheBoundSleepsAtOnce) {
  auto pool = Make(1, /*idle_spin_us=*/200);
  // Real time is what the spin bounds, so the gaps are real: 2 ms, ten times the bound.
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    RunJob(*pool, 0, 1, 1000);
  }
  const InstanceStats s = pool->Stats()[0];
  // The first idle period (before anything was learnt) may spin; later ones follow gaps
  // longer than the bound and sleep without spinning.
  EXPECT_LE(s.idle_spins, 1);
  EXPECT_GE(s.idle_sleeps, 10);
}

TEST_F(InstancePoolTest, AnInstanceDoesNotSpinForJobsSubmittedFromItsOwnCore) {
  if (!HaveCores({0})) GTEST_SKIP() << "needs core 0";
  ScopedPin pin(0);
  ASSERT_TRUE(pin.ok());
  // Spinning here would only keep the submitter off the core for up to 100 ms each time.
  auto pool = Make(1, /*idle_spin_us=*/100'000, /*cores=*/{0});
  for (int i = 0; i < 10; ++i) RunJob(*pool, 0, 1, 1000);
  const InstanceStats s = pool->Stats()[0];
  EXPECT_LE(s.idle_spins, 1);  // before the first job nothing was known
  EXPECT_GE(s.idle_sleeps, 9);
}

TEST_F(InstancePoolTest, ZeroIdleSpinNeverSpins) {
  auto pool = Make(1, /*idle_spin_us=*/0);
  for (int i = 0; i < 5; ++i) RunJob(*pool, 0, 1, 1000);
  EXPECT_EQ(pool->Stats()[0].idle_spins, 0);
  EXPECT_EQ(pool->Stats()[0].executions, 5);
}

TEST_F(InstancePoolTest, DestroyingAPoolWhoseInstanceSpinsReturnsAtOnce) {
  auto pool = Make(2, /*idle_spin_us=*/60'000'000);
  RunJob(*pool, 0, 1, 1000);
  const auto t0 = std::chrono::steady_clock::now();
  pool.reset();  // the spinners see `wake` and stop; a 60 s spin would hang here
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

// Pipelined instances (BackendInstance::pipeline_depth() > 1, as on a GPU).

backends::ExecuteRequest OneRow(float value) {
  backends::ExecuteRequest r;
  r.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 1}, {value})});
  return r;
}

// A two-phase job: launches one row of `value` on the instance and, when finished, appends
// `value` to `finished` (and its output's first value to `outputs`, if given).
PoolJob LaunchJob(float value, std::vector<float>* finished, std::mutex* mu,
                  std::vector<float>* outputs = nullptr) {
  PoolJob job;
  job.batch_size = 1;
  job.launch = [=](backends::BackendInstance& inst, int, std::function<void()> on_done) {
    const Status launched = inst.Launch(OneRow(value), std::move(on_done));
    EXPECT_TRUE(launched.ok()) << launched.ToString();
    return PoolJob::Finish([=, &inst]() -> int64_t {
      std::vector<NamedTensor> out;
      const Status s = inst.Finish(&out);
      EXPECT_TRUE(s.ok()) << s.ToString();
      std::lock_guard<std::mutex> lock(*mu);
      finished->push_back(value);
      if (outputs && !out.empty()) outputs->push_back(out[0].tensor.values<float>()[0]);
      return 1;
    });
  };
  return job;
}

TEST_F(InstancePoolTest, PipelinedInstanceLaunchesTheNextJobBeforeTheLastFinishes) {
  state_->set_pipeline_depth(2);
  auto pool = Make(1);
  std::mutex mu;
  std::vector<float> finished, outputs;
  state_->Block(1);
  pool->Submit(0, LaunchJob(1, &finished, &mu, &outputs));
  ASSERT_TRUE(state_->WaitForWaiting(1));  // on the "device", blocked
  // One of two places held: it still counts as idle for forming a batch, and a job given to
  // it is expected after the one on its device.
  EXPECT_TRUE(pool->HasIdle());
  EXPECT_EQ(pool->Choose(1), 0);
  pool->Submit(0, LaunchJob(2, &finished, &mu, &outputs));
  // Launched while the first is still on the device.
  ASSERT_TRUE(WaitUntil([&] { return state_->max_outstanding() == 2; }))
      << "the second job was not launched while the first was on the device";
  EXPECT_FALSE(pool->HasIdle());
  EXPECT_EQ(pool->Choose(1), -1) << "both places are taken";
  EXPECT_EQ(pool->busy_count(), 2);
  EXPECT_EQ(pool->Service().idle_instances, 0);
  state_->Unblock(1);
  ASSERT_TRUE(WaitUntil([&] { return pool->busy_count() == 0; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(finished, (std::vector<float>{1, 2})) << "finished in the order launched";
    EXPECT_EQ(outputs, (std::vector<float>{2, 4}));
  }
  EXPECT_EQ(pool->Stats()[0].executions, 2);
  EXPECT_EQ(pool->Stats()[0].pipeline_depth, 2);
  EXPECT_EQ(pool->Stats()[0].overlapped_executions, 1) << "the second, launched behind the first";
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

TEST_F(InstancePoolTest, PipelinedInstanceRunsAOnePhaseJobBehindWhatIsLaunched) {
  state_->set_pipeline_depth(2);
  auto pool = Make(1);
  std::mutex mu;
  std::vector<float> finished;
  state_->Block(1);
  pool->Submit(0, LaunchJob(1, &finished, &mu));
  ASSERT_TRUE(state_->WaitForWaiting(1));
  std::atomic<bool> ran{false};
  pool->Submit(0, PoolJob{1, [&](backends::BackendInstance& inst, int) {
                            std::vector<NamedTensor> out;
                            // Allowed with one batch outstanding; it runs after that one.
                            EXPECT_TRUE(inst.Execute(OneRow(3), &out).ok());
                            ran = true;
                            return int64_t{1};
                          }});
  state_->Unblock(1);
  ASSERT_TRUE(WaitUntil([&] { return pool->busy_count() == 0; }));
  EXPECT_TRUE(ran);
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].row_keys, (std::vector<float>{1}));
  EXPECT_EQ(ex[1].row_keys, (std::vector<float>{3}));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(finished, (std::vector<float>{1}));
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

TEST_F(InstancePoolTest, PipelinedInstanceFinishesEveryLaunchedJobWhenThePoolStops) {
  state_->set_pipeline_depth(2);
  auto pool = Make(1);
  std::mutex mu;
  std::vector<float> finished;
  state_->Block(1);
  pool->Submit(0, LaunchJob(1, &finished, &mu));
  pool->Submit(0, LaunchJob(2, &finished, &mu));
  ASSERT_TRUE(state_->WaitForWaiting(1));
  std::thread unblock([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    state_->Unblock(1);
  });
  pool.reset();  // stops after running every submitted job
  unblock.join();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(finished, (std::vector<float>{1, 2}));
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

TEST_F(InstancePoolTest, PipelinedJobWhoseWakeUpNeverComesIsFinishedAnyway) {
  state_->set_pipeline_depth(2);
  state_->set_drop_on_done(true);
  auto pool = Make(1);
  std::mutex mu;
  std::vector<float> finished;
  const auto start = std::chrono::steady_clock::now();
  pool->Submit(0, LaunchJob(1, &finished, &mu));
  ASSERT_TRUE(WaitUntil([&] { return pool->busy_count() == 0; }))
      << "a launched job without its on_done was never finished";
  // It waited for the wake-up first: at least a second (its predicted time is far less).
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(finished, (std::vector<float>{1}));
}

TEST_F(InstancePoolTest, PipelinedJobsTeachTheCostModelTheTimeEachAdds) {
  state_->set_pipeline_depth(2);
  auto pool = Make(1);
  // Two jobs launched together; the second's time runs from the first's finish (when it
  // could begin on the device), not from its own launch: 300 ns, not 700.
  std::promise<void> first_launched, release_first;
  auto release = release_first.get_future().share();
  std::promise<void> second_launched;
  // The first's work ends when the test releases it; the second's is over by its launch
  // (its on_done comes at once), so its thread finishes it without waiting.
  auto job = [&](std::promise<void>* launched, std::shared_future<void> wait_for,
                 int64_t advance_at_finish) {
    PoolJob j;
    j.batch_size = 4;
    j.launch = [=, this](backends::BackendInstance&, int, std::function<void()> on_done) {
      launched->set_value();
      if (!wait_for.valid()) on_done();
      return PoolJob::Finish([=, this]() -> int64_t {
        if (wait_for.valid()) wait_for.wait();
        clock_->AdvanceNs(advance_at_finish);
        if (wait_for.valid()) on_done();
        return 4;
      });
    };
    return j;
  };
  pool->Submit(0, job(&first_launched, release, 400));
  first_launched.get_future().wait();
  pool->Submit(0, job(&second_launched, {}, 300));
  second_launched.get_future().wait();
  release_first.set_value();
  ASSERT_TRUE(WaitUntil([&] { return pool->busy_count() == 0; }));
  const InstanceStats s = pool->Stats()[0];
  EXPECT_EQ(s.executions, 2);
  EXPECT_EQ(s.busy_ns, 700) << "400 for the first, 300 for the second";
}

}  // namespace
}  // namespace shoal::runtime
