#include "core/status.h"

#include <cstdio>
#include <cstdlib>

namespace shoal {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string* const kEmpty = new std::string();
  return rep_ ? rep_->message : *kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::WithPrefix(std::string_view prefix) const {
  if (ok()) return *this;
  std::string m(prefix);
  m += ": ";
  m += message();
  Status out(code(), std::move(m));
  return retry_after_ms() >= 0 ? out.WithRetryAfterMs(retry_after_ms()) : out;
}

Status Status::WithRetryAfterMs(int64_t ms) const {
  if (ok()) return *this;
  Status out;
  out.rep_ = std::make_shared<const Rep>(Rep{code(), message(), ms < 0 ? 0 : ms});
  return out;
}

namespace internal_status {

void DieOfBadValueAccess(const Status& status) {
  std::fprintf(stderr, "StatusOr value accessed on an error: %s\n", status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal_status

}  // namespace shoal
