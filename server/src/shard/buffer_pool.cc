#include "shard/buffer_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include "zps/common/logging.h"

namespace zps::server {

BufferPool::~BufferPool() {
  reserve_stop_ = true;
  if (reserve_thread_.joinable()) reserve_thread_.join();
}

Result<AlignedBuffer<float>> BufferPool::Take(size_t n) {
  if (n == 0) return AlignedBuffer<float>();
  {
    MutexLock lock(&mu_);
    auto it = buffers_.find(n);
    if (it != buffers_.end()) {
      AlignedBuffer<float> b = std::move(it->second);
      buffers_.erase(it);
      return b;
    }
  }
  return AlignedBuffer<float>::AllocateUninitialized(n);
}

Result<ChunkBuffers> BufferPool::TakeLike(const ChunkBuffers& like) {
  ChunkBuffers out;
  Status failed;
  like.ForEach([&](StateKind k, const AlignedBuffer<float>& b) {
    if (!failed.ok()) return;
    Result<AlignedBuffer<float>> taken = Take(b.size());
    if (taken.ok()) {
      out.of(k) = std::move(*taken);
    } else {
      failed = taken.status();
    }
  });
  if (!failed.ok()) {
    Give(std::move(out));
    return failed;
  }
  return out;
}

void BufferPool::Give(AlignedBuffer<float> b) {
  if (b.size() == 0) return;
  MutexLock lock(&mu_);
  buffers_.emplace(b.size(), std::move(b));
}

void BufferPool::Give(ChunkBuffers b) {
  b.ForEach([&](StateKind, AlignedBuffer<float>& buf) { Give(std::move(buf)); });
}

size_t BufferPool::pooled() const {
  MutexLock lock(&mu_);
  return buffers_.size();
}

void BufferPool::Reserve(std::vector<size_t> sizes, std::string who) {
  if (reserve_thread_.joinable()) return;
  uint64_t bytes = 0;
  for (size_t n : sizes) bytes += n * sizeof(float);
  ZPS_LOG(INFO) << who << ": reserving " << bytes
                << " bytes for the snapshots of background checkpoints";
  reserve_thread_ = std::thread([this, sizes = std::move(sizes), who = std::move(who)] {
    log::SetThreadName("zps-reserve");
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);  // best effort
    for (size_t n : sizes) {
      if (reserve_stop_.load(std::memory_order_relaxed)) return;
      auto b = AlignedBuffer<float>::Allocate(n);  // zeroed: every page faulted in here
      if (!b.ok()) {
        ZPS_LOG(WARNING) << who << ": snapshot buffers not reserved: " << b.status().ToString();
        return;
      }
      Give(std::move(*b));
    }
  });
}

}  // namespace zps::server
