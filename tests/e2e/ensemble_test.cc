// Ensembles end to end: `shoal serve` on examples/models in explicit mode, asked to load
// only the two ensembles (vae_walk: encoder -> latent_walk -> decoder; vae_blend: two
// encoders -> latent_mix -> decoder), which loads their steps. Every ensemble answer, over
// HTTP, gRPC and gRPC streaming, is compared with the client running the steps one by one.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/npy.h"
#include "proto/grpc_service.grpc.pb.h"
#include "server/http_test_client.h"
#include "shoal_process.h"

namespace shoal::e2e {
namespace {

using json = nlohmann::json;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;

json Reference(const std::string& model) {
  std::ifstream f(SourceDir() + "/tests/e2e/examples/" + model + ".json");
  std::stringstream s;
  s << f.rdbuf();
  return json::parse(s.str());
}

// A KServe v2 JSON tensor.
json Tensor(const std::string& name, const std::vector<int64_t>& shape,
            const std::vector<float>& data) {
  return {{"name", name}, {"datatype", "FP32"}, {"shape", shape}, {"data", data}};
}

std::vector<float> Floats(const json& t) { return t["data"].get<std::vector<float>>(); }

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

class EnsembleE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    http_port_ = FreePort();
    grpc_port_ = FreePort();
    process_ = ShoalProcess::Start({"serve", "--model-repository", SourceDir() + "/examples/models",
                                    "--http-port", std::to_string(http_port_), "--grpc-port",
                                    std::to_string(grpc_port_), "--metrics-port",
                                    std::to_string(FreePort()), "--model-control-mode", "explicit",
                                    "--load-model", "vae_walk", "--load-model", "vae_blend"});
  }
  static void TearDownTestSuite() {
    if (process_) EXPECT_EQ(process_->Terminate(), 0) << process_->log();
    process_.reset();
  }
  void SetUp() override {
    ASSERT_NE(process_, nullptr);
    ASSERT_TRUE(process_->WaitForPort(http_port_, 60000)) << process_->log();
    ASSERT_TRUE(process_->WaitForPort(grpc_port_, 60000)) << process_->log();
    http_ = std::make_unique<HttpTestClient>("127.0.0.1", http_port_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (http_->Get("/v2/health/ready").status != 200) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << process_->log();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stub_ = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(grpc_port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (HasFailure() && process_) std::cerr << "---- shoal log ----\n" << process_->log() << "\n";
  }

  // POSTs `inputs` to `model` over HTTP; its outputs by name.
  std::map<std::string, json> Infer(const std::string& model, const json& inputs) {
    HttpReply r = http_->Post("/v2/models/" + model + "/infer", json{{"inputs", inputs}}.dump());
    EXPECT_EQ(r.status, 200) << model << ": " << r.body;
    std::map<std::string, json> out;
    if (r.status != 200) return out;
    const json reply = json::parse(r.body);  // outlives the loop over its outputs
    for (const json& o : reply["outputs"]) out[o["name"].get<std::string>()] = o;
    return out;
  }
  // vae_walk's answer computed by the client: encoder, latent_walk, decoder in turn.
  std::vector<float> WalkBySteps(const json& image, const json& step) {
    json img = image;
    img["name"] = "image";
    auto enc = Infer("encoder", json::array({img}));
    json mu = enc["mu"], logvar = enc["logvar"], st = step;
    mu["name"] = "mu";
    logvar["name"] = "logvar";
    st["name"] = "step";
    auto walk = Infer("latent_walk", json::array({mu, logvar, st}));
    json z = walk["z"];
    z["name"] = "z";
    return Floats(Infer("decoder", json::array({z}))["image"]);
  }
  int64_t Successes(const std::string& model) {
    HttpReply r = http_->Get("/v2/models/" + model + "/stats");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["model_stats"][0]["inference_stats"]["success"]["count"];
  }

  static int http_port_, grpc_port_;
  static std::unique_ptr<ShoalProcess> process_;
  std::unique_ptr<HttpTestClient> http_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

int EnsembleE2eTest::http_port_ = 0;
int EnsembleE2eTest::grpc_port_ = 0;
std::unique_ptr<ShoalProcess> EnsembleE2eTest::process_;

TEST_F(EnsembleE2eTest, HttpChainMatchesItsStepsRunOneByOne) {
  const json ref = Reference("vae_walk");
  const json& image = ref["inputs"][0];
  const json& step = ref["inputs"][1];
  auto out = Infer("vae_walk", ref["inputs"]);
  ASSERT_EQ(out.count("walked"), 1u);
  EXPECT_EQ(out["walked"]["shape"], (json{2, 1, 8, 8}));
  EXPECT_LE(MaxDiff(Floats(out["walked"]), WalkBySteps(image, step)), 1e-6f);
}

TEST_F(EnsembleE2eTest, HttpTwoBranchDagMatchesItsStepsRunOneByOne) {
  const json ref = Reference("vae_blend");
  auto out = Infer("vae_blend", ref["inputs"]);
  ASSERT_EQ(out.count("blended"), 1u);
  json a = ref["inputs"][0], b = ref["inputs"][1], alpha = ref["inputs"][2];
  a["name"] = b["name"] = "image";
  json za = Infer("encoder", json::array({a}))["mu"];
  json zb = Infer("encoder", json::array({b}))["mu"];
  za["name"] = "z_a";
  zb["name"] = "z_b";
  json z = Infer("latent_mix", json::array({za, zb, alpha}))["z"];
  z["name"] = "z";
  EXPECT_LE(MaxDiff(Floats(out["blended"]), Floats(Infer("decoder", json::array({z}))["image"])),
            1e-6f);
}

inference::ModelInferRequest WalkRequest(const json& ref, const std::string& id) {
  inference::ModelInferRequest r;
  r.set_model_name("vae_walk");
  r.set_id(id);
  for (const json& t : ref["inputs"]) {
    auto* in = r.add_inputs();
    in->set_name(t["name"]);
    in->set_datatype("FP32");
    for (int64_t d : t["shape"]) in->add_shape(d);
    const auto v = Floats(t);
    r.add_raw_input_contents(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  }
  return r;
}

std::vector<float> RawFloats(const std::string& raw) {
  std::vector<float> v(raw.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

TEST_F(EnsembleE2eTest, GrpcAndStreamingMatchTheStepsRunOneByOne) {
  const json ref = Reference("vae_walk");
  const std::vector<float> want = WalkBySteps(ref["inputs"][0], ref["inputs"][1]);

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  inference::ModelInferResponse resp;
  grpc::Status s = stub_->ModelInfer(&ctx, WalkRequest(ref, "unary"), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.model_name(), "vae_walk");
  EXPECT_EQ(resp.id(), "unary");
  ASSERT_EQ(resp.raw_output_contents_size(), 1);
  EXPECT_LE(MaxDiff(RawFloats(resp.raw_output_contents(0)), want), 1e-6f);

  grpc::ClientContext sctx;
  sctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub_->ModelStreamInfer(&sctx);
  constexpr int kRequests = 8;
  for (int i = 0; i < kRequests; ++i)
    ASSERT_TRUE(stream->Write(WalkRequest(ref, std::to_string(i))));
  stream->WritesDone();
  std::map<std::string, std::vector<float>> got;
  inference::ModelStreamInferResponse r;
  while (stream->Read(&r)) {
    EXPECT_EQ(r.error_message(), "");
    if (r.infer_response().raw_output_contents_size() == 1)
      got[r.infer_response().id()] = RawFloats(r.infer_response().raw_output_contents(0));
  }
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(got.size(), size_t{kRequests});
  for (const auto& [id, v] : got) EXPECT_LE(MaxDiff(v, want), 1e-6f) << id;
}

TEST_F(EnsembleE2eTest, MetadataConfigStatisticsAndReadinessFollowTheSteps) {
  // Loading the ensembles loaded their steps.
  for (const char* m : {"encoder", "latent_walk", "decoder", "latent_mix", "vae_walk"})
    EXPECT_EQ(http_->Get(std::string("/v2/models/") + m + "/ready").status, 200) << m;
  const json md = json::parse(http_->Get("/v2/models/vae_walk").body);
  EXPECT_EQ(md["platform"], "ensemble");
  EXPECT_EQ(md["inputs"][0]["name"], "image");
  EXPECT_EQ(md["outputs"][0]["shape"], (json{-1, 1, 8, 8}));
  const json config = json::parse(http_->Get("/v2/models/vae_walk/config").body);
  EXPECT_EQ(config["platform"], "ensemble");
  EXPECT_EQ(config["ensemble_scheduling"]["step"].size(), 3u);

  // Statistics: the ensemble counts its requests, each step model the step requests.
  const int64_t walk0 = Successes("vae_walk"), walk_step0 = Successes("latent_walk");
  const json ref = Reference("vae_walk");
  for (int i = 0; i < 3; ++i) Infer("vae_walk", ref["inputs"]);
  EXPECT_EQ(Successes("vae_walk") - walk0, 3);
  EXPECT_EQ(Successes("latent_walk") - walk_step0, 3);

  // Unloading a step leaves the ensemble loaded but not ready, until the step is back.
  EXPECT_EQ(http_->Post("/v2/repository/models/latent_walk/unload", "{}").status, 200);
  EXPECT_NE(http_->Get("/v2/models/vae_walk/ready").status, 200);
  HttpReply refused =
      http_->Post("/v2/models/vae_walk/infer", json{{"inputs", ref["inputs"]}}.dump());
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("latent_walk"), std::string::npos) << refused.body;
  EXPECT_EQ(http_->Get("/v2/models/vae_blend/ready").status, 200) << "it does not use that step";
  EXPECT_EQ(http_->Post("/v2/repository/models/latent_walk/load", "{}").status, 200);
  EXPECT_EQ(http_->Get("/v2/models/vae_walk/ready").status, 200);
  EXPECT_EQ(Infer("vae_walk", ref["inputs"]).count("walked"), 1u);
}

TEST_F(EnsembleE2eTest, ShoalBenchLoadsAnEnsembleThroughItsSteps) {
  const int64_t walk0 = Successes("vae_walk"), step0 = Successes("latent_walk");
  TempDir out;
  const std::string report_path = out.path() + "/r.json";
  auto p = ShoalProcess::Start({"bench", "-m", "vae_walk", "-u",
                                "127.0.0.1:" + std::to_string(http_port_), "--concurrency-range",
                                "4", "-p", "300", "--warmup", "100", "--max-trials", "3", "--json",
                                report_path});
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->Wait(60'000), 0) << p->log();
  std::ifstream f(report_path);
  std::stringstream text;
  text << f.rdbuf();
  const json report = json::parse(text.str());
  ASSERT_EQ(report["steps"].size(), 1u);
  const json& step = report["steps"][0];
  EXPECT_EQ(step["errors_total"], 0) << step;
  const int64_t measured = step["requests"].get<int64_t>();
  EXPECT_GT(measured, 0) << step;
  // Every request the bench sent (measured, warmup and trials) ran through the step.
  const int64_t ensemble_requests = Successes("vae_walk") - walk0;
  EXPECT_GE(ensemble_requests, measured);
  EXPECT_EQ(Successes("latent_walk") - step0, ensemble_requests);
}

TEST(EnsembleRunE2eTest, ShoalRunServesAnEnsembleOffline) {
  // `shoal run` loads only the model it is asked for; the ensemble loads its steps.
  const json ref = Reference("vae_walk");
  constexpr int kCopies = 20;  // 40 rows, several batches through each step
  std::vector<float> images, steps, want;
  for (int i = 0; i < kCopies; ++i) {
    for (float v : Floats(ref["inputs"][0])) images.push_back(v);
    for (float v : Floats(ref["inputs"][1])) steps.push_back(v);
    for (float v : Floats(ref["outputs"][0])) want.push_back(v);
  }
  TempDir files;
  const std::string in = files.path() + "/in.npz", out = files.path() + "/out.npy";
  const int64_t rows = 2 * kCopies;
  ASSERT_TRUE(
      WriteNpz(in, {{"image", Tensor::FromVector<float>(DataType::kFp32, {rows, 1, 8, 8}, images)},
                    {"step", Tensor::FromVector<float>(DataType::kFp32, {rows, 1}, steps)}})
          .ok());
  auto p = ShoalProcess::Start({"run", "--model-repository", SourceDir() + "/examples/models", "-m",
                                "vae_walk", "--input", in, "--output", out, "-q"});
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->Wait(60'000), 0) << p->log();
  auto got = ReadNpy(out);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::vector<float> values;
  for (int64_t r = 0; r < rows; ++r) {
    for (float v : got->Row(r).values<float>()) values.push_back(v);
  }
  // Against PyTorch's outputs (the examples' reference), as examples_test.cc checks them.
  EXPECT_LE(MaxDiff(values, want), 1e-4f);
}

}  // namespace
}  // namespace shoal::e2e
