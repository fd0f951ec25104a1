// The CUDA backend's staging logic without a GPU (zps/worker/staging_slots.h, with a fake
// CopyEvents): slots are handed out whole and bounded; a copy holds its slot until its event is
// done, so a slot is reused only after the copy that reads it completed; the number of copies in
// flight is bounded (the oldest is waited for); event errors are returned. And the real backend
// here: without a device (this machine, CI) Create and CudaAvailable report FailedPrecondition
// "no CUDA device", never a crash.
#include "zps/worker/staging_slots.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "zps/testing/status_matchers.h"
#include "zps/worker/cuda_backend.h"

namespace zps::worker {
namespace {

// Events the test completes by hand.
class FakeEvents final : public CopyEvents {
 public:
  explicit FakeEvents(size_t n) : done(n, false) {}
  Result<bool> Done(size_t i) override {
    if (fail) return Internal("fake event failure");
    return static_cast<bool>(done[i]);
  }
  Status Wait(size_t i) override {
    ++waits;
    if (fail) return Internal("fake event failure");
    done[i] = true;  // waiting completes it
    return Status::Ok();
  }
  std::vector<bool> done;
  int waits = 0;
  bool fail = false;
};

struct Slots {
  Slots(size_t n, size_t bytes) : memory(n * bytes) {
    pool = std::make_unique<SlotPool>(std::span<std::byte>(memory), bytes);
  }
  // A buffer as the backend hands it out: its run released to the pool when the last owner goes.
  std::shared_ptr<const void> Take(size_t bytes) {
    auto run = pool->TryAcquire(bytes);
    if (!run) return nullptr;
    SlotPool* p = pool.get();
    const SlotPool::Run r = *run;
    return std::shared_ptr<const void>(p->memory(r).data(), [p, r](const void*) { p->Release(r); });
  }
  std::vector<std::byte> memory;
  std::unique_ptr<SlotPool> pool;
};

TEST(SlotPoolTest, RunsOfContiguousSlotsFirstFit) {
  Slots s(4, 1024);
  EXPECT_EQ(s.pool->size(), 4u);
  EXPECT_EQ(s.pool->slot_bytes(), 1024u);
  auto a = s.pool->TryAcquire(100);  // one slot
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->first, 0u);
  EXPECT_EQ(a->count, 1u);
  auto b = s.pool->TryAcquire(2048);  // exactly two
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->first, 1u);
  EXPECT_EQ(b->count, 2u);
  EXPECT_EQ(s.pool->memory(*b).data(), s.memory.data() + 1024);
  EXPECT_EQ(s.pool->memory(*b).size(), 2048u);
  EXPECT_FALSE(s.pool->TryAcquire(1025).has_value());  // one slot left, two needed
  auto c = s.pool->TryAcquire(0);                      // an empty buffer still takes a slot
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->first, 3u);
  EXPECT_FALSE(s.pool->TryAcquire(1).has_value());  // every slot held
  EXPECT_EQ(s.pool->free_count(), 0u);
  s.pool->Release(*a);
  s.pool->Release(*c);
  EXPECT_FALSE(s.pool->TryAcquire(2048).has_value()) << "slots 0 and 3 are not contiguous";
  s.pool->Release(*b);
  auto all = s.pool->TryAcquire(4096);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->first, 0u);
  EXPECT_EQ(all->count, 4u);
  EXPECT_FALSE(s.pool->TryAcquire(4097).has_value());  // larger than the whole pool
}

TEST(InflightCopiesTest, ASlotReturnsOnlyAfterItsCopyCompleted) {
  Slots s(2, 256);
  FakeEvents ev(2);
  InflightCopies q(&ev, 2);
  auto slot = s.Take(256);
  ASSERT_NE(slot, nullptr);
  auto e = q.Acquire();
  ASSERT_THAT(e, IsOk());
  q.Push(*e, slot);
  slot.reset();  // the caller is done with it; the copy still reads it
  EXPECT_EQ(s.pool->free_count(), 1u);
  ASSERT_THAT(q.Poll(), IsOk());
  EXPECT_EQ(s.pool->free_count(), 1u) << "reused before its event completed";
  ev.done[*e] = true;
  ASSERT_THAT(q.Poll(), IsOk());
  EXPECT_EQ(s.pool->free_count(), 2u);
  EXPECT_EQ(q.in_flight(), 0u);
}

TEST(InflightCopiesTest, TheBoundWaitsForTheOldestCopy) {
  FakeEvents ev(2);
  InflightCopies q(&ev, 2);
  int released = 0;
  auto keep = [&] { return std::shared_ptr<const void>(&ev, [&](const void*) { ++released; }); };
  auto a = q.Acquire();
  ASSERT_THAT(a, IsOk());
  q.Push(*a, keep());
  auto b = q.Acquire();
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(*a, *b);
  q.Push(*b, keep());
  EXPECT_EQ(q.in_flight(), 2u);
  EXPECT_EQ(ev.waits, 0);
  auto c = q.Acquire();  // full: waits for the oldest (a), which frees its event
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(ev.waits, 1);
  EXPECT_EQ(*c, *a);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(q.in_flight(), 1u);
  EXPECT_EQ(q.waits(), 1u);
  q.Push(*c, keep());
  ASSERT_THAT(q.Drain(), IsOk());
  EXPECT_EQ(released, 3);
  EXPECT_EQ(q.in_flight(), 0u);
}

TEST(InflightCopiesTest, CompletedCopiesRetireInOrderWithoutWaiting) {
  FakeEvents ev(3);
  InflightCopies q(&ev, 3);
  std::vector<size_t> events;
  for (int k = 0; k < 3; ++k) {
    auto e = q.Acquire();
    ASSERT_THAT(e, IsOk());
    q.Push(*e, nullptr);
    events.push_back(*e);
  }
  ev.done[events[0]] = true;
  ev.done[events[2]] = true;  // behind a pending one: stays until that one is done
  ASSERT_THAT(q.Poll(), IsOk());
  EXPECT_EQ(q.in_flight(), 2u);
  auto next = q.Acquire();
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(*next, events[0]);
  EXPECT_EQ(ev.waits, 0);
  q.Abandon(*next);
  ev.done[events[1]] = true;
  ASSERT_THAT(q.Poll(), IsOk());
  EXPECT_EQ(q.in_flight(), 0u);
}

TEST(InflightCopiesTest, AnEventErrorIsReturnedAndTheCopyRetired) {
  FakeEvents ev(1);
  InflightCopies q(&ev, 1);
  int released = 0;
  auto e = q.Acquire();
  ASSERT_THAT(e, IsOk());
  q.Push(*e, std::shared_ptr<const void>(&ev, [&](const void*) { ++released; }));
  ev.fail = true;
  auto again = q.Acquire();
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kInternal);
  EXPECT_EQ(released, 1);
  EXPECT_EQ(q.in_flight(), 0u);
}

// Here (no GPU; in CI not even a driver) the real backend reports the clear Status. Where a
// device is present this case has nothing to check and skips.
TEST(CudaBackendTest, ReportsNoDeviceWhereThereIsNone) {
  Status avail = CudaAvailable(0);
  if (avail.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(avail.code(), Code::kFailedPrecondition) << avail.ToString();
  EXPECT_NE(avail.message().find("no CUDA device"), std::string::npos) << avail.ToString();
  auto be = CudaBackend::Create({});
  ASSERT_FALSE(be.ok());
  EXPECT_EQ(be.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(be.status().message().find("no CUDA device"), std::string::npos);
}

TEST(CudaBackendTest, BadOptionsAreInvalidArgument) {
  auto be = CudaBackend::Create({.device = 0, .slot_bytes = 1, .slots = 0, .max_inflight = 1});
  ASSERT_FALSE(be.ok());
  EXPECT_EQ(be.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::worker
