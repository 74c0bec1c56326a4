// End-to-end test of the example model repository: the real `shoal serve` on
// examples/models (the directory scripts/serve.sh serves), and for every model in it the
// metadata and one inference checked against tests/e2e/examples/<model>.json, written by
// examples/models/generate.py (PyTorch's outputs for the ONNX models).
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

namespace shoal::e2e {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using shoal::testing::HttpReply;
using shoal::testing::HttpTestClient;

std::string ExamplesDir() { return SourceDir() + "/examples/models"; }

// The model folders of the example repository (what the server scans).
std::vector<std::string> ExampleModels() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ExamplesDir())) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name[0] != '.') names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

json ReadReference(const std::string& model) {
  std::ifstream f(SourceDir() + "/tests/e2e/examples/" + model + ".json");
  if (!f) return json();
  std::stringstream s;
  s << f.rdbuf();
  return json::parse(s.str(), nullptr, false);
}

class ExamplesE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    http_port_ = FreePort();
    process_ = ShoalProcess::Start(
        {"serve", "--model-repository", ExamplesDir(), "--http-port", std::to_string(http_port_),
         "--grpc-port", std::to_string(FreePort()), "--metrics-port", std::to_string(FreePort()),
         "--backend-directory", BinaryDir() + "/backends"});
  }
  static void TearDownTestSuite() {
    if (process_) {
      EXPECT_EQ(process_->Terminate(), 0) << process_->log();
    }
    process_.reset();
  }
  void SetUp() override {
    ASSERT_NE(process_, nullptr);
    ASSERT_TRUE(process_->WaitForPort(http_port_, 60000)) << process_->log();
    client_ = std::make_unique<HttpTestClient>("127.0.0.1", http_port_);
    // Models load (and warm up) before the server reports ready.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (client_->Get("/v2/health/ready").status != 200) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << process_->log();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  void TearDown() override {
    if (HasFailure() && process_) std::cerr << "---- shoal log ----\n" << process_->log() << "\n";
  }

  static int http_port_;
  static std::unique_ptr<ShoalProcess> process_;
  std::unique_ptr<HttpTestClient> client_;
};

int ExamplesE2eTest::http_port_ = 0;
std::unique_ptr<ShoalProcess> ExamplesE2eTest::process_;

TEST_F(ExamplesE2eTest, EveryModelHasAReferenceAndIsReady) {
  const auto models = ExampleModels();
  EXPECT_GE(models.size(), 9u);
  for (const auto& m : models) {
    EXPECT_FALSE(ReadReference(m).is_null())
        << "examples/models/" << m << " has no tests/e2e/examples/" << m
        << ".json; run examples/models/generate.py";
    EXPECT_EQ(client_->Get("/v2/models/" + m + "/ready").status, 200) << m;
  }
}

TEST_F(ExamplesE2eTest, MetadataAndOneInferenceMatchTheReference) {
  for (const auto& m : ExampleModels()) {
    SCOPED_TRACE("model " + m);
    const json ref = ReadReference(m);
    ASSERT_TRUE(ref.is_object());

    HttpReply meta = client_->Get("/v2/models/" + m);
    ASSERT_EQ(meta.status, 200) << meta.body;
    const json md = json::parse(meta.body);
    EXPECT_EQ(md["name"], m);
    // Names, datatypes and shapes ([-1, dims...]: every example model batches).
    EXPECT_EQ(md["inputs"], ref["metadata"]["inputs"]);
    EXPECT_EQ(md["outputs"], ref["metadata"]["outputs"]);

    HttpReply r =
        client_->Post("/v2/models/" + m + "/infer", json{{"inputs", ref["inputs"]}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json res = json::parse(r.body);
    EXPECT_EQ(res["model_name"], m);
    ASSERT_EQ(res["outputs"].size(), ref["outputs"].size()) << r.body;
    for (const json& want : ref["outputs"]) {
      const std::string name = want["name"];
      auto it = std::find_if(res["outputs"].begin(), res["outputs"].end(),
                             [&](const json& o) { return o["name"] == name; });
      ASSERT_NE(it, res["outputs"].end()) << "no output " << name << " in " << r.body;
      const json& got = *it;
      EXPECT_EQ(got["datatype"], want["datatype"]) << name;
      EXPECT_EQ(got["shape"], want["shape"]) << name;
      const auto g = got["data"].get<std::vector<double>>();
      const auto w = want["data"].get<std::vector<double>>();
      ASSERT_EQ(g.size(), w.size()) << name;
      double scale = 1.0, worst = 0.0;
      for (double v : w) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
      EXPECT_LE(worst, ref["relative_tolerance"].get<double>() * scale)
          << name << ": max |shoal - reference| " << worst;
    }

    // Classifiers: the argmax of each row is the true class (real digits for `digits`).
    if (ref.contains("labels")) {
      auto it = std::find_if(res["outputs"].begin(), res["outputs"].end(),
                             [&](const json& o) { return o["name"] == ref["label_output"]; });
      ASSERT_NE(it, res["outputs"].end());
      const auto data = (*it)["data"].get<std::vector<float>>();
      const auto labels = ref["labels"].get<std::vector<int>>();
      ASSERT_FALSE(labels.empty());
      const auto classes = static_cast<std::ptrdiff_t>(data.size() / labels.size());
      for (size_t row = 0; row < labels.size(); ++row) {
        auto begin = data.begin() + static_cast<std::ptrdiff_t>(row) * classes;
        const auto predicted = std::max_element(begin, begin + classes) - begin;
        EXPECT_EQ(predicted, labels[row]) << "row " << row;
      }
    }
  }
}

}  // namespace
}  // namespace shoal::e2e
