// zps-server: one shard of a zps job (shard 0 also runs the coordinator unless --coordinator is
// given). See docs/operations.md.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "zps/common/config.h"
#include "zps/common/logging.h"
#include "zps/server/shard_server.h"

namespace {

zps::Status Run(int argc, char** argv) {
  zps::server::ShardServerOptions opts;
  zps::Flags flags("zps-server",
                   "A zps shard: holds fp32 masters and optimizer state for its chunks, serves "
                   "16-bit fetches and takes gradient pushes. Shard 0 is also the coordinator, "
                   "the one endpoint workers are pointed at.");
  opts.Register(flags);
  ZPS_ASSIGN_OR_RETURN(auto outcome, flags.Parse(argc, argv));
  if (outcome == zps::ParseOutcome::kHelpShown) return zps::Status::Ok();
  ZPS_ASSIGN_OR_RETURN(auto level, zps::log::ParseLevel(opts.log_level));
  zps::log::SetLevel(level);
  ZPS_RETURN_IF_ERROR(opts.Finalize());

  // Signals are taken by a dedicated thread, so shutdown runs as ordinary code.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  ZPS_ASSIGN_OR_RETURN(auto server, zps::server::ShardServer::Create(opts));
  ZPS_RETURN_IF_ERROR(server->Start());
  std::thread signals([&] {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig != 0) {
      ZPS_LOG(INFO) << "signal " << sig << ": shutting down";
      server->Stop();
    }
  });
  zps::Status result = server->Wait();
  server->Stop();
  pthread_kill(signals.native_handle(), SIGTERM);  // wake the watcher if it still waits
  signals.join();
  ZPS_LOG(INFO) << "zps-server exits: " << result.ToString();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  zps::Status s = Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "zps-server: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
