// Model metadata, shape resolution, input data, the HTTP wire format and statistics
// parsing: everything shoal bench derives from what the server says, without a server.
#include "loadgen/model_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/fp16.h"
#include "loadgen/http_wire.h"
#include "loadgen/input_data.h"
#include "loadgen/server_stats.h"

namespace shoal::loadgen {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kMetadata[] = R"({"name":"identity","versions":["1"],"platform":"identity",
  "inputs":[{"name":"INPUT0","datatype":"FP32","shape":[-1,-1]}],
  "outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1,-1]}]})";

ModelInfo Identity() {
  auto info = ParseHttpModelInfo(kMetadata, R"({"name":"identity","max_batch_size":8})");
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  return *info;
}

TEST(ModelInfoTest, ParsesMetadataAndMaxBatchSize) {
  ModelInfo m = Identity();
  EXPECT_EQ(m.name, "identity");
  EXPECT_EQ(m.max_batch_size, 8);
  ASSERT_EQ(m.inputs.size(), 1u);
  EXPECT_EQ(m.inputs[0].datatype, "FP32");
  EXPECT_THAT(m.inputs[0].shape, ElementsAre(-1, -1));
  // max_batch_size as a string, or absent.
  EXPECT_EQ(ParseHttpModelInfo(kMetadata, R"({"max_batch_size":"4"})")->max_batch_size, 4);
  EXPECT_EQ(ParseHttpModelInfo(kMetadata, "{}")->max_batch_size, 0);
  EXPECT_FALSE(ParseHttpModelInfo("not json", "{}").ok());
  EXPECT_FALSE(ParseHttpModelInfo(R"({"name":"x","inputs":[]})", "{}").ok());
}

TEST(ResolveInputsTest, BatchAxisAndShapes) {
  auto r = ResolveInputs(Identity(), {{"INPUT0", {16}}}, 4);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT((*r)[0].shape, ElementsAre(4, 16));
}

TEST(ResolveInputsTest, MissingShapeNamesTheInputAndTheFlag) {
  auto r = ResolveInputs(Identity(), {}, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("INPUT0"));
  EXPECT_THAT(r.status().message(), HasSubstr("--shape INPUT0:"));
}

TEST(ResolveInputsTest, Errors) {
  EXPECT_THAT(ResolveInputs(Identity(), {{"NOPE", {1}}}, 1).status().message(),
              HasSubstr("not an input"));
  EXPECT_THAT(ResolveInputs(Identity(), {{"INPUT0", {1, 2}}}, 1).status().message(),
              HasSubstr("does not fit"));
  EXPECT_THAT(ResolveInputs(Identity(), {{"INPUT0", {4}}}, 9).status().message(),
              HasSubstr("max_batch_size 8"));
  ModelInfo fixed = Identity();
  fixed.max_batch_size = 0;
  fixed.inputs[0].shape = {2, 3};
  auto r = ResolveInputs(fixed, {}, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT((*r)[0].shape, ElementsAre(2, 3));
  EXPECT_THAT(ResolveInputs(fixed, {}, 2).status().message(), HasSubstr("does not batch"));
  EXPECT_THAT(ResolveInputs(fixed, {{"INPUT0", {2, 4}}}, 1).status().message(),
              HasSubstr("does not fit"));
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST(InputDataTest, ZeroAndRandomHaveTheRightSizes) {
  std::vector<TensorInfo> inputs = {{"A", "FP32", {2, 3}}, {"B", "INT64", {2, 1}}};
  auto zero = MakePayloads(inputs, "zero", true, 2, 1);
  ASSERT_TRUE(zero.ok());
  ASSERT_EQ(zero->size(), 1u);
  EXPECT_EQ((*zero)[0][0].data, std::string(24, '\0'));
  EXPECT_EQ((*zero)[0][1].data.size(), 16u);
  auto random = MakePayloads(inputs, "random", true, 2, 1);
  ASSERT_TRUE(random.ok());
  const auto v = Floats((*random)[0][0].data);
  ASSERT_EQ(v.size(), 6u);
  for (float x : v) EXPECT_TRUE(x >= 0 && x < 1);
  // One sample repeated for each batch element.
  EXPECT_EQ(v[0], v[3]);
  EXPECT_FALSE(MakePayloads(inputs, "/nonexistent.json", true, 2, 1).ok());
}

TEST(InputDataTest, PerfAnalyzerFileFormat) {
  std::vector<TensorInfo> inputs = {{"A", "FP32", {2, 2}}, {"S", "BYTES", {2, 1}}};
  auto p = PayloadsFromJson(
      inputs,
      R"({"data":[{"A":[1,2],"S":["hi"]},{"A":{"content":[[3],[4]],"shape":[2]},"S":["yo"]}]})",
      true, 2);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ(Floats((*p)[0][0].data), (std::vector<float>{1, 2, 1, 2}));
  EXPECT_EQ(Floats((*p)[1][0].data), (std::vector<float>{3, 4, 3, 4}));
  EXPECT_EQ((*p)[0][1].data, std::string("\x02\0\0\0hi\x02\0\0\0hi", 12));
  // The simple form: one entry.
  auto simple = PayloadsFromJson(inputs, R"({"A":[5,6],"S":["x"]})", true, 2);
  ASSERT_TRUE(simple.ok());
  EXPECT_EQ(simple->size(), 1u);
}

TEST(InputDataTest, FileErrorsSayWhatIsWrong) {
  std::vector<TensorInfo> inputs = {{"A", "FP32", {1, 3}}};
  EXPECT_THAT(PayloadsFromJson(inputs, R"({"A":[1,2]})", true, 1).status().message(),
              HasSubstr("gives 2 values"));
  EXPECT_THAT(PayloadsFromJson(inputs, R"({"B":[1,2,3]})", true, 1).status().message(),
              HasSubstr("no values for input 'A'"));
  EXPECT_THAT(PayloadsFromJson(inputs, R"({"A":["x","y","z"]})", true, 1).status().message(),
              HasSubstr("numbers"));
  EXPECT_THAT(PayloadsFromJson(inputs, R"({"A":{"content":[1,2,3],"shape":[4]}})", true, 1)
                  .status()
                  .message(),
              HasSubstr("shape"));
  EXPECT_FALSE(PayloadsFromJson(inputs, "[1,2", true, 1).ok());
}

// FP16 inputs carry real halves: random values in [0, 1), file values rounded to FP16,
// values beyond FP16's range refused.
TEST(InputDataTest, Fp16InputsAreEncodedAsHalves) {
  std::vector<TensorInfo> inputs = {{"H", "FP16", {1, 64}}};
  auto random = MakePayloads(inputs, "random", true, 1, 7);
  ASSERT_TRUE(random.ok()) << random.status().ToString();
  const std::string& bytes = (*random)[0][0].data;
  ASSERT_EQ(bytes.size(), 128u);
  float lo = 1, hi = 0;
  for (size_t i = 0; i < 64; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    lo = std::min(lo, Fp16ToFloat(h));
    hi = std::max(hi, Fp16ToFloat(h));
  }
  EXPECT_GE(lo, 0.f);
  EXPECT_LE(hi, 1.f);
  EXPECT_GT(hi - lo, 0.5f);
  std::vector<TensorInfo> three = {{"H", "FP16", {1, 3}}};
  auto file = PayloadsFromJson(three, R"({"H":[1, -2.5, 0.1]})", true, 1);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)[0][0].data, std::string("\x00\x3c\x00\xc1\x66\x2e", 6));
  EXPECT_THAT(PayloadsFromJson(three, R"({"H":[1, 70000, 0]})", true, 1).status().message(),
              HasSubstr("input data for 'H': 70000 is beyond the range of FP16"));
  // Beyond FP32's range too: refused, not narrowed to infinity and sent.
  EXPECT_THAT(PayloadsFromJson(three, R"({"H":[1, 1e300, 0]})", true, 1).status().message(),
              HasSubstr("is beyond the range of FP16"));
  // The largest finite FP16 and an explicit infinity are kept.
  auto edge = PayloadsFromJson(three, R"({"H":[65504, -65504, 0]})", true, 1);
  ASSERT_TRUE(edge.ok()) << edge.status().ToString();
  EXPECT_EQ((*edge)[0][0].data, std::string("\xff\x7b\xff\xfb\x00\x00", 6));
}

TEST(HttpWireTest, EncodesBinaryTensorRequest) {
  Payload p = {{"INPUT0", "FP32", {1, 2}, std::string(8, 'x')}};
  const std::string r = EncodeHttpInferRequest("h:1", ModelPath("m", 3, "/infer"), p);
  EXPECT_EQ(r.rfind("POST /v2/models/m/versions/3/infer HTTP/1.1\r\n", 0), 0u);
  const std::string json =
      R"({"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}],"parameters":{"binary_data_output":true}})";
  EXPECT_THAT(
      r, HasSubstr("Inference-Header-Content-Length: " + std::to_string(json.size()) + "\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Length: " + std::to_string(json.size() + 8) + "\r\n"));
  EXPECT_EQ(r.substr(r.size() - json.size() - 8), json + "xxxxxxxx");
  EXPECT_EQ(ModelPath("m", -1, "/stats"), "/v2/models/m/stats");
}

TEST(ServerStatsTest, ParsesAndSubtracts) {
  const char* json = R"({"model_stats":[
    {"name":"m","version":"1","inference_count":10,"execution_count":5,
     "inference_stats":{"success":{"count":10,"ns":1000},"queue":{"count":10,"ns":400},
       "compute_input":{"count":5,"ns":50},"compute_infer":{"count":5,"ns":500},
       "compute_output":{"count":5,"ns":25}}},
    {"name":"m","version":"2","inference_count":2,"execution_count":1,
     "inference_stats":{"queue":{"count":2,"ns":100}}}]})";
  auto s = ParseHttpStats(json);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->inference_count, 12u);
  EXPECT_EQ(s->queue.count, 12u);
  EXPECT_EQ(s->queue.ns, 500u);
  ServerStats before = *s;
  before.queue = {2, 100};
  before.compute_infer = {1, 100};
  const ServerStats d = Subtract(*s, before);
  EXPECT_EQ(d.queue.count, 10u);
  EXPECT_DOUBLE_EQ(d.queue.MeanUs(), 0.04);
  EXPECT_EQ(d.compute_infer.ns, 400u);
  EXPECT_EQ(Subtract(before, *s).queue.count, 0u);  // never negative
  EXPECT_FALSE(ParseHttpStats("{}").ok());
}

}  // namespace
}  // namespace shoal::loadgen
