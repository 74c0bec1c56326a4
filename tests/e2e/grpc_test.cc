// End-to-end: the real `shoal serve` binary, spoken to over gRPC by a client built from
// the project's own grpc_service.proto, as tritonclient/perf_analyzer would.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "e2e_wait.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/grpc_service.grpc.pb.h"
#include "runtime/testing/plugin_configs.h"
#include "server/held_model.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using runtime::testing::kAddSubConfig;
using runtime::testing::kIdentityConfig;
using runtime::testing::kStringsConfig;

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

// One instance taking `a_us` per execution; `queue_policy` inside dynamic_batching.
std::string Slow(const std::string& name, int a_us, const std::string& queue_policy = "") {
  return "name: \"" + name + "\"\nbackend: \"cost_model\"\nmax_batch_size: 1\n" +
         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
         "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
         "dynamic_batching { " +
         queue_policy + " }\n" + "parameters { key: \"a_us\" value { string_value: \"" +
         std::to_string(a_us) +
         "\" } }\nparameters { key: \"b_us\" value { string_value: \"0\" } }\n";
}

// Gives a call a deadline far beyond what it should take, so that a server that stalls
// fails the test instead of hanging it.
void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
}

template <typename T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> Values(const std::string& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  if (!raw.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

ModelInferRequest FloatRequest(const std::string& model, const std::vector<float>& values,
                               const std::string& id = "") {
  ModelInferRequest r;
  r.set_model_name(model);
  r.set_id(id);
  auto* in = r.add_inputs();
  in->set_name("INPUT0");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(static_cast<int64_t>(values.size()));
  r.add_raw_input_contents(Raw(values));
  return r;
}

ModelInferRequest AddSubRequest(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  ModelInferRequest r;
  r.set_model_name("add_sub");
  for (const char* name : {"INPUT0", "INPUT1"}) {
    auto* in = r.add_inputs();
    in->set_name(name);
    in->set_datatype("INT32");
    in->add_shape(4);
  }
  r.add_raw_input_contents(Raw(a));
  r.add_raw_input_contents(Raw(b));
  return r;
}

// A running `shoal serve` with a gRPC stub connected to it, and a client of its metrics
// endpoint.
class Shoal {
 public:
  Shoal(const TempDir& repo, std::vector<std::string> extra = {}) {
    grpc_port_ = FreePort();
    metrics_port_ = FreePort();
    std::vector<std::string> args = {"serve",
                                     "--model-repository",
                                     repo.path(),
                                     "--http-port",
                                     std::to_string(FreePort()),
                                     "--grpc-port",
                                     std::to_string(grpc_port_),
                                     "--metrics-port",
                                     std::to_string(metrics_port_),
                                     "--backend-directory",
                                     BinaryDir() + "/backends"};
    args.insert(args.end(), extra.begin(), extra.end());
    process_ = ShoalProcess::Start(args);
    ready_ = process_ != nullptr && process_->WaitForPort(grpc_port_) &&
             process_->WaitForPort(metrics_port_);
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxReceiveMessageSize(INT32_MAX);
    channel_args.SetMaxSendMessageSize(INT32_MAX);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(grpc_port_),
                                         grpc::InsecureChannelCredentials(), channel_args);
    // Connected before the test's first call, so calls made together reach the server together.
    ready_ = ready_ && channel_->WaitForConnected(std::chrono::system_clock::now() +
                                                  std::chrono::seconds(20));
    stub_ = GRPCInferenceService::NewStub(channel_);
    metrics_ = std::make_unique<shoal::testing::HttpTestClient>("127.0.0.1", metrics_port_);
  }

  bool ready() const { return ready_; }
  GRPCInferenceService::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  ShoalProcess& process() { return *process_; }
  std::string log() const { return process_ ? process_->log() : "(not started)"; }

  grpc::Status Infer(const ModelInferRequest& req, ModelInferResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->ModelInfer(&ctx, req, resp);
  }

  inference::ModelStatistics Stats(const std::string& model) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ModelStatisticsRequest req;
    req.set_name(model);
    inference::ModelStatisticsResponse resp;
    auto s = stub_->ModelStatistics(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.model_stats_size() == 1 ? resp.model_stats(0) : inference::ModelStatistics();
  }

  // Requests `model` has answered, successfully or not.
  int64_t Answered(const std::string& model) {
    const auto s = Stats(model).inference_stats();
    return static_cast<int64_t>(s.success().count() + s.fail().count());
  }
  // From the metrics endpoint: requests `model` has accepted and not yet answered, or -1.
  // Not thread-safe: call it from the test's thread only.
  int64_t InFlight(const std::string& model) { return e2e::InFlight(*metrics_, model); }

  bool ModelReady(const std::string& model) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ModelReadyRequest req;
    req.set_name(model);
    inference::ModelReadyResponse resp;
    EXPECT_TRUE(stub_->ModelReady(&ctx, req, &resp).ok());
    return resp.ready();
  }

 private:
  int grpc_port_ = 0, metrics_port_ = 0;
  std::unique_ptr<ShoalProcess> process_;
  bool ready_ = false;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<GRPCInferenceService::Stub> stub_;
  std::unique_ptr<shoal::testing::HttpTestClient> metrics_;
};

class GrpcE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.WriteFile("identity/config.pbtxt", kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
    repo_.WriteFile("strings/config.pbtxt", kStringsConfig);
    repo_.WriteFile("strings/1/.keep", "");
    repo_.WriteFile("add_sub/config.pbtxt", kAddSubConfig);
    repo_.WriteFile("add_sub/1/.keep", "");
  }
  void AddModel(const std::string& name, const std::string& config) {
    repo_.WriteFile(name + "/config.pbtxt", config);
    repo_.WriteFile(name + "/1/.keep", "");
  }
  TempDir repo_;
};

TEST_F(GrpcE2eTest, HealthMetadataAndConfig) {
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  auto& stub = shoal.stub();
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ServerLiveResponse resp;
    ASSERT_TRUE(stub.ServerLive(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.live());
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ServerReadyResponse resp;
    ASSERT_TRUE(stub.ServerReady(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.ready());
  }
  EXPECT_TRUE(shoal.ModelReady("identity"));
  EXPECT_FALSE(shoal.ModelReady("missing"));
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ServerMetadataResponse resp;
    ASSERT_TRUE(stub.ServerMetadata(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.name(), "shoal");
    EXPECT_FALSE(resp.version().empty());
    std::vector<std::string> ext(resp.extensions().begin(), resp.extensions().end());
    EXPECT_NE(std::find(ext.begin(), ext.end(), "statistics"), ext.end());
    EXPECT_NE(std::find(ext.begin(), ext.end(), "model_configuration"), ext.end());
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ModelMetadataRequest req;
    req.set_name("identity");
    inference::ModelMetadataResponse resp;
    ASSERT_TRUE(stub.ModelMetadata(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.name(), "identity");
    ASSERT_EQ(resp.versions_size(), 1);
    EXPECT_EQ(resp.versions(0), "1");
    ASSERT_EQ(resp.inputs_size(), 1);
    EXPECT_EQ(resp.inputs(0).datatype(), "FP32");
    EXPECT_EQ(std::vector<int64_t>(resp.inputs(0).shape().begin(), resp.inputs(0).shape().end()),
              (std::vector<int64_t>{-1, -1}));
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ModelConfigRequest req;
    req.set_name("add_sub");
    inference::ModelConfigResponse resp;
    ASSERT_TRUE(stub.ModelConfig(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.config().name(), "add_sub");
    ASSERT_EQ(resp.config().input_size(), 2);
    EXPECT_EQ(resp.config().input(1).name(), "INPUT1");
    EXPECT_EQ(resp.config().input(1).data_type(), inference::TYPE_INT32);
  }
  {
    auto health = grpc::health::v1::Health::NewStub(shoal.channel());
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, UnaryInferRawTypedAndBytes) {
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();

  ModelInferRequest raw = AddSubRequest({1, 2, 3, 4}, {10, 20, 30, 40});
  raw.set_id("raw");
  ModelInferResponse resp;
  auto s = shoal.Infer(raw, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.id(), "raw");
  EXPECT_EQ(resp.model_version(), "1");
  ASSERT_EQ(resp.raw_output_contents_size(), 2);
  EXPECT_EQ(resp.outputs(1).name(), "OUTPUT1");
  EXPECT_EQ(Values<int32_t>(resp.raw_output_contents(0)), (std::vector<int32_t>{11, 22, 33, 44}));
  EXPECT_EQ(Values<int32_t>(resp.raw_output_contents(1)),
            (std::vector<int32_t>{-9, -18, -27, -36}));

  ModelInferRequest typed = AddSubRequest({}, {});
  typed.clear_raw_input_contents();
  for (int v : {5, 6, 7, 8}) typed.mutable_inputs(0)->mutable_contents()->add_int_contents(v);
  for (int v : {1, 1, 1, 1}) typed.mutable_inputs(1)->mutable_contents()->add_int_contents(v);
  ModelInferResponse tresp;
  s = shoal.Infer(typed, &tresp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Values<int32_t>(tresp.raw_output_contents(0)), (std::vector<int32_t>{6, 7, 8, 9}));

  // BYTES, raw: 4-byte little-endian lengths, including an empty and a binary element.
  const std::string elements = std::string("\x02\0\0\0hi", 6) + std::string("\0\0\0\0", 4) +
                               std::string("\x03\0\0\0\xff\0\x01", 7);
  ModelInferRequest bytes;
  bytes.set_model_name("strings");
  auto* in = bytes.add_inputs();
  in->set_name("INPUT0");
  in->set_datatype("BYTES");
  in->add_shape(3);
  bytes.add_raw_input_contents(elements);
  ModelInferResponse bresp;
  s = shoal.Infer(bytes, &bresp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(bresp.outputs(0).datatype(), "BYTES");
  EXPECT_EQ(bresp.raw_output_contents(0), elements);

  // Larger than gRPC's default 4 MiB receive limit.
  std::vector<float> big(2 << 20, 0.5f);
  ModelInferResponse big_resp;
  s = shoal.Infer(FloatRequest("identity", big), &big_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(big_resp.raw_output_contents(0).size(), big.size() * sizeof(float));
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, MessageLimitIsAnOption) {
  Shoal shoal(repo_, {"--grpc-max-message-bytes", std::to_string(1 << 20)});
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  ModelInferResponse resp;
  auto s = shoal.Infer(FloatRequest("identity", std::vector<float>(1 << 10, 0.5f)), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // 2 MiB of floats: over the 1 MiB limit set above.
  s = shoal.Infer(FloatRequest("identity", std::vector<float>(512 << 10, 0.5f)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, StreamingWithAnErrorInTheMiddle) {
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = shoal.stub().ModelStreamInfer(&ctx);
  const int n = 7;
  for (int i = 0; i < n; ++i) {
    ModelInferRequest r = FloatRequest("identity", {float(i), float(-i)}, std::to_string(i));
    if (i == 3) r.mutable_inputs(0)->set_shape(1, 5);  // declares 5 floats, sends 2
    ASSERT_TRUE(stream->Write(r));
  }
  stream->WritesDone();
  std::map<std::string, inference::ModelStreamInferResponse> got;
  inference::ModelStreamInferResponse r;
  while (stream->Read(&r)) got[r.infer_response().id()] = r;
  auto status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(got.size(), size_t{n});
  for (int i = 0; i < n; ++i) {
    const auto& resp = got[std::to_string(i)];
    if (i == 3) {
      EXPECT_NE(resp.error_message().find("INPUT0"), std::string::npos) << resp.error_message();
      continue;
    }
    EXPECT_EQ(resp.error_message(), "");
    EXPECT_EQ(resp.infer_response().model_name(), "identity");
    EXPECT_EQ(Values<float>(resp.infer_response().raw_output_contents(0)),
              (std::vector<float>{float(i), float(-i)}));
  }
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, EveryErrorStatus) {
  AddModel("held_q1", testing::HeldConfig("held_q1", "default_queue_policy { max_queue_size: 1 }"));
  AddModel("held_timeout",
           testing::HeldConfig("held_timeout",
                               "default_queue_policy { default_timeout_microseconds: 1000 }"));
  AddModel("broken", "name: \"broken\"\nbackend: \"no_such_plugin\"\nmax_batch_size: 1\n");
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  ModelInferResponse resp;

  auto s = shoal.Infer(FloatRequest("missing", {1}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();

  ModelInferRequest bad = AddSubRequest({1, 2, 3, 4}, {1, 2, 3});
  s = shoal.Infer(bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("INPUT1"), std::string::npos) << s.error_message();

  ModelInferRequest bad_version = FloatRequest("identity", {1});
  bad_version.set_model_version("latest");
  EXPECT_EQ(shoal.Infer(bad_version, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  s = shoal.Infer(FloatRequest("broken", {1}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();

  // A full queue: held_q1 keeps its one queued request, so the next is refused.
  {
    grpc::ClientContext held_ctx;
    SetDeadline(&held_ctx);
    std::thread holder([&] {
      ModelInferResponse r;
      const auto code =
          shoal.stub().ModelInfer(&held_ctx, FloatRequest("held_q1", {1}), &r).error_code();
      EXPECT_EQ(code, grpc::StatusCode::CANCELLED);
    });
    const bool queued = WaitUntil([&] { return shoal.InFlight("held_q1") == 1; });
    EXPECT_TRUE(queued) << shoal.InFlight("held_q1");
    if (queued) {
      s = shoal.Infer(FloatRequest("held_q1", {2}), &resp);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    }
    held_ctx.TryCancel();
    holder.join();
    // The cancellation reached the server, which took the request out of the queue.
    ASSERT_TRUE(WaitUntil([&] { return shoal.InFlight("held_q1") == 0; }))
        << shoal.InFlight("held_q1");
  }

  // A queue timeout: held_timeout would keep a lone request queued for ten minutes, so it
  // stays past its 1 ms timeout, and REJECT answers it with UNAVAILABLE, as Triton does.
  s = shoal.Infer(FloatRequest("held_timeout", {1}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("in the queue"), std::string::npos)
      << "the server's queue timeout, not the client's deadline: " << s.error_message();

  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::RepositoryIndexRequest req;
    req.set_repository_name("another");  // shoal serves one repository
    inference::RepositoryIndexResponse r;
    EXPECT_EQ(shoal.stub().RepositoryIndex(&ctx, req, &r).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::RepositoryModelLoadRequest req;
    req.set_model_name("identity");
    inference::RepositoryModelLoadResponse r;
    EXPECT_EQ(shoal.stub().RepositoryModelLoad(&ctx, req, &r).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION)
        << "control mode none";
  }
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::ModelConfigRequest req;
    req.set_name("missing");
    inference::ModelConfigResponse r;
    EXPECT_EQ(shoal.stub().ModelConfig(&ctx, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    // A client deadline shorter than the queue: DEADLINE_EXCEEDED from the client side
    // (held_q1, empty again, holds the call until the deadline passes).
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    ModelInferResponse r;
    EXPECT_EQ(shoal.stub().ModelInfer(&ctx, FloatRequest("held_q1", {2}), &r).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, ClientDeadlineAndTimeoutParameterAreTheRequestsDeadline) {
  AddModel("slow",
           "name: \"slow\"\nbackend: \"cost_model\"\nmax_batch_size: 1\n"
           "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
           "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
           "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"
           "parameters { key: \"a_us\" value { string_value: \"300000\" } }\n"
           "parameters { key: \"b_us\" value { string_value: \"0\" } }\n");
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  ModelInferResponse resp;
  // One run teaches the server that "slow" takes 300 ms.
  ASSERT_TRUE(shoal.Infer(FloatRequest("slow", {1}), &resp).ok());
  std::thread running([&] {
    ModelInferResponse r;
    EXPECT_TRUE(shoal.Infer(FloatRequest("slow", {2}), &r).ok());
  });
  ASSERT_TRUE(WaitUntil([&] { return shoal.InFlight("slow") == 1; })) << shoal.InFlight("slow");
  {
    // Behind a running request, a 100 ms gRPC deadline cannot be met: refused at once
    // with UNAVAILABLE (which gRPC clients retry), well before the deadline.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    ModelInferResponse r;
    const auto sent = std::chrono::steady_clock::now();
    grpc::Status st = shoal.stub().ModelInfer(&ctx, FloatRequest("slow", {3}), &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
    EXPECT_NE(st.error_message().find("deadline"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find("retry after"), std::string::npos) << st.error_message();
    EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::milliseconds(100));
  }
  ModelInferRequest with_timeout = FloatRequest("slow", {4});
  (*with_timeout.mutable_parameters())["timeout"].set_int64_param(100000);
  grpc::Status st = shoal.Infer(with_timeout, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  running.join();
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, StatisticsCountsMove) {
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  const auto before = shoal.Stats("identity");
  EXPECT_EQ(before.name(), "identity");
  EXPECT_EQ(before.version(), "1");
  for (int i = 0; i < 3; ++i) {
    ModelInferResponse r;
    ASSERT_TRUE(shoal.Infer(FloatRequest("identity", {float(i)}), &r).ok());
  }
  const auto after = shoal.Stats("identity");
  EXPECT_EQ(after.inference_stats().success().count(),
            before.inference_stats().success().count() + 3);
  EXPECT_GT(after.inference_stats().success().ns(), before.inference_stats().success().ns());
  EXPECT_EQ(after.inference_count(), before.inference_count() + 3);
  EXPECT_GE(after.execution_count(), before.execution_count() + 1);
  EXPECT_GT(after.last_inference(), 0u);
  EXPECT_GE(after.batch_stats_size(), 1);

  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  inference::ModelStatisticsResponse all;
  ASSERT_TRUE(shoal.stub().ModelStatistics(&ctx, {}, &all).ok());
  EXPECT_EQ(all.model_stats_size(), 3);
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, RepositoryLoadAndUnloadInExplicitMode) {
  Shoal shoal(repo_, {"--model-control-mode", "explicit", "--load-model", "identity"});
  ASSERT_TRUE(shoal.ready()) << shoal.log();
  auto& stub = shoal.stub();
  auto index = [&](bool ready_only) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::RepositoryIndexRequest req;
    req.set_ready(ready_only);
    inference::RepositoryIndexResponse resp;
    EXPECT_TRUE(stub.RepositoryIndex(&ctx, req, &resp).ok());
    std::map<std::string, std::string> states;
    for (const auto& m : resp.models()) states[m.name()] = m.state();
    return states;
  };
  EXPECT_EQ(index(true), (std::map<std::string, std::string>{{"identity", "READY"}}));
  EXPECT_EQ(index(false).size(), 3u);
  EXPECT_FALSE(shoal.ModelReady("add_sub"));

  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::RepositoryModelLoadRequest req;
    req.set_model_name("add_sub");
    inference::RepositoryModelLoadResponse resp;
    auto s = stub.RepositoryModelLoad(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_TRUE(shoal.ModelReady("add_sub"));
  ModelInferResponse r;
  EXPECT_TRUE(shoal.Infer(AddSubRequest({1, 1, 1, 1}, {2, 2, 2, 2}), &r).ok());
  EXPECT_EQ(index(true).size(), 2u);

  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::RepositoryModelUnloadRequest req;
    req.set_model_name("add_sub");
    inference::RepositoryModelUnloadResponse resp;
    auto s = stub.RepositoryModelUnload(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_FALSE(shoal.ModelReady("add_sub"));
  auto s = shoal.Infer(AddSubRequest({1, 1, 1, 1}, {2, 2, 2, 2}), &r);
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
              s.error_code() == grpc::StatusCode::NOT_FOUND)
      << s.error_message();
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    inference::RepositoryModelLoadRequest req;
    req.set_model_name("not_in_repository");
    inference::RepositoryModelLoadResponse resp;
    EXPECT_EQ(stub.RepositoryModelLoad(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(shoal.process().Terminate(), 0) << shoal.log();
}

TEST_F(GrpcE2eTest, SigtermAnswersEveryRpcInFlightAndExitsZero) {
  AddModel("slow", Slow("slow", 250000));
  AddModel("held", testing::HeldConfig("held"));
  Shoal shoal(repo_);
  ASSERT_TRUE(shoal.ready()) << shoal.log();

  // The first call on "slow" (250 ms: most likely still running when the signal comes), the
  // others on "held", which keeps them queued until the draining shutdown runs them.
  const int n = 5;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      ModelInferResponse r;
      auto s = shoal.Infer(FloatRequest(i == 0 ? "slow" : "held", {float(i)}), &r);
      EXPECT_TRUE(s.ok()) << s.error_message();
      ok += s.ok();
    });
  }
  // A stream with requests in flight too, already half-closed.
  grpc::ClientContext stream_ctx;
  SetDeadline(&stream_ctx);
  auto stream = shoal.stub().ModelStreamInfer(&stream_ctx);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(stream->Write(FloatRequest("held", {float(i)}, "s" + std::to_string(i))));
  }
  stream->WritesDone();
  // All 7 reached the server: "slow"'s one is in flight or answered (either count is exact
  // for a lone request), and "held" answers nothing before the signal. (No ASSERT while the
  // clients run: a failed wait still lets the signal end their calls.)
  EXPECT_TRUE(WaitUntil([&] {
    return shoal.Answered("slow") + shoal.InFlight("slow") >= 1 &&
           shoal.InFlight("held") == n - 1 + 2;
  })) << "slow: "
      << shoal.Answered("slow") << " answered, " << shoal.InFlight("slow")
      << " in flight; held: " << shoal.InFlight("held") << " in flight";
  shoal.process().Signal(SIGTERM);

  int stream_ok = 0;
  inference::ModelStreamInferResponse r;
  while (stream->Read(&r)) stream_ok += r.error_message().empty();
  EXPECT_TRUE(stream->Finish().ok());
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), n);
  EXPECT_EQ(stream_ok, 2);
  EXPECT_EQ(shoal.process().Wait(), 0) << shoal.log();
}

}  // namespace
}  // namespace shoal::e2e
