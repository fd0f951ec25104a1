// SessionTable (server/src/shard/session_table.h): the shard's admission, replacement and fence
// policy for worker sessions, with ints for endpoints (no UCX).
#include "shard/session_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using testing::ElementsAre;
using testing::IsEmpty;
using testing::UnorderedElementsAre;
using Table = SessionTable<int>;

TEST(SessionTable, AdmitsOnlyWhileServing) {
  Table t;
  EXPECT_THAT(t.CheckAdmission(), StatusIs(Code::kUnavailable));  // before the job is restored
  t.SetAccepting(true);
  EXPECT_THAT(t.CheckAdmission(), IsOk());
  EXPECT_THAT(t.TakeRank(0), IsEmpty());
  t.Add(100, {0, 7, 3});
  auto s = t.Find(100);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rank, 0u);
  EXPECT_EQ(s->ep, 7);
  EXPECT_EQ(s->epoch, 3u);  // the epoch it was admitted at: ShardState refuses older ones
  EXPECT_EQ(t.size(), 1u);
}

TEST(SessionTable, UnknownSessionIsUnauthenticated) {
  Table t;
  t.SetAccepting(true);
  t.Add(100, {0, 7, 0});
  EXPECT_FALSE(t.Find(999).has_value());
  EXPECT_THAT(t.SessionError(999), StatusIs(Code::kUnauthenticated));
  EXPECT_FALSE(t.Disconnect(999).has_value());  // nothing to close
  EXPECT_EQ(t.size(), 1u);
}

TEST(SessionTable, NewSessionOfARankReplacesItsOldOnes) {
  Table t;
  t.SetAccepting(true);
  t.Add(100, {0, 7, 0});
  t.Add(200, {1, 8, 0});
  // Rank 0 restarted: its old session is taken out (for the caller to close), then the new one
  // is added. Rank 1 is left alone.
  EXPECT_THAT(t.TakeRank(0), ElementsAre(7));
  t.Add(300, {0, 9, 0});
  EXPECT_FALSE(t.Find(100).has_value());
  // A replaced session is gone, not fenced: its worker is no longer there to re-join.
  EXPECT_THAT(t.SessionError(100), StatusIs(Code::kUnauthenticated));
  EXPECT_EQ(t.Find(300)->ep, 9);
  EXPECT_EQ(t.Find(200)->ep, 8);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_THAT(t.AbsentRanks(3), ElementsAre(2));
}

TEST(SessionTable, StoppingServingFencesEverySession) {
  std::vector<size_t> counts;
  Table t([&](size_t n) { counts.push_back(n); });
  t.SetAccepting(true);
  t.Add(100, {0, 7, 0});
  t.Add(200, {1, 8, 0});
  EXPECT_THAT(t.ParkedFetchError(), IsOk());
  // A rollback begins (SetServing(false)): every session is handed back to be closed.
  auto fenced = t.FenceAll();
  EXPECT_THAT(fenced, UnorderedElementsAre(std::pair<uint64_t, int>{100, 7},
                                           std::pair<uint64_t, int>{200, 8}));
  EXPECT_FALSE(t.accepting());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_THAT(t.AbsentRanks(2), ElementsAre(0, 1));
  // Their tokens now say "re-join" rather than "unknown".
  EXPECT_FALSE(t.Find(100).has_value());
  EXPECT_THAT(t.SessionError(100), StatusIs(Code::kUnavailable));
  EXPECT_THAT(t.SessionError(200), StatusIs(Code::kUnavailable));
  EXPECT_THAT(t.SessionError(300), StatusIs(Code::kUnauthenticated));
  // No hello is admitted until the restore is done.
  EXPECT_THAT(t.CheckAdmission(), StatusIs(Code::kUnavailable));
  EXPECT_THAT(counts, ElementsAre(1, 2, 0));
}

TEST(SessionTable, FetchParkedAfterTheFenceIsAnsweredAtOnce) {
  Table t;
  t.SetAccepting(true);
  t.Add(100, {0, 7, 0});
  // The fetch handler found the session...
  ASSERT_TRUE(t.Find(100).has_value());
  // ...then another thread fenced it before the fetch was parked.
  (void)t.FenceAll();
  // Once parked, the handler asks: every parked fetch must be answered now, not at a publish
  // the rollback never makes.
  EXPECT_THAT(t.ParkedFetchError(), StatusIs(Code::kUnavailable));
  // Serving again (the restore is done): parked fetches wait for their publish as usual.
  t.SetAccepting(true);
  EXPECT_THAT(t.ParkedFetchError(), IsOk());
}

TEST(SessionTable, FencedTokensStayFencedUntilTheWorkerDisconnects) {
  std::vector<size_t> counts;
  Table t([&](size_t n) { counts.push_back(n); });
  t.SetAccepting(true);
  t.Add(100, {0, 7, 0});
  (void)t.FenceAll();
  t.SetAccepting(true);  // the shard serves again: new sessions come in, old tokens stay fenced
  t.Add(300, {0, 9, 1});
  EXPECT_THAT(t.SessionError(100), StatusIs(Code::kUnavailable));
  // The old worker's control connection closes: its fence is forgotten, nothing to close.
  EXPECT_FALSE(t.Disconnect(100).has_value());
  EXPECT_THAT(t.SessionError(100), StatusIs(Code::kUnauthenticated));
  // The new one's closes: its endpoint is handed back.
  EXPECT_EQ(t.Disconnect(300), std::optional<int>(9));
  EXPECT_EQ(t.size(), 0u);
  EXPECT_THAT(counts, ElementsAre(1, 0, 1, 0));
}

TEST(SessionTable, EndpointsListsLiveSessions) {
  Table t;
  t.SetAccepting(true);
  t.Add(100, {0, 7, 0});
  t.Add(200, {1, 8, 0});
  EXPECT_THAT(t.Endpoints(), UnorderedElementsAre(std::pair<uint64_t, int>{100, 7},
                                                  std::pair<uint64_t, int>{200, 8}));
}

}  // namespace
}  // namespace zps::server
