// A dead shard or coordinator gives the worker a clear error, never a hang (issue 3: "Every
// wait has a deadline. A dead shard or coordinator gives a clear error").
//
// Real processes: two zps-server shards (fork + exec; shard 0 is the coordinator) and a worker
// Client in this process, over UCX tcp and over shared memory (posix, cma, self: there UCX
// 1.13 reports no peer failure, and the Client's worker-watch thread must notice the shard's
// control connection dropping). A shard is SIGKILLed while a fetch is parked on it; then the
// parked fetch, a new Fetch, a PushGrad (seen at FlushPushes) and AwaitCommit must each return
// Unavailable naming the shard. The op_timeout is long: a wait that only ends at it returns
// DeadlineExceeded, which fails the test (no wall-clock assertion needed).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "shard_process.h"
#include "zps/server/job.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/client.h"

namespace zps {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "dead-shard-test-token";

class DeadShardTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int kShards = 2;

  void SetUp() override {
    ASSERT_TRUE(cluster_.Start(kShards, GetParam(), kToken, "zps-dead-shard"));

    // Four one-chunk parameters over the two shards; world size 1, server-sum.
    auto layout = Layout::Build({{"a", {1024}}, {"b", {1024}}, {"c", {1024}}, {"d", {1024}}},
                                {.chunk_elems = 1024, .align_elems = 64, .num_shards = kShards});
    ASSERT_THAT(layout, IsOk());
    server::JobSpec job{*layout, {}, {}, {}};
    worker::WorkerOptions wo;
    wo.endpoint = cluster_.endpoint;
    wo.token = kToken;
    wo.ucx_tls = GetParam();
    wo.connect_timeout = 60s;
    wo.op_timeout = 60s;  // only a missed failure would wait this long (DeadlineExceeded)
    auto c = worker::Client::Connect(wo, job.Serialize(), job.Hash());
    ASSERT_THAT(c, IsOk());
    client_ = std::move(*c);
    for (uint32_t p = 0; p < client_->layout().num_params(); ++p) {
      std::vector<float> v(client_->layout().param_numel(p), 0.5f);
      ASSERT_THAT(client_->PushInitial(p, v), IsOk());
    }
    ASSERT_THAT(client_->FlushPushes(), IsOk());
    for (uint32_t p = 0; p < client_->layout().num_params(); ++p) {
      auto r = client_->Fetch(p, 0);
      ASSERT_THAT(r, IsOk());
    }
  }

  void TearDown() override {
    client_.reset();  // must not hang on the dead shard either
    cluster_.shards.clear();
  }

  /// A parameter held (whole) by shard `ordinal`.
  uint32_t ParamOn(uint32_t ordinal) const {
    const Layout& l = client_->layout();
    for (uint32_t p = 0; p < l.num_params(); ++p) {
      auto pieces = l.Pieces(p);
      if (pieces.ok() && pieces->size() == 1 && l.shard_of_chunk((*pieces)[0].chunk) == ordinal) {
        return p;
      }
    }
    ADD_FAILURE() << "no parameter on shard " << ordinal;
    return 0;
  }

  static void ExpectUnavailable(const Status& s, const std::string& names) {
    EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find(names), std::string::npos)
        << "'" << s.message() << "' does not name " << names;
  }

  LocalShards cluster_;
  std::unique_ptr<worker::Client> client_;
};

TEST_P(DeadShardTest, KilledShardFailsEveryWait) {
  const uint32_t victim = ParamOn(1);
  const uint32_t survivor = ParamOn(0);
  // Parked on shard 1 until version 1, which never comes: only the failure can end it.
  worker::FetchOp parked = client_->FetchAsync(victim, 1);
  // The survivor's gradient goes in, so that the commit of step 0 waits for shard 1 only.
  std::vector<float> grad(client_->layout().param_numel(survivor), 1e-3f);
  ASSERT_THAT(client_->PushGrad(survivor, 0, grad), IsOk());
  ASSERT_THAT(client_->FlushPushes(), IsOk());

  cluster_.shards[1]->Kill();

  ExpectUnavailable(parked.Wait(client_->op_timeout()).status(), "shard 1");
  ExpectUnavailable(client_->Fetch(victim, 0).status(), "shard 1");
  std::vector<float> vgrad(client_->layout().param_numel(victim), 1e-3f);
  Status pushed = client_->PushGrad(victim, 0, vgrad);  // OK (asynchronous) or the failure
  Status flushed = client_->FlushPushes();
  ExpectUnavailable(pushed.ok() ? flushed : pushed, "shard 1");
  // The coordinator (shard 0) lost shard 1's control connection: the step cannot commit.
  auto commit = client_->AwaitCommit(0);
  ASSERT_FALSE(commit.ok());
  EXPECT_EQ(commit.status().code(), Code::kUnavailable) << commit.status().ToString();
  // The survivor answers: its parameter, or (once it learned of the job's recovery and fenced
  // this worker's session) Unavailable; never the op timeout.
  auto alive = client_->Fetch(survivor, 0);
  if (!alive.ok()) ExpectUnavailable(alive.status(), "re-join");
}

// The survivor's side of the same kill: the coordinator (shard 0) starts the job's recovery
// and fences every worker session, answering what is parked and closing the session's
// endpoint. Its notice fails the worker's endpoint too, so a fetch sent after the close (which
// would go unanswered) fails at once with Unavailable instead of waiting for the op timeout.
TEST_P(DeadShardTest, FencedSessionFailsEveryLaterWait) {
  const uint32_t survivor = ParamOn(0);
  // Parked on shard 0 until version 1, which the rollback never publishes.
  worker::FetchOp parked = client_->FetchAsync(survivor, 1);

  cluster_.shards[1]->Kill();

  ExpectUnavailable(parked.Wait(client_->op_timeout()).status(), "re-join");
  for (int i = 0; i < 3; ++i) {
    ExpectUnavailable(client_->Fetch(survivor, 0).status(), "ended this worker's session");
  }
}

TEST_P(DeadShardTest, KilledCoordinatorFailsEveryWait) {
  const uint32_t victim = ParamOn(0);
  worker::FetchOp parked = client_->FetchAsync(victim, 1);
  // AwaitCommit(0) long-polls the coordinator: no gradient was pushed, so it waits.
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    cluster_.shards[0]->Kill();
  });
  auto commit = client_->AwaitCommit(0);
  killer.join();
  ASSERT_FALSE(commit.ok());
  ExpectUnavailable(commit.status(), "coordinator");
  ExpectUnavailable(parked.Wait(client_->op_timeout()).status(), "shard 0");
  ExpectUnavailable(client_->Fetch(victim, 0).status(), "shard 0");
  // A later call to the dead coordinator fails at once too.
  ExpectUnavailable(client_->AwaitCommit(0).status(), "coordinator");
}

INSTANTIATE_TEST_SUITE_P(Transports, DeadShardTest, ::testing::Values("tcp", "shm"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace zps
