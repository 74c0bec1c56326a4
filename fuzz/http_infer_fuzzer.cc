// libFuzzer target: one raw HTTP request (head + body) through everything the HTTP front
// end does with bytes before the runtime sees them: head parsing, path splitting,
// chunked transfer decoding, Content-Encoding, the binary-extension split and the JSON
// infer parser; a request that parses is echoed back through the response serializer
// (as an identity model would), in both encodings.
//
// An input that starts with "HTTP/" is read as a server's response instead, through the
// client side's HttpResponseReader, fed in two pieces split where the input's last byte
// says.
//
// Invariants checked (a violation traps): a parsed tensor's byte size matches its shape
// and type; nothing is allocated beyond the limits given to the parser; a serialized
// response reads back through HttpResponseReader with its status and body; a response
// the reader completes has the body its head declared.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "proto/http_message.h"
#include "server/http_infer_codec.h"

using namespace shoal;
using namespace shoal::proto;
using namespace shoal::server;

namespace {

void ReadResponse(std::string_view input) {
  const size_t split = std::min<size_t>(static_cast<uint8_t>(input.back()), input.size());
  HttpResponseReader reader(/*keep_body=*/true, /*max_body_bytes=*/1 << 20);
  reader.Feed(input.substr(0, split));
  if (reader.Feed(input.substr(split)) != HttpResponseReader::State::kDone) return;
  const HttpResponseHead& head = reader.head();
  if (head.status < 200 || head.status > 999) __builtin_trap();
  if (!head.chunked && static_cast<int64_t>(reader.body().size()) != head.content_length)
    __builtin_trap();
  if (reader.body().size() > (1 << 20)) __builtin_trap();
  (void)reader.Next();
}

// The response as a server sends it, read back as a client reads it.
void CheckRoundTrip(const HttpResponse& response, bool keep_alive) {
  std::string wire = SerializeResponseHead(response, keep_alive, 1) + response.body;
  for (const BodyChunk& c : response.tail) wire.append(c.bytes);
  HttpResponseReader reader;
  if (reader.Feed(wire) != HttpResponseReader::State::kDone) __builtin_trap();
  if (reader.status() != response.status || reader.head().keep_alive != keep_alive)
    __builtin_trap();
  if (reader.body().size() != response.content_length()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.substr(0, 5) == "HTTP/") {
    ReadResponse(input);
    return 0;
  }
  const size_t end = input.find("\r\n\r\n");
  if (end == std::string_view::npos || end > (16 << 10)) return 0;
  HttpRequestHead head;
  if (!ParseRequestHead(input.substr(0, end + 4), &head).ok()) return 0;
  (void)SplitPath(head.path);

  std::string_view raw_body = input.substr(end + 4);
  std::string dechunked;
  if (head.chunked) {
    ChunkedDecoder decoder(1 << 20, 4096);
    auto b = BodyBuffer::Create(0);
    size_t consumed = 0;
    HttpError error;
    if (decoder.Feed(raw_body, &consumed, b.get(), &error) != ChunkedDecoder::Result::kDone)
      return 0;
    if (consumed > raw_body.size() || b->size() > (1 << 20)) __builtin_trap();
    dechunked.assign(b->view());
    raw_body = dechunked;
  }
  const std::string* header_length = head.Find("inference-header-content-length");
  size_t align_at = 0;
  if (header_length != nullptr && ParseDecimal(*header_length) > 0)
    align_at = static_cast<size_t>(ParseDecimal(*header_length));
  auto body = BodyBuffer::Create(raw_body.size(), align_at);
  if (!raw_body.empty()) std::memcpy(body->data(), raw_body.data(), raw_body.size());
  body->set_size(raw_body.size());
  if (const std::string* encoding = head.Find("content-encoding")) {
    auto decoded = DecodeContentEncoding(*encoding, body, 1 << 20, align_at);
    if (!decoded.ok()) return 0;
    if ((*decoded)->size() > (1 << 20)) __builtin_trap();
    body = *decoded;
  }
  runtime::RequestLimits limits;
  limits.max_elements_per_tensor = 1 << 20;
  limits.max_inputs = 16;
  std::optional<std::string_view> hl;
  if (header_length != nullptr) hl = *header_length;
  auto parsed = ParseInferRequest(body, hl, limits);
  if (!parsed.ok()) return 0;

  runtime::InferResponse response;
  response.model_name = "fuzz";
  response.id = parsed->request.id;
  if (parsed->request.inputs.size() > static_cast<size_t>(limits.max_inputs)) __builtin_trap();
  for (const auto& in : parsed->request.inputs) {
    const Tensor& t = in.tensor;
    const int64_t n = t.element_count();
    if (n < 0 || n > limits.max_elements_per_tensor) __builtin_trap();
    if (t.dtype() == DataType::kBytes) {
      if (!t.BytesElements().ok()) __builtin_trap();
    } else if (t.byte_size() != static_cast<size_t>(n) * DataTypeSize(t.dtype())) {
      __builtin_trap();
    }
    response.outputs.push_back(in);
  }
  OutputEncoding json_out;
  (void)SerializeInferResponse(response, json_out);
  OutputEncoding binary_out;
  binary_out.default_binary = true;
  auto http = SerializeInferResponse(response, binary_out);
  if (http.ok()) CheckRoundTrip(*http, head.keep_alive);
  (void)SerializeInferResponse(response, parsed->encoding);
  return 0;
}
