// The HTTP infer codec without sockets: JSON and binary requests, every malformed input
// answered with INVALID_ARGUMENT naming the field, compression, and the reply encoding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "server/http_infer_codec.h"
#include "server/http_test_client.h"

namespace shoal::server {
namespace {

using shoal::testing::RawBytes;
using shoal::testing::SerializeStrings;
using ::testing::HasSubstr;

std::shared_ptr<proto::BodyBuffer> Body(std::string_view s, size_t align_at = 0) {
  auto b = proto::BodyBuffer::Create(s.size(), align_at);
  if (!s.empty()) std::memcpy(b->data(), s.data(), s.size());
  b->set_size(s.size());
  return b;
}

StatusOr<ParsedInfer> Parse(std::string_view json, runtime::RequestLimits limits = {}) {
  return ParseInferRequest(Body(json), std::nullopt, limits);
}

StatusOr<ParsedInfer> ParseBinary(std::string_view json, std::string_view binary,
                                  runtime::RequestLimits limits = {}) {
  const std::string body = std::string(json) + std::string(binary);
  const std::string n = std::to_string(json.size());
  return ParseInferRequest(Body(body, json.size()), std::string_view(n), limits);
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  std::vector<T> out(t.byte_size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.data(), t.byte_size());
  return out;
}

void ExpectError(const StatusOr<ParsedInfer>& r, std::string_view fragment) {
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << fragment;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(std::string(fragment)));
}

TEST(HttpInferParserTest, JsonInputsOfEveryJsonType) {
  auto r = Parse(R"({"id":"req-1","inputs":[
    {"name":"F","shape":[2,2],"datatype":"FP32","data":[[1.5,2],[3.4028235e38,-4.25]]},
    {"name":"D","shape":[1],"datatype":"FP64","data":[1e300]},
    {"name":"I8","shape":[2],"datatype":"INT8","data":[-128,127]},
    {"name":"U16","shape":[1],"datatype":"UINT16","data":[65535]},
    {"name":"I64","shape":[1],"datatype":"INT64","data":[-9223372036854775808]},
    {"name":"U64","shape":[1],"datatype":"UINT64","data":[18446744073709551615]},
    {"name":"B","shape":[3],"datatype":"BOOL","data":[true,false,true]},
    {"name":"S","shape":[2],"datatype":"BYTES","data":["hi","\u00e9\n"]}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& in = r->request.inputs;
  ASSERT_EQ(in.size(), 8u);
  EXPECT_EQ(r->request.id, "req-1");
  EXPECT_EQ(in[0].name, "F");
  EXPECT_EQ(in[0].tensor.dtype(), DataType::kFp32);
  EXPECT_EQ(in[0].tensor.shape(), (Shape{2, 2}));
  // FLT_MAX in its shortest text is a little above it, and still FLT_MAX.
  EXPECT_EQ(Values<float>(in[0].tensor),
            (std::vector<float>{1.5f, 2.f, std::numeric_limits<float>::max(), -4.25f}));
  EXPECT_EQ(Values<double>(in[1].tensor), (std::vector<double>{1e300}));
  EXPECT_EQ(Values<int8_t>(in[2].tensor), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(Values<uint16_t>(in[3].tensor), (std::vector<uint16_t>{65535}));
  EXPECT_EQ(Values<int64_t>(in[4].tensor), (std::vector<int64_t>{INT64_MIN}));
  EXPECT_EQ(Values<uint64_t>(in[5].tensor), (std::vector<uint64_t>{UINT64_MAX}));
  EXPECT_EQ(Values<uint8_t>(in[6].tensor), (std::vector<uint8_t>{1, 0, 1}));
  auto strings = in[7].tensor.BytesElements();
  ASSERT_TRUE(strings.ok());
  EXPECT_EQ((*strings)[0], "hi");
  EXPECT_EQ((*strings)[1], "\xc3\xa9\n");
  EXPECT_TRUE(r->request.requested_outputs.empty());
  EXPECT_FALSE(r->encoding.default_binary);
}

TEST(HttpInferParserTest, ParametersOutputsAndMemberOrder) {
  // "data" before "datatype" and "shape"; top-level members in any order.
  auto r = Parse(R"({"outputs":[{"name":"B","parameters":{"binary_data":false}},{"name":"A"}],
    "parameters":{"priority":2,"timeout":1500,"binary_data_output":true,"custom":"x","n":-3,"f":0.5,
                  "flag":true,"sequence_id":0,"sequence_start":false},
    "inputs":[{"data":[7],"datatype":"INT32","name":"X","shape":[1]}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->request.priority, 2u);
  EXPECT_EQ(r->request.timeout_us, 1500u);
  EXPECT_TRUE(r->encoding.default_binary);
  EXPECT_EQ(r->request.requested_outputs, (std::vector<std::string>{"B", "A"}));
  EXPECT_FALSE(r->encoding.Binary("B"));
  EXPECT_TRUE(r->encoding.Binary("A"));
  const auto& p = r->request.parameters;
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(std::get<std::string>(p.at("custom")), "x");
  EXPECT_EQ(std::get<int64_t>(p.at("n")), -3);
  EXPECT_EQ(std::get<double>(p.at("f")), 0.5);
  EXPECT_EQ(std::get<bool>(p.at("flag")), true);
  EXPECT_EQ(Values<int32_t>(r->request.inputs[0].tensor), (std::vector<int32_t>{7}));
}

TEST(HttpInferParserTest, BinaryInputsAreAlignedViewsIntoTheBody) {
  const std::vector<float> f = {1, 2, 3, 4};
  const std::vector<int64_t> i = {-1, 5};
  const std::string json = R"({"inputs":[
    {"name":"A","shape":[4],"datatype":"FP32","parameters":{"binary_data_size":16}},
    {"name":"J","shape":[1],"datatype":"INT32","data":[3]},
    {"name":"B","shape":[2],"datatype":"INT64","parameters":{"binary_data_size":16}},
    {"name":"S","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":11}},
    {"name":"E","shape":[0],"datatype":"FP32","parameters":{"binary_data_size":0}}]})";
  const std::string binary = RawBytes(f) + RawBytes(i) + SerializeStrings({"abc", ""});
  auto body = Body(json + binary, json.size());
  const std::string n = std::to_string(json.size());
  auto r = ParseInferRequest(body, std::string_view(n), {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& in = r->request.inputs;
  EXPECT_EQ(Values<float>(in[0].tensor), f);
  EXPECT_EQ(Values<int32_t>(in[1].tensor), (std::vector<int32_t>{3}));
  EXPECT_EQ(Values<int64_t>(in[2].tensor), i);
  EXPECT_EQ(in[3].tensor.byte_size(), 11u);
  EXPECT_EQ(in[4].tensor.byte_size(), 0u);
  EXPECT_EQ(in[4].tensor.shape(), (Shape{0}));
  // The first binary tensor starts on the 64-byte boundary the body was aligned at,
  // and is used in place.
  EXPECT_EQ(in[0].tensor.data(), body->data() + json.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(in[0].tensor.data()) % 64, 0u);
}

TEST(HttpInferParserTest, MisalignedBinaryIsCopied) {
  const std::string json =
      R"({"inputs":[{"name":"A","shape":[1],"datatype":"UINT8","parameters":{"binary_data_size":1}},
    {"name":"B","shape":[1],"datatype":"FP64","parameters":{"binary_data_size":8}}]})";
  const double d = 2.5;
  auto r = ParseBinary(json, std::string("\x07", 1) + RawBytes(std::vector<double>{d}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r->request.inputs[1].tensor.data()) % 8, 0u);
  EXPECT_EQ(Values<double>(r->request.inputs[1].tensor), (std::vector<double>{d}));
}

TEST(HttpInferParserTest, MalformedRequestsNameTheField) {
  ExpectError(Parse(""), "empty");
  ExpectError(Parse("{"), "invalid JSON");
  ExpectError(Parse("[1]"), "expected a JSON object");
  ExpectError(Parse(R"({"inputs":[]} x)"), "");
  ExpectError(Parse(R"({"id":1,"inputs":[]})"), "id: expected a string");
  ExpectError(Parse(R"({"outputs":[]})"), "inputs: missing");
  ExpectError(Parse(R"({"inputs":{}})"), "inputs: expected an array");
  ExpectError(Parse(R"({"inputs":[{"shape":[1],"datatype":"FP32","data":[1]}]})"),
              "inputs[0].name");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP33","data":[1]}]})"),
              "inputs[0] ('X').datatype: unknown datatype 'FP33'");
  ExpectError(Parse(R"({"inputs":[{"name":"X","datatype":"FP32","data":[1]}]})"),
              "inputs[0] ('X').shape");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[2,-3],"datatype":"FP32","data":[1]}]})"),
              "inputs[0] ('X').shape[1]: negative dimension -3");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1.5],"datatype":"FP32","data":[1]}]})"),
              "shape[0]");
  ExpectError(
      Parse(
          R"({"inputs":[{"name":"X","shape":[4294967296,4294967296],"datatype":"FP32","data":[1]}]})"),
      "('X').shape");
  ExpectError(
      Parse(
          R"({"inputs":[{"name":"X","shape":[9223372036854775807,2],"datatype":"FP32","data":[1]}]})"),
      "('X').shape");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[3],"datatype":"FP32","data":[1,2]}]})"),
              "holds 2 elements but shape [3] declares 3");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1,2]}]})"),
              "holds more than the 1 elements");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":["a"]}]})"),
              "inputs[0] ('X').data[0]: expected a number");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"INT8","data":[300]}]})"),
              "data[0]: 300 does not fit in INT8");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"UINT8","data":[-1]}]})"),
              "data[0]");
  // A fraction is never truncated into an integer type, and a number beyond FP32's range
  // never becomes infinity: both name the input and the value.
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[2],"datatype":"INT64","data":[1,1.5]}]})"),
              "inputs[0] ('X').data[1]: 1.5 is not an integer, as INT64 needs");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"INT32","data":[2e3]}]})"),
              "inputs[0] ('X').data[0]: 2e3 is not an integer");
  ExpectError(
      Parse(
          R"({"inputs":[{"name":"X","shape":[1],"datatype":"INT64","data":[9223372036854775808]}]})"),
      "inputs[0] ('X').data[0]: 9223372036854775808 does not fit in INT64");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"INT64","data":[true]}]})"),
              "inputs[0] ('X').data[0]: expected an integer");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[2],"datatype":"FP32","data":[1,1e39]}]})"),
              "inputs[0] ('X').data[1]: 1e+39 is beyond the range of FP32");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[-4e38]}]})"),
              "inputs[0] ('X').data[0]: -4e+38 is beyond the range of FP32");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP16","data":[1]}]})"),
              "FP16 data cannot be sent as JSON");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"BOOL","data":[1]}]})"),
              "true or false");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"BYTES","data":[1]}]})"),
              "expected a string");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32"}]})"),
              "exactly one of");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1],
                        "parameters":{"binary_data_size":4}}]})"),
              "exactly one of");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32",
                        "parameters":{"shared_memory_region":"r"}}]})"),
              "shared_memory_region needs shared_memory_byte_size");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1],
                        "parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}}]})"),
              "an input in shared memory takes neither");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32",
                        "parameters":{"shared_memory_offset":4}}]})"),
              "need shared_memory_region");
  ExpectError(Parse(R"({"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":[1]},
                                  {"name":"X","shape":[1],"datatype":"FP32","data":[1]}]})"),
              "given twice");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"priority":-1}})"), "parameters.priority");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"priority":4294967296}})"),
              "parameters.priority");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"timeout":"5"}})"), "parameters.timeout");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"triton_x":1}})"), "parameters.triton_x");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"sequence_id":5}})"),
              "sequences are not supported");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"obj":{}}})"), "parameters.obj");
  ExpectError(Parse(R"({"inputs":[],"parameters":{"big":18446744073709551615}})"),
              "parameters.big");
  ExpectError(Parse(R"({"inputs":[],"outputs":[{"name":"A","parameters":{"classification":0}}]})"),
              "outputs[0].parameters.classification: must be a positive integer");
  ExpectError(
      Parse(R"({"inputs":[],"outputs":[{"name":"A","parameters":{"classification":"3"}}]})"),
      "outputs[0].parameters.classification");
  ExpectError(Parse(R"({"inputs":[],"outputs":[{"name":"A","parameters":{"binary_data":1}}]})"),
              "outputs[0].parameters.binary_data");
  ExpectError(Parse(R"({"inputs":[],"outputs":[{"name":"A"},{"name":"A"}]})"), "requested twice");
  ExpectError(Parse(R"({"inputs":[],"inputs":[]})"), "inputs: given twice");
  ExpectError(Parse("{\"id\":\"\xff\xfe\",\"inputs\":[]}"), "UTF-8");
}

// Values the parser never reads (unknown parameters, fields skipped while looking up
// others) are still checked: a malformed one used to leave simdjson's On Demand iterator
// in an undefined state (a fuzzer finding, the first case).
TEST(HttpInferParserTest, TrailingBytesAreReportedAsSuchNotAsAnEarlyEnd) {
  for (const char* body :
       {R"({"inputs":[]} x)", R"({"inputs":[]} 5)", R"({"inputs":[]}])", R"({"inputs":[]}})",
        R"({"inputs":[]} {"b":2})", R"({"inputs":[{"name":"}"}]} x)"}) {
    auto r = Parse(body);
    ExpectError(r, "trailing bytes after the JSON document");
    if (!r.ok()) {
      EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("ended early"))) << body;
    }
  }
  ExpectError(Parse(R"({"inputs":[)"), "invalid JSON");  // a truncated one still is
  auto truncated = Parse(R"({"inputs":[)");
  EXPECT_THAT(truncated.status().message(), ::testing::Not(HasSubstr("trailing")));
}

TEST(HttpInferParserTest, MalformedJsonInFieldsNobodyReadsIsRefused) {
  ExpectError(Parse(R"({"inputs": [{"name": "A", "shape": [1], "datatype": "INT32",)"
                    R"( "parameters": {"binary_dype": "IN?32", "paremevers": }}}}}}}}})"),
              "invalid JSON in the request body at inputs[0].parameters.paremevers");
  ExpectError(Parse(R"({"unknown": {"a": ]}, "inputs": [{"name": "A", "shape": [1],)"
                    R"( "datatype": "INT32", "data": [1]}]})"),
              "invalid JSON");
  ExpectError(Parse(R"({"inputs": [{"name": "A", "extra": [1, :], "shape": [1],)"
                    R"( "datatype": "INT32", "data": [1]}]})"),
              "at inputs[0].extra[1]");
  ExpectError(Parse(R"({"id": "x", "parameters": {"k": nul}, "inputs": []})"), "invalid JSON");
  ExpectError(Parse(std::string(200, '[') + std::string(200, ']')), "a JSON object");
  ExpectError(Parse(R"({"a": )" + std::string(100, '[') + std::string(100, ']') + "}"),
              "invalid JSON");
  // Well-formed fields nobody reads are still fine, in any order.
  auto r = Parse(R"({"extra": {"deep": [1, {"x": null, "y": [true, "s\n"]}]},)"
                 R"( "inputs": [{"datatype": "INT32", "unused": -1.5e3, "data": [7],)"
                 R"( "shape": [1], "name": "A"}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->request.inputs.size(), 1u);
  EXPECT_EQ(Values<int32_t>(r->request.inputs[0].tensor), std::vector<int32_t>{7});
}

TEST(HttpInferParserTest, LimitsAreCheckedBeforeAllocation) {
  runtime::RequestLimits limits;
  limits.max_elements_per_tensor = 10;
  limits.max_inputs = 2;
  ExpectError(
      Parse(R"({"inputs":[{"name":"X","shape":[11],"datatype":"FP32","data":[1]}]})", limits),
      "more than 10 elements");
  ExpectError(Parse(R"({"inputs":[{"name":"A","shape":[1],"datatype":"FP32","data":[1]},
    {"name":"B","shape":[1],"datatype":"FP32","data":[1]},{"name":"C","shape":[1],"datatype":"FP32","data":[1]}]})",
                    limits),
              "more than 2 inputs");
  // A shape far larger than the JSON text could hold is refused without allocating it.
  ExpectError(
      Parse(R"({"inputs":[{"name":"X","shape":[100000000],"datatype":"FP64","data":[1]}]})"),
      "more than the request holds");
  // A binary tensor larger than the body never allocates: the slice is checked first.
  ExpectError(ParseBinary(R"({"inputs":[{"name":"X","shape":[100000000],"datatype":"FP32",
    "parameters":{"binary_data_size":400000000}}]})",
                          "abcd"),
              "truncated");
}

TEST(HttpInferParserTest, BinaryFramingErrors) {
  const std::string one =
      R"({"inputs":[{"name":"X","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8}}]})";
  ExpectError(ParseBinary(one, "1234"), "binary data is truncated");
  ExpectError(ParseBinary(one, "123456789"), "1 bytes beyond");
  const std::string wrong =
      R"({"inputs":[{"name":"X","shape":[3],"datatype":"INT32","parameters":{"binary_data_size":8}}]})";
  ExpectError(ParseBinary(wrong, "12345678"),
              "binary_data_size is 8 bytes but shape [3] of INT32 needs 12");
  const std::string bytes =
      R"({"inputs":[{"name":"X","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":9}}]})";
  ExpectError(ParseBinary(bytes, SerializeStrings({"a"}) + std::string("\x09\0\0\0", 4)),
              "claims 9 bytes");
  // binary_data_size without the header.
  ExpectError(Parse(one), "Inference-Header-Content-Length");
  // Header values.
  auto body = Body(one);
  ExpectError(ParseInferRequest(body, std::string_view("abc"), {}),
              "Inference-Header-Content-Length");
  ExpectError(ParseInferRequest(body, std::string_view("0"), {}), "not supported");
  ExpectError(ParseInferRequest(body, std::string_view("100000"), {}), "more than the");
  ExpectError(ParseInferRequest(body, std::string_view("-1"), {}),
              "Inference-Header-Content-Length");
}

TEST(HttpInferParserTest, SplitAndSliceAreExact) {
  auto s = SplitBinaryBody("{}abc", std::string_view("2"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->json, "{}");
  EXPECT_EQ(s->binary, "abc");
  auto all = SplitBinaryBody("{}", std::nullopt);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->json, "{}");
  auto slices = SliceBinaryRegion("abcdef", {1, 0, 5});
  ASSERT_TRUE(slices.ok());
  EXPECT_EQ((*slices)[0], "a");
  EXPECT_EQ((*slices)[1], "");
  EXPECT_EQ((*slices)[2], "bcdef");
  EXPECT_FALSE(SliceBinaryRegion("abc", {UINT64_MAX}).ok());
  EXPECT_FALSE(SliceBinaryRegion("abc", {2, UINT64_MAX}).ok());
}

TEST(HttpInferParserTest, GzipAndDeflateBodies) {
  const std::string json =
      R"({"inputs":[{"name":"X","shape":[2],"datatype":"INT32","data":[1,2]}]})";
  for (const auto& [encoding, compressed] :
       {std::pair<std::string, std::string>{"gzip", testing::GzipCompress(json)},
        {"deflate", testing::ZlibCompress(json)}}) {
    auto decoded = DecodeContentEncoding(encoding, Body(compressed), 1 << 20, 0);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ((*decoded)->view(), json);
    auto r = ParseInferRequest(*decoded, std::nullopt, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  auto identity = Body(json);
  auto same = DecodeContentEncoding("identity", identity, 10, 0);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->get(), identity.get());
  // Over the limit after decompression: RESOURCE_EXHAUSTED (the front end answers 413).
  const std::string big(1 << 20, 'a');
  auto bomb = DecodeContentEncoding("gzip", Body(testing::GzipCompress(big)), 1000, 0);
  ASSERT_FALSE(bomb.ok());
  EXPECT_EQ(bomb.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(DecodeContentEncoding("br", Body(json), 1000, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(DecodeContentEncoding("gzip", Body("not gzip"), 1000, 0).status().message(),
              HasSubstr("corrupt"));
  const std::string gz = testing::GzipCompress(json);
  EXPECT_THAT(
      DecodeContentEncoding("gzip", Body(gz.substr(0, gz.size() / 2)), 1000, 0).status().message(),
      HasSubstr("truncated"));
  EXPECT_THAT(DecodeContentEncoding("gzip", Body(gz + "xx"), 1000, 0).status().message(),
              HasSubstr("after the end"));
  // Aligned at the JSON header length, so binary tensors stay aligned after decoding.
  auto aligned = DecodeContentEncoding("gzip", Body(gz), 1 << 20, 5);
  ASSERT_TRUE(aligned.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*aligned)->data() + 5) % 64, 0u);
}

runtime::InferResponse Response() {
  runtime::InferResponse r;
  r.model_name = "m";
  r.model_version = 3;
  r.id = "abc";
  r.outputs.push_back({"F", Tensor::FromVector<float>(DataType::kFp32, {2}, {0.1f, -2})});
  r.outputs.push_back({"I", Tensor::FromVector<int32_t>(DataType::kInt32, {1, 2}, {7, -8})});
  r.outputs.push_back({"S", Tensor::FromStrings({2}, {"x\"y", "\xc3\xa9"})});
  r.outputs.push_back({"B", Tensor::FromVector<uint8_t>(DataType::kBool, {2}, {1, 0})});
  return r;
}

TEST(HttpInferCodecTest, JsonResponse) {
  auto http = SerializeInferResponse(Response(), OutputEncoding{});
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  EXPECT_EQ(http->content_type, "application/json");
  EXPECT_TRUE(http->tail.empty());
  EXPECT_EQ(http->body, R"({"model_name":"m","model_version":"3","id":"abc","outputs":[)"
                        R"({"name":"F","datatype":"FP32","shape":[2],"data":[0.1,-2]},)"
                        R"({"name":"I","datatype":"INT32","shape":[1,2],"data":[7,-8]},)"
                        R"({"name":"S","datatype":"BYTES","shape":[2],"data":["x\"y","é"]},)"
                        R"({"name":"B","datatype":"BOOL","shape":[2],"data":[true,false]}]})");
}

TEST(HttpInferCodecTest, ResponseParametersAreAnObjectBeforeTheOutputs) {
  runtime::InferResponse r;
  r.model_name = "m";
  r.model_version = 1;
  r.parameters["precision"] = std::string("int8");
  r.parameters["n"] = int64_t{3};
  auto http = SerializeInferResponse(r, OutputEncoding{});
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  EXPECT_EQ(http->body, R"({"model_name":"m","model_version":"1",)"
                        R"("parameters":{"n":3,"precision":"int8"},"outputs":[]})");
}

TEST(HttpInferCodecTest, BinaryResponseInRequestedOrder) {
  OutputEncoding enc;
  enc.requested = {{"I", true}, {"F", std::nullopt}, {"S", true}};
  auto http = SerializeInferResponse(Response(), enc);
  ASSERT_TRUE(http.ok()) << http.status().ToString();
  EXPECT_EQ(http->content_type, "application/octet-stream");
  ASSERT_EQ(http->headers.size(), 1u);
  EXPECT_EQ(http->headers[0].first, "Inference-Header-Content-Length");
  EXPECT_EQ(http->headers[0].second, std::to_string(http->body.size()));
  EXPECT_EQ(
      http->body,
      R"({"model_name":"m","model_version":"3","id":"abc","outputs":[)"
      R"({"name":"I","datatype":"INT32","shape":[1,2],"parameters":{"binary_data_size":8}},)"
      R"({"name":"F","datatype":"FP32","shape":[2],"data":[0.1,-2]},)"
      R"({"name":"S","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":13}}]})");
  ASSERT_EQ(http->tail.size(), 2u);
  EXPECT_EQ(http->tail[0].bytes, RawBytes(std::vector<int32_t>{7, -8}));
  EXPECT_EQ(http->tail[1].bytes, SerializeStrings({"x\"y", "\xc3\xa9"}));
  EXPECT_EQ(http->content_length(), http->body.size() + 8 + 13);
}

TEST(HttpInferCodecTest, OutputsJsonCannotCarry) {
  runtime::InferResponse r;
  r.model_name = "m";
  r.outputs.push_back({"H", Tensor::FromVector<uint16_t>(DataType::kFp16, {1}, {0x3c00})});
  EXPECT_THAT(SerializeInferResponse(r, {}).status().message(), HasSubstr("binary_data"));
  OutputEncoding binary;
  binary.default_binary = true;
  EXPECT_TRUE(SerializeInferResponse(r, binary).ok());
  runtime::InferResponse s;
  s.outputs.push_back({"S", Tensor::FromStrings({1}, {"\xff"})});
  EXPECT_THAT(SerializeInferResponse(s, {}).status().message(), HasSubstr("UTF-8"));
  OutputEncoding missing;
  missing.requested = {{"nope", std::nullopt}};
  EXPECT_EQ(SerializeInferResponse(s, missing).status().code(), StatusCode::kInternal);
}

TEST(HttpInferCodecTest, AllBinaryOutputsEmptyStaysJson) {
  runtime::InferResponse r;
  r.model_name = "m";
  r.outputs.push_back({"E", Tensor::FromVector<float>(DataType::kFp32, {0}, {})});
  OutputEncoding enc;
  enc.default_binary = true;
  auto http = SerializeInferResponse(r, enc);
  ASSERT_TRUE(http.ok());
  EXPECT_EQ(http->content_type, "application/json");
  EXPECT_TRUE(http->headers.empty());
  EXPECT_THAT(http->body, HasSubstr(R"("parameters":{"binary_data_size":0})"));
}

TEST(HttpInferCodecTest, RepositoryBodies) {
  EXPECT_EQ(*ParseRepositoryIndexBody(""), false);
  EXPECT_EQ(*ParseRepositoryIndexBody(R"({"ready":true})"), true);
  EXPECT_FALSE(ParseRepositoryIndexBody(R"({"ready":1})").ok());
  EXPECT_FALSE(ParseRepositoryIndexBody("{").ok());
  auto p =
      ParseRepositoryParametersBody(R"({"parameters":{"config":"{}","unload_dependents":true}})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->names, (std::vector<std::string>{"config", "unload_dependents"}));
  EXPECT_TRUE(p->unload_dependents);
  EXPECT_EQ(p->config, std::optional<std::string>("{}"));
  EXPECT_FALSE(ParseRepositoryParametersBody(R"({"parameters":{"config":{}}})").ok());
  EXPECT_TRUE(ParseRepositoryParametersBody("  ").ok());
  EXPECT_FALSE(ParseRepositoryParametersBody(R"({"parameters":[]})").ok());
}

TEST(HttpInferParserTest, SharedMemoryInputsAndOutputsAndClassification) {
  auto r = Parse(R"({"inputs":[{"name":"X","shape":[2],"datatype":"FP32",
      "parameters":{"shared_memory_region":"in","shared_memory_byte_size":8,
                    "shared_memory_offset":16}}],
    "outputs":[{"name":"Y","parameters":{"shared_memory_region":"out",
                                         "shared_memory_byte_size":32}},
               {"name":"Z","parameters":{"classification":2}}]})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->shared_memory_inputs.size(), 1u);
  EXPECT_EQ(r->shared_memory_inputs[0].first, 0u);
  EXPECT_EQ(r->shared_memory_inputs[0].second.region, "in");
  EXPECT_EQ(r->shared_memory_inputs[0].second.offset, 16u);
  EXPECT_EQ(r->shared_memory_inputs[0].second.byte_size, 8u);
  EXPECT_EQ(r->request.inputs[0].tensor.shape(), (Shape{2}));
  ASSERT_EQ(r->encoding.shared_memory.count("Y"), 1u);
  EXPECT_EQ(r->encoding.shared_memory.at("Y").region, "out");
  EXPECT_EQ(r->encoding.shared_memory.at("Y").offset, 0u);
  EXPECT_EQ(r->encoding.shared_memory.at("Y").byte_size, 32u);
  EXPECT_EQ(r->request.classification, (std::map<std::string, int64_t>{{"Z", 2}}));

  // Resolving against a manager without those regions names the input.
  SharedMemoryManager none;
  Status s = ResolveSharedMemory(none, &*r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("inputs[0] ('X')"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'in'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace shoal::server
