#include "runtime/batcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shoal::runtime {
namespace {

struct FakeTask {
  int id = 0;
  int64_t size = 1;
  uint64_t key = 0;
  uint32_t prio = 0;
  uint64_t timeout = 0;
  int64_t deadline = 0;
  int64_t batch_size() const { return size; }
  uint64_t shape_key() const { return key; }
  uint32_t priority() const { return prio; }
  uint64_t timeout_us() const { return timeout; }
  int64_t deadline_ns() const { return deadline; }
};

constexpr int64_t kUs = 1000;
constexpr int64_t kMs = 1000 * kUs;

std::unique_ptr<FakeTask> T(int id, int64_t size = 1, uint64_t key = 0, uint32_t prio = 0) {
  auto t = std::make_unique<FakeTask>();
  t->id = id;
  t->size = size;
  t->key = key;
  t->prio = prio;
  return t;
}

std::vector<int> Ids(const std::vector<std::unique_ptr<FakeTask>>& batch) {
  std::vector<int> ids;
  for (const auto& t : batch) ids.push_back(t->id);
  return ids;
}

std::unique_ptr<Batcher<FakeTask>> Make(BatcherOptions o) {
  auto b = Batcher<FakeTask>::Create(std::move(o));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

// A batcher with only the size and delay bounds set.
std::unique_ptr<Batcher<FakeTask>> Make(int64_t max_batch_size, uint64_t max_queue_delay_us = 0) {
  BatcherOptions o;
  o.max_batch_size = max_batch_size;
  o.max_queue_delay_us = max_queue_delay_us;
  return Make(std::move(o));
}

void Push(Batcher<FakeTask>& b, std::unique_ptr<FakeTask> t, int64_t now) {
  Status s = b.Enqueue(t, now);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(t, nullptr) << "enqueue returned OK but did not take the task";
}

TEST(BatcherTest, CreateRejectsBadOptionsNamingTheValue) {
  BatcherOptions o;
  o.max_batch_size = -3;
  auto r = Batcher<FakeTask>::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("was -3"), std::string::npos);
  o.max_batch_size = 8;
  o.preferred_batch_sizes = {4, 16};
  r = Batcher<FakeTask>::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("was 16"), std::string::npos);
  o.preferred_batch_sizes = {};
  o.priority_levels = 2;
  o.default_priority_level = 3;
  EXPECT_FALSE(Batcher<FakeTask>::Create(o).ok());
}

TEST(BatcherTest, ZeroDelayReleasesWhatIsQueuedInFifoOrder) {
  auto b = Make(8);
  const int64_t now = 100 * kMs;
  for (int i = 0; i < 3; ++i) Push(*b, T(i), now);
  auto d = b->FormBatch(now);
  EXPECT_EQ(Ids(d.batch), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(b->empty());
}

TEST(BatcherTest, FullBatchReleasedAtOnceRestWaitsForDelay) {
  auto b = Make(4, 500);
  int64_t now = 100 * kMs;
  for (int i = 0; i < 6; ++i) Push(*b, T(i), now);
  auto d = b->FormBatch(now);
  EXPECT_EQ(Ids(d.batch), (std::vector<int>{0, 1, 2, 3}));
  // Two remain; not full, delay not passed: wait until the oldest has waited 500 us.
  d = b->FormBatch(now);
  EXPECT_TRUE(d.batch.empty());
  EXPECT_EQ(d.wake_at_ns, now + 500 * kUs);
  d = b->FormBatch(now + 499 * kUs);
  EXPECT_TRUE(d.batch.empty());
  d = b->FormBatch(now + 500 * kUs);
  EXPECT_EQ(Ids(d.batch), (std::vector<int>{4, 5}));
}

TEST(BatcherTest, DelayCountsFromTheOldestTask) {
  auto b = Make(8, 1000);
  int64_t t0 = 100 * kMs;
  Push(*b, T(0), t0);
  Push(*b, T(1), t0 + 900 * kUs);
  EXPECT_TRUE(b->FormBatch(t0 + 950 * kUs).batch.empty());
  EXPECT_EQ(Ids(b->FormBatch(t0 + 1000 * kUs).batch), (std::vector<int>{0, 1}));
}

TEST(BatcherTest, LargestPreferredSizeReleasesWithoutWaiting) {
  BatcherOptions o;
  o.max_batch_size = 16;
  o.preferred_batch_sizes = {2, 4};
  o.max_queue_delay_us = 10'000;
  auto b = Make(o);
  int64_t now = 100 * kMs;
  for (int i = 0; i < 5; ++i) Push(*b, T(i), now);
  // 5 queued: the largest preferred size (4) is reached, so 4 go now.
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{0, 1, 2, 3}));
  // 1 left; 2 is preferred but not reached: wait for the delay.
  EXPECT_TRUE(b->FormBatch(now).batch.empty());
  Push(*b, T(5), now);
  Push(*b, T(6), now);
  // 3 queued, delay not passed, largest preferred not reached: still wait.
  EXPECT_TRUE(b->FormBatch(now + 5 * kMs).batch.empty());
  // Delay passed: release the largest preferred prefix (2), not all 3.
  EXPECT_EQ(Ids(b->FormBatch(now + 10 * kMs).batch), (std::vector<int>{4, 5}));
  EXPECT_EQ(b->size(), 1u);
}

TEST(BatcherTest, TasksWithSeveralItemsFillByItemsNotCount) {
  auto b = Make(8);
  int64_t now = 100 * kMs;
  Push(*b, T(0, 3), now);
  Push(*b, T(1, 4), now);
  Push(*b, T(2, 2), now);  // would make 9 > 8: stops the walk
  Push(*b, T(3, 1), now);
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{0, 1}));
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{2, 3}));
}

TEST(BatcherTest, ShapeBucketsAreNeverMixed) {
  auto b = Make(8);
  int64_t now = 100 * kMs;
  Push(*b, T(0, 1, /*key=*/7), now);
  Push(*b, T(1, 1, /*key=*/9), now);
  Push(*b, T(2, 1, /*key=*/7), now);
  Push(*b, T(3, 1, /*key=*/9), now);
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{0, 2}));
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{1, 3}));
}

TEST(BatcherTest, HigherPriorityGoesFirstFifoWithinLevel) {
  BatcherOptions o;
  o.max_batch_size = 2;
  o.priority_levels = 3;
  o.default_priority_level = 2;
  auto b = Make(o);
  int64_t now = 100 * kMs;
  Push(*b, T(0, 1, 0, /*prio=*/3), now);
  Push(*b, T(1, 1, 0, /*prio=*/0), now);  // default level 2
  Push(*b, T(2, 1, 0, /*prio=*/1), now);
  Push(*b, T(3, 1, 0, /*prio=*/3), now);
  Push(*b, T(4, 1, 0, /*prio=*/1), now);
  EXPECT_EQ(b->level_size(2), 1u);
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{2, 4}));
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{1, 0}));
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{3}));
}

TEST(BatcherTest, PriorityOutsideLevelsIsRejectedAndCallerKeepsTask) {
  BatcherOptions o;
  o.max_batch_size = 2;
  o.priority_levels = 2;
  o.default_priority_level = 1;
  auto b = Make(o);
  auto t = T(0, 1, 0, /*prio=*/5);
  Status s = b->Enqueue(t, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->id, 0);
  auto big = T(1, /*size=*/3);
  EXPECT_EQ(b->Enqueue(big, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big, nullptr);
}

TEST(BatcherTest, QueueOverflowRejectedAtOnceAndRetryable) {
  BatcherOptions o;
  o.max_batch_size = 4;
  o.default_queue_policy.max_queue_size = 2;
  auto b = Make(o);
  Push(*b, T(0), 0);
  Push(*b, T(1), 0);
  auto t = T(2);
  Status s = b->Enqueue(t, 0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(s.retryable());
  EXPECT_NE(t, nullptr);
  EXPECT_EQ(b->size(), 2u);
  // A model without priority levels has one queue: the message names no level.
  EXPECT_EQ(s.message(), "the queue is full (2 requests); retry later");
}

TEST(BatcherTest, PerLevelQueuePolicyOverridesDefault) {
  BatcherOptions o;
  o.max_batch_size = 4;
  o.priority_levels = 2;
  o.default_priority_level = 2;
  o.default_queue_policy.max_queue_size = 1;
  QueuePolicy unbounded;
  o.priority_queue_policy = {{1, unbounded}};
  auto b = Make(o);
  Push(*b, T(0, 1, 0, 1), 0);
  Push(*b, T(1, 1, 0, 1), 0);
  Push(*b, T(2, 1, 0, 2), 0);
  auto t = T(3, 1, 0, 2);
  const Status s = b->Enqueue(t, 0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "the queue for priority level 2 is full (1 requests); retry later");
}

TEST(BatcherTest, RejectTimeoutAnswersAtThatMoment) {
  BatcherOptions o;
  o.max_batch_size = 4;
  o.max_queue_delay_us = 1'000'000;
  o.default_queue_policy.default_timeout_us = 300;
  auto b = Make(o);
  int64_t now = 100 * kMs;
  Push(*b, T(0), now);
  Push(*b, T(1), now + 100 * kUs);
  EXPECT_EQ(b->next_expiry_ns(), now + 300 * kUs);
  EXPECT_TRUE(b->TakeExpired(now + 299 * kUs).empty());
  auto expired = b->TakeExpired(now + 300 * kUs);
  EXPECT_EQ(Ids(expired), (std::vector<int>{0}));
  EXPECT_EQ(b->next_expiry_ns(), now + 400 * kUs);
  EXPECT_EQ(Ids(b->TakeExpired(now + 400 * kUs)), (std::vector<int>{1}));
  EXPECT_TRUE(b->empty());
}

TEST(BatcherTest, TimeoutOverrideOnlyWhenAllowed) {
  BatcherOptions o;
  o.max_batch_size = 4;
  o.max_queue_delay_us = 1'000'000;
  o.default_queue_policy.default_timeout_us = 1000;
  auto b = Make(o);
  auto t = T(0);
  t->timeout = 10;
  Push(*b, std::move(t), 0);
  EXPECT_EQ(b->next_expiry_ns(), 1000 * kUs);  // override ignored

  o.default_queue_policy.allow_timeout_override = true;
  auto b2 = Make(o);
  auto t2 = T(1);
  t2->timeout = 10;
  Push(*b2, std::move(t2), 0);
  EXPECT_EQ(b2->next_expiry_ns(), 10 * kUs);
}

TEST(BatcherTest, DelayTimeoutMovesTaskBehindOthers) {
  BatcherOptions o;
  o.max_batch_size = 2;
  o.default_queue_policy.timeout_action = TimeoutAction::kDelay;
  o.default_queue_policy.default_timeout_us = 100;
  o.default_queue_policy.allow_timeout_override = true;
  auto b = Make(o);
  auto slow = T(0);
  slow->timeout = 50;
  Push(*b, std::move(slow), 0);
  auto expired = b->TakeExpired(60 * kUs);
  EXPECT_TRUE(expired.empty()) << "DELAY must not answer the task";
  EXPECT_EQ(b->size(), 1u);
  Push(*b, T(1), 60 * kUs);
  Push(*b, T(2), 60 * kUs);
  // The delayed task goes after both newer ones.
  EXPECT_EQ(Ids(b->FormBatch(60 * kUs).batch), (std::vector<int>{1, 2}));
  EXPECT_EQ(Ids(b->FormBatch(60 * kUs).batch), (std::vector<int>{0}));
}

TEST(BatcherTest, DeadlineReleasesEarlyAccountingForExecutionTime) {
  auto b = Make(8, 10'000);
  auto t = T(0);
  t->deadline = 5 * kMs;
  Push(*b, std::move(t), 0);
  auto d = b->FormBatch(1 * kMs, /*exec_estimate_ns=*/2 * kMs);
  EXPECT_TRUE(d.batch.empty());
  EXPECT_EQ(d.wake_at_ns, 3 * kMs);
  EXPECT_EQ(Ids(b->FormBatch(3 * kMs, 2 * kMs).batch), (std::vector<int>{0}));
}

TEST(BatcherTest, NonBatchingModelReleasesOneTaskPerBatch) {
  auto b = Make(0);
  Push(*b, T(0), 0);
  Push(*b, T(1), 0);
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{0}));
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{1}));
}

TEST(BatcherTest, RemoveIfAndTakeAllReturnEveryTaskOnce) {
  auto b = Make(4, 1000);
  for (int i = 0; i < 5; ++i) Push(*b, T(i), 0);
  auto removed = b->RemoveIf([](const FakeTask& t) { return t.id % 2 == 1; });
  EXPECT_EQ(Ids(removed), (std::vector<int>{1, 3}));
  EXPECT_EQ(b->size(), 3u);
  EXPECT_EQ(Ids(b->TakeAll()), (std::vector<int>{0, 2, 4}));
  EXPECT_TRUE(b->empty());
}

TEST(BatcherTest, ForceReleasesBeforeDelay) {
  BatcherOptions o;
  o.max_batch_size = 4;
  o.preferred_batch_sizes = {2};
  o.max_queue_delay_us = 1'000'000;
  auto b = Make(o);
  Push(*b, T(0), 0);
  EXPECT_TRUE(b->FormBatch(0).batch.empty());
  EXPECT_EQ(Ids(b->FormBatch(0, 0, /*force=*/true).batch), (std::vector<int>{0}));
}

}  // namespace
}  // namespace shoal::runtime
