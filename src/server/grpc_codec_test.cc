// The gRPC codec without a network: proto <-> runtime conversion rules (spec sections
// 3.2-3.3, 4.1, 4.4) and the wire identity of grpc_service.proto.
#include "server/grpc_codec.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "proto/grpc_health.grpc.pb.h"
#include "proto/grpc_service.grpc.pb.h"

namespace shoal::server {
namespace {

using inference::ModelInferRequest;
using Message = std::shared_ptr<ModelInferRequest>;

Message NewRequest(const std::string& model = "m") {
  auto m = std::make_shared<ModelInferRequest>();
  m->set_model_name(model);
  return m;
}

template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string BytesElements(const std::vector<std::string>& elements) {
  std::string out;
  for (const auto& e : elements) {
    const auto len = static_cast<uint32_t>(e.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += e;
  }
  return out;
}

ModelInferRequest::InferInputTensor* AddInput(ModelInferRequest& m, const std::string& name,
                                              const std::string& datatype,
                                              std::vector<int64_t> shape) {
  auto* in = m.add_inputs();
  in->set_name(name);
  in->set_datatype(datatype);
  for (int64_t d : shape) in->add_shape(d);
  return in;
}

Status Decode(const Message& m, runtime::RequestLimits limits = {}) {
  return InferRequestFromProto(m, limits).status();
}

void ExpectInvalid(const Message& m, const std::string& fragment,
                   runtime::RequestLimits limits = {}) {
  Status s = Decode(m, limits);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(fragment), std::string::npos)
      << "'" << s.message() << "' should mention '" << fragment << "'";
}

TEST(GrpcCodecTest, ParsesModelVersions) {
  EXPECT_EQ(*ParseModelVersion(""), -1);
  EXPECT_EQ(*ParseModelVersion("0"), 0);
  EXPECT_EQ(*ParseModelVersion("17"), 17);
  EXPECT_FALSE(ParseModelVersion("-1").ok());
  EXPECT_FALSE(ParseModelVersion("1a").ok());
  EXPECT_FALSE(ParseModelVersion(" 1").ok());
  EXPECT_FALSE(ParseModelVersion("1234567890123456789").ok());
}

TEST(GrpcCodecTest, RawInputIsAZeroCopyViewThatKeepsTheMessageAlive) {
  auto m = NewRequest("add_sub");
  m->set_model_version("2");
  m->set_id("req-1");
  AddInput(*m, "INPUT0", "FP32", {1, 3});
  m->add_raw_input_contents(RawBytes<float>({1.5f, 2.5f, -3}));
  m->add_outputs()->set_name("OUTPUT1");
  const char* raw_data = m->raw_input_contents(0).data();

  auto r = InferRequestFromProto(m, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::weak_ptr<ModelInferRequest> weak = m;
  m.reset();
  ASSERT_FALSE(weak.expired()) << "the tensor must keep the message alive";

  EXPECT_EQ(r->model_name, "add_sub");
  EXPECT_EQ(r->model_version, 2);
  EXPECT_EQ(r->id, "req-1");
  ASSERT_EQ(r->inputs.size(), 1u);
  const Tensor& t = r->inputs[0].tensor;
  EXPECT_EQ(r->inputs[0].name, "INPUT0");
  EXPECT_EQ(t.dtype(), DataType::kFp32);
  EXPECT_EQ(t.shape(), (Shape{1, 3}));
  EXPECT_EQ(t.data(), raw_data) << "raw input must not be copied";
  EXPECT_EQ(std::vector<float>(t.values<float>().begin(), t.values<float>().end()),
            (std::vector<float>{1.5f, 2.5f, -3}));
  EXPECT_EQ(r->requested_outputs, std::vector<std::string>{"OUTPUT1"});

  r = Status(Internal("drop"));
  EXPECT_TRUE(weak.expired()) << "dropping the tensors releases the message";
}

TEST(GrpcCodecTest, RawEntriesAreConsumedInInputOrder) {
  auto m = NewRequest();
  AddInput(*m, "A", "INT32", {2});
  AddInput(*m, "B", "INT64", {1});
  AddInput(*m, "C", "BYTES", {2});
  m->add_raw_input_contents(RawBytes<int32_t>({7, 8}));
  m->add_raw_input_contents(RawBytes<int64_t>({-9}));
  m->add_raw_input_contents(BytesElements({"hi", ""}));
  auto r = InferRequestFromProto(m, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->inputs.size(), 3u);
  EXPECT_EQ(r->inputs[0].tensor.values<int32_t>()[1], 8);
  EXPECT_EQ(r->inputs[1].tensor.values<int64_t>()[0], -9);
  auto elements = r->inputs[2].tensor.BytesElements();
  ASSERT_TRUE(elements.ok());
  EXPECT_EQ(*elements, (std::vector<std::string_view>{"hi", ""}));
}

TEST(GrpcCodecTest, ZeroSizeAndHalfPrecisionRawInputs) {
  auto m = NewRequest();
  AddInput(*m, "E", "FP32", {0, 4});
  AddInput(*m, "H", "FP16", {2});
  AddInput(*m, "B", "BF16", {1});
  m->add_raw_input_contents("");
  m->add_raw_input_contents(std::string(4, '\0'));
  m->add_raw_input_contents(std::string(2, '\0'));
  auto r = InferRequestFromProto(m, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].tensor.byte_size(), 0u);
  EXPECT_EQ(r->inputs[1].tensor.dtype(), DataType::kFp16);
}

TEST(GrpcCodecTest, TypedContentsAreCopiedAndNarrowed) {
  auto m = NewRequest();
  auto* i8 = AddInput(*m, "I8", "INT8", {3})->mutable_contents();
  for (int v : {-128, 0, 127}) i8->add_int_contents(v);
  auto* u16 = AddInput(*m, "U16", "UINT16", {2})->mutable_contents();
  for (unsigned v : {0u, 65535u}) u16->add_uint_contents(v);
  auto* b = AddInput(*m, "B", "BOOL", {2})->mutable_contents();
  b->add_bool_contents(true);
  b->add_bool_contents(false);
  auto* f64 = AddInput(*m, "F64", "FP64", {1})->mutable_contents();
  f64->add_fp64_contents(0.25);
  auto* u64 = AddInput(*m, "U64", "UINT64", {1})->mutable_contents();
  u64->add_uint64_contents(UINT64_MAX);
  auto* s = AddInput(*m, "S", "BYTES", {1, 2})->mutable_contents();
  s->add_bytes_contents("abc");
  s->add_bytes_contents(std::string("\0\xff", 2));

  auto r = InferRequestFromProto(m, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->inputs.size(), 6u);
  auto i8v = r->inputs[0].tensor.values<int8_t>();
  EXPECT_EQ(std::vector<int8_t>(i8v.begin(), i8v.end()), (std::vector<int8_t>{-128, 0, 127}));
  EXPECT_EQ(r->inputs[1].tensor.values<uint16_t>()[1], 65535);
  EXPECT_EQ(r->inputs[1].tensor.byte_size(), 4u);
  EXPECT_EQ(r->inputs[2].tensor.values<uint8_t>()[0], 1);
  EXPECT_EQ(r->inputs[2].tensor.values<uint8_t>()[1], 0);
  EXPECT_EQ(r->inputs[3].tensor.values<double>()[0], 0.25);
  EXPECT_EQ(r->inputs[4].tensor.values<uint64_t>()[0], UINT64_MAX);
  EXPECT_EQ(r->inputs[5].tensor.bytes(), BytesElements({"abc", std::string("\0\xff", 2)}));
}

TEST(GrpcCodecTest, TypedContentsErrorsNameTheInput) {
  {
    auto m = NewRequest();
    AddInput(*m, "SMALL", "INT8", {1})->mutable_contents()->add_int_contents(128);
    ExpectInvalid(m, "'SMALL': element 0 (128) is out of range for INT8");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "U8", "UINT8", {1})->mutable_contents()->add_uint_contents(256);
    ExpectInvalid(m, "'U8'");
  }
  {
    auto m = NewRequest();
    auto* c = AddInput(*m, "X", "FP32", {3})->mutable_contents();
    c->add_fp32_contents(1);
    c->add_fp32_contents(2);
    ExpectInvalid(m, "input 'X' has 2 elements in fp32_contents but shape [3] needs 3");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "W", "FP32", {1})->mutable_contents()->add_int_contents(1);
    ExpectInvalid(m, "'W': FP32 contents belong in fp32_contents");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "H", "FP16", {1})->mutable_contents()->add_fp32_contents(1);
    ExpectInvalid(m, "'H': FP16 data can only be sent in raw_input_contents");
  }
  {
    // An empty but present `contents` is a (zero-element) typed source.
    auto m = NewRequest();
    AddInput(*m, "Z", "FP32", {2})->mutable_contents();
    ExpectInvalid(m, "input 'Z' has 0 elements");
  }
}

TEST(GrpcCodecTest, DataSourceErrors) {
  {
    auto m = NewRequest();
    AddInput(*m, "A", "FP32", {1})->mutable_contents()->add_fp32_contents(1);
    AddInput(*m, "B", "FP32", {1});
    m->add_raw_input_contents(RawBytes<float>({2}));
    ExpectInvalid(m, "contents and raw_input_contents cannot be mixed");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "A", "FP32", {1});
    AddInput(*m, "MISSING", "FP32", {1});
    m->add_raw_input_contents(RawBytes<float>({2}));
    ExpectInvalid(m, "unable to find data for input tensor 'MISSING'");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "A", "FP32", {1});
    m->add_raw_input_contents(RawBytes<float>({2}));
    m->add_raw_input_contents(RawBytes<float>({3}));
    ExpectInvalid(m, "raw_input_contents has 2 entries but 1 input(s)");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "SHORT", "FP32", {2, 2});
    m->add_raw_input_contents(RawBytes<float>({1, 2, 3}));
    ExpectInvalid(m,
                  "input 'SHORT' has 12 bytes in raw_input_contents but shape [2,2] of FP32 "
                  "needs 16");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "STR", "BYTES", {2});
    m->add_raw_input_contents(BytesElements({"only one"}));
    ExpectInvalid(m, "input 'STR'");
  }
  {
    auto m = NewRequest();
    std::string bad = BytesElements({"x"});
    bad[0] = 100;  // claims 100 bytes
    AddInput(*m, "STR", "BYTES", {1});
    m->add_raw_input_contents(bad);
    ExpectInvalid(m, "input 'STR'");
  }
}

TEST(GrpcCodecTest, ShapesAreCheckedBeforeAnythingIsAllocated) {
  {
    auto m = NewRequest();
    AddInput(*m, "NEG", "FP32", {2, -1});
    m->add_raw_input_contents("");
    ExpectInvalid(m, "input 'NEG': dimension 1 is negative");
  }
  {
    // 2^62 elements: must fail on the limit, not try to allocate or overflow.
    auto m = NewRequest();
    AddInput(*m, "HUGE", "FP32", {int64_t{1} << 31, int64_t{1} << 31});
    m->add_raw_input_contents("");
    ExpectInvalid(m, "input 'HUGE'");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "HUGE", "FP64", {INT64_MAX, INT64_MAX})->mutable_contents();
    ExpectInvalid(m, "input 'HUGE'");
  }
  {
    runtime::RequestLimits limits;
    limits.max_elements_per_tensor = 4;
    auto m = NewRequest();
    AddInput(*m, "FIVE", "FP32", {5});
    m->add_raw_input_contents(RawBytes<float>({1, 2, 3, 4, 5}));
    ExpectInvalid(m, "input 'FIVE'", limits);
  }
  {
    runtime::RequestLimits limits;
    limits.max_inputs = 1;
    auto m = NewRequest();
    AddInput(*m, "A", "FP32", {0});
    AddInput(*m, "B", "FP32", {0});
    m->add_raw_input_contents("");
    m->add_raw_input_contents("");
    ExpectInvalid(m, "request has 2 inputs; the limit is 1", limits);
  }
}

TEST(GrpcCodecTest, MalformedRequests) {
  {
    auto m = NewRequest("");
    ExpectInvalid(m, "model_name is empty");
  }
  {
    auto m = NewRequest();
    m->set_model_version("latest");
    ExpectInvalid(m, "model version must be decimal digits");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "T", "FLOAT", {1});
    m->add_raw_input_contents("abcd");
    ExpectInvalid(m, "input 'T' has unknown datatype 'FLOAT'");
  }
  {
    auto m = NewRequest();
    AddInput(*m, "T", "FP32", {1});
    AddInput(*m, "T", "FP32", {1});
    m->add_raw_input_contents("abcd");
    m->add_raw_input_contents("abcd");
    ExpectInvalid(m, "input 'T' appears twice");
  }
  {
    auto m = NewRequest();
    m->add_outputs()->set_name("O");
    m->add_outputs()->set_name("O");
    ExpectInvalid(m, "output 'O' is requested twice");
  }
  {
    auto m = NewRequest();
    auto* in = AddInput(*m, "SHM", "FP32", {1});
    (*in->mutable_parameters())["shared_memory_region"].set_string_param("r");
    ExpectInvalid(m, "input 'SHM': shared_memory_region needs shared_memory_byte_size");
    (*in->mutable_parameters())["shared_memory_byte_size"].set_int64_param(4);
    ExpectInvalid(m, "input 'SHM': shared memory is not available here");
  }
  {
    auto m = NewRequest();
    auto* out = m->add_outputs();
    out->set_name("CLS");
    (*out->mutable_parameters())["classification"].set_int64_param(0);
    ExpectInvalid(m, "output 'CLS': parameter 'classification' must be a positive integer");
  }
}

TEST(GrpcCodecTest, SharedMemoryInputsOutputsAndClassification) {
  const std::string key = "/shoal_grpc_codec_test_" + std::to_string(::getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  auto* shm = static_cast<char*>(mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  const int32_t in[2] = {5, 6};
  std::memcpy(shm + 8, in, 8);
  SharedMemoryManager manager;
  ASSERT_TRUE(manager.Register("region", key, 0, 64).ok());

  auto m = NewRequest();
  auto& ip = *AddInput(*m, "X", "INT32", {2})->mutable_parameters();
  ip["shared_memory_region"].set_string_param("region");
  ip["shared_memory_byte_size"].set_int64_param(8);
  ip["shared_memory_offset"].set_uint64_param(8);
  auto* out = m->add_outputs();
  out->set_name("Y");
  auto& op = *out->mutable_parameters();
  op["shared_memory_region"].set_string_param("region");
  op["shared_memory_byte_size"].set_int64_param(16);
  op["shared_memory_offset"].set_int64_param(32);
  auto* cls = m->add_outputs();
  cls->set_name("Z");
  (*cls->mutable_parameters())["classification"].set_int64_param(2);
  SharedMemoryOutputs outputs;
  auto r = InferRequestFromProto(m, {}, &manager, &outputs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->inputs.size(), 1u);
  EXPECT_EQ(r->inputs[0].tensor.values<int32_t>()[1], 6);
  const int32_t changed = 9;
  std::memcpy(shm + 8, &changed, 4);
  EXPECT_EQ(r->inputs[0].tensor.values<int32_t>()[0], 9) << "a view, not a copy";
  EXPECT_EQ(r->classification, (std::map<std::string, int64_t>{{"Z", 2}}));
  ASSERT_EQ(outputs.count("Y"), 1u);

  runtime::InferResponse answer;
  answer.model_name = "m";
  answer.outputs.push_back({"Y", Tensor::FromVector<int32_t>(DataType::kInt32, {2}, {11, 12})});
  inference::ModelInferResponse proto;
  ASSERT_TRUE(InferResponseToProto(answer, outputs, &proto).ok());
  int32_t written[2];
  std::memcpy(written, shm + 32, 8);
  EXPECT_EQ(written[0], 11);
  EXPECT_EQ(written[1], 12);
  ASSERT_EQ(proto.raw_output_contents_size(), 1);
  EXPECT_TRUE(proto.raw_output_contents(0).empty());
  EXPECT_EQ(proto.outputs(0).parameters().at("shared_memory_region").string_param(), "region");
  EXPECT_EQ(proto.outputs(0).parameters().at("shared_memory_byte_size").int64_param(), 8);

  // Out of the region's bounds: refused before the request runs.
  op["shared_memory_offset"].set_int64_param(60);
  SharedMemoryOutputs none;
  auto past = InferRequestFromProto(m, {}, &manager, &none);
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("past the end"), std::string::npos);
  munmap(shm, 64);
  shm_unlink(key.c_str());
}

TEST(GrpcCodecTest, RequestParameters) {
  auto m = NewRequest();
  auto& p = *m->mutable_parameters();
  p["priority"].set_uint64_param(2);
  p["timeout"].set_int64_param(1500);
  p["sequence_id"].set_int64_param(0);
  p["sequence_start"].set_bool_param(false);
  p["triton_enable_empty_final_response"].set_bool_param(true);
  p["binary_data_output"].set_bool_param(true);
  p["flag"].set_bool_param(true);
  p["count"].set_uint64_param(5);
  p["ratio"].set_double_param(0.5);
  p["label"].set_string_param("x");
  auto r = InferRequestFromProto(m, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->priority, 2u);
  EXPECT_EQ(r->timeout_us, 1500u);
  runtime::Parameters want = {
      {"flag", true}, {"count", int64_t{5}}, {"ratio", 0.5}, {"label", std::string("x")}};
  EXPECT_EQ(r->parameters, want) << "reserved keys must not reach the model";

  auto with = [](const std::string& key, auto set) {
    auto m = NewRequest();
    set((*m->mutable_parameters())[key]);
    return m;
  };
  auto m2 = with("priority", [](auto& v) { v.set_int64_param(3); });
  EXPECT_EQ(InferRequestFromProto(m2, {})->priority, 3u) << "Triton accepts int64 priority";
  ExpectInvalid(with("priority", [](auto& v) { v.set_int64_param(-1); }),
                "parameter 'priority' must not be negative");
  ExpectInvalid(with("priority", [](auto& v) { v.set_uint64_param(uint64_t{1} << 32); }),
                "parameter 'priority' is too large");
  ExpectInvalid(with("timeout", [](auto& v) { v.set_string_param("10"); }),
                "parameter 'timeout' must be an unsigned integer");
  ExpectInvalid(with("sequence_end", [](auto& v) { v.set_int64_param(1); }),
                "parameter 'sequence_end' must be bool_param");
  ExpectInvalid(with("sequence_id", [](auto& v) { v.set_bool_param(true); }),
                "parameter 'sequence_id' must be");
  // Sequences are refused, as over HTTP; id 0 / "" / false flags mean "not a sequence".
  ExpectInvalid(with("sequence_id", [](auto& v) { v.set_int64_param(3); }),
                "sequences are not supported");
  ExpectInvalid(with("sequence_id", [](auto& v) { v.set_string_param("s1"); }),
                "sequences are not supported");
  ExpectInvalid(with("sequence_start", [](auto& v) { v.set_bool_param(true); }),
                "sequences are not supported");
  EXPECT_TRUE(
      InferRequestFromProto(with("sequence_id", [](auto& v) { v.set_string_param(""); }), {}).ok());
  ExpectInvalid(with("triton_magic", [](auto& v) { v.set_bool_param(true); }),
                "parameter 'triton_magic' is not supported");
  ExpectInvalid(with("big", [](auto& v) { v.set_uint64_param(UINT64_MAX); }),
                "parameter 'big' is too large");
  ExpectInvalid(with("empty", [](auto&) {}), "parameter 'empty' has no value");
}

TEST(GrpcCodecTest, ResponseHasOneRawEntryPerOutputInOrder) {
  runtime::InferResponse r;
  r.model_name = "m";
  r.model_version = 3;
  r.id = "abc";
  r.outputs.push_back({"B", Tensor::FromVector<int32_t>(DataType::kInt32, {2}, {5, -6})});
  r.outputs.push_back({"A", Tensor::Allocate(DataType::kFp32, {0, 2})});
  r.outputs.push_back({"S", Tensor::FromStrings({1}, {"xyz"})});
  inference::ModelInferResponse out;
  InferResponseToProto(r, &out);
  EXPECT_EQ(out.model_name(), "m");
  EXPECT_EQ(out.model_version(), "3");
  EXPECT_EQ(out.id(), "abc");
  ASSERT_EQ(out.outputs_size(), 3);
  ASSERT_EQ(out.raw_output_contents_size(), 3);
  EXPECT_EQ(out.outputs(0).name(), "B");
  EXPECT_EQ(out.outputs(0).datatype(), "INT32");
  EXPECT_EQ(std::vector<int64_t>(out.outputs(0).shape().begin(), out.outputs(0).shape().end()),
            (std::vector<int64_t>{2}));
  EXPECT_EQ(out.raw_output_contents(0), RawBytes<int32_t>({5, -6}));
  EXPECT_EQ(out.outputs(1).shape_size(), 2);
  EXPECT_EQ(out.raw_output_contents(1), "") << "a zero-size output still has its entry";
  EXPECT_EQ(out.outputs(2).datatype(), "BYTES");
  EXPECT_EQ(out.raw_output_contents(2), BytesElements({"xyz"}));
  EXPECT_FALSE(out.outputs(0).has_contents()) << "typed contents are never filled";
  EXPECT_TRUE(out.parameters().empty());
  r.parameters["precision"] = std::string("int8");
  inference::ModelInferResponse with_tier;
  InferResponseToProto(r, &with_tier);
  ASSERT_EQ(with_tier.parameters().count("precision"), 1u);
  EXPECT_EQ(with_tier.parameters().at("precision").string_param(), "int8");
}

TEST(GrpcCodecTest, StatusesMapThroughTheOneTable) {
  EXPECT_TRUE(ToGrpcStatus(Status::Ok()).ok());
  EXPECT_EQ(ToGrpcStatus(InvalidArgument("x")).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(InvalidArgument("x")).error_message(), "x");
  EXPECT_EQ(ToGrpcStatus(NotFound("x")).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ToGrpcStatus(ResourceExhausted("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(Unavailable("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(DeadlineExceeded("x")).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpcStatus(Cancelled("x")).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(ToGrpcStatus(Internal("x")).error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(ToGrpcStatus(Unimplemented("x")).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(GrpcCodecTest, MetadataShapesStartWithMinusOneWhenTheModelBatches) {
  runtime::ModelSignature sig;
  sig.max_batch_size = 8;
  sig.inputs.push_back({"IN", DataType::kFp32, {-1, 3}});
  sig.outputs.push_back({"OUT", DataType::kBytes, {2}});
  inference::ModelMetadataResponse out;
  ModelMetadataToProto("m", {1, 3}, "identity", sig, &out);
  EXPECT_EQ(out.name(), "m");
  ASSERT_EQ(out.versions_size(), 2);
  EXPECT_EQ(out.versions(1), "3");
  EXPECT_EQ(out.platform(), "identity");
  ASSERT_EQ(out.inputs_size(), 1);
  EXPECT_EQ(out.inputs(0).datatype(), "FP32");
  EXPECT_EQ(std::vector<int64_t>(out.inputs(0).shape().begin(), out.inputs(0).shape().end()),
            (std::vector<int64_t>{-1, -1, 3}));
  EXPECT_EQ(out.outputs(0).datatype(), "BYTES");

  sig.max_batch_size = 0;
  inference::ModelMetadataResponse flat;
  ModelMetadataToProto("m", {1}, "", sig, &flat);
  EXPECT_EQ(flat.outputs(0).shape_size(), 1);
}

TEST(GrpcCodecTest, StatisticsFillEveryPerfAnalyzerField) {
  runtime::ModelStatsSnapshot s;
  s.last_inference_ms = 1234;
  s.inference_count = 10;
  s.execution_count = 4;
  s.success = {10, 1000};
  s.queue = {10, 100};
  s.compute_infer = {10, 500};
  s.batch_stats[4].compute_infer = {2, 300};
  inference::ModelStatistics out;
  ModelStatisticsToProto("m", 2, s, &out);
  EXPECT_EQ(out.name(), "m");
  EXPECT_EQ(out.version(), "2");
  EXPECT_EQ(out.last_inference(), 1234u);
  EXPECT_EQ(out.inference_count(), 10u);
  EXPECT_EQ(out.execution_count(), 4u);
  ASSERT_TRUE(out.has_inference_stats());
  const auto& is = out.inference_stats();
  EXPECT_EQ(is.success().count(), 10u);
  EXPECT_EQ(is.success().ns(), 1000u);
  EXPECT_EQ(is.queue().ns(), 100u);
  EXPECT_EQ(is.compute_infer().ns(), 500u);
  EXPECT_TRUE(is.has_cache_hit() && is.has_cache_miss() && is.has_compute_input() &&
              is.has_compute_output() && is.has_fail());
  ASSERT_EQ(out.batch_stats_size(), 1);
  EXPECT_EQ(out.batch_stats(0).batch_size(), 4u);
  EXPECT_EQ(out.batch_stats(0).compute_infer().count(), 2u);
}

// The names and numbers that go on the wire (spec sections 3.1, 3.2, 3.8). A typo here
// would silently break every client, so they are checked against the spec's tables.
TEST(GrpcCodecTest, WireIdentityMatchesTheSpec) {
  const auto* service = inference::GRPCInferenceService::service_full_name();
  EXPECT_STREQ(service, "inference.GRPCInferenceService");
  EXPECT_STREQ(grpc::health::v1::Health::service_full_name(), "grpc.health.v1.Health");

  auto number = [](const google::protobuf::Descriptor* d, const std::string& field) {
    const auto* f = d->FindFieldByName(field);
    return f == nullptr ? -1 : f->number();
  };
  using namespace inference;  // NOLINT
  const auto* req = ModelInferRequest::descriptor();
  EXPECT_EQ(number(req, "model_name"), 1);
  EXPECT_EQ(number(req, "model_version"), 2);
  EXPECT_EQ(number(req, "id"), 3);
  EXPECT_EQ(number(req, "parameters"), 4);
  EXPECT_EQ(number(req, "inputs"), 5);
  EXPECT_EQ(number(req, "outputs"), 6);
  EXPECT_EQ(number(req, "raw_input_contents"), 7);
  const auto* in = ModelInferRequest::InferInputTensor::descriptor();
  EXPECT_EQ(number(in, "contents"), 5);
  EXPECT_EQ(number(ModelInferRequest::InferRequestedOutputTensor::descriptor(), "parameters"), 2);
  const auto* resp = ModelInferResponse::descriptor();
  EXPECT_EQ(number(resp, "outputs"), 5);
  EXPECT_EQ(number(resp, "raw_output_contents"), 6);
  EXPECT_EQ(number(ModelStreamInferResponse::descriptor(), "error_message"), 1);
  EXPECT_EQ(number(ModelStreamInferResponse::descriptor(), "infer_response"), 2);
  const auto* param = InferParameter::descriptor();
  EXPECT_EQ(number(param, "bool_param"), 1);
  EXPECT_EQ(number(param, "double_param"), 4);
  EXPECT_EQ(number(param, "uint64_param"), 5);
  const auto* contents = InferTensorContents::descriptor();
  EXPECT_EQ(number(contents, "bool_contents"), 1);
  EXPECT_EQ(number(contents, "uint64_contents"), 5);
  EXPECT_EQ(number(contents, "bytes_contents"), 8);
  EXPECT_EQ(number(ModelMetadataResponse::descriptor(), "outputs"), 5);
  EXPECT_EQ(number(ModelMetadataResponse::TensorMetadata::descriptor(), "shape"), 3);
  EXPECT_EQ(number(ServerMetadataResponse::descriptor(), "extensions"), 3);
  EXPECT_EQ(number(ModelConfigResponse::descriptor(), "config"), 1);
  const auto* stats = ModelStatistics::descriptor();
  EXPECT_EQ(number(stats, "inference_stats"), 6);
  EXPECT_EQ(number(stats, "batch_stats"), 7);
  EXPECT_EQ(number(stats, "response_stats"), 9);
  const auto* infer_stats = InferStatistics::descriptor();
  EXPECT_EQ(number(infer_stats, "cache_hit"), 7);
  EXPECT_EQ(number(infer_stats, "cache_miss"), 8);
  EXPECT_EQ(number(InferResponseStatistics::descriptor(), "cancel"), 6);
  EXPECT_EQ(number(InferBatchStatistics::descriptor(), "compute_output"), 4);
  EXPECT_EQ(number(MemoryUsage::descriptor(), "byte_size"), 3);
  EXPECT_EQ(number(RepositoryIndexResponse::ModelIndex::descriptor(), "reason"), 4);
  EXPECT_EQ(number(RepositoryModelLoadRequest::descriptor(), "parameters"), 3);
  EXPECT_EQ(number(ModelRepositoryParameter::descriptor(), "bytes_param"), 4);
  EXPECT_EQ(number(CudaSharedMemoryRegisterRequest::descriptor(), "byte_size"), 4);

  const auto* sd = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      "inference.GRPCInferenceService");
  ASSERT_NE(sd, nullptr);
  for (const char* rpc :
       {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
        "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex",
        "RepositoryModelLoad", "RepositoryModelUnload"}) {
    EXPECT_NE(sd->FindMethodByName(rpc), nullptr) << rpc;
  }
  const auto* stream = sd->FindMethodByName("ModelStreamInfer");
  EXPECT_TRUE(stream->client_streaming() && stream->server_streaming());
}

}  // namespace
}  // namespace shoal::server
