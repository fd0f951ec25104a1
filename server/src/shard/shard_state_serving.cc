// ShardState's spilled serving copies: placement in the store, the staging buffers and read
// cache, and the "zps-serving-rd" thread that answers fetches of spilled copies. See
// shard_state.h and docs/nvme.md "Serving copies".
#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"
#include "zps/common/thread_annotations.h"
#include "zps/server/shard_state.h"

namespace zps::server {

// A fixed set of chunk-sized staging buffers, and a cache of the latest copies read into them.
// A buffer handed out returns to the free list when the last owner lets go (the deleter), which
// may be on any thread (e.g. UCX's progress thread when a reply's send completes); the storage
// lives as long as any handed-out owner, even past the ShardState.
//
// Thread-safety: Get and the cache belong to the serving reader thread; Stop may be called from
// any thread; the deleters from any thread.
class ShardState::ServingStaging {
 public:
  static Result<std::unique_ptr<ServingStaging>> Create(size_t count, uint64_t elems) {
    auto core = std::make_shared<Core>();
    MutexLock lock(&core->mu);  // not shared yet; for the analysis
    for (size_t i = 0; i < count; ++i) {
      ZPS_ASSIGN_OR_RETURN(auto b, AlignedBuffer<uint16_t>::Allocate(elems));
      core->bufs.push_back(std::move(b));
      core->free.push_back(i);
    }
    auto s = std::unique_ptr<ServingStaging>(new ServingStaging());
    s->core_ = std::move(core);
    s->bytes_ = count * elems * sizeof(uint16_t);
    return s;
  }

  /// The copy of store chunk `index` at serving generation `gen`, from the cache or read by
  /// `read` (which fills the whole chunk) into a free buffer, waiting for one. `*hit` tells which.
  /// Errors: from `read`; Cancelled after Stop.
  Result<std::shared_ptr<const uint16_t>> Get(uint32_t index, uint64_t gen,
                                              const std::function<Status(uint16_t*)>& read,
                                              bool* hit) {
    std::erase_if(cache_, [&](const Entry& e) { return e.gen != gen; });
    for (const Entry& e : cache_) {
      if (e.index == index) {
        *hit = true;
        return e.data;
      }
    }
    *hit = false;
    ZPS_ASSIGN_OR_RETURN(std::shared_ptr<uint16_t> buf, Acquire());
    ZPS_RETURN_IF_ERROR(read(buf.get()));
    cache_.push_back({index, gen, buf});
    return std::shared_ptr<const uint16_t>(std::move(buf));
  }

  void Stop() {
    {
      MutexLock lock(&core_->mu);
      core_->stopped = true;
    }
    core_->cv.SignalAll();
  }

  uint64_t bytes() const { return bytes_; }

 private:
  struct Core {
    Mutex mu;
    CondVar cv;
    std::vector<AlignedBuffer<uint16_t>> bufs;  // fixed at Create
    std::vector<size_t> free GUARDED_BY(mu);
    bool stopped GUARDED_BY(mu) = false;
  };
  struct Entry {
    uint32_t index = 0;
    uint64_t gen = 0;
    std::shared_ptr<const uint16_t> data;
  };
  ServingStaging() = default;

  // A free buffer; evicts the oldest cache entries first, then waits for in-flight replies.
  Result<std::shared_ptr<uint16_t>> Acquire() {
    for (;;) {
      MutexLock lock(&core_->mu);
      if (core_->stopped) return Cancelled("the serving reader stopped");
      if (!core_->free.empty()) {
        const size_t i = core_->free.back();
        core_->free.pop_back();
        std::shared_ptr<Core> core = core_;
        return std::shared_ptr<uint16_t>(core->bufs[i].data(), [core, i](uint16_t*) {
          {
            MutexLock l(&core->mu);
            core->free.push_back(i);
          }
          core->cv.SignalAll();
        });
      }
      if (!cache_.empty()) {
        lock.Unlock();  // the entry's deleter takes core_->mu
        cache_.erase(cache_.begin());
        continue;
      }
      core_->cv.Wait(lock,
                     [&]() REQUIRES(core_->mu) { return core_->stopped || !core_->free.empty(); });
    }
  }

  std::shared_ptr<Core> core_;
  std::vector<Entry> cache_;  // oldest first; reader thread only
  uint64_t bytes_ = 0;
};

ShardState::ShardState(const Layout& layout, uint32_t ordinal, const ShardJob& job,
                       ThreadPool* pool)
    : layout_(layout),
      ordinal_(ordinal),
      job_(job),
      pool_(pool),
      schedule_(job.lr_schedule),
      serving_words_(static_cast<uint32_t>(DTypeSize(job.serving_dtype) / 2)),
      accum_(job.accumulation_steps) {}

ShardState::~ShardState() {
  Shutdown(Cancelled("shard state destroyed"));
  StopSpeculation();
  StopServingReader();
  reserve_stop_ = true;
  if (reserve_thread_.joinable()) reserve_thread_.join();
}

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
