// BucketReducer (zps/worker/bucket_reducer.h) and CheckedCollectives against a fake two-rank
// communicator, in-process: the fixed reduce order whatever order gradients arrive in, zeros for
// what a rank got no gradient for, the slices pushed, and a mismatched or skipped bucket that
// comes back as an error naming the bucket and the sizes.
#include "zps/worker/bucket_reducer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "zps/testing/status_matchers.h"
#include "zps/worker/checked_collectives.h"

namespace zps::worker {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

// Rank 0 of two whose peer contributes the same values: a reduce-scatter doubles this rank's
// slice; an all-gather copies this rank's block (the descriptors agree) unless `other` rewrites
// the peer's block.
class TwinCollectives : public Collectives {
 public:
  uint32_t rank() const override { return 0; }
  uint32_t world_size() const override { return 2; }
  Status ReduceScatter(std::span<float> inout) override {
    std::lock_guard<std::mutex> lock(mu);
    reduced.push_back(inout.size());
    const SliceRange mine = RankSlice(inout.size(), 2, 0);
    for (uint64_t i = 0; i < mine.length; ++i) inout[mine.begin + i] *= 2;
    return Status::Ok();
  }
  Status AllGather(std::span<std::byte> inout, size_t block_bytes) override {
    std::memcpy(inout.data() + block_bytes, inout.data(), block_bytes);
    if (other) other(inout.subspan(block_bytes));
    return Status::Ok();
  }
  Status AllReduce(std::span<float>) override { return Unimplemented("not used"); }
  std::mutex mu;
  std::vector<size_t> reduced;  // element counts, in the order issued
  std::function<void(std::span<std::byte>)> other;
};

struct Pushed {
  uint32_t param;
  uint64_t begin;
  std::vector<float> values;
};

class BucketReducerTest : public ::testing::Test {
 protected:
  // Parameters of 4, 6, 2 and 8 elements; buckets of at most 8 elements: {0}, {1, 2}, {3}.
  void SetUp() override {
    layout_ = *Layout::Build({{"a", {4}}, {"b", {6}}, {"c", {2}}, {"d", {8}}}, {});
    auto r = BucketReducer::Create(
        layout_, {}, &comm_,
        [this](uint32_t param, int64_t, uint64_t begin, std::span<const float> g, uint32_t) {
          std::lock_guard<std::mutex> lock(mu_);
          pushed_.push_back({param, begin, {g.begin(), g.end()}});
          return Status::Ok();
        },
        {.bucket_bytes = 8 * sizeof(float)});
    ASSERT_THAT(r, IsOk());
    reducer_ = std::move(*r);
  }
  std::vector<float> Grad(uint32_t param, float v) {
    return std::vector<float>(layout_.param_numel(param), v);
  }

  Layout layout_;
  TwinCollectives comm_;
  std::mutex mu_;
  std::vector<Pushed> pushed_;
  std::unique_ptr<BucketReducer> reducer_;
};

TEST_F(BucketReducerTest, BucketsGoInReverseLayoutOrderWhateverOrderGradientsArriveIn) {
  ASSERT_EQ(reducer_->num_buckets(), 3u);
  // Parameter a first (its bucket is last in the order), then c, b and d.
  for (uint32_t p : {0u, 2u, 1u}) ASSERT_THAT(reducer_->Add(p, 5, 0, Grad(p, p + 1.0f)), IsOk());
  ASSERT_THAT(reducer_->Drain(), IsOk());
  EXPECT_TRUE(comm_.reduced.empty());  // bucket {3} comes first and has no gradient yet
  ASSERT_THAT(reducer_->Add(3, 5, 0, Grad(3, 4.0f)), IsOk());
  ASSERT_THAT(reducer_->Drain(), IsOk());
  EXPECT_THAT(comm_.reduced, ElementsAre(8u, 8u, 4u));  // {3}, {1, 2}, {0}
  EXPECT_EQ(reducer_->stats().buckets_early, 3u);
  // This rank's half of each bucket, doubled, one piece per parameter: d[0,4), b[0,4), a[0,2).
  ASSERT_EQ(pushed_.size(), 3u);
  EXPECT_EQ(pushed_[0].param, 3u);
  EXPECT_THAT(pushed_[0].values, ElementsAre(8, 8, 8, 8));
  EXPECT_EQ(pushed_[1].param, 1u);
  EXPECT_EQ(pushed_[1].begin, 0u);
  EXPECT_THAT(pushed_[1].values, ElementsAre(4, 4, 4, 4));
  EXPECT_EQ(pushed_[2].param, 0u);
  EXPECT_THAT(pushed_[2].values, ElementsAre(2, 2));
}

TEST_F(BucketReducerTest, FinishTakesPartWithZerosForWhatGotNoGradient) {
  ASSERT_THAT(reducer_->Add(1, 0, 0, Grad(1, 1.0f)), IsOk());  // b only: c is missing
  ASSERT_THAT(reducer_->Finish(), IsOk());
  ASSERT_THAT(reducer_->Drain(), IsOk());
  EXPECT_THAT(comm_.reduced, ElementsAre(8u, 8u, 4u));
  EXPECT_EQ(reducer_->stats().zero_filled, 3u);  // a, c, d
  EXPECT_EQ(reducer_->stats().buckets_early, 0u);
  EXPECT_THAT(pushed_[0].values, ElementsAre(0, 0, 0, 0));
  // The next step starts clean; a second gradient in one step is refused.
  ASSERT_THAT(reducer_->Add(1, 1, 0, Grad(1, 1.0f)), IsOk());
  EXPECT_THAT(reducer_->Add(1, 1, 0, Grad(1, 1.0f)), StatusIs(Code::kAlreadyExists));
  EXPECT_THAT(reducer_->Add(9, 1, 0, Grad(1, 1.0f)), StatusIs(Code::kOutOfRange));
  EXPECT_THAT(reducer_->Add(0, 1, 0, Grad(1, 1.0f)), StatusIs(Code::kInvalidArgument));
  // Another step before this one is finished: step 1 takes part with zeros for the rest.
  comm_.reduced.clear();
  ASSERT_THAT(reducer_->Add(0, 2, 0, Grad(0, 1.0f)), IsOk());
  ASSERT_THAT(reducer_->Drain(), IsOk());
  EXPECT_THAT(comm_.reduced, ElementsAre(8u, 8u, 4u));  // step 1's three buckets
  EXPECT_EQ(reducer_->stats().zero_filled, 3u + 3u);    // step 1's a, c, d
}

TEST_F(BucketReducerTest, MismatchedBucketsFailNamingTheBucketTheRanksAndTheSizes) {
  // The peer is at bucket 1 where this rank is at bucket 0.
  comm_.other = [](std::span<std::byte> theirs) {
    uint32_t id = 1;
    uint64_t count = 8;
    std::memcpy(theirs.data() + 20, &id, sizeof(id));
    std::memcpy(theirs.data() + 24, &count, sizeof(count));
  };
  ASSERT_THAT(reducer_->Add(3, 0, 0, Grad(3, 1.0f)), IsOk());
  Status s = reducer_->Drain();
  ASSERT_THAT(s, StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(s.message(), HasSubstr("reduce-scatter of bucket 0 (params 3-3: d), 8 elements"));
  EXPECT_THAT(s.message(), HasSubstr("on rank 0 of 2"));
  EXPECT_THAT(s.message(), HasSubstr("rank 1 issued collective #0 (reduce-scatter of bucket 1 "
                                     "(params 1-2: b c), 8 elements)"));
  EXPECT_TRUE(comm_.reduced.empty());  // the data never went to the transport
  EXPECT_TRUE(pushed_.empty());
  // What a training program re-joins on: a mismatch, with or without context; other errors
  // of the exchange are not one.
  EXPECT_TRUE(IsCollectiveMismatch(s));
  EXPECT_TRUE(IsCollectiveMismatch(s.WithContext("step 12")));
  EXPECT_FALSE(IsCollectiveMismatch(Status(Code::kDeadlineExceeded, s.message())));
  EXPECT_FALSE(IsCollectiveMismatch(FailedPrecondition("stale step 3 (chunk at version 4)")));
  // Sticky: the communicator is unusable.
  EXPECT_THAT(reducer_->Add(0, 0, 0, Grad(0, 1.0f)), StatusIs(Code::kFailedPrecondition));
}

TEST(BucketReducer, SkipHookLeavesTheBucketOut) {
  Layout layout = *Layout::Build({{"a", {4}}, {"b", {4}}}, {});
  TwinCollectives comm;
  int pushes = 0;
  auto r =
      BucketReducer::Create(layout, {}, &comm,
                            [&](uint32_t, int64_t, uint64_t, std::span<const float>, uint32_t) {
                              ++pushes;
                              return Status::Ok();
                            },
                            {.bucket_bytes = 16, .skip_bucket = 0});
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT((*r)->Finish(), IsOk());  // nothing in progress: nothing to do
  std::vector<float> g(4, 1.0f);
  ASSERT_THAT((*r)->Add(0, 0, 0, g), IsOk());
  ASSERT_THAT((*r)->Add(1, 0, 0, g), IsOk());
  ASSERT_THAT((*r)->Drain(), IsOk());
  EXPECT_THAT(comm.reduced, ElementsAre(4u));  // bucket 1 ({a}) only
  EXPECT_EQ(pushes, 1);
}

TEST(BucketReducer, SkipHookInOneStepLeavesTheOtherStepsAlone) {
  Layout layout = *Layout::Build({{"a", {4}}, {"b", {4}}}, {});
  TwinCollectives comm;
  auto push = [](uint32_t, int64_t, uint64_t, std::span<const float>, uint32_t) {
    return Status::Ok();
  };
  auto r = BucketReducer::Create(layout, {}, &comm, push,
                                 {.bucket_bytes = 16, .skip_bucket = 0, .skip_step = 1});
  ASSERT_THAT(r, IsOk());
  std::vector<float> g(4, 1.0f);
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_THAT((*r)->Add(0, step, 0, g), IsOk());
    ASSERT_THAT((*r)->Add(1, step, 0, g), IsOk());
    ASSERT_THAT((*r)->Drain(), IsOk());
  }
  // Both buckets in steps 0 and 2, bucket 1 ({a}) alone in step 1.
  EXPECT_EQ(comm.reduced.size(), 5u);
}

TEST(BucketReducer, FrozenParametersAreInNoBucket) {
  Layout layout = *Layout::Build({{"a", {4}}, {"b", {4}}}, {});
  TwinCollectives comm;
  std::vector<uint8_t> frozen = {1, 0};
  auto push = [](uint32_t, int64_t, uint64_t, std::span<const float>, uint32_t) {
    return Status::Ok();
  };
  auto r = BucketReducer::Create(layout, frozen, &comm, push, {});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)->num_buckets(), 1u);
  std::vector<float> g(4, 1.0f);
  EXPECT_THAT((*r)->Add(0, 0, 0, g), StatusIs(Code::kInvalidArgument));
  std::vector<uint8_t> bad = {1};
  EXPECT_THAT(BucketReducer::Create(layout, bad, &comm, push, {}),
              StatusIs(Code::kInvalidArgument));
}

}  // namespace
}  // namespace zps::worker
