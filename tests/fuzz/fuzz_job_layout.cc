// Fuzz target: JobSpec::Deserialize (the job spec rank 0 registers and the catalog stores) and
// Layout::Deserialize. Byte 0 picks which; accepted inputs must serialize back and validate.
#include "fuzz_util.h"
#include "zps/common/layout.h"
#include "zps/server/job.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto in = zps::fuzz::Bytes(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto l = zps::Layout::Deserialize(in);
    if (!l.ok()) return 0;
    auto again = zps::Layout::Deserialize(l->Serialize());
    ZPS_FUZZ_CHECK(again.ok());
    ZPS_FUZZ_CHECK(again->Hash() == l->Hash());
    // Pieces allocates one entry per chunk a parameter spans: bounded by kMaxChunks; walked
    // only for small layouts, to keep the fuzzer fast.
    ZPS_FUZZ_CHECK(l->num_chunks() <= zps::kMaxChunks);
    if (l->num_chunks() <= (1u << 12)) {
      for (uint32_t p = 0; p < l->num_params(); ++p) (void)l->Pieces(p);
    }
  } else {
    auto j = zps::server::JobSpec::Deserialize(in);
    if (!j.ok()) return 0;
    (void)j->Validate();
    auto again = zps::server::JobSpec::Deserialize(j->Serialize());
    ZPS_FUZZ_CHECK(again.ok());
    ZPS_FUZZ_CHECK(again->Hash() == j->Hash());
  }
  return 0;
}
