// zps/server/shard_server.h — a shard process: the control plane (RPC), the data plane (UCX),
// the step driver, and, on the coordinator shard, the Coordinator. A thin adapter over
// ShardState and Coordinator, which hold the logic.
//
// Startup: bind the control port; start UCX; (coordinator shard) serve coordinator RPCs; connect
// to the coordinator, register, and wait for the job; build the ShardState; then run steps:
// wait for gradients -> reduce -> report (long-poll for the decision) -> apply -> publish.
//
// Thread-safety: Start/Stop/Wait from the owning thread (main); Stop is also safe from a signal
// watcher thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zps/common/config.h"
#include "zps/common/status.h"

namespace zps::server {

struct ShardServerOptions {
  int ordinal = 0;                           // Default: 0 (the coordinator shard).
  int shards = 1;                            // Default: 1. Shards in the job.
  std::string coordinator;                   // Default: "". host:port of the coordinator (shard 0's
                                             // control plane); required on shards other than 0.
  std::string bind_address = "0.0.0.0";      // Default: all interfaces.
  std::string advertise_host = "127.0.0.1";  // Default: loopback. How peers reach this shard.
  int port = 7070;                 // Default: 7070. Control-plane TCP port (0 = ephemeral).
  std::string token;               // Default: "" (use token-file). Shared secret.
  std::string token_file;          // Default: "". File holding the shared secret.
  std::string ucx_tls;             // Default: "" = UCX_TLS or UCX's choice; e.g. tcp, shm.
  int ucx_spin_us = 200;           // Default: 200 µs. UCX progress-thread polling before it
                                   // sleeps (docs/data-plane.md: fetch latency vs CPU).
  int optimizer_threads = 0;       // Default: 0 = one per CPU.
  bool pin_threads = false;        // Default: false.
  int64_t step_timeout_s = 3600;   // Default: 1 h. Longest wait for a step's gradients.
  std::string log_level = "info";  // Default: info.
  int metrics_port = 9464;         // Default: 9464. /metrics, /healthz, /readyz (0 = off).
  std::string data_dir;            // Default: "" (no durable state yet).
  uint64_t memory_budget = 0;      // Default: 0 = unlimited (RAM tier only). > 0: fp32
                                   // master + optimizer state beyond it spill to NVMe.
  uint64_t serving_budget = 0;     // Default: 0 = unlimited (every 16-bit serving copy in
                                   // RAM). > 0: serving copies beyond it (and 4 chunk-sized
                                   // fetch staging buffers) spill to NVMe.
  std::string spill_dir;           // Default: "" = <data-dir>/spill. Where spill files go.
  /// stored: the update pass writes each chunk's 16-bit serving copy and the shard keeps it, so a
  /// fetch is a copy (or a one-sided RMA get) of bytes already there. on-fetch: no copy is kept
  /// (2 bytes a parameter fewer, in RAM or in the spill files); each fetch converts the master
  /// (read back from NVMe if it spilled), on the shard's CPU, and goes by request and reply.
  /// Needs sync updates, and no serving_budget (docs/state-bytes.md).
  std::string serving_copies = "stored";  // Default: stored.
  int64_t checkpoint_every = 0;           // Default: 0 = never.
  /// background: the checkpoint step is snapshotted (copy-on-write per chunk) and written by a
  /// "zps-ckpt-write" thread while later steps run; a shard with a --memory-budget writes
  /// synchronously. sync: written between steps, training waits (the earlier behaviour).
  std::string checkpoint_mode = "background";  // Default: background.
  /// > 0: a background checkpoint of the --checkpoint-every period is written over about this
  /// fraction of the period (its steps x the recent step time), so that less of the write runs
  /// beside each step, and the recovery point advances that much later. A write someone waits
  /// for (the next checkpoint, a restore, the shutdown) goes on unpaced; on-demand checkpoints
  /// between the periodic ones are not paced.
  double checkpoint_pace = 0.0;       // Default: 0 = as fast as it goes. In [0, 1].
  bool checkpoint_direct_io = false;  // Default: false. O_DIRECT checkpoint writes (flush) and
                                      // reads (needs a filesystem that supports it; faster on
                                      // NVMe, docs/benchmarks.md "Checkpoints").

  /// Registers every field with `flags` (name = the option's flag).
  void Register(Flags& flags);
  /// Resolves token-file into token and checks ranges. Errors: InvalidArgument, NotFound.
  Status Finalize();
};

class ShardServer {
 public:
  /// Binds the control port and sets up UCX. Errors: IoError (port in use), from UCX.
  static Result<std::unique_ptr<ShardServer>> Create(const ShardServerOptions& options);
  ~ShardServer();

  /// Starts serving and the background job/step threads.
  Status Start();
  /// Blocks until Stop() or a fatal error; returns that error (OK after a clean Stop).
  Status Wait();
  /// Requests shutdown: waiters fail with Cancelled, threads join. Idempotent.
  void Stop();
  /// The bound control port.
  uint16_t port() const;
  /// The bound metrics port (/metrics, /healthz, /readyz); 0 when metrics_port is 0 (off).
  /// Valid after Start.
  uint16_t metrics_port() const;

  struct Impl;

 private:
  explicit ShardServer(std::unique_ptr<Impl> impl);
  void StopOnce();
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::server
