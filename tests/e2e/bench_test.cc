// End-to-end tests of `shoal bench`: the real `shoal serve` on a temporary repository
// with the example plugins, and the real `shoal bench` binary driving it over loopback
// HTTP and gRPC with short windows. Assertions are on what the reports say (requests
// served, no errors, the server's own figures), not on how fast this machine is.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/testing/plugin_configs.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using runtime::testing::kIdentityConfig;

using json = nlohmann::json;
using ::testing::HasSubstr;

// 2 ms per execution whatever the batch: the server's compute figure must show it.
constexpr char kCost[] = R"(
name: "cost"
backend: "cost_model"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { }
parameters { key: "a_us" value { string_value: "2000" } }
parameters { key: "b_us" value { string_value: "0" } }
)";

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class BenchE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.WriteFile("identity/config.pbtxt", kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
    repo_.WriteFile("cost/config.pbtxt", kCost);
    repo_.WriteFile("cost/1/.keep", "");
    http_port_ = FreePort();
    grpc_port_ = FreePort();
    server_ = ShoalProcess::Start(
        {"serve", "--model-repository", repo_.path(), "--http-port", std::to_string(http_port_),
         "--grpc-port", std::to_string(grpc_port_), "--metrics-port", std::to_string(FreePort()),
         "--backend-directory", BinaryDir() + "/backends"});
    ASSERT_NE(server_, nullptr);
    ASSERT_TRUE(server_->WaitForPort(http_port_)) << server_->log();
    ASSERT_TRUE(server_->WaitForPort(grpc_port_)) << server_->log();
  }
  void TearDown() override {
    if (HasFailure() && server_) std::cerr << "---- shoal serve log ----\n" << server_->log();
  }

  // Runs `shoal bench ARGS`; returns its exit status and keeps its output in output_.
  int Bench(std::vector<std::string> args) {
    args.insert(args.begin(), "bench");
    auto p = ShoalProcess::Start(args);
    const int rc = p->Wait(120'000);
    output_ = p->log();
    return rc;
  }
  std::string Url(int port) { return "127.0.0.1:" + std::to_string(port); }
  std::string OutPath(const std::string& name) { return out_.path() + "/" + name; }

  TempDir repo_, out_;
  int http_port_ = 0, grpc_port_ = 0;
  std::unique_ptr<ShoalProcess> server_;
  std::string output_;
};

void ExpectSaneStep(const json& s) {
  EXPECT_GT(s["requests"].get<int64_t>(), 0) << s;
  EXPECT_GT(s["inferences_per_s"].get<double>(), 0) << s;
  EXPECT_EQ(s["errors_total"], 0) << s;
  const auto& l = s["latency_us"];
  EXPECT_GT(l["p50"].get<double>(), 0);
  EXPECT_LE(l["p50"].get<double>(), l["p99"].get<double>());
  EXPECT_LE(l["p99"].get<double>(), l["max"].get<double>());
  EXPECT_GT(s["client_cpu_us_per_request"].get<double>(), 0);
  ASSERT_TRUE(s.contains("server")) << s;
  EXPECT_GT(s["server"]["inference_count"].get<int64_t>(), 0);
}

TEST_F(BenchE2eTest, HttpClosedLoopSweep) {
  const int rc = Bench({"-m",
                        "identity",
                        "--shape",
                        "INPUT0:16",
                        "-u",
                        Url(http_port_),
                        "-i",
                        "http",
                        "-b",
                        "2",
                        "--concurrency-range",
                        "1:4:3",
                        "-p",
                        "300",
                        "--warmup",
                        "100",
                        "--max-trials",
                        "3",
                        "--percentile",
                        "99",
                        "--json",
                        OutPath("r.json"),
                        "-f",
                        OutPath("r.csv"),
                        "--svg",
                        OutPath("r.svg")});
  ASSERT_EQ(rc, 0) << output_;
  EXPECT_THAT(output_, HasSubstr("| Concurrency |"));
  const json report = json::parse(ReadFile(OutPath("r.json")));
  EXPECT_EQ(report["model"], "identity");
  EXPECT_EQ(report["protocol"], "http");
  EXPECT_EQ(report["latency_column"], "p99 latency");
  ASSERT_EQ(report["steps"].size(), 2u);
  EXPECT_EQ(report["steps"][0]["concurrency"], 1.0);
  EXPECT_EQ(report["steps"][1]["concurrency"], 4.0);
  for (const json& s : report["steps"]) {
    ExpectSaneStep(s);
    // -b 2: two inferences per request.
    EXPECT_DOUBLE_EQ(s["inferences_per_s"].get<double>(), 2 * s["requests_per_s"].get<double>());
  }
  const std::string csv = ReadFile(OutPath("r.csv"));
  EXPECT_EQ(csv.rfind("Concurrency,Inferences/Second", 0), 0u) << csv;
  EXPECT_THAT(ReadFile(OutPath("r.svg")), HasSubstr("<polyline class=\"p99\""));
}

TEST_F(BenchE2eTest, GrpcClosedAndOpenLoopSeeTheServersComputeTime) {
  int rc = Bench({"-m", "identity", "--shape", "INPUT0:16", "-u", Url(grpc_port_), "-i", "grpc",
                  "--concurrency-range", "4", "-p", "300", "--warmup", "100", "--max-trials", "3",
                  "--json", OutPath("g.json")});
  ASSERT_EQ(rc, 0) << output_;
  json report = json::parse(ReadFile(OutPath("g.json")));
  EXPECT_EQ(report["protocol"], "grpc");
  ASSERT_EQ(report["steps"].size(), 1u);
  ExpectSaneStep(report["steps"][0]);

  // Open loop on the 2 ms model: the server's compute time per execution shows the cost.
  rc = Bench({"-m", "cost", "-u", Url(grpc_port_), "-i", "grpc", "--request-rate-range", "100",
              "--request-distribution", "poisson", "-p", "400", "--warmup", "100", "--max-trials",
              "3", "--json", OutPath("o.json")});
  ASSERT_EQ(rc, 0) << output_;
  report = json::parse(ReadFile(OutPath("o.json")));
  const json& s = report["steps"][0];
  ExpectSaneStep(s);
  EXPECT_EQ(s["mode"], "request_rate");
  EXPECT_GE(s["server"]["compute_infer_us"].get<double>(), 1900) << s;
  EXPECT_GE(s["latency_us"]["p50"].get<double>(), 2000) << s;
}

TEST_F(BenchE2eTest, HttpOpenLoop) {
  const int rc = Bench({"-m", "cost", "-u", Url(http_port_), "--request-rate-range", "50:100:50",
                        "-p", "400", "--warmup", "100", "--max-trials", "3", "--input-data", "zero",
                        "--latency-threshold", "1000", "--json", OutPath("h.json")});
  ASSERT_EQ(rc, 0) << output_;
  const json report = json::parse(ReadFile(OutPath("h.json")));
  ASSERT_EQ(report["steps"].size(), 2u);
  for (const json& s : report["steps"]) {
    ExpectSaneStep(s);
    // Every request is far inside a 1 s SLO.
    EXPECT_DOUBLE_EQ(s["goodput_per_s"].get<double>(), s["requests_per_s"].get<double>());
  }
}

TEST_F(BenchE2eTest, UnknownModelAndMissingShapeFailWithAMessage) {
  EXPECT_EQ(Bench({"-m", "nope", "-u", Url(http_port_), "-p", "100"}), 1);
  EXPECT_THAT(output_, HasSubstr("model 'nope'"));
  EXPECT_EQ(Bench({"-m", "nope", "-u", Url(grpc_port_), "-i", "grpc", "-p", "100"}), 1);
  EXPECT_THAT(output_, HasSubstr("model 'nope'"));
  EXPECT_EQ(Bench({"-m", "identity", "-u", Url(http_port_), "-p", "100"}), 1);
  EXPECT_THAT(output_, HasSubstr("--shape INPUT0:"));
  EXPECT_EQ(Bench({"-m", "identity", "-u", "127.0.0.1:1", "-p", "100"}), 1);
  EXPECT_THAT(output_, HasSubstr("cannot connect"));
}

}  // namespace
}  // namespace shoal::e2e
