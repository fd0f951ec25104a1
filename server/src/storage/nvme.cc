// nvme.cc — SpillFile, AlignedBufferPool and the io_uring engine.
#include "zps/server/nvme.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "zps/common/logging.h"

namespace zps::server {

// ---------------------------------------------------------------------------------------------
// SpillFile

Result<std::unique_ptr<SpillFile>> SpillFile::Create(const std::string& dir,
                                                     const std::string& name, uint64_t bytes,
                                                     const SpillFileOptions& options) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return NotFound("spill directory '" + dir + "' does not exist or is not a directory");
  }
  std::unique_ptr<SpillFile> f(new SpillFile());
  f->path_ = dir + "/" + name;
  f->size_ = bytes;
  f->remove_on_close_ = options.remove_on_close;
  const int base_flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  int fd = -1;
  bool buffered = !options.direct;
  if (options.direct) {
    fd = ::open(f->path_.c_str(), base_flags | O_DIRECT, 0600);
    if (fd < 0) {
      const int err = errno;
      if (err != EINVAL) return ErrnoError("open " + f->path_, err);
      ::unlink(f->path_.c_str());  // open may have created it before refusing O_DIRECT
      if (!options.allow_buffered_fallback) {
        return FailedPrecondition("the filesystem of spill directory '" + dir +
                                  "' refuses O_DIRECT; use a directory on a block device, or "
                                  "allow the buffered fallback (spill-buffered-fallback)");
      }
      ZPS_LOG(WARNING) << "spill directory " << dir
                       << " refuses O_DIRECT; using buffered I/O (slower, uses page cache)";
      buffered = true;
    }
  }
  if (buffered) {
    fd = ::open(f->path_.c_str(), base_flags, 0600);
    if (fd < 0) return ErrnoError("open " + f->path_, errno);
    f->direct_ = false;
  }
  f->fd_ = ScopedFd(fd);
  if (bytes > 0) {
    int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      const int err = errno;
      ::unlink(f->path_.c_str());
      f->remove_on_close_ = false;
      return ErrnoError("fallocate " + std::to_string(bytes) + " bytes for " + f->path_, err)
          .WithContext("spill file");
    }
  }
  return f;
}

SpillFile::~SpillFile() {
  if (remove_on_close_ && !path_.empty()) ::unlink(path_.c_str());
}

// ---------------------------------------------------------------------------------------------
// AlignedBufferPool

Result<std::unique_ptr<AlignedBufferPool>> AlignedBufferPool::Create(size_t count,
                                                                     size_t buffer_bytes) {
  if (count == 0 || buffer_bytes == 0) {
    return InvalidArgument("buffer pool needs count > 0 and buffer_bytes > 0");
  }
  constexpr size_t kHuge = 2u << 20;
  std::unique_ptr<AlignedBufferPool> p(new AlignedBufferPool());
  p->count_ = count;
  p->buffer_bytes_ = AlignUp(buffer_bytes);
  const size_t total = AlignUp(p->total_bytes(), kHuge);
  void* mem = std::aligned_alloc(kHuge, total);
  if (mem == nullptr) {
    return ResourceExhausted("cannot allocate an I/O buffer pool of " + std::to_string(total) +
                             " bytes");
  }
  ::madvise(mem, total, MADV_HUGEPAGE);  // a hint only
  std::memset(mem, 0, total);
  p->base_ = static_cast<std::byte*>(mem);
  return p;
}

AlignedBufferPool::~AlignedBufferPool() { std::free(base_); }

// ---------------------------------------------------------------------------------------------
// io_uring engine

namespace {

class UringEngine final : public IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> Create(const UringOptions& o) {
    if (o.depth == 0 || o.depth > 4096) {
      return InvalidArgument("io_uring depth must be in [1, 4096], got " + std::to_string(o.depth));
    }
    std::unique_ptr<UringEngine> e(new UringEngine());
    io_uring_params params{};
    if (o.sqpoll) {
      params.flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = 50;
    }
    int rc = io_uring_queue_init_params(o.depth, &e->ring_, &params);
    if (rc < 0) return ErrnoError("io_uring_queue_init", -rc);
    e->ring_ok_ = true;
    e->depth_ = o.depth;
    if (!o.fixed_buffers.empty()) {
      std::vector<iovec> iov;
      for (auto b : o.fixed_buffers) iov.push_back({b.data(), b.size()});
      rc = io_uring_register_buffers(&e->ring_, iov.data(), static_cast<unsigned>(iov.size()));
      if (rc < 0) return ErrnoError("io_uring_register_buffers", -rc);
      e->fixed_ = o.fixed_buffers;
    }
    return std::unique_ptr<IoEngine>(std::move(e));
  }

  ~UringEngine() override {
    // In-flight requests would write into buffers the owner is about to free: reap them first.
    while (in_flight_ > 0 && ring_ok_) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }

  uint32_t depth() const override { return depth_; }
  uint32_t in_flight() const override { return in_flight_; }

  Status Push(const IoRequest& req) override {
    if (in_flight_ >= depth_) {
      return FailedPrecondition("io_uring: " + std::to_string(depth_) + " requests in flight");
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      ZPS_RETURN_IF_ERROR(Flush());
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return Internal("io_uring: no submission entry after flush");
    }
    const int fixed = FixedIndex(req.buf, req.len);
    const bool read = req.op == IoRequest::Op::kRead;
    if (fixed >= 0 && read) {
      io_uring_prep_read_fixed(sqe, req.fd, req.buf, req.len, req.offset, fixed);
    } else if (fixed >= 0) {
      io_uring_prep_write_fixed(sqe, req.fd, req.buf, req.len, req.offset, fixed);
    } else if (read) {
      io_uring_prep_read(sqe, req.fd, req.buf, req.len, req.offset);
    } else {
      io_uring_prep_write(sqe, req.fd, req.buf, req.len, req.offset);
    }
    io_uring_sqe_set_data64(sqe, req.tag);
    ++in_flight_;
    ++queued_;
    return Status::Ok();
  }

  Status Flush() override {
    while (queued_ > 0) {
      int rc = io_uring_submit(&ring_);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) return ErrnoError("io_uring_submit", -rc);
      queued_ -= std::min<uint32_t>(queued_, static_cast<uint32_t>(rc));
      if (rc == 0) break;
    }
    return Status::Ok();
  }

  Result<IoCompletion> Wait() override {
    if (in_flight_ == 0) return FailedPrecondition("io_uring: wait with nothing in flight");
    ZPS_RETURN_IF_ERROR(Flush());
    io_uring_cqe* cqe = nullptr;
    int rc;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return ErrnoError("io_uring_wait_cqe", -rc);
    IoCompletion c{io_uring_cqe_get_data64(cqe), cqe->res};
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
    return c;
  }

 private:
  UringEngine() = default;
  int FixedIndex(const std::byte* buf, size_t len) const {
    for (size_t i = 0; i < fixed_.size(); ++i) {
      if (buf >= fixed_[i].data() && buf + len <= fixed_[i].data() + fixed_[i].size()) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  uint32_t depth_ = 0;
  uint32_t in_flight_ = 0;
  uint32_t queued_ = 0;
  std::vector<std::span<std::byte>> fixed_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreateUringEngine(const UringOptions& options) {
  return UringEngine::Create(options);
}

}  // namespace zps::server
