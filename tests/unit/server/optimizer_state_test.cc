// Compact optimizer state (OptimizerConfig::state_dtype bf16 and int8): the packed formats, the
// fused update over them against the fp32-state update, and the properties the shard relies on
// (out of place, any pool size, a chunk updated in several calls, every ISA packing alike).
// Runs once per ISA (ZPS_ISA), as optimizer_test.cc; the golden CRCs are in
// optimizer_golden_test.cc.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "optimizer/state_codec.h"
#include "optimizer_cases.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"
#include "zps/common/thread_pool.h"
#include "zps/server/optimizer.h"
#include "zps/server/packed_moment.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using test_cases::Case;
using test_cases::Cases;
using test_cases::Rng;

constexpr StateDType kCompact[] = {StateDType::kBF16, StateDType::kInt8};

// A chunk's state in one state dtype: fp32 master, packed m and v, a bf16 serving copy.
struct Packed {
  std::vector<float> p;
  std::vector<std::byte> m, v;
  std::vector<uint16_t> out;
  ChunkState state() { return {p, m, v}; }
  ConstChunkState cstate() const { return {p, m, v}; }
};

Packed MakePacked(StateDType sd, size_t n, uint64_t seed, bool zero_moments = false) {
  Rng rng{seed};
  std::vector<float> m(n), v(n);
  Packed s;
  s.p.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = rng.Sym();
    // Magnitudes spread over several decades inside a block, as trained moments are.
    const float scale = std::ldexp(1.0f, -static_cast<int>(rng.Next() % 12));
    m[i] = zero_moments ? 0.0f : 0.01f * scale * rng.Sym();
    v[i] = zero_moments ? 0.0f : 1e-4f * scale * scale * std::fabs(rng.Sym());
  }
  s.m.resize(MomentBytes(sd, n));
  s.v.resize(MomentBytes(sd, n));
  EXPECT_THAT(PackMoment(sd, MomentKind::kM, m, s.m), IsOk());
  EXPECT_THAT(PackMoment(sd, MomentKind::kV, v, s.v), IsOk());
  s.out.assign(n, 0);
  return s;
}

std::vector<float> Grads(size_t n, uint64_t seed) {
  Rng rng{seed};
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = 0.1f * rng.Sym() * std::ldexp(1.0f, -static_cast<int>(rng.Next() % 8));
  }
  return g;
}

OptimizerConfig WithState(OptimizerConfig c, StateDType sd) {
  c.state_dtype = sd;
  return c;
}

bool UsesM(const OptimizerConfig& c) { return c.kind != OptimizerKind::kSgd || c.momentum > 0; }
bool UsesV(const OptimizerConfig& c) { return c.kind != OptimizerKind::kSgd; }

// The state an optimizer configuration actually keeps: plain SGD has no m, SGD no v.
ChunkState Kept(const OptimizerConfig& c, Packed& s) {
  ChunkState st = s.state();
  if (!UsesM(c)) st.m = {};
  if (!UsesV(c)) st.v = {};
  return st;
}
ConstChunkState KeptConst(const OptimizerConfig& c, const Packed& s) {
  ConstChunkState st = s.cstate();
  if (!UsesM(c)) st.m = {};
  if (!UsesV(c)) st.v = {};
  return st;
}

TEST(OptimizerState, MomentBytesAndRanges) {
  EXPECT_EQ(MomentBytes(StateDType::kF32, 100), 400u);
  EXPECT_EQ(MomentBytes(StateDType::kBF16, 100), 200u);
  EXPECT_EQ(MomentBytes(StateDType::kInt8, 64), kInt8BlockBytes);
  EXPECT_EQ(MomentBytes(StateDType::kInt8, 65), 2 * kInt8BlockBytes);
  EXPECT_EQ(MomentBytes(StateDType::kInt8, 0), 0u);
  EXPECT_EQ(MomentOffset(StateDType::kInt8, 128), 2 * kInt8BlockBytes);
  EXPECT_EQ(MomentOffset(StateDType::kBF16, 3), 6u);
  // A range of a packed moment is the packed moment of its elements.
  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i) - 0.1f;
  for (StateDType sd : {StateDType::kF32, StateDType::kBF16, StateDType::kInt8}) {
    std::vector<std::byte> whole(MomentBytes(sd, 300)), part(MomentBytes(sd, 300 - 128));
    ASSERT_THAT(PackMoment(sd, MomentKind::kM, x, whole), IsOk());
    ASSERT_THAT(PackMoment(sd, MomentKind::kM, std::span<const float>(x).subspan(128), part),
                IsOk());
    const auto r = MomentRange(sd, std::span<const std::byte>(whole), 128, 300 - 128);
    ASSERT_EQ(r.size(), part.size()) << StateDTypeName(sd);
    EXPECT_EQ(std::memcmp(r.data(), part.data(), r.size()), 0) << StateDTypeName(sd);
  }
  std::vector<std::byte> wrong(10);
  EXPECT_EQ(PackMoment(StateDType::kInt8, MomentKind::kM, x, wrong).code(), Code::kInvalidArgument);
}

// Every code of both maps decodes to a value inside its own cell: quantizing it gives it back.
TEST(OptimizerState, Int8MapRoundTripsEveryCode) {
  for (bool is_signed : {true, false}) {
    const float* table = internal::Int8Table(is_signed);
    for (int code = 0; code < 256; ++code) {
      const float x = table[code];
      const uint8_t back = is_signed ? internal::Int8Quantize<true>(x, 1.0f)
                                     : internal::Int8Quantize<false>(x, 1.0f);
      EXPECT_EQ(back, code) << (is_signed ? "signed " : "unsigned ") << code << " = " << x;
    }
  }
  // Dynamic: the smallest non-zero magnitudes are 10^-7 of the scale.
  EXPECT_LT(internal::Int8Table(true)[1], 1e-6f);
  EXPECT_LT(internal::Int8Table(false)[1], 1e-6f);
  EXPECT_EQ(internal::Int8Table(false)[255], 1.0f);
}

// The binade form that the AVX-512 kernel computes (state_codec.h) gives Int8Quantize's codes:
// near every threshold it folds in (the zero rule, the decade bounds, 1.0), on a stride through
// [0, 2), and at inputs where a fused a * scale - 0.1 would round differently (found by an
// exhaustive search of [0, 2); that search found no difference between the two forms).
TEST(OptimizerState, Int8BinadeFormGivesInt8QuantizeCodes) {
  std::vector<uint32_t> bits = {0x3f800000u, 0x3f800001u, 0x3f800002u, 0x3fffffffu};
  for (float t : {2.75e-7f, 1e-38f, 1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f}) {
    const uint32_t b = std::bit_cast<uint32_t>(t);
    for (uint32_t d = 0; d < 64; ++d) bits.insert(bits.end(), {b + d, b - d});
  }
  for (uint32_t b = 0; b < 0x40000000u; b += 4093) bits.push_back(b);
  for (float x :
       {0x1.27476cp-21f, 0x1.b43524p-19f, 0x1.450efcp-14f, 0x1.5b573ep-11f, 0x1.d14e3ap-11f}) {
    bits.push_back(std::bit_cast<uint32_t>(x));
  }
  for (uint32_t b : bits) {
    for (float x : {std::bit_cast<float>(b), -std::bit_cast<float>(b)}) {
      ASSERT_EQ(internal::Int8QuantizeBinade<true>(x, 1.0f), internal::Int8Quantize<true>(x, 1.0f))
          << std::hexfloat << x;
    }
    const float x = std::bit_cast<float>(b);
    ASSERT_EQ(internal::Int8QuantizeBinade<false>(x, 1.0f), internal::Int8Quantize<false>(x, 1.0f))
        << std::hexfloat << x;
  }
  // Other scales reach the same a through the same product.
  for (float inv : {3.0f, 1e-3f, 7.5e4f}) {
    for (uint32_t b = 0x30000000u; b < 0x3f900000u; b += 65537) {
      const float x = std::bit_cast<float>(b) / inv;
      ASSERT_EQ(internal::Int8QuantizeBinade<false>(x, inv), internal::Int8Quantize<false>(x, inv));
      ASSERT_EQ(internal::Int8QuantizeBinade<true>(-x, inv), internal::Int8Quantize<true>(-x, inv));
    }
  }
}

// Quantization error: relative to each value, bounded by the map's cell (decade 6: 0.9/64
// signed, 0.9/128 unsigned, relative to 0.1 at worst), and a positive v never becomes 0.
TEST(OptimizerState, Int8ErrorIsWithinTheMap) {
  Rng rng{5};
  const size_t n = 64 * 50;
  std::vector<float> m(n), v(n), back(n);
  for (size_t i = 0; i < n; ++i) {
    m[i] = rng.Sym();
    v[i] = 1e-3f * std::fabs(rng.Sym()) + 1e-30f;
  }
  std::vector<std::byte> pm(MomentBytes(StateDType::kInt8, n));
  ASSERT_THAT(PackMoment(StateDType::kInt8, MomentKind::kM, m, pm), IsOk());
  ASSERT_THAT(UnpackMoment(StateDType::kInt8, MomentKind::kM, pm, back), IsOk());
  for (size_t i = 0; i < n; ++i) {
    // Within a block, values above a tenth of the absmax keep ~1/64 of a decade.
    EXPECT_NEAR(back[i], m[i], 0.02f) << i;
  }
  ASSERT_THAT(PackMoment(StateDType::kInt8, MomentKind::kV, v, pm), IsOk());
  ASSERT_THAT(UnpackMoment(StateDType::kInt8, MomentKind::kV, pm, back), IsOk());
  for (size_t i = 0; i < n; ++i) EXPECT_GT(back[i], 0.0f) << i;
}

// bf16 v's stochastic rounding: unbiased (the mean of many roundings of one value is that value,
// well inside the ulp), and the bits depend on the element's index and the step only.
TEST(OptimizerState, Bf16StochasticRoundingIsUnbiased) {
  const float x = 1.0f + 0x1p-10f;  // a quarter of a bf16 ulp above 1
  double sum = 0.0;
  const int kN = 1 << 16;
  const uint32_t key = internal::SrKey(0);
  for (int i = 0; i < kN; ++i) {
    sum += internal::Bf16Value(
        internal::Bf16Stochastic(x, internal::SrBits(key, i, 7) >> internal::kBf16VShift));
  }
  EXPECT_NEAR(sum / kN, x, 0x1p-14);  // the ulp is 2^-7; round-to-nearest would give 1.0
  EXPECT_NE(internal::SrBits(key, 5, 7), internal::SrBits(key, 5, 8));
  EXPECT_NE(internal::SrKey(0), internal::SrKey(1));
  EXPECT_EQ(internal::Bf16Stochastic(std::nanf(""), 0xffff), 0x7fc0);
}

// Many steps of every optimizer case with compact state stay close to the fp32-state run: the
// masters' distance from the fp32 run is a small fraction of how far the fp32 run moved.
TEST(OptimizerState, TracksTheFp32StateUpdate) {
  ZPS_GET_ISA_OR_SKIP(isa);
  const size_t n = 64 * 70 + 13;
  for (const Case& cs : Cases()) {
    auto ref_opt = Optimizer::Create(cs.config, nullptr, isa);
    ASSERT_THAT(ref_opt, IsOk());
    Packed ref = MakePacked(StateDType::kF32, n, 3, /*zero_moments=*/true);
    const std::vector<float> start = ref.p;
    for (StateDType sd : kCompact) {
      SCOPED_TRACE(testing::Message() << cs.name << " " << StateDTypeName(sd));
      auto opt = Optimizer::Create(WithState(cs.config, sd), nullptr, isa);
      ASSERT_THAT(opt, IsOk());
      Packed ref_run = ref;
      Packed s = MakePacked(sd, n, 3, /*zero_moments=*/true);
      for (int step = 1; step <= 30; ++step) {
        const std::vector<float> g = Grads(n, 100 + step);
        UpdateParams up;
        up.step = step;
        up.out16 = s.out;
        ASSERT_THAT((*opt)->Update(Kept(cs.config, s), {g.data(), DType::kF32, n}, up), IsOk());
        up.out16 = ref_run.out;
        ASSERT_THAT((*ref_opt)->Update(Kept(cs.config, ref_run), {g.data(), DType::kF32, n}, up),
                    IsOk());
      }
      double moved = 0.0, off = 0.0;
      for (size_t i = 0; i < n; ++i) {
        moved += std::fabs(ref_run.p[i] - start[i]);
        off += std::fabs(s.p[i] - ref_run.p[i]);
      }
      ASSERT_GT(moved, 0.0);
      EXPECT_LT(off / moved, sd == StateDType::kBF16 ? 0.01 : 0.05) << off / moved;
      // The serving copy is the new master's.
      for (size_t i = 0; i < n; i += 97) EXPECT_EQ(s.out[i], FloatToBf16(s.p[i]));
    }
  }
}

// Out of place (a speculative update, a snapshot's fresh buffers) gives the in-place bits and
// leaves its source alone; any pool size gives the single-threaded bits.
TEST(OptimizerState, OutOfPlaceAndPoolsGiveTheSameBits) {
  ZPS_GET_ISA_OR_SKIP(isa);
  auto pool = ThreadPool::Create({.name = "test-state", .threads = 3});
  ASSERT_THAT(pool, IsOk());
  const size_t n = 3 * 65536 + 64 * 5 + 7;
  const std::vector<float> g = Grads(n, 9);
  for (StateDType sd : kCompact) {
    for (const Case& cs : Cases()) {
      SCOPED_TRACE(testing::Message() << cs.name << " " << StateDTypeName(sd));
      auto one = Optimizer::Create(WithState(cs.config, sd), nullptr, isa);
      auto many = Optimizer::Create(WithState(cs.config, sd), pool->get(), isa);
      ASSERT_THAT(one, IsOk());
      ASSERT_THAT(many, IsOk());
      UpdateParams up;
      up.step = 4;
      up.first_index = 1000;
      Packed a = MakePacked(sd, n, 17);
      up.out16 = a.out;
      ASSERT_THAT((*one)->Update(Kept(cs.config, a), {g.data(), DType::kF32, n}, up), IsOk());

      Packed b = MakePacked(sd, n, 17);
      up.out16 = b.out;
      ASSERT_THAT((*many)->Update(Kept(cs.config, b), {g.data(), DType::kF32, n}, up), IsOk());
      EXPECT_EQ(a.p, b.p);
      EXPECT_EQ(a.m, b.m);
      EXPECT_EQ(a.v, b.v);
      EXPECT_EQ(a.out, b.out);

      const Packed src = MakePacked(sd, n, 17);
      Packed dst = MakePacked(sd, n, 99);
      up.out16 = dst.out;
      up.source = KeptConst(cs.config, src);
      ASSERT_THAT((*many)->Update(Kept(cs.config, dst), {g.data(), DType::kF32, n}, up), IsOk());
      EXPECT_EQ(dst.p, a.p);
      if (UsesM(cs.config)) {
        EXPECT_EQ(dst.m, a.m);
      }
      if (UsesV(cs.config)) {
        EXPECT_EQ(dst.v, a.v);
      }
      EXPECT_EQ(dst.out, a.out);
      EXPECT_EQ(src.p, MakePacked(sd, n, 17).p);
    }
  }
}

// A chunk updated as parameter runs, one call each (the shard), or in one call (the reference),
// or cut differently (another shard count), gives the same bits: bf16's random bits follow the
// element's layout index, int8's blocks start on run boundaries.
TEST(OptimizerState, RunsInSeveralCallsEqualOneCall) {
  ZPS_GET_ISA_OR_SKIP(isa);
  const size_t n = 64 * 300 + 21;
  const size_t cut = 64 * 131;
  const uint64_t first = (uint64_t{1} << 32) - 64 * 200;  // the index crosses 2^32 too
  const std::vector<float> g = Grads(n, 4);
  for (StateDType sd : kCompact) {
    SCOPED_TRACE(StateDTypeName(sd));
    OptimizerConfig c;
    c.state_dtype = sd;
    auto opt = Optimizer::Create(c, nullptr, isa);
    ASSERT_THAT(opt, IsOk());
    UpdateParams up;
    up.step = 11;
    up.first_index = first;
    Packed a = MakePacked(sd, n, 8);
    up.out16 = a.out;
    ASSERT_THAT((*opt)->Update(a.state(), {g.data(), DType::kF32, n}, up), IsOk());

    Packed b = MakePacked(sd, n, 8);
    for (auto [begin, len] : {std::pair<size_t, size_t>{0, cut}, {cut, n - cut}}) {
      ChunkState part{std::span<float>(b.p).subspan(begin, len),
                      MomentRange(sd, std::span<std::byte>(b.m), begin, len),
                      MomentRange(sd, std::span<std::byte>(b.v), begin, len)};
      up.first_index = first + begin;
      up.out16 = std::span<uint16_t>(b.out).subspan(begin, len);
      ASSERT_THAT((*opt)->Update(part, {g.data() + begin, DType::kF32, len}, up), IsOk());
    }
    EXPECT_EQ(a.p, b.p);
    EXPECT_EQ(a.m, b.m);
    EXPECT_EQ(a.v, b.v);
    EXPECT_EQ(a.out, b.out);
    if (sd == StateDType::kBF16) {  // and another first index draws other bits for v
      Packed c2 = MakePacked(sd, n, 8);
      up.first_index = first + 64;
      up.out16 = c2.out;
      ASSERT_THAT((*opt)->Update(c2.state(), {g.data(), DType::kF32, n}, up), IsOk());
      EXPECT_NE(a.v, c2.v);
    }
  }
}

// With a zero gradient the moments' arithmetic has one rounding per operation on every ISA
// (FMA or not: the added term is 0), so the packed moments are compared bit for bit between
// this ISA and the scalar kernel: the vector packing is the scalar packing, lane by lane.
TEST(OptimizerState, PackingIsTheScalarPackingOnEveryIsa) {
  ZPS_GET_ISA_OR_SKIP(isa);
  const size_t n = 64 * 40 + 9;
  const std::vector<float> g(n, 0.0f);
  OptimizerConfig adamw;
  adamw.weight_decay = 0.1f;
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.momentum = 0.9f;
  for (StateDType sd : kCompact) {
    for (const OptimizerConfig& base : {adamw, sgd}) {
      SCOPED_TRACE(testing::Message() << OptimizerKindName(base.kind) << " " << StateDTypeName(sd)
                                      << " on " << IsaName(isa));
      auto vec = Optimizer::Create(WithState(base, sd), nullptr, isa);
      auto sca = Optimizer::Create(WithState(base, sd), nullptr, Isa::kScalar);
      ASSERT_THAT(vec, IsOk());
      ASSERT_THAT(sca, IsOk());
      Packed a = MakePacked(sd, n, 21), b = MakePacked(sd, n, 21);
      for (int step = 1; step <= 3; ++step) {
        UpdateParams up;
        up.step = step;
        up.first_index = 77;
        ASSERT_THAT((*vec)->Update(Kept(base, a), {g.data(), DType::kF32, n}, up), IsOk());
        ASSERT_THAT((*sca)->Update(Kept(base, b), {g.data(), DType::kF32, n}, up), IsOk());
      }
      EXPECT_EQ(a.m, b.m);
      if (UsesV(base)) {
        EXPECT_EQ(a.v, b.v);
      }
    }
  }
}

TEST(OptimizerState, WrongMomentSizesRejected) {
  ZPS_GET_ISA_OR_SKIP(isa);
  OptimizerConfig c;
  c.state_dtype = StateDType::kInt8;
  auto opt = Optimizer::Create(c, nullptr, isa);
  ASSERT_THAT(opt, IsOk());
  const size_t n = 200;
  Packed s = MakePacked(StateDType::kInt8, n, 1);
  const std::vector<float> g(n, 0.1f);
  const Packed before = s;
  ChunkState bad = s.state();
  bad.m = bad.m.first(bad.m.size() - 1);
  EXPECT_EQ((*opt)->Update(bad, {g.data(), DType::kF32, n}, {}).code(), Code::kInvalidArgument);
  std::vector<std::byte> f32(4 * n);
  EXPECT_EQ((*opt)->Update({s.p, f32, s.v}, {g.data(), DType::kF32, n}, {}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(s.p, before.p);
  EXPECT_EQ(s.m, before.m);
}

}  // namespace
}  // namespace zps::server
