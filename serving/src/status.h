// Status and StatusOr: the one error type every layer returns (never throws).
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace serving {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // malformed or inconsistent request -> 400
  kNotFound,          // unknown model, version or route -> 404
  kPayloadTooLarge,   // body over --max-body-bytes -> 413
  kUnavailable,       // not ready, draining, shutting down -> 503
  kDeadlineExceeded,  // request timeout -> 504
  kInternal,          // runtime failure -> 500
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* StatusCodeName(StatusCode code);
// HTTP status for an error code, as served by the KServe v2 REST endpoints.
int HttpStatusFor(StatusCode code);

inline Status InvalidArgument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status NotFound(std::string msg) {
  return Status(StatusCode::kNotFound, std::move(msg));
}
inline Status PayloadTooLarge(std::string msg) {
  return Status(StatusCode::kPayloadTooLarge, std::move(msg));
}
inline Status Unavailable(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status DeadlineExceeded(std::string msg) {
  return Status(StatusCode::kDeadlineExceeded, std::move(msg));
}
inline Status Internal(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// A value or the error that prevented producing it.
template <typename T>
class StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Internal("StatusOr built from an OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }

  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace serving

#define SERVING_CONCAT_INNER(a, b) a##b
#define SERVING_CONCAT(a, b) SERVING_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when it is an error.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::serving::Status _serving_status = (expr);        \
    if (!_serving_status.ok()) return _serving_status; \
  } while (false)

// ASSIGN_OR_RETURN(auto x, StatusOrExpr()): unwraps or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(SERVING_CONCAT(_status_or_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
