// zps/worker/client.h — the worker library: connects a training process (one rank) to a zps job,
// fetches parameters (the job's serving dtype: bf16, fp16 or fp32) from the shards and pushes
// gradients to them.
//
//   auto c = zps::worker::Client::Connect(opts, job_spec_bytes, job_hash);   // rank 0 registers
//   auto buf = (*c)->Fetch(param_id, /*min_version=*/step);                  // fans out to shards
//   (*c)->PushGrad(param_id, step, grad_fp32);                               // async, bucketed
//   (*c)->FlushPushes();                                                     // all acknowledged
//   auto commit = (*c)->AwaitCommit(step);                                   // the step's decision
//
// The control plane (RPC over TCP) authenticates with the shared token and exchanges UCX worker
// addresses; the data plane is UCX active messages carrying each shard's session token.
// No global state: any number of Clients may live in one process.
//
// Thread-safety: every method is thread-safe. Fetch results are immutable buffers shared with the
// caller. Every wait is bounded by WorkerOptions::op_timeout: a dead shard or coordinator gives
// Unavailable naming it ("shard N at host:port", "coordinator at host:port") as soon as the
// loss is seen (UCX error, or the shard's control connection closing on shared memory), and
// DeadlineExceeded at the latest, never a hang (tests/integration/worker/dead_shard_test.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/messages.h"
#include "zps/common/process_metrics.h"
#include "zps/common/status.h"
#include "zps/worker/device.h"
#include "zps/worker/fetch_op.h"
#include "zps/worker/param_source.h"

namespace zps::worker {

struct WorkerOptions {
  std::string endpoint;  // Default: none. host:port of the coordinator (ZPS_ENDPOINT).
  std::string token;     // Default: none. The shared auth secret.
  uint32_t rank = 0;     // Default: 0.
  std::string ucx_tls;   // Default: "" = UCX_TLS or UCX's choice.
  /// How a fetch's data travels. "auto": RMA get from the shard's serving region when the
  /// transports are shared memory only, else an active message with rendezvous; "am"; "rma".
  /// docs/data-plane.md has the measurements. Default: "auto".
  std::string fetch_mode = "auto";
  /// With RMA fetches: read a chunk's range straight from the shard's serving region, with no
  /// request, when this Client knows the address (from an earlier reply) and that a version >=
  /// min_version is there (from that reply or the shard's publish notice), and has pushed no
  /// gradient for the chunk since (docs/protocol.md, "One-sided fetch"). Otherwise, and on
  /// tcp, every fetch asks the shard. Default: true.
  bool direct_fetch = true;
  /// How a push's data travels. "auto": on shared memory only, the shard reads it with RMA get
  /// from a staging region this Client allocates through UCX (kAmPushRma); else an active
  /// message with rendezvous; "am"; "rma". PushGradShared always goes by AM (the caller's
  /// buffer is not in a UCX region). Default: "auto".
  std::string push_mode = "auto";
  /// A job with block-quantized gradients (grad_dtype int8 / int4 blocks): carry each pushed
  /// range's quantization residual into its next push (error feedback). false quantizes every
  /// push on its own: a testing switch that shows what the feedback is for. Default: true.
  bool grad_error_feedback = true;
  /// Size of that staging region (allocated at Connect when pushes go by RMA). A push that
  /// finds no room in it goes by AM. Default: 256 MiB.
  size_t rma_push_bytes = size_t{256} << 20;
  /// UCX progress-thread polling after activity before it sleeps (latency vs CPU; the poll
  /// yields the core to other runnable threads). Default: 200 µs.
  std::chrono::microseconds ucx_spin{200};
  std::chrono::milliseconds connect_timeout{60000};  // Default: 60 s to reach and join the job.
  std::chrono::milliseconds op_timeout{300000};      // Default: 5 min for any single wait.
  Device* device = nullptr;  // Default: null = host memory, 64-byte aligned, reused from
                             // a pool in the Client (released buffers up to 256 MiB).
  /// Default: null = no metrics. The handles are copied at Connect; their registry must outlive
  /// the Client. Fed: fetch/push bytes, request durations and in-flight by op (fetch and push per
  /// shard piece, control = AwaitCommit and CallShard), protocol errors, UCX transports.
  const metrics::ProcessMetrics* metrics = nullptr;
};

class Client final : public ParamSource {
 public:
  /// Connects to the coordinator (retrying until connect_timeout), joins the job (rank 0
  /// registers `job_spec`; other ranks are checked against `job_hash`), and connects to every
  /// shard. Errors: Unavailable (unreachable), Unauthenticated (token), FailedPrecondition (spec
  /// mismatch), InvalidArgument (bad options or replies).
  static Result<std::unique_ptr<Client>> Connect(const WorkerOptions& options,
                                                 std::span<const std::byte> job_spec,
                                                 uint64_t job_hash);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Layout& layout() const override;
  const msg::JoinReply& job() const;
  /// The dtype fetched buffers hold: job().serving_dtype, or fp32 for quantized weights
  /// (int8-block), which the client dequantizes as each piece arrives.
  DType serving_dtype() const override {
    return IsBlockQuantized(job().serving_dtype) ? DType::kF32 : job().serving_dtype;
  }
  /// The step to train next (0 for a new job).
  int64_t resume_step() const { return job().resume_step; }
  uint32_t rank() const;
  /// Micro-batches per step (the job's accumulation_steps, from the join; 1 = no accumulation).
  /// With k > 1 every rank pushes every trained parameter k times per step, once per micro-batch
  /// m in [0, k) (the overloads below taking `micro`); the shards sum the world x k
  /// contributions in the order rank * k + m. The pushes without `micro` are micro 0.
  uint32_t accumulation_steps() const;
  /// The bound on every single wait (WorkerOptions::op_timeout).
  std::chrono::milliseconds op_timeout() const override;

  /// Starts fetching parameter `param` at version >= min_version from the shards that hold it.
  /// Errors are reported by the returned op's Wait (OutOfRange for a bad id).
  FetchOp FetchAsync(uint32_t param, int64_t min_version) override;
  /// Starts fetching elements [begin, begin + length) of parameter `param` (a bandwidth-centric
  /// rank's slice): the buffer holds `length` elements, `begin` is recorded in it. length 0 gives
  /// a completed op with an empty buffer. Errors (by Wait): OutOfRange for a bad id or range.
  FetchOp FetchAsync(uint32_t param, uint64_t begin, uint64_t length, int64_t min_version) override;
  /// The job's serving dtype as the shards send it (job().serving_dtype).
  DType wire_dtype() const override { return job().serving_dtype; }
  /// As the ranged FetchAsync, for quantized weights: the buffer holds the covering block records
  /// as fetched (half the bytes of bf16), laid out as QuantizedPieces says, for a reader that
  /// dequantizes them itself (on a GPU, or after an all-gather). Errors (by Wait): as
  /// FetchAsync; FailedPrecondition for a job whose serving copy is not block-quantized.
  FetchOp FetchQuantizedAsync(uint32_t param, uint64_t begin, uint64_t length,
                              int64_t min_version) override;
  /// FetchAsync + Wait(op_timeout).
  Result<std::shared_ptr<const ParamBuffer>> Fetch(uint32_t param, int64_t min_version);

  /// Sends the gradient of `param` for `step` (fp32, numel elements), converted to the job's
  /// grad dtype: with block-quantized gradients, quantized per push piece with error feedback
  /// (every push of the same range, micro-batches included, carries the previous one's residual;
  /// the residuals restart from zero after a step whose commit says checkpoint, and in a new
  /// Client). Copies before returning; completion is observed through FlushPushes.
  /// Errors: OutOfRange (id), InvalidArgument (length); an earlier push's failure.
  Status PushGrad(uint32_t param, int64_t step, std::span<const float> grad);
  /// As above for micro-batch `micro` (< accumulation_steps(), else InvalidArgument) of `step`.
  Status PushGrad(uint32_t param, int64_t step, std::span<const float> grad, uint32_t micro);
  /// As PushGrad, for a gradient already in the job's grad dtype (e.g. fp16 with an injected Inf).
  /// Not for block-quantized gradients (InvalidArgument; as PushGradShared).
  Status PushGradRaw(uint32_t param, int64_t step, std::span<const std::byte> grad);
  /// As above for micro-batch `micro` (< accumulation_steps(), else InvalidArgument).
  Status PushGradRaw(uint32_t param, int64_t step, std::span<const std::byte> grad, uint32_t micro);
  /// Sends elements [begin, begin + grad.size()) of the gradient of `param` (fp32, converted to
  /// the job's grad dtype; copied before returning): a pre-reduced rank's slice, already summed
  /// over the ranks. An empty `grad` sends nothing. Errors: OutOfRange (id or range),
  /// InvalidArgument (micro); an earlier push's failure.
  Status PushGradRange(uint32_t param, int64_t step, uint64_t begin, std::span<const float> grad,
                       uint32_t micro = 0);
  /// As PushGradRaw without the copy: `grad` (numel x the job's grad dtype bytes) is sent from
  /// where it is (by RMA when it lies in a buffer from AllocatePushBuffer and pushes go by RMA).
  /// The Client holds `owner` until every piece is acknowledged or failed; the caller must not
  /// change the bytes before FlushPushes (or AwaitPushesBelow) says they are done. Errors: as
  /// PushGradRaw.
  Status PushGradShared(uint32_t param, int64_t step, std::span<const std::byte> grad,
                        std::shared_ptr<const void> owner);
  /// As above for micro-batch `micro` (< accumulation_steps(), else InvalidArgument).
  Status PushGradShared(uint32_t param, int64_t step, std::span<const std::byte> grad,
                        std::shared_ptr<const void> owner, uint32_t micro);
  /// A host buffer of `bytes` bytes (64-byte aligned, not initialised) for gradients to be sent
  /// with PushGradShared: when pushes go by RMA (WorkerOptions::push_mode) it lies in the
  /// Client's UCX staging region, and a PushGradShared from it is read by the shard with RMA
  /// get, with no copy on either side. Otherwise (tcp, or the region full) it is ordinary
  /// memory and the push goes by AM. Any thread; the buffer may outlive the Client.
  std::shared_ptr<std::byte[]> AllocatePushBuffer(size_t bytes);
  /// Rank 0 of a new job: the initial fp32 values of `param`.
  Status PushInitial(uint32_t param, std::span<const float> values);
  /// Waits until every push so far is acknowledged; returns (and clears) the first error.
  Status FlushPushes();
  /// Waits until fewer than `max_pending` push pieces are unacknowledged (a sliding window
  /// over pushes, which bounds the memory their copies hold). Returns the first push error so
  /// far without clearing it. Errors: DeadlineExceeded after op_timeout; a push's failure.
  Status AwaitPushesBelow(size_t max_pending);

  /// The coordinator's decision for `step` (long-poll, bounded by op_timeout). A decision that
  /// says checkpoint zeroes the quantized-gradient residuals (the rule of docs/checkpoints.md:
  /// call it for every step, before pushing the next).
  Result<msg::CommitInfo> AwaitCommit(int64_t step);
  /// Calls rpc `type` on shard `ordinal` (tools and tests, e.g. msg::kStatus).
  Result<std::vector<std::byte>> CallShard(uint32_t ordinal, uint16_t type,
                                           std::span<const std::byte> payload);

  /// Bytes moved so far (for progress output).
  uint64_t fetched_bytes() const;
  uint64_t pushed_bytes() const;
  /// Fetch pieces read one-sided so far, without a request (WorkerOptions::direct_fetch).
  uint64_t direct_fetches() const;
  /// Publish notices (kAmServingNotice) accepted so far; 0 unless direct fetches are on.
  uint64_t serving_notices() const;

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  FetchOp StartFetch(uint32_t param, uint64_t begin, uint64_t length, int64_t min_version,
                     bool quantized);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::worker
