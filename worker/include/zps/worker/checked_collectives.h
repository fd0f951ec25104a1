// zps/worker/checked_collectives.h — collectives that cannot be mismatched silently: before
// each operation the ranks exchange what it is (a fixed-size descriptor: sequence number, kind,
// bucket or plan position, size), and the operation runs only where every rank issues the same
// one. Ranks that do different things (a mixture of experts routing differently per rank, a
// skipped bucket) then get an error that names the operation on every rank, instead of a
// transport that reads a message of the wrong size (Gloo's tcp pair enforces the size on its
// event-loop thread, where the exception reaches std::terminate).
//
//   CheckedCollectives c(&gloo, [](const CollectiveOp& op) { return "bucket " + ...; });
//   ZPS_RETURN_IF_ERROR(c.ReduceScatter(/*id=*/bucket, grads));
//
// The exchange is always world x 32 bytes, so it matches whatever the ranks issue; a rank that
// issues fewer operations than the others leaves them waiting until the inner timeout
// (DeadlineExceeded). After any error the object is broken: every later call returns the same
// error at once (the communicator is unusable; build a new one).
//
// A mismatch (IsCollectiveMismatch) is what a training program recovers from as from a dead
// rank: every rank re-joins the job, builds a new communicator and redoes the step from the
// state the servers rolled back to; a mismatch that comes back in the redone step is in the
// program itself (ranks that diverge deterministically) and ends the job with the error.
//
// Thread-safety: as Collectives: one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "zps/common/status.h"
#include "zps/worker/collectives.h"

namespace zps::worker {

/// What a collective is for, as the ranks exchange it before running it.
struct CollectiveOp {
  enum class Kind : uint32_t { kReduceScatter = 1, kAllGather = 2 };
  Kind kind = Kind::kReduceScatter;
  uint32_t id = 0;     // the caller's name for it: a bucket index, a plan position
  uint64_t count = 0;  // elements (reduce-scatter) or block bytes (all-gather)
};

/// Whether `s` (with any context added) is a mismatch the descriptor exchange found: the ranks
/// issued different collectives (FailedPrecondition). A timeout or a lost peer is not one.
bool IsCollectiveMismatch(const Status& s);

class CheckedCollectives {
 public:
  /// Names an operation for error messages ("bucket 3 (params 4-6: moe.experts.1.weight, ...)").
  using Namer = std::function<std::string(const CollectiveOp&)>;

  /// `inner` (not owned) must outlive this object.
  CheckedCollectives(Collectives* inner, Namer namer);

  uint32_t rank() const { return inner_->rank(); }
  uint32_t world_size() const { return inner_->world_size(); }

  /// Collectives::ReduceScatter after the ranks agreed on (kReduceScatter, id, inout.size()).
  /// Errors: FailedPrecondition naming this rank's operation and the first rank whose
  /// operation differs (kind, id, size); the inner errors (Unavailable, DeadlineExceeded,
  /// Internal) with the operation's name; the first error again once broken.
  Status ReduceScatter(uint32_t id, std::span<float> inout);
  /// Collectives::AllGather after the ranks agreed on (kAllGather, id, block_bytes).
  /// Errors: as ReduceScatter, and InvalidArgument (inout.size() != world x block_bytes).
  Status AllGather(uint32_t id, std::span<std::byte> inout, size_t block_bytes);

  /// Operations run so far (each one's sequence number is its index).
  uint64_t ops() const { return seq_; }

 private:
  // Agrees on `op` with the other ranks, then runs `call` (the inner collective); counts the
  // operation either way, and on an error logs it and keeps it (broken_).
  Status Run(const CollectiveOp& op, const std::function<Status()>& call);
  Status Agree(const CollectiveOp& op);
  Status Describe(const CollectiveOp& op, Status s) const;
  std::string Name(const CollectiveOp& op) const;

  Collectives* inner_;
  Namer namer_;
  uint64_t seq_ = 0;
  Status broken_;  // the first error; ok while usable
};

}  // namespace zps::worker
