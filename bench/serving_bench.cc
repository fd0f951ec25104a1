// zps-bench serving: what a fetch of a chunk's 16-bit serving copy costs the shard's CPU when the
// copy is stored (today: the bytes are already there, and a fetch reads them) against when it is
// made at fetch time from the fp32 master (convert the master into a staging buffer, then send
// that). docs/state-bytes.md uses the two rates to decide whether the serving copy's 2 bytes per
// parameter can go.
//
//   zps-bench serving --json --threads 1,2
//
// Method. A working set of chunks of --chunk-elems elements (the layout's default chunk) is made:
// each chunk has its fp32 master and its bf16 serving copy, in separate buffers as on a shard.
// Each thread owns --staging chunk-sized 16-bit staging buffers (the serving tier's staging
// buffers) and, per "fetch", takes the next chunk of the working set and the next of its staging
// buffers, so that neither source nor destination is hot in the cache (a shard serves every chunk
// once per worker per pass). Modes, per chunk:
//   stored          memcpy of the bf16 copy into the staging buffer: the bytes a fetch reads
//                   today (on shared memory a one-sided get is this one copy, done by the worker);
//   convert         ConvertF32ToBF16 of the master into the staging buffer (what the shard's
//                   optimizer pass writes today, so the same bits);
//   convert_stream  StreamConvertF32ToBF16 (the same bits, non-temporal stores from a quarter of
//                   the last-level cache up).
// GB/s is of output (16-bit) bytes, summed over threads: what can be handed to the wire per
// second. Each case runs `reps` times after a warm-up; the JSON line gives the median and best.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/aligned_buffer.h"
#include "zps/common/config.h"
#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/stream_copy.h"

namespace zps::bench {
namespace {

struct Options {
  uint64_t chunk_elems = LayoutOptions{}.chunk_elems;  // Default: the layout's chunk (4 Mi).
  uint64_t working_set = 1ull << 30;    // Default: 1 GiB of fp32 master (64 default chunks).
  int staging = 4;                      // Default: 4 staging buffers per thread.
  uint64_t bytes_per_rep = 2ull << 30;  // Default: 2 GiB of 16-bit output per repetition.
  std::string threads = "1,2";          // Default: 1 and 2 threads.
  std::string modes = "stored,convert,convert_stream";  // Default: all three.
  int reps = 5;                                         // Default: 5 (after one warm-up).
  bool json = false;                                    // Default: false (a table).
};

struct Chunk {
  AlignedBuffer<float> master;
  AlignedBuffer<uint16_t> serving;
};

enum class Mode { kStored, kConvert, kConvertStream };

// One chunk's fetch in mode `m`: the serving bytes of chunk `c` land in `dst`.
void Serve(Mode m, const Chunk& c, uint64_t n, uint16_t* dst) {
  switch (m) {
    case Mode::kStored:
      std::memcpy(dst, c.serving.data(), n * sizeof(uint16_t));
      return;
    case Mode::kConvert:
      ConvertF32ToBF16({c.master.data(), n}, {dst, n});
      return;
    case Mode::kConvertStream:
      StreamConvertF32ToBF16({c.master.data(), n}, {dst, n});
      return;
  }
}

// GB/s of 16-bit output over `threads` threads, each serving `per_thread` chunks: thread t
// takes chunks t, t + threads, ... of the working set, cycling.
double Rep(Mode m, const std::vector<Chunk>& chunks, uint64_t n,
           std::vector<std::vector<AlignedBuffer<uint16_t>>>& staging, int threads,
           uint64_t per_thread) {
  std::barrier start(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto& mine = staging[t];
      start.arrive_and_wait();
      size_t c = t;
      for (uint64_t i = 0; i < per_thread; ++i) {
        Serve(m, chunks[c], n, mine[i % mine.size()].data());
        c = (c + threads) % chunks.size();
      }
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  start.arrive_and_wait();
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(per_thread) * threads * n * sizeof(uint16_t) / s / 1e9;
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench serving",
          "serving a stored bf16 copy vs converting the fp32 master at fetch time, GB/s out.");
  f.AddBytes("chunk-elems", "elements per chunk", &o.chunk_elems);
  f.AddBytes("working-set", "bytes of fp32 master the fetches cycle through", &o.working_set);
  f.Add("staging", "chunk-sized staging buffers per thread", &o.staging, 1, 64);
  f.AddBytes("bytes-per-rep", "16-bit output bytes per repetition (over all threads)",
             &o.bytes_per_rep);
  f.Add("threads", "thread counts, comma-separated", &o.threads);
  f.Add("modes", "stored,convert,convert_stream", &o.modes);
  f.Add("reps", "repetitions after a warm-up", &o.reps, 1, 1000);
  f.Add("json", "one JSON object per line", &o.json);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench serving: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  const uint64_t n = o.chunk_elems;
  if (n == 0 || n % 64 != 0) {
    std::fprintf(stderr, "zps-bench serving: --chunk-elems must be a positive multiple of 64\n");
    return 2;
  }
  std::vector<int> thread_counts;
  for (const auto& s : SplitList(o.threads)) {
    const int t = std::atoi(s.c_str());
    if (t < 1 || t > 256) {
      std::fprintf(stderr, "zps-bench serving: bad thread count '%s'\n", s.c_str());
      return 2;
    }
    thread_counts.push_back(t);
  }
  std::vector<std::pair<std::string, Mode>> modes;
  for (const auto& s : SplitList(o.modes)) {
    if (s == "stored") {
      modes.emplace_back(s, Mode::kStored);
    } else if (s == "convert") {
      modes.emplace_back(s, Mode::kConvert);
    } else if (s == "convert_stream") {
      modes.emplace_back(s, Mode::kConvertStream);
    } else {
      std::fprintf(stderr, "zps-bench serving: unknown mode '%s'\n", s.c_str());
      return 2;
    }
  }
  const int max_threads = *std::max_element(thread_counts.begin(), thread_counts.end());

  // The working set: masters with values spread over many exponents (rounding does work on
  // every element), and their serving copies made the way the optimizer pass makes them.
  const uint64_t count = std::max<uint64_t>(o.working_set / (n * sizeof(float)), max_threads);
  std::vector<Chunk> chunks;
  for (uint64_t c = 0; c < count; ++c) {
    auto master = AlignedBuffer<float>::Allocate(n);
    auto serving = AlignedBuffer<uint16_t>::Allocate(n);
    if (!master.ok() || !serving.ok())
      return Fail("serving", master.ok() ? serving.status() : master.status());
    uint32_t x = static_cast<uint32_t>(c) * 2654435761u + 1;
    for (uint64_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      (*master)[i] = (static_cast<float>(x >> 8) - 8388608.0f) * 1.1920929e-9f;
    }
    ConvertF32ToBF16({master->data(), n}, {serving->data(), n});
    chunks.push_back({std::move(*master), std::move(*serving)});
  }
  std::vector<std::vector<AlignedBuffer<uint16_t>>> staging(max_threads);
  for (auto& mine : staging) {
    for (int i = 0; i < o.staging; ++i) {
      auto b = AlignedBuffer<uint16_t>::Allocate(n);
      if (!b.ok()) return Fail("serving", b.status());
      mine.push_back(std::move(*b));
    }
  }

  for (const int threads : thread_counts) {
    const uint64_t per_thread =
        std::max<uint64_t>(o.bytes_per_rep / (n * sizeof(uint16_t)) / threads, 1);
    for (const auto& [name, mode] : modes) {
      Rep(mode, chunks, n, staging, threads, std::max<uint64_t>(per_thread / 4, 1));  // warm-up
      std::vector<double> v;
      for (int r = 0; r < o.reps; ++r)
        v.push_back(Rep(mode, chunks, n, staging, threads, per_thread));
      std::sort(v.begin(), v.end());
      if (o.json) {
        std::printf(
            "{\"bench\":\"serving\",\"mode\":\"%s\",\"threads\":%d,\"chunk_elems\":%llu,"
            "\"chunks\":%llu,\"out_gb_per_s\":%.3f,\"best_out_gb_per_s\":%.3f,\"reps\":%zu}\n",
            name.c_str(), threads, static_cast<unsigned long long>(n),
            static_cast<unsigned long long>(count), v[v.size() / 2], v.back(), v.size());
      } else {
        std::printf("serving %-15s threads %d  %llu elems  median %7.3f GB/s out  best %7.3f\n",
                    name.c_str(), threads, static_cast<unsigned long long>(n), v[v.size() / 2],
                    v.back());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("serving",
                     "fetch of a stored bf16 serving copy vs made from the master at fetch time",
                     Run);

}  // namespace zps::bench
