// DataLoader: rank disjointness, determinism, epochs; LoadCorpus.
#include "zps/train/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "zps/testing/status_matchers.h"

namespace zps::train {
namespace {

std::string Text(size_t n) {
  std::string s(n, ' ');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 13) % 26);
  return s;
}

TEST(DataTest, DefaultCorpusLoads) {
  auto c = LoadCorpus("");
  ASSERT_THAT(c, IsOk());
  EXPECT_GT(c->size(), 100000u);
  EXPECT_EQ(LoadCorpus("/nonexistent/zps").status().code(), Code::kNotFound);
}

TEST(DataTest, CorpusDirectorySortedAndNoSymlinks) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("zps_corpus_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "b") << "BBB";
  std::ofstream(dir / "a") << "AA";
  std::filesystem::create_symlink(dir / "a", dir / "c");
  auto c = LoadCorpus(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(*c, "AABBB");
}

TEST(DataTest, RanksDisjointAndDeterministic) {
  const std::string corpus = Text(64 * 1000);
  DataOptions o;
  o.seq_len = 15;
  o.batch = 5;
  o.world = 3;
  o.eval_windows = 4;
  const int64_t steps = 40;  // > one epoch (3996 / 15 windows ... see steps_per_epoch)
  std::vector<std::unique_ptr<DataLoader>> loaders;
  for (int r = 0; r < o.world; ++r) {
    o.rank = r;
    auto l = DataLoader::Create(corpus, o);
    ASSERT_THAT(l, IsOk());
    loaders.push_back(std::move(l).value());
  }
  const int64_t spe = loaders[0]->steps_per_epoch();
  EXPECT_EQ(spe, loaders[0]->train_windows() / 15);
  for (int64_t s = 0; s < steps + spe; ++s) {
    std::set<int64_t> seen;
    for (int r = 0; r < o.world; ++r) {
      std::vector<uint8_t> a(loaders[r]->batch_bytes()), b(a.size()), c(a.size());
      ASSERT_THAT(loaders[r]->Batch(s, a), IsOk());
      ASSERT_THAT(loaders[0]->BatchForRank(s, r, b), IsOk());
      ASSERT_THAT(loaders[r]->Batch(s, c), IsOk());
      EXPECT_EQ(a, b);
      EXPECT_EQ(a, c);
      for (int i = 0; i < o.batch; ++i) {
        const int64_t w = loaders[r]->WindowOf(s, r, i);
        EXPECT_LT(w, loaders[r]->train_windows());
        EXPECT_TRUE(seen.insert(w).second) << "window reused in step " << s;
        EXPECT_EQ(0, std::memcmp(a.data() + i * 16, corpus.data() + w * 16, 16));
      }
    }
  }
  // One epoch visits every used window exactly once.
  std::set<int64_t> epoch;
  for (int64_t s = 0; s < spe; ++s)
    for (int r = 0; r < o.world; ++r)
      for (int i = 0; i < o.batch; ++i)
        EXPECT_TRUE(epoch.insert(loaders[0]->WindowOf(s, r, i)).second);
  // Eval windows are the tail, outside training.
  std::vector<uint8_t> ev(2 * 16);
  ASSERT_THAT(loaders[0]->EvalBatch(2, 2, ev), IsOk());
  EXPECT_EQ(0, std::memcmp(ev.data(), corpus.data() + (loaders[0]->train_windows() + 2) * 16, 32));
  EXPECT_EQ(loaders[0]->EvalBatch(3, 2, ev).code(), Code::kOutOfRange);
}

TEST(DataTest, BadOptions) {
  DataOptions o;
  o.seq_len = 100;
  o.batch = 4;
  EXPECT_EQ(DataLoader::Create(Text(500), o).status().code(), Code::kInvalidArgument);
  o.rank = 2;
  o.world = 2;
  EXPECT_EQ(DataLoader::Create(Text(100000), o).status().code(), Code::kInvalidArgument);
  o.rank = 0;
  auto l = DataLoader::Create(Text(100000), o);
  ASSERT_THAT(l, IsOk());
  std::vector<uint8_t> small(10);
  EXPECT_EQ((*l)->Batch(0, small).code(), Code::kInvalidArgument);
  std::vector<uint8_t> ok((*l)->batch_bytes());
  EXPECT_EQ((*l)->Batch(-1, ok).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::train
