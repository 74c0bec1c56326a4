// Server over a real repository on disk with the real example plugins.
#include "runtime/server.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/testing/fake_backend.h"
#include "runtime/testing/test_repository.h"
#include "runtime/testing/wait_until.h"

namespace shoal::runtime {
namespace {

using testing::kAddSubConfig;
using testing::kIdentityConfig;
using testing::PluginDir;
using testing::RepositoryOptions;
using testing::TempRepository;

InferResponse InferSync(Server& server, InferRequest request) {
  // Shared, so that an answer arriving after the test gave up has somewhere to go.
  auto p = std::make_shared<std::promise<InferResponse>>();
  auto f = p->get_future();
  server.Infer(std::move(request), [p](InferResponse r) { p->set_value(std::move(r)); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "no answer within 20 s";
    InferResponse none;
    none.status = Internal("no answer within 20 s");
    return none;
  }
  return f.get();
}

InferRequest FloatRequest(const std::string& model, std::vector<float> values) {
  InferRequest r;
  r.model_name = model;
  r.inputs.push_back(
      {"INPUT0", Tensor::FromVector<float>(DataType::kFp32, {1, (int64_t)values.size()}, values)});
  return r;
}

TEST(ServerTest, LoadsRepositoryAndServesPlugins) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  repo.AddModel("add_sub", kAddSubConfig);
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_TRUE((*server)->ready());

  auto r = InferSync(**server, FloatRequest("identity", {1, 2, 3}));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.model_version, 1);
  EXPECT_EQ(std::vector<float>(r.outputs[0].tensor.values<float>().begin(),
                               r.outputs[0].tensor.values<float>().end()),
            (std::vector<float>{1, 2, 3}));

  InferRequest as;
  as.model_name = "add_sub";
  as.inputs.push_back({"INPUT0", Tensor::FromVector<int32_t>(DataType::kInt32, {4}, {1, 2, 3, 4})});
  as.inputs.push_back(
      {"INPUT1", Tensor::FromVector<int32_t>(DataType::kInt32, {4}, {10, 20, 30, 40})});
  as.requested_outputs = {"OUTPUT1"};
  auto r2 = InferSync(**server, std::move(as));
  ASSERT_TRUE(r2.status.ok()) << r2.status.ToString();
  ASSERT_EQ(r2.outputs.size(), 1u);
  EXPECT_EQ(r2.outputs[0].name, "OUTPUT1");
  EXPECT_EQ(r2.outputs[0].tensor.values<int32_t>()[3], -36);
}

// A model whose GPU lost its context (a sticky CUDA error: its instance reports
// context_lost) can never run again in this process: its requests are answered
// UNAVAILABLE saying so, without running, it is not ready (its metadata still answers),
// and the server stops being live and ready, so that an orchestrator restarts it; an
// unload does not make it live again. With instances that run one batch at a time, and
// with pipelining ones (a GPU instance's default).
TEST(ServerTest, AModelWhoseDeviceIsLostIsUnavailableAndTheServerNotLive) {
  for (const int depth : {1, 2}) {
    SCOPED_TRACE(depth);
    TempRepository repo("shoal_server_test");
    repo.AddModel("lost", R"(
name: "lost"
backend: "fake"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
)");
    auto state = std::make_shared<testing::FakeBackendState>();
    state->set_pipeline_depth(depth);
    ServerOptions options = RepositoryOptions(repo, ModelControlMode::kExplicit);
    options.registry = std::make_shared<backends::BackendRegistry>();
    options.registry->Register(std::make_shared<testing::FakeBackend>(state));
    auto server = Server::Create(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    ASSERT_TRUE((*server)->LoadModel("lost").ok());
    EXPECT_TRUE((*server)->live());
    EXPECT_TRUE((*server)->ready());
    auto r = InferSync(**server, FloatRequest("lost", {1, 2}));
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_TRUE((*server)->live()) << "a device that answers is not lost";
    EXPECT_TRUE((*server)->ModelReady("lost").ok());

    state->LoseDevice();
    // The batch that finds the device lost (its stats, after it) still answers.
    r = InferSync(**server, FloatRequest("lost", {3}));
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_TRUE(testing::WaitUntil([&] { return !(*server)->live(); }));
    EXPECT_FALSE((*server)->ready());
    const Status ready = (*server)->ModelReady("lost");
    EXPECT_EQ(ready.code(), StatusCode::kUnavailable);
    EXPECT_NE(ready.message().find("context is lost"), std::string::npos) << ready.ToString();
    EXPECT_TRUE((*server)->GetModel("lost").ok()) << "its metadata and config still answer";
    const size_t ran = state->executions().size();
    r = InferSync(**server, FloatRequest("lost", {4}));
    EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
    EXPECT_NE(r.status.message().find("restart the server"), std::string::npos)
        << r.status.ToString();
    EXPECT_EQ(state->executions().size(), ran) << "nothing runs on a lost device";
    // Only a new process clears it: unloading the model does not.
    ASSERT_TRUE((*server)->UnloadModel("lost").ok());
    EXPECT_FALSE((*server)->live());
    EXPECT_FALSE((*server)->ready());
  }
}

TEST(ServerTest, BrokenModelIsUnavailableWithReasonOthersServe) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  repo.AddModel("broken", "name: \"broken\"\nbackend: \"identity\"\nmax_batch_size: -3\n");
  repo.AddModel("nobackend",
                "name: \"nobackend\"\nbackend: \"no_such_plugin\"\nmax_batch_size: 1\n"
                "input [ { name: \"I\" data_type: TYPE_FP32 dims: [1] } ]\n"
                "output [ { name: \"O\" data_type: TYPE_FP32 dims: [1] } ]\n");
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok());
  EXPECT_FALSE((*server)->ready());
  auto index = (*server)->RepositoryIndex();
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0].name, "broken");
  EXPECT_EQ(index[0].state, ModelState::kUnavailable);
  EXPECT_NE(index[0].reason.find("max_batch_size"), std::string::npos) << index[0].reason;
  EXPECT_NE(index[0].reason.find("-3"), std::string::npos) << index[0].reason;
  EXPECT_EQ(index[1].state, ModelState::kReady);
  EXPECT_EQ(index[2].state, ModelState::kUnavailable);
  EXPECT_NE(index[2].reason.find("no_such_plugin"), std::string::npos) << index[2].reason;

  EXPECT_TRUE(InferSync(**server, FloatRequest("identity", {1})).status.ok());
  EXPECT_EQ(InferSync(**server, FloatRequest("broken", {1})).status.code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(InferSync(**server, FloatRequest("nope", {1})).status.code(), StatusCode::kNotFound);
}

TEST(ServerTest, OpenRecordsStartupModelsLoadingUntilLoadStartupModels) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  auto server = Server::Open(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_TRUE((*server)->live());
  EXPECT_FALSE((*server)->ready()) << "not ready before the start-up models loaded";
  EXPECT_FALSE((*server)->startup_finished());
  auto index = (*server)->RepositoryIndex();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].state, ModelState::kLoading);
  const InferResponse early = InferSync(**server, FloatRequest("identity", {1}));
  EXPECT_EQ(early.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(early.status.message().find("still loading"), std::string::npos)
      << early.status.message();

  (*server)->LoadStartupModels();
  EXPECT_TRUE((*server)->startup_finished());
  EXPECT_TRUE((*server)->ready());
  EXPECT_TRUE(InferSync(**server, FloatRequest("identity", {1})).status.ok());
}

TEST(ServerTest, CancelledStartupLeavesTheRestUnavailableAndFinishes) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  auto server = Server::Open(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok());
  (*server)->CancelStartupLoading();
  (*server)->LoadStartupModels();
  EXPECT_TRUE((*server)->startup_finished());
  EXPECT_FALSE((*server)->ready());
  auto index = (*server)->RepositoryIndex();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].state, ModelState::kUnavailable);
  EXPECT_NE(index[0].reason.find("cancelled"), std::string::npos) << index[0].reason;
}

TEST(ServerTest, WithoutStrictReadinessABrokenModelDoesNotKeepTheServerUnready) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  repo.AddModel("broken", "name: \"broken\"\nbackend: \"identity\"\nmax_batch_size: -3\n");
  ServerOptions strict = RepositoryOptions(repo);
  auto strict_server = Server::Create(strict);
  ASSERT_TRUE(strict_server.ok());
  EXPECT_FALSE((*strict_server)->ready()) << "strict: one model failed";
  (*strict_server)->Shutdown();

  ServerOptions lenient = RepositoryOptions(repo);
  lenient.strict_readiness = false;
  auto opened = Server::Open(lenient);
  ASSERT_TRUE(opened.ok());
  EXPECT_FALSE((*opened)->ready()) << "not even lenient readiness before start-up loading";
  (*opened)->LoadStartupModels();
  EXPECT_TRUE((*opened)->ready());
  (*opened)->Shutdown();
  EXPECT_FALSE((*opened)->ready()) << "never ready while shutting down";
}

TEST(ServerTest, ExplicitModeLoadsAndUnloadsOnRequest) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kExplicit));
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(InferSync(**server, FloatRequest("identity", {1})).status.code(),
            StatusCode::kNotFound);
  ASSERT_TRUE((*server)->LoadModel("identity").ok());
  EXPECT_TRUE(InferSync(**server, FloatRequest("identity", {1})).status.ok());
  ASSERT_TRUE((*server)->UnloadModel("identity").ok());
  EXPECT_FALSE(InferSync(**server, FloatRequest("identity", {1})).status.ok());
  EXPECT_TRUE((*server)->ready()) << "an unload on request is not a failure";
  // As Triton: unloading what is not loaded (or not there at all) is a no-op success.
  EXPECT_TRUE((*server)->UnloadModel("identity").ok());
  EXPECT_TRUE((*server)->UnloadModel("missing").ok());
  EXPECT_TRUE((*server)->ready());
  EXPECT_EQ((*server)->LoadModel("missing").code(), StatusCode::kNotFound);
}

TEST(ServerTest, ReloadAndUnloadDropTheModelsCachedResults) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", std::string(kIdentityConfig) + "response_cache { enable: true }\n");
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kExplicit));
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->LoadModel("identity").ok());
  EXPECT_FALSE(InferSync(**server, FloatRequest("identity", {1})).cache_hit);
  EXPECT_TRUE(InferSync(**server, FloatRequest("identity", {1})).cache_hit);
  EXPECT_EQ((*server)->cache()->stats().entries, 1);
  // Reloaded under the same version number: the old model's results are gone.
  ASSERT_TRUE((*server)->LoadModel("identity").ok());
  EXPECT_EQ((*server)->cache()->stats().entries, 0);
  auto fresh = InferSync(**server, FloatRequest("identity", {1}));
  EXPECT_TRUE(fresh.status.ok()) << fresh.status.ToString();
  EXPECT_FALSE(fresh.cache_hit) << "a reloaded model answered with the old model's result";
  EXPECT_EQ((*server)->cache()->stats().entries, 1);
  ASSERT_TRUE((*server)->UnloadModel("identity").ok());
  EXPECT_EQ((*server)->cache()->stats().entries, 0);
}

TEST(ServerTest, UntrustedModelNamesAreEscapedInTheLog) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_st>(log)));
  {
    TempRepository repo("shoal_server_test");
    auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kExplicit));
    ASSERT_TRUE(server.ok());
    // What a client can send as the model name of a load request.
    EXPECT_FALSE((*server)->LoadModel("x\n[critical] forged line \x1b[2J").ok());
  }
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  EXPECT_EQ(text.find("\n[critical] forged"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("x\\n[critical] forged line \\x1b[2J"), std::string::npos) << text;
}

TEST(ServerTest, VersionPolicySelectsVersionsAndLatestIsDefault) {
  TempRepository repo("shoal_server_test");
  std::string config = kIdentityConfig;
  config += "version_policy: { all { } }\n";
  repo.AddModel("identity", config, {1, 3});
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(InferSync(**server, FloatRequest("identity", {1})).model_version, 3);
  auto req = FloatRequest("identity", {1});
  req.model_version = 1;
  EXPECT_EQ(InferSync(**server, req).model_version, 1);
  req.model_version = 2;
  EXPECT_EQ(InferSync(**server, req).status.code(), StatusCode::kNotFound);
}

TEST(ServerTest, PollPicksUpNewChangedAndRemovedModels) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kPoll));
  ASSERT_TRUE(server.ok());
  repo.AddModel("add_sub", kAddSubConfig);
  ASSERT_TRUE((*server)->PollRepository().ok());
  EXPECT_TRUE((*server)->GetModel("add_sub").ok());
  // A broken edit keeps the working version serving.
  repo.AddModel("identity", "this is not a config");
  ASSERT_TRUE((*server)->PollRepository().ok());
  EXPECT_TRUE(InferSync(**server, FloatRequest("identity", {1})).status.ok());
  repo.Remove("add_sub");
  ASSERT_TRUE((*server)->PollRepository().ok());
  EXPECT_EQ((*server)->GetModel("add_sub").status().code(), StatusCode::kNotFound);
}

TEST(ServerTest, CompletedConfigIsReturnedAndCostModelBatches) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("cost", R"(
name: "cost"
backend: "cost_model"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "a_us" value { string_value: "1000" } }
parameters { key: "b_us" value { string_value: "10" } }
)");
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok());
  auto config = (*server)->GetModelConfig("cost");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->max_batch_size(), 16);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  for (int i = 0; i < 64; ++i) {
    (*server)->Infer(FloatRequest("cost", {float(i)}), [&](InferResponse r) {
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return done == 64; }));
  auto mv = (*server)->GetModel("cost");
  auto stats = (*mv)->stats();
  EXPECT_EQ(stats.inference_count, 64u + 0u) << "warmup is not counted";
  EXPECT_LT(stats.execution_count, 64u) << "requests sent together must be batched";
  auto inst = (*mv)->instance_stats();
  ASSERT_EQ(inst.size(), 2u);
}

// GetModelConfig used to look the model up twice; a model removed from the repository
// between the looks made the second throw, and a front end answered 500 instead of 404.
// Readers race polls that remove and restore the model: every answer must be the config
// or NOT_FOUND / UNAVAILABLE.
TEST(ServerTest, ConfigOfAModelRemovedMeanwhileIsNotFoundNeverAnError) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("identity", kIdentityConfig);
  auto server = Server::Create(RepositoryOptions(repo, ModelControlMode::kPoll));
  ASSERT_TRUE(server.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> found{0}, missing{0};
  std::mutex mu;
  std::vector<std::string> unexpected;  // under mu (a local: no GUARDED_BY attribute)
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      while (!stop) {
        try {
          auto config = (*server)->GetModelConfig("identity");
          if (config.ok()) {
            ++found;
            if (config->name() != "identity") {
              std::lock_guard<std::mutex> lock(mu);
              unexpected.push_back("config of '" + config->name() + "'");
            }
          } else if (config.status().code() == StatusCode::kNotFound ||
                     config.status().code() == StatusCode::kUnavailable) {
            ++missing;
          } else {
            std::lock_guard<std::mutex> lock(mu);
            unexpected.push_back(config.status().ToString());
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          unexpected.push_back(std::string("exception: ") + e.what());
        }
      }
    });
  }
  for (int cycle = 0; cycle < 300; ++cycle) {
    repo.Remove("identity");
    ASSERT_TRUE((*server)->PollRepository().ok());
    repo.AddModel("identity", kIdentityConfig);
    ASSERT_TRUE((*server)->PollRepository().ok());
    std::lock_guard<std::mutex> lock(mu);
    if (!unexpected.empty()) break;
  }
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_TRUE(unexpected.empty()) << unexpected.size()
                                  << " bad answers, the first: " << unexpected.front();
  EXPECT_GT(found.load(), 0);
  EXPECT_GT(missing.load(), 0);
}

// A config without model_warmup gets a default warmup (zeros at each batch size) that
// nobody asked for: when the model refuses it, the model still loads, with a warning.
// A warmup the config names must still succeed.
TEST(ServerTest, FailingDefaultWarmupDoesNotFailTheLoad) {
  TempRepository repo("shoal_server_test");
  const std::string config = R"(
name: "NAME" backend: "test_misbehaving" max_batch_size: 2
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
parameters { key: "mode" value { string_value: "wrong_size" } }
)";
  auto named = [&](const std::string& name) {
    return std::string(config).replace(config.find("NAME"), 4, name);
  };
  repo.AddModel("unwarmed", named("unwarmed"));
  repo.AddModel("warmed", named("warmed") + R"(
model_warmup [ { name: "asked_for" batch_size: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]
)");
  ServerOptions options = RepositoryOptions(repo);
  options.backend_directories.push_back(PluginDir() + "_testdata");
  auto server = Server::Create(options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*server)->GetModel("unwarmed").ok())
      << (*server)->GetModel("unwarmed").status().ToString();
  auto warmed = (*server)->GetModel("warmed");
  ASSERT_FALSE(warmed.ok());
  EXPECT_NE(warmed.status().message().find("warmup 'asked_for'"), std::string::npos)
      << warmed.status().ToString();
  // The model's own failure reaches each request instead.
  auto r = InferSync(**server, FloatRequest("unwarmed", {1, 2}));
  EXPECT_FALSE(r.status.ok());
}

// The scheduling parameters are checked when the model loads; a bad one fails that model
// alone, naming the parameter.
TEST(ServerTest, SchedulingParametersAreValidatedAtLoad) {
  TempRepository repo("shoal_server_test");
  auto config = [](const std::string& name, const std::string& key, const std::string& value) {
    return "name: \"" + name +
           "\" backend: \"cost_model\" max_batch_size: 2\n"
           "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
           "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
           "parameters { key: \"" +
           key + "\" value { string_value: \"" + value + "\" } }\n";
  };
  repo.AddModel("reserve_ok", config("reserve_ok", "deadline_reserve_percent", "40"));
  repo.AddModel("reserve_100", config("reserve_100", "deadline_reserve_percent", "100"));
  repo.AddModel("reserve_text", config("reserve_text", "deadline_reserve_percent", "0.3"));
  repo.AddModel("policy_bad", config("policy_bad", "batching_policy", "fifo"));
  repo.AddModel("overrun_ok", config("overrun_ok", "admission_overrun_percentile", "99.5"));
  repo.AddModel("overrun_off", config("overrun_off", "admission_overrun_percentile", "0"));
  repo.AddModel("overrun_100", config("overrun_100", "admission_overrun_percentile", "100"));
  repo.AddModel("overrun_low", config("overrun_low", "admission_overrun_percentile", "20"));
  repo.AddModel("overrun_text", config("overrun_text", "admission_overrun_percentile", "p99"));
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto reserve_ok = (*server)->GetModel("reserve_ok");
  ASSERT_TRUE(reserve_ok.ok()) << reserve_ok.status().ToString();
  EXPECT_DOUBLE_EQ((*reserve_ok)->admission_reserve(), 0.40);
  EXPECT_TRUE((*server)->GetModel("overrun_ok").ok());
  EXPECT_TRUE((*server)->GetModel("overrun_off").ok());
  for (const auto& [model, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"reserve_100", "'deadline_reserve_percent' must be below 100"},
           {"reserve_text", "'deadline_reserve_percent' must be a non-negative integer"},
           {"policy_bad", "'batching_policy' must be 'slo' or 'fixed_window'"},
           {"overrun_100",
            "'admission_overrun_percentile' must be 0 (learn nothing) or in [50, 100)"},
           {"overrun_low",
            "'admission_overrun_percentile' must be 0 (learn nothing) or in [50, 100); was 20"},
           {"overrun_text", "'admission_overrun_percentile' must be a non-negative number"}}) {
    auto mv = (*server)->GetModel(model);
    ASSERT_FALSE(mv.ok()) << model;
    EXPECT_NE(mv.status().message().find(fragment), std::string::npos) << mv.status().ToString();
  }
}

TEST(ServerTest, ShutdownAnswersQueuedRequestsThenRejects) {
  TempRepository repo("shoal_server_test");
  repo.AddModel("cost", R"(
name: "cost"
backend: "cost_model"
max_batch_size: 2
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
parameters { key: "a_us" value { string_value: "2000" } }
)");
  auto server = Server::Create(RepositoryOptions(repo));
  ASSERT_TRUE(server.ok());
  std::atomic<int> ok{0}, answered{0};
  for (int i = 0; i < 20; ++i) {
    (*server)->Infer(FloatRequest("cost", {float(i)}), [&](InferResponse r) {
      ok += r.status.ok();
      ++answered;
    });
  }
  (*server)->Shutdown();
  EXPECT_EQ(answered.load(), 20);
  EXPECT_EQ(ok.load(), 20);
  EXPECT_FALSE((*server)->ready());
  EXPECT_EQ(InferSync(**server, FloatRequest("cost", {1})).status.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shoal::runtime
