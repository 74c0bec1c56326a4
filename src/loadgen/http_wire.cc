#include "loadgen/http_wire.h"

#include "proto/http_message.h"
#include "proto/json_writer.h"

namespace shoal::loadgen {

std::string ModelPath(const std::string& model, int64_t version, std::string_view suffix) {
  std::string path = "/v2/models/" + model;
  if (version >= 0) path += "/versions/" + std::to_string(version);
  path += suffix;
  return path;
}

std::string EncodeHttpInferRequest(const std::string& host_header, const std::string& path,
                                   const Payload& payload) {
  std::string json;
  proto::JsonWriter w(&json);
  w.BeginObject().Key("inputs").BeginArray();
  size_t binary_bytes = 0;
  for (const InputTensor& in : payload) {
    w.BeginObject().Member("name", in.name).Key("shape").BeginArray();
    for (int64_t d : in.shape) w.Int(d);
    w.EndArray().Member("datatype", in.datatype);
    w.Key("parameters").BeginObject().MemberUint("binary_data_size", in.data.size()).EndObject();
    w.EndObject();
    binary_bytes += in.data.size();
  }
  w.EndArray();
  w.Key("parameters").BeginObject().MemberBool("binary_data_output", true).EndObject();
  w.EndObject();

  std::string out =
      proto::SerializeRequestHead("POST", path,
                                  {{"Host", host_header},
                                   {"Content-Type", "application/octet-stream"},
                                   {"Inference-Header-Content-Length", std::to_string(json.size())},
                                   {"Content-Length", std::to_string(json.size() + binary_bytes)}});
  out.reserve(out.size() + json.size() + binary_bytes);
  out += json;
  for (const InputTensor& in : payload) out += in.data;
  return out;
}

}  // namespace shoal::loadgen
