// Fuzz target: every control-plane message decoder (msg::*::Decode). The first byte picks the
// message; the rest is its payload.
#include "fuzz_util.h"
#include "zps/common/messages.h"

namespace msg = zps::msg;
using zps::fuzz::RoundTrip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto in = zps::fuzz::Bytes(data + 1, size - 1);
  switch (data[0] % 22) {
    case 0:
      RoundTrip<msg::ChunkCrcsRequest>(in);
      break;
    case 1:
      RoundTrip<msg::ReadMasterRequest>(in);
      break;
    case 2:
      RoundTrip<msg::MasterRange>(in);
      break;
    case 3:
      RoundTrip<msg::ChunkCrcs>(in);
      break;
    case 4:
      RoundTrip<msg::RegisterShard>(in);
      break;
    case 5:
      RoundTrip<msg::Join>(in);
      break;
    case 6:
      RoundTrip<msg::JoinReply>(in);
      break;
    case 7:
      RoundTrip<msg::Report>(in);
      break;
    case 8:
      RoundTrip<msg::CommitInfo>(in);
      break;
    case 9:
      RoundTrip<msg::AwaitCommit>(in);
      break;
    case 10:
      RoundTrip<msg::CheckpointReport>(in);
      break;
    case 11:
      RoundTrip<msg::ShardSync>(in);
      break;
    case 12:
      RoundTrip<msg::ShardSyncReply>(in);
      break;
    case 13:
      RoundTrip<msg::CheckpointDone>(in);
      break;
    case 14:
      RoundTrip<msg::KvSet>(in);
      break;
    case 15:
      RoundTrip<msg::KvGet>(in);
      break;
    case 16:
      RoundTrip<msg::KvReply>(in);
      break;
    case 17:
      RoundTrip<msg::ReshardInfo>(in);
      break;
    case 18:
      RoundTrip<msg::ReshardFetch>(in);
      break;
    case 19:
      RoundTrip<msg::ReshardValues>(in);
      break;
    case 20:
      RoundTrip<msg::ReshardReport>(in);
      break;
    default:
      RoundTrip<msg::ReshardStatus>(in);
      break;
  }
  return 0;
}
