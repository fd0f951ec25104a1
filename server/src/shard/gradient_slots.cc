#include "shard/gradient_slots.h"

#include <algorithm>

#include "zps/common/crc32c.h"

namespace zps::server {
namespace {

// Zeroes a slot buffer, or replaces it with a zeroed one while a ticket still holds it. Only
// tickets share a slot buffer, and none is made without the owner's lock: a count of 1 means no
// transfer can write into it any more.
template <typename T>
Status FreshSlot(std::shared_ptr<AlignedBuffer<T>>& g, uint64_t size) {
  if (g.use_count() == 1) {
    std::fill(g->span().begin(), g->span().end(), T{0});
    return Status::Ok();
  }
  ZPS_ASSIGN_OR_RETURN(auto fresh, AlignedBuffer<T>::Allocate(size));  // zeroed
  g = std::make_shared<AlignedBuffer<T>>(std::move(fresh));
  return Status::Ok();
}

}  // namespace

Result<GradientSlots> GradientSlots::Create(uint64_t n, uint32_t slots, DType grad_dtype) {
  GradientSlots s;
  s.n_ = n;
  s.dtype_ = grad_dtype;
  // fp32 slots: one per slot for an fp32 job; for a 16-bit or block-quantized job only slot 0
  // (the initial values, and the sum of the slots), beside its 16-bit or quantized slots.
  const bool quantized = IsBlockQuantized(grad_dtype);
  const bool half = grad_dtype != DType::kF32 && !quantized;
  for (uint32_t k = 0; k < (grad_dtype != DType::kF32 ? 1 : slots); ++k) {
    ZPS_ASSIGN_OR_RETURN(auto g, AlignedBuffer<float>::Allocate(n));
    s.grads_.push_back(std::make_shared<AlignedBuffer<float>>(std::move(g)));
  }
  if (quantized) s.quantized_.resize(slots);
  for (uint32_t k = 0; half && k < slots; ++k) {
    ZPS_ASSIGN_OR_RETURN(auto g, AlignedBuffer<uint16_t>::Allocate(n));
    s.grads16_.push_back(std::make_shared<AlignedBuffer<uint16_t>>(std::move(g)));
  }
  s.covered_.resize(slots);
  s.landed_.assign(slots, 0);
  return s;
}

void GradientSlots::AddParam(uint64_t begin, uint64_t end, bool frozen) {
  params_.push_back({begin, end, frozen});
  expected_init_ += end - begin;
  if (!frozen) expected_ += end - begin;
}

const GradientSlots::Param* GradientSlots::ParamOf(uint64_t offset, uint64_t length) const {
  auto it = std::upper_bound(params_.begin(), params_.end(), offset,
                             [](uint64_t off, const Param& p) { return off < p.begin; });
  if (it == params_.begin() || std::prev(it)->end < offset + length) return nullptr;
  return &*std::prev(it);
}

bool GradientSlots::Complete() const {
  for (uint64_t n : landed_) {
    if (n != expected_) return false;
  }
  return true;
}

bool GradientSlots::Overlaps(uint32_t slot, uint64_t b, uint64_t e) const {
  const auto& cov = covered_[slot];
  auto next = cov.lower_bound(b);
  return (next != cov.end() && next->first < e) ||
         (next != cov.begin() && std::prev(next)->second > b);
}

GradientSlots::Target GradientSlots::Reserve(uint32_t slot, uint64_t b, uint64_t e, DType dtype) {
  covered_[slot].emplace(b, e);
  Target t;
  if (IsBlockQuantized(dtype)) {
    // The range's buffer from an earlier step, unless a push still holds it or it is not as
    // long (pieces are the same every step, so it usually is reused).
    auto& q = quantized_[slot][b];
    const size_t bytes = PushBytes(dtype, e - b);
    if (!q || q.use_count() != 1 || q->size() != bytes) {
      q = std::make_shared<std::vector<std::byte>>(bytes);
    }
    t.quantized = q;
    t.dest = q->data();
    return t;
  }
  if (dtype == DType::kF32) {
    t.fp32 = grads_[slot];
    t.dest = reinterpret_cast<std::byte*>(t.fp32->data() + b);
  } else {
    t.half = grads16_[slot];
    t.dest = reinterpret_cast<std::byte*>(t.half->data() + b);
  }
  return t;
}

bool GradientSlots::Current(uint32_t slot, const Target& t) const {
  if (t.quantized) {
    if (slot >= quantized_.size()) return false;
    for (const auto& [b, q] : quantized_[slot]) {
      if (q == t.quantized) return true;
    }
    return false;
  }
  if (t.half) return slot < grads16_.size() && t.half == grads16_[slot];
  return slot < grads_.size() && t.fp32 == grads_[slot];
}

void GradientSlots::ResetCoverage() {
  for (auto& cov : covered_) cov.clear();
  std::fill(landed_.begin(), landed_.end(), 0);
}

Result<uint64_t> GradientSlots::Forget(uint32_t slot) {
  if (Empty(slot)) return uint64_t{0};
  const uint64_t dropped = landed_[slot];
  covered_[slot].clear();
  landed_[slot] = 0;
  if (slot < grads_.size()) ZPS_RETURN_IF_ERROR(FreshSlot(grads_[slot], n_));
  if (slot < grads16_.size()) ZPS_RETURN_IF_ERROR(FreshSlot(grads16_[slot], n_));
  if (slot < quantized_.size()) quantized_[slot].clear();  // a push still holding one writes on
  return dropped;
}

Status GradientSlots::Fresh() {
  for (auto& g : grads_) ZPS_RETURN_IF_ERROR(FreshSlot(g, n_));
  for (auto& g : grads16_) ZPS_RETURN_IF_ERROR(FreshSlot(g, n_));
  for (auto& q : quantized_) q.clear();
  return Status::Ok();
}

void GradientSlots::Reduce() {
  float* acc = grads_[0]->data();
  if (!quantized_.empty()) {
    // Slot 0 is written (not added to 0, which would turn -0 into +0), later slots added, in
    // slot order; a slot's ranges do not overlap, so their order does not matter.
    const QuantFormat f = GradQuantFormat(dtype_);
    if (SameRanges()) {
      // Every slot pushed the same ranges (server-sum): block by block, each block's slots are
      // summed while it is in cache, and only what no range covers is zeroed.
      const size_t stride = QuantizedBlockStride(f);
      uint64_t zeroed_to = 0;
      for (const auto& [b, e] : covered_[0]) {
        std::fill(acc + zeroed_to, acc + b, 0.0f);
        zeroed_to = e;
        for (uint64_t at = b, k = 0; at < e; at += f.block, ++k) {
          const uint64_t len = std::min<uint64_t>(f.block, e - at);
          std::span<float> out(acc + at, len);
          for (size_t slot = 0; slot < quantized_.size(); ++slot) {
            const std::span<const std::byte> rec =
                std::span<const std::byte>(*quantized_[slot].at(b))
                    .subspan(k * stride, QuantizedBytes(f, len));
            if (slot == 0) {
              DequantizeBlocks(f, rec, out);
            } else {
              DequantizeAddBlocks(f, rec, out);
            }
          }
        }
      }
      std::fill(acc + zeroed_to, acc + n_, 0.0f);
      return;
    }
    std::fill(acc, acc + n_, 0.0f);
    for (size_t slot = 0; slot < quantized_.size(); ++slot) {
      for (const auto& [b, e] : covered_[slot]) {
        const auto& q = quantized_[slot].at(b);
        std::span<float> out(acc + b, e - b);
        if (slot == 0) {
          DequantizeBlocks(f, *q, out);
        } else {
          DequantizeAddBlocks(f, *q, out);
        }
      }
    }
    return;
  }
  for (size_t r = 1; r < grads_.size(); ++r) {
    const float* g = grads_[r]->data();
    for (uint64_t i = 0; i < n_; ++i) acc[i] += g[i];
  }
  if (grads16_.size() <= 1) return;
  // acc = g0 + g1 + ... in slot order, each widened (exactly) to fp32 first: the sums of fp32
  // slots that held the widened values. Block by block, in cache.
  constexpr uint64_t kBlock = 4096;
  float wide[kBlock];
  auto widen = [&](size_t slot, uint64_t begin, uint64_t n, float* out) {
    std::span<const uint16_t> in(grads16_[slot]->data() + begin, n);
    if (dtype_ == DType::kF16) {
      ConvertF16ToF32(in, {out, n});
    } else {
      ConvertBF16ToF32(in, {out, n});
    }
  };
  for (uint64_t b = 0; b < n_; b += kBlock) {
    const uint64_t n = std::min(kBlock, n_ - b);
    widen(0, b, n, acc + b);
    for (size_t r = 1; r < grads16_.size(); ++r) {
      widen(r, b, n, wide);
      for (uint64_t i = 0; i < n; ++i) acc[b + i] += wide[i];
    }
  }
}

bool GradientSlots::SameRanges() const {
  for (size_t slot = 1; slot < covered_.size(); ++slot) {
    if (covered_[slot] != covered_[0]) return false;
  }
  return true;
}

void GradientSlots::ZeroReduced(uint64_t begin, uint64_t end) {
  // A 16-bit zero is all bits clear, as fp32's is.
  if (grads16_.size() == 1) {
    std::fill(grads16_[0]->data() + begin, grads16_[0]->data() + end, uint16_t{0});
  } else {
    std::fill(grads_[0]->data() + begin, grads_[0]->data() + end, 0.0f);
  }
}

GradView GradientSlots::Reduced() const {
  if (grads16_.size() == 1) return {grads16_[0]->data(), dtype_, n_};
  return {grads_[0]->data(), DType::kF32, n_};
}

uint32_t GradientSlots::Crc(uint32_t crc) const {
  for (const auto& g : grads_) crc = Crc32cExtend(crc, std::as_bytes(g->span()));
  for (const auto& g : grads16_) crc = Crc32cExtend(crc, std::as_bytes(g->span()));
  for (const auto& slot : quantized_) {
    for (const auto& [b, q] : slot) crc = Crc32cExtend(crc, std::span<const std::byte>(*q));
  }
  for (size_t slot = 0; slot < covered_.size(); ++slot) {
    for (const auto& [b, e] : covered_[slot]) {
      const uint64_t range[2] = {b, e};
      crc = Crc32cExtend(crc, std::as_bytes(std::span<const uint64_t>(range)));
    }
    crc = Crc32cExtend(crc, std::as_bytes(std::span<const uint64_t>(&landed_[slot], 1)));
  }
  return crc;
}

}  // namespace zps::server
