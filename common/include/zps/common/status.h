// zps/common/status.h — the one error type of the project.
//
// `Status` is an error code plus a human-readable message; `Result<T>` is either a value or a
// non-OK Status. Both are [[nodiscard]]: an ignored error is a compile warning (an error in CI).
// Propagate with ZPS_RETURN_IF_ERROR(expr) and ZPS_ASSIGN_OR_RETURN(lhs, expr).
//
// Thread-safety: values; copying and reading from several threads is safe, as for any value type.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace zps {

/// Error codes. Stable numeric values: they travel on the wire in typed error replies.
enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,     ///< a caller or peer sent something malformed or out of range
  kNotFound = 2,            ///< an id, key or file that does not exist
  kAlreadyExists = 3,       ///< e.g. a duplicate push from the same rank
  kFailedPrecondition = 4,  ///< the call is valid but not in the current state (stale step, ...)
  kOutOfRange = 5,          ///< an index or byte range past its bound
  kUnauthenticated = 6,     ///< a missing or wrong token
  kDeadlineExceeded = 7,    ///< a wait ran past its deadline
  kUnavailable = 8,         ///< a peer is gone or not reachable; retry may help
  kDataLoss = 9,            ///< a checksum mismatch or corrupt stored data
  kResourceExhausted = 10,  ///< memory or disk budget exceeded
  kIoError = 11,            ///< an operating-system I/O call failed
  kUnimplemented = 12,
  kInternal = 13,   ///< a broken invariant inside zps
  kCancelled = 14,  ///< the operation was stopped by shutdown
};

/// Name of a code, e.g. "INVALID_ARGUMENT".
std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "CODE: message", or "OK".
  std::string ToString() const;
  /// Returns a copy whose message is "context: message". OK stays OK.
  Status WithContext(std::string_view context) const;

  /// Explicitly ignore a status (for best-effort cleanup paths).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Constructors for each code, so call sites read as the decision they make.
Status InvalidArgument(std::string msg);
Status NotFound(std::string msg);
Status AlreadyExists(std::string msg);
Status FailedPrecondition(std::string msg);
Status OutOfRange(std::string msg);
Status Unauthenticated(std::string msg);
Status DeadlineExceeded(std::string msg);
Status Unavailable(std::string msg);
Status DataLoss(std::string msg);
Status ResourceExhausted(std::string msg);
Status IoError(std::string msg);
Status Unimplemented(std::string msg);
Status Internal(std::string msg);
Status Cancelled(std::string msg);
/// The one conversion of an errno value (positive) to a Status: ENOSPC, EDQUOT and EFBIG are
/// ResourceExhausted ("what: disk full (strerror)"); anything else is IoError
/// ("what: strerror").
Status ErrnoError(std::string_view what, int err);
/// The one conversion of a code received from a peer (a reply on either plane, a stored
/// result) to a Status: 0 is OK, a known code keeps its message, an unknown one is Internal
/// naming it (`what` says where it came from, e.g. "error reply").
Status StatusFromCode(uint32_t code, std::string message, std::string_view what = "peer");

/// A value of type T, or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  /// The error; OK when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace zps

#define ZPS_STATUS_CONCAT_INNER_(a, b) a##b
#define ZPS_STATUS_CONCAT_(a, b) ZPS_STATUS_CONCAT_INNER_(a, b)

/// Returns the Status of `expr` from the enclosing function if it is not OK.
#define ZPS_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::zps::Status zps_status_ = (expr);        \
    if (!zps_status_.ok()) return zps_status_; \
  } while (0)

/// Evaluates `rexpr` (a Result<T>); on error returns its Status, else moves the value into `lhs`
/// (which may be a declaration such as `auto x`).
#define ZPS_ASSIGN_OR_RETURN(lhs, rexpr) \
  ZPS_ASSIGN_OR_RETURN_IMPL_(ZPS_STATUS_CONCAT_(zps_result_, __LINE__), lhs, rexpr)
#define ZPS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
