// Status and StatusOr<T>: how every fallible function in shoal reports failure.
//
// One code enum for the whole server. The front ends map it to HTTP and gRPC in one
// table (server/status_map), so a code chosen here decides what a client sees:
//   kInvalidArgument   -> 400 / INVALID_ARGUMENT   malformed or inconsistent input
//   kNotFound          -> 404 / NOT_FOUND          unknown model, version or route
//   kResourceExhausted -> 429 / UNAVAILABLE        overload: queue full, predicted wait
//                                                  past the deadline; retryable
//   kUnavailable       -> 503 / UNAVAILABLE        not ready, shutting down, queue
//                                                  timeout; retryable
//   kDeadlineExceeded  -> 504 / DEADLINE_EXCEEDED  the request's own deadline passed
//   kCancelled         -> 499 / CANCELLED          the client went away
//   kInternal          -> 500 / INTERNAL           backend failure, broken invariant
// Functions that return Status are [[nodiscard]]: an ignored error is a bug.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace shoal {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kFailedPrecondition,
  kResourceExhausted,
  kUnavailable,
  kDeadlineExceeded,
  kCancelled,
  kUnimplemented,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  const std::string& message() const;
  // True for codes a client may simply retry later (queue full, not ready yet).
  bool retryable() const {
    return code() == StatusCode::kResourceExhausted || code() == StatusCode::kUnavailable;
  }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "prefix: message"; OK stays OK. Keeps the retry hint.
  Status WithPrefix(std::string_view prefix) const;
  // A retryable error may say when a retry is likely to succeed (an overloaded model's
  // predicted drain time): milliseconds from now, or -1 when it does not say.
  int64_t retry_after_ms() const { return rep_ ? rep_->retry_after_ms : -1; }
  // Returns a copy carrying the hint (clamped to >= 0); OK stays OK.
  Status WithRetryAfterMs(int64_t ms) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
    int64_t retry_after_ms = -1;
  };
  // Null when OK, so an OK status costs one pointer and no allocation.
  std::shared_ptr<const Rep> rep_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

namespace internal_status {
// Prints "StatusOr value accessed on an error: CODE: message" to stderr and aborts.
[[noreturn]] void DieOfBadValueAccess(const Status& status);
}  // namespace internal_status

// Holds either a T or a non-OK Status. Reading the value of an error aborts (see value()).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Internal("StatusOr constructed from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // The value. On an error these print the status to stderr and abort: reading a
  // value that is not there is a bug in the caller, never something to carry on from.
  T& value() & { return CheckedValue(); }
  const T& value() const& { return CheckedValue(); }
  T&& value() && { return std::move(CheckedValue()); }
  T& operator*() & { return CheckedValue(); }
  const T& operator*() const& { return CheckedValue(); }
  T&& operator*() && { return std::move(CheckedValue()); }
  T* operator->() { return &CheckedValue(); }
  const T* operator->() const { return &CheckedValue(); }

 private:
  T& CheckedValue() {
    if (!value_.has_value()) internal_status::DieOfBadValueAccess(status_);
    return *value_;
  }
  const T& CheckedValue() const {
    if (!value_.has_value()) internal_status::DieOfBadValueAccess(status_);
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace shoal

#define SHOAL_CONCAT_INNER(a, b) a##b
#define SHOAL_CONCAT(a, b) SHOAL_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::shoal::Status shoal_status_ = (expr);        \
    if (!shoal_status_.ok()) return shoal_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(SHOAL_CONCAT(shoal_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
