#include "zps/server/checkpoint_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

// One output file of an export: the parameters [first, end) in layout order.
struct FilePlan {
  std::string path;
  uint32_t first = 0, end = 0;
};

// Appends parameters' values to output files in layout order, one chunk of fp32 read at a time:
// a parameter's pieces visit chunks in ascending order, and so do consecutive parameters, also
// across files.
class ParamStreamer {
 public:
  ParamStreamer(const Layout& layout, const std::vector<Shard>& by_shard, DType dtype,
                uint64_t buffer_bytes)
      : layout_(layout),
        by_shard_(by_shard),
        dtype_(dtype),
        esize_(DTypeSize(dtype)),
        buffer_bytes_(buffer_bytes),
        chunk_buf_(layout.options().chunk_elems) {
    out_buf_.reserve(buffer_bytes);
  }

  Status Write(uint32_t p, OutputFile& file) {
    ZPS_ASSIGN_OR_RETURN(auto pieces, layout_.Pieces(p));
    for (const auto& piece : pieces) {
      if (static_cast<int64_t>(piece.chunk) != loaded_) {
        const uint64_t n = layout_.chunk_size(piece.chunk);
        const auto& shard = by_shard_[layout_.shard_of_chunk(piece.chunk)];
        ZPS_RETURN_IF_ERROR(
            shard.reader->ReadChunk(piece.chunk, {std::span<float>(chunk_buf_.data(), n), {}, {}}));
        loaded_ = piece.chunk;
      }
      const float* src = chunk_buf_.data() + piece.chunk_offset;
      uint64_t done = 0;
      while (done < piece.length) {
        if (out_buf_.size() + esize_ > buffer_bytes_) ZPS_RETURN_IF_ERROR(Flush(file));
        const uint64_t room = (buffer_bytes_ - out_buf_.size()) / esize_;
        const uint64_t n = std::min(room, piece.length - done);
        const size_t at = out_buf_.size();
        out_buf_.resize(at + n * esize_);
        if (dtype_ == DType::kF32) {
          std::memcpy(out_buf_.data() + at, src + done, n * 4);
        } else {
          ConvertF32ToBF16(
              std::span<const float>(src + done, n),
              std::span<uint16_t>(reinterpret_cast<uint16_t*>(out_buf_.data() + at), n));
        }
        done += n;
      }
    }
    return Status::Ok();
  }

  Status Flush(OutputFile& file) {
    Status s = file.Write(out_buf_.data(), out_buf_.size());
    out_buf_.clear();
    return s;
  }

  uint64_t peak_bytes() const { return chunk_buf_.size() * sizeof(float) + out_buf_.capacity(); }

 private:
  const Layout& layout_;
  const std::vector<Shard>& by_shard_;
  const DType dtype_;
  const size_t esize_;
  const uint64_t buffer_bytes_;
  std::vector<float> chunk_buf_;
  std::vector<std::byte> out_buf_;
  int64_t loaded_ = -1;
};

// The JSON header of one file (padded to 8 bytes) and the size of its data section.
std::pair<std::string, uint64_t> FileHeader(const Layout& layout, const FilePlan& plan, DType dtype,
                                            const nlohmann::ordered_json& metadata) {
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  const size_t esize = DTypeSize(dtype);
  uint64_t offset = 0;
  for (uint32_t p = plan.first; p < plan.end; ++p) {
    const auto& spec = layout.spec(p);
    const uint64_t bytes = layout.param_numel(p) * esize;
    header[spec.name] = {{"dtype", dtype == DType::kF32 ? "F32" : "BF16"},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return {std::move(text), offset};
}

// The sharded set's files, or the one file.
Result<std::vector<FilePlan>> PlanFiles(const ExportOptions& o, const Layout& layout) {
  if (o.max_shard_bytes == 0) return std::vector<FilePlan>{{o.out, 0, layout.num_params()}};
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return IoError("export: create directory " + o.out + ": " + ec.message());
  std::vector<uint64_t> sizes(layout.num_params());
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    sizes[p] = layout.param_numel(p) * DTypeSize(o.dtype);
  }
  const auto starts = SplitIntoFiles(sizes, o.max_shard_bytes);
  std::vector<FilePlan> plans;
  for (size_t i = 0; i < starts.size(); ++i) {
    const uint32_t end =
        i + 1 < starts.size() ? static_cast<uint32_t>(starts[i + 1]) : layout.num_params();
    plans.push_back({(std::filesystem::path(o.out) / ShardFileName(i, starts.size())).string(),
                     static_cast<uint32_t>(starts[i]), end});
  }
  return plans;
}

// Writes the sharded set's index: Hugging Face's keys, names sorted (as its json.dumps does).
Status WriteIndex(const ExportOptions& o, const Layout& layout, const std::vector<FilePlan>& plans,
                  uint64_t total_size) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& plan : plans) {
    const std::string file = std::filesystem::path(plan.path).filename().string();
    for (uint32_t p = plan.first; p < plan.end; ++p) weight_map[layout.spec(p).name] = file;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = std::move(weight_map);
  const std::string text = index.dump(2) + "\n";
  ZPS_ASSIGN_OR_RETURN(
      auto file, OutputFile::Create((std::filesystem::path(o.out) / kShardIndexName).string()));
  ZPS_RETURN_IF_ERROR(file->Write(text.data(), text.size()));
  ZPS_RETURN_IF_ERROR(file->Finish());
  // The renames into the directory are durable only once the directory is.
  ScopedFd dir(::open(o.out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoError("open " + o.out, errno);
  if (::fsync(dir.get()) != 0) return ErrnoError("fsync " + o.out, errno);
  return Status::Ok();
}

}  // namespace

std::vector<size_t> SplitIntoFiles(std::span<const uint64_t> tensor_bytes,
                                   uint64_t max_file_bytes) {
  std::vector<size_t> starts;
  uint64_t current = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    if (starts.empty() || current + tensor_bytes[i] > max_file_bytes) {
      starts.push_back(i);
      current = 0;
    }
    current += tensor_bytes[i];
  }
  return starts;
}

std::string ShardFileName(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

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

  // The layout's hash as of one shard: the weights do not depend on where the chunks lived, and
  // a job resharded at some step exports the same bytes as one that never was.
  LayoutOptions one_shard = layout.options();
  one_shard.num_shards = 1;
  ZPS_ASSIGN_OR_RETURN(Layout placement_free, Layout::Build(layout.specs(), one_shard));
  const nlohmann::ordered_json metadata = {
      {"format", "pt"},
      {"zps_step", std::to_string(step)},
      {"zps_layout_hash", std::to_string(placement_free.Hash())}};

  ZPS_ASSIGN_OR_RETURN(auto plans, PlanFiles(o, layout));
  ParamStreamer streamer(layout, by_shard, o.dtype, o.write_buffer_bytes);
  ExportStats stats;
  stats.step = step;
  stats.params = layout.num_params();
  uint64_t total_data = 0;
  // Every file stays under its temporary name until all are complete.
  std::vector<std::unique_ptr<OutputFile>> files;
  for (const auto& plan : plans) {
    auto [text, data_bytes] = FileHeader(layout, plan, o.dtype, metadata);
    const uint64_t header_len = text.size();
    ZPS_ASSIGN_OR_RETURN(auto file, OutputFile::Create(plan.path));
    ZPS_RETURN_IF_ERROR(file->Write(&header_len, 8));  // little-endian (checked in bytes.h)
    ZPS_RETURN_IF_ERROR(file->Write(text.data(), text.size()));
    for (uint32_t p = plan.first; p < plan.end; ++p) ZPS_RETURN_IF_ERROR(streamer.Write(p, *file));
    ZPS_RETURN_IF_ERROR(streamer.Flush(*file));
    if (file->written() != 8 + header_len + data_bytes) {
      return Internal("export: wrote " + std::to_string(file->written()) + " bytes to " +
                      plan.path + ", expected " + std::to_string(8 + header_len + data_bytes));
    }
    stats.header_bytes += header_len;
    stats.file_bytes += file->written();
    total_data += data_bytes;
    files.push_back(std::move(file));
  }
  for (auto& file : files) ZPS_RETURN_IF_ERROR(file->Finish());
  if (o.max_shard_bytes > 0) ZPS_RETURN_IF_ERROR(WriteIndex(o, layout, plans, total_data));
  stats.files = static_cast<uint32_t>(files.size());
  stats.peak_buffer_bytes = streamer.peak_bytes();
  return stats;
}

}  // namespace zps::server
