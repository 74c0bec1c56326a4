// End-to-end: a model with a KIND_GPU instance group served by the real `shoal serve`,
// beside the same file on KIND_CPU. Where shoal has a GPU to run on (bench/gpu/run.sh on
// the GPU machine), both answer the same rows with the same scores. Everywhere else the
// GPU copy fails its load and the repository index gives the reason (built without the
// CUDA path, or no usable CUDA device), while the CPU copy serves: a GPU model that
// cannot run never takes the server down with it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using json = nlohmann::json;
using shoal::testing::HttpTestClient;
using ::testing::AnyOf;
using ::testing::HasSubstr;

std::string Config(const std::string& name, const std::string& group) {
  return "name: \"" + name +
         "\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 64\n"
         "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
         "instance_group [ { " +
         group + " } ]\n";
}

TEST(GpuE2eTest, AGpuModelServesAsItsCpuTwinOrFailsAloneSayingWhy) {
  TempDir repo;
  std::ifstream in(SourceDir() + "/examples/models/recommender/1/model.onnx", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  ASSERT_GT(bytes.str().size(), 1000u);
  repo.WriteFile("on_gpu/1/model.onnx", bytes.str());
  repo.WriteFile("on_gpu/config.pbtxt", Config("on_gpu", "count: 1 kind: KIND_GPU gpus: [ 0 ]"));
  repo.WriteFile("on_cpu/1/model.onnx", bytes.str());
  repo.WriteFile("on_cpu/config.pbtxt", Config("on_cpu", "count: 1 kind: KIND_CPU"));
  const int http = FreePort(), metrics = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(FreePort()),
                                "--metrics-port", std::to_string(metrics)});
  ASSERT_TRUE(p->WaitForPort(http)) << p->log();
  HttpTestClient client("127.0.0.1", http);
  ASSERT_EQ(client.Get("/v2/models/on_cpu/ready").status, 200) << p->log();

  // Three rows of 64 features.
  std::vector<float> rows;
  for (int i = 0; i < 3 * 64; ++i) rows.push_back(std::sin(0.37f * static_cast<float>(i)));
  const std::string body =
      json({{"inputs",
             {{{"name", "features"}, {"shape", {3, 64}}, {"datatype", "FP32"}, {"data", rows}}}}})
          .dump();
  const auto on_cpu = client.Post("/v2/models/on_cpu/infer", body);
  ASSERT_EQ(on_cpu.status, 200) << on_cpu.body;
  const json cpu = json::parse(on_cpu.body)["outputs"][0]["data"];
  ASSERT_EQ(cpu.size(), 3u);

  if (client.Get("/v2/models/on_gpu/ready").status != 200) {
    const auto index = client.Post("/v2/repository/index", "{}");
    EXPECT_THAT(index.body, HasSubstr("on_gpu"));
    EXPECT_THAT(index.body,
                AnyOf(HasSubstr("built without the CUDA path"), HasSubstr("no usable CUDA device")))
        << index.body;
    // No GPU instance ran, so no GPU families.
    HttpTestClient scrape("127.0.0.1", metrics);
    const auto page = scrape.Get("/metrics");
    EXPECT_EQ(page.status, 200);
    EXPECT_THAT(page.body, ::testing::Not(HasSubstr("shoal_gpu_busy_seconds_total")));
    EXPECT_EQ(p->Terminate(), 0) << p->log();
    GTEST_SKIP() << "no GPU here; the KIND_GPU model failed its load as it should: " << index.body;
  }
  const auto on_gpu = client.Post("/v2/models/on_gpu/infer", body);
  ASSERT_EQ(on_gpu.status, 200) << on_gpu.body;
  const json gpu = json::parse(on_gpu.body)["outputs"][0]["data"];
  ASSERT_EQ(gpu.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(gpu[i].get<double>(), cpu[i].get<double>(), 1e-5) << "row " << i;
  // The GPU instance's device time and memory, and the GPU's, on the metrics page. The
  // instance records them after it has answered, so wait for them to show.
  HttpTestClient scrape("127.0.0.1", metrics);
  std::string page;
  for (int i = 0; i < 100; ++i) {
    page = scrape.Get("/metrics").body;
    if (page.find("shoal_gpu_busy_seconds_total") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(page, HasSubstr("shoal_gpu_busy_seconds_total{model=\"on_gpu\""));
  EXPECT_THAT(page, HasSubstr("instance=\"on_gpu_0\",gpu=\"0\"}"));
  EXPECT_THAT(page, HasSubstr("shoal_gpu_instance_memory_bytes{model=\"on_gpu\""));
  EXPECT_THAT(page, HasSubstr("shoal_gpu_memory_used_bytes{gpu=\"0\"}"));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("instance=\"on_cpu_0\",gpu=")));
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

}  // namespace
}  // namespace shoal::e2e
