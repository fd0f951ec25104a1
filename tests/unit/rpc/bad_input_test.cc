// Every bad input at the transport level, sent over a raw socket. After each the server is still
// up and serves a good client; framing errors close the connection; each is counted by kind.
#include <gtest/gtest.h>

#include <cstring>

#include "raw_socket.h"
#include "rpc_fixture.h"
#include "zps/common/crc32c.h"
#include "zps/testing/status_matchers.h"

namespace zps::rpc::testing {
namespace {

class BadInputTest : public RpcTest {
 protected:
  /// A raw connection that completed a valid hello.
  std::unique_ptr<RawSocket> AuthedRaw() {
    auto s = std::make_unique<RawSocket>(server_->port());
    EXPECT_GE(s->fd(), 0);
    EXPECT_TRUE(s->Send(EncodeFrame(kTypeHello, 1, HelloPayload(kToken))));
    auto f = s->ReadFrame(2s);
    EXPECT_TRUE(f.has_value());
    if (f) {
      auto v = DecodeFrame(*f);
      EXPECT_THAT(v, IsOk());
      if (v.ok()) {
        EXPECT_EQ(v->header.type, kTypeHelloReply);
      }
    }
    return s;
  }

  /// Reads the next frame, expects an Error frame for `id` with `code`; returns its message.
  std::string ExpectErrorFrame(RawSocket& s, Code code, std::optional<uint64_t> id = std::nullopt) {
    auto f = s.ReadFrame(2s);
    EXPECT_TRUE(f.has_value()) << "no error frame";
    if (!f) return {};
    auto v = DecodeFrame(*f);
    EXPECT_THAT(v, IsOk());
    if (!v.ok()) return {};
    EXPECT_EQ(v->header.type, kTypeError);
    if (id) {
      EXPECT_EQ(v->header.request_id, *id);
    }
    Status st = DecodeErrorPayload(v->payload);
    EXPECT_EQ(st.code(), code) << st.ToString();
    return st.message();
  }

  void ExpectClosedAndHealthy(RawSocket& s, const std::string& kind) {
    EXPECT_TRUE(s.WaitClosed(2s)) << "server kept the connection open after " << kind;
    EXPECT_TRUE(WaitError(kind)) << "no protocol error of kind " << kind;
    ExpectServerHealthy();
  }
};

std::vector<std::byte> WithCrcFixed(std::vector<std::byte> f) {
  uint32_t crc = Crc32cExtend(Crc32c(f.data(), 28), std::span(f).subspan(32));
  std::memcpy(f.data() + 28, &crc, 4);
  return f;
}

TEST_F(BadInputTest, GarbageBytes) {
  RawSocket s(server_->port());
  std::string junk = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
  for (int i = 0; i < 200; ++i) junk.push_back(static_cast<char>((i * 7919) & 0xff));
  ASSERT_TRUE(s.Send(Bytes(junk)));
  ExpectErrorFrame(s, Code::kInvalidArgument, 0);
  ExpectClosedAndHealthy(s, "bad_magic");
}

TEST_F(BadInputTest, WrongMagic) {
  RawSocket s(server_->port());
  auto f = EncodeFrame(kTypeHello, 5, HelloPayload(kToken));
  std::memcpy(f.data(), "ZPS2", 4);
  ASSERT_TRUE(s.Send(WithCrcFixed(f)));
  ExpectClosedAndHealthy(s, "bad_magic");
}

TEST_F(BadInputTest, WrongHeaderVersion) {
  RawSocket s(server_->port());
  auto f = EncodeFrame(kTypeHello, 5, HelloPayload(kToken));
  uint16_t v2 = kProtocolVersion + 1;
  std::memcpy(f.data() + 4, &v2, 2);
  ASSERT_TRUE(s.Send(WithCrcFixed(f)));
  auto msg = ExpectErrorFrame(s, Code::kFailedPrecondition, 5);  // the request id is echoed
  EXPECT_NE(msg.find("version"), std::string::npos) << msg;
  ExpectClosedAndHealthy(s, "bad_version");
}

TEST_F(BadInputTest, WrongHelloVersion) {
  RawSocket s(server_->port());
  ASSERT_TRUE(s.Send(EncodeFrame(kTypeHello, 6, HelloPayload(kToken, kProtocolVersion + 1))));
  ExpectErrorFrame(s, Code::kFailedPrecondition, 6);
  ExpectClosedAndHealthy(s, "bad_version");
}

TEST_F(BadInputTest, LengthOverTheBoundBeforeHello) {
  RawSocket s(server_->port());
  auto f = EncodeFrame(kTypeHello, 1, {});
  uint32_t len = kMaxHelloPayloadBytes + 1;  // an unauthenticated peer gets the tight bound
  std::memcpy(f.data() + 16, &len, 4);
  ASSERT_TRUE(s.Send(f));  // the header only: the server must not wait for the payload
  ExpectErrorFrame(s, Code::kResourceExhausted);
  ExpectClosedAndHealthy(s, "oversize");
}

TEST_F(BadInputTest, LengthOverTheHardBoundAfterHello) {
  auto s = AuthedRaw();
  auto f = EncodeFrame(kEcho, 2, {});
  uint32_t len = 0xFFFFFFFFu;
  std::memcpy(f.data() + 16, &len, 4);
  ASSERT_TRUE(s->Send(f));
  ExpectErrorFrame(*s, Code::kResourceExhausted, 2);
  ExpectClosedAndHealthy(*s, "oversize");
}

TEST_F(BadInputTest, TruncatedPayload) {
  auto s = AuthedRaw();
  auto f = EncodeFrame(kEcho, 2, Bytes(std::string(100, 'p')));
  ASSERT_TRUE(s->Send(std::span(f).first(32 + 10)));
  s->ShutdownWrite();
  ExpectClosedAndHealthy(*s, "truncated");
}

TEST_F(BadInputTest, TruncatedHeader) {
  RawSocket s(server_->port());
  auto f = EncodeFrame(kTypeHello, 1, HelloPayload(kToken));
  ASSERT_TRUE(s.Send(std::span(f).first(10)));
  s.ShutdownWrite();
  ExpectClosedAndHealthy(s, "truncated");
}

TEST_F(BadInputTest, BadCrc) {
  auto s = AuthedRaw();
  auto f = EncodeFrame(kEcho, 3, Bytes("payload"));
  f.back() ^= std::byte{0x40};
  ASSERT_TRUE(s->Send(f));
  ExpectErrorFrame(*s, Code::kDataLoss, 3);
  ExpectClosedAndHealthy(*s, "bad_crc");
}

TEST_F(BadInputTest, BadCrcOnHello) {
  RawSocket s(server_->port());
  auto f = EncodeFrame(kTypeHello, 1, HelloPayload(kToken));
  f[30] ^= std::byte{1};
  ASSERT_TRUE(s.Send(f));
  ExpectClosedAndHealthy(s, "bad_crc");
}

TEST_F(BadInputTest, UnknownTypeKeepsTheConnection) {
  auto s = AuthedRaw();
  ASSERT_TRUE(s->Send(EncodeFrame(0x7ABC, 4, Bytes("?"))));
  ExpectErrorFrame(*s, Code::kUnimplemented, 4);
  // A reply type sent as a request is unknown too.
  ASSERT_TRUE(s->Send(EncodeFrame(ReplyTypeOf(kEcho), 5, {})));
  ExpectErrorFrame(*s, Code::kUnimplemented, 5);
  EXPECT_TRUE(WaitError("unknown_type", 2));
  // Still open and serving.
  ASSERT_TRUE(s->Send(EncodeFrame(kEcho, 6, Bytes("still here"))));
  auto f = s->ReadFrame(2s);
  ASSERT_TRUE(f.has_value());
  auto v = DecodeFrame(*f);
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(v->header.type, ReplyTypeOf(kEcho));
  EXPECT_EQ(v->header.request_id, 6u);
  EXPECT_EQ(Str(v->payload), "still here");
  // The real client sees the same.
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->Call(0x1234, {}, 2s).status().code(), Code::kUnimplemented);
  EXPECT_TRUE(c->connected());
}

TEST_F(BadInputTest, SecondHelloIsRefusedButKeepsTheConnection) {
  auto s = AuthedRaw();
  ASSERT_TRUE(s->Send(EncodeFrame(kTypeHello, 9, HelloPayload(kToken))));
  ExpectErrorFrame(*s, Code::kFailedPrecondition, 9);
  ASSERT_TRUE(s->Send(EncodeFrame(kEcho, 10, Bytes("x"))));
  auto f = s->ReadFrame(2s);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(DecodeFrame(*f)->header.type, ReplyTypeOf(kEcho));
}

TEST_F(BadInputTest, WrongToken) {
  RawSocket s(server_->port());
  ASSERT_TRUE(s.Send(EncodeFrame(kTypeHello, 1, HelloPayload("s3cret-tokeN"))));
  auto msg = ExpectErrorFrame(s, Code::kUnauthenticated, 1);
  EXPECT_EQ(msg.find(kToken), std::string::npos) << "the error must not echo the token";
  ExpectClosedAndHealthy(s, "unauthenticated");
  RawSocket empty(server_->port());
  ASSERT_TRUE(empty.Send(EncodeFrame(kTypeHello, 1, HelloPayload(""))));
  ExpectErrorFrame(empty, Code::kUnauthenticated, 1);
  EXPECT_TRUE(empty.WaitClosed(2s));
}

TEST_F(BadInputTest, FrameBeforeHello) {
  RawSocket s(server_->port());
  ASSERT_TRUE(s.Send(EncodeFrame(kEcho, 8, Bytes("let me in"))));
  ExpectErrorFrame(s, Code::kUnauthenticated, 8);
  ExpectClosedAndHealthy(s, "unauthenticated");
}

TEST_F(BadInputTest, MalformedHello) {
  RawSocket s(server_->port());
  auto p = HelloPayload(kToken);
  p.resize(p.size() - 2);  // cut inside the extra blob length
  ASSERT_TRUE(s.Send(EncodeFrame(kTypeHello, 1, p)));
  ExpectErrorFrame(s, Code::kInvalidArgument, 1);
  ExpectClosedAndHealthy(s, "invalid_argument");
  // A name length that claims more than the bound.
  RawSocket s2(server_->port());
  ByteWriter w;
  w.U16(kProtocolVersion);
  w.U32(0);
  w.U32(0);
  w.U32(0x7FFFFFFF);  // name length
  ASSERT_TRUE(s2.Send(EncodeFrame(kTypeHello, 1, w.Take())));
  ExpectErrorFrame(s2, Code::kInvalidArgument, 1);
  EXPECT_TRUE(s2.WaitClosed(2s));
}

TEST_F(BadInputTest, SilentClientIsClosedAfterHelloTimeout) {
  StartServer(ServerOptions{.hello_timeout_ms = 300});
  RawSocket s(server_->port());
  ASSERT_GE(s.fd(), 0);
  ASSERT_TRUE(WaitConnections(1));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(s.WaitClosed(3s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  EXPECT_TRUE(WaitError("timeout"));
  EXPECT_TRUE(WaitConnections(0));
  ExpectServerHealthy();
}

TEST_F(BadInputTest, HalfAHelloThenSilenceIsClosedToo) {
  StartServer(ServerOptions{.hello_timeout_ms = 300});
  RawSocket s(server_->port());
  auto f = EncodeFrame(kTypeHello, 1, HelloPayload(kToken));
  ASSERT_TRUE(s.Send(std::span(f).first(40)));  // header + part of the payload, then nothing
  EXPECT_TRUE(s.WaitClosed(3s));
  EXPECT_TRUE(WaitError("timeout"));
  ExpectServerHealthy();
}

TEST_F(BadInputTest, ManyBadConnectionsInARow) {
  StartServer(ServerOptions{.io_threads = 2});
  for (int i = 0; i < 100; ++i) {
    RawSocket s(server_->port());
    ASSERT_GE(s.fd(), 0);
    auto f = EncodeFrame(kTypeHello, 1, HelloPayload(i % 2 ? "wrong" : kToken));
    if (i % 3 == 0) f[i % 32] ^= std::byte{0xFF};
    (void)s.Send(f);
  }
  ExpectServerHealthy();
  EXPECT_TRUE(WaitConnections(0, 5s));
}

}  // namespace
}  // namespace zps::rpc::testing
