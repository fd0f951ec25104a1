// Fuzz target: the data plane's active-message header parsing (what the shard's and the worker's
// UCX handlers decode first: Fetch, FetchReply, FetchRmaReply, Push, PushRma, PushReply,
// ServingNotice).
#include "fuzz_util.h"
#include "zps/common/messages.h"

namespace msg = zps::msg;
using zps::fuzz::RoundTrip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto in = zps::fuzz::Bytes(data + 1, size - 1);
  switch (data[0] % 7) {
    case 0:
      RoundTrip<msg::FetchHeader>(in);
      break;
    case 1:
      RoundTrip<msg::FetchReplyHeader>(in);
      break;
    case 2:
      RoundTrip<msg::FetchRmaReplyHeader>(in);
      break;
    case 3:
      RoundTrip<msg::PushHeader>(in);
      break;
    case 4:
      RoundTrip<msg::PushRmaHeader>(in);
      break;
    case 5:
      RoundTrip<msg::PushReplyHeader>(in);
      break;
    default:
      RoundTrip<msg::ServingNoticeHeader>(in);
      break;
  }
  return 0;
}
