#include "zps/server/checkpoint_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "zps/common/logging.h"
#include "zps/common/scoped_fd.h"
#include "zps/server/checkpoint.h"

namespace zps::server {
namespace {

// Owns the output descriptor and the temporary name until Finish() renames it into place.
class OutputFile {
 public:
  static Result<std::unique_ptr<OutputFile>> Create(const std::string& path) {
    auto f = std::unique_ptr<OutputFile>(new OutputFile());
    f->path_ = path;
    f->tmp_ = path + ".tmp";
    f->fd_ = ScopedFd(::open(f->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!f->fd_.valid()) return ErrnoError("create " + f->tmp_, errno);
    return f;
  }
  ~OutputFile() {
    fd_ = ScopedFd();
    if (!done_) ::unlink(tmp_.c_str());
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  Status Write(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_.get(), p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoError("write " + tmp_, errno);
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
    return Status::Ok();
  }
  Status Finish() {
    if (::fsync(fd_.get()) != 0) return ErrnoError("fsync " + tmp_, errno);
    if (fd_.Close() != 0) return ErrnoError("close " + tmp_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) return ErrnoError("rename to " + path_, errno);
    done_ = true;
    return Status::Ok();
  }
  uint64_t written() const { return written_; }

 private:
  OutputFile() = default;
  std::string path_, tmp_;
  ScopedFd fd_;
  bool done_ = false;
  uint64_t written_ = 0;
};

struct Shard {
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<CheckpointReader> reader;
};

Result<int64_t> NewestCommonStep(const std::vector<Shard>& shards) {
  std::map<int64_t, size_t> count;
  for (const auto& s : shards) {
    ZPS_ASSIGN_OR_RETURN(auto list, s.store->ListCheckpoints(false));
    for (const auto& c : list) {
      if (c.verification != Verification::kCorrupt) ++count[c.step];
    }
  }
  for (auto it = count.rbegin(); it != count.rend(); ++it) {
    if (it->second == shards.size()) return it->first;
  }
  return NotFound("no checkpoint step is committed on every shard");
}

}  // namespace

Result<ExportStats> ExportSafetensors(const ExportOptions& o) {
  if (o.data_dirs.empty()) return InvalidArgument("export: no data directories");
  if (o.out.empty()) return InvalidArgument("export: no output path");
  if (o.dtype == DType::kF16) return InvalidArgument("export: dtype must be fp32 or bf16");
  if (o.write_buffer_bytes < 4096) return InvalidArgument("export: write buffer below 4 KiB");

  // Open every shard read-only and check they form one job.
  CheckpointOptions copts;
  copts.read_only = true;
  copts.create_if_missing = false;
  std::vector<Shard> by_shard;
  std::vector<bool> seen;
  Layout layout;
  for (size_t i = 0; i < o.data_dirs.size(); ++i) {
    ZPS_ASSIGN_OR_RETURN(auto store, CheckpointStore::Open(o.data_dirs[i], copts));
    ZPS_ASSIGN_OR_RETURN(auto l, store->GetLayout());
    ZPS_ASSIGN_OR_RETURN(uint32_t shard, store->GetShard());
    if (i == 0) {
      layout = std::move(l);
      if (layout.options().num_shards != o.data_dirs.size()) {
        return InvalidArgument("export: the layout has " +
                               std::to_string(layout.options().num_shards) + " shards but " +
                               std::to_string(o.data_dirs.size()) + " directories were given");
      }
      by_shard.resize(o.data_dirs.size());
      seen.assign(o.data_dirs.size(), false);
    } else if (l.Hash() != layout.Hash()) {
      return InvalidArgument("export: " + o.data_dirs[i] + " has another layout than " +
                             o.data_dirs[0]);
    }
    if (shard >= by_shard.size() || seen[shard]) {
      return InvalidArgument("export: shard " + std::to_string(shard) + " (" + o.data_dirs[i] +
                             ") given twice or out of range");
    }
    seen[shard] = true;
    by_shard[shard].store = std::move(store);
  }
  int64_t step = o.step;
  if (step < 0) {
    ZPS_ASSIGN_OR_RETURN(step, NewestCommonStep(by_shard));
  }
  for (auto& s : by_shard) {
    ZPS_ASSIGN_OR_RETURN(s.reader, s.store->OpenCheckpoint(step));
    if (s.reader->info().layout_hash != layout.Hash()) {
      return DataLoss("export: checkpoint " + std::to_string(step) + " in " + s.store->dir() +
                      " was written for another layout");
    }
  }

  // Header.
  const size_t esize = DTypeSize(o.dtype);
  // The layout's hash as of one shard: the weights do not depend on where the chunks lived, and
  // a job resharded at some step exports the same bytes as one that never was.
  LayoutOptions one_shard = layout.options();
  one_shard.num_shards = 1;
  ZPS_ASSIGN_OR_RETURN(Layout placement_free, Layout::Build(layout.specs(), one_shard));
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"},
                            {"zps_step", std::to_string(step)},
                            {"zps_layout_hash", std::to_string(placement_free.Hash())}};
  uint64_t offset = 0;
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    const auto& spec = layout.spec(p);
    const uint64_t bytes = layout.param_numel(p) * esize;
    header[spec.name] = {{"dtype", o.dtype == DType::kF32 ? "F32" : "BF16"},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t header_len = text.size();

  ZPS_ASSIGN_OR_RETURN(auto file, OutputFile::Create(o.out));
  ZPS_RETURN_IF_ERROR(file->Write(&header_len, 8));  // little-endian (checked in bytes.h)
  ZPS_RETURN_IF_ERROR(file->Write(text.data(), text.size()));

  // Data: parameters in order; their pieces visit chunks in ascending order, so one chunk at a
  // time is enough.
  std::vector<float> chunk_buf(layout.options().chunk_elems);
  std::vector<std::byte> out_buf;
  out_buf.reserve(o.write_buffer_bytes);
  int64_t loaded = -1;
  auto flush = [&]() -> Status {
    Status s = file->Write(out_buf.data(), out_buf.size());
    out_buf.clear();
    return s;
  };
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    ZPS_ASSIGN_OR_RETURN(auto pieces, layout.Pieces(p));
    for (const auto& piece : pieces) {
      if (static_cast<int64_t>(piece.chunk) != loaded) {
        const uint64_t n = layout.chunk_size(piece.chunk);
        const auto& shard = by_shard[layout.shard_of_chunk(piece.chunk)];
        ZPS_RETURN_IF_ERROR(
            shard.reader->ReadChunk(piece.chunk, {std::span<float>(chunk_buf.data(), n), {}, {}}));
        loaded = piece.chunk;
      }
      const float* src = chunk_buf.data() + piece.chunk_offset;
      uint64_t done = 0;
      while (done < piece.length) {
        if (out_buf.size() + esize > o.write_buffer_bytes) ZPS_RETURN_IF_ERROR(flush());
        const uint64_t room = (o.write_buffer_bytes - out_buf.size()) / esize;
        const uint64_t n = std::min(room, piece.length - done);
        const size_t at = out_buf.size();
        out_buf.resize(at + n * esize);
        if (o.dtype == DType::kF32) {
          std::memcpy(out_buf.data() + at, src + done, n * 4);
        } else {
          ConvertF32ToBF16(
              std::span<const float>(src + done, n),
              std::span<uint16_t>(reinterpret_cast<uint16_t*>(out_buf.data() + at), n));
        }
        done += n;
      }
    }
  }
  ZPS_RETURN_IF_ERROR(flush());
  ExportStats stats;
  stats.step = step;
  stats.params = layout.num_params();
  stats.header_bytes = header_len;
  stats.file_bytes = file->written();
  stats.peak_buffer_bytes = chunk_buf.size() * sizeof(float) + out_buf.capacity();
  if (stats.file_bytes != 8 + header_len + offset) {
    return Internal("export: wrote " + std::to_string(stats.file_bytes) + " bytes, expected " +
                    std::to_string(8 + header_len + offset));
  }
  ZPS_RETURN_IF_ERROR(file->Finish());
  return stats;
}

}  // namespace zps::server
