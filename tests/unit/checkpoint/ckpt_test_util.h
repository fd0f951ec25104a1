// ckpt_test_util.h — small layouts and deterministic chunk contents for checkpoint tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "zps/common/layout.h"
#include "zps/server/checkpoint.h"

namespace zps::server::testing {

/// A fresh directory under the test temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zps-ckpt-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Three parameters over chunks of `chunk` elements, `shards` shards; p0 spans several chunks.
inline Layout SmallLayout(uint32_t shards, uint64_t chunk = 1024) {
  auto l = Layout::Build({{"embed.weight", {37, 50}}, {"blk.0.bias", {70}}, {"head", {3, 5, 7}}},
                         {.chunk_elems = chunk, .align_elems = 64, .num_shards = shards});
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

/// The value of flat element i for tensor kind k (0 master, 1 m, 2 v) at `step`.
inline float Value(uint64_t i, int k, int64_t step) {
  return std::sin(static_cast<float>(i) * 0.001f + static_cast<float>(k)) * 3.0f +
         static_cast<float>(step) * 0.25f;
}

/// A chunk's tensors with fp32 moments (m and v packed as fp32 are their floats' bytes).
struct ChunkData {
  std::vector<float> master, m, v;
  ChunkTensors tensors() const {
    return {master, std::as_bytes(std::span(m)), std::as_bytes(std::span(v))};
  }
  ChunkTensorsOut out() {
    return {master, std::as_writable_bytes(std::span(m)), std::as_writable_bytes(std::span(v))};
  }
};

inline ChunkData MakeChunk(const Layout& l, uint32_t chunk, int64_t step) {
  const uint64_t n = l.chunk_size(chunk);
  const uint64_t base = uint64_t{chunk} * l.options().chunk_elems;
  ChunkData d{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (uint64_t i = 0; i < n; ++i) {
    d.master[i] = Value(base + i, 0, step);
    d.m[i] = Value(base + i, 1, step);
    d.v[i] = Value(base + i, 2, step);
  }
  return d;
}

/// Writes and commits checkpoint `step` of every local chunk, with a state blob.
inline Status WriteCheckpoint(CheckpointStore& store, const Layout& l, uint32_t shard,
                              int64_t step) {
  ZPS_ASSIGN_OR_RETURN(auto w, store.BeginCheckpoint(step));
  for (uint32_t c : l.ChunksOfShard(shard)) {
    auto d = MakeChunk(l, c, step);
    ZPS_RETURN_IF_ERROR(w->AddChunk(c, step + 1, d.tensors()));
  }
  std::string state = "state@" + std::to_string(step);
  ZPS_RETURN_IF_ERROR(w->SetState(std::as_bytes(std::span(state.data(), state.size()))));
  return w->Commit();
}

/// Checks every local chunk of `step` against MakeChunk.
inline void ExpectCheckpoint(const CheckpointStore& store, const Layout& l, uint32_t shard,
                             int64_t step) {
  auto r = store.OpenCheckpoint(step);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (uint32_t c : l.ChunksOfShard(shard)) {
    auto want = MakeChunk(l, c, step);
    ChunkData got{std::vector<float>(want.master.size()), std::vector<float>(want.m.size()),
                  std::vector<float>(want.v.size())};
    Status s = (*r)->ReadChunk(c, got.out());
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(got.master, want.master) << "chunk " << c;
    ASSERT_EQ(got.m, want.m);
    ASSERT_EQ(got.v, want.v);
  }
  auto state = (*r)->ReadState();
  ASSERT_TRUE(state.ok());
  std::string want = "state@" + std::to_string(step);
  ASSERT_EQ(std::string(reinterpret_cast<const char*>(state->data()), state->size()), want);
}

}  // namespace zps::server::testing
