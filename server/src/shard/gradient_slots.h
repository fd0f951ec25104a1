// One chunk's gradient slots for the step in progress: the slot buffers pushes land in, the
// element ranges reserved and landed per slot (coverage), and the buffer side of the rollback
// fence (a slot a push ticket still holds is replaced, never zeroed under it).
//
// Slots hold the job's grad_dtype. fp32 job: one fp32 slot per contributor. 16-bit job: one
// 16-bit slot per contributor, plus the fp32 slot 0 where initial values land and several 16-bit
// slots are summed. Block-quantized job (int8 / int4 blocks, grad_quant.h): each reserved range
// of a slot lands, encoded, in a byte buffer of its own (a push piece is encoded on its own), and
// Reduce dequantizes them into the fp32 slot 0. Reduce sums the slots IN SLOT ORDER (acc = g0;
// acc += g1; ...), never arrival order, so results are reproducible; one 16-bit slot stays as it
// landed.
//
// Coverage: a range must lie inside one parameter (padding is never pushed), and overlapping a
// reserved range is a duplicate. The chunk's step is complete when every slot landed every
// trained (not frozen) element; its initial values when slot 0 landed every element.
//
// Lock order: no lock of its own, and it takes none (it calls nothing that locks), so it adds
// nothing to ShardState's order.
// Thread-safety: none of its own. ShardState::mu_ guards every call (a Chunk's slots are
// reached only through it, and the analysis checks that through the REQUIRES(mu_) functions
// that take a Chunk); the slot buffers are shared with push tickets, which write into them
// without the lock, and Reduce runs on a complete chunk, which no push reaches.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "zps/common/aligned_buffer.h"
#include "zps/common/dtype.h"
#include "zps/common/grad_quant.h"
#include "zps/common/status.h"
#include "zps/server/optimizer.h"

namespace zps::server {

class GradientSlots {
 public:
  /// A parameter's elements in the chunk, [begin, end), and whether it is frozen.
  struct Param {
    uint64_t begin = 0, end = 0;
    bool frozen = false;
  };
  /// Where one push writes: the slot buffer it keeps alive while its transfer may still write
  /// (one of the three is set) and the first byte.
  struct Target {
    std::shared_ptr<AlignedBuffer<float>> fp32;
    std::shared_ptr<AlignedBuffer<uint16_t>> half;
    std::shared_ptr<std::vector<std::byte>> quantized;  // the range's encoding
    std::byte* dest = nullptr;
  };

  GradientSlots() = default;
  /// `slots` zeroed slots of `n` elements of `grad_dtype` (fp32, fp16, bf16, or int8 / int4
  /// blocks). Errors: ResourceExhausted.
  static Result<GradientSlots> Create(uint64_t n, uint32_t slots, DType grad_dtype);

  /// Adds the chunk's next parameter piece (ascending, not overlapping).
  void AddParam(uint64_t begin, uint64_t end, bool frozen);
  /// The parameter that holds all of [offset, offset + length), or null.
  const Param* ParamOf(uint64_t offset, uint64_t length) const;

  uint32_t count() const { return static_cast<uint32_t>(covered_.size()); }
  /// Trained (not frozen) parameter elements: what a step's slot must land.
  uint64_t expected() const { return expected_; }
  /// Every parameter element: what the initial values (slot 0) must land.
  uint64_t expected_init() const { return expected_init_; }
  uint64_t landed(uint32_t slot) const { return landed_[slot]; }
  /// Every slot landed every trained element.
  bool Complete() const;
  /// Slot 0 landed every parameter element (initial values).
  bool InitComplete() const { return landed_[0] == expected_init_; }
  /// Nothing reserved or landed in `slot`.
  bool Empty(uint32_t slot) const { return covered_[slot].empty() && landed_[slot] == 0; }

  /// Whether [b, e) overlaps a range reserved in `slot`.
  bool Overlaps(uint32_t slot, uint64_t b, uint64_t e) const;
  /// Reserves [b, e) of `slot` (not overlapping: see Overlaps) and returns where a push of
  /// `dtype` writes it: fp32 (initial values, fp32 jobs) into the fp32 slot, 16-bit into the
  /// 16-bit slot, block-quantized into the range's own buffer (PushBytes(dtype, e - b) bytes).
  Target Reserve(uint32_t slot, uint64_t b, uint64_t e, DType dtype);
  /// Releases the range reserved at `b` (a failed transfer).
  void Release(uint32_t slot, uint64_t b) { covered_[slot].erase(b); }
  /// Counts `n` elements of `slot` as landed.
  void Land(uint32_t slot, uint64_t n) { landed_[slot] += n; }
  /// Whether `target` still writes into the live buffer of `slot` (not replaced since Reserve).
  bool Current(uint32_t slot, const Target& target) const;

  /// Forgets coverage (the slot buffers keep their bytes).
  void ResetCoverage();
  /// Drops what `slot` reserved and landed: its buffer is zeroed, or replaced while a push still
  /// holds it (so that push writes into memory no one reads). Returns the elements it had
  /// landed. Errors: ResourceExhausted (no memory for a fresh buffer).
  Result<uint64_t> Forget(uint32_t slot);
  /// Every slot zeroed or replaced (as Forget), for a rollback; coverage is not touched.
  Status Fresh();

  /// Sums the slots in slot order into the fp32 slot 0 (16-bit slots widened exactly first; one
  /// 16-bit slot stays as it is; block-quantized: slot 0's ranges dequantized into it, then each
  /// later slot's added, DequantizeAddBlocks; elements no range covers are 0). Called once per
  /// step, on a complete chunk.
  void Reduce();
  /// Zeroes [begin, end) of the reduced gradient (frozen parameters: slot 0 may still hold their
  /// initial values, and they must add nothing to the norm).
  void ZeroReduced(uint64_t begin, uint64_t end);
  /// The reduced gradient (after Reduce): the one 16-bit slot as it landed, or the fp32 slot 0.
  GradView Reduced() const;
  /// The fp32 slot 0: the initial values once InitComplete.
  std::span<const float> initial_values() const { return grads_[0]->span(); }
  /// Extends `crc` over every slot's bytes, reserved ranges and landed count.
  uint32_t Crc(uint32_t crc) const;
  /// Bytes of the slot buffers (fp32 and 16-bit, and for block-quantized slots what the whole
  /// chunk's encoding takes per slot): fixed at Create (a replaced buffer has the same size).
  uint64_t bytes() const {
    return n_ * (grads_.size() * sizeof(float) + grads16_.size() * sizeof(uint16_t)) +
           (quantized_.empty() ? 0 : quantized_.size() * PushBytes(dtype_, n_));
  }

 private:
  uint64_t n_ = 0;
  DType dtype_ = DType::kF32;
  std::vector<std::shared_ptr<AlignedBuffer<float>>> grads_;
  std::vector<std::shared_ptr<AlignedBuffer<uint16_t>>> grads16_;
  // Block-quantized jobs: per slot, begin -> the encoding of the range reserved there (kept
  // across steps and reused while no ticket holds it; dropped by Forget and Fresh).
  std::vector<std::map<uint64_t, std::shared_ptr<std::vector<std::byte>>>> quantized_;
  std::vector<std::map<uint64_t, uint64_t>> covered_;  // per slot: begin -> end (reserved)
  // Every slot covers the same ranges (Reduce's block-by-block path for quantized slots).
  bool SameRanges() const;
  std::vector<uint64_t> landed_;  // per slot: elements completed
  std::vector<Param> params_;     // ascending
  uint64_t expected_ = 0;
  uint64_t expected_init_ = 0;
};

}  // namespace zps::server
