// zps/tools/plan.h — the arithmetic of zps-plan: memory, bytes on every link and the bounds of
// the step time of a zps job, from a model size, a cluster shape and the job's modes.
//
// The model of a step (docs/scaling.md says it in words, with its assumptions):
//   - every worker (one per GPU) fetches the whole model in the fetch dtype `passes` times a step
//     (1 when the model fits in the worker's live window, as forward and backward then share one
//     fetch; 2 otherwise: forward, then backward again), directly from the shards; with the
//     bandwidth-centric strategy each fetches 1/W of it and the workers all-gather the rest. The
//     window holds what the worker made of the fetch: the fetch format itself for fp32/fp16/bf16,
//     but fp32 for an int8/int4 fetch, which the worker dequantizes (Client::serving_dtype);
//   - server-sum: every worker pushes its whole gradient; pre-reduced: the workers
//     reduce-scatter the fp32 gradient (ReduceScatterHostBytes) and each pushes its 1/W slice;
//   - the shards update their 1/S of the state after the commit (sync mode): the optimizer pass,
//     and with state over the RAM budget the spilled part read and written once from NVMe.
// Step time, in two phases: the forward moves the first fetch pass (and its all-gather), the
// backward the pushes, the reduce-scatter and a second fetch pass. On one link the phases follow
// each other (the next step's fetches wait for the update, which waits for the pushes); within a
// phase both directions of a link run at once. The forward is a third of the compute, the
// backward two thirds.
//   - lower bound: the busiest link direction over the whole step, overlapped with the compute,
//     and the NVMe reads with the optimizer: max(network, compute) + max(optimizer, NVMe);
//   - expected: each phase's network overlapped with its compute, the phases one after the
//     other: max(forward network, compute / 3) + max(backward network, 2 compute / 3) +
//     max(optimizer, NVMe); with serial_collectives the backward's compute is 2 compute / 3 +
//     the reduce-scatter's time;
//   - upper bound: the two phases' network, the compute, the optimizer and NVMe added up.
//
// Per-element sizes come from the code where it has them (DTypeSize for fp32/fp16/bf16; the
// shard's state is an fp32 master, two moments and the serving copy, as ChunkLayout keeps it);
// the int8/int4 block-quantized formats carry one fp32 scale per block. Given only a parameter
// count, a quantized fetch or push is taken as that many elements in whole blocks. Given the
// model's tensors (PlanInput::tensors), the bytes of one fetch and one push of the whole model
// are those of its pieces (layout.h: each tensor's runs inside the chunks of the flat space), as
// the workers move them: a push piece is quantized on its own, with a short last block
// (grad_quant.h), and a fetch of a piece carries the serving copy's blocks that cover it
// (serving_quant.h), so the scales of short blocks and the blocks a piece shares with its
// neighbours are counted, and the bytes equal the shards' counters.
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/block_quant.h"
#include "zps/common/grad_quant.h"
#include "zps/common/status.h"

namespace zps::plan {

/// An element format on the wire or in the shard's state.
enum class Format : uint8_t { kFp32, kFp16, kBf16, kInt8, kInt4 };

/// "fp32", "fp16", "bf16", "int8", "int4". Errors: InvalidArgument.
Result<Format> ParseFormat(std::string_view text);
std::string_view FormatName(Format f);
/// Bytes one element takes, scales included: DTypeSize for fp32/fp16/bf16, 1 (int8) or 0.5
/// (int4) plus 4 bytes of fp32 scale per `block` elements.
double ElementBytes(Format f, uint64_t block);
/// Bytes one fetched element takes in a worker's live window: the format's size for fp32, fp16
/// and bf16; 4 for int8 and int4, which the worker dequantizes into fp32.
double WindowElementBytes(Format fetch);

/// Bytes per parameter of the shard's optimizer state with moments in `state` and a serving
/// copy in `serving`: fp32 master (4) + m + v + serving. fp32 moments with a bf16 copy: 14;
/// bf16 moments: 10; int8 moments: 8 (moments at 1 byte; block scales not counted). Errors:
/// InvalidArgument for a state format other than fp32, bf16 or int8.
Result<double> StateBytesPerParam(Format state, Format serving, uint64_t block);

/// The element counts of a model's tensors, in the order the job registers them, from a JSON
/// array whose items are element counts (`4096`) or shapes (`[64, 64]`). Errors:
/// InvalidArgument for text that is not such an array, an empty one, a count or dimension that
/// is not a positive integer, or a shape of more than 2^40 elements (kMaxTotalElems).
Result<std::vector<uint64_t>> ParseTensorList(std::string_view json);

/// Bytes a reduce-scatter of `bytes` (the whole buffer, per rank) sends over the busiest host's
/// link, each way, among `ranks` ranks of which `ranks_per_host` consecutive ones share a host.
///   - ring (gloo = false; NCCL on GPU workers): a host's ranks are one stretch of the ring, so
///     one edge leaves the host and carries what one rank's does: (ranks - 1) / ranks x bytes;
///   - gloo = true (zps's CPU collectives, Gloo's ReduceScatterHalvingDoubling): at step i a
///     rank exchanges bytes / 2^(i+1) with rank ^ 2^i, then each rank whose slice came to rest
///     at its bit-reversed rank gets it from there (bytes / ranks); the host that sends the most
///     off-host. For a world that is not a power of two this counts the largest power-of-two
///     block's steps only (Gloo adds exchanges between its blocks there).
/// 0 when every rank is on one host.
double ReduceScatterHostBytes(double bytes, int ranks, int ranks_per_host, bool gloo);

struct PlanInput {
  double params = 0;  // Default: 0 (required unless `tensors` is given). Parameters of the model.
  // The model's tensors (element counts, in registration order); when given, `params` is their
  // sum (or must equal it) and the quantized bytes are those of the layout's pieces.
  std::vector<uint64_t> tensors;  // Default: empty = only `params` is known.
  uint64_t chunk_elems = 262144;  // Default: 256 Ki (zps-train's --chunk-elems).
  // Default: 0 = zps-train's: `weight_block` with an int8/int4 fetch (each parameter on serving
  // blocks of its own), else 64. The job's align_elems.
  uint32_t align_elems = 0;
  int nodes = 1;                 // Default: 1. Worker hosts.
  int gpus_per_node = 8;         // Default: 8. Workers (ranks) per worker host.
  int shards = 0;                // Default: 0 = one per node.
  bool colocated = true;         // Default: true. Shards on the worker hosts (else own hosts).
  double link_gbps = 100;        // Default: 100 Gbit/s each way per host.
  double link_efficiency = 0.9;  // Default: 0.9 of the line rate is payload.
  double nvme_gbytes_s = 0;      // Default: 0 = no NVMe. GB/s per host (read or write).
  double shard_ram_bytes = 0;    // Default: 0 = unlimited. RAM per shard for master + moments.
  Format fetch = Format::kBf16;  // Default: bf16. What workers fetch (the serving copy).
  Format grad = Format::kFp32;   // Default: fp32. What workers push.
  Format state = Format::kFp32;  // Default: fp32. The optimizer's moments.
  // Elements per fp32 scale of int8/int4 blocks, as the job uses them: the serving copy's blocks
  // (kWeightQuantBlock, 256) and the gradient pushes' (kGradQuantBlock, 256).
  uint64_t weight_block = kWeightQuantBlock;  // Default: 256.
  uint64_t grad_block = kGradQuantBlock;      // Default: 256.
  bool pre_reduced = false;                   // Default: false = server-sum.
  bool bandwidth_centric = false;             // Default: false = direct fetches.
  // Default: false = ring collectives (NCCL). true: Gloo's, as zps's CPU workers run them
  // (ReduceScatterHostBytes).
  bool gloo_collectives = false;
  // Default: false = the reduce-scatter overlaps the backward (zps.torch's reducer thread).
  // true: it runs between the backward's layers (zps-train's training thread), so its network
  // time adds to the backward's compute.
  bool serial_collectives = false;
  double worker_live_bytes = 1073741824;  // Default: 1 GiB (zps-train's --max-live-bytes).
  double prefetch_bytes = 268435456;      // Default: 256 MiB (zps-train's --prefetch-bytes).
  double bucket_bytes = 16777216;         // Default: 16 MiB (zps-train's --bucket-bytes).
  double optimizer_rate = 1.5e9;  // Default: 1.5e9 parameters/s per shard (2 threads measured).
  double compute_s = 0;           // Default: 0. A worker's forward + backward per step.
  double tokens_per_gpu = 0;      // Default: 0. With gpu_tflops: compute = 6 P T / FLOP/s.
  double gpu_tflops = 0;          // Default: 0. Achieved (not peak) TFLOP/s per GPU.
};

/// Bytes a step moves on one host's link, each way.
struct LinkBytes {
  double out = 0;  // sent by the host
  double in = 0;   // received by the host
};

struct Plan {
  int workers = 0;          // nodes x gpus_per_node
  int shards = 0;           // resolved
  int shard_hosts = 0;      // hosts the shards run on
  int fetch_passes = 0;     // 1 or 2
  double fetch_bytes = 0;   // per element fetched
  double window_bytes = 0;  // per element fetched, in the worker's live window (dequantized)
  double grad_bytes = 0;    // per element pushed
  double state_bytes = 0;   // per parameter in the shard's state (serving copy included)
  // Memory per shard.
  double shard_state_bytes = 0;  // master + moments + serving copy of its 1/S
  double shard_grad_bytes = 0;   // gradient slots (not budgeted: always RAM)
  double shard_ram_bytes = 0;    // state in RAM + gradient slots
  double shard_nvme_bytes = 0;   // master + moments over shard_ram_bytes, spilled
  // Memory per worker (host RAM; the live window may be GPU memory for CUDA parameters).
  double worker_window_bytes = 0;    // live window + prefetch, as the worker holds them
  double worker_bucket_bytes = 0;    // pre-reduced: the fp32 bucket and its reduced slice
  double worker_residual_bytes = 0;  // quantized gradients: the fp32 error-feedback residual
  // Bytes per step.
  LinkBytes worker_rank;  // one worker rank's traffic (before intra-node savings)
  LinkBytes worker_host;  // a worker host's link (separate shard hosts) or a node's (colocated)
  LinkBytes shard_host;   // a shard host's link (separate hosts only)
  double shard_in = 0;    // one shard's ingress (pushes)
  double shard_out = 0;   // one shard's egress (fetches)
  // Step time, seconds.
  double t_network = 0;           // the busiest link direction at link_gbps x link_efficiency
  double t_network_forward = 0;   // the busiest direction of what the forward moves
  double t_network_backward = 0;  // the busiest direction of what the backward moves
  double t_scatter = 0;           // the reduce-scatter on the busiest host's link (pre-reduced)
  double t_compute = 0;
  double t_optimizer = 0;
  double t_nvme = 0;
  double t_lower = 0;     // max(network, compute) + max(optimizer, nvme)
  double t_expected = 0;  // each phase overlapped with its compute (above)
  double t_upper = 0;     // forward + backward network + compute + optimizer + nvme
};

/// Computes the plan. Errors: InvalidArgument for a non-positive params, nodes, gpus or link
/// rate, a negative constant, more shards than parameters, a state format the shard cannot
/// keep (StateBytesPerParam), params that differ from the tensors' sum, or tensors that make no
/// layout (Layout::Build: a chunk size that is not a multiple of the alignment, too many
/// chunks).
Result<Plan> MakePlan(const PlanInput& in);

/// A human-readable report: the inputs that matter, memory, bytes per link and the step time.
std::string FormatPlan(const PlanInput& in, const Plan& plan);
/// The same as one line of JSON (keys as in Plan; bytes and seconds as numbers).
std::string PlanJson(const PlanInput& in, const Plan& plan);

}  // namespace zps::plan
