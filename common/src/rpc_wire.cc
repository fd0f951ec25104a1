#include <random>
#include <string>

#include "rpc_internal.h"
#include "zps/common/bytes.h"
#include "zps/common/frame.h"
#include "zps/common/rpc.h"

namespace zps::rpc {

std::string_view PeerRoleName(PeerRole role) {
  switch (role) {
    case PeerRole::kUnspecified:
      return "unspecified";
    case PeerRole::kWorker:
      return "worker";
    case PeerRole::kShard:
      return "shard";
    case PeerRole::kTool:
      return "tool";
  }
  return "unknown";
}

Result<PeerRole> PeerRoleFromWire(uint32_t value) {
  if (value > static_cast<uint32_t>(PeerRole::kTool)) {
    return InvalidArgument("hello.role: " + std::to_string(value) +
                           " is not a role (0 unspecified, 1 worker, 2 shard, 3 tool)");
  }
  return static_cast<PeerRole>(value);
}

}  // namespace zps::rpc

namespace zps::rpc::internal {

std::vector<std::byte> EncodeHello(uint16_t version, PeerRole role, uint32_t rank,
                                   std::string_view name, std::string_view token,
                                   std::span<const std::byte> extra) {
  ByteWriter w;
  w.U16(version);
  w.U32(static_cast<uint32_t>(role));
  w.U32(rank);
  w.Str(name);
  w.Str(token);
  w.Blob(extra);
  return w.Take();
}

Result<HelloRequest> DecodeHello(std::span<const std::byte> payload) {
  ByteReader r(payload);
  HelloRequest h;
  ZPS_ASSIGN_OR_RETURN(h.version, r.U16("hello.version"));
  ZPS_ASSIGN_OR_RETURN(const uint32_t role, r.U32("hello.role"));
  ZPS_ASSIGN_OR_RETURN(h.role, PeerRoleFromWire(role));
  ZPS_ASSIGN_OR_RETURN(h.rank, r.U32("hello.rank"));
  ZPS_ASSIGN_OR_RETURN(h.name, r.Str("hello.name", kMaxNameBytes));
  ZPS_ASSIGN_OR_RETURN(h.token, r.Str("hello.token", kMaxTokenBytes));
  ZPS_ASSIGN_OR_RETURN(h.extra, r.Blob("hello.extra", kMaxHelloPayloadBytes));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("hello"));
  return h;
}

std::vector<std::byte> EncodeHelloReply(uint64_t session_id, uint64_t session_token,
                                        std::span<const std::byte> extra) {
  ByteWriter w;
  w.U64(session_id);
  w.U64(session_token);
  w.Blob(extra);
  return w.Take();
}

Result<HelloReply> DecodeHelloReply(std::span<const std::byte> payload) {
  ByteReader r(payload);
  HelloReply h;
  ZPS_ASSIGN_OR_RETURN(h.session_id, r.U64("hello_reply.session_id"));
  ZPS_ASSIGN_OR_RETURN(h.session_token, r.U64("hello_reply.session_token"));
  ZPS_ASSIGN_OR_RETURN(auto extra, r.Blob("hello_reply.extra", kMaxPayloadBytes));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("hello reply"));
  h.extra.assign(extra.begin(), extra.end());
  return h;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Walk the longer length so the time does not reveal a common prefix; fold the length
  // difference in so "abc" != "abcd".
  size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

uint64_t RandomU64() {
  thread_local std::random_device rd;  // getrandom(2) on Linux
  for (;;) {
    uint64_t v = (static_cast<uint64_t>(rd()) << 32) | static_cast<uint64_t>(rd());
    if (v != 0) return v;
  }
}

}  // namespace zps::rpc::internal
