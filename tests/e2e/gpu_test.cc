// End-to-end: a model with a KIND_GPU instance group served by the real `shoal serve`,
// beside the same file on KIND_CPU. Where shoal has a GPU to run on (bench/gpu/run.sh on
// the GPU machine), both answer the same rows with the same scores. Everywhere else the
// GPU copy fails its load and the repository index gives the reason (built without the
// CUDA path, or no usable CUDA device), while the CPU copy serves: a GPU model that
// cannot run never takes the server down with it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/http_test_client.h"
#include "shoal_process.h"
#ifdef SHOAL_E2E_CUDA_BUILD
#include "engine/cuda/device.h"
#include "engine/cuda/ipc_memory.h"
#include "engine/cuda/nvml.h"
#endif

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
  EXPECT_THAT(page, HasSubstr("shoal_gpu_model_weights_bytes{model=\"on_gpu\",version=\"1\","
                              "gpu=\"0\"}"));
  EXPECT_THAT(page, HasSubstr("shoal_gpu_memory_used_bytes{gpu=\"0\"}"));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("instance=\"on_cpu_0\",gpu=")));
  // The GPU instance pipelines (double buffering); the CPU one does not.
  EXPECT_THAT(page, HasSubstr("shoal_instance_overlapped_executions_total{model=\"on_gpu\","
                              "version=\"1\",instance=\"on_gpu_0\"}"));
  EXPECT_THAT(page, ::testing::Not(
                        HasSubstr("shoal_instance_overlapped_executions_total{model=\"on_cpu\"")));
#ifdef SHOAL_E2E_CUDA_BUILD
  // NVML's utilisation where the driver's library is here and gives it for GPU 0 (as this
  // process finds it; a MIG slice does not).
  auto nvml = engine::cuda::Nvml::Get();
  if (nvml.ok() && (*nvml)->Utilization(0).ok()) {
    EXPECT_THAT(page, HasSubstr("shoal_gpu_utilization_ratio{gpu=\"0\"}"));
  } else {
    EXPECT_THAT(page, ::testing::Not(HasSubstr("shoal_gpu_utilization_ratio")));
  }
#endif
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

// Every file of example model `name`, by its path under the model's folder.
std::vector<std::pair<std::string, std::string>> ExampleFiles(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(SourceDir()) / "examples" / "models" / name;
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    files.emplace_back(fs::relative(entry.path(), root).string(), bytes.str());
  }
  return files;
}

// A request for the model whose metadata (GET /v2/models/<name>) is `meta`: one row, every
// variable dimension 1, fp32 values from a sine, integers small (valid token ids).
json RequestFor(const json& meta) {
  json inputs = json::array();
  for (const json& in : meta["inputs"]) {
    std::vector<int64_t> shape;
    int64_t count = 1;
    for (const json& d : in["shape"]) {
      shape.push_back(d.get<int64_t>() < 0 ? 1 : d.get<int64_t>());
      count *= shape.back();
    }
    const std::string type = in["datatype"];
    json data = json::array();
    for (int64_t i = 0; i < count; ++i) {
      if (type == "FP32") {
        data.push_back(std::sin(0.37 * static_cast<double>(i)));
      } else if (type == "BOOL") {
        data.push_back(i % 2 == 0);
      } else {
        data.push_back(i % 5);
      }
    }
    inputs.push_back({{"name", in["name"]}, {"shape", shape}, {"datatype", type}, {"data", data}});
  }
  return {{"inputs", inputs}};
}

// Every ONNX model of the example repository, served twice by one `shoal serve`: as shipped
// (KIND_CPU) and renamed `<name>_gpu` on KIND_GPU. Where there is a GPU, each GPU copy
// answers the request its metadata describes as its CPU twin does. Elsewhere every GPU copy
// fails its load, the index saying why, and every CPU twin still answers.
TEST(GpuE2eTest, EveryExampleOnnxModelServesOnKindGpuAsOnKindCpu) {
  const std::vector<std::string> models = {"decoder",          "digits",         "encoder",
                                           "image_classifier", "latent_mix",     "latent_walk",
                                           "recommender",      "text_classifier"};
  TempDir repo;
  for (const std::string& m : models) {
    for (const auto& [path, bytes] : ExampleFiles(m)) {
      repo.WriteFile(m + "/" + path, bytes);
      std::string gpu = bytes;
      if (path == "config.pbtxt") {
        const std::string name = "name: \"" + m + "\"";
        const size_t at = gpu.find(name);
        ASSERT_NE(at, std::string::npos) << m;
        gpu.replace(at, name.size(), "name: \"" + m + "_gpu\"");
        for (size_t k; (k = gpu.find("kind: KIND_CPU")) != std::string::npos;)
          gpu.replace(k, 14, "kind: KIND_GPU gpus: [ 0 ]");
        ASSERT_NE(gpu.find("KIND_GPU"), std::string::npos) << m << " has no instance_group";
      }
      repo.WriteFile(m + "_gpu/" + path, gpu);
    }
  }
  const int http = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(FreePort()),
                                "--metrics-port", std::to_string(FreePort())});
  ASSERT_TRUE(p->WaitForPort(http, 60000)) << p->log();
  HttpTestClient client("127.0.0.1", http);
  const bool gpu_here = client.Get("/v2/models/recommender_gpu/ready").status == 200;
  for (const std::string& m : models) {
    SCOPED_TRACE(m);
    ASSERT_EQ(client.Get("/v2/models/" + m + "/ready").status, 200) << p->log();
    const auto meta = client.Get("/v2/models/" + m);
    ASSERT_EQ(meta.status, 200) << meta.body;
    const std::string body = RequestFor(json::parse(meta.body)).dump();
    const auto on_cpu = client.Post("/v2/models/" + m + "/infer", body);
    ASSERT_EQ(on_cpu.status, 200) << on_cpu.body;
    const json cpu = json::parse(on_cpu.body)["outputs"];
    ASSERT_FALSE(cpu.empty());
    if (!gpu_here) {
      EXPECT_NE(client.Get("/v2/models/" + m + "_gpu/ready").status, 200);
      continue;
    }
    const auto on_gpu = client.Post("/v2/models/" + m + "_gpu/infer", body);
    ASSERT_EQ(on_gpu.status, 200) << on_gpu.body;
    const json gpu = json::parse(on_gpu.body)["outputs"];
    ASSERT_EQ(gpu.size(), cpu.size());
    for (size_t o = 0; o < cpu.size(); ++o) {
      ASSERT_EQ(gpu[o]["name"], cpu[o]["name"]);
      ASSERT_EQ(gpu[o]["shape"], cpu[o]["shape"]);
      const json& a = gpu[o]["data"];
      const json& b = cpu[o]["data"];
      ASSERT_EQ(a.size(), b.size());
      double scale = 1, worst = 0;
      for (const json& v : b) scale = std::max(scale, std::fabs(v.get<double>()));
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::fabs(a[i].get<double>() - b[i].get<double>()));
      // (the CPU twin may run its convolutions as Winograd, image_classifier does: 1e-3)
      EXPECT_LE(worst, 1e-3 * scale) << "output " << cpu[o]["name"];
    }
  }
  if (!gpu_here) {
    // Every GPU copy failed alone, and the index says why.
    const auto index = client.Post("/v2/repository/index", "{}");
    for (const std::string& m : models) EXPECT_THAT(index.body, HasSubstr(m + "_gpu"));
    EXPECT_THAT(index.body, AnyOf(HasSubstr("built without the CUDA path"),
                                  HasSubstr("no usable CUDA device")));
  }
  EXPECT_EQ(p->Terminate(), 0) << p->log();
  if (!gpu_here) GTEST_SKIP() << "no GPU here: every CPU twin answered, every GPU copy refused";
}

#ifdef SHOAL_E2E_CUDA_BUILD
std::string Base64(const std::string& bytes) {
  static const char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out.push_back(kDigits[(v >> k) & 63]);
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    out += {kDigits[(v >> 18) & 63], kDigits[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const uint32_t v =
        (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8);
    out += {kDigits[(v >> 18) & 63], kDigits[(v >> 12) & 63], kDigits[(v >> 6) & 63], '='};
  }
  return out;
}

// Triton's CUDA shared memory: this test process allocates device memory, exports its IPC
// handle and registers it; the server (another process) opens it, reads the input rows
// from it and writes the scores into it, which this process then reads on the device.
TEST(GpuE2eTest, CudaSharedMemoryCarriesTheInputsAndOutputs) {
  namespace cuda = engine::cuda;
  if (auto devices = cuda::ListDevices(); !devices.ok())
    GTEST_SKIP() << "no CUDA device here: " << devices.status().ToString();
  TempDir repo;
  std::ifstream in(SourceDir() + "/examples/models/recommender/1/model.onnx", std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  repo.WriteFile("rec/1/model.onnx", bytes.str());
  repo.WriteFile("rec/config.pbtxt", Config("rec", "count: 1 kind: KIND_CPU"));
  const int http = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(FreePort()),
                                "--metrics-port", std::to_string(FreePort())});
  ASSERT_TRUE(p->WaitForPort(http)) << p->log();
  HttpTestClient client("127.0.0.1", http);
  ASSERT_EQ(client.Get("/v2/models/rec/ready").status, 200) << p->log();

  std::vector<float> rows;
  for (int i = 0; i < 3 * 64; ++i) rows.push_back(std::cos(0.21f * static_cast<float>(i)));
  const auto plain = client.Post(
      "/v2/models/rec/infer",
      json({{"inputs",
             {{{"name", "features"}, {"shape", {3, 64}}, {"datatype", "FP32"}, {"data", rows}}}}})
          .dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json want = json::parse(plain.body)["outputs"][0]["data"];

  // Inputs at offset 0 (768 bytes), the three scores at offset 1024.
  auto stream = cuda::Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  auto memory = cuda::DeviceBuffer::Allocate(4096);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  ASSERT_TRUE(cuda::CopyToDevice(memory->data(), rows.data(), rows.size() * 4, *stream).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  auto handle = cuda::ExportIpcHandle(memory->data());
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  const auto registered = client.Post(
      "/v2/cudasharedmemory/region/gpu_io/register",
      json({{"raw_handle", {{"b64", Base64(*handle)}}}, {"device_id", 0}, {"byte_size", 4096}})
          .dump());
  ASSERT_EQ(registered.status, 200) << registered.body << p->log();
  const json status = json::parse(client.Get("/v2/cudasharedmemory/status").body);
  ASSERT_EQ(status.size(), 1u) << status;
  EXPECT_EQ(status[0]["name"], "gpu_io");
  EXPECT_EQ(status[0]["device_id"], 0);
  EXPECT_EQ(status[0]["byte_size"], 4096);

  const auto shared = client.Post(
      "/v2/models/rec/infer",
      json({{"inputs",
             {{{"name", "features"},
               {"shape", {3, 64}},
               {"datatype", "FP32"},
               {"parameters",
                {{"shared_memory_region", "gpu_io"}, {"shared_memory_byte_size", 768}}}}}},
            {"outputs",
             {{{"name", "score"},
               {"parameters",
                {{"shared_memory_region", "gpu_io"},
                 {"shared_memory_offset", 1024},
                 {"shared_memory_byte_size", 12}}}}}}})
          .dump());
  ASSERT_EQ(shared.status, 200) << shared.body;
  EXPECT_FALSE(json::parse(shared.body)["outputs"][0].contains("data")) << shared.body;
  float got[3] = {};
  ASSERT_TRUE(cuda::CopyToHost(got, memory->as<char>() + 1024, sizeof(got), *stream).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], want[i].get<double>(), 1e-6) << "row " << i;

  ASSERT_EQ(client.Post("/v2/cudasharedmemory/region/gpu_io/unregister", "").status, 200);
  EXPECT_EQ(json::parse(client.Get("/v2/cudasharedmemory/status").body), json::array());
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}
#endif

}  // namespace
}  // namespace shoal::e2e
