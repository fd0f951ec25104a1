// HeldOutSet: the held-out loss is the mean over every held-out window, whatever the batch size,
// with the windows in order and each batch's rows weighted by their count.
#include "zps/train/held_out.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::train {
namespace {

// A corpus whose window w starts with byte w (as long as w < 256): an evaluator can tell which
// windows it was given.
std::unique_ptr<DataLoader> Loader(int eval_windows) {
  DataOptions o;
  o.seq_len = 7;
  o.batch = 2;
  o.eval_windows = eval_windows;
  const int windows = 200;
  std::string corpus(static_cast<size_t>(windows) * 8, 'x');
  for (int w = 0; w < windows; ++w) corpus[static_cast<size_t>(w) * 8] = static_cast<char>(w);
  auto l = DataLoader::Create(std::move(corpus), o);
  EXPECT_THAT(l, IsOk());
  return std::move(l).value();
}

// The "loss" of a window: its first byte, so the mean over windows is known exactly.
HeldOutSet::Evaluator FirstBytes(std::vector<int>* rows_seen) {
  return [rows_seen](std::span<const uint8_t> tokens, int rows) -> Result<double> {
    EXPECT_EQ(tokens.size(), static_cast<size_t>(rows) * 8);
    rows_seen->push_back(rows);
    double s = 0;
    for (int r = 0; r < rows; ++r) s += tokens[static_cast<size_t>(r) * 8];
    return s / rows;
  };
}

TEST(HeldOutTest, MeanOverEveryWindowForAnyBatchSize) {
  auto loader = Loader(37);
  const int first = static_cast<int>(loader->train_windows());  // held-out windows 163..199
  double want = 0;
  for (int w = first; w < first + 37; ++w) want += w;
  want /= 37;
  for (int rows : {1, 4, 8, 37, 64}) {
    SCOPED_TRACE(rows);
    auto set = HeldOutSet::Create(*loader, rows);
    ASSERT_THAT(set, IsOk());
    EXPECT_EQ(set->windows(), 37);
    std::vector<int> seen;
    auto loss = set->Loss(FirstBytes(&seen));
    ASSERT_THAT(loss, IsOk());
    EXPECT_NEAR(*loss, want, 1e-12);
    // Full batches, then the rest.
    const int full = 37 / rows, rest = 37 % rows;
    ASSERT_EQ(seen.size(), static_cast<size_t>(full + (rest ? 1 : 0)));
    for (int b = 0; b < full; ++b) EXPECT_EQ(seen[static_cast<size_t>(b)], rows);
    if (rest) {
      EXPECT_EQ(seen.back(), rest);
    }
  }
}

TEST(HeldOutTest, NoWindowsIsNaNWithoutEvaluating) {
  auto set = HeldOutSet::Create(*Loader(0), 8);
  ASSERT_THAT(set, IsOk());
  std::vector<int> seen;
  auto loss = set->Loss(FirstBytes(&seen));
  ASSERT_THAT(loss, IsOk());
  EXPECT_TRUE(std::isnan(*loss));
  EXPECT_TRUE(seen.empty());
}

TEST(HeldOutTest, TheEvaluatorsErrorStopsTheLoss) {
  auto set = HeldOutSet::Create(*Loader(16), 4);
  ASSERT_THAT(set, IsOk());
  int calls = 0;
  auto loss = set->Loss([&](std::span<const uint8_t>, int) -> Result<double> {
    if (++calls == 2) return Unavailable("shard gone");
    return 1.0;
  });
  EXPECT_THAT(loss.status(), StatusIs(Code::kUnavailable));
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(HeldOutSet::Create(*Loader(16), 0).status(), StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::train
