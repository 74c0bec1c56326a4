// Ensembles in a Server over a real repository with the real example plugins: loading,
// readiness, model control and statistics (the DAG itself: ensemble_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "runtime/server.h"
#include "runtime/testing/test_repository.h"

namespace shoal::runtime {
namespace {

using ::testing::HasSubstr;
using testing::kAddSubConfig;
using testing::RepositoryOptions;
using testing::TempRepository;

// add_sub twice: (x, y) -> (x + y, x - y) -> (2x, 2y).
constexpr char kTwiceConfig[] = R"(
name: "twice"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "TWO_X" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "TWO_Y" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add_sub" model_version: -1
      input_map { key: "INPUT0" value: "X" } input_map { key: "INPUT1" value: "Y" }
      output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "diff" } },
    { model_name: "add_sub" model_version: -1
      input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "diff" }
      output_map { key: "OUTPUT0" value: "TWO_X" } output_map { key: "OUTPUT1" value: "TWO_Y" } }
  ]
}
)";

InferResponse InferSync(Server& server, InferRequest request) {
  auto p = std::make_shared<std::promise<InferResponse>>();
  auto f = p->get_future();
  server.Infer(std::move(request), [p](InferResponse r) { p->set_value(std::move(r)); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "no answer within 20 s";
    InferResponse none;
    none.status = Internal("no answer");
    return none;
  }
  return f.get();
}

InferRequest TwiceRequest() {
  InferRequest r;
  r.model_name = "twice";
  r.inputs.push_back({"X", Tensor::FromVector<int32_t>(DataType::kInt32, {4}, {1, 2, 3, 4})});
  r.inputs.push_back({"Y", Tensor::FromVector<int32_t>(DataType::kInt32, {4}, {10, 20, 30, 40})});
  return r;
}

std::vector<int32_t> Values(const InferResponse& r, const std::string& name) {
  for (const auto& o : r.outputs) {
    if (o.name == name)
      return {o.tensor.values<int32_t>().begin(), o.tensor.values<int32_t>().end()};
  }
  return {};
}

TEST(ServerEnsembleTest, ServesAnEnsembleAndCountsItAndItsSteps) {
  TempRepository repo("shoal_server_ensemble_test");
  repo.AddModel("add_sub", kAddSubConfig);
  repo.AddModel("twice", kTwiceConfig);
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_TRUE((*server)->ready());
  auto r = InferSync(**server, TwiceRequest());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.model_name, "twice");
  EXPECT_EQ(Values(r, "TWO_X"), (std::vector<int32_t>{2, 4, 6, 8}));
  EXPECT_EQ(Values(r, "TWO_Y"), (std::vector<int32_t>{20, 40, 60, 80}));
  // Triton's statistics: the ensemble counts its request, each composing model its steps.
  auto twice = (*server)->GetModel("twice");
  auto add_sub = (*server)->GetModel("add_sub");
  ASSERT_TRUE(twice.ok() && add_sub.ok());
  EXPECT_TRUE((*twice)->is_ensemble());
  EXPECT_EQ((*twice)->stats().success.count, 1u);
  EXPECT_EQ((*add_sub)->stats().success.count, 2u);
  // The config endpoint's source: the ensemble's own config, steps included.
  auto config = (*server)->GetModelConfig("twice");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->ensemble_scheduling().step_size(), 2);
  // A bad input is refused before any step runs.
  InferRequest bad = TwiceRequest();
  bad.inputs.pop_back();
  EXPECT_EQ(InferSync(**server, std::move(bad)).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*add_sub)->stats().success.count, 2u);
}

TEST(ServerEnsembleTest, ExplicitLoadLoadsStepsAndUnloadingAStepMakesTheEnsembleUnready) {
  TempRepository repo("shoal_server_ensemble_test");
  repo.AddModel("add_sub", kAddSubConfig);
  repo.AddModel("twice", kTwiceConfig);
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kExplicit));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Server& s = **server;
  EXPECT_FALSE(s.GetModel("add_sub").ok());
  ASSERT_TRUE(s.LoadModel("twice").ok());
  EXPECT_TRUE(s.GetModel("add_sub").ok()) << "loading the ensemble loads its step";
  EXPECT_TRUE(s.ready());
  EXPECT_TRUE(InferSync(s, TwiceRequest()).status.ok());

  // Unloading a step an ensemble uses is allowed; the ensemble stays loaded but is not
  // ready, and answers UNAVAILABLE naming the step, until the step is back.
  ASSERT_TRUE(s.UnloadModel("add_sub").ok());
  auto twice = s.GetModel("twice");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(twice.status().message(), HasSubstr("step model 'add_sub'"));
  EXPECT_FALSE(s.ready());
  bool listed = false;
  for (const auto& m : s.RepositoryIndex()) {
    if (m.name != "twice") continue;
    listed = true;
    EXPECT_EQ(m.state, ModelState::kUnavailable);
    EXPECT_THAT(m.reason, HasSubstr("add_sub"));
  }
  EXPECT_TRUE(listed);
  EXPECT_EQ(InferSync(s, TwiceRequest()).status.code(), StatusCode::kUnavailable);

  ASSERT_TRUE(s.LoadModel("add_sub").ok());
  EXPECT_TRUE(s.GetModel("twice").ok());
  EXPECT_TRUE(s.ready());
  EXPECT_TRUE(InferSync(s, TwiceRequest()).status.ok());
}

TEST(ServerEnsembleTest, UnloadDependentsUnloadsTheStepsNoOtherEnsembleUses) {
  TempRepository repo("shoal_server_ensemble_test");
  repo.AddModel("add_sub", kAddSubConfig);
  repo.AddModel("twice", kTwiceConfig);
  std::string other = kTwiceConfig;
  other.replace(other.find("\"twice\""), 7, "\"again\"");
  repo.AddModel("again", other);
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kExplicit));
  ASSERT_TRUE(server.ok());
  Server& s = **server;
  ASSERT_TRUE(s.LoadModel("twice").ok());
  ASSERT_TRUE(s.LoadModel("again").ok());
  ASSERT_TRUE(s.UnloadModel("twice", /*unload_dependents=*/true).ok());
  EXPECT_TRUE(s.GetModel("add_sub").ok()) << "'again' still uses it";
  ASSERT_TRUE(s.UnloadModel("again", /*unload_dependents=*/true).ok());
  EXPECT_FALSE(s.GetModel("add_sub").ok());
}

TEST(ServerEnsembleTest, EnsembleWithAMissingStepFailsToLoadNamingIt) {
  TempRepository repo("shoal_server_ensemble_test");
  repo.AddModel("twice", kTwiceConfig);
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kExplicit));
  ASSERT_TRUE(server.ok());
  Status s = (*server)->LoadModel("twice");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("step model 'add_sub'"));
}

TEST(ServerEnsembleTest, ShutdownDrainsEnsembleRequestsThroughTheirSteps) {
  TempRepository repo("shoal_server_ensemble_test");
  repo.AddModel("add_sub", kAddSubConfig);
  repo.AddModel("twice", kTwiceConfig);
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok());
  constexpr int kRequests = 50;
  std::vector<std::future<InferResponse>> answers;
  for (int i = 0; i < kRequests; ++i) {
    auto p = std::make_shared<std::promise<InferResponse>>();
    answers.push_back(p->get_future());
    (*server)->Infer(TwiceRequest(), [p](InferResponse r) { p->set_value(std::move(r)); });
  }
  (*server)->Shutdown();
  for (auto& f : answers) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    EXPECT_TRUE(f.get().status.ok()) << "accepted before shutdown: must finish";
  }
  EXPECT_EQ(InferSync(**server, TwiceRequest()).status.code(), StatusCode::kUnavailable);
}

// "a_twice" (an ensemble) is a step of "b_outer", and sorts before it: shutdown must
// drain the outer one first, or its accepted requests would find their inner step closed.
TEST(ServerEnsembleTest, ShutdownDrainsNestedEnsemblesOuterFirst) {
  std::string inner = kTwiceConfig;
  inner.replace(inner.find("name: \"twice\""), 14, "name: \"a_twice\"");
  constexpr char kOuterConfig[] = R"(
name: "b_outer"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "TWO_X" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "a_twice" model_version: -1
      input_map { key: "X" value: "X" } input_map { key: "Y" value: "Y" }
      output_map { key: "TWO_X" value: "TWO_X" } }
  ]
}
)";
  TempRepository repo("shoal_server_ensemble_test");
  repo.AddModel("add_sub", kAddSubConfig);
  repo.AddModel("a_twice", inner);
  repo.AddModel("b_outer", kOuterConfig);
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  constexpr int kRequests = 300;
  std::vector<std::future<InferResponse>> answers;
  for (int i = 0; i < kRequests; ++i) {
    auto p = std::make_shared<std::promise<InferResponse>>();
    answers.push_back(p->get_future());
    InferRequest r = TwiceRequest();
    r.model_name = "b_outer";
    (*server)->Infer(std::move(r), [p](InferResponse a) { p->set_value(std::move(a)); });
  }
  (*server)->Shutdown();
  int ok = 0;
  for (auto& f : answers) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    InferResponse a = f.get();
    EXPECT_TRUE(a.status.ok()) << a.status.ToString();
    if (a.status.ok() && Values(a, "TWO_X") == std::vector<int32_t>{2, 4, 6, 8}) ++ok;
  }
  EXPECT_EQ(ok, kRequests);
}

}  // namespace
}  // namespace shoal::runtime
