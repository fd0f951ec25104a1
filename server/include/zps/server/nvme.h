// zps/server/nvme.h — the NVMe tier's building blocks: an owned fd, preallocated O_DIRECT spill
// files, a pool of aligned I/O buffers, and an asynchronous I/O engine (io_uring) behind a small
// interface so tests can inject faults.
//
// Errors from the kernel (errno values, or negative io_uring completion results) become a Status
// in exactly one function, IoStatus(): ENOSPC/EDQUOT -> ResourceExhausted, everything else ->
// IoError, each message naming the operation, file and offset.
//
// Thread-safety: every class here is used by one thread at a time (ChunkStore serialises its
// calls); none is internally synchronised unless its comment says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/scoped_fd.h"
#include "zps/common/status.h"

namespace zps::server {

// Kernel errors become Status through zps::ErrnoError (common/status.h), descriptors are owned
// by zps::ScopedFd (common/scoped_fd.h).

/// Alignment of every O_DIRECT buffer, offset and length (covers 512- and 4096-byte sectors).
inline constexpr size_t kDirectAlign = 4096;
inline constexpr uint64_t AlignUp(uint64_t n, uint64_t a = kDirectAlign) {
  return (n + a - 1) / a * a;
}

struct SpillFileOptions {
  bool direct = true;                    // Default: true (O_DIRECT).
  bool allow_buffered_fallback = false;  // Default: false. When the filesystem refuses O_DIRECT
                                         // (EINVAL at open, e.g. an old tmpfs): true = open
                                         // buffered and log a warning; false = FailedPrecondition.
  bool remove_on_close = true;           // Default: true. Unlink the file when closed.
};

/// A preallocated file for spilled chunk records, created fresh (truncated) and fully allocated
/// with fallocate so a full disk is found at creation, not in the middle of a pass.
class SpillFile {
 public:
  /// Creates `dir`/`name` of `bytes` bytes. Errors: NotFound when `dir` does not exist;
  /// FailedPrecondition when O_DIRECT is refused and no fallback is allowed (the message says
  /// so and names the option); ResourceExhausted when fallocate finds no space (ENOSPC);
  /// IoError for any other open/fallocate failure. A failed Create leaves no file behind.
  static Result<std::unique_ptr<SpillFile>> Create(const std::string& dir, const std::string& name,
                                                   uint64_t bytes, const SpillFileOptions& options);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  /// False when the buffered fallback was taken.
  bool direct() const { return direct_; }

 private:
  SpillFile() = default;
  ScopedFd fd_;
  std::string path_;
  uint64_t size_ = 0;
  bool direct_ = true;
  bool remove_on_close_ = true;
};

/// `count` buffers of `buffer_bytes` each (rounded up to kDirectAlign), carved from one
/// 2 MiB-aligned allocation (madvised for huge pages). Buffers are addressed by index.
class AlignedBufferPool {
 public:
  /// Errors: InvalidArgument for count == 0 or buffer_bytes == 0; ResourceExhausted when the
  /// allocation fails.
  static Result<std::unique_ptr<AlignedBufferPool>> Create(size_t count, size_t buffer_bytes);
  ~AlignedBufferPool();
  AlignedBufferPool(const AlignedBufferPool&) = delete;
  AlignedBufferPool& operator=(const AlignedBufferPool&) = delete;

  size_t count() const { return count_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t total_bytes() const { return count_ * buffer_bytes_; }
  std::byte* buffer(size_t i) const { return base_ + i * buffer_bytes_; }
  /// The whole pool as one region (for io_uring buffer registration).
  std::span<std::byte> region() const { return {base_, total_bytes()}; }

 private:
  AlignedBufferPool() = default;
  std::byte* base_ = nullptr;
  size_t count_ = 0;
  size_t buffer_bytes_ = 0;
};

/// One read or write of `len` bytes at `offset` of `fd`, from/to `buf`.
struct IoRequest {
  enum class Op : uint8_t { kRead = 0, kWrite = 1 };
  Op op = Op::kRead;
  int fd = -1;
  std::byte* buf = nullptr;
  uint32_t len = 0;
  uint64_t offset = 0;
  uint64_t tag = 0;  // returned in the completion
};

/// A finished request: `res` is the byte count, or a negative errno.
struct IoCompletion {
  uint64_t tag = 0;
  int32_t res = 0;
};

/// An asynchronous I/O engine: submit requests, then reap completions (in any order).
/// Implementations: the io_uring engine (CreateUringEngine) and test wrappers that inject faults.
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  /// The most requests in flight at once.
  virtual uint32_t depth() const = 0;
  /// Queues a request; it is handed to the kernel at the next Flush() or Wait().
  /// Errors: FailedPrecondition when depth() requests are already in flight (a caller bug).
  virtual Status Push(const IoRequest& req) = 0;
  /// Hands queued requests to the kernel. Errors: IoError when submission fails.
  virtual Status Flush() = 0;
  /// Flushes, then blocks until at least one completion is available and returns it.
  /// Errors: FailedPrecondition when nothing is in flight; IoError when waiting fails.
  /// A failed *request* is not an error here: it comes back as a completion with res < 0.
  virtual Result<IoCompletion> Wait() = 0;
  virtual uint32_t in_flight() const = 0;
};

struct UringOptions {
  uint32_t depth = 16;  // Default: 16 requests in flight (fio --iodepth=16).
  bool sqpoll = false;  // Default: false. Kernel submission-polling thread.
  /// Optional: buffers to register (each < 1 GiB); requests that lie inside one of them use
  /// READ_FIXED/WRITE_FIXED. Empty: none. Registration pins the memory (RLIMIT_MEMLOCK).
  std::vector<std::span<std::byte>> fixed_buffers;
};

/// Creates an io_uring engine. Errors: IoError (e.g. ENOSYS or EPERM when io_uring is disabled,
/// ENOMEM when the fixed region cannot be pinned), InvalidArgument for depth 0 or > 4096.
Result<std::unique_ptr<IoEngine>> CreateUringEngine(const UringOptions& options);

}  // namespace zps::server
