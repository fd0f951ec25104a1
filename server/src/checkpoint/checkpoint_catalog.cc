#include "zps/server/checkpoint_catalog.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint_codec.h"
#include "zps/common/bytes.h"
#include "zps/common/logging.h"

namespace zps::server {
namespace {

constexpr std::string_view kGlobalPrefix = "global/";

// Zero-padded decimal, so names sort by step.
std::string GlobalName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "global/%020lld", static_cast<long long>(step));
  return buf;
}

std::vector<std::byte> EncodeGlobal(const GlobalCheckpoint& g) {
  ByteWriter w;
  w.I64(g.step);
  w.U32(g.num_shards);
  w.U32(static_cast<uint32_t>(g.committed.size()));
  for (uint32_t s : g.committed) w.U32(s);
  return w.Take();
}

}  // namespace

namespace internal {
Result<GlobalCheckpoint> DecodeGlobal(std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  GlobalCheckpoint g;
  auto decode = [&]() -> Status {
    ZPS_ASSIGN_OR_RETURN(g.step, r.I64("step"));
    ZPS_ASSIGN_OR_RETURN(g.num_shards, r.U32("num_shards"));
    ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32("committed"));
    if (n > g.num_shards) return InvalidArgument("more reports than shards");
    // A count read from disk must not size an allocation past the record (regression input:
    // tests/fuzz/corpus/checkpoint/crash-global-huge-count, std::bad_alloc before).
    if (n > r.remaining() / 4) return InvalidArgument("committed count past the record's end");
    g.committed.resize(n);
    for (auto& s : g.committed) {
      ZPS_ASSIGN_OR_RETURN(s, r.U32("shard"));
    }
    return r.ExpectEnd("global checkpoint");
  };
  Status s = decode();
  if (!s.ok()) return DataLoss("stored global checkpoint: " + s.message());
  g.complete = g.committed.size() == g.num_shards;
  return g;
}
}  // namespace internal

namespace {
using internal::DecodeGlobal;

}  // namespace

CoordinatorCatalog::CoordinatorCatalog(std::unique_ptr<CheckpointStore> store, uint32_t keep)
    : store_(std::move(store)), keep_(keep) {}
CoordinatorCatalog::~CoordinatorCatalog() = default;

Result<std::unique_ptr<CoordinatorCatalog>> CoordinatorCatalog::Open(
    const std::string& dir, const CheckpointOptions& options) {
  CheckpointOptions o = options;
  // Only small values: modest memtables.
  o.write_buffer_bytes = std::min<uint64_t>(o.write_buffer_bytes, 16ull << 20);
  ZPS_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(dir, o));
  return std::unique_ptr<CoordinatorCatalog>(new CoordinatorCatalog(std::move(store), o.keep));
}

Status CoordinatorCatalog::PutJobSpec(const JobSpec& spec) { return store_->PutJobSpec(spec); }
Result<JobSpec> CoordinatorCatalog::GetJobSpec() const { return store_->GetJobSpec(); }
Status CoordinatorCatalog::PutRegistry(std::span<const std::byte> registry) {
  return store_->PutCatalog("registry", registry);
}
Result<std::vector<std::byte>> CoordinatorCatalog::GetRegistry() const {
  return store_->GetCatalog("registry");
}
Status CoordinatorCatalog::PutPlacement(std::span<const std::byte> placement) {
  return store_->PutCatalog("placement", placement);
}
Result<std::vector<std::byte>> CoordinatorCatalog::GetPlacement() const {
  return store_->GetCatalog("placement");
}
Status CoordinatorCatalog::PutStep(int64_t step) {
  ByteWriter w;
  w.I64(step);
  return store_->PutCatalog("step", w.buffer());
}
Result<int64_t> CoordinatorCatalog::GetStep() const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, store_->GetCatalog("step"));
  ByteReader r(bytes);
  auto v = r.I64("step");
  if (!v.ok() || r.remaining() != 0) return DataLoss("stored step is malformed");
  return *v;
}

Status CoordinatorCatalog::PutEpoch(uint64_t epoch) {
  ByteWriter w;
  w.U64(epoch);
  return store_->PutCatalog("epoch", w.buffer());
}
Result<uint64_t> CoordinatorCatalog::GetEpoch() const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, store_->GetCatalog("epoch"));
  ByteReader r(bytes);
  auto v = r.U64("epoch");
  if (!v.ok() || r.remaining() != 0) return DataLoss("stored epoch is malformed");
  return *v;
}

Result<GlobalCheckpoint> CoordinatorCatalog::ReadGlobal(int64_t step) const {
  ZPS_ASSIGN_OR_RETURN(auto bytes, store_->GetCatalog(GlobalName(step)));
  ZPS_ASSIGN_OR_RETURN(auto g, DecodeGlobal(bytes));
  if (g.step != step) return DataLoss("stored global checkpoint has the wrong step");
  return g;
}

Status CoordinatorCatalog::WriteGlobal(const GlobalCheckpoint& g) {
  return store_->PutCatalog(GlobalName(g.step), EncodeGlobal(g));
}

Result<bool> CoordinatorCatalog::RecordShardCheckpoint(int64_t step, uint32_t shard,
                                                       uint32_t num_shards) {
  if (step < 0) return InvalidArgument("checkpoint step must be >= 0");
  if (num_shards == 0 || shard >= num_shards) {
    return InvalidArgument("shard " + std::to_string(shard) + " of " + std::to_string(num_shards));
  }
  MutexLock lock(&mu_);
  GlobalCheckpoint g;
  auto have = ReadGlobal(step);
  if (have.ok()) {
    g = std::move(*have);
    if (g.num_shards != num_shards) {
      return InvalidArgument("checkpoint " + std::to_string(step) + " was reported for " +
                             std::to_string(g.num_shards) + " shards, now " +
                             std::to_string(num_shards));
    }
  } else if (have.status().code() == Code::kNotFound) {
    g.step = step;
    g.num_shards = num_shards;
  } else {
    return have.status();
  }
  auto pos = std::lower_bound(g.committed.begin(), g.committed.end(), shard);
  if (pos != g.committed.end() && *pos == shard) return false;
  g.committed.insert(pos, shard);
  g.complete = g.committed.size() == num_shards;
  ZPS_RETURN_IF_ERROR(WriteGlobal(g));
  if (!g.complete) return false;
  ZPS_LOG(INFO) << "global checkpoint " << step << " complete on " << num_shards << " shards";
  // Keep the newest `keep_` complete ones; drop everything older than the oldest kept.
  ZPS_ASSIGN_OR_RETURN(auto all, ListGlobal());
  std::vector<int64_t> complete;
  for (const auto& x : all) {
    if (x.complete) complete.push_back(x.step);
  }
  if (complete.size() > keep_) {
    const int64_t oldest_kept = complete[complete.size() - keep_];
    std::vector<std::string> drop;
    for (const auto& x : all) {
      if (x.step < oldest_kept) drop.push_back(GlobalName(x.step));
    }
    Status s = store_->DeleteCatalog(drop);
    if (!s.ok()) ZPS_LOG(WARNING) << "global checkpoint gc: " << s.ToString();
  }
  return true;
}

Result<std::vector<GlobalCheckpoint>> CoordinatorCatalog::ListGlobal() const {
  ZPS_ASSIGN_OR_RETURN(auto names, store_->ListCatalog(kGlobalPrefix));
  std::vector<GlobalCheckpoint> out;
  for (const auto& n : names) {
    ZPS_ASSIGN_OR_RETURN(auto bytes, store_->GetCatalog(n));
    ZPS_ASSIGN_OR_RETURN(auto g, DecodeGlobal(bytes));
    out.push_back(std::move(g));
  }
  return out;
}

Result<int64_t> CoordinatorCatalog::LatestGlobalComplete() const {
  ZPS_ASSIGN_OR_RETURN(auto all, ListGlobal());
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete) return it->step;
  }
  return NotFound("no complete global checkpoint");
}

Status CoordinatorCatalog::DropGlobalAfter(int64_t step) {
  MutexLock lock(&mu_);
  ZPS_ASSIGN_OR_RETURN(auto all, ListGlobal());
  std::vector<std::string> drop;
  for (const auto& x : all) {
    if (x.step > step) drop.push_back(GlobalName(x.step));
  }
  return store_->DeleteCatalog(drop);
}

}  // namespace zps::server
