// The HTTP/1.1 pieces shoal bench needs, without sockets, so they can be tested alone:
// encoding an inference request with binary tensors (Inference-Header-Content-Length;
// docs/open-inference-protocol.md section 2), and an incremental response parser.
//
// The parser handles what inference servers send: a status line, headers and a body
// delimited by Content-Length (no chunked encoding, which is reported as an error). Only
// the status code is kept; the body is skipped unless keep_body is set.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loadgen/input_data.h"

namespace shoal::loadgen {

// "/v2/models/{m}[/versions/{v}]" (+ suffix, e.g. "/infer").
std::string ModelPath(const std::string& model, int64_t version, std::string_view suffix);

// A complete POST request: JSON header asking for binary outputs, then the raw input
// bytes in input order.
std::string EncodeHttpInferRequest(const std::string& host_header, const std::string& path,
                                   const Payload& payload);

class HttpResponseParser {
 public:
  enum class State { kIncomplete, kDone, kError };

  explicit HttpResponseParser(bool keep_body = false) : keep_body_(keep_body) {}

  // Feeds received bytes; returns kDone once a whole response is in. Bytes past the end
  // of the response are ignored (a client sends one request at a time).
  State Feed(std::string_view bytes);
  void Reset();

  int status() const { return status_; }
  bool close_after() const { return close_after_; }  // "Connection: close"
  const std::string& body() const { return body_; }
  const std::string& error() const { return error_; }

 private:
  State ParseHeader(std::string_view header);

  bool keep_body_;
  std::string header_;
  std::string body_;
  bool in_body_ = false;
  int64_t body_left_ = 0;
  int status_ = 0;
  bool close_after_ = false;
  std::string error_;
};

}  // namespace shoal::loadgen
