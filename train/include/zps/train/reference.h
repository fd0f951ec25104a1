// zps/train/reference.h — the in-process reference trainer: the whole zps step, with no server.
//
// It holds every parameter's fp32 master, Adam m and v (packed in the optimizer's state dtype,
// MomentBytes over the flat space: chunk c's are MomentRange(begin_c, n_c)), and the 16-bit
// serving copy in the flat chunked space of zps/common/layout.h, and runs a synchronous step for a
// world of W ranks with the very same model code and optimizer kernels as the distributed path. The
// distributed run (W workers, S shards, server-sum) must end bit-identical to it.
//
// One Step(), in this exact order (what the workers, shards and coordinator must mirror):
//   1. loss_scale = (float) commit.loss_scale()  (1 unless dynamic loss scaling).
//   2. For rank r = 0..W-1, in order: Model::TrainStep(batch_r, loss_scale) with parameters read
//      from the serving copy (16-bit -> fp32, exact). Each pushed grad (fp32, loss-scaled) is
//      stored at the parameter's flat offset in the push dtype (fp32 copy, or rounded to fp16 /
//      bf16 to nearest even with ConvertF32ToF16 / ConvertF32ToBF16). Forced overflow: at step
//      `inject_overflow_step`, rank 0's grad of param 0 (tok_emb) has element 0 replaced by +Inf
//      before conversion. Padding between parameters is never pushed and counts as 0.
//   3. Reduce, per chunk, in rank order in fp32: acc = float(g_0) (a copy, not 0 + g_0, which
//      would turn -0 into +0); then acc += float(g_r) for r = 1..W-1, element by element.
//   4. Per chunk c in chunk order: report_c = Optimizer::ComputeGradStats({acc_c, fp32}, 1.0f)
//      over the whole chunk (padding included, which is 0).
//   5. decision = StepCommit::Decide(reports in chunk-id order).
//   6. If skipped: nothing changes (master, m, v, serving, optimizer step count). Otherwise
//      optimizer_step += 1 (1-based count of applied updates) and per chunk:
//      Optimizer::Update({master_c, m_c, v_c}, {acc_c, fp32},
//                        {optimizer_step, decision.grad_scale, serving_dtype, serving_c,
//                         lr = LrSchedule(lr_schedule).LrFor(optimizer_step - 1, optimizer.lr),
//                         first_index = begin_c}).
//   7. step += 1 (the version the next fetches ask for).
// Initial state: master = InitParam(decl, model seed) at each parameter's offset, padding 0;
// m = v = 0; serving = ConvertF32ToBF16 (or ToF16, or a copy for fp32) of the whole master.
// Quantized weights (ReferenceOptions::quantized_weights_block): the serving copy is instead
// QuantizeBlocks of each chunk's master (int8 blocks from the chunk's start), made at start and
// after each chunk's update in 6 (which then writes no 16-bit copy); step 2 reads the parameters
// as DequantizeRange of their pieces' covering blocks.
//
// Thread-safety: not thread-safe; one thread drives a ReferenceTrainer. The optimizer may use the
// ThreadPool passed to Create (results do not depend on its size).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "zps/common/block_quant.h"
#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/common/thread_pool.h"
#include "zps/server/lr_schedule.h"
#include "zps/server/optimizer.h"
#include "zps/server/step_commit.h"
#include "zps/train/model.h"

namespace zps::train {

struct ReferenceOptions {
  LayoutOptions layout;                // Default: LayoutOptions defaults. Must match the shards'.
  server::OptimizerConfig optimizer;   // Default: AdamW, lr 1e-3.
  server::CommitConfig commit;         // Default: no clipping, no loss scaling, divisor 1.
  int world = 1;                       // Default: 1. Ranks per step.
  DType serving_dtype = DType::kBF16;  // Default: bf16. kF16, kBF16 or kF32 (a copy of master).
  DType grad_dtype = DType::kF32;      // Default: fp32. Push dtype: kF32, kF16, kBF16, or
                                       // kI8Block / kI4Block (quantized, with error feedback).
  /// Quantized gradients: each rank's residuals are zeroed after every step s with
  /// (s + 1) % this == 0, as the workers do at the steps the shards checkpoint (their
  /// --checkpoint-every; docs/checkpoints.md). Default: 0 = never.
  int64_t residual_reset_every = 0;
  bool grad_error_feedback = true;  // Default: true. false: as WorkerOptions::grad_error_feedback.
  /// The servers' lr schedule (one group: optimizer.lr). Default: none.
  server::LrScheduleConfig lr_schedule;
  int64_t inject_overflow_step = -1;  // Default: -1 = never. 0-based step index.
  /// Quantized weights (issue 27, item 1): 0 = off; otherwise the serving copy is int8 blocks of
  /// this many elements (zps/common/block_quant.h), each chunk's blocks starting at the chunk's
  /// start, made from the master after each update and dequantized to fp32 by Acquire and
  /// Evaluate. Default: 0 = off (the serving copy in serving_dtype).
  uint32_t quantized_weights_block = 0;

  Status Validate() const;
};

struct ReferenceStepResult {
  double loss = 0.0;                // mean over ranks (rank losses summed in rank order) / W
  std::vector<double> rank_loss;    // per rank
  server::CommitDecision decision;  // the commit of this step
  int64_t tokens = 0;               // tokens processed over all ranks
};

class ViewBuffers;

class ReferenceTrainer {
 public:
  /// Errors: InvalidArgument from the model config, options or layout; from Optimizer::Create.
  /// `pool` may be null; it must outlive the trainer.
  static Result<std::unique_ptr<ReferenceTrainer>> Create(const ModelConfig& model,
                                                          const ReferenceOptions& options,
                                                          ThreadPool* pool);
  ~ReferenceTrainer();
  ReferenceTrainer(const ReferenceTrainer&) = delete;
  ReferenceTrainer& operator=(const ReferenceTrainer&) = delete;

  /// One synchronous step (see the header comment). batches[r] is rank r's micro-batch of
  /// `batch` rows (Model::TrainStep layout). Errors: InvalidArgument when batches.size() != world
  /// or a batch is malformed; errors of the model or the optimizer (state is unchanged if the
  /// failure happens before the update phase).
  Result<ReferenceStepResult> Step(std::span<const std::span<const uint8_t>> batches, int batch);

  /// Mean loss of `tokens` under the current serving copy. Errors: as Model::Evaluate.
  Result<double> Evaluate(std::span<const uint8_t> tokens, int batch);

  const Layout& layout() const { return layout_; }
  Model& model() { return *model_; }
  int64_t step() const { return step_; }                      // Step() calls so far
  int64_t optimizer_step() const { return optimizer_step_; }  // applied updates so far
  double loss_scale() const { return commit_.loss_scale(); }

  /// Whole flat-space state (total_elems long), for comparisons with shards.
  std::span<const float> master() const { return master_; }
  /// m and v packed in the optimizer's state dtype (MomentBytes(state_dtype, total_elems)).
  std::span<const std::byte> m() const { return m_; }
  std::span<const std::byte> v() const { return v_; }
  /// The serving copy: ServingWords() 16-bit words per element (2 for fp32, little-endian).
  /// Empty with quantized weights (see quantized_serving()).
  std::span<const uint16_t> serving() const { return serving_; }
  /// With quantized weights: chunk c's int8 blocks start at c * QuantizedBytes(format,
  /// chunk_elems); empty otherwise.
  std::span<const std::byte> quantized_serving() const { return qserving_; }
  /// The fp32 master of one parameter. Errors: OutOfRange for a bad id.
  Result<std::vector<float>> ParamMaster(uint32_t id) const;
  /// CRC32C over master, m, v and serving of chunk c, in that order. Errors: OutOfRange.
  Result<uint32_t> ChunkCrc(uint32_t c) const;

 private:
  class Access;
  ReferenceTrainer(Layout layout, const ReferenceOptions& options);

  Layout layout_;
  ReferenceOptions options_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<server::Optimizer> optimizer_;
  server::StepCommit commit_;
  std::vector<float> master_, acc_, widened_;
  std::vector<std::byte> m_, v_;     // packed (MomentBytes over the flat space)
  std::vector<uint16_t> serving_;    // ServingWords() 16-bit words per element
  std::vector<std::byte> qserving_;  // quantized weights: per chunk, QuantStride() bytes apart
  bool Quantized() const { return options_.quantized_weights_block != 0; }
  QuantFormat QuantWeights() const { return {8, options_.quantized_weights_block}; }
  size_t QuantStride() const {
    return QuantizedBytes(QuantWeights(), layout_.options().chunk_elems);
  }
  /// Chunk c's bytes of qserving_.
  std::span<std::byte> QuantChunk(uint32_t c);
  std::span<const std::byte> QuantChunk(uint32_t c) const;
  /// Rewrites chunk c's int8 copy from its master.
  void Requantize(uint32_t c);
  /// The fp32 values of parameter `id` from the int8 copy. Errors: from Layout::Pieces.
  Status DequantizeParam(uint32_t id, std::span<float> out) const;
  size_t ServingWords() const { return DTypeSize(options_.serving_dtype) / 2; }
  std::vector<std::byte> rank_grad_;  // one rank's pushes, in grad_dtype, total_elems long
  // Quantized gradients: per rank, its error-feedback residuals over the flat space (what the
  // rank's Client keeps per parameter).
  std::vector<std::vector<float>> residual_;
  std::unique_ptr<ViewBuffers> views_;  // what Access's views point into, reused step to step
  int64_t step_ = 0;
  int64_t optimizer_step_ = 0;
};

}  // namespace zps::train
