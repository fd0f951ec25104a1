// UCX data plane across two processes: the peer is test_ucx_peer, started with fork + exec.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ucx_test_util.h"
#include "zps/common/ucx.h"
#include "zps/testing/status_matchers.h"

namespace zps::ucx {
namespace {

using namespace std::chrono_literals;
using testing::Completions;
using testing::MakeHeader;
using testing::ParseHeader;
using testing::RandomBytes;

/// A running test_ucx_peer: its stdin (closing it ends the peer) and what it printed.
class PeerProcess {
 public:
  static std::unique_ptr<PeerProcess> Spawn(const std::string& tls) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return nullptr;
    pid_t pid = fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      dup2(in[0], 0);
      dup2(out[1], 1);
      const char* argv[] = {ZPS_UCX_PEER, tls.c_str(), nullptr};
      execv(ZPS_UCX_PEER, const_cast<char* const*>(argv));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess());
    p->pid_ = pid;
    p->stdin_fd_ = in[1];
    FILE* f = fdopen(out[0], "r");
    char line[8192];
    while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
      std::string s(line);
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      if (s.rfind("ADDR ", 0) == 0) p->address = testing::Unhex(s.substr(5));
      if (s.rfind("RKEY ", 0) == 0) p->rkey = testing::Unhex(s.substr(5));
      if (s.rfind("RADDR ", 0) == 0) p->remote_address = std::stoull(s.substr(6));
      if (s == "READY") break;
    }
    if (f != nullptr) std::fclose(f);
    if (p->address.empty()) return nullptr;
    return p;
  }

  ~PeerProcess() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
    if (pid_ > 0) {
      // Give a peer that saw EOF a moment to exit cleanly, then make sure it is gone.
      for (int i = 0; i < 200; ++i) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
        usleep(10000);
      }
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void Signal(int sig) { kill(pid_, sig); }
  int pid() const { return pid_; }

  std::vector<std::byte> address;
  std::vector<std::byte> rkey;
  uint64_t remote_address = 0;

 private:
  PeerProcess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
};

class UcxProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    peer_ = PeerProcess::Spawn(GetParam());
    ASSERT_NE(peer_, nullptr) << "cannot start " << ZPS_UCX_PEER;
    auto ctx = Context::Create({.transports = GetParam(), .keepalive_interval = 200ms});
    ASSERT_THAT(ctx, IsOk());
    ctx_ = std::move(*ctx);
    auto w = Worker::Create(*ctx_, {.thread_name = "ucx-parent", .close_timeout = 500ms});
    ASSERT_THAT(w, IsOk());
    worker_ = std::move(*w);
    ASSERT_TRUE(worker_
                    ->SetAmHandler(2,
                                   [this](AmMessage& m) {
                                     auto buf =
                                         std::make_shared<std::vector<std::byte>>(m.data_length());
                                     auto header = ParseHeader(m.header());
                                     m.Receive(*buf, [this, buf, header](Status s) {
                                        std::lock_guard<std::mutex> lock(mu_);
                                        replies_.push_back(s.ok() && Crc32c(*buf) == header.crc &&
                                                           buf->size() == header.length);
                                        cv_.notify_all();
                                      }).IgnoreError();
                                   })
                    .ok());
    ASSERT_THAT(worker_->Start(), IsOk());
    auto ep = worker_->Connect(
        peer_->address,
        [this](const Endpoint&, const Status& s) {
          std::lock_guard<std::mutex> lock(mu_);
          ep_error_ = s;
          cv_.notify_all();
        },
        peer_->pid());
    ASSERT_THAT(ep, IsOk());
    ep_ = *ep;
  }

  void TearDown() override {
    if (worker_) worker_->Stop();
    worker_.reset();
    peer_.reset();
  }

  bool Echo(size_t size) {
    auto payload = std::make_shared<std::vector<std::byte>>(RandomBytes(size, 42));
    Completions sent;
    SendOptions o;
    o.force_rendezvous = size > 65536;
    worker_->SendAm(ep_, 1, MakeHeader(*payload, 0), *payload, payload, sent.Callback(), o);
    if (!sent.WaitFor(1) || !sent.statuses()[0].ok()) return false;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, testing::kTimeout, [&] { return !replies_.empty(); })) return false;
    bool ok = replies_.front();
    replies_.erase(replies_.begin());
    return ok;
  }

  std::unique_ptr<PeerProcess> peer_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Worker> worker_;
  Endpoint ep_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> replies_;
  Status ep_error_;
};

TEST_P(UcxProcessTest, EchoAndGetAcrossProcesses) {
  EXPECT_TRUE(Echo(3000));
  EXPECT_TRUE(Echo(6 << 20));
  std::vector<std::byte> local(4 << 20);
  Completions done;
  worker_->Get(ep_, local, peer_->remote_address, peer_->rkey, nullptr, done.Callback());
  ASSERT_TRUE(done.WaitFor(1));
  ASSERT_THAT(done.statuses()[0], IsOk());
  for (size_t i = 0; i < local.size(); i += 4093) {
    ASSERT_EQ(local[i], std::byte((i * 131 + 7) & 0xff)) << "at byte " << i;
  }
}

TEST_P(UcxProcessTest, KilledPeerFailsPendingOperations) {
  ASSERT_TRUE(Echo(100));  // the connection is up
  peer_->Signal(SIGSTOP);  // the peer stops progressing: rendezvous sends stay pending
  auto payload = std::make_shared<std::vector<std::byte>>(RandomBytes(1 << 20, 1));
  Completions done;
  SendOptions o;
  o.force_rendezvous = true;
  for (int i = 0; i < 4; ++i) {
    worker_->SendAm(ep_, 1, MakeHeader(*payload, 0), *payload, payload, done.Callback(), o);
  }
  std::vector<std::byte> local(1 << 20);
  worker_->Get(ep_, local, peer_->remote_address, peer_->rkey, nullptr, done.Callback());
  std::this_thread::sleep_for(100ms);
  peer_->Signal(SIGKILL);
  ASSERT_TRUE(done.WaitFor(5)) << "pending operations hung after the peer died";
  size_t failed = 0;
  for (auto& s : done.statuses()) {
    if (!s.ok()) {
      ++failed;
      EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
    }
  }
  EXPECT_GE(failed, 4u);  // the rendezvous sends cannot have finished; the get may have
  std::unique_lock<std::mutex> lock(mu_);
  EXPECT_TRUE(cv_.wait_for(lock, testing::kTimeout, [&] { return !ep_error_.ok(); }));
}

INSTANTIATE_TEST_SUITE_P(ucx, UcxProcessTest, ::testing::Values("tcp", "shm"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace zps::ucx
