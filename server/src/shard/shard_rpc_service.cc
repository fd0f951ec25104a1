// The shard's own control-plane calls: one line each over shard_queries.h (rpc_service.h).
#include <string>
#include <vector>

#include "shard/rpc_service.h"
#include "shard/shard_queries.h"
#include "zps/common/messages.h"

namespace zps::server {

void RegisterShardRpcs(rpc::Server& rpc, const RpcMetering& metering, ShardRpcHost host) {
  using rpc_adapt::NoRequest;
  using rpc_adapt::Sync;
  auto state = host.state;
  rpc.Register(msg::kStatus, metering.timed(Sync<NoRequest>([json = std::move(host.status_json)](
                                                                const rpc::Peer&, NoRequest) {
    const std::string s = json();
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    return Result<std::vector<std::byte>>(std::vector<std::byte>(b, b + s.size()));
  })));
  rpc.Register(msg::kChunkCrcs, metering.timed(Sync<msg::ChunkCrcsRequest>(
                                    [state](const rpc::Peer&, const msg::ChunkCrcsRequest& m) {
                                      return ChunkCrcsOf(state(), m);
                                    })));
  rpc.Register(msg::kReadMaster, metering.timed(Sync<msg::ReadMasterRequest>(
                                     [state](const rpc::Peer&, const msg::ReadMasterRequest& m) {
                                       return ReadMasterOf(state(), m);
                                     })));
}

}  // namespace zps::server
