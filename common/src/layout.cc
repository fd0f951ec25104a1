#include "zps/common/layout.h"

#include <algorithm>
#include <unordered_set>

#include "zps/common/bytes.h"

namespace zps {
namespace {

constexpr uint32_t kLayoutMagic = 0x5a50534cu;  // "ZPSL"
constexpr uint32_t kLayoutVersion = 1;

uint64_t Fnv1a(std::span<const std::byte> bytes) {
  uint64_t h = 1469598103934665603ull;
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

uint64_t ParamSpec::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<Layout> Layout::Build(std::vector<ParamSpec> specs, LayoutOptions options) {
  if (options.align_elems == 0 || options.chunk_elems == 0 ||
      options.chunk_elems % options.align_elems != 0) {
    return InvalidArgument("chunk_elems must be a positive multiple of align_elems (" +
                           std::to_string(options.align_elems) + ")");
  }
  if (options.chunk_elems > (1ull << 32)) return InvalidArgument("chunk_elems must be <= 2^32");
  if (options.num_shards == 0 || options.num_shards > 4096) {
    return InvalidArgument("num_shards must be in [1, 4096]");
  }
  if (specs.empty()) return InvalidArgument("a layout needs at least one parameter");
  if (specs.size() > kMaxParams) {
    return InvalidArgument("too many parameters: " + std::to_string(specs.size()));
  }
  Layout l;
  l.options_ = options;
  std::unordered_set<std::string> names;
  uint64_t off = 0;
  for (const auto& s : specs) {
    if (s.name.empty() || s.name.size() > kMaxParamNameBytes) {
      return InvalidArgument("parameter name must be 1.." + std::to_string(kMaxParamNameBytes) +
                             " bytes");
    }
    if (!names.insert(s.name).second) {
      return InvalidArgument("duplicate parameter name '" + s.name + "'");
    }
    if (s.shape.empty() || s.shape.size() > kMaxRank) {
      return InvalidArgument("parameter '" + s.name + "' must have 1.." + std::to_string(kMaxRank) +
                             " dims");
    }
    uint64_t n = 1;
    for (int64_t d : s.shape) {
      if (d <= 0 || static_cast<uint64_t>(d) > kMaxTotalElems ||
          n > kMaxTotalElems / static_cast<uint64_t>(d)) {
        return InvalidArgument("parameter '" + s.name + "' has a bad shape");
      }
      n *= static_cast<uint64_t>(d);
    }
    off = (off + options.align_elems - 1) / options.align_elems * options.align_elems;
    l.offsets_.push_back(off);
    l.numels_.push_back(n);
    off += n;
    if (off > kMaxTotalElems) return InvalidArgument("parameter space exceeds 2^40 elements");
  }
  l.total_elems_ = off;
  const uint64_t chunks = (off + options.chunk_elems - 1) / options.chunk_elems;
  if (chunks > kMaxChunks) {
    return InvalidArgument("the layout has " + std::to_string(chunks) + " chunks (at most " +
                           std::to_string(kMaxChunks) + "): use larger chunk_elems");
  }
  l.num_chunks_ = static_cast<uint32_t>(chunks);
  l.specs_ = std::move(specs);
  l.hash_ = Fnv1a(l.Serialize());
  return l;
}

uint64_t Layout::chunk_size(uint32_t c) const {
  uint64_t begin = static_cast<uint64_t>(c) * options_.chunk_elems;
  return std::min(options_.chunk_elems, total_elems_ - begin);
}

std::vector<uint32_t> Layout::ChunksOfShard(uint32_t shard) const {
  std::vector<uint32_t> out;
  for (uint32_t c = shard; c < num_chunks_; c += options_.num_shards) out.push_back(c);
  return out;
}

Result<uint32_t> Layout::Find(std::string_view name) const {
  for (uint32_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return i;
  }
  return NotFound("no parameter named '" + std::string(name) + "'");
}

Result<std::vector<Piece>> Layout::Pieces(uint32_t id, uint64_t begin, uint64_t len) const {
  if (id >= specs_.size())
    return OutOfRange("parameter id " + std::to_string(id) + " out of range");
  if (begin > numels_[id] || len > numels_[id] - begin) {
    return OutOfRange("range [" + std::to_string(begin) + ", +" + std::to_string(len) +
                      ") outside parameter '" + specs_[id].name + "'");
  }
  std::vector<Piece> out;
  uint64_t flat = offsets_[id] + begin;
  uint64_t left = len;
  uint64_t poff = begin;
  while (left > 0) {
    uint32_t c = static_cast<uint32_t>(flat / options_.chunk_elems);
    uint64_t coff = flat % options_.chunk_elems;
    uint64_t n = std::min(left, options_.chunk_elems - coff);
    out.push_back({c, coff, poff, n});
    flat += n;
    poff += n;
    left -= n;
  }
  return out;
}

std::vector<std::byte> Layout::Serialize() const {
  ByteWriter w;
  w.U32(kLayoutMagic);
  w.U32(kLayoutVersion);
  w.U64(options_.chunk_elems);
  w.U32(options_.align_elems);
  w.U32(options_.num_shards);
  w.U32(static_cast<uint32_t>(specs_.size()));
  for (const auto& s : specs_) {
    w.Str(s.name);
    w.U8(static_cast<uint8_t>(s.shape.size()));
    for (int64_t d : s.shape) w.I64(d);
  }
  return w.Take();
}

Result<Layout> Layout::Deserialize(std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  ZPS_ASSIGN_OR_RETURN(uint32_t magic, r.U32("layout.magic"));
  if (magic != kLayoutMagic) return DataLoss("not a zps layout (bad magic)");
  ZPS_ASSIGN_OR_RETURN(uint32_t version, r.U32("layout.version"));
  if (version != kLayoutVersion) {
    return InvalidArgument("unsupported layout version " + std::to_string(version));
  }
  LayoutOptions o;
  ZPS_ASSIGN_OR_RETURN(o.chunk_elems, r.U64("layout.chunk_elems"));
  ZPS_ASSIGN_OR_RETURN(o.align_elems, r.U32("layout.align_elems"));
  ZPS_ASSIGN_OR_RETURN(o.num_shards, r.U32("layout.num_shards"));
  ZPS_ASSIGN_OR_RETURN(uint32_t count, r.U32("layout.num_params"));
  if (count == 0 || count > kMaxParams) {
    return InvalidArgument("layout parameter count " + std::to_string(count) + " out of range");
  }
  std::vector<ParamSpec> specs;
  specs.reserve(std::min<uint32_t>(count, 65536));
  for (uint32_t i = 0; i < count; ++i) {
    ParamSpec s;
    ZPS_ASSIGN_OR_RETURN(s.name, r.Str("param.name", kMaxParamNameBytes));
    ZPS_ASSIGN_OR_RETURN(uint8_t rank, r.U8("param.rank"));
    if (rank == 0 || rank > kMaxRank) return InvalidArgument("parameter rank out of range");
    for (uint8_t d = 0; d < rank; ++d) {
      ZPS_ASSIGN_OR_RETURN(int64_t dim, r.I64("param.dim"));
      s.shape.push_back(dim);
    }
    specs.push_back(std::move(s));
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("layout"));
  return Build(std::move(specs), o);
}

}  // namespace zps
