// The inference requests shoal bench sends over HTTP, without sockets, so they can be
// tested alone: an inference request with binary tensors (Inference-Header-Content-Length;
// docs/open-inference-protocol.md section 2). Responses are read with
// proto::HttpResponseReader (proto/http_message.h).
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

}  // namespace shoal::loadgen
