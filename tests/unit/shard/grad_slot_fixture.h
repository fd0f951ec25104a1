// grad_slot_fixture.h — the jobs and pushes of the gradient-slot tests that compare a job whose
// pushes arrive in a narrow dtype with an fp32 job fed the widened values
// (shard_state_grad16_test.cc, shard_state_quantized_grads_test.cc): the case table's row, a
// 1-shard layout with a frozen parameter, the job of a case, its contributor slots and the
// initial values; a push is shard_steps.h's, the comparison of two shards' chunk CRCs
// state_crcs.h's.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "shard_steps.h"
#include "state_crcs.h"
#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {

/// One job of a parameterized gradient-slot test: the pushes' dtype, the reduction, the world
/// size, the accumulation steps and the update mode.
struct GradSlotCase {
  DType dtype;
  ReductionMode mode;
  uint32_t world;
  uint32_t accum;
  UpdateMode update;

  /// The gtest name of the case, e.g. "fp16_sum_w3_k1_sync" or "int8_prereduced_w1_k3_sync".
  std::string Name() const {
    const std::string d = dtype == DType::kI8Block   ? "int8"
                          : dtype == DType::kI4Block ? "int4"
                                                     : std::string(DTypeName(dtype));
    return d + "_" + (mode == ReductionMode::kServerSum ? "sum" : "prereduced") + "_w" +
           std::to_string(world) + "_k" + std::to_string(accum) + "_" +
           (update == UpdateMode::kSync ? "sync" : "speculative");
  }
};

/// The parameter that GradSlotJob freezes: never pushed after the initial values.
inline constexpr uint32_t kFrozenParam = 2;

/// 1 shard, chunks of `chunk_elems`: a {a_elems}, b {3, 300}, c {700} (frozen), d {10},
/// e {e_elems}. With a and e longer than a chunk, parameters cross chunks, and chunks end in
/// padding.
inline Layout GradSlotLayout(int64_t a_elems, int64_t e_elems, uint32_t chunk_elems) {
  auto l = Layout::Build(
      {{"a", {a_elems}}, {"b", {3, 300}}, {"c", {700}}, {"d", {10}}, {"e", {e_elems}}},
      {.chunk_elems = chunk_elems, .align_elems = 64, .num_shards = 1});
  EXPECT_THAT(l, IsOk());
  return *l;
}

/// The job of case `c` with its pushes in `grad` (the case's dtype, or fp32 for the reference
/// job): bf16 serving copy, parameter c frozen.
inline ShardJob GradSlotJob(const GradSlotCase& c, DType grad) {
  ShardJob job{c.mode, c.world, grad, DType::kBF16};
  job.accumulation_steps = c.accum;
  job.frozen = {0, 0, 1, 0, 0};
  job.update_mode = c.update;
  return job;
}

/// Contributors whose pushes a step waits for: one slot per contributor (server-sum) or per
/// micro-batch (pre-reduced: the ranks push disjoint slices; these tests push them all as rank 0's
/// micro-batches).
inline uint32_t GradSlots(const GradSlotCase& c) {
  return (c.mode == ReductionMode::kServerSum ? c.world : 1) * c.accum;
}

/// Pushes the same initial values, drawn from N(0, 0.5) with `rng`, as fp32 into every state.
inline Status PushInitialValues(const Layout& layout, std::mt19937& rng,
                                std::initializer_list<ShardState*> states) {
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    ZPS_ASSIGN_OR_RETURN(auto pieces, layout.Pieces(p));
    for (const Piece& piece : pieces) {
      std::vector<float> v(piece.length);
      std::normal_distribution<float> dist(0.0f, 0.5f);
      for (auto& x : v) x = dist(rng);
      for (ShardState* s : states) {
        ZPS_RETURN_IF_ERROR(
            Push(*s, {kInitStep, piece.chunk, piece.chunk_offset, piece.length, 0, DType::kF32},
                 v.data()));
      }
    }
  }
  return Status::Ok();
}

/// A piece of a parameter, with the parameter's id.
struct ParamPiece {
  uint32_t param;
  Piece piece;
};

/// The pieces of every parameter but the frozen one, in parameter order: what a step pushes.
inline std::vector<ParamPiece> TrainedPieces(const Layout& layout) {
  std::vector<ParamPiece> out;
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    if (p == kFrozenParam) continue;
    auto pieces = layout.Pieces(p);
    EXPECT_THAT(pieces, IsOk());
    if (!pieces.ok()) continue;
    for (const Piece& piece : *pieces) out.push_back({p, piece});
  }
  return out;
}

}  // namespace zps::server::testing
