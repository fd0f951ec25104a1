#include "zps/server/job.h"

#include "zps/common/bytes.h"

namespace zps::server {
namespace {
constexpr uint32_t kJobMagic = 0x5a50534au;  // "ZPSJ"
// Version 1: the fields up to commit.min_loss_scale. Version 2 appends the optimizer surface of
// ShardJob (accumulation, groups, frozen, schedule). A spec whose new fields all have their
// defaults is written as version 1, byte for byte as before; both versions are read.
constexpr uint32_t kJobVersion1 = 1;
constexpr uint32_t kJobVersion2 = 2;
// Version 3 appends ShardJob::update_mode (u8); written only when it is not sync.
constexpr uint32_t kJobVersion3 = 3;
constexpr size_t kMaxLayoutBytes = 512u << 20;
constexpr uint32_t kMaxGroups = 65536;
constexpr uint32_t kMaxParams = 1u << 24;

bool HasV2Fields(const ShardJob& s) {
  return s.accumulation_steps != 1 || !s.param_groups.empty() || !s.param_group.empty() ||
         !s.frozen.empty() || !(s.lr_schedule == LrScheduleConfig{});
}
}  // namespace

std::vector<std::byte> JobSpec::Serialize() const {
  ByteWriter w;
  const bool v3 = shard.update_mode != UpdateMode::kSync;
  const bool v2 = v3 || HasV2Fields(shard);
  w.U32(kJobMagic);
  w.U32(v3 ? kJobVersion3 : (v2 ? kJobVersion2 : kJobVersion1));
  w.Blob(layout.Serialize());
  w.U8(static_cast<uint8_t>(shard.mode));
  w.U32(shard.world_size);
  w.U8(static_cast<uint8_t>(shard.grad_dtype));
  w.U8(static_cast<uint8_t>(shard.serving_dtype));
  w.Blob(optimizer.Serialize());
  w.F64(commit.max_grad_norm);
  w.F64(commit.grad_divisor);
  w.U8(commit.dynamic_loss_scale ? 1 : 0);
  w.F64(commit.initial_loss_scale);
  w.F64(commit.scale_factor);
  w.I64(commit.scale_window);
  w.F64(commit.min_loss_scale);
  if (v2) {
    w.U32(shard.accumulation_steps);
    w.U32(static_cast<uint32_t>(shard.param_groups.size()));
    for (const ParamGroup& g : shard.param_groups) {
      w.F32(g.lr);
      w.F32(g.weight_decay);
    }
    w.U32(static_cast<uint32_t>(shard.param_group.size()));
    for (uint32_t g : shard.param_group) w.U32(g);
    w.U32(static_cast<uint32_t>(shard.frozen.size()));
    for (uint8_t f : shard.frozen) w.U8(f);
    const LrScheduleConfig& ls = shard.lr_schedule;
    w.U8(static_cast<uint8_t>(ls.kind));
    w.F64(ls.warmup_min_lr);
    w.F64(ls.warmup_max_lr);
    w.I64(ls.warmup_num_steps);
    w.U8(static_cast<uint8_t>(ls.warmup_type));
    w.I64(ls.total_num_steps);
    w.F64(ls.warmup_min_ratio);
    w.F64(ls.cos_min_ratio);
  }
  if (v3) w.U8(static_cast<uint8_t>(shard.update_mode));
  return w.Take();
}

Result<JobSpec> JobSpec::Deserialize(std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  ZPS_ASSIGN_OR_RETURN(uint32_t magic, r.U32("job.magic"));
  if (magic != kJobMagic) return InvalidArgument("not a zps job spec (bad magic)");
  ZPS_ASSIGN_OR_RETURN(uint32_t version, r.U32("job.version"));
  if (version != kJobVersion1 && version != kJobVersion2 && version != kJobVersion3) {
    return InvalidArgument("unsupported job spec version " + std::to_string(version) +
                           " (this build reads 1 to 3)");
  }
  ZPS_ASSIGN_OR_RETURN(auto layout_bytes, r.Blob("job.layout", kMaxLayoutBytes));
  ZPS_ASSIGN_OR_RETURN(Layout layout, Layout::Deserialize(layout_bytes));
  JobSpec j{std::move(layout), {}, {}, {}};
  ZPS_ASSIGN_OR_RETURN(uint8_t mode, r.U8("job.mode"));
  if (mode > 1) return InvalidArgument("unknown reduction mode " + std::to_string(mode));
  j.shard.mode = static_cast<ReductionMode>(mode);
  ZPS_ASSIGN_OR_RETURN(j.shard.world_size, r.U32("job.world_size"));
  ZPS_ASSIGN_OR_RETURN(uint8_t gd, r.U8("job.grad_dtype"));
  ZPS_ASSIGN_OR_RETURN(j.shard.grad_dtype, DTypeFromByte(gd));
  ZPS_ASSIGN_OR_RETURN(uint8_t sd, r.U8("job.serving_dtype"));
  ZPS_ASSIGN_OR_RETURN(j.shard.serving_dtype, DTypeFromByte(sd));
  ZPS_ASSIGN_OR_RETURN(auto opt_bytes, r.Blob("job.optimizer", 4096));
  ZPS_ASSIGN_OR_RETURN(j.optimizer, OptimizerConfig::Deserialize(opt_bytes));
  ZPS_ASSIGN_OR_RETURN(j.commit.max_grad_norm, r.F64("job.max_grad_norm"));
  ZPS_ASSIGN_OR_RETURN(j.commit.grad_divisor, r.F64("job.grad_divisor"));
  ZPS_ASSIGN_OR_RETURN(uint8_t dls, r.U8("job.dynamic_loss_scale"));
  j.commit.dynamic_loss_scale = dls != 0;
  ZPS_ASSIGN_OR_RETURN(j.commit.initial_loss_scale, r.F64("job.initial_loss_scale"));
  ZPS_ASSIGN_OR_RETURN(j.commit.scale_factor, r.F64("job.scale_factor"));
  ZPS_ASSIGN_OR_RETURN(j.commit.scale_window, r.I64("job.scale_window"));
  ZPS_ASSIGN_OR_RETURN(j.commit.min_loss_scale, r.F64("job.min_loss_scale"));
  if (version >= kJobVersion2) {
    ShardJob& s = j.shard;
    ZPS_ASSIGN_OR_RETURN(s.accumulation_steps, r.U32("job.accumulation_steps"));
    ZPS_ASSIGN_OR_RETURN(uint32_t ng, r.U32("job.param_groups"));
    if (ng > kMaxGroups) return InvalidArgument("job spec: param_groups: too many groups");
    s.param_groups.resize(ng);
    for (ParamGroup& g : s.param_groups) {
      ZPS_ASSIGN_OR_RETURN(g.lr, r.F32("job.param_groups.lr"));
      ZPS_ASSIGN_OR_RETURN(g.weight_decay, r.F32("job.param_groups.weight_decay"));
    }
    ZPS_ASSIGN_OR_RETURN(uint32_t npg, r.U32("job.param_group"));
    if (npg > kMaxParams || npg * size_t{4} > r.remaining()) {
      return InvalidArgument("job spec: param_group: bad length " + std::to_string(npg));
    }
    s.param_group.resize(npg);
    for (uint32_t& g : s.param_group) {
      ZPS_ASSIGN_OR_RETURN(g, r.U32("job.param_group"));
    }
    ZPS_ASSIGN_OR_RETURN(uint32_t nf, r.U32("job.frozen"));
    if (nf > kMaxParams || nf > r.remaining()) {
      return InvalidArgument("job spec: frozen: bad length " + std::to_string(nf));
    }
    s.frozen.resize(nf);
    for (uint8_t& f : s.frozen) {
      ZPS_ASSIGN_OR_RETURN(f, r.U8("job.frozen"));
    }
    LrScheduleConfig& ls = s.lr_schedule;
    ZPS_ASSIGN_OR_RETURN(uint8_t kind, r.U8("job.lr_schedule.kind"));
    if (kind > static_cast<uint8_t>(LrScheduleKind::kWarmupCosineLR)) {
      return InvalidArgument("job spec: lr_schedule.kind " + std::to_string(kind) + " is unknown");
    }
    ls.kind = static_cast<LrScheduleKind>(kind);
    ZPS_ASSIGN_OR_RETURN(ls.warmup_min_lr, r.F64("job.lr_schedule.warmup_min_lr"));
    ZPS_ASSIGN_OR_RETURN(ls.warmup_max_lr, r.F64("job.lr_schedule.warmup_max_lr"));
    ZPS_ASSIGN_OR_RETURN(ls.warmup_num_steps, r.I64("job.lr_schedule.warmup_num_steps"));
    ZPS_ASSIGN_OR_RETURN(uint8_t wt, r.U8("job.lr_schedule.warmup_type"));
    if (wt > static_cast<uint8_t>(WarmupType::kLinear)) {
      return InvalidArgument("job spec: lr_schedule.warmup_type " + std::to_string(wt) +
                             " is unknown");
    }
    ls.warmup_type = static_cast<WarmupType>(wt);
    ZPS_ASSIGN_OR_RETURN(ls.total_num_steps, r.I64("job.lr_schedule.total_num_steps"));
    ZPS_ASSIGN_OR_RETURN(ls.warmup_min_ratio, r.F64("job.lr_schedule.warmup_min_ratio"));
    ZPS_ASSIGN_OR_RETURN(ls.cos_min_ratio, r.F64("job.lr_schedule.cos_min_ratio"));
  }
  if (version >= kJobVersion3) {
    ZPS_ASSIGN_OR_RETURN(uint8_t um, r.U8("job.update_mode"));
    if (um > static_cast<uint8_t>(UpdateMode::kSpeculative)) {
      return InvalidArgument("job spec: update_mode " + std::to_string(um) + " is unknown");
    }
    j.shard.update_mode = static_cast<UpdateMode>(um);
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("job spec"));
  ZPS_RETURN_IF_ERROR(j.Validate());
  return j;
}

uint64_t JobSpec::Hash() const {
  auto bytes = Serialize();
  uint64_t h = 1469598103934665603ull;
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 1099511628211ull;
  }
  return h;
}

Status JobSpec::Validate() const {
  ZPS_RETURN_IF_ERROR(optimizer.Validate());
  ZPS_RETURN_IF_ERROR(ValidateShardJob(shard, layout, optimizer));
  ZPS_RETURN_IF_ERROR(commit.Validate());
  return Status::Ok();
}

}  // namespace zps::server
