// chunk_store.cc — placement, the pipelined pass, and single-chunk transfers.
#include "zps/server/chunk_store.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "zps/common/logging.h"
#include "zps/common/serving_quant.h"
#include "zps/common/spill_budget.h"

namespace zps::server {

// A pipeline slot: one state buffer and one serving buffer from the pools.
struct ChunkStore::Slot {
  enum class St : uint8_t { kFree, kReading, kReady, kWriting };
  St st = St::kFree;
  uint32_t chunk = 0;
  uint32_t pending = 0;  // requests not yet completed
  Status err;            // first failed request of the current read or write
  bool err_serving = false;
  std::byte* state = nullptr;
  std::byte* serving = nullptr;
};

namespace {

// A request's tag: its length (high 32 bits), then slot index * 2 + (1 for the serving record).
uint64_t MakeTag(uint32_t len, size_t slot, bool serving) {
  return (uint64_t{len} << 32) | (slot * 2 + (serving ? 1 : 0));
}

// Cuts [offset, offset + bytes) into requests of at most `piece` bytes.
void Split(IoRequest::Op op, int fd, uint64_t offset, std::byte* buf, uint64_t bytes,
           uint32_t piece, size_t slot, bool serving, std::deque<IoRequest>& q) {
  for (uint64_t done = 0; done < bytes; done += piece) {
    const auto len = static_cast<uint32_t>(std::min<uint64_t>(piece, bytes - done));
    q.push_back({op, fd, buf + done, len, offset + done, MakeTag(len, slot, serving)});
  }
}

uint32_t Pieces(uint64_t bytes, uint32_t piece) {
  return static_cast<uint32_t>((bytes + piece - 1) / piece);
}

}  // namespace

ChunkStore::ChunkStore(const ChunkStoreOptions& options) : options_(options) {}
ChunkStore::~ChunkStore() {
  engine_.reset();  // reaps anything in flight before the buffers go
}

Result<std::unique_ptr<ChunkStore>> ChunkStore::Create(const ChunkStoreOptions& options,
                                                       std::vector<uint64_t> chunk_elems) {
  const auto& o = options;
  if (o.queue_depth == 0 || o.queue_depth > 4096) {
    return InvalidArgument("chunk store: queue_depth must be in [1, 4096]");
  }
  if (o.io_bytes == 0 || o.io_bytes % kDirectAlign != 0) {
    return InvalidArgument("chunk store: io_bytes must be a positive multiple of 4096");
  }
  if (o.read_ahead == 0 || o.write_behind == 0 || o.read_ahead > 64 || o.write_behind > 64) {
    return InvalidArgument("chunk store: read_ahead and write_behind must be in [1, 64]");
  }
  if (o.moments > 2) return InvalidArgument("chunk store: moments must be 0, 1 or 2");
  if (o.serving_dtype != DType::kF16 && o.serving_dtype != DType::kBF16 &&
      o.serving_dtype != DType::kF32 && o.serving_dtype != DType::kI8Block) {
    return InvalidArgument("chunk store: serving_dtype must be fp16, bf16, fp32 or int8-block");
  }
  if (chunk_elems.empty()) return InvalidArgument("chunk store: no chunks");
  if (chunk_elems.size() > (1ull << 31)) return InvalidArgument("chunk store: too many chunks");
  std::unique_ptr<ChunkStore> store(new ChunkStore(options));
  ZPS_RETURN_IF_ERROR(store->Init(std::move(chunk_elems)));
  return store;
}

Status ChunkStore::Init(std::vector<uint64_t> chunk_elems) {
  MutexLock lock(&mu_);  // not shared yet (Create); for the analysis
  const auto& o = options_;
  const uint64_t slots = o.read_ahead + 1 + o.write_behind;
  uint64_t total_state = 0, total_serving = 0;
  chunks_.resize(chunk_elems.size());
  for (size_t c = 0; c < chunk_elems.size(); ++c) {
    Chunk& k = chunks_[c];
    k.elems = chunk_elems[c];
    if (k.elems == 0 || k.elems > (1ull << 40)) {
      return InvalidArgument("chunk store: chunk " + std::to_string(c) + " has a bad size " +
                             std::to_string(k.elems));
    }
    k.moment_bytes = MomentBytes(o.state_dtype, k.elems);
    k.m_off = AlignUp(k.elems * sizeof(float));
    k.moment_stride = AlignUp(k.moment_bytes);
    k.state_bytes = k.m_off + o.moments * k.moment_stride;
    k.serving_bytes =
        o.serving_records ? AlignUp(ServingWords(o.serving_dtype, k.elems) * sizeof(uint16_t)) : 0;
    total_state += k.state_bytes;
    total_serving += k.serving_bytes;
    state_stride_max_ = std::max(state_stride_max_, k.state_bytes);
    serving_stride_max_ = std::max(serving_stride_max_, k.serving_bytes);
  }

  // Placement: if everything fits, no buffers; otherwise buffers first, then chunks in id order.
  auto place = [&](uint64_t budget, uint64_t total, uint64_t max_record, bool serving,
                   uint64_t* ram, uint64_t* file, bool* spills) -> Status {
    *ram = *file = 0;
    *spills = total > budget;
    uint64_t avail = budget;
    if (*spills) {
      // The advice is the one the launchers give before any shard starts (spill_budget.h).
      const SpillTier tier{serving ? "serving_memory_budget" : "memory_budget", budget, total,
                           max_record};
      ZPS_RETURN_IF_ERROR(CheckSpillPipeline(tier, slots).WithContext("chunk store"));
      avail -= slots * max_record;
    }
    for (auto& k : chunks_) {
      const uint64_t bytes = serving ? k.serving_bytes : k.state_bytes;
      bool& resident = serving ? k.serving_resident : k.state_resident;
      uint64_t& off = serving ? k.serving_off : k.state_off;
      resident = *ram + bytes <= avail;
      off = resident ? *ram : *file;
      (resident ? *ram : *file) += bytes;
    }
    return Status::Ok();
  };
  bool state_spills = false, serving_spills = false;
  uint64_t state_ram = 0, state_file = 0, serving_ram = 0, serving_file = 0;
  ZPS_RETURN_IF_ERROR(place(o.memory_budget, total_state, state_stride_max_, false, &state_ram,
                            &state_file, &state_spills));
  ZPS_RETURN_IF_ERROR(place(o.serving_memory_budget, total_serving, serving_stride_max_, true,
                            &serving_ram, &serving_file, &serving_spills));

  if (state_ram > 0) {
    ZPS_ASSIGN_OR_RETURN(state_ram_, AlignedBufferPool::Create(1, state_ram));
  }
  if (serving_ram > 0 && o.serving_ram_alloc) {
    ZPS_ASSIGN_OR_RETURN(std::span<std::byte> mem, o.serving_ram_alloc(serving_ram));
    if (mem.size() < serving_ram || reinterpret_cast<uintptr_t>(mem.data()) % 64 != 0) {
      return InvalidArgument("chunk store: serving_ram_alloc returned " +
                             std::to_string(mem.size()) + " bytes (or unaligned memory) for " +
                             std::to_string(serving_ram));
    }
    std::memset(mem.data(), 0, serving_ram);  // all state starts at zero
    serving_ram_base_ = mem.data();
  } else if (serving_ram > 0) {
    ZPS_ASSIGN_OR_RETURN(serving_ram_, AlignedBufferPool::Create(1, serving_ram));
    serving_ram_base_ = serving_ram_->buffer(0);
  }
  if (!state_spills && !serving_spills) {
    stats_.chunks = num_chunks();
    stats_.state_resident = stats_.serving_resident = num_chunks();
    stats_.state_ram_bytes = state_ram;
    stats_.serving_ram_bytes = serving_ram;
    return Status::Ok();
  }
  // A slot carries a buffer of each tier that spills (the budgets paid for those only), so a
  // chunk needs one slot whatever spills.
  slot_count_ = slots;
  if (state_spills) {
    ZPS_ASSIGN_OR_RETURN(state_bufs_, AlignedBufferPool::Create(slots, state_stride_max_));
  }
  if (serving_spills) {
    ZPS_ASSIGN_OR_RETURN(serving_bufs_, AlignedBufferPool::Create(slots, serving_stride_max_));
  }
  SpillFileOptions fo;
  fo.direct = o.direct_io;
  fo.allow_buffered_fallback = o.allow_buffered_fallback;
  if (state_file > 0) {
    ZPS_ASSIGN_OR_RETURN(
        state_file_, SpillFile::Create(o.spill_dir, o.file_prefix + "-state.zps", state_file, fo));
  }
  if (serving_file > 0) {
    ZPS_ASSIGN_OR_RETURN(
        serving_file_,
        SpillFile::Create(o.spill_dir, o.file_prefix + "-serving.zps", serving_file, fo));
  }
  UringOptions uo;
  uo.depth = o.queue_depth;
  uo.sqpoll = o.sqpoll;
  if (o.register_buffers) {
    for (size_t i = 0; i < slots; ++i) {
      if (state_bufs_) {
        uo.fixed_buffers.push_back({state_bufs_->buffer(i), state_bufs_->buffer_bytes()});
      }
      if (serving_bufs_) {
        uo.fixed_buffers.push_back({serving_bufs_->buffer(i), serving_bufs_->buffer_bytes()});
      }
    }
  }
  ZPS_ASSIGN_OR_RETURN(engine_, CreateUringEngine(uo));
  if (o.wrap_engine) engine_ = o.wrap_engine(std::move(engine_));

  stats_.chunks = num_chunks();
  for (const auto& k : chunks_) {
    stats_.state_resident += k.state_resident ? 1 : 0;
    stats_.serving_resident += k.serving_resident ? 1 : 0;
  }
  stats_.state_ram_bytes = state_ram;
  stats_.serving_ram_bytes = serving_ram;
  stats_.serving_buffer_bytes = serving_bufs_ ? serving_bufs_->total_bytes() : 0;
  stats_.buffer_bytes =
      (state_bufs_ ? state_bufs_->total_bytes() : 0) + stats_.serving_buffer_bytes;
  stats_.state_file_bytes = state_file;
  stats_.serving_file_bytes = serving_file;
  stats_.direct =
      (!state_file_ || state_file_->direct()) && (!serving_file_ || serving_file_->direct());
  // Without serving records the shard keeps its serving copies itself, or none.
  ZPS_LOG(INFO) << "chunk store: " << stats_.state_resident << "/" << stats_.chunks
                << " chunk states"
                << (o.serving_records
                        ? " and " + std::to_string(stats_.serving_resident) + " serving copies"
                        : std::string())
                << " in RAM; spill files " << state_file << " + " << serving_file << " bytes in "
                << o.spill_dir << (stats_.direct ? " (O_DIRECT)" : " (buffered)");
  return Status::Ok();
}

ChunkStoreStats ChunkStore::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::span<uint16_t> ChunkStore::ResidentServing(uint32_t c) const {
  if (c >= chunks_.size() || !chunks_[c].serving_resident || serving_ram_base_ == nullptr) {
    return {};
  }
  const Chunk& k = chunks_[c];
  return {reinterpret_cast<uint16_t*>(serving_ram_base_ + k.serving_off),
          ServingWords(options_.serving_dtype, k.elems)};
}

Status ChunkStore::NoServingRecords() {
  return FailedPrecondition(
      "chunk store: created with serving_records = false (no serving copies)");
}

Status ChunkStore::CheckId(uint32_t c) const {
  if (c >= chunks_.size()) {
    return InvalidArgument("chunk store: chunk " + std::to_string(c) + " out of range (" +
                           std::to_string(chunks_.size()) + " chunks)");
  }
  return Status::Ok();
}

Status ChunkStore::RecordLostError(uint32_t c, bool serving) const {
  const std::string& why = serving ? chunks_[c].serving_lost : chunks_[c].state_lost;
  return DataLoss("chunk store: the spilled " + std::string(serving ? "serving copy" : "state") +
                  " of chunk " + std::to_string(c) +
                  " was lost by a failed write and must be rewritten: " + why);
}

Status ChunkStore::ForEachChunk(std::span<const uint32_t> ids, const PassOptions& pass,
                                const ChunkFn& fn) {
  MutexLock lock(&mu_);
  if (pass.serving && !options_.serving_records) return NoServingRecords();
  std::vector<bool> seen(chunks_.size(), false);
  for (uint32_t c : ids) {
    ZPS_RETURN_IF_ERROR(CheckId(c));
    if (seen[c]) return InvalidArgument("chunk store: chunk " + std::to_string(c) + " repeated");
    seen[c] = true;
    const Chunk& k = chunks_[c];
    if (pass.read_state && !k.state_resident && !k.state_lost.empty()) {
      return RecordLostError(c, false);
    }
  }
  const uint32_t moments = options_.moments;
  auto needs_slot = [&](const Chunk& k) {
    return (!k.state_resident && (pass.read_state || pass.write_state)) ||
           (pass.serving && !k.serving_resident);
  };
  std::vector<uint32_t> spilled;  // ids that go through a slot, in pass order
  for (uint32_t c : ids) {
    if (needs_slot(chunks_[c])) spilled.push_back(c);
  }
  std::vector<Slot> slots(spilled.empty() ? 0 : slot_count_);
  for (size_t i = 0; i < slots.size(); ++i) {
    slots[i].state = state_bufs_ ? state_bufs_->buffer(i) : nullptr;
    slots[i].serving = serving_bufs_ ? serving_bufs_->buffer(i) : nullptr;
  }
  std::deque<IoRequest> q;
  Status first_err;
  const uint32_t piece = options_.io_bytes;
  const int state_fd = state_file_ ? state_file_->fd() : -1;
  const int serving_fd = serving_file_ ? serving_file_->fd() : -1;

  auto pump = [&]() -> Status {
    if (engine_ == nullptr) return Status::Ok();  // nothing spills
    while (!q.empty() && engine_->in_flight() < engine_->depth()) {
      ZPS_RETURN_IF_ERROR(engine_->Push(q.front()));
      q.pop_front();
    }
    return engine_->Flush();
  };
  auto reap_one = [&]() -> Status {
    ZPS_ASSIGN_OR_RETURN(IoCompletion done, engine_->Wait());
    const auto len = static_cast<uint32_t>(done.tag >> 32);
    const bool serving = (done.tag & 1) != 0;
    Slot& s = slots[(done.tag & 0xffffffffu) / 2];
    const Chunk& k = chunks_[s.chunk];
    const bool writing = s.st == Slot::St::kWriting;
    if (done.res >= 0) {
      (writing ? stats_.bytes_written : stats_.bytes_read) += done.res;
      if (serving) (writing ? stats_.serving_bytes_written : stats_.serving_bytes_read) += done.res;
    }
    if (done.res != static_cast<int32_t>(len) && s.err.ok()) {
      const std::string what =
          std::string(writing ? "write" : "read") + " of chunk " + std::to_string(s.chunk) +
          (serving
               ? " serving copy (" + serving_file_->path() + ", record at " +
                     std::to_string(k.serving_off)
               : " state (" + state_file_->path() + ", record at " + std::to_string(k.state_off)) +
          ")";
      s.err = done.res < 0 ? ErrnoError(what, -done.res)
                           : IoError(what + ": short transfer of " + std::to_string(done.res) +
                                     " of " + std::to_string(len) + " bytes");
      s.err_serving = serving;
    }
    if (--s.pending > 0) return Status::Ok();
    if (s.st == Slot::St::kReading) {
      s.st = Slot::St::kReady;
    } else if (s.st == Slot::St::kWriting) {
      if (!s.err.ok()) {
        Chunk& lost = chunks_[s.chunk];
        (s.err_serving ? lost.serving_lost : lost.state_lost) = s.err.message();
        ZPS_LOG(ERROR) << "chunk store: " << s.err.ToString();
        if (first_err.ok()) first_err = s.err;
      }
      s.st = Slot::St::kFree;
    }
    return Status::Ok();
  };
  size_t next = 0;  // next index of `spilled` to start reading
  auto issue = [&]() {
    while (first_err.ok() && next < spilled.size()) {
      size_t active = 0, free_slot = slots.size();
      for (size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].st == Slot::St::kReading || slots[i].st == Slot::St::kReady) ++active;
        if (slots[i].st == Slot::St::kFree && free_slot == slots.size()) free_slot = i;
      }
      if (active > options_.read_ahead || free_slot == slots.size()) return;
      Slot& s = slots[free_slot];
      s = Slot{Slot::St::kReading, spilled[next++], 0, Status::Ok(), false, s.state, s.serving};
      const Chunk& k = chunks_[s.chunk];
      if (pass.read_state && !k.state_resident) {
        Split(IoRequest::Op::kRead, state_fd, k.state_off, s.state, k.state_bytes, piece, free_slot,
              false, q);
        s.pending = Pieces(k.state_bytes, piece);
      }
      if (s.pending == 0) s.st = Slot::St::kReady;
    }
  };
  // Hard failures of the engine itself (not of a request) end the pass at once.
  Status engine_err;
  for (uint32_t c : ids) {
    const Chunk& k = chunks_[c];
    ChunkSpans spans;
    Slot* slot = nullptr;
    if (needs_slot(k)) {
      while (true) {
        issue();
        if (Status st = pump(); !st.ok()) {
          engine_err = st;
          break;
        }
        for (auto& s : slots) {
          if (s.chunk == c && s.st == Slot::St::kReady) slot = &s;
        }
        if (slot != nullptr || !first_err.ok()) break;
        if (engine_->in_flight() == 0) {
          engine_err =
              Internal("chunk store: pipeline stalled waiting for chunk " + std::to_string(c));
          break;
        }
        if (Status st = reap_one(); !st.ok()) {
          engine_err = st;
          break;
        }
      }
      if (!engine_err.ok() || !first_err.ok()) break;
      if (!slot->err.ok()) {
        first_err = slot->err;  // a failed read: fn is not called, nothing is written
        slot->st = Slot::St::kFree;
        break;
      }
    } else {
      issue();
      if (Status st = pump(); !st.ok()) {
        engine_err = st;
        break;
      }
    }
    std::byte* state = k.state_resident ? state_ram_->buffer(0) + k.state_off : slot->state;
    const size_t n = k.elems;
    if (k.state_resident || pass.read_state || pass.write_state) {
      spans.state.master = {reinterpret_cast<float*>(state), n};
      if (moments >= 1) spans.state.m = {state + k.m_off, k.moment_bytes};
      if (moments >= 2) spans.state.v = {state + k.m_off + k.moment_stride, k.moment_bytes};
    }
    if (pass.serving) {
      std::byte* sv = k.serving_resident ? serving_ram_base_ + k.serving_off : slot->serving;
      spans.serving = {reinterpret_cast<uint16_t*>(sv), ServingWords(options_.serving_dtype, n)};
    }
    Status st = fn(c, spans);
    if (!st.ok()) {
      first_err = st;
      if (slot != nullptr) slot->st = Slot::St::kFree;
      break;
    }
    if (slot == nullptr) continue;
    const size_t si = static_cast<size_t>(slot - slots.data());
    slot->pending = 0;
    slot->err = Status::Ok();
    if (pass.write_state && !k.state_resident) {
      Split(IoRequest::Op::kWrite, state_fd, k.state_off, slot->state, k.state_bytes, piece, si,
            false, q);
      slot->pending += Pieces(k.state_bytes, piece);
    }
    if (pass.serving && !k.serving_resident) {
      Split(IoRequest::Op::kWrite, serving_fd, k.serving_off, slot->serving, k.serving_bytes, piece,
            si, true, q);
      slot->pending += Pieces(k.serving_bytes, piece);
    }
    slot->st = slot->pending > 0 ? Slot::St::kWriting : Slot::St::kFree;
    // Records written in full are no longer lost (a failed write marks them again).
    if (pass.write_state && !k.state_resident) chunks_[c].state_lost.clear();
    if (pass.serving && !k.serving_resident) chunks_[c].serving_lost.clear();
  }
  // Drain: reads not yet submitted are dropped; every write is completed (or marked lost).
  if (!first_err.ok() || !engine_err.ok()) {
    std::erase_if(q, [&](const IoRequest& r) {
      if (r.op != IoRequest::Op::kRead) return false;
      --slots[(r.tag & 0xffffffffu) / 2].pending;
      return true;
    });
  }
  while (engine_err.ok() && engine_ != nullptr && (engine_->in_flight() > 0 || !q.empty())) {
    if (Status st = pump(); !st.ok()) engine_err = st;
    if (engine_err.ok() && engine_->in_flight() > 0) {
      if (Status st = reap_one(); !st.ok()) engine_err = st;
    }
  }
  if (!engine_err.ok()) {
    // Writes still in flight have unknown outcomes: mark their records lost.
    for (auto& s : slots) {
      if (s.st == Slot::St::kWriting) {
        chunks_[s.chunk].state_lost = chunks_[s.chunk].serving_lost = engine_err.message();
      }
    }
    return engine_err;
  }
  return first_err;
}

Status ChunkStore::Transfer(IoRequest::Op op, const SpillFile& file, uint64_t offset,
                            std::byte* buf, uint64_t bytes, const std::string& what, bool serving) {
  std::deque<IoRequest> q;
  Split(op, file.fd(), offset, buf, bytes, options_.io_bytes, 0, false, q);
  Status err;
  const bool write = op == IoRequest::Op::kWrite;
  while (!q.empty() || engine_->in_flight() > 0) {
    while (!q.empty() && engine_->in_flight() < engine_->depth()) {
      ZPS_RETURN_IF_ERROR(engine_->Push(q.front()));
      q.pop_front();
    }
    ZPS_ASSIGN_OR_RETURN(IoCompletion done, engine_->Wait());
    const auto len = static_cast<uint32_t>(done.tag >> 32);
    if (done.res >= 0) {
      (write ? stats_.bytes_written : stats_.bytes_read) += done.res;
      if (serving) (write ? stats_.serving_bytes_written : stats_.serving_bytes_read) += done.res;
    }
    if (done.res != static_cast<int32_t>(len) && err.ok()) {
      const std::string w =
          what + " (" + file.path() + ", record at " + std::to_string(offset) + ")";
      err = done.res < 0 ? ErrnoError(w, -done.res)
                         : IoError(w + ": short transfer of " + std::to_string(done.res) + " of " +
                                   std::to_string(len) + " bytes");
      q.clear();
    }
  }
  return err;
}

Status ChunkStore::ReadChunk(uint32_t c, std::span<float> master, std::span<std::byte> m,
                             std::span<std::byte> v) {
  MutexLock lock(&mu_);
  ZPS_RETURN_IF_ERROR(CheckId(c));
  const Chunk& k = chunks_[c];
  const uint32_t mo = options_.moments;
  if (master.size() != k.elems || m.size() != (mo >= 1 ? k.moment_bytes : 0) ||
      v.size() != (mo >= 2 ? k.moment_bytes : 0)) {
    return InvalidArgument("chunk store: ReadChunk lengths do not match chunk " +
                           std::to_string(c));
  }
  ZPS_ASSIGN_OR_RETURN(const std::byte* src, StateRecord(c, k.state_bytes, "state"));
  std::memcpy(master.data(), src, master.size_bytes());
  if (!m.empty()) std::memcpy(m.data(), src + k.m_off, m.size());
  if (!v.empty()) std::memcpy(v.data(), src + k.m_off + k.moment_stride, v.size());
  return Status::Ok();
}

Status ChunkStore::VisitMaster(uint32_t c, const std::function<void(std::span<const float>)>& fn) {
  MutexLock lock(&mu_);
  ZPS_RETURN_IF_ERROR(CheckId(c));
  const Chunk& k = chunks_[c];
  // The master is the record's first m_off bytes (a 4 KiB multiple): the moments stay on disk.
  ZPS_ASSIGN_OR_RETURN(const std::byte* src, StateRecord(c, k.m_off, "master"));
  fn({reinterpret_cast<const float*>(src), k.elems});
  return Status::Ok();
}

Result<const std::byte*> ChunkStore::StateRecord(uint32_t c, uint64_t bytes, const char* what) {
  const Chunk& k = chunks_[c];
  if (k.state_resident) return static_cast<const std::byte*>(state_ram_->buffer(0) + k.state_off);
  if (!k.state_lost.empty()) return RecordLostError(c, false);
  ZPS_RETURN_IF_ERROR(Transfer(IoRequest::Op::kRead, *state_file_, k.state_off,
                               state_bufs_->buffer(0), bytes,
                               "read of chunk " + std::to_string(c) + " " + what, false));
  return static_cast<const std::byte*>(state_bufs_->buffer(0));
}

Status ChunkStore::WriteChunk(uint32_t c, std::span<const float> master,
                              std::span<const std::byte> m, std::span<const std::byte> v) {
  MutexLock lock(&mu_);
  ZPS_RETURN_IF_ERROR(CheckId(c));
  Chunk& k = chunks_[c];
  const uint32_t mo = options_.moments;
  if (master.size() != k.elems || m.size() != (mo >= 1 ? k.moment_bytes : 0) ||
      v.size() != (mo >= 2 ? k.moment_bytes : 0)) {
    return InvalidArgument("chunk store: WriteChunk lengths do not match chunk " +
                           std::to_string(c));
  }
  std::byte* dst = k.state_resident ? state_ram_->buffer(0) + k.state_off : state_bufs_->buffer(0);
  if (!k.state_resident) std::memset(dst, 0, k.state_bytes);  // deterministic padding
  std::memcpy(dst, master.data(), master.size_bytes());
  if (!m.empty()) std::memcpy(dst + k.m_off, m.data(), m.size());
  if (!v.empty()) std::memcpy(dst + k.m_off + k.moment_stride, v.data(), v.size());
  if (k.state_resident) return Status::Ok();
  Status st = Transfer(IoRequest::Op::kWrite, *state_file_, k.state_off, dst, k.state_bytes,
                       "write of chunk " + std::to_string(c) + " state", false);
  k.state_lost = st.ok() ? std::string() : st.message();
  return st;
}

Status ChunkStore::ReadServing(uint32_t c, std::span<uint16_t> out) {
  MutexLock lock(&mu_);
  if (!options_.serving_records) return NoServingRecords();
  ZPS_RETURN_IF_ERROR(CheckId(c));
  const Chunk& k = chunks_[c];
  if (out.size() != ServingWords(options_.serving_dtype, k.elems)) {
    return InvalidArgument("chunk store: ReadServing length does not match chunk " +
                           std::to_string(c));
  }
  if (k.serving_resident) {
    std::memcpy(out.data(), serving_ram_base_ + k.serving_off, out.size_bytes());
    return Status::Ok();
  }
  if (!k.serving_lost.empty()) return RecordLostError(c, true);
  ZPS_RETURN_IF_ERROR(Transfer(IoRequest::Op::kRead, *serving_file_, k.serving_off,
                               serving_bufs_->buffer(0), k.serving_bytes,
                               "read of chunk " + std::to_string(c) + " serving copy", true));
  std::memcpy(out.data(), serving_bufs_->buffer(0), out.size_bytes());
  return Status::Ok();
}

Status ChunkStore::WriteServing(uint32_t c, std::span<const uint16_t> in) {
  MutexLock lock(&mu_);
  if (!options_.serving_records) return NoServingRecords();
  ZPS_RETURN_IF_ERROR(CheckId(c));
  Chunk& k = chunks_[c];
  if (in.size() != ServingWords(options_.serving_dtype, k.elems)) {
    return InvalidArgument("chunk store: WriteServing length does not match chunk " +
                           std::to_string(c));
  }
  if (k.serving_resident) {
    std::memcpy(serving_ram_base_ + k.serving_off, in.data(), in.size_bytes());
    return Status::Ok();
  }
  std::byte* dst = serving_bufs_->buffer(0);
  std::memset(dst, 0, k.serving_bytes);
  std::memcpy(dst, in.data(), in.size_bytes());
  Status st = Transfer(IoRequest::Op::kWrite, *serving_file_, k.serving_off, dst, k.serving_bytes,
                       "write of chunk " + std::to_string(c) + " serving copy", true);
  k.serving_lost = st.ok() ? std::string() : st.message();
  return st;
}

}  // namespace zps::server
