// HttpServer in process, over a real runtime::Server with the example plugins, talked to
// over loopback: every endpoint, both tensor encodings, errors with their status codes,
// connection handling (keep-alive, pipelining, chunked, 100-continue, limits), client
// disconnects cancelling queued work, and graceful shutdown.
#include "server/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/testing/test_repository.h"
#include "server/dashboard_assets.h"
#include "server/held_model.h"
#include "server/http_test_client.h"
#include "server/metrics.h"

namespace shoal::server {
namespace {

using json = nlohmann::json;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;
using shoal::testing::RawBytes;
using shoal::testing::SerializeStrings;
using ::testing::HasSubstr;

using runtime::testing::kAddSubConfig;
using runtime::testing::kIdentityConfig;
using runtime::testing::kStringsConfig;
using runtime::testing::RepositoryOptions;
using runtime::testing::TempRepository;

std::string InferJson(const std::vector<float>& values) {
  json body = {{"inputs",
                {{{"name", "INPUT0"},
                  {"shape", {1, values.size()}},
                  {"datatype", "FP32"},
                  {"data", values}}}}};
  return body.dump();
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(runtime::ModelControlMode mode = runtime::ModelControlMode::kNone,
             HttpOptions options = {}) {
    repo_.AddModel("identity", kIdentityConfig);
    repo_.AddModel("strings", kStringsConfig);
    repo_.AddModel("add_sub", kAddSubConfig);
    repo_.AddModel("held", shoal::testing::HeldConfig("held"));
    auto server = runtime::Server::Create(RepositoryOptions(repo_, mode));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    options.address = "127.0.0.1";
    options.port = 0;
    auto http = HttpServer::Start(server_.get(), options);
    ASSERT_TRUE(http.ok()) << http.status().ToString();
    http_ = std::move(http).value();
    client_ = std::make_unique<HttpTestClient>("127.0.0.1", http_->port());
  }
  void TearDown() override {
    if (http_) http_->Stop();
    if (server_) server_->Shutdown();
  }
  std::unique_ptr<HttpTestClient> NewClient() {
    return std::make_unique<HttpTestClient>("127.0.0.1", http_->port());
  }
  // Waits, at most 20 s, until `done` holds for model `name`'s state.
  template <typename Pred>
  bool WaitModel(const std::string& name, Pred done) {
    auto mv = server_->GetModel(name);
    if (!mv.ok()) return false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done(**mv)) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  TempRepository repo_{"shoal_http_test"};
  std::unique_ptr<runtime::Server> server_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<HttpTestClient> client_;
};

void ExpectError(const HttpReply& r, int status, std::string_view fragment) {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_NE(r.Header("content-type"), nullptr);
  EXPECT_EQ(*r.Header("content-type"), "application/json");
  auto j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr(std::string(fragment)));
}

TEST_F(HttpServerTest, HealthAndMetadata) {
  Start();
  HttpReply live = client_->Get("/v2/health/live");
  EXPECT_EQ(live.status, 200);
  EXPECT_EQ(live.body, "");
  EXPECT_EQ(client_->Get("/v2/health/ready").status, 200);
  EXPECT_EQ(client_->Get("/v2/models/identity/ready").status, 200);
  EXPECT_EQ(client_->Get("/v2/models/identity/versions/1/ready").status, 200);
  ExpectError(client_->Get("/v2/models/identity/versions/2/ready"), 404, "no loaded version 2");
  ExpectError(client_->Get("/v2/models/nope/ready"), 404,
              "Request for unknown model: 'nope' is not found");

  auto meta = json::parse(client_->Get("/v2").body);
  EXPECT_EQ(meta["name"], "shoal");
  EXPECT_FALSE(meta["version"].get<std::string>().empty());
  EXPECT_THAT(meta["extensions"].get<std::vector<std::string>>(),
              ::testing::IsSupersetOf(
                  {"binary_tensor_data", "statistics", "model_configuration", "model_repository"}));

  auto m = json::parse(client_->Get("/v2/models/identity").body);
  EXPECT_EQ(m["name"], "identity");
  EXPECT_EQ(m["versions"], json({"1"}));
  EXPECT_EQ(m["platform"], "identity");
  EXPECT_EQ(m["inputs"][0], json({{"name", "INPUT0"}, {"datatype", "FP32"}, {"shape", {-1, -1}}}));
  EXPECT_EQ(m["outputs"][0]["shape"], json({-1, -1}));
  auto a = json::parse(client_->Get("/v2/models/add_sub/versions/1").body);
  EXPECT_EQ(a["inputs"][1], json({{"name", "INPUT1"}, {"datatype", "INT32"}, {"shape", {4}}}));
  auto s = json::parse(client_->Get("/v2/models/strings").body);
  EXPECT_EQ(s["inputs"][0]["datatype"], "BYTES");

  HttpReply config = client_->Get("/v2/models/identity/config");
  ASSERT_EQ(config.status, 200);
  auto c = json::parse(config.body);
  EXPECT_EQ(c["name"], "identity");
  EXPECT_EQ(c["max_batch_size"], 8);
  EXPECT_EQ(c["input"][0]["data_type"], "TYPE_FP32");
  EXPECT_EQ(c["input"][0]["dims"], json({-1}));  // numbers, not strings
  EXPECT_TRUE(c.contains("dynamic_batching"));
  EXPECT_TRUE(c["dynamic_batching"]["max_queue_delay_microseconds"].is_number());

  ExpectError(client_->Get("/v2/models/identity/versions/x1/config"), 400, "decimal");
  ExpectError(client_->Get("/v2/nothing"), 404, "Not Found");
  ExpectError(client_->Get("/v3"), 404, "Not Found");
  HttpReply wrong = client_->Request("POST", "/v2/health/live", "");
  ExpectError(wrong, 405, "not allowed");
  ASSERT_NE(wrong.Header("allow"), nullptr);
  ExpectError(client_->Get("/v2/models/identity/infer"), 405, "POST");
  EXPECT_EQ(client_->connects(), 1) << "every request above reused one connection";
}

TEST_F(HttpServerTest, JsonInfer) {
  Start();
  HttpReply r = client_->Post("/v2/models/identity/infer", InferJson({1.5, -2, 3}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(*r.Header("content-type"), "application/json");
  auto j = json::parse(r.body);
  EXPECT_EQ(j["model_name"], "identity");
  EXPECT_EQ(j["model_version"], "1");
  EXPECT_FALSE(j.contains("id"));
  EXPECT_EQ(j["outputs"][0]["name"], "OUTPUT0");
  EXPECT_EQ(j["outputs"][0]["datatype"], "FP32");
  EXPECT_EQ(j["outputs"][0]["shape"], json({1, 3}));
  EXPECT_EQ(j["outputs"][0]["data"], json({1.5, -2, 3}));
  EXPECT_FALSE(j["outputs"][0].contains("parameters"));

  // Outputs in the requested order, id echoed, nested data flattened.
  json req = {
      {"id", "42"},
      {"inputs",
       {{{"name", "INPUT0"}, {"shape", {4}}, {"datatype", "INT32"}, {"data", {{1, 2}, {3, 4}}}},
        {{"name", "INPUT1"}, {"shape", {4}}, {"datatype", "INT32"}, {"data", {10, 20, 30, 40}}}}},
      {"outputs", {{{"name", "OUTPUT1"}}, {{"name", "OUTPUT0"}}}}};
  r = client_->Post("/v2/models/add_sub/versions/1/infer", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["id"], "42");
  EXPECT_EQ(j["outputs"][0]["name"], "OUTPUT1");
  EXPECT_EQ(j["outputs"][0]["data"], json({-9, -18, -27, -36}));
  EXPECT_EQ(j["outputs"][1]["data"], json({11, 22, 33, 44}));
}

TEST_F(HttpServerTest, BinaryInferBothWaysWithBytes) {
  Start();
  const std::vector<std::string> strings = {"hello", "", std::string("\xff\x00z", 3)};
  const std::string raw = SerializeStrings(strings);
  json header = {{"inputs",
                  {{{"name", "INPUT0"},
                    {"shape", {3}},
                    {"datatype", "BYTES"},
                    {"parameters", {{"binary_data_size", raw.size()}}}}}},
                 {"parameters", {{"binary_data_output", true}}}};
  const std::string h = header.dump();
  HttpReply r = client_->Post("/v2/models/strings/infer", h + raw,
                              {{"Inference-Header-Content-Length", std::to_string(h.size())},
                               {"Content-Type", "application/octet-stream"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(*r.Header("content-type"), "application/octet-stream");
  auto j = json::parse(r.Json());
  EXPECT_EQ(j["outputs"][0]["parameters"]["binary_data_size"], raw.size());
  EXPECT_FALSE(j["outputs"][0].contains("data"));
  EXPECT_EQ(r.Binary(), raw);

  // FP32 binary in, JSON out for one output by its own parameter.
  const std::vector<float> values = {0.25f, 8.f};
  json h2 = {{"inputs",
              {{{"name", "INPUT0"},
                {"shape", {1, 2}},
                {"datatype", "FP32"},
                {"parameters", {{"binary_data_size", 8}}}}}},
             {"outputs", {{{"name", "OUTPUT0"}, {"parameters", {{"binary_data", false}}}}}}};
  const std::string hs = h2.dump();
  r = client_->Post("/v2/models/identity/infer", hs + RawBytes(values),
                    {{"Inference-Header-Content-Length", std::to_string(hs.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("inference-header-content-length"), nullptr);
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({0.25, 8}));

  // JSON BYTES that are not UTF-8 cannot come back as JSON.
  r = client_->Post(
      "/v2/models/strings/infer",
      header.dump().replace(header.dump().find("true"), 4, "false") + raw,
      {{"Inference-Header-Content-Length", std::to_string(header.dump().size() + 1)}});
  ExpectError(r, 400, "UTF-8");
}

TEST_F(HttpServerTest, GzipAndDeflateBodies) {
  Start();
  for (const auto& [encoding, body] :
       {std::pair<std::string, std::string>{"gzip", testing::GzipCompress(InferJson({4, 5}))},
        {"deflate", testing::ZlibCompress(InferJson({4, 5}))}}) {
    HttpReply r =
        client_->Post("/v2/models/identity/infer", body, {{"Content-Encoding", encoding}});
    ASSERT_EQ(r.status, 200) << encoding << ": " << r.body;
    EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({4, 5}));
  }
  ExpectError(
      client_->Post("/v2/models/identity/infer", InferJson({1}), {{"Content-Encoding", "br"}}), 400,
      "br");
  ExpectError(client_->Post("/v2/models/identity/infer", "garbage", {{"Content-Encoding", "gzip"}}),
              400, "corrupt");
}

TEST_F(HttpServerTest, LargeAndCompressedRequestsAreHandledOffTheLoops) {
  HttpOptions o;
  o.threads = 1;
  o.codec_threads = 2;
  o.offload_bytes = 2048;
  Start(runtime::ModelControlMode::kNone, o);
  std::vector<float> small = {1, 2, 3};
  std::vector<float> large(1000);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<float>(i);

  // Small body, small answer: both on the loop.
  HttpReply r = client_->Post("/v2/models/identity/infer", InferJson(small));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json(small));
  EXPECT_EQ(http_->offloaded(), 0);

  // A compressed body, however small, is inflated off the loop; its answer is small.
  r = client_->Post("/v2/models/identity/infer", testing::GzipCompress(InferJson(small)),
                    {{"Content-Encoding", "gzip"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json(small));
  EXPECT_EQ(http_->offloaded(), 1);

  // A large body (4 KB of JSON) with a large JSON answer (4000 tensor bytes): both off.
  ASSERT_GT(InferJson(large).size(), 2048u);
  r = client_->Post("/v2/models/identity/infer", InferJson(large));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json(large));
  EXPECT_EQ(http_->offloaded(), 3);

  // The same answer as binary data is zero-copy, so only the request goes.
  json header = json::parse(InferJson(large));
  header["outputs"] = {{{"name", "OUTPUT0"}, {"parameters", {{"binary_data", true}}}}};
  r = client_->Post("/v2/models/identity/infer", header.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(http_->offloaded(), 4);

  // Errors found off the loop are answered as on it.
  ExpectError(client_->Post("/v2/models/identity/infer", "garbage", {{"Content-Encoding", "gzip"}}),
              400, "corrupt");
  std::string bad = InferJson(large);
  bad.replace(bad.find("FP32"), 4, "FP99");
  ExpectError(client_->Post("/v2/models/identity/infer", bad), 400, "FP99");
  EXPECT_EQ(http_->offloaded(), 6);
}

TEST_F(HttpServerTest, NoCodecThreadsKeepsEverythingOnTheLoops) {
  HttpOptions o;
  o.codec_threads = 0;
  o.offload_bytes = 0;
  Start(runtime::ModelControlMode::kNone, o);
  HttpReply r = client_->Post("/v2/models/identity/infer", testing::GzipCompress(InferJson({7, 8})),
                              {{"Content-Encoding", "gzip"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({7, 8}));
  EXPECT_EQ(http_->offloaded(), 0);
}

TEST_F(HttpServerTest, DisconnectCancelsARequestParsedOffTheLoop) {
  HttpOptions o;
  o.offload_bytes = 0;  // every body goes to the codec threads
  Start(runtime::ModelControlMode::kNone, o);
  auto leaver = NewClient();
  ASSERT_TRUE(leaver->SendRaw("POST /v2/models/held/infer HTTP/1.1\r\nContent-Length: " +
                              std::to_string(InferJson({2}).size()) + "\r\n\r\n" + InferJson({2})));
  ASSERT_TRUE(WaitModel("held", [](const auto& m) { return m.in_flight() == 1; }));
  EXPECT_EQ(http_->offloaded(), 1);
  leaver->Close();
  ASSERT_TRUE(WaitModel("held", [](const auto& m) { return m.stats().cancelled == 1; }));
  auto mv = server_->GetModel("held");
  ASSERT_TRUE(mv.ok());
  EXPECT_EQ((*mv)->stats().execution_count, 0u) << "the cancelled request never ran";
}

TEST_F(HttpServerTest, ErrorsCarryTheirStatusAndNameTheField) {
  HttpOptions o;
  o.max_body_bytes = 4096;
  o.max_header_bytes = 1024;
  o.limits.max_elements_per_tensor = 1000;
  Start(runtime::ModelControlMode::kNone, o);
  ExpectError(client_->Post("/v2/models/identity/infer", "{not json"), 400, "invalid JSON");
  ExpectError(client_->Post("/v2/models/nope/infer", InferJson({1})), 404,
              "Request for unknown model: 'nope' is not found");
  ExpectError(client_->Post(
                  "/v2/models/identity/infer",
                  R"({"inputs":[{"name":"INPUT0","shape":[1,-2],"datatype":"FP32","data":[1]}]})"),
              400, "inputs[0] ('INPUT0').shape[1]: negative dimension");
  ExpectError(
      client_->Post(
          "/v2/models/identity/infer",
          R"({"inputs":[{"name":"INPUT0","shape":[1,2000],"datatype":"FP32","data":[1]}]})"),
      400, "more than 1000 elements");
  // Validated by the runtime against the model: wrong datatype.
  ExpectError(client_->Post(
                  "/v2/models/identity/infer",
                  R"({"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"INT32","data":[1]}]})"),
              400, "INPUT0");
  // Body over the limit: 413 before the body is read, then the connection closes.
  HttpReply big = client_->Post("/v2/models/identity/infer", std::string(5000, ' '));
  ExpectError(big, 413, "larger than the limit");
  EXPECT_TRUE(big.server_closed);
  // Head over the limit: 431.
  HttpReply head =
      client_->Request("GET", "/v2/health/live", "", {{"X-Big", std::string(2000, 'a')}});
  ExpectError(head, 431, "request head");
  // Garbage on the wire: 400 and close.
  ASSERT_TRUE(client_->SendRaw("NOT HTTP\r\n\r\n"));
  HttpReply garbage = client_->ReadReply();
  EXPECT_EQ(garbage.status, 400);
  client_->Close();
  EXPECT_EQ(client_->Get("/v2/health/live").status, 200) << "the server survives";
}

TEST_F(HttpServerTest, PipeliningChunkedAndContinue) {
  Start();
  // Two requests in one write: two replies, in order.
  ASSERT_TRUE(client_->SendRaw("GET /v2/health/live HTTP/1.1\r\n\r\nGET /v2 HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(client_->ReadReply().status, 200);
  HttpReply second = client_->ReadReply();
  EXPECT_EQ(second.status, 200);
  EXPECT_THAT(second.body, HasSubstr("shoal"));
  // A chunked body.
  const std::string body = InferJson({9});
  std::string chunked =
      "POST /v2/models/identity/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  chunked += "5;ext=1\r\n" + body.substr(0, 5) + "\r\n";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", body.size() - 5);
  chunked += std::string(size) + "\r\n" + body.substr(5) + "\r\n0\r\nTrailer: x\r\n\r\n";
  ASSERT_TRUE(client_->SendRaw(chunked));
  HttpReply r = client_->ReadReply();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["outputs"][0]["data"], json({9}));
  // Expect: 100-continue gets the interim reply before the body is sent.
  ASSERT_TRUE(client_->SendRaw(
      "POST /v2/models/identity/infer HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n"));
  HttpReply cont = client_->ReadReply(300);  // ReadReply skips the 100 and waits for more
  EXPECT_EQ(cont.status, 0);                 // nothing but "100 Continue" yet: no final reply
  client_->Close();
  auto c2 = NewClient();
  ASSERT_TRUE(c2->SendRaw(
      "POST /v2/models/identity/infer HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(c2->SendRaw(body));
  EXPECT_EQ(c2->ReadReply().status, 200);
  EXPECT_EQ(c2->connects(), 1);
}

// Lines ended by a bare LF never make the "\r\n\r\n" the head scan waited for, so such a
// request once hung until the I/O timeout. Now it is answered 400 at once.
TEST_F(HttpServerTest, BareLineFeedsAreAnsweredWith400) {
  Start();
  ASSERT_TRUE(client_->SendRaw("GET /v2/health/live HTTP/1.1\nHost: x\n\n"));
  HttpReply r = client_->ReadReply();
  ExpectError(r, 400, "bare LF");
  EXPECT_TRUE(r.server_closed);
  // A chunked body with bare LFs too.
  auto c2 = NewClient();
  ASSERT_TRUE(c2->SendRaw(
      "POST /v2/models/identity/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n"));
  ExpectError(c2->ReadReply(), 400, "bare LF");
}

TEST_F(HttpServerTest, StatisticsCountRequests) {
  Start();
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  HttpReply r = client_->Get("/v2/models/identity/stats");
  ASSERT_EQ(r.status, 200) << r.body;
  auto j = json::parse(r.body);
  ASSERT_EQ(j["model_stats"].size(), 1u);
  const auto& s = j["model_stats"][0];
  EXPECT_EQ(s["name"], "identity");
  EXPECT_EQ(s["version"], "1");
  EXPECT_EQ(s["inference_count"], 5);
  EXPECT_GE(s["execution_count"].get<int>(), 1);
  EXPECT_GT(s["last_inference"].get<uint64_t>(), 0u);
  for (const char* k : {"success", "fail", "queue", "compute_input", "compute_infer",
                        "compute_output", "cache_hit", "cache_miss"}) {
    ASSERT_TRUE(s["inference_stats"][k]["count"].is_number_unsigned()) << k;
    ASSERT_TRUE(s["inference_stats"][k]["ns"].is_number_unsigned()) << k;
  }
  EXPECT_EQ(s["inference_stats"]["success"]["count"], 5);
  EXPECT_GT(s["inference_stats"]["success"]["ns"].get<uint64_t>(), 0u);
  EXPECT_TRUE(s["batch_stats"].is_array());
  auto all = json::parse(client_->Get("/v2/models/stats").body);
  EXPECT_EQ(all["model_stats"].size(), 4u);
  EXPECT_EQ(
      json::parse(client_->Get("/v2/models/add_sub/versions/1/stats").body)["model_stats"].size(),
      1u);
  ExpectError(client_->Get("/v2/models/nope/stats"), 404, "nope");
}

TEST_F(HttpServerTest, DisconnectCancelsQueuedRequest) {
  Start();
  // Queue a request, then go away.
  auto leaver = NewClient();
  ASSERT_TRUE(leaver->SendRaw("POST /v2/models/held/infer HTTP/1.1\r\nContent-Length: " +
                              std::to_string(InferJson({2}).size()) + "\r\n\r\n" + InferJson({2})));
  ASSERT_TRUE(WaitModel("held", [](const auto& m) { return m.in_flight() == 1; }));
  leaver->Close();
  ASSERT_TRUE(WaitModel("held", [](const auto& m) { return m.stats().cancelled == 1; }));
  auto mv = server_->GetModel("held");
  ASSERT_TRUE(mv.ok());
  EXPECT_EQ((*mv)->stats().execution_count, 0u) << "the cancelled request never ran";
  // The request is counted gone just after its (cancelled) answer.
  EXPECT_TRUE(WaitModel("held", [](const auto& m) { return m.in_flight() == 0; }));
}

TEST_F(HttpServerTest, ManyConcurrentConnections) {
  Start();
  constexpr int kClients = 64, kRequests = 10;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      HttpTestClient client("127.0.0.1", http_->port());
      for (int i = 0; i < kRequests; ++i) {
        HttpReply r = client.Post("/v2/models/identity/infer", InferJson({float(c), float(i)}));
        if (r.status == 200 && json::parse(r.body)["outputs"][0]["data"] == json({c, i})) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients * kRequests);
}

TEST_F(HttpServerTest, StopAcceptingAnswersRequestsInFlight) {
  Start();
  auto a = NewClient();
  ASSERT_TRUE(a->SendRaw("POST /v2/models/held/infer HTTP/1.1\r\nContent-Length: " +
                         std::to_string(InferJson({1}).size()) + "\r\n\r\n" + InferJson({1})));
  auto idle = NewClient();
  ASSERT_EQ(idle->Get("/v2/health/live").status, 200);
  ASSERT_TRUE(WaitModel("held", [](const auto& m) { return m.in_flight() == 1; }));
  http_->StopAccepting();
  EXPECT_TRUE(idle->WaitForClose(2000)) << "idle keep-alive connections are closed";
  server_->Shutdown();  // drains: runs and answers the held request
  EXPECT_TRUE(http_->Drain(5000));
  HttpReply r = a->ReadReply();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.server_closed);
  HttpTestClient late("127.0.0.1", http_->port());
  EXPECT_FALSE(late.Connect(200));
  http_->Stop();
  http_->Stop();  // idempotent
}

TEST_F(HttpServerTest, RepositoryIndexLoadUnload) {
  Start(runtime::ModelControlMode::kExplicit);
  HttpReply idx = client_->Post("/v2/repository/index", "");
  ASSERT_EQ(idx.status, 200) << idx.body;
  auto j = json::parse(idx.body);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[0]["name"], "add_sub");
  EXPECT_EQ(j[0]["state"], "UNAVAILABLE");
  ExpectError(client_->Post("/v2/models/identity/infer", InferJson({1})), 404, "identity");
  HttpReply load = client_->Post("/v2/repository/models/identity/load", "");
  EXPECT_EQ(load.status, 200) << load.body;
  EXPECT_EQ(load.body, "");
  EXPECT_EQ(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  auto ready = json::parse(client_->Post("/v2/repository/index", R"({"ready": true})").body);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0],
            json({{"name", "identity"}, {"version", "1"}, {"state", "READY"}, {"reason", ""}}));
  EXPECT_EQ(client_
                ->Post("/v2/repository/models/identity/unload",
                       R"({"parameters":{"unload_dependents":false}})")
                .status,
            200);
  EXPECT_NE(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  ExpectError(client_->Post("/v2/repository/models/nope/load", ""), 404, "nope");
  // A config override that does not validate (no backend) is refused with the reason.
  ExpectError(
      client_->Post("/v2/repository/models/identity/load", R"({"parameters":{"config":"{}"}})"),
      400, "config override");
  ExpectError(client_->Post("/v2/repository/models/identity/load",
                            R"({"parameters":{"file:1/model.onnx":"eA=="}})"),
              501, "file:1/model.onnx");
  EXPECT_EQ(client_->Post("/v2/repository/myrepo/models/add_sub/load", "").status, 200);
  ExpectError(client_->Post("/v2/repository/index", "{"), 400, "invalid JSON");
}

TEST_F(HttpServerTest, LoadRefusedOutsideExplicitMode) {
  Start();
  ExpectError(client_->Post("/v2/repository/models/identity/load", ""), 400, "explicit");
}

TEST_F(HttpServerTest, MetricsServerScrapes) {
  Start();
  ASSERT_EQ(client_->Post("/v2/models/identity/infer", InferJson({1})).status, 200);
  auto metrics = MetricsServer::Start(server_.get(), "127.0.0.1", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  HttpTestClient m("127.0.0.1", (*metrics)->port());
  HttpReply r = m.Get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(*r.Header("content-type"), HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(
      r.body,
      HasSubstr("shoal_request_duration_seconds_count{model=\"identity\",version=\"1\"} 1\n"));
  EXPECT_THAT(r.body, HasSubstr("shoal_request_duration_seconds_bucket{model=\"identity\",version="
                                "\"1\",le=\"+Inf\"} 1\n"));
  EXPECT_EQ(m.Get("/other").status, 404);
  (*metrics)->Stop();
}

// The dashboard shares the metrics port: its data, its page, a section added through
// the MetricsServer, and GET only.
TEST_F(HttpServerTest, MetricsServerServesTheDashboard) {
  Start();
  auto metrics = MetricsServer::Start(server_.get(), "127.0.0.1", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  ASSERT_TRUE((*metrics)
                  ->dashboard()
                  .AddSection("extra",
                              [] {
                                return DashboardSection{
                                    .title = "Extra",
                                    .charts = {{.title = "t", .series = {{"x", 1}}}}};
                              })
                  .ok());
  HttpTestClient m("127.0.0.1", (*metrics)->port());
  HttpReply r = m.Get("/dashboard/data.json");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(*r.Header("content-type"), HasSubstr("application/json"));
  const json j = json::parse(r.body);
  bool identity = false;
  for (const json& model : j["models"]) identity |= model["model"] == "identity";
  EXPECT_TRUE(identity) << r.body;
  EXPECT_EQ(j["sections"][0]["title"], "Extra");
  r = m.Get("/dashboard");
  EXPECT_EQ(r.status, 301);
  EXPECT_EQ(*r.Header("location"), "dashboard/");
  r = m.Get("/dashboard/");
  EXPECT_EQ(r.status, DashboardAssets().empty() ? 404 : 200);
  EXPECT_EQ(m.Post("/dashboard/data.json", "").status, 405);
  (*metrics)->Stop();
}

}  // namespace
}  // namespace shoal::server
