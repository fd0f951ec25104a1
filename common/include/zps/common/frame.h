// zps/common/frame.h — the control-plane frame: a fixed 32-byte header followed by a payload.
//
// Layout (all fields little-endian; see docs/protocol.md for the full specification):
//
//   offset  size  field        meaning
//   0       4     magic        bytes 'Z' 'P' 'S' '1' (u32 0x3153505A)
//   4       2     version      kProtocolVersion
//   6       2     type         message type (requests < 0x8000, reply = request | 0x8000)
//   8       8     request_id   chosen by the requester, echoed in the reply
//   16      4     payload_len  bytes after the header, <= kMaxPayloadBytes
//   20      4     flags        0 (reserved; receivers of version 1 ignore it)
//   24      4     reserved     0 (reserved; receivers of version 1 ignore it)
//   28      4     crc32c       CRC32C over header bytes [0, 28) followed by the payload
//
// Validation order on receipt: magic, version, payload_len bound (all from the header alone, before
// any payload byte is read or any buffer is allocated), then the CRC once the payload is in.
//
// Every failed check is a Status whose FrameError kind can be recovered with FrameErrorOf(); the
// kind names feed the metric zps_protocol_errors_total{kind}.
//
// Thread-safety: pure functions over caller-owned buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "zps/common/status.h"

namespace zps {

/// 'Z','P','S','1' read as a little-endian u32.
inline constexpr uint32_t kFrameMagic = 0x3153505Au;
// 3: kAmServingNotice; 4: FetchRmaReplyHeader::bank_delta (docs/protocol.md)
inline constexpr uint16_t kProtocolVersion = 4;
inline constexpr size_t kFrameHeaderBytes = 32;
/// Hard upper bound on payload_len. A header announcing more is rejected before anything else is
/// read from the stream.
inline constexpr uint32_t kMaxPayloadBytes = 16u << 20;
/// Byte offset of the crc32c field; the CRC covers the header bytes before it.
inline constexpr size_t kFrameCrcOffset = 28;

// ---- message type numbering ----
/// Bit set on every reply type: reply type = request type | kReplyBit.
inline constexpr uint16_t kReplyBit = 0x8000;
/// Error reply (any request may get it instead of its normal reply). Payload: EncodeErrorPayload.
inline constexpr uint16_t kTypeError = 0xFFFF;
/// Handshake. Handled inside zps::rpc; see rpc.h and docs/protocol.md.
inline constexpr uint16_t kTypeHello = 1;
inline constexpr uint16_t kTypeHelloReply = kTypeHello | kReplyBit;

inline constexpr bool IsRequestType(uint16_t type) { return type != 0 && (type & kReplyBit) == 0; }
inline constexpr uint16_t ReplyTypeOf(uint16_t request_type) {
  return static_cast<uint16_t>(request_type | kReplyBit);
}

/// Framing failure kinds. Stable; the names are metric label values.
enum class FrameError {
  kBadMagic,     ///< first 4 bytes are not 'ZPS1' (garbage, or another protocol)
  kBadVersion,   ///< header version != kProtocolVersion
  kOversize,     ///< payload_len over the bound in force
  kTruncated,    ///< the stream ended (or the buffer is shorter) inside a frame
  kBadCrc,       ///< CRC32C mismatch
  kUnknownType,  ///< no handler for this type (the connection survives this one)
};

/// "bad_magic", "bad_version", "oversize", "truncated", "bad_crc", "unknown_type".
std::string_view FrameErrorName(FrameError e);

/// The Status for a framing failure. Its message starts with "<kind name>: ". Codes:
/// bad_magic/truncated → InvalidArgument, bad_version → FailedPrecondition, oversize →
/// ResourceExhausted, bad_crc → DataLoss, unknown_type → Unimplemented.
Status FrameErrorStatus(FrameError e, std::string_view detail);
/// The FrameError kind of a Status built by FrameErrorStatus (or by the functions below);
/// nullopt for any other Status (including OK).
std::optional<FrameError> FrameErrorOf(const Status& s);

/// A decoded header. Only produced by DecodeFrameHeader, so its fields have passed the checks.
struct FrameHeader {
  uint16_t version = kProtocolVersion;
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint32_t payload_len = 0;
  uint32_t flags = 0;
  uint32_t crc32c = 0;
};

/// Encodes the 32-byte header for `payload`, CRC included. Precondition: payload.size() <=
/// kMaxPayloadBytes (checked; larger is a broken invariant of the caller — check first).
std::array<std::byte, kFrameHeaderBytes> EncodeFrameHeader(uint16_t type, uint64_t request_id,
                                                           std::span<const std::byte> payload);
/// Header followed by payload in one buffer. Same precondition as EncodeFrameHeader.
std::vector<std::byte> EncodeFrame(uint16_t type, uint64_t request_id,
                                   std::span<const std::byte> payload);

/// Decodes and validates a header from the first kFrameHeaderBytes of `bytes`.
/// `max_payload` lets a receiver apply a tighter bound (e.g. before the handshake); it is
/// clamped to kMaxPayloadBytes.
/// Errors (FrameErrorOf gives the kind): truncated (fewer than 32 bytes), bad_magic, bad_version,
/// oversize. Does not check the CRC (the payload is not there yet): use VerifyFrameCrc.
Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes,
                                      uint32_t max_payload = kMaxPayloadBytes);

/// Checks the CRC of a frame: `header_bytes` are the 32 raw header bytes as received, `payload`
/// the payload_len bytes that followed. Errors: truncated (sizes do not match the header),
/// bad_crc.
Status VerifyFrameCrc(std::span<const std::byte> header_bytes, std::span<const std::byte> payload);

/// A whole frame decoded from a contiguous buffer (a view into it).
struct FrameView {
  FrameHeader header;
  std::span<const std::byte> payload;
};
/// Decodes one complete frame at the start of `bytes` (trailing bytes are ignored; the frame's
/// size is kFrameHeaderBytes + header.payload_len). Errors: any of DecodeFrameHeader's, truncated,
/// bad_crc.
Result<FrameView> DecodeFrame(std::span<const std::byte> bytes,
                              uint32_t max_payload = kMaxPayloadBytes);

// ---- error replies (type kTypeError) ----
/// Longest error message carried on the wire; longer messages are cut on encode.
inline constexpr size_t kMaxErrorMessageBytes = 4096;
/// Payload {code u32 (zps::Code), message str}. `s` should be non-OK; an OK status is sent as
/// Internal "error reply without an error".
std::vector<std::byte> EncodeErrorPayload(const Status& s);
/// The Status carried by an error payload: always non-OK. A malformed payload, or a code of 0 or
/// one unknown to this build, gives Internal naming the problem.
Status DecodeErrorPayload(std::span<const std::byte> payload);

}  // namespace zps
