// End-to-end tests of Triton-compatible behaviour of `shoal serve`: health endpoints that
// answer while models load, --strict-readiness, the request log of --log-verbose, Triton's
// nv_* metric names, and a model config that stays within Triton's ModelConfig schema.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_wait.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/grpc_service.grpc.pb.h"
#include "runtime/testing/plugin_configs.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using inference::GRPCInferenceService;
using runtime::testing::kIdentityConfig;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;

// A model whose load takes seconds: cost_model sleeps a_us per run, and its warmup runs
// 16 times (a large warmup count, as slow-starting real models have).
constexpr char kSlowConfig[] = R"(
name: "slow"
backend: "cost_model"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "a_us" value { string_value: "250000" } }
parameters { key: "b_us" value { string_value: "0" } }
model_warmup [ { name: "w" batch_size: 1 count: 16
                 inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
)";

// Fails with INTERNAL when an input holds 7 (answered 500 / INTERNAL).
constexpr char kFailingConfig[] = R"(
name: "failing"
backend: "cost_model"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "a_us" value { string_value: "100" } }
parameters { key: "b_us" value { string_value: "0" } }
parameters { key: "fail_on_value" value { string_value: "7" } }
)";

std::string OneValue(float v) {
  std::ostringstream body;
  body << R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[)" << v << "]}]}";
  return body.str();
}

std::string IdentityBody(const std::string& id) {
  return R"({"id":")" + id +
         R"(","inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]})";
}

struct Ports {
  int http = FreePort(), grpc = FreePort(), metrics = FreePort();
};

std::unique_ptr<ShoalProcess> Serve(const TempDir& repo, const Ports& ports,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"serve",
                                   "--model-repository",
                                   repo.path(),
                                   "--address",
                                   "127.0.0.1",
                                   "--http-port",
                                   std::to_string(ports.http),
                                   "--grpc-port",
                                   std::to_string(ports.grpc),
                                   "--metrics-port",
                                   std::to_string(ports.metrics),
                                   "--backend-directory",
                                   BinaryDir() + "/backends"};
  args.insert(args.end(), extra.begin(), extra.end());
  return ShoalProcess::Start(args);
}

std::unique_ptr<GRPCInferenceService::Stub> GrpcStub(int port) {
  return GRPCInferenceService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
}

bool GrpcLive(GRPCInferenceService::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  inference::ServerLiveResponse r;
  return stub.ServerLive(&ctx, {}, &r).ok() && r.live();
}

bool GrpcReady(GRPCInferenceService::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  inference::ServerReadyResponse r;
  return stub.ServerReady(&ctx, {}, &r).ok() && r.ready();
}

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(CompatE2eTest, HealthAnswersWhileModelsLoadThenReady) {
  TempDir repo;
  repo.WriteFile("identity/config.pbtxt", kIdentityConfig);
  repo.WriteFile("identity/1/.keep", "");
  repo.WriteFile("slow/config.pbtxt", kSlowConfig);
  repo.WriteFile("slow/1/.keep", "");
  Ports ports;
  auto p = Serve(repo, ports);
  ASSERT_NE(p, nullptr);
  // Only listening: the slow model's warmup takes 16 x 250 ms.
  ASSERT_TRUE(p->WaitForListening(ports.http)) << p->log();
  ASSERT_TRUE(p->WaitForListening(ports.grpc)) << p->log();
  HttpTestClient client("127.0.0.1", ports.http);
  auto stub = GrpcStub(ports.grpc);

  EXPECT_EQ(client.Get("/v2/health/live").status, 200);
  EXPECT_EQ(client.Get("/v2/health/ready").status, 503);
  EXPECT_TRUE(GrpcLive(*stub));
  EXPECT_FALSE(GrpcReady(*stub));
  const HttpReply early = client.Post("/v2/models/slow/infer", OneValue(1));
  EXPECT_EQ(early.status, 503) << early.body;
  EXPECT_NE(early.body.find("still loading"), std::string::npos) << early.body;
  EXPECT_NE(client.Get("/v2/models/slow/ready").status, 200);
  // All of the above happened during the load, not after it.
  EXPECT_EQ(p->log().find("start-up loading finished"), std::string::npos) << p->log();

  EXPECT_TRUE(WaitUntil([&] { return client.Get("/v2/health/ready").status == 200; }, 60000))
      << p->log();
  EXPECT_NE(p->log().find("start-up loading finished: every model loaded; the server is ready"),
            std::string::npos)
      << p->log();
  EXPECT_TRUE(GrpcReady(*stub));
  EXPECT_EQ(client.Get("/v2/models/slow/ready").status, 200);
  EXPECT_EQ(client.Post("/v2/models/slow/infer", OneValue(1)).status, 200);
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

// SIGTERM while models load: the model loading at that moment finishes, the rest are
// not started, and the server stops cleanly instead of loading everything first.
TEST(CompatE2eTest, SigtermDuringStartupLoadingStopsAfterTheCurrentModel) {
  TempDir repo;
  std::string second = kSlowConfig;
  second.replace(second.find("\"slow\""), 6, "\"slow2\"");
  repo.WriteFile("slow/config.pbtxt", kSlowConfig);
  repo.WriteFile("slow/1/.keep", "");
  repo.WriteFile("slow2/config.pbtxt", second);
  repo.WriteFile("slow2/1/.keep", "");
  Ports ports;
  auto p = Serve(repo, ports);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->WaitForListening(ports.http)) << p->log();
  HttpTestClient client("127.0.0.1", ports.http);
  EXPECT_EQ(client.Get("/v2/health/live").status, 200);
  EXPECT_EQ(p->Terminate(), 0) << p->log();
  const std::string log = p->log();
  EXPECT_NE(log.find("start-up loading was cancelled"), std::string::npos) << log;
  EXPECT_NE(log.find("shoal stopped cleanly"), std::string::npos) << log;
}

TEST(CompatE2eTest, StrictReadinessDecidesWhetherABrokenModelKeepsTheServerUnready) {
  TempDir repo;
  repo.WriteFile("identity/config.pbtxt", kIdentityConfig);
  repo.WriteFile("identity/1/.keep", "");
  repo.WriteFile("broken/config.pbtxt",
                 "name: \"broken\"\nbackend: \"identity\"\nmax_batch_size: -3\n");
  repo.WriteFile("broken/1/.keep", "");
  for (const bool strict : {true, false}) {
    SCOPED_TRACE(strict ? "--strict-readiness true" : "--strict-readiness false");
    Ports ports;
    auto p = Serve(repo, ports, {"--strict-readiness", strict ? "true" : "false"});
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p->WaitForPort(ports.http)) << p->log();  // start-up loading finished
    HttpTestClient client("127.0.0.1", ports.http);
    EXPECT_EQ(client.Get("/v2/health/live").status, 200);
    EXPECT_EQ(client.Get("/v2/health/ready").status, strict ? 503 : 200) << p->log();
    ASSERT_TRUE(p->WaitForListening(ports.grpc)) << p->log();
    EXPECT_EQ(GrpcReady(*GrpcStub(ports.grpc)), !strict);
    HttpTestClient metrics("127.0.0.1", ports.metrics);
    EXPECT_EQ(MetricSample(metrics, "shoal_server_ready"), strict ? 0 : 1);
    EXPECT_NE(client.Get("/v2/models/broken/ready").status, 200);
    EXPECT_EQ(client.Get("/v2/models/identity/ready").status, 200);
    EXPECT_EQ(client.Post("/v2/models/identity/infer", IdentityBody("x")).status, 200);
    EXPECT_NE(p->log().find("1 model(s) failed to load"), std::string::npos) << p->log();
    EXPECT_EQ(p->Terminate(), 0) << p->log();
  }
}

TEST(CompatE2eTest, RequestLogLinesAtVerboseOneAndErrorLinesAtEveryLevel) {
  TempDir repo;
  repo.WriteFile("identity/config.pbtxt", kIdentityConfig);
  repo.WriteFile("identity/1/.keep", "");
  repo.WriteFile("failing/config.pbtxt", kFailingConfig);
  repo.WriteFile("failing/1/.keep", "");
  const std::string error_line =
      "internal error answering a HTTP request for model 'failing' version 1: ";
  {
    Ports ports;
    auto p = Serve(repo, ports, {"--log-verbose", "1"});
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p->WaitForPort(ports.http)) << p->log();
    HttpTestClient client("127.0.0.1", ports.http);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(
          client.Post("/v2/models/identity/infer", IdentityBody("req-" + std::to_string(i))).status,
          200);
    }
    EXPECT_EQ(client.Post("/v2/models/failing/infer", OneValue(7)).status, 500);
    EXPECT_EQ(client.Post("/v2/models/nope/infer", OneValue(1)).status, 404);
    {
      ASSERT_TRUE(p->WaitForListening(ports.grpc)) << p->log();
      inference::ModelInferRequest r;
      r.set_model_name("identity");
      r.set_id("grpc-1");
      auto* in = r.add_inputs();
      in->set_name("INPUT0");
      in->set_datatype("FP32");
      in->add_shape(1);
      in->add_shape(1);
      in->mutable_contents()->add_fp32_contents(5);
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      inference::ModelInferResponse resp;
      ASSERT_TRUE(GrpcStub(ports.grpc)->ModelInfer(&ctx, r, &resp).ok());
    }
    // Each HTTP answer is logged just before it is sent; wait for the last one.
    ASSERT_TRUE(WaitUntil([&] { return p->log().find("id 'grpc-1'") != std::string::npos; }))
        << p->log();
    const std::string log = p->log();
    const std::regex line(
        "debug request model 'identity' version 1 id 'req-[0-2]' over HTTP: OK; queue [0-9]+ "
        "us, compute [0-9]+ us, total [0-9]+ us");
    EXPECT_EQ(
        std::distance(std::sregex_iterator(log.begin(), log.end(), line), std::sregex_iterator()),
        3)
        << log;
    EXPECT_NE(log.find("request model 'identity' version 1 id 'grpc-1' over gRPC: OK;"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("request model 'failing' version 1 over HTTP: INTERNAL ("),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("request model 'nope' over HTTP: NOT_FOUND ("), std::string::npos) << log;
    EXPECT_EQ(Count(log, error_line), 1u) << log;
    EXPECT_EQ(p->Terminate(), 0) << p->log();
  }
  {
    // Level 0 (the default): no per-request lines, but the internal error still is.
    Ports ports;
    auto p = Serve(repo, ports);
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p->WaitForPort(ports.http)) << p->log();
    HttpTestClient client("127.0.0.1", ports.http);
    EXPECT_EQ(client.Post("/v2/models/identity/infer", IdentityBody("quiet")).status, 200);
    EXPECT_EQ(client.Post("/v2/models/failing/infer", OneValue(7)).status, 500);
    ASSERT_TRUE(WaitUntil([&] { return p->log().find(error_line) != std::string::npos; }))
        << p->log();
    EXPECT_EQ(p->log().find("request model '"), std::string::npos) << p->log();
    EXPECT_EQ(p->Terminate(), 0) << p->log();
  }
}

// name{labels} -> value for every sample line.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

TEST(CompatE2eTest, TritonMetricNamesAgreeWithTheRequestsMade) {
  TempDir repo;
  repo.WriteFile("identity/config.pbtxt", kIdentityConfig);
  repo.WriteFile("identity/1/.keep", "");
  Ports ports;
  auto p = Serve(repo, ports);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->WaitForPort(ports.http)) << p->log();
  HttpTestClient client("127.0.0.1", ports.http);
  HttpTestClient scraper("127.0.0.1", ports.metrics);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(client.Post("/v2/models/identity/infer", IdentityBody("m")).status, 200);
  }
  // The model takes FP32: an INT32 input is refused by the model (400).
  EXPECT_EQ(
      client
          .Post("/v2/models/identity/infer",
                R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"INT32","data":[1]}]})")
          .status,
      400);
  const std::string in_flight = "shoal_requests_in_flight{model=\"identity\",version=\"1\"}";
  ASSERT_TRUE(WaitUntil([&] { return MetricSample(scraper, in_flight) == 0; }));
  const HttpReply scrape = scraper.Get("/metrics");
  ASSERT_EQ(scrape.status, 200);
  for (const char* counter :
       {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
        "nv_inference_exec_count", "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us"}) {
    EXPECT_NE(scrape.body.find(std::string("# TYPE ") + counter + " counter\n"), std::string::npos)
        << counter;
  }
  EXPECT_NE(scrape.body.find("# TYPE nv_inference_pending_request_count gauge\n"),
            std::string::npos);
  auto s = Samples(scrape.body);
  const std::string l = "{model=\"identity\",version=\"1\"}";
  auto failure = [&](const char* reason) {
    return s["nv_inference_request_failure{model=\"identity\",version=\"1\",reason=\"" +
             std::string(reason) + "\"}"];
  };
  EXPECT_EQ(s["nv_inference_request_success" + l], 5);
  EXPECT_EQ(
      s["nv_inference_request_success" + l],
      s["shoal_inference_requests_total{model=\"identity\",version=\"1\",outcome=\"success\"}"]);
  EXPECT_EQ(failure("OTHER"), 1);
  EXPECT_EQ(
      failure("OTHER") + failure("BACKEND") + failure("REJECTED") + failure("CANCELED"),
      s["shoal_inference_requests_total{model=\"identity\",version=\"1\",outcome=\"failure\"}"]);
  EXPECT_EQ(s["nv_inference_count" + l], 5);
  EXPECT_EQ(s["nv_inference_count" + l], s["shoal_inference_items_total" + l]);
  EXPECT_EQ(s["nv_inference_exec_count" + l], s["shoal_inference_executions_total" + l]);
  EXPECT_EQ(s["nv_inference_pending_request_count" + l], 0);
  // Cumulative microseconds: the same time as shoal's histogram sum in seconds.
  const double request_us = s["nv_inference_request_duration_us" + l];
  EXPECT_GT(request_us, 0);
  EXPECT_NEAR(request_us, s["shoal_request_duration_seconds_sum" + l] * 1e6, 1.0);
  EXPECT_NEAR(s["nv_inference_queue_duration_us" + l],
              s["shoal_queue_duration_seconds_sum" + l] * 1e6, 1.0);
  EXPECT_LE(s["nv_inference_compute_infer_duration_us" + l], request_us);
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

TEST(CompatE2eTest, ModelConfigParsesStrictlyAsTritonsModelConfigAndKeepsExtensions) {
  TempDir repo;
  // Group 0 in the deprecated spelling, group 1 in the parameter one.
  const std::string pinned = R"(
name: "pinned"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU cpu_cores: [ 0 ] threads: 1 },
                 { count: 1 kind: KIND_CPU } ]
parameters { key: "shoal.instance_group.1.cpu_cores" value { string_value: "0" } }
)";
  repo.WriteFile("pinned/config.pbtxt", pinned);
  repo.WriteFile("pinned/1/.keep", "");
  std::string also_old = pinned;
  also_old.replace(also_old.find("\"pinned\""), 8, "\"pinned2\"");
  repo.WriteFile("pinned2/config.pbtxt", also_old);
  repo.WriteFile("pinned2/1/.keep", "");
  Ports ports;
  auto p = Serve(repo, ports);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->WaitForPort(ports.http)) << p->log();
  HttpTestClient client("127.0.0.1", ports.http);
  EXPECT_EQ(client.Get("/v2/health/ready").status, 200) << p->log();

  const HttpReply r = client.Get("/v2/models/pinned/config");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body.find("\"cpu_cores\""), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("\"threads\""), std::string::npos) << r.body;
  // Strictly, as Triton's tools parse it: a field the schema lacks is an error.
  google::protobuf::util::JsonParseOptions strict;
  strict.ignore_unknown_fields = false;
  inference::ModelConfig config;
  const auto parsed = google::protobuf::util::JsonStringToMessage(r.body, &config, strict);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString() << "\n" << r.body;
  EXPECT_EQ(config.instance_group_size(), 2);
  EXPECT_EQ(config.parameters().at("shoal.instance_group.0.cpu_cores").string_value(), "0");
  EXPECT_EQ(config.parameters().at("shoal.instance_group.0.threads").string_value(), "1");
  EXPECT_EQ(config.parameters().at("shoal.instance_group.1.cpu_cores").string_value(), "0");

  // gRPC carries the same message: nothing outside the schema on the wire either.
  ASSERT_TRUE(p->WaitForListening(ports.grpc)) << p->log();
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  inference::ModelConfigRequest req;
  req.set_name("pinned");
  inference::ModelConfigResponse resp;
  ASSERT_TRUE(GrpcStub(ports.grpc)->ModelConfig(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.config().parameters().at("shoal.instance_group.0.threads").string_value(), "1");
  for (const auto& group : resp.config().instance_group()) {
    EXPECT_TRUE(group.GetReflection()->GetUnknownFields(group).empty());
  }
  // Two configs in the old spelling, one deprecation warning.
  EXPECT_EQ(Count(p->log(), "cpu_cores and threads are deprecated"), 1u) << p->log();
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

}  // namespace
}  // namespace shoal::e2e
