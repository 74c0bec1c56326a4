// PayloadCodec: how the queue worker turns an entry's payload into a runtime request and
// a runtime response into the result it stores. The worker layer may not include the
// front ends (design.md), so it declares this interface and the `shoal` command hands it
// the HTTP front end's codec (src/cli/worker.cc wraps server/http_infer_codec.h): the
// payload is exactly a KServe v2 HTTP infer request body, JSON or JSON + binary tensor
// data, and the result exactly the body an HTTP client would receive.
//
// Threads: Decode runs on the worker's reader thread, Encode on its writer thread; an
// implementation must be safe to call from both at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "runtime/infer_request.h"

namespace shoal::worker {

class PayloadCodec {
 public:
  virtual ~PayloadCodec() = default;

  struct Decoded {
    runtime::InferRequest request;  // model name and version are set by the worker
    // Whatever Encode needs to know about how the request asked for its outputs.
    std::shared_ptr<const void> encoding;
  };
  struct Encoded {
    std::string body;
    // Set when `body` is JSON followed by binary data: the JSON part's length.
    std::optional<int64_t> header_length;
  };

  // INVALID_ARGUMENT naming the field for a malformed payload. `header_length` is the
  // entry's header_length field, if given (the HTTP Inference-Header-Content-Length).
  virtual StatusOr<Decoded> Decode(std::string payload,
                                   std::optional<std::string_view> header_length) const = 0;
  // Only for successful responses; `encoding` is Decoded::encoding of its request.
  virtual StatusOr<Encoded> Encode(const runtime::InferResponse& response,
                                   const std::shared_ptr<const void>& encoding) const = 0;
};

}  // namespace shoal::worker
