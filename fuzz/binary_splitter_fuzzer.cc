// libFuzzer target: the binary tensor data extension. The input describes a request
// whose inputs all carry binary_data_size (datatype, shape and claimed size come from
// the fuzzer), followed by the binary region; it goes through SplitBinaryBody,
// SliceBinaryRegion and the binary attachment of ParseInferRequest (sizes that lie,
// truncated regions, malformed BYTES elements, misaligned tensors).
//
// Layout: [n: 1 byte] then n x [dtype: 1][dim: 2][claimed size: 4] then the region.
// Invariants (a violation traps): slices tile the region exactly; an accepted tensor's
// bytes lie inside the body or in its own copy and match its shape.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "proto/http_message.h"
#include "server/http_infer_codec.h"

using namespace shoal;
using namespace shoal::server;

namespace {

constexpr const char* kTypes[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8",  "INT16",
                                  "INT32", "INT64", "FP16",   "FP32",   "FP64",   "BYTES", "BF16"};

uint32_t Load(const uint8_t* p, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t n = data[0] % 8;
  if (size < 1 + n * 7) return 0;
  std::string json = "{\"inputs\":[";
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* d = data + 1 + i * 7;
    const char* type = kTypes[d[0] % 14];
    const uint32_t dim = Load(d + 1, 2);
    const uint32_t claimed = Load(d + 3, 4) % (1 << 16);
    if (i) json += ",";
    json += "{\"name\":\"I" + std::to_string(i) + "\",\"datatype\":\"" + type + "\",\"shape\":[" +
            std::to_string(dim) +
            "],\"parameters\":{\"binary_data_size\":" + std::to_string(claimed) + "}}";
    sizes.push_back(claimed);
  }
  json += "]}";
  const std::string_view region(reinterpret_cast<const char*>(data) + 1 + n * 7, size - 1 - n * 7);

  // The splitter alone.
  auto slices = SliceBinaryRegion(region, sizes);
  if (slices.ok()) {
    size_t pos = 0;
    for (const auto& s : *slices) {
      if (s.data() != region.data() + pos) __builtin_trap();
      pos += s.size();
    }
    if (pos != region.size()) __builtin_trap();
  }

  // The whole body, with an odd JSON length so alignment varies.
  const std::string text = json + std::string(region);
  auto body = proto::BodyBuffer::Create(text.size(), json.size());
  std::memcpy(body->data(), text.data(), text.size());
  body->set_size(text.size());
  const std::string header_length = std::to_string(json.size());
  auto split = SplitBinaryBody(body->view(), std::string_view(header_length));
  if (!split.ok() || split->json.size() != json.size()) __builtin_trap();
  auto parsed = ParseInferRequest(body, std::string_view(header_length), {});
  if (!parsed.ok()) return 0;
  if (!slices.ok()) __builtin_trap();  // the parser accepted what the splitter refused
  for (const auto& in : parsed->request.inputs) {
    const Tensor& t = in.tensor;
    if (t.dtype() == DataType::kBytes) {
      if (!t.BytesElements().ok()) __builtin_trap();
    } else if (t.byte_size() != static_cast<size_t>(t.element_count()) * DataTypeSize(t.dtype())) {
      __builtin_trap();
    }
    const char* p = static_cast<const char*>(t.data());
    const bool in_body = p >= body->data() && p + t.byte_size() <= body->data() + body->size();
    if (!in_body && t.buffer().get() != nullptr && t.buffer()->size() < t.byte_size())
      __builtin_trap();
  }
  return 0;
}
