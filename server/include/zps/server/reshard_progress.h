// zps/server/reshard_progress.h — what an online reshard (online_reshard.h) shows an operator
// while it runs, before the shard serves: its phase, its chunks, the bytes it fetched and served,
// and how long its current wait for a peer has lasted (docs/metrics.md, the zps_reshard_* rows).
//
// zps-server registers these series in a registry of their own and exports it on the shard's
// metrics port while the reshard (or a donor) runs; /readyz answers 503 with the phase then, and
// /healthz 200, so that a long copy is not taken for a hung process. The shard's own exporter
// takes the port after the reshard: the series are gone once the shard serves.
//
// Thread-safety: every method is safe from any thread (the handles are atomic cells); the
// reshard's caller thread sets the phase and the chunks, the endpoint's io threads add served
// bytes. A default-constructed ReshardProgress is detached: its calls do nothing.
#pragma once

#include <cstdint>
#include <string_view>

#include "zps/common/metrics.h"
#include "zps/common/status.h"

namespace zps::server {

/// The value of zps_reshard_phase.
enum class ReshardPhase : int {
  kNone = 0,             ///< no reshard started (or the store is on the shard count already)
  kWaitingForPeers = 1,  ///< asking shard 0 for the job, or a peer for its store's identity
  kCopying = 2,          ///< writing this shard's new store: chunks copied and fetched
  kAwaitingSwitch = 3,   ///< the new store committed (a donor: serving), waiting for the switch
  kDone = 4,             ///< the job switched and this shard's store is the new one
  kFailed = 5,           ///< the reshard returned an error; the process exits
};

/// A name for logs and /readyz ("waiting for peers", ...).
std::string_view ReshardPhaseName(ReshardPhase phase);

class ReshardProgress {
 public:
  ReshardProgress() = default;  // detached
  /// Registers the zps_reshard_* families in `registry` (which must outlive this object) and
  /// sets every series to 0. Errors: AlreadyExists when they are registered there already;
  /// InvalidArgument/Internal as metrics::Registry.
  static Result<ReshardProgress> Create(metrics::Registry& registry);

  void SetPhase(ReshardPhase phase) const;
  ReshardPhase phase() const { return static_cast<ReshardPhase>(static_cast<int>(phase_.Value())); }
  /// The chunks this shard's new store holds (the state blob not counted).
  void SetChunksTotal(uint64_t n) const { chunks_total_.Set(static_cast<double>(n)); }
  /// One chunk written from this process's own old store.
  void ChunkCopied() const { chunks_copied_.Inc(); }
  /// One chunk written from values a peer sent.
  void ChunkFetched() const { chunks_fetched_.Inc(); }
  /// Bytes of stored values received from peers (keys and values as framed).
  void Fetched(uint64_t bytes) const { fetched_bytes_.Inc(bytes); }
  /// Bytes of stored values this process's endpoint sent to peers.
  void Served(uint64_t bytes) const { served_bytes_.Inc(bytes); }
  /// A peer endpoint answered for the first time (distinct ordinals counted by the caller).
  void PeerReached() const { peers_reached_.Inc(); }
  /// The seconds the current wait (for a peer endpoint, or for the others' reports and the
  /// switch) has lasted; 0 when not waiting.
  void SetWaitSeconds(double s) const { wait_seconds_.Set(s); }
  /// New stores reported committed, as shard 0 counts them (its own included).
  void SetCommitted(uint64_t n) const { committed_.Set(static_cast<double>(n)); }

  uint64_t chunks_total() const { return static_cast<uint64_t>(chunks_total_.Value()); }
  uint64_t chunks_copied() const { return static_cast<uint64_t>(chunks_copied_.Value()); }
  uint64_t chunks_fetched() const { return static_cast<uint64_t>(chunks_fetched_.Value()); }
  uint64_t fetched_bytes() const { return fetched_bytes_.Value(); }
  uint64_t served_bytes() const { return served_bytes_.Value(); }
  uint64_t peers_reached() const { return static_cast<uint64_t>(peers_reached_.Value()); }
  double wait_seconds() const { return wait_seconds_.Value(); }
  uint64_t committed() const { return static_cast<uint64_t>(committed_.Value()); }

 private:
  metrics::Gauge phase_;
  metrics::Gauge chunks_total_, chunks_copied_, chunks_fetched_;
  metrics::Counter fetched_bytes_, served_bytes_;
  metrics::Gauge peers_reached_, wait_seconds_, committed_;
};

}  // namespace zps::server
