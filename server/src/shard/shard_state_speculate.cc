// ShardState's speculative updates (UpdateMode::kSpeculative): a chunk is reduced and updated
// into a spare as soon as its gradient is complete, assuming the step neither clips nor skips;
// the commit publishes the spare, redoes the chunk from its live state, or drops the spare.
// The live master, m, v and serving copy are never written before the commit, so the
// "pre-update state" a redo starts from is simply the live one, and a skip restores nothing.
// With RAM state the new serving copy goes straight into the chunk's next serving bank, which
// no fetch reads ("Serving banks" in shard_state.h): the publish copies nothing.
// See shard_state.h and docs/architecture.md "The speculative step".
#include <algorithm>
#include <bit>
#include <cstring>

#include "shard/buffer_pool.h"
#include "shard/chunk_layout.h"
#include "shard/shard_chunk.h"
#include "zps/common/logging.h"
#include "zps/server/shard_state.h"

namespace zps::server {

bool ShardState::SameOrder(const CommitOrder& a, const CommitOrder& b) {
  return a.step == b.step && !a.skip && !b.skip && a.optimizer_step == b.optimizer_step &&
         std::bit_cast<uint32_t>(a.grad_scale) == std::bit_cast<uint32_t>(b.grad_scale);
}

Status ShardState::InitSpeculation(uint64_t spares) {
  const uint64_t sw = serving_words_;
  uint64_t largest = 0;
  for (const Chunk& c : chunks_) largest = std::max(largest, c.size);
  const size_t count =
      store_ ? static_cast<size_t>(std::min<uint64_t>(spares, chunks_.size())) : chunks_.size();
  spares_.resize(count);
  for (size_t k = 0; k < count; ++k) {
    const uint64_t n = store_ ? largest : chunks_[k].size;
    Spare& sp = spares_[k];
    ZPS_ASSIGN_OR_RETURN(sp.state, ChunkBuffers::Allocate(*kinds_, n));
    if (store_) {
      ZPS_ASSIGN_OR_RETURN(sp.serving, AlignedBuffer<uint16_t>::Allocate(n * sw));
    }
    spare_bytes_ += sp.state.bytes() + sp.serving.size() * sizeof(uint16_t);
  }
  spare_bytes_ += serving_bank_bytes_;  // the second serving bank (RAM state)
  {
    MutexLock lock(&mu_);  // not shared yet (Create); for the analysis
    if (store_) {
      for (size_t k = 0; k < count; ++k) free_spares_.push_back(static_cast<int>(k));
    }
    spec_stats_.spares = static_cast<uint32_t>(count);
    spec_stats_.spare_bytes = spare_bytes_;
  }
  ZPS_LOG(INFO) << "shard " << ordinal_ << ": speculative updates: " << count << " of "
                << chunks_.size() << " chunks can be speculated per step (" << spare_bytes_
                << " bytes of spare buffers)";
  spec_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "zps-speculate");
    SpeculationLoop();
  });
  return Status::Ok();
}

void ShardState::StopSpeculation() {
  {
    MutexLock lock(&mu_);
    spec_stop_ = true;
  }
  spec_cv_.SignalAll();
  if (spec_thread_.joinable()) spec_thread_.join();
}

void ShardState::ArmSpeculation(const CommitOrder& assumed) {
  if (!speculative_) return;
  MutexLock lock(&mu_);
  armed_ = assumed;
}

SpeculationStats ShardState::speculation_stats() const {
  MutexLock lock(&mu_);
  SpeculationStats out = spec_stats_;
  for (const Chunk& c : chunks_) out.in_flight += c.spec == SpecPhase::kSpeculated ? 1 : 0;
  out.busy = static_cast<uint32_t>(spec_busy_);
  return out;
}

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

Status ShardState::Speculate(const Chunk& c, Spare& sp, const CommitOrder& order) {
  const uint64_t n = c.size;
  if (!store_ && sp.state.master.size() != n) {  // given to a checkpoint's snapshot
    ZPS_ASSIGN_OR_RETURN(sp.state, buffers_->TakeLike(c.state));
  }
  ChunkState st = sp.state.prefix(n);
  if (store_) {  // read into the spare, updated there in place
    const std::span<uint16_t> serving = sp.serving.span().subspan(0, n * serving_words_);
    ZPS_RETURN_IF_ERROR(
        CountIo(store_->ReadChunk(static_cast<uint32_t>(IndexOf(c)), st.master, st.m, st.v)));
    return UpdateChunk(c, st, serving, order, nullptr, spec_optimizer_.get());
  }
  // Out of place from the live state, which nothing writes meanwhile: only ApplyCommit and
  // ResetTo do, and both wait for this chunk's speculation first (ApplyCommit handles it after
  // the others). No copy: the pass reads and writes the same bytes as the synchronous update.
  // The serving copy of version step + 1 goes into its bank, which no fetch reads.
  const ConstChunkState live = std::as_const(c.state).spans();
  return UpdateChunk(c, st, ServingFor(c, order.step + 1), order, &live, spec_optimizer_.get());
}

void ShardState::SpeculationLoop() {
  int64_t hooked = -1;  // the last step whose first speculated chunk called the test hook
  for (;;) {
    size_t i = 0;
    std::optional<CommitOrder> order;
    int spare = -1;
    bool late = false;  // reduced already (its report is out): speculate only
    {
      MutexLock lock(&mu_);
      spec_cv_.Wait(lock,
                    [&]() REQUIRES(mu_) { return spec_stop_ || shutdown_ || !spec_q_.empty(); });
      if (spec_stop_ || shutdown_) return;
      i = spec_q_.front();
      spec_q_.pop_front();
      Chunk& c = chunks_[i];
      // Anything else: claimed by ReduceStep, taken back by ApplyCommit, or rolled back.
      if (c.spec != SpecPhase::kQueued && c.spec != SpecPhase::kQueuedLate) continue;
      late = c.spec == SpecPhase::kQueuedLate;
      c.spec = late ? SpecPhase::kSpeculating : SpecPhase::kBusy;
      ++spec_busy_;
      if (late) ++spec_speculating_;
      if (armed_ && armed_->step == c.version) {
        if (!store_) {
          spare = static_cast<int>(i);
        } else if (!free_spares_.empty()) {
          spare = free_spares_.back();
          free_spares_.pop_back();
        }
        if (spare >= 0) order = *armed_;
      }
    }
    Chunk& c = chunks_[i];
    Result<ChunkReport> rep =
        late ? Result<ChunkReport>(ChunkReport{}) : ReduceChunk(c, spec_optimizer_.get());
    Status st = rep.status();
    bool speculated = false;
    bool reported = late;  // a late chunk's report is out already
    if (st.ok() && order && !late) {
      // The report is ready: ReduceStep need not wait for the update that follows.
      {
        MutexLock lock(&mu_);
        c.report = *rep;
        c.spec = SpecPhase::kSpeculating;
        ++spec_speculating_;
      }
      reported = true;
      cv_.SignalAll();
    }
    if (st.ok() && order) {
      if (test_hook_) test_hook_("speculating", order->step);
      Status s = Speculate(c, spares_[spare], *order);
      if (s.ok()) {
        speculated = true;
      } else {  // the chunk is updated at the commit instead
        ZPS_LOG(WARNING) << "speculative update of chunk " << c.id << " failed (" << s.ToString()
                         << "); it is updated at the commit";
      }
    }
    {
      MutexLock lock(&mu_);
      --spec_busy_;
      if (c.spec == SpecPhase::kSpeculating) --spec_speculating_;
      if (!st.ok()) {
        // A reduction cannot be repeated (it sums in place): the step fails at ReduceStep.
        spec_error_ = st.WithContext("reducing chunk " + std::to_string(c.id));
        c.spec = SpecPhase::kReduced;
      } else {
        if (!reported) c.report = *rep;
        c.spec = speculated ? SpecPhase::kSpeculated : SpecPhase::kReduced;
        if (speculated) {
          c.spec_order = *order;
          c.spare = spare;
        }
      }
      if (!speculated && spare >= 0 && store_) free_spares_.push_back(spare);
    }
    cv_.SignalAll();
    if (speculated && order->step != hooked) {
      hooked = order->step;
      if (test_hook_) test_hook_("speculate", order->step);
    }
  }
}

Status ShardState::PublishSpare(Chunk& c, Spare& sp) {
  const uint64_t n = c.size;
  const std::span<const uint16_t> serving = sp.serving.span().subspan(0, n * serving_words_);
  const ChunkState st = sp.state.prefix(n);
  const uint32_t idx = static_cast<uint32_t>(IndexOf(c));
  ZPS_RETURN_IF_ERROR(CountIo(store_->WriteChunk(idx, st.master, st.m, st.v)));
  if (ServingSpilled(c)) return CountIo(store_->WriteServing(idx, serving));
  std::memcpy(c.serving.data(), serving.data(), serving.size_bytes());
  return Status::Ok();
}

Status ShardState::ApplySpeculative(const CommitOrder& order) {
  // A chunk still being speculated (kSpeculating; with RAM state only, ApplyCommit waits
  // otherwise) is handled last: the pass over the others runs beside it.
  std::vector<size_t> now, later;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < chunks_.size(); ++i) {
      (chunks_[i].spec == SpecPhase::kSpeculating ? later : now).push_back(i);
    }
  }
  SpecCounts n;
  ZPS_RETURN_IF_ERROR(ApplySpeculativeTo(now, order, n));
  if (!later.empty()) {
    {
      MutexLock lock(&mu_);
      cv_.Wait(lock, [&]() REQUIRES(mu_) { return shutdown_ || spec_busy_ == 0; });
      if (shutdown_) return shutdown_reason_;
      spec_stats_.beside += later.size();
    }
    ZPS_RETURN_IF_ERROR(ApplySpeculativeTo(later, order, n));
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

Status ShardState::ApplySpeculativeTo(const std::vector<size_t>& chunks, const CommitOrder& order,
                                      SpecCounts& n) {
  std::vector<char> use(chunks_.size(), 0);
  std::shared_ptr<Snapshot> snap;
  {
    MutexLock lock(&mu_);
    snap = snapshot_.lock();
    SpecCounts here;
    for (size_t i : chunks) {
      const Chunk& c = chunks_[i];
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
    spec_stats_.published += here.published;
    spec_stats_.redone += here.redone;
    spec_stats_.dropped += here.dropped;
    spec_stats_.sync += here.sync;
    n.published += here.published;
    n.redone += here.redone;
    n.dropped += here.dropped;
    n.sync += here.sync;
  }
  if (order.skip) {  // nothing live was written: nothing to restore
    // The version advances over unchanged bytes: the next bank gets the current copy.
    for (size_t i : chunks) MirrorServing(chunks_[i]);
    return Status::Ok();
  }
  if (!store_) {
    // A published chunk's serving copy is in its next bank already; the others are written
    // there now.
    for (size_t i : chunks) {
      Chunk& c = chunks_[i];
      const std::span<uint16_t> next = ServingFor(c, order.step + 1);
      if (use[i] && snap && snap->Adopt(i, c.state)) {
        // A checkpoint still needs the pre-update state: it took the live buffers themselves;
        // the spare's become the live ones, and the spare is allocated again by the next
        // speculation of the chunk (off the critical path).
        c.state = std::move(spares_[i].state);
        continue;
      }
      if (use[i]) {
        c.state.swap(spares_[i].state);
      } else if (snap) {
        ZPS_RETURN_IF_ERROR(UpdateForSnapshot(i, *snap, order, next));
      } else {
        ZPS_RETURN_IF_ERROR(UpdateChunk(c, c.state.spans(), next, order));
      }
    }
    return Status::Ok();
  }
  std::vector<uint32_t> rest;
  for (size_t i : chunks) {
    if (use[i]) {
      ZPS_RETURN_IF_ERROR(PublishSpare(chunks_[i], spares_[chunks_[i].spare]));
    } else {
      rest.push_back(static_cast<uint32_t>(i));
    }
  }
  if (rest.empty()) return Status::Ok();
  PassOptions pass;
  pass.serving = serving_in_store_;
  return CountIo(store_->ForEachChunk(rest, pass, [&](uint32_t i, const ChunkSpans& s) -> Status {
    const Chunk& c = chunks_[i];
    return UpdateChunk(c, {s.state.master, s.state.m, s.state.v},
                       serving_in_store_ ? s.serving : c.serving, order);
  }));
}

}  // namespace zps::server
