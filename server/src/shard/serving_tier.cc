// ShardState's spilled serving copies and copies made on fetch (serving_tier.h), and the
// conversion of a master into its serving copy. See shard_state.h and docs/nvme.md "Serving
// copies".
#include "shard/serving_tier.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"
#include "zps/common/thread_pool.h"

namespace zps::server {

void ShardState::ToServing(std::span<const float> master, std::span<uint16_t> serving) const {
  if (job_.serving_dtype == DType::kF32) {
    std::memcpy(serving.data(), master.data(), std::min(serving.size_bytes(), master.size_bytes()));
  } else if (IsBlockQuantized(job_.serving_dtype)) {
    // The quantized copy is made from the whole chunk (blocks from its first element), so it is
    // a function of the master alone (zps/common/serving_quant.h).
    QuantizeBlocks(ServingQuantFormat(job_.serving_dtype), master, std::as_writable_bytes(serving));
  } else if (job_.serving_dtype == DType::kF16) {
    ConvertF32ToF16(master, serving);
  } else {
    ConvertF32ToBF16(master, serving);
  }
}

void ShardState::ServingTier::Convert(std::span<const float> master,
                                      std::span<uint16_t> out) const {
  const ShardState& s = *s_;
  constexpr size_t kPiece = size_t{1} << 18;  // elements a task converts
  if (s.pool_ == nullptr || s.pool_->size() < 2 || IsBlockQuantized(s.job_.serving_dtype) ||
      master.size() < 2 * kPiece) {
    s.ToServing(master, out);
    return;
  }
  s.pool_->ParallelFor((master.size() + kPiece - 1) / kPiece, [&](size_t i) {
    const size_t begin = i * kPiece, n = std::min(master.size() - begin, kPiece);
    s.ToServing(master.subspan(begin, n),
                out.subspan(s.kinds_->serving_words(begin), s.kinds_->serving_words(n)));
  });
}

Status ShardState::ServingTier::Make(uint32_t index, std::span<const float> master,
                                     std::span<uint16_t> out) const {
  const ShardState& s = *s_;
  if (!s.store_) {
    Convert(master, out);
    return Status::Ok();
  }
  return s.CountIo(
      s.store_->VisitMaster(index, [&](std::span<const float> m) { Convert(m, out); }));
}

Status ShardState::ServingTier::Start() {
  ShardState& s = *s_;
  uint64_t largest = 0;
  bool any_spilled = false;
  for (size_t i = 0; i < s.chunks_.size(); ++i) {
    Chunk& c = s.chunks_[i];
    if (s.store_) c.serving = s.store_->ResidentServing(static_cast<uint32_t>(i));
    any_spilled = any_spilled || c.serving.empty();
    largest = std::max(largest, c.size);
  }
  if (!any_spilled) return Status::Ok();
  ZPS_ASSIGN_OR_RETURN(
      staging_, ServingStaging::Create(kServingStagingBuffers, s.kinds_->serving_words(largest)));
  reader_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "zps-serving-rd");
    Loop();
  });
  if (s.serving_on_fetch_) {
    ZPS_LOG(INFO) << "shard " << s.ordinal_ << ": no serving copies kept; fetches convert the "
                  << "masters" << (s.store_ ? " (read back from NVMe when spilled)" : "")
                  << " into " << kServingStagingBuffers << " staging buffers";
    return Status::Ok();
  }
  const ChunkStoreStats st = s.store_->stats();
  ZPS_LOG(INFO) << "shard " << s.ordinal_ << ": " << st.serving_resident << "/" << st.chunks
                << " serving copies in RAM, " << st.chunks - st.serving_resident
                << " spilled; fetches of spilled copies are read back into "
                << kServingStagingBuffers << " staging buffers";
  return Status::Ok();
}

void ShardState::ServingTier::Stop() {
  if (!reader_.joinable()) return;
  {
    MutexLock lock(&s_->mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  staging_->Stop();
  reader_.join();
}

void ShardState::ServingTier::Queue(Waiter w) {
  s_->mu_.AssertHeld();
  queue_.push_back(std::move(w));
  cv_.Signal();
}

std::vector<ShardState::Waiter> ShardState::ServingTier::TakeQueued() {
  s_->mu_.AssertHeld();
  std::vector<Waiter> out(std::make_move_iterator(queue_.begin()),
                          std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

void ShardState::ServingTier::Published() {
  s_->mu_.AssertHeld();
  ++gen_;  // even again, together with the new version
  cv_.SignalAll();
}

void ShardState::ServingTier::BeginRewrite() {
  MutexLock lock(&s_->mu_);
  if (gen_ % 2 == 0) ++gen_;  // odd: readers wait
  // A conversion of a master in progress ends before the pass writes it (a read of a spilled
  // record is ordered by the store's lock instead, and waits here only as long).
  cv_.Wait(lock, [&]() REQUIRES(s_->mu_) { return !reading_; });
}

void ShardState::ServingTier::EndRewrite(const Status& result) {
  {
    MutexLock lock(&s_->mu_);
    if (gen_ % 2 == 1) ++gen_;
    error_ = result;
  }
  cv_.SignalAll();
}

Status ShardState::ServingTier::Write(const Chunk& c, std::span<const float> master) const {
  const ShardState& s = *s_;
  if (s.serving_on_fetch_) return Status::Ok();  // made from the master when fetched
  std::vector<uint16_t> serving(s.kinds_->serving_words(c.size));
  s.ToServing(master, serving);
  return s.CountIo(s.store_->WriteServing(static_cast<uint32_t>(s.IndexOf(c)), serving));
}

Status ShardState::ServingTier::Copy(const Chunk& c, std::vector<uint16_t>& out) const {
  const ShardState& s = *s_;
  out.assign(s.kinds_->serving_words(c.size), 0);
  if (s.serving_on_fetch_ && s.store_) {
    return Make(static_cast<uint32_t>(s.IndexOf(c)), {}, out);  // the store orders the read
  }
  if (s.serving_on_fetch_) {
    MutexLock lock(&s.mu_);  // the master's buffers (a publish or a snapshot may swap them)
    s.ToServing(c.state.master.span().first(c.size), out);
    return Status::Ok();
  }
  if (!s.ServedByTier(c)) {
    std::copy(c.serving.begin(), c.serving.end(), out.begin());
    return Status::Ok();
  }
  return s.CountIo(s.store_->ReadServing(static_cast<uint32_t>(s.IndexOf(c)), out));
}

// One fetch at a time, in arrival order: wait until no pass is rewriting serving copies, read
// the chunk's copy, or convert its master (or take either from the cache), and answer if no
// rewrite began meanwhile (else queue it again at the front). The callback runs without mu_.
void ShardState::ServingTier::Loop() {
  ShardState& s = *s_;
  MutexLock lock(&s_->mu_);
  for (;;) {
    cv_.Wait(lock, [&]() REQUIRES(s_->mu_) {
      return stop_ || s_->shutdown_ || (!queue_.empty() && gen_ % 2 == 0);
    });
    if (stop_ || s_->shutdown_) return;  // Shutdown fails what is queued
    Waiter w = std::move(queue_.front());
    queue_.pop_front();
    const Chunk* c = s.FindChunk(w.req.chunk);
    const int64_t version = c->version;
    Status fail = error_;
    if (fail.ok() && version < w.req.min_version) {
      fail = Unavailable("chunk " + std::to_string(c->id) + " rolled back while a fetch waited");
    }
    if (!fail.ok()) {
      lock.Unlock();
      w.cb(fail, -1, {}, nullptr);
      lock.Lock();
      continue;
    }
    const uint64_t gen = gen_;
    const auto index = static_cast<uint32_t>(s.IndexOf(*c));
    const size_t words = s.kinds_->serving_words(c->size);
    // Made on fetch from RAM: the master as it is now (a publish or a snapshot may swap the
    // buffers under mu_); no pass writes it until reading_ is cleared (BeginRewrite waits). From
    // a store: read in Make.
    const std::span<const float> master = s.serving_on_fetch_ && !s.store_
                                              ? c->state.master.span().first(c->size)
                                              : std::span<const float>{};
    reading_ = true;
    lock.Unlock();
    bool hit = false;
    auto data = staging_->Get(
        index, gen,
        [&](uint16_t* out) {
          if (s.serving_on_fetch_) return Make(index, master, {out, words});
          return s.CountIo(s.store_->ReadServing(index, {out, words}));
        },
        &hit);
    lock.Lock();
    reading_ = false;
    cv_.SignalAll();                 // a pass waiting in BeginRewrite
    if (data.ok() && gen_ != gen) {  // rewritten while we read: read again later
      queue_.push_front(std::move(w));
      continue;
    }
    lock.Unlock();
    if (!data.ok()) {
      ZPS_LOG(ERROR) << "fetch of the spilled serving copy of chunk " << c->id << ": "
                     << data.status().ToString();
      w.cb(data.status(), -1, {}, nullptr);
    } else {
      fetches_.fetch_add(1, std::memory_order_relaxed);
      if (!hit) reads_.fetch_add(1, std::memory_order_relaxed);
      // The reply is sent straight from the staging buffer, and holds it until the send is
      // done. A send to a peer that vanished may never complete (shared memory in UCX 1.13):
      // its buffer then stays held for good, and later reads get another (serving_staging.h).
      // A range of at most a quarter of the chunk is copied out instead, so that a reply never
      // holds more than four times the bytes it sends.
      const QuantRange r = s.kinds_->serving_range(c->size, w.req.offset, w.req.length);
      const auto* from = reinterpret_cast<const std::byte*>(data->get()) + r.offset;
      if (r.bytes * 4 <= words * sizeof(uint16_t)) {
        std::shared_ptr<std::byte[]> copy(new std::byte[r.bytes]);
        std::memcpy(copy.get(), from, r.bytes);
        data->reset();
        const std::span<const std::byte> range(copy.get(), r.bytes);
        w.cb(Status::Ok(), version, range, std::move(copy));
      } else {
        w.cb(Status::Ok(), version, std::span<const std::byte>(from, r.bytes), *std::move(data));
      }
    }
    lock.Lock();
  }
}

}  // namespace zps::server
