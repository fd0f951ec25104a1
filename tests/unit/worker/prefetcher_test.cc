// Prefetcher (zps/worker/prefetcher.h) against a fake ParamSource, in-process: the trace recorded
// in the first step, its rebuild when the access order changes, the byte caps, and what happens
// to fetches that fail, time out or are never asked for.
#include "zps/worker/prefetcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "zps/testing/status_matchers.h"
#include "zps/worker/param_source.h"

namespace zps::worker {
namespace {

using testing::ElementsAre;

constexpr uint64_t kNumel = 64;                   // elements per parameter
constexpr uint64_t kBytes = kNumel * 2;           // bf16
constexpr std::chrono::milliseconds kShort{100};  // the fake's op_timeout in the timeout tests

struct FetchCall {
  uint32_t param;
  int64_t version;
  bool operator==(const FetchCall&) const = default;
};

void PrintTo(const FetchCall& f, std::ostream* os) {
  *os << "{param " << f.param << ", v" << f.version << "}";
}

// Parameters of kNumel bf16 elements each. A fetch completes at once with a buffer whose bytes
// are the parameter id, unless its parameter is in `hold` (then it completes only by Complete) or
// in `fail` (then it fails with that status).
class FakeSource : public ParamSource {
 public:
  explicit FakeSource(uint32_t params) {
    std::vector<ParamSpec> specs;
    for (uint32_t i = 0; i < params; ++i) specs.push_back({"p" + std::to_string(i), {kNumel}});
    layout_ = *Layout::Build(std::move(specs), {});
  }

  const Layout& layout() const override { return layout_; }
  DType serving_dtype() const override { return DType::kBF16; }
  std::chrono::milliseconds op_timeout() const override { return timeout; }
  FetchOp FetchAsync(uint32_t param, int64_t min_version) override {
    return FetchAsync(param, 0, kNumel, min_version);
  }
  FetchOp FetchAsync(uint32_t param, uint64_t begin, uint64_t length,
                     int64_t min_version) override {
    calls.push_back({param, min_version});
    ranges.emplace_back(begin, length);
    FetchPromise p(param);
    if (param >= layout_.num_params()) {
      p.Fail(OutOfRange("parameter id " + std::to_string(param)));
    } else if (auto f = fail.find(param); f != fail.end()) {
      p.Fail(f->second);
    } else if (hold.count(param) != 0) {
      held.emplace_back(param, p);
    } else {
      p.Set(Buffer(param, begin, length, min_version));
    }
    return p.op();
  }

  // Completes the held fetches of `param`.
  void Complete(uint32_t param) {
    for (auto& [id, p] : held) {
      if (id == param) p.Set(Buffer(id, 0, kNumel, 0));
    }
  }

  static std::shared_ptr<ParamBuffer> Buffer(uint32_t param, uint64_t begin, uint64_t length,
                                             int64_t version) {
    auto mem = std::make_shared<std::vector<std::byte>>(length * 2, std::byte(param));
    auto b = std::make_shared<ParamBuffer>();
    b->param = param;
    b->begin = begin;
    b->version = version;
    b->dtype = DType::kBF16;
    b->memory = DeviceBuffer(mem->data(), mem->size(), [mem](std::byte*) mutable { mem.reset(); });
    return b;
  }

  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  std::set<uint32_t> hold;
  std::map<uint32_t, Status> fail;
  std::vector<FetchCall> calls;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, length) of each call
  std::vector<std::pair<uint32_t, FetchPromise>> held;

 private:
  Layout layout_;
};

// One step: acquires and releases each id in turn, checking the buffer is that parameter's.
void RunStep(Prefetcher& p, int64_t step, const std::vector<uint32_t>& order) {
  p.BeginStep(step);
  for (uint32_t id : order) {
    auto r = p.Acquire({&id, 1});
    ASSERT_THAT(r, IsOk()) << "parameter " << id << " at step " << step;
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0]->param, id);
    EXPECT_GE((*r)[0]->version, step);
    EXPECT_EQ((*r)[0]->bytes().size(), kBytes);
    EXPECT_EQ((*r)[0]->bytes()[0], std::byte(id));
    p.Release({&id, 1});
  }
  ASSERT_THAT(p.EndStep(), IsOk());
}

TEST(Prefetcher, FirstStepRecordsTheTraceAndFetchesOnDemandOnly) {
  FakeSource src(3);
  Prefetcher p(&src, {});
  RunStep(p, 0, {0, 1, 2});
  EXPECT_THAT(src.calls, ElementsAre(FetchCall{0, 0}, FetchCall{1, 0}, FetchCall{2, 0}));
  EXPECT_EQ(p.stats().acquires, 3u);
  EXPECT_EQ(p.stats().prefetches, 0u);
  EXPECT_EQ(p.stats().hits, 0u);
  EXPECT_EQ(p.stats().trace_rebuilds, 0u);
}

TEST(Prefetcher, LaterStepsPrefetchAlongTheTraceIntoTheNextStep) {
  FakeSource src(3);
  Prefetcher p(&src, {});
  RunStep(p, 0, {0, 1, 2});
  src.calls.clear();
  p.BeginStep(1);
  uint32_t id = 0;
  ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
  // The demand fetch, then the rest of this step's trace and, one step ahead at most, the next
  // step's first parameter at the next version.
  EXPECT_THAT(src.calls,
              ElementsAre(FetchCall{0, 1}, FetchCall{1, 1}, FetchCall{2, 1}, FetchCall{0, 2}));
  p.Release({&id, 1});
  for (uint32_t next : {1u, 2u}) {
    ASSERT_THAT(p.Acquire({&next, 1}), IsOk());
    p.Release({&next, 1});
  }
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_EQ(p.stats().hits, 2u);  // 1 and 2 were in flight when acquired
  EXPECT_EQ(p.stats().trace_rebuilds, 0u);
  // Step 2 starts with its first parameter already fetched.
  RunStep(p, 2, {0, 1, 2});
  EXPECT_EQ(p.stats().hits, 5u);
  EXPECT_EQ(p.stats().trace_rebuilds, 0u);
}

TEST(Prefetcher, ChangedOrderRebuildsTheTrace) {
  FakeSource src(3);
  Prefetcher p(&src, {});
  RunStep(p, 0, {0, 1, 2});
  RunStep(p, 1, {0, 2, 1});  // dynamic control flow: another order
  EXPECT_EQ(p.stats().trace_rebuilds, 1u);
  src.calls.clear();
  p.BeginStep(2);
  uint32_t id = 0;
  auto r = p.Acquire({&id, 1});
  ASSERT_THAT(r, IsOk());
  // 0 was prefetched in step 1; prefetching follows the new order: 2 comes next now.
  ASSERT_FALSE(src.calls.empty());
  EXPECT_EQ(src.calls[0], (FetchCall{2, 2}));
  p.Release({&id, 1});
  for (uint32_t next : {2u, 1u}) {
    ASSERT_THAT(p.Acquire({&next, 1}), IsOk());
    p.Release({&next, 1});
  }
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_EQ(p.stats().trace_rebuilds, 1u);  // the same order again: no rebuild
}

TEST(Prefetcher, BranchAwayFromTheTraceNeverWaitsOnItsPrefetches) {
  FakeSource src(4);
  src.timeout = kShort;
  Prefetcher p(&src, {});
  RunStep(p, 0, {0, 1, 2});
  src.hold = {1, 2};  // their prefetches never complete
  p.BeginStep(1);
  for (uint32_t id : {0u, 3u}) {  // a branch: 3 instead of 1 and 2
    auto r = p.Acquire({&id, 1});
    ASSERT_THAT(r, IsOk()) << "waited on a fetch nobody asked for (parameter " << id << ")";
    p.Release({&id, 1});
  }
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_EQ(p.stats().trace_rebuilds, 1u);
  // The abandoned prefetches are dropped with their step, still unanswered.
  p.BeginStep(2);
  EXPECT_THAT(src.calls, testing::Contains(FetchCall{1, 1}));
  EXPECT_FALSE(src.held.empty());
  EXPECT_FALSE(src.held.front().second.op().done());
  EXPECT_LE(p.live_bytes(), 2 * kBytes);  // at most the new trace's prefetches of step 2
  src.hold.clear();
  RunStep(p, 2, {0, 3});
  EXPECT_EQ(p.stats().trace_rebuilds, 1u);
}

TEST(Prefetcher, PrefetchBytesBoundsWhatIsInFlightAhead) {
  FakeSource src(8);
  Prefetcher p(&src, {.prefetch_bytes = 2 * kBytes});
  RunStep(p, 0, {0, 1, 2, 3, 4, 5, 6, 7});
  const uint64_t before = p.stats().prefetches;
  p.BeginStep(1);
  uint32_t id = 0;
  ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
  EXPECT_EQ(p.stats().prefetches - before, 2u);  // 1 and 2
  p.Release({&id, 1});
  id = 1;
  ASSERT_THAT(p.Acquire({&id, 1}), IsOk());  // consumes one: room for one more (3)
  EXPECT_EQ(p.stats().prefetches - before, 3u);
  p.Release({&id, 1});
  for (id = 2; id < 8; ++id) {
    ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
    p.Release({&id, 1});
  }
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_EQ(p.stats().hits, 7u);  // every parameter after the first was prefetched
}

TEST(Prefetcher, NoPrefetchWithAZeroBudget) {
  FakeSource src(4);
  Prefetcher p(&src, {.prefetch_bytes = 0});
  RunStep(p, 0, {0, 1, 2, 3});
  RunStep(p, 1, {0, 1, 2, 3});
  EXPECT_EQ(p.stats().prefetches, 0u);
  EXPECT_EQ(src.calls.size(), 8u);
}

TEST(Prefetcher, MaxLiveBytesBoundsHeldBuffersLeastRecentlyUsedFirst) {
  FakeSource src(8);
  Prefetcher p(&src, {.prefetch_bytes = 1 << 20, .max_live_bytes = 3 * kBytes});
  RunStep(p, 0, {0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_LE(p.live_bytes(), 3 * kBytes);
  p.BeginStep(1);
  uint32_t id = 0;
  ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
  // The prefetches stop at the cap: 0 held, 1 and 2 in flight.
  EXPECT_EQ(p.live_bytes(), 3 * kBytes);
  EXPECT_EQ(p.stats().prefetches, 2u);
  p.Release({&id, 1});
  for (id = 1; id < 8; ++id) {
    ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
    p.Release({&id, 1});
    EXPECT_LE(p.live_bytes(), 3 * kBytes) << "after parameter " << id;
  }
  ASSERT_THAT(p.EndStep(), IsOk());
  // The most recently used buffer stays live.
  src.calls.clear();
  id = 7;
  ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
  p.Release({&id, 1});
  EXPECT_THAT(src.calls, testing::Not(testing::Contains(FetchCall{7, 1})));
}

TEST(Prefetcher, BuffersAreSharedWhileHeldAndReusedWithinTheStep) {
  FakeSource src(2);
  Prefetcher p(&src, {});
  p.BeginStep(0);
  uint32_t id = 1;
  auto a = p.Acquire({&id, 1});
  auto b = p.Acquire({&id, 1});  // the backward pass while the forward pass still holds it
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*a)[0], (*b)[0]);
  EXPECT_EQ(src.calls.size(), 1u);
  p.Release({&id, 1});
  p.Release({&id, 1});
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_EQ(p.live_bytes(), kBytes);
  p.BeginStep(1);  // an older version is never needed again
  EXPECT_EQ(p.live_bytes(), 0u);
}

TEST(Prefetcher, FailedFetchReleasesWhatTheAcquireTook) {
  FakeSource src(3);
  src.fail[1] = Unavailable("shard 0 at host:1 lost");
  Prefetcher p(&src, {});
  p.BeginStep(0);
  std::vector<uint32_t> ids = {0, 1};
  EXPECT_THAT(p.Acquire(ids), StatusIs(Code::kUnavailable));
  ids = {2, 7};  // 7 is not a parameter
  EXPECT_THAT(p.Acquire(ids), StatusIs(Code::kOutOfRange));
  ASSERT_THAT(p.EndStep(), IsOk());
  // Nothing stays acquired: a new step drops every buffer of the old version.
  p.BeginStep(1);
  EXPECT_EQ(p.live_bytes(), 0u);
  src.fail.clear();
  src.calls.clear();
  RunStep(p, 1, {0, 1, 2});
  // The bad id is not part of the trace: nothing tries to prefetch it.
  EXPECT_THAT(src.calls, testing::Not(testing::Contains(testing::Field(&FetchCall::param, 7u))));
}

TEST(Prefetcher, FetchNotAnsweredTimesOutAndIsAskedAgain) {
  FakeSource src(2);
  src.timeout = kShort;
  src.hold = {1};
  Prefetcher p(&src, {});
  p.BeginStep(0);
  uint32_t id = 1;
  EXPECT_THAT(p.Acquire({&id, 1}), StatusIs(Code::kDeadlineExceeded));
  EXPECT_EQ(p.live_bytes(), 0u);  // the timed-out fetch is dropped
  src.hold.clear();
  auto r = p.Acquire({&id, 1});  // a new fetch, not the abandoned one
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(src.calls.size(), 2u);
  p.Release({&id, 1});
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_GE(p.stats().wait, kShort);
}

TEST(Prefetcher, DestroyedWithFetchesInFlight) {
  FakeSource src(4);
  {
    Prefetcher p(&src, {});
    RunStep(p, 0, {0, 1, 2, 3});
    src.hold = {1, 2, 3};
    p.BeginStep(1);
    uint32_t id = 0;
    ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
    EXPECT_EQ(p.stats().prefetches, 4u);  // 1, 2, 3 and the next step's 0
  }                                       // nothing waits on the held prefetches
  src.Complete(1);                        // an answer after the Prefetcher is gone goes nowhere
  EXPECT_TRUE(src.held.front().second.op().done());
}

// Rank 0 of two: the other rank's block is a copy of this one's (as if it did the same thing and
// fetched the same bytes), so a gathered parameter holds its id in every byte, and the ranks'
// descriptors and acquire groups agree. `other` (when set) writes the other rank's block
// instead, for the all-gather of that block size.
class FakeCollectives : public Collectives {
 public:
  uint32_t rank() const override { return 0; }
  uint32_t world_size() const override { return 2; }
  Status ReduceScatter(std::span<float>) override { return Unimplemented("not used"); }
  Status AllReduce(std::span<float>) override { return Unimplemented("not used"); }
  Status AllGather(std::span<std::byte> inout, size_t block_bytes) override {
    blocks.push_back(block_bytes);
    if (!fail.ok()) return fail;
    if (inout.size() != 2 * block_bytes) return InvalidArgument("not two blocks");
    std::memcpy(inout.data() + block_bytes, inout.data(), block_bytes);
    if (other) other(inout.subspan(block_bytes));
    return Status::Ok();
  }
  // The data all-gathers only (not the 32-byte descriptors, nor the plan exchange).
  std::vector<size_t> DataBlocks() const {
    std::vector<size_t> out;
    for (size_t b : blocks) {
      if (b != 32 && b != 16) out.push_back(b);
    }
    return out;
  }
  std::vector<size_t> blocks;  // block_bytes of each AllGather
  Status fail;
  std::function<void(std::span<std::byte>)> other;
};

TEST(Prefetcher, BandwidthCentricGathersWhatTheRanksPlannedFromTheSecondStep) {
  FakeSource src(3);
  FakeCollectives gather;
  Prefetcher p(&src, {.prefetch_bytes = 0, .gather = &gather});
  std::vector<uint32_t> ids = {0, 1};
  // Step 0: no plan yet, whole parameters from the shards; EndStep agrees on the plan.
  p.BeginStep(0);
  ASSERT_THAT(p.Acquire(ids), IsOk());
  p.Release(ids);
  EXPECT_THAT(src.ranges, ElementsAre(std::pair<uint64_t, uint64_t>{0, kNumel},
                                      std::pair<uint64_t, uint64_t>{0, kNumel}));
  EXPECT_TRUE(gather.DataBlocks().empty());
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_EQ(p.stats().plan_groups, 1u);
  // Step 1: this rank's slice (the first half) of each parameter, one all-gather of both.
  src.ranges.clear();
  p.BeginStep(1);
  auto r = p.Acquire(ids);
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(src.ranges, ElementsAre(std::pair<uint64_t, uint64_t>{0, kNumel / 2},
                                      std::pair<uint64_t, uint64_t>{0, kNumel / 2}));
  EXPECT_THAT(gather.DataBlocks(), ElementsAre(2 * kBytes / 2));
  EXPECT_EQ(p.stats().gathers, 2u);
  ASSERT_EQ(r->size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*r)[i]->param, ids[i]);
    ASSERT_EQ((*r)[i]->bytes().size(), kBytes);  // the whole parameter
    EXPECT_EQ((*r)[i]->bytes()[kBytes - 1], std::byte(ids[i]));
  }
  // Acquired again (past its plan position): live, nothing to gather.
  r = p.Acquire(ids);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(gather.DataBlocks().size(), 1u);
  p.Release(ids);
  p.Release(ids);
  ASSERT_THAT(p.EndStep(), IsOk());
}

TEST(Prefetcher, SkippedPlanPositionsAreGatheredOnTheWayAndUnplannedGroupsFetchedWhole) {
  FakeSource src(4);
  FakeCollectives gather;
  Prefetcher p(&src, {.prefetch_bytes = 0, .gather = &gather});
  RunStep(p, 0, {0, 1, 2});                        // the plan: {0}, {1}, {2}
  const uint64_t unplanned = p.stats().unplanned;  // step 0's, with no plan yet
  gather.blocks.clear();
  src.ranges.clear();
  p.BeginStep(1);
  uint32_t id = 3;  // not in the plan: whole, no collective
  ASSERT_THAT(p.Acquire({&id, 1}), IsOk());
  p.Release({&id, 1});
  EXPECT_TRUE(gather.DataBlocks().empty());
  EXPECT_EQ(p.stats().unplanned, unplanned + 1);
  id = 1;  // plan position 1: position 0 first (skipped by this rank), then 1
  auto r = p.Acquire({&id, 1});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0]->bytes()[kBytes - 1], std::byte(1));
  p.Release({&id, 1});
  EXPECT_THAT(gather.DataBlocks(), ElementsAre(kBytes / 2, kBytes / 2));
  // EndStep takes part in position 2, which this rank never acquired.
  ASSERT_THAT(p.EndStep(), IsOk());
  EXPECT_THAT(gather.DataBlocks(), ElementsAre(kBytes / 2, kBytes / 2, kBytes / 2));
  EXPECT_EQ(p.stats().gathers, 3u);
}

TEST(Prefetcher, ThePlanIsWhatEveryRankAcquiredInOrder) {
  FakeSource src(4);
  FakeCollectives gather;
  Prefetcher p(&src, {.prefetch_bytes = 0, .gather = &gather});
  // The other rank acquired {0}, {2}, {3} where this one acquires {0}, {1}, {2}: the plan is
  // {0}, {2}.
  gather.other = [](std::span<std::byte> theirs) {
    if (theirs.size() == 16) {  // (hash, length in words): a different hash
      uint64_t head[2] = {42, 7};
      std::memcpy(theirs.data(), head, sizeof(head));
    } else if (theirs.size() == 7 * 4) {  // the groups: count, then (size, ids...)
      uint32_t words[7] = {3, 1, 0, 1, 2, 1, 3};
      std::memcpy(theirs.data(), words, sizeof(words));
    }
  };
  RunStep(p, 0, {0, 1, 2});
  EXPECT_EQ(p.stats().plan_groups, 2u);
  const uint64_t unplanned = p.stats().unplanned;
  gather.other = nullptr;
  gather.blocks.clear();
  RunStep(p, 1, {0, 1, 2});
  EXPECT_THAT(gather.DataBlocks(), ElementsAre(kBytes / 2, kBytes / 2));
  EXPECT_EQ(p.stats().unplanned, unplanned + 1);  // {1}
}

TEST(Prefetcher, AGroupThatChangesEveryStepLeavesThePlan) {
  FakeSource src(4);
  FakeCollectives gather;
  Prefetcher p(&src, {.prefetch_bytes = 0, .gather = &gather});
  RunStep(p, 0, {0, 1, 3});  // every rank alike, expert 1 this step
  EXPECT_EQ(p.stats().plan_groups, 3u);
  RunStep(p, 1, {0, 2, 3});  // expert 2: {0} and {3} stay planned, {1} and {2} do not
  EXPECT_EQ(p.stats().plan_groups, 2u);
  gather.blocks.clear();
  RunStep(p, 2, {0, 1, 3});
  EXPECT_THAT(gather.DataBlocks(), ElementsAre(kBytes / 2, kBytes / 2));
}

TEST(Prefetcher, RanksThatIssueDifferentGathersFailNamingThePositionAndTheSizes) {
  FakeSource src(3);
  FakeCollectives gather;
  Prefetcher p(&src, {.prefetch_bytes = 0, .gather = &gather});
  RunStep(p, 0, {0, 1});
  // The other rank's descriptor says plan position 1 where this rank is at position 0.
  gather.other = [](std::span<std::byte> theirs) {
    if (theirs.size() == 32) {
      uint32_t id = 1;
      std::memcpy(theirs.data() + 20, &id, sizeof(id));
    }
  };
  p.BeginStep(1);
  uint32_t id = 0;
  auto r = p.Acquire({&id, 1});
  ASSERT_THAT(r, StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(r.status().message(), testing::HasSubstr("plan position 0 (params p0)"));
  EXPECT_THAT(r.status().message(), testing::HasSubstr("rank 1 issued"));
  EXPECT_THAT(r.status().message(), testing::HasSubstr("plan position 1 (params p1)"));
  // The communicator is unusable: the plan is dropped, and everything is fetched whole.
  gather.other = nullptr;
  r = p.Acquire({&id, 1});
  ASSERT_THAT(r, IsOk());
  p.Release({&id, 1});
  EXPECT_THAT(p.EndStep(), StatusIs(Code::kFailedPrecondition));
}

TEST(Prefetcher, FailedGatherLeavesNothingAcquired) {
  FakeSource src(2);
  FakeCollectives gather;
  Prefetcher p(&src, {.gather = &gather});
  std::vector<uint32_t> ids = {0, 1};
  p.BeginStep(0);
  ASSERT_THAT(p.Acquire(ids), IsOk());
  p.Release(ids);
  ASSERT_THAT(p.EndStep(), IsOk());
  p.BeginStep(1);
  gather.fail = Unavailable("rank 1 lost");
  EXPECT_THAT(p.Acquire(ids), StatusIs(Code::kUnavailable));
  for (uint32_t i : ids) p.Release({&i, 1});
  gather.fail = Status::Ok();
  auto r = p.Acquire(ids);  // no plan any more: fetched whole
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[1]->bytes()[kBytes - 1], std::byte(1));
  p.Release(ids);
}

TEST(FetchPromise, OnlyTheFirstCompletionCounts) {
  FetchPromise p(5);
  FetchOp op = p.op();
  EXPECT_FALSE(op.done());
  EXPECT_THAT(op.Wait(std::chrono::milliseconds(1)), StatusIs(Code::kDeadlineExceeded));
  p.Set(FakeSource::Buffer(5, 0, 4, 9));
  p.Fail(Unavailable("too late"));
  auto r = op.Wait(std::chrono::milliseconds(1));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)->param, 5u);
  EXPECT_EQ((*r)->version, 9);
}

}  // namespace
}  // namespace zps::worker
