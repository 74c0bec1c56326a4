// End-to-end: an FP16 model (models/fp16_cnn.onnx: FLOAT16 input, weights and output)
// served by the real `shoal serve`. Its tensors are FP16 to clients: the metadata says
// so (from an explicit config and from auto-completion), binary HTTP and raw gRPC
// contents carry IEEE halves in and out and match PyTorch's reference, classification
// reads the FP16 scores, and the ways FP16
// cannot travel (JSON `data`, gRPC typed contents, JSON output) fail with messages
// saying how to send it (docs/open-inference-protocol.md section 1.9).
#include "core/fp16.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "proto/grpc_service.grpc.pb.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using json = nlohmann::json;
using shoal::testing::HttpTestClient;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// The tensors of a committed .sht reference (models/README.md): name -> raw bytes.
std::map<std::string, std::string> ReadSht(const std::string& path) {
  const std::string f = ReadAll(path);
  std::map<std::string, std::string> out;
  size_t p = 8;
  auto u32 = [&] {
    uint32_t v = 0;
    std::memcpy(&v, f.data() + p, 4);
    p += 4;
    return v;
  };
  if (f.size() < 8 || f.compare(0, 4, "SHT1") != 0) return out;
  p = 4;
  const uint32_t count = u32();
  for (uint32_t i = 0; i < count && p < f.size(); ++i) {
    const uint32_t name_len = u32();
    const std::string name = f.substr(p, name_len);
    p += name_len;
    u32();  // dtype
    const uint32_t rank = u32();
    p += 8 * rank;
    uint64_t bytes = 0;
    std::memcpy(&bytes, f.data() + p, 8);
    p += 8;
    out[name] = f.substr(p, bytes);
    p += bytes;
  }
  return out;
}

std::vector<float> Floats(const std::string& raw) {
  std::vector<float> v(raw.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

std::vector<float> Halves(std::string_view raw) {
  std::vector<uint16_t> h(raw.size() / 2);
  if (!h.empty()) std::memcpy(h.data(), raw.data(), raw.size());
  std::vector<float> v(h.size());
  Fp16ToFloat(h.data(), v.data(), h.size());
  return v;
}

// The models' acceptance (models/generate_fp16.py): max |error| <= 2e-3 x max |reference|.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 1e-6f, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(err, 2e-3f * scale) << "max |ref| " << scale;
}

std::string Config(const std::string& name, bool with_io) {
  std::string c = "name: \"" + name + "\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 4\n" +
                  "dynamic_batching { max_queue_delay_microseconds: 1000 }\n" +
                  "instance_group [ { count: 1 kind: KIND_CPU } ]\n";
  if (with_io) {
    c += "input [ { name: \"x\" data_type: TYPE_FP16 dims: [ 3, 16, 16 ] } ]\n"
         "output [ { name: \"y\" data_type: TYPE_FP16 dims: [ 10 ] } ]\n";
  }
  return c;
}

TEST(Fp16E2eTest, Fp16ModelServedOverHttpBinaryAndGrpcRaw) {
  TempDir repo;
  const std::string model = ReadAll(SourceDir() + "/models/fp16_cnn.onnx");
  ASSERT_GT(model.size(), 1000u);
  repo.WriteFile("fp16_cnn/1/model.onnx", model);
  repo.WriteFile("fp16_cnn/config.pbtxt", Config("fp16_cnn", true));
  repo.WriteFile("fp16_auto/1/model.onnx", model);
  repo.WriteFile("fp16_auto/config.pbtxt", Config("fp16_auto", false));
  const auto b1 = ReadSht(SourceDir() + "/models/fp16_cnn.b1.sht");
  const auto b4 = ReadSht(SourceDir() + "/models/fp16_cnn.b4.sht");
  ASSERT_EQ(b1.at("in:x").size(), 3u * 16 * 16 * 2);
  ASSERT_EQ(b4.at("out:y").size(), 4u * 10 * 4);

  const int http = FreePort(), grpc_port = FreePort();
  auto p = ShoalProcess::Start({"serve", "--model-repository", repo.path(), "--http-port",
                                std::to_string(http), "--grpc-port", std::to_string(grpc_port),
                                "--metrics-port", std::to_string(FreePort())});
  ASSERT_TRUE(p->WaitForPort(http) && p->WaitForPort(grpc_port)) << p->log();
  HttpTestClient client("127.0.0.1", http);

  // Metadata: FP16, whether the config says so or auto-completion reads the model.
  for (const char* name : {"fp16_cnn", "fp16_auto"}) {
    const auto r = client.Get(std::string("/v2/models/") + name);
    ASSERT_EQ(r.status, 200) << r.body << p->log();
    const json j = json::parse(r.body);
    EXPECT_EQ(j["inputs"][0]["datatype"], "FP16") << name;
    EXPECT_EQ(j["inputs"][0]["shape"], json({-1, 3, 16, 16})) << name;
    EXPECT_EQ(j["outputs"][0]["datatype"], "FP16") << name;
  }

  // HTTP: binary FP16 in and out, as the Python client sends a numpy float16 array.
  const std::string& x1 = b1.at("in:x");
  const json header = {{"inputs",
                        {{{"name", "x"},
                          {"shape", {1, 3, 16, 16}},
                          {"datatype", "FP16"},
                          {"parameters", {{"binary_data_size", x1.size()}}}}}},
                       {"outputs", {{{"name", "y"}, {"parameters", {{"binary_data", true}}}}}}};
  const std::string h = header.dump();
  auto r = client.Post("/v2/models/fp16_cnn/infer", h + x1,
                       {{"Inference-Header-Content-Length", std::to_string(h.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json reply = json::parse(r.Json());
  EXPECT_EQ(reply["outputs"][0]["datatype"], "FP16");
  EXPECT_EQ(reply["outputs"][0]["shape"], json({1, 10}));
  EXPECT_EQ(reply["outputs"][0]["parameters"]["binary_data_size"], 20);
  ExpectClose(Halves(r.Binary()), Floats(b1.at("out:y")));

  // Classification of the FP16 scores: the top classes as JSON strings, best first.
  json classify = header;
  classify["outputs"] = {{{"name", "y"}, {"parameters", {{"classification", 3}}}}};
  const std::string ch = classify.dump();
  r = client.Post("/v2/models/fp16_cnn/infer", ch + x1,
                  {{"Inference-Header-Content-Length", std::to_string(ch.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json classes = json::parse(r.body)["outputs"][0];
  EXPECT_EQ(classes["datatype"], "BYTES");
  ASSERT_EQ(classes["data"].size(), 3u);
  const std::vector<float> want1 = Floats(b1.at("out:y"));
  const auto best = std::max_element(want1.begin(), want1.end()) - want1.begin();
  EXPECT_THAT(classes["data"][0].get<std::string>(),
              ::testing::EndsWith(":" + std::to_string(best)));

  // The same input asking for a JSON output: FP16 has no JSON form, and the error says
  // how to ask for it.
  json no_binary = header;
  no_binary.erase("outputs");
  const std::string nh = no_binary.dump();
  r = client.Post("/v2/models/fp16_cnn/infer", nh + x1,
                  {{"Inference-Header-Content-Length", std::to_string(nh.size())}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("binary_data"));
  // FP16 in JSON `data`: refused, naming the input and the binary alternative.
  const json as_json = {
      {"inputs", {{{"name", "x"}, {"shape", {1, 1}}, {"datatype", "FP16"}, {"data", {1.0}}}}}};
  r = client.Post("/v2/models/fp16_cnn/infer", as_json.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("FP16 data cannot be sent as JSON; use binary data"));

  // gRPC: raw_input_contents at batch 4, raw_output_contents back.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT32_MAX);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(grpc_port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(30); };
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    inference::ModelMetadataRequest req;
    req.set_name("fp16_auto");
    inference::ModelMetadataResponse meta;
    ASSERT_TRUE(stub->ModelMetadata(&ctx, req, &meta).ok());
    EXPECT_EQ(meta.inputs(0).datatype(), "FP16");
    EXPECT_EQ(meta.outputs(0).datatype(), "FP16");
  }
  inference::ModelInferRequest req;
  req.set_model_name("fp16_auto");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("FP16");
  for (int64_t d : {4, 3, 16, 16}) in->add_shape(d);
  req.add_raw_input_contents(b4.at("in:x"));
  inference::ModelInferResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status s = stub->ModelInfer(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).datatype(), "FP16");
  EXPECT_THAT(std::vector<int64_t>(resp.outputs(0).shape().begin(), resp.outputs(0).shape().end()),
              ::testing::ElementsAre(4, 10));
  ASSERT_EQ(resp.raw_output_contents_size(), 1);
  ExpectClose(Halves(resp.raw_output_contents(0)), Floats(b4.at("out:y")));

  // Typed contents cannot carry FP16.
  req.clear_raw_input_contents();
  for (int i = 0; i < 4 * 3 * 16 * 16; ++i) in->mutable_contents()->add_fp32_contents(0.5f);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    const grpc::Status s = stub->ModelInfer(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("raw_input_contents"));
  }
  EXPECT_EQ(p->Terminate(), 0) << p->log();
}

}  // namespace
}  // namespace shoal::e2e
