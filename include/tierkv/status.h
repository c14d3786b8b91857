// Status and StatusOr<T>: how tierkv reports errors across module and process
// boundaries. Errors are values; a Status that is dropped unread is a compile
// warning ([[nodiscard]]). Immutable values, safe to share between threads.
#ifndef TIERKV_INCLUDE_TIERKV_STATUS_H_
#define TIERKV_INCLUDE_TIERKV_STATUS_H_

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tierkv {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,     // The caller passed something malformed.
  kNotFound,            // The thing asked for does not exist.
  kAlreadyExists,       // Creating something that is already there.
  kResourceExhausted,   // Not enough free blocks / slots / bytes right now.
  kFailedPrecondition,  // The system is not in a state that allows this.
  kOutOfRange,          // An index or id past the valid range.
  kPermissionDenied,    // The caller may not do this.
  kUnavailable,         // A peer (daemon, worker) is gone; retrying may help.
  kDataLoss,            // Stored bytes failed verification.
  kUnimplemented,       // Not supported by this build or backend.
  kInternal,            // An invariant broke; a bug in tierkv.
  kDeadlineExceeded,    // A peer did not answer in time (wedged or slow).
  kAborted,  // Cancelled before it took effect, nothing changed (a disk
             // write whose block was removed first; a lookup asked again
             // whose base tierkvd no longer keeps: send it whole).
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) {
    return {StatusCode::kNotFound, std::move(msg)};
  }
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status OutOfRange(std::string msg) {
    return {StatusCode::kOutOfRange, std::move(msg)};
  }
  static Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
  }
  static Status Unavailable(std::string msg) {
    return {StatusCode::kUnavailable, std::move(msg)};
  }
  static Status DataLoss(std::string msg) {
    return {StatusCode::kDataLoss, std::move(msg)};
  }
  static Status Unimplemented(std::string msg) {
    return {StatusCode::kUnimplemented, std::move(msg)};
  }
  static Status Internal(std::string msg) {
    return {StatusCode::kInternal, std::move(msg)};
  }
  static Status DeadlineExceeded(std::string msg) {
    return {StatusCode::kDeadlineExceeded, std::move(msg)};
  }
  static Status Aborted(std::string msg) {
    return {StatusCode::kAborted, std::move(msg)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Holds either a value or a non-OK Status. Accessing the value of an errored
// StatusOr aborts with the status text: that is a bug in the caller.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : rep_(std::move(status)) {  // NOLINT: implicit
    if (std::get<Status>(rep_).ok()) {
      rep_ = Status::Internal("StatusOr constructed from an OK Status");
    }
  }
  StatusOr(T value) : rep_(std::move(value)) {}  // NOLINT: implicit

  bool ok() const { return std::holds_alternative<T>(rep_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(rep_); }

  T& value() & {
    CheckOk();
    return std::get<T>(rep_);
  }
  const T& value() const& {
    CheckOk();
    return std::get<T>(rep_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(rep_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const;

  std::variant<Status, T> rep_;
};

namespace internal {
[[noreturn]] void DieOnBadStatusOrAccess(const Status& status);
}  // namespace internal

template <typename T>
void StatusOr<T>::CheckOk() const {
  if (!ok()) internal::DieOnBadStatusOrAccess(std::get<Status>(rep_));
}

}  // namespace tierkv

#define TIERKV_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::tierkv::Status tierkv_status_ = (expr);        \
    if (!tierkv_status_.ok()) return tierkv_status_; \
  } while (false)

#define TIERKV_CONCAT_INNER_(a, b) a##b
#define TIERKV_CONCAT_(a, b) TIERKV_CONCAT_INNER_(a, b)
#define TIERKV_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
// TIERKV_ASSIGN_OR_RETURN(auto x, MakeX()); returns the error if MakeX fails.
#define TIERKV_ASSIGN_OR_RETURN(lhs, expr) \
  TIERKV_ASSIGN_OR_RETURN_IMPL_(TIERKV_CONCAT_(tierkv_or_, __LINE__), lhs, expr)

#endif  // TIERKV_INCLUDE_TIERKV_STATUS_H_
