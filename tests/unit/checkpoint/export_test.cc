// Exports checkpoints made through the API from known values and reads them back with the
// independent reader tools/safetensors_read.py.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt_test_util.h"
#include "zps/common/dtype.h"
#include "zps/server/checkpoint_export.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {
namespace {

// The first python3 that has numpy (a pyenv shim on PATH may lack the Debian package).
const std::string& Python() {
  static const std::string python = [] {
    for (const char* p : {"python3", "/usr/bin/python3"}) {
      if (std::system((std::string(p) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
        return std::string(p);
      }
    }
    return std::string();
  }();
  return python;
}

std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// Reads the reader's dump: name -> values.
std::map<std::string, std::vector<float>> ReadDump(const std::string& dir) {
  std::map<std::string, std::vector<float>> out;
  std::ifstream idx(dir + "/index.txt");
  std::string i, name;
  while (idx >> i >> name) {
    std::ifstream f(dir + "/" + i + ".f32", std::ios::binary | std::ios::ate);
    std::vector<float> v(static_cast<size_t>(f.tellg()) / 4);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    out[name] = std::move(v);
  }
  return out;
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Python().empty()) GTEST_SKIP() << "python3 with numpy is needed for the reader";
    for (uint32_t s = 0; s < 2; ++s) {
      dirs_.push_back(dir_.sub("shard" + std::to_string(s)));
      auto store = CheckpointStore::Open(dirs_.back(), {});
      ASSERT_THAT(store, IsOk());
      ASSERT_THAT((*store)->SetIdentity(layout_, s), IsOk());
      ASSERT_THAT(WriteCheckpoint(**store, layout_, s, 6), IsOk());
      ASSERT_THAT(WriteCheckpoint(**store, layout_, s, 7), IsOk());
    }
  }
  // Reads `files` (one export, in order) with the independent reader and compares them with
  // the known parameters: together they hold each parameter once, in layout order.
  void Check(const std::vector<std::string>& files, DType dtype, int64_t step) {
    std::map<std::string, std::vector<float>> got;
    std::string out;
    for (const auto& file : files) {
      const std::string dump = dir_.sub("dump" + std::to_string(++dumps_));
      auto [rc, text] = RunCommand(Python() + " " ZPS_SOURCE_DIR "/tools/safetensors_read.py " +
                                   file + " --dump " + dump);
      ASSERT_EQ(rc, 0) << text;
      EXPECT_NE(text.find("\"zps_step\": \"" + std::to_string(step) + "\""), std::string::npos)
          << text;
      for (auto& [name, v] : ReadDump(dump)) {
        EXPECT_TRUE(got.emplace(name, std::move(v)).second) << name << " in two files";
      }
      out += text;
    }
    ASSERT_EQ(got.size(), layout_.num_params());
    for (uint32_t p = 0; p < layout_.num_params(); ++p) {
      const auto& spec = layout_.spec(p);
      EXPECT_NE(out.find(spec.name + (dtype == DType::kF32 ? " F32 " : " BF16 ")),
                std::string::npos);
      const auto& v = got[spec.name];
      ASSERT_EQ(v.size(), layout_.param_numel(p)) << spec.name;
      for (uint64_t j = 0; j < v.size(); ++j) {
        float want = Value(layout_.param_offset(p) + j, 0, step);
        if (dtype == DType::kBF16) want = Bf16ToFloat(FloatToBf16(want));
        ASSERT_EQ(v[j], want) << spec.name << "[" << j << "]";
      }
    }
  }
  void Check(const std::string& file, DType dtype, int64_t step) {
    Check(std::vector<std::string>{file}, dtype, step);
  }
  TempDir dir_;
  Layout layout_ = SmallLayout(2, 1024);  // 3 chunks: 0 and 2 on shard 0, 1 on shard 1
  std::vector<std::string> dirs_;
  int dumps_ = 0;
};

TEST_F(ExportTest, Fp32AndBf16ReadBackWithTheIndependentReader) {
  ASSERT_EQ(layout_.num_chunks(), 3u);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ExportOptions o;
    o.data_dirs = {dirs_[1], dirs_[0]};  // any order
    o.out = dir_.sub(std::string("model-") + std::string(DTypeName(dtype)) + ".safetensors");
    o.dtype = dtype;
    o.write_buffer_bytes = 4096;  // forces many partial flushes
    auto stats = ExportSafetensors(o);
    ASSERT_THAT(stats, IsOk());
    EXPECT_EQ(stats->step, 7);  // newest common step
    EXPECT_EQ(stats->header_bytes % 8, 0u);
    // Bounded memory: one chunk of fp32 plus the write buffer.
    EXPECT_LE(stats->peak_buffer_bytes, layout_.options().chunk_elems * 4 + 4096);
    Check(o.out, dtype, 7);
  }
  ExportOptions older;
  older.data_dirs = dirs_;
  older.step = 6;
  older.out = dir_.sub("older.safetensors");
  ASSERT_THAT(ExportSafetensors(older), IsOk());
  Check(older.out, DType::kF32, 6);
}

TEST_F(ExportTest, BadInputsAreClearErrors) {
  ExportOptions o;
  o.out = dir_.sub("x.safetensors");
  o.data_dirs = {dirs_[0]};
  EXPECT_EQ(ExportSafetensors(o).status().code(), Code::kInvalidArgument);  // one shard missing
  o.data_dirs = {dirs_[0], dirs_[0]};
  EXPECT_EQ(ExportSafetensors(o).status().code(), Code::kInvalidArgument);  // shard twice
  o.data_dirs = dirs_;
  o.step = 99;
  EXPECT_EQ(ExportSafetensors(o).status().code(), Code::kNotFound);
  o.step = 7;
  o.dtype = DType::kF16;
  EXPECT_EQ(ExportSafetensors(o).status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(o.out));
  EXPECT_FALSE(std::filesystem::exists(o.out + ".tmp"));
}

TEST(SplitIntoFiles, FillsFilesInOrderAndGivesALargeTensorItsOwn) {
  using V = std::vector<size_t>;
  EXPECT_EQ(SplitIntoFiles(std::vector<uint64_t>{}, 20), V{});
  EXPECT_EQ(SplitIntoFiles(std::vector<uint64_t>{10, 10, 10}, 20), (V{0, 2}));  // 20 fits
  EXPECT_EQ(SplitIntoFiles(std::vector<uint64_t>{30, 5}, 20), (V{0, 1}));
  EXPECT_EQ(SplitIntoFiles(std::vector<uint64_t>{5, 30, 5, 5}, 20), (V{0, 1, 2}));
  EXPECT_EQ(SplitIntoFiles(std::vector<uint64_t>{0, 0, 7}, 1), (V{0, 2}));
  EXPECT_EQ(ShardFileName(0, 1), "model-00001-of-00001.safetensors");
  EXPECT_EQ(ShardFileName(1, 12), "model-00002-of-00012.safetensors");
}

// The sharded set: embed.weight (7400 bytes of fp32) alone, blk.0.bias (280) alone, head (420)
// alone with a 300-byte limit; the index names each tensor's file and the data's total size.
TEST_F(ExportTest, ShardedSetWithIndex) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ExportOptions o;
    o.data_dirs = dirs_;
    o.out = dir_.sub(std::string("sharded-") + std::string(DTypeName(dtype)));
    o.dtype = dtype;
    o.write_buffer_bytes = 4096;
    o.max_shard_bytes = dtype == DType::kF32 ? 300 : 150;
    auto stats = ExportSafetensors(o);
    ASSERT_THAT(stats, IsOk());
    EXPECT_EQ(stats->files, 3u);
    EXPECT_LE(stats->peak_buffer_bytes, layout_.options().chunk_elems * 4 + 4096);
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(o.out)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    ASSERT_EQ(names, (std::vector<std::string>{
                         "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                         "model-00003-of-00003.safetensors", kShardIndexName}));
    std::vector<std::string> files;
    for (size_t i = 0; i < 3; ++i) files.push_back(o.out + "/" + names[i]);
    Check(files, dtype, 7);

    std::ifstream f(o.out + "/" + kShardIndexName);
    auto index = nlohmann::json::parse(f);
    const uint64_t esize = DTypeSize(dtype);
    uint64_t total = 0;
    for (uint32_t p = 0; p < layout_.num_params(); ++p) total += layout_.param_numel(p) * esize;
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    EXPECT_EQ(stats->file_bytes, total + stats->header_bytes + 3 * 8);
    EXPECT_EQ(index["weight_map"],
              (nlohmann::json{{"embed.weight", "model-00001-of-00003.safetensors"},
                              {"blk.0.bias", "model-00002-of-00003.safetensors"},
                              {"head", "model-00003-of-00003.safetensors"}}));
  }
  // A limit above the model: one file, still with its index.
  ExportOptions one;
  one.data_dirs = dirs_;
  one.out = dir_.sub("sharded-one");
  one.max_shard_bytes = 1ull << 30;
  auto stats = ExportSafetensors(one);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->files, 1u);
  Check(one.out + "/" + ShardFileName(0, 1), DType::kF32, 7);
  EXPECT_TRUE(std::filesystem::exists(one.out + "/" + kShardIndexName));
}

TEST_F(ExportTest, AFailedShardedExportLeavesNoFileUnderItsName) {
  ExportOptions o;
  o.data_dirs = dirs_;
  o.step = 99;  // not on the shards
  o.out = dir_.sub("sharded-failed");
  o.max_shard_bytes = 300;
  EXPECT_THAT(ExportSafetensors(o), StatusIs(Code::kNotFound));
  EXPECT_FALSE(std::filesystem::exists(o.out + "/" + kShardIndexName));
  // The second file cannot be created (a directory holds its temporary name): the first,
  // complete by then, must not carry its name either, and there is no index.
  o.step = 7;
  std::filesystem::create_directories(o.out + "/" + ShardFileName(1, 3) + ".tmp");
  EXPECT_THAT(ExportSafetensors(o), StatusIs(Code::kIoError));
  EXPECT_FALSE(std::filesystem::exists(o.out + "/" + ShardFileName(0, 3)));
  EXPECT_FALSE(std::filesystem::exists(o.out + "/" + ShardFileName(0, 3) + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(o.out + "/" + kShardIndexName));
}

TEST_F(ExportTest, CommandLine) {
  const std::string bin = ZPS_CKPT_BIN;
  auto [rc, out] = RunCommand(bin + " --help");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("export"), std::string::npos);
  std::tie(rc, out) = RunCommand(bin + " inspect --data-dir " + dirs_[1] + " --verify");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("verified"), std::string::npos) << out;
  EXPECT_NE(out.find("shard 1"), std::string::npos) << out;
  const std::string file = dir_.sub("cli.safetensors");
  std::tie(rc, out) = RunCommand(bin + " export --data-dir " + dirs_[0] + "," + dirs_[1] +
                                 " --step 6 --dtype bf16 --out " + file);
  ASSERT_EQ(rc, 0) << out;
  Check(file, DType::kBF16, 6);
  const std::string set = dir_.sub("cli-sharded");
  std::tie(rc, out) = RunCommand(bin + " export --data-dir " + dirs_[0] + "," + dirs_[1] +
                                 " --max-shard-size 0.3KB --out " + set);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("in 3 files"), std::string::npos) << out;
  Check({set + "/" + ShardFileName(0, 3), set + "/" + ShardFileName(1, 3),
         set + "/" + ShardFileName(2, 3)},
        DType::kF32, 7);
  std::tie(rc, out) = RunCommand(bin + " export --data-dir " + dirs_[0] + "," + dirs_[1] +
                                 " --max-shard-size 5XB --out " + set);
  EXPECT_EQ(rc, 2) << out;
  std::tie(rc, out) = RunCommand(bin + " export --data-dir " + dirs_[0] + " --out " + file);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  std::tie(rc, out) = RunCommand(bin + " save --endpoint 127.0.0.1:7000");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;  // no --token-file
  std::tie(rc, out) = RunCommand(bin + " frobnicate");
  EXPECT_EQ(rc, 2) << out;
}

}  // namespace
}  // namespace zps::server::testing
