// zps/worker/collectives.h — collective operations among the ranks of a job (reduce-scatter,
// all-gather, all-reduce), the interface the worker library's `pre-reduced` pushes and
// `bandwidth-centric` fetches are built on. The Gloo (CPU, tcp) implementation is
// zps/worker/gloo_collectives.h (target zps::worker_gloo); a GPU (NCCL) one implements the same.
//
// Slices. For an array of n elements among `world` ranks, rank r owns the contiguous element range
// RankSlice(n, world, r) = [min(n, r*s), min(n, (r+1)*s)) with s = ceil(n / world): the first
// ranks own s elements, the last ones fewer (possibly none). A buffer "padded" for the
// collectives holds PaddedCount(n, world) = world * s elements (the tail beyond n zero). Applied
// to one parameter (n = its numel) the slice of rank r is also a contiguous range of the flat
// Layout ([param_offset + begin, param_offset + begin + length)), which is what a shard in
// pre-reduced mode expects: disjoint ranges, one contributor each, covering the parameter.
//
// Every operation is collective: every rank calls the same operations in the same order with the
// same sizes. Results are deterministic: the same inputs give the same bits run to run (the
// summation order depends only on the world size and the sizes).
//
// Thread-safety: a Collectives object is driven by one thread at a time (it is not safe to call
// two operations on one object concurrently). Different objects are independent. Errors are
// values: a failed operation (a peer lost, a timeout) leaves the communicator unusable; build a
// new one (new rendezvous prefix).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "zps/common/status.h"

namespace zps::worker {

/// A contiguous element range [begin, begin + length).
struct SliceRange {
  uint64_t begin = 0;
  uint64_t length = 0;
};

/// Elements each rank's slice holds at most: ceil(n / world) (world >= 1).
constexpr uint64_t SliceElems(uint64_t n, uint32_t world) { return (n + world - 1) / world; }
/// world * SliceElems(n, world): the length of a padded buffer.
constexpr uint64_t PaddedCount(uint64_t n, uint32_t world) { return SliceElems(n, world) * world; }
/// The slice rank `rank` owns of n elements (see the header comment).
constexpr SliceRange RankSlice(uint64_t n, uint32_t world, uint32_t rank) {
  const uint64_t s = SliceElems(n, world);
  const uint64_t b = s * rank < n ? s * rank : n;
  const uint64_t e = b + s < n ? b + s : n;
  return {b, e - b};
}

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual uint32_t rank() const = 0;
  virtual uint32_t world_size() const = 0;

  /// Sums `inout` (n elements, the same n on every rank) over the ranks; afterwards this rank's
  /// slice RankSlice(n, world, rank) of `inout` holds the sum and the rest of `inout` is
  /// unspecified (overwritten). n need not be a multiple of the world size.
  /// Errors: InvalidArgument (n over 2^31 - 1 elements), Unavailable (a peer lost),
  /// DeadlineExceeded (the operation timed out), Internal.
  virtual Status ReduceScatter(std::span<float> inout) = 0;

  /// Gathers equal blocks: `inout` holds world * block_bytes bytes and block r (bytes
  /// [r * block_bytes, (r + 1) * block_bytes)) is rank r's input; afterwards every block holds
  /// its rank's bytes on every rank. Errors: InvalidArgument (inout.size() != world *
  /// block_bytes), Unavailable, DeadlineExceeded, Internal.
  virtual Status AllGather(std::span<std::byte> inout, size_t block_bytes) = 0;

  /// Sums `inout` over the ranks; afterwards every rank holds the whole sum. Errors: as
  /// ReduceScatter.
  virtual Status AllReduce(std::span<float> inout) = 0;
};

/// The one-rank Collectives (world size 1): every operation leaves the buffer as it is.
class LocalCollectives final : public Collectives {
 public:
  uint32_t rank() const override { return 0; }
  uint32_t world_size() const override { return 1; }
  Status ReduceScatter(std::span<float>) override { return Status::Ok(); }
  Status AllGather(std::span<std::byte> inout, size_t block_bytes) override {
    if (inout.size() != block_bytes) return InvalidArgument("all-gather: buffer is not one block");
    return Status::Ok();
  }
  Status AllReduce(std::span<float>) override { return Status::Ok(); }
};

}  // namespace zps::worker
