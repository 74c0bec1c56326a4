// libFuzzer target: the gRPC request codec (server/grpc_codec.h). The input is a
// serialized inference.ModelInferRequest, as gRPC hands it to the server; it goes through
// InferRequestFromProto (typed contents and raw_input_contents, shapes against limits and
// data sizes, parameters, requested outputs), and a request that decodes is echoed back
// through InferResponseToProto, as an identity model would answer it.
//
// Invariants (a violation traps): a decoded tensor's byte size matches its shape and type,
// its BYTES elements parse, its element count is within the limits, and its bytes lie in
// the message's raw_input_contents or in its own buffer; the echo has one output and one
// raw_output_contents entry per input, each with the input's bytes.
//
//   cmake --build build-fuzz --target grpc_infer_fuzzer
//   build-fuzz/fuzz/grpc_infer_fuzzer fuzz/grpc_corpus/infer -max_len=65536
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "server/grpc_codec.h"

using namespace shoal;

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Invalid UTF-8 in string fields is logged by protobuf for every such input.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto message = std::make_shared<inference::ModelInferRequest>();
  if (!message->ParseFromArray(data, static_cast<int>(size))) return 0;
  runtime::RequestLimits limits;
  limits.max_elements_per_tensor = 1 << 20;
  limits.max_inputs = 16;
  auto request = server::InferRequestFromProto(message, limits);
  if (!request.ok()) return 0;
  if (static_cast<int64_t>(request->inputs.size()) > limits.max_inputs) __builtin_trap();
  runtime::InferResponse response;
  response.model_name = request->model_name;
  response.model_version = request->model_version < 0 ? 1 : request->model_version;
  response.id = request->id;
  for (const auto& in : request->inputs) {
    const Tensor& t = in.tensor;
    if (t.element_count() > limits.max_elements_per_tensor) __builtin_trap();
    if (t.dtype() == DataType::kBytes) {
      if (!t.BytesElements().ok()) __builtin_trap();
    } else if (t.byte_size() != static_cast<size_t>(t.element_count()) * DataTypeSize(t.dtype())) {
      __builtin_trap();
    }
    if (t.byte_size() > 0) {
      const char* p = static_cast<const char*>(t.data());
      bool in_raw = false;
      for (const std::string& raw : message->raw_input_contents()) {
        if (p >= raw.data() && p + t.byte_size() <= raw.data() + raw.size()) in_raw = true;
      }
      if (!in_raw &&
          (t.buffer() == nullptr || !t.buffer()->owns_data() || t.buffer()->size() < t.byte_size()))
        __builtin_trap();
    }
    response.outputs.push_back(in);
  }
  inference::ModelInferResponse out;
  server::InferResponseToProto(response, &out);
  if (out.outputs_size() != static_cast<int>(response.outputs.size()) ||
      out.raw_output_contents_size() != out.outputs_size())
    __builtin_trap();
  for (int i = 0; i < out.outputs_size(); ++i) {
    const Tensor& t = response.outputs[static_cast<size_t>(i)].tensor;
    const std::string& raw = out.raw_output_contents(i);
    if (raw.size() != t.byte_size()) __builtin_trap();
    if (!raw.empty() && std::memcmp(raw.data(), t.data(), raw.size()) != 0) __builtin_trap();
  }
  return 0;
}
