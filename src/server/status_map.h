// The one table that maps shoal's status codes to HTTP and gRPC (design.md: "one code
// enum, mapped to HTTP and gRPC in one table"). Every front end answers errors through
// it, so a code means the same thing on every protocol.
#pragma once

#include <string_view>

#include "core/status.h"

namespace shoal::server {

struct StatusMapping {
  StatusCode code;
  int http_status;  // e.g. 400
  int grpc_code;    // grpc::StatusCode numeric value, e.g. 3 = INVALID_ARGUMENT
  std::string_view http_reason;
};

const StatusMapping& MappingFor(StatusCode code);
inline int HttpStatusFor(StatusCode code) { return MappingFor(code).http_status; }
inline int GrpcCodeFor(StatusCode code) { return MappingFor(code).grpc_code; }

// Seconds a client should wait before retrying a retryable error that carries no hint
// of its own (Retry-After).
inline constexpr int kRetryAfterSeconds = 1;
// The Retry-After value for a retryable status, in whole seconds as HTTP requires: its
// own hint rounded up (at least 1), or kRetryAfterSeconds.
int RetryAfterSeconds(const Status& status);

}  // namespace shoal::server
