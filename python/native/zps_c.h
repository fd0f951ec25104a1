/* zps_c.h — the stable C API over the worker library, for bindings (zps.torch loads it with
 * ctypes). It knows nothing of Python or torch: tensors cross as raw host pointers and sizes, so
 * one build serves every CPython and every torch version (docs/pytorch.md, "Why a C API").
 *
 *   zps_client* c;
 *   if (zps_connect(options_json, job_json, &c) != 0) puts(zps_last_error());
 *   zps_begin_step(c, step);
 *   zps_fetch_into(c, ids, n, dst_ptrs, dst_dtypes);   // parameters land in the caller's memory
 *   zps_push_grad(c, param, step, grad, numel, 0);      // async; copied before returning
 *   zps_end_step(c);  zps_flush(c);  zps_await_commit(c, step, &info);
 *   zps_close(c);
 *
 * Errors: every function that can fail returns 0 on success or a zps::Code (1..14, the values of
 * common/include/zps/common/status.h) and leaves the message for zps_last_error() on the calling
 * thread. Output parameters are written only on success.
 *
 * Thread-safety: a zps_client may be used from several threads; the calls that drive the
 * prefetcher (zps_begin_step, zps_end_step, zps_fetch_into, zps_acquire, zps_release) are
 * serialised on it. Pointers from zps_acquire stay valid until the matching zps_release.
 */
#ifndef ZPS_C_H_
#define ZPS_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: the CUDA entry points (zps_cuda_available, ...); 3: zps_chunk_crcs; 4:
 * zps_check_memory_budget; 5: quantized weights handed out as fetched (zps_acquire_quantized,
 * zps_dequantize_blocks, zps_job_info.quant_bits/quant_block, zps_stats.gather_bytes); 6: the
 * "grad_error_feedback" connect option. */
#define ZPS_C_API_VERSION 6

#if defined(__GNUC__)
#define ZPS_C_EXPORT __attribute__((visibility("default")))
#else
#define ZPS_C_EXPORT
#endif

typedef struct zps_client zps_client;

/* Element types, as zps::DType. */
enum { ZPS_DTYPE_F32 = 0, ZPS_DTYPE_F16 = 1, ZPS_DTYPE_BF16 = 2 };

typedef struct zps_job_info {
  int64_t resume_step; /* the step to train next (0 for a new job) */
  double loss_scale;   /* the loss scale to use for resume_step */
  uint32_t world_size;
  uint32_t rank;
  uint32_t num_params;
  uint32_t num_shards;
  int32_t serving_dtype; /* ZPS_DTYPE_* */
  int32_t grad_dtype;
  uint64_t job_hash;
  /* Quantized weights: the shards' block format (code bits, 8; elements per block), 0 and 0
   * otherwise. */
  uint32_t quant_bits;
  uint32_t quant_block;
} zps_job_info;

/* A run of a quantized parameter's elements (zps_acquire_quantized): `elems` elements that start
 * `skip` elements into the first of the block records at bytes [offset, offset + bytes) of the
 * buffer. Each record is a little-endian fp32 scale followed by quant_block int8 codes (the last
 * record of a chunk may be short: 4 + its elements bytes); value = float(code) * scale
 * (common/include/zps/common/block_quant.h). Pieces follow each other in element order. */
typedef struct zps_quant_piece {
  uint64_t elems;
  uint64_t skip;
  uint64_t offset;
  uint64_t bytes;
} zps_quant_piece;

typedef struct zps_commit_info {
  int64_t step;
  int32_t skip;           /* 1: the step was skipped (fp16 overflow) */
  float grad_scale;       /* what multiplied each summed gradient element */
  double global_norm;     /* of the averaged, unscaled gradient */
  double loss_scale;      /* used by this step */
  double next_loss_scale; /* to use for the next step */
  int64_t optimizer_step; /* applied updates after this step */
  int32_t checkpoint;     /* 1: the shards checkpoint the state after this step */
} zps_commit_info;

typedef struct zps_stats {
  uint64_t fetched_bytes;
  uint64_t pushed_bytes;
  uint64_t live_bytes; /* fetched buffers the prefetcher holds (<= max_live_bytes) */
  uint64_t acquires;
  uint64_t hits; /* acquires already fetched or in flight */
  uint64_t prefetches;
  uint64_t trace_rebuilds;
  uint64_t wait_ns;      /* time spent waiting for fetches */
  uint64_t gather_bytes; /* bandwidth-centric: bytes this rank's parameter all-gathers carried
                            (world x each rank's block) */
} zps_stats;

ZPS_C_EXPORT int zps_c_api_version(void);
/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
ZPS_C_EXPORT const char* zps_last_error(void);
/* The name of a code, e.g. "INVALID_ARGUMENT". */
ZPS_C_EXPORT const char* zps_code_name(int code);

/* Builds the job from `job_json` (docs/pytorch.md, "The job description"), connects to the
 * coordinator named in `options_json` ({"endpoint", "token", "rank", "ucx_tls", "op_timeout_ms",
 * "connect_timeout_ms", "prefetch_bytes", "max_live_bytes", "reduction", "fetch_strategy",
 * "gloo_hostname", "cuda_device", "cuda_slot_bytes", "cuda_slots", "collectives",
 * "keep_quantized", "grad_error_feedback"}), joins (rank 0 registers the job) and connects to
 * every shard. Unknown keys are InvalidArgument. "keep_quantized": true (quantized weights only;
 * default false) keeps fetched parameters as the shards' block records: zps_acquire_quantized
 * hands them out, zps_fetch_into dequantizes them on the CPU, and zps_acquire and
 * zps_fetch_to_device refuse (FAILED_PRECONDITION). "grad_error_feedback": false (testing
 * only; default true) quantizes every block-quantized gradient push on its own, without the
 * residual of the last (WorkerOptions::grad_error_feedback). Errors: as
 * zps::worker::Client::Connect. */
ZPS_C_EXPORT int zps_connect(const char* options_json, const char* job_json, zps_client** out);
/* Closes the connections and frees `c` (null is allowed). Buffers from zps_acquire become invalid.
 */
ZPS_C_EXPORT void zps_close(zps_client* c);
/* Asks the coordinator at `endpoint` (host:port) how many shards its job has, with `token`,
 * waiting up to timeout_ms for it to answer (a coordinator still starting is retried). */
ZPS_C_EXPORT int zps_cluster_shards(const char* endpoint, const char* token, int64_t timeout_ms,
                                    uint32_t* out);
/* The job's serialised JobSpec hash for `job_json` without connecting (for checks and tests). */
ZPS_C_EXPORT int zps_job_hash(const char* job_json, uint64_t* out);
/* Whether every shard of the job in `job_json` can run with a --memory-budget of `memory_budget`
 * bytes (0 = none): the check each shard's chunk store makes when it starts, made before any
 * shard does (zps/common/spill_budget.h). Errors: RESOURCE_EXHAUSTED with the shard's own advice
 * ("shard 0: memory_budget ... bytes cannot hold the spill pipeline's ..."); INVALID_ARGUMENT for
 * a bad job. */
ZPS_C_EXPORT int zps_check_memory_budget(const char* job_json, uint64_t memory_budget);

ZPS_C_EXPORT int zps_job_info_get(zps_client* c, zps_job_info* out);
ZPS_C_EXPORT int zps_stats_get(zps_client* c, zps_stats* out);

/* Rank 0 of a new job: the initial fp32 values of `param` (numel elements). */
ZPS_C_EXPORT int zps_push_initial(zps_client* c, uint32_t param, const float* values,
                                  uint64_t numel);

/* Prefetcher: parameters are needed at version >= step from now on. */
ZPS_C_EXPORT int zps_begin_step(zps_client* c, int64_t step);
/* Ends this rank's fetches of the step: adopts its access order as its trace when it changed.
 * With options.fetch_strategy "bandwidth-centric" (and more than one rank) it is a collective,
 * once per step on every rank, before zps_flush: it takes part in the all-gathers of the step's
 * plan this rank did not need, and agrees on the next step's plan (worker/prefetcher.h). */
ZPS_C_EXPORT int zps_end_step(zps_client* c);
/* Fetches (or takes from the prefetcher) each of `ids` and writes it into dst[i], converted from
 * the serving dtype to dst_dtype[i] (ZPS_DTYPE_*): numel elements of host memory the caller owns.
 * Errors: from the fetch (UNAVAILABLE, DEADLINE_EXCEEDED, OUT_OF_RANGE); INVALID_ARGUMENT for a
 * bad dtype. */
ZPS_C_EXPORT int zps_fetch_into(zps_client* c, const uint32_t* ids, size_t n, void* const* dst,
                                const int32_t* dst_dtype);
/* As zps_fetch_into for one parameter, but hands out the fetched buffer itself (serving dtype,
 * numel elements at *data, *bytes bytes) for a copy the caller makes (e.g. to a GPU). Valid until
 * zps_release(c, param). */
ZPS_C_EXPORT int zps_acquire(zps_client* c, uint32_t param, const void** data, uint64_t* bytes);
ZPS_C_EXPORT int zps_release(zps_client* c, uint32_t param);
/* With options.keep_quantized: as zps_acquire, but hands out the quantized buffer as fetched
 * (*bytes bytes of block records at *data; host memory, pinned with the CUDA backend) and its
 * pieces (up to `cap` into `pieces`, their count into *n), for the caller to dequantize, e.g. on
 * the parameter's GPU (zps.torch). Valid until zps_release(c, param). Errors: as zps_acquire;
 * FAILED_PRECONDITION (not keep_quantized, or the job's weights are not quantized);
 * OUT_OF_RANGE (more than cap pieces). */
ZPS_C_EXPORT int zps_acquire_quantized(zps_client* c, uint32_t param, const void** data,
                                       uint64_t* bytes, zps_quant_piece* pieces, size_t cap,
                                       size_t* n);
/* The CPU dequantization zps_fetch_into applies (SIMD, block_quant.h): `elems` elements that
 * start `skip` elements into the first of the block records in blocks[0, bytes) (int8 codes when
 * bits is 8, int4 when 4; `block` elements a block) into dst as dst_dtype (ZPS_DTYPE_*). The
 * reference the device path is checked against. Errors: INVALID_ARGUMENT (format, dtype, or a
 * run that does not lie inside the records held). */
ZPS_C_EXPORT int zps_dequantize_blocks(const void* blocks, uint64_t bytes, uint32_t bits,
                                       uint32_t block, uint64_t skip, uint64_t elems,
                                       int32_t dst_dtype, void* dst);

/* Sends the fp32 gradient of `param` for `step` (numel elements) as micro-batch `micro` of this
 * rank (0 unless the job accumulates). Copies before returning; completion through zps_flush.
 * With options.reduction "pre-reduced" (and more than one rank) the gradient goes into its
 * bucket, and the buckets are reduce-scattered among the ranks in one fixed order on a thread of
 * the library, whatever parameters and order each rank pushes (worker/bucket_reducer.h); only
 * this rank's slice of each bucket is pushed. A bucket is reduced once every trainable parameter
 * in it has a gradient (push zeros for those that got none) or, with zeros for what is missing,
 * at the next micro-batch's first push. */
ZPS_C_EXPORT int zps_push_grad(zps_client* c, uint32_t param, int64_t step, float* grad,
                               uint64_t numel, uint32_t micro);
/* Waits until fewer than `max_pending` push pieces are unacknowledged (bounds the memory the
 * pushes' copies hold); returns the first push error so far without clearing it. */
ZPS_C_EXPORT int zps_await_pushes_below(zps_client* c, uint64_t max_pending);
/* Waits until every push so far is acknowledged; returns (and clears) the first push error.
 * pre-reduced: first waits until every complete bucket is reduced and pushed (errors: a
 * mismatched or failed collective, naming the bucket, ranks and sizes). */
ZPS_C_EXPORT int zps_flush(zps_client* c);
/* The coordinator's decision for `step` (bounded by op_timeout). */
ZPS_C_EXPORT int zps_await_commit(zps_client* c, int64_t step, zps_commit_info* out);
/* The fp32 master of `param` (numel floats into dst) from the shards that hold it, once they
 * reached `min_version` (retried while they have not, up to op_timeout). Errors: OUT_OF_RANGE
 * (id), DEADLINE_EXCEEDED, UNAVAILABLE. */
ZPS_C_EXPORT int zps_read_master(zps_client* c, uint32_t param, int64_t min_version, float* dst);
/* Shard `ordinal`'s status document (docs/protocol.md, Status), as JSON text into buf (at most
 * len bytes with the terminating NUL; OUT_OF_RANGE if it does not fit). */
ZPS_C_EXPORT int zps_shard_status(zps_client* c, uint32_t ordinal, char* buf, size_t len);
/* CRC32C of each chunk's fp32 state (master, and the optimizer state) on shard `ordinal`, once
 * it reached `min_version` (UNAVAILABLE before): up to `cap` (chunk id, crc) pairs into `chunks`
 * and `crcs`, their count into *n (OUT_OF_RANGE if the shard has more than cap chunks). What
 * the tests compare for bit-identical runs, as zps-train --print-crcs. */
ZPS_C_EXPORT int zps_chunk_crcs(zps_client* c, uint32_t ordinal, int64_t min_version,
                                uint32_t* chunks, uint32_t* crcs, size_t cap, size_t* n);
/* Asks the coordinator for a checkpoint at the next step boundary and waits (up to timeout_ms)
 * until it is complete on every shard; *step is its step. */
ZPS_C_EXPORT int zps_checkpoint_now(zps_client* c, int64_t timeout_ms, int64_t* step);

/* ---- CUDA (docs/pytorch.md, "CUDA tensors"). Device pointers and cudaStream_t values cross as
 * integers; libzps_c.so opens the CUDA runtime and NCCL with dlopen only when these are used, so
 * it loads on machines without them. */

/* Whether the CUDA backend can use device `device` here: 0, or FAILED_PRECONDITION ("no CUDA
 * device: ..." — no runtime, driver or device, or a build without the backend), INVALID_ARGUMENT
 * (an ordinal beyond the devices). */
ZPS_C_EXPORT int zps_cuda_available(int device);
/* As zps_fetch_into, into DEVICE memory: dst[i] receives numel elements of the serving dtype
 * (no conversion), through the backend's pinned staging slots and its copy stream, ordered after
 * the work queued on `stream` (a cudaStream_t; 0 = the legacy default stream), which then waits
 * for the copies. Returns once the copies are queued. Needs options.cuda_device (else
 * FAILED_PRECONDITION). Errors: from the fetch; from CUDA. */
ZPS_C_EXPORT int zps_fetch_to_device(zps_client* c, const uint32_t* ids, size_t n, void* const* dst,
                                     uint64_t stream);
/* As zps_push_grad, from DEVICE memory: numel elements of grad_dtype (ZPS_DTYPE_*) read after
 * the work queued on `stream`, copied into a pinned slot on the copy stream, then pushed.
 * Returns once `grad` has been read. With options.reduction "pre-reduced" (more than one rank)
 * `grad` must be fp32; it goes into its bucket as zps_push_grad's do, and the buckets are
 * reduce-scattered in their order with NCCL (options.collectives; through device scratch) or,
 * without NCCL, with Gloo on the host; only this rank's slice is pushed. */
ZPS_C_EXPORT int zps_push_grad_device(zps_client* c, uint32_t param, int64_t step, void* grad,
                                      int32_t grad_dtype, uint64_t numel, uint32_t micro,
                                      uint64_t stream);
/* The client's CUDA side as JSON ({"device", "collectives": "none"|"gloo"|"nccl", "h2d_bytes",
 * "d2h_bytes", "overflow_allocs", "inflight_waits", "free_slots"}) into buf (at most len bytes
 * with the NUL; OUT_OF_RANGE if it does not fit). */
ZPS_C_EXPORT int zps_cuda_info(zps_client* c, char* buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* ZPS_C_H_ */
