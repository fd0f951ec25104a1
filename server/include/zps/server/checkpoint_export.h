// zps/server/checkpoint_export.h — consolidated weights of a checkpoint as safetensors: one file,
// or Hugging Face's sharded set of files with its index.
//
// Each file is the safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// (padded with spaces to a multiple of 8) giving each parameter's dtype, shape and
// [begin, end) byte offsets into the data section, then the data: parameters in layout order,
// contiguous, row-major, little-endian. "__metadata__" holds the step and the layout hash as of
// one shard (zps_layout_hash: the same whatever the shard count, so a resharded job exports the
// same bytes).
//
// Sharded (max_shard_bytes > 0): `out` is a directory (created if missing) that receives
// model-00001-of-0000N.safetensors ... (the parameters in layout order, split as
// SplitIntoFiles says) and model.safetensors.index.json, Hugging Face's index:
// {"metadata": {"total_size": <data bytes of all files>}, "weight_map": {name: file}}. Every
// data file is written under a temporary name and renamed only once all are complete; the
// index is written last, so an index names only complete files. Files of an earlier export
// into the same directory that the new index does not name are left alone.
//
// Streaming: chunks are read one at a time in flat order, each from the shard that owns it, and
// their parameter runs are converted and appended to the file. Memory is one chunk of fp32 plus
// a fixed write buffer, whatever the model size or the number of files. Each file is written to
// "<name>.tmp", synced and renamed, so a partial export never carries the final name.
//
// Thread-safety: free functions; safe to call from several threads on different outputs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"

namespace zps::server {

struct ExportOptions {
  std::vector<std::string> data_dirs;  // one checkpoint store per shard, any order
  int64_t step = -1;                   // Default: -1 = the newest step committed on every shard
  std::string out;  // the .safetensors path; with max_shard_bytes, the directory of the set
  DType dtype = DType::kF32;                 // Default: fp32; bf16 rounds to nearest even
  uint64_t write_buffer_bytes = 8ull << 20;  // Default: 8 MiB
  uint64_t max_shard_bytes = 0;              // Default: 0 = one file; else the sharded set (above)
};

struct ExportStats {
  int64_t step = 0;
  uint64_t params = 0;
  uint32_t files = 0;              // data files written (1 unless sharded)
  uint64_t header_bytes = 0;       // the JSON, padded, of all files
  uint64_t file_bytes = 0;         // all data files together (the index not counted)
  uint64_t peak_buffer_bytes = 0;  // largest memory held for data at once
};

/// The name of the sharded set's index file.
inline constexpr char kShardIndexName[] = "model.safetensors.index.json";

/// Errors: InvalidArgument (options, dtype fp16, shards that disagree on the layout or do not
/// cover every shard exactly once), NotFound (a store, or the step on some shard), DataLoss (a CRC
/// mismatch; the partial output is removed), IoError, ResourceExhausted.
Result<ExportStats> ExportSafetensors(const ExportOptions& options);

/// How a sharded export splits tensors (in order, of the given data sizes) into files, as Hugging
/// Face's save_pretrained does: a file takes tensors while its data stays within
/// `max_file_bytes`; a tensor larger than that gets a file of its own. Returns the index of each
/// file's first tensor (the first is 0; empty for no tensors). `max_file_bytes` must be > 0.
std::vector<size_t> SplitIntoFiles(std::span<const uint64_t> tensor_bytes, uint64_t max_file_bytes);

/// "model-00002-of-00005.safetensors" for index 1 of 5 (Hugging Face's names).
std::string ShardFileName(size_t index, size_t count);

}  // namespace zps::server
