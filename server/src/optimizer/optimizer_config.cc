// OptimizerConfig: names, validation and the versioned binary encoding used by checkpoints.
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "zps/common/crc32c.h"
#include "zps/server/optimizer.h"

namespace zps::server {

std::string_view OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kSgd:
      return "sgd";
  }
  return "unknown";
}

Result<OptimizerKind> ParseOptimizerKind(std::string_view text) {
  if (text == "adam") return OptimizerKind::kAdam;
  if (text == "adamw") return OptimizerKind::kAdamW;
  if (text == "sgd") return OptimizerKind::kSgd;
  return InvalidArgument("optimizer must be adam, adamw or sgd; got '" + std::string(text) + "'");
}

namespace {

std::string Num(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

Status Bad(std::string_view field, std::string_view rule, float got) {
  return InvalidArgument("optimizer config: " + std::string(field) + " " + std::string(rule) +
                         ", got " + Num(got));
}

}  // namespace

Status OptimizerConfig::Validate() const {
  if (kind != OptimizerKind::kAdam && kind != OptimizerKind::kAdamW &&
      kind != OptimizerKind::kSgd) {
    return InvalidArgument("optimizer config: unknown kind " +
                           std::to_string(static_cast<int>(kind)));
  }
  // `!(x >= 0)` rather than `x < 0` so that NaN fails every check.
  if (!std::isfinite(lr) || !(lr >= 0.0f)) return Bad("lr", "must be finite and >= 0", lr);
  if (!(beta1 >= 0.0f && beta1 < 1.0f)) return Bad("beta1", "must be in [0, 1)", beta1);
  if (!(beta2 >= 0.0f && beta2 < 1.0f)) return Bad("beta2", "must be in [0, 1)", beta2);
  if (!std::isfinite(eps) || !(eps > 0.0f)) return Bad("eps", "must be finite and > 0", eps);
  if (!std::isfinite(weight_decay) || !(weight_decay >= 0.0f)) {
    return Bad("weight_decay", "must be finite and >= 0", weight_decay);
  }
  if (!(momentum >= 0.0f && momentum < 1.0f)) return Bad("momentum", "must be in [0, 1)", momentum);
  if (nesterov && !(momentum > 0.0f)) {
    return InvalidArgument("optimizer config: nesterov needs momentum > 0");
  }
  // Decoupled decay multiplies the weights by (1 - lr*weight_decay); past 1 it flips their sign,
  // which is never intended.
  if (kind == OptimizerKind::kAdamW && static_cast<double>(lr) * weight_decay > 1.0) {
    return InvalidArgument("optimizer config: adamw needs lr * weight_decay <= 1, got " + Num(lr) +
                           " * " + Num(weight_decay));
  }
  return Status::Ok();
}

// Encoding, version 1 (little-endian, 39 bytes):
//   0  "ZOPT"          magic
//   4  u16 version     1
//   6  u16 length      of the body that follows, before the CRC (27)
//   8  u8  kind        | f32 lr | f32 beta1 | f32 beta2 | f32 eps | f32 weight_decay
//  29  u8  bias_correction | f32 momentum | u8 nesterov
//  35  u32 crc32c      of bytes [0, 35)
// A later version may append fields; readers reject versions they do not know.
namespace {

constexpr char kMagic[4] = {'Z', 'O', 'P', 'T'};
constexpr uint16_t kVersion = 1;
constexpr uint16_t kBodyLen = 1 + 5 * 4 + 1 + 4 + 1;
constexpr size_t kTotalLen = 8 + kBodyLen + 4;

template <typename T>
void Put(std::vector<std::byte>& out, T v) {
  static_assert(std::endian::native == std::endian::little, "zps assumes a little-endian host");
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

template <typename T>
T Get(std::span<const std::byte> in, size_t& pos) {
  T v;
  std::memcpy(&v, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

}  // namespace

std::vector<std::byte> OptimizerConfig::Serialize() const {
  std::vector<std::byte> out;
  out.reserve(kTotalLen);
  for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
  Put<uint16_t>(out, kVersion);
  Put<uint16_t>(out, kBodyLen);
  Put<uint8_t>(out, static_cast<uint8_t>(kind));
  for (float f : {lr, beta1, beta2, eps, weight_decay}) Put<float>(out, f);
  Put<uint8_t>(out, bias_correction ? 1 : 0);
  Put<float>(out, momentum);
  Put<uint8_t>(out, nesterov ? 1 : 0);
  Put<uint32_t>(out, Crc32c(out));
  return out;
}

Result<OptimizerConfig> OptimizerConfig::Deserialize(std::span<const std::byte> bytes) {
  if (bytes.size() < 8) {
    return InvalidArgument("optimizer config: " + std::to_string(bytes.size()) +
                           " bytes is too short for a header");
  }
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    return InvalidArgument("optimizer config: bad magic (not an optimizer config)");
  }
  size_t pos = 4;
  const auto version = Get<uint16_t>(bytes, pos);
  const auto body_len = Get<uint16_t>(bytes, pos);
  if (version != kVersion) {
    return InvalidArgument("optimizer config: unsupported version " + std::to_string(version) +
                           " (this build reads version " + std::to_string(kVersion) + ")");
  }
  if (body_len != kBodyLen || bytes.size() != kTotalLen) {
    return InvalidArgument("optimizer config: wrong length " + std::to_string(bytes.size()) +
                           " (body " + std::to_string(body_len) + ") for version 1");
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + kTotalLen - 4, 4);
  if (Crc32c(bytes.first(kTotalLen - 4)) != stored_crc) {
    return DataLoss("optimizer config: checksum mismatch");
  }
  OptimizerConfig c;
  const auto kind = Get<uint8_t>(bytes, pos);
  if (kind > static_cast<uint8_t>(OptimizerKind::kSgd)) {
    return InvalidArgument("optimizer config: unknown kind " + std::to_string(kind));
  }
  c.kind = static_cast<OptimizerKind>(kind);
  c.lr = Get<float>(bytes, pos);
  c.beta1 = Get<float>(bytes, pos);
  c.beta2 = Get<float>(bytes, pos);
  c.eps = Get<float>(bytes, pos);
  c.weight_decay = Get<float>(bytes, pos);
  const auto bias = Get<uint8_t>(bytes, pos);
  c.momentum = Get<float>(bytes, pos);
  const auto nesterov = Get<uint8_t>(bytes, pos);
  if (bias > 1 || nesterov > 1) return InvalidArgument("optimizer config: bad boolean field");
  c.bias_correction = bias == 1;
  c.nesterov = nesterov == 1;
  ZPS_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace zps::server
