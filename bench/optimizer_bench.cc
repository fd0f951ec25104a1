// zps-bench optimizer: throughput of the fused optimizer pass and of the gradient-statistics
// pass over a chunk far larger than the caches (default 64M parameters, ~1.3 GiB of buffers).
//
// Method (as the roofline probe bench/adam_roofline.c, so the figures compare): buffers are
// first-touched by the same pool that runs the kernels, each case runs `steps` times, the first
// two are warm-up, and the best remaining time is reported (the median too). Bytes per parameter
// count what the pass must move: reads and writes of the arrays, not the read-for-ownership
// traffic.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/block_quant.h"
#include "zps/common/config.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"
#include "zps/common/thread_pool.h"
#include "zps/server/optimizer.h"

namespace zps::bench {
namespace {

struct Options {
  bool json = false;                 // Default: false (a table).
  int threads = 0;                   // Default: 0 = run at 1 thread and at all CPUs.
  int64_t params = 64 << 20;         // Default: 64M.
  int steps = 8;                     // Default: 8 (2 warm-up).
  bool huge_pages = false;           // Default: false (plain pages, as the probe).
  bool pin = false;                  // Default: false.
  std::string state_dtype = "fp32";  // Default: fp32 (the moments' storage; the master is fp32).
  bool quantized_copy = false;       // Default: false (no int8 serving-copy cases).
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
std::unique_ptr<T[], FreeDeleter> Alloc(size_t n, bool huge) {
  constexpr size_t kAlign = 2 << 20;
  const size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p == nullptr) {
    std::fprintf(stderr, "zps-bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint; THP may still say no
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

struct Buffers {
  size_t n;
  std::unique_ptr<float[], FreeDeleter> g32, master, m, v;
  std::unique_ptr<uint16_t[], FreeDeleter> g16, out;
};

// First touch from the pool's threads, as the probe does with OpenMP.
void Fill(Buffers& b, ThreadPool* pool) {
  constexpr size_t kBlock = 1 << 20;
  const size_t tasks = (b.n + kBlock - 1) / kBlock;
  pool->ParallelFor(tasks, [&](size_t t) {
    for (size_t i = t * kBlock; i < std::min(b.n, (t + 1) * kBlock); ++i) {
      b.master[i] = 0.01f * static_cast<float>(i % 97);
      b.g32[i] = 0.001f * static_cast<float>(i % 13) - 0.006f;
      b.g16[i] = FloatToHalf(b.g32[i]);
      b.m[i] = b.v[i] = 0.0f;
      b.out[i] = 0;
    }
  });
}

struct Case {
  // "adamw_fused" | "grad_stats" | "adamw_fused_q8" (the int8 serving copy made in the pass,
  // UpdateParams::out_quant) | "adamw_then_q8" (the pass without a copy, then QuantizeBlocks
  // over the master on the calling thread: the shards' way before the copy moved into the pass)
  std::string kernel;
  DType grad;
  bool copy;
  DType out;
  double bytes_per_param;
};

struct Timing {
  double best_s, median_s;
};

template <typename Fn>
Timing TimeSteps(int steps, Fn&& fn) {
  std::vector<double> t;
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(s);
    const auto t1 = std::chrono::steady_clock::now();
    if (s > 2) t.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

int Run(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench optimizer",
              "Fused optimizer and gradient-statistics throughput over one large chunk.\n"
              "ZPS_ISA=scalar|avx2|avx512 selects the kernels (default: the best this CPU has).");
  flags.Add("json", "print one JSON object per line", &o.json);
  flags.Add("threads", "pool size; 0 = run at 1 thread and at all CPUs", &o.threads, 0, 1024);
  flags.Add("params", "parameters in the chunk", &o.params, 1, int64_t{1} << 34);
  flags.Add("steps", "timed steps per case (the first 2 are warm-up)", &o.steps, 3, 1000);
  flags.Add("huge-pages", "madvise(MADV_HUGEPAGE) the buffers", &o.huge_pages);
  flags.Add("pin", "pin pool threads to CPUs (ThreadPoolOptions.pin)", &o.pin);
  flags.Add("state-dtype", "how m and v are stored: fp32, bf16 or int8", &o.state_dtype);
  flags.Add("quantized-copy",
            "also time the pass with an int8 serving copy (blocks of 256), made in the pass "
            "(adamw_fused_q8) and after it (adamw_then_q8)",
            &o.quantized_copy);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench optimizer: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  auto state_dtype = ParseStateDType(o.state_dtype);
  if (!state_dtype.ok()) {
    std::fprintf(stderr, "zps-bench optimizer: %s\n", state_dtype.status().ToString().c_str());
    return 2;
  }
  auto isa = ActiveIsa();
  if (!isa.ok()) {
    std::fprintf(stderr, "zps-bench optimizer: %s\n", isa.status().ToString().c_str());
    return 2;
  }

  std::vector<int> thread_counts;
  if (o.threads > 0) {
    thread_counts = {o.threads};
  } else {
    const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    thread_counts = {1};
    if (all > 1) thread_counts.push_back(all);
  }

  const auto n = static_cast<size_t>(o.params);
  Buffers b{n,
            Alloc<float>(n, o.huge_pages),
            Alloc<float>(n, o.huge_pages),
            Alloc<float>(n, o.huge_pages),
            Alloc<float>(n, o.huge_pages),
            Alloc<uint16_t>(n, o.huge_pages),
            Alloc<uint16_t>(n, o.huge_pages)};

  // Fused AdamW reads g, master, m, v and writes master, m, v (+ the copy); m and v are packed
  // in the state dtype (int8: a code and 2/64 bytes of scale per element).
  const uint64_t moment_bytes = server::MomentBytes(*state_dtype, n);
  const double state_bytes = 8 + 4 * static_cast<double>(moment_bytes) / static_cast<double>(n);
  std::vector<Case> cases = {
      {"adamw_fused", DType::kF32, true, DType::kBF16, 4 + state_bytes + 2},
      {"adamw_fused", DType::kF16, true, DType::kF16, 2 + state_bytes + 2},
      {"adamw_fused", DType::kF32, false, DType::kBF16, 4 + state_bytes},
      {"grad_stats", DType::kF32, false, DType::kF32, 4},
      {"grad_stats", DType::kF16, false, DType::kF32, 2},
  };
  // The int8 serving copy: 1 byte and 4/256 of scale per parameter, counted alike for both
  // (the second sweep's extra read of the master is what the fused pass saves).
  const QuantFormat q8{8, kWeightQuantBlock};
  const std::uint64_t q8_bytes = QuantizedBytes(q8, n);
  std::vector<std::byte> q8_copy(o.quantized_copy ? q8_bytes : 0);
  if (o.quantized_copy) {
    const double copy = static_cast<double>(q8_bytes) / static_cast<double>(n);
    cases.push_back(
        {"adamw_fused_q8", DType::kF32, false, DType::kI8Block, 4 + state_bytes + copy});
    cases.push_back({"adamw_then_q8", DType::kF32, false, DType::kI8Block, 4 + state_bytes + copy});
  }

  if (!o.json) {
    std::printf(
        "zps-bench optimizer: %zu params, isa %s, %s state, best of %d steps after 2 warm-up\n", n,
        std::string(IsaName(*isa)).c_str(), o.state_dtype.c_str(), o.steps - 2);
    std::printf("%-12s %-5s %-5s %7s %10s %10s %8s %6s\n", "kernel", "grad", "out", "threads",
                "Mparam/s", "median", "GB/s", "B/par");
  }
  server::OptimizerConfig cfg;  // AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8
  cfg.weight_decay = 0.01f;
  cfg.state_dtype = *state_dtype;
  for (int threads : thread_counts) {
    auto pool = ThreadPool::Create({.name = "zps-bench", .threads = threads, .pin = o.pin});
    if (!pool.ok()) {
      std::fprintf(stderr, "zps-bench optimizer: %s\n", pool.status().ToString().c_str());
      return 1;
    }
    Fill(b, pool->get());
    auto opt = server::Optimizer::Create(cfg, pool->get(), *isa);
    if (!opt.ok()) {
      std::fprintf(stderr, "zps-bench optimizer: %s\n", opt.status().ToString().c_str());
      return 1;
    }
    for (const Case& c : cases) {
      const void* gdata =
          c.grad == DType::kF32 ? static_cast<const void*>(b.g32.get()) : b.g16.get();
      const server::GradView grad{gdata, c.grad, n};
      Status err;
      const Timing t = TimeSteps(o.steps, [&](int step) {
        if (c.kernel == "grad_stats") {
          auto st = (*opt)->ComputeGradStats(grad, 0.5f);
          if (!st.ok()) err = st.status();
          return;
        }
        // The fp32 buffers hold any packed moment (MomentBytes <= 4n); zeros are a valid one.
        const server::ChunkState state{
            {b.master.get(), n},
            std::as_writable_bytes(std::span<float>(b.m.get(), n)).first(moment_bytes),
            std::as_writable_bytes(std::span<float>(b.v.get(), n)).first(moment_bytes)};
        server::UpdateParams up;
        up.step = step;
        if (c.copy) {
          up.out_dtype = c.out;
          up.out16 = {b.out.get(), n};
        }
        if (c.kernel == "adamw_fused_q8") {
          up.out_quant = q8_copy;
          up.out_quant_format = q8;
        }
        Status s = (*opt)->Update(state, grad, up);
        if (!s.ok()) err = s;
        if (c.kernel == "adamw_then_q8") QuantizeBlocks(q8, state.master, q8_copy);
      });
      if (!err.ok()) {
        std::fprintf(stderr, "zps-bench optimizer: %s\n", err.ToString().c_str());
        return 1;
      }
      const double mps = static_cast<double>(n) / t.best_s / 1e6;
      const double mps_med = static_cast<double>(n) / t.median_s / 1e6;
      const double gbs = static_cast<double>(n) * c.bytes_per_param / t.best_s / 1e9;
      const std::string out =
          c.copy || c.out == DType::kI8Block ? std::string(DTypeName(c.out)) : "none";
      const std::string gname(DTypeName(c.grad));
      if (o.json) {
        std::printf(
            "{\"bench\": \"optimizer\", \"kernel\": \"%s\", \"grad_dtype\": \"%s\", \"out_dtype\": "
            "\"%s\", \"threads\": %d, \"params\": %zu, \"isa\": \"%s\", \"mparams_per_s\": %.0f, "
            "\"median_mparams_per_s\": %.0f, \"gb_per_s\": %.1f, \"bytes_per_param\": %.2f, "
            "\"huge_pages\": %s, \"pin\": %s, \"state_dtype\": \"%s\"}\n",
            c.kernel.c_str(), gname.c_str(), out.c_str(), threads, n,
            std::string(IsaName(*isa)).c_str(), mps, mps_med, gbs, c.bytes_per_param,
            o.huge_pages ? "true" : "false", o.pin ? "true" : "false", o.state_dtype.c_str());
      } else {
        std::printf("%-12s %-5s %-5s %7d %10.0f %10.0f %8.1f %6.1f\n", c.kernel.c_str(),
                    gname.c_str(), out.c_str(), threads, mps, mps_med, gbs, c.bytes_per_param);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("optimizer", "fused optimizer and gradient-statistics throughput", Run);

}  // namespace zps::bench
