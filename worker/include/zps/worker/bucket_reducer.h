// zps/worker/bucket_reducer.h — `pre-reduced` gradients that do not depend on what each rank
// executed: the trainable parameters are cut into buckets in layout order (consecutive ids, up
// to bucket_bytes of fp32 each; a larger parameter is a bucket of its own), and every rank
// reduce-scatters the buckets in one order all ranks know, the reverse of the layout's (the
// order backward usually produces gradients in), whatever order its gradients arrive in.
//
//   auto r = BucketReducer::Create(layout, frozen, &comm, push, {});
//   r->Add(param, step, micro, grad);   // any order; copied; a complete bucket is queued
//   r->Finish();                        // zeros for what got no gradient; queues the rest
//   r->Drain();                         // every bucket reduced and handed to `push`
//
// A bucket is queued for the reduce thread ("zps-reduce") once it is complete and every bucket
// before it in the order is queued, so reduction overlaps with backward wherever the ranks
// agree. A bucket whose parameters got no gradient on this rank (an expert this rank did not
// route to, a skipped branch) takes part with zeros at Finish, which the caller reaches at the
// end of its backward at the latest. The reduce thread owns the communicator: a rank that waits
// in a reduce-scatter for a rank still in its backward never blocks its own training thread.
// After the reduce-scatter, this rank's slice RankSlice(bucket elements, world, rank) of the
// bucket (the bucket's parameters back to back) goes to `push` one parameter piece at a time:
// disjoint ranges, one contributor each, covering every parameter.
//
// Memory: a bucket's fp32 buffer lives from its first gradient until it is reduced. A rank whose
// first bucket in the order completes last holds every gradient of its step until Finish.
//
// Thread-safety: every method is thread-safe (Add and Finish are serialised; one thread at a time
// is the intended use: the training thread, or autograd's during backward); the push callback
// runs on the reduce thread. Errors are sticky: the first failed reduce-scatter or push
// is returned by every later call (the communicator is then unusable).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/worker/collectives.h"

namespace zps::worker {

struct BucketReducerOptions {
  /// fp32 bytes per bucket at most (a larger parameter is a bucket of its own).
  /// Default: 16 MiB.
  uint64_t bucket_bytes = 16ull << 20;
  /// Test hook: this rank skips the reduce-scatter of bucket `skip_bucket` (its position in the
  /// reduce order), to feed the ranks mismatched collectives. Default: -1 = none.
  int64_t skip_bucket = -1;
  /// Test hook: skip_bucket only in this step (the first micro-batch of it). Default: -1 = in
  /// every step.
  int64_t skip_step = -1;
};

struct BucketReducerStats {
  uint64_t buckets_reduced = 0;
  uint64_t buckets_early = 0;  // queued during the step, before Finish
  uint64_t zero_filled = 0;    // parameters that took part with zeros
};

class BucketReducer {
 public:
  /// Sends elements [begin, begin + grad.size()) of `param`'s reduced gradient for (step,
  /// micro): Client::PushGradRange.
  using Push = std::function<Status(uint32_t param, int64_t step, uint64_t begin,
                                    std::span<const float> grad, uint32_t micro)>;

  /// `layout` and `comm` (not owned) must outlive the reducer; `frozen` is empty or one entry
  /// per parameter (1 = never pushed). Starts the reduce thread. Errors: InvalidArgument
  /// (frozen of the wrong size, bucket_bytes 0).
  static Result<std::unique_ptr<BucketReducer>> Create(const Layout& layout,
                                                       std::span<const uint8_t> frozen,
                                                       Collectives* comm, Push push,
                                                       const BucketReducerOptions& options);
  /// Stops the reduce thread after the bucket it is reducing (queued ones are dropped).
  ~BucketReducer();
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  /// Adds `grad` (numel elements, copied) as `param`'s gradient of (step, micro). A new (step,
  /// micro) first finishes the previous one (Finish). Errors: OutOfRange (id), InvalidArgument
  /// (length, a frozen parameter), AlreadyExists (a second gradient of the parameter in one
  /// (step, micro)); the reduce thread's first error.
  Status Add(uint32_t param, int64_t step, uint32_t micro, std::span<const float> grad);
  /// Ends this rank's gradients of the (step, micro) in progress: every trainable parameter
  /// without one takes part with zeros, and every bucket not queued yet is queued. Does not
  /// wait; nothing to do when no (step, micro) is in progress. Errors: the reduce thread's
  /// first error.
  Status Finish();
  /// Waits until every queued bucket is reduced and pushed. Errors: the first error of the
  /// reduce thread (a mismatched or failed collective, a failed push).
  Status Drain();

  uint32_t num_buckets() const;
  BucketReducerStats stats() const;

  struct Impl;

 private:
  explicit BucketReducer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::worker
