// Test helpers for integration tests that run zps-server child processes: a free loopback
// port, a zps-server process (fork + exec of ZPS_SERVER_BIN) killed and reaped on
// destruction, and deterministic test values.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "zps/common/free_port.h"
#include "zps/common/scoped_fd.h"

namespace zps {

// n values uniform in [-scale, scale), the same for the same seed.
inline std::vector<float> Values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * u(rng);
  return v;
}

// A free loopback port (zps/common/free_port.h: below the ephemeral range, reserved across
// processes); 0 when none can be had.
inline uint16_t FreePort() {
  auto port = FreeLoopbackPort();
  return port.ok() ? *port : 0;
}

/// A zps-server child process; SIGKILLed and reaped when destroyed.
class ShardProcess {
 public:
  explicit ShardProcess(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execv(ZPS_SERVER_BIN, argv.data());
      ::_exit(127);
    }
  }
  ~ShardProcess() { Kill(); }
  ShardProcess(const ShardProcess&) = delete;
  ShardProcess& operator=(const ShardProcess&) = delete;
  bool started() const { return pid_ > 0; }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

/// N zps-server children on loopback (shard 0 the coordinator), with a token file in a temp dir;
/// all killed, and the files removed, on destruction.
struct LocalShards {
  std::string dir, token_file, endpoint;
  std::vector<std::unique_ptr<ShardProcess>> shards;

  /// False when a step failed (no temp dir, no free port, a fork failed).
  /// `extra`: more zps-server flags for every shard.
  bool Start(int n, const std::string& tls, const char* token, const std::string& name,
             const std::vector<std::string>& extra = {}) {
    std::string tmpl = "/tmp/" + name + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return false;
    dir = tmpl;
    token_file = dir + "/token";
    FILE* f = std::fopen(token_file.c_str(), "w");
    if (f == nullptr) return false;
    std::fputs(token, f);
    std::fclose(f);
    std::vector<uint16_t> ports;
    for (int i = 0; i < n; ++i) {
      ports.push_back(FreePort());
      if (ports.back() == 0) return false;
    }
    endpoint = "127.0.0.1:" + std::to_string(ports[0]);
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> args = {ZPS_SERVER_BIN,
                                       "--ordinal=" + std::to_string(i),
                                       "--shards=" + std::to_string(n),
                                       "--port=" + std::to_string(ports[i]),
                                       "--bind=127.0.0.1",
                                       "--token-file=" + token_file,
                                       "--metrics-port=0",
                                       "--threads=1",
                                       "--log-level=warning",
                                       "--ucx-tls=" + tls};
      if (i > 0) args.push_back("--coordinator=" + endpoint);
      args.insert(args.end(), extra.begin(), extra.end());
      shards.push_back(std::make_unique<ShardProcess>(args));
      if (!shards.back()->started()) return false;
    }
    return true;
  }
  ~LocalShards() {
    shards.clear();
    if (!token_file.empty()) std::remove(token_file.c_str());
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
};

}  // namespace zps
