// GrpcServer in process, on a loopback port, with a client built from the project's own
// proto: the asynchronous machinery (unary, inference, streaming, cancellation, Stop).
#include "server/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "proto/grpc_health.grpc.pb.h"
#include "proto/grpc_service.grpc.pb.h"
#include "server/grpc_test_util.h"

namespace shoal::server {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using testing::TempRepository;

std::shared_ptr<grpc::Channel> Connect(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT32_MAX);
  args.SetMaxSendMessageSize(INT32_MAX);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  // Connect now: a first call that also sets up the connection can take longer than the
  // work the tests race it against (under TSan, hundreds of milliseconds).
  channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return channel;
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

grpc::Status Infer(GRPCInferenceService::Stub& stub, const ModelInferRequest& req,
                   ModelInferResponse* resp, int timeout_ms = 20000) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  return stub.ModelInfer(&ctx, req, resp);
}

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.AddModel("identity", testing::kIdentityConfig);
    repo_.AddModel("strings", testing::kStringsConfig);
    repo_.AddModel("add_sub", testing::kAddSubConfig);
    repo_.AddModel("slow", testing::SlowConfig("slow", 200000));
    repo_.AddModel("held", shoal::testing::HeldConfig("held"));
    repo_.AddModel("held_q1", shoal::testing::HeldConfig(
                                  "held_q1", "default_queue_policy { max_queue_size: 1 }"));
    runtime_ = testing::MakeServer(repo_);
    ASSERT_NE(runtime_, nullptr);
  }

  void StartServer(GrpcOptions options = {}) {
    options.address = "127.0.0.1";
    options.port = 0;
    auto s = GrpcServer::Start(runtime_.get(), std::move(options));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    grpc_ = std::move(s).value();
    ASSERT_GT(grpc_->port(), 0);
    stub_ = GRPCInferenceService::NewStub(Connect(grpc_->port()));
  }

  int64_t InFlight(const std::string& model) {
    auto mv = runtime_->GetModel(model);
    return mv.ok() ? (*mv)->in_flight() : -1;
  }
  // Requests `model` has received so far: in flight or answered (a count that only grows,
  // unlike in_flight, so waiting on it does not race the model's execution time). A request
  // answered between the two reads may count twice (stats are recorded before in_flight
  // drops), so only "at least one arrived" is exact.
  int64_t Arrived(const std::string& model) {
    auto mv = runtime_->GetModel(model);
    if (!mv.ok()) return -1;
    const auto st = (*mv)->stats();
    return (*mv)->in_flight() + static_cast<int64_t>(st.success.count + st.fail.count);
  }
  bool WaitArrived(const std::string& model, int64_t want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (Arrived(model) < want) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
  // Calls "identity" until a call fails (at most 20 s): once Stop has begun draining, new
  // calls are refused. Returns the first failure's code (OK if none failed).
  grpc::StatusCode CallUntilRefused() {
    grpc::StatusCode code = grpc::StatusCode::OK;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (code == grpc::StatusCode::OK && std::chrono::steady_clock::now() < deadline) {
      ModelInferResponse r;
      code = Infer(*stub_, FloatRequest("identity", {1}), &r, 2000).error_code();
    }
    return code;
  }
  // Waits (at most 20 s, so a broken assumption fails instead of hanging) until `model`
  // has at least `want` requests in flight, or none when `want` is 0.
  bool WaitInFlight(const std::string& model, int64_t want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (want == 0 ? InFlight(model) != 0 : InFlight(model) < want) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  TempRepository repo_{"shoal_grpc_test"};
  std::unique_ptr<runtime::Server> runtime_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<GRPCInferenceService::Stub> stub_;
};

TEST_F(GrpcServerTest, StartRejectsBadOptions) {
  auto bad = [&](auto mutate) {
    GrpcOptions o;
    o.port = 0;
    mutate(o);
    return GrpcServer::Start(runtime_.get(), o).status();
  };
  EXPECT_EQ(bad([](GrpcOptions& o) { o.port = 70000; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](GrpcOptions& o) { o.threads = 0; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](GrpcOptions& o) { o.max_message_bytes = 0; }).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](GrpcOptions& o) { o.max_message_bytes = int64_t{1} << 31; }).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](GrpcOptions& o) { o.stream_max_in_flight = 0; }).code(),
            StatusCode::kInvalidArgument);
  Status null_server = GrpcServer::Start(nullptr, GrpcOptions{}).status();
  EXPECT_EQ(null_server.code(), StatusCode::kInvalidArgument);
  Status threads = bad([](GrpcOptions& o) { o.threads = -3; });
  EXPECT_NE(threads.message().find("was -3"), std::string::npos) << threads.message();

  StartServer();
  GrpcOptions same;
  same.address = "127.0.0.1";
  same.port = grpc_->port();
  auto second = GrpcServer::Start(runtime_.get(), same);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << "the port is taken";
}

TEST_F(GrpcServerTest, UnaryRpcsOverTheNetwork) {
  StartServer();
  {
    grpc::ClientContext ctx;
    inference::ServerLiveResponse resp;
    ASSERT_TRUE(stub_->ServerLive(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.live());
  }
  {
    grpc::ClientContext ctx;
    inference::ServerMetadataResponse resp;
    ASSERT_TRUE(stub_->ServerMetadata(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.name(), "shoal");
  }
  {
    grpc::ClientContext ctx;
    inference::ModelMetadataRequest req;
    req.set_name("nope");
    inference::ModelMetadataResponse resp;
    EXPECT_EQ(stub_->ModelMetadata(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    inference::SystemSharedMemoryStatusResponse resp;
    EXPECT_TRUE(stub_->SystemSharedMemoryStatus(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.regions().empty());
  }
  {
    grpc::ClientContext ctx;
    inference::CudaSharedMemoryRegisterRequest req;
    req.set_name("c");
    req.set_byte_size(4);
    inference::CudaSharedMemoryRegisterResponse resp;
    // This server's shared-memory manager has no device opener (serve.cc sets one).
    EXPECT_EQ(stub_->CudaSharedMemoryRegister(&ctx, req, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    auto health = grpc::health::v1::Health::NewStub(Connect(grpc_->port()));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

TEST_F(GrpcServerTest, InferRawTypedAndBytes) {
  StartServer();
  ModelInferRequest req;
  req.set_model_name("add_sub");
  req.set_id("42");
  for (const char* name : {"INPUT0", "INPUT1"}) {
    auto* in = req.add_inputs();
    in->set_name(name);
    in->set_datatype("INT32");
    in->add_shape(4);
  }
  req.add_raw_input_contents(Raw<int32_t>({1, 2, 3, 4}));
  req.add_raw_input_contents(Raw<int32_t>({10, 20, 30, 40}));
  ModelInferResponse resp;
  auto s = Infer(*stub_, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.id(), "42");
  EXPECT_EQ(resp.model_name(), "add_sub");
  EXPECT_EQ(resp.model_version(), "1");
  ASSERT_EQ(resp.outputs_size(), 2);
  ASSERT_EQ(resp.raw_output_contents_size(), 2);
  EXPECT_EQ(resp.outputs(0).name(), "OUTPUT0");
  EXPECT_EQ(Values<int32_t>(resp.raw_output_contents(0)), (std::vector<int32_t>{11, 22, 33, 44}));
  EXPECT_EQ(Values<int32_t>(resp.raw_output_contents(1)),
            (std::vector<int32_t>{-9, -18, -27, -36}));

  // The same with typed contents, asking for OUTPUT1 only.
  req.clear_raw_input_contents();
  for (int i = 0; i < 2; ++i) {
    auto* c = req.mutable_inputs(i)->mutable_contents();
    for (int v : {1, 2, 3, 4}) c->add_int_contents(v * (i + 1));
  }
  req.add_outputs()->set_name("OUTPUT1");
  ModelInferResponse typed;
  s = Infer(*stub_, req, &typed);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(typed.outputs_size(), 1);
  EXPECT_EQ(typed.outputs(0).name(), "OUTPUT1");
  EXPECT_EQ(Values<int32_t>(typed.raw_output_contents(0)), (std::vector<int32_t>{-1, -2, -3, -4}));

  ModelInferRequest strings;
  strings.set_model_name("strings");
  auto* in = strings.add_inputs();
  in->set_name("INPUT0");
  in->set_datatype("BYTES");
  in->add_shape(2);
  in->mutable_contents()->add_bytes_contents("hello");
  in->mutable_contents()->add_bytes_contents(std::string("\0bin", 4));
  ModelInferResponse sresp;
  s = Infer(*stub_, strings, &sresp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(sresp.outputs(0).datatype(), "BYTES");
  EXPECT_EQ(sresp.raw_output_contents(0), std::string("\x05\0\0\0hello\x04\0\0\0\0bin", 17));
}

TEST_F(GrpcServerTest, InferErrorsMapToStatusCodes) {
  StartServer();
  ModelInferResponse resp;
  EXPECT_EQ(Infer(*stub_, FloatRequest("unknown", {1}), &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);

  ModelInferRequest bad = FloatRequest("identity", {1, 2});
  bad.mutable_inputs(0)->set_shape(1, 3);  // 3 floats declared, 2 sent
  auto s = Infer(*stub_, bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("INPUT0"), std::string::npos) << s.error_message();

  ModelInferRequest wrong_name = FloatRequest("identity", {1});
  wrong_name.mutable_inputs(0)->set_name("OTHER");
  s = Infer(*stub_, wrong_name, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("OTHER"), std::string::npos) << s.error_message();

  // A full queue: held_q1 keeps its one queued request, so the next is refused.
  grpc::ClientContext held_ctx;
  std::thread holder([&] {
    ModelInferResponse r;
    EXPECT_EQ(stub_->ModelInfer(&held_ctx, FloatRequest("held_q1", {1}), &r).error_code(),
              grpc::StatusCode::CANCELLED);
  });
  ASSERT_TRUE(WaitInFlight("held_q1", 1));
  s = Infer(*stub_, FloatRequest("held_q1", {2}), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("full"), std::string::npos) << s.error_message();
  held_ctx.TryCancel();
  holder.join();
}

TEST_F(GrpcServerTest, MessagesAboveFourMebibytes) {
#if defined(SHOAL_TSAN)  // CMakeLists.txt undefines __SANITIZE_THREAD__ for protobuf's ABI
  GTEST_SKIP() << "minutes under TSan (every byte copied inside gRPC is checked), and it "
                  "tests message limits, not threads";
#endif
  StartServer();
  std::vector<float> big(5 << 18);  // 5 MiB
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000);
  ModelInferResponse resp;
  // The deadline only guards against a hang: 5 MiB each way under ASan on a loaded
  // 2-core machine once took longer than the 20 s the other tests allow.
  auto s = Infer(*stub_, FloatRequest("identity", big), &resp, 120000);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Values<float>(resp.raw_output_contents(0)), big);
}

TEST_F(GrpcServerTest, StreamingWithAnErrorInTheMiddle) {
  StartServer();
  grpc::ClientContext ctx;
  auto stream = stub_->ModelStreamInfer(&ctx);
  const int n = 6;
  for (int i = 0; i < n; ++i) {
    ModelInferRequest r =
        FloatRequest(i == 2 ? "unknown" : "identity", {float(i)}, "id" + std::to_string(i));
    if (i == 4) r.mutable_inputs(0)->set_datatype("NOPE");
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
    const auto& resp = got["id" + std::to_string(i)];
    if (i == 2) {
      EXPECT_NE(resp.error_message().find("unknown"), std::string::npos) << resp.error_message();
    } else if (i == 4) {
      EXPECT_NE(resp.error_message().find("NOPE"), std::string::npos) << resp.error_message();
    } else {
      EXPECT_EQ(resp.error_message(), "");
      auto final_flag = resp.infer_response().parameters().find("triton_final_response");
      ASSERT_NE(final_flag, resp.infer_response().parameters().end());
      EXPECT_TRUE(final_flag->second.bool_param());
      ASSERT_EQ(resp.infer_response().raw_output_contents_size(), 1);
      EXPECT_EQ(Values<float>(resp.infer_response().raw_output_contents(0)),
                std::vector<float>{float(i)});
    }
  }
}

TEST_F(GrpcServerTest, StreamBackPressureStillAnswersEverything) {
  GrpcOptions o;
  o.stream_max_in_flight = 2;
  StartServer(o);
  grpc::ClientContext ctx;
  auto stream = stub_->ModelStreamInfer(&ctx);
  const int n = 200;
  std::thread writer([&] {
    for (int i = 0; i < n; ++i) stream->Write(FloatRequest("identity", {float(i)}));
    stream->WritesDone();
  });
  int count = 0;
  inference::ModelStreamInferResponse r;
  while (stream->Read(&r)) count += r.error_message().empty();
  writer.join();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(count, n);
}

TEST_F(GrpcServerTest, ClientDeadlineCancelsTheRuntimeRequest) {
  StartServer();
  // The deadline must not pass before the request reaches the runtime, or there is nothing
  // to cancel: a watcher records that it did.
  std::atomic<bool> reached{false}, answered{false};
  std::thread watcher([&] {
    while (!answered) {
      if (InFlight("held") == 1) reached = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  ModelInferResponse resp;
  const auto code = Infer(*stub_, FloatRequest("held", {2}), &resp, 2000).error_code();
  answered = true;
  watcher.join();
  EXPECT_EQ(code, grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(reached.load()) << "the request never reached the runtime within 2 s";
  // The abandoned request was cancelled, not run.
  ASSERT_TRUE(WaitInFlight("held", 0));
  auto stats = (*runtime_->GetModel("held"))->stats();
  EXPECT_EQ(stats.execution_count, 0u);
  EXPECT_EQ(stats.cancelled, 1u);
  EXPECT_TRUE(Infer(*stub_, FloatRequest("identity", {1}), &resp).ok());
}

TEST_F(GrpcServerTest, StopAnswersEveryRpcInFlight) {
  GrpcOptions o;
  o.shutdown_grace_ms = 60000;  // far more than the test needs, even under sanitizers
  StartServer(o);
  const int n = 4;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      ModelInferResponse r;
      auto s = Infer(*stub_, FloatRequest("held", {float(i)}), &r);
      EXPECT_TRUE(s.ok()) << s.error_message();
      ok += s.ok();
    });
  }
  // All n are held in the queue, so all are in flight when Stop begins.
  const bool all_in = WaitInFlight("held", n);
  std::thread stopper([&] { grpc_->Stop(); });
  // Once Stop is draining (new calls are refused), let the held requests run: the runtime's
  // draining shutdown executes what is queued. Stop must deliver every answer.
  EXPECT_EQ(CallUntilRefused(), grpc::StatusCode::UNAVAILABLE);
  runtime_->Shutdown();
  stopper.join();
  for (auto& t : clients) t.join();
  EXPECT_TRUE(all_in) << InFlight("held");
  EXPECT_EQ(ok.load(), n);
  grpc_->Stop();  // idempotent
}

TEST_F(GrpcServerTest, StopEndsAnOpenStreamOnceItsRequestsAreAnswered) {
  GrpcOptions o;
  o.shutdown_grace_ms = 60000;
  StartServer(o);
  grpc::ClientContext ctx;
  auto stream = stub_->ModelStreamInfer(&ctx);
  ASSERT_TRUE(stream->Write(FloatRequest("identity", {1}, "a")));
  inference::ModelStreamInferResponse r;
  ASSERT_TRUE(stream->Read(&r));
  EXPECT_EQ(r.infer_response().id(), "a");
  ASSERT_TRUE(stream->Write(FloatRequest("slow", {1}, "b")));
  ASSERT_TRUE(WaitArrived("slow", 1)) << Arrived("slow");
  // Another stream, idle: it must not hold Stop for the grace period.
  grpc::ClientContext idle_ctx;
  auto idle = stub_->ModelStreamInfer(&idle_ctx);
  ASSERT_TRUE(idle->Write(FloatRequest("identity", {2}, "c")));
  ASSERT_TRUE(idle->Read(&r));

  const auto start = std::chrono::steady_clock::now();
  grpc_->Stop();  // the client never half-closes either stream
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
      << "Stop must not wait out the grace period for streams left open";
  ASSERT_TRUE(stream->Read(&r)) << "the request in flight is answered";
  EXPECT_EQ(r.infer_response().id(), "b");
  EXPECT_EQ(r.error_message(), "");
  EXPECT_FALSE(stream->Read(&r));
  auto status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_FALSE(idle->Read(&r));
  EXPECT_EQ(idle->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcServerTest, StopCancelsWhatStillRunsAfterTheGracePeriod) {
  GrpcOptions o;
  o.shutdown_grace_ms = 50;
  StartServer(o);
  const int n = 3;  // all held in the queue far longer than the grace period
  std::atomic<int> answered{0}, failed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      ModelInferResponse r;
      auto s = Infer(*stub_, FloatRequest("held", {float(i)}), &r);
      ++answered;
      // gRPC reports the forced cancellation as UNAVAILABLE ("Cancelling all calls").
      failed += s.error_code() == grpc::StatusCode::CANCELLED ||
                s.error_code() == grpc::StatusCode::UNAVAILABLE;
    });
  }
  ASSERT_TRUE(WaitInFlight("held", n)) << InFlight("held");
  grpc_->Stop();
  for (auto& t : clients) t.join();
  EXPECT_EQ(answered.load(), n);
  EXPECT_EQ(failed.load(), n) << "every call was still running when the grace period ended";
  // The runtime answered them as cancelled, without running them.
  ASSERT_TRUE(WaitInFlight("held", 0)) << InFlight("held");
  const auto stats = (*runtime_->GetModel("held"))->stats();
  EXPECT_EQ(stats.cancelled, uint64_t{n});
  EXPECT_EQ(stats.execution_count, 0u);
}

TEST_F(GrpcServerTest, NewInferenceIsRefusedWhileDraining) {
  StartServer();
  // Keep one call in flight (held in the queue) so that Stop stays in its draining phase
  // until the test lets it go.
  grpc::ClientContext busy_ctx;
  std::thread busy([&] {
    ModelInferResponse r;
    auto code = stub_->ModelInfer(&busy_ctx, FloatRequest("held", {1}), &r).error_code();
    EXPECT_TRUE(code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::UNAVAILABLE)
        << code;
  });
  ASSERT_TRUE(WaitInFlight("held", 1)) << InFlight("held");
  std::thread stopper([&] { grpc_->Stop(); });
  // Calls made before Stop begins draining still succeed; once it has, they are refused.
  EXPECT_EQ(CallUntilRefused(), grpc::StatusCode::UNAVAILABLE);
  busy_ctx.TryCancel();
  busy.join();
  stopper.join();
}

TEST_F(GrpcServerTest, RuntimeShutdownDuringStreamingIsAnsweredAsUnavailable) {
  StartServer();
  grpc::ClientContext ctx;
  auto stream = stub_->ModelStreamInfer(&ctx);
  ASSERT_TRUE(stream->Write(FloatRequest("slow", {1}, "queued")));
  ASSERT_TRUE(WaitArrived("slow", 1)) << Arrived("slow");
  runtime_->Shutdown();  // drains: "queued" is still answered
  ASSERT_TRUE(stream->Write(FloatRequest("identity", {1}, "late")));
  stream->WritesDone();
  std::map<std::string, inference::ModelStreamInferResponse> got;
  inference::ModelStreamInferResponse r;
  while (stream->Read(&r)) got[r.infer_response().id()] = r;
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(got["queued"].error_message(), "");
  EXPECT_NE(got["late"].error_message().find("shutting down"), std::string::npos)
      << got["late"].error_message();
  grpc_->Stop();
}

}  // namespace
}  // namespace shoal::server
