// zps-bench spill: throughput of the NVMe tier through ChunkStore (io_uring, O_DIRECT).
//
// Three passes over every chunk, in id order, with most state spilled (the budget decides):
//   write      — PassOptions{read_state = false}: fn fills master/m/v, the pipeline writes behind.
//   read       — PassOptions{write_state = false}: the pipeline reads ahead, fn only looks.
//   optimizer  — the full step: read ahead, fused AdamW (writes the bf16 serving copy), write
//                behind. Reported in Mparam/s and as disk MB/s (read + written).
// MB/s counts bytes that reached the disk (ChunkStoreStats), in 10^6 bytes per second, as fio's
// "MB/s". The spill files are removed at exit. scripts/bench-spill.sh runs fio beside it.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/dtype.h"
#include "zps/common/thread_pool.h"
#include "zps/server/chunk_store.h"
#include "zps/server/optimizer.h"

namespace zps::bench {
namespace {

using server::ChunkSpans;
using server::ChunkStore;
using server::ChunkStoreOptions;
using server::PassOptions;

// "256M", "1B", "1.5G", "4194304": a count with a decimal suffix (K, M, B/G = 1e9).
Result<int64_t> ParseCount(std::string_view t) {
  double mult = 1;
  if (!t.empty()) {
    switch (t.back()) {
      case 'K':
      case 'k':
        mult = 1e3;
        break;
      case 'M':
      case 'm':
        mult = 1e6;
        break;
      case 'B':
      case 'b':
      case 'G':
      case 'g':
        mult = 1e9;
        break;
      default:
        break;
    }
    if (mult != 1) t.remove_suffix(1);
  }
  ZPS_ASSIGN_OR_RETURN(double v, ParseDouble(t));
  if (!(v > 0) || v * mult > 1e13) return InvalidArgument("bad count '" + std::string(t) + "'");
  return static_cast<int64_t>(v * mult);
}

struct Options {
  std::string dir = "/var/tmp";            // Default: /var/tmp.
  int64_t params = 256'000'000;            // Default: 256M parameters (3 GB of master + m + v).
  int64_t chunk_params = 4 << 20;          // Default: 4Mi (the layout's default chunk).
  uint64_t memory_budget = 512ull << 20;   // Default: 512 MiB.
  uint64_t serving_budget = 128ull << 20;  // Default: 128 MiB.
  int queue_depth = 16;                    // Default: 16.
  uint64_t io_bytes = 1 << 20;             // Default: 1 MiB.
  int read_ahead = 2;                      // Default: 2.
  int write_behind = 2;                    // Default: 2.
  int threads = 0;                         // Default: 0 = all CPUs (optimizer pool).
  int passes = 1;                          // Default: 1 optimizer pass.
  bool register_buffers = false;           // Default: false.
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Run(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench spill", "NVMe tier: spilled write/read and optimizer-pass throughput.");
  flags.Add("dir", "spill directory (must exist; O_DIRECT required)", &o.dir);
  flags.AddCustom("params", "parameters (K/M/B suffixes: 1B = 1e9)", "256M",
                  [&](std::string_view t) -> Status {
                    ZPS_ASSIGN_OR_RETURN(o.params, ParseCount(t));
                    return Status::Ok();
                  });
  flags.Add("chunk-params", "parameters per chunk", &o.chunk_params, 1024, int64_t{1} << 30);
  flags.AddBytes("memory-budget", "RAM for master+m+v (and pipeline buffers)", &o.memory_budget);
  flags.AddBytes("serving-budget", "RAM for serving copies (and buffers)", &o.serving_budget);
  flags.Add("queue-depth", "io_uring requests in flight", &o.queue_depth, 1, 4096);
  flags.AddBytes("io-bytes", "bytes per request (multiple of 4096)", &o.io_bytes);
  flags.Add("read-ahead", "chunks read ahead", &o.read_ahead, 1, 64);
  flags.Add("write-behind", "chunks written behind", &o.write_behind, 1, 64);
  flags.Add("threads", "optimizer pool size; 0 = all CPUs", &o.threads, 0, 1024);
  flags.Add("passes", "optimizer passes", &o.passes, 1, 100);
  flags.Add("register-buffers", "register the pipeline buffers with io_uring", &o.register_buffers);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;

  std::vector<uint64_t> chunks;
  for (int64_t left = o.params; left > 0; left -= o.chunk_params) {
    chunks.push_back(static_cast<uint64_t>(std::min(left, o.chunk_params)));
  }
  ChunkStoreOptions so;
  so.spill_dir = o.dir;
  so.file_prefix = "zps-bench-spill";
  so.memory_budget = o.memory_budget;
  so.serving_memory_budget = o.serving_budget;
  so.queue_depth = static_cast<uint32_t>(o.queue_depth);
  so.io_bytes = static_cast<uint32_t>(o.io_bytes);
  so.read_ahead = static_cast<uint32_t>(o.read_ahead);
  so.write_behind = static_cast<uint32_t>(o.write_behind);
  so.register_buffers = o.register_buffers;
  auto t_create = std::chrono::steady_clock::now();
  auto store_or = ChunkStore::Create(so, chunks);
  if (!store_or.ok()) {
    std::fprintf(stderr, "zps-bench spill: %s\n", store_or.status().ToString().c_str());
    return 1;
  }
  ChunkStore& store = **store_or;
  const double create_s = Seconds(t_create);
  const auto st0 = store.stats();
  std::printf(
      "spill: %lld params in %zu chunks; budget %.2f GiB state + %.2f GiB serving; "
      "in RAM %u/%u states, %u/%u serving; spilled %.2f GB state + %.2f GB serving "
      "(%s); buffers %.0f MiB; create %.2f s\n",
      static_cast<long long>(o.params), chunks.size(), o.memory_budget / 1073741824.0,
      o.serving_budget / 1073741824.0, st0.state_resident, st0.chunks, st0.serving_resident,
      st0.chunks, st0.state_file_bytes / 1e9, st0.serving_file_bytes / 1e9,
      st0.direct ? "O_DIRECT" : "buffered", st0.buffer_bytes / 1048576.0, create_s);

  std::vector<uint32_t> ids(chunks.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i);
  auto timed = [&](const char* name, const PassOptions& pass, const ChunkStore::ChunkFn& fn,
                   double* mbps_read, double* mbps_written, double* secs) -> bool {
    const auto before = store.stats();
    auto t0 = std::chrono::steady_clock::now();
    Status st = store.ForEachChunk(ids, pass, fn);
    *secs = Seconds(t0);
    if (!st.ok()) {
      std::fprintf(stderr, "zps-bench spill: %s pass: %s\n", name, st.ToString().c_str());
      return false;
    }
    const auto after = store.stats();
    *mbps_read = (after.bytes_read - before.bytes_read) / 1e6 / *secs;
    *mbps_written = (after.bytes_written - before.bytes_written) / 1e6 / *secs;
    return true;
  };

  double r = 0, w = 0, s = 0;
  PassOptions write_pass;
  write_pass.read_state = false;
  if (!timed(
          "write", write_pass,
          [](uint32_t c, const ChunkSpans& sp) {
            for (size_t i = 0; i < sp.state.master.size(); ++i) {
              sp.state.master[i] = 0.001f * static_cast<float>((i + c) % 1000);
            }
            std::memset(sp.state.m.data(), 0, sp.state.m.size_bytes());
            std::memset(sp.state.v.data(), 0, sp.state.v.size_bytes());
            return Status::Ok();
          },
          &r, &w, &s)) {
    return 1;
  }
  const double write_mbps = w;
  std::printf("spill write     : %8.1f MB/s  (%.2f s)\n", w, s);
  PassOptions read_pass;
  read_pass.write_state = false;
  double sink = 0;
  if (!timed(
          "read", read_pass,
          [&](uint32_t, const ChunkSpans& sp) {
            sink += sp.state.master[sp.state.master.size() / 2];
            return Status::Ok();
          },
          &r, &w, &s)) {
    return 1;
  }
  const double read_mbps = r;
  std::printf("spill read      : %8.1f MB/s  (%.2f s)\n", r, s);

  ThreadPoolOptions po;
  po.name = "zps-opt";
  po.threads = o.threads;
  auto pool = ThreadPool::Create(po);
  auto opt = pool.ok() ? server::Optimizer::Create(server::OptimizerConfig{}, pool->get())
                       : Result<std::unique_ptr<server::Optimizer>>(pool.status());
  if (!opt.ok()) {
    std::fprintf(stderr, "zps-bench spill: %s\n", opt.status().ToString().c_str());
    return 1;
  }
  std::vector<float> grad(static_cast<size_t>(o.chunk_params));
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 1e-3f * static_cast<float>(i % 13) - 6e-3f;
  PassOptions opt_pass;
  opt_pass.serving = true;
  double opt_mparams = 0;
  for (int p = 1; p <= o.passes; ++p) {
    if (!timed(
            "optimizer", opt_pass,
            [&](uint32_t, const ChunkSpans& sp) {
              server::UpdateParams up;
              up.step = p;
              up.out16 = sp.serving;
              up.out_dtype = DType::kBF16;
              return (*opt)->Update(
                  sp.state, server::GradView{grad.data(), DType::kF32, sp.state.master.size()}, up);
            },
            &r, &w, &s)) {
      return 1;
    }
    opt_mparams = static_cast<double>(o.params) / 1e6 / s;
    std::printf(
        "optimizer pass %d: %8.1f Mparam/s  (%.2f s; disk %.1f MB/s read + %.1f MB/s "
        "written; %d threads)\n",
        p, opt_mparams, s, r, w, (*pool)->size());
  }
  // One line for scripts.
  std::printf("RESULT spill_write_MBps=%.1f spill_read_MBps=%.1f optimizer_Mparams=%.1f%s\n",
              write_mbps, read_mbps, opt_mparams, sink == -1 ? " " : "");
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("spill", "NVMe tier: spilled write/read and optimizer pass (ChunkStore)", Run);

}  // namespace zps::bench
