// zps/server/optimizer.h — the fused CPU optimizer a shard runs over its chunks.
//
// One call to Optimizer::Update makes ONE pass over memory: it reads the gradient (fp32, fp16 or
// bf16), the fp32 master, m and v, applies one scale factor (1/loss_scale x clip coefficient),
// and writes master, m, v and the serving copy (fp16, bf16 or fp32) of the new master. The
// moments are stored packed in the job's state dtype (OptimizerConfig::state_dtype, formats
// below) and are unpacked and repacked inside that same pass; the master is always fp32.
// ComputeGradStats is the separate statistics pass (sum of squares, non-finite flag) that feeds
// the coordinator's commit decision.
//
// Algorithms: Adam and AdamW (bias correction on or off; weight decay coupled, i.e. L2 added to
// the gradient, or decoupled) and SGD with momentum (optionally Nesterov).
// Vectorised for AVX-512 and AVX2+FMA+F16C with a scalar fallback, chosen at Create() from the
// active ISA (zps/common/cpu.h, ZPS_ISA overrides).
//
// Determinism: results are bit-identical whatever the thread pool's size, because work is cut
// into fixed-size blocks and partial sums are combined in block order.
//
// Thread-safety: an Optimizer is immutable after Create(); Update and ComputeGradStats may run
// concurrently on disjoint chunks (they share the pool, whose calls are serialised).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zps/common/block_quant.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"
#include "zps/common/job_spec.h"
#include "zps/common/status.h"
#include "zps/common/thread_pool.h"

namespace zps::server {

// OptimizerKind and OptimizerConfig (the hyperparameters) are part of the job spec:
// zps/common/job_spec.h.

// ---- packed moments ---------------------------------------------------------------------------
//
// A moment (Adam's m or v, SGD's momentum buffer) of n elements is stored in MomentBytes(dtype, n)
// bytes:
//   - fp32: n floats (4n bytes);
//   - bf16: n bfloat16 words (2n bytes): m (and SGD's buffer) rounded to nearest even, v
//     rounded up or down by a golden-ratio dither over steps (docs/optimizer.md says why);
//   - int8: ceil(n / kInt8BlockElems) blocks, each kInt8BlockElems one-byte codes followed by the
//     block's scale, a bfloat16 (little-endian) at least the block's largest |value|; a code
//     indexes the dynamic quantization map (signed for m and SGD's buffer, unsigned for v) and
//     the element is map[code] x scale. A last partial block keeps its whole size; its unused
//     codes are 0.
// Elements [begin, begin + k) of a packed moment are themselves a packed moment of k elements,
// at byte MomentOffset(dtype, begin), when begin is a multiple of kInt8BlockElems (any begin for
// fp32 and bf16): a shard updates a chunk's parameter runs, which start at multiples of the
// layout's align_elems, one call each (JobSpec validation keeps align_elems a multiple of the
// block for int8).

/// Elements per int8 quantization block (one scale each): the job spec's constant.
inline constexpr uint64_t kInt8BlockElems = kInt8StateBlockElems;
/// Bytes of one int8 block: the codes, then a bfloat16 scale.
inline constexpr uint64_t kInt8BlockBytes = kInt8BlockElems + 2;

/// Bytes of one packed moment of `n` elements in `dtype`.
/// The byte offset of element `begin` in a packed moment (for int8, `begin` must be a multiple of
/// kInt8BlockElems: the offset of its block).
uint64_t MomentOffset(StateDType dtype, uint64_t begin);
/// Elements [begin, begin + n) of the packed moment `packed`, itself a packed moment of n elements
/// (empty in, empty out). The range must lie inside `packed`, and for int8 `begin` must be a
/// multiple of kInt8BlockElems (violations abort: they are the caller's arithmetic).
std::span<std::byte> MomentRange(StateDType dtype, std::span<std::byte> packed, uint64_t begin,
                                 uint64_t n);
std::span<const std::byte> MomentRange(StateDType dtype, std::span<const std::byte> packed,
                                       uint64_t begin, uint64_t n);

/// The state of one chunk: the fp32 master, and the moments packed in the optimizer's state
/// dtype (MomentBytes). `v` is unused (may be empty) for SGD; `m` holds the momentum buffer for
/// SGD (may be empty when momentum == 0).
struct ChunkState {
  std::span<float> master;
  std::span<std::byte> m;
  std::span<std::byte> v;
};

/// A read-only gradient buffer of `n` elements of `dtype`.
struct GradView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  size_t n = 0;
};

/// A read-only chunk state (the source of an out-of-place update), packed as ChunkState.
struct ConstChunkState {
  std::span<const float> master;
  std::span<const std::byte> m;
  std::span<const std::byte> v;
};

struct UpdateParams {
  int64_t step = 1;                // 1-based step count after this update (drives bias correction).
  float grad_scale = 1.0f;         // Multiplies every gradient element before use.
  DType out_dtype = DType::kBF16;  // kF16, kBF16 (out16) or kF32 (out32): the serving copy's type.
  std::span<uint16_t> out16;  // 16-bit serving copy; same length as master. May be empty: no copy.
  std::span<float> out32;     // fp32 serving copy (out_dtype kF32); same length, or empty.
  /// A block-quantized serving copy (zps/common/block_quant.h) of the updated master: exactly
  /// QuantizedBytes(out_quant_format, n) bytes, blocks from this call's element 0, the same bytes
  /// as QuantizeBlocks(out_quant_format, master) after the update. Made in the same pass, task by
  /// task while each task's master is still in cache. May be empty: no quantized copy. Needs
  /// ValidateQuantFormat(out_quant_format) and a block that divides the pass's task size
  /// (kI8Block's kWeightQuantBlock does); independent of out16 / out32.
  std::span<std::byte> out_quant;
  QuantFormat out_quant_format;  // Default: int8, block 2048; the shards pass ServingQuantFormat.
  /// Per-call overrides of OptimizerConfig::lr / weight_decay (a parameter group's values, a
  /// scheduled lr). Not set: the config's. The constants are folded exactly as for the config's.
  std::optional<float> lr;
  std::optional<float> weight_decay;
  /// Out of place: the old master, m and v are read from here (same lengths as the state's,
  /// not overlapping it) and the new ones written to the state; the source is not changed. The
  /// same bits as copying the source into the state and updating in place. Not set (default):
  /// in place.
  std::optional<ConstChunkState> source;
  /// The index, in the layout's flat parameter space, of this call's element 0 (a chunk's first
  /// element is chunk_id x chunk_elems). bf16 state computes the dither that rounds v
  /// from (first_index + i, step), so the same element gets the same bits whatever
  /// the ISA, the shard count or the call's extent: pass it wherever bit identity with another
  /// run (the reference, a recovery) matters. Unused by fp32 and int8 state.
  uint64_t first_index = 0;
};

struct GradStats {
  double sum_squares = 0.0;  // of the scaled gradient
  bool non_finite = false;   // any Inf or NaN element
};

class Optimizer {
 public:
  /// Errors: InvalidArgument from config.Validate(); InvalidArgument if `isa` is not supported
  /// by this CPU. `pool` may be null (single-threaded); it must outlive the Optimizer.
  static Result<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config, ThreadPool* pool,
                                                   Isa isa);
  /// As above with the active ISA (ActiveIsa()).
  static Result<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config, ThreadPool* pool);

  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const OptimizerConfig& config() const { return config_; }
  StateDType state_dtype() const { return config_.state_dtype; }
  Isa isa() const { return isa_; }

  /// One fused pass. Errors: InvalidArgument when lengths disagree (grad.n, master, out16 /
  /// out32; m and v, when used, must be MomentBytes(state_dtype(), grad.n) bytes), when the copy
  /// does not match out_dtype (out16 with kF32, out32 with a 16-bit type), when out_quant has
  /// the wrong size or out_quant_format is not valid for it (see UpdateParams), when step < 1, when
  /// grad_scale is not finite, when an lr / weight_decay override is negative or not finite (or,
  /// for AdamW, lr * weight_decay > 1), or for a bad grad dtype / null grad data with n > 0. On
  /// error nothing is written. The arrays must not overlap each other (they are read and written in
  /// one pass).
  Status Update(const ChunkState& state, const GradView& grad, const UpdateParams& params) const;

  /// Sum of squares of (grad x scale), accumulated in double over fixed blocks of 4096
  /// elements (each fp32 square is exact in double; 16 lane sums per block), blocks added in
  /// index order within each 64 Ki-element task and the tasks in index order, then multiplied by
  /// scale^2; and the non-finite flag (any Inf/NaN element).
  /// Bit-identical for any pool size and on every ISA. Relative error <= (320 + n/65536) x 2^-53
  /// (docs/optimizer.md). Errors: InvalidArgument for a bad dtype, null data with n > 0, or a
  /// non-finite scale.
  Result<GradStats> ComputeGradStats(const GradView& grad, float scale = 1.0f) const;

 private:
  Optimizer(const OptimizerConfig& config, ThreadPool* pool, Isa isa);

  OptimizerConfig config_;
  ThreadPool* pool_;
  Isa isa_;
};

}  // namespace zps::server
