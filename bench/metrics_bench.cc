// zps-bench metrics: what one metric update costs on a hot path, with 1..N threads updating the
// SAME handle at once (the shard's case: every fetch lands in one histogram series). Counter::Inc,
// Gauge::Inc, Histogram::Observe (zps_request_duration_seconds' buckets) and ObserveSince (with
// the steady_clock read a request's end does). The numbers say whether prometheus-cpp's
// per-histogram mutex matters next to a request's cost (docs/benchmarks.md, "Metrics").
//
//   zps-bench metrics --json --threads 1,2,4 --ops 2000000
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/metrics.h"
#include "zps/common/process_metrics.h"

namespace zps::bench {
namespace {

struct Options {
  std::string threads = "1,2,4";  // Default: 1, 2 and 4 threads on one handle.
  int64_t ops = 2000000;          // Default: 2 M updates per thread per repetition.
  int reps = 3;                   // Default: 3 (after one warm-up).
  bool json = false;              // Default: false (a table).
};

// ns per update per thread, `threads` threads each doing `ops` updates at once.
double Rep(int threads, int64_t ops, const std::function<void(int64_t)>& update) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> ns(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < ops; ++i) update(i);
      ns[t] =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
          static_cast<double>(ops);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go = true;
  for (auto& t : ts) t.join();
  return *std::max_element(ns.begin(), ns.end());
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench metrics", "ns per metric update, 1..N threads on one handle.");
  f.Add("threads", "thread counts, comma-separated", &o.threads);
  f.Add("ops", "updates per thread per repetition", &o.ops, 1000, int64_t{1} << 32);
  f.Add("reps", "repetitions after a warm-up", &o.reps, 1, 1000);
  f.Add("json", "one JSON object per line", &o.json);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) return Fail("metrics", parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;

  metrics::Registry registry;
  auto counter = registry.AddCounter("bench_total", "c");
  auto gauge = registry.AddGauge("bench_gauge", "g");
  auto hist = registry.AddHistogram("bench_seconds", "h", {}, metrics::RequestDurationBuckets());
  if (!counter.ok()) return Fail("metrics", counter.status());
  if (!gauge.ok()) return Fail("metrics", gauge.status());
  if (!hist.ok()) return Fail("metrics", hist.status());
  auto c = (*counter)->Add({});
  auto g = (*gauge)->Add({});
  auto h = (*hist)->Add({});
  if (!c.ok() || !g.ok() || !h.ok()) return Fail("metrics", Internal("Family::Add failed"));
  const metrics::Counter cc = *c;
  const metrics::Gauge gg = *g;
  const metrics::Histogram hh = *h;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::pair<const char*, std::function<void(int64_t)>>> cases = {
      {"counter_inc", [&](int64_t) { cc.Inc(4096); }},
      {"gauge_inc", [&](int64_t) { gg.Inc(); }},
      // Durations spread over the buckets a request sees (25 us .. ~1.6 ms).
      {"histogram_observe",
       [&](int64_t i) { hh.Observe(25e-6 * static_cast<double>(1 + (i & 63))); }},
      {"observe_since", [&](int64_t) { hh.ObserveSince(start); }},
  };
  size_t b = 0;
  while (b <= o.threads.size()) {
    size_t e = std::min(o.threads.find(',', b), o.threads.size());
    const std::string item = o.threads.substr(b, e - b);
    b = e + 1;
    if (item.empty()) continue;
    auto n = ParseInt(item, 1, 256);
    if (!n.ok()) return Fail("metrics", n.status());
    for (const auto& [name, update] : cases) {
      Rep(static_cast<int>(*n), std::max<int64_t>(o.ops / 10, 1), update);  // warm-up
      std::vector<double> v;
      for (int r = 0; r < o.reps; ++r) v.push_back(Rep(static_cast<int>(*n), o.ops, update));
      std::sort(v.begin(), v.end());
      if (o.json) {
        std::printf(
            "{\"bench\":\"metrics\",\"op\":\"%s\",\"threads\":%lld,\"ns_per_op\":%.2f,"
            "\"best_ns_per_op\":%.2f,\"reps\":%zu}\n",
            name, static_cast<long long>(*n), v[v.size() / 2], v.front(), v.size());
      } else {
        std::printf("metrics %-18s threads %3lld  median %8.2f ns/op  best %8.2f ns/op\n", name,
                    static_cast<long long>(*n), v[v.size() / 2], v.front());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("metrics", "ns per metric update with 1..N threads on one handle", Run);

}  // namespace zps::bench
