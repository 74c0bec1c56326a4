// End-to-end: a committed model (models/resnet_op13.onnx) served twice by the real
// `shoal serve`, whole and cut into pipeline stages (config parameters pipeline_stages,
// pipeline_micro_batches), with dynamic batching and two instances (the hybrid
// strategy). The same batch over HTTP gets the same logits from both; the pipelined
// model's instances export shoal_pipeline_bubble_ratio and the whole model's do not; a
// bad pipeline parameter fails that model's load with a message naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using json = nlohmann::json;
using shoal::testing::HttpTestClient;
using ::testing::HasSubstr;

std::string Config(const std::string& name, const std::string& extra) {
  return "name: \"" + name + "\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n" +
         "dynamic_batching { max_queue_delay_microseconds: 1000 }\n" +
         "instance_group [ { count: 2 kind: KIND_CPU } ]\n" + extra;
}

std::string Param(const std::string& key, const std::string& value) {
  return "parameters { key: \"" + key + "\" value { string_value: \"" + value + "\" } }\n";
}

std::vector<float> Logits(HttpTestClient& client, const std::string& model,
                          const std::string& body) {
  const auto r = client.Post("/v2/models/" + model + "/infer", body);
  EXPECT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("outputs")) return {};
  EXPECT_EQ(j["outputs"][0]["shape"], json({4, 10}));
  return j["outputs"][0]["data"].get<std::vector<float>>();
}

TEST(PipelineE2eTest, StagedModelAnswersLikeTheWholeModelAndExportsItsBubble) {
  TempDir repo;
  const std::string onnx = SourceDir() + "/models/resnet_op13.onnx";
  std::ifstream in(onnx, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  ASSERT_GT(bytes.str().size(), 1000u);
  repo.WriteFile("whole/1/model.onnx", bytes.str());
  repo.WriteFile("whole/config.pbtxt", Config("whole", ""));
  repo.WriteFile("staged/1/model.onnx", bytes.str());
  repo.WriteFile("staged/config.pbtxt", Config("staged", Param("pipeline_stages", "2") +
                                                             Param("pipeline_micro_batches", "2")));
  repo.WriteFile("bad/1/model.onnx", bytes.str());
  repo.WriteFile("bad/config.pbtxt",
                 Config("bad", Param("pipeline_stage_boundaries", "no_such_node")));
  const int http = FreePort(), metrics = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(FreePort()),
                                "--metrics-port", std::to_string(metrics)});
  ASSERT_TRUE(p->WaitForPort(http)) << p->log();
  ASSERT_TRUE(p->WaitForPort(metrics)) << p->log();
  HttpTestClient client("127.0.0.1", http);

  json data = json::array();
  for (int i = 0; i < 4 * 3 * 32 * 32; ++i) data.push_back(std::sin(0.01 * i));
  const std::string body = json({{"inputs",
                                  {{{"name", "input"},
                                    {"shape", {4, 3, 32, 32}},
                                    {"datatype", "FP32"},
                                    {"data", data}}}}})
                               .dump();
  const std::vector<float> want = Logits(client, "whole", body);
  ASSERT_EQ(want.size(), 40u);
  float scale = 1e-6f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (int run = 0; run < 3; ++run) {
    const std::vector<float> got = Logits(client, "staged", body);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f * scale) << i;
  }

  const auto ready = client.Get("/v2/models/bad/ready");
  EXPECT_NE(ready.status, 200);
  const auto index = client.Post("/v2/repository/index", "{}");
  EXPECT_THAT(index.body, HasSubstr("'no_such_node' is not a node"));

  HttpTestClient scraper("127.0.0.1", metrics);
  const std::string text = scraper.Get("/metrics").body;
  EXPECT_THAT(text, HasSubstr("# TYPE shoal_pipeline_bubble_ratio gauge\n"));
  for (const char* instance : {"staged_0", "staged_1"}) {
    const std::string series = std::string("\nshoal_pipeline_bubble_ratio{model=\"staged\",") +
                               "version=\"1\",instance=\"" + instance + "\"} ";
    const size_t at = text.find(series);
    ASSERT_NE(at, std::string::npos) << instance << "\n" << text;
    const double v = std::strtod(text.c_str() + at + series.size(), nullptr);
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
  }
  EXPECT_EQ(text.find("shoal_pipeline_bubble_ratio{model=\"whole\""), std::string::npos);
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

}  // namespace
}  // namespace shoal::e2e
