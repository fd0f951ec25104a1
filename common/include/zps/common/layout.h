// zps/common/layout.h — the flat parameter space.
//
// Parameters are registered in order and laid out in one flat space of fp32 elements, each one
// starting at a multiple of `align_elems`. The space is cut into chunks of `chunk_elems` elements
// and chunk c lives on shard c % num_shards. A parameter may span chunks (and so shards): Pieces()
// lists the (chunk, offset, length) runs that make it up, so one fetch fans out to several shards.
//
// The layout is a pure function of the specs and options; every process that builds it from the
// same inputs gets the same layout and the same Hash(), which is how ranks validate each other.
//
// Thread-safety: immutable after Build(); safe to share across threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"

namespace zps {

/// Limits that bound what a peer or a file may ask for.
inline constexpr uint32_t kMaxParams = 1u << 20;
inline constexpr uint32_t kMaxParamNameBytes = 256;
inline constexpr uint32_t kMaxRank = 4;  ///< dims per parameter
inline constexpr uint64_t kMaxTotalElems = 1ull << 40;
/// At most this many chunks (a 2^40-element space needs chunks of 64 Ki elements or more).
/// Chunk ids are u32 on the wire; without the bound a layout of small chunks over a large
/// space truncated its chunk count (seen while fixing an out-of-memory fuzz_job_layout
/// found: tests/fuzz/corpus/job_layout/oom-layout-huge-param-small-chunks).
inline constexpr uint64_t kMaxChunks = 1ull << 24;

struct ParamSpec {
  std::string name;            // unique, 1..kMaxParamNameBytes bytes
  std::vector<int64_t> shape;  // 1..kMaxRank positive dims
  uint64_t numel() const;
};

struct LayoutOptions {
  uint64_t chunk_elems = 4u << 20;  // Default: 4 Mi elements (16 MiB of fp32 master per chunk).
  uint32_t align_elems = 64;        // Default: 64 (256 B): every parameter starts aligned.
  uint32_t num_shards = 1;          // Default: 1.
};

/// One contiguous run of a parameter inside one chunk.
struct Piece {
  uint32_t chunk = 0;
  uint64_t chunk_offset = 0;  // elements from the chunk's start
  uint64_t param_offset = 0;  // elements from the parameter's start
  uint64_t length = 0;        // elements
};

class Layout {
 public:
  /// Errors: InvalidArgument for empty/duplicate/oversized names, bad shapes, chunk_elems not a
  /// positive multiple of align_elems, num_shards == 0, a space beyond kMaxTotalElems, or more
  /// than kMaxChunks chunks.
  static Result<Layout> Build(std::vector<ParamSpec> specs, LayoutOptions options);

  const LayoutOptions& options() const { return options_; }
  uint32_t num_params() const { return static_cast<uint32_t>(specs_.size()); }
  const ParamSpec& spec(uint32_t id) const { return specs_[id]; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  uint64_t param_offset(uint32_t id) const { return offsets_[id]; }
  uint64_t param_numel(uint32_t id) const { return numels_[id]; }
  /// Total elements of the flat space, padding included.
  uint64_t total_elems() const { return total_elems_; }
  uint32_t num_chunks() const { return num_chunks_; }
  /// Elements in chunk c (the last one may be short).
  uint64_t chunk_size(uint32_t c) const;
  uint32_t shard_of_chunk(uint32_t c) const { return c % options_.num_shards; }
  /// Chunks owned by `shard`, ascending.
  std::vector<uint32_t> ChunksOfShard(uint32_t shard) const;
  /// Looks a parameter up by name. Errors: NotFound.
  Result<uint32_t> Find(std::string_view name) const;

  /// The pieces covering elements [begin, begin+len) of parameter `id`, in order.
  /// Errors: OutOfRange for a bad id or range.
  Result<std::vector<Piece>> Pieces(uint32_t id, uint64_t begin, uint64_t len) const;
  Result<std::vector<Piece>> Pieces(uint32_t id) const {
    if (id >= specs_.size())
      return OutOfRange("parameter id " + std::to_string(id) + " out of range");
    return Pieces(id, 0, param_numel(id));
  }

  /// 64-bit hash of specs and options (FNV-1a over the serialised form).
  uint64_t Hash() const { return hash_; }
  /// Stable binary form (for the wire and the catalog), and its inverse. Deserialize validates
  /// everything (counts, names, dims, options) and rebuilds; errors: InvalidArgument/DataLoss.
  std::vector<std::byte> Serialize() const;
  static Result<Layout> Deserialize(std::span<const std::byte> bytes);

 private:
  LayoutOptions options_;
  std::vector<ParamSpec> specs_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> numels_;
  uint64_t total_elems_ = 0;
  uint32_t num_chunks_ = 0;
  uint64_t hash_ = 0;
};

}  // namespace zps
