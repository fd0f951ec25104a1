// Pure frame codec tests: no sockets.
#include "zps/common/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "rpc_internal.h"
#include "zps/common/bytes.h"
#include "zps/common/crc32c.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

TEST(Frame, LayoutIsThe32ByteHeaderOfTheSpec) {
  auto payload = Bytes("hello");
  auto f = EncodeFrame(42, 0x0102030405060708ull, payload);
  ASSERT_EQ(f.size(), 32u + 5u);
  // magic 'Z','P','S','1'
  EXPECT_EQ(std::memcmp(f.data(), "ZPS1", 4), 0);
  uint16_t version, type;
  uint64_t id;
  uint32_t len, flags, reserved, crc;
  std::memcpy(&version, f.data() + 4, 2);
  std::memcpy(&type, f.data() + 6, 2);
  std::memcpy(&id, f.data() + 8, 8);
  std::memcpy(&len, f.data() + 16, 4);
  std::memcpy(&flags, f.data() + 20, 4);
  std::memcpy(&reserved, f.data() + 24, 4);
  std::memcpy(&crc, f.data() + 28, 4);
  EXPECT_EQ(version, kProtocolVersion);
  EXPECT_EQ(type, 42);
  EXPECT_EQ(id, 0x0102030405060708ull);
  EXPECT_EQ(len, 5u);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(reserved, 0u);
  EXPECT_EQ(crc, Crc32cExtend(Crc32c(f.data(), 28), payload));
}

TEST(Frame, RoundTrip) {
  auto payload = Bytes("some payload bytes");
  auto f = EncodeFrame(7, 99, payload);
  auto v = DecodeFrame(f);
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->header.type, 7);
  EXPECT_EQ(v->header.request_id, 99u);
  EXPECT_EQ(v->header.payload_len, payload.size());
  EXPECT_TRUE(std::equal(v->payload.begin(), v->payload.end(), payload.begin(), payload.end()));
  auto empty = EncodeFrame(7, 1, {});
  EXPECT_THAT(DecodeFrame(empty), IsOk());
}

void ExpectKind(const Status& s, FrameError kind) {
  ASSERT_FALSE(s.ok());
  auto k = FrameErrorOf(s);
  ASSERT_TRUE(k.has_value()) << s.ToString();
  EXPECT_EQ(*k, kind) << s.ToString();
}

TEST(Frame, EveryErrorKindIsDetected) {
  auto good = EncodeFrame(7, 1, Bytes("abcdef"));

  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  ExpectKind(DecodeFrame(bad_magic).status(), FrameError::kBadMagic);

  auto bad_version = good;
  bad_version[4] = static_cast<std::byte>(kProtocolVersion + 1);
  ExpectKind(DecodeFrame(bad_version).status(), FrameError::kBadVersion);
  EXPECT_EQ(DecodeFrame(bad_version).status().code(), Code::kFailedPrecondition);

  auto oversize = good;
  uint32_t big = kMaxPayloadBytes + 1;
  std::memcpy(oversize.data() + 16, &big, 4);
  ExpectKind(DecodeFrameHeader(oversize).status(), FrameError::kOversize);
  // A tighter receiver bound applies too.
  ExpectKind(DecodeFrame(good, 5).status(), FrameError::kOversize);
  EXPECT_THAT(DecodeFrame(good, 6), IsOk());

  ExpectKind(DecodeFrame(std::span(good).first(20)).status(), FrameError::kTruncated);
  ExpectKind(DecodeFrame(std::span(good).first(good.size() - 1)).status(), FrameError::kTruncated);

  auto bad_crc = good;
  bad_crc.back() ^= std::byte{1};
  ExpectKind(DecodeFrame(bad_crc).status(), FrameError::kBadCrc);
  EXPECT_EQ(DecodeFrame(bad_crc).status().code(), Code::kDataLoss);
  auto bad_hdr_crc = good;
  bad_hdr_crc[9] ^= std::byte{1};  // request id is covered too
  ExpectKind(DecodeFrame(bad_hdr_crc).status(), FrameError::kBadCrc);
}

TEST(Frame, ErrorNamesAndKindRecovery) {
  EXPECT_EQ(FrameErrorName(FrameError::kBadMagic), "bad_magic");
  EXPECT_EQ(FrameErrorName(FrameError::kBadVersion), "bad_version");
  EXPECT_EQ(FrameErrorName(FrameError::kOversize), "oversize");
  EXPECT_EQ(FrameErrorName(FrameError::kTruncated), "truncated");
  EXPECT_EQ(FrameErrorName(FrameError::kBadCrc), "bad_crc");
  EXPECT_EQ(FrameErrorName(FrameError::kUnknownType), "unknown_type");
  EXPECT_EQ(FrameErrorOf(FrameErrorStatus(FrameError::kUnknownType, "x")),
            FrameError::kUnknownType);
  EXPECT_FALSE(FrameErrorOf(InvalidArgument("bad_magic without colon")).has_value());
  EXPECT_FALSE(FrameErrorOf(Status::Ok()).has_value());
  EXPECT_FALSE(FrameErrorOf(Internal("bad_crc: wrong code")).has_value());
}

TEST(Frame, TypeNumbering) {
  EXPECT_TRUE(IsRequestType(1));
  EXPECT_TRUE(IsRequestType(0x7FFF));
  EXPECT_FALSE(IsRequestType(0));
  EXPECT_FALSE(IsRequestType(0x8001));
  EXPECT_FALSE(IsRequestType(kTypeError));
  EXPECT_EQ(ReplyTypeOf(0x10), 0x8010);
  EXPECT_EQ(kTypeHelloReply, 0x8001);
}

TEST(Frame, ErrorPayloadRoundTrip) {
  Status s = NotFound("param 17 does not exist");
  Status back = DecodeErrorPayload(EncodeErrorPayload(s));
  EXPECT_EQ(back, s);
  EXPECT_EQ(DecodeErrorPayload(EncodeErrorPayload(Status::Ok())).code(), Code::kInternal);
  // Long messages are cut, not rejected.
  Status longmsg = Internal(std::string(10000, 'x'));
  EXPECT_EQ(DecodeErrorPayload(EncodeErrorPayload(longmsg)).message().size(),
            kMaxErrorMessageBytes);
  // Malformed: truncated, unknown code, trailing bytes.
  EXPECT_EQ(DecodeErrorPayload(Bytes("ab")).code(), Code::kInternal);
  ByteWriter w;
  w.U32(999);
  w.Str("m");
  EXPECT_EQ(DecodeErrorPayload(w.Take()).code(), Code::kInternal);
  auto p = EncodeErrorPayload(s);
  p.push_back(std::byte{0});
  EXPECT_EQ(DecodeErrorPayload(p).code(), Code::kInternal);
}

TEST(Hello, CodecAndBounds) {
  using namespace rpc::internal;
  auto extra = Bytes("ucx-address");
  auto p = EncodeHello(kProtocolVersion, rpc::PeerRole::kShard, 5, "worker-5", "tok", extra);
  auto h = DecodeHello(p);
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(h->version, kProtocolVersion);
  EXPECT_EQ(h->role, rpc::PeerRole::kShard);
  EXPECT_EQ(h->rank, 5u);
  EXPECT_EQ(h->name, "worker-5");
  EXPECT_EQ(h->token, "tok");
  EXPECT_EQ(h->extra.size(), extra.size());
  EXPECT_FALSE(DecodeHello(std::span(p).first(p.size() - 1)).ok());
  auto long_token = EncodeHello(kProtocolVersion, rpc::PeerRole::kUnspecified, 0, "n",
                                std::string(rpc::kMaxTokenBytes + 1, 't'), {});
  EXPECT_EQ(DecodeHello(long_token).status().code(), Code::kInvalidArgument);
  auto r = EncodeHelloReply(1, 2, extra);
  auto hr = DecodeHelloReply(r);
  ASSERT_THAT(hr, IsOk());
  EXPECT_EQ(hr->session_id, 1u);
  EXPECT_EQ(hr->session_token, 2u);
  EXPECT_EQ(hr->extra, extra);
}

TEST(Hello, RoleIsANamedEnum) {
  using namespace rpc::internal;
  // The role is the hello's second field (after the u16 version): any value outside PeerRole is
  // refused at decode, so no handler ever sees a role it does not know.
  auto p = EncodeHello(kProtocolVersion, rpc::PeerRole::kTool, 0, "n", "t", {});
  auto h = DecodeHello(p);
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(h->role, rpc::PeerRole::kTool);
  EXPECT_EQ(rpc::PeerRoleName(h->role), "tool");
  p[2] = std::byte{7};  // little-endian u32 role = 7
  EXPECT_THAT(DecodeHello(p), StatusIs(Code::kInvalidArgument, ::testing::HasSubstr("not a role")));
  EXPECT_THAT(rpc::PeerRoleFromWire(4), StatusIs(Code::kInvalidArgument));
  for (uint32_t v = 0; v <= 3; ++v) {
    ASSERT_THAT(rpc::PeerRoleFromWire(v), IsOk());
    EXPECT_EQ(static_cast<uint32_t>(*rpc::PeerRoleFromWire(v)), v);
  }
}

TEST(Hello, ConstantTimeEquals) {
  using rpc::internal::ConstantTimeEquals;
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0", 2), "a"));
  EXPECT_NE(rpc::internal::RandomU64(), 0u);
}

}  // namespace
}  // namespace zps

using zps::IsOk;

TEST(Messages, ReadMasterRoundTripAndBounds) {
  zps::msg::ReadMasterRequest q{7, 3, 64, 128};
  auto back = zps::msg::ReadMasterRequest::Decode(q.Encode());
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->min_version, 7);
  EXPECT_EQ(back->chunk, 3u);
  EXPECT_EQ(back->offset, 64u);
  EXPECT_EQ(back->length, 128u);
  q.length = zps::msg::kMaxReadMaster + 1;
  EXPECT_EQ(zps::msg::ReadMasterRequest::Decode(q.Encode()).status().code(),
            zps::Code::kInvalidArgument);
  auto bytes = q.Encode();
  bytes.pop_back();
  EXPECT_FALSE(zps::msg::ReadMasterRequest::Decode(bytes).ok());

  zps::msg::MasterRange m{5, {1.5f, -2.0f, 3.25f}};
  auto r = zps::msg::MasterRange::Decode(m.Encode());
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->version, 5);
  EXPECT_EQ(r->values, m.values);
  auto odd = m.Encode();
  odd[8] = std::byte{11};  // a blob length that is not a multiple of 4
  EXPECT_FALSE(zps::msg::MasterRange::Decode(odd).ok());
}
