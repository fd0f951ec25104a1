#include "zps/server/reshard_progress.h"

namespace zps::server {

std::string_view ReshardPhaseName(ReshardPhase phase) {
  switch (phase) {
    case ReshardPhase::kNone:
      return "none";
    case ReshardPhase::kWaitingForPeers:
      return "waiting for peers";
    case ReshardPhase::kCopying:
      return "copying";
    case ReshardPhase::kAwaitingSwitch:
      return "awaiting the switch";
    case ReshardPhase::kDone:
      return "done";
    case ReshardPhase::kFailed:
      return "failed";
  }
  return "unknown";
}

Result<ReshardProgress> ReshardProgress::Create(metrics::Registry& r) {
  ReshardProgress p;
  ZPS_ASSIGN_OR_RETURN(auto* phase,
                       r.AddGauge("zps_reshard_phase",
                                  "Online reshard phase: 0 none, 1 waiting for peers, 2 copying, "
                                  "3 awaiting the switch, 4 done, 5 failed."));
  ZPS_ASSIGN_OR_RETURN(p.phase_, phase->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* chunks,
                       r.AddGauge("zps_reshard_chunks",
                                  "Chunks of this shard's new store: to write, copied from its "
                                  "own old store, fetched from peers.",
                                  {"kind"}));
  ZPS_ASSIGN_OR_RETURN(p.chunks_total_, chunks->Add({"total"}));
  ZPS_ASSIGN_OR_RETURN(p.chunks_copied_, chunks->Add({"copied"}));
  ZPS_ASSIGN_OR_RETURN(p.chunks_fetched_, chunks->Add({"fetched"}));
  ZPS_ASSIGN_OR_RETURN(auto* fetched,
                       r.AddCounter("zps_reshard_fetched_bytes_total",
                                    "Bytes of stored values received from reshard peers."));
  ZPS_ASSIGN_OR_RETURN(p.fetched_bytes_, fetched->Add({}));
  ZPS_ASSIGN_OR_RETURN(
      auto* served, r.AddCounter("zps_reshard_served_bytes_total",
                                 "Bytes of stored values this process's reshard endpoint sent."));
  ZPS_ASSIGN_OR_RETURN(p.served_bytes_, served->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* peers, r.AddGauge("zps_reshard_peers_reached",
                                               "Reshard peer endpoints that have answered."));
  ZPS_ASSIGN_OR_RETURN(p.peers_reached_, peers->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* wait,
                       r.AddGauge("zps_reshard_wait_seconds",
                                  "How long the reshard's current wait for a peer or for the "
                                  "switch has lasted; 0 when not waiting."));
  ZPS_ASSIGN_OR_RETURN(p.wait_seconds_, wait->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* committed,
                       r.AddGauge("zps_reshard_committed_shards",
                                  "New stores reported committed (as shard 0 last counted)."));
  ZPS_ASSIGN_OR_RETURN(p.committed_, committed->Add({}));
  return p;
}

void ReshardProgress::SetPhase(ReshardPhase phase) const {
  phase_.Set(static_cast<double>(static_cast<int>(phase)));
}

}  // namespace zps::server
