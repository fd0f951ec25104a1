// zps-bench copy: what one memcpy of a request costs when its destination is hot (the same
// buffer every time, as ucx_perftest reuses one buffer) and when it is not (a new destination
// each time, cycling through a working set, as a shard writes each chunk's gradient into its
// own slot). On shared memory both the RMA get of a push and ucx_perftest's ucp_get are one
// such copy, so this bounds what a push through the server can reach against perftest on the
// same machine (docs/benchmarks.md, "Transport through the server").
//
//   zps-bench copy --json --sizes 4MiB,16MiB,64MiB --working-set 512MiB
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"

namespace zps::bench {
namespace {

struct Options {
  std::string sizes = "4MiB,16MiB,64MiB";  // Default: 4, 16, 64 MiB per copy.
  uint64_t working_set = 512ull << 20;     // Default: 512 MiB (zps-bench transport's push set).
  uint64_t bytes_per_rep = 512ull << 20;   // Default: 512 MiB copied per repetition.
  int reps = 3;                            // Default: 3 (after one warm-up).
  bool json = false;                       // Default: false (a table).
};

struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete (p, std::align_val_t{64}); }
};
using Buffer = std::unique_ptr<std::byte, AlignedFree>;

Buffer Allocate(uint64_t n) {
  Buffer b(static_cast<std::byte*>(::operator new (n, std::align_val_t{64})));
  std::memset(b.get(), 1, n);  // fault every page in first
  return b;
}

// GB/s of `bytes` copied from `src` into dests[i % dests.size()], `size` bytes at a time.
double CopyRep(const std::byte* src, const std::vector<Buffer>& dests, uint64_t size,
               uint64_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  for (size_t i = 0; done < bytes; ++i, done += size) {
    std::memcpy(dests[i % dests.size()].get(), src, size);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return done / s / 1e9;
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench copy", "memcpy GB/s into a hot destination vs a rotating working set.");
  f.Add("sizes", "copy sizes, comma-separated", &o.sizes);
  f.AddBytes("working-set", "bytes of distinct destinations the 'rotating' case cycles through",
             &o.working_set);
  f.AddBytes("bytes-per-rep", "bytes copied per repetition", &o.bytes_per_rep);
  f.Add("reps", "repetitions after a warm-up", &o.reps, 1, 1000);
  f.Add("json", "one JSON object per line", &o.json);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench copy: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  size_t b = 0;
  while (b <= o.sizes.size()) {
    size_t e = std::min(o.sizes.find(',', b), o.sizes.size());
    const std::string item = o.sizes.substr(b, e - b);
    b = e + 1;
    if (item.empty()) continue;
    auto size = ParseBytes(item);
    if (!size.ok() || *size == 0) {
      std::fprintf(stderr, "zps-bench copy: bad size '%s'\n", item.c_str());
      return 2;
    }
    Buffer src = Allocate(*size);
    for (const bool rotating : {false, true}) {
      std::vector<Buffer> dests;
      const uint64_t n = rotating ? std::max<uint64_t>(o.working_set / *size, 1) : 1;
      for (uint64_t i = 0; i < n; ++i) dests.push_back(Allocate(*size));
      CopyRep(src.get(), dests, *size, std::max(o.bytes_per_rep / 4, *size));  // warm-up
      std::vector<double> v;
      for (int r = 0; r < o.reps; ++r)
        v.push_back(CopyRep(src.get(), dests, *size, o.bytes_per_rep));
      std::sort(v.begin(), v.end());
      const char* dest = rotating ? "rotating" : "same";
      if (o.json) {
        std::printf(
            "{\"bench\":\"copy\",\"dest\":\"%s\",\"size_bytes\":%llu,\"working_set\":%llu,"
            "\"gb_per_s\":%.3f,\"best_gb_per_s\":%.3f,\"reps\":%zu}\n",
            dest, static_cast<unsigned long long>(*size),
            static_cast<unsigned long long>(n * *size), v[v.size() / 2], v.back(), v.size());
      } else {
        std::printf("copy %-8s %10llu B  median %7.3f GB/s  best %7.3f GB/s\n", dest,
                    static_cast<unsigned long long>(*size), v[v.size() / 2], v.back());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("copy", "memcpy into a hot buffer vs a rotating working set", Run);

}  // namespace zps::bench
