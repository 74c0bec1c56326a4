// End-to-end tests of the HTTP/REST front end: the real `shoal serve` on a temporary
// repository with the example plugins, driven over loopback by a plain HTTP client.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "e2e_wait.h"
#include "runtime/testing/plugin_configs.h"
#include "server/held_model.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using runtime::testing::kAddSubConfig;
using runtime::testing::kIdentityConfig;
using runtime::testing::kStringsConfig;

using json = nlohmann::json;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;
using shoal::testing::RawBytes;
using shoal::testing::SerializeStrings;
using ::testing::HasSubstr;

// One instance, one item per execution, 400 ms each: a second request waits in the queue;
// at most two requests may wait (a third is refused with 429).
constexpr char kSlow[] = R"(
name: "slow"
backend: "cost_model"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { default_queue_policy { max_queue_size: 2 } }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "a_us" value { string_value: "400000" } }
parameters { key: "b_us" value { string_value: "0" } }
)";

std::string InferJson(const std::vector<float>& values) {
  json body = {{"inputs",
                {{{"name", "INPUT0"},
                  {"shape", {1, values.size()}},
                  {"datatype", "FP32"},
                  {"data", values}}}}};
  return body.dump();
}

std::string SlowJson(float v) {
  json body = {
      {"inputs", {{{"name", "INPUT0"}, {"shape", {1, 1}}, {"datatype", "FP32"}, {"data", {v}}}}}};
  return body.dump();
}

std::string RawPost(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

void ExpectError(const HttpReply& r, int status, std::string_view fragment) {
  EXPECT_EQ(r.status, status) << r.body;
  auto j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr(std::string(fragment)));
}

class HttpE2eTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> extra = {}) {
    repo_.WriteFile("identity/config.pbtxt", kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
    repo_.WriteFile("strings/config.pbtxt", kStringsConfig);
    repo_.WriteFile("strings/1/.keep", "");
    repo_.WriteFile("add_sub/config.pbtxt", kAddSubConfig);
    repo_.WriteFile("add_sub/1/.keep", "");
    repo_.WriteFile("slow/config.pbtxt", kSlow);
    repo_.WriteFile("slow/1/.keep", "");
    // "held" keeps what is sent to it queued (server/held_model.h); its queue holds two.
    repo_.WriteFile("held/config.pbtxt",
                    testing::HeldConfig("held", "default_queue_policy { max_queue_size: 2 }"));
    repo_.WriteFile("held/1/.keep", "");
    http_port_ = FreePort();
    metrics_port_ = FreePort();
    std::vector<std::string> args = {"serve",
                                     "--model-repository",
                                     repo_.path(),
                                     "--http-port",
                                     std::to_string(http_port_),
                                     "--grpc-port",
                                     std::to_string(FreePort()),
                                     "--metrics-port",
                                     std::to_string(metrics_port_),
                                     "--backend-directory",
                                     BinaryDir() + "/backends"};
    args.insert(args.end(), extra.begin(), extra.end());
    process_ = ShoalProcess::Start(args);
    ASSERT_NE(process_, nullptr);
    ASSERT_TRUE(process_->WaitForPort(http_port_)) << process_->log();
    client_ = std::make_unique<HttpTestClient>("127.0.0.1", http_port_);
  }
  void TearDown() override {
    if (HasFailure() && process_) std::cerr << "---- shoal log ----\n" << process_->log() << "\n";
  }
  std::unique_ptr<HttpTestClient> NewClient() {
    return std::make_unique<HttpTestClient>("127.0.0.1", http_port_);
  }
  json Stats(const std::string& model) {
    HttpReply r = client_->Get("/v2/models/" + model + "/stats");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["model_stats"][0];
  }
  // Requests `model` has answered, successfully or not.
  int64_t Answered(const std::string& model) {
    const json s = Stats(model)["inference_stats"];
    return s["success"]["count"].get<int64_t>() + s["fail"]["count"].get<int64_t>();
  }
  // From the metrics endpoint: requests `model` has accepted and not yet answered.
  int64_t InFlight(const std::string& model) {
    if (!metrics_) metrics_ = std::make_unique<HttpTestClient>("127.0.0.1", metrics_port_);
    return e2e::InFlight(*metrics_, model);
  }
  int64_t InstanceExecutions(const std::string& model) {
    if (!metrics_) metrics_ = std::make_unique<HttpTestClient>("127.0.0.1", metrics_port_);
    return e2e::InstanceExecutions(*metrics_, model);
  }

  TempDir repo_;
  int http_port_ = 0, metrics_port_ = 0;
  std::unique_ptr<ShoalProcess> process_;
  std::unique_ptr<HttpTestClient> client_;
  std::unique_ptr<HttpTestClient> metrics_;
};

TEST_F(HttpE2eTest, HealthMetadataAndConfig) {
  Start();
  EXPECT_EQ(client_->Get("/v2/health/live").status, 200);
  EXPECT_EQ(client_->Get("/v2/health/ready").status, 200);
  EXPECT_EQ(client_->Get("/v2/models/identity/ready").status, 200);
  EXPECT_EQ(client_->Get("/v2/models/identity/versions/1/ready").status, 200);
  EXPECT_NE(client_->Get("/v2/models/missing/ready").status, 200);
  auto server = json::parse(client_->Get("/v2").body);
  EXPECT_EQ(server["name"], "shoal");
  EXPECT_THAT(server["extensions"].get<std::vector<std::string>>(),
              ::testing::Contains("binary_tensor_data"));
  auto meta = json::parse(client_->Get("/v2/models/identity").body);
  EXPECT_EQ(meta["inputs"][0]["shape"], json({-1, -1}));
  auto config = json::parse(client_->Get("/v2/models/identity/config").body);
  EXPECT_EQ(config["max_batch_size"], 8);
  EXPECT_EQ(config["input"][0]["name"], "INPUT0");
  EXPECT_EQ(config["input"][0]["data_type"], "TYPE_FP32");
  EXPECT_TRUE(config.contains("dynamic_batching"));
}

TEST_F(HttpE2eTest, JsonBinaryAndBytesInfer) {
  Start();
  HttpReply r = client_->Post("/v2/models/identity/infer", InferJson({1, 2.5, -3}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({1, 2.5, -3}));

  // Binary in and out, as perf_analyzer and the Python client send it.
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  json header = {{"inputs",
                  {{{"name", "INPUT0"},
                    {"shape", {4}},
                    {"datatype", "INT32"},
                    {"parameters", {{"binary_data_size", 16}}}},
                   {{"name", "INPUT1"},
                    {"shape", {4}},
                    {"datatype", "INT32"},
                    {"parameters", {{"binary_data_size", 16}}}}}},
                 {"outputs",
                  {{{"name", "OUTPUT0"}, {"parameters", {{"binary_data", true}}}},
                   {{"name", "OUTPUT1"}, {"parameters", {{"binary_data", true}}}}}}};
  const std::string h = header.dump();
  r = client_->Post("/v2/models/add_sub/infer", h + RawBytes(a) + RawBytes(b),
                    {{"Inference-Header-Content-Length", std::to_string(h.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_NE(r.Header("inference-header-content-length"), nullptr);
  auto j = json::parse(r.Json());
  EXPECT_EQ(j["outputs"][0]["parameters"]["binary_data_size"], 16);
  EXPECT_EQ(r.Binary(), RawBytes(std::vector<int32_t>{11, 22, 33, 44}) +
                            RawBytes(std::vector<int32_t>{-9, -18, -27, -36}));

  // BYTES: JSON strings in, binary out.
  json sreq = {
      {"inputs",
       {{{"name", "INPUT0"}, {"shape", {2}}, {"datatype", "BYTES"}, {"data", {"hello", "wörld"}}}}},
      {"parameters", {{"binary_data_output", true}}}};
  r = client_->Post("/v2/models/strings/infer", sreq.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Binary(), SerializeStrings({"hello", "wörld"}));
  // BYTES: binary in, JSON out.
  const std::string raw = SerializeStrings({"x", ""});
  json bh = {{"inputs",
              {{{"name", "INPUT0"},
                {"shape", {2}},
                {"datatype", "BYTES"},
                {"parameters", {{"binary_data_size", raw.size()}}}}}}};
  r = client_->Post("/v2/models/strings/infer", bh.dump() + raw,
                    {{"Inference-Header-Content-Length", std::to_string(bh.dump().size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({"x", ""}));

  // gzip-compressed request body.
  r = client_->Post("/v2/models/identity/infer", testing::GzipCompress(InferJson({7})),
                    {{"Content-Encoding", "gzip"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({7}));
}

TEST_F(HttpE2eTest, EveryErrorHasItsStatus) {
  Start({"--max-body-bytes", "65536", "--max-header-bytes", "4096"});
  ExpectError(client_->Post("/v2/models/identity/infer", "{\"inputs\": [}"), 400, "inputs");
  ExpectError(client_->Post("/v2/models/identity/infer", "{\"inputs\": [], "), 400, "JSON");
  ExpectError(client_->Post("/v2/models/nope/infer", InferJson({1})), 404, "nope");
  ExpectError(client_->Post("/v2/models/identity/versions/7/infer", InferJson({1})), 404,
              "version 7");
  ExpectError(
      client_->Post(
          "/v2/models/identity/infer",
          R"({"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2,3]}]})"),
      400, "inputs[0] ('INPUT0').data");
  ExpectError(client_->Post(
                  "/v2/models/identity/infer",
                  R"({"inputs":[{"name":"INPUT0","shape":[1,-1],"datatype":"FP32","data":[1]}]})"),
              400, "negative dimension");
  ExpectError(client_->Post(
                  "/v2/models/identity/infer",
                  R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FLOAT","data":[1]}]})"),
              400, "datatype");
  ExpectError(client_->Post(
                  "/v2/models/identity/infer",
                  R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"INT64","data":[1]}]})"),
              400, "INPUT0");
  const std::string h =
      R"({"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}]})";
  ExpectError(client_->Post("/v2/models/identity/infer", h + "12345678",
                            {{"Inference-Header-Content-Length", std::to_string(h.size())}}),
              400, "truncated");
  ExpectError(client_->Post("/v2/models/identity/infer", std::string(70000, ' ')), 413,
              "larger than the limit");
  ExpectError(
      client_->Post("/v2/models/identity/infer", testing::GzipCompress(std::string(200000, ' ')),
                    {{"Content-Encoding", "gzip"}}),
      413, "decompressed");
  ExpectError(client_->Request("GET", "/v2", "", {{"X-Padding", std::string(5000, 'x')}}), 431,
              "head");
  ExpectError(client_->Get("/v2/models/identity/infer"), 405, "POST");
  ExpectError(client_->Get("/v2/no/such/path"), 404, "Not Found");
  // Queue full: "held" keeps two requests queued, so a third is refused with 429 and
  // Retry-After. (The two are cancelled when their connections close as the test ends.)
  std::vector<std::unique_ptr<HttpTestClient>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(NewClient());
    ASSERT_TRUE(held.back()->SendRaw(RawPost("/v2/models/held/infer", SlowJson(float(i)))));
  }
  ASSERT_TRUE(WaitUntil([&] { return InFlight("held") == 2; })) << InFlight("held");
  HttpReply full = client_->Post("/v2/models/held/infer", SlowJson(9));
  ExpectError(full, 429, "");
  ASSERT_NE(full.Header("retry-after"), nullptr);
  // The refusal left the queue as it was (the gauge of requests in flight could still count
  // the refused one for a moment after its answer).
  EXPECT_EQ(MetricSample(*metrics_, "shoal_queue_depth{model=\"held\",version=\"1\"}"), 2);
  EXPECT_EQ(client_->Get("/v2/health/live").status, 200) << "the server is still up";
}

TEST_F(HttpE2eTest, DeadlinesAndOverloadAnswerWithTheirStatuses) {
  Start();
  // Before "slow" has run, the server predicts it fast: a request with a 100 ms `timeout`
  // queued behind a running one is admitted, then answered 504 when its deadline can no
  // longer be met, long before the running one (400 ms) ends, and never runs.
  auto first = NewClient();
  ASSERT_TRUE(first->SendRaw(RawPost("/v2/models/slow/infer", SlowJson(1))));
  ASSERT_TRUE(WaitUntil([&] { return InFlight("slow") == 1; })) << InFlight("slow");
  json body = json::parse(SlowJson(2));
  body["parameters"] = {{"timeout", 100000}};
  const auto sent = std::chrono::steady_clock::now();
  HttpReply late = client_->Post("/v2/models/slow/infer", body.dump());
  const auto waited = std::chrono::steady_clock::now() - sent;
  ExpectError(late, 504, "deadline");
  EXPECT_LT(waited, std::chrono::milliseconds(350)) << "answered before the running request ended";
  HttpReply first_reply = first->ReadReply();
  EXPECT_EQ(first_reply.status, 200) << first_reply.body;
  EXPECT_EQ(Stats("slow")["execution_count"], 1) << "the late request never ran";
  // Its instance records the run, and learns its time, after its answer is sent: until then
  // the next request would still be planned on the old prediction.
  ASSERT_TRUE(WaitUntil([&] { return InstanceExecutions("slow") == 1; }))
      << InstanceExecutions("slow");

  // Now it has learned a run takes 400 ms: behind a running request, a deadline of 100 ms
  // (the parameter, or the Shoal-Timeout-Us header) is refused at once with 429 and the
  // predicted drain time.
  ASSERT_TRUE(first->SendRaw(RawPost("/v2/models/slow/infer", SlowJson(3))));
  ASSERT_TRUE(WaitUntil([&] { return InFlight("slow") == 1; })) << InFlight("slow");
  HttpReply refused = client_->Post("/v2/models/slow/infer", body.dump());
  ExpectError(refused, 429, "deadline");
  ASSERT_NE(refused.Header("retry-after"), nullptr);
  EXPECT_EQ(*refused.Header("retry-after"), "1");
  ASSERT_NE(refused.Header("shoal-retry-after-ms"), nullptr);
  EXPECT_GT(std::stoll(*refused.Header("shoal-retry-after-ms")), 0);
  HttpReply by_header =
      client_->Post("/v2/models/slow/infer", SlowJson(4), {{"Shoal-Timeout-Us", "100000"}});
  ExpectError(by_header, 429, "deadline");
  ExpectError(client_->Post("/v2/models/slow/infer", SlowJson(4), {{"Shoal-Timeout-Us", "soon"}}),
              400, "shoal-timeout-us");
  EXPECT_EQ(first->ReadReply().status, 200);
  HttpTestClient metrics("127.0.0.1", metrics_port_);
  const std::string text = metrics.Get("/metrics").body;
  EXPECT_THAT(text, HasSubstr("shoal_inference_rejections_total{model=\"slow\",version=\"1\","
                              "reason=\"deadline\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("shoal_inference_rejections_total{model=\"slow\",version=\"1\","
                              "reason=\"overload\"} 2\n"));
}

TEST_F(HttpE2eTest, KeepAliveReusesOneConnection) {
  Start();
  for (int i = 0; i < 25; ++i) {
    HttpReply r = client_->Post("/v2/models/identity/infer", InferJson({float(i)}));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_FALSE(r.server_closed);
  }
  EXPECT_EQ(client_->connects(), 1);
}

TEST_F(HttpE2eTest, StatisticsMove) {
  Start();
  json before = Stats("identity");
  for (const char* k : {"success", "queue", "compute_input", "compute_infer", "compute_output",
                        "cache_hit", "cache_miss"}) {
    ASSERT_TRUE(before["inference_stats"][k]["count"].is_number_unsigned()) << k;
    ASSERT_TRUE(before["inference_stats"][k]["ns"].is_number_unsigned()) << k;
  }
  for (int i = 0; i < 6; ++i)
    ASSERT_EQ(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  json after = Stats("identity");
  EXPECT_EQ(after["inference_count"].get<uint64_t>() - before["inference_count"].get<uint64_t>(),
            6u);
  EXPECT_EQ(after["inference_stats"]["success"]["count"].get<uint64_t>() -
                before["inference_stats"]["success"]["count"].get<uint64_t>(),
            6u);
  EXPECT_GT(after["inference_stats"]["compute_infer"]["ns"].get<uint64_t>(),
            before["inference_stats"]["compute_infer"]["ns"].get<uint64_t>());
  EXPECT_GE(after["execution_count"].get<uint64_t>(),
            before["execution_count"].get<uint64_t>() + 1);
  EXPECT_EQ(json::parse(client_->Get("/v2/models/stats").body)["model_stats"].size(), 5u);
}

TEST_F(HttpE2eTest, ExplicitRepositoryLoadAndUnload) {
  Start({"--model-control-mode", "explicit", "--load-model", "add_sub"});
  auto index = json::parse(client_->Post("/v2/repository/index", "").body);
  ASSERT_EQ(index.size(), 5u);
  EXPECT_NE(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  HttpReply load = client_->Post("/v2/repository/models/identity/load", "");
  ASSERT_EQ(load.status, 200) << load.body;
  EXPECT_EQ(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  auto ready = json::parse(client_->Post("/v2/repository/index", R"({"ready":true})").body);
  EXPECT_EQ(ready.size(), 2u);
  ASSERT_EQ(client_->Post("/v2/repository/models/identity/unload", "").status, 200);
  EXPECT_NE(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  ExpectError(client_->Post("/v2/repository/models/nothere/load", ""), 404, "nothere");
}

TEST_F(HttpE2eTest, DisconnectCancelsQueuedRequest) {
  Start();
  auto leaver = NewClient();
  ASSERT_TRUE(leaver->SendRaw(RawPost("/v2/models/held/infer", SlowJson(1))));
  ASSERT_TRUE(WaitUntil([&] { return InFlight("held") == 1; })) << InFlight("held");
  leaver->Close();
  // "held" would keep the request queued for ten minutes: only the cancellation answers it.
  ASSERT_TRUE(WaitUntil([&] { return Answered("held") == 1; })) << Stats("held");
  json s = Stats("held");
  EXPECT_EQ(s["execution_count"], 0) << "the cancelled request never ran";
  EXPECT_EQ(s["inference_stats"]["fail"]["count"], 1);
  HttpTestClient metrics("127.0.0.1", metrics_port_);
  EXPECT_THAT(metrics.Get("/metrics").body,
              HasSubstr("shoal_inference_rejections_total{model=\"held\",version=\"1\",reason="
                        "\"cancelled\"} 1\n"));
}

TEST_F(HttpE2eTest, SigtermAnswersRequestsInFlightAndExitsZero) {
  Start();
  // One request on "slow" (400 ms: most likely still running when the signal comes) and
  // two on "held", which keeps them queued until the draining shutdown runs them.
  const std::vector<std::string> models = {"slow", "held", "held"};
  std::vector<std::unique_ptr<HttpTestClient>> clients;
  for (size_t i = 0; i < models.size(); ++i) {
    clients.push_back(NewClient());
    ASSERT_TRUE(
        clients.back()->SendRaw(RawPost("/v2/models/" + models[i] + "/infer", SlowJson(float(i)))));
  }
  // A keep-alive connection that is idle when the signal comes.
  auto idle = NewClient();
  ASSERT_EQ(idle->Get("/v2/health/live").status, 200);
  // All three reached the server: "slow"'s one is in flight or answered (either count is
  // exact for a lone request), and "held" answers nothing before the signal.
  ASSERT_TRUE(WaitUntil([&] {
    return Answered("slow") + InFlight("slow") >= 1 && InFlight("held") == 2;
  })) << "slow: "
      << Answered("slow") << " answered, " << InFlight("slow")
      << " in flight; held: " << InFlight("held") << " in flight";
  process_->Signal(SIGTERM);
  for (size_t i = 0; i < clients.size(); ++i) {
    HttpReply r = clients[i]->ReadReply();
    EXPECT_EQ(r.status, 200) << models[i] << ": " << r.body;
    if (r.status == 200) {
      EXPECT_EQ(json::parse(r.body)["model_name"], models[i]);
    }
  }
  EXPECT_EQ(process_->Wait(20000), 0) << process_->log();
}

}  // namespace
}  // namespace shoal::e2e
