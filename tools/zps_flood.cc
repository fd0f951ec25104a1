// zps-flood: sends a stream of malformed control-plane frames, connection floods and malformed
// data-plane active messages at every shard of a running zps job, and reports what it sent and
// how each shard answered (docs/operations.md "Faults: what an operator sees").
//
//   zps-flood --targets 127.0.0.1:7070,127.0.0.1:7071 --token-file token --duration 30
//
// It never sends anything a shard could accept as a parameter write: its data-plane session is
// opened with a worker rank (kFloodRankBase + shard) that no job has, so every push it sends is
// refused before any byte is taken (the contributor check), and it never says hello as a real
// rank (that would replace the rank's session: ForgetRank). Test: tests/integration/load/flood.sh.
//
// Exit status: 0 when every shard answered every case as docs/protocol.md says and still serves
// a Status request at the end; 1 when a shard stopped serving or answered a case otherwise; 2 for
// bad flags.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zps/common/bytes.h"
#include "zps/common/config.h"
#include "zps/common/crc32c.h"
#include "zps/common/frame.h"
#include "zps/common/logging.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/common/status.h"
#include "zps/common/ucx.h"

namespace zps::flood {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The hello rank of the flood's data-plane sessions: far above any world size, so that no push
// of the flood can name a contributor the shard would take.
constexpr uint32_t kFloodRankBase = 1u << 30;

struct FloodOptions {
  std::string targets;     // Default: "" (required). host:port of every shard, comma-separated.
  std::string token;       // Default: "". The job's token (prefer token-file).
  std::string token_file;  // Default: "".
  double duration_s = 0;   // Default: 0 = until SIGTERM/SIGINT.
  int interval_ms = 100;   // Default: 100 ms between rounds, per shard.
  int idle_conns = 8;      // Default: 8 silent connections held open per shard.
  int burst = 16;          // Default: 16 connections opened at once per round, then reset.
  bool data_plane = true;  // Default: true. Malformed active messages over UCX too.
  std::string ucx_tls = "tcp";      // Default: tcp.
  int reply_timeout_ms = 10000;     // Default: 10 s for any answer a case waits for.
  std::string log_level = "error";  // Default: error.
};

// ---- outcomes ---------------------------------------------------------------------------------

// One case's tally on one shard: what was sent, how many answers were the documented one, and
// every other outcome by name.
struct Tally {
  uint64_t sent = 0;
  uint64_t expected = 0;
  std::map<std::string, uint64_t> other;
};

struct CaseInfo {
  const char* name;
  const char* expect;  // the documented answer, for the report
  const char* metric;  // the zps_protocol_errors_total kind it raises ("-": none)
};

enum Case : int {
  kBadMagic,
  kBadVersion,
  kOversize,
  kTruncated,
  kHalfHeader,
  kBadCrc,
  kGarbageHello,
  kWrongToken,
  kBeforeHello,
  kUnknownType,
  kReplyType,
  kGarbageBody,
  kSecondHello,
  kIdle,
  kConnectClose,
  kBurst,
  kAmBadHeader,
  kAmFetchWrongSession,
  kAmPushWrongSession,
  kAmFetchUnknownChunk,
  kAmFetchFutureVersion,
  kAmPushBadLength,
  kAmPushWrongDtype,
  kAmPushForeignRank,
  kNumCases
};

constexpr std::array<CaseInfo, kNumCases> kCases = {{
    {"bad_magic", "Error INVALID_ARGUMENT, closed", "bad_magic"},
    {"bad_version", "Error FAILED_PRECONDITION, closed", "bad_version"},
    {"oversize", "Error RESOURCE_EXHAUSTED, closed", "oversize"},
    {"truncated", "Error INVALID_ARGUMENT or closed", "truncated"},
    {"half_header", "Error INVALID_ARGUMENT or closed", "truncated"},
    {"bad_crc", "Error DATA_LOSS, closed", "bad_crc"},
    {"garbage_hello", "Error INVALID_ARGUMENT, closed", "invalid_argument"},
    {"wrong_token", "Error UNAUTHENTICATED, closed", "unauthenticated"},
    {"before_hello", "Error UNAUTHENTICATED, closed", "unauthenticated"},
    {"unknown_type", "Error UNIMPLEMENTED, stays open", "unknown_type"},
    {"reply_type", "Error UNIMPLEMENTED, stays open", "unknown_type"},
    {"garbage_body", "Error INVALID_ARGUMENT, stays open", "-"},
    {"second_hello", "Error FAILED_PRECONDITION, stays open", "-"},
    {"idle", "Error DEADLINE_EXCEEDED at the hello timeout", "timeout"},
    {"connect_close", "accepted", "-"},
    {"burst", "accepted", "-"},
    {"am_bad_header", "dropped (no reply)", "invalid_argument"},
    {"am_fetch_wrong_session", "UNAUTHENTICATED", "unauthenticated"},
    {"am_push_wrong_session", "UNAUTHENTICATED", "unauthenticated"},
    {"am_fetch_unknown_chunk", "OUT_OF_RANGE", "-"},
    {"am_fetch_future_version", "FAILED_PRECONDITION", "-"},
    {"am_push_bad_length", "INVALID_ARGUMENT", "invalid_argument"},
    {"am_push_wrong_dtype", "INVALID_ARGUMENT", "invalid_argument"},
    {"am_push_foreign_rank", "INVALID_ARGUMENT", "invalid_argument"},
}};

// Everything one shard's flood counted. `mu` guards the tallies (the UCX progress thread counts
// data-plane replies).
struct ShardFlood {
  std::string host;
  uint16_t port = 0;
  uint32_t index = 0;
  std::mutex mu;
  std::array<Tally, kNumCases> tally;
  uint64_t rounds = 0;
  uint64_t tool_errors = 0;  // failures of this machine (e.g. no ephemeral port), not the shard's
  std::string last_tool_error;
  std::string first_failure;  // the first sign the shard stopped serving

  void Sent(Case c, uint64_t n = 1) {
    std::lock_guard<std::mutex> l(mu);
    tally[c].sent += n;
  }
  void Outcome(Case c, bool as_expected, std::string_view what) {
    std::lock_guard<std::mutex> l(mu);
    if (as_expected)
      ++tally[c].expected;
    else
      ++tally[c].other[std::string(what)];
  }
  void ToolError(std::string what) {
    std::lock_guard<std::mutex> l(mu);
    ++tool_errors;
    last_tool_error = std::move(what);
  }
  void Failure(std::string what) {
    std::lock_guard<std::mutex> l(mu);
    if (first_failure.empty()) first_failure = std::move(what);
  }
};

// ---- raw sockets ------------------------------------------------------------------------------

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (SO_LINGER 0): no TIME_WAIT on this side, which a flood of short
  // connections would otherwise fill with the machine's ephemeral ports.
  void Abort() {
    if (fd_ < 0) return;
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Reset();
  }

 private:
  int fd_ = -1;
};

// Connects (blocking). Errors: Unavailable (refused or reset: the shard's side), ResourceExhausted
// (this machine: no fd or ephemeral port), InvalidArgument (not an IPv4 address).
Result<Fd> Connect(const std::string& host, uint16_t port, int timeout_ms) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return InvalidArgument("'" + host + "' is not an IPv4 address");
  }
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ResourceExhausted(std::string("socket: ") + std::strerror(errno));
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const int e = errno;
    std::string what = "connect to " + host + ":" + std::to_string(port) + ": " + std::strerror(e);
    if (e == EADDRNOTAVAIL || e == EMFILE || e == ENFILE || e == ENOBUFS) {
      return ResourceExhausted(what);
    }
    return Unavailable(what);
  }
  return fd;
}

bool SendAll(int fd, std::span<const std::byte> b) {
  size_t off = 0;
  while (off < b.size()) {
    ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool ReadExact(int fd, std::byte* p, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, p + off, n - off, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    off += static_cast<size_t>(r);
  }
  return true;
}

// What came back on a connection: a frame (its type and, for an Error frame, the code), or the
// connection ending, or nothing in time.
struct Answer {
  enum Kind { kFrame, kClosed, kTimeout } kind = kClosed;
  uint16_t type = 0;
  Code code = Code::kOk;
  std::string Name() const {
    if (kind == kClosed) return "closed";
    if (kind == kTimeout) return "no answer in time";
    if (type == kTypeError) return "Error " + std::string(CodeName(code));
    return "frame type " + std::to_string(type);
  }
  bool IsError(Code c) const { return kind == kFrame && type == kTypeError && code == c; }
};

Answer ReadAnswer(int fd) {
  std::array<std::byte, kFrameHeaderBytes> hdr{};
  size_t got = 0;
  while (got < hdr.size()) {
    ssize_t r = ::recv(fd, hdr.data() + got, hdr.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return {Answer::kTimeout};
    if (r <= 0) return {Answer::kClosed};
    got += static_cast<size_t>(r);
  }
  auto h = DecodeFrameHeader(hdr);
  if (!h.ok()) return {Answer::kFrame, 0, Code::kInternal};
  std::vector<std::byte> payload(h->payload_len);
  if (!ReadExact(fd, payload.data(), payload.size())) return {Answer::kClosed};
  Answer a{Answer::kFrame, h->type, Code::kOk};
  if (h->type == kTypeError) a.code = DecodeErrorPayload(payload).code();
  return a;
}

// After an Error that closes: the server half-closed, so EOF follows.
bool ClosedAfter(int fd) {
  std::array<std::byte, 256> b{};
  for (;;) {
    ssize_t r = ::recv(fd, b.data(), b.size(), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    if (r < 0) return false;  // timed out: still open
  }
}

std::vector<std::byte> Hello(std::string_view token, rpc::PeerRole role, uint32_t rank) {
  ByteWriter w;
  w.U16(kProtocolVersion);
  w.U32(static_cast<uint32_t>(role));
  w.U32(rank);
  w.Str("zps-flood");
  w.Str(token);
  w.U32(0);  // no extra
  return w.Take();
}

// A header with any field as given, and the CRC a correct sender would compute over it.
std::vector<std::byte> RawFrame(uint32_t magic, uint16_t version, uint16_t type, uint64_t id,
                                uint32_t payload_len, std::span<const std::byte> payload) {
  ByteWriter w;
  w.U32(magic);
  w.U16(version);
  w.U16(type);
  w.U64(id);
  w.U32(payload_len);
  w.U32(0);
  w.U32(0);
  uint32_t crc = Crc32cExtend(0, w.buffer());
  crc = Crc32cExtend(crc, payload);
  w.U32(crc);
  w.Raw(payload.data(), payload.size());
  return w.Take();
}

// ---- the flood of one shard -------------------------------------------------------------------

class DataPlane;

class ShardFlooder {
 public:
  ShardFlooder(const FloodOptions& o, ShardFlood* s, DataPlane* dp) : o_(o), s_(s), dp_(dp) {}
  void Run(const std::atomic<bool>& stop);

 private:
  // One fresh connection that sends `bytes` (then, with `shut`, half-closes) and reads the answer.
  void OneShot(Case c, std::span<const std::byte> bytes, Code want, bool shut = false);
  void OnAuthed();
  void Idle();
  void ConnectFloods();
  // Connects; a refusal is the shard's failure, a local shortage only the tool's.
  std::optional<Fd> Open(Case c);

  const FloodOptions& o_;
  ShardFlood* s_;
  DataPlane* dp_;
  Fd authed_;
  uint64_t next_id_ = 1;
  std::vector<Fd> idle_;
};

std::optional<Fd> ShardFlooder::Open(Case c) {
  auto fd = Connect(s_->host, s_->port, o_.reply_timeout_ms);
  if (fd.ok()) return std::move(*fd);
  if (fd.status().code() == Code::kResourceExhausted) {
    s_->ToolError(fd.status().ToString());
  } else {
    s_->Sent(c);
    s_->Outcome(c, false, "connect failed");
    s_->Failure(std::string(kCases[c].name) + ": " + fd.status().ToString());
  }
  return std::nullopt;
}

void ShardFlooder::OneShot(Case c, std::span<const std::byte> bytes, Code want, bool shut) {
  auto fd = Open(c);
  if (!fd) return;
  s_->Sent(c);
  if (!SendAll(fd->get(), bytes)) {
    // The shard may close before taking all of a bad frame; what it answered is still readable.
  }
  if (shut) ::shutdown(fd->get(), SHUT_WR);
  Answer a = ReadAnswer(fd->get());
  bool ok = a.IsError(want) && ClosedAfter(fd->get());
  // A stream cut inside a frame: the shard answers the Error best-effort, so a plain close is
  // as documented too.
  if (!ok && shut && a.kind == Answer::kClosed) ok = true;
  s_->Outcome(c, ok, a.kind == Answer::kFrame && a.IsError(want) ? "Error, not closed" : a.Name());
  if (a.kind == Answer::kTimeout) {
    s_->Failure(std::string(kCases[c].name) + ": no answer within " +
                std::to_string(o_.reply_timeout_ms) + " ms");
  }
}

void ShardFlooder::OnAuthed() {
  if (!authed_.valid()) {
    auto fd = Open(kUnknownType);
    if (!fd) return;
    auto hello = EncodeFrame(kTypeHello, next_id_++, Hello(o_.token, rpc::PeerRole::kTool, 0));
    Answer a;
    if (SendAll(fd->get(), hello)) a = ReadAnswer(fd->get());
    if (a.kind != Answer::kFrame || a.type != kTypeHelloReply) {
      s_->Failure("hello with the job's token: " + a.Name());
      return;
    }
    authed_ = std::move(*fd);
  }
  // Each of these leaves the connection open, so they share it.
  const std::array<std::byte, 3> garbage{std::byte{0xff}, std::byte{0xfe}, std::byte{0xfd}};
  struct Step {
    Case c;
    std::vector<std::byte> frame;
    Code want;
  };
  std::vector<Step> steps;
  steps.push_back({kUnknownType, EncodeFrame(0x7abc, next_id_++, {}), Code::kUnimplemented});
  steps.push_back({kReplyType, EncodeFrame(ReplyTypeOf(msg::kChunkCrcs), next_id_++, {}),
                   Code::kUnimplemented});
  steps.push_back(
      {kGarbageBody, EncodeFrame(msg::kChunkCrcs, next_id_++, garbage), Code::kInvalidArgument});
  steps.push_back({kSecondHello,
                   EncodeFrame(kTypeHello, next_id_++, Hello(o_.token, rpc::PeerRole::kTool, 0)),
                   Code::kFailedPrecondition});
  for (const Step& st : steps) {
    s_->Sent(st.c);
    Answer a;
    if (SendAll(authed_.get(), st.frame)) a = ReadAnswer(authed_.get());
    const bool ok = a.IsError(st.want);
    s_->Outcome(st.c, ok, a.Name());
    if (!ok) {
      if (a.kind == Answer::kTimeout) s_->Failure(std::string(kCases[st.c].name) + ": no answer");
      authed_.Reset();  // start again with a fresh connection next round
      return;
    }
  }
}

// Silent connections: the shard closes each at its hello timeout with DEADLINE_EXCEEDED.
void ShardFlooder::Idle() {
  for (auto it = idle_.begin(); it != idle_.end();) {
    pollfd p{it->get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) {
      ++it;
      continue;
    }
    Answer a = ReadAnswer(it->get());
    s_->Outcome(kIdle, a.IsError(Code::kDeadlineExceeded), a.Name());
    it = idle_.erase(it);
  }
  while (idle_.size() < static_cast<size_t>(o_.idle_conns)) {
    auto fd = Open(kIdle);
    if (!fd) return;
    s_->Sent(kIdle);
    idle_.push_back(std::move(*fd));
  }
}

void ShardFlooder::ConnectFloods() {
  if (auto fd = Open(kConnectClose)) {
    s_->Sent(kConnectClose);
    s_->Outcome(kConnectClose, true, "");
    fd->Abort();
  }
  std::vector<Fd> burst;
  for (int i = 0; i < o_.burst; ++i) {
    auto fd = Open(kBurst);
    if (!fd) break;
    s_->Sent(kBurst);
    s_->Outcome(kBurst, true, "");
    burst.push_back(std::move(*fd));
  }
  for (Fd& fd : burst) fd.Abort();
}

// ---- the data plane ---------------------------------------------------------------------------

// One UCX worker for the whole flood; one session per shard, opened with a flood rank. Replies
// are matched to the case that sent them by request id.
class DataPlane {
 public:
  Status Start(const FloodOptions& o, std::vector<std::unique_ptr<ShardFlood>>& shards) {
    ZPS_ASSIGN_OR_RETURN(ctx_, ucx::Context::Create({.transports = o.ucx_tls}));
    ZPS_ASSIGN_OR_RETURN(worker_, ucx::Worker::Create(*ctx_, {.thread_name = "flood-ucx"}));
    auto on_reply = [this](uint16_t id) {
      return [this, id](ucx::AmMessage& m) {
        uint64_t request = 0;
        uint32_t code = 0;
        if (id == msg::kAmPushReply) {
          auto h = msg::PushReplyHeader::Decode(m.header());
          if (!h.ok()) return;
          request = h->request;
          code = h->code;
        } else if (id == msg::kAmFetchReply) {
          auto h = msg::FetchReplyHeader::Decode(m.header());
          if (!h.ok()) return;
          request = h->request;
          code = h->code;
        } else {
          auto h = msg::FetchRmaReplyHeader::Decode(m.header());
          if (!h.ok()) return;
          request = h->request;
          code = h->code;
        }
        Answered(request, static_cast<Code>(code));
      };
    };
    for (uint16_t id : {msg::kAmFetchReply, msg::kAmPushReply, msg::kAmFetchRmaReply}) {
      ZPS_RETURN_IF_ERROR(worker_->SetAmHandler(id, on_reply(id)));
    }
    ZPS_RETURN_IF_ERROR(worker_->Start());
    sessions_.resize(shards.size());
    for (size_t i = 0; i < shards.size(); ++i) sessions_[i].shard = shards[i].get();
    return Status::Ok();
  }

  // Opens shard i's session (retried by the caller's rounds while the shard has no job yet) and
  // learns which chunks it holds. False while not ready.
  bool Ready(size_t i, const FloodOptions& o) {
    Session& s = sessions_[i];
    if (s.rpc && s.rpc->connected()) return true;
    rpc::ClientOptions co{s.shard->host,
                          s.shard->port,
                          o.token,
                          rpc::PeerRole::kWorker,
                          kFloodRankBase + s.shard->index,
                          "zps-flood",
                          worker_->Address(),
                          5000};
    auto c = rpc::Client::Connect(co);
    if (!c.ok()) return false;  // e.g. "this shard has not loaded the job yet": retried
    auto ep = worker_->Connect((*c)->hello_reply_extra());
    if (!ep.ok()) return false;
    auto crcs = (*c)->Call(msg::kChunkCrcs, msg::ChunkCrcsRequest{0}.Encode(), 10s);
    if (!crcs.ok()) return false;
    auto m = msg::ChunkCrcs::Decode(*crcs);
    if (!m.ok() || m->crcs.empty()) return false;
    s.chunk = m->crcs.front().first;
    s.token = (*c)->session_token();
    s.ep = *ep;
    s.rpc = std::move(*c);
    return true;
  }

  void Round(size_t i) {
    Session& s = sessions_[i];
    ShardFlood* sf = s.shard;
    // Bytes that decode as no header at all, to each of the four request ids in turn.
    static constexpr std::array<uint16_t, 4> kIds = {msg::kAmFetch, msg::kAmPush, msg::kAmFetchRma,
                                                     msg::kAmPushRma};
    auto junk = std::make_shared<std::vector<std::byte>>(7, std::byte{0x5a});
    sf->Sent(kAmBadHeader);
    worker_->SendAm(s.ep, kIds[s.rounds++ % kIds.size()], *junk, {}, junk, [](Status) {});

    auto fetch = [&](Case c, Code want, msg::FetchHeader h) {
      h.request = Expect(sf, c, want);
      sf->Sent(c);
      worker_->SendAm(s.ep, msg::kAmFetch, h.Encode(), {}, nullptr, [](Status) {});
    };
    auto push = [&](Case c, Code want, msg::PushHeader h, size_t bytes) {
      auto data = std::make_shared<std::vector<std::byte>>(bytes, std::byte{0});
      h.request = Expect(sf, c, want);
      sf->Sent(c);
      worker_->SendAm(s.ep, msg::kAmPush, h.Encode(), *data, data, [](Status) {});
    };
    // Header fields: session, request (set above), then as msg::FetchHeader / msg::PushHeader.
    fetch(kAmFetchWrongSession, Code::kUnauthenticated,
          {s.token ^ 0x5a5a5a5a5a5a5a5aull, 0, s.chunk, 0, 1, 0});
    push(kAmPushWrongSession, Code::kUnauthenticated,
         {s.token ^ 0xa5a5a5a5a5a5a5a5ull, 0, 0, s.chunk, 0, 1, 0, DType::kF32}, 4);
    fetch(kAmFetchUnknownChunk, Code::kOutOfRange, {s.token, 0, 0x7ffffff0u, 0, 1, 0});
    fetch(kAmFetchFutureVersion, Code::kFailedPrecondition,
          {s.token, 0, s.chunk, 0, 1, int64_t{1} << 40});
    push(kAmPushBadLength, Code::kInvalidArgument, {s.token, 0, 0, s.chunk, 0, 4, 0, DType::kF32},
         3);
    push(kAmPushWrongDtype, Code::kInvalidArgument, {s.token, 0, 0, s.chunk, 0, 1, 0, DType::kBF16},
         2);
    // A well-formed push of a contributor that is not the session's rank: refused before any
    // byte is taken (the flood's rank is no rank of the job).
    push(kAmPushForeignRank, Code::kInvalidArgument, {s.token, 0, 0, s.chunk, 0, 1, 0, DType::kF32},
         4);
  }

  // Waits (bounded) for the replies still due, then counts the missing ones, and stops UCX.
  void Finish(std::chrono::milliseconds wait) {
    const auto deadline = Clock::now() + wait;
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (pending_.empty() || Clock::now() >= deadline) {
          for (auto& [req, p] : pending_) p.shard->Outcome(p.c, false, "no reply");
          pending_.clear();
          break;
        }
      }
      std::this_thread::sleep_for(20ms);
    }
    for (Session& s : sessions_) s.rpc.reset();
    if (worker_) worker_->Stop();
  }

 private:
  struct Session {
    ShardFlood* shard = nullptr;
    std::unique_ptr<rpc::Client> rpc;
    ucx::Endpoint ep;
    uint64_t token = 0;
    uint32_t chunk = 0;
    uint64_t rounds = 0;
  };
  struct Pending {
    ShardFlood* shard;
    Case c;
    Code want;
  };
  uint64_t Expect(ShardFlood* sf, Case c, Code want) {
    std::lock_guard<std::mutex> l(mu_);
    const uint64_t id = next_++;
    pending_[id] = {sf, c, want};
    return id;
  }
  void Answered(uint64_t request, Code code) {
    Pending p;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = pending_.find(request);
      if (it == pending_.end()) return;
      p = it->second;
      pending_.erase(it);
    }
    p.shard->Outcome(p.c, code == p.want, std::string(CodeName(code)));
  }

  std::unique_ptr<ucx::Context> ctx_;
  std::unique_ptr<ucx::Worker> worker_;
  std::vector<Session> sessions_;
  std::mutex mu_;
  std::map<uint64_t, Pending> pending_;  // guarded by mu_
  uint64_t next_ = 1;                    // guarded by mu_
};

void ShardFlooder::Run(const std::atomic<bool>& stop) {
  const std::array<std::byte, 3> garbage{std::byte{0xff}, std::byte{0xfe}, std::byte{0xfd}};
  const auto hello = Hello(o_.token, rpc::PeerRole::kTool, 0);
  std::vector<std::byte> bad_magic(kFrameHeaderBytes, std::byte{0xab});
  auto bad_version = RawFrame(kFrameMagic, 9, kTypeHello, 1, 0, {});
  auto oversize = RawFrame(kFrameMagic, kProtocolVersion, kTypeHello, 1, 0x7fffffffu, {});
  std::vector<std::byte> truncated = RawFrame(kFrameMagic, kProtocolVersion, kTypeHello, 1, 64, {});
  truncated.resize(kFrameHeaderBytes + 10, std::byte{0x11});
  std::vector<std::byte> half_header(EncodeFrame(kTypeHello, 1, hello));
  half_header.resize(kFrameHeaderBytes / 2);
  auto bad_crc = EncodeFrame(kTypeHello, 1, hello);
  bad_crc[kFrameCrcOffset] ^= std::byte{0xff};
  auto garbage_hello = EncodeFrame(kTypeHello, 1, garbage);
  auto wrong_token =
      EncodeFrame(kTypeHello, 1, Hello(o_.token + "-not-it", rpc::PeerRole::kTool, 0));
  auto before_hello = EncodeFrame(msg::kStatus, 1, {});

  bool dp_ready = false;
  while (!stop.load()) {
    const auto t0 = Clock::now();
    OneShot(kBadMagic, bad_magic, Code::kInvalidArgument);
    OneShot(kBadVersion, bad_version, Code::kFailedPrecondition);
    OneShot(kOversize, oversize, Code::kResourceExhausted);
    OneShot(kTruncated, truncated, Code::kInvalidArgument, true);
    OneShot(kHalfHeader, half_header, Code::kInvalidArgument, true);
    OneShot(kBadCrc, bad_crc, Code::kDataLoss);
    OneShot(kGarbageHello, garbage_hello, Code::kInvalidArgument);
    OneShot(kWrongToken, wrong_token, Code::kUnauthenticated);
    OneShot(kBeforeHello, before_hello, Code::kUnauthenticated);
    OnAuthed();
    Idle();
    ConnectFloods();
    if (dp_ != nullptr) {
      if (!dp_ready) dp_ready = dp_->Ready(s_->index, o_);
      if (dp_ready) dp_->Round(s_->index);
    }
    {
      std::lock_guard<std::mutex> l(s_->mu);
      ++s_->rounds;
    }
    const auto next = t0 + std::chrono::milliseconds(o_.interval_ms);
    while (!stop.load() && Clock::now() < next) std::this_thread::sleep_for(5ms);
  }
  for (Fd& fd : idle_) fd.Abort();
  idle_.clear();
  authed_.Reset();
}

// ---- report -----------------------------------------------------------------------------------

// The shard still answers a tool's Status request.
Status StillServing(const FloodOptions& o, const ShardFlood& s) {
  rpc::ClientOptions co{s.host, s.port, o.token, rpc::PeerRole::kTool, 0, "zps-flood", {}, 5000};
  ZPS_ASSIGN_OR_RETURN(auto c, rpc::Client::Connect(co));
  ZPS_ASSIGN_OR_RETURN(auto st, c->Call(msg::kStatus, {}, 10s));
  (void)st;
  return Status::Ok();
}

int Report(const FloodOptions& o, std::vector<std::unique_ptr<ShardFlood>>& shards, double secs) {
  bool bad = false;
  for (auto& sp : shards) {
    ShardFlood& s = *sp;
    std::lock_guard<std::mutex> l(s.mu);
    std::printf("zps-flood: shard %u (%s:%u): %llu rounds in %.1fs\n", s.index, s.host.c_str(),
                s.port, static_cast<unsigned long long>(s.rounds), secs);
    std::printf("  %-24s %8s %8s  %-44s %s\n", "case", "sent", "as-doc", "documented answer",
                "metric kind / other answers");
    for (int c = 0; c < kNumCases; ++c) {
      const Tally& t = s.tally[c];
      std::string other;
      for (const auto& [what, n] : t.other) {
        other += (other.empty() ? "" : ", ") + what + " x" + std::to_string(n);
        // An idle connection the flood closed itself at the end is not the shard's answer.
        if (c != kIdle || what != "closed") bad = true;
      }
      std::printf("  %-24s %8llu %8llu  %-44s %s%s%s\n", kCases[c].name,
                  static_cast<unsigned long long>(t.sent),
                  static_cast<unsigned long long>(t.expected), kCases[c].expect, kCases[c].metric,
                  other.empty() ? "" : "; OTHER: ", other.c_str());
      // One line per case for scripts: flood <shard> <case> <sent> <as documented> <metric kind>
      std::printf("flood %u %s %llu %llu %s\n", s.index, kCases[c].name,
                  static_cast<unsigned long long>(t.sent),
                  static_cast<unsigned long long>(t.expected), kCases[c].metric);
    }
    if (s.tool_errors > 0) {
      std::printf("  %llu connects failed on this machine (not the shard's doing), last: %s\n",
                  static_cast<unsigned long long>(s.tool_errors), s.last_tool_error.c_str());
    }
    Status serving = StillServing(o, s);
    std::printf("flood_serving %u %s\n", s.index, serving.ok() ? "yes" : "no");
    if (!serving.ok()) {
      std::printf("  FAIL: shard %u no longer serves: %s\n", s.index, serving.ToString().c_str());
      bad = true;
    }
    if (!s.first_failure.empty()) {
      std::printf("  FAIL: %s\n", s.first_failure.c_str());
      bad = true;
    }
  }
  std::printf(
      "zps-flood: %s\n",
      bad ? "FAIL (see above)" : "every shard answered every case as documented and still serves");
  std::fflush(stdout);
  return bad ? 1 : 0;
}

Status Run(int argc, char** argv, int* exit_code) {
  FloodOptions o;
  Flags f("zps-flood",
          "Floods every shard of a running zps job with malformed control-plane frames (bad "
          "magic, version, length, CRC, truncated, garbage bodies, unknown types, wrong token), "
          "connection floods (silent, half a frame, closed at once, bursts) and malformed "
          "data-plane active messages (bad headers, wrong session token, unknown chunks, future "
          "versions, wrong lengths, dtypes and contributors), then reports what it sent and how "
          "each shard answered. Nothing it sends can change a parameter. Exit 0: every answer as "
          "documented (docs/protocol.md) and every shard still serving.");
  f.Add("targets", "host:port of every shard's control port, comma-separated (IPv4)", &o.targets);
  f.Add("token", "the job's auth token (prefer token-file)", &o.token);
  f.Add("token-file", "file holding the job's auth token", &o.token_file);
  f.Add("duration", "seconds to flood (0 = until SIGTERM or SIGINT)", &o.duration_s);
  f.Add("interval-ms", "pause between rounds, per shard", &o.interval_ms, 0, 60000);
  f.Add("idle-conns", "silent connections held open per shard", &o.idle_conns, 0, 512);
  f.Add("burst", "connections opened at once per round and shard, then reset", &o.burst, 0, 512);
  f.Add("data-plane", "also send malformed active messages over UCX", &o.data_plane);
  f.Add("ucx-tls", "UCX transports for the data-plane session", &o.ucx_tls);
  f.Add("reply-timeout-ms", "how long a case waits for its answer", &o.reply_timeout_ms, 100,
        600000);
  f.Add("log-level", "debug, info, warning or error", &o.log_level);
  ZPS_ASSIGN_OR_RETURN(auto outcome, f.Parse(argc, argv));
  if (outcome == ParseOutcome::kHelpShown) {
    *exit_code = 0;
    return Status::Ok();
  }
  ZPS_ASSIGN_OR_RETURN(auto level, log::ParseLevel(o.log_level));
  log::SetLevel(level);
  if (!o.token_file.empty()) {
    ZPS_ASSIGN_OR_RETURN(o.token, ReadTokenFile(o.token_file));
  }
  if (o.duration_s < 0) return InvalidArgument("--duration must be >= 0");
  std::vector<std::unique_ptr<ShardFlood>> shards;
  std::string_view rest = o.targets;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view one = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (one.empty()) continue;
    ZPS_ASSIGN_OR_RETURN(auto hp, SplitHostPort(one));
    auto s = std::make_unique<ShardFlood>();
    s->host = hp.first;
    s->port = hp.second;
    s->index = static_cast<uint32_t>(shards.size());
    shards.push_back(std::move(s));
  }
  if (shards.empty()) return InvalidArgument("--targets names no shard");

  // Signals are taken in this thread (sigtimedwait), so the report runs as ordinary code.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  std::unique_ptr<DataPlane> dp;
  if (o.data_plane) {
    dp = std::make_unique<DataPlane>();
    ZPS_RETURN_IF_ERROR(dp->Start(o, shards).WithContext("data plane"));
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (auto& s : shards) {
    threads.emplace_back([&o, &stop, s = s.get(), d = dp.get()] {
      log::SetThreadName("flood-" + std::to_string(s->index));
      ShardFlooder(o, s, d).Run(stop);
    });
  }
  std::fprintf(stderr, "zps-flood: flooding %zu shard(s)%s\n", shards.size(),
               o.duration_s > 0 ? "" : " until SIGTERM/SIGINT");
  const auto t0 = Clock::now();
  for (;;) {
    timespec ts{0, 100'000'000};
    if (sigtimedwait(&set, nullptr, &ts) > 0) break;
    if (o.duration_s > 0 &&
        std::chrono::duration<double>(Clock::now() - t0).count() >= o.duration_s) {
      break;
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (dp) dp->Finish(std::chrono::milliseconds(o.reply_timeout_ms));
  *exit_code = Report(o, shards, secs);
  return Status::Ok();
}

}  // namespace
}  // namespace zps::flood

int main(int argc, char** argv) {
  int code = 1;
  zps::Status s = zps::flood::Run(argc, argv, &code);
  if (!s.ok()) {
    std::fprintf(stderr, "zps-flood: %s\n", s.ToString().c_str());
    return 2;
  }
  return code;
}
