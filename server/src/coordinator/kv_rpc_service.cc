// The rendezvous store's control-plane calls (shard 0): one line each over KvService
// (shard/rpc_service.h). A Get that waits is answered from the store's callback.
#include "coordinator/kv_service.h"
#include "shard/rpc_service.h"
#include "zps/common/messages.h"

namespace zps::server {

void RegisterKvRpcs(rpc::Server& rpc, const RpcMetering& metering, KvService* s) {
  using rpc_adapt::Async;
  using rpc_adapt::Sync;
  using P = const rpc::Peer&;
  rpc.Register(
      msg::kKvSet,
      metering.timed(Sync<msg::KvSet>([s](P, msg::KvSet m) { return s->Set(std::move(m)); })));
  rpc.Register(msg::kKvGet,
               Async<msg::KvGet, msg::KvReply>(
                   metering, [s](P, const auto& m, auto done) { s->Get(m, std::move(done)); }));
}

}  // namespace zps::server
