// zps-bench quant: the block size of the quantized serving copy (issue 27, item 1), chosen by
// measurement. For each block size it prints what the choice trades:
//   - bytes: the quantized copy against a bf16 one (the egress ratio a fetch gets);
//   - quality: the relative RMS error of dequantized weights, with bf16's own rounding error
//     (the unquantized serving copy) measured on the same data beside it;
//   - speed: quantize (fp32 master -> blocks, what the shard adds to its update) and dequantize
//     to bf16 (what a worker does per fetched byte), in G elements/s, with fp32 -> bf16 and
//     bf16 -> fp32 conversion of the same data beside them as the reference.
// The data is weight-like: N(0, 0.02) with rows of 4096 whose scale varies by up to 4x and one
// outlier of 20 sigma in 10,000 elements (LLM weight matrices have such outliers, and they are
// what makes a large block lose precision: one outlier sets the scale for the whole block).
//
//   zps-bench quant --elems 16777216 --blocks 64,128,256,512,1024,2048,4096,8192 --bits 8
//
// ZPS_ISA=scalar|avx2|avx512 picks the kernels (cpu.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "zps/common/block_quant.h"
#include "zps/common/config.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"

namespace zps::bench {
namespace {

struct Options {
  uint64_t elems = 16ull << 20;  // Default: 16 Mi elements (64 MiB fp32).
  std::string blocks = "64,128,256,512,1024,2048,4096,8192";  // Default: 64 to 8192.
  int bits = 8;                                               // Default: 8.
  int reps = 5;                                               // Default: 5 (best is reported).
  bool json = false;                                          // Default: false (a table).
};

std::vector<float> WeightLike(size_t n) {
  uint64_t s = 12345;
  auto next = [&] {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto uniform = [&] { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; };
  std::vector<float> x(n);
  double row_scale = 1.0;
  for (size_t i = 0; i < n; ++i) {
    if (i % 4096 == 0) row_scale = 0.25 + 0.75 * uniform();
    const double g =
        std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
    double v = 0.02 * row_scale * g;
    if (next() % 10000 == 0) v = (v < 0 ? -20.0 : 20.0) * 0.02 * row_scale;
    x[i] = static_cast<float>(v);
  }
  return x;
}

double RelRms(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(y[i]) - x[i];
    num += d * d;
    den += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

template <typename Fn>
double BestGelemPerS(size_t n, int reps, Fn&& fn) {
  fn();  // warm-up: pages faulted, caches as in the measured runs
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, n / s / 1e9);
  }
  return best;
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench quant",
          "block size of the quantized serving copy: bytes, error and speed per block size.");
  f.AddBytes("elems", "elements of the weight-like tensor", &o.elems);
  f.Add("blocks", "block sizes, comma-separated (multiples of 64)", &o.blocks);
  f.Add("bits", "8 or 4", &o.bits, 4, 8);
  f.Add("reps", "timed repetitions after a warm-up (the best is reported)", &o.reps, 1, 1000);
  f.Add("json", "one JSON object per line", &o.json);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) return Fail("quant", parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  auto isa = ActiveIsa();
  if (!isa.ok()) return Fail("quant", isa.status());
  const size_t n = o.elems;
  const std::vector<float> x = WeightLike(n);
  std::vector<uint16_t> bf(n);
  std::vector<float> back(n);
  // The reference: the bf16 serving copy of the same data, made and read the same way.
  const double bf16_q = BestGelemPerS(n, o.reps, [&] { ConvertF32ToBF16(x, bf); });
  const double bf16_d = BestGelemPerS(n, o.reps, [&] { ConvertBF16ToF32(bf, back); });
  const double bf16_err = RelRms(x, back);
  if (!o.json) {
    std::printf("isa %s, %zu elements, int%d\n", std::string(IsaName(*isa)).c_str(), n, o.bits);
    std::printf("%-8s %12s %12s %14s %14s\n", "block", "bytes/bf16", "rel_rms_err", "quant_Gel/s",
                "deq_bf16_Gel/s");
    std::printf("%-8s %12.4f %12.3e %14.2f %14.2f\n", "bf16", 1.0, bf16_err, bf16_q, bf16_d);
  } else {
    std::printf(
        "{\"bench\":\"quant\",\"isa\":\"%s\",\"format\":\"bf16\",\"bytes_ratio\":1.0,"
        "\"rel_rms_err\":%.4e,\"quant_gelem_s\":%.3f,\"deq_gelem_s\":%.3f}\n",
        std::string(IsaName(*isa)).c_str(), bf16_err, bf16_q, bf16_d);
  }
  std::vector<std::byte> q;
  for (const std::string& item : SplitList(o.blocks)) {
    auto block = ParseInt(item, 64, 1 << 24);
    if (!block.ok()) return Fail("quant", block.status());
    const QuantFormat fmt{static_cast<uint8_t>(o.bits), static_cast<uint32_t>(*block)};
    if (Status s = ValidateQuantFormat(fmt); !s.ok()) return Fail("quant", s);
    q.assign(QuantizedBytes(fmt, n), std::byte{0});
    const double qs = BestGelemPerS(n, o.reps, [&] { QuantizeBlocks(fmt, x, q); });
    const double ds = BestGelemPerS(n, o.reps, [&] { DequantizeBlocksToBf16(fmt, q, bf); });
    DequantizeBlocks(fmt, q, back);
    const double err = RelRms(x, back);
    const double ratio = static_cast<double>(q.size()) / (2.0 * n);
    if (!o.json) {
      std::printf("%-8lld %12.4f %12.3e %14.2f %14.2f\n", static_cast<long long>(*block), ratio,
                  err, qs, ds);
    } else {
      std::printf(
          "{\"bench\":\"quant\",\"isa\":\"%s\",\"format\":\"int%d\",\"block\":%lld,"
          "\"bytes_ratio\":%.5f,\"rel_rms_err\":%.4e,\"quant_gelem_s\":%.3f,"
          "\"deq_gelem_s\":%.3f}\n",
          std::string(IsaName(*isa)).c_str(), o.bits, static_cast<long long>(*block), ratio, err,
          qs, ds);
    }
  }
  return 0;
}

ZPS_BENCH_SUBCOMMAND("quant", "block-quantization codec: bytes, error and speed per block size",
                     Run);

}  // namespace
}  // namespace zps::bench
