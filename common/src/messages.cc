#include "zps/common/messages.h"

#include "zps/common/bytes.h"

namespace zps::msg {

// Each message's Encode/Decode, generated from its field table (wire_codec.h).
ZPS_WIRE_DEFINE_CODEC(ChunkCrcsRequest)
ZPS_WIRE_DEFINE_CODEC(ReadMasterRequest)
ZPS_WIRE_DEFINE_CODEC(MasterRange)
ZPS_WIRE_DEFINE_CODEC(ChunkCrcs)
ZPS_WIRE_DEFINE_CODEC(RegisterShard)
ZPS_WIRE_DEFINE_CODEC(Join)
ZPS_WIRE_DEFINE_CODEC(JoinReply)
ZPS_WIRE_DEFINE_CODEC(Report)
ZPS_WIRE_DEFINE_CODEC(CommitInfo)
ZPS_WIRE_DEFINE_CODEC(AwaitCommit)
ZPS_WIRE_DEFINE_CODEC(FetchHeader)
ZPS_WIRE_DEFINE_CODEC(FetchReplyHeader)
ZPS_WIRE_DEFINE_CODEC(FetchRmaReplyHeader)
ZPS_WIRE_DEFINE_CODEC(PushHeader)
ZPS_WIRE_DEFINE_CODEC(PushRmaHeader)
ZPS_WIRE_DEFINE_CODEC(ServingNoticeHeader)
ZPS_WIRE_DEFINE_CODEC(PushReplyHeader)
ZPS_WIRE_DEFINE_CODEC(CheckpointReport)
ZPS_WIRE_DEFINE_CODEC(ShardSync)
ZPS_WIRE_DEFINE_CODEC(ShardSyncReply)
ZPS_WIRE_DEFINE_CODEC(CheckpointDone)
ZPS_WIRE_DEFINE_CODEC(KvSet)
ZPS_WIRE_DEFINE_CODEC(KvGet)
ZPS_WIRE_DEFINE_CODEC(KvReply)
ZPS_WIRE_DEFINE_CODEC(ReshardInfo)
ZPS_WIRE_DEFINE_CODEC(ReshardFetch)
ZPS_WIRE_DEFINE_CODEC(ReshardValues)
ZPS_WIRE_DEFINE_CODEC(ReshardReport)
ZPS_WIRE_DEFINE_CODEC(ReshardStatus)

Status StatusFromWire(uint32_t code, std::string message) {
  return StatusFromCode(code, std::move(message), "peer reply");
}

}  // namespace zps::msg
