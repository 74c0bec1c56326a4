// StagePipeline with plain stage functions: order, bounded queues, errors, a failing
// init, destruction with work inside, and the bubble ratio on a fake clock.
#include "engine/stage_pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace shoal::engine {
namespace {

using ::testing::HasSubstr;

StagePipeline::Options Opts(int stages, int capacity) {
  StagePipeline::Options o;
  o.stages = stages;
  o.queue_capacity = capacity;
  return o;
}

// A gate a stage waits at until the test opens it.
class Gate {
 public:
  void Open() {
    MutexLock lock(&mu_);
    open_ = true;
    cv_.SignalAll();
  }
  void Wait() {
    MutexLock lock(&mu_);
    while (!open_) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool open_ GUARDED_BY(mu_) = false;
};

TEST(StagePipelineTest, RejectsBadOptions) {
  auto run = [](int, MicroBatch*) { return Status::Ok(); };
  EXPECT_FALSE(StagePipeline::Create(Opts(0, 1), nullptr, run).ok());
  EXPECT_FALSE(StagePipeline::Create(Opts(2, 0), nullptr, run).ok());
  EXPECT_FALSE(StagePipeline::Create(Opts(2, 1), nullptr, nullptr).ok());
}

TEST(StagePipelineTest, EveryStageSeesItemsInOrder) {
  constexpr int kStages = 3, kItems = 40;
  std::vector<std::vector<int>> seen(kStages);  // each written by its stage's thread only
  auto p = StagePipeline::Create(Opts(kStages, 2), nullptr, [&](int s, MicroBatch* item) {
    seen[static_cast<size_t>(s)].push_back(item->index);
    item->tensors["s" + std::to_string(s)] = Tensor();
    return Status::Ok();
  });
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<MicroBatch> items(kItems);
  for (int i = 0; i < kItems; ++i) items[static_cast<size_t>(i)].index = i;
  ASSERT_TRUE((*p)->Run(&items).ok());
  std::vector<int> want(kItems);
  for (int i = 0; i < kItems; ++i) want[static_cast<size_t>(i)] = i;
  for (int s = 0; s < kStages; ++s) EXPECT_EQ(seen[static_cast<size_t>(s)], want) << s;
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(items[static_cast<size_t>(i)].index, i);
    EXPECT_EQ(items[static_cast<size_t>(i)].tensors.size(), 3u);
  }
  EXPECT_EQ((*p)->stats().items, kItems);
}

TEST(StagePipelineTest, QueuesStayBounded) {
  constexpr int kCapacity = 2, kItems = 12;
  Gate gate;
  std::atomic<int> submitted{0};
  auto p = StagePipeline::Create(Opts(2, kCapacity), nullptr, [&](int s, MicroBatch* item) {
    if (s == 1 && item->index == 0) gate.Wait();
    return Status::Ok();
  });
  ASSERT_TRUE(p.ok());
  std::atomic<int> done{0};
  std::thread producer([&] {
    for (int i = 0; i < kItems; ++i) {
      MicroBatch item;
      item.index = i;
      (*p)->Submit(std::move(item), [&](MicroBatch) { ++done; });
      ++submitted;
    }
  });
  // Stage 2 holds item 0; its queue fills, stage 1 holds one it cannot pass on, stage
  // 1's queue fills, and the producer blocks: 1 + 2 + 1 + 2 items submitted.
  while ((*p)->QueueDepths() != std::vector<int>{kCapacity, kCapacity}) std::this_thread::yield();
  while (submitted.load() < 2 * kCapacity + 2) std::this_thread::yield();
  for (int i = 0; i < 1000; ++i) std::this_thread::yield();
  EXPECT_EQ(submitted.load(), 2 * kCapacity + 2);
  for (int d : (*p)->QueueDepths()) EXPECT_LE(d, kCapacity);
  EXPECT_EQ(done.load(), 0);
  gate.Open();
  producer.join();
  while (done.load() < kItems) std::this_thread::yield();
  EXPECT_EQ((*p)->stats().items, kItems);
}

TEST(StagePipelineTest, AFailingStageFailsOnlyItsItemAndSkipsLaterStages) {
  std::atomic<int> second_stage_runs{0};
  auto p = StagePipeline::Create(Opts(2, 1), nullptr, [&](int s, MicroBatch* item) {
    if (s == 0 && item->index == 3) return Internal("stage one broke on item 3");
    if (s == 1) ++second_stage_runs;
    return Status::Ok();
  });
  ASSERT_TRUE(p.ok());
  std::vector<MicroBatch> items(6);
  for (int i = 0; i < 6; ++i) items[static_cast<size_t>(i)].index = i;
  Status s = (*p)->Run(&items);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("item 3"));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(items[static_cast<size_t>(i)].status.ok(), i != 3) << i;
  EXPECT_EQ(second_stage_runs.load(), 5);
  // The pipeline keeps working after a failure.
  std::vector<MicroBatch> more(2);
  EXPECT_TRUE((*p)->Run(&more).ok());
}

TEST(StagePipelineTest, AFailingInitFailsCreate) {
  auto p = StagePipeline::Create(
      Opts(3, 1), [](int s) { return s == 2 ? InvalidArgument("no cores for me") : Status::Ok(); },
      [](int, MicroBatch*) { return Status::Ok(); });
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("pipeline stage 3"));
  EXPECT_THAT(p.status().message(), HasSubstr("no cores for me"));
}

TEST(StagePipelineTest, DestroyWithWorkInsideAnswersEveryItemOnce) {
  constexpr int kItems = 5;
  Gate gate, entered;
  // Stage 1 holds item 0 until the gate opens; the other items wait in its queue.
  auto p = StagePipeline::Create(Opts(2, kItems - 1), nullptr, [&](int s, MicroBatch* item) {
    if (s == 0 && item->index == 0) {
      entered.Open();
      gate.Wait();
    }
    return Status::Ok();
  });
  ASSERT_TRUE(p.ok());
  std::vector<std::atomic<int>> answers(kItems);
  std::vector<Status> statuses(kItems);  // each written once, before its answer count
  for (int i = 0; i < kItems; ++i) {
    MicroBatch item;
    item.index = i;
    (*p)->Submit(std::move(item), [&, i](MicroBatch done) {
      statuses[static_cast<size_t>(i)] = done.status;
      ++answers[static_cast<size_t>(i)];
    });
  }
  entered.Wait();
  StagePipeline* raw = p->get();
  std::thread destroyer([&] { p->reset(); });
  // The destructor has begun (it waits for stage 1's item) before the item may finish.
  while (!raw->shutting_down()) std::this_thread::yield();
  gate.Open();
  destroyer.join();
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(answers[static_cast<size_t>(i)].load(), 1) << i;
    const Status& st = statuses[static_cast<size_t>(i)];
    EXPECT_EQ(st.code(), StatusCode::kCancelled) << i << ": " << st.ToString();
  }
}

TEST(StagePipelineTest, BubbleRatioOfOneItemThroughTwoStagesIsHalf) {
  std::atomic<int64_t> clock{0};
  StagePipeline::Options o = Opts(2, 1);
  o.now_ns = [&] { return clock.load(); };
  auto p = StagePipeline::Create(o, nullptr, [&](int, MicroBatch*) {
    clock += 10;  // each stage takes 10 ns of fake time
    return Status::Ok();
  });
  ASSERT_TRUE(p.ok());
  std::vector<MicroBatch> one(1);
  ASSERT_TRUE((*p)->Run(&one).ok());
  const StagePipelineStats s = (*p)->stats();
  EXPECT_EQ(s.busy_span_ns, 20);
  EXPECT_EQ(s.stage_busy_ns, (std::vector<int64_t>{10, 10}));
  EXPECT_DOUBLE_EQ(s.bubble_ratio(), 0.5);
  EXPECT_DOUBLE_EQ(StagePipelineStats().bubble_ratio(), 0.0);
}

}  // namespace
}  // namespace shoal::engine
