#include "zps/train/reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "view_buffers.h"
#include "zps/common/crc32c.h"
#include "zps/common/grad_quant.h"

namespace zps::train {

Status ReferenceOptions::Validate() const {
  if (world < 1 || world > (1 << 16))
    return InvalidArgument("reference: world must be in [1, 65536]");
  if (serving_dtype != DType::kF32 && serving_dtype != DType::kF16 && serving_dtype != DType::kBF16)
    return InvalidArgument("reference: serving_dtype must be fp16, bf16 or fp32");
  if (inject_overflow_step < -1) return InvalidArgument("reference: inject_overflow_step >= -1");
  if (quantized_weights_block != 0) {
    Status q = ValidateQuantFormat({8, quantized_weights_block});
    if (!q.ok()) return InvalidArgument("reference: quantized_weights_block: " + q.message());
  }
  ZPS_RETURN_IF_ERROR(lr_schedule.Validate());
  ZPS_RETURN_IF_ERROR(optimizer.Validate());
  return commit.Validate();
}

// ParamAccess over the serving copy; pushes land in the trainer's per-rank gradient buffer.
class ReferenceTrainer::Access : public ParamAccess {
 public:
  Access(ReferenceTrainer& t, bool inject_overflow, int rank = 0)
      : t_(t), inject_(inject_overflow), rank_(rank) {}

  Result<std::vector<std::span<const float>>> Acquire(
      std::span<const uint32_t> param_ids) override {
    std::vector<std::span<const float>> out;
    out.reserve(param_ids.size());
    for (uint32_t id : param_ids) {
      if (id >= t_.layout_.num_params())
        return OutOfRange("reference: param id " + std::to_string(id) + " out of range");
    }
    for (uint32_t id : param_ids) {
      const uint64_t off = t_.layout_.param_offset(id), n = t_.layout_.param_numel(id);
      if (!t_.Quantized() && t_.options_.serving_dtype == DType::kF32) {
        // The fp32 serving copy is the view: nothing to convert.
        out.emplace_back(reinterpret_cast<const float*>(t_.serving_.data()) + off, n);
        continue;
      }
      const std::span<float> buf = t_.views_->Get(id, n);
      if (t_.Quantized()) {
        ZPS_RETURN_IF_ERROR(t_.DequantizeParam(id, buf));
        out.emplace_back(buf);
        continue;
      }
      const std::span<const uint16_t> src(t_.serving_.data() + off, n);
      if (t_.options_.serving_dtype == DType::kBF16) {
        ConvertBF16ToF32(src, buf);
      } else {
        ConvertF16ToF32(src, buf);
      }
      out.emplace_back(buf);
    }
    return out;
  }

  void Release(std::span<const uint32_t> param_ids) override { t_.views_->Drop(param_ids); }

  Status PushGrad(uint32_t param_id, std::span<const float> grad) override {
    if (param_id >= t_.layout_.num_params())
      return OutOfRange("reference: param id " + std::to_string(param_id) + " out of range");
    const uint64_t off = t_.layout_.param_offset(param_id), n = t_.layout_.param_numel(param_id);
    if (grad.size() != n)
      return InvalidArgument("reference: grad of " + t_.layout_.spec(param_id).name + " has " +
                             std::to_string(grad.size()) + " elements, expected " +
                             std::to_string(n));
    std::vector<float> injected;
    if (inject_ && param_id == 0) {
      injected.assign(grad.begin(), grad.end());
      injected[0] = std::numeric_limits<float>::infinity();
      grad = injected;
    }
    if (IsBlockQuantized(t_.options_.grad_dtype)) return PushQuantized(param_id, off, grad);
    std::byte* base = t_.rank_grad_.data();
    switch (t_.options_.grad_dtype) {
      case DType::kF32:
        std::memcpy(reinterpret_cast<float*>(base) + off, grad.data(), n * sizeof(float));
        break;
      case DType::kF16:
        ConvertF32ToF16(grad, {reinterpret_cast<uint16_t*>(base) + off, n});
        break;
      case DType::kBF16:
        ConvertF32ToBF16(grad, {reinterpret_cast<uint16_t*>(base) + off, n});
        break;
      case DType::kI8Block:  // PushQuantized, above
      case DType::kI4Block:
        return Internal("reference: a block-quantized gradient reached the 16-bit path");
    }
    return Status::Ok();
  }

 private:
  // As the rank's Client pushes it (worker/src/grad_residual.h): each piece quantized with the
  // rank's residual, blocks from the piece's start; what lands is its dequantized value.
  Status PushQuantized(uint32_t param_id, uint64_t off, std::span<const float> grad) {
    const DType gd = t_.options_.grad_dtype;
    const QuantFormat f = GradQuantFormat(gd);
    ZPS_ASSIGN_OR_RETURN(auto pieces, t_.layout_.Pieces(param_id));
    std::span<float> r(t_.residual_[static_cast<size_t>(rank_)].data() + off, grad.size());
    if (!t_.options_.grad_error_feedback) std::fill(r.begin(), r.end(), 0.0f);
    std::vector<std::byte> encoded;
    for (const Piece& p : pieces) {
      encoded.resize(PushBytes(gd, p.length));
      QuantizeWithResidual(f, grad.subspan(p.param_offset, p.length),
                           r.subspan(p.param_offset, p.length), encoded);
      DequantizeBlocks(f, encoded, {t_.widened_.data() + off + p.param_offset, p.length});
    }
    return Status::Ok();
  }

  ReferenceTrainer& t_;
  bool inject_;
  int rank_;
};

ReferenceTrainer::ReferenceTrainer(Layout layout, const ReferenceOptions& options)
    : layout_(std::move(layout)),
      options_(options),
      commit_(options.commit),
      views_(std::make_unique<ViewBuffers>()) {}

ReferenceTrainer::~ReferenceTrainer() = default;

Result<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(const ModelConfig& model,
                                                                   const ReferenceOptions& options,
                                                                   ThreadPool* pool) {
  ZPS_RETURN_IF_ERROR(options.Validate());
  ZPS_ASSIGN_OR_RETURN(auto m, Model::Create(model));
  ZPS_ASSIGN_OR_RETURN(auto layout, Layout::Build(LayoutSpecs(m->decls()), options.layout));
  ZPS_ASSIGN_OR_RETURN(auto opt, server::Optimizer::Create(options.optimizer, pool));
  std::unique_ptr<ReferenceTrainer> t(new ReferenceTrainer(std::move(layout), options));
  t->model_ = std::move(m);
  t->optimizer_ = std::move(opt);
  const size_t total = t->layout_.total_elems();
  t->master_.assign(total, 0.0f);
  // Zeroed bytes are zero moments in every state dtype.
  const uint64_t moment = server::MomentBytes(options.optimizer.state_dtype, total);
  t->m_.assign(moment, std::byte{0});
  t->v_.assign(moment, std::byte{0});
  t->acc_.assign(total, 0.0f);
  if (t->Quantized()) {
    t->qserving_.assign(t->QuantStride() * t->layout_.num_chunks(), std::byte{0});
  } else {
    t->serving_.assign(total * t->ServingWords(), 0);
  }
  t->rank_grad_.assign(total * DTypeSize(options.grad_dtype), std::byte{0});
  if (options.grad_dtype != DType::kF32) t->widened_.assign(total, 0.0f);
  if (IsBlockQuantized(options.grad_dtype)) {
    t->residual_.assign(static_cast<size_t>(options.world), std::vector<float>(total, 0.0f));
  }
  const auto& decls = t->model_->decls();
  for (uint32_t id = 0; id < decls.size(); ++id) {
    ZPS_RETURN_IF_ERROR(
        InitParam(decls[id], model.seed,
                  {t->master_.data() + t->layout_.param_offset(id), t->layout_.param_numel(id)}));
  }
  if (t->Quantized()) {
    for (uint32_t c = 0; c < t->layout_.num_chunks(); ++c) t->Requantize(c);
  } else if (options.serving_dtype == DType::kF32) {
    std::memcpy(t->serving_.data(), t->master_.data(), total * sizeof(float));
  } else if (options.serving_dtype == DType::kBF16) {
    ConvertF32ToBF16(t->master_, t->serving_);
  } else {
    ConvertF32ToF16(t->master_, t->serving_);
  }
  return t;
}

Result<ReferenceStepResult> ReferenceTrainer::Step(
    std::span<const std::span<const uint8_t>> batches, int batch) {
  const int world = options_.world;
  if (batches.size() != static_cast<size_t>(world))
    return InvalidArgument("reference: " + std::to_string(batches.size()) +
                           " micro-batches for a world of " + std::to_string(world));
  ReferenceStepResult res;
  const float loss_scale = static_cast<float>(commit_.loss_scale());
  const size_t total = layout_.total_elems();
  const DType gd = options_.grad_dtype;
  // 2 + 3: ranks in order; each rank's pushes are reduced into acc_ before the next rank runs.
  for (int r = 0; r < world; ++r) {
    std::memset(rank_grad_.data(), 0, rank_grad_.size());  // padding is never pushed: 0
    const bool quantized = IsBlockQuantized(gd);
    if (quantized) std::fill(widened_.begin(), widened_.end(), 0.0f);
    Access access(*this, step_ == options_.inject_overflow_step && r == 0, r);
    ZPS_ASSIGN_OR_RETURN(
        auto out, model_->TrainStep(batches[static_cast<size_t>(r)], batch, loss_scale, access));
    res.rank_loss.push_back(out.loss);
    res.tokens += out.tokens;
    // Widen this rank's pushes to fp32 (exact), then acc = g_0 or acc += g_r.
    const float* g = reinterpret_cast<const float*>(rank_grad_.data());
    if (quantized) {
      g = widened_.data();  // the dequantized pushes (Access::PushQuantized)
    } else if (gd != DType::kF32) {
      const std::span<const uint16_t> g16(reinterpret_cast<const uint16_t*>(rank_grad_.data()),
                                          total);
      if (gd == DType::kF16) {
        ConvertF16ToF32(g16, widened_);
      } else {
        ConvertBF16ToF32(g16, widened_);
      }
      g = widened_.data();
    }
    if (r == 0) {
      std::memcpy(acc_.data(), g, total * sizeof(float));
    } else {
      for (size_t i = 0; i < total; ++i) acc_[i] += g[i];
    }
  }
  double loss_sum = 0.0;
  for (double l : res.rank_loss) loss_sum += l;
  res.loss = loss_sum / world;

  // 4: per-chunk statistics, in chunk order.
  const uint32_t chunks = layout_.num_chunks();
  const uint64_t chunk_elems = layout_.options().chunk_elems;
  std::vector<server::ChunkReport> reports(chunks);
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint64_t begin = static_cast<uint64_t>(c) * chunk_elems, n = layout_.chunk_size(c);
    ZPS_ASSIGN_OR_RETURN(auto stats,
                         optimizer_->ComputeGradStats({acc_.data() + begin, DType::kF32, n}, 1.0f));
    reports[c] = {stats.sum_squares, stats.non_finite};
  }
  // 5: the commit.
  res.decision = commit_.Decide(reports);
  // 6: the update.
  if (!res.decision.skip) {
    ++optimizer_step_;
    const server::LrSchedule schedule(options_.lr_schedule);
    const float lr = schedule.LrFor(optimizer_step_ - 1, options_.optimizer.lr);
    for (uint32_t c = 0; c < chunks; ++c) {
      const uint64_t begin = static_cast<uint64_t>(c) * chunk_elems, n = layout_.chunk_size(c);
      const StateDType sd = options_.optimizer.state_dtype;
      server::ChunkState st{{master_.data() + begin, n},
                            server::MomentRange(sd, std::span<std::byte>(m_), begin, n),
                            server::MomentRange(sd, std::span<std::byte>(v_), begin, n)};
      server::UpdateParams up;
      up.first_index = begin;  // bf16 state's rounding: the element's index, as on the shards
      up.step = optimizer_step_;
      up.grad_scale = res.decision.grad_scale;
      up.out_dtype = options_.serving_dtype;
      up.lr = lr;
      if (Quantized()) {
        // The int8 copy is made from the updated master below; the update writes no copy.
      } else if (options_.serving_dtype == DType::kF32) {
        up.out32 = {reinterpret_cast<float*>(serving_.data()) + begin, n};
      } else {
        up.out16 = {serving_.data() + begin, n};
      }
      ZPS_RETURN_IF_ERROR(optimizer_->Update(st, {acc_.data() + begin, DType::kF32, n}, up));
      if (Quantized()) Requantize(c);
    }
  }
  if (!residual_.empty() && options_.residual_reset_every > 0 &&
      (step_ + 1) % options_.residual_reset_every == 0) {
    for (auto& r : residual_) std::fill(r.begin(), r.end(), 0.0f);
  }
  ++step_;
  return res;
}

Result<double> ReferenceTrainer::Evaluate(std::span<const uint8_t> tokens, int batch) {
  Access access(*this, false);
  return model_->Evaluate(tokens, batch, access);
}

Result<std::vector<float>> ReferenceTrainer::ParamMaster(uint32_t id) const {
  if (id >= layout_.num_params()) return OutOfRange("reference: param id out of range");
  const auto* p = master_.data() + layout_.param_offset(id);
  return std::vector<float>(p, p + layout_.param_numel(id));
}

Result<uint32_t> ReferenceTrainer::ChunkCrc(uint32_t c) const {
  if (c >= layout_.num_chunks()) return OutOfRange("reference: chunk out of range");
  const uint64_t begin = static_cast<uint64_t>(c) * layout_.options().chunk_elems;
  const uint64_t n = layout_.chunk_size(c);
  const StateDType sd = options_.optimizer.state_dtype;
  uint32_t crc = Crc32c(master_.data() + begin, n * sizeof(float));
  crc = Crc32cExtend(crc, server::MomentRange(sd, std::span<const std::byte>(m_), begin, n));
  crc = Crc32cExtend(crc, server::MomentRange(sd, std::span<const std::byte>(v_), begin, n));
  if (Quantized()) return Crc32cExtend(crc, QuantChunk(c));
  const size_t w = ServingWords();
  crc = Crc32cExtend(crc,
                     std::as_bytes(std::span<const uint16_t>(serving_.data() + begin * w, n * w)));
  return crc;
}

std::span<std::byte> ReferenceTrainer::QuantChunk(uint32_t c) {
  return {qserving_.data() + c * QuantStride(),
          QuantizedBytes(QuantWeights(), layout_.chunk_size(c))};
}

std::span<const std::byte> ReferenceTrainer::QuantChunk(uint32_t c) const {
  return const_cast<ReferenceTrainer*>(this)->QuantChunk(c);
}

void ReferenceTrainer::Requantize(uint32_t c) {
  const uint64_t begin = static_cast<uint64_t>(c) * layout_.options().chunk_elems;
  QuantizeBlocks(QuantWeights(), {master_.data() + begin, layout_.chunk_size(c)}, QuantChunk(c));
}

Status ReferenceTrainer::DequantizeParam(uint32_t id, std::span<float> out) const {
  // A piece is a run at any offset inside its chunk: dequantize its covering blocks' range.
  ZPS_ASSIGN_OR_RETURN(std::vector<Piece> pieces, layout_.Pieces(id));
  for (const Piece& p : pieces) {
    const QuantRange r = QuantizedCovering(QuantWeights(), layout_.chunk_size(p.chunk),
                                           p.chunk_offset, p.chunk_offset + p.length);
    DequantizeRange(QuantWeights(), QuantChunk(p.chunk).subspan(r.offset, r.bytes), r.skip,
                    p.length, DequantTarget::kF32, out.data() + p.param_offset);
  }
  return Status::Ok();
}

}  // namespace zps::train
