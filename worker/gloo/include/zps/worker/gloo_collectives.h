// zps/worker/gloo_collectives.h — Collectives over Gloo (CPU, tcp), rendezvous through the
// coordinator's key-value store (zps/worker/coordinator_kv.h): a rank needs only the coordinator
// endpoint and the token, its rank and the world size.
//
//   auto c = zps::worker::GlooCollectives::Create({.endpoint = ep, .token = t, .rank = r,
//                                                  .world_size = n, .prefix = "job/gloo/0"});
//   ZPS_RETURN_IF_ERROR((*c)->ReduceScatter(grad));   // rank r's slice now holds the sum
//
// Algorithms (Debian's Gloo, 2022): reduce-scatter is ReduceScatterHalvingDoubling (recursive
// halving within binary blocks; deterministic for a given world size and count), all-gather is
// gloo::allgather (ring), all-reduce gloo::allreduce (ring). Counts are int in the legacy
// algorithm: at most 2^31 - 1 elements per call. Gloo's exceptions are caught inside this
// library and turned into a Status in one function (GlooCall in gloo_collectives.cc).
//
// Thread-safety: as Collectives (one thread at a time per object). Owns its Gloo context, tcp
// device and kv connection (RAII).
//
// Process-wide: Create with world_size > 1 sets SIGPIPE to ignored where it is at its default.
// Gloo writes to its peers' sockets with writev, and a write to a peer that died raises SIGPIPE,
// whose default action ends the process silently; ignored, the write fails with EPIPE and the
// collective returns Unavailable. A disposition the program set itself (a handler, or SIG_IGN)
// is left alone; a handler that returns gives the same EPIPE.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "zps/common/status.h"
#include "zps/worker/collectives.h"

namespace zps::worker {

struct GlooOptions {
  std::string endpoint;     // Default: none. The coordinator host:port (ZPS_ENDPOINT).
  std::string token;        // Default: none. The shared auth secret.
  uint32_t rank = 0;        // Default: 0.
  uint32_t world_size = 1;  // Default: 1.
  /// Key prefix of this communicator's rendezvous. Every rank of one communicator passes the
  /// same prefix; a communicator rebuilt within one kv generation needs a new one (keys are
  /// never reused). Default: "gloo".
  std::string prefix = "gloo";
  /// Address (or host name) this rank's Gloo tcp device binds and advertises; it must be
  /// reachable from the other ranks. Default: "" = the machine's host name.
  std::string hostname;
  std::chrono::milliseconds timeout{300000};  // Default: 5 min for the rendezvous and each op.
};

class GlooCollectives final : public Collectives {
 public:
  /// Rendezvous with the other ranks (blocks until all world_size ranks arrived or timeout).
  /// Errors: InvalidArgument (rank >= world_size, empty prefix), Unavailable (coordinator or a
  /// peer unreachable, the kv generation ended), DeadlineExceeded, Unauthenticated, Internal.
  static Result<std::unique_ptr<GlooCollectives>> Create(const GlooOptions& options);
  ~GlooCollectives() override;

  uint32_t rank() const override;
  uint32_t world_size() const override;
  Status ReduceScatter(std::span<float> inout) override;
  Status AllGather(std::span<std::byte> inout, size_t block_bytes) override;
  Status AllReduce(std::span<float> inout) override;

  struct Impl;

 private:
  explicit GlooCollectives(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::worker
