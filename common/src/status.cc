#include "zps/common/status.h"

#include <cstring>

namespace zps {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case Code::kOutOfRange:
      return "OUT_OF_RANGE";
    case Code::kUnauthenticated:
      return "UNAUTHENTICATED";
    case Code::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kDataLoss:
      return "DATA_LOSS";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kIoError:
      return "IO_ERROR";
    case Code::kUnimplemented:
      return "UNIMPLEMENTED";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status InvalidArgument(std::string msg) { return {Code::kInvalidArgument, std::move(msg)}; }
Status NotFound(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
Status AlreadyExists(std::string msg) { return {Code::kAlreadyExists, std::move(msg)}; }
Status FailedPrecondition(std::string msg) { return {Code::kFailedPrecondition, std::move(msg)}; }
Status OutOfRange(std::string msg) { return {Code::kOutOfRange, std::move(msg)}; }
Status Unauthenticated(std::string msg) { return {Code::kUnauthenticated, std::move(msg)}; }
Status DeadlineExceeded(std::string msg) { return {Code::kDeadlineExceeded, std::move(msg)}; }
Status Unavailable(std::string msg) { return {Code::kUnavailable, std::move(msg)}; }
Status DataLoss(std::string msg) { return {Code::kDataLoss, std::move(msg)}; }
Status ResourceExhausted(std::string msg) { return {Code::kResourceExhausted, std::move(msg)}; }
Status IoError(std::string msg) { return {Code::kIoError, std::move(msg)}; }
Status Unimplemented(std::string msg) { return {Code::kUnimplemented, std::move(msg)}; }
Status Internal(std::string msg) { return {Code::kInternal, std::move(msg)}; }
Status Cancelled(std::string msg) { return {Code::kCancelled, std::move(msg)}; }

Status StatusFromCode(uint32_t code, std::string message, std::string_view what) {
  if (code == 0) return Status::Ok();
  if (code > static_cast<uint32_t>(Code::kCancelled)) {
    return Internal(std::string(what) + " with unknown error code " + std::to_string(code) + ": " +
                    message);
  }
  return Status(static_cast<Code>(code), std::move(message));
}

Status ErrnoError(std::string_view what, int err) {
  char buf[256];
  const char* text = strerror_r(err, buf, sizeof(buf));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return ResourceExhausted(std::string(what) + ": disk full (" + text + ")");
  }
  return IoError(std::string(what) + ": " + text);
}

}  // namespace zps
