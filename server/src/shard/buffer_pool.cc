#include "shard/buffer_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include "zps/common/logging.h"

namespace zps::server {

BufferPool::~BufferPool() {
  reserve_stop_ = true;
  if (reserve_thread_.joinable()) reserve_thread_.join();
}

namespace {
// `pool` is guarded by `mu`.
template <typename T>
Result<AlignedBuffer<T>> TakeFrom(Mutex& mu, std::multimap<size_t, AlignedBuffer<T>>* pool,
                                  size_t n) {
  if (n == 0) return AlignedBuffer<T>();
  {
    MutexLock lock(&mu);
    auto it = pool->find(n);
    if (it != pool->end()) {
      AlignedBuffer<T> b = std::move(it->second);
      pool->erase(it);
      return b;
    }
  }
  return AlignedBuffer<T>::AllocateUninitialized(n);
}
}  // namespace

Result<AlignedBuffer<float>> BufferPool::Take(size_t n) { return TakeFrom(mu_, &buffers_, n); }

Result<AlignedBuffer<std::byte>> BufferPool::TakeBytes(size_t n) {
  return TakeFrom(mu_, &bytes_, n);
}

Result<ChunkBuffers> BufferPool::TakeLike(const ChunkBuffers& like) {
  ChunkBuffers out;
  out.dtype = like.dtype;
  Status failed;
  auto master = Take(like.master.size());
  if (master.ok())
    out.master = std::move(*master);
  else
    failed = master.status();
  for (auto [from, to] : {std::pair{&like.m, &out.m}, std::pair{&like.v, &out.v}}) {
    if (!failed.ok()) break;
    auto b = TakeBytes(from->size());
    if (b.ok())
      *to = std::move(*b);
    else
      failed = b.status();
  }
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

void BufferPool::Give(AlignedBuffer<std::byte> b) {
  if (b.size() == 0) return;
  MutexLock lock(&mu_);
  bytes_.emplace(b.size(), std::move(b));
}

void BufferPool::Give(ChunkBuffers b) {
  Give(std::move(b.master));
  Give(std::move(b.m));
  Give(std::move(b.v));
}

size_t BufferPool::pooled() const {
  MutexLock lock(&mu_);
  return buffers_.size() + bytes_.size();
}

void BufferPool::Reserve(std::vector<size_t> master_elems, std::vector<size_t> moment_bytes,
                         std::string who) {
  if (reserve_thread_.joinable()) return;
  uint64_t bytes = 0;
  for (size_t n : master_elems) bytes += n * sizeof(float);
  for (size_t n : moment_bytes) bytes += n;
  ZPS_LOG(INFO) << who << ": reserving " << bytes
                << " bytes for the snapshots of background checkpoints";
  reserve_thread_ = std::thread([this, master_elems = std::move(master_elems),
                                 moment_bytes = std::move(moment_bytes), who = std::move(who)] {
    log::SetThreadName("zps-reserve");
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);  // best effort
    // Zeroed: every page faulted in here.
    auto fill = [&](const std::vector<size_t>& sizes, auto allocate) {
      for (size_t n : sizes) {
        if (reserve_stop_.load(std::memory_order_relaxed)) return false;
        auto b = allocate(n);
        if (!b.ok()) {
          ZPS_LOG(WARNING) << who << ": snapshot buffers not reserved: " << b.status().ToString();
          return false;
        }
        Give(std::move(*b));
      }
      return true;
    };
    if (!fill(master_elems, [](size_t n) { return AlignedBuffer<float>::Allocate(n); })) return;
    fill(moment_bytes, [](size_t n) { return AlignedBuffer<std::byte>::Allocate(n); });
  });
}

}  // namespace zps::server
