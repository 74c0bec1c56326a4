// End-to-end: a model whose output is not batch-major (models/nms_batch.onnx,
// NonMaxSuppression's [num_selected, 3]) served by the real `shoal serve`. Configured with
// dynamic batching it fails to load, and the repository index gives the reason naming
// the output; the same file with max_batch_size 0 (and with no config at all, which must
// not turn batching on) serves over HTTP.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(BatchMajorE2eTest, BatchingIsRefusedAtLoadAndUnbatchedServes) {
  TempDir repo;
  std::ifstream in(SourceDir() + "/models/nms_batch.onnx", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  ASSERT_GT(bytes.str().size(), 100u);
  const std::string common = "platform: \"onnxruntime_onnx\"\n";
  repo.WriteFile("batched/1/model.onnx", bytes.str());
  repo.WriteFile("batched/config.pbtxt",
                 "name: \"batched\"\n" + common +
                     "max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100 }\n");
  repo.WriteFile("single/1/model.onnx", bytes.str());
  repo.WriteFile("single/config.pbtxt", "name: \"single\"\n" + common + "max_batch_size: 0\n");
  repo.WriteFile("bare/1/model.onnx", bytes.str());
  repo.WriteFile("bare/config.pbtxt", "name: \"bare\"\n" + common);
  const int http = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(FreePort()),
                                "--metrics-port", std::to_string(FreePort())});
  ASSERT_TRUE(p->WaitForPort(http)) << p->log();
  HttpTestClient client("127.0.0.1", http);

  EXPECT_NE(client.Get("/v2/models/batched/ready").status, 200);
  const auto index = client.Post("/v2/repository/index", "{}");
  EXPECT_THAT(index.body, HasSubstr("output 'selected_indices'"));
  EXPECT_THAT(index.body, HasSubstr("is not batch-major"));

  // One image of three boxes, the second overlapping the first.
  const std::string body = json({{"inputs",
                                  {{{"name", "boxes"},
                                    {"shape", {1, 6, 4}},
                                    {"datatype", "FP32"},
                                    {"data", {0,  0,  10, 10, 0,  0,  9,  9,  20, 20, 30, 30,
                                              50, 50, 51, 51, 60, 60, 61, 61, 70, 70, 71, 71}}},
                                   {{"name", "scores"},
                                    {"shape", {1, 1, 6}},
                                    {"datatype", "FP32"},
                                    {"data", {0.9, 0.8, 0.7, 0.3, 0.2, 0.1}}}}}})
                               .dump();
  for (const char* model : {"single", "bare"}) {
    EXPECT_EQ(client.Get(std::string("/v2/models/") + model + "/ready").status, 200) << model;
    const auto config = json::parse(client.Get(std::string("/v2/models/") + model + "/config").body,
                                    nullptr, false);
    ASSERT_TRUE(config.is_object() && config.contains("name")) << config.dump();
    EXPECT_EQ(config.value("max_batch_size", 0), 0) << config.dump();  // 0 may be left out
    const auto r = client.Post(std::string("/v2/models/") + model + "/infer", body);
    ASSERT_EQ(r.status, 200) << model << ": " << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["outputs"][0]["name"], "selected_indices");
    EXPECT_EQ(j["outputs"][0]["shape"], json({3, 3}));
    EXPECT_EQ(j["outputs"][0]["data"], json({0, 0, 0, 0, 0, 2, 0, 0, 3}));
  }
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

}  // namespace
}  // namespace shoal::e2e
