#include "zps/worker/prefetcher.h"

#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"

namespace zps::worker {

Prefetcher::Prefetcher(ParamSource* source, const PrefetchOptions& options)
    : source_(source), options_(options) {}

uint64_t Prefetcher::ParamBytes(uint32_t param) const {
  return source_->layout().param_numel(param) * DTypeSize(source_->serving_dtype());
}

void Prefetcher::BeginStep(int64_t step) {
  step_ = step;
  recording_.clear();
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

Prefetcher::Entry& Prefetcher::Start(uint32_t param, int64_t version) {
  Key key{param, version};
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second;
  auto fetch = [&] {
    Collectives* g = options_.gather;
    if (g == nullptr || g->world_size() == 1) return source_->FetchAsync(param, version);
    const SliceRange mine =
        RankSlice(source_->layout().param_numel(param), g->world_size(), g->rank());
    return source_->FetchAsync(param, mine.begin, mine.length, version);
  };
  Entry e{fetch(), nullptr, ParamBytes(param), 0, ++clock_};
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
  if (options_.gather != nullptr && options_.gather->world_size() > 1 &&
      std::all_of(ids.begin(), ids.end(), [&](uint32_t id) { return id < num_params; })) {
    // bandwidth-centric: every parameter of this Acquire that is not gathered yet, in one
    // all-gather (the same set on every rank: the same calls in the same order).
    std::vector<Key> pending;
    for (uint32_t id : ids) {
      const Entry& e = Start(id, step_);
      if (!e.buffer && std::find(pending.begin(), pending.end(), Key{id, step_}) == pending.end()) {
        pending.emplace_back(id, step_);
      }
    }
    if (!pending.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      Status s = Gather(pending);
      stats_.wait += std::chrono::steady_clock::now() - t0;
      if (!s.ok()) {
        for (const Key& k : pending) {
          auto it = entries_.find(k);
          if (it != entries_.end() && !it->second.buffer && it->second.refs == 0) {
            live_bytes_ -= it->second.bytes;
            entries_.erase(it);
          }
        }
        return s;
      }
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
    Entry& e = Start(id, step_);
    if (!e.buffer) {  // direct (bandwidth-centric buffers were gathered above)
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

Status Prefetcher::Gather(const std::vector<Key>& keys) {
  Collectives* g = options_.gather;
  const uint32_t world = g->world_size();
  struct Item {
    Entry* entry;
    std::shared_ptr<const ParamBuffer> slice;
    uint64_t numel;
    size_t slice_bytes;  // padded: SliceElems(numel, world) x esize
    size_t offset;       // in each rank's block
  };
  std::vector<Item> items;
  size_t block = 0;
  for (const Key& k : keys) {
    Entry& e = entries_.at(k);
    ZPS_ASSIGN_OR_RETURN(auto slice, e.op.Wait(source_->op_timeout()));
    const uint64_t numel = source_->layout().param_numel(k.first);
    const size_t sb = SliceElems(numel, world) * DTypeSize(slice->dtype);
    items.push_back({&e, slice, numel, sb, block});
    block += sb;
  }
  // Rank q's block: its slice of every parameter, back to back (each padded to SliceElems).
  std::vector<std::byte> all(block * world);
  for (const Item& it : items) {
    if (!it.slice->bytes().empty()) {
      std::memcpy(all.data() + block * g->rank() + it.offset, it.slice->bytes().data(),
                  it.slice->bytes().size());
    }
  }
  ZPS_RETURN_IF_ERROR(g->AllGather(all, block));
  for (const Item& it : items) {
    auto mem = std::make_shared<std::vector<std::byte>>(it.slice_bytes * world);
    for (uint32_t q = 0; q < world; ++q) {
      std::memcpy(mem->data() + it.slice_bytes * q, all.data() + block * q + it.offset,
                  it.slice_bytes);
    }
    auto out = std::make_shared<ParamBuffer>();
    out->param = it.slice->param;
    out->version = it.slice->version;
    out->dtype = it.slice->dtype;
    std::byte* raw = mem->data();
    out->memory = DeviceBuffer(raw, it.numel * DTypeSize(it.slice->dtype),
                               [mem = std::move(mem)](std::byte*) mutable { mem.reset(); });
    it.entry->buffer = std::move(out);
    ++stats_.gathers;
  }
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
      Start(id, version);
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

void Prefetcher::EndStep() {
  if (recording_ != trace_) {
    if (!trace_.empty()) ++stats_.trace_rebuilds;
    trace_ = recording_;
    ahead_ = 0;
  }
}

}  // namespace zps::worker
