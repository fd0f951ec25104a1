// ShardState's update policies (update_policy.h): SyncUpdate and SpeculativeUpdate, and what
// both run on a chunk: the reduction of its gradient slots and the fused update, run by run.
//
// Speculation: the live master, m, v and serving copy are never written before the commit, so
// the "pre-update state" a redo starts from is simply the live one, and a skip restores nothing.
// With RAM state the new serving copy goes straight into the chunk's next serving bank, which no
// fetch reads ("Serving banks" in shard_state.h): the publish copies nothing. See
// docs/architecture.md "The speculative step".
#include "shard/update_policy.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <thread>

#include "shard/buffer_pool.h"
#include "shard/chunk_layout.h"
#include "shard/shard_chunk.h"
#include "shard/snapshot_manager.h"
#include "zps/common/logging.h"

namespace zps::server {

// ---- what every policy runs on a chunk ----------------------------------------------------------

Result<ChunkReport> ShardState::ReduceChunk(Chunk& c, const Optimizer* opt) const {
  if (opt == nullptr) opt = optimizer_.get();
  c.slots.Reduce();
  // Frozen parameters were never pushed: the reduced gradient may still hold their initial
  // values (slot 0). Zero them, so they add nothing to the norm (and nothing is read from them
  // by the update).
  for (const Chunk::Run& r : c.runs) {
    if (r.frozen) c.slots.ZeroReduced(r.begin, r.end);
  }
  ZPS_ASSIGN_OR_RETURN(GradStats st, opt->ComputeGradStats(c.slots.Reduced(), 1.0f));
  return ChunkReport{st.sum_squares, st.non_finite};
}

Status ShardState::UpdateChunk(const Chunk& c, const ChunkState& st, std::span<uint16_t> serving,
                               const CommitOrder& order, const ConstChunkState* source,
                               const Optimizer* opt) const {
  if (opt == nullptr) opt = optimizer_.get();
  const int64_t applied = order.optimizer_step - 1;  // the schedule's index (lr_schedule.h)
  const GradView grad = c.slots.Reduced();
  const auto* grad_bytes = static_cast<const std::byte*>(grad.data);
  const size_t grad_size = DTypeSize(grad.dtype);
  const StateDType sd = kinds_->state_dtype();
  // A run of packed moments: runs start at parameter pieces, at multiples of align_elems, which
  // ValidateShardJob keeps a multiple of the int8 block (MomentRange in optimizer.h).
  auto moments = [&](auto packed, const Chunk::Run& r) {
    return packed.empty() ? packed : MomentRange(sd, packed, r.begin, r.end - r.begin);
  };
  // A quantized copy's blocks start at the chunk's start and cross runs (frozen ones too). When
  // one run covers the whole chunk, the kernel call makes it in its own pass (UpdateParams::
  // out_quant, task by task while the master is in cache); otherwise it is made below from the
  // whole updated master.
  const bool quant = !serving.empty() && IsBlockQuantized(job_.serving_dtype);
  const bool quant_fused = quant && c.runs.size() == 1 && !c.runs[0].frozen &&
                           c.runs[0].begin == 0 && c.runs[0].end == st.master.size();
  for (const Chunk::Run& r : c.runs) {
    if (r.frozen) {
      // Never updated. Out of place, its state is carried over to the buffers that replace the
      // live ones (a spare, or fresh ones beside a snapshot), which hold older bytes or none.
      if (source != nullptr) {
        std::copy(source->master.begin() + r.begin, source->master.begin() + r.end,
                  st.master.begin() + r.begin);
        auto keep = [&](std::span<const std::byte> from, std::span<std::byte> to) {
          if (to.empty()) return;
          const std::span<const std::byte> f = moments(from, r);
          std::copy(f.begin(), f.end(), moments(to, r).begin());
        };
        keep(source->m, st.m);
        keep(source->v, st.v);
      }
      continue;
    }
    const ParamGroup& g = groups_[r.group];
    const uint64_t n = r.end - r.begin;
    UpdateParams up;
    up.step = order.optimizer_step;
    up.grad_scale = order.grad_scale;
    // A quantized copy is not the kernel's: it writes none (out16, out32 empty), made below.
    if (!IsBlockQuantized(job_.serving_dtype)) up.out_dtype = job_.serving_dtype;
    up.lr = schedule_.LrFor(applied, g.lr);
    up.weight_decay = g.weight_decay;
    // bf16 state's dither that rounds v is a function of the element's index in the whole model.
    up.first_index = uint64_t{c.id} * layout_.options().chunk_elems + r.begin;
    if (!serving.empty() && !IsBlockQuantized(job_.serving_dtype)) {
      if (job_.serving_dtype == DType::kF32) {
        up.out32 = {reinterpret_cast<float*>(serving.data()) + r.begin, n};
      } else {
        up.out16 = serving.subspan(r.begin, n);
      }
    }
    if (quant_fused) {
      up.out_quant_format = ServingQuantFormat(job_.serving_dtype);
      up.out_quant = std::as_writable_bytes(serving).first(ServingBytes(job_.serving_dtype, n));
    }
    ChunkState part{st.master.subspan(r.begin, n), moments(st.m, r), moments(st.v, r)};
    if (source != nullptr) {
      up.source = ConstChunkState{source->master.subspan(r.begin, n), moments(source->m, r),
                                  moments(source->v, r)};
    }
    ZPS_RETURN_IF_ERROR(opt->Update(part, {grad_bytes + r.begin * grad_size, grad.dtype, n}, up));
  }
  if (quant && !quant_fused) ToServing(st.master, serving);
  return Status::Ok();
}

Status ShardState::UpdateForSnapshot(size_t i, Snapshot& snap, const CommitOrder& order,
                                     std::span<uint16_t> serving) {
  Chunk& c = chunks_[i];
  return snapshots_->UpdateOutOfPlace(snap, i, c.state,
                                      [&](const ChunkState& out, const ConstChunkState* source) {
                                        return UpdateChunk(c, out, serving, order, source);
                                      });
}

// ---- sync: every chunk at the commit
// --------------------------------------------------------------

class ShardState::SyncUpdate final : public ShardState::UpdatePolicy {
 public:
  explicit SyncUpdate(ShardState* state) : UpdatePolicy(state) {}

  void OnComplete(Chunk&) override {}
  bool ReductionsDone() const override { return true; }
  Status ReductionError() const override { return Status::Ok(); }
  void OnReduced(int64_t, const std::vector<size_t>&) override {}
  bool CommitReady() const override { return true; }
  void OnPublished(Chunk&) override {}
  void OnCommitted(const std::optional<CommitOrder>&) override {}
  bool Idle() const override { return true; }
  void Reset() override {}
  SpeculationStats stats() const override { return {}; }
  void Arm(const CommitOrder&) override {}
  void Wake() override {}
  void Stop() override {}

  Status Apply(const CommitOrder& order, const std::shared_ptr<Snapshot>& snap) override {
    if (order.skip) return Status::Ok();
    ShardState& s = *s_;
    if (s.store_) {
      // The same per-chunk update as the RAM path, fed by the read-ahead / write-behind
      // pipeline. The gradient (slot 0) is a RAM buffer of the chunk; the serving copy is too,
      // or, with serving records, the store's (resident in place, spilled written behind).
      PassOptions pass;
      pass.serving = s.serving_in_store_;
      return s.CountIo(s.store_->ForEachChunk(
          s.store_ids_, pass, [&](uint32_t i, const ChunkSpans& sp) -> Status {
            const Chunk& c = s.chunks_[i];
            return s.UpdateChunk(c, {sp.state.master, sp.state.m, sp.state.v},
                                 s.serving_in_store_ ? sp.serving : c.serving, order);
          }));
    }
    for (size_t i = 0; i < s.chunks_.size(); ++i) {
      Chunk& c = s.chunks_[i];
      if (snap) {  // a checkpoint is still being written: it keeps the pre-update buffers
        ZPS_RETURN_IF_ERROR(s.UpdateForSnapshot(i, *snap, order, c.serving));
        continue;
      }
      ZPS_RETURN_IF_ERROR(s.UpdateChunk(c, c.state.spans(), c.serving, order));
    }
    return Status::Ok();
  }
};

// ---- speculative: each chunk as soon as it is complete
// ---------------------------------------------

class ShardState::SpeculativeUpdate final : public ShardState::UpdatePolicy {
 public:
  explicit SpeculativeUpdate(ShardState* state) : UpdatePolicy(state) {}
  ~SpeculativeUpdate() override { Stop(); }

  // Spares and the thread. `spares`: spare sets with a store.
  Status Start(const OptimizerConfig& optimizer, ThreadPool* pool, uint64_t spares);

  void OnComplete(Chunk& c) override {
    s_->mu_.AssertHeld();
    if (c.spec != SpecPhase::kIdle) return;
    c.spec = SpecPhase::kQueued;
    queue_.push_back(s_->IndexOf(c));
    cv_.Signal();
  }
  // Every chunk reduced; a speculation in progress (kSpeculating) has its report already.
  bool ReductionsDone() const override {
    s_->mu_.AssertHeld();
    return busy_ == speculating_;
  }
  Status ReductionError() const override {
    s_->mu_.AssertHeld();
    return error_;
  }
  // The chunks reduced by ReduceStep are speculated while the coordinator decides (late), so
  // that the commit finds them done in the common case.
  void OnReduced(int64_t step, const std::vector<size_t>& mine) override {
    s_->mu_.AssertHeld();
    if (!armed_ || armed_->step != step || mine.empty()) return;
    for (size_t i : mine) {
      s_->chunks_[i].spec = SpecPhase::kQueuedLate;
      queue_.push_back(i);
    }
    cv_.Signal();
  }
  // A speculation in progress finishes: with RAM state beside the pass over the other chunks
  // (Apply), with a store first. Those not started are updated by the commit instead.
  bool CommitReady() const override {
    s_->mu_.AssertHeld();
    return busy_ == (s_->store_ ? 0 : speculating_);
  }
  void OnPublished(Chunk& c) override {
    s_->mu_.AssertHeld();
    if (s_->store_ && c.spec == SpecPhase::kSpeculated) free_.push_back(c.spare);
  }
  void OnCommitted(const std::optional<CommitOrder>& next) override {
    s_->mu_.AssertHeld();
    queue_.clear();
    if (next) armed_ = *next;
  }
  // The chunk being speculated reads the live state and the gradient slots.
  bool Idle() const override {
    s_->mu_.AssertHeld();
    return busy_ == 0;
  }
  void Reset() override {
    s_->mu_.AssertHeld();
    queue_.clear();
    armed_.reset();
    free_.clear();
    for (size_t k = 0; s_->store_ && k < spares_.size(); ++k) free_.push_back(static_cast<int>(k));
    error_ = Status::Ok();
  }
  SpeculationStats stats() const override {
    s_->mu_.AssertHeld();
    SpeculationStats out = stats_;
    for (const Chunk& c : s_->chunks_) out.in_flight += c.spec == SpecPhase::kSpeculated ? 1 : 0;
    out.busy = static_cast<uint32_t>(busy_);
    return out;
  }
  void Arm(const CommitOrder& assumed) override {
    MutexLock lock(&s_->mu_);
    armed_ = assumed;
  }
  void Wake() override { cv_.SignalAll(); }
  void Stop() override {
    {
      MutexLock lock(&s_->mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }
  // Publishes, redoes or drops each chunk's speculation; a chunk still being speculated (RAM
  // state) last, once its speculation is done.
  Status Apply(const CommitOrder& order, const std::shared_ptr<Snapshot>& snap) override;

 private:
  struct Spare {         // the updated state of a speculated chunk, until the commit
    ChunkBuffers state;  // sized for the chunk (RAM state) or the largest (a store)
    // With a store, unless the copies are made on fetch (RAM state: the next serving bank).
    AlignedBuffer<uint16_t> serving;
    // The serving copy of a chunk of `words` serving words; empty where none is kept.
    std::span<uint16_t> ServingOf(uint64_t words) {
      return serving.size() == 0 ? std::span<uint16_t>{} : serving.span().first(words);
    }
  };
  struct Counts {
    uint64_t published = 0, redone = 0, dropped = 0, sync = 0;
  };
  static bool SameOrder(const CommitOrder& a, const CommitOrder& b) {
    return a.step == b.step && !a.skip && !b.skip && a.optimizer_step == b.optimizer_step &&
           std::bit_cast<uint32_t>(a.grad_scale) == std::bit_cast<uint32_t>(b.grad_scale);
  }
  void Loop();
  // Copies the live state into `sp` and updates it with `order`.
  Status Speculate(const Chunk& c, Spare& sp, const CommitOrder& order);
  Status PublishSpare(Chunk& c, Spare& sp);  // live state <- spare: the store write (store)
  // Apply for `chunks` (indices; none in kSpeculating), adding to `n` and the stats.
  Status ApplyTo(const std::vector<size_t>& chunks, const CommitOrder& order, Counts& n);

  // The speculation thread's optimizer: the same configuration on a pool of its own, as wide as
  // the shard's (none with one thread; the same bits: the optimizer's work split does not depend
  // on threads), so that a chunk it speculates runs beside the commit's pass over the others
  // instead of queueing for the shard's pool.
  std::unique_ptr<ThreadPool> pool_;  // "zps-spec-N"; destroyed after optimizer_
  std::unique_ptr<Optimizer> optimizer_;
  // Per chunk without a store (spares_[i] belongs to chunks_[i]), else a pool of what fits in
  // the budget (free_). Fixed at Start; a spare is used by one thread at a time (its chunk's
  // phase says which).
  std::vector<Spare> spares_;
  uint64_t spare_bytes_ = 0;
  std::vector<int> free_ GUARDED_BY(s_->mu_);
  std::deque<size_t> queue_ GUARDED_BY(s_->mu_);  // chunk indices to speculate
  std::optional<CommitOrder> armed_ GUARDED_BY(s_->mu_);
  bool stop_ GUARDED_BY(s_->mu_) = false;
  int busy_ GUARDED_BY(s_->mu_) = 0;         // chunks being reduced/speculated
  int speculating_ GUARDED_BY(s_->mu_) = 0;  // of those, in kSpeculating
  SpeculationStats stats_ GUARDED_BY(s_->mu_);
  Status error_ GUARDED_BY(s_->mu_);  // a failed reduction (ReduceStep)
  CondVar cv_;                        // the speculation thread waits on it (with mu_)
  std::thread thread_;                // "zps-speculate"
};

Status ShardState::SpeculativeUpdate::Start(const OptimizerConfig& optimizer, ThreadPool* pool,
                                            uint64_t spares) {
  ShardState& s = *s_;
  // The speculation thread's own pool, as wide as the shard's (the thread is its caller), so
  // that speculation gets the thread count --threads gives the commit's pass (not measured to
  // help on 2 cores: docs/benchmarks.md); its own, not the shard's, so that a chunk it
  // speculates runs beside that pass.
  if (pool != nullptr && pool->size() > 1) {
    ZPS_ASSIGN_OR_RETURN(pool_, ThreadPool::Create({.name = "zps-spec", .threads = pool->size()}));
  }
  ZPS_ASSIGN_OR_RETURN(optimizer_, Optimizer::Create(optimizer, pool_.get()));
  uint64_t largest = 0;
  for (const Chunk& c : s.chunks_) largest = std::max(largest, c.size);
  const size_t count = s.store_ ? static_cast<size_t>(std::min<uint64_t>(spares, s.chunks_.size()))
                                : s.chunks_.size();
  spares_.resize(count);
  for (size_t k = 0; k < count; ++k) {
    const uint64_t n = s.store_ ? largest : s.chunks_[k].size;
    Spare& sp = spares_[k];
    ZPS_ASSIGN_OR_RETURN(sp.state, ChunkBuffers::Allocate(*s.kinds_, n));
    if (s.store_ && !s.serving_on_fetch_) {
      ZPS_ASSIGN_OR_RETURN(sp.serving,
                           AlignedBuffer<uint16_t>::Allocate(s.kinds_->serving_words(n)));
    }
    spare_bytes_ += sp.state.bytes() + sp.serving.size() * sizeof(uint16_t);
  }
  spare_bytes_ += s.serving_bank_bytes_;  // the second serving bank (RAM state)
  {
    MutexLock lock(&s_->mu_);  // not shared yet (Create); for the analysis
    if (s.store_) {
      for (size_t k = 0; k < count; ++k) free_.push_back(static_cast<int>(k));
    }
    stats_.spares = static_cast<uint32_t>(count);
    stats_.spare_bytes = spare_bytes_;
  }
  ZPS_LOG(INFO) << "shard " << s.ordinal_ << ": speculative updates: " << count << " of "
                << s.chunks_.size() << " chunks can be speculated per step (" << spare_bytes_
                << " bytes of spare buffers)";
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "zps-speculate");
    Loop();
  });
  return Status::Ok();
}

Status ShardState::SpeculativeUpdate::Speculate(const Chunk& c, Spare& sp,
                                                const CommitOrder& order) {
  ShardState& s = *s_;
  const uint64_t n = c.size;
  if (!s.store_ && sp.state.master.size() != n) {  // given to a checkpoint's snapshot
    ZPS_ASSIGN_OR_RETURN(sp.state, s.snapshots_->buffers().TakeLike(c.state));
  }
  ChunkState st = sp.state.prefix(n);
  if (s.store_) {  // read into the spare, updated there in place
    const std::span<uint16_t> serving = sp.ServingOf(s.kinds_->serving_words(n));
    ZPS_RETURN_IF_ERROR(
        s.CountIo(s.store_->ReadChunk(static_cast<uint32_t>(s.IndexOf(c)), st.master, st.m, st.v)));
    return s.UpdateChunk(c, st, serving, order, nullptr, optimizer_.get());
  }
  // Out of place from the live state, which nothing writes meanwhile: only ApplyCommit and
  // ResetTo do, and both wait for this chunk's speculation first (ApplyCommit handles it after
  // the others). No copy: the pass reads and writes the same bytes as the synchronous update.
  // The serving copy of version step + 1 goes into its bank, which no fetch reads.
  const ConstChunkState live = std::as_const(c.state).spans();
  return s.UpdateChunk(c, st, ServingFor(c, order.step + 1), order, &live, optimizer_.get());
}

void ShardState::SpeculativeUpdate::Loop() {
  ShardState& s = *s_;
  int64_t hooked = -1;  // the last step whose first speculated chunk called the test hook
  for (;;) {
    size_t i = 0;
    std::optional<CommitOrder> order;
    int spare = -1;
    bool late = false;  // reduced already (its report is out): speculate only
    {
      MutexLock lock(&s_->mu_);
      cv_.Wait(lock, [&]() REQUIRES(s_->mu_) { return stop_ || s_->shutdown_ || !queue_.empty(); });
      if (stop_ || s_->shutdown_) return;
      i = queue_.front();
      queue_.pop_front();
      Chunk& c = s.chunks_[i];
      // Anything else: claimed by ReduceStep, taken back by ApplyCommit, or rolled back.
      if (c.spec != SpecPhase::kQueued && c.spec != SpecPhase::kQueuedLate) continue;
      late = c.spec == SpecPhase::kQueuedLate;
      c.spec = late ? SpecPhase::kSpeculating : SpecPhase::kBusy;
      ++busy_;
      if (late) ++speculating_;
      if (armed_ && armed_->step == c.version) {
        if (!s.store_) {
          spare = static_cast<int>(i);
        } else if (!free_.empty()) {
          spare = free_.back();
          free_.pop_back();
        }
        if (spare >= 0) order = *armed_;
      }
    }
    Chunk& c = s.chunks_[i];
    Result<ChunkReport> rep =
        late ? Result<ChunkReport>(ChunkReport{}) : s.ReduceChunk(c, optimizer_.get());
    Status st = rep.status();
    bool speculated = false;
    bool reported = late;  // a late chunk's report is out already
    if (st.ok() && order && !late) {
      // The report is ready: ReduceStep need not wait for the update that follows.
      {
        MutexLock lock(&s_->mu_);
        c.report = *rep;
        c.spec = SpecPhase::kSpeculating;
        ++speculating_;
      }
      reported = true;
      s.cv_.SignalAll();
    }
    if (st.ok() && order) {
      if (s.test_hook_) s.test_hook_("speculating", order->step);
      Status sp = Speculate(c, spares_[spare], *order);
      if (sp.ok()) {
        speculated = true;
      } else {  // the chunk is updated at the commit instead
        ZPS_LOG(WARNING) << "speculative update of chunk " << c.id << " failed (" << sp.ToString()
                         << "); it is updated at the commit";
      }
    }
    {
      MutexLock lock(&s_->mu_);
      --busy_;
      if (c.spec == SpecPhase::kSpeculating) --speculating_;
      if (!st.ok()) {
        // A reduction cannot be repeated (it sums in place): the step fails at ReduceStep.
        error_ = st.WithContext("reducing chunk " + std::to_string(c.id));
        c.spec = SpecPhase::kReduced;
      } else {
        if (!reported) c.report = *rep;
        c.spec = speculated ? SpecPhase::kSpeculated : SpecPhase::kReduced;
        if (speculated) {
          c.spec_order = *order;
          c.spare = spare;
        }
      }
      if (!speculated && spare >= 0 && s.store_) free_.push_back(spare);
    }
    s.cv_.SignalAll();
    if (speculated && order->step != hooked) {
      hooked = order->step;
      if (s.test_hook_) s.test_hook_("speculate", order->step);
    }
  }
}

Status ShardState::SpeculativeUpdate::PublishSpare(Chunk& c, Spare& sp) {
  ShardState& s = *s_;
  const uint64_t n = c.size;
  const std::span<const uint16_t> serving = sp.ServingOf(s.kinds_->serving_words(n));
  const ChunkState st = sp.state.prefix(n);
  const uint32_t idx = static_cast<uint32_t>(s.IndexOf(c));
  ZPS_RETURN_IF_ERROR(s.CountIo(s.store_->WriteChunk(idx, st.master, st.m, st.v)));
  if (s.serving_on_fetch_) return Status::Ok();  // made from the new master when fetched
  if (s.ServedByTier(c)) return s.CountIo(s.store_->WriteServing(idx, serving));
  std::memcpy(c.serving.data(), serving.data(), serving.size_bytes());
  return Status::Ok();
}

Status ShardState::SpeculativeUpdate::Apply(const CommitOrder& order,
                                            const std::shared_ptr<Snapshot>&) {
  ShardState& s = *s_;
  // A chunk still being speculated (kSpeculating; with RAM state only, CommitReady waits
  // otherwise) is handled last: the pass over the others runs beside it.
  std::vector<size_t> now, later;
  {
    MutexLock lock(&s_->mu_);
    for (size_t i = 0; i < s.chunks_.size(); ++i) {
      (s.chunks_[i].spec == SpecPhase::kSpeculating ? later : now).push_back(i);
    }
  }
  Counts n;
  ZPS_RETURN_IF_ERROR(ApplyTo(now, order, n));
  if (!later.empty()) {
    {
      MutexLock lock(&s_->mu_);
      s.cv_.Wait(lock, [&]() REQUIRES(s_->mu_) { return s_->shutdown_ || busy_ == 0; });
      if (s_->shutdown_) return s_->shutdown_reason_;
      stats_.beside += later.size();
    }
    ZPS_RETURN_IF_ERROR(ApplyTo(later, order, n));
  }
  if (n.redone > 0) {
    ZPS_LOG(INFO) << "step " << order.step << " clipped (grad_scale " << order.grad_scale
                  << "): " << n.redone << " speculated chunks redone from their pre-update state";
  } else if (n.dropped > 0) {
    ZPS_LOG(INFO) << "step " << order.step << " skipped: " << n.dropped
                  << " speculated chunks dropped (their state is unchanged)";
  }
  return Status::Ok();
}

Status ShardState::SpeculativeUpdate::ApplyTo(const std::vector<size_t>& chunks,
                                              const CommitOrder& order, Counts& n) {
  ShardState& s = *s_;
  std::vector<char> use(s.chunks_.size(), 0);
  std::shared_ptr<Snapshot> snap;  // read again: a checkpoint may have begun beside `now`
  {
    MutexLock lock(&s_->mu_);
    snap = s_->snapshots_->Current();
    Counts here;
    for (size_t i : chunks) {
      const Chunk& c = s.chunks_[i];
      if (c.spec == SpecPhase::kSpeculated) {
        if (order.skip) {
          ++here.dropped;
        } else if (SameOrder(c.spec_order, order)) {
          use[i] = 1;
          ++here.published;
        } else {
          ++here.redone;
        }
      } else if (!order.skip) {
        ++here.sync;
      }
    }
    stats_.published += here.published;
    stats_.redone += here.redone;
    stats_.dropped += here.dropped;
    stats_.sync += here.sync;
    n.published += here.published;
    n.redone += here.redone;
    n.dropped += here.dropped;
    n.sync += here.sync;
  }
  if (order.skip) {  // nothing live was written: nothing to restore
    // The version advances over unchanged bytes: the next bank gets the current copy.
    for (size_t i : chunks) MirrorServing(s.chunks_[i]);
    return Status::Ok();
  }
  if (!s.store_) {
    // A published chunk's serving copy is in its next bank already; the others are written
    // there now.
    for (size_t i : chunks) {
      Chunk& c = s.chunks_[i];
      const std::span<uint16_t> next = ServingFor(c, order.step + 1);
      if (use[i]) {
        // When a checkpoint still needs the pre-update state it takes the live buffers
        // themselves, and the spare is allocated again by the next speculation of the chunk (off
        // the critical path); otherwise the old state becomes the spare.
        s.snapshots_->Replace(snap.get(), i, c.state, spares_[i].state);
      } else if (snap) {
        ZPS_RETURN_IF_ERROR(s.UpdateForSnapshot(i, *snap, order, next));
      } else {
        ZPS_RETURN_IF_ERROR(s.UpdateChunk(c, c.state.spans(), next, order));
      }
    }
    return Status::Ok();
  }
  std::vector<uint32_t> rest;
  for (size_t i : chunks) {
    if (use[i]) {
      ZPS_RETURN_IF_ERROR(PublishSpare(s.chunks_[i], spares_[s.chunks_[i].spare]));
    } else {
      rest.push_back(static_cast<uint32_t>(i));
    }
  }
  if (rest.empty()) return Status::Ok();
  PassOptions pass;
  pass.serving = s.serving_in_store_;
  return s.CountIo(
      s.store_->ForEachChunk(rest, pass, [&](uint32_t i, const ChunkSpans& sp) -> Status {
        const Chunk& c = s.chunks_[i];
        return s.UpdateChunk(c, {sp.state.master, sp.state.m, sp.state.v},
                             s.serving_in_store_ ? sp.serving : c.serving, order);
      }));
}

// ---- choosing one ------------------------------------------------------------------------------

std::unique_ptr<ShardState::UpdatePolicy> ShardState::UpdatePolicy::Sync(ShardState* state) {
  return std::make_unique<SyncUpdate>(state);
}

Result<std::unique_ptr<ShardState::UpdatePolicy>> ShardState::UpdatePolicy::Create(
    ShardState* state, const OptimizerConfig& optimizer, ThreadPool* pool, uint64_t spares) {
  if (state->job_.update_mode != UpdateMode::kSpeculative || state->chunks_.empty()) {
    return Sync(state);
  }
  auto spec = std::make_unique<SpeculativeUpdate>(state);
  ZPS_RETURN_IF_ERROR(spec->Start(optimizer, pool, spares));
  return std::unique_ptr<UpdatePolicy>(std::move(spec));
}

}  // namespace zps::server
