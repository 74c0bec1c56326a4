#include "runtime/batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
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
  bool offline = false;
  int64_t batch_size() const { return size; }
  uint64_t shape_key() const { return key; }
  uint32_t priority() const { return prio; }
  uint64_t timeout_us() const { return timeout; }
  int64_t deadline_ns() const { return deadline; }
  bool best_effort() const { return offline; }
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

std::vector<int> Ids(const std::vector<Batcher<FakeTask>::Expired>& expired) {
  std::vector<int> ids;
  for (const auto& e : expired) ids.push_back(e.task->id);
  return ids;
}

std::unique_ptr<Batcher<FakeTask>> MakeWithPolicy(BatcherOptions o) {
  auto b = Batcher<FakeTask>::Create(std::move(o));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

// The tests up to the kSlo section check Triton's semantics: kFixedWindow.
std::unique_ptr<Batcher<FakeTask>> Make(BatcherOptions o) {
  o.policy = BatchingPolicy::kFixedWindow;
  return MakeWithPolicy(std::move(o));
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
  EXPECT_EQ(s.message(), "the queue is full (2 requests); retry after 0 ms");
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
  EXPECT_EQ(s.message(), "the queue for priority level 2 is full (1 requests); retry after 0 ms");
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

TEST(BatcherTest, FixedWindowIgnoresDeadlinesAsTritonDoes) {
  auto b = Make(8, 10'000);
  ServiceEstimate service;
  service.a_ns = 2 * kMs;  // a batch takes 2 ms
  b->set_service(service);
  auto t = T(0);
  t->deadline = 5 * kMs;
  Push(*b, std::move(t), 0);
  auto d = b->FormBatch(4 * kMs);
  EXPECT_TRUE(d.batch.empty());
  EXPECT_EQ(d.wake_at_ns, 10 * kMs);
  EXPECT_TRUE(b->TakeExpired(6 * kMs).empty()) << "not expired by its deadline either";
  EXPECT_EQ(Ids(b->FormBatch(10 * kMs).batch), (std::vector<int>{0}));
}

TEST(BatcherSloTest, UnderHeavyLoadAFreeInstanceStillTakesWhatIsQueuedAtOnce) {
  BatcherOptions o;
  o.max_batch_size = 8;
  o.max_queue_delay_us = 10'000;
  auto b = MakeWithPolicy(o);
  ServiceEstimate service;
  service.a_ns = 2 * kMs;
  b->set_service(service);
  // A heavy arrival rate makes the target the full batch.
  for (int i = 0; i < 500; ++i) {
    Push(*b, T(100 + i), i * 10 * kUs);
    (void)b->FormBatch(i * 10 * kUs, /*force=*/true);
  }
  const int64_t now = 5 * kMs;
  ASSERT_EQ(b->target_batch(now), 8);
  auto t = T(0);
  t->deadline = now + 5 * kMs;
  Push(*b, std::move(t), now);
  Push(*b, T(1), now);
  // Two queued, target 8, the window not passed: released now all the same. Holding them
  // would only make them later; what arrives meanwhile joins the next batch.
  auto d = b->FormBatch(now);
  EXPECT_EQ(Ids(d.batch), (std::vector<int>{0, 1}));
  EXPECT_TRUE(b->empty());
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
  EXPECT_EQ(Ids(b->FormBatch(0, /*force=*/true).batch), (std::vector<int>{0}));
}

// ---- kSlo: work-conserving, deadline-aware batching and admission ----

ServiceEstimate Service(int64_t a_ns, int64_t b_ns, int instances = 1, int64_t backlog_ns = 0) {
  ServiceEstimate e;
  e.a_ns = static_cast<double>(a_ns);
  e.b_ns = static_cast<double>(b_ns);
  e.instances = instances;
  e.backlog_ns = backlog_ns;
  e.idle_instances = backlog_ns > 0 ? 0 : instances;  // work on hand: every instance busy
  return e;
}

std::unique_ptr<Batcher<FakeTask>> MakeSlo(int64_t max_batch_size, uint64_t max_queue_delay_us,
                                           const ServiceEstimate& service) {
  BatcherOptions o;
  o.max_batch_size = max_batch_size;
  o.max_queue_delay_us = max_queue_delay_us;
  auto b = MakeWithPolicy(std::move(o));
  b->set_service(service);
  return b;
}

std::unique_ptr<FakeTask> D(int id, int64_t deadline_ns, int64_t size = 1) {
  auto t = T(id, size);
  t->deadline = deadline_ns;
  return t;
}

TEST(BatcherSloTest, LoneRequestOnAnIdleInstanceIsReleasedWithoutWaitingForTheWindow) {
  auto b = MakeSlo(8, /*delay_us=*/2000, Service(500 * kUs, 100 * kUs));
  const int64_t now = 100 * kMs;
  Push(*b, T(0), now);
  EXPECT_EQ(b->target_batch(now), 1) << "one arrival in the window is light load";
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{0}));
}

TEST(BatcherSloTest, BatchesGrowWithTheLoadWithoutWaiting) {
  // t(n) = 400 us + 20 us·n on one instance; 5,000 items/s arrive (one per 200 us).
  auto b = MakeSlo(16, /*delay_us=*/5000, Service(400 * kUs, 20 * kUs));
  int64_t now = 0;
  for (int i = 0; i < 2000; ++i, now += 200 * kUs) {
    Push(*b, T(i), now);
    ASSERT_EQ(b->FormBatch(now, /*force=*/true).batch.size(), 1u);  // keep the queue empty
  }
  EXPECT_NEAR(b->arrival_rate_per_s(now), 5000, 100);
  // Batches of n give n / (400 + 20n) items per us: with 20% headroom (6,000/s) n must
  // be at least 2.73, so 3.
  EXPECT_EQ(b->target_batch(now), 3);
  // Drive one instance on a fake clock: a batch is formed whenever the instance is free,
  // and runs t(n). Nothing is ever held back, yet the instance keeps up: every batch
  // takes what arrived during the previous run, and the sizes settle where the run time
  // covers the arrivals (n = 5000/s · t(n): about 2.2).
  int next_id = 10'000;
  int64_t next_arrival = now;
  int64_t free_at = now;
  int64_t items = 0, batches = 0, waited_ns = 0;
  std::map<int, int64_t> arrived;
  const int64_t end = now + 2000 * kMs;
  while (free_at < end) {
    while (next_arrival <= free_at) {
      arrived[next_id] = next_arrival;
      Push(*b, T(next_id++), next_arrival);
      next_arrival += 200 * kUs;
    }
    auto d = b->FormBatch(free_at);
    if (d.batch.empty()) {
      ASSERT_TRUE(b->empty()) << "a free instance never leaves queued work waiting";
      free_at = next_arrival;
      continue;
    }
    const int64_t n = static_cast<int64_t>(d.batch.size());
    for (const auto& task : d.batch) waited_ns += free_at - arrived[task->id];
    items += n;
    ++batches;
    free_at += 400 * kUs + n * 20 * kUs;
  }
  EXPECT_LT(b->size(), 4u) << "kept up with the arrivals";
  const double mean_batch = static_cast<double>(items) / static_cast<double>(batches);
  EXPECT_GT(mean_batch, 1.8);
  EXPECT_LT(mean_batch, 3.0);
  // Each task waited on average less than one run (it waits out at most the run in
  // progress), where holding for the target of 3 makes the first of each batch wait for
  // two more arrivals (400 us).
  EXPECT_LT(static_cast<double>(waited_ns) / static_cast<double>(items), 400.0 * kUs);
}

TEST(BatcherSloTest, TargetIsTheFullBatchWhenNothingSmallerKeepsUp) {
  auto b = MakeSlo(8, 0, Service(400 * kUs, 200 * kUs));
  int64_t now = 0;
  // 10,000 items/s against at most 1 / 200 us = 5,000/s at any size.
  for (int i = 0; i < 3000; ++i, now += 100 * kUs) {
    Push(*b, T(i), now);
    (void)b->FormBatch(now, true);
  }
  EXPECT_EQ(b->target_batch(now), 8);
}

TEST(BatcherSloTest, EarliestDeadlineFirstWithinALevel) {
  auto b = MakeSlo(2, 0, Service(0, 0));
  Push(*b, D(0, 30 * kMs), 0);
  Push(*b, D(1, 10 * kMs), 0);
  Push(*b, D(2, 20 * kMs), 0);
  Push(*b, T(3), 0);  // no deadline: ordered as if 1 s after its arrival
  Push(*b, D(4, 2000 * kMs), 0);
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{1, 2}));
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{0, 3}));
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{4}));
}

TEST(BatcherSloTest, BatchIsNotGrownPastAMembersDeadline) {
  // t(n) = 1 ms + 1 ms·n. Task 0 must finish by 3 ms: a batch of 2 (3 ms) meets it, 3 not.
  auto b = MakeSlo(8, 0, Service(1 * kMs, 1 * kMs));
  Push(*b, D(0, 3 * kMs), 0);
  for (int i = 1; i <= 3; ++i) Push(*b, D(i, 100 * kMs), 0);
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{0, 1}));
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{2, 3}));
}

TEST(BatcherSloTest, UnderOverloadATaskThatCannotMakeItInATargetBatchIsLeftToExpire) {
  // t(n) = 1 ms + 1 ms·n: at the arrival rate below only full batches of 8 (9 ms) keep up.
  auto b = MakeSlo(8, 0, Service(1 * kMs, 1 * kMs));
  for (int i = 0; i < 500; ++i) {
    Push(*b, T(100 + i), i * 10 * kUs);
    (void)b->FormBatch(i * 10 * kUs, /*force=*/true);
  }
  const int64_t now = 5 * kMs;
  ASSERT_EQ(b->target_batch(now), 8);
  b->set_service(Service(1 * kMs, 1 * kMs, 1, 1 * kMs));  // busy: no probe
  // Admitted whatever the prediction (offline: no admission), as if they had come before
  // the load rose; admission would now refuse task 0, which only a full batch follows.
  const auto admitted = [](std::unique_ptr<FakeTask> t) {
    t->offline = true;
    return t;
  };
  Push(*b, admitted(D(0, now + 5 * kMs)), now);  // alone it would make it; in a batch of 8, not
  for (int i = 1; i <= 8; ++i) Push(*b, admitted(D(i, now + 50 * kMs)), now);
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}))
      << "a batch of 8 for those who can make it, not a batch of 3 to save one";
  auto expired = b->TakeExpired(now + 3 * kMs);  // its deadline minus a run alone
  ASSERT_EQ(Ids(expired), (std::vector<int>{0}));
  EXPECT_EQ(expired[0].reason, ExpiryReason::kDeadline);
}

TEST(BatcherSloTest, ATaskThatFindsTheModelIdleRunsWhateverThePrediction) {
  // A stale estimate (one slow first run) says a run takes 50 ms; the SLO is 25 ms.
  auto b = MakeSlo(8, 0, Service(50 * kMs, 0));
  Push(*b, D(0, 25 * kMs), 0);  // idle model: admitted as a probe
  EXPECT_EQ(b->next_expiry_ns(), std::numeric_limits<int64_t>::max()) << "never expired";
  EXPECT_EQ(Ids(b->FormBatch(0).batch), (std::vector<int>{0}));
  // With that run in progress, the same estimate refuses the next one at once.
  b->set_service(Service(50 * kMs, 0, 1, 50 * kMs));
  auto next = D(1, 25 * kMs);
  EXPECT_EQ(b->Enqueue(next, 0).code(), StatusCode::kResourceExhausted);
}

TEST(BatcherSloTest, WhenEveryTaskWouldBeLeftOutTheBatchRunsAnyway) {
  // A stale estimate: a full batch "takes" 30 ms against deadlines 25 ms away, and the
  // arrival rate calls for full batches. Leaving every task out would run nothing, and
  // nothing would ever correct the estimate.
  auto b = MakeSlo(8, 0, Service(2 * kMs, 3500 * kUs, 1, 1 * kMs));
  for (int i = 0; i < 500; ++i) {
    Push(*b, T(100 + i), i * 10 * kUs);
    (void)b->FormBatch(i * 10 * kUs, /*force=*/true);
  }
  const int64_t now = 5 * kMs;
  ASSERT_EQ(b->target_batch(now), 8);
  for (int i = 0; i < 3; ++i) {
    auto t = D(i, now + 25 * kMs);
    t->offline = true;  // admitted whatever the (stale) prediction
    Push(*b, std::move(t), now);
  }
  EXPECT_EQ(Ids(b->FormBatch(now).batch), (std::vector<int>{0, 1, 2})) << "something must run";
}

TEST(BatcherSloTest, AdmissionRefusesWhenThePredictedFinishIsPastTheDeadline) {
  // No batching, 1 ms a run: five queued requests are 5 ms of work ahead.
  auto b = MakeSlo(1, 0, Service(1 * kMs, 0));
  for (int i = 0; i < 5; ++i) Push(*b, T(i), 0);
  auto late = D(5, 4 * kMs);
  RejectReason reason;
  Status s = b->Enqueue(late, 0, &reason);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kOverload);
  EXPECT_NE(s.message().find("deadline"), std::string::npos) << s.message();
  EXPECT_EQ(s.retry_after_ms(), 5) << "the predicted time to drain the queue";
  ASSERT_NE(late, nullptr) << "a refused task stays the caller's";
  // 6 ms of predicted finish fits an 8 ms deadline (25% of it is kept in reserve), not 7.
  auto tight = D(6, 7 * kMs);
  EXPECT_EQ(b->Enqueue(tight, 0).code(), StatusCode::kResourceExhausted);
  Push(*b, D(6, 8 * kMs), 0);
  // With 2 ms of work already on the instance, the retry hint grows by it.
  b->set_service(Service(1 * kMs, 0, 1, 2 * kMs));
  auto later = D(7, 1 * kMs);
  EXPECT_EQ(b->Enqueue(later, 0).retry_after_ms(), 8);
}

TEST(BatcherSloTest, AdmissionReportsItsPredictedFinish) {
  // 1 ms a run, no batching: behind two queued tasks a task is predicted to finish at 3 ms.
  auto b = MakeSlo(1, 0, Service(1 * kMs, 0, 1, 0));
  Push(*b, D(0, 50 * kMs), 0);
  Push(*b, D(1, 50 * kMs), 0);
  auto t = D(2, 50 * kMs);
  int64_t finish = -1;
  ASSERT_TRUE(b->Enqueue(t, 10, nullptr, &finish).ok());
  EXPECT_EQ(finish, 10 + 3 * kMs);
  // A task that finds the model idle (a probe) is predicted its own run.
  auto idle = MakeSlo(1, 0, Service(1 * kMs, 0));
  auto p = D(3, 50 * kMs);
  ASSERT_TRUE(idle->Enqueue(p, 0, nullptr, &finish).ok());
  EXPECT_EQ(finish, 1 * kMs);
  // No deadline, or offline work: nothing to learn from, 0.
  auto none = T(4);
  ASSERT_TRUE(b->Enqueue(none, 0, nullptr, &finish).ok());
  EXPECT_EQ(finish, 0);
  auto offline = D(5, 50 * kMs);
  offline->offline = true;
  finish = -1;
  ASSERT_TRUE(b->Enqueue(offline, 0, nullptr, &finish).ok());
  EXPECT_EQ(finish, 0);
}

// Reports `n` answers that came `late_ns` after their predicted finish, with a 10 ms budget.
void AnswerLate(Batcher<FakeTask>& b, int n, int64_t late_ns) {
  for (int i = 0; i < n; ++i) b.ObserveAnswer(0, 5 * kMs, 10 * kMs, 5 * kMs + late_ns);
  b.RefreshOverrun();
}

TEST(BatcherSloTest, AdmissionKeepsInReserveWhatItsPredictionsRanLateByWhenThatIsMore) {
  // 1 ms a run, no batching, four tasks queued: a new task is predicted to finish at 5 ms.
  const auto queued = [] {
    auto b = MakeSlo(1, 0, Service(1 * kMs, 0, 1, 0));
    for (int i = 0; i < 4; ++i) Push(*b, T(i), 0);
    return b;
  };
  auto b = queued();
  EXPECT_DOUBLE_EQ(b->admission_reserve(), 0.25) << "nothing learned yet: the configured floor";
  auto t = D(10, 7 * kMs);  // 5.25 ms usable: admitted
  ASSERT_TRUE(b->Enqueue(t, 0).ok());

  // Answers have come 4 ms (40% of their 10 ms budget) after their predicted finish: 40%
  // of a task's time is now kept back, and the same task is refused.
  b = queued();
  AnswerLate(*b, 1000, 4 * kMs);
  EXPECT_NEAR(b->admission_reserve(), 0.40, 0.003);
  auto again = D(10, 7 * kMs);  // 4.2 ms usable
  RejectReason reason;
  Status s = b->Enqueue(again, 0, &reason);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kOverload);
  EXPECT_NE(s.message().find("40% of it kept in reserve"), std::string::npos) << s.message();

  // Late by less than the floor: the floor stays.
  b = queued();
  AnswerLate(*b, 1000, 1 * kMs);
  EXPECT_DOUBLE_EQ(b->admission_reserve(), 0.25);

  // The estimate looks at the 99th percentile: 1 late answer in 200 does not move it.
  b = queued();
  for (int i = 0; i < 20; ++i) {
    AnswerLate(*b, 199, 0);
    AnswerLate(*b, 1, 6 * kMs);
  }
  EXPECT_DOUBLE_EQ(b->admission_reserve(), 0.25);

  // Predictions that have become accurate again give the time back (half-life: 500
  // answers).
  b = queued();
  AnswerLate(*b, 1000, 4 * kMs);
  AnswerLate(*b, 5000, 0);
  EXPECT_DOUBLE_EQ(b->admission_reserve(), 0.25);
  auto back = D(11, 7 * kMs);
  EXPECT_TRUE(b->Enqueue(back, 0).ok());
}

TEST(BatcherSloTest, TheLearnedReserveIsBoundedAndCanBeTurnedOff) {
  auto b = MakeSlo(1, 0, Service(1 * kMs, 0));
  AnswerLate(*b, 1000, 20 * kMs);  // twice the budget late
  EXPECT_DOUBLE_EQ(b->admission_reserve(), Batcher<FakeTask>::kMaxReserve);

  BatcherOptions o;
  o.max_batch_size = 1;
  o.deadline_reserve = 0.1;
  o.overrun_quantile = 0;
  auto fixed = MakeWithPolicy(o);
  AnswerLate(*fixed, 1000, 5 * kMs);
  EXPECT_DOUBLE_EQ(fixed->admission_reserve(), 0.1);
  // A floor above the bound is the user's to set.
  o.deadline_reserve = 0.9;
  EXPECT_DOUBLE_EQ(MakeWithPolicy(o)->admission_reserve(), 0.9);

  o.overrun_quantile = 1.0;
  EXPECT_FALSE(Batcher<FakeTask>::Create(o).ok());
}

TEST(BatcherSloTest, AdmissionCountsTheArrivalsThatWillFillTheBatchATaskJoins) {
  // t(n) = 2 ms + 0.25 ms·n, batches of 32 (a full one: 10 ms). 64 items queued: two full
  // batches (20 ms) ahead, then the task's own batch. Deadline 35 ms: with 25% in reserve
  // the predicted finish must be at most 26.25 ms.
  const auto queue_64 = [](Batcher<FakeTask>& b, int64_t at) {
    for (int i = 0; i < 64; ++i) Push(b, T(1000 + i), at);
  };
  // Light load: the 64 arrived long ago and nothing since, so the task's batch holds only
  // itself (2.25 ms): 22.25 ms, admitted.
  {
    auto b = MakeSlo(32, 0, Service(2 * kMs, 250 * kUs));
    queue_64(*b, 0);
    const int64_t now = 2000 * kMs;
    EXPECT_LT(b->arrival_rate_per_s(now), 1);
    auto t = D(0, now + 35 * kMs);
    EXPECT_TRUE(b->Enqueue(t, now).ok());
  }
  // Heavy load (10,000 items/s): during the 20 ms wait far more than 31 arrive, so the
  // task leaves in a full batch: 30 ms, refused. Counting only the items ahead (0 left
  // over beyond the two full batches) predicted 22.25 ms and admitted a task that would
  // answer late.
  {
    auto b = MakeSlo(32, 0, Service(2 * kMs, 250 * kUs));
    int64_t now = 0;
    for (int i = 0; i < 3000; ++i, now += 100 * kUs) {
      Push(*b, T(i), now);
      (void)b->FormBatch(now, /*force=*/true);
    }
    ASSERT_TRUE(b->empty());
    queue_64(*b, now);
    EXPECT_GT(b->arrival_rate_per_s(now), 9000);
    auto t = D(0, now + 35 * kMs);
    RejectReason reason;
    EXPECT_EQ(b->Enqueue(t, now, &reason).code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(reason, RejectReason::kOverload);
    // 40 ms leaves room for the 30 ms: admitted.
    auto roomy = D(1, now + 40 * kMs);
    EXPECT_TRUE(b->Enqueue(roomy, now).ok());
  }
}

TEST(BatcherSloTest, PredictedWaitIsBoundedWithoutDeadlinesAndOfflineWorkIsExempt) {
  BatcherOptions o;
  o.max_batch_size = 1;
  o.max_queue_wait_us = 2000;
  auto b = MakeWithPolicy(o);
  b->set_service(Service(1 * kMs, 0));
  Push(*b, T(0), 0);
  Push(*b, T(1), 0);
  Push(*b, T(2), 0);  // waits 2 ms: at the bound, accepted
  auto t = T(3);
  RejectReason reason;
  EXPECT_EQ(b->Enqueue(t, 0, &reason).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, RejectReason::kOverload);
  t->offline = true;
  Push(*b, std::move(t), 0);
  EXPECT_EQ(b->size(), 4u);
}

TEST(BatcherSloTest, AutomaticWaitBoundIsTheLargerOfOneSecondAndTenFullBatches) {
  auto b = MakeSlo(1, 0, Service(200 * kMs, 0));   // 10 runs = 2 s
  for (int i = 0; i < 10; ++i) Push(*b, T(i), 0);  // the last waits 1.8 s
  auto t = T(10);                                  // would wait 2 s: accepted
  EXPECT_TRUE(b->Enqueue(t, 0).ok());
  auto over = T(11);  // 2.2 s
  EXPECT_EQ(b->Enqueue(over, 0).code(), StatusCode::kResourceExhausted);
}

TEST(BatcherSloTest, TaskWhoseDeadlineCannotBeMetExpiresUnrunWithItsReason) {
  // A run takes 2 ms; the instance is busy (an idle model would run it as a probe).
  auto b = MakeSlo(8, 10'000, Service(2 * kMs, 0, 1, 1 * kMs));
  Push(*b, D(0, 5 * kMs), 0);  // doomed from 3 ms on
  Push(*b, D(1, 50 * kMs), 0);
  EXPECT_EQ(b->next_expiry_ns(), 3 * kMs);
  EXPECT_TRUE(b->TakeExpired(3 * kMs - 1).empty());
  auto expired = b->TakeExpired(3 * kMs);
  ASSERT_EQ(Ids(expired), (std::vector<int>{0}));
  EXPECT_EQ(expired[0].reason, ExpiryReason::kDeadline);
  EXPECT_EQ(b->size(), 1u);
  EXPECT_EQ(b->queued_items(), 1);
}

TEST(BatcherSloTest, AgingLiftsAStarvedLowPriorityTaskAfterItsInterval) {
  BatcherOptions o;
  o.max_batch_size = 1;
  o.priority_levels = 3;
  o.default_priority_level = 1;
  o.priority_aging_us = 10'000;  // 10 ms per level
  auto b = MakeWithPolicy(o);
  b->set_service(Service(0, 0));
  Push(*b, T(0, 1, 0, /*prio=*/3), 0);
  // A steady flood of level-1 work: one new task per ms, one batch per ms.
  int64_t now = 0;
  std::vector<int> order;
  for (int i = 1; i <= 30; ++i, now += kMs) {
    Push(*b, T(i, 1, 0, /*prio=*/1), now);
    for (auto& t : b->FormBatch(now).batch) order.push_back(t->id);
  }
  // Level 3 → 2 at 10 ms, 2 → 1 at 20 ms; at level 1 it sorts before newer arrivals.
  const auto pos = std::find(order.begin(), order.end(), 0) - order.begin();
  EXPECT_EQ(pos, 20) << "ran at 20 ms, after exactly two aging intervals";
}

TEST(BatcherSloTest, StrictPriorityWithoutAgingStillStarves) {
  BatcherOptions o;
  o.max_batch_size = 1;
  o.priority_levels = 2;
  o.default_priority_level = 1;
  auto b = MakeWithPolicy(o);
  b->set_service(Service(0, 0));
  Push(*b, T(0, 1, 0, 2), 0);
  for (int i = 1; i <= 50; ++i) {
    Push(*b, T(i, 1, 0, 1), i * kMs);
    EXPECT_EQ(Ids(b->FormBatch(i * kMs).batch), (std::vector<int>{i}));
  }
}

TEST(BatcherSloTest, FullQueueMessageNamesNoLevelOnASingleLevelModel) {
  BatcherOptions o;
  o.max_batch_size = 4;
  o.default_queue_policy.max_queue_size = 1;
  auto b = MakeWithPolicy(o);
  Push(*b, T(0), 0);
  auto t = T(1);
  RejectReason reason;
  Status s = b->Enqueue(t, 0, &reason);
  EXPECT_EQ(reason, RejectReason::kQueueFull);
  EXPECT_EQ(s.message().find("priority"), std::string::npos) << s.message();
  EXPECT_GE(s.retry_after_ms(), 0);
}

}  // namespace
}  // namespace shoal::runtime
