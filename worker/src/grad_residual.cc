#include "grad_residual.h"

#include <algorithm>

#include "zps/common/grad_quant.h"

namespace zps::worker {

GradResiduals::GradResiduals(DType dtype, bool feedback) : dtype_(dtype), feedback_(feedback) {}

GradResiduals::Range& GradResiduals::Find(const Key& key) {
  MutexLock lock(&mu_);
  auto& slot = ranges_[key];
  if (!slot) {
    slot = std::make_unique<Range>();
    MutexLock range_lock(&slot->mu);
    slot->r.assign(std::get<2>(key), 0.0f);
  }
  return *slot;
}

Status GradResiduals::Encode(uint32_t param, uint64_t begin, std::span<const float> grad,
                             std::span<const uint64_t> piece_lengths, std::span<std::byte> out) {
  uint64_t elems = 0;
  size_t bytes = 0;
  for (uint64_t n : piece_lengths) {
    elems += n;
    bytes += PushBytes(dtype_, n);
  }
  if (elems != grad.size() || bytes != out.size()) {
    return InvalidArgument("quantized push: pieces of " + std::to_string(elems) + " elements, " +
                           std::to_string(bytes) + " bytes for a gradient of " +
                           std::to_string(grad.size()) + " elements into " +
                           std::to_string(out.size()) + " bytes");
  }
  const QuantFormat f = GradQuantFormat(dtype_);
  Range& range = Find({param, begin, grad.size()});
  MutexLock lock(&range.mu);
  if (!feedback_) std::fill(range.r.begin(), range.r.end(), 0.0f);
  uint64_t at = 0;
  size_t byte_at = 0;
  for (uint64_t n : piece_lengths) {
    const size_t nb = PushBytes(dtype_, n);
    QuantizeWithResidual(f, grad.subspan(at, n), std::span<float>(range.r).subspan(at, n),
                         out.subspan(byte_at, nb));
    at += n;
    byte_at += nb;
  }
  return Status::Ok();
}

void GradResiduals::Reset() {
  MutexLock lock(&mu_);
  for (auto& [key, range] : ranges_) {
    MutexLock range_lock(&range->mu);
    std::fill(range->r.begin(), range->r.end(), 0.0f);
  }
}

std::vector<float> GradResiduals::Residual(uint32_t param, uint64_t begin, uint64_t length) const {
  MutexLock lock(&mu_);
  auto it = ranges_.find({param, begin, length});
  if (it == ranges_.end()) return {};
  MutexLock range_lock(&it->second->mu);
  return it->second->r;
}

}  // namespace zps::worker
