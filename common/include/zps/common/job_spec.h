// zps/common/job_spec.h — the job description rank 0 registers with the coordinator, which every
// other rank and every shard must agree with (checked through JobSpec::Hash()). It is the contract
// between workers and servers, so it lives here and both sides build it from this one header.
//
// Every field is declared ONCE, in a field list below (ZPS_*_FIELDS): C++ type, member, default,
// JSON key, the binary version that introduced it, the JSON range of a number, and its meaning.
// The struct members, the binary codec (JobSpec::Serialize/Deserialize), the JSON codec
// (JobSpecFromJson, used by zps.torch and zps-train) and the key tables in docs/pytorch.md and
// docs/protocol.md (JobSpecDocTable, checked by tests/unit/common/job_spec_doc_test.cc) all come
// from those lists, so adding a field is one line there.
//
// A row is X(type, member, default, "json key", version, json_lo, json_hi, "doc"): json_lo and
// json_hi bound a number read from JSON (unused for other types); version is the JobSpec binary
// version the field first appears in (ShardJob, CommitConfig) or the version of the record the
// struct is encoded in (OptimizerConfig: its own "ZOPT" record, whose version 2 only JobSpec
// version 4 carries; LrScheduleConfig, ParamGroup: inline in their ShardJob field).
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/status.h"

namespace zps {

namespace job_limits {
inline constexpr double kFloatMax = std::numeric_limits<float>::max();
inline constexpr double kBig = 1e300;
inline constexpr double kSteps = 1e15;
}  // namespace job_limits

// ---- enums: X(enumerator, value, "name"); the name is what JSON, flags and docs use ----------

#define ZPS_REDUCTION_MODE_VALUES(X) X(kServerSum, 0, "server-sum") X(kPreReduced, 1, "pre-reduced")
#define ZPS_UPDATE_MODE_VALUES(X) X(kSync, 0, "sync") X(kSpeculative, 1, "speculative")
#define ZPS_OPTIMIZER_KIND_VALUES(X) X(kAdam, 0, "adam") X(kAdamW, 1, "adamw") X(kSgd, 2, "sgd")
// DeepSpeed's scheduler type names.
#define ZPS_LR_SCHEDULE_KIND_VALUES(X) \
  X(kNone, 0, "none")                  \
  X(kWarmupLR, 1, "WarmupLR")          \
  X(kWarmupDecayLR, 2, "WarmupDecayLR") X(kWarmupCosineLR, 3, "WarmupCosineLR")
#define ZPS_WARMUP_TYPE_VALUES(X) X(kLog, 0, "log") X(kLinear, 1, "linear")
#define ZPS_STATE_DTYPE_VALUES(X) X(kF32, 0, "fp32") X(kBF16, 1, "bf16") X(kInt8, 2, "int8")

#define ZPS_ENUMERATOR(id, value, name) id = value,
/// How gradients are reduced: server-sum (each rank pushes its own gradient, the shards sum) or
/// pre-reduced (the ranks reduce-scatter first and push disjoint slices).
enum class ReductionMode : uint8_t { ZPS_REDUCTION_MODE_VALUES(ZPS_ENUMERATOR) };
/// When a shard runs the optimizer (docs/architecture.md "The speculative step"):
///   - sync: after the commit decision, over every chunk;
///   - speculative: on each chunk as soon as its gradient is complete, into spare buffers,
///     assuming no clip and no skip; the commit publishes the spare (the decided order is the
///     assumed one), redoes the chunk from its untouched pre-update state (it clipped), or drops
///     the spare (skip). Bit-identical to sync in every case.
enum class UpdateMode : uint8_t { ZPS_UPDATE_MODE_VALUES(ZPS_ENUMERATOR) };
enum class OptimizerKind : uint8_t { ZPS_OPTIMIZER_KIND_VALUES(ZPS_ENUMERATOR) };
/// none: each group's own lr, constant; the others as DeepSpeed's schedulers of that name.
enum class LrScheduleKind : uint8_t { ZPS_LR_SCHEDULE_KIND_VALUES(ZPS_ENUMERATOR) };
enum class WarmupType : uint8_t { ZPS_WARMUP_TYPE_VALUES(ZPS_ENUMERATOR) };
/// How a shard stores the optimizer's moments (Adam's m and v, SGD's momentum buffer) beside the
/// fp32 master, which is always fp32: fp32; bf16 (m rounded to nearest, v up or down by a dither
/// over steps); int8 (blockwise, dynamic quantization map, an absmax scale per block). The packed
/// formats: zps/server/optimizer.h.
enum class StateDType : uint8_t { ZPS_STATE_DTYPE_VALUES(ZPS_ENUMERATOR) };
#undef ZPS_ENUMERATOR
/// Elements per int8 quantization block (zps/server/optimizer.h has the packed format). A job
/// with int8 state needs the layout's align_elems to be a multiple of it (ValidateShardJob).
inline constexpr uint32_t kInt8StateBlockElems = 64;
/// Bytes of one packed moment (m or v) of n elements stored as `dtype`: fp32 4n, bf16 2n, int8
/// ceil(n / kInt8StateBlockElems) blocks of that many one-byte codes and a bf16 scale each. The
/// one size rule the kernels, the shard's buffers, the spill store, checkpoints and the launcher's
/// budget check (zps/common/spill_budget.h) all follow.
uint64_t MomentBytes(StateDType dtype, uint64_t n);

/// The name of a value ("unknown" for a value outside the enum).
std::string_view ReductionModeName(ReductionMode m);
std::string_view UpdateModeName(UpdateMode m);
std::string_view OptimizerKindName(OptimizerKind kind);
std::string_view LrScheduleKindName(LrScheduleKind kind);
std::string_view WarmupTypeName(WarmupType type);
std::string_view StateDTypeName(StateDType dtype);
/// The value of a name. Errors: InvalidArgument "<what> must be <the names>; got '<text>'".
Result<ReductionMode> ParseReductionMode(std::string_view text);
Result<UpdateMode> ParseUpdateMode(std::string_view text);
Result<OptimizerKind> ParseOptimizerKind(std::string_view text);
Result<LrScheduleKind> ParseLrScheduleKind(std::string_view text);
Result<WarmupType> ParseWarmupType(std::string_view text);
Result<StateDType> ParseStateDType(std::string_view text);

#define ZPS_DECLARE_FIELD(type, member, def, key, version, lo, hi, doc) type member = def;

// ---- OptimizerConfig ----------------------------------------------------------------------------

#define ZPS_OPTIMIZER_CONFIG_FIELDS(X)                                                   \
  X(OptimizerKind, kind, OptimizerKind::kAdamW, "type", 1, 0, 0,                         \
    "adam: weight decay coupled (L2); adamw: decoupled; sgd: with momentum")             \
  X(float, lr, 1e-3f, "lr", 1, 0, job_limits::kFloatMax,                                 \
    "learning rate; finite, >= 0 (not used when shard.param_groups is set)")             \
  X(float, beta1, 0.9f, "beta1", 1, 0, 1, "Adam/AdamW; in [0, 1)")                       \
  X(float, beta2, 0.999f, "beta2", 1, 0, 1, "Adam/AdamW; in [0, 1)")                     \
  X(float, eps, 1e-8f, "eps", 1, 0, job_limits::kFloatMax, "Adam/AdamW; > 0")            \
  X(float, weight_decay, 0.0f, "weight_decay", 1, 0, job_limits::kFloatMax,              \
    ">= 0; coupled (L2) for adam and sgd, decoupled for adamw (lr * weight_decay <= 1)") \
  X(bool, bias_correction, true, "bias_correction", 1, 0, 0, "Adam/AdamW")               \
  X(float, momentum, 0.0f, "momentum", 1, 0, 1, "SGD; in [0, 1)")                        \
  X(bool, nesterov, false, "nesterov", 1, 0, 0, "SGD; needs momentum > 0")               \
  X(StateDType, state_dtype, StateDType::kF32, "state_dtype", 2, 0, 0,                   \
    "how the shards store the moments (the master stays fp32): fp32, bf16 or int8")

/// The optimizer's hyperparameters (the fused optimizer is zps/server/optimizer.h).
struct OptimizerConfig {
  ZPS_OPTIMIZER_CONFIG_FIELDS(ZPS_DECLARE_FIELD)

  /// Errors: InvalidArgument naming the field.
  Status Validate() const;
  /// A stable binary record (magic "ZOPT", u16 version, u16 body length, the fields of every
  /// version up to the one written in list order, CRC32C), for the job spec and checkpoints. The
  /// version written is the smallest that holds every field not at its default: version 1 (39
  /// bytes) unless state_dtype is set, version 2 (40 bytes) with it.
  std::vector<std::byte> Serialize() const;
  /// Errors: InvalidArgument for a malformed or unknown-version record or a value Validate()
  /// refuses; DataLoss for a checksum mismatch.
  static Result<OptimizerConfig> Deserialize(std::span<const std::byte> bytes);
  bool operator==(const OptimizerConfig&) const = default;
};

// ---- CommitConfig -------------------------------------------------------------------------------

#define ZPS_COMMIT_CONFIG_FIELDS(X)                                                            \
  X(double, max_grad_norm, 0.0, "max_grad_norm", 1, 0, job_limits::kBig,                       \
    "clip the global gradient norm to this; 0 = no clipping")                                  \
  X(double, grad_divisor, 1.0, "grad_divisor", 1, 1e-30, job_limits::kBig,                     \
    "divides the summed gradient: world_size x accumulation_steps averages every micro-batch") \
  X(bool, dynamic_loss_scale, false, "dynamic_loss_scale", 1, 0, 0,                            \
    "fp16 loss scaling: skip a step with a non-finite gradient and lower the scale")           \
  X(double, initial_loss_scale, 65536.0, "initial_loss_scale", 1, 1e-30, job_limits::kBig,     \
    "the first loss scale (dynamic_loss_scale)")                                               \
  X(double, scale_factor, 2.0, "scale_factor", 1, 1, job_limits::kBig,                         \
    "the scale is divided by this on overflow and multiplied after scale_window good steps")   \
  X(int64_t, scale_window, 1000, "scale_window", 1, 1, job_limits::kSteps,                     \
    "good steps before the scale grows")                                                       \
  X(double, min_loss_scale, 1.0, "min_loss_scale", 1, 1e-30, job_limits::kBig,                 \
    "the scale never goes below this")

/// The coordinator's commit decision (zps/server/step_commit.h).
struct CommitConfig {
  ZPS_COMMIT_CONFIG_FIELDS(ZPS_DECLARE_FIELD)

  /// Errors: InvalidArgument naming the field.
  Status Validate() const;
  bool operator==(const CommitConfig&) const = default;
};

// ---- LrScheduleConfig ---------------------------------------------------------------------------

#define ZPS_LR_SCHEDULE_CONFIG_FIELDS(X)                                                   \
  X(LrScheduleKind, kind, LrScheduleKind::kNone, "type", 1, 0, 0,                          \
    "DeepSpeed's schedulers of these names; none: each group's lr, constant")              \
  X(double, warmup_min_lr, 0.0, "warmup_min_lr", 1, 0, job_limits::kBig,                   \
    "WarmupLR, WarmupDecayLR: the lr at step 0")                                           \
  X(double, warmup_max_lr, 0.001, "warmup_max_lr", 1, 0, job_limits::kBig,                 \
    "WarmupLR, WarmupDecayLR: the lr after warmup")                                        \
  X(int64_t, warmup_num_steps, 1000, "warmup_num_steps", 1, 0, job_limits::kSteps,         \
    "warmup steps, >= 1 (max(2, this) is used, as DeepSpeed does)")                        \
  X(WarmupType, warmup_type, WarmupType::kLog, "warmup_type", 1, 0, 0, "the warmup curve") \
  X(int64_t, total_num_steps, 0, "total_num_steps", 1, 0, job_limits::kSteps,              \
    "WarmupDecayLR, WarmupCosineLR: the last step (>= 1 for those)")                       \
  X(double, warmup_min_ratio, 0.0, "warmup_min_ratio", 1, 0, job_limits::kBig,             \
    "WarmupCosineLR: the ratio at step 0")                                                 \
  X(double, cos_min_ratio, 0.0001, "cos_min_ratio", 1, 0, job_limits::kBig,                \
    "WarmupCosineLR: the ratio at the end")

/// The learning-rate schedule's parameters, DeepSpeed's JSON names (the schedule itself is
/// zps/server/lr_schedule.h). Fields a kind does not use are ignored, but still validated and
/// serialised.
struct LrScheduleConfig {
  ZPS_LR_SCHEDULE_CONFIG_FIELDS(ZPS_DECLARE_FIELD)

  /// Errors: InvalidArgument naming the field.
  Status Validate() const;
  /// The largest factor (absolute lr for WarmupLR/WarmupDecayLR, ratio for WarmupCosineLR, 1 for
  /// none) the schedule can produce: for the AdamW check lr * weight_decay <= 1.
  double MaxValue() const;
  bool operator==(const LrScheduleConfig&) const = default;
};

// ---- ParamGroup ---------------------------------------------------------------------------------

#define ZPS_PARAM_GROUP_FIELDS(X)                                                        \
  X(float, lr, 1e-3f, "lr", 1, 0, job_limits::kFloatMax, "the group's lr; finite, >= 0") \
  X(float, weight_decay, 0.0f, "weight_decay", 1, 0, job_limits::kFloatMax,              \
    "the group's weight decay; finite, >= 0 (coupled or decoupled as the optimizer)")

/// One torch.optim-style parameter group: its own lr and weight decay (the rest of the
/// optimizer's hyperparameters are shared, from OptimizerConfig).
struct ParamGroup {
  ZPS_PARAM_GROUP_FIELDS(ZPS_DECLARE_FIELD)
  bool operator==(const ParamGroup&) const = default;
};

// ---- ShardJob -----------------------------------------------------------------------------------

#define ZPS_SHARD_JOB_FIELDS(X)                                                              \
  X(ReductionMode, mode, ReductionMode::kServerSum, "reduction", 1, 0, 0,                    \
    "pre-reduced: the ranks reduce-scatter each gradient and push their slice")              \
  X(uint32_t, world_size, 1, "world_size", 1, 1, 65536, "ranks, in [1, 65536]")              \
  X(DType, grad_dtype, DType::kF32, "grad_dtype", 1, 0, 0,                                   \
    "the dtype pushes use; int8-block, int4-block: quantized with error feedback")           \
  X(DType, serving_dtype, DType::kBF16, "serving_dtype", 1, 0, 0,                            \
    "the copy workers fetch: bf16, fp16, fp32 (the master), int8-block (quantized weights)") \
  X(uint32_t, accumulation_steps, 1, "accumulation_steps", 2, 1, 1024,                       \
    "micro-batches each rank pushes per step, in [1, 1024]; world_size x this <= 65536")     \
  X(std::vector<ParamGroup>, param_groups, {}, "param_groups", 2, 0, 0,                      \
    "list of {lr, weight_decay}; empty: one group with optimizer.lr and .weight_decay")      \
  X(std::vector<uint32_t>, param_group, {}, "param_group", 2, 0, 1 << 20,                    \
    "per parameter (layout order), its index into param_groups; empty: all in group 0")      \
  X(std::vector<uint8_t>, frozen, {}, "frozen", 2, 0, 1,                                     \
    "per parameter, 1 = frozen (served, never pushed, never updated); empty: none")          \
  X(LrScheduleConfig, lr_schedule, {}, "lr_schedule", 2, 0, 0,                               \
    "the learning-rate schedule (its keys below)")                                           \
  X(UpdateMode, update_mode, UpdateMode::kSync, "update", 3, 0, 0,                           \
    "speculative: each chunk is updated as soon as its gradient is complete (bit-identical)")

/// What every shard must agree on about the job's step (besides the layout and optimizer).
/// Validated by ValidateShardJob (JobSpec::Validate, ShardState::Create). Beyond the doc column:
///   - accumulation_steps k: each rank pushes k micro-batches per step, with contributor index
///     rank * k + micro in PushRequest::rank;
///   - param_groups not empty: OptimizerConfig::lr / weight_decay are not used (still validated);
///   - param_group not empty: exactly layout.num_params() entries, each < param_groups.size()
///     (param_groups must then not be empty);
///   - frozen not empty: exactly layout.num_params() entries of 0 or 1;
///   - serving_dtype fp32: 4 bytes an element everywhere the serving copy goes; int8-block: the
///     int8 blocks of each chunk's master (zps/common/serving_quant.h), fetched by covering block.
struct ShardJob {
  ZPS_SHARD_JOB_FIELDS(ZPS_DECLARE_FIELD)
  bool operator==(const ShardJob&) const = default;
};

#undef ZPS_DECLARE_FIELD

/// Checks `job` against the layout and optimizer. Errors: InvalidArgument naming the field
/// (world_size, serving_dtype other than fp16, bf16, fp32 or int8-block, optimizer.state_dtype int8
/// with an align_elems that is not a multiple of kInt8StateBlockElems, accumulation_steps,
/// param_groups[i].lr / .weight_decay, param_group, frozen, lr_schedule.*; AdamW: a group's largest
/// scheduled lr * weight_decay > 1).
Status ValidateShardJob(const ShardJob& job, const Layout& layout,
                        const OptimizerConfig& optimizer);

// ---- JobSpec ------------------------------------------------------------------------------------

struct JobSpec {
  Layout layout;
  ShardJob shard;
  OptimizerConfig optimizer;
  CommitConfig commit;

  /// Stable binary form, versioned: magic "ZPSJ", u32 version, then for each version up to the
  /// one written, the fields of that version (layout blob, ShardJob's, the optimizer record,
  /// CommitConfig's, in that order). The version written is the smallest that holds every field
  /// not at its default, so a spec without newer fields has the bytes (and hash) of older
  /// builds. docs/protocol.md has the table.
  std::vector<std::byte> Serialize() const;
  /// Reads versions 1 to 4 (fields of later versions keep their defaults), then Validate().
  /// Version 4 adds no field of its own: it is the version that carries optimizer record
  /// version 2 (optimizer.state_dtype), so that builds which do not know the field refuse the
  /// spec by its version.
  /// Errors: InvalidArgument (bad magic, unknown version, a truncated or malformed field, or
  /// Validate's); DataLoss (the optimizer record's checksum).
  static Result<JobSpec> Deserialize(std::span<const std::byte> bytes);
  /// Hash of the serialised form: equal specs, equal hashes, on every process.
  uint64_t Hash() const;
  /// Errors: InvalidArgument naming the field: OptimizerConfig::Validate, ValidateShardJob,
  /// CommitConfig::Validate.
  Status Validate() const;
};

/// The highest binary version this build reads and writes.
inline constexpr uint32_t kJobSpecVersion = 4;

/// Builds a JobSpec from the JSON job description: {"params": [{"name", "shape"}...],
/// "chunk_elems", "align_elems", "num_shards", "optimizer": {...}, "commit": {...},
/// "shard": {..., "lr_schedule": {...}}} with the keys of the field lists (enums by name,
/// dtypes as ParseDType reads them); an absent or null key keeps its default. Then Validate().
/// Errors: InvalidArgument naming the key: not JSON, an unknown key ("unknown key
/// job.shard.x"), a value of the wrong type or out of its range, a bad name, or Validate's.
Result<JobSpec> JobSpecFromJson(std::string_view json);

/// The markdown tables generated from the field lists: "json" (every JSON key, its type, default,
/// binary version and meaning: docs/pytorch.md) or "binary" (the binary fields in wire order:
/// docs/protocol.md). Empty for another name.
std::string JobSpecDocTable(std::string_view which);

}  // namespace zps

// The server's code names these zps::server::X, where they were declared before the job spec
// became part of common; the aliases keep those names.
namespace zps::server {
using zps::CommitConfig;
using zps::JobSpec;
using zps::LrScheduleConfig;
using zps::LrScheduleKind;
using zps::LrScheduleKindName;
using zps::MomentBytes;
using zps::OptimizerConfig;
using zps::OptimizerKind;
using zps::OptimizerKindName;
using zps::ParamGroup;
using zps::ParseLrScheduleKind;
using zps::ParseOptimizerKind;
using zps::ParseReductionMode;
using zps::ParseStateDType;
using zps::ParseUpdateMode;
using zps::ParseWarmupType;
using zps::ReductionMode;
using zps::ReductionModeName;
using zps::ShardJob;
using zps::StateDType;
using zps::StateDTypeName;
using zps::UpdateMode;
using zps::UpdateModeName;
using zps::ValidateShardJob;
using zps::WarmupType;
using zps::WarmupTypeName;
}  // namespace zps::server
