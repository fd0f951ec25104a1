#include "zps/train/worker_access.h"

#include <cstring>
#include <limits>

namespace zps::train {

WorkerAccess::WorkerAccess(worker::Client* client, const worker::PrefetchOptions& prefetch,
                           worker::Collectives* reduce)
    : client_(client), prefetcher_(client, prefetch), reduce_(reduce) {}

void WorkerAccess::BeginStep(int64_t step, bool inject_overflow) {
  step_ = step;
  inject_ = inject_overflow;
  prefetcher_.BeginStep(step);
}

Result<std::vector<std::span<const float>>> WorkerAccess::Acquire(std::span<const uint32_t> ids) {
  ZPS_ASSIGN_OR_RETURN(auto buffers, prefetcher_.Acquire(ids));
  std::vector<std::span<const float>> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto& b = *buffers[i];
    std::vector<float>& view = views_[ids[i]];
    const size_t n = b.bytes().size() / DTypeSize(b.dtype);
    view.resize(n);
    if (b.dtype == DType::kF32) {  // an fp32 serving copy: the master's bits
      std::memcpy(view.data(), b.bytes().data(), n * sizeof(float));
    } else {
      std::span<const uint16_t> src(reinterpret_cast<const uint16_t*>(b.bytes().data()), n);
      if (b.dtype == DType::kBF16) ConvertBF16ToF32(src, view);
      else ConvertF16ToF32(src, view);
    }
    out.emplace_back(view);
  }
  return out;
}

void WorkerAccess::Release(std::span<const uint32_t> ids) {
  for (uint32_t id : ids) views_.erase(id);
  prefetcher_.Release(ids);
}

Status WorkerAccess::PushGrad(uint32_t param_id, std::span<const float> grad) {
  if (reduce_ != nullptr) {
    // pre-reduced: sum over the ranks first, then push only this rank's (summed) slice.
    scratch_.assign(grad.begin(), grad.end());
    if (inject_ && param_id == 0 && !scratch_.empty()) {
      scratch_[0] = std::numeric_limits<float>::infinity();
    }
    ZPS_RETURN_IF_ERROR(reduce_->ReduceScatter(scratch_));
    const worker::SliceRange mine =
        worker::RankSlice(scratch_.size(), reduce_->world_size(), reduce_->rank());
    return client_->PushGradRange(param_id, step_, mine.begin,
                                  std::span<const float>(scratch_).subspan(mine.begin, mine.length));
  }
  if (inject_ && param_id == 0 && !grad.empty()) {
    std::vector<float> copy(grad.begin(), grad.end());
    copy[0] = std::numeric_limits<float>::infinity();
    return client_->PushGrad(param_id, step_, copy);
  }
  return client_->PushGrad(param_id, step_, grad);
}

}  // namespace zps::train
