// End-to-end tests of Triton's protocol extensions on the real `shoal serve`: system
// shared memory (a region created here, registered over HTTP and gRPC, inputs read from
// it and outputs written into it), classification with labels from label_filename, the
// logging and trace settings, CUDA shared memory's refusal, and a model load with a
// config override.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "proto/grpc_service.grpc.pb.h"
#include "runtime/testing/plugin_configs.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using json = nlohmann::json;
// The shoal under test was built with the CUDA path (SHOAL_CUDA), so it opens CUDA IPC handles.
constexpr bool kCudaBuild = SHOAL_E2E_CUDA_BUILD;
using runtime::testing::kAddSubConfig;
using runtime::testing::kIdentityConfig;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;

// add_sub with labels on OUTPUT0 (classification).
constexpr char kLabeledAddSub[] = R"(
name: "labeled"
backend: "add_sub"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] label_filename: "labels.txt" },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
)";

// A POSIX shared memory object created by the test, as a Triton client creates one.
class ShmObject {
 public:
  explicit ShmObject(size_t bytes)
      : key_("/shoal_e2e_shm_" + std::to_string(::getpid()) + "_" + std::to_string(bytes)),
        bytes_(bytes) {
    shm_unlink(key_.c_str());
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    data_ = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~ShmObject() {
    munmap(data_, bytes_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  void Put(size_t offset, const std::vector<int32_t>& v) {
    std::memcpy(data_ + offset, v.data(), v.size() * 4);
  }
  std::vector<int32_t> Get(size_t offset, size_t n) const {
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), data_ + offset, n * 4);
    return v;
  }

 private:
  std::string key_;
  size_t bytes_;
  char* data_ = nullptr;
};

class ExtensionsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repo_.WriteFile("add_sub/config.pbtxt", kAddSubConfig);
    repo_.WriteFile("add_sub/1/.keep", "");
    repo_.WriteFile("labeled/config.pbtxt", kLabeledAddSub);
    repo_.WriteFile("labeled/labels.txt", "zero\none\ntwo\nthree\n");
    repo_.WriteFile("labeled/1/.keep", "");
    repo_.WriteFile("identity/config.pbtxt", kIdentityConfig);
    repo_.WriteFile("identity/1/.keep", "");
    http_port_ = FreePort();
    grpc_port_ = FreePort();
    process_ = ShoalProcess::Start(
        {"serve", "--model-repository", repo_.path(), "--http-port", std::to_string(http_port_),
         "--grpc-port", std::to_string(grpc_port_), "--metrics-port", std::to_string(FreePort()),
         "--backend-directory", BinaryDir() + "/backends", "--model-control-mode", "explicit",
         "--load-model", "*"});
    ASSERT_NE(process_, nullptr);
    ASSERT_TRUE(process_->WaitForPort(http_port_)) << process_->log();
    ASSERT_TRUE(process_->WaitForPort(grpc_port_)) << process_->log();
    http_ = std::make_unique<HttpTestClient>("127.0.0.1", http_port_);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port_),
                                       grpc::InsecureChannelCredentials());
    // The port is bound before the gRPC service starts: wait until it answers.
    ASSERT_TRUE(
        channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)))
        << process_->log();
    stub_ = inference::GRPCInferenceService::NewStub(channel);
  }
  void TearDown() override {
    if (HasFailure() && process_) std::cerr << "---- shoal log ----\n" << process_->log() << "\n";
  }

  json PostJson(const std::string& path, const json& body, int want = 200) {
    HttpReply r = http_->Post(path, body.dump());
    EXPECT_EQ(r.status, want) << path << ": " << r.body;
    return r.body.empty() ? json() : json::parse(r.body, nullptr, false);
  }
  json GetJson(const std::string& path, int want = 200) {
    HttpReply r = http_->Get(path);
    EXPECT_EQ(r.status, want) << path << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  }

  TempDir repo_;
  int http_port_ = 0, grpc_port_ = 0;
  std::unique_ptr<ShoalProcess> process_;
  std::unique_ptr<HttpTestClient> http_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

json ShmParams(const std::string& region, uint64_t byte_size, uint64_t offset) {
  return {{"shared_memory_region", region},
          {"shared_memory_byte_size", byte_size},
          {"shared_memory_offset", offset}};
}

TEST_F(ExtensionsE2eTest, HttpSystemSharedMemoryInputsAndOutputs) {
  ShmObject shm(4096 + 64);
  // Inputs at 4096 and 4112 of the object; the region starts at 4096 (offset), the output
  // goes to region offset 32.
  shm.Put(4096, {1, 2, 3, 4});
  shm.Put(4096 + 16, {10, 20, 30, 40});
  PostJson("/v2/systemsharedmemory/region/io/register",
           {{"key", shm.key()}, {"offset", 4096}, {"byte_size", 64}});
  json status = GetJson("/v2/systemsharedmemory/status");
  ASSERT_EQ(status.size(), 1u) << status;
  EXPECT_EQ(status[0]["name"], "io");
  EXPECT_EQ(status[0]["key"], shm.key());
  EXPECT_EQ(status[0]["offset"], 4096);
  EXPECT_EQ(status[0]["byte_size"], 64);
  EXPECT_EQ(GetJson("/v2/systemsharedmemory/region/io/status")[0]["name"], "io");

  json request = {
      {"inputs",
       {{{"name", "INPUT0"},
         {"datatype", "INT32"},
         {"shape", {4}},
         {"parameters", ShmParams("io", 16, 0)}},
        {{"name", "INPUT1"},
         {"datatype", "INT32"},
         {"shape", {4}},
         {"parameters", ShmParams("io", 16, 16)}}}},
      {"outputs",
       {{{"name", "OUTPUT0"}, {"parameters", ShmParams("io", 16, 32)}}, {{"name", "OUTPUT1"}}}}};
  json reply = PostJson("/v2/models/add_sub/infer", request);
  ASSERT_EQ(reply["outputs"].size(), 2u) << reply;
  const json& out0 = reply["outputs"][0];
  EXPECT_EQ(out0["name"], "OUTPUT0");
  EXPECT_FALSE(out0.contains("data")) << out0;
  EXPECT_EQ(out0["parameters"]["shared_memory_region"], "io");
  EXPECT_EQ(out0["parameters"]["shared_memory_byte_size"], 16);
  EXPECT_EQ(out0["parameters"]["shared_memory_offset"], 32);
  EXPECT_EQ(shm.Get(4096 + 32, 4), (std::vector<int32_t>{11, 22, 33, 44}));
  EXPECT_EQ(reply["outputs"][1]["data"], json({-9, -18, -27, -36}));

  // Out of bounds, size mismatch, unknown region: 400 naming the problem.
  request["inputs"][0]["parameters"] = ShmParams("io", 16, 60);
  json past = PostJson("/v2/models/add_sub/infer", request, 400);
  EXPECT_NE(past["error"].get<std::string>().find("past the end"), std::string::npos) << past;
  request["inputs"][0]["parameters"] = ShmParams("io", 12, 0);
  json size = PostJson("/v2/models/add_sub/infer", request, 400);
  EXPECT_NE(size["error"].get<std::string>().find("needs 16"), std::string::npos) << size;
  request["inputs"][0]["parameters"] = ShmParams("nope", 16, 0);
  json unknown = PostJson("/v2/models/add_sub/infer", request, 400);
  EXPECT_NE(unknown["error"].get<std::string>().find("'nope'"), std::string::npos) << unknown;
  request["inputs"][0]["parameters"] = ShmParams("io", 16, 0);
  request["outputs"][0]["parameters"] = ShmParams("io", 8, 32);
  json small = PostJson("/v2/models/add_sub/infer", request, 400);
  EXPECT_NE(small["error"].get<std::string>().find("needs 16 bytes"), std::string::npos) << small;

  // Registering twice is refused; unregister, and the name is gone.
  PostJson("/v2/systemsharedmemory/region/io/register",
           {{"key", shm.key()}, {"offset", 0}, {"byte_size", 64}}, 409);
  PostJson("/v2/systemsharedmemory/region/io/unregister", json::object());
  EXPECT_EQ(GetJson("/v2/systemsharedmemory/status"), json::array());
  GetJson("/v2/systemsharedmemory/region/io/status", 400);
  PostJson("/v2/systemsharedmemory/region/x/register",
           {{"key", "/shoal_no_such_object"}, {"offset", 0}, {"byte_size", 64}}, 400);
}

TEST_F(ExtensionsE2eTest, GrpcSystemSharedMemoryAndCudaRefusal) {
  ShmObject shm(64);
  shm.Put(0, {5, 6, 7, 8});
  shm.Put(16, {1, 1, 1, 1});
  {
    grpc::ClientContext ctx;
    inference::SystemSharedMemoryRegisterRequest req;
    req.set_name("g");
    req.set_key(shm.key());
    req.set_byte_size(64);
    inference::SystemSharedMemoryRegisterResponse resp;
    auto s = stub_->SystemSharedMemoryRegister(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // One registry for both protocols: HTTP sees the region gRPC registered.
  EXPECT_EQ(GetJson("/v2/systemsharedmemory/status")[0]["name"], "g");
  inference::ModelInferRequest req;
  req.set_model_name("add_sub");
  for (int i = 0; i < 2; ++i) {
    auto* in = req.add_inputs();
    in->set_name(i == 0 ? "INPUT0" : "INPUT1");
    in->set_datatype("INT32");
    in->add_shape(4);
    auto& p = *in->mutable_parameters();
    p["shared_memory_region"].set_string_param("g");
    p["shared_memory_byte_size"].set_int64_param(16);
    p["shared_memory_offset"].set_int64_param(16 * i);
  }
  auto* out = req.add_outputs();
  out->set_name("OUTPUT1");
  auto& op = *out->mutable_parameters();
  op["shared_memory_region"].set_string_param("g");
  op["shared_memory_byte_size"].set_int64_param(16);
  op["shared_memory_offset"].set_int64_param(32);
  {
    grpc::ClientContext ctx;
    inference::ModelInferResponse resp;
    auto s = stub_->ModelInfer(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.outputs_size(), 1);
    EXPECT_EQ(resp.outputs(0).parameters().at("shared_memory_region").string_param(), "g");
    EXPECT_EQ(shm.Get(32, 4), (std::vector<int32_t>{4, 5, 6, 7}));
  }
  {
    grpc::ClientContext ctx;
    inference::SystemSharedMemoryStatusRequest sreq;
    inference::SystemSharedMemoryStatusResponse sresp;
    ASSERT_TRUE(stub_->SystemSharedMemoryStatus(&ctx, sreq, &sresp).ok());
    ASSERT_EQ(sresp.regions().count("g"), 1u);
    EXPECT_EQ(sresp.regions().at("g").key(), shm.key());
  }
  {
    grpc::ClientContext ctx;
    inference::SystemSharedMemoryUnregisterRequest ureq;
    inference::SystemSharedMemoryUnregisterResponse uresp;
    ASSERT_TRUE(stub_->SystemSharedMemoryUnregister(&ctx, ureq, &uresp).ok());
  }
  {
    grpc::ClientContext ctx;
    inference::ModelInferResponse resp;
    auto s = stub_->ModelInfer(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("Unable to find system shared memory region: 'g'"),
              std::string::npos)
        << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    inference::CudaSharedMemoryRegisterRequest creq;
    creq.set_name("c");
    creq.set_byte_size(4);
    inference::CudaSharedMemoryRegisterResponse cresp;
    auto s = stub_->CudaSharedMemoryRegister(&ctx, creq, &cresp);
    // Built with the CUDA path, the empty handle is refused for its size; without it,
    // CUDA shared memory is not supported at all. Either way nothing is registered.
    EXPECT_EQ(s.error_code(), kCudaBuild ? grpc::StatusCode::INVALID_ARGUMENT
                                         : grpc::StatusCode::FAILED_PRECONDITION)
        << s.error_message();
  }
  EXPECT_EQ(GetJson("/v2/cudasharedmemory/status"), json::array());
  json refused = PostJson("/v2/cudasharedmemory/region/c/register",
                          {{"raw_handle", {{"b64", ""}}}, {"device_id", 0}, {"byte_size", 4}}, 400);
  EXPECT_NE(refused["error"].get<std::string>().find(
                kCudaBuild ? "raw_handle must be a cudaIpcMemHandle_t of 64 bytes; was 0"
                           : "CUDA shared memory is not supported"),
            std::string::npos)
      << refused;
  // A handle that is not base64, and a missing device_id, are refused before any device.
  json not_b64 =
      PostJson("/v2/cudasharedmemory/region/c/register",
               {{"raw_handle", {{"b64", "@@"}}}, {"device_id", 0}, {"byte_size", 4}}, 400);
  EXPECT_NE(not_b64["error"].get<std::string>().find("raw_handle.b64: not base64"),
            std::string::npos)
      << not_b64;
  json no_device = PostJson("/v2/cudasharedmemory/region/c/register",
                            {{"raw_handle", {{"b64", "AAAA"}}}, {"byte_size", 4}}, 400);
  EXPECT_NE(no_device["error"].get<std::string>().find("device_id: missing"), std::string::npos)
      << no_device;
  json unknown = GetJson("/v2/cudasharedmemory/region/c/status", 400);
  EXPECT_NE(unknown["error"].get<std::string>().find("Unable to find cuda shared memory region"),
            std::string::npos)
      << unknown;
  EXPECT_EQ(GetJson("/v2/cudasharedmemory/status"), json::array());
}

TEST_F(ExtensionsE2eTest, ClassificationWithLabels) {
  json request = {
      {"inputs",
       {{{"name", "INPUT0"}, {"datatype", "INT32"}, {"shape", {4}}, {"data", {1, 2, 3, 4}}},
        {{"name", "INPUT1"}, {"datatype", "INT32"}, {"shape", {4}}, {"data", {10, 0, 5, 1}}}}},
      {"outputs",
       {{{"name", "OUTPUT0"}, {"parameters", {{"classification", 2}}}},
        {{"name", "OUTPUT1"}, {"parameters", {{"classification", 3}}}}}}};
  json reply = PostJson("/v2/models/labeled/infer", request);
  ASSERT_EQ(reply["outputs"].size(), 2u) << reply;
  EXPECT_EQ(reply["outputs"][0]["datatype"], "BYTES");
  EXPECT_EQ(reply["outputs"][0]["shape"], json({2}));
  // OUTPUT0 = [11, 2, 8, 5]: labels from labels.txt.
  EXPECT_EQ(reply["outputs"][0]["data"], json({"11:0:zero", "8:2:two"}));
  // OUTPUT1 = [-9, 2, -2, 3] has no label file.
  EXPECT_EQ(reply["outputs"][1]["data"], json({"3:3", "2:1", "-2:2"}));

  // The same over gRPC.
  inference::ModelInferRequest req;
  req.set_model_name("labeled");
  for (int i = 0; i < 2; ++i) {
    auto* in = req.add_inputs();
    in->set_name(i == 0 ? "INPUT0" : "INPUT1");
    in->set_datatype("INT32");
    in->add_shape(4);
    for (int v : i == 0 ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{10, 0, 5, 1})
      in->mutable_contents()->add_int_contents(v);
  }
  auto* out = req.add_outputs();
  out->set_name("OUTPUT0");
  (*out->mutable_parameters())["classification"].set_int64_param(1);
  grpc::ClientContext ctx;
  inference::ModelInferResponse resp;
  auto s = stub_->ModelInfer(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.raw_output_contents_size(), 1);
  const std::string& raw = resp.raw_output_contents(0);
  ASSERT_GE(raw.size(), 4u);
  uint32_t len;
  std::memcpy(&len, raw.data(), 4);
  EXPECT_EQ(raw.substr(4, len), "11:0:zero");

  // An unknown output or a bad count: 400.
  request["outputs"][0]["name"] = "NOPE";
  PostJson("/v2/models/labeled/infer", request, 400);
}

TEST_F(ExtensionsE2eTest, LoggingSettingsChangeWhatIsLogged) {
  json settings = GetJson("/v2/logging");
  EXPECT_EQ(settings["log_info"], true) << settings;
  EXPECT_EQ(settings["log_verbose_level"], 0);
  EXPECT_EQ(settings["log_file"], "");

  // With info lines off, an unload is not logged; with them on again, it is.
  json off = PostJson("/v2/logging", {{"log_info", false}});
  EXPECT_EQ(off["log_info"], false);
  EXPECT_EQ(off["log_warning"], true);
  PostJson("/v2/repository/models/identity/unload", json::object());
  PostJson("/v2/logging", {{"log_info", true}, {"log_verbose_level", 1}});
  EXPECT_EQ(GetJson("/v2/logging")["log_verbose_level"], 1);
  PostJson("/v2/repository/models/add_sub/unload", json::object());
  const std::string log = process_->log();
  EXPECT_EQ(log.find("unloaded model 'identity'"), std::string::npos) << log;
  EXPECT_NE(log.find("unloaded model 'add_sub'"), std::string::npos) << log;

  json unknown = PostJson("/v2/logging", {{"log_colour", true}}, 400);
  EXPECT_NE(unknown["error"].get<std::string>().find("log_colour"), std::string::npos);
  PostJson("/v2/logging", {{"log_file", "/tmp/shoal.log"}}, 400);
  PostJson("/v2/logging", {{"log_info", "yes"}}, 400);

  // gRPC reads the same process-wide settings.
  grpc::ClientContext ctx;
  inference::LogSettingsRequest req;
  inference::LogSettingsResponse resp;
  ASSERT_TRUE(stub_->LogSettings(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.settings().at("log_verbose_level").uint32_param(), 1u);
}

TEST_F(ExtensionsE2eTest, TraceSettingsCanBeReadAndSetButNotEnabled) {
  json global = GetJson("/v2/trace/setting");
  EXPECT_EQ(global["trace_level"], json({"OFF"})) << global;
  EXPECT_EQ(global["trace_rate"], "1000");
  json set = PostJson("/v2/trace/setting", {{"trace_rate", "10"}, {"log_frequency", 5}});
  EXPECT_EQ(set["trace_rate"], "10");
  EXPECT_EQ(set["log_frequency"], "5");
  json model = PostJson("/v2/models/add_sub/trace/setting", {{"trace_count", "3"}});
  EXPECT_EQ(model["trace_count"], "3");
  EXPECT_EQ(model["trace_rate"], "10");
  EXPECT_EQ(GetJson("/v2/trace/setting")["trace_count"], "-1");
  json cleared = PostJson("/v2/models/add_sub/trace/setting", {{"trace_count", nullptr}});
  EXPECT_EQ(cleared["trace_count"], "-1");
  json on = PostJson("/v2/trace/setting", {{"trace_level", {"TIMESTAMPS"}}}, 400);
  EXPECT_NE(on["error"].get<std::string>().find("does not produce traces"), std::string::npos);
  PostJson("/v2/trace/setting", {{"trace_level", {"OFF"}}});
  GetJson("/v2/models/nope/trace/setting", 404);
}

TEST_F(ExtensionsE2eTest, LoadWithConfigOverride) {
  EXPECT_EQ(GetJson("/v2/models/identity/config")["max_batch_size"], 8);
  const json config = {
      {"name", "identity"},
      {"backend", "identity"},
      {"max_batch_size", 4},
      {"input", {{{"name", "INPUT0"}, {"data_type", "TYPE_FP32"}, {"dims", {-1}}}}},
      {"output", {{{"name", "OUTPUT0"}, {"data_type", "TYPE_FP32"}, {"dims", {-1}}}}},
      {"dynamic_batching", json::object()}};
  PostJson("/v2/repository/models/identity/load", {{"parameters", {{"config", config.dump()}}}});
  EXPECT_EQ(GetJson("/v2/models/identity/config")["max_batch_size"], 4);

  json bad = PostJson("/v2/repository/models/identity/load",
                      {{"parameters", {{"config", "{\"max_batch_size\": -1}"}}}}, 400);
  EXPECT_NE(bad["error"].get<std::string>().find("max_batch_size"), std::string::npos) << bad;
  json broken = PostJson("/v2/repository/models/identity/load",
                         {{"parameters", {{"config", "{not json"}}}}, 400);
  EXPECT_NE(broken["error"].get<std::string>().find("parameters.config"), std::string::npos);
  EXPECT_EQ(GetJson("/v2/models/identity/config")["max_batch_size"], 4) << "still serving";

  // gRPC: the same override, back to 8; a load without it reads config.pbtxt again.
  inference::RepositoryModelLoadRequest req;
  req.set_model_name("identity");
  json eight = config;
  eight["max_batch_size"] = 2;
  (*req.mutable_parameters())["config"].set_string_param(eight.dump());
  {
    grpc::ClientContext ctx;
    inference::RepositoryModelLoadResponse resp;
    auto s = stub_->RepositoryModelLoad(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(GetJson("/v2/models/identity/config")["max_batch_size"], 2);
  PostJson("/v2/repository/models/identity/load", json::object());
  EXPECT_EQ(GetJson("/v2/models/identity/config")["max_batch_size"], 8);
}

// A batching ONNX example with a label file: top K per row, shape [batch, K].
TEST(ExtensionsExampleE2eTest, ImageClassifierClassifiesEachRow) {
  std::ifstream f(SourceDir() + "/tests/e2e/examples/image_classifier.json");
  ASSERT_TRUE(f) << "missing tests/e2e/examples/image_classifier.json";
  const json ref = json::parse(f);
  const int port = FreePort();
  auto process =
      ShoalProcess::Start({"serve", "--model-repository", SourceDir() + "/examples/models",
                           "--http-port", std::to_string(port), "--grpc-port",
                           std::to_string(FreePort()), "--metrics-port", std::to_string(FreePort()),
                           "--model-control-mode", "explicit", "--load-model", "image_classifier"});
  ASSERT_NE(process, nullptr);
  ASSERT_TRUE(process->WaitForPort(port, 120000)) << process->log();
  HttpTestClient http("127.0.0.1", port);
  json request = {{"inputs", ref["inputs"]},
                  {"outputs", {{{"name", "logits"}, {"parameters", {{"classification", 2}}}}}}};
  HttpReply r = http.Post("/v2/models/image_classifier/infer", request.dump());
  ASSERT_EQ(r.status, 200) << r.body << process->log();
  const json out = json::parse(r.body)["outputs"][0];
  EXPECT_EQ(out["datatype"], "BYTES");
  EXPECT_EQ(out["shape"], json({2, 2}));
  // Reference logits: row 0 peaks at 2 (4.771) then 3 (1.895); row 1 at 0 (8.551) then 1 (1.687).
  ASSERT_EQ(out["data"].size(), 4u) << out;
  const std::vector<std::string> suffixes = {":2:two", ":3:three", ":0:zero", ":1:one"};
  for (size_t i = 0; i < suffixes.size(); ++i) {
    const std::string got = out["data"][i].get<std::string>();
    EXPECT_TRUE(got.size() > suffixes[i].size() &&
                got.compare(got.size() - suffixes[i].size(), suffixes[i].size(), suffixes[i]) == 0)
        << i << ": " << got;
  }
  EXPECT_EQ(out["data"][0].get<std::string>().substr(0, 4), "4.77");
  EXPECT_EQ(process->Terminate(), 0);
}

}  // namespace
}  // namespace shoal::e2e
