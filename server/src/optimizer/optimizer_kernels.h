// optimizer_kernels.h — internal interface between Optimizer (validation, threading) and the
// per-ISA kernels (optimizer_{scalar,avx2,avx512}.cc).
//
// The driver turns an OptimizerConfig + UpdateParams into KernelArgs (all constants precomputed
// in double and rounded once to float), then calls an ISA's UpdateRange on fixed-size blocks.
// Kernels never allocate, never fail and never look at the thread pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zps/common/dtype.h"
#include "zps/server/optimizer.h"

namespace zps::server::internal {

/// Everything one fused pass needs. Pointers cover the whole chunk; kernels index [begin, end).
struct KernelArgs {
  OptimizerKind kind = OptimizerKind::kAdamW;
  DType grad_dtype = DType::kF32;
  bool has_out = false;  // write the serving copy (`out`, or `out32` when out_dtype is kF32)
  DType out_dtype = DType::kBF16;
  bool stream_out = false;    // non-temporal stores for the copy (large chunks only)
  bool stream_state = false;  // non-temporal stores for master, m, v (out of place, large only)
  bool has_momentum = false;  // SGD: momentum > 0 (m is read and written)
  bool nesterov = false;
  // How m and v are packed (zps/server/optimizer.h): fp32 (float*), bf16 (uint16_t*) or int8
  // (blocks of kInt8BlockBytes, the first at element 0 of the call).
  StateDType state = StateDType::kF32;
  int64_t step = 1;          // bf16: the step, which advances v's rounding dither (SrOffset)
  uint64_t first_index = 0;  // bf16: the layout index of element 0 (UpdateParams::first_index)

  const void* grad = nullptr;
  float* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  uint16_t* out = nullptr;
  float* out32 = nullptr;
  // Out of place (UpdateParams::source): master, m, v are read here and written above. Null:
  // in place.
  const float* src_master = nullptr;
  const void* src_m = nullptr;
  const void* src_v = nullptr;

  float grad_scale = 1.0f;
  // Adam/AdamW:
  //   g' = g*grad_scale (+ l2*p for kAdam);  m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2
  //   p  = p*decay - step_size * m / (sqrt(v)*inv_sqrt_bc2 + eps)
  float beta1 = 0.9f, one_minus_beta1 = 0.1f;
  float beta2 = 0.999f, one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float l2 = 0.0f;            // coupled weight decay (kAdam, kSgd); 0 for kAdamW
  float decay = 1.0f;         // decoupled: 1 - lr*weight_decay (kAdamW); 1 otherwise
  float step_size = 1e-3f;    // lr / (1 - beta1^step), or lr without bias correction
  float inv_sqrt_bc2 = 1.0f;  // 1 / sqrt(1 - beta2^step), or 1
  // SGD: g' = g*grad_scale + l2*p;  buf = momentum*buf + g';  d = nesterov ? g' + momentum*buf :
  // buf
  //      p = p - lr*d   (momentum == 0: p = p - lr*g')
  float lr = 1e-3f;
  float momentum = 0.0f;
};

/// Elements per statistics block: each block's squares are summed in double lanes and reduced
/// to one double in a fixed order; blocks are then added in index order.
inline constexpr size_t kStatsBlock = 4096;

/// One ISA's kernels.
struct KernelTable {
  /// Updates elements [begin, end) in place. `begin` must be a multiple of 64 (of
  /// kInt8BlockElems: a tile of the packed pass starts on an int8 block).
  void (*update_range)(const KernelArgs& args, size_t begin, size_t end);
  /// Sum over [begin, end) of double(g)^2 for raw (unscaled) gradient elements, computed as
  /// consecutive kStatsBlock blocks whose sums are added in order. `begin` must be a multiple of
  /// kStatsBlock. Inf/NaN inputs make the result non-finite (squares of finite fp32 values are
  /// exact in double and cannot overflow), which is how the non-finite flag is derived.
  double (*sum_squares_range)(const void* grad, DType dtype, size_t begin, size_t end);
};

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

}  // namespace zps::server::internal
