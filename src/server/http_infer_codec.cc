// Binary framing, compression and response serialization of the HTTP infer codec
// (the JSON request parser is in http_infer_parser.cc).
#include "server/http_infer_codec.h"

#include <zlib.h>

#include <cstring>
#include <type_traits>
#include <variant>

#include "proto/json_writer.h"
#include "proto/tensor_json.h"

namespace shoal::server {

bool OutputEncoding::Binary(std::string_view output) const {
  for (const auto& [name, flag] : requested) {
    if (name == output) return flag.value_or(default_binary);
  }
  return default_binary;
}

StatusOr<BinarySplit> SplitBinaryBody(std::string_view body,
                                      std::optional<std::string_view> header_length) {
  if (!header_length) return BinarySplit{body, {}};
  const int64_t n = proto::ParseDecimal(*header_length);
  if (n < 0 || n > INT32_MAX) {
    return InvalidArgument("Inference-Header-Content-Length: '" +
                           std::string(header_length->substr(0, 32)) +
                           "' is not a non-negative 32-bit integer");
  }
  if (n == 0) {
    return InvalidArgument(
        "Inference-Header-Content-Length: 0 (a raw binary request without JSON) is not supported");
  }
  if (static_cast<uint64_t>(n) > body.size()) {
    return InvalidArgument("Inference-Header-Content-Length: " + std::to_string(n) +
                           " is more than the " + std::to_string(body.size()) + "-byte body");
  }
  return BinarySplit{body.substr(0, static_cast<size_t>(n)), body.substr(static_cast<size_t>(n))};
}

StatusOr<std::vector<std::string_view>> SliceBinaryRegion(std::string_view binary,
                                                          const std::vector<uint64_t>& sizes) {
  std::vector<std::string_view> out;
  out.reserve(sizes.size());
  size_t pos = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > binary.size() - pos) {
      return InvalidArgument("binary data is truncated: binary tensor " + std::to_string(i) +
                             " needs " + std::to_string(sizes[i]) + " bytes but only " +
                             std::to_string(binary.size() - pos) + " remain after the JSON header");
    }
    out.push_back(binary.substr(pos, static_cast<size_t>(sizes[i])));
    pos += static_cast<size_t>(sizes[i]);
  }
  if (pos != binary.size()) {
    return InvalidArgument("binary data has " + std::to_string(binary.size() - pos) +
                           " bytes beyond the binary_data_size of the inputs");
  }
  return out;
}

StatusOr<std::shared_ptr<proto::BodyBuffer>> DecodeContentEncoding(
    std::string_view encoding, std::shared_ptr<proto::BodyBuffer> body, int64_t max_bytes,
    size_t align_at) {
  int window_bits;
  if (encoding.empty() || proto::EqualsIgnoreCase(encoding, "identity")) return body;
  if (proto::EqualsIgnoreCase(encoding, "gzip") || proto::EqualsIgnoreCase(encoding, "x-gzip")) {
    window_bits = 15 + 16;
  } else if (proto::EqualsIgnoreCase(encoding, "deflate")) {
    window_bits = 15;  // a zlib stream, as HTTP's "deflate" means
  } else {
    return InvalidArgument("Content-Encoding '" + std::string(encoding.substr(0, 64)) +
                           "' is not supported; use gzip, deflate or identity");
  }
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  if (inflateInit2(&zs, window_bits) != Z_OK) return Internal("zlib: inflateInit2 failed");
  struct Guard {
    z_stream* zs;
    ~Guard() { inflateEnd(zs); }
  } guard{&zs};

  const std::string_view in = body->view();
  const size_t limit = static_cast<size_t>(std::max<int64_t>(max_bytes, 0));
  size_t capacity = std::min(limit, std::max<size_t>(in.size() * 4, 4096));
  auto out = proto::BodyBuffer::Create(capacity, align_at);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = 0;
  size_t in_pos = 0, out_size = 0;
  while (true) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      const size_t n = std::min<size_t>(in.size() - in_pos, 1u << 30);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + in_pos));
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    if (out_size == capacity) {
      if (capacity >= limit) {
        return ResourceExhausted("the decompressed request body is larger than the limit of " +
                                 std::to_string(limit) + " bytes");
      }
      capacity = std::min(limit, capacity * 2);
      out->set_size(out_size);
      out->Reserve(capacity);
    }
    const size_t room = std::min<size_t>(capacity - out_size, 1u << 30);
    zs.next_out = reinterpret_cast<Bytef*>(out->data() + out_size);
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out_size += room - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (zs.avail_in != 0 || in_pos != in.size()) {
        return InvalidArgument("Content-Encoding " + std::string(encoding) +
                               ": data after the end of the stream");
      }
      break;
    }
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_pos == in.size() && zs.avail_out != 0) {
      return InvalidArgument("Content-Encoding " + std::string(encoding) +
                             ": the compressed body is truncated");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return InvalidArgument("Content-Encoding " + std::string(encoding) +
                             ": corrupt compressed body (" +
                             std::string(zs.msg ? zs.msg : "zlib error") + ")");
    }
  }
  out->set_size(out_size);
  return out;
}

namespace {

// Writes the output's elements as a flat JSON array.
Status AppendJsonData(const NamedTensor& output, std::string* out) {
  const Status s = proto::AppendTensorJsonData(output.tensor, out);
  if (s.ok()) return s;
  std::string message = "output '" + output.name + "' " + s.message();
  if (s.code() == StatusCode::kInvalidArgument)
    message += "; request it with \"binary_data\": true";
  return Status(s.code(), std::move(message));
}

}  // namespace

Status ResolveSharedMemory(const SharedMemoryManager& manager, ParsedInfer* parsed) {
  for (const auto& [index, ref] : parsed->shared_memory_inputs) {
    NamedTensor& in = parsed->request.inputs[index];
    const std::string field = "inputs[" + std::to_string(index) + "] ('" + in.name + "')";
    ASSIGN_OR_RETURN(in.tensor,
                     manager.InputTensor(ref, in.tensor.dtype(), in.tensor.shape(), field));
  }
  for (const auto& [name, ref] : parsed->encoding.shared_memory) {
    ASSIGN_OR_RETURN(SharedMemoryView view, manager.View(ref, "output '" + name + "'"));
    parsed->encoding.shared_memory_views[name] = std::move(view);
  }
  return Status::Ok();
}

StatusOr<proto::HttpResponse> SerializeInferResponse(const runtime::InferResponse& response,
                                                     const OutputEncoding& encoding) {
  // The outputs in reply order: the request's order when it named outputs.
  std::vector<const NamedTensor*> outputs;
  if (!encoding.requested.empty()) {
    for (const auto& [name, flag] : encoding.requested) {
      const NamedTensor* found = nullptr;
      for (const auto& o : response.outputs) {
        if (o.name == name) found = &o;
      }
      if (found == nullptr)
        return Internal("the model did not produce requested output '" + name + "'");
      outputs.push_back(found);
    }
  } else {
    for (const auto& o : response.outputs) outputs.push_back(&o);
  }

  proto::HttpResponse http;
  http.status = 200;
  std::string& body = http.body;
  body.reserve(256);
  proto::JsonWriter w(&body);
  w.BeginObject();
  w.Member("model_name", response.model_name);
  w.Member("model_version", std::to_string(response.model_version));
  if (!response.id.empty()) w.Member("id", response.id);
  if (!response.parameters.empty()) {
    w.Key("parameters").BeginObject();
    for (const auto& [key, value] : response.parameters) {
      w.Key(key);
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::string>) {
              w.String(v);
            } else if constexpr (std::is_same_v<V, bool>) {
              w.Bool(v);
            } else if constexpr (std::is_same_v<V, double>) {
              w.Double(v);
            } else {
              w.Int(v);
            }
          },
          value);
    }
    w.EndObject();
  }
  w.Key("outputs").BeginArray();
  bool any_binary_bytes = false;
  for (const NamedTensor* o : outputs) {
    w.BeginObject();
    w.Member("name", o->name);
    w.Member("datatype", DataTypeName(o->tensor.dtype()));
    w.Key("shape").BeginArray();
    for (int64_t d : o->tensor.shape()) w.Int(d);
    w.EndArray();
    if (auto shm = encoding.shared_memory_views.find(o->name);
        shm != encoding.shared_memory_views.end()) {
      RETURN_IF_ERROR(WriteToSharedMemory(shm->second, o->tensor, o->name));
      const SharedMemoryRef& ref = encoding.shared_memory.at(o->name);
      w.Key("parameters").BeginObject();
      w.Member("shared_memory_region", ref.region);
      w.MemberUint("shared_memory_byte_size", o->tensor.byte_size());
      if (ref.offset != 0) w.MemberUint("shared_memory_offset", ref.offset);
      w.EndObject();
    } else if (encoding.Binary(o->name)) {
      const size_t n = o->tensor.byte_size();
      w.Key("parameters").BeginObject().MemberUint("binary_data_size", n).EndObject();
      if (n > 0) {
        http.tail.push_back(proto::BodyChunk{
            std::string_view(static_cast<const char*>(o->tensor.data()), n), o->tensor.buffer()});
        any_binary_bytes = true;
      }
    } else {
      w.Key("data");
      w.Raw("");  // places the separator; the array is appended directly
      RETURN_IF_ERROR(AppendJsonData(*o, &body));
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  if (any_binary_bytes) {
    http.content_type = "application/octet-stream";
    http.headers.emplace_back("Inference-Header-Content-Length", std::to_string(body.size()));
  } else {
    http.content_type = "application/json";
  }
  return http;
}

}  // namespace shoal::server
