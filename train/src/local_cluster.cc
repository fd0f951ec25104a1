#include "local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "zps/common/free_port.h"
#include "zps/common/scoped_fd.h"

namespace zps::train {
namespace {

std::atomic<int> g_signal{0};

struct Child {
  pid_t pid = -1;
  std::string name;
  std::string log;
  bool done = false;
  int status = 0;
};

Result<Child> Spawn(const std::string& name, const std::vector<std::string>& args,
                    const std::string& log_path) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    ::setpgid(0, 0);  // a terminal's ^C reaches only us; we stop the children in order
    if (!log_path.empty()) {
      ScopedFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
      if (log.valid()) {
        ::dup2(log.get(), STDERR_FILENO);
        if (name.rfind("worker-0", 0) != 0) ::dup2(log.get(), STDOUT_FILENO);
      }
    }
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  return Child{pid, name, log_path};
}

void PrintTail(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  size_t from = lines.size() > 15 ? lines.size() - 15 : 0;
  for (size_t i = from; i < lines.size(); ++i) std::fprintf(stderr, "  | %s\n", lines[i].c_str());
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "unknown status";
}

// The last "zps-server: CODE: message" line of a shard's log: what it printed as it exited.
std::string ExitStatusLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, found;
  while (std::getline(in, line)) {
    if (line.rfind("zps-server: ", 0) == 0) found = line.substr(12);
  }
  return found;
}

// "shard-1 stopped early (exit code 1): RESOURCE_EXHAUSTED: spill file: ... disk full", after
// printing the last lines of its log.
Status StoppedEarly(const Child& c) {
  std::string why = c.name + " stopped early (" + DescribeExit(c.status) + ")";
  if (!c.log.empty()) {
    std::fprintf(stderr, "last lines of %s:\n", c.log.c_str());
    PrintTail(c.log);
    const std::string status = ExitStatusLine(c.log);
    if (!status.empty()) why += ": " + status;
    why += "; its log: " + c.log;
  }
  return Internal(why);
}

// Signals every child and waits up to `grace` for them all, then SIGKILLs the rest.
void StopAll(std::vector<Child>& children, int sig, std::chrono::seconds grace) {
  for (auto& c : children) {
    if (!c.done) ::kill(c.pid, sig);
  }
  auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& c : children) {
    while (!c.done) {
      pid_t r = ::waitpid(c.pid, &c.status, WNOHANG);
      if (r == c.pid) {
        c.done = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.done = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace

std::string ClusterParentDir(const std::string& work_dir) {
  if (!work_dir.empty()) return work_dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

Status RunLocalCluster(const LocalCluster& cluster, int argc, char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return IoError("cannot find this program's path: " + ec.message());
  fs::path server = self.parent_path() / "zps-server";
  if (!fs::exists(server)) return NotFound("zps-server not found next to " + self.string());
  const std::string parent = ClusterParentDir(cluster.work_dir);
  if (!fs::is_directory(parent, ec)) {
    return NotFound("the work directory " + parent +
                    " does not exist (--work-dir, ZPS_WORK_DIR or " + "TMPDIR)");
  }
  std::string tmpl = parent + "/zps-local-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl, errno);
  const std::string dir = tmpl;
  const std::string token_file = dir + "/token";
  {
    std::random_device rd;
    std::string token;
    for (int i = 0; i < 32; ++i) token += "0123456789abcdef"[rd() % 16];
    std::ofstream(token_file) << token << "\n";
    ::chmod(token_file.c_str(), 0600);
  }
  if (cluster.metrics_port != 0 &&
      cluster.metrics_port + cluster.shards + cluster.workers > 65536) {
    return InvalidArgument("--metrics-port " + std::to_string(cluster.metrics_port) +
                           " leaves no room for " +
                           std::to_string(cluster.shards + cluster.workers) + " ports");
  }
  auto metrics_port = [&](int index) {
    return cluster.metrics_port == 0 ? 0 : cluster.metrics_port + index;
  };
  ZPS_ASSIGN_OR_RETURN(const std::vector<uint16_t> ports,
                       FreeLoopbackPorts(static_cast<size_t>(cluster.shards)));
  const std::string endpoint = "127.0.0.1:" + std::to_string(ports[0]);
  std::printf("zps local cluster: %d shards + %d workers on loopback (logs in %s)\n",
              cluster.shards, cluster.workers, dir.c_str());
  if (cluster.metrics_port != 0) {
    std::printf(
        "zps local cluster: /metrics on 127.0.0.1, shards at ports %d-%d, workers at "
        "%d-%d\n",
        metrics_port(0), metrics_port(cluster.shards - 1), metrics_port(cluster.shards),
        metrics_port(cluster.shards + cluster.workers - 1));
  }
  std::fflush(stdout);

  struct sigaction sa {};
  sa.sa_handler = [](int sig) { g_signal = sig; };
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  std::vector<Child> shards, workers;
  Status result;
  for (int i = 0; i < cluster.shards; ++i) {
    std::vector<std::string> args = {server.string(),
                                     "--ordinal=" + std::to_string(i),
                                     "--shards=" + std::to_string(cluster.shards),
                                     "--port=" + std::to_string(ports[i]),
                                     "--bind=127.0.0.1",
                                     "--token-file=" + token_file,
                                     "--metrics-port=" + std::to_string(metrics_port(i))};
    if (i > 0) args.push_back("--coordinator=" + endpoint);
    if (!cluster.ucx_tls.empty()) args.push_back("--ucx-tls=" + cluster.ucx_tls);
    if (cluster.shard_memory_budget > 0) {
      args.push_back("--memory-budget=" + std::to_string(cluster.shard_memory_budget));
    }
    if (cluster.shard_serving_budget > 0) {
      args.push_back("--serving-budget=" + std::to_string(cluster.shard_serving_budget));
    }
    args.push_back("--serving-copies=" + cluster.shard_serving_copies);
    if (cluster.shard_memory_budget > 0 || cluster.shard_serving_budget > 0) {
      args.push_back("--data-dir=" + dir + "/shard-" + std::to_string(i) + "-data");
    }
    auto c =
        Spawn("shard-" + std::to_string(i), args, dir + "/shard-" + std::to_string(i) + ".log");
    if (!c.ok()) {
      result = c.status();
      break;
    }
    shards.push_back(std::move(*c));
  }
  for (int r = 0; result.ok() && r < cluster.workers; ++r) {
    std::vector<std::string> args = {self.string()};
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    args.push_back("--mode=worker");
    args.push_back("--rank=" + std::to_string(r));
    args.push_back("--endpoint=" + endpoint);
    args.push_back("--token-file=" + token_file);
    args.push_back("--metrics-port=" + std::to_string(metrics_port(cluster.shards + r)));
    args.push_back("--metrics-bind=127.0.0.1");
    auto c = Spawn("worker-" + std::to_string(r), args,
                   r == 0 ? "" : dir + "/worker-" + std::to_string(r) + ".log");
    if (!c.ok()) {
      result = c.status();
      break;
    }
    workers.push_back(std::move(*c));
  }
  // Wait for every worker; stop early if anything fails or a signal arrives.
  bool shard_reported = false;  // the failure is a shard's own
  while (result.ok()) {
    if (g_signal != 0) {
      result = Cancelled("interrupted by signal " + std::to_string(g_signal.load()));
      break;
    }
    bool all_done = true;
    for (auto* group : {&workers, &shards}) {
      for (auto& c : *group) {
        if (c.done) continue;
        pid_t r = ::waitpid(c.pid, &c.status, WNOHANG);
        if (r == c.pid) {
          c.done = true;
          bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
          if ((!ok || group == &shards) && result.ok()) {
            result = StoppedEarly(c);
            shard_reported = group == &shards;
          }
        }
      }
    }
    for (auto& c : workers) all_done = all_done && c.done;
    if (all_done || !result.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // A worker fails as soon as a shard it talks to is gone: the shard's own reason is the cause,
  // so give the shards a moment to be seen exiting (a coordinator that fails stays up 2 s to
  // tell the workers why) and report the first that did.
  if (!result.ok() && !shard_reported && result.code() != Code::kCancelled) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool shard_seen = false;
    while (!shard_seen && std::chrono::steady_clock::now() < deadline) {
      for (auto& c : shards) {
        if (!c.done && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.done = true;
        if (c.done && !shard_seen) {
          shard_seen = true;
          result = StoppedEarly(c);
        }
      }
      if (!shard_seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  StopAll(workers, SIGTERM, std::chrono::seconds(10));
  // A shard writes its shutdown checkpoint before it exits: a few seconds for a large state, and
  // several times that on a loaded 2-core machine (7.7 s has been seen), so 10 s killed shards
  // that were stopping cleanly. The chart gives a shard 600 s (terminationGracePeriodSeconds);
  // 60 s here bounds how long a failing local run waits.
  StopAll(shards, SIGTERM, std::chrono::seconds(60));
  for (auto& c : shards) {
    if (result.ok() && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
      result = Internal(c.name + " did not shut down cleanly (" + DescribeExit(c.status) + ")");
      PrintTail(c.log);
    }
  }
  if (result.ok()) {
    std::printf("zps local cluster: all processes exited cleanly\n");
    // ZPS_KEEP_CLUSTER_LOGS (tests): the logs stay for the caller to read (and remove).
    if (std::getenv("ZPS_KEEP_CLUSTER_LOGS") == nullptr) fs::remove_all(dir, ec);
  } else {
    std::fprintf(stderr,
                 "zps local cluster: the cluster directory %s is kept (shard-N.log, "
                 "worker-N.log)\n",
                 dir.c_str());
  }
  return result;
}

}  // namespace zps::train
