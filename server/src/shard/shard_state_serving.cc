// ShardState's spilled serving copies: placement in the store, the staging buffers and read
// cache, and the "zps-serving-rd" thread that answers fetches of spilled copies. See
// shard_state.h and docs/nvme.md "Serving copies".
#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "shard/serving_staging.h"
#include "shard/shard_chunk.h"
#include "zps/common/logging.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/shard_state.h"

namespace zps::server {

Status ShardState::InitServingStore() {
  uint64_t largest = 0;
  bool any_spilled = false;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = chunks_[i];
    c.serving = store_->ResidentServing(static_cast<uint32_t>(i));
    any_spilled = any_spilled || c.serving.empty();
    largest = std::max(largest, c.size);
  }
  if (!any_spilled) return Status::Ok();
  ZPS_ASSIGN_OR_RETURN(staging_,
                       ServingStaging::Create(kServingStagingBuffers, largest * serving_words_));
  serving_reader_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "zps-serving-rd");
    ServingReaderLoop();
  });
  const ChunkStoreStats st = store_->stats();
  ZPS_LOG(INFO) << "shard " << ordinal_ << ": " << st.serving_resident << "/" << st.chunks
                << " serving copies in RAM, " << st.chunks - st.serving_resident
                << " spilled; fetches of spilled copies are read back into "
                << kServingStagingBuffers << " staging buffers";
  return Status::Ok();
}

uint64_t ShardState::StagingBytes() const { return staging_ ? staging_->bytes() : 0; }

void ShardState::StopServingReader() {
  if (!serving_reader_.joinable()) return;
  {
    MutexLock lock(&mu_);
    reader_stop_ = true;
  }
  reader_cv_.SignalAll();
  staging_->Stop();
  serving_reader_.join();
}

void ShardState::QueueSpilledFetch(Waiter w) {
  spilled_q_.push_back(std::move(w));
  reader_cv_.Signal();
}

std::vector<ShardState::Waiter> ShardState::TakeSpilledFetches() {
  std::vector<Waiter> out(std::make_move_iterator(spilled_q_.begin()),
                          std::make_move_iterator(spilled_q_.end()));
  spilled_q_.clear();
  return out;
}

void ShardState::BeginServingRewrite() {
  MutexLock lock(&mu_);
  if (serving_gen_ % 2 == 0) ++serving_gen_;  // odd: readers wait
}

void ShardState::EndServingRewrite(const Status& result) {
  {
    MutexLock lock(&mu_);
    if (serving_gen_ % 2 == 1) ++serving_gen_;
    serving_error_ = result;
  }
  reader_cv_.SignalAll();
}

void ShardState::ToServing(std::span<const float> master, std::span<uint16_t> serving) const {
  if (job_.serving_dtype == DType::kF32) {
    std::memcpy(serving.data(), master.data(), std::min(serving.size_bytes(), master.size_bytes()));
  } else if (job_.serving_dtype == DType::kF16) {
    ConvertF32ToF16(master, serving);
  } else {
    ConvertF32ToBF16(master, serving);
  }
}

Status ShardState::WriteSpilledServing(Chunk& c, std::span<const float> master) {
  std::vector<uint16_t> serving(c.size * serving_words_);
  ToServing(master, serving);
  return CountIo(store_->WriteServing(static_cast<uint32_t>(IndexOf(c)), serving));
}

Status ShardState::ServingCopy(const Chunk& c, std::vector<uint16_t>& out) const {
  out.assign(c.size * serving_words_, 0);
  if (!ServingSpilled(c)) {
    std::copy(c.serving.begin(), c.serving.end(), out.begin());
    return Status::Ok();
  }
  return CountIo(store_->ReadServing(static_cast<uint32_t>(IndexOf(c)), out));
}

// One fetch at a time, in arrival order: wait until no pass is rewriting serving copies, read
// the chunk's copy (or take it from the cache), and answer if no rewrite began meanwhile (else
// queue it again at the front). The callback runs without mu_.
void ShardState::ServingReaderLoop() {
  MutexLock lock(&mu_);
  for (;;) {
    reader_cv_.Wait(lock, [&]() REQUIRES(mu_) {
      return reader_stop_ || shutdown_ || (!spilled_q_.empty() && serving_gen_ % 2 == 0);
    });
    if (reader_stop_ || shutdown_) return;  // Shutdown fails what is queued
    Waiter w = std::move(spilled_q_.front());
    spilled_q_.pop_front();
    const Chunk* c = FindChunk(w.req.chunk);
    const int64_t version = c->version;
    Status fail = serving_error_;
    if (fail.ok() && version < w.req.min_version) {
      fail = Unavailable("chunk " + std::to_string(c->id) + " rolled back while a fetch waited");
    }
    if (!fail.ok()) {
      lock.Unlock();
      w.cb(fail, -1, {}, nullptr);
      lock.Lock();
      continue;
    }
    const uint64_t gen = serving_gen_;
    const auto index = static_cast<uint32_t>(IndexOf(*c));
    lock.Unlock();
    bool hit = false;
    auto data = staging_->Get(
        index, gen,
        [&](uint16_t* out) {
          return CountIo(
              store_->ReadServing(index, {out, static_cast<size_t>(c->size * serving_words_)}));
        },
        &hit);
    lock.Lock();
    if (data.ok() && serving_gen_ != gen) {  // rewritten while we read: read again later
      spilled_q_.push_front(std::move(w));
      continue;
    }
    lock.Unlock();
    if (!data.ok()) {
      ZPS_LOG(ERROR) << "fetch of the spilled serving copy of chunk " << c->id << ": "
                     << data.status().ToString();
      w.cb(data.status(), -1, {}, nullptr);
    } else {
      spilled_fetches_.fetch_add(1, std::memory_order_relaxed);
      if (!hit) spilled_fetch_reads_.fetch_add(1, std::memory_order_relaxed);
      // The reply gets a copy of its range, never the staging buffer itself: a send to a peer
      // that vanished may never complete (shared memory in UCX 1.13), and its data then stays
      // held for good; a held staging buffer would stall every later spilled fetch.
      const uint16_t* from = data->get() + w.req.offset * serving_words_;
      auto copy =
          std::make_shared<std::vector<uint16_t>>(from, from + w.req.length * serving_words_);
      data->reset();  // only the cache keeps the staging buffer now: evictable for the next read
      w.cb(Status::Ok(), version, std::as_bytes(std::span<const uint16_t>(*copy)), copy);
    }
    lock.Lock();
  }
}

}  // namespace zps::server
