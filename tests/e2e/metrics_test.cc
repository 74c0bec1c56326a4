// End-to-end test of the Prometheus endpoint: scrape the real `shoal serve` after some
// traffic and check the exposition text, the histogram series and the moving counters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include "e2e_wait.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;
using ::testing::HasSubstr;

// name{labels} -> value, for every sample line; fails the test on a malformed line.
std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  const std::regex re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (\S+)$)");
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, re)) << "malformed: " << line;
    if (!m.empty()) out[m[1]] = m[3] == "+Inf" ? INFINITY : std::stod(m[3]);
  }
  return out;
}

TEST(MetricsE2eTest, ScrapeHasHistogramsAndMovingCounters) {
  TempDir repo;
  repo.WriteFile("identity/config.pbtxt", R"(
name: "identity"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)");
  repo.WriteFile("identity/1/.keep", "");
  const int http = FreePort(), metrics = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(FreePort()),
                                "--metrics-port", std::to_string(metrics), "--backend-directory",
                                BinaryDir() + "/backends"});
  ASSERT_TRUE(p->WaitForPort(http)) << p->log();
  ASSERT_TRUE(p->WaitForPort(metrics)) << p->log();
  HttpTestClient client("127.0.0.1", http);
  HttpTestClient scraper("127.0.0.1", metrics);
  const std::string body =
      R"({"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]})";
  ASSERT_EQ(client.Post("/v2/models/identity/infer", body).status, 200);
  auto before = ParseSamples(scraper.Get("/metrics").body);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(client.Post("/v2/models/identity/infer", body).status, 200);
  // A client has its answer a moment before the server counts the request gone (the
  // gauge drops after the reply is handed over): wait for the gauge, bounded.
  const std::string in_flight = "shoal_requests_in_flight{model=\"identity\",version=\"1\"}";
  EXPECT_TRUE(WaitUntil([&] { return MetricSample(scraper, in_flight) == 0; }));
  HttpReply r = scraper.Get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(*r.Header("content-type"), HasSubstr("version=0.0.4"));
  EXPECT_THAT(r.body, HasSubstr("# TYPE shoal_request_duration_seconds histogram\n"));
  auto after = ParseSamples(r.body);
  const std::string l = "{model=\"identity\",version=\"1\"}";
  const std::string success =
      "shoal_inference_requests_total{model=\"identity\",version=\"1\",outcome=\"success\"}";
  EXPECT_EQ(after[success] - before[success], 4);
  for (const std::string h : {"shoal_request_duration_seconds", "shoal_queue_duration_seconds",
                              "shoal_compute_duration_seconds", "shoal_batch_size"}) {
    ASSERT_TRUE(after.count(h + "_count" + l)) << h;
    ASSERT_TRUE(after.count(h + "_sum" + l)) << h;
    const std::string inf = h + "_bucket{model=\"identity\",version=\"1\",le=\"+Inf\"}";
    ASSERT_TRUE(after.count(inf)) << h;
    EXPECT_EQ(after[inf], after[h + "_count" + l]) << h;
    EXPECT_GE(after[h + "_count" + l], 5) << h;
  }
  EXPECT_GT(after["shoal_request_duration_seconds_sum" + l], 0);
  EXPECT_EQ(after["shoal_queue_depth" + l], 0);
  EXPECT_EQ(after["shoal_requests_in_flight" + l], 0);
  EXPECT_GT(after["process_resident_memory_bytes"], 1e6);
  EXPECT_GE(after["process_cpu_seconds_total"], before["process_cpu_seconds_total"]);
  EXPECT_EQ(after["shoal_server_ready"], 1);
  EXPECT_EQ(scraper.Get("/nope").status, 404);
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

}  // namespace
}  // namespace shoal::e2e
