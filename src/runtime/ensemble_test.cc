// Ensemble: the DAG over scripted step models (the test answers each step by hand), and
// an ensemble ModelVersion over real model versions with the fake backend.
#include "runtime/ensemble.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/model_version.h"
#include "runtime/testing/fake_backend.h"

namespace shoal::runtime {
namespace {

using ::testing::HasSubstr;

// Step models the test drives by hand: every submitted request is recorded with its
// callback, and answered when the test says.
class ScriptedSteps {
 public:
  struct Call {
    InferRequest request;
    InferCallback callback;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    bool answered = false;
  };
  // When set, answers every submission at once with this status (a model refusing).
  void RefuseWith(Status s) { refuse_ = std::move(s); }

  StepInfer Infer() {
    return [this](InferRequest r, InferCallback cb) -> std::shared_ptr<RequestHandle> {
      struct Handle : RequestHandle {
        std::shared_ptr<std::atomic<bool>> flag;
        void Cancel() override { flag->store(true); }
      };
      auto h = std::make_shared<Handle>();
      if (!refuse_.ok()) {
        InferResponse resp;
        resp.status = refuse_;
        cb(std::move(resp));
        return h;
      }
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back(std::make_shared<Call>());
      calls_.back()->request = std::move(r);
      calls_.back()->callback = std::move(cb);
      h->flag = calls_.back()->cancelled;
      return h;
    };
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.size();
  }
  std::shared_ptr<Call> call(size_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.at(i);
  }
  std::vector<std::string> models() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& c : calls_) out.push_back(c->request.model_name);
    return out;
  }
  // Answers call `i` with `outputs`, or with `status` when it is an error.
  static void Answer(Call& c, std::vector<NamedTensor> outputs, Status status = Status::Ok()) {
    ASSERT_FALSE(c.answered);
    c.answered = true;
    InferResponse r;
    r.status = std::move(status);
    r.outputs = std::move(outputs);
    c.callback(std::move(r));
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Call>> calls_;
  Status refuse_;
};

Tensor Floats(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::FromVector<float>(DataType::kFp32, {n}, v);
}

EnsembleStep Step(std::string model, std::vector<std::pair<std::string, std::string>> in,
                  std::vector<std::pair<std::string, std::string>> out) {
  EnsembleStep s;
  s.model_name = std::move(model);
  s.input_map = std::move(in);
  s.output_map = std::move(out);
  return s;
}

// Collects the answers of every run; counts them to check "exactly once".
struct Answers {
  std::mutex mu;
  std::vector<InferResponse> got;
  InferCallback For() {
    return [this](InferResponse r) {
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(std::move(r));
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return got.size();
  }
};

class EnsembleTest : public ::testing::Test {
 protected:
  std::unique_ptr<Ensemble> Make(std::vector<EnsembleStep> steps, std::vector<std::string> inputs,
                                 std::vector<std::string> outputs) {
    EnsembleOptions o;
    o.name = "pipe";
    o.steps = std::move(steps);
    o.inputs = std::move(inputs);
    o.outputs = std::move(outputs);
    o.step_infer = steps_.Infer();
    o.clock = clock_;
    auto e = Ensemble::Create(std::move(o));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  // x -> A -> t1 -> B -> t2 -> C -> y
  std::unique_ptr<Ensemble> Chain() {
    return Make(
        {Step("A", {{"IN", "x"}}, {{"OUT", "t1"}}), Step("B", {{"IN", "t1"}}, {{"OUT", "t2"}}),
         Step("C", {{"IN", "t2"}}, {{"OUT", "y"}})},
        {"x"}, {"y"});
  }
  // x -> split -> a; a -> left -> b; a -> right -> c; (b, c) -> merge -> y
  std::unique_ptr<Ensemble> Diamond() {
    return Make(
        {Step("split", {{"IN", "x"}}, {{"OUT", "a"}}), Step("left", {{"IN", "a"}}, {{"OUT", "b"}}),
         Step("right", {{"IN", "a"}}, {{"OUT", "c"}}),
         Step("merge", {{"L", "b"}, {"R", "c"}}, {{"OUT", "y"}})},
        {"x"}, {"y"});
  }
  static InferRequest Request(Tensor x, int64_t deadline_ns = 0, uint32_t priority = 0) {
    InferRequest r;
    r.id = "req";
    r.inputs.push_back({"x", std::move(x)});
    r.deadline_ns = deadline_ns;
    r.priority = priority;
    return r;
  }

  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  ScriptedSteps steps_;
  Answers answers_;
};

TEST_F(EnsembleTest, ChainRunsStepsInOrderAndPassesTensorsWithoutCopies) {
  auto e = Chain();
  Tensor x = Floats({1, 2});
  const void* x_data = x.data();
  e->Run(Request(x), answers_.For());
  // Only the first step can start.
  ASSERT_EQ(steps_.models(), (std::vector<std::string>{"A"}));
  auto a = steps_.call(0);
  ASSERT_EQ(a->request.inputs.size(), 1u);
  EXPECT_EQ(a->request.inputs[0].name, "IN");
  EXPECT_EQ(a->request.inputs[0].tensor.data(), x_data) << "the client's tensor, not a copy";
  EXPECT_EQ(a->request.requested_outputs, (std::vector<std::string>{"OUT"}));

  // Each step allocates its own output; the next step must get that very buffer.
  Tensor t1 = Floats({3});
  ScriptedSteps::Answer(*a, {{"OUT", t1}});
  ASSERT_EQ(steps_.models(), (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(steps_.call(1)->request.inputs[0].tensor.buffer(), t1.buffer());
  Tensor t2 = Floats({4});
  ScriptedSteps::Answer(*steps_.call(1), {{"OUT", t2}});
  ASSERT_EQ(steps_.models(), (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_EQ(steps_.call(2)->request.inputs[0].tensor.buffer(), t2.buffer());
  EXPECT_EQ(answers_.size(), 0u);
  Tensor y = Floats({5});
  ScriptedSteps::Answer(*steps_.call(2), {{"OUT", y}});

  ASSERT_EQ(answers_.size(), 1u);
  const InferResponse& r = answers_.got[0];
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].name, "y");
  EXPECT_EQ(r.outputs[0].tensor.buffer(), y.buffer()) << "the last step's output, not a copy";
  // Three buffers were allocated (the steps' outputs) and every tensor seen is one of them
  // or the client's: the DAG itself allocated nothing. The ensemble dropped its handles:
  // only this test and the response still hold the intermediates.
  EXPECT_EQ(t1.buffer().use_count(), 2);  // t1 and the recorded input of call B
  EXPECT_EQ(e->live_runs(), 0);
}

TEST_F(EnsembleTest, IndependentBranchesRunConcurrentlyAndMerge) {
  auto e = Diamond();
  e->Run(Request(Floats({1})), answers_.For());
  ASSERT_EQ(steps_.size(), 1u);
  Tensor a = Floats({2});
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", a}});
  // Both branches are in flight together, before either answers.
  ASSERT_EQ(steps_.models(), (std::vector<std::string>{"split", "left", "right"}));
  EXPECT_EQ(steps_.call(1)->request.inputs[0].tensor.buffer(), a.buffer());
  EXPECT_EQ(steps_.call(2)->request.inputs[0].tensor.buffer(), a.buffer());
  // The merge waits for both.
  Tensor c = Floats({3});
  ScriptedSteps::Answer(*steps_.call(2), {{"OUT", c}});
  EXPECT_EQ(steps_.size(), 3u);
  Tensor b = Floats({4});
  ScriptedSteps::Answer(*steps_.call(1), {{"OUT", b}});
  ASSERT_EQ(steps_.size(), 4u);
  auto merge = steps_.call(3);
  ASSERT_EQ(merge->request.inputs.size(), 2u);
  EXPECT_EQ(merge->request.inputs[0].name, "L");
  EXPECT_EQ(merge->request.inputs[0].tensor.buffer(), b.buffer());
  EXPECT_EQ(merge->request.inputs[1].name, "R");
  EXPECT_EQ(merge->request.inputs[1].tensor.buffer(), c.buffer());
  ScriptedSteps::Answer(*merge, {{"OUT", Floats({5})}});
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_TRUE(answers_.got[0].status.ok());
}

TEST_F(EnsembleTest, RunsOnlyTheStepsTheRequestedOutputsNeed) {
  auto e =
      Make({Step("one", {{"IN", "x"}}, {{"OUT", "p"}}), Step("two", {{"IN", "x"}}, {{"OUT", "q"}})},
           {"x"}, {"p", "q"});
  InferRequest r = Request(Floats({1}));
  r.requested_outputs = {"q"};
  e->Run(std::move(r), answers_.For());
  ASSERT_EQ(steps_.models(), (std::vector<std::string>{"two"}));
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", Floats({2})}});
  ASSERT_EQ(answers_.size(), 1u);
  ASSERT_EQ(answers_.got[0].outputs.size(), 1u);
  EXPECT_EQ(answers_.got[0].outputs[0].name, "q");

  InferRequest bad = Request(Floats({1}));
  bad.requested_outputs = {"nope"};
  e->Run(std::move(bad), answers_.For());
  ASSERT_EQ(answers_.size(), 2u);
  EXPECT_EQ(answers_.got[1].status.code(), StatusCode::kInvalidArgument);
}

TEST_F(EnsembleTest, StepsCarryTheRequestsDeadlineAndPriority) {
  auto e = Chain();
  const int64_t deadline = clock_->NowNs() + 1'000'000;
  e->Run(Request(Floats({1}), deadline, 2), answers_.For());
  auto a = steps_.call(0);
  EXPECT_EQ(a->request.deadline_ns, deadline);
  EXPECT_EQ(a->request.priority, 2u);
  EXPECT_EQ(a->request.id, "req");
  ScriptedSteps::Answer(*a, {{"OUT", Floats({1})}});
  EXPECT_EQ(steps_.call(1)->request.deadline_ns, deadline);
  EXPECT_EQ(steps_.call(1)->request.priority, 2u);
  ScriptedSteps::Answer(*steps_.call(1), {{"OUT", Floats({1})}});
  ScriptedSteps::Answer(*steps_.call(2), {{"OUT", Floats({1})}});
  EXPECT_EQ(answers_.size(), 1u);
}

TEST_F(EnsembleTest, StepsCarryTheRequestsParametersAndTimeout) {
  auto e = Diamond();
  InferRequest r = Request(Floats({1}));
  r.parameters["precision"] = std::string("bf16");
  r.parameters["custom"] = int64_t{7};
  r.timeout_us = 5000;
  e->Run(std::move(r), answers_.For());
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", Floats({1})}});
  ScriptedSteps::Answer(*steps_.call(1), {{"OUT", Floats({1})}});
  ScriptedSteps::Answer(*steps_.call(2), {{"OUT", Floats({1})}});
  ASSERT_EQ(steps_.size(), 4u);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const InferRequest& step = steps_.call(i)->request;
    EXPECT_EQ(step.timeout_us, 5000u) << step.model_name;
    ASSERT_EQ(step.parameters.size(), 2u) << step.model_name;
    EXPECT_EQ(std::get<std::string>(step.parameters.at("precision")), "bf16") << step.model_name;
    EXPECT_EQ(std::get<int64_t>(step.parameters.at("custom")), 7) << step.model_name;
  }
  ScriptedSteps::Answer(*steps_.call(3), {{"OUT", Floats({1})}});
  EXPECT_EQ(answers_.size(), 1u);
}

TEST_F(EnsembleTest, NoStepStartsAfterTheDeadline) {
  auto e = Chain();
  e->Run(Request(Floats({1}), clock_->NowNs() + 1'000'000), answers_.For());
  clock_->AdvanceMs(2);  // step A answers after the request's deadline
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", Floats({1})}});
  EXPECT_EQ(steps_.size(), 1u) << "step B must not be submitted";
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_.got[0].status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(answers_.got[0].status.message(), HasSubstr("step 1 (model 'B')"));
  EXPECT_EQ(e->live_runs(), 0);
}

TEST_F(EnsembleTest, CancelMidPipelineAnswersOnceAndStopsTheRest) {
  auto e = Chain();
  auto handle = e->Run(Request(Floats({1})), answers_.For());
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", Floats({1})}});
  auto b = steps_.call(1);
  handle->Cancel();
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_.got[0].status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(b->cancelled->load()) << "the step in flight is cancelled too";
  EXPECT_EQ(e->live_runs(), 1) << "step B has not answered yet";
  handle->Cancel();  // again: nothing more
  // Step B answers anyway (it had already run): dropped, and C never starts.
  ScriptedSteps::Answer(*b, {{"OUT", Floats({2})}});
  EXPECT_EQ(steps_.size(), 2u);
  EXPECT_EQ(answers_.size(), 1u);
  EXPECT_EQ(e->live_runs(), 0);
}

TEST_F(EnsembleTest, FailingStepFailsTheRequestNamingStepAndModelAndCancelsItsSibling) {
  auto e = Diamond();
  e->Run(Request(Floats({1})), answers_.For());
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", Floats({1})}});
  auto left = steps_.call(1);
  auto right = steps_.call(2);
  ScriptedSteps::Answer(*right, {}, InvalidArgument("bad value"));
  ASSERT_EQ(answers_.size(), 1u);
  const Status& s = answers_.got[0].status;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ensemble 'pipe' step 2 (model 'right')"));
  EXPECT_THAT(s.message(), HasSubstr("bad value"));
  EXPECT_TRUE(left->cancelled->load());
  ScriptedSteps::Answer(*left, {{"OUT", Floats({1})}});
  EXPECT_EQ(steps_.size(), 3u) << "merge never starts";
  EXPECT_EQ(answers_.size(), 1u);
  EXPECT_EQ(e->live_runs(), 0);
}

TEST_F(EnsembleTest, StepWithoutItsMappedOutputFailsTheRequest) {
  auto e = Chain();
  e->Run(Request(Floats({1})), answers_.For());
  ScriptedSteps::Answer(*steps_.call(0), {{"OTHER", Floats({1})}});
  ASSERT_EQ(answers_.size(), 1u);
  EXPECT_EQ(answers_.got[0].status.code(), StatusCode::kInternal);
  EXPECT_THAT(answers_.got[0].status.message(), HasSubstr("step 0 (model 'A')"));
}

TEST_F(EnsembleTest, AStepsFullQueueRefusesTheRequestWithItsStatus) {
  // The steps' queues are the bound: a refused step fails the request at once, keeping
  // the refusal's code and Retry-After; nothing queues in the ensemble.
  auto e = Chain();
  steps_.RefuseWith(ResourceExhausted("model 'A': queue full").WithRetryAfterMs(40));
  e->Run(Request(Floats({1})), answers_.For());
  ASSERT_EQ(answers_.size(), 1u);
  const Status& s = answers_.got[0].status;
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.retry_after_ms(), 40);
  EXPECT_THAT(s.message(), HasSubstr("step 0 (model 'A')"));
  EXPECT_EQ(e->live_runs(), 0);
}

TEST_F(EnsembleTest, ShutdownWaitsForStepsInFlightThenRefuses) {
  auto e = Chain();
  auto handle = e->Run(Request(Floats({1})), answers_.For());
  handle->Cancel();  // answered, but step A is still in flight
  ASSERT_EQ(answers_.size(), 1u);
  std::atomic<bool> done{false};
  std::thread t([&] {
    e->Shutdown();
    done = true;
  });
  // Shutdown cannot finish before step A answers; answer it, then it must.
  EXPECT_EQ(e->live_runs(), 1);
  ScriptedSteps::Answer(*steps_.call(0), {{"OUT", Floats({1})}});
  t.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(steps_.size(), 1u);
  e->Run(Request(Floats({1})), answers_.For());
  ASSERT_EQ(answers_.size(), 2u);
  EXPECT_EQ(answers_.got[1].status.code(), StatusCode::kUnavailable);
}

TEST_F(EnsembleTest, EveryRequestIsAnsweredExactlyOnceUnderConcurrentAnswersAndCancels) {
  auto e = Diamond();
  constexpr int kRuns = 200;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < kRuns; ++i) handles.push_back(e->Run(Request(Floats({1})), answers_.For()));
  // Threads answer every step that appears while another cancels every third request.
  std::atomic<bool> stop{false};
  auto answerer = [&](size_t parity) {
    size_t next = parity;
    while (!stop) {
      if (next < steps_.size()) {
        auto c = steps_.call(next);
        next += 2;
        std::vector<NamedTensor> out;
        out.push_back({"OUT", Floats({1})});
        InferResponse r;
        r.outputs = std::move(out);
        c->callback(std::move(r));
      } else {
        std::this_thread::yield();
      }
    }
  };
  std::thread t0(answerer, 0), t1(answerer, 1);
  std::thread canceller([&] {
    for (int i = 0; i < kRuns; i += 3) handles[i]->Cancel();
  });
  canceller.join();
  while (e->live_runs() > 0) std::this_thread::yield();
  stop = true;
  t0.join();
  t1.join();
  EXPECT_EQ(answers_.size(), static_cast<size_t>(kRuns));
  int ok = 0, cancelled = 0;
  for (const auto& r : answers_.got) {
    ok += r.status.ok();
    cancelled += r.status.code() == StatusCode::kCancelled;
  }
  EXPECT_EQ(ok + cancelled, kRuns);
}

TEST(EnsembleCreateTest, RefusesGraphsThatCannotRun) {
  EnsembleOptions o;
  o.name = "e";
  o.step_infer = [](InferRequest, InferCallback) { return std::shared_ptr<RequestHandle>(); };
  o.inputs = {"x"};
  o.outputs = {"y"};
  o.steps = {Step("A", {{"IN", "t"}}, {{"OUT", "y"}})};
  EXPECT_THAT(Ensemble::Create(o).status().message(), HasSubstr("tensor 't'"));
  o.steps = {Step("A", {{"IN", "x"}, {"IN2", "u"}}, {{"OUT", "y"}}),
             Step("B", {{"IN", "y"}}, {{"OUT", "u"}})};
  EXPECT_THAT(Ensemble::Create(o).status().message(), HasSubstr("cycle"));
  o.steps = {Step("A", {{"IN", "x"}}, {{"OUT", "z"}})};
  EXPECT_THAT(Ensemble::Create(o).status().message(), HasSubstr("output 'y'"));
}

// An ensemble ModelVersion over two real model versions (fake backend: OUTPUT0 = 2 x).
class EnsembleVersionTest : public ::testing::Test {
 protected:
  static ModelSignature Sig() {
    ModelSignature sig;
    sig.max_batch_size = 8;
    sig.inputs.push_back({"INPUT0", DataType::kFp32, {-1}, false});
    sig.outputs.push_back({"OUTPUT0", DataType::kFp32, {-1}, false});
    return sig;
  }
  std::shared_ptr<ModelVersion> MakeStep(const std::string& name, uint32_t max_queue_size = 0) {
    ModelVersionOptions o;
    o.name = name;
    o.signature = Sig();
    o.batching.max_batch_size = 8;
    o.batching.default_queue_policy.max_queue_size = max_queue_size;
    o.instances.push_back({name + "_0", 0, {}});
    auto mv =
        ModelVersion::Create(std::move(o), std::make_unique<testing::FakeBackendModel>(state_));
    EXPECT_TRUE(mv.ok()) << mv.status().ToString();
    return *mv;
  }
  std::shared_ptr<ModelVersion> Pipeline() {
    EnsembleOptions e;
    e.name = "double_twice";
    e.inputs = {"IN"};
    e.outputs = {"OUT"};
    e.steps = {Step("first", {{"INPUT0", "IN"}}, {{"OUTPUT0", "mid"}}),
               Step("second", {{"INPUT0", "mid"}}, {{"OUTPUT0", "OUT"}})};
    e.step_infer = [this](InferRequest r, InferCallback cb) {
      return (r.model_name == "first" ? first_ : second_)->Infer(std::move(r), std::move(cb));
    };
    auto ensemble = Ensemble::Create(std::move(e));
    EXPECT_TRUE(ensemble.ok()) << ensemble.status().ToString();
    ModelVersionOptions o;
    o.name = "double_twice";
    o.signature = Sig();
    o.signature.inputs[0].name = "IN";
    o.signature.outputs[0].name = "OUT";
    auto mv = ModelVersion::CreateEnsemble(std::move(o), std::move(ensemble).value());
    EXPECT_TRUE(mv.ok()) << mv.status().ToString();
    return *mv;
  }
  static InferRequest Req(float v) {
    InferRequest r;
    r.id = "r";
    r.inputs.push_back({"IN", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {v, v + 1})});
    return r;
  }

  std::shared_ptr<testing::FakeBackendState> state_ = std::make_shared<testing::FakeBackendState>();
  std::shared_ptr<ModelVersion> first_ = MakeStep("first");
  std::shared_ptr<ModelVersion> second_ = MakeStep("second");
};

TEST_F(EnsembleVersionTest, RunsThroughTheStepModelsAndCountsInEach) {
  auto pipeline = Pipeline();
  EXPECT_TRUE(pipeline->is_ensemble());
  std::promise<InferResponse> p;
  pipeline->Infer(Req(1), [&](InferResponse r) { p.set_value(std::move(r)); });
  InferResponse r = p.get_future().get();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.model_name, "double_twice");
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].name, "OUT");
  EXPECT_EQ(r.outputs[0].tensor.values<float>()[0], 4.0f);
  EXPECT_EQ(r.outputs[0].tensor.values<float>()[1], 8.0f);
  pipeline->Shutdown();
  EXPECT_EQ(pipeline->stats().success.count, 1u);
  EXPECT_EQ(first_->stats().success.count, 1u);
  EXPECT_EQ(second_->stats().success.count, 1u);
  EXPECT_TRUE(pipeline->instance_stats().empty());
}

TEST_F(EnsembleVersionTest, RequestParametersDeadlineAndPriorityReachEveryStep) {
  auto pipeline = Pipeline();
  InferRequest r = Req(1);
  r.parameters["precision"] = std::string("bf16");
  r.priority = 1;
  r.timeout_us = 60'000'000;
  std::promise<InferResponse> p;
  pipeline->Infer(std::move(r), [&](InferResponse resp) { p.set_value(std::move(resp)); });
  InferResponse resp = p.get_future().get();
  ASSERT_TRUE(resp.status.ok()) << resp.status.ToString();
  // Both step models ran the request's tier (their batches asked the backend for it)...
  const std::vector<testing::Execution> runs = state_->executions();
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& run : runs) EXPECT_EQ(run.variant, "bf16");
  // ...and the answer says which tier answered, as a plain model's does.
  ASSERT_EQ(resp.parameters.count("precision"), 1u);
  EXPECT_EQ(std::get<std::string>(resp.parameters.at("precision")), "bf16");
  EXPECT_EQ(first_->stats().precision_requests.count("bf16"), 1u);
  EXPECT_EQ(second_->stats().precision_requests.count("bf16"), 1u);
}

TEST_F(EnsembleVersionTest, AStepGetsTheRequestsAbsoluteDeadline) {
  // The step gets the deadline the ensemble computed from the request's budgets.
  InferRequest seen;
  EnsembleOptions e;
  e.name = "one";
  e.inputs = {"IN"};
  e.outputs = {"OUT"};
  e.steps = {Step("first", {{"INPUT0", "IN"}}, {{"OUTPUT0", "OUT"}})};
  e.step_infer = [&](InferRequest r, InferCallback cb) -> std::shared_ptr<RequestHandle> {
    seen = r;
    InferResponse resp;  // answered by hand: the fake clock is not the step models'
    resp.outputs.push_back({"OUTPUT0", r.inputs.at(0).tensor});
    cb(std::move(resp));
    return nullptr;
  };
  auto clock = std::make_shared<FakeClock>();
  e.clock = clock;
  auto ensemble = Ensemble::Create(std::move(e));
  ASSERT_TRUE(ensemble.ok());
  ModelVersionOptions o;
  o.name = "one";
  o.signature = Sig();
  o.signature.inputs[0].name = "IN";
  o.signature.outputs[0].name = "OUT";
  o.clock = clock;
  auto mv = ModelVersion::CreateEnsemble(std::move(o), std::move(ensemble).value());
  ASSERT_TRUE(mv.ok());
  InferRequest r = Req(1);
  r.timeout_us = 2000;
  r.client_deadline_us = 1500;  // the earlier budget wins
  r.priority = 2;
  std::promise<InferResponse> p;
  (*mv)->Infer(std::move(r), [&](InferResponse resp) { p.set_value(std::move(resp)); });
  EXPECT_TRUE(p.get_future().get().status.ok());
  EXPECT_EQ(seen.deadline_ns, clock->NowNs() + 1'500'000);
  EXPECT_EQ(seen.priority, 2u);
  EXPECT_EQ(seen.timeout_us, 2000u);
  (*mv)->Shutdown();
}

TEST_F(EnsembleVersionTest, ARequestThatIsNoStepIsDispatchedAtOnceFromAnAnswer) {
  // Only ensemble steps wait for the end of the answer loop that submits them: a callback
  // that submits another request and waits for its answer must get it.
  InferRequest direct;
  direct.id = "direct";
  direct.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {3, 4})});
  std::promise<Status> inner_status;
  std::promise<void> done;
  first_->Infer(std::move(direct), [&](InferResponse r) {
    ASSERT_TRUE(r.status.ok());
    InferRequest next;
    next.id = "next";
    next.inputs.push_back({"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {5, 6})});
    std::promise<Status> answered;
    second_->Infer(std::move(next), [&](InferResponse r2) { answered.set_value(r2.status); });
    auto f = answered.get_future();
    // On first_'s instance thread, inside its answer loop.
    if (f.wait_for(std::chrono::seconds(30)) == std::future_status::ready) {
      inner_status.set_value(f.get());
    } else {
      inner_status.set_value(Internal("never dispatched while the answer loop waited"));
    }
    done.set_value();
  });
  EXPECT_TRUE(inner_status.get_future().get().ok());
  done.get_future().wait();
}

TEST_F(EnsembleVersionTest, ABatchOfOneStepReachesTheNextStepAsOneBatch) {
  // The next step's model is idle throughout: without ModelVersion::DeferDispatch the
  // first answer of step one's batch would leave alone for it, the others after.
  auto pipeline = Pipeline();
  state_->Block(-5);
  std::promise<Status> blocker;
  pipeline->Infer(Req(-5), [&](InferResponse r) { blocker.set_value(r.status); });
  ASSERT_TRUE(state_->WaitForWaiting(1));  // step "first" runs it; the next ones queue
  std::atomic<int> ok{0};
  std::promise<void> all;
  for (float v : {100.0f, 200.0f, 300.0f}) {
    pipeline->Infer(Req(v), [&](InferResponse r) {
      if (r.status.ok() && ++ok == 3) all.set_value();
    });
  }
  state_->Unblock(-5);  // fails (negative: the fake backend's error), so never reaches "second"
  EXPECT_EQ(blocker.get_future().get().code(), StatusCode::kInternal);
  // A lost dispatch would leave them queued for ever: fail instead of hanging.
  ASSERT_EQ(all.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  pipeline->Shutdown();
  std::vector<std::vector<float>> batches;
  for (const auto& e : state_->executions()) batches.push_back(e.row_keys);
  // first: [-5], [100, 200, 300]; second: the same three doubled, together.
  EXPECT_EQ(batches, (std::vector<std::vector<float>>{{-5}, {100, 200, 300}, {200, 400, 600}}));
  EXPECT_EQ(second_->stats().success.count, 3u);
}

TEST_F(EnsembleVersionTest, AThreeStepChainOfRealModelsCopiesNoTensor) {
  // IN -> first -> a -> second -> b -> third -> OUT, each step a real model version.
  auto third = MakeStep("third");
  EnsembleOptions e;
  e.name = "chain";
  e.inputs = {"IN"};
  e.outputs = {"OUT"};
  e.steps = {Step("first", {{"INPUT0", "IN"}}, {{"OUTPUT0", "a"}}),
             Step("second", {{"INPUT0", "a"}}, {{"OUTPUT0", "b"}}),
             Step("third", {{"INPUT0", "b"}}, {{"OUTPUT0", "OUT"}})};
  e.step_infer = [&](InferRequest r, InferCallback cb) {
    auto& mv = r.model_name == "first" ? first_ : r.model_name == "second" ? second_ : third;
    return mv->Infer(std::move(r), std::move(cb));
  };
  auto ensemble = Ensemble::Create(std::move(e));
  ASSERT_TRUE(ensemble.ok());
  ModelVersionOptions o;
  o.name = "chain";
  o.signature = Sig();
  o.signature.inputs[0].name = "IN";
  o.signature.outputs[0].name = "OUT";
  auto chain = ModelVersion::CreateEnsemble(std::move(o), std::move(ensemble).value());
  ASSERT_TRUE(chain.ok());
  InferRequest r = Req(1);
  const void* client_bytes = r.inputs[0].tensor.data();
  std::promise<InferResponse> p;
  (*chain)->Infer(std::move(r), [&](InferResponse resp) { p.set_value(std::move(resp)); });
  InferResponse resp = p.get_future().get();
  ASSERT_TRUE(resp.status.ok()) << resp.status.ToString();
  ASSERT_EQ(resp.outputs.size(), 1u);
  EXPECT_EQ(resp.outputs[0].tensor.values<float>()[0], 8.0f);
  const std::vector<testing::Execution> runs = state_->executions();
  ASSERT_EQ(runs.size(), 3u);
  // Each backend call read the very bytes the previous one wrote (the client's, first),
  // and the answer is the last one's: the only buffers are the three steps' own outputs.
  EXPECT_EQ(runs[0].input_data, client_bytes);
  EXPECT_EQ(runs[1].input_data, runs[0].output_data);
  EXPECT_EQ(runs[2].input_data, runs[1].output_data);
  EXPECT_EQ(resp.outputs[0].tensor.data(), runs[2].output_data);
  (*chain)->Shutdown();
  third->Shutdown();
}

TEST_F(EnsembleVersionTest, AFullStepQueueRefusesTheEnsembleRequestNamingTheStep) {
  // "second" holds at most one queued request; "first" runs freely.
  second_ = MakeStep("second", /*max_queue_size=*/1);
  auto pipeline = Pipeline();
  state_->Block(2);  // second's run of the first request (first doubled 1 to 2) blocks
  std::vector<std::promise<Status>> answers(3);
  pipeline->Infer(Req(1), [&](InferResponse r) { answers[0].set_value(r.status); });
  ASSERT_TRUE(state_->WaitForWaiting(1));
  pipeline->Infer(Req(5), [&](InferResponse r) { answers[1].set_value(r.status); });  // queues
  ASSERT_TRUE(state_->WaitForExecutions(3));  // first ran it; now in second's queue
  pipeline->Infer(Req(7), [&](InferResponse r) { answers[2].set_value(r.status); });
  // The third finds second's queue full: refused at once, naming the step and model.
  const Status refused = answers[2].get_future().get();
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("step 1 (model 'second')"), std::string::npos)
      << refused.ToString();
  state_->Unblock(2);
  EXPECT_TRUE(answers[0].get_future().get().ok());
  EXPECT_TRUE(answers[1].get_future().get().ok());
  pipeline->Shutdown();
  EXPECT_EQ(second_->stats().success.count, 2u);
}

TEST_F(EnsembleVersionTest, InvalidRequestIsRefusedBeforeAnyStep) {
  auto pipeline = Pipeline();
  InferRequest bad;
  bad.inputs.push_back({"WRONG", Tensor::FromVector<float>(DataType::kFp32, {1, 1}, {1})});
  std::promise<InferResponse> p;
  pipeline->Infer(std::move(bad), [&](InferResponse r) { p.set_value(std::move(r)); });
  EXPECT_EQ(p.get_future().get().status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(first_->stats().success.count + first_->stats().fail.count, 0u);
}

TEST_F(EnsembleVersionTest, CancelWhileAStepRunsAndDestroyWithWorkInFlight) {
  auto pipeline = Pipeline();
  state_->Block(7);
  std::atomic<int> answers{0};
  std::promise<Status> p;
  auto handle = pipeline->Infer(Req(7), [&](InferResponse r) {
    ++answers;
    p.set_value(r.status);
  });
  ASSERT_TRUE(state_->WaitForWaiting(1));  // step "first" is executing
  handle->Cancel();
  EXPECT_EQ(p.get_future().get().code(), StatusCode::kCancelled);
  // A second request in flight when the ensemble is destroyed: answered, exactly once.
  std::promise<Status> p2;
  pipeline->Infer(Req(7), [&](InferResponse r) {
    ++answers;
    p2.set_value(r.status);
  });
  std::thread destroy([&] { pipeline.reset(); });
  state_->Unblock(7);
  destroy.join();
  EXPECT_TRUE(p2.get_future().get().ok());
  EXPECT_EQ(answers, 2);
  EXPECT_EQ(second_->stats().success.count, 1u) << "the cancelled request never reached it";
}

}  // namespace
}  // namespace shoal::runtime
