// Internal to zps::rpc: the hello codec and helpers shared by rpc_server.cc and rpc_client.cc.
// No Asio here either, so rpc_wire.cc compiles fast and is unit-testable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/rpc.h"
#include "zps/common/status.h"

namespace zps::rpc::internal {

/// Hello request payload: {version u16, role u32, rank u32, name str, token str, extra blob}.
struct HelloRequest {
  uint16_t version = 0;
  PeerRole role = PeerRole::kUnspecified;
  uint32_t rank = 0;
  std::string name;
  std::string token;
  std::span<const std::byte> extra;  // view into the decoded payload
};
std::vector<std::byte> EncodeHello(uint16_t version, PeerRole role, uint32_t rank,
                                   std::string_view name, std::string_view token,
                                   std::span<const std::byte> extra);
/// Errors: InvalidArgument (truncated, a field over its bound, trailing bytes).
Result<HelloRequest> DecodeHello(std::span<const std::byte> payload);

/// Hello reply payload: {session_id u64, session_token u64, extra blob}.
struct HelloReply {
  uint64_t session_id = 0;
  uint64_t session_token = 0;
  std::vector<std::byte> extra;
};
std::vector<std::byte> EncodeHelloReply(uint64_t session_id, uint64_t session_token,
                                        std::span<const std::byte> extra);
/// Errors: InvalidArgument.
Result<HelloReply> DecodeHelloReply(std::span<const std::byte> payload);

/// Equality whose running time depends only on the lengths, not on where the bytes differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

/// A random 64-bit value from the OS (getrandom via std::random_device); never 0.
uint64_t RandomU64();

}  // namespace zps::rpc::internal
