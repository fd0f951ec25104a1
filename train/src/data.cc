#include "zps/train/data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace zps::train {
namespace {

constexpr uint64_t kMaxCorpusBytes = 4ull << 30;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Status ReadFile(const std::filesystem::path& p, std::string* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return IoError("cannot open corpus file " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("cannot read corpus file " + p.string());
  out->append(ss.str());
  if (out->size() > kMaxCorpusBytes) return InvalidArgument("corpus larger than 4 GiB");
  return Status::Ok();
}

}  // namespace

Result<std::string> LoadCorpus(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p = path.empty() ? fs::path(std::string(kDefaultCorpusDir)) : fs::path(path);
  std::error_code ec;
  const auto st = fs::status(p, ec);
  if (ec || !fs::exists(st)) return NotFound("corpus path " + p.string() + " does not exist");
  std::string out;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(p, ec)) {
      if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
      files.push_back(e.path());
    }
    if (ec) return IoError("cannot list corpus directory " + p.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) ZPS_RETURN_IF_ERROR(ReadFile(f, &out));
  } else {
    ZPS_RETURN_IF_ERROR(ReadFile(p, &out));
  }
  if (out.empty()) return InvalidArgument("corpus " + p.string() + " is empty");
  return out;
}

DataLoader::DataLoader(std::string corpus, const DataOptions& options, int64_t train_windows)
    : corpus_(std::move(corpus)), options_(options), train_windows_(train_windows) {}

Result<std::unique_ptr<DataLoader>> DataLoader::Create(std::string corpus, const DataOptions& o) {
  if (o.seq_len < 1) return InvalidArgument("data: seq_len must be >= 1");
  if (o.batch < 1) return InvalidArgument("data: batch must be >= 1");
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    return InvalidArgument("data: need 0 <= rank < world");
  if (o.eval_windows < 0) return InvalidArgument("data: eval_windows must be >= 0");
  const int64_t windows = static_cast<int64_t>(corpus.size()) / (o.seq_len + 1);
  const int64_t train = windows - o.eval_windows;
  const int64_t per_step = static_cast<int64_t>(o.world) * o.batch;
  if (train < per_step)
    return InvalidArgument("data: corpus of " + std::to_string(corpus.size()) + " bytes has " +
                           std::to_string(windows) + " windows of " +
                           std::to_string(o.seq_len + 1) + " bytes; need " +
                           std::to_string(per_step) + " per step plus " +
                           std::to_string(o.eval_windows) + " held out");
  return std::unique_ptr<DataLoader>(new DataLoader(std::move(corpus), o, train));
}

size_t DataLoader::batch_bytes() const {
  return static_cast<size_t>(options_.batch) * (static_cast<size_t>(options_.seq_len) + 1);
}

std::vector<int64_t> DataLoader::Permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(train_windows_));
  for (int64_t i = 0; i < train_windows_; ++i) perm[static_cast<size_t>(i)] = i;
  uint64_t state = options_.seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(epoch);
  for (int64_t i = train_windows_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

int64_t DataLoader::WindowOf(int64_t step, int rank, int i) const {
  const int64_t per_step = static_cast<int64_t>(options_.world) * options_.batch;
  const int64_t spe = steps_per_epoch();
  const auto perm = Permutation(step / spe);
  return perm[static_cast<size_t>((step % spe) * per_step +
                                  static_cast<int64_t>(rank) * options_.batch + i)];
}

Status DataLoader::Batch(int64_t step, std::span<uint8_t> out) const {
  return BatchForRank(step, options_.rank, out);
}

Status DataLoader::BatchForRank(int64_t step, int rank, std::span<uint8_t> out) const {
  if (step < 0) return InvalidArgument("data: step must be >= 0");
  if (rank < 0 || rank >= options_.world) return InvalidArgument("data: rank out of range");
  if (out.size() != batch_bytes())
    return InvalidArgument("data: batch buffer has " + std::to_string(out.size()) +
                           " bytes, expected " + std::to_string(batch_bytes()));
  const int64_t per_step = static_cast<int64_t>(options_.world) * options_.batch;
  const int64_t spe = steps_per_epoch();
  const auto perm = Permutation(step / spe);
  const size_t w = static_cast<size_t>(options_.seq_len) + 1;
  for (int i = 0; i < options_.batch; ++i) {
    const int64_t win = perm[static_cast<size_t>((step % spe) * per_step +
                                                 static_cast<int64_t>(rank) * options_.batch + i)];
    std::memcpy(out.data() + static_cast<size_t>(i) * w,
                corpus_.data() + static_cast<size_t>(win) * w, w);
  }
  return Status::Ok();
}

Status DataLoader::EvalBatch(int first, int count, std::span<uint8_t> out) const {
  if (first < 0 || count < 1 || first + count > options_.eval_windows)
    return OutOfRange("data: eval windows [" + std::to_string(first) + ", +" +
                      std::to_string(count) + ") past " + std::to_string(options_.eval_windows));
  const size_t w = static_cast<size_t>(options_.seq_len) + 1;
  if (out.size() != static_cast<size_t>(count) * w)
    return InvalidArgument("data: eval buffer size mismatch");
  const size_t base = static_cast<size_t>(train_windows_ + first) * w;
  std::memcpy(out.data(), corpus_.data() + base, out.size());
  return Status::Ok();
}

}  // namespace zps::train
