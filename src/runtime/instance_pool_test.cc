#include "runtime/instance_pool.h"

#include <gtest/gtest.h>

#include <future>

#include "runtime/testing/fake_backend.h"

namespace shoal::runtime {
namespace {

using testing::FakeBackendModel;
using testing::FakeBackendState;

class InstancePoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<InstancePool> Make(int n) {
    InstancePool::Options o;
    o.model = &model_;
    for (int i = 0; i < n; ++i) o.instances.push_back({"inst_" + std::to_string(i), i, {}});
    o.clock = clock_;
    o.prior_a_ns = 1000;
    o.prior_b_ns = 100;
    auto pool = InstancePool::Create(std::move(o));
    EXPECT_TRUE(pool.ok()) << pool.status().ToString();
    return std::move(pool).value();
  }
  // Runs a job of `n` items on instance `i` that takes `ns` of fake time.
  void RunJob(InstancePool& pool, int i, int64_t n, int64_t ns) {
    std::promise<void> done;
    pool.Submit(i, PoolJob{n, [&, n, ns](backends::BackendInstance&, int) {
                             clock_->AdvanceNs(ns);
                             done.set_value();
                             return n;
                           }});
    done.get_future().wait();
    // Wait until the instance recorded the job and went idle again.
    while (pool.busy_count() > 0) std::this_thread::yield();
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

}  // namespace
}  // namespace shoal::runtime
