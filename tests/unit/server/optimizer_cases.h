// The optimizer configurations the kernel tests run (optimizer_test.cc against a double-precision
// reference, optimizer_golden_test.cc against stored CRCs): every kind, with and without bias
// correction, L2 against decoupled decay, plain, momentum and Nesterov SGD; the inputs' random
// stream (Rng) and the skip where the machine has no ISA to run (ZPS_GET_ISA_OR_SKIP).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/cpu.h"
#include "zps/server/optimizer.h"

// Declares `const Isa var`, the ISA the kernels run with here (ActiveIsa), or skips the test.
#define ZPS_GET_ISA_OR_SKIP(var)                                            \
  auto var##_result = ActiveIsa();                                          \
  if (!var##_result.ok()) GTEST_SKIP() << var##_result.status().ToString(); \
  const Isa var = *var##_result

namespace zps::server::test_cases {

// fp32 moments as the packed bytes ChunkState holds (fp32 state: the floats themselves).
inline std::span<std::byte> Bytes(std::span<float> f) { return std::as_writable_bytes(f); }
inline std::span<std::byte> Bytes(std::vector<float>& f) { return Bytes(std::span<float>(f)); }
inline std::span<const std::byte> Bytes(const std::vector<float>& f) {
  return std::as_bytes(std::span<const float>(f));
}

// splitmix64, turned into floats with exact integer-to-float steps.
struct Rng {
  uint64_t x;
  uint64_t Next() {  // splitmix64
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1) with 24 random bits: every step is exact in fp32.
  float Sym() { return static_cast<float>(Next() >> 40) * 0x1p-23f - 1.0f; }
};

struct Case {
  const char* name;
  OptimizerConfig config;
};

inline std::vector<Case> Cases() {
  std::vector<Case> cases;
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW, c.weight_decay = 0.1f;
  cases.push_back({"adamw", c});
  c.bias_correction = false;
  cases.push_back({"adamw_nobias", c});
  c = {};
  c.kind = OptimizerKind::kAdam, c.weight_decay = 0.01f, c.beta1 = 0.8f, c.eps = 1e-6f;
  cases.push_back({"adam_l2", c});
  c = {};
  c.kind = OptimizerKind::kSgd, c.lr = 0.05f;
  cases.push_back({"sgd_plain", c});
  c.momentum = 0.9f, c.weight_decay = 1e-3f;
  cases.push_back({"sgd_momentum", c});
  c.nesterov = true;
  cases.push_back({"sgd_nesterov", c});
  return cases;
}

}  // namespace zps::server::test_cases
