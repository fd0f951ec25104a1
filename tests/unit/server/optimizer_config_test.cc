// OptimizerConfig: validation messages, the versioned encoding and its rejection of garbage.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "zps/common/crc32c.h"
#include "zps/server/optimizer.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

OptimizerConfig Odd() {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.125f;
  c.beta1 = 0.5f;
  c.beta2 = 0.75f;
  c.eps = 1e-6f;
  c.weight_decay = 0.02f;
  c.bias_correction = false;
  c.momentum = 0.9f;
  c.nesterov = true;
  return c;
}

void ExpectInvalid(const OptimizerConfig& c, std::string_view field) {
  Status s = c.Validate();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  EXPECT_FALSE(Optimizer::Create(c, nullptr, Isa::kScalar).ok()) << field;
}

TEST(OptimizerConfig, DefaultsAreValid) {
  EXPECT_THAT(OptimizerConfig{}.Validate(), IsOk());
  EXPECT_THAT(Odd().Validate(), IsOk());
}

TEST(OptimizerConfig, BadHyperparametersRejected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [](auto edit) {
    OptimizerConfig c;
    edit(c);
    return c;
  };
  ExpectInvalid(with([](auto& c) { c.lr = -1e-3f; }), "lr");
  ExpectInvalid(with([&](auto& c) { c.lr = nan; }), "lr");
  ExpectInvalid(with([&](auto& c) { c.lr = inf; }), "lr");
  ExpectInvalid(with([](auto& c) { c.beta1 = 1.0f; }), "beta1");
  ExpectInvalid(with([](auto& c) { c.beta1 = -0.1f; }), "beta1");
  ExpectInvalid(with([&](auto& c) { c.beta1 = nan; }), "beta1");
  ExpectInvalid(with([](auto& c) { c.beta2 = 1.0f; }), "beta2");
  ExpectInvalid(with([](auto& c) { c.beta2 = 1.5f; }), "beta2");
  ExpectInvalid(with([](auto& c) { c.eps = 0.0f; }), "eps");
  ExpectInvalid(with([](auto& c) { c.eps = -1e-8f; }), "eps");
  ExpectInvalid(with([&](auto& c) { c.eps = nan; }), "eps");
  ExpectInvalid(with([](auto& c) { c.weight_decay = -0.01f; }), "weight_decay");
  ExpectInvalid(with([&](auto& c) { c.weight_decay = inf; }), "weight_decay");
  ExpectInvalid(with([](auto& c) { c.momentum = 1.0f; }), "momentum");
  ExpectInvalid(with([](auto& c) { c.momentum = -0.5f; }), "momentum");
  ExpectInvalid(with([](auto& c) { c.kind = OptimizerKind::kSgd, c.nesterov = true; }), "nesterov");
  ExpectInvalid(with([](auto& c) { c.lr = 2.0f, c.weight_decay = 1.0f; }), "lr * weight_decay");
  ExpectInvalid(with([](auto& c) { c.kind = static_cast<OptimizerKind>(9); }), "kind");
  // Edges that are allowed.
  EXPECT_THAT(with([](auto& c) { c.lr = 0.0f, c.beta1 = 0.0f, c.beta2 = 0.0f; }).Validate(),
              IsOk());
  EXPECT_TRUE(
      with([](auto& c) { c.kind = OptimizerKind::kAdam, c.lr = 2.0f, c.weight_decay = 1.0f; })
          .Validate()
          .ok());
}

TEST(OptimizerConfig, KindNames) {
  for (auto k : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    auto parsed = ParseOptimizerKind(OptimizerKindName(k));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(ParseOptimizerKind("lamb").status().code(), Code::kInvalidArgument);
}

TEST(OptimizerConfig, SerializeRoundTrip) {
  for (const OptimizerConfig& c : {OptimizerConfig{}, Odd()}) {
    const auto bytes = c.Serialize();
    auto back = OptimizerConfig::Deserialize(bytes);
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->kind, c.kind);
    EXPECT_EQ(back->lr, c.lr);
    EXPECT_EQ(back->beta1, c.beta1);
    EXPECT_EQ(back->beta2, c.beta2);
    EXPECT_EQ(back->eps, c.eps);
    EXPECT_EQ(back->weight_decay, c.weight_decay);
    EXPECT_EQ(back->bias_correction, c.bias_correction);
    EXPECT_EQ(back->momentum, c.momentum);
    EXPECT_EQ(back->nesterov, c.nesterov);
    EXPECT_EQ(back->Serialize(), bytes);
  }
}

// state_dtype: the record stays version 1 (39 bytes, as older builds wrote it) at fp32 and is
// version 2 (40 bytes, the field appended) otherwise.
TEST(OptimizerConfig, StateDtypeWritesRecordVersion2) {
  OptimizerConfig c = Odd();
  const auto v1 = c.Serialize();
  EXPECT_EQ(v1.size(), 39u);
  EXPECT_EQ(v1[4], std::byte{1});
  c.state_dtype = StateDType::kInt8;
  const auto v2 = c.Serialize();
  ASSERT_EQ(v2.size(), 40u);
  EXPECT_EQ(v2[4], std::byte{2});
  EXPECT_EQ(std::memcmp(v1.data() + 8, v2.data() + 8, 27), 0);  // the version-1 body, unchanged
  auto back = OptimizerConfig::Deserialize(v2);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, c);
}

// Rewrites the trailing CRC so that a test reaches the checks behind it.
void Reseal(std::vector<std::byte>& b) {
  const uint32_t crc = Crc32c(std::span<const std::byte>(b).first(b.size() - 4));
  std::memcpy(b.data() + b.size() - 4, &crc, 4);
}

TEST(OptimizerConfig, GarbageRejected) {
  const auto good = Odd().Serialize();
  auto bad = [&](std::vector<std::byte> b) {
    return OptimizerConfig::Deserialize(b).status().code();
  };
  EXPECT_NE(bad({}), Code::kOk);
  EXPECT_NE(bad(std::vector<std::byte>(good.begin(), good.begin() + 7)), Code::kOk);
  EXPECT_NE(bad(std::vector<std::byte>(good.begin(), good.end() - 1)), Code::kOk);
  auto longer = good;
  longer.push_back(std::byte{0});
  EXPECT_NE(bad(longer), Code::kOk);
  auto magic = good;
  magic[0] = std::byte{'X'};
  EXPECT_EQ(bad(magic), Code::kInvalidArgument);
  auto version = good;
  version[4] = std::byte{2};
  Reseal(version);
  EXPECT_EQ(bad(version), Code::kInvalidArgument);
  for (size_t i = 8; i < good.size(); ++i) {  // any flipped body or CRC byte
    auto flipped = good;
    flipped[i] ^= std::byte{0x10};
    EXPECT_NE(bad(flipped), Code::kOk) << "byte " << i;
  }
  auto kind = good;
  kind[8] = std::byte{7};
  Reseal(kind);
  EXPECT_EQ(bad(kind), Code::kInvalidArgument);
  auto lr = good;  // a well-formed buffer with a value Validate() refuses
  const float neg = -1.0f;
  std::memcpy(lr.data() + 9, &neg, 4);
  Reseal(lr);
  EXPECT_EQ(bad(lr), Code::kInvalidArgument);
  auto boolean = good;
  boolean[29] = std::byte{2};
  Reseal(boolean);
  EXPECT_EQ(bad(boolean), Code::kInvalidArgument);
  OptimizerConfig compact = Odd();
  compact.state_dtype = StateDType::kBF16;
  auto state = compact.Serialize();
  state[35] = std::byte{9};  // no such state dtype
  Reseal(state);
  EXPECT_EQ(bad(state), Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::server
