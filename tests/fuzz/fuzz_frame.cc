// Fuzz target: the control plane's frame decoder (header, CRC, whole frame) and error payloads.
#include "fuzz_util.h"
#include "zps/common/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto in = zps::fuzz::Bytes(data, size);
  auto h = zps::DecodeFrameHeader(in);
  if (h.ok()) {
    ZPS_FUZZ_CHECK(h->payload_len <= zps::kMaxPayloadBytes);
    if (size >= zps::kFrameHeaderBytes) {
      (void)zps::VerifyFrameCrc(in.first(zps::kFrameHeaderBytes),
                                in.subspan(zps::kFrameHeaderBytes));
    }
  }
  (void)zps::DecodeFrameHeader(in, 64);  // the pre-handshake bound
  auto f = zps::DecodeFrame(in);
  if (f.ok()) {
    ZPS_FUZZ_CHECK(f->payload.size() == f->header.payload_len);
    ZPS_FUZZ_CHECK(zps::kFrameHeaderBytes + f->payload.size() <= size);
    // A frame that decodes re-encodes to the same bytes.
    auto again = zps::EncodeFrame(f->header.type, f->header.request_id, f->payload);
    ZPS_FUZZ_CHECK(zps::DecodeFrame(again).ok());
    ZPS_FUZZ_CHECK(!zps::DecodeErrorPayload(f->payload).ok());  // always a non-OK status
  }
  ZPS_FUZZ_CHECK(!zps::DecodeErrorPayload(in).ok());
  return 0;
}
