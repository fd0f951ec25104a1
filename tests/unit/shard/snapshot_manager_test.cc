// SnapshotManager: copy-on-write snapshots over a live state held by the test (no ShardState),
// and the write hooks a shard calls before it changes a chunk.
#include "shard/snapshot_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

constexpr uint64_t kElems = 16;

// A shard's chunk table reduced to what the manager reads: one Adam state per chunk, each element
// of chunk i's master, m and v set from a per-chunk "generation" g so that a visit shows which
// generation it saw.
class SnapshotManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (size_t i = 0; i < ids_.size(); ++i) {
      auto b = ChunkBuffers::Allocate(layout_, kElems);
      ASSERT_THAT(b.status(), IsOk());
      live_.push_back(std::move(*b));
      Fill(live_[i].spans(), i, 0);
    }
    manager_ = std::make_unique<SnapshotManager>(
        ids_, [this](size_t i) -> const ChunkBuffers& { return live_[i]; });
  }

  static void Fill(const ChunkState& st, size_t chunk, int gen) {
    for (float& x : st.master) x = static_cast<float>(100 * chunk + gen);
    for (std::byte& b : st.m) b = std::byte(static_cast<uint8_t>(10 * chunk + gen));
    for (std::byte& b : st.v) b = std::byte(static_cast<uint8_t>(20 * chunk + gen));
  }
  static bool Holds(std::span<const float> master, std::span<const std::byte> m,
                    std::span<const std::byte> v, size_t chunk, int gen) {
    for (float x : master) {
      if (x != static_cast<float>(100 * chunk + gen)) return false;
    }
    for (std::byte b : m) {
      if (b != std::byte(static_cast<uint8_t>(10 * chunk + gen))) return false;
    }
    for (std::byte b : v) {
      if (b != std::byte(static_cast<uint8_t>(20 * chunk + gen))) return false;
    }
    return master.size() == kElems && !m.empty() && !v.empty();
  }
  // An update to generation `gen` that records whether it ran in place.
  SnapshotManager::UpdateFn To(size_t chunk, int gen, bool* in_place) {
    return [=](const ChunkState& out, const ConstChunkState* source) {
      *in_place = source == nullptr;
      if (source && source->master.size() != out.master.size()) return Internal("sizes differ");
      Fill(out, chunk, gen);
      return Status::Ok();
    };
  }
  // The generation every chunk had in the snapshot's visit (-1: not as the live one ever was).
  std::map<uint32_t, int> VisitAll(ShardSnapshot& snap, int gens) {
    std::map<uint32_t, int> seen;
    EXPECT_THAT(snap.Visit([&](uint32_t id, int64_t version, std::span<const float> master,
                               std::span<const std::byte> m, std::span<const std::byte> v) {
      EXPECT_EQ(version, snap.version());
      const size_t i = static_cast<size_t>(std::find(ids_.begin(), ids_.end(), id) - ids_.begin());
      seen[id] = -1;
      for (int g = 0; g < gens; ++g) {
        if (Holds(master, m, v, i, g)) seen[id] = g;
      }
      return Status::Ok();
    }),
                IsOk());
    return seen;
  }

  const ChunkLayout layout_ = ChunkLayout::For(OptimizerConfig{}, DType::kBF16);
  const std::vector<uint32_t> ids_ = {3, 7, 11};
  std::vector<ChunkBuffers> live_;
  std::unique_ptr<SnapshotManager> manager_;
};

TEST_F(SnapshotManagerTest, OneSnapshotAtATime) {
  EXPECT_EQ(manager_->Current(), nullptr);
  auto snap = manager_->Open(5);
  ASSERT_THAT(snap.status(), IsOk());
  EXPECT_EQ((*snap)->version(), 5);
  EXPECT_EQ(manager_->Current(), *snap);
  EXPECT_THAT(manager_->Open(6).status(), StatusIs(Code::kFailedPrecondition));
  snap->reset();  // closed with its last reference
  EXPECT_EQ(manager_->Current(), nullptr);
  EXPECT_THAT(manager_->Open(6).status(), IsOk());
}

TEST_F(SnapshotManagerTest, UntouchedChunksAreReadFromTheLiveStateWithoutCopyOnWrite) {
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  const auto seen = VisitAll(**snap, 1);
  EXPECT_EQ(seen, (std::map<uint32_t, int>{{3, 0}, {7, 0}, {11, 0}}));
  EXPECT_EQ((*snap)->copied_on_write(), 0u);
  // The written copies went back to the pool: one master and two moments per chunk.
  EXPECT_EQ(manager_->buffers().pooled(), 3u * ids_.size());
}

TEST_F(SnapshotManagerTest, AnUpdateBeforeTheVisitRunsOutOfPlaceAndTheSnapshotKeepsTheOldState) {
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  const float* old_master = live_[1].master.data();
  bool in_place = true;
  ASSERT_THAT(manager_->UpdateOutOfPlace(**snap, 1, live_[1], To(1, 1, &in_place)), IsOk());
  EXPECT_FALSE(in_place);
  EXPECT_NE(live_[1].master.data(), old_master);  // fresh buffers replaced the live ones
  EXPECT_TRUE(Holds(live_[1].master.span(), live_[1].m.span(), live_[1].v.span(), 1, 1));
  // A second update of the same chunk: the snapshot has its copy, the live state is ours again.
  ASSERT_THAT(manager_->UpdateOutOfPlace(**snap, 1, live_[1], To(1, 2, &in_place)), IsOk());
  EXPECT_TRUE(in_place);
  EXPECT_EQ((*snap)->copied_on_write(), 1u);
  const auto seen = VisitAll(**snap, 3);
  EXPECT_EQ(seen, (std::map<uint32_t, int>{{3, 0}, {7, 0}, {11, 0}}));
  EXPECT_TRUE(Holds(live_[1].master.span(), live_[1].m.span(), live_[1].v.span(), 1, 2));
}

TEST_F(SnapshotManagerTest, AFailedOutOfPlaceUpdateLeavesTheLiveStateAsItWas) {
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  const float* old_master = live_[0].master.data();
  auto fail = [](const ChunkState&, const ConstChunkState*) { return Internal("update failed"); };
  EXPECT_THAT(manager_->UpdateOutOfPlace(**snap, 0, live_[0], fail), StatusIs(Code::kInternal));
  EXPECT_EQ(live_[0].master.data(), old_master);
  EXPECT_EQ((*snap)->copied_on_write(), 0u);
  EXPECT_EQ(VisitAll(**snap, 1)[3], 0);
}

TEST_F(SnapshotManagerTest, AChunkCopiedByTheReaderIsUpdatedInPlace) {
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  // Visit copies every chunk first; an update while the visit writes chunk 0 runs in place and
  // changes nothing the visit reads.
  bool in_place = false;
  std::map<uint32_t, bool> as_of_snapshot;
  ASSERT_THAT((*snap)->Visit([&](uint32_t id, int64_t, std::span<const float> master,
                                 std::span<const std::byte> m, std::span<const std::byte> v) {
    if (id == 3) {
      EXPECT_THAT(manager_->UpdateOutOfPlace(**snap, 2, live_[2], To(2, 1, &in_place)), IsOk());
    }
    const size_t i = id == 3 ? 0 : (id == 7 ? 1 : 2);
    as_of_snapshot[id] = Holds(master, m, v, i, 0);
    return Status::Ok();
  }),
              IsOk());
  EXPECT_TRUE(in_place);
  EXPECT_EQ((*snap)->copied_on_write(), 0u);
  EXPECT_EQ(as_of_snapshot, (std::map<uint32_t, bool>{{3, true}, {7, true}, {11, true}}));
  EXPECT_TRUE(Holds(live_[2].master.span(), live_[2].m.span(), live_[2].v.span(), 2, 1));
}

TEST_F(SnapshotManagerTest, ReplaceHandsTheLiveBuffersToASnapshotThatNeedsThem) {
  auto spare = ChunkBuffers::Allocate(layout_, kElems);
  ASSERT_THAT(spare.status(), IsOk());
  Fill(spare->spans(), 0, 1);
  const float* old_master = live_[0].master.data();
  const float* spare_master = spare->master.data();
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  manager_->Replace(snap->get(), 0, live_[0], *spare);
  EXPECT_EQ(live_[0].master.data(), spare_master);
  EXPECT_EQ(spare->master.size(), 0u);  // taken by the snapshot: allocated again by its owner
  EXPECT_EQ((*snap)->copied_on_write(), 1u);
  // Once the snapshot has its own, a publish swaps: the old state becomes the spare.
  auto next = ChunkBuffers::Allocate(layout_, kElems);
  ASSERT_THAT(next.status(), IsOk());
  const float* next_master = next->master.data();
  manager_->Replace(snap->get(), 0, live_[0], *next);
  EXPECT_EQ(live_[0].master.data(), next_master);
  EXPECT_EQ(next->master.data(), spare_master);
  EXPECT_EQ((*snap)->copied_on_write(), 1u);
  const auto seen = VisitAll(**snap, 2);
  EXPECT_EQ(seen.at(3), 0);
  EXPECT_NE(live_[0].master.data(), old_master);
  // Without a snapshot: a plain swap.
  manager_->Replace(nullptr, 0, live_[0], *next);
  EXPECT_EQ(live_[0].master.data(), spare_master);
}

TEST_F(SnapshotManagerTest, PreserveAllCopiesEveryChunkBeforeAnInPlaceChange) {
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  manager_->PreserveAll(**snap);
  EXPECT_EQ((*snap)->copied_on_write(), ids_.size());
  for (size_t i = 0; i < live_.size(); ++i) Fill(live_[i].spans(), i, 1);  // a rollback
  manager_->PreserveAll(**snap);                                           // copied once
  EXPECT_EQ((*snap)->copied_on_write(), ids_.size());
  EXPECT_EQ(VisitAll(**snap, 2), (std::map<uint32_t, int>{{3, 0}, {7, 0}, {11, 0}}));
}

TEST_F(SnapshotManagerTest, VisitStopsAtTheVisitorsError) {
  auto snap = manager_->Open(1);
  ASSERT_THAT(snap.status(), IsOk());
  int calls = 0;
  EXPECT_THAT((*snap)->Visit([&](uint32_t, int64_t, std::span<const float>,
                                 std::span<const std::byte>, std::span<const std::byte>) {
    ++calls;
    return IoError("disk full");
  }),
              StatusIs(Code::kIoError));
  EXPECT_EQ(calls, 1);
}

TEST_F(SnapshotManagerTest, ReserveFillsThePoolWithOneSetPerChunk) {
  manager_->Reserve("test");
  // The reserving thread runs at the lowest priority: wait for its buffers (not a timing check).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (manager_->buffers().pooled() < 3u * ids_.size() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(manager_->buffers().pooled(), 3u * ids_.size());
}

}  // namespace
}  // namespace zps::server
