#include "loadgen/http_wire.h"

#include <charconv>

#include "server/json_writer.h"

namespace shoal::loadgen {
namespace {

bool EqualsLower(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char c = a[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != lower[i]) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

std::string ModelPath(const std::string& model, int64_t version, std::string_view suffix) {
  std::string path = "/v2/models/" + model;
  if (version >= 0) path += "/versions/" + std::to_string(version);
  path += suffix;
  return path;
}

std::string EncodeHttpInferRequest(const std::string& host_header, const std::string& path,
                                   const Payload& payload) {
  std::string json;
  server::JsonWriter w(&json);
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

  std::string out = "POST " + path + " HTTP/1.1\r\nHost: " + host_header +
                    "\r\nContent-Type: application/octet-stream\r\n"
                    "Inference-Header-Content-Length: " +
                    std::to_string(json.size()) +
                    "\r\nContent-Length: " + std::to_string(json.size() + binary_bytes) +
                    "\r\n\r\n";
  out.reserve(out.size() + json.size() + binary_bytes);
  out += json;
  for (const InputTensor& in : payload) out += in.data;
  return out;
}

void HttpResponseParser::Reset() {
  header_.clear();
  body_.clear();
  in_body_ = false;
  body_left_ = 0;
  status_ = 0;
  close_after_ = false;
  error_.clear();
}

HttpResponseParser::State HttpResponseParser::Feed(std::string_view bytes) {
  if (!in_body_) {
    const size_t old = header_.size();
    header_.append(bytes);
    // Search from a little before the new bytes, in case the terminator straddles reads.
    const size_t end = header_.find("\r\n\r\n", old >= 3 ? old - 3 : 0);
    if (end == std::string::npos) {
      if (header_.size() > 64 * 1024) {
        error_ = "response header above 64 KiB";
        return State::kError;
      }
      return State::kIncomplete;
    }
    if (State s = ParseHeader(std::string_view(header_).substr(0, end + 2));
        s != State::kIncomplete) {
      return s;
    }
    in_body_ = true;
    // The body's first bytes came with the header; header_ stays as it is until Reset.
    bytes = std::string_view(header_).substr(end + 4);
  }
  const auto take = std::min<int64_t>(body_left_, static_cast<int64_t>(bytes.size()));
  if (keep_body_) body_.append(bytes.substr(0, static_cast<size_t>(take)));
  body_left_ -= take;
  return body_left_ == 0 ? State::kDone : State::kIncomplete;
}

HttpResponseParser::State HttpResponseParser::ParseHeader(std::string_view h) {
  // "HTTP/1.1 200 OK\r\n"
  if (h.size() < 12 || h.substr(0, 5) != "HTTP/") {
    error_ = "not an HTTP response";
    return State::kError;
  }
  const size_t sp = h.find(' ');
  if (sp == std::string_view::npos ||
      std::from_chars(h.data() + sp + 1, h.data() + h.size(), status_).ec != std::errc()) {
    error_ = "bad status line";
    return State::kError;
  }
  bool have_length = false;
  size_t pos = h.find("\r\n") + 2;
  while (pos < h.size()) {
    const size_t eol = h.find("\r\n", pos);
    std::string_view line = h.substr(pos, eol - pos);
    pos = eol + 2;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view name = line.substr(0, colon), value = Trim(line.substr(colon + 1));
    if (EqualsLower(name, "content-length")) {
      if (std::from_chars(value.data(), value.data() + value.size(), body_left_).ec !=
              std::errc() ||
          body_left_ < 0) {
        error_ = "bad Content-Length";
        return State::kError;
      }
      have_length = true;
    } else if (EqualsLower(name, "connection")) {
      close_after_ = EqualsLower(value, "close");
    } else if (EqualsLower(name, "transfer-encoding")) {
      error_ = "chunked responses are not supported";
      return State::kError;
    }
  }
  if (!have_length) body_left_ = 0;  // e.g. 204, or a bodiless reply
  return State::kIncomplete;
}

}  // namespace shoal::loadgen
