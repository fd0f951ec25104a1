// zps/common/rpc.h — the control plane: framed request/reply over TCP (Boost.Asio inside).
//
// A Server accepts connections, performs the authenticated hello (type 1) and then dispatches
// each request frame to the Handler registered for its type. A Handler answers through a
// Responder, at once or later from any thread (long-poll). A Client connects, performs the hello
// and issues Calls; many Calls may be outstanding at once and are matched by request id.
//
// Wire format and handshake: docs/protocol.md and zps/common/frame.h.
//
// No Asio type appears in this header (pimpl), so users do not compile Asio.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"

namespace zps::rpc {

/// Longest shared-secret token accepted in a hello.
inline constexpr size_t kMaxTokenBytes = 4096;
/// Longest peer name accepted in a hello.
inline constexpr size_t kMaxNameBytes = 256;
/// Bound on any frame's payload before the hello succeeded (the hello itself included). Keeps an
/// unauthenticated peer from making the server allocate kMaxPayloadBytes per connection.
inline constexpr uint32_t kMaxHelloPayloadBytes = 64 * 1024;

struct ServerOptions {
  std::string bind_address = "0.0.0.0";  // Default: all interfaces. Tests use "127.0.0.1".
  uint16_t port = 7070;                  // Default: 7070; 0 = ephemeral, read back with port().
  std::string token;              // Default: empty. Shared secret; compared in constant time.
  int hello_timeout_ms = 5000;    // Default: 5 s. A client silent this long is closed.
  int idle_timeout_ms = 0;        // Default: 0 = no idle timeout after the handshake.
  size_t max_connections = 1024;  // Default: 1024. Further connections are closed at once.
  int io_threads = 1;             // Default: 1. Threads named "rpc-io-N".
};

/// Who a peer says it is, in its hello. Crosses the wire as a u32; a hello with any other value is
/// refused (InvalidArgument) before the OnHello hook runs.
enum class PeerRole : uint32_t {
  kUnspecified = 0,  ///< a client that declares no role (generic RPC users, tests)
  kWorker = 1,       ///< a training worker
  kShard = 2,        ///< a shard registering with the coordinator
  kTool = 3,         ///< zps-ckpt, zps-flood, libzps_c's control calls, KV clients
};
/// "unspecified", "worker", "shard" or "tool".
std::string_view PeerRoleName(PeerRole role);
/// The role for a wire value. Errors: InvalidArgument for a value outside PeerRole.
Result<PeerRole> PeerRoleFromWire(uint32_t value);

/// An authenticated peer, as established by its hello. The server hands it to handlers and hooks
/// by reference, valid during the call; copy it to keep it.
struct Peer {
  uint64_t session_id = 0;     ///< random, issued by the server at the hello
  uint64_t session_token = 0;  ///< random, issued by the server; data-plane messages carry it
  PeerRole role = PeerRole::kUnspecified;  ///< as the client declared it
  uint32_t rank = 0;                       ///< as the client declared it
  std::string name;                        ///< as the client declared it (<= kMaxNameBytes)
  std::string remote;                      ///< "ip:port" of the client
};

class Connection;  // internal

/// The way to answer one request. A copyable handle: copies refer to the same request.
/// Only the first Reply/Error across all copies sends anything; later calls are no-ops.
/// Thread-safety: callable from any thread, at once or later (long-poll). Calling it after the
/// connection closed or the server stopped is a safe no-op.
class Responder {
 public:
  /// An empty handle; Reply/Error do nothing. valid() is false.
  Responder() = default;

  /// Sends the reply frame (request type | 0x8000, the request's id) with `payload`.
  /// A payload over kMaxPayloadBytes is not sent; the peer gets Error ResourceExhausted instead.
  void Reply(std::vector<std::byte> payload);
  /// Sends an Error frame (kTypeError) carrying `s` (code and message). An OK `s` is sent as
  /// Internal.
  void Error(const Status& s);

  /// True if this handle refers to a request (not default-constructed).
  bool valid() const { return state_ != nullptr; }
  /// True once Reply or Error was called on this handle or a copy.
  bool answered() const;
  /// The request's type and id (0 for an empty handle).
  uint16_t request_type() const;
  uint64_t request_id() const;

  struct State;  // internal

 private:
  friend class Connection;
  explicit Responder(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

/// Called for each request of a registered type on an authenticated connection.
/// Runs on an rpc io thread, serialised per connection: it must not block. Long work or waits go
/// elsewhere, carrying the Responder. `peer` and `payload` are valid only during the call (copy
/// what you keep). An exception escaping the handler is caught and answered with Error Internal.
using Handler = std::function<void(const Peer&, std::span<const std::byte> payload, Responder)>;

/// Returns extra bytes appended to the hello reply, or an error to refuse the peer (sent to it as
/// an Error frame, then the connection is closed). Runs on an io thread; must not block.
using HelloHook =
    std::function<Result<std::vector<std::byte>>(const Peer&, std::span<const std::byte> extra)>;
/// The answer to an asynchronous hello: the reply's extra bytes, or the refusal. Call it once,
/// from any thread.
using HelloDone = std::function<void(Result<std::vector<std::byte>>)>;
/// A hello hook that answers later (e.g. once another thread made a resource for the peer), so
/// that no io thread waits for it. The connection reads nothing more until `done` runs; the
/// hello timeout still applies (a late `done` for a closed connection is dropped). Runs on an io
/// thread; must not block. `extra` is valid during the call only.
using AsyncHelloHook =
    std::function<void(const Peer&, std::span<const std::byte> extra, HelloDone done)>;

/// The control-plane server.
///
/// Lifecycle: Create (binds) → Register/OnHello/OnDisconnect/OnProtocolError → Start → Stop.
/// Thread-safety: Register and the On* setters must be called before Start. Start, Stop, port()
/// and connections() are safe from any thread, except that Stop (and the destructor) must not be
/// called from a handler or hook (it joins the io threads).
///
/// Bad input handling: a framing error (bad magic, bad version, oversize length, bad CRC,
/// truncated frame) closes the connection after a best-effort Error frame. A non-hello frame before
/// the hello, a wrong token or a hello-level version mismatch gets an Error frame and a close.
/// An unknown type after the hello gets Error Unimplemented and the connection stays.
class Server {
 public:
  /// Binds the listening socket (nothing is accepted until Start).
  /// Errors: InvalidArgument (bad address, io_threads < 1, max_connections 0, hello_timeout_ms <=
  /// 0, idle_timeout_ms < 0), IoError (bind or listen failed, e.g. the port is in use).
  static Result<std::unique_ptr<Server>> Create(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Sets the handler for request type `type` (1..0x7FFF, not kTypeHello). Replaces an earlier
  /// one. Before Start only. An invalid type is a broken invariant (ZPS_CHECK).
  void Register(uint16_t type, Handler h);
  /// Hook run on each valid hello (token and version already checked). Default: accept, no extra.
  void OnHello(HelloHook f);
  /// As OnHello, answered through `done` (replaces an OnHello hook, and the other way round).
  void OnHelloAsync(AsyncHelloHook f);
  /// Called (on an io thread) when an authenticated peer's connection closes, for any reason,
  /// including Stop.
  void OnDisconnect(std::function<void(const Peer&)> f);
  /// Called (on an io thread) once per protocol error, for metrics. Kinds: the FrameError names
  /// (bad_magic, bad_version, oversize, truncated, bad_crc, unknown_type), plus unauthenticated,
  /// invalid_argument (malformed hello), timeout (hello or idle timeout) and too_many_connections.
  void OnProtocolError(std::function<void(std::string_view kind)> f);

  /// Starts accepting, on io_threads threads. Errors: FailedPrecondition if already started or
  /// stopped.
  Status Start();
  /// Closes the listener and every connection (pending Responders become no-ops; their clients see
  /// Unavailable), then joins the io threads. Idempotent; also run by the destructor.
  void Stop();

  /// The bound port (the real one when ServerOptions::port was 0).
  uint16_t port() const;
  /// Open connections right now (authenticated or not).
  size_t connections() const;

  struct Impl;  // internal

 private:
  explicit Server(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

struct ClientOptions {
  std::string host;                        // Default: none (required). Name or address.
  uint16_t port = 0;                       // Default: none (required).
  std::string token;                       // Default: empty. Shared secret (<= kMaxTokenBytes).
  PeerRole role = PeerRole::kUnspecified;  // Default: unspecified. Sent in the hello.
  uint32_t rank = 0;                       // Default: 0. Sent in the hello.
  std::string name;                        // Default: empty. Sent in the hello (<= kMaxNameBytes).
  std::vector<std::byte> hello_extra;      // Default: empty. Passed to the server's OnHello hook.
  int connect_timeout_ms = 5000;  // Default: 5 s. Bounds the TCP connect and the hello each.
};

/// A control-plane client: one TCP connection, one internal io thread ("rpc-client").
/// Thread-safety: all methods are safe from any thread. Close (and the destructor) must not be
/// called from inside a Call on the same client (none runs user code, so this only matters across
/// threads: a Close while Calls wait makes them return Unavailable).
class Client {
 public:
  /// Connects and performs the hello.
  /// Errors: InvalidArgument (empty host, token or name over its bound), Unavailable (resolve
  /// failed, connect refused or timed out, connection closed during the hello), Unauthenticated
  /// (wrong token), FailedPrecondition (protocol version mismatch), DeadlineExceeded (no hello
  /// reply in time), or whatever error the server's OnHello hook refused with.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& o);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// What the server's OnHello hook returned.
  std::span<const std::byte> hello_reply_extra() const;
  uint64_t session_id() const;
  uint64_t session_token() const;

  /// Sends request `type` (1..0x7FFF) with `payload` and waits for its reply.
  /// Returns the reply payload, or the typed error from an Error frame.
  /// Errors: InvalidArgument (type out of range, payload over kMaxPayloadBytes), Unavailable (not
  /// connected, or the connection died before the reply), DeadlineExceeded (no reply within
  /// `timeout`; a reply arriving later is dropped), plus any error the server's handler sent.
  Result<std::vector<std::byte>> Call(uint16_t type, std::span<const std::byte> payload,
                                      std::chrono::milliseconds timeout);

  /// False once the connection closed (by either side) or Close was called.
  bool connected() const;
  /// Closes the connection; waiting Calls return Unavailable. Idempotent; run by the destructor.
  void Close();

  struct Impl;  // internal

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::rpc
