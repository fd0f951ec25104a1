#include "zps/server/checkpoint_reshard.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "zps/common/logging.h"
#include "zps/common/thread_pool.h"
#include "zps/server/checkpoint.h"
#include "zps/server/checkpoint_catalog.h"
#include "zps/server/optimizer.h"
#include "zps/server/packed_moment.h"

namespace zps::server {
namespace {

namespace fs = std::filesystem;

// One of the job's stores, opened read-only, with its checkpoint of the chosen step.
struct Input {
  std::string dir;
  std::unique_ptr<CheckpointStore> store;
  Layout layout;
  JobSpec job;
  uint32_t shard = 0;
  std::vector<CheckpointInfo> checkpoints;
  std::unique_ptr<CheckpointReader> reader;
  std::vector<std::byte> state;
};

std::string JoinSteps(const std::vector<CheckpointInfo>& list) {
  std::string out;
  for (const auto& c : list) out += (out.empty() ? "" : ", ") + std::to_string(c.step);
  return out.empty() ? "none" : out;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Opens one input read-only; with `direct_reads`, with O_DIRECT where its filesystem allows it.
Result<std::unique_ptr<CheckpointStore>> OpenInput(const std::string& dir, bool direct_reads) {
  CheckpointOptions ro;
  ro.read_only = true;
  ro.create_if_missing = false;
  ro.write_threads = 1;
  ro.direct_reads = direct_reads;
  auto store = CheckpointStore::Open(dir, ro);
  if (store.ok() || !direct_reads) return store;
  // A filesystem without O_DIRECT (tmpfs before Linux 6.6) refuses the open: read it through
  // the page cache. Any other error repeats itself below and is returned.
  ro.direct_reads = false;
  auto buffered = CheckpointStore::Open(dir, ro);
  if (buffered.ok()) {
    ZPS_LOG(INFO) << "reshard: input " << dir << " is read through the page cache ("
                  << store.status().ToString() << ")";
  }
  return buffered;
}

// Opens every input and checks that they are the N stores of one job, each at `step` (-1: the
// newest, the same on every store). Returns them indexed by shard ordinal.
Result<std::vector<Input>> OpenInputs(const std::vector<std::string>& dirs, int64_t& step,
                                      bool direct_reads) {
  std::vector<Input> given;
  for (const auto& dir : dirs) {
    Input in;
    in.dir = dir;
    ZPS_ASSIGN_OR_RETURN(in.store, OpenInput(dir, direct_reads));
    auto layout = in.store->GetLayout();
    if (!layout.ok())
      return layout.status().WithContext("input " + dir + " (not a shard's store?)");
    in.layout = std::move(*layout);
    ZPS_ASSIGN_OR_RETURN(in.shard, in.store->GetShard());
    auto job = in.store->GetJobSpec();
    if (!job.ok()) return job.status().WithContext("input " + dir);
    in.job = std::move(*job);
    ZPS_ASSIGN_OR_RETURN(in.checkpoints, in.store->ListCheckpoints(false));
    given.push_back(std::move(in));
  }
  const Input& first = given.front();
  for (const auto& in : given) {
    if (in.layout.Hash() != first.layout.Hash() || in.job.Hash() != first.job.Hash()) {
      return InvalidArgument("the inputs are stores of two different jobs: " + first.dir +
                             " has layout " + Hex(first.layout.Hash()) + " and job " +
                             Hex(first.job.Hash()) + ", " + in.dir + " has layout " +
                             Hex(in.layout.Hash()) + " and job " + Hex(in.job.Hash()));
    }
  }
  const uint32_t n = first.layout.options().num_shards;
  std::vector<Input> by_shard(n);
  std::vector<std::string> seen(n);
  for (auto& in : given) {
    if (in.shard >= n) {
      return DataLoss("input " + in.dir + " says it is shard " + std::to_string(in.shard) +
                      " of a job of " + std::to_string(n) + " shards");
    }
    if (!seen[in.shard].empty()) {
      return InvalidArgument("shard " + std::to_string(in.shard) +
                             "'s store is given twice: " + seen[in.shard] + " and " + in.dir);
    }
    seen[in.shard] = in.dir;
    by_shard[in.shard] = std::move(in);
  }
  std::string missing;
  for (uint32_t s = 0; s < n; ++s) {
    if (seen[s].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
  }
  if (!missing.empty()) {
    return InvalidArgument("the job has " + std::to_string(n) + " shards; the store of shard " +
                           missing + " is missing from the inputs (give every shard's store)");
  }
  // The step: every store must hold it; by default it is every store's newest, so that a store
  // left behind at an older step (restored from an old backup, or whose shard failed its last
  // checkpoints) is noticed rather than silently rolling the whole job back.
  if (step < 0) {
    std::string newest;
    bool same = true;
    for (const auto& in : by_shard) {
      if (in.checkpoints.empty()) {
        return NotFound("input " + in.dir + " (shard " + std::to_string(in.shard) +
                        ") holds no checkpoint");
      }
      newest +=
          (newest.empty() ? "" : ", ") + in.dir + " " + std::to_string(in.checkpoints.back().step);
      same = same && in.checkpoints.back().step == by_shard[0].checkpoints.back().step;
    }
    if (!same) {
      return InvalidArgument(
          "the inputs' newest checkpoints are of different steps (" + newest +
          "): a store of another step; give --step S for a step every store holds");
    }
    step = by_shard[0].checkpoints.back().step;
  }
  for (auto& in : by_shard) {
    const bool has = std::any_of(in.checkpoints.begin(), in.checkpoints.end(),
                                 [&](const CheckpointInfo& c) { return c.step == step; });
    if (!has) {
      return NotFound("input " + in.dir + " (shard " + std::to_string(in.shard) +
                      ") has no checkpoint of step " + std::to_string(step) + " (it holds " +
                      JoinSteps(in.checkpoints) + ")");
    }
    ZPS_ASSIGN_OR_RETURN(in.reader, in.store->OpenCheckpoint(step));
    std::vector<uint32_t> want = in.layout.ChunksOfShard(in.shard);
    if (in.reader->chunks() != want) {
      return DataLoss("checkpoint " + std::to_string(step) + " in " + in.dir +
                      " does not hold the chunks of shard " + std::to_string(in.shard));
    }
    ZPS_ASSIGN_OR_RETURN(in.state, in.reader->ReadState());
    if (in.state != by_shard[0].state) {
      return InvalidArgument("checkpoint " + std::to_string(step) + " holds another step's " +
                             "state (step, loss scaler, optimizer step) in " + in.dir +
                             " than in " + by_shard[0].dir + ": stores of different runs");
    }
    const StateDType dtype = in.reader->info().state_dtype;
    if (dtype != by_shard[0].reader->info().state_dtype) {
      return InvalidArgument("checkpoint " + std::to_string(step) + " in " + in.dir + " holds " +
                             std::string(StateDTypeName(dtype)) + " moments, in " +
                             by_shard[0].dir + " " +
                             std::string(StateDTypeName(by_shard[0].reader->info().state_dtype)) +
                             ": stores of different runs");
    }
  }
  return by_shard;
}

// An output directory: created with its missing parents by Create(), and removed again by
// Remove() (the directories it created; one that existed empty is emptied).
class OutputDir {
 public:
  static Result<OutputDir> Claim(const std::string& dir) {
    std::error_code ec;
    OutputDir out;
    out.dir_ = dir;
    if (fs::exists(dir, ec)) {
      if (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec)) {
        return FailedPrecondition("output " + dir +
                                  " exists and is not empty (resharding writes new stores only)");
      }
      out.root_ = dir;
      out.existed_ = true;
    } else {
      // The highest missing ancestor is what Remove() deletes.
      fs::path p = fs::path(dir).lexically_normal();
      while (p.has_parent_path() && p.parent_path() != p && !fs::exists(p.parent_path(), ec)) {
        p = p.parent_path();
      }
      out.root_ = p.string();
    }
    if (ec) return IoError("output " + dir + ": " + ec.message());
    return out;
  }
  Status Create() const {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) return IoError("cannot create " + dir_ + ": " + ec.message());
    return Status::Ok();
  }
  void Remove() const {
    std::error_code ec;
    if (!existed_) {
      fs::remove_all(root_, ec);
    } else {
      for (const auto& e : fs::directory_iterator(dir_, ec)) fs::remove_all(e.path(), ec);
    }
    if (ec) ZPS_LOG(ERROR) << "reshard: cannot remove " << root_ << ": " << ec.message();
  }

 private:
  std::string dir_;
  std::string root_;
  bool existed_ = false;
};

bool SamePath(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  return fs::weakly_canonical(a, ec1) == fs::weakly_canonical(b, ec2);
}

// Chunk `chunk` of `from` into `to` with its moments unpacked from `from`'s state dtype and
// packed in `dtype` (PackMoment); the master and the chunk's version as they are.
Status ConvertChunk(const CheckpointReader& from, uint32_t chunk, uint64_t elems, StateDType dtype,
                    CheckpointWriter& to) {
  const StateDType was = from.info().state_dtype;
  const ChunkEntry* entry = from.info().FindChunk(chunk);
  if (entry == nullptr) return NotFound("chunk " + std::to_string(chunk) + " not in input");
  std::vector<float> master(elems), values(elems);
  std::vector<std::byte> m(MomentBytes(was, elems)), v(MomentBytes(was, elems));
  ZPS_RETURN_IF_ERROR(from.ReadChunk(chunk, {master, m, v}));
  std::vector<std::byte> m2(MomentBytes(dtype, elems)), v2(MomentBytes(dtype, elems));
  ZPS_RETURN_IF_ERROR(UnpackMoment(was, MomentKind::kM, m, values));
  ZPS_RETURN_IF_ERROR(PackMoment(dtype, MomentKind::kM, values, m2));
  ZPS_RETURN_IF_ERROR(UnpackMoment(was, MomentKind::kV, v, values));
  ZPS_RETURN_IF_ERROR(PackMoment(dtype, MomentKind::kV, values, v2));
  return to.AddChunk(chunk, entry->version, {master, m2, v2});
}

struct Output {
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<CheckpointWriter> writer;
  std::vector<uint64_t> from_bytes;  // payload copied from each input shard
  Status result;
};

}  // namespace

Result<ReshardStats> ReshardCheckpoint(const ReshardOptions& o) {
  if (o.inputs.empty()) return InvalidArgument("reshard: no input stores (--data-dir)");
  if (o.outputs.empty()) return InvalidArgument("reshard: no output stores (--out)");
  if (o.outputs.size() > 4096) return InvalidArgument("reshard: at most 4096 output stores");
  for (size_t i = 0; i < o.outputs.size(); ++i) {
    for (const auto& in : o.inputs) {
      if (SamePath(in, o.outputs[i])) {
        return InvalidArgument("reshard: output " + o.outputs[i] +
                               " is one of the inputs (resharding writes new stores)");
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (SamePath(o.outputs[j], o.outputs[i])) {
        return InvalidArgument("reshard: output " + o.outputs[i] + " is given twice");
      }
    }
  }
  int64_t step = o.step;
  ZPS_ASSIGN_OR_RETURN(std::vector<Input> inputs, OpenInputs(o.inputs, step, o.direct_reads));
  const auto m = static_cast<uint32_t>(o.outputs.size());
  const auto n = static_cast<uint32_t>(inputs.size());
  const Layout& old_layout = inputs[0].layout;
  ZPS_ASSIGN_OR_RETURN(JobSpec job, JobOnShards(inputs[0].job, m));
  const StateDType stored_dtype = inputs[0].reader->info().state_dtype;
  const StateDType state_dtype = o.state_dtype.value_or(stored_dtype);
  const bool convert = state_dtype != stored_dtype;
  job.optimizer.state_dtype = state_dtype;
  if ((o.world_size == 0) != (o.accumulation_steps == 0)) {
    return InvalidArgument("reshard: give the world size and the accumulation steps together");
  }
  if (o.world_size != 0) {
    const uint64_t before = uint64_t{job.shard.world_size} * job.shard.accumulation_steps;
    const uint64_t after = uint64_t{o.world_size} * o.accumulation_steps;
    if (before != after) {
      return InvalidArgument("reshard: world size " + std::to_string(o.world_size) +
                             " x accumulation " + std::to_string(o.accumulation_steps) + " = " +
                             std::to_string(after) + " contributions a step, the job has " +
                             std::to_string(job.shard.world_size) + " x " +
                             std::to_string(job.shard.accumulation_steps) + " = " +
                             std::to_string(before) + " (keep the global batch)");
    }
    job.shard.world_size = o.world_size;
    job.shard.accumulation_steps = o.accumulation_steps;
  }
  ZPS_RETURN_IF_ERROR(job.Validate().WithContext("the job on " + std::to_string(m) + " shards"));

  const std::string coordinator_dir =
      !o.coordinator_out.empty()
          ? o.coordinator_out
          : (fs::path(o.outputs[0]).lexically_normal().parent_path() / "coordinator").string();
  const std::string old_coordinator =
      (fs::path(inputs[0].dir).lexically_normal().parent_path() / "coordinator").string();
  std::vector<OutputDir> claimed;
  for (const auto& dir : o.outputs) {
    ZPS_ASSIGN_OR_RETURN(auto c, OutputDir::Claim(dir));
    claimed.push_back(std::move(c));
  }
  ZPS_ASSIGN_OR_RETURN(auto coordinator_claim, OutputDir::Claim(coordinator_dir));

  // From here on the outputs are written; any error removes them again.
  std::vector<Output> outs(m);
  auto write = [&]() -> Status {
    CheckpointOptions wo;
    wo.write_threads = 1;  // CopyChunk writes from the calling thread
    // Each output is written front to back by one thread, so its chunks go in as table files
    // (no memtable or flush: measured in docs/benchmarks.md, "Resharding (offline)"). The
    // memtables hold only the catalog and the commit record: small ones do.
    wo.ingest_copies = true;
    wo.write_buffer_bytes = 16ull << 20;
    wo.max_write_buffers = 4;
    wo.direct_writes = o.direct_writes;
    for (uint32_t j = 0; j < m; ++j) {
      Output& out = outs[j];
      ZPS_RETURN_IF_ERROR(claimed[j].Create());
      ZPS_ASSIGN_OR_RETURN(out.store, CheckpointStore::Open(o.outputs[j], wo));
      ZPS_RETURN_IF_ERROR(out.store->SetIdentity(job.layout, j));
      ZPS_RETURN_IF_ERROR(out.store->PutJobSpec(job));
      // Catalog entries besides the identity (none today) are the job's: shard 0's come along.
      ZPS_ASSIGN_OR_RETURN(auto names, inputs[0].store->ListCatalog(""));
      for (const auto& name : names) {
        if (name == "layout" || name == "shard" || name == "job") continue;
        ZPS_ASSIGN_OR_RETURN(auto value, inputs[0].store->GetCatalog(name));
        ZPS_RETURN_IF_ERROR(out.store->PutCatalog(name, value));
      }
      // The moments are copied as stored, or converted to the new state dtype.
      ZPS_ASSIGN_OR_RETURN(out.writer, out.store->BeginCheckpoint(step, state_dtype));
      out.from_bytes.assign(n, 0);
    }
    ZPS_ASSIGN_OR_RETURN(
        auto pool,
        ThreadPool::Create({.name = "zps-reshard",
                            .threads = static_cast<int>(std::clamp<uint32_t>(o.threads, 1, m)),
                            .nice = 0}));
    pool->ParallelFor(m, [&](size_t j) {
      Output& out = outs[j];
      for (uint32_t c : job.layout.ChunksOfShard(static_cast<uint32_t>(j))) {
        const uint32_t from = old_layout.shard_of_chunk(c);
        if (convert) {
          // The tensors read: the master and the two moments as stored.
          const uint64_t elems = job.layout.chunk_size(c);
          out.result = ConvertChunk(*inputs[from].reader, c, elems, state_dtype, *out.writer);
          if (!out.result.ok()) return;
          out.from_bytes[from] += elems * sizeof(float) + 2 * MomentBytes(stored_dtype, elems);
          continue;
        }
        const uint64_t before = out.writer->bytes();
        out.result = out.writer->CopyChunk(*inputs[from].reader, c);
        if (!out.result.ok()) return;
        out.from_bytes[from] += out.writer->bytes() - before;
      }
      out.result = convert ? out.writer->SetState(inputs[0].state)
                           : out.writer->CopyState(*inputs[0].reader);
    });
    for (auto& out : outs) ZPS_RETURN_IF_ERROR(out.result);
    // Every input's values were copied exactly once: its chunks' payload plus its state blob
    // is what its manifest counts. A value missing from an input shows here.
    for (uint32_t s = 0; s < n; ++s) {
      uint64_t copied = inputs[s].state.size();
      for (const auto& out : outs) copied += out.from_bytes[s];
      if (copied != inputs[s].reader->info().bytes) {
        return DataLoss("checkpoint " + std::to_string(step) + " in " + inputs[s].dir + " holds " +
                        std::to_string(copied) + " bytes of values, its manifest counts " +
                        std::to_string(inputs[s].reader->info().bytes) + ": a value is missing");
      }
    }
    for (auto& out : outs) ZPS_RETURN_IF_ERROR(out.writer->Commit());
    ZPS_RETURN_IF_ERROR(coordinator_claim.Create());
    return WriteResumeCatalog(coordinator_dir, job, step, m, old_coordinator);
  };
  Status s = write();
  ReshardStats stats;
  for (auto& out : outs) {
    stats.bytes += out.writer ? out.writer->bytes() : 0;
    out.writer.reset();
    out.store.reset();
  }
  if (!s.ok()) {
    for (const auto& c : claimed) c.Remove();
    coordinator_claim.Remove();
    return s.WithContext("reshard (the outputs were removed; the inputs are unchanged)");
  }
  stats.step = step;
  stats.from_shards = n;
  stats.to_shards = m;
  stats.chunks = job.layout.num_chunks();
  stats.from_state_dtype = stored_dtype;
  stats.state_dtype = state_dtype;
  stats.coordinator_dir = coordinator_dir;
  return stats;
}

Result<JobSpec> JobOnShards(const JobSpec& old, uint32_t shards) {
  if (shards == 0) return InvalidArgument("a job of 0 shards");
  JobSpec job = old;
  LayoutOptions lo = old.layout.options();
  lo.num_shards = shards;
  ZPS_ASSIGN_OR_RETURN(job.layout, Layout::Build(old.layout.specs(), lo));
  return job;
}

Status WriteResumeCatalog(const std::string& dir, const JobSpec& job, int64_t step, uint32_t shards,
                          const std::string& old_dir) {
  ZPS_ASSIGN_OR_RETURN(auto catalog, CoordinatorCatalog::Open(dir, {}));
  ZPS_RETURN_IF_ERROR(catalog->PutJobSpec(job));
  // The recovery epoch goes on from the old coordinator's (a new one never reuses an epoch).
  CheckpointOptions ro;
  ro.read_only = true;
  ro.create_if_missing = false;
  std::error_code ec;
  if (fs::exists(old_dir, ec)) {
    auto old = CoordinatorCatalog::Open(old_dir, ro);
    if (old.ok()) {
      auto epoch = (*old)->GetEpoch();
      if (epoch.ok()) ZPS_RETURN_IF_ERROR(catalog->PutEpoch(*epoch));
    }
  }
  ZPS_RETURN_IF_ERROR(catalog->PutStep(step));
  for (uint32_t s = 0; s < shards; ++s) {
    ZPS_RETURN_IF_ERROR(catalog->RecordShardCheckpoint(step, s, shards).status());
  }
  return Status::Ok();
}

void KeepFreedMemory() {
  ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace zps::server
