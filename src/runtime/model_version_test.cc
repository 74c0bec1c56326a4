#include "runtime/model_version.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <thread>

#include "runtime/testing/fake_backend.h"
#include "runtime/testing/wait_until.h"

namespace shoal::runtime {
namespace {

using testing::FakeBackendModel;
using testing::FakeBackendState;

// Collects answers by request id; fails the test if an id is answered twice.
class Answers {
 public:
  InferCallback For(const std::string& id) {
    return [this, id](InferResponse r) {
      std::lock_guard<std::mutex> lock(mu_);
      EXPECT_EQ(r.id, id);
      EXPECT_EQ(got_.count(id), 0u) << "request " << id << " answered twice";
      got_.emplace(id, std::move(r));
      cv_.notify_all();
    };
  }
  bool WaitFor(const std::string& id) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return got_.count(id) > 0; });
  }
  bool Has(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return got_.count(id) > 0;
  }
  InferResponse Get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return got_.at(id);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, InferResponse> got_;
};

using testing::WaitUntil;

ModelSignature Sig(int64_t max_batch) {
  ModelSignature sig;
  sig.max_batch_size = max_batch;
  sig.inputs.push_back({"INPUT0", DataType::kFp32, {-1}, false});
  sig.outputs.push_back({"OUTPUT0", DataType::kFp32, {-1}, false});
  return sig;
}

InferRequest Req(const std::string& id, std::vector<float> row, uint32_t priority = 0) {
  InferRequest r;
  r.model_name = "fake";
  r.id = id;
  r.priority = priority;
  const int64_t n = static_cast<int64_t>(row.size());
  r.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, n}, row)});
  return r;
}

class ModelVersionTest : public ::testing::Test {
 protected:
  std::shared_ptr<ModelVersion> Make(ModelVersionOptions o, int instances = 1) {
    o.name = "fake";
    if (o.signature.inputs.empty()) o.signature = Sig(8);
    for (int i = 0; i < instances; ++i) o.instances.push_back({"fake_" + std::to_string(i), i, {}});
    o.clock = clock_;
    auto mv = ModelVersion::Create(std::move(o), std::make_unique<FakeBackendModel>(state_));
    EXPECT_TRUE(mv.ok()) << mv.status().ToString();
    return mv.ok() ? *mv : nullptr;
  }
  static ModelVersionOptions Batching(int64_t max_batch, uint64_t delay_us = 0) {
    ModelVersionOptions o;
    o.signature = Sig(max_batch);
    o.batching.max_batch_size = max_batch;
    o.batching.max_queue_delay_us = delay_us;
    return o;
  }

  // Sends request `id` (key 100) and waits until it holds an instance, blocked there until
  // the test calls state_->Unblock(100). False if it never got there.
  [[nodiscard]] bool Occupy(ModelVersion& mv, const std::string& id) {
    state_->Block(100);
    mv.Infer(Req(id, {100}), answers_.For(id));
    return state_->WaitForWaiting(1);
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::shared_ptr<FakeBackendState> state_ = std::make_shared<FakeBackendState>();
  Answers answers_;
};

TEST_F(ModelVersionTest, AnswersOneRequestWithTheBackendsOutput) {
  auto mv = Make(Batching(8));
  mv->Infer(Req("a", {1.5f, 2}), answers_.For("a"));
  ASSERT_TRUE(answers_.WaitFor("a"));
  InferResponse r = answers_.Get("a");
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].name, "OUTPUT0");
  EXPECT_EQ(r.outputs[0].tensor.shape(), (Shape{1, 2}));
  EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 3.0f);
  EXPECT_EQ(r.outputs[0].tensor.values<float>()[1], 4.0f);
  mv->Shutdown();
  auto s = mv->stats();
  EXPECT_EQ(s.success.count, 1u);
  EXPECT_EQ(s.execution_count, 1u);
  EXPECT_EQ(s.inference_count, 1u);
}

TEST_F(ModelVersionTest, RequestsArrivingWhileBusyRunAsOneBatchAndGetTheirOwnRows) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  for (int i = 1; i <= 3; ++i)
    mv->Infer(Req("r" + std::to_string(i), {float(i)}), answers_.For("r" + std::to_string(i)));
  EXPECT_EQ(mv->queue_depth(), 3u);
  state_->Unblock(100);
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(answers_.WaitFor("r" + std::to_string(i)));
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[1].row_keys, (std::vector<float>{1, 2, 3}));
  for (int i = 1; i <= 3; ++i) {
    auto r = answers_.Get("r" + std::to_string(i));
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.outputs[0].tensor.shape(), (Shape{1, 1}));
    EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 2.0f * i);
  }
  mv->Shutdown();
  auto s = mv->stats();
  EXPECT_EQ(s.batch_stats.at(3).compute_infer.count, 1u);
  EXPECT_EQ(s.batch_stats.at(1).compute_infer.count, 1u);
}

TEST_F(ModelVersionTest, QueueDelayHoldsABatchUntilTheClockPassesIt) {
  auto o = Batching(8, /*delay_us=*/1000);
  o.batching.policy = BatchingPolicy::kFixedWindow;  // Triton's fixed window
  auto mv = Make(std::move(o));
  mv->Infer(Req("a", {1}), answers_.For("a"));
  mv->Infer(Req("b", {2}), answers_.For("b"));
  clock_->AdvanceUs(999);
  EXPECT_FALSE(answers_.Has("a"));
  EXPECT_TRUE(state_->executions().empty());
  clock_->AdvanceUs(1);
  ASSERT_TRUE(answers_.WaitFor("a"));
  ASSERT_TRUE(answers_.WaitFor("b"));
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].row_keys, (std::vector<float>{1, 2}));
}

TEST_F(ModelVersionTest, DifferentShapesAreNeverBatchedTogether) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("two_a", {1, 1}), answers_.For("two_a"));
  mv->Infer(Req("three", {2, 2, 2}), answers_.For("three"));
  mv->Infer(Req("two_b", {3, 3}), answers_.For("two_b"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("three"));
  ASSERT_TRUE(answers_.WaitFor("two_b"));
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[1].row_keys, (std::vector<float>{1, 3}));
  EXPECT_EQ(ex[2].row_keys, (std::vector<float>{2}));
  EXPECT_EQ(answers_.Get("three").outputs[0].tensor.shape(), (Shape{1, 3}));
}

TEST_F(ModelVersionTest, HigherPriorityRunsFirst) {
  auto o = Batching(1);
  o.batching.priority_levels = 2;
  o.batching.default_priority_level = 2;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("low1", {1}, 2), answers_.For("low1"));
  mv->Infer(Req("low2", {2}, 0), answers_.For("low2"));
  mv->Infer(Req("high", {3}, 1), answers_.For("high"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("low2"));
  ASSERT_TRUE(answers_.WaitFor("low1"));
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 4u);
  EXPECT_EQ(ex[1].row_keys[0], 3);
  EXPECT_EQ(ex[2].row_keys[0], 1);
  EXPECT_EQ(ex[3].row_keys[0], 2);
}

// While every instance is busy, arrivals do not wake the scheduler; the instance that
// finishes first takes the queued requests, and an instance left idle is still used at once.
TEST_F(ModelVersionTest, QueuedWorkGoesToTheFirstInstanceToFinishAndIdleOnesStayInUse) {
  auto mv = Make(Batching(8), /*instances=*/2);
  state_->Block(100);
  state_->Block(200);
  mv->Infer(Req("a", {100}), answers_.For("a"));
  ASSERT_TRUE(state_->WaitForWaiting(1));
  mv->Infer(Req("b", {200}), answers_.For("b"));
  ASSERT_TRUE(state_->WaitForWaiting(2));
  for (int i = 1; i <= 3; ++i)
    mv->Infer(Req("r" + std::to_string(i), {float(i)}), answers_.For("r" + std::to_string(i)));
  EXPECT_EQ(mv->queue_depth(), 3u);
  state_->Unblock(100);
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(answers_.WaitFor("r" + std::to_string(i)));
  // "b" still holds the other instance; a new request must not wait for it.
  mv->Infer(Req("n", {5}), answers_.For("n"));
  ASSERT_TRUE(answers_.WaitFor("n"));
  EXPECT_TRUE(answers_.Get("n").status.ok());
  EXPECT_FALSE(answers_.Has("b"));
  state_->Unblock(200);
  ASSERT_TRUE(answers_.WaitFor("b"));
  mv->Shutdown();
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 4u);
  bool one_batch = false;
  for (const auto& e : ex) one_batch |= e.row_keys == std::vector<float>{1, 2, 3};
  EXPECT_TRUE(one_batch) << "the three queued requests run as one batch";
}

TEST_F(ModelVersionTest, PriorityOutsideTheLevelsIsRefusedAndCountedInvalid) {
  auto o = Batching(8);
  o.batching.priority_levels = 2;
  o.batching.default_priority_level = 2;
  auto mv = Make(std::move(o));
  ASSERT_NE(mv, nullptr);
  mv->Infer(Req("too_low", {1}, 3), answers_.For("too_low"));
  ASSERT_TRUE(answers_.WaitFor("too_low"));
  EXPECT_EQ(answers_.Get("too_low").status.code(), StatusCode::kInvalidArgument);
  mv->Shutdown();
  const auto s = mv->stats();
  EXPECT_EQ(s.rejected_invalid, 1u);
  EXPECT_EQ(s.fail.count, 1u);
  EXPECT_TRUE(state_->executions().empty());
}

TEST_F(ModelVersionTest, QueueTimeoutIsAnsweredWhileTheInstanceIsStillBusy) {
  auto o = Batching(8);
  o.batching.default_queue_policy.default_timeout_us = 100;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("late", {1}), answers_.For("late"));
  clock_->AdvanceUs(100);
  ASSERT_TRUE(answers_.WaitFor("late"));
  // The model's queue timeout is UNAVAILABLE, as Triton answers it: not the client's
  // own deadline expiring.
  EXPECT_EQ(answers_.Get("late").status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(answers_.Has("first")) << "the running batch is still blocked";
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("first"));
  EXPECT_TRUE(answers_.Get("first").status.ok());
  mv->Shutdown();
  EXPECT_EQ(mv->stats().timed_out, 1u);
  EXPECT_EQ(state_->executions().size(), 1u);
}

TEST_F(ModelVersionTest, DelayedRequestIsNotAnsweredAtTimeoutButRunsAfterOthers) {
  auto o = Batching(1);
  o.batching.default_queue_policy.timeout_action = TimeoutAction::kDelay;
  o.batching.default_queue_policy.default_timeout_us = 100;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("old", {1}), answers_.For("old"));
  clock_->AdvanceUs(150);
  mv->Infer(Req("new", {2}), answers_.For("new"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("old"));
  EXPECT_TRUE(answers_.Get("old").status.ok());
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[1].row_keys[0], 2) << "the delayed request goes behind the newer one";
  EXPECT_EQ(ex[2].row_keys[0], 1);
}

TEST_F(ModelVersionTest, FullQueueRejectsAtOnceWithRetryableStatus) {
  auto o = Batching(8);
  o.batching.default_queue_policy.max_queue_size = 1;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("queued", {1}), answers_.For("queued"));
  mv->Infer(Req("overflow", {2}), answers_.For("overflow"));
  ASSERT_TRUE(answers_.Has("overflow")) << "rejection must be immediate";
  EXPECT_EQ(answers_.Get("overflow").status.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(answers_.Get("overflow").status.retryable());
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("queued"));
  EXPECT_TRUE(answers_.Get("queued").status.ok());
  mv->Shutdown();
  EXPECT_EQ(mv->stats().rejected_queue_full, 1u);
}

TEST_F(ModelVersionTest, CancelledQueuedRequestIsAnsweredAndNeverRuns) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  auto handle = mv->Infer(Req("gone", {7}), answers_.For("gone"));
  mv->Infer(Req("stays", {8}), answers_.For("stays"));
  handle->Cancel();
  ASSERT_TRUE(answers_.WaitFor("gone"));
  EXPECT_EQ(answers_.Get("gone").status.code(), StatusCode::kCancelled);
  handle->Cancel();  // twice is harmless
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("stays"));
  for (const auto& e : state_->executions()) {
    for (float k : e.row_keys) EXPECT_NE(k, 7) << "a cancelled request ran";
  }
}

TEST_F(ModelVersionTest, InvalidRequestsGetInvalidArgumentNamingTheInput) {
  auto mv = Make(Batching(2));
  InferRequest wrong_type = Req("t", {1});
  wrong_type.inputs[0].tensor = Tensor::FromVector<int32_t>(DataType::kInt32, {1, 1}, {1});
  mv->Infer(std::move(wrong_type), answers_.For("t"));
  InferRequest too_big = Req("b", {1});
  too_big.inputs[0].tensor = Tensor::Allocate(DataType::kFp32, {3, 1});
  mv->Infer(std::move(too_big), answers_.For("b"));
  InferRequest missing = Req("m", {1});
  missing.inputs.clear();
  mv->Infer(std::move(missing), answers_.For("m"));
  InferRequest short_data = Req("s", {1, 2});
  short_data.inputs[0].tensor =
      Tensor(DataType::kFp32, {1, 2}, short_data.inputs[0].tensor.buffer(), 0, 4);
  mv->Infer(std::move(short_data), answers_.For("s"));
  for (const char* id : {"t", "b", "m", "s"}) {
    ASSERT_TRUE(answers_.Has(id)) << id;
    EXPECT_EQ(answers_.Get(id).status.code(), StatusCode::kInvalidArgument) << id;
    EXPECT_NE(answers_.Get(id).status.message().find("INPUT0"), std::string::npos)
        << answers_.Get(id).status.message();
  }
  EXPECT_TRUE(state_->executions().empty());
}

TEST_F(ModelVersionTest, BackendErrorFailsItsBatchAndServingContinues) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("bad", {-1}), answers_.For("bad"));
  mv->Infer(Req("neighbour", {5}), answers_.For("neighbour"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("neighbour"));
  ASSERT_TRUE(answers_.WaitFor("bad"));
  EXPECT_EQ(answers_.Get("bad").status.code(), StatusCode::kInternal);
  EXPECT_NE(answers_.Get("bad").status.message().find("asked to fail"), std::string::npos);
  EXPECT_EQ(answers_.Get("neighbour").status.code(), StatusCode::kInternal) << "same batch";
  mv->Infer(Req("after", {6}), answers_.For("after"));
  ASSERT_TRUE(answers_.WaitFor("after"));
  EXPECT_TRUE(answers_.Get("after").status.ok());
}

// An input error found only by the backend (e.g. an index out of range) fails only the
// request that brought it: the batch is run again one request at a time.
TEST_F(ModelVersionTest, BadInputFoundByTheBackendFailsOnlyItsOwnRequest) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("left", {5}), answers_.For("left"));
  mv->Infer(Req("bad", {-1000}), answers_.For("bad"));
  mv->Infer(Req("right", {6}), answers_.For("right"));
  state_->Unblock(100);
  for (const char* id : {"left", "bad", "right"}) ASSERT_TRUE(answers_.WaitFor(id)) << id;
  EXPECT_EQ(answers_.Get("bad").status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(answers_.Get("bad").status.message().find("out of range"), std::string::npos);
  for (const auto& [id, v] : {std::pair<const char*, float>{"left", 5}, {"right", 6}}) {
    const InferResponse r = answers_.Get(id);
    ASSERT_TRUE(r.status.ok()) << id << ": " << r.status.ToString();
    EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 2 * v) << id;
  }
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 5u) << "the first, the failed batch, then each request alone";
  EXPECT_EQ(ex[1].row_keys, (std::vector<float>{5, -1000, 6}));
  EXPECT_EQ(ex[2].row_keys, (std::vector<float>{5}));
  EXPECT_EQ(ex[3].row_keys, (std::vector<float>{-1000}));
  EXPECT_EQ(ex[4].row_keys, (std::vector<float>{6}));
  mv->Shutdown();
  auto s = mv->stats();
  EXPECT_EQ(s.success.count, 3u);
  EXPECT_EQ(s.fail.count, 1u);
}

TEST_F(ModelVersionTest, OneBadRequestInALargeBatchIsFoundByBisectingNotByRunningEveryone) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  for (int i = 0; i < 8; ++i) {
    const float v = i == 5 ? -1000.0f : static_cast<float>(i + 1);
    mv->Infer(Req("r" + std::to_string(i), {v}), answers_.For("r" + std::to_string(i)));
  }
  state_->Unblock(100);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(answers_.WaitFor("r" + std::to_string(i)));
  for (int i = 0; i < 8; ++i) {
    const InferResponse r = answers_.Get("r" + std::to_string(i));
    if (i == 5) {
      EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.ToString();
      EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 2.0f * (i + 1));
    }
  }
  auto ex = state_->executions();
  // The first; the batch of 8 (fails); its halves (the second fails); that one's halves
  // (the first fails); its two requests alone: 8 runs, where running everyone alone after
  // the failure takes 10.
  ASSERT_EQ(ex.size(), 8u);
  EXPECT_EQ(ex[2].row_keys, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(ex[3].row_keys, (std::vector<float>{5, -1000, 7, 8}));
  EXPECT_EQ(ex[4].row_keys, (std::vector<float>{5, -1000}));
  EXPECT_EQ(ex[5].row_keys, (std::vector<float>{5}));
  EXPECT_EQ(ex[6].row_keys, (std::vector<float>{-1000}));
  EXPECT_EQ(ex[7].row_keys, (std::vector<float>{7, 8}));
}

TEST_F(ModelVersionTest, CacheHitAndInFlightJoinRunTheModelOnce) {
  auto o = Batching(8);
  o.cache = std::make_shared<ResponseCache>(1 << 20);
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "leader"));
  mv->Infer(Req("joiner", {100}), answers_.For("joiner"));
  EXPECT_FALSE(answers_.Has("joiner"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("leader"));
  ASSERT_TRUE(answers_.WaitFor("joiner"));
  EXPECT_EQ(answers_.Get("joiner").outputs[0].tensor.values<float>()[0], 200.0f);
  mv->Infer(Req("hit", {100}), answers_.For("hit"));
  ASSERT_TRUE(answers_.Has("hit")) << "a hit is answered on the caller's thread";
  EXPECT_TRUE(answers_.Get("hit").cache_hit);
  EXPECT_EQ(answers_.Get("hit").outputs[0].tensor.values<float>()[0], 200.0f);
  mv->Infer(Req("other", {3}), answers_.For("other"));
  ASSERT_TRUE(answers_.WaitFor("other"));
  EXPECT_FALSE(answers_.Get("other").cache_hit);
  EXPECT_EQ(state_->executions().size(), 2u);
  auto cs = mv->options().cache->stats();
  EXPECT_EQ(cs.hits, 1);
  EXPECT_EQ(cs.joins, 1);
  EXPECT_EQ(cs.misses, 2);
  mv->Shutdown();
  EXPECT_EQ(mv->stats().cache_hit.count, 2u);  // the hit and the joiner
  EXPECT_EQ(mv->stats().cache_miss.count, 2u);
}

TEST_F(ModelVersionTest, ReloadUnderTheSameVersionNeverHitsTheOldModelsResults) {
  auto cache = std::make_shared<ResponseCache>(1 << 20);
  auto o = Batching(8);
  o.cache = cache;
  auto old_mv = Make(o);
  old_mv->Infer(Req("old", {1}), answers_.For("old"));
  ASSERT_TRUE(answers_.WaitFor("old"));
  old_mv->Shutdown();
  // The same name and version number, reloaded: another backend, sharing the cache.
  auto reloaded_state = std::make_shared<FakeBackendState>();
  o.name = "fake";
  o.instances = {{"fake_0", 0, {}}};
  o.clock = clock_;
  auto mv = ModelVersion::Create(o, std::make_unique<FakeBackendModel>(reloaded_state));
  ASSERT_TRUE(mv.ok()) << mv.status().ToString();
  EXPECT_NE((*mv)->cache_owner_id(), old_mv->cache_owner_id());
  (*mv)->Infer(Req("new", {1}), answers_.For("new"));
  ASSERT_TRUE(answers_.WaitFor("new"));
  EXPECT_TRUE(answers_.Get("new").status.ok());
  EXPECT_FALSE(answers_.Get("new").cache_hit) << "served the old model's result";
  EXPECT_EQ(reloaded_state->executions().size(), 1u);
  (*mv)->Shutdown();
}

TEST_F(ModelVersionTest, JoinerOfALeaderThatTimedOutInTheQueueRunsItsOwnRequest) {
  auto o = Batching(8);
  o.cache = std::make_shared<ResponseCache>(1 << 20);
  o.batching.default_queue_policy.allow_timeout_override = true;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  InferRequest impatient = Req("leader", {1});
  impatient.timeout_us = 1000;  // admitted (a run is predicted well under 1 ms), then late
  mv->Infer(std::move(impatient), answers_.For("leader"));
  mv->Infer(Req("joiner", {1}), answers_.For("joiner"));  // no timeout of its own
  EXPECT_EQ(mv->options().cache->stats().joins, 1);
  clock_->AdvanceUs(1000);
  ASSERT_TRUE(answers_.WaitFor("leader"));
  EXPECT_EQ(answers_.Get("leader").status.code(), StatusCode::kDeadlineExceeded);
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("joiner"));
  InferResponse joiner = answers_.Get("joiner");
  ASSERT_TRUE(joiner.status.ok()) << "inherited the leader's timeout: " << joiner.status.ToString();
  ASSERT_EQ(joiner.outputs.size(), 1u);
  EXPECT_EQ(joiner.outputs[0].tensor.values<float>()[0], 2.0f);
  mv->Shutdown();
  EXPECT_EQ(state_->executions().size(), 2u);  // "first", then the joiner's own run
}

TEST_F(ModelVersionTest, JoinersOfACancelledLeaderGetTheirOwnResultsFromOneRun) {
  auto o = Batching(8);
  o.cache = std::make_shared<ResponseCache>(1 << 20);
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  auto leader = mv->Infer(Req("leader", {4}), answers_.For("leader"));
  mv->Infer(Req("joiner1", {4}), answers_.For("joiner1"));
  mv->Infer(Req("joiner2", {4}), answers_.For("joiner2"));
  leader->Cancel();
  ASSERT_TRUE(answers_.WaitFor("leader"));
  EXPECT_EQ(answers_.Get("leader").status.code(), StatusCode::kCancelled);
  state_->Unblock(100);
  for (const char* id : {"joiner1", "joiner2"}) {
    ASSERT_TRUE(answers_.WaitFor(id));
    InferResponse r = answers_.Get(id);
    ASSERT_TRUE(r.status.ok()) << id << " inherited the leader's cancel: " << r.status.ToString();
    EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 8.0f);
  }
  mv->Shutdown();
  // One joiner led the second run and the other joined it.
  EXPECT_EQ(state_->executions().size(), 2u);
  EXPECT_EQ(answers_.size(), 4u);
}

TEST_F(ModelVersionTest, PreserveOrderingHoldsLaterBatchesUntilEarlierAnswered) {
  auto o = Batching(1);
  o.preserve_ordering = true;
  auto mv = Make(std::move(o), /*instances=*/2);
  ASSERT_TRUE(Occupy(*mv, "slow"));
  mv->Infer(Req("fast", {1}), answers_.For("fast"));
  ASSERT_TRUE(state_->WaitForExecutions(2));
  // "fast" has run on the other instance, whose job is over (the pool counts a job when
  // it returns, after its answers were given or held), but must wait for "slow".
  ASSERT_TRUE(WaitUntil([&] {
    int64_t jobs = 0;
    for (const auto& s : mv->instance_stats()) jobs += s.executions;
    return jobs == 1;
  }));
  EXPECT_FALSE(answers_.Has("fast"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("fast"));
  EXPECT_TRUE(answers_.Has("slow"));
}

TEST_F(ModelVersionTest, ShutdownDrainsQueuedWorkAndThenRejects) {
  auto mv = Make(Batching(2, /*delay_us=*/1'000'000));
  state_->Block(100);
  mv->Infer(Req("first", {100}), answers_.For("first"));
  clock_->AdvanceUs(1'000'000);
  ASSERT_TRUE(state_->WaitForWaiting(1));
  for (int i = 0; i < 5; ++i)
    mv->Infer(Req("q" + std::to_string(i), {float(i)}), answers_.For("q" + std::to_string(i)));
  std::thread stopper([&] { mv->Shutdown(); });
  // Shutdown has begun once a new request is refused at once; those sent before that
  // were accepted and must be answered like the queued ones.
  int probes = 0;
  ASSERT_TRUE(WaitUntil([&] {
    const std::string id = "probe" + std::to_string(probes++);
    mv->Infer(Req(id, {1}), answers_.For(id));
    return answers_.Has(id) && answers_.Get(id).status.code() == StatusCode::kUnavailable;
  }));
  state_->Unblock(100);
  stopper.join();
  EXPECT_EQ(answers_.size(), 6u + static_cast<size_t>(probes));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(answers_.Get("q" + std::to_string(i)).status.ok());
  for (int i = 0; i + 1 < probes; ++i)
    EXPECT_TRUE(answers_.Get("probe" + std::to_string(i)).status.ok());
  mv->Infer(Req("late", {1}), answers_.For("late"));
  ASSERT_TRUE(answers_.Has("late"));
  EXPECT_EQ(answers_.Get("late").status.code(), StatusCode::kUnavailable);
}

TEST_F(ModelVersionTest, LoneRequestDoesNotWaitOutTheBatchingWindow) {
  auto mv = Make(Batching(8, /*delay_us=*/2000));
  mv->Infer(Req("a", {1}), answers_.For("a"));
  // The fake clock never moves: only a work-conserving release can answer it.
  ASSERT_TRUE(answers_.WaitFor("a"));
  EXPECT_TRUE(answers_.Get("a").status.ok());
}

TEST_F(ModelVersionTest, RequestThatCanNoLongerMeetItsDeadlineIsAnsweredUnrun) {
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  InferRequest r = Req("late", {1});
  r.timeout_us = 5000;  // the KServe `timeout` parameter: a 5 ms deadline
  mv->Infer(std::move(r), answers_.For("late"));
  InferRequest g = Req("grpc", {2});
  g.client_deadline_us = 8000;  // a gRPC deadline
  g.timeout_us = 60'000'000;    // the earlier of the two counts
  mv->Infer(std::move(g), answers_.For("grpc"));
  clock_->AdvanceUs(5000);
  ASSERT_TRUE(answers_.WaitFor("late"));
  EXPECT_EQ(answers_.Get("late").status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(answers_.Get("late").status.message().find("not run"), std::string::npos)
      << answers_.Get("late").status.message();
  EXPECT_FALSE(answers_.Has("grpc"));
  clock_->AdvanceUs(3000);
  ASSERT_TRUE(answers_.WaitFor("grpc"));
  EXPECT_EQ(answers_.Get("grpc").status.code(), StatusCode::kDeadlineExceeded);
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("first"));
  mv->Shutdown();
  EXPECT_EQ(state_->executions().size(), 1u) << "neither late request ran";
  EXPECT_EQ(mv->stats().deadline_missed, 2u);
}

TEST_F(ModelVersionTest, ModelSloIsTheDeadlineOfRequestsWithoutOneButNotOfOfflineWork) {
  auto o = Batching(8);
  o.latency_slo_us = 1000;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));  // its own deadline is 1 ms too, but it is running
  mv->Infer(Req("served", {1}), answers_.For("served"));
  InferRequest offline = Req("offline", {2});
  offline.best_effort = true;
  mv->Infer(std::move(offline), answers_.For("offline"));
  clock_->AdvanceUs(1000);
  ASSERT_TRUE(answers_.WaitFor("served"));
  EXPECT_EQ(answers_.Get("served").status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(answers_.Has("offline"));
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("offline"));
  EXPECT_TRUE(answers_.Get("offline").status.ok());
}

TEST_F(ModelVersionTest, OverloadIsRefusedAtOnceWithARetryHint) {
  auto o = Batching(1);
  o.batching.max_queue_wait_us = 1;  // any wait behind a running request is too long
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("over", {1}), answers_.For("over"));
  ASSERT_TRUE(answers_.Has("over")) << "refused before queueing";
  const Status s = answers_.Get("over").status;
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_GE(s.retry_after_ms(), 0);
  EXPECT_NE(s.message().find("model 'fake'"), std::string::npos) << s.message();
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("first"));
  mv->Shutdown();
  EXPECT_EQ(mv->stats().rejected_overload, 1u);
}

// 400 requests of one row, one at a time, on a model with a 10 ms SLO: every other run
// takes 8 ms of the fake clock (Occupy's value, 100) and the rest none. Each finds the
// instance idle (and so runs at once, predicted its own run).
void RunSlowAndQuickInTurn(ModelVersion& mv, FakeClock& clock, FakeBackendState& state,
                           Answers& answers,
                           const std::function<bool(const std::string&)>& occupy) {
  const int64_t base = mv.instance_stats()[0].executions;
  for (int i = 0; i < 400; ++i) {
    const std::string id = "r" + std::to_string(i);
    if (i % 2 == 0) {
      ASSERT_TRUE(occupy(id));
      clock.AdvanceUs(8000);
      state.Unblock(100);
    } else {
      mv.Infer(Req(id, {1}), answers.For(id));
    }
    ASSERT_TRUE(answers.WaitFor(id));
    ASSERT_TRUE(answers.Get(id).status.ok()) << answers.Get(id).status.ToString();
    // Finished, its record observed, before the next arrives.
    ASSERT_TRUE(WaitUntil([&] { return mv.instance_stats()[0].executions == base + i + 1; }));
  }
}

TEST_F(ModelVersionTest, AdmissionReserveLearnsHowLateAnswersCameAgainstTheirPrediction) {
  auto o = Batching(8);
  o.latency_slo_us = 10'000;  // every request has 10 ms
  auto mv = Make(std::move(o));
  EXPECT_DOUBLE_EQ(mv->admission_reserve(), 0.25) << "nothing learned yet: the floor";
  // The cost model predicts about the mean run, 4 ms, so every other answer comes about
  // 40% of its budget after the finish its admission predicted, more than the 25% floor.
  RunSlowAndQuickInTurn(*mv, *clock_, *state_, answers_,
                        [&](const std::string& id) { return Occupy(*mv, id); });
  if (HasFatalFailure()) return;
  // The last answer's record reaches the batcher just after its callback.
  EXPECT_TRUE(WaitUntil([&] { return mv->admission_reserve() > 0.32; })) << mv->admission_reserve();
  EXPECT_LT(mv->admission_reserve(), 0.55);
  mv->Shutdown();
}

// The same runs as above, but every slow one paid a one-time set-up (a plan prepared for
// a new shape, as the backend's setups() says): neither admission's reserve nor the cost
// model learns from them, so the reserve stays at its floor and the predicted run short.
TEST_F(ModelVersionTest, ARunThatPaidAOneTimeSetUpTeachesNeitherAdmissionNorTheCostModel) {
  auto o = Batching(8);
  o.latency_slo_us = 10'000;
  auto mv = Make(std::move(o));
  state_->MarkSetup(100);  // Occupy's value
  RunSlowAndQuickInTurn(*mv, *clock_, *state_, answers_,
                        [&](const std::string& id) { return Occupy(*mv, id); });
  if (HasFatalFailure()) return;
  EXPECT_EQ(state_->setups(), 200);
  EXPECT_EQ(mv->instance_stats()[0].setups, 200) << "the instance's statistics show them";
  // Nothing learned from the slow runs; 200 quick ones were observed.
  EXPECT_DOUBLE_EQ(mv->admission_reserve(), 0.25);
  const auto stats = mv->instance_stats()[0];
  EXPECT_LT(stats.cost_a_ns + stats.cost_b_ns, 1e6) << "a run of one predicted under 1 ms";
  mv->Shutdown();
}

TEST_F(ModelVersionTest, RequestsDroppedForTheirDeadlineTeachAdmissionToo) {
  auto o = Batching(8);
  o.latency_slo_us = 10'000;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  // Queued behind a run that the cost model's prior thinks short: admitted, predicted to
  // finish within a few milliseconds.
  int admitted = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string id = "q" + std::to_string(i);
    mv->Infer(Req(id, {1}), answers_.For(id));
    if (!answers_.Has(id)) ++admitted;
  }
  ASSERT_GE(admitted, 250);
  EXPECT_DOUBLE_EQ(mv->admission_reserve(), 0.25);
  // The run takes 10 ms: every queued request is dropped unrun, each as late as its
  // deadline at least, far past its predicted finish.
  clock_->AdvanceUs(10'000);
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(answers_.WaitFor("q" + std::to_string(i)));
  EXPECT_EQ(mv->stats().deadline_missed, static_cast<uint64_t>(admitted));
  EXPECT_TRUE(WaitUntil([&] { return mv->admission_reserve() > 0.5; })) << mv->admission_reserve();
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("first"));
  mv->Shutdown();
}

TEST_F(ModelVersionTest, PrecisionLadderStepsDownUnderSustainedLoadAndBackWithHysteresis) {
  auto o = Batching(1);  // one request per run: ten queued are ~1.1 ms of predicted work
  o.precision_ladder = {"fp32", "int8"};
  o.degrade_above_us = 1000;
  // Below 0.9 ms: a lone queued request once the instance is idle. (The blocked first run
  // takes 10 ms of fake time, which the cost model remembers for a while.)
  o.restore_below_us = 900;
  o.degrade_after_us = 10'000;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  for (int i = 0; i < 10; ++i)
    mv->Infer(Req("q" + std::to_string(i), {1}), answers_.For("q" + std::to_string(i)));
  EXPECT_EQ(mv->precision_tier(), 0) << "above the threshold, but not for long yet";
  clock_->AdvanceUs(10'000);
  mv->Infer(Req("turn", {2}), answers_.For("turn"));  // its arrival finds 10 ms above: step down
  EXPECT_EQ(mv->precision_tier(), 1);
  mv->Infer(Req("cheap", {3}), answers_.For("cheap"));
  InferRequest optout = Req("optout", {4});
  optout.parameters["precision"] = std::string("fp32");  // a request may insist
  mv->Infer(std::move(optout), answers_.For("optout"));
  state_->Unblock(100);
  for (const char* id : {"turn", "cheap", "optout", "q9"}) ASSERT_TRUE(answers_.WaitFor(id)) << id;
  auto tier_of = [&](const std::string& id) {
    const InferResponse r = answers_.Get(id);
    EXPECT_TRUE(r.status.ok()) << id << ": " << r.status.ToString();
    auto it = r.parameters.find("precision");
    return it == r.parameters.end() ? std::string("none") : std::get<std::string>(it->second);
  };
  EXPECT_EQ(tier_of("q0"), "fp32");
  EXPECT_EQ(tier_of("turn"), "fp32");
  EXPECT_EQ(tier_of("cheap"), "int8");
  EXPECT_EQ(tier_of("optout"), "fp32");
  std::map<float, std::string> variant_of_row;
  for (const auto& e : state_->executions()) variant_of_row[e.row_keys[0]] = e.variant;
  EXPECT_EQ(variant_of_row[3], "int8") << "the backend was asked for the cheaper tier";
  EXPECT_EQ(variant_of_row[4], "fp32");

  // Idle now: the ladder comes back only after the drain time stays low for 10 ms. (An
  // instance is idle once its run is counted, a moment after it answered.)
  auto wait_runs = [&](uint64_t n) {
    for (int i = 0; i < 10'000; ++i) {
      if (mv->instance_stats()[0].executions >= static_cast<int64_t>(n)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  };
  ASSERT_TRUE(wait_runs(14));
  mv->Infer(Req("calm1", {5}), answers_.For("calm1"));
  ASSERT_TRUE(answers_.WaitFor("calm1"));
  EXPECT_EQ(mv->precision_tier(), 1);
  ASSERT_TRUE(wait_runs(15));
  clock_->AdvanceUs(10'000);
  mv->Infer(Req("calm2", {6}), answers_.For("calm2"));
  EXPECT_EQ(mv->precision_tier(), 0);
  mv->Infer(Req("calm3", {7}), answers_.For("calm3"));
  ASSERT_TRUE(answers_.WaitFor("calm3"));
  EXPECT_EQ(tier_of("calm3"), "fp32");
  mv->Shutdown();
  const auto stats = mv->stats();
  EXPECT_EQ(stats.precision_switches, 2u);
  // "cheap", and "calm1" and "calm2", which arrived before the ladder returned (the step
  // is decided after the arrival that finds the period over).
  EXPECT_EQ(stats.precision_requests.at("int8"), 3u);
}

// A model that keeps its queue short by refusing (here: any wait is too long) never shows a
// long drain time; its refusals, sustained, step the ladder down all the same.
TEST_F(ModelVersionTest, PrecisionLadderStepsDownWhenOverloadRefusalsAreSustained) {
  auto o = Batching(1);
  o.batching.max_queue_wait_us = 1;
  o.precision_ladder = {"fp32", "int8"};
  o.degrade_above_us = 1'000'000'000;  // the drain time alone never would
  o.restore_below_us = 1;
  o.degrade_after_us = 10'000;
  auto mv = Make(std::move(o));
  ASSERT_TRUE(Occupy(*mv, "first"));
  // Refusals 3 ms apart (more than a quarter of degrade_after_us): not sustained. (Once
  // the fake clock passes the running batch's predicted end, one arrival finds no wait
  // and queues; every later one waits behind it and is refused.)
  auto refused = [&](const std::string& id) {
    return answers_.Has(id) && answers_.Get(id).status.code() == StatusCode::kResourceExhausted;
  };
  int sparse_refused = 0;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "sparse" + std::to_string(i);
    mv->Infer(Req(id, {1}), answers_.For(id));
    sparse_refused += refused(id);
    clock_->AdvanceUs(3'000);
  }
  EXPECT_GE(sparse_refused, 5);
  EXPECT_EQ(mv->precision_tier(), 0) << "refusals with gaps are not sustained pressure";
  // Refusals 1 ms apart for 10 ms: sustained.
  for (int i = 0; i <= 10; ++i) {
    const std::string id = "dense" + std::to_string(i);
    mv->Infer(Req(id, {1}), answers_.For(id));
    EXPECT_TRUE(refused(id)) << id;
    if (i < 10) clock_->AdvanceUs(1'000);
  }
  EXPECT_EQ(mv->precision_tier(), 1);
  state_->Unblock(100);
  ASSERT_TRUE(answers_.WaitFor("first"));
  mv->Shutdown();
  EXPECT_EQ(mv->stats().precision_switches, 1u);
}

TEST_F(ModelVersionTest, DestroyingWithWorkQueuedAnswersEverything) {
  {
    auto mv = Make(Batching(4, /*delay_us=*/5'000'000));
    for (int i = 0; i < 10; ++i)
      mv->Infer(Req("d" + std::to_string(i), {float(i)}), answers_.For("d" + std::to_string(i)));
  }
  EXPECT_EQ(answers_.size(), 10u);
}

TEST_F(ModelVersionTest, WarmupRunsOnEveryInstanceBeforeReady) {
  auto o = Batching(4);
  WarmupSample w;
  w.name = "zeros";
  w.batch_size = 4;
  w.count = 2;
  w.inputs.push_back({"INPUT0", Tensor::Allocate(DataType::kFp32, {4, 3})});
  o.warmup.push_back(w);
  auto mv = Make(std::move(o), /*instances=*/2);
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 4u);
  int per_instance[2] = {0, 0};
  for (const auto& e : ex) {
    EXPECT_EQ(e.batch_size, 4);
    per_instance[e.instance]++;
  }
  EXPECT_EQ(per_instance[0], 2);
  EXPECT_EQ(per_instance[1], 2);
}

TEST_F(ModelVersionTest, FailingWarmupFailsCreateWithItsName) {
  auto o = Batching(4);
  o.name = "fake";
  o.signature = Sig(4);
  o.instances.push_back({"fake_0", 0, {}});
  o.clock = clock_;
  WarmupSample w;
  w.name = "poison";
  w.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 1}, {-5})});
  o.warmup.push_back(w);
  auto mv = ModelVersion::Create(std::move(o), std::make_unique<FakeBackendModel>(state_));
  ASSERT_FALSE(mv.ok());
  EXPECT_NE(mv.status().message().find("warmup 'poison'"), std::string::npos)
      << mv.status().ToString();
}

// A warmup nobody configured (the zeros a config without model_warmup gets) must not
// keep a model from loading: a model may refuse zeros as data.
TEST_F(ModelVersionTest, FailingDefaultWarmupOnlyWarns) {
  auto o = Batching(4);
  WarmupSample w;
  w.name = "default_batch_1";
  w.required = false;
  w.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 1}, {-5})});
  o.warmup.push_back(w);
  w.name = "default_batch_4";
  o.warmup.push_back(w);
  auto mv = Make(std::move(o));
  ASSERT_NE(mv, nullptr);
  EXPECT_EQ(state_->executions().size(), 1u) << "the default samples after a failure are skipped";
  mv->Infer(Req("a", {1}), answers_.For("a"));
  ASSERT_TRUE(answers_.WaitFor("a"));
  EXPECT_TRUE(answers_.Get("a").status.ok()) << answers_.Get("a").status.ToString();
}

// The batcher buckets requests by a 64-bit hash of their shapes. Two different shapes
// that hash alike (forced here) must not be merged into one batch: each runs with its
// own shape and gets its own answer.
TEST_F(ModelVersionTest, ShapeKeyCollisionIsNotMergedIntoOneBatch) {
  auto o = Batching(8, /*delay_us=*/1'000'000);
  o.batching.policy = BatchingPolicy::kFixedWindow;  // hold all three for one batch
  o.batching.preferred_batch_sizes = {3};
  o.shape_key_for_testing = [](const InferRequest&, uint64_t) { return uint64_t{7}; };
  auto mv = Make(std::move(o));
  mv->Infer(Req("two", {1, 2}), answers_.For("two"));
  mv->Infer(Req("three", {10, 20, 30}), answers_.For("three"));
  mv->Infer(Req("two_b", {3, 4}), answers_.For("two_b"));  // the third makes the batch
  clock_->AdvanceUs(1'000'000);
  for (const char* id : {"two", "three", "two_b"}) ASSERT_TRUE(answers_.WaitFor(id)) << id;
  auto values = [&](const std::string& id) {
    const InferResponse r = answers_.Get(id);
    EXPECT_TRUE(r.status.ok()) << id << ": " << r.status.ToString();
    if (r.outputs.empty()) return std::vector<float>{};
    auto v = r.outputs[0].tensor.values<float>();
    return std::vector<float>(v.begin(), v.end());
  };
  EXPECT_EQ(values("two"), (std::vector<float>{2, 4}));
  EXPECT_EQ(values("three"), (std::vector<float>{20, 40, 60}));
  EXPECT_EQ(values("two_b"), (std::vector<float>{6, 8}));
  // One batch was formed; it ran as two backend calls, one per true shape.
  const auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].row_keys, (std::vector<float>{1, 3}));
  EXPECT_EQ(ex[1].row_keys, (std::vector<float>{10}));
}

// Sends kThreads x kPerThread requests from kThreads threads at once, request i of thread t
// with id "t_i" and the one value value_of(i), answered into `answers`.
constexpr int kThreads = 4, kPerThread = 200;
template <typename ValueOf>
void SendFromThreads(ModelVersion& mv, Answers& answers, ValueOf value_of) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = std::to_string(t) + "_" + std::to_string(i);
        mv.Infer(Req(id, {value_of(i)}), answers.For(id));
      }
    });
  }
  for (auto& th : threads) th.join();
}

TEST_F(ModelVersionTest, ManyConcurrentCallersAllAnsweredExactlyOnce) {
  auto mv = Make(Batching(8), /*instances=*/2);
  SendFromThreads(*mv, answers_, [](int i) { return static_cast<float>(i); });
  mv->Shutdown();
  EXPECT_EQ(answers_.size(), static_cast<size_t>(kThreads * kPerThread));
  auto s = mv->stats();
  EXPECT_EQ(s.success.count, static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(s.inference_count, static_cast<uint64_t>(kThreads * kPerThread));
}

// Pipelined instances (BackendInstance::pipeline_depth() > 1, as on a GPU).

TEST_F(ModelVersionTest, PipelinedInstanceLaunchesTheNextBatchBehindTheOneOnItsDevice) {
  state_->set_pipeline_depth(2);
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  // The instance holds one batch of its two: the next leaves at once, launched behind it.
  mv->Infer(Req("r1", {1}), answers_.For("r1"));
  ASSERT_TRUE(WaitUntil([&] { return state_->max_outstanding() == 2; }))
      << "the second batch was not launched while the first was on the device";
  // Now it holds two: these wait in the queue, and leave as one batch.
  mv->Infer(Req("r2", {2}), answers_.For("r2"));
  mv->Infer(Req("r3", {3}), answers_.For("r3"));
  EXPECT_EQ(mv->queue_depth(), 2u);
  EXPECT_FALSE(answers_.Has("r1")) << "answered before the batch ahead of it";
  state_->Unblock(100);
  for (const char* id : {"first", "r1", "r2", "r3"}) {
    ASSERT_TRUE(answers_.WaitFor(id)) << id;
    const InferResponse r = answers_.Get(id);
    ASSERT_TRUE(r.status.ok()) << id << ": " << r.status.ToString();
  }
  EXPECT_EQ(answers_.Get("r3").outputs[0].tensor.values<float>()[0], 6.0f);
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[0].row_keys, (std::vector<float>{100}));
  EXPECT_EQ(ex[1].row_keys, (std::vector<float>{1}));
  EXPECT_EQ(ex[2].row_keys, (std::vector<float>{2, 3}));
  mv->Shutdown();
  EXPECT_EQ(mv->stats().execution_count, 3u);
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

TEST_F(ModelVersionTest, BadInputInAPipelinedBatchFailsOnlyItsOwnRequest) {
  state_->set_pipeline_depth(2);
  auto mv = Make(Batching(8));
  ASSERT_TRUE(Occupy(*mv, "first"));
  mv->Infer(Req("alone", {1}), answers_.For("alone"));  // launched behind "first"
  ASSERT_TRUE(WaitUntil([&] { return state_->max_outstanding() == 2; }));
  mv->Infer(Req("left", {5}), answers_.For("left"));
  mv->Infer(Req("bad", {-1000}), answers_.For("bad"));
  mv->Infer(Req("right", {6}), answers_.For("right"));
  state_->Unblock(100);
  for (const char* id : {"first", "alone", "left", "bad", "right"})
    ASSERT_TRUE(answers_.WaitFor(id)) << id;
  EXPECT_EQ(answers_.Get("bad").status.code(), StatusCode::kInvalidArgument);
  for (const auto& [id, v] : {std::pair<const char*, float>{"left", 5}, {"right", 6}}) {
    const InferResponse r = answers_.Get(id);
    ASSERT_TRUE(r.status.ok()) << id << ": " << r.status.ToString();
    EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 2 * v) << id;
  }
  // The launched batch of three failed on the device; each request then ran alone.
  auto ex = state_->executions();
  ASSERT_EQ(ex.size(), 6u);
  EXPECT_EQ(ex[2].row_keys, (std::vector<float>{5, -1000, 6}));
  EXPECT_EQ(ex[3].row_keys, (std::vector<float>{5}));
  EXPECT_EQ(ex[4].row_keys, (std::vector<float>{-1000}));
  EXPECT_EQ(ex[5].row_keys, (std::vector<float>{6}));
  mv->Shutdown();
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

TEST_F(ModelVersionTest, PipelinedBatchWhoseLaunchFailsIsAnsweredAfterTheBatchAhead) {
  state_->set_pipeline_depth(2);
  ModelVersionOptions o = Batching(8);
  o.preserve_ordering = true;
  auto mv = Make(o);
  std::mutex mu;
  std::vector<std::string> order;
  auto in_order = [&](const std::string& id) {
    InferCallback inner = answers_.For(id);
    return InferCallback([&mu, &order, inner, id](InferResponse r) mutable {
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(id);
      }
      inner(std::move(r));
    });
  };
  state_->Block(100);
  mv->Infer(Req("first", {100}), in_order("first"));
  ASSERT_TRUE(state_->WaitForWaiting(1));
  // Its launch is refused (nothing reaches the device): answered with that error, but
  // after the batch ahead of it, and the one behind it is launched and answered in turn.
  mv->Infer(Req("refused", {-2000}), in_order("refused"));
  ASSERT_TRUE(WaitUntil([&] { return mv->queue_depth() == 0; }));
  mv->Infer(Req("after", {7}), in_order("after"));
  state_->Unblock(100);
  for (const char* id : {"first", "refused", "after"}) ASSERT_TRUE(answers_.WaitFor(id)) << id;
  EXPECT_TRUE(answers_.Get("first").status.ok());
  EXPECT_EQ(answers_.Get("refused").status.code(), StatusCode::kInternal);
  EXPECT_NE(answers_.Get("refused").status.message().find("launch refused"), std::string::npos);
  ASSERT_TRUE(answers_.Get("after").status.ok());
  EXPECT_EQ(answers_.Get("after").outputs[0].tensor.values<float>()[0], 14.0f);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<std::string>{"first", "refused", "after"}));
  }
  mv->Shutdown();
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

TEST_F(ModelVersionTest, PipelinedInstancesAnswerManyConcurrentCallersExactlyOnce) {
  state_->set_pipeline_depth(2);
  auto mv = Make(Batching(8), /*instances=*/2);
  // Every 50th request has bad data: the batches it joins are split.
  SendFromThreads(*mv, answers_,
                  [](int i) { return i % 50 == 7 ? -1000.0f : static_cast<float>(i); });
  mv->Shutdown();
  ASSERT_EQ(answers_.size(), static_cast<size_t>(kThreads * kPerThread));
  int bad = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const InferResponse r = answers_.Get(std::to_string(t) + "_" + std::to_string(i));
      if (i % 50 == 7) {
        EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
        ++bad;
        continue;
      }
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 2.0f * i);
    }
  }
  auto s = mv->stats();
  EXPECT_EQ(s.success.count, static_cast<uint64_t>(kThreads * kPerThread - bad));
  EXPECT_EQ(state_->contract_broken(), std::vector<std::string>{});
}

}  // namespace
}  // namespace shoal::runtime
