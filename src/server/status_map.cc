#include "server/status_map.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace shoal::server {
namespace {

// gRPC codes by number: 0 OK, 1 CANCELLED, 3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED,
// 5 NOT_FOUND, 6 ALREADY_EXISTS, 8 RESOURCE_EXHAUSTED, 9 FAILED_PRECONDITION,
// 12 UNIMPLEMENTED, 13 INTERNAL, 14 UNAVAILABLE.
constexpr std::array<StatusMapping, 11> kTable = {{
    {StatusCode::kOk, 200, 0, "OK"},
    {StatusCode::kInvalidArgument, 400, 3, "Bad Request"},
    {StatusCode::kNotFound, 404, 5, "Not Found"},
    {StatusCode::kAlreadyExists, 409, 6, "Conflict"},
    {StatusCode::kFailedPrecondition, 400, 9, "Bad Request"},
    // Overload (queue full, predicted wait past the deadline): 429 over HTTP, and gRPC's
    // UNAVAILABLE, the code gRPC clients (Triton's included) retry.
    {StatusCode::kResourceExhausted, 429, 14, "Too Many Requests"},
    {StatusCode::kUnavailable, 503, 14, "Service Unavailable"},
    {StatusCode::kDeadlineExceeded, 504, 4, "Gateway Timeout"},
    {StatusCode::kCancelled, 499, 1, "Client Closed Request"},
    {StatusCode::kUnimplemented, 501, 12, "Not Implemented"},
    {StatusCode::kInternal, 500, 13, "Internal Server Error"},
}};

}  // namespace

int RetryAfterSeconds(const Status& status) {
  const int64_t ms = status.retry_after_ms();
  if (ms < 0) return kRetryAfterSeconds;
  return static_cast<int>(std::max<int64_t>(1, (ms + 999) / 1000));
}

const StatusMapping& MappingFor(StatusCode code) {
  for (const auto& m : kTable) {
    if (m.code == code) return m;
  }
  return kTable.back();
}

}  // namespace shoal::server
