// Fused optimizer kernels against a scalar double-precision reference, once per ISA (the ctest
// registration sets ZPS_ISA; see zps_cc_test ISA_MATRIX).
//
// Tolerances (one step from identical fp32 inputs; u = 2^-24 ~ 6e-8 is the fp32 unit roundoff,
// and each kernel value is a handful of fp32 operations, each rounding once):
//   m, v:    |err| <= 1e-6 * (sum of the magnitudes of the terms that form them) + 1e-30
//            (~16u: the terms carry <= ~4 roundings; bounding by the terms, not the result,
//            allows for cancellation in b1*m + (1-b1)*g)
//   master:  |err| <= 1e-6 * |p_ref| + 1e-5 * step_size * U + 1e-30, with U = (|b1*m| +
//            |(1-b1)*g|) / denom the size of the Adam update before the step size (for SGD
//            U = |d|-terms, likewise). sqrt and division are exact (correctly rounded) in every
//            path, so the update carries ~10u at most; 1e-5 leaves room without hiding a wrong
//            formula (a missing bias correction or decay changes the result by >= 1e-3 relative).
//   grad stats: |err| <= 1e-12 * reference (every square is exact in double; only additions
//            round).
//   16-bit copy: bit-equal to FloatToHalf/FloatToBf16 of the new master.
#include "zps/server/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "optimizer_cases.h"
#include "zps/common/aligned_buffer.h"
#include "zps/common/block_quant.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"
#include "zps/common/thread_pool.h"
#include "zps/server/packed_moment.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

constexpr double kTolMV = 1e-6;
constexpr double kTolP = 1e-6;
constexpr double kTolUpdate = 1e-5;
constexpr double kTolStats = 1e-12;

struct State {
  std::vector<float> p, m, v;
  std::vector<uint16_t> g16;  // grads as fp16/bf16 bits
  std::vector<float> g32;
  std::vector<uint16_t> out;
};

uint16_t ToBits(float x, DType t) { return t == DType::kF16 ? FloatToHalf(x) : FloatToBf16(x); }

// Random state resembling training: weights O(1), moments small, some fresh (zero) moments.
State MakeState(size_t n, DType grad_dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> w(-1.0f, 1.0f), g(-0.1f, 0.1f);
  State s;
  s.p.resize(n), s.m.resize(n), s.v.resize(n), s.g32.resize(n), s.g16.resize(n),
      s.out.assign(n, 0xdead);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = w(rng);
    const bool fresh = i % 7 == 3;
    s.m[i] = fresh ? 0.0f : 0.01f * w(rng);
    s.v[i] = fresh ? 0.0f : 1e-4f * std::fabs(w(rng));
    float gi = g(rng);
    if (i % 11 == 5) gi *= 1e-4f;  // small gradients: eps matters
    if (grad_dtype != DType::kF32) {
      s.g16[i] = ToBits(gi, grad_dtype);
      gi = LoadAsFloat(s.g16.data(), grad_dtype, i);
    }
    s.g32[i] = gi;
  }
  return s;
}

GradView Grad(const State& s, DType t, size_t off, size_t n) {
  return t == DType::kF32 ? GradView{s.g32.data() + off, t, n} : GradView{s.g16.data() + off, t, n};
}

struct Ref {
  double p, m, v, tol_p, tol_m, tol_v;
};

// The reference step in double, from the same fp32 inputs, with its tolerance.
Ref Reference(const OptimizerConfig& c, int64_t step, float scale, float p, float m, float v,
              float g) {
  const double lr = c.lr, wd = c.weight_decay;
  double gd = static_cast<double>(g) * scale;
  Ref r{};
  if (c.kind == OptimizerKind::kSgd) {
    const double l2 = wd * p;
    gd += l2;
    const double mom = c.momentum;
    double d = gd, dterms = std::fabs(gd) + std::fabs(l2);
    if (mom > 0) {
      r.m = mom * m + gd;
      r.tol_m = kTolMV * (std::fabs(mom * m) + dterms) + 1e-30;
      d = c.nesterov ? gd + mom * r.m : r.m;
      dterms =
          c.nesterov ? dterms + mom * (std::fabs(mom * m) + dterms) : std::fabs(mom * m) + dterms;
    }
    r.p = p - lr * d;
    r.tol_p = kTolP * std::fabs(r.p) + kTolUpdate * lr * dterms + 1e-30;
    return r;
  }
  double l2term = 0;
  if (c.kind == OptimizerKind::kAdam) {
    l2term = wd * p;
    gd += l2term;
  }
  const double b1 = c.beta1, b2 = c.beta2;
  r.m = b1 * m + (1 - b1) * gd;
  r.v = b2 * v + (1 - b2) * gd * gd;
  const double gterms = std::fabs(static_cast<double>(g) * scale) + std::fabs(l2term);
  r.tol_m = kTolMV * (std::fabs(b1 * m) + (1 - b1) * gterms) + 1e-30;
  r.tol_v = kTolMV * (b2 * v + (1 - b2) * gterms * gterms) + 1e-30;
  const double bc1 = c.bias_correction ? 1 - std::pow(b1, static_cast<double>(step)) : 1;
  const double bc2 = c.bias_correction ? 1 - std::pow(b2, static_cast<double>(step)) : 1;
  const double denom = std::sqrt(r.v) / std::sqrt(bc2) + c.eps;
  const double decayed = c.kind == OptimizerKind::kAdamW ? p * (1 - lr * wd) : p;
  const double step_size = lr / bc1;
  r.p = decayed - step_size * r.m / denom;
  r.tol_p = kTolP * std::fabs(r.p) +
            kTolUpdate * step_size * (std::fabs(b1 * m) + (1 - b1) * gterms) / denom + 1e-30;
  return r;
}

using test_cases::Bytes;
using test_cases::Case;
using test_cases::Cases;

// Runs the optimizer on elements [off, off+n) of a fresh state and checks every element against
// the reference, and the copy against the scalar conversion.
void CheckAgainstReference(Isa isa, ThreadPool* pool, const Case& cs, DType gt, bool copy, DType ot,
                           size_t off, size_t n, int64_t step) {
  SCOPED_TRACE(testing::Message() << cs.name << " grad=" << DTypeName(gt)
                                  << " out=" << (copy ? DTypeName(ot) : "none") << " off=" << off
                                  << " n=" << n << " step=" << step);
  const bool sgd = cs.config.kind == OptimizerKind::kSgd;
  State s = MakeState(off + n + 3, gt, static_cast<uint32_t>(n * 31 + off));
  const State before = s;
  auto opt = Optimizer::Create(cs.config, pool, isa);
  ASSERT_THAT(opt, IsOk());
  const float scale = 0.5f;
  ChunkState st{{s.p.data() + off, n},
                Bytes(std::span<float>(s.m.data() + off, n)),
                Bytes(std::span<float>(s.v.data() + off, n))};
  if (sgd) st.v = {};
  if (sgd && cs.config.momentum == 0) st.m = {};
  UpdateParams up;
  up.step = step;
  up.grad_scale = scale;
  up.out_dtype = ot;
  if (copy) up.out16 = {s.out.data() + off, n};
  ASSERT_THAT((*opt)->Update(st, Grad(s, gt, off, n), up), IsOk());

  int bad = 0;
  for (size_t i = off; i < off + n && bad < 5; ++i) {
    const Ref r =
        Reference(cs.config, step, scale, before.p[i], before.m[i], before.v[i], before.g32[i]);
    const bool ok_p = std::fabs(s.p[i] - r.p) <= r.tol_p;
    const bool has_m = !sgd || cs.config.momentum > 0;
    const bool ok_m = !has_m || std::fabs(s.m[i] - r.m) <= r.tol_m;
    const bool ok_v = sgd || std::fabs(s.v[i] - r.v) <= r.tol_v;
    const bool ok_out = copy ? s.out[i] == ToBits(s.p[i], ot) : s.out[i] == 0xdead;
    if (!(ok_p && ok_m && ok_v && ok_out)) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": p " << s.p[i] << " vs " << r.p << " (tol " << r.tol_p
                    << "), m " << s.m[i] << " vs " << r.m << ", v " << s.v[i] << " vs " << r.v
                    << ", out " << s.out[i] << " vs " << ToBits(s.p[i], ot);
    }
  }
  // Nothing outside [off, off+n) is touched.
  for (size_t i : {size_t{0}, off + n, off + n + 2}) {
    if (i >= off && i < off + n) continue;
    EXPECT_EQ(s.p[i], before.p[i]);
    EXPECT_EQ(s.m[i], before.m[i]);
    EXPECT_EQ(s.v[i], before.v[i]);
    EXPECT_EQ(s.out[i], before.out[i]);
  }
}

// CheckAgainstReference for every optimizer case and every combination of these values.
struct Sweep {
  const char* name;
  int threads;  // of the pool; 0: none
  std::vector<DType> grads;
  std::vector<std::optional<DType>> copies;  // the 16-bit copy's dtype; nullopt: no copy
  std::vector<size_t> offsets;
  std::vector<size_t> sizes;
  std::vector<int64_t> steps;
};

// gtest prints a sweep by its name (in the test's and ctest's names too), not as bytes.
void PrintTo(const Sweep& w, std::ostream* os) { *os << w.name; }

std::vector<size_t> OneTo(size_t last) {
  std::vector<size_t> v(last);
  for (size_t i = 0; i < last; ++i) v[i] = i + 1;
  return v;
}

const Sweep kSweeps[] = {
    // 70001 elements: several pool tasks, streaming copy stores (>= 64Ki), a ragged tail; the
    // offset of 1 element misaligns every array and the copy (alignment peel).
    {.name = "EveryKernelGradDtypeAndCopy",
     .threads = 2,
     .grads = {DType::kF32, DType::kF16, DType::kBF16},
     .copies = {std::nullopt, DType::kF16, DType::kBF16},
     .offsets = {1},
     .sizes = {70001},
     .steps = {3}},
    {.name = "BiasCorrectionAcrossSteps",
     .threads = 0,
     .grads = {DType::kF32},
     .copies = {DType::kBF16},
     .offsets = {0},
     .sizes = {333},
     .steps = {1, 2, 10, 1000, 1000000}},
    {.name = "TinyAndOddSizes",
     .threads = 0,
     .grads = {DType::kF16},
     .copies = {DType::kF16},
     .offsets = {0, 3},
     .sizes = OneTo(67),
     .steps = {2}},
};

class OptimizerSweep : public ::testing::TestWithParam<Sweep> {};

TEST_P(OptimizerSweep, MatchesReference) {
  ZPS_GET_ISA_OR_SKIP(isa);
  const Sweep& w = GetParam();
  std::unique_ptr<ThreadPool> pool;
  if (w.threads > 0) {
    auto p = ThreadPool::Create({.name = "test-opt", .threads = w.threads});
    ASSERT_THAT(p, IsOk());
    pool = std::move(*p);
  }
  for (const Case& cs : Cases()) {
    for (DType gt : w.grads) {
      for (std::optional<DType> copy : w.copies) {
        for (size_t off : w.offsets) {
          for (size_t n : w.sizes) {
            for (int64_t step : w.steps) {
              CheckAgainstReference(isa, pool.get(), cs, gt, copy.has_value(),
                                    copy.value_or(DType::kBF16), off, n, step);
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweeps, OptimizerSweep, ::testing::ValuesIn(kSweeps),
                         [](const ::testing::TestParamInfo<Sweep>& i) {
                           return std::string(i.param.name);
                         });

TEST(Optimizer, AnEmptyRangeIsAcceptedAndSumsToZero) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto opt = Optimizer::Create(OptimizerConfig{}, nullptr, isa);
  ASSERT_THAT(opt, IsOk());
  EXPECT_THAT((*opt)->Update({}, GradView{nullptr, DType::kF32, 0}, UpdateParams{}), IsOk());
  auto stats = (*opt)->ComputeGradStats(GradView{nullptr, DType::kBF16, 0});
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->sum_squares, 0.0);
  EXPECT_FALSE(stats->non_finite);
}

// Every byte of the result, for pool sizes 1, 2, 3 and 7 and no pool.
TEST(Optimizer, BitIdenticalAcrossThreadCounts) {
  ZPS_GET_ISA_OR_SKIP(isa);
  const size_t n = 3 * 65536 + 12345;
  for (const Case& cs : Cases()) {
    std::vector<State> results;
    std::vector<double> sums;
    for (int threads : {0, 1, 2, 3, 7}) {
      std::unique_ptr<ThreadPool> pool;
      if (threads > 0) {
        auto p = ThreadPool::Create({.name = "test-bits", .threads = threads});
        ASSERT_THAT(p, IsOk());
        pool = std::move(*p);
      }
      State s = MakeState(n, DType::kBF16, 7);
      auto opt = Optimizer::Create(cs.config, pool.get(), isa);
      ASSERT_THAT(opt, IsOk());
      UpdateParams up;
      up.grad_scale = 0.25f;
      up.out16 = s.out;
      for (int64_t step = 1; step <= 2; ++step) {
        up.step = step;
        ASSERT_THAT((*opt)->Update({s.p, Bytes(s.m), Bytes(s.v)}, Grad(s, DType::kBF16, 0, n), up),
                    IsOk());
      }
      auto stats = (*opt)->ComputeGradStats(Grad(s, DType::kF32, 0, n), 3.0f);
      ASSERT_THAT(stats, IsOk());
      sums.push_back(stats->sum_squares);
      results.push_back(std::move(s));
    }
    for (size_t k = 1; k < results.size(); ++k) {
      EXPECT_EQ(std::memcmp(results[k].p.data(), results[0].p.data(), n * 4), 0)
          << cs.name << " " << k;
      EXPECT_EQ(std::memcmp(results[k].m.data(), results[0].m.data(), n * 4), 0)
          << cs.name << " " << k;
      EXPECT_EQ(std::memcmp(results[k].v.data(), results[0].v.data(), n * 4), 0)
          << cs.name << " " << k;
      EXPECT_EQ(results[k].out, results[0].out) << cs.name << " " << k;
      EXPECT_EQ(std::bit_cast<uint64_t>(sums[k]), std::bit_cast<uint64_t>(sums[0]))
          << cs.name << " " << k;
    }
  }
}

// An out-of-place update (UpdateParams::source: the speculative update's) gives the bits of
// the in-place one, leaves its source unchanged, and refuses an overlapping source.
TEST(Optimizer, OutOfPlaceEqualsInPlace) {
  ZPS_GET_ISA_OR_SKIP(isa);
  const size_t n = 65536 + 77;  // a tail too
  for (const Case& cs : Cases()) {
    State a = MakeState(n, DType::kBF16, 11);
    State src = MakeState(n, DType::kBF16, 11);
    State b = MakeState(n, DType::kBF16, 12);  // overwritten entirely
    const State keep = MakeState(n, DType::kBF16, 11);
    auto opt = Optimizer::Create(cs.config, nullptr, isa);
    ASSERT_THAT(opt, IsOk());
    UpdateParams up;
    up.step = 3;
    up.grad_scale = 0.5f;
    up.out16 = a.out;
    ASSERT_THAT((*opt)->Update({a.p, Bytes(a.m), Bytes(a.v)}, Grad(a, DType::kF32, 0, n), up),
                IsOk());
    up.out16 = b.out;
    up.source = ConstChunkState{src.p, Bytes(src.m), Bytes(src.v)};
    ASSERT_THAT((*opt)->Update({b.p, Bytes(b.m), Bytes(b.v)}, Grad(src, DType::kF32, 0, n), up),
                IsOk());
    EXPECT_EQ(std::memcmp(a.p.data(), b.p.data(), n * 4), 0) << cs.name;
    if (!a.m.empty() && cs.config.kind != OptimizerKind::kSgd) {
      EXPECT_EQ(std::memcmp(a.m.data(), b.m.data(), n * 4), 0) << cs.name;
      EXPECT_EQ(std::memcmp(a.v.data(), b.v.data(), n * 4), 0) << cs.name;
    }
    EXPECT_EQ(a.out, b.out) << cs.name;
    EXPECT_EQ(std::memcmp(src.p.data(), keep.p.data(), n * 4), 0) << cs.name;
    up.source = ConstChunkState{b.p, Bytes(b.m), Bytes(b.v)};
    EXPECT_EQ(
        (*opt)->Update({b.p, Bytes(b.m), Bytes(b.v)}, Grad(src, DType::kF32, 0, n), up).code(),
        Code::kInvalidArgument);
  }
}

// Out of place, large ranges write master, m and v with streaming stores where each of them is
// on a cache line at the same element as master (RunRange's peel), and with ordinary stores
// otherwise: every relative alignment, on a pool, gives the in-place bits, and the copy too.
TEST(Optimizer, OutOfPlaceStreamsAtEveryAlignment) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto pool = ThreadPool::Create({.name = "test-oop", .threads = 2});
  ASSERT_THAT(pool, IsOk());
  const size_t n = 3 * 65536 + 77;
  // {master, m, v, copy} offsets in elements from 64-byte-aligned bases: all on a line, all off
  // it by the same amount, and each off by a different amount.
  const size_t offsets[][4] = {{0, 0, 0, 0}, {3, 3, 3, 6},     {1, 0, 0, 0}, {0, 5, 0, 0},
                               {0, 0, 0, 1}, {16, 16, 16, 32}, {2, 7, 9, 3}};
  const State src = MakeState(n, DType::kBF16, 21);
  for (const Case& cs : Cases()) {
    auto opt = Optimizer::Create(cs.config, pool->get(), isa);
    ASSERT_THAT(opt, IsOk());
    State ref = MakeState(n, DType::kBF16, 21);
    UpdateParams up;
    up.step = 5;
    up.grad_scale = 0.25f;
    up.out16 = ref.out;
    ASSERT_THAT(
        (*opt)->Update({ref.p, Bytes(ref.m), Bytes(ref.v)}, Grad(src, DType::kF32, 0, n), up),
        IsOk());
    for (const auto& off : offsets) {
      auto buf = [n] { return AlignedBuffer<float>::Allocate(n + 64).value(); };
      AlignedBuffer<float> p = buf(), m = buf(), v = buf();
      auto copy = AlignedBuffer<uint16_t>::Allocate(n + 64).value();
      const std::span<float> dp = p.span().subspan(off[0], n), dm = m.span().subspan(off[1], n),
                             dv = v.span().subspan(off[2], n);
      const std::span<uint16_t> dc = copy.span().subspan(off[3], n);
      up.out16 = dc;
      up.source = ConstChunkState{src.p, Bytes(src.m), Bytes(src.v)};
      ASSERT_THAT((*opt)->Update({dp, Bytes(dm), Bytes(dv)}, Grad(src, DType::kF32, 0, n), up),
                  IsOk());
      up.source.reset();
      const std::string at = std::string(cs.name) + " offsets " + std::to_string(off[0]) + "," +
                             std::to_string(off[1]) + "," + std::to_string(off[2]) + "," +
                             std::to_string(off[3]);
      EXPECT_EQ(std::memcmp(dp.data(), ref.p.data(), n * 4), 0) << at;
      const bool sgd = cs.config.kind == OptimizerKind::kSgd;
      if (!sgd || cs.config.momentum > 0.0f) {  // plain SGD has no m
        EXPECT_EQ(std::memcmp(dm.data(), ref.m.data(), n * 4), 0) << at;
      }
      if (!sgd) {
        EXPECT_EQ(std::memcmp(dv.data(), ref.v.data(), n * 4), 0) << at;
      }
      EXPECT_EQ(std::memcmp(dc.data(), ref.out.data(), n * 2), 0) << at;
    }
  }
}

double RefSumSquares(const State& s, size_t n, float scale) {
  long double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<long double>(s.g32[i]) * s.g32[i];
  return static_cast<double>(sum * scale * scale);
}

// The default optimizer (AdamW) on a pool of `threads`.
struct PooledOptimizer {
  std::unique_ptr<ThreadPool> pool;  // declared first: outlives `opt`
  std::unique_ptr<Optimizer> opt;
};

Result<PooledOptimizer> DefaultOnPool(Isa isa, int threads) {
  ZPS_ASSIGN_OR_RETURN(auto pool, ThreadPool::Create({.name = "test-stats", .threads = threads}));
  ZPS_ASSIGN_OR_RETURN(auto opt, Optimizer::Create(OptimizerConfig{}, pool.get(), isa));
  return PooledOptimizer{std::move(pool), std::move(opt)};
}

// The gradient statistics, once per gradient dtype.
class OptimizerGradStats : public ::testing::TestWithParam<DType> {};

INSTANTIATE_TEST_SUITE_P(GradDTypes, OptimizerGradStats,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(DTypeName(i.param));
                         });

TEST_P(OptimizerGradStats, MatchReference) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto o = DefaultOnPool(isa, 3);
  ASSERT_THAT(o, IsOk());
  const DType gt = GetParam();
  for (size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{4095}, size_t{4097}, size_t{200003}}) {
    State s = MakeState(n, gt, static_cast<uint32_t>(n));
    auto stats = o->opt->ComputeGradStats(Grad(s, gt, 0, n), 8.0f);
    ASSERT_THAT(stats, IsOk());
    const double ref = RefSumSquares(s, n, 8.0f);
    EXPECT_NEAR(stats->sum_squares, ref, kTolStats * ref) << "n=" << n;
    EXPECT_FALSE(stats->non_finite);
  }
}

// The statistics are the same bits on every ISA this CPU has (same lane layout, exact squares).
TEST(Optimizer, GradStatsSameOnEveryIsa) {
  const size_t n = 100003;
  State s = MakeState(n, DType::kF16, 11);
  std::vector<uint64_t> bits;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    auto opt = Optimizer::Create(OptimizerConfig{}, nullptr, isa);
    ASSERT_THAT(opt, IsOk());
    auto stats = (*opt)->ComputeGradStats(Grad(s, DType::kF16, 0, n));
    ASSERT_THAT(stats, IsOk());
    bits.push_back(std::bit_cast<uint64_t>(stats->sum_squares));
  }
  for (uint64_t b : bits) EXPECT_EQ(b, bits[0]);
}

// AVX2 and AVX-512 bit for bit: OptimizerGolden.* (optimizer_golden_test.cc) checks each ISA
// this CPU has against stored CRCs, so it also runs where one of them is missing.

TEST_P(OptimizerGradStats, NonFiniteGradientsFlagged) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto o = DefaultOnPool(isa, 2);
  ASSERT_THAT(o, IsOk());
  const DType gt = GetParam();
  const size_t n = 150001;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Positions: first, inside a vector, in a later pool task, the ragged tail, the last.
  for (size_t pos : {size_t{0}, size_t{9}, size_t{70000}, size_t{n - 3}, size_t{n - 1}}) {
    for (float bad : {inf, -inf, nan}) {
      State s = MakeState(n, gt, 5);
      s.g32[pos] = bad;
      s.g16[pos] = ToBits(bad, gt == DType::kF32 ? DType::kF16 : gt);
      auto stats = o->opt->ComputeGradStats(Grad(s, gt, 0, n), 1e-3f);
      ASSERT_THAT(stats, IsOk());
      EXPECT_TRUE(stats->non_finite) << "pos=" << pos << " value=" << bad;
    }
  }
}

// fp16 overflow: the largest finite fp16 is fine, squared or not.
TEST(Optimizer, LargestFiniteHalfGradientNotFlagged) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto o = DefaultOnPool(isa, 2);
  ASSERT_THAT(o, IsOk());
  State s = MakeState(100, DType::kF16, 5);
  s.g16[50] = 0x7bff;
  auto stats = o->opt->ComputeGradStats(Grad(s, DType::kF16, 0, 100), 65536.0f);
  ASSERT_THAT(stats, IsOk());
  EXPECT_FALSE(stats->non_finite);
}

TEST(Optimizer, BadArgumentsRejectedAndNothingWritten) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto opt = Optimizer::Create(OptimizerConfig{}, nullptr, isa);
  ASSERT_THAT(opt, IsOk());
  const size_t n = 100;
  State s = MakeState(n, DType::kF32, 1);
  const State before = s;
  const GradView g = Grad(s, DType::kF32, 0, n);
  UpdateParams up;
  up.out16 = s.out;
  // `up` with one field changed.
  auto with = [&](auto change) {
    UpdateParams p = up;
    change(p);
    return p;
  };
  const ChunkState good{s.p, Bytes(s.m), Bytes(s.v)};
  const struct {
    const char* what;
    ChunkState st;
    GradView g;
    UpdateParams p;
  } cases[] = {
      {"short master", {{s.p.data(), n - 1}, Bytes(s.m), Bytes(s.v)}, g, up},
      {"short m", {s.p, Bytes(s.m).first(4 * n - 4), Bytes(s.v)}, g, up},
      {"missing v", {s.p, Bytes(s.m), {}}, g, up},
      {"long grad", good, GradView{g.data, DType::kF32, n + 1}, up},
      {"null grad", good, GradView{nullptr, DType::kF32, n}, up},
      {"bad dtype", good, GradView{g.data, static_cast<DType>(7), n}, up},
      {"short copy", good, g, with([&](UpdateParams& p) {
         p.out16 = {s.out.data(), n - 1};
       })},
      {"step 0", good, g, with([](UpdateParams& p) { p.step = 0; })},
      {"inf scale", good, g,
       with([](UpdateParams& p) { p.grad_scale = std::numeric_limits<float>::infinity(); })},
      {"nan scale", good, g,
       with([](UpdateParams& p) { p.grad_scale = std::numeric_limits<float>::quiet_NaN(); })},
      {"fp32 copy", good, g, with([](UpdateParams& p) { p.out_dtype = DType::kF32; })},
  };
  for (const auto& c : cases) {
    Status r = (*opt)->Update(c.st, c.g, c.p);
    EXPECT_EQ(r.code(), Code::kInvalidArgument) << c.what << ": " << r.ToString();
  }
  EXPECT_EQ(s.p, before.p);
  EXPECT_EQ(s.m, before.m);
  EXPECT_EQ(s.v, before.v);
  EXPECT_EQ(s.out, before.out);
  EXPECT_EQ((*opt)->ComputeGradStats(g, std::numeric_limits<float>::infinity()).status().code(),
            Code::kInvalidArgument);
  // SGD without momentum needs neither m nor v.
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  auto plain = Optimizer::Create(sgd, nullptr, isa);
  ASSERT_THAT(plain, IsOk());
  EXPECT_THAT((*plain)->Update({s.p, {}, {}}, g, up), IsOk());
  sgd.momentum = 0.5f;
  auto mom = Optimizer::Create(sgd, nullptr, isa);
  ASSERT_THAT(mom, IsOk());
  EXPECT_EQ((*mom)->Update({s.p, {}, {}}, g, up).code(), Code::kInvalidArgument);
}

// UpdateParams::out_quant: the block-quantized copy made in the pass, task by task, is the same
// bytes as QuantizeBlocks of the updated master after the pass (several tasks, a short last
// block, fp32 and int8 state, int8 and int4 blocks), and the master is the one the pass without
// the copy gives.
TEST(Optimizer, QuantizedCopyInThePassEqualsQuantizeBlocksAfterIt) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto pool = ThreadPool::Create({.name = "test-quant", .threads = 2});
  ASSERT_THAT(pool, IsOk());
  const size_t n = 3 * 65536 + 1000;
  for (StateDType sd : {StateDType::kF32, StateDType::kInt8}) {
    for (QuantFormat qf : {QuantFormat{8, kWeightQuantBlock}, QuantFormat{4, kWeightQuantBlock}}) {
      OptimizerConfig cfg;
      cfg.state_dtype = sd;
      auto opt = Optimizer::Create(cfg, pool->get(), isa);
      ASSERT_THAT(opt, IsOk());
      const State s = MakeState(n, DType::kF32, 21);
      const size_t mb = MomentBytes(sd, n);
      auto moments = [&](const std::vector<float>& x) {
        std::vector<std::byte> b(mb);
        EXPECT_THAT(PackMoment(sd, MomentKind::kM, x, b), IsOk());
        return b;
      };
      std::vector<float> p1 = s.p, p2 = s.p;
      std::vector<std::byte> m1 = moments(s.m), m2 = m1, v1 = moments(s.v), v2 = v1;
      std::vector<uint16_t> o1(n), o2(n);
      std::vector<std::byte> fused(QuantizedBytes(qf, n), std::byte{0x5a});
      std::vector<std::byte> after(fused.size());
      UpdateParams up;
      up.step = 3;
      up.out16 = o1;
      up.out_quant = fused;
      up.out_quant_format = qf;
      ASSERT_THAT((*opt)->Update({p1, m1, v1}, Grad(s, DType::kF32, 0, n), up), IsOk());
      UpdateParams plain;
      plain.step = 3;
      plain.out16 = o2;
      ASSERT_THAT((*opt)->Update({p2, m2, v2}, Grad(s, DType::kF32, 0, n), plain), IsOk());
      QuantizeBlocks(qf, p2, after);
      EXPECT_EQ(p1, p2);
      EXPECT_EQ(m1, m2);
      EXPECT_EQ(v1, v2);
      EXPECT_EQ(o1, o2);
      EXPECT_TRUE(fused == after) << "state " << StateDTypeName(sd) << ", int" << int{qf.bits};
    }
  }
}

TEST(Optimizer, QuantizedCopyOfTheWrongSizeOrBlockIsRejected) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto opt = Optimizer::Create(OptimizerConfig{}, nullptr, isa);
  ASSERT_THAT(opt, IsOk());
  const size_t n = 1000;
  State s = MakeState(n, DType::kF32, 5);
  const std::vector<float> before = s.p;
  auto m = std::as_writable_bytes(std::span<float>(s.m));
  auto v = std::as_writable_bytes(std::span<float>(s.v));
  const struct {
    const char* what;
    QuantFormat format;
    size_t extra_bytes;  // beyond QuantizedBytes(format, n)
  } cases[] = {
      {"a byte too many", {8, kWeightQuantBlock}, 1},
      // 192 is a valid block (a multiple of 64) but does not divide the pass's tasks.
      {"block 192", {8, 192}, 0},
  };
  for (const auto& c : cases) {
    std::vector<std::byte> q(QuantizedBytes(c.format, n) + c.extra_bytes);
    UpdateParams up;
    up.out_quant = q;
    up.out_quant_format = c.format;
    EXPECT_EQ((*opt)->Update({s.p, m, v}, Grad(s, DType::kF32, 0, n), up).code(),
              Code::kInvalidArgument)
        << c.what;
  }
  EXPECT_EQ(s.p, before);
}

TEST(Optimizer, CreateReportsIsa) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto opt = Optimizer::Create(OptimizerConfig{}, nullptr);
  ASSERT_THAT(opt, IsOk());
  EXPECT_EQ((*opt)->isa(), isa);
  EXPECT_EQ((*opt)->config().kind, OptimizerKind::kAdamW);
}

}  // namespace
}  // namespace zps::server
