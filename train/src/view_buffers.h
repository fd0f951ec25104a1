// view_buffers.h — the fp32 buffers behind the views a ParamAccess hands the model, reused from
// one Acquire to the next.
//
// A fresh std::vector per Acquire is zero-filled and, since glibc gives large blocks back to the
// kernel when they are freed, page-faulted in again at every Acquire: that was most of a
// worker's CPU per step (docs/benchmarks.md, "Training step: the CPU per parameter"). Buffers
// come from a StagingPool instead: not initialised (the caller writes every element) and kept
// for the next Acquire when released.
//
// Thread-safety: one thread (the model's) uses an instance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>

#include "zps/common/staging_pool.h"

namespace zps::train {

class ViewBuffers {
 public:
  /// An uninitialised buffer of n floats for parameter `id`, held until Drop of `id` (a buffer
  /// `id` already held is dropped first).
  std::span<float> Get(uint32_t id, size_t n) {
    auto buf = pool_.Acquire(n * sizeof(float));
    float* p = reinterpret_cast<float*>(buf.get());
    held_[id] = std::move(buf);
    return {p, n};
  }

  /// Holds `owner` (memory a view points into without a copy) until Drop of `id`.
  void Keep(uint32_t id, std::shared_ptr<const void> owner) { held_[id] = std::move(owner); }

  /// Ends the holds of `ids` (ids not held are ignored); pooled buffers go back to the pool.
  void Drop(std::span<const uint32_t> ids) {
    for (uint32_t id : ids) held_.erase(id);
  }

 private:
  StagingPool pool_;
  std::unordered_map<uint32_t, std::shared_ptr<const void>> held_;
};

}  // namespace zps::train
