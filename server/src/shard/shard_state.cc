#include "zps/server/shard_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shard/chunk_layout.h"
#include "shard/serving_tier.h"
#include "shard/shard_chunk.h"
#include "shard/snapshot_manager.h"
#include "shard/update_policy.h"
#include "zps/common/crc32c.h"
#include "zps/common/grad_quant.h"
#include "zps/common/logging.h"

namespace zps::server {

ShardState::ShardState(const Layout& layout, uint32_t ordinal, const ShardJob& job,
                       const OptimizerConfig& optimizer, ThreadPool* pool)
    : layout_(layout),
      ordinal_(ordinal),
      job_(job),
      pool_(pool),
      kinds_(std::make_unique<ChunkLayout>(ChunkLayout::For(optimizer, job.serving_dtype))),
      schedule_(job.lr_schedule),
      accum_(job.accumulation_steps),
      policy_(UpdatePolicy::Sync(this)),
      serving_(std::make_unique<ServingTier>(this)) {}

ShardState::~ShardState() {
  Shutdown(Cancelled("shard state destroyed"));
  policy_->Stop();
  serving_->Stop();
}

Result<ServingCopies> ParseServingCopies(std::string_view name) {
  if (name == "stored") return ServingCopies::kStored;
  if (name == "on-fetch") return ServingCopies::kOnFetch;
  return InvalidArgument("--serving-copies must be stored or on-fetch; got '" + std::string(name) +
                         "'");
}

Result<std::unique_ptr<ShardState>> ShardState::Create(
    const Layout& layout, uint32_t ordinal, const ShardJob& job, const OptimizerConfig& optimizer,
    ThreadPool* pool, const std::optional<ChunkStoreOptions>& spill,
    const ServingAllocator& serving_alloc, ServingCopies serving_copies) {
  if (ordinal >= layout.options().num_shards) {
    return InvalidArgument("shard ordinal " + std::to_string(ordinal) + " >= num_shards " +
                           std::to_string(layout.options().num_shards));
  }
  ZPS_RETURN_IF_ERROR(ValidateShardJob(job, layout, optimizer));
  std::unique_ptr<ShardState> s(new ShardState(layout, ordinal, job, optimizer, pool));
  ZPS_ASSIGN_OR_RETURN(s->optimizer_, Optimizer::Create(optimizer, pool));
  s->groups_ = job.param_groups;
  if (s->groups_.empty()) s->groups_.push_back({optimizer.lr, optimizer.weight_decay});
  s->chunk_ids_ = layout.ChunksOfShard(ordinal);
  // One slot per contributor (server-sum) or per micro-batch (pre-reduced).
  const uint32_t slots =
      (job.mode == ReductionMode::kServerSum ? job.world_size : 1) * job.accumulation_steps;
  const ChunkLayout& kinds = *s->kinds_;
  s->chunks_.resize(s->chunk_ids_.size());  // never resized again: the manager reads it
  s->snapshots_ = std::make_unique<SnapshotManager>(
      s->chunk_ids_,
      [raw = s.get()](size_t i) -> const ChunkBuffers& { return raw->chunks_[i].state; });
  const bool spilling = spill.has_value() && !s->chunk_ids_.empty();
  // Made on fetch, a conversion reads the live master between commits: speculation writes only
  // spares, and the commit that swaps or rewrites masters waits for a conversion in progress.
  s->serving_on_fetch_ = serving_copies == ServingCopies::kOnFetch && !s->chunk_ids_.empty();
  // Made on fetch, a store keeps no serving records: the reader converts its masters.
  s->serving_in_store_ = spilling && spill->serving_records && !s->serving_on_fetch_;
  for (size_t i = 0; i < s->chunk_ids_.size(); ++i) {
    Chunk& c = s->chunks_[i];
    c.id = s->chunk_ids_[i];
    c.size = layout.chunk_size(c.id);
    if (!spilling) {
      ZPS_ASSIGN_OR_RETURN(c.state, ChunkBuffers::Allocate(kinds, c.size));
    }
    ZPS_ASSIGN_OR_RETURN(c.slots, GradientSlots::Create(c.size, slots, job.grad_dtype));
  }
  // Every serving copy lives in one block (one UCX region, one rkey, when the server allocates
  // it), each copy at a 64-byte aligned offset.
  size_t serving_bytes = 0;
  for (const Chunk& c : s->chunks_) serving_bytes += kinds.serving_stride(c.size);
  if (s->TierServes()) serving_bytes = 0;  // the store places them, or there are none
  // Speculation with the state in RAM writes the next version's serving copies beside the ones
  // being served: two banks ("Serving banks" in shard_state.h).
  const bool banked = job.update_mode == UpdateMode::kSpeculative && !spilling;
  const size_t bank_bytes = serving_bytes;
  if (banked) serving_bytes *= 2;
  std::span<std::byte> serving;
  if (serving_bytes > 0 && serving_alloc) {
    ZPS_ASSIGN_OR_RETURN(serving, serving_alloc(serving_bytes));
    if (serving.size() < serving_bytes || reinterpret_cast<uintptr_t>(serving.data()) % 64 != 0) {
      return InvalidArgument("serving allocator returned " + std::to_string(serving.size()) +
                             " bytes (or unaligned memory) for " + std::to_string(serving_bytes));
    }
    std::memset(serving.data(), 0, serving_bytes);
  } else if (serving_bytes > 0) {
    ZPS_ASSIGN_OR_RETURN(s->serving_own_, AlignedBuffer<std::byte>::Allocate(serving_bytes));
    serving = s->serving_own_.span();
  }
  size_t serving_off = 0;
  for (Chunk& c : s->chunks_) {
    if (s->TierServes()) break;
    const uint64_t words = kinds.serving_words(c.size);
    c.serving = {reinterpret_cast<uint16_t*>(serving.data() + serving_off), words};
    if (banked && bank_bytes > 0) {
      c.banks[0] = c.serving;
      c.banks[1] = {reinterpret_cast<uint16_t*>(serving.data() + bank_bytes + serving_off), words};
    }
    serving_off += kinds.serving_stride(c.size);
  }
  if (banked) s->serving_bank_bytes_ = bank_bytes;
  ZPS_RETURN_IF_ERROR(s->BuildRuns());
  const bool speculative = job.update_mode == UpdateMode::kSpeculative && !s->chunks_.empty();
  uint64_t spares = 0;  // spare sets for speculation with a store
  if (spilling) {
    ChunkStoreOptions so = *spill;
    if (speculative) {
      // The spares count against the memory budget: a quarter of it (all chunks when there is
      // no budget) is set aside for them, and the store gets the rest. Chunks beyond the spares
      // are updated at the commit, as in sync mode.
      uint64_t largest = 0;
      for (const Chunk& c : s->chunks_) largest = std::max(largest, c.size);
      const uint64_t set_bytes = kinds.spare_set_bytes(largest, !s->serving_on_fetch_);
      if (so.memory_budget == UINT64_MAX) {
        spares = s->chunks_.size();
      } else {
        spares = std::min<uint64_t>(s->chunks_.size(), (so.memory_budget / 4) / set_bytes);
        so.memory_budget -= spares * set_bytes;
      }
    }
    so.moments = kinds.moments();
    so.state_dtype = kinds.state_dtype();
    so.serving_dtype = kinds.serving_dtype();
    std::vector<uint64_t> elems;
    for (const Chunk& c : s->chunks_) {
      s->store_ids_.push_back(static_cast<uint32_t>(elems.size()));
      elems.push_back(c.size);
    }
    if (s->serving_in_store_) {
      // Resident serving copies come from the ServingAllocator (the UCX region); the staging
      // buffers for fetches of spilled ones are taken from the serving budget.
      so.serving_ram_alloc = serving_alloc;
      uint64_t total = 0, largest = 0;
      for (uint64_t n : elems) {
        total += AlignUp(kinds.bytes(StateKind::kServing, n));
        largest = std::max(largest, AlignUp(kinds.bytes(StateKind::kServing, n)));
      }
      if (total > so.serving_memory_budget) {
        const uint64_t staging = uint64_t{kServingStagingBuffers} * largest;
        if (staging > so.serving_memory_budget) {
          return ResourceExhausted(
              "serving budget " + std::to_string(so.serving_memory_budget) +
              " bytes cannot hold the " + std::to_string(kServingStagingBuffers) +
              " fetch staging buffers of " + std::to_string(largest) +
              " bytes (plus the spill pipeline's); raise it or lower the chunk size");
        }
        so.serving_memory_budget -= staging;
      }
    } else {
      so.serving_records = false;  // serving copies stay in the shard's RAM block
    }
    ZPS_ASSIGN_OR_RETURN(s->store_, ChunkStore::Create(so, std::move(elems)));
    if (s->serving_in_store_) ZPS_RETURN_IF_ERROR(s->serving_->Start());
  }
  if (s->serving_on_fetch_) ZPS_RETURN_IF_ERROR(s->serving_->Start());
  ZPS_ASSIGN_OR_RETURN(s->policy_, UpdatePolicy::Create(s.get(), optimizer, pool, spares));
  return s;
}

Status ShardState::BuildRuns() {
  // Parameter runs inside each local chunk (ascending: parameters are laid out in order), and
  // each parameter's attributes: group and frozen flag.
  auto group_of = [&](uint32_t p) { return job_.param_group.empty() ? 0u : job_.param_group[p]; };
  auto frozen_of = [&](uint32_t p) { return !job_.frozen.empty() && job_.frozen[p] != 0; };
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> starts(chunks_.size());  // (off, param)
  for (uint32_t p = 0; p < layout_.num_params(); ++p) {
    ZPS_ASSIGN_OR_RETURN(auto pieces, layout_.Pieces(p));
    for (const Piece& piece : pieces) {
      if (layout_.shard_of_chunk(piece.chunk) != ordinal_) continue;
      Chunk* c = FindChunk(piece.chunk);
      c->slots.AddParam(piece.chunk_offset, piece.chunk_offset + piece.length, frozen_of(p));
      starts[IndexOf(*c)].emplace_back(piece.chunk_offset, p);
    }
  }
  for (Chunk& c : chunks_) {
    const auto& st = starts[IndexOf(c)];
    // Elements before the chunk's first parameter piece are padding of the parameter laid out
    // before it (or, for a chunk without pieces, of no parameter: group 0).
    auto attrs = [&](uint32_t p) { return Chunk::Run{0, 0, group_of(p), frozen_of(p)}; };
    Chunk::Run lead{0, 0, 0, false};
    if (!st.empty() && st.front().second > 0)
      lead = attrs(st.front().second - 1);
    else if (!st.empty())
      lead = attrs(st.front().second);
    std::vector<Chunk::Run> raw;
    uint64_t pos = 0;
    Chunk::Run cur = lead;
    for (const auto& [off, p] : st) {
      if (off > pos) raw.push_back({pos, off, cur.group, cur.frozen});
      pos = off;
      cur = attrs(p);
    }
    if (pos < c.size) raw.push_back({pos, c.size, cur.group, cur.frozen});
    for (const Chunk::Run& r : raw) {
      if (!c.runs.empty() && c.runs.back().group == r.group && c.runs.back().frozen == r.frozen) {
        c.runs.back().end = r.end;
      } else {
        c.runs.push_back(r);
      }
    }
  }
  return Status::Ok();
}

ShardState::Chunk* ShardState::FindChunk(uint32_t id) {
  const uint32_t n = layout_.options().num_shards;
  if (id >= layout_.num_chunks() || id % n != ordinal_) return nullptr;
  return &chunks_[(id - ordinal_) / n];
}

const ShardState::Chunk* ShardState::FindChunk(uint32_t id) const {
  return const_cast<ShardState*>(this)->FindChunk(id);
}

uint64_t ShardState::epoch() const {
  MutexLock lock(&mu_);
  return epoch_;
}

int64_t ShardState::version() const {
  MutexLock lock(&mu_);
  int64_t v = INT64_MAX;
  for (const auto& c : chunks_) v = std::min(v, c.version);
  return chunks_.empty() ? 0 : v;
}

Result<PushTicket> ShardState::BeginPush(const PushRequest& req) {
  if (req.length == 0) return InvalidArgument("push of zero elements");
  const bool init = req.step == kInitStep;
  if (init ? req.dtype != DType::kF32 : req.dtype != job_.grad_dtype) {
    return InvalidArgument(std::string("push dtype ") + std::string(DTypeName(req.dtype)) +
                           " does not match the job's " +
                           std::string(DTypeName(init ? DType::kF32 : job_.grad_dtype)));
  }
  if (req.rank >= job_.world_size * accum_) {
    if (accum_ == 1) {
      return InvalidArgument("rank " + std::to_string(req.rank) + " >= world size " +
                             std::to_string(job_.world_size));
    }
    return InvalidArgument("contributor " + std::to_string(req.rank) + " >= world size " +
                           std::to_string(job_.world_size) + " x accumulation_steps " +
                           std::to_string(accum_));
  }
  if (req.session_rank && req.rank / accum_ != *req.session_rank) {
    return InvalidArgument("contributor " + std::to_string(req.rank) + " (rank " +
                           std::to_string(req.rank / accum_) + ", micro " +
                           std::to_string(req.rank % accum_) + ") pushed by rank " +
                           std::to_string(*req.session_rank) + "'s session");
  }
  if (init && req.rank % accum_ != 0) {
    return InvalidArgument("initial values are pushed with micro 0");
  }
  MutexLock lock(&mu_);
  if (shutdown_) return shutdown_reason_;
  if (req.epoch && *req.epoch != epoch_) {
    return Unavailable("push from before the shard rolled back (generation " +
                       std::to_string(*req.epoch) + ", now " + std::to_string(epoch_) +
                       "); re-join");
  }
  Chunk* c = FindChunk(req.chunk);
  if (c == nullptr) {
    return OutOfRange("chunk " + std::to_string(req.chunk) + " is not on shard " +
                      std::to_string(ordinal_));
  }
  if (req.offset >= c->size || req.length > c->size - req.offset) {
    return OutOfRange("push range outside chunk " + std::to_string(req.chunk));
  }
  // The range must lie inside one parameter run.
  const GradientSlots::Param* param = c->slots.ParamOf(req.offset, req.length);
  if (param == nullptr) {
    return OutOfRange("push range [" + std::to_string(req.offset) + ", +" +
                      std::to_string(req.length) + ") is not inside one parameter");
  }
  if (!init && param->frozen) {
    return InvalidArgument("push range [" + std::to_string(req.offset) + ", +" +
                           std::to_string(req.length) + ") of chunk " + std::to_string(c->id) +
                           " is in a frozen parameter (never pushed)");
  }
  if (init) {
    if (c->version == 0) {
      // Initialised, and no step applied yet: rank 0 joined again at step 0 (its step 0 failed
      // without a rollback) and pushes its initial values again. The shard keeps the values it
      // holds, as a rank joining at a later step does (from the same process they are the same
      // bits), so the copy is received and dropped.
      return DiscardedPush(req, 0);
    }
    if (c->version > 0) {
      // A step was applied since: rank 0 was told to start at step 0 while that step was
      // being decided (its own gradients of step 0, pushed before it re-joined, completed it).
      // Joining again gives it the step the job is at now.
      return Unavailable("chunk " + std::to_string(c->id) +
                         " is already initialised and updated (version " +
                         std::to_string(c->version) +
                         "): the job moved past step 0 while this rank joined; re-join");
    }
  } else if (c->version == -1) {
    return FailedPrecondition("chunk " + std::to_string(c->id) + " is not initialised yet");
  } else if (req.step < c->version) {
    return FailedPrecondition("stale step " + std::to_string(req.step) + " (chunk at version " +
                              std::to_string(c->version) + ")");
  } else if (req.step > c->version) {
    return FailedPrecondition("future step " + std::to_string(req.step) + " (chunk at version " +
                              std::to_string(c->version) + ")");
  }
  const uint32_t slot =
      init ? 0 : (job_.mode == ReductionMode::kPreReduced ? req.rank % accum_ : req.rank);
  const uint64_t b = req.offset, e = req.offset + req.length;
  if (c->slots.Overlaps(slot, b, e)) {
    if (!init && Sealed(*c)) {
      // A restarted rank pushing again a step its old process completed (ForgetRank kept it):
      // the same rank computes the same bits (pre-reduced: the ranks redo the same
      // reduce-scatter of the same gradients), so the copy is received and dropped.
      return DiscardedPush(req, slot);
    }
    return AlreadyExists(
        "elements [" + std::to_string(b) + ", " + std::to_string(e) + ") of chunk " +
        std::to_string(c->id) + " were already pushed by " +
        (slot == 0 && req.rank != 0 ? "a rank" : "rank " + std::to_string(req.rank)));
  }
  // Initial values land in gradient slot 0 too (free until the first step): no push ever writes
  // into the master directly. 16-bit gradients land in their slot as they are.
  GradientSlots::Target target = c->slots.Reserve(slot, b, e, req.dtype);
  PushTicket t;
  t.req_ = req;
  t.slot_ = slot;
  t.epoch_ = epoch_;
  t.bytes_ = PushBytes(req.dtype, req.length);
  t.dest_ = target.dest;
  t.slot_buffer_ = std::move(target.fp32);
  t.slot16_buffer_ = std::move(target.half);
  t.slot_quantized_ = std::move(target.quantized);
  return t;
}

PushTicket ShardState::DiscardedPush(const PushRequest& req, uint32_t slot) const {
  PushTicket t;
  t.req_ = req;
  t.slot_ = slot;
  t.epoch_ = epoch_;
  t.bytes_ = PushBytes(req.dtype, req.length);
  t.staging_ = push_staging_.Acquire(t.bytes_);
  t.dest_ = t.staging_.get();
  t.discard_ = true;
  return t;
}

Status ShardState::FinishPush(PushTicket t, const Status& transfer) {
  std::vector<std::pair<Waiter, Status>> ready;
  {
    MutexLock lock(&mu_);
    Chunk* c = FindChunk(t.req_.chunk);
    if (c == nullptr || t.dest_ == nullptr)
      return InvalidArgument("FinishPush with an invalid ticket");
    if (t.discard_) return Status::Ok();  // pushed again (see BeginPush)
    if (t.epoch_ != epoch_) return Unavailable("push begun before the shard rolled back; re-join");
    if (!c->slots.Current(t.slot_,
                          {t.slot_buffer_, t.slot16_buffer_, t.slot_quantized_, t.dest_})) {
      return Unavailable("push of a session its rank replaced (ForgetRank): dropped");
    }
    if (!transfer.ok()) {
      c->slots.Release(t.slot_, t.req_.offset);
      return Status::Ok();
    }
    c->slots.Land(t.slot_, t.req_.length);
    if (t.req_.step == kInitStep) {
      if (c->slots.InitComplete()) {
        if (store_) {
          if (Status st = StoreInitChunk(*c); !st.ok()) {
            c->slots.ResetCoverage();  // the initial values must be pushed again
            return st.WithContext("storing the initial values of chunk " + std::to_string(c->id));
          }
        } else {
          std::memcpy(c->state.master.data(), c->slots.initial_values().data(),
                      c->size * sizeof(float));
        }
        std::span<const float> master =
            store_ ? c->slots.initial_values() : std::span<const float>(c->state.master.span());
        if (ServedByTier(*c)) {
          if (Status st = serving_->Write(*c, master); !st.ok()) {
            c->slots.ResetCoverage();  // the initial values must be pushed again
            return st.WithContext("storing the serving copy of chunk " + std::to_string(c->id));
          }
        } else {
          c->serving = ServingFor(*c, 0);
          ToServing(master, c->serving);
          MirrorServing(*c);  // frozen runs are never rewritten: both banks hold them
        }
        c->slots.ResetCoverage();
        Publish(*c, 0, ready);
        cv_.SignalAll();
      }
    } else if (c->slots.Complete()) {
      policy_->OnComplete(*c);
      cv_.SignalAll();
    }
  }
  Answer(ready, 0);
  return Status::Ok();
}

bool ShardState::StepReady(int64_t step) const {
  for (const auto& c : chunks_) {
    if (c.version != step || !c.slots.Complete()) return false;
  }
  return true;
}

Status ShardState::WaitForGradients(int64_t step, std::chrono::milliseconds timeout) {
  MutexLock lock(&mu_);
  bool ok =
      cv_.WaitFor(lock, timeout, [&]() REQUIRES(mu_) { return shutdown_ || StepReady(step); });
  if (shutdown_) return shutdown_reason_;
  if (!ok) return DeadlineExceeded("gradients of step " + std::to_string(step) + " incomplete");
  sealed_step_ = step;
  return Status::Ok();
}

Result<std::vector<std::pair<uint32_t, ChunkReport>>> ShardState::ReduceStep(int64_t step) {
  std::vector<size_t> mine;  // chunks this thread reduces (not taken by the speculation thread)
  {
    MutexLock lock(&mu_);
    if (!StepReady(step)) {
      return FailedPrecondition("step " + std::to_string(step) + " is not complete on this shard");
    }
    for (size_t i = 0; i < chunks_.size(); ++i) {
      Chunk& c = chunks_[i];
      if (c.spec == SpecPhase::kIdle || c.spec == SpecPhase::kQueued) {
        c.spec = SpecPhase::kBusy;  // a queued entry is then skipped by the speculation thread
        mine.push_back(i);
      }
    }
    // Every chunk reduced; a speculation in progress (kSpeculating) has its report already.
    cv_.Wait(lock, [&]() REQUIRES(mu_) { return shutdown_ || policy_->ReductionsDone(); });
    if (shutdown_) return shutdown_reason_;
    ZPS_RETURN_IF_ERROR(policy_->ReductionError());
    sealed_step_ = step;  // (ForgetRank); called again before the publish, nothing is reduced twice
  }
  // Complete chunks are not touched by pushes (every range is taken), so no lock is needed.
  for (size_t i : mine) {
    Chunk& c = chunks_[i];
    ZPS_ASSIGN_OR_RETURN(ChunkReport rep, ReduceChunk(c));
    MutexLock lock(&mu_);
    c.report = rep;
    c.spec = SpecPhase::kReduced;
  }
  std::vector<std::pair<uint32_t, ChunkReport>> out;
  out.reserve(chunks_.size());
  MutexLock lock(&mu_);
  for (const Chunk& c : chunks_) out.emplace_back(c.id, c.report);
  policy_->OnReduced(step, mine);
  return out;
}

Status ShardState::ApplyCommit(const CommitOrder& order, std::optional<CommitOrder> next) {
  std::shared_ptr<Snapshot> snap;
  {
    MutexLock lock(&mu_);
    if (!StepReady(order.step)) {
      return FailedPrecondition("commit for step " + std::to_string(order.step) +
                                " before its gradients are complete");
    }
    cv_.Wait(lock, [&]() REQUIRES(mu_) { return shutdown_ || policy_->CommitReady(); });
    if (shutdown_) return shutdown_reason_;
    for (Chunk& c : chunks_) {
      if (c.spec == SpecPhase::kQueuedLate) c.spec = SpecPhase::kReduced;
    }
    for (const Chunk& c : chunks_) {
      if (c.spec != SpecPhase::kReduced && c.spec != SpecPhase::kSpeculated &&
          c.spec != SpecPhase::kSpeculating) {
        return FailedPrecondition("commit for step " + std::to_string(order.step) +
                                  " before ReduceStep");
      }
    }
    snap = snapshots_->Current();
  }
  const bool rewrite_serving = !order.skip && TierServes();
  if (rewrite_serving) serving_->BeginRewrite();
  Status st = policy_->Apply(order, snap);
  if (!st.ok() && rewrite_serving) serving_->EndRewrite(st);
  ZPS_RETURN_IF_ERROR(st);
  std::vector<std::pair<Waiter, Status>> ready;
  {
    MutexLock lock(&mu_);
    for (Chunk& c : chunks_) {
      c.slots.ResetCoverage();
      policy_->OnPublished(c);
      c.spec = SpecPhase::kIdle;
      c.spare = -1;
      Publish(c, order.step + 1, ready);
    }
    policy_->OnCommitted(next);
    if (rewrite_serving) serving_->Published();
  }
  Answer(ready, order.step + 1);
  return Status::Ok();
}

void ShardState::Answer(std::vector<std::pair<Waiter, Status>>& ready, int64_t version) {
  for (auto& [w, st] : ready) {
    const Chunk* c = FindChunk(w.req.chunk);
    if (st.ok() && ServedByTier(*c)) {
      MutexLock lock(&mu_);
      if (!shutdown_) {
        serving_->Queue(std::move(w));
        continue;
      }
      const Status reason = shutdown_reason_;
      lock.Unlock();
      w.cb(reason, -1, {}, nullptr);
      continue;
    }
    w.cb(st, version, ServingBytesOf(*c, w.req), nullptr);
  }
}

std::span<const std::byte> ShardState::CopyBytes(const Chunk& c,
                                                 std::span<const uint16_t> serving) const {
  return std::as_bytes(serving).subspan(0, kinds_->bytes(StateKind::kServing, c.size));
}

std::span<const std::byte> ShardState::ServingBytesOf(const Chunk& c,
                                                      const FetchRequest& req) const {
  const QuantRange r = kinds_->serving_range(c.size, req.offset, req.length);
  return std::as_bytes(std::span<const uint16_t>(c.serving)).subspan(r.offset, r.bytes);
}

void ShardState::ArmSpeculation(const CommitOrder& assumed) { policy_->Arm(assumed); }

SpeculationStats ShardState::speculation_stats() const {
  MutexLock lock(&mu_);
  return policy_->stats();
}

Result<uint64_t> ShardState::ForgetRank(uint32_t rank) {
  MutexLock lock(&mu_);
  uint64_t dropped = 0;
  auto forget = [&](Chunk& c, uint32_t slot) -> Status {
    // A buffer a ticket still holds is replaced, so the old transfer writes into memory no one
    // reads and FinishPush refuses it.
    ZPS_ASSIGN_OR_RETURN(uint64_t n, c.slots.Forget(slot));
    dropped += n;
    return Status::Ok();
  };
  for (Chunk& c : chunks_) {
    if (c.version == -1) {
      if (rank == 0) ZPS_RETURN_IF_ERROR(forget(c, 0));  // the initial values
      continue;
    }
    if (Sealed(c)) continue;
    if (job_.mode == ReductionMode::kPreReduced) {
      // Slices have no per-rank owner, and every rank restarts the step with a new
      // communicator (the coordinator's worker generation): the whole step is pushed again.
      for (uint32_t slot = 0; slot < c.slots.count(); ++slot) ZPS_RETURN_IF_ERROR(forget(c, slot));
      continue;
    }
    for (uint32_t micro = 0; micro < accum_; ++micro) {
      const uint32_t slot = rank * accum_ + micro;
      if (slot < c.slots.count()) ZPS_RETURN_IF_ERROR(forget(c, slot));
    }
  }
  return dropped;
}

std::vector<uint32_t> ShardState::MissingRanks(int64_t step) const {
  MutexLock lock(&mu_);
  std::vector<uint32_t> out;
  if (job_.mode == ReductionMode::kPreReduced) return out;
  for (uint32_t rank = 0; rank < job_.world_size; ++rank) {
    bool missing = false;
    for (const Chunk& c : chunks_) {
      if (c.version != step) continue;
      for (uint32_t micro = 0; micro < accum_ && !missing; ++micro) {
        const uint32_t slot = rank * accum_ + micro;
        missing = slot < c.slots.count() && c.slots.landed(slot) != c.slots.expected();
      }
      if (missing) break;
    }
    if (missing) out.push_back(rank);
  }
  return out;
}

void ShardState::Publish(Chunk& c, int64_t version, std::vector<std::pair<Waiter, Status>>& ready) {
  c.version = version;
  c.serving = ServingFor(c, version);
  auto keep = c.waiters.begin();
  for (auto it = c.waiters.begin(); it != c.waiters.end(); ++it) {
    if (it->req.min_version <= version) {
      ready.emplace_back(std::move(*it), Status::Ok());
    } else {
      *keep++ = std::move(*it);
    }
  }
  c.waiters.erase(keep, c.waiters.end());
}

void ShardState::Fetch(const FetchRequest& req, FetchCallback cb) {
  MutexLock lock(&mu_);
  if (shutdown_) {
    Status s = shutdown_reason_;
    lock.Unlock();
    cb(s, -1, {}, nullptr);
    return;
  }
  Chunk* c = FindChunk(req.chunk);
  Status bad;
  if (c == nullptr) {
    bad = OutOfRange("chunk " + std::to_string(req.chunk) + " is not on shard " +
                     std::to_string(ordinal_));
  } else if (req.length == 0 || req.offset >= c->size || req.length > c->size - req.offset) {
    bad = OutOfRange("fetch range outside chunk " + std::to_string(req.chunk));
  } else if (req.min_version < 0 || req.min_version > c->version + 1) {
    bad = FailedPrecondition("fetch for version " + std::to_string(req.min_version) +
                             " while chunk " + std::to_string(req.chunk) + " is at " +
                             std::to_string(c->version));
  }
  if (!bad.ok()) {
    lock.Unlock();
    cb(bad, -1, {}, nullptr);
    return;
  }
  if (c->version >= req.min_version && ServedByTier(*c)) {
    serving_->Queue({req, std::move(cb)});  // read back from NVMe, or made, by the reader
    return;
  }
  if (c->version >= req.min_version) {
    int64_t v = c->version;
    auto data = ServingBytesOf(*c, req);
    lock.Unlock();
    cb(Status::Ok(), v, data, nullptr);
    return;
  }
  c->waiters.push_back({req, std::move(cb)});
}

void ShardState::Shutdown(const Status& reason) {
  std::vector<Waiter> failed;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    shutdown_reason_ = reason;
    for (auto& c : chunks_) {
      for (auto& w : c.waiters) failed.push_back(std::move(w));
      c.waiters.clear();
    }
    for (auto& w : serving_->TakeQueued()) failed.push_back(std::move(w));
  }
  cv_.SignalAll();
  serving_->Wake();
  policy_->Wake();
  for (auto& w : failed) w.cb(reason, -1, {}, nullptr);
}

uint32_t ShardState::GradientCrc() const {
  MutexLock lock(&mu_);
  uint32_t crc = 0;
  for (const auto& c : chunks_) crc = c.slots.Crc(crc);
  return crc;
}

// The CRCs and MasterOf read the store without mu_: the store holds its own mutex for a whole
// update pass, and a CRC asked for during one would otherwise hold mu_ until the pass ends,
// stalling every fetch and push (they need mu_) on the UCX thread. State in RAM is read under
// mu_ (a speculative publish swaps a chunk's buffers under it); chunks_ is fixed at Create.
uint32_t ShardState::StateCrc() const {
  uint32_t crc = 0;
  std::vector<float> master;
  std::vector<std::byte> m, v;
  for (const auto& c : chunks_) {
    if (store_) {
      // A failed read is counted and logged; the CRC then covers zeros (it cannot match).
      if (Status st = StoreChunkCopy(c, master, m, v); !st.ok()) {
        ZPS_LOG(ERROR) << "StateCrc: " << st.ToString();
      }
      crc = Crc32cExtend(crc, std::as_bytes(std::span<const float>(master)));
      crc = Crc32cExtend(crc, m);
      crc = Crc32cExtend(crc, v);
    } else {
      MutexLock lock(&mu_);
      crc = c.state.Crc(crc);
    }
    if (ServedByTier(c)) {
      std::vector<uint16_t> serving;
      if (Status st = serving_->Copy(c, serving); !st.ok()) {
        ZPS_LOG(ERROR) << "StateCrc: " << st.ToString();
      }
      crc = Crc32cExtend(crc, CopyBytes(c, serving));
    } else {
      MutexLock lock(&mu_);
      crc = Crc32cExtend(crc, CopyBytes(c, c.serving));
    }
    int64_t version;
    {
      MutexLock lock(&mu_);
      version = c.version;
    }
    crc = Crc32cExtend(crc, std::as_bytes(std::span<const int64_t>(&version, 1)));
  }
  return crc;
}

Result<uint32_t> ShardState::ChunkCrc(uint32_t chunk) const {
  const Chunk* c = FindChunk(chunk);
  if (c == nullptr) return OutOfRange("chunk " + std::to_string(chunk) + " is not on this shard");
  uint32_t crc = 0;
  if (store_) {
    std::vector<float> master;
    std::vector<std::byte> m, v;
    ZPS_RETURN_IF_ERROR(StoreChunkCopy(*c, master, m, v));
    crc = Crc32c(master.data(), master.size() * sizeof(float));
    crc = Crc32cExtend(crc, m);
    crc = Crc32cExtend(crc, v);
  } else {
    MutexLock lock(&mu_);
    crc = c->state.Crc(0);
  }
  if (ServedByTier(*c)) {  // spilled, or made on fetch: the copy a fetch would get
    std::vector<uint16_t> serving;
    ZPS_RETURN_IF_ERROR(serving_->Copy(*c, serving));
    return Crc32cExtend(crc, CopyBytes(*c, serving));
  }
  MutexLock lock(&mu_);
  return Crc32cExtend(crc, CopyBytes(*c, c->serving));
}

Result<std::vector<float>> ShardState::MasterOf(uint32_t chunk) const {
  const Chunk* c = FindChunk(chunk);
  if (c == nullptr) return OutOfRange("chunk " + std::to_string(chunk) + " is not on this shard");
  if (store_) {
    std::vector<float> master;
    std::vector<std::byte> m, v;
    ZPS_RETURN_IF_ERROR(StoreChunkCopy(*c, master, m, v));
    return master;
  }
  MutexLock lock(&mu_);
  return std::vector<float>(c->state.master.data(), c->state.master.data() + c->size);
}

}  // namespace zps::server
