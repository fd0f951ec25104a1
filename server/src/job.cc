#include "zps/server/job.h"

#include "zps/common/bytes.h"

namespace zps::server {
namespace {
constexpr uint32_t kJobMagic = 0x5a50534au;  // "ZPSJ"
constexpr uint32_t kJobVersion = 1;
constexpr size_t kMaxLayoutBytes = 512u << 20;
}  // namespace

std::vector<std::byte> JobSpec::Serialize() const {
  ByteWriter w;
  w.U32(kJobMagic);
  w.U32(kJobVersion);
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
  return w.Take();
}

Result<JobSpec> JobSpec::Deserialize(std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  ZPS_ASSIGN_OR_RETURN(uint32_t magic, r.U32("job.magic"));
  if (magic != kJobMagic) return InvalidArgument("not a zps job spec (bad magic)");
  ZPS_ASSIGN_OR_RETURN(uint32_t version, r.U32("job.version"));
  if (version != kJobVersion) return InvalidArgument("unsupported job spec version");
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
  if (shard.world_size == 0 || shard.world_size > 65536) {
    return InvalidArgument("world_size must be in [1, 65536]");
  }
  if (shard.serving_dtype == DType::kF32) return InvalidArgument("serving dtype must be 16-bit");
  ZPS_RETURN_IF_ERROR(optimizer.Validate());
  ZPS_RETURN_IF_ERROR(commit.Validate());
  return Status::Ok();
}

}  // namespace zps::server
