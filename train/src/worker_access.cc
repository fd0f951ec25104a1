#include "zps/train/worker_access.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "view_buffers.h"

namespace zps::train {

WorkerAccess::~WorkerAccess() = default;

WorkerAccess::WorkerAccess(worker::Client* client, const worker::PrefetchOptions& prefetch,
                           worker::Collectives* reduce, uint64_t bucket_elems)
    : client_(client),
      prefetcher_(client, prefetch),
      views_(std::make_unique<ViewBuffers>()),
      reduce_(reduce),
      bucket_elems_(bucket_elems) {
  if (reduce_ != nullptr) {
    // Ranks whose buckets differ get an error naming the bucket and the sizes, not a transport
    // that aborts (zps/worker/checked_collectives.h).
    checked_ = std::make_unique<worker::CheckedCollectives>(
        reduce_, [this](const worker::CollectiveOp& op) {
          return "gradient bucket " + std::to_string(op.id) + " of step " + std::to_string(step_);
        });
  }
}

Status WorkerAccess::FlushGradients() {
  if (reduce_ == nullptr || entries_.empty()) return Status::Ok();
  if (skip_bucket_ && skip_bucket_(step_, buckets_)) {
    ++buckets_;
    bucket_.clear();
    entries_.clear();
    return Status::Ok();
  }
  ZPS_RETURN_IF_ERROR(checked_->ReduceScatter(buckets_++, bucket_));
  const worker::SliceRange mine =
      worker::RankSlice(bucket_.size(), reduce_->world_size(), reduce_->rank());
  const uint64_t mine_end = mine.begin + mine.length;
  for (const BucketEntry& e : entries_) {
    // The part of this parameter inside this rank's slice of the bucket: one contiguous range.
    const uint64_t b = std::max(e.offset, mine.begin);
    const uint64_t end = std::min(e.offset + e.numel, mine_end);
    if (b >= end) continue;
    ZPS_RETURN_IF_ERROR(client_->PushGradRange(
        e.param, step_, b - e.offset, std::span<const float>(bucket_).subspan(b, end - b)));
    if (after_slice_) after_slice_(step_, ++slices_);
  }
  bucket_.clear();
  entries_.clear();
  return Status::Ok();
}

void WorkerAccess::BeginStep(int64_t step, bool inject_overflow) {
  step_ = step;
  buckets_ = 0;
  pushes_ = 0;
  slices_ = 0;
  bucket_.clear();  // left over from a failed step
  entries_.clear();
  inject_ = inject_overflow;
  prefetcher_.BeginStep(step);
}

Result<std::vector<std::span<const float>>> WorkerAccess::Acquire(std::span<const uint32_t> ids) {
  ZPS_ASSIGN_OR_RETURN(auto buffers, prefetcher_.Acquire(ids));
  std::vector<std::span<const float>> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto& b = *buffers[i];
    const size_t n = b.bytes().size() / DTypeSize(b.dtype);
    if (b.dtype == DType::kF32) {
      // An fp32 serving copy (the master's bits) or dequantized int8 weights: viewed in place.
      out.emplace_back(reinterpret_cast<const float*>(b.bytes().data()), n);
      views_->Keep(ids[i], std::move(buffers[i]));
      continue;
    }
    const std::span<float> view = views_->Get(ids[i], n);
    std::span<const uint16_t> src(reinterpret_cast<const uint16_t*>(b.bytes().data()), n);
    if (b.dtype == DType::kBF16)
      ConvertBF16ToF32(src, view);
    else
      ConvertF16ToF32(src, view);
    out.emplace_back(view);
  }
  return out;
}

void WorkerAccess::Release(std::span<const uint32_t> ids) {
  views_->Drop(ids);
  prefetcher_.Release(ids);
}

Status WorkerAccess::PushGrad(uint32_t param_id, std::span<const float> grad) {
  Status s = PushGradNow(param_id, grad);
  if (s.ok() && after_push_) after_push_(step_, ++pushes_);
  return s;
}

Status WorkerAccess::PushGradNow(uint32_t param_id, std::span<const float> grad) {
  if (reduce_ != nullptr) {
    // pre-reduced: into the bucket; a full bucket is summed over the ranks and this rank pushes
    // its slice of it.
    const uint64_t offset = bucket_.size();
    bucket_.insert(bucket_.end(), grad.begin(), grad.end());
    if (inject_ && param_id == 0 && !grad.empty()) {
      bucket_[offset] = std::numeric_limits<float>::infinity();
    }
    entries_.push_back({param_id, offset, grad.size()});
    if (bucket_.size() >= bucket_elems_) return FlushGradients();
    return Status::Ok();
  }
  if (inject_ && param_id == 0 && !grad.empty()) {
    std::vector<float> copy(grad.begin(), grad.end());
    copy[0] = std::numeric_limits<float>::infinity();
    return client_->PushGrad(param_id, step_, copy);
  }
  return client_->PushGrad(param_id, step_, grad);
}

}  // namespace zps::train
