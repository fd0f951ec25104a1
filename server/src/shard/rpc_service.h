// The control-plane RPC handlers of a shard process, as thin adapters over plain classes: each
// handler decodes its request, calls one method, and encodes the answer (or sends the error).
// The decoding and answering live here once; the three registration functions each have one
// file, with one line per handler:
//   shard_rpc_service.cc                   kStatus, kChunkCrcs, kReadMaster (shard_queries.h)
//   coordinator/coordinator_rpc_service.cc the coordinator's calls (CoordinatorService)
//   coordinator/kv_rpc_service.cc          the rendezvous store's calls (KvService)
//
// Thread-safety: handlers run on the rpc::Server's io threads; what they call is thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zps/common/rpc.h"
#include "zps/common/status.h"

namespace zps::server {

class CoordinatorService;
class KvService;
class ShardState;

/// How the shard counts its control requests (metrics): `timed` wraps a handler that answers
/// before it returns (timed from receipt to return); `long_poll` returns a token that counts a
/// request in flight until its last copy (held by the answer's callback) is gone.
struct RpcMetering {
  std::function<rpc::Handler(rpc::Handler)> timed;
  std::function<std::shared_ptr<void>()> long_poll;
};

/// The shard's own calls. `state` returns the ShardState (null until the job is loaded);
/// `status_json` the kStatus document.
struct ShardRpcHost {
  std::function<ShardState*()> state;
  std::function<std::string()> status_json;
};

void RegisterShardRpcs(rpc::Server& rpc, const RpcMetering& metering, ShardRpcHost host);
/// Shard 0 only. `service` must outlive the server.
void RegisterCoordinatorRpcs(rpc::Server& rpc, const RpcMetering& metering,
                             CoordinatorService* service);
/// Shard 0 only. `service` must outlive the server.
void RegisterKvRpcs(rpc::Server& rpc, const RpcMetering& metering, KvService* service);

namespace rpc_adapt {

/// A request with no payload to decode (the payload is ignored).
struct NoRequest {
  static Result<NoRequest> Decode(std::span<const std::byte>) { return NoRequest{}; }
};

template <typename T>
std::vector<std::byte> ToWire(const T& v) {
  if constexpr (std::is_same_v<T, std::vector<std::byte>>) {
    return v;  // already bytes (kStatus's JSON)
  } else if constexpr (requires { v.Encode(); }) {
    return v.Encode();
  } else {
    return v.Serialize();  // JobSpec
  }
}

/// An OK Status answers an empty payload.
inline void Answer(rpc::Responder& r, const Status& s) {
  if (!s.ok()) return r.Error(s);
  r.Reply({});
}
template <typename T>
void Answer(rpc::Responder& r, const Result<T>& v) {
  if (!v.ok()) return r.Error(v.status());
  r.Reply(ToWire(*v));
}

/// A handler that answers before it returns: `f(peer, request)` gives a Status or Result<T>.
template <typename Req, typename F>
rpc::Handler Sync(F f) {
  return [f = std::move(f)](const rpc::Peer& peer, std::span<const std::byte> p, rpc::Responder r) {
    auto req = Req::Decode(p);
    if (!req.ok()) return r.Error(req.status());
    Answer(r, f(peer, std::move(*req)));
  };
}

/// A handler that answers later: `f(peer, request, done)` calls done(Result<T>) once. The
/// request counts in flight (RpcMetering::long_poll) until then.
template <typename Req, typename T, typename F>
rpc::Handler Async(const RpcMetering& metering, F f) {
  return [long_poll = metering.long_poll, f = std::move(f)](
             const rpc::Peer& peer, std::span<const std::byte> p, rpc::Responder r) {
    auto poll = long_poll();
    auto req = Req::Decode(p);
    if (!req.ok()) return r.Error(req.status());
    f(peer, std::move(*req), [r, poll](const Result<T>& v) mutable { Answer(r, v); });
  };
}

}  // namespace rpc_adapt
}  // namespace zps::server
