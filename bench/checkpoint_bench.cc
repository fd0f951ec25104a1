// zps-bench checkpoint: write and read throughput of a checkpoint of `bytes` of chunk state
// (fp32 master + m + v) in a directory, through CheckpointStore — the whole path: CRC32C framing,
// RocksDB memtables, blob files, flush and the synced commit.
//
// Write: BeginCheckpoint → AddChunk × n → Commit (returns once durable), timed end to end.
// Read: the store is closed, the page cache of its files is dropped (POSIX_FADV_DONTNEED on each
// file: they are synced, so this is per-file and leaves other processes' cache alone), the store
// is reopened and every chunk's master, m and v are read and CRC-checked with `read-threads`
// threads. Compare with fio on the same directory: scripts/bench-checkpoint.sh.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/layout.h"
#include "zps/server/checkpoint.h"

namespace zps::bench {
namespace {

using server::CheckpointOptions;
using server::CheckpointStore;

struct Options {
  std::string dir;                      // Default: none (required)
  uint64_t bytes = 2ull << 30;          // Default: 2 GiB of master + m + v
  int64_t chunk_elems = 4 << 20;        // Default: 4 Mi elements (48 MiB of state per chunk)
  uint64_t slice_bytes = 4ull << 20;    // Default: 4 MiB
  uint64_t write_buffer = 64ull << 20;  // Default: 64 MiB memtables
  int write_buffers = 8;                // Default: 8
  int background_jobs = 8;              // Default: 8
  uint64_t write_io = 8ull << 20;       // Default: 8 MiB
  bool direct_writes = false;           // Default: off
  bool direct_reads = false;            // Default: off
  int write_threads = 2;                // Default: 2
  int read_threads = 2;                 // Default: 2
  int reps = 1;                         // Default: 1
  bool json = false;                    // Default: false
};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Fail(const Status& s) { return bench::Fail("checkpoint", s); }

int Run(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench checkpoint", "Checkpoint write/read throughput in a directory.");
  flags.Add("dir", "directory for the checkpoint store (created; removed afterwards)", &o.dir);
  flags.AddBytes("bytes", "chunk state per checkpoint (master + m + v)", &o.bytes);
  flags.Add("chunk-elems", "elements per chunk", &o.chunk_elems, 1024, int64_t{1} << 30);
  flags.AddBytes("slice-bytes", "largest tensor value", &o.slice_bytes);
  flags.AddBytes("write-buffer", "RocksDB memtable size", &o.write_buffer);
  flags.Add("write-buffers", "RocksDB memtables", &o.write_buffers, 2, 64);
  flags.Add("background-jobs", "RocksDB flush/compaction threads", &o.background_jobs, 2, 64);
  flags.AddBytes("write-io", "bytes per write call of a file", &o.write_io);
  flags.Add("direct-writes", "O_DIRECT flush/compaction", &o.direct_writes);
  flags.Add("direct-reads", "O_DIRECT reads", &o.direct_reads);
  flags.Add("write-threads", "threads framing and inserting slices", &o.write_threads, 1, 64);
  flags.Add("read-threads", "threads reading chunks", &o.read_threads, 1, 64);
  flags.Add("reps", "write+read repetitions", &o.reps, 1, 100);
  flags.Add("json", "print one JSON object per line", &o.json);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  if (o.dir.empty()) return Fail(InvalidArgument("--dir is required"));

  const uint64_t chunk = static_cast<uint64_t>(o.chunk_elems) / 64 * 64;
  const uint64_t elems = std::max<uint64_t>(chunk, o.bytes / 12 / chunk * chunk);
  auto layout = Layout::Build({{"w", {static_cast<int64_t>(elems)}}},
                              {.chunk_elems = chunk, .align_elems = 64, .num_shards = 1});
  if (!layout.ok()) return Fail(layout.status());
  const uint64_t total = elems * 12;
  std::vector<float> master(chunk), m(chunk), v(chunk);
  for (uint64_t i = 0; i < chunk; ++i) {
    master[i] = 0.001f * static_cast<float>(i % 1013);
    m[i] = -master[i];
    v[i] = master[i] * master[i];
  }

  CheckpointOptions copts;
  copts.keep = 1;
  copts.slice_bytes = o.slice_bytes;
  copts.write_buffer_bytes = o.write_buffer;
  copts.max_write_buffers = o.write_buffers;
  copts.direct_writes = o.direct_writes;
  copts.background_jobs = o.background_jobs;
  copts.write_io_bytes = o.write_io;
  copts.direct_reads = o.direct_reads;
  copts.write_threads = o.write_threads;
  if (Status s = copts.Validate(); !s.ok()) return Fail(s);
  const std::string db = o.dir + "/zps-ckpt-bench";
  std::error_code ec;
  std::filesystem::remove_all(db, ec);

  if (!o.json) {
    std::printf(
        "checkpoint of %.2f GiB (%u chunks of %llu elements), slices %llu KiB, "
        "direct writes %s, direct reads %s, %d read threads\n",
        static_cast<double>(total) / (1 << 30), layout->num_chunks(),
        static_cast<unsigned long long>(chunk),
        static_cast<unsigned long long>(o.slice_bytes >> 10), o.direct_writes ? "on" : "off",
        o.direct_reads ? "on" : "off", o.read_threads);
  }
  int rc = 0;
  for (int rep = 0; rep < o.reps && rc == 0; ++rep) {
    double write_s = 0, commit_s = 0, read_s = 0, write_cpu = 0, read_cpu = 0;
    {
      auto store = CheckpointStore::Open(db, copts);
      if (!store.ok()) return Fail(store.status());
      if (Status s = (*store)->SetIdentity(*layout, 0); !s.ok()) return Fail(s);
      const double c0 = CpuSeconds();
      auto t0 = std::chrono::steady_clock::now();
      auto w = (*store)->BeginCheckpoint(rep);
      if (!w.ok()) return Fail(w.status());
      for (uint32_t c = 0; c < layout->num_chunks(); ++c) {
        const uint64_t n = layout->chunk_size(c);
        master[0] = static_cast<float>(c);
        Status s =
            (*w)->AddChunk(c, rep,
                           {std::span(master.data(), n), std::as_bytes(std::span(m.data(), n)),
                            std::as_bytes(std::span(v.data(), n))});
        if (!s.ok()) return Fail(s);
      }
      auto t1 = std::chrono::steady_clock::now();
      if (Status s = (*w)->Commit(); !s.ok()) return Fail(s);
      auto t2 = std::chrono::steady_clock::now();
      write_s = Seconds(t0, t2);
      write_cpu = CpuSeconds() - c0;
      commit_s = Seconds(t1, t2);
    }
    DropCache(db);
    {
      auto store = CheckpointStore::Open(db, copts);
      if (!store.ok()) return Fail(store.status());
      const double c0 = CpuSeconds();
      auto t0 = std::chrono::steady_clock::now();
      auto reader = (*store)->OpenCheckpoint(rep);
      if (!reader.ok()) return Fail(reader.status());
      std::atomic<uint32_t> next{0};
      std::atomic<bool> failed{false};
      std::vector<std::thread> threads;
      for (int t = 0; t < o.read_threads; ++t) {
        threads.emplace_back([&] {
          std::vector<float> a(chunk), b(chunk), c(chunk);
          for (uint32_t i = next++; i < layout->num_chunks() && !failed; i = next++) {
            const uint64_t n = layout->chunk_size(i);
            Status s = (*reader)->ReadChunk(
                i, {std::span(a.data(), n), std::as_writable_bytes(std::span(b.data(), n)),
                    std::as_writable_bytes(std::span(c.data(), n))});
            if (!s.ok() || a[0] != static_cast<float>(i)) {
              std::fprintf(stderr, "read of chunk %u: %s\n", i, s.ToString().c_str());
              failed = true;
            }
          }
        });
      }
      for (auto& t : threads) t.join();
      read_s = Seconds(t0, std::chrono::steady_clock::now());
      read_cpu = CpuSeconds() - c0;
      if (failed) rc = 1;
    }
    const double gb = static_cast<double>(total) / 1e9;
    if (o.json) {
      std::printf(
          "{\"bench\":\"checkpoint\",\"bytes\":%llu,\"write_s\":%.3f,\"commit_s\":%.3f,"
          "\"read_s\":%.3f,\"write_cpu_s\":%.3f,\"read_cpu_s\":%.3f,"
          "\"write_gbps\":%.3f,\"read_gbps\":%.3f}\n",
          static_cast<unsigned long long>(total), write_s, commit_s, read_s, write_cpu, read_cpu,
          gb / write_s, gb / read_s);
    } else {
      std::printf(
          "rep %d: write %.3f GB/s (%.2f s, of which commit %.2f s; %.2f CPU-s), "
          "read %.3f GB/s (%.2f s; %.2f CPU-s)\n",
          rep, gb / write_s, write_s, commit_s, write_cpu, gb / read_s, read_s, read_cpu);
    }
    std::fflush(stdout);
  }
  std::filesystem::remove_all(db, ec);
  return rc;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("checkpoint", "checkpoint write/read throughput (CheckpointStore)", Run);

}  // namespace zps::bench
