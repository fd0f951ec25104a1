// zps/server/online_reshard.h — a shard started with another shard count than its job's moves
// the job's checkpoint to the new layout with its peers before it serves, so that a StatefulSet
// with one volume per shard pod can change its shard count (docs/checkpoints.md, "Online").
//
// Every process of the change — the M shards of the new job, and a donor for each old ordinal
// >= M (at scale-down) — runs a reshard endpoint (an rpc::Server on --reshard-port) that serves
// its old store read-only: ReshardInfo (identity and checkpoint), ReshardFetch (a chunk's values
// as stored). Shard i of M fills a side store `<data-dir>/checkpoints.reshard` with its chunks of
// the job's checkpoint S — chunk c from old shard c % N: CheckpointWriter::CopyChunk from its own
// store, PutStored for values fetched from a peer (each value's CRC checked on arrival) — commits
// it and reports to the new shard 0 (ReshardReport). Shard 0, once all M reported, writes the
// coordinator catalog of the M-shard job beside its own (`coordinator.reshard`) and exchanges the
// two directories in one rename (renameat2 RENAME_EXCHANGE), then syncs the data directory: the
// commit point. A crash before it resumes the N-shard job, after it the M-shard one. Each shard
// then exchanges its side store with `checkpoints` and removes the old store; donors exit.
//
// Bad input leaves every old store as it was: the old stores are opened read-only, and any error
// before the commit point removes the side store. Errors are returned to main(), which exits.
//
// Test hooks (MaybeCrashAt, ZPS_TEST_CRASH_AT=<point>:<step>): `reshard-committed` (a shard
// other than 0, its side store committed, before its report) and `reshard-switched` (shard 0,
// right after the commit point).
//
// Progress: ReshardAtStart and ServeAsDonor follow their work in a ReshardProgress (phase, chunks,
// bytes fetched and served, the current wait), which zps-server exports while they run.
//
// Thread-safety: ReshardAtStart and ServeAsDonor run on the caller's thread (the endpoint answers
// on its own io threads); the returned ReshardEndpoint is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zps/common/config.h"
#include "zps/common/status.h"
#include "zps/server/reshard_progress.h"

namespace zps::server {

struct OnlineReshardOptions {
  /// Default: "" = no online resharding (a shard whose store has another shard count fails, as
  /// before). host:port of the reshard endpoint of every ordinal, comma-separated, the i-th is
  /// ordinal i's; at least max(old, new shard count) of them.
  std::string peers;
  /// Default: 7072. The port of this process's reshard endpoint.
  int port = 7072;
  /// Default: 600. Seconds to wait for a peer (a donor that never comes) and for the others'
  /// reports, before the reshard fails (the old stores untouched).
  int timeout_s = 600;
  /// Default: false. Serve this store of a leaving ordinal (>= the new shard count) until the
  /// new shard 0 says the job switched, then exit.
  bool donor = false;

  void Register(Flags& flags);
  /// The peers, parsed. Errors: InvalidArgument (an endpoint that is not host:port).
  Result<std::vector<std::string>> PeerList() const;
};

/// Who this process is.
struct ReshardSelf {
  std::string data_dir;      // the shard's --data-dir (`checkpoints`, `coordinator` inside)
  uint32_t ordinal = 0;      // in the new job (a donor: its old ordinal)
  uint32_t shards = 1;       // the new job's shard count
  std::string bind_address;  // the endpoint listens here
  std::string token;         // the job's shared secret
};

class ReshardEndpoint;

/// A kept endpoint: shard 0 keeps answering ReshardReport (the job switched) while it runs, for
/// shards and donors that restart or come late. Destroying it stops it.
class ReshardHandle {
 public:
  explicit ReshardHandle(std::unique_ptr<ReshardEndpoint> endpoint);
  ~ReshardHandle();
  ReshardHandle(const ReshardHandle&) = delete;
  ReshardHandle& operator=(const ReshardHandle&) = delete;

 private:
  std::unique_ptr<ReshardEndpoint> endpoint_;
};

/// Brings `<data_dir>/checkpoints` to the job on self.shards shards when it holds the job on
/// another count (or is empty while the job's shard 0 holds another count), with the peers;
/// does nothing (and returns null) otherwise, or when options.peers is empty. Also finishes a
/// reshard that a crash interrupted. Returns the endpoint to keep while the shard runs (shard
/// 0), or null.
/// Errors (the old stores are unchanged unless the job had switched):
///   InvalidArgument   stores of two jobs, a store of another step, a shard started with
///                     another new shard count than shard 0's, too few peers;
///   FailedPrecondition an old store without a checkpoint;
///   DeadlineExceeded  a peer (an old store's holder or donor) or a new shard's report did not
///                     come within timeout_s;
///   DataLoss          a corrupt value; ResourceExhausted a full disk; IoError.
/// `progress` follows the reshard (reshard_progress.h): its phase ends kDone, or kFailed on an
/// error, and stays kNone when there was nothing to move.
Result<std::unique_ptr<ReshardHandle>> ReshardAtStart(
    const OnlineReshardOptions& options, const ReshardSelf& self,
    const ReshardProgress& progress = ReshardProgress());

/// Serves `<data_dir>/checkpoints` read-only until the new shard 0 reports the job switched.
/// Errors: as ReshardAtStart; NotFound (no store in data_dir). `progress`: its phase is
/// kAwaitingSwitch while it serves, then kDone or kFailed; it counts the bytes served.
Status ServeAsDonor(const OnlineReshardOptions& options, const ReshardSelf& self,
                    const ReshardProgress& progress = ReshardProgress());

}  // namespace zps::server
