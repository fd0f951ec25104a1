// Fuzz target: the checkpoint store's manifest decoder and the coordinator catalog's global
// checkpoint records (bytes read back from disk).
#include "checkpoint_codec.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  int64_t key = 0;
  for (int i = 0; i < 8; ++i) key = (key << 8) | data[i];
  const auto in = zps::fuzz::Bytes(data + 8, size - 8);
  auto m = zps::server::internal::DecodeManifest(key, in);
  if (m.ok()) ZPS_FUZZ_CHECK(m->info.step == key && m->info.chunks.size() <= in.size() / 20);
  auto g = zps::server::internal::DecodeGlobal(in);
  if (g.ok()) ZPS_FUZZ_CHECK(g->committed.size() <= g->num_shards);
  return 0;
}
