// zps/common/scoped_fd.h — the one owner of a file descriptor (files, sockets, epoll, eventfd).
//
// Thread-safety: a value type; one ScopedFd must not be used from two threads at once.
#pragma once

#include <unistd.h>

namespace zps {

/// An owned file descriptor. Move-only; closes on destruction (a close error is ignored there:
/// call Close() where it matters, e.g. after writes that must be durable).
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { Reset(); }
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.Release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Gives up ownership: the caller closes the returned descriptor.
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes now and returns close(2)'s result (0, or -1 with errno set); the descriptor is
  /// released either way. 0 when there was none.
  int Close() {
    if (fd_ < 0) return 0;
    return ::close(Release());
  }

 private:
  void Reset() {
    if (fd_ >= 0) ::close(Release());
  }
  int fd_ = -1;
};

}  // namespace zps
