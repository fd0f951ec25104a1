// The fused optimizer's fp32 serving copy and its per-call lr / weight-decay overrides (parameter
// groups, schedules), once per ISA (ZPS_ISA, see zps_cc_test ISA_MATRIX).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "optimizer_cases.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"
#include "zps/server/optimizer.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using test_cases::Bytes;

struct Arrays {
  std::vector<float> p, m, v, g;
};

Arrays Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Arrays a;
  for (size_t i = 0; i < n; ++i) {
    a.p.push_back(u(rng));
    a.m.push_back(0.01f * u(rng));
    a.v.push_back(1e-4f * std::fabs(u(rng)));
    a.g.push_back(0.1f * u(rng));
  }
  return a;
}

std::unique_ptr<Optimizer> Make(const OptimizerConfig& c) {
  auto isa = ActiveIsa();
  EXPECT_THAT(isa, IsOk());
  auto o = Optimizer::Create(c, nullptr, *isa);
  EXPECT_THAT(o, IsOk());
  return std::move(*o);
}

// An fp32 copy is the new master bit for bit, and writing it leaves master/m/v exactly as the
// 16-bit path does (whose copy is unchanged by the new code: still FloatToBf16 of the master).
TEST(OptimizerFp32Serving, CopyIsTheMasterAndStateMatchesThe16BitPath) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    for (size_t n : {1u, 15u, 17u, 1000u, 70000u}) {  // tails, one block, several, streaming size
      OptimizerConfig c;
      c.kind = kind;
      c.weight_decay = 0.01f;
      c.momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f;
      auto opt = Make(c);
      Arrays a = Random(n, static_cast<uint32_t>(n)), b = a;
      std::vector<uint16_t> out16(n, 0xdead);
      std::vector<float> out32(n, -7.0f);
      UpdateParams up;
      up.step = 3;
      up.grad_scale = 0.5f;
      up.out_dtype = DType::kBF16;
      up.out16 = out16;
      ASSERT_THAT(opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, n}, up),
                  IsOk());
      UpdateParams up32 = up;
      up32.out16 = {};
      up32.out_dtype = DType::kF32;
      up32.out32 = out32;
      ASSERT_THAT(opt->Update({b.p, Bytes(b.m), Bytes(b.v)}, {b.g.data(), DType::kF32, n}, up32),
                  IsOk());
      ASSERT_EQ(0, std::memcmp(a.p.data(), b.p.data(), n * 4)) << n;
      ASSERT_EQ(0, std::memcmp(a.m.data(), b.m.data(), n * 4)) << n;
      if (kind != OptimizerKind::kSgd) {
        ASSERT_EQ(0, std::memcmp(a.v.data(), b.v.data(), n * 4));
      }
      ASSERT_EQ(0, std::memcmp(out32.data(), b.p.data(), n * 4)) << n;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out16[i], FloatToBf16(a.p[i])) << i;
    }
  }
}

TEST(OptimizerFp32Serving, MismatchedCopyArgumentsAreRejected) {
  auto opt = Make({});
  Arrays a = Random(8, 1);
  std::vector<float> out32(8);
  std::vector<uint16_t> out16(8);
  UpdateParams up;
  up.out_dtype = DType::kBF16;
  up.out32 = out32;  // a 16-bit type writes out16
  EXPECT_EQ(opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, 8}, up).code(),
            Code::kInvalidArgument);
  up.out32 = {};
  up.out_dtype = DType::kF32;
  up.out16 = out16;  // fp32 writes out32
  EXPECT_EQ(opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, 8}, up).code(),
            Code::kInvalidArgument);
  up.out16 = {};
  up.out32 = std::span<float>(out32).first(7);
  EXPECT_EQ(opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, 8}, up).code(),
            Code::kInvalidArgument);
  Arrays fresh = Random(8, 1);
  EXPECT_EQ(0, std::memcmp(a.p.data(), fresh.p.data(), 32));  // nothing written
}

// An override gives exactly what a config with those values gives (the constants fold the same).
TEST(OptimizerOverrides, LrAndWeightDecayOverridesEqualTheConfig) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    OptimizerConfig base;
    base.kind = kind;
    OptimizerConfig group = base;
    group.lr = 3.5e-4f;
    group.weight_decay = 0.25f;
    auto a_opt = Make(base), b_opt = Make(group);
    const size_t n = 333;
    Arrays a = Random(n, 7), b = a;
    UpdateParams up;
    up.step = 2;
    up.lr = group.lr;
    up.weight_decay = group.weight_decay;
    ASSERT_THAT(a_opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, n}, up),
                IsOk());
    UpdateParams plain;
    plain.step = 2;
    ASSERT_THAT(b_opt->Update({b.p, Bytes(b.m), Bytes(b.v)}, {b.g.data(), DType::kF32, n}, plain),
                IsOk());
    EXPECT_EQ(0, std::memcmp(a.p.data(), b.p.data(), n * 4));
    EXPECT_EQ(0, std::memcmp(a.m.data(), b.m.data(), n * 4));
  }
}

TEST(OptimizerOverrides, BadOverridesAreRejected) {
  auto opt = Make({});  // adamw
  Arrays a = Random(4, 2);
  UpdateParams up;
  up.lr = -1.0f;
  EXPECT_EQ(opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, 4}, up).code(),
            Code::kInvalidArgument);
  up.lr = 0.5f;
  up.weight_decay = 4.0f;  // adamw: lr * wd > 1
  EXPECT_EQ(opt->Update({a.p, Bytes(a.m), Bytes(a.v)}, {a.g.data(), DType::kF32, 4}, up).code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::server
