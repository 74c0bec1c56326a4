#include "server/status_map.h"

#include <array>

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
    {StatusCode::kResourceExhausted, 429, 8, "Too Many Requests"},
    {StatusCode::kUnavailable, 503, 14, "Service Unavailable"},
    {StatusCode::kDeadlineExceeded, 504, 4, "Gateway Timeout"},
    {StatusCode::kCancelled, 499, 1, "Client Closed Request"},
    {StatusCode::kUnimplemented, 501, 12, "Not Implemented"},
    {StatusCode::kInternal, 500, 13, "Internal Server Error"},
}};

}  // namespace

const StatusMapping& MappingFor(StatusCode code) {
  for (const auto& m : kTable) {
    if (m.code == code) return m;
  }
  return kTable.back();
}

}  // namespace shoal::server
