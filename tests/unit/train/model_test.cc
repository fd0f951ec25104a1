// Model: gradient check by finite differences, determinism, access order, bad input.
#include "zps/train/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "zps/testing/status_matchers.h"

namespace zps::train {
namespace {

// A ParamAccess over plain fp32 arrays (no 16-bit rounding), recording calls.
class FakeAccess : public ParamAccess {
 public:
  explicit FakeAccess(const std::vector<ParamDecl>& decls, uint64_t seed) {
    for (const auto& d : decls) {
      params.emplace_back(d.spec.numel());
      EXPECT_THAT(InitParam(d, seed, params.back()), IsOk());
    }
    grads.resize(decls.size());
  }
  Result<std::vector<std::span<const float>>> Acquire(std::span<const uint32_t> ids) override {
    std::vector<std::span<const float>> out;
    for (uint32_t id : ids) {
      if (id >= params.size()) return OutOfRange("id");
      if (held.count(id)) ADD_FAILURE() << "double acquire of " << id;
      held.insert({id, true});
      out.emplace_back(params[id]);
    }
    log.push_back("A" + std::to_string(ids[0]));
    return out;
  }
  void Release(std::span<const uint32_t> ids) override {
    for (uint32_t id : ids) {
      if (!held.erase(id)) ADD_FAILURE() << "release of unheld " << id;
    }
    log.push_back("R" + std::to_string(ids[0]));
  }
  Status PushGrad(uint32_t id, std::span<const float> g) override {
    if (g.size() != params[id].size()) return InvalidArgument("size");
    if (!grads[id].empty()) ADD_FAILURE() << "second push of " << id;
    grads[id].assign(g.begin(), g.end());
    log.push_back("P" + std::to_string(id));
    return Status::Ok();
  }
  std::vector<std::vector<float>> params, grads;
  std::map<uint32_t, bool> held;
  std::vector<std::string> log;
};

ModelConfig Tiny() {
  ModelConfig c;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 24;  // not a multiple of 16: exercises GEMM edge tiles
  c.seq_len = 7;
  c.seed = 3;
  return c;
}

std::vector<uint8_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> t(n);
  for (auto& b : t) b = static_cast<uint8_t>(rng() % 256);
  return t;
}

TEST(ModelTest, SpecsCountAndGroups) {
  const ModelConfig c = Tiny();
  auto decls = Specs(c);
  uint64_t total = 0;
  for (const auto& d : decls) total += d.spec.numel();
  EXPECT_EQ(total, CountParams(c));
  ASSERT_EQ(decls.size(), 2u + 12u * c.n_layers + 3u);
  auto m = Model::Create(c);
  ASSERT_THAT(m, IsOk());
  const auto& groups = (*m)->LayerGroups();
  ASSERT_EQ(groups.size(), static_cast<size_t>(c.n_layers) + 2);
  uint32_t next = 0;
  for (const auto& g : groups)
    for (uint32_t id : g) EXPECT_EQ(id, next++);
  EXPECT_EQ(next, decls.size());
  EXPECT_GT(TrainFlopsPerToken(c), 6.0 * 0.5 * static_cast<double>(total));
}

TEST(ModelTest, InitIsRangeIndependentAndSeeded) {
  auto decls = Specs(Tiny());
  const ParamDecl& w = decls[4];  // h0.attn.wqkv
  std::vector<float> whole(w.spec.numel()), part(100);
  ASSERT_THAT(InitParam(w, 7, whole), IsOk());
  ASSERT_THAT(InitParam(w, 7, 50, part), IsOk());
  EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + 50, sizeof(float) * part.size()));
  std::vector<float> other(w.spec.numel());
  ASSERT_THAT(InitParam(w, 8, other), IsOk());
  EXPECT_NE(0, std::memcmp(other.data(), whole.data(), sizeof(float) * other.size()));
  double s2 = 0;
  for (float v : whole) s2 += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(s2 / static_cast<double>(whole.size())), 0.02, 0.004);
  EXPECT_FALSE(InitParam(w, 7, whole.size() - 1, part).ok());
}

TEST(ModelTest, BadConfigAndInput) {
  ModelConfig c = Tiny();
  c.n_heads = 3;
  EXPECT_EQ(Model::Create(c).status().code(), Code::kInvalidArgument);
  c = Tiny();
  c.vocab = 100;
  EXPECT_EQ(Model::Create(c).status().code(), Code::kInvalidArgument);
  auto m = std::move(Model::Create(Tiny()).value());
  FakeAccess access(m->decls(), 1);
  std::vector<uint8_t> short_buf(10);
  EXPECT_EQ(m->TrainStep(short_buf, 2, 1.0f, access).status().code(), Code::kInvalidArgument);
  auto tokens = RandomTokens(2 * 8, 1);
  EXPECT_EQ(m->TrainStep(tokens, 2, 0.0f, access).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(access.held.empty());
}

TEST(ModelTest, AccessOrderAndPushes) {
  const ModelConfig c = Tiny();
  auto m = std::move(Model::Create(c).value());
  FakeAccess access(m->decls(), 1);
  auto tokens = RandomTokens(2 * 8, 2);
  ASSERT_THAT(m->TrainStep(tokens, 2, 1.0f, access), IsOk());
  std::vector<std::string> want = {"A0",  "R0",  "A2",  "R2",  "A14", "R14",
                                   "A26", "P26", "P27", "P28", "R26", "A14"};
  for (int i = 14; i < 26; ++i) want.push_back("P" + std::to_string(i));
  want.push_back("R14");
  want.push_back("A2");
  for (int i = 2; i < 14; ++i) want.push_back("P" + std::to_string(i));
  want.push_back("R2");
  want.push_back("P0");
  want.push_back("P1");
  EXPECT_EQ(access.log, want);
  EXPECT_TRUE(access.held.empty());
}

// Directional finite difference per parameter tensor: with a random unit direction u over the
// tensor, (L(p + eps u) - L(p - eps u)) / 2 eps must match <grad, u>. The model is fp32, so the
// loss carries ~1e-7 relative noise; eps = 1e-2 keeps that below 1e-4 of the derivative and the
// truncation error is O(eps^2). Tolerance: 1% relative + 5e-5 absolute (observed: <= 1e-5).
TEST(ModelTest, FiniteDifferenceGradients) {
  const ModelConfig c = Tiny();
  auto m = std::move(Model::Create(c).value());
  FakeAccess access(m->decls(), 11);
  // Parameters in a regime where every kind carries a sizable gradient (the default init makes
  // the blocks nearly silent): weights with unit-variance outputs, gains 1 +- 0.3, biases +- 0.3.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (size_t id = 0; id < access.params.size(); ++id) {
    const auto& spec = m->decls()[id].spec;
    const bool gain = spec.name.ends_with(".g");
    const float a =
        spec.shape.size() == 2 ? 1.7f / std::sqrt(static_cast<float>(spec.shape[0])) : 0.3f;
    for (auto& v : access.params[id]) v = (gain ? 1.0f : 0.0f) + a * unit(rng);
  }
  const int batch = 2;
  auto tokens = RandomTokens(batch * (c.seq_len + 1), 9);
  const float loss_scale = 4.0f;  // grads are of loss x loss_scale
  ASSERT_THAT(m->TrainStep(tokens, batch, loss_scale, access), IsOk());
  auto grads = access.grads;
  for (size_t id = 0; id < access.params.size(); ++id) {
    auto& p = access.params[id];
    std::vector<float> u(p.size());
    double norm = 0;
    std::normal_distribution<float> nd;
    for (auto& x : u) {
      x = nd(rng);
      norm += static_cast<double>(x) * x;
    }
    double analytic = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      u[i] = static_cast<float>(u[i] / std::sqrt(norm));
      analytic += static_cast<double>(grads[id][i]) * u[i] / loss_scale;
    }
    const std::vector<float> saved = p;
    const float eps = 1e-2f;
    for (size_t i = 0; i < p.size(); ++i) p[i] = saved[i] + eps * u[i];
    const double lp = m->Evaluate(tokens, batch, access).value();
    for (size_t i = 0; i < p.size(); ++i) p[i] = saved[i] - eps * u[i];
    const double lm = m->Evaluate(tokens, batch, access).value();
    p = saved;
    const double numeric = (lp - lm) / (2.0 * eps);
    if (std::getenv("ZPS_FD_VERBOSE"))
      std::printf("%-16s %+.6e %+.6e\n", m->decls()[id].spec.name.c_str(), numeric, analytic);
    EXPECT_NEAR(numeric, analytic, 5e-5 + 0.01 * std::fabs(analytic)) << m->decls()[id].spec.name;
  }
}

TEST(ModelTest, DeterministicBits) {
  const ModelConfig c = Tiny();
  auto m1 = std::move(Model::Create(c).value());
  auto m2 = std::move(Model::Create(c).value());
  FakeAccess a1(m1->decls(), 1), a2(m2->decls(), 1), a3(m1->decls(), 1);
  auto tokens = RandomTokens(3 * 8, 4);
  auto r1 = m1->TrainStep(tokens, 3, 1.0f, a1);
  auto r2 = m2->TrainStep(tokens, 3, 1.0f, a2);
  // Reuse of m1's workspace after a different batch size must not change a bit.
  auto small = RandomTokens(1 * 8, 5);
  FakeAccess scratch(m1->decls(), 1);
  ASSERT_THAT(m1->TrainStep(small, 1, 1.0f, scratch), IsOk());
  auto r3 = m1->TrainStep(tokens, 3, 1.0f, a3);
  ASSERT_THAT(r1, IsOk());
  ASSERT_THAT(r2, IsOk());
  ASSERT_THAT(r3, IsOk());
  EXPECT_EQ(std::memcmp(&r1->loss, &r2->loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&r1->loss, &r3->loss, sizeof(double)), 0);
  for (size_t id = 0; id < a1.grads.size(); ++id) {
    ASSERT_EQ(a1.grads[id].size(), a2.grads[id].size());
    EXPECT_EQ(0, std::memcmp(a1.grads[id].data(), a2.grads[id].data(),
                             sizeof(float) * a1.grads[id].size()));
    EXPECT_EQ(0, std::memcmp(a1.grads[id].data(), a3.grads[id].data(),
                             sizeof(float) * a1.grads[id].size()));
  }
}

}  // namespace
}  // namespace zps::train
