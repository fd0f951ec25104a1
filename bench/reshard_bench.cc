// zps-bench reshard: the time of `zps-ckpt reshard` (ReshardCheckpoint) of `bytes` of chunk state
// (fp32 master + m + v) from `from` shards to `to` shards in a directory.
//
// Setup (not timed): the `from` input stores are written with one checkpoint, closed, and the
// page cache of their files dropped (POSIX_FADV_DONTNEED per file, after fdatasync), so the
// reshard reads them from the disk. Timed: ReshardCheckpoint, from the open of the inputs to the
// return after every output store's synced commit and the coordinator catalog. Compare with fio
// reading and writing the same bytes on the same directory: scripts/bench-reshard.sh.
//
// --online: the same move through the online path instead (ReshardAtStart, docs/checkpoints.md
// "Online"): each of the `to` new shards runs it on its own thread with its data dir (the first
// `from` holding the old stores), over real reshard endpoints on 127.0.0.1. Timed from the start
// of the threads to the last one's return (every new store committed, the job switched, the
// stores swapped in).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/free_port.h"
#include "zps/common/layout.h"
#include "zps/server/checkpoint.h"
#include "zps/server/checkpoint_reshard.h"
#include "zps/server/online_reshard.h"

namespace zps::bench {
namespace {

using server::CheckpointOptions;
using server::CheckpointStore;

struct Options {
  std::string dir;                // Default: none (required)
  uint64_t bytes = 2ull << 30;    // Default: 2 GiB of master + m + v
  int64_t chunk_elems = 4 << 20;  // Default: 4 Mi elements (48 MiB of state per chunk)
  int from = 2;                   // Default: 2 input shards
  int to = 3;                     // Default: 3 output shards
  bool direct_io = false;         // Default: false (O_DIRECT writes too)
  bool buffered_reads = false;    // Default: false (O_DIRECT reads, as zps-ckpt reshard)
  bool online = false;            // Default: false (zps-ckpt reshard's path)
  bool json = false;              // Default: false
};

int Fail(const Status& s) { return bench::Fail("reshard", s); }

// Writes checkpoint 1 of every input shard's chunks.
Status WriteInputs(const Layout& layout, const std::vector<std::string>& dirs) {
  const uint64_t chunk = layout.options().chunk_elems;
  std::vector<float> master(chunk), m(chunk), v(chunk);
  for (uint64_t i = 0; i < chunk; ++i) {
    master[i] = 0.001f * static_cast<float>(i % 1013);
    m[i] = -master[i];
    v[i] = master[i] * master[i];
  }
  server::JobSpec job;
  job.layout = layout;
  for (uint32_t s = 0; s < dirs.size(); ++s) {
    std::filesystem::create_directories(std::filesystem::path(dirs[s]).parent_path());
    ZPS_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(dirs[s], {}));
    ZPS_RETURN_IF_ERROR(store->SetIdentity(layout, s));
    ZPS_RETURN_IF_ERROR(store->PutJobSpec(job));
    ZPS_ASSIGN_OR_RETURN(auto w, store->BeginCheckpoint(1));
    for (uint32_t c : layout.ChunksOfShard(s)) {
      const uint64_t n = layout.chunk_size(c);
      master[0] = static_cast<float>(c);
      ZPS_RETURN_IF_ERROR(w->AddChunk(
          c, 1,
          {std::span<const float>(master.data(), n), std::as_bytes(std::span(m.data(), n)),
           std::as_bytes(std::span(v.data(), n))}));
    }
    const char state[] = "bench state";
    ZPS_RETURN_IF_ERROR(w->SetState(std::as_bytes(std::span(state))));
    ZPS_RETURN_IF_ERROR(w->Commit());
  }
  return Status::Ok();
}

// Every new shard's ReshardAtStart on its own thread; the first error, if any. Returns the bytes
// of chunk state the new shards fetched from their peers in *fetched.
Status ReshardOnline(const std::string& root, int to, uint64_t* fetched) {
  server::OnlineReshardOptions o;
  ZPS_ASSIGN_OR_RETURN(const std::vector<uint16_t> ports,
                       FreeLoopbackPorts(static_cast<size_t>(to)));
  for (size_t i = 0; i < ports.size(); ++i) {
    o.peers += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(ports[i]);
  }
  ZPS_ASSIGN_OR_RETURN(auto peers, o.PeerList());
  std::vector<metrics::Registry> registries(static_cast<size_t>(to));
  std::vector<server::ReshardProgress> progress;
  for (auto& r : registries) {
    ZPS_ASSIGN_OR_RETURN(auto p, server::ReshardProgress::Create(r));
    progress.push_back(p);
  }
  std::vector<Status> results(static_cast<size_t>(to), Status::Ok());
  std::vector<std::unique_ptr<server::ReshardHandle>> handles(static_cast<size_t>(to));
  std::vector<std::thread> threads;
  for (int i = 0; i < to; ++i) {
    threads.emplace_back([&, i] {
      server::OnlineReshardOptions mine = o;
      mine.port = std::stoi(peers[i].substr(peers[i].rfind(':') + 1));
      const server::ReshardSelf self{root + "/in/s" + std::to_string(i), static_cast<uint32_t>(i),
                                     static_cast<uint32_t>(to), "127.0.0.1", "zps-bench"};
      auto r = server::ReshardAtStart(mine, self, progress[i]);
      if (r.ok()) {
        handles[i] = std::move(*r);
      } else {
        results[i] = r.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  *fetched = 0;
  for (const auto& p : progress) *fetched += p.fetched_bytes();
  for (auto& r : results) ZPS_RETURN_IF_ERROR(r);
  return Status::Ok();
}

int Run(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench reshard", "Offline resharding time of a checkpoint (ReshardCheckpoint).");
  flags.Add("dir", "directory for the stores (created; removed afterwards)", &o.dir);
  flags.AddBytes("bytes", "chunk state of the job (master + m + v)", &o.bytes);
  flags.Add("chunk-elems", "elements per chunk", &o.chunk_elems, 1024, int64_t{1} << 30);
  flags.Add("from", "input shards", &o.from, 1, 4096);
  flags.Add("to", "output shards", &o.to, 1, 4096);
  flags.Add("direct-io", "O_DIRECT writes of the outputs too", &o.direct_io);
  flags.Add("buffered-reads", "read the inputs through the page cache (default: O_DIRECT)",
            &o.buffered_reads);
  flags.Add("online",
            "the online path (ReshardAtStart on a thread per new shard, over loopback) instead "
            "of zps-ckpt reshard's",
            &o.online);
  flags.Add("json", "print one JSON object", &o.json);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  if (o.dir.empty()) return Fail(InvalidArgument("--dir is required"));

  const uint64_t chunk = static_cast<uint64_t>(o.chunk_elems) / 64 * 64;
  const uint64_t elems = std::max<uint64_t>(chunk, o.bytes / 12 / chunk * chunk);
  auto layout = Layout::Build(
      {{"w", {static_cast<int64_t>(elems)}}},
      {.chunk_elems = chunk, .align_elems = 64, .num_shards = static_cast<uint32_t>(o.from)});
  if (!layout.ok()) return Fail(layout.status());
  const std::string root = o.dir + "/zps-reshard-bench";
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  server::ReshardOptions r;
  r.direct_writes = o.direct_io;
  r.direct_reads = !o.buffered_reads;
  for (int s = 0; s < o.from; ++s)
    r.inputs.push_back(root + "/in/s" + std::to_string(s) + "/checkpoints");
  for (int s = 0; s < o.to; ++s)
    r.outputs.push_back(root + "/out/s" + std::to_string(s) + "/checkpoints");
  // As zps-ckpt reshard does; zps-server, which runs the online path, does not.
  if (!o.online) server::KeepFreedMemory();
  if (Status s = WriteInputs(*layout, r.inputs); !s.ok()) return Fail(s);
  DropCache(root + "/in");

  const double c0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  Result<server::ReshardStats> stats = server::ReshardStats{};
  uint64_t fetched = 0;
  if (o.online) {
    Status s = ReshardOnline(root, o.to, &fetched);
    if (!s.ok()) stats = s;
  } else {
    stats = server::ReshardCheckpoint(r);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = CpuSeconds() - c0;
  std::filesystem::remove_all(root, ec);
  if (!stats.ok()) return Fail(stats.status());
  const uint64_t total = elems * 12;
  if (o.json) {
    std::printf(
        "{\"bench\":\"reshard\",\"path\":\"%s\",\"bytes\":%llu,\"copied\":%llu,"
        "\"fetched\":%llu,\"from\":%d,\"to\":%d,\"seconds\":%.3f,\"cpu_s\":%.3f,"
        "\"gbps\":%.3f}\n",
        o.online ? "online" : "offline", static_cast<unsigned long long>(total),
        static_cast<unsigned long long>(stats->bytes), static_cast<unsigned long long>(fetched),
        o.from, o.to, secs, cpu, static_cast<double>(total) / 1e9 / secs);
  } else {
    std::printf(
        "%s reshard of %.2f GiB (%u chunks) from %d to %d shards: %.2f s (%.3f GB/s, %.2f "
        "CPU-s)\n",
        o.online ? "online" : "offline", static_cast<double>(total) / (1 << 30),
        layout->num_chunks(), o.from, o.to, secs, static_cast<double>(total) / 1e9 / secs, cpu);
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("reshard", "offline resharding time of a checkpoint (zps-ckpt reshard)", Run);

}  // namespace zps::bench
