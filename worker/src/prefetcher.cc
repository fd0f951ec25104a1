#include "zps/worker/prefetcher.h"

#include <algorithm>
#include <cstring>

#include "zps/common/logging.h"

namespace zps::worker {

Prefetcher::Prefetcher(Client* client, const PrefetchOptions& options)
    : client_(client), options_(options) {}

uint64_t Prefetcher::ParamBytes(uint32_t param) const {
  return client_->layout().param_numel(param) * DTypeSize(client_->job().serving_dtype);
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
    if (g == nullptr || g->world_size() == 1) return client_->FetchAsync(param, version);
    const SliceRange mine =
        RankSlice(client_->layout().param_numel(param), g->world_size(), g->rank());
    return client_->FetchAsync(param, mine.begin, mine.length, version);
  };
  Entry e{fetch(), nullptr, ParamBytes(param), 0, ++clock_};
  live_bytes_ += e.bytes;
  return entries_.emplace(key, std::move(e)).first->second;
}

Result<std::vector<std::shared_ptr<const ParamBuffer>>> Prefetcher::Acquire(
    std::span<const uint32_t> ids) {
  std::vector<std::shared_ptr<const ParamBuffer>> out;
  out.reserve(ids.size());
  for (uint32_t id : ids) {
    ++stats_.acquires;
    recording_.push_back(id);
    if (following_) {
      if (cursor_ < trace_.size() && trace_[cursor_] == id) {
        ++cursor_;
      } else {
        following_ = false;  // the order changed: stop guessing, rebuild the trace at EndStep
        ZPS_LOG(DEBUG) << "access order changed at position " << cursor_ << "; rebuilding trace";
      }
    }
    if (id >= client_->layout().num_params()) {
      Release({ids.data(), out.size()});
      return OutOfRange("parameter id " + std::to_string(id));
    }
    const bool hit = entries_.count({id, step_}) > 0;
    if (hit) ++stats_.hits;
    Entry& e = Start(id, step_);
    if (!e.buffer) {
      auto t0 = std::chrono::steady_clock::now();
      auto r2 = e.op.Wait(client_->op_timeout());
      if (r2.ok() && options_.gather != nullptr && options_.gather->world_size() > 1) {
        r2 = Gather(**r2);
      }
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

Result<std::shared_ptr<const ParamBuffer>> Prefetcher::Gather(const ParamBuffer& slice) {
  Collectives* g = options_.gather;
  const uint64_t numel = client_->layout().param_numel(slice.param);
  const size_t esize = DTypeSize(slice.dtype);
  const size_t block = SliceElems(numel, g->world_size()) * esize;
  // One block per rank; this rank's slice at its place, the tail past numel left as padding.
  auto mem = std::make_shared<std::vector<std::byte>>(block * g->world_size());
  if (!slice.bytes().empty()) {
    std::memcpy(mem->data() + block * g->rank(), slice.bytes().data(), slice.bytes().size());
  }
  ZPS_RETURN_IF_ERROR(g->AllGather(*mem, block));
  ++stats_.gathers;
  auto out = std::make_shared<ParamBuffer>();
  out->param = slice.param;
  out->version = slice.version;
  out->dtype = slice.dtype;
  std::byte* raw = mem->data();
  out->memory = DeviceBuffer(raw, numel * esize, [mem = std::move(mem)](std::byte*) mutable {
    mem.reset();
  });
  return std::shared_ptr<const ParamBuffer>(std::move(out));
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
