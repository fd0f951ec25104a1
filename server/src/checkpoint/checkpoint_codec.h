// checkpoint_codec.h — the stored formats' decoders of the checkpoint store and the coordinator
// catalog, exposed (inside the server library) for the fuzz targets (tests/fuzz/). Both validate
// every field of bytes read from disk and return DataLoss for anything malformed; neither
// allocates more than the input's size justifies.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/status.h"
#include "zps/server/checkpoint.h"
#include "zps/server/checkpoint_catalog.h"

namespace zps::server::internal {

/// A shard checkpoint's manifest (the record under its step's key).
struct Manifest {
  CheckpointInfo info;
  uint64_t slice_bytes = 0;
  bool has_state = false;
  uint64_t state_len = 0;
  uint32_t state_crc = 0;
};

/// Decodes a manifest stored under `key_step`. Errors: DataLoss.
Result<Manifest> DecodeManifest(int64_t key_step, std::span<const std::byte> bytes);
/// Its inverse (`info.verification` and `info.problem` are not stored).
std::vector<std::byte> EncodeManifest(const Manifest& m);

/// Decodes a global checkpoint record of the coordinator catalog. Errors: DataLoss.
Result<GlobalCheckpoint> DecodeGlobal(std::span<const std::byte> bytes);

}  // namespace zps::server::internal
