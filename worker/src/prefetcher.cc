#include "zps/worker/prefetcher.h"

#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"
#include "zps/common/serving_quant.h"
#include "zps/worker/quantized_pieces.h"

namespace zps::worker {

namespace {
// The CollectiveOp id of the plan exchange (plan positions are below it).
constexpr uint32_t kTraceExchange = 0xffffffffu;

uint64_t Fnv(std::span<const uint32_t> words) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t w : words) {
    for (int i = 0; i < 4; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// Groups as words: count, then each group's size and ids.
std::vector<uint32_t> Encode(const std::vector<std::vector<uint32_t>>& groups) {
  std::vector<uint32_t> out{static_cast<uint32_t>(groups.size())};
  for (const auto& g : groups) {
    out.push_back(static_cast<uint32_t>(g.size()));
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

Result<std::vector<std::vector<uint32_t>>> Decode(std::span<const uint32_t> w) {
  std::vector<std::vector<uint32_t>> out;
  if (w.empty()) return out;
  size_t i = 1;
  for (uint32_t n = 0; n < w[0]; ++n) {
    if (i >= w.size() || w[i] > w.size() - i - 1) return DataLoss("a rank's groups do not parse");
    out.emplace_back(w.begin() + i + 1, w.begin() + i + 1 + w[i]);
    i += 1 + w[i];
  }
  return out;
}

// A longest common subsequence of two group sequences (dynamic programming, O(|a| |b|)).
std::vector<std::vector<uint32_t>> Common(const std::vector<std::vector<uint32_t>>& a,
                                          const std::vector<std::vector<uint32_t>>& b) {
  if (a == b) return a;  // the ranks (or the steps) agree: no table
  const size_t n = a.size(), m = b.size();
  std::vector<uint32_t> len((n + 1) * (m + 1), 0);
  auto at = [&](size_t i, size_t j) -> uint32_t& { return len[i * (m + 1) + j]; };
  for (size_t i = n; i-- > 0;) {
    for (size_t j = m; j-- > 0;) {
      at(i, j) = a[i] == b[j] ? at(i + 1, j + 1) + 1 : std::max(at(i + 1, j), at(i, j + 1));
    }
  }
  std::vector<std::vector<uint32_t>> out;
  for (size_t i = 0, j = 0; i < n && j < m;) {
    if (a[i] == b[j]) {
      out.push_back(a[i]);
      ++i, ++j;
    } else if (at(i + 1, j) >= at(i, j + 1)) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}
}  // namespace

Prefetcher::Prefetcher(ParamSource* source, const PrefetchOptions& options)
    : source_(source), options_(options) {
  if (Gathering()) {
    checked_ =
        std::make_unique<CheckedCollectives>(options_.gather, [this](const CollectiveOp& op) {
          if (op.id == kTraceExchange) return std::string("the ranks' acquire groups");
          std::string s = "plan position " + std::to_string(op.id);
          if (op.id < plan_.size() && !plan_[op.id].empty()) {
            s += " (params";
            for (size_t i = 0; i < plan_[op.id].size() && i < 3; ++i) {
              s += " " + source_->layout().spec(plan_[op.id][i]).name;
            }
            s += plan_[op.id].size() > 3 ? " ...)" : ")";
          }
          return s;
        });
  }
}

bool Prefetcher::Gathering() const {
  return options_.gather != nullptr && options_.gather->world_size() > 1;
}

bool Prefetcher::WireQuantized() const { return IsBlockQuantized(source_->wire_dtype()); }

bool Prefetcher::KeepQuantized() const { return options_.keep_quantized && WireQuantized(); }

uint64_t Prefetcher::ParamBytes(uint32_t param) const {
  const uint64_t numel = source_->layout().param_numel(param);
  if (KeepQuantized()) return QuantizedBytes(ServingQuantFormat(source_->wire_dtype()), numel);
  return numel * DTypeSize(source_->serving_dtype());
}

FetchOp Prefetcher::Fetch(uint32_t param, uint64_t begin, uint64_t length, int64_t version,
                          bool quantized) {
  if (quantized && WireQuantized()) {
    return source_->FetchQuantizedAsync(param, begin, length, version);
  }
  if (begin == 0 && length == source_->layout().param_numel(param)) {
    return source_->FetchAsync(param, version);
  }
  return source_->FetchAsync(param, begin, length, version);
}

void Prefetcher::BeginStep(int64_t step) {
  step_ = step;
  recording_.clear();
  groups_.clear();
  plan_done_ = 0;
  cursor_ = 0;
  following_ = !trace_.empty();
  // Positions prefetched for this step while the last one ended carry over.
  ahead_ = ahead_ >= trace_.size() ? ahead_ - trace_.size() : 0;
  // Buffers of older versions are never needed again.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->first.second < step && it->second.refs == 0) {
      live_bytes_ -= it->second.bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

Prefetcher::Entry& Prefetcher::Start(uint32_t param, int64_t version, bool slice) {
  Key key{param, version};
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    Entry& e = it->second;
    if (!slice && e.slice && !e.buffer) {  // needed whole now: the slice is not enough
      e.op = Fetch(param, 0, source_->layout().param_numel(param), version, KeepQuantized());
      e.slice = false;
    }
    return e;
  }
  slice = slice && Gathering();
  auto fetch = [&] {
    const uint64_t numel = source_->layout().param_numel(param);
    if (!slice) return Fetch(param, 0, numel, version, KeepQuantized());
    Collectives* g = options_.gather;
    const SliceRange mine = RankSlice(numel, g->world_size(), g->rank());
    // A quantized wire dtype: the slice's block records, all-gathered as they are.
    return Fetch(param, mine.begin, mine.length, version, /*quantized=*/true);
  };
  Entry e{fetch(), slice, nullptr, nullptr, ParamBytes(param), 0, ++clock_};
  live_bytes_ += e.bytes;
  return entries_.emplace(key, std::move(e)).first->second;
}

Result<std::vector<std::shared_ptr<const ParamBuffer>>> Prefetcher::Acquire(
    std::span<const uint32_t> ids) {
  std::vector<std::shared_ptr<const ParamBuffer>> out;
  out.reserve(ids.size());
  const uint32_t num_params = source_->layout().num_params();
  std::vector<char> hits(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) hits[i] = entries_.count({ids[i], step_}) > 0;
  if (Gathering() &&
      std::all_of(ids.begin(), ids.end(), [&](uint32_t id) { return id < num_params; })) {
    groups_.emplace_back(ids.begin(), ids.end());
    if (options_.same_first_step && !plan_agreed_) {
      plan_.push_back(groups_.back());  // every rank does the same: this is the plan so far
    }
    // bandwidth-centric: the group's next plan position, after the ones skipped on the way.
    auto at = std::find(plan_.begin() + static_cast<std::ptrdiff_t>(plan_done_), plan_.end(),
                        groups_.back());
    if (at != plan_.end()) {
      const auto t0 = std::chrono::steady_clock::now();
      Status s = GatherUpTo(static_cast<size_t>(at - plan_.begin()) + 1);
      stats_.wait += std::chrono::steady_clock::now() - t0;
      if (!s.ok()) return s;
    } else {
      ++stats_.unplanned;
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    ++stats_.acquires;
    if (id >= num_params) {
      // Before the recording: a bad id in the trace would be prefetched (and sized) next step.
      Release({ids.data(), out.size()});
      return OutOfRange("parameter id " + std::to_string(id));
    }
    recording_.push_back(id);
    if (following_) {
      if (cursor_ < trace_.size() && trace_[cursor_] == id) {
        ++cursor_;
      } else {
        following_ = false;  // the order changed: stop guessing, rebuild the trace at EndStep
        ZPS_LOG(DEBUG) << "access order changed at position " << cursor_ << "; rebuilding trace";
      }
    }
    if (hits[i]) ++stats_.hits;
    Entry& e = Start(id, step_, /*slice=*/false);
    if (!e.buffer) {  // whole (a planned group's buffers were gathered above)
      auto t0 = std::chrono::steady_clock::now();
      auto r2 = e.op.Wait(source_->op_timeout());
      stats_.wait += std::chrono::steady_clock::now() - t0;
      if (!r2.ok()) {
        live_bytes_ -= e.bytes;
        entries_.erase({id, step_});
        Release({ids.data(), out.size()});
        return r2.status();
      }
      e.buffer = *r2;
    }
    ++e.refs;
    e.last_use = ++clock_;
    out.push_back(e.buffer);
  }
  PrefetchAhead();
  return out;
}

Status Prefetcher::GatherUpTo(size_t end) {
  for (; plan_done_ < end; ++plan_done_) {
    Status s = Gather(plan_done_);
    if (!s.ok()) {
      // The communicator is unusable: no more plan (everything is fetched whole from now on).
      plan_.clear();
      planned_.clear();
      plan_done_ = 0;
      return s;
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<const ParamBuffer>> Prefetcher::AwaitFetch(Entry& e, const Key& key) {
  auto r = e.op.Wait(source_->op_timeout());
  if (!r.ok() && e.refs == 0) {
    live_bytes_ -= e.bytes;
    entries_.erase(key);
  }
  return r;
}

template <typename Visit>
Status Prefetcher::WalkSlices(size_t pos, Visit&& visit) {
  std::vector<uint32_t> seen;  // a group may name a parameter twice
  for (uint32_t id : plan_[pos]) {
    if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
    seen.push_back(id);
    Entry& e = Start(id, step_, /*slice=*/true);
    HeldBuffer held = e.buffer;
    if (!held) {
      ZPS_ASSIGN_OR_RETURN(held, AwaitFetch(e, Key{id, step_}));
      if (!e.slice) e.buffer = held;  // a whole fetch in flight: the buffer is the parameter
    }
    ZPS_RETURN_IF_ERROR(visit(id, e, std::move(held)));
  }
  return Status::Ok();
}

Status Prefetcher::Gather(size_t pos) {
  if (WireQuantized()) return GatherQuantized(pos);
  const uint32_t world = checked_->world_size();
  const uint32_t rank = checked_->rank();
  const size_t esize = DTypeSize(source_->serving_dtype());
  struct Item {
    Key key;
    std::shared_ptr<const ParamBuffer> mine;  // this rank's slice, or the whole parameter
    uint64_t numel;
    size_t slice_bytes;  // padded: SliceElems(numel, world) x esize
    size_t offset;       // in each rank's block
  };
  std::vector<Item> items;
  size_t block = 0;
  auto add = [&](uint32_t id, Entry&, HeldBuffer mine) -> Status {
    const uint64_t numel = source_->layout().param_numel(id);
    const size_t sb = SliceElems(numel, world) * esize;
    items.push_back({Key{id, step_}, std::move(mine), numel, sb, block});
    block += sb;
    return Status::Ok();
  };
  ZPS_RETURN_IF_ERROR(WalkSlices(pos, add));
  // Rank q's block: its slice of every parameter, back to back (each padded to SliceElems).
  std::vector<std::byte> all(block * world);
  for (const Item& it : items) {
    const SliceRange s = RankSlice(it.numel, world, rank);
    // A whole buffer holds the slice at its offset; a slice buffer is the slice.
    const size_t from =
        it.mine->begin == 0 && it.mine->bytes().size() == it.numel * esize ? s.begin * esize : 0;
    const size_t n = s.length * esize;
    if (n > 0)
      std::memcpy(all.data() + block * rank + it.offset, it.mine->bytes().data() + from, n);
  }
  ZPS_RETURN_IF_ERROR(checked_->AllGather(static_cast<uint32_t>(pos), all, block));
  stats_.gather_bytes += all.size();
  for (const Item& it : items) {
    Entry& e = entries_.at(it.key);
    if (e.buffer) continue;  // already whole
    auto mem = std::make_shared<std::vector<std::byte>>(it.slice_bytes * world);
    for (uint32_t q = 0; q < world; ++q) {
      std::memcpy(mem->data() + it.slice_bytes * q, all.data() + block * q + it.offset,
                  it.slice_bytes);
    }
    auto out = std::make_shared<ParamBuffer>();
    out->param = it.key.first;
    out->version = it.mine->version;
    out->dtype = source_->serving_dtype();
    std::byte* raw = mem->data();
    out->memory = DeviceBuffer(raw, it.numel * esize,
                               [mem = std::move(mem)](std::byte*) mutable { mem.reset(); });
    e.buffer = std::move(out);
    ++stats_.gathers;
  }
  return Status::Ok();
}

// As Gather, with block records: rank q's block holds, for each parameter, the covering blocks of
// its slice (QuantizedPieces of RankSlice(numel, world, q), which every rank computes alike from
// the layout), padded to the largest rank's. The whole parameter is then every rank's pieces in
// rank order: kept so (keep_quantized), or dequantized into fp32 with the same codec a direct
// fetch uses, so the bits are a direct fetch's.
Status Prefetcher::GatherQuantized(size_t pos) {
  const uint32_t world = checked_->world_size();
  const uint32_t rank = checked_->rank();
  const DType wire = source_->wire_dtype();
  const QuantFormat format = ServingQuantFormat(wire);
  const Layout& layout = source_->layout();
  struct Item {
    Key key;
    std::shared_ptr<const ParamBuffer> mine;  // this rank's slice, quantized
    uint64_t numel;
    std::vector<std::vector<QuantPiece>> ranks;  // each rank's slice
    size_t slot = 0;                             // padded bytes of a rank's slice
    size_t offset = 0;                           // in each rank's block
  };
  std::vector<Item> items;
  size_t block = 0;
  auto add = [&](uint32_t id, Entry& e, HeldBuffer got) -> Status {
    const uint64_t numel = layout.param_numel(id);
    if (!e.buffer) {
      e.quant_slice = got;  // this rank's slice as block records, for a later plan position
    } else {
      // Whole here already: the other ranks still need this rank's slice as block records.
      got = e.quant_slice;
      if (!got) {
        const SliceRange s = RankSlice(numel, world, rank);
        auto r =
            source_->FetchQuantizedAsync(id, s.begin, s.length, step_).Wait(source_->op_timeout());
        if (!r.ok()) return r.status();
        got = e.quant_slice = *r;
      }
    }
    Item it{Key{id, step_}, std::move(got), numel, {}, 0, block};
    for (uint32_t q = 0; q < world; ++q) {
      const SliceRange sq = RankSlice(numel, world, q);
      ZPS_ASSIGN_OR_RETURN(auto pieces, QuantizedPieces(layout, wire, id, sq.begin, sq.length));
      it.slot = std::max<size_t>(it.slot, QuantizedPiecesBytes(pieces));
      it.ranks.push_back(std::move(pieces));
    }
    if (it.mine->bytes().size() != QuantizedPiecesBytes(it.ranks[rank])) {
      return Internal("parameter " + std::to_string(id) + ": a quantized slice of " +
                      std::to_string(it.mine->bytes().size()) + " bytes, expected " +
                      std::to_string(QuantizedPiecesBytes(it.ranks[rank])));
    }
    block += it.slot;
    items.push_back(std::move(it));
    return Status::Ok();
  };
  ZPS_RETURN_IF_ERROR(WalkSlices(pos, add));
  std::vector<std::byte> all(block * world);
  for (const Item& it : items) {
    if (!it.mine->bytes().empty()) {
      std::memcpy(all.data() + block * rank + it.offset, it.mine->bytes().data(),
                  it.mine->bytes().size());
    }
  }
  ZPS_RETURN_IF_ERROR(checked_->AllGather(static_cast<uint32_t>(pos), all, block));
  stats_.gather_bytes += all.size();
  for (Item& it : items) {
    Entry& e = entries_.at(it.key);
    if (e.buffer) continue;  // already whole
    auto out = std::make_shared<ParamBuffer>();
    out->param = it.key.first;
    out->version = it.mine->version;
    std::shared_ptr<std::vector<std::byte>> mem;
    if (KeepQuantized()) {
      out->dtype = wire;
      uint64_t total = 0;
      for (const auto& pieces : it.ranks) total += QuantizedPiecesBytes(pieces);
      mem = std::make_shared<std::vector<std::byte>>(total);
      uint64_t at = 0;
      for (uint32_t q = 0; q < world; ++q) {
        const uint64_t n = QuantizedPiecesBytes(it.ranks[q]);
        if (n > 0) std::memcpy(mem->data() + at, all.data() + block * q + it.offset, n);
        for (QuantPiece p : it.ranks[q]) {
          p.offset += at;
          out->pieces.push_back(p);
        }
        at += n;
      }
    } else {
      out->dtype = DType::kF32;
      mem = std::make_shared<std::vector<std::byte>>(it.numel * sizeof(float));
      for (uint32_t q = 0; q < world; ++q) {
        const SliceRange sq = RankSlice(it.numel, world, q);
        DequantizePieces(format, it.ranks[q], all.data() + block * q + it.offset,
                         DequantTarget::kF32, mem->data() + sq.begin * sizeof(float));
      }
    }
    std::byte* raw = mem->data();
    const size_t size = mem->size();  // before the move below: argument order is unspecified
    out->memory =
        DeviceBuffer(raw, size, [mem = std::move(mem)](std::byte*) mutable { mem.reset(); });
    e.buffer = std::move(out);
    ++stats_.gathers;
  }
  return Status::Ok();
}

Status Prefetcher::AgreePlan() {
  const uint32_t world = checked_->world_size();
  const std::vector<uint32_t> mine = Encode(groups_);
  // First the fixed-size summary (hash, length) of every rank; the groups themselves only where
  // the ranks differ.
  std::vector<uint64_t> heads(2 * world);
  heads[2 * checked_->rank()] = Fnv(mine);
  heads[2 * checked_->rank() + 1] = mine.size();
  ZPS_RETURN_IF_ERROR(checked_->AllGather(kTraceExchange, std::as_writable_bytes(std::span(heads)),
                                          2 * sizeof(uint64_t)));
  bool same = true;
  uint64_t longest = 0;
  for (uint32_t q = 0; q < world; ++q) {
    same = same && heads[2 * q] == heads[0] && heads[2 * q + 1] == heads[1];
    longest = std::max(longest, heads[2 * q + 1]);
  }
  std::vector<Group> plan = groups_;
  if (!same) {
    std::vector<uint32_t> all(longest * world, 0);
    std::copy(mine.begin(), mine.end(), all.begin() + longest * checked_->rank());
    ZPS_RETURN_IF_ERROR(checked_->AllGather(kTraceExchange, std::as_writable_bytes(std::span(all)),
                                            longest * sizeof(uint32_t)));
    // The same fold on every rank (rank 0's groups, then each rank's in rank order): a common
    // subsequence is not unique, and every rank must pick the same one.
    for (uint32_t q = 0; q < world; ++q) {
      ZPS_ASSIGN_OR_RETURN(auto theirs,
                           Decode(std::span(all).subspan(longest * q, heads[2 * q + 1])));
      plan = q == 0 ? std::move(theirs) : Common(plan, theirs);
    }
  }
  // Only what the ranks did alike in this step and the one before: a group that changes every
  // step (an expert whose tokens come and go) would otherwise be all-gathered by every rank
  // next step whether it is used or not.
  std::vector<Group> common = plan;
  if (plan_agreed_) plan = Common(last_common_, plan);
  last_common_ = std::move(common);
  plan_ = std::move(plan);
  plan_agreed_ = true;
  planned_.assign(source_->layout().num_params(), 0);
  for (const Group& g : plan_) {
    for (uint32_t id : g) planned_[id] = 1;
  }
  stats_.plan_groups = plan_.size();
  return Status::Ok();
}

void Prefetcher::PrefetchAhead() {
  if (!following_ || options_.prefetch_bytes == 0 || trace_.empty()) return;
  ahead_ = std::max(ahead_, cursor_);
  // Bytes requested but not yet consumed by an Acquire.
  uint64_t in_flight = 0;
  for (const auto& [key, e] : entries_) {
    if (e.refs == 0 && !e.buffer) in_flight += e.bytes;
  }
  const size_t limit = cursor_ + trace_.size();  // at most one step ahead
  while (ahead_ < limit) {
    const uint32_t id = trace_[ahead_ % trace_.size()];
    const int64_t version = ahead_ < trace_.size() ? step_ : step_ + 1;
    const uint64_t bytes = ParamBytes(id);
    if (entries_.count({id, version}) == 0) {
      if (in_flight + bytes > options_.prefetch_bytes) break;
      if (live_bytes_ + bytes > options_.max_live_bytes) {
        Evict();
        if (live_bytes_ + bytes > options_.max_live_bytes) break;
      }
      Start(id, version, /*slice=*/id < planned_.size() && planned_[id] != 0);
      ++stats_.prefetches;
      in_flight += bytes;
    }
    ++ahead_;
  }
}

void Prefetcher::Release(std::span<const uint32_t> ids) {
  for (uint32_t id : ids) {
    auto it = entries_.find({id, step_});
    if (it != entries_.end() && it->second.refs > 0) --it->second.refs;
  }
  Evict();
  PrefetchAhead();
}

void Prefetcher::Evict() {
  while (live_bytes_ > options_.max_live_bytes) {
    // Least recently used buffer that is ready and not held.
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.refs == 0 && it->second.buffer &&
          (victim == entries_.end() || it->second.last_use < victim->second.last_use)) {
        victim = it;
      }
    }
    if (victim == entries_.end()) return;
    live_bytes_ -= victim->second.bytes;
    entries_.erase(victim);
  }
}

Status Prefetcher::EndStep() {
  if (recording_ != trace_) {
    if (!trace_.empty()) ++stats_.trace_rebuilds;
    trace_ = recording_;
    ahead_ = 0;
  }
  if (!Gathering()) return Status::Ok();
  Status s = GatherUpTo(plan_.size());
  if (s.ok()) s = AgreePlan();
  if (!s.ok()) {
    plan_.clear();
    planned_.clear();
    stats_.plan_groups = 0;
  }
  plan_done_ = 0;
  return s;
}

}  // namespace zps::worker
