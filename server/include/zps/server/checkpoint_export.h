// zps/server/checkpoint_export.h — consolidated weights of a checkpoint as one safetensors file.
//
// The file is the safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// (padded with spaces to a multiple of 8) giving each parameter's dtype, shape and
// [begin, end) byte offsets into the data section, then the data: parameters in layout order,
// contiguous, row-major, little-endian. "__metadata__" holds the step and the layout hash as of
// one shard (zps_layout_hash: the same whatever the shard count, so a resharded job exports the
// same bytes).
//
// Streaming: chunks are read one at a time in flat order, each from the shard that owns it, and
// their parameter runs are converted and appended to the file. Memory is one chunk of fp32 plus
// a fixed write buffer, whatever the model size. The file is written to "<out>.tmp", synced and
// renamed, so a partial export never carries the final name.
//
// Thread-safety: a free function; safe to call from several threads on different outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"

namespace zps::server {

struct ExportOptions {
  std::vector<std::string> data_dirs;  // one checkpoint store per shard, any order
  int64_t step = -1;                   // Default: -1 = the newest step committed on every shard
  std::string out;                     // the .safetensors path
  DType dtype = DType::kF32;           // Default: fp32; bf16 rounds to nearest even
  uint64_t write_buffer_bytes = 8ull << 20;  // Default: 8 MiB
};

struct ExportStats {
  int64_t step = 0;
  uint64_t params = 0;
  uint64_t header_bytes = 0;  // the JSON, padded
  uint64_t file_bytes = 0;
  uint64_t peak_buffer_bytes = 0;  // largest memory held for data at once
};

/// Errors: InvalidArgument (options, dtype fp16, shards that disagree on the layout or do not
/// cover every shard exactly once), NotFound (a store, or the step on some shard), DataLoss (a CRC
/// mismatch; the partial output is removed), IoError, ResourceExhausted.
Result<ExportStats> ExportSafetensors(const ExportOptions& options);

}  // namespace zps::server
