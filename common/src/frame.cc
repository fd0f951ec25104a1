#include "zps/common/frame.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "zps/common/bytes.h"
#include "zps/common/crc32c.h"
#include "zps/common/logging.h"

namespace zps {
namespace {

constexpr FrameError kAllFrameErrors[] = {FrameError::kBadMagic, FrameError::kBadVersion,
                                          FrameError::kOversize, FrameError::kTruncated,
                                          FrameError::kBadCrc,   FrameError::kUnknownType};

template <typename T>
T LoadLe(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian host (static_assert in bytes.h)
  return v;
}
template <typename T>
void StoreLe(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

Code FrameErrorCode(FrameError e) {
  switch (e) {
    case FrameError::kBadMagic:
      return Code::kInvalidArgument;
    case FrameError::kBadVersion:
      return Code::kFailedPrecondition;
    case FrameError::kOversize:
      return Code::kResourceExhausted;
    case FrameError::kTruncated:
      return Code::kInvalidArgument;
    case FrameError::kBadCrc:
      return Code::kDataLoss;
    case FrameError::kUnknownType:
      return Code::kUnimplemented;
  }
  return Code::kInternal;
}

}  // namespace

std::string_view FrameErrorName(FrameError e) {
  switch (e) {
    case FrameError::kBadMagic:
      return "bad_magic";
    case FrameError::kBadVersion:
      return "bad_version";
    case FrameError::kOversize:
      return "oversize";
    case FrameError::kTruncated:
      return "truncated";
    case FrameError::kBadCrc:
      return "bad_crc";
    case FrameError::kUnknownType:
      return "unknown_type";
  }
  return "unknown";
}

Status FrameErrorStatus(FrameError e, std::string_view detail) {
  std::string msg(FrameErrorName(e));
  msg += ": ";
  msg += detail;
  return Status(FrameErrorCode(e), std::move(msg));
}

std::optional<FrameError> FrameErrorOf(const Status& s) {
  if (s.ok()) return std::nullopt;
  for (FrameError e : kAllFrameErrors) {
    std::string_view name = FrameErrorName(e);
    const std::string& m = s.message();
    if (s.code() == FrameErrorCode(e) && m.size() > name.size() + 1 &&
        m.compare(0, name.size(), name) == 0 && m[name.size()] == ':') {
      return e;
    }
  }
  return std::nullopt;
}

std::array<std::byte, kFrameHeaderBytes> EncodeFrameHeader(uint16_t type, uint64_t request_id,
                                                           std::span<const std::byte> payload) {
  ZPS_CHECK(payload.size() <= kMaxPayloadBytes);
  std::array<std::byte, kFrameHeaderBytes> h{};
  StoreLe<uint32_t>(h.data() + 0, kFrameMagic);
  StoreLe<uint16_t>(h.data() + 4, kProtocolVersion);
  StoreLe<uint16_t>(h.data() + 6, type);
  StoreLe<uint64_t>(h.data() + 8, request_id);
  StoreLe<uint32_t>(h.data() + 16, static_cast<uint32_t>(payload.size()));
  StoreLe<uint32_t>(h.data() + 20, 0);  // flags
  StoreLe<uint32_t>(h.data() + 24, 0);  // reserved
  uint32_t crc = Crc32cExtend(0, std::span<const std::byte>(h.data(), kFrameCrcOffset));
  crc = Crc32cExtend(crc, payload);
  StoreLe<uint32_t>(h.data() + kFrameCrcOffset, crc);
  return h;
}

std::vector<std::byte> EncodeFrame(uint16_t type, uint64_t request_id,
                                   std::span<const std::byte> payload) {
  auto h = EncodeFrameHeader(type, request_id, payload);
  std::vector<std::byte> out(kFrameHeaderBytes + payload.size());
  std::memcpy(out.data(), h.data(), kFrameHeaderBytes);
  if (!payload.empty()) std::memcpy(out.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return out;
}

Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes, uint32_t max_payload) {
  if (bytes.size() < kFrameHeaderBytes) {
    return FrameErrorStatus(FrameError::kTruncated, "header has " + std::to_string(bytes.size()) +
                                                        " of " + std::to_string(kFrameHeaderBytes) +
                                                        " bytes");
  }
  const std::byte* p = bytes.data();
  uint32_t magic = LoadLe<uint32_t>(p + 0);
  if (magic != kFrameMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    return FrameErrorStatus(FrameError::kBadMagic, std::string("magic ") + hex + " is not 'ZPS1'");
  }
  FrameHeader h;
  h.version = LoadLe<uint16_t>(p + 4);
  if (h.version != kProtocolVersion) {
    return FrameErrorStatus(FrameError::kBadVersion,
                            "protocol version " + std::to_string(h.version) +
                                ", this build speaks " + std::to_string(kProtocolVersion));
  }
  h.type = LoadLe<uint16_t>(p + 6);
  h.request_id = LoadLe<uint64_t>(p + 8);
  h.payload_len = LoadLe<uint32_t>(p + 16);
  h.flags = LoadLe<uint32_t>(p + 20);
  h.crc32c = LoadLe<uint32_t>(p + kFrameCrcOffset);
  uint32_t bound = max_payload < kMaxPayloadBytes ? max_payload : kMaxPayloadBytes;
  if (h.payload_len > bound) {
    return FrameErrorStatus(FrameError::kOversize,
                            "payload length " + std::to_string(h.payload_len) +
                                " exceeds the bound " + std::to_string(bound));
  }
  return h;
}

Status VerifyFrameCrc(std::span<const std::byte> header_bytes, std::span<const std::byte> payload) {
  if (header_bytes.size() < kFrameHeaderBytes) {
    return FrameErrorStatus(FrameError::kTruncated, "header shorter than 32 bytes");
  }
  uint32_t len = LoadLe<uint32_t>(header_bytes.data() + 16);
  if (payload.size() != len) {
    return FrameErrorStatus(
        FrameError::kTruncated,
        "payload has " + std::to_string(payload.size()) + " of " + std::to_string(len) + " bytes");
  }
  uint32_t want = LoadLe<uint32_t>(header_bytes.data() + kFrameCrcOffset);
  uint32_t got = Crc32cExtend(0, header_bytes.first(kFrameCrcOffset));
  got = Crc32cExtend(got, payload);
  if (got != want) {
    return FrameErrorStatus(FrameError::kBadCrc, "crc32c mismatch (frame says " +
                                                     std::to_string(want) + ", computed " +
                                                     std::to_string(got) + ")");
  }
  return Status::Ok();
}

Result<FrameView> DecodeFrame(std::span<const std::byte> bytes, uint32_t max_payload) {
  ZPS_ASSIGN_OR_RETURN(FrameHeader h, DecodeFrameHeader(bytes, max_payload));
  if (bytes.size() - kFrameHeaderBytes < h.payload_len) {
    return FrameErrorStatus(FrameError::kTruncated,
                            "payload has " + std::to_string(bytes.size() - kFrameHeaderBytes) +
                                " of " + std::to_string(h.payload_len) + " bytes");
  }
  FrameView v{h, bytes.subspan(kFrameHeaderBytes, h.payload_len)};
  ZPS_RETURN_IF_ERROR(VerifyFrameCrc(bytes.first(kFrameHeaderBytes), v.payload));
  return v;
}

std::vector<std::byte> EncodeErrorPayload(const Status& s) {
  ByteWriter w;
  if (s.ok()) {
    w.U32(static_cast<uint32_t>(Code::kInternal));
    w.Str("error reply without an error");
    return w.Take();
  }
  w.U32(static_cast<uint32_t>(s.code()));
  std::string_view msg = s.message();
  if (msg.size() > kMaxErrorMessageBytes) msg = msg.substr(0, kMaxErrorMessageBytes);
  w.Str(msg);
  return w.Take();
}

Status DecodeErrorPayload(std::span<const std::byte> payload) {
  ByteReader r(payload);
  auto code = r.U32("error.code");
  if (!code.ok()) return Internal("malformed error reply: " + code.status().message());
  auto msg = r.Str("error.message", kMaxErrorMessageBytes);
  if (!msg.ok()) return Internal("malformed error reply: " + msg.status().message());
  Status end = r.ExpectEnd("error reply");
  if (!end.ok()) return Internal("malformed error reply: " + end.message());
  if (*code == 0) return Internal("error reply with code 0 (OK): " + *msg);
  return StatusFromCode(*code, std::move(*msg), "error reply");
}

}  // namespace zps
