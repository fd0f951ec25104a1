// zps/worker/nccl_collectives.h — Collectives over NCCL (GPU), rendezvous through the
// coordinator's key-value store: rank 0 puts the NCCL unique id under `<prefix>/id`, every rank
// reads it and announces itself (`<prefix>/arrived/<rank>`), then all create the communicator.
// A rank needs only the coordinator endpoint and the token, its rank and the world size.
//
//   auto c = zps::worker::NcclCollectives::Create({.endpoint = ep, .token = t, .rank = r,
//                                                  .world_size = n, .prefix = "job/nccl/0"});
//   (*c)->set_stream(torch_current_stream);
//   ZPS_RETURN_IF_ERROR((*c)->ReduceScatter({grad_dev, numel}));   // DEVICE memory
//
// The spans of every operation are DEVICE memory on `device` (pointers into it; the span
// itself is never read on the host), or, with `host_buffers`, host memory: each operation then
// copies its input into device scratch, runs there, and copies the result back (reduce-scatter:
// this rank's slice only), on the communicator's stream alone (set_stream does not apply), so
// that a host-side reducer (BucketReducer) can drive NCCL as it drives Gloo. Counts must be
// equal on every rank: reduce-scatter copies
// the input into a scratch buffer padded to a multiple of the world size (zero tail) and runs
// ncclReduceScatter in place; all-gather and all-reduce run in place. Operations run on the
// communicator's own stream, ordered after the work queued on the caller's stream (an event)
// and before the work queued there afterwards (the caller's stream waits for the op's event) —
// no record_stream. Each operation returns once it completed: the host polls the op's event
// and ncclCommGetAsyncError, bounded by `timeout`; on an error or the timeout it calls
// ncclCommAbort (ncclCommDestroy can block forever) and the communicator is unusable: every
// later call fails with the same Status. Build a new one (new prefix) after a rollback or a
// re-join: one communicator per job generation.
//
// Loading: NCCL and the CUDA runtime are opened with dlopen (ZPS_NCCL, libnccl.so.2; see
// cuda_backend.h); Create returns FailedPrecondition where either, a driver or a device is
// missing. ncclResult_t becomes a Status in one function (NcclStatus, src/nccl_api.cc).
//
// Thread-safety: as Collectives (one thread at a time per object). Owns its communicator,
// stream, event, scratch memory and kv connection (RAII).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "zps/common/status.h"
#include "zps/worker/collectives.h"

namespace zps::worker {

struct NcclOptions {
  std::string endpoint;     // Default: none. The coordinator host:port (ZPS_ENDPOINT).
  std::string token;        // Default: none. The shared auth secret.
  uint32_t rank = 0;        // Default: 0.
  uint32_t world_size = 1;  // Default: 1.
  /// Key prefix of this communicator's rendezvous (same on every rank; new per communicator).
  /// Default: "nccl".
  std::string prefix = "nccl";
  int device = 0;  // Default: 0. The CUDA device this rank's buffers live on.
  std::chrono::milliseconds timeout{300000};  // Default: 5 min for the rendezvous and each op.
  /// The operations' spans are host memory, staged through device scratch. Default: false.
  bool host_buffers = false;
};

/// Whether NCCL can be loaded here: Ok or FailedPrecondition naming why not.
Status NcclAvailable();

class NcclCollectives final : public Collectives {
 public:
  /// Rendezvous and ncclCommInitRank (blocks until every rank arrived, or timeout).
  /// Errors: InvalidArgument (rank >= world_size, empty prefix), FailedPrecondition (no NCCL,
  /// runtime or device), Unavailable (coordinator lost, the kv generation ended),
  /// DeadlineExceeded, Internal.
  static Result<std::unique_ptr<NcclCollectives>> Create(const NcclOptions& options);
  ~NcclCollectives() override;

  /// The caller's stream (a cudaStream_t as an integer; 0 = the legacy default stream) that
  /// operations are ordered against. Default: 0.
  void set_stream(uintptr_t stream);

  uint32_t rank() const override;
  uint32_t world_size() const override;
  Status ReduceScatter(std::span<float> inout) override;
  Status AllGather(std::span<std::byte> inout, size_t block_bytes) override;
  Status AllReduce(std::span<float> inout) override;

  struct Impl;

 private:
  explicit NcclCollectives(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::worker
