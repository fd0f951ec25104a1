// zps-server: one shard of a zps job (shard 0 also runs the coordinator unless --coordinator is
// given). See docs/operations.md.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "zps/common/config.h"
#include "zps/common/logging.h"
#include "zps/common/metrics.h"
#include "zps/server/online_reshard.h"
#include "zps/server/shard_server.h"

namespace {

zps::Status Run(int argc, char** argv) {
  zps::server::ShardServerOptions opts;
  zps::Flags flags("zps-server",
                   "A zps shard: holds fp32 masters and optimizer state for its chunks, serves "
                   "16-bit fetches and takes gradient pushes. Shard 0 is also the coordinator, "
                   "the one endpoint workers are pointed at.");
  opts.Register(flags);
  zps::server::OnlineReshardOptions reshard;
  reshard.Register(flags);
  ZPS_ASSIGN_OR_RETURN(auto outcome, flags.Parse(argc, argv));
  if (outcome == zps::ParseOutcome::kHelpShown) return zps::Status::Ok();
  ZPS_ASSIGN_OR_RETURN(auto level, zps::log::ParseLevel(opts.log_level));
  zps::log::SetLevel(level);
  // A donor's ordinal is of the old job, at or beyond --shards; its other options are checked as
  // shard 0's would be.
  const int ordinal = opts.ordinal;
  if (reshard.donor) opts.ordinal = 0;
  ZPS_RETURN_IF_ERROR(opts.Finalize());
  opts.ordinal = ordinal;

  // Signals are taken by a dedicated thread, so shutdown runs as ordinary code. Blocked
  // before any thread starts (the reshard endpoint's too: threads inherit the mask); a signal
  // during a reshard waits until it is done.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // A store of another shard count than --shards is moved to the new layout with the peers
  // before the shard serves (docs/checkpoints.md, "Online"); a donor only serves its store to
  // them. Both run before the shard binds its own ports.
  const zps::server::ReshardSelf self{opts.data_dir, static_cast<uint32_t>(opts.ordinal),
                                      static_cast<uint32_t>(opts.shards), opts.bind_address,
                                      opts.token};
  // While they run, the metrics port shows their progress (zps_reshard_*, docs/metrics.md):
  // /healthz answers, /readyz says the phase. The shard's own exporter takes the port after.
  zps::metrics::Registry reshard_registry;
  ZPS_ASSIGN_OR_RETURN(auto progress, zps::server::ReshardProgress::Create(reshard_registry));
  std::unique_ptr<zps::metrics::Exporter> reshard_exporter;
  if (!reshard.peers.empty() && opts.metrics_port != 0) {
    zps::metrics::ExporterOptions eo;
    eo.bind_address = opts.bind_address;
    eo.port = static_cast<uint16_t>(opts.metrics_port);
    ZPS_ASSIGN_OR_RETURN(
        reshard_exporter, zps::metrics::Exporter::Start(eo, &reshard_registry, {}, [progress] {
          return zps::Unavailable("resharding: " +
                                  std::string(zps::server::ReshardPhaseName(progress.phase())));
        }));
  }
  if (reshard.donor) return zps::server::ServeAsDonor(reshard, self, progress);
  ZPS_ASSIGN_OR_RETURN(auto reshard_endpoint, zps::server::ReshardAtStart(reshard, self, progress));
  reshard_exporter.reset();  // frees the metrics port for the shard

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
