// Optimizer: argument validation, constant folding and threading around the per-ISA kernels.
//
// Threading: a call is cut into blocks of a fixed number of elements (never "n / threads"), and
// the pool runs the blocks in any order. The update is element-wise and every element sees the
// same arithmetic wherever it falls (tails run the vector code on a padded copy), and the
// statistics are added block by block in index order, so results are bit-identical for any pool
// size, including no pool.
#include "zps/server/optimizer.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "optimizer_kernels.h"

namespace zps::server {

namespace {

using internal::KernelArgs;
using internal::KernelTable;

// 64 Ki elements: 256 KiB per fp32 array, large enough that the pool's per-task cost (an atomic
// and an indirect call) is noise, small enough that two threads stay balanced on a 4 MiB chunk.
// A multiple of kStatsBlock and of 64 (the kernels' alignment unit).
constexpr size_t kTaskElems = 64 * 1024;
static_assert(kTaskElems % internal::kStatsBlock == 0 && kTaskElems % 64 == 0 &&
              kTaskElems % kInt8BlockElems == 0);

// Below this many elements the serving copy is written with ordinary stores: it fits in L2 and
// a fetch may read it soon. Above it, non-temporal stores skip the read-for-ownership of lines
// this pass never reads, which saves 2 of ~32 bytes of traffic per parameter.
constexpr size_t kStreamMinElems = 64 * 1024;

const KernelTable& KernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return internal::Avx512Kernels();
    case Isa::kAvx2:
      return internal::Avx2Kernels();
    case Isa::kScalar:
      break;
  }
  return internal::ScalarKernels();
}

Status CheckGrad(const GradView& grad) {
  const auto d = static_cast<uint8_t>(grad.dtype);
  if (d > static_cast<uint8_t>(DType::kBF16)) {
    return InvalidArgument("gradient dtype " + std::to_string(d) + " is not fp32, fp16 or bf16");
  }
  if (grad.n > 0 && grad.data == nullptr) return InvalidArgument("gradient data is null");
  return Status::Ok();
}

Status CheckLen(std::string_view what, size_t got, size_t want) {
  if (got == want) return Status::Ok();
  return InvalidArgument(std::string(what) + " has " + std::to_string(got) +
                         " elements, gradient has " + std::to_string(want));
}

Status CheckMoment(std::string_view what, StateDType dtype, size_t got_bytes, size_t n) {
  const uint64_t want = MomentBytes(dtype, n);
  if (got_bytes == want) return Status::Ok();
  return InvalidArgument(std::string(what) + " has " + std::to_string(got_bytes) + " bytes; " +
                         std::to_string(n) + " elements of " + std::string(StateDTypeName(dtype)) +
                         " state take " + std::to_string(want));
}

template <typename B>
std::span<B> Range(StateDType dtype, std::span<B> packed, uint64_t begin, uint64_t n) {
  if (packed.empty()) return packed;
  if (dtype == StateDType::kInt8 && begin % kInt8BlockElems != 0) {
    std::abort();  // the caller's arithmetic: runs start on a block (see optimizer.h)
  }
  const uint64_t off = MomentOffset(dtype, begin), bytes = MomentBytes(dtype, n);
  if (off + bytes > packed.size()) std::abort();
  return packed.subspan(off, bytes);
}

// Runs fn(begin, end) over fixed blocks, on the pool when there is more than one block.
template <typename Fn>
void ForBlocks(ThreadPool* pool, size_t n, const Fn& fn) {
  const size_t tasks = (n + kTaskElems - 1) / kTaskElems;
  auto one = [&](size_t t) { fn(t * kTaskElems, std::min(n, (t + 1) * kTaskElems)); };
  if (pool == nullptr || tasks <= 1) {
    for (size_t t = 0; t < tasks; ++t) one(t);
    return;
  }
  pool->ParallelFor(tasks, one);
}

}  // namespace

uint64_t MomentOffset(StateDType dtype, uint64_t begin) {
  return dtype == StateDType::kInt8 ? begin / kInt8BlockElems * kInt8BlockBytes
                                    : MomentBytes(dtype, begin);
}

std::span<std::byte> MomentRange(StateDType dtype, std::span<std::byte> packed, uint64_t begin,
                                 uint64_t n) {
  return Range(dtype, packed, begin, n);
}

std::span<const std::byte> MomentRange(StateDType dtype, std::span<const std::byte> packed,
                                       uint64_t begin, uint64_t n) {
  return Range(dtype, packed, begin, n);
}

Optimizer::Optimizer(const OptimizerConfig& config, ThreadPool* pool, Isa isa)
    : config_(config), pool_(pool), isa_(isa) {}

Optimizer::~Optimizer() = default;

Result<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config,
                                                     ThreadPool* pool, Isa isa) {
  ZPS_RETURN_IF_ERROR(config.Validate());
  if (!IsaSupported(isa)) {
    return InvalidArgument("optimizer: ISA " + std::string(IsaName(isa)) +
                           " is not supported by this CPU");
  }
  return std::unique_ptr<Optimizer>(new Optimizer(config, pool, isa));
}

Result<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config,
                                                     ThreadPool* pool) {
  ZPS_ASSIGN_OR_RETURN(Isa isa, ActiveIsa());
  return Create(config, pool, isa);
}

Status Optimizer::Update(const ChunkState& state, const GradView& grad,
                         const UpdateParams& params) const {
  ZPS_RETURN_IF_ERROR(CheckGrad(grad));
  const size_t n = grad.n;
  const bool adam = config_.kind != OptimizerKind::kSgd;
  const bool has_momentum = !adam && config_.momentum > 0.0f;
  const StateDType sd = config_.state_dtype;
  ZPS_RETURN_IF_ERROR(CheckLen("master", state.master.size(), n));
  if (adam || has_momentum) ZPS_RETURN_IF_ERROR(CheckMoment("m", sd, state.m.size(), n));
  if (adam) ZPS_RETURN_IF_ERROR(CheckMoment("v", sd, state.v.size(), n));
  if (!params.out16.empty()) ZPS_RETURN_IF_ERROR(CheckLen("out16", params.out16.size(), n));
  if (!params.out32.empty()) ZPS_RETURN_IF_ERROR(CheckLen("out32", params.out32.size(), n));
  const bool out_f32 = params.out_dtype == DType::kF32;
  if (!out_f32 && params.out_dtype != DType::kF16 && params.out_dtype != DType::kBF16) {
    return InvalidArgument("out_dtype must be fp16, bf16 or fp32");
  }
  if (out_f32 ? !params.out16.empty() : !params.out32.empty()) {
    return InvalidArgument(out_f32 ? "out_dtype fp32 writes out32, not out16"
                                   : "out_dtype fp16/bf16 writes out16, not out32");
  }
  const float lr_f = params.lr.value_or(config_.lr);
  const float wd_f = params.weight_decay.value_or(config_.weight_decay);
  if (!std::isfinite(lr_f) || !(lr_f >= 0.0f)) return InvalidArgument("lr must be finite and >= 0");
  if (!std::isfinite(wd_f) || !(wd_f >= 0.0f)) {
    return InvalidArgument("weight_decay must be finite and >= 0");
  }
  if (config_.kind == OptimizerKind::kAdamW && static_cast<double>(lr_f) * wd_f > 1.0) {
    return InvalidArgument("adamw needs lr * weight_decay <= 1");
  }
  if (params.source) {
    ZPS_RETURN_IF_ERROR(CheckLen("source master", params.source->master.size(), n));
    if (adam || has_momentum) {
      ZPS_RETURN_IF_ERROR(CheckMoment("source m", sd, params.source->m.size(), n));
    }
    if (adam) ZPS_RETURN_IF_ERROR(CheckMoment("source v", sd, params.source->v.size(), n));
    auto overlaps = [](auto a, auto b) {
      const auto* pa = reinterpret_cast<const std::byte*>(a.data());
      const auto* pb = reinterpret_cast<const std::byte*>(b.data());
      return pa != nullptr && pb != nullptr && pa < pb + b.size_bytes() && pb < pa + a.size_bytes();
    };
    if (overlaps(params.source->master, state.master) || overlaps(params.source->m, state.m) ||
        overlaps(params.source->v, state.v)) {
      return InvalidArgument("an out-of-place update's source overlaps its state");
    }
  }
  if (!params.out_quant.empty()) {
    ZPS_RETURN_IF_ERROR(ValidateQuantFormat(params.out_quant_format));
    if (kTaskElems % params.out_quant_format.block != 0) {
      return InvalidArgument("out_quant: block " + std::to_string(params.out_quant_format.block) +
                             " does not divide the pass's task of " + std::to_string(kTaskElems));
    }
    const size_t want = QuantizedBytes(params.out_quant_format, n);
    if (params.out_quant.size() != want) {
      return InvalidArgument("out_quant has " + std::to_string(params.out_quant.size()) +
                             " bytes; " + std::to_string(n) + " elements take " +
                             std::to_string(want));
    }
  }
  if (params.step < 1)
    return InvalidArgument("step must be >= 1, got " + std::to_string(params.step));
  if (!std::isfinite(params.grad_scale)) return InvalidArgument("grad_scale must be finite");
  if (n == 0) return Status::Ok();

  KernelArgs a;
  a.kind = config_.kind;
  a.grad_dtype = grad.dtype;
  a.has_out = out_f32 ? !params.out32.empty() : !params.out16.empty();
  a.out_dtype = params.out_dtype;
  // fp32 copies use ordinary stores (the streaming peel assumes 2-byte elements).
  a.stream_out = a.has_out && !out_f32 && n >= kStreamMinElems;
  // Out of place, the destination lines are never read by the pass: without streaming stores
  // each would be read for ownership first (12 bytes of extra traffic per parameter), which
  // measured 2.0x the in-place pass here against 1.2-1.3x with them (zps-bench overlap's
  // "one layer's update" line).
  a.stream_state = params.source.has_value() && n >= kStreamMinElems;
  a.has_momentum = has_momentum;
  a.nesterov = config_.nesterov;
  a.grad = grad.data;
  a.master = state.master.data();
  a.state = sd;
  a.step = params.step;
  a.first_index = params.first_index;
  a.m = (adam || has_momentum) ? state.m.data() : nullptr;
  a.v = adam ? state.v.data() : nullptr;
  a.out = a.has_out && !out_f32 ? params.out16.data() : nullptr;
  a.out32 = a.has_out && out_f32 ? params.out32.data() : nullptr;
  if (params.source) {
    a.src_master = params.source->master.data();
    a.src_m = a.m != nullptr ? params.source->m.data() : nullptr;
    a.src_v = a.v != nullptr ? params.source->v.data() : nullptr;
  }
  a.grad_scale = params.grad_scale;
  a.lr = lr_f;
  a.momentum = config_.momentum;
  // Constants are formed in double and rounded once, so they do not depend on evaluation order.
  const double lr = lr_f, wd = wd_f;
  a.l2 = config_.kind == OptimizerKind::kAdamW ? 0.0f : wd_f;
  a.decay = config_.kind == OptimizerKind::kAdamW ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  a.beta1 = config_.beta1;
  a.beta2 = config_.beta2;
  a.one_minus_beta1 = static_cast<float>(1.0 - config_.beta1);
  a.one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
  a.eps = config_.eps;
  double bc1 = 1.0, bc2 = 1.0;
  if (config_.bias_correction) {
    const auto step = static_cast<double>(params.step);
    bc1 = 1.0 - std::pow(static_cast<double>(config_.beta1), step);
    bc2 = 1.0 - std::pow(static_cast<double>(config_.beta2), step);
  }
  a.step_size = static_cast<float>(lr / bc1);
  a.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));

  const KernelTable& k = KernelsFor(isa_);
  // The quantized copy of each task's range right after its update, while that range's master
  // is still in this core's cache: tasks start at multiples of the block (checked above), so
  // the blocks are the whole call's.
  const QuantFormat qf = params.out_quant_format;
  const bool quant = !params.out_quant.empty();
  ForBlocks(pool_, n, [&](size_t begin, size_t end) {
    k.update_range(a, begin, end);
    if (quant) {
      QuantizeBlocks(qf, state.master.subspan(begin, end - begin),
                     params.out_quant.subspan(begin / qf.block * QuantizedBlockStride(qf),
                                              QuantizedBytes(qf, end - begin)));
    }
  });
  return Status::Ok();
}

Result<GradStats> Optimizer::ComputeGradStats(const GradView& grad, float scale) const {
  ZPS_RETURN_IF_ERROR(CheckGrad(grad));
  if (!std::isfinite(scale)) return InvalidArgument("grad stats: scale must be finite");
  const size_t n = grad.n;
  const size_t tasks = (n + kTaskElems - 1) / kTaskElems;
  std::vector<double> partial(tasks, 0.0);
  const KernelTable& k = KernelsFor(isa_);
  ForBlocks(pool_, n, [&](size_t begin, size_t end) {
    partial[begin / kTaskElems] = k.sum_squares_range(grad.data, grad.dtype, begin, end);
  });
  double raw = 0.0;
  for (double p : partial) raw += p;  // task order, whatever thread computed each
  GradStats stats;
  // A finite fp32 square is at most ~1.2e77, so a finite sum of finite inputs cannot overflow a
  // double: non-finite here means some input was Inf or NaN.
  stats.non_finite = !std::isfinite(raw);
  const double s = scale;
  stats.sum_squares = raw * (s * s);
  return stats;
}

}  // namespace zps::server
