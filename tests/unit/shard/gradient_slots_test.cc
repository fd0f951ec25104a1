// GradientSlots: coverage, the buffer side of the rollback fence, and the reduction order.
#include "shard/gradient_slots.h"

#include <gtest/gtest.h>

#include <cstring>

#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

GradientSlots Make(uint64_t n, uint32_t slots, DType dtype) {
  auto s = GradientSlots::Create(n, slots, dtype);
  EXPECT_THAT(s.status(), IsOk());
  return std::move(*s);
}

void Write(const GradientSlots::Target& t, std::span<const float> values) {
  std::memcpy(t.dest, values.data(), values.size_bytes());
}

TEST(GradientSlotsTest, ParamsAndCoverage) {
  GradientSlots s = Make(16, 2, DType::kF32);
  s.AddParam(0, 6, false);
  s.AddParam(6, 10, true);  // frozen: not in a step's coverage
  s.AddParam(10, 14, false);
  EXPECT_EQ(s.expected(), 10u);
  EXPECT_EQ(s.expected_init(), 14u);
  ASSERT_NE(s.ParamOf(0, 6), nullptr);
  EXPECT_EQ(s.ParamOf(7, 2)->begin, 6u);
  EXPECT_TRUE(s.ParamOf(7, 2)->frozen);
  EXPECT_EQ(s.ParamOf(4, 4), nullptr);   // spans two parameters
  EXPECT_EQ(s.ParamOf(14, 1), nullptr);  // padding

  EXPECT_FALSE(s.Overlaps(0, 0, 6));
  s.Reserve(0, 0, 3, DType::kF32);
  EXPECT_TRUE(s.Overlaps(0, 2, 4));
  EXPECT_FALSE(s.Overlaps(0, 3, 6));
  EXPECT_FALSE(s.Overlaps(1, 0, 3));  // slots are apart
  s.Release(0, 0);                    // a failed transfer
  EXPECT_FALSE(s.Overlaps(0, 0, 3));

  for (uint32_t slot = 0; slot < 2; ++slot) {
    s.Reserve(slot, 0, 6, DType::kF32);
    s.Reserve(slot, 10, 14, DType::kF32);
    EXPECT_FALSE(s.Complete());
    s.Land(slot, 10);
  }
  EXPECT_TRUE(s.Complete());
  EXPECT_FALSE(s.InitComplete());
  s.ResetCoverage();
  EXPECT_FALSE(s.Complete());
  EXPECT_TRUE(s.Empty(0));
}

TEST(GradientSlotsTest, ForgetReplacesABufferATicketHolds) {
  GradientSlots s = Make(4, 2, DType::kF32);
  s.AddParam(0, 4, false);
  GradientSlots::Target held = s.Reserve(1, 0, 4, DType::kF32);
  const std::vector<float> ones(4, 1.0f);
  Write(held, ones);
  s.Land(1, 4);
  EXPECT_TRUE(s.Current(1, held));
  auto dropped = s.Forget(1);
  ASSERT_THAT(dropped.status(), IsOk());
  EXPECT_EQ(*dropped, 4u);
  // The ticket still writes into the old buffer; the live one is a fresh, zeroed one.
  EXPECT_FALSE(s.Current(1, held));
  Write(held, ones);
  GradientSlots::Target next = s.Reserve(1, 0, 4, DType::kF32);
  EXPECT_EQ(reinterpret_cast<const float*>(next.dest)[0], 0.0f);

  // Without a ticket the buffer is zeroed in place.
  GradientSlots::Target t0 = s.Reserve(0, 0, 4, DType::kF32);
  Write(t0, ones);
  const std::byte* where = t0.dest;
  t0 = {};
  ASSERT_THAT(s.Forget(0).status(), IsOk());
  GradientSlots::Target again = s.Reserve(0, 0, 4, DType::kF32);
  EXPECT_EQ(again.dest, where);
  EXPECT_EQ(reinterpret_cast<const float*>(again.dest)[3], 0.0f);
}

TEST(GradientSlotsTest, FreshFencesEverySlot) {
  GradientSlots s = Make(4, 2, DType::kBF16);
  s.AddParam(0, 4, false);
  GradientSlots::Target t = s.Reserve(1, 0, 4, DType::kBF16);
  ASSERT_THAT(s.Fresh(), IsOk());
  EXPECT_FALSE(s.Current(1, t));
  EXPECT_FALSE(s.Empty(1));  // coverage is the caller's to reset
}

TEST(GradientSlotsTest, ReducesFp32SlotsInSlotOrder) {
  GradientSlots s = Make(3, 3, DType::kF32);
  s.AddParam(0, 3, false);
  const std::vector<float> g0 = {1e8f, 1.0f, 2.0f}, g1 = {-1e8f, 2.0f, 3.0f},
                           g2 = {1.0f, 3.0f, 4.0f};
  // Landed out of order: the sum is still g0 + g1 + g2.
  Write(s.Reserve(2, 0, 3, DType::kF32), g2);
  Write(s.Reserve(0, 0, 3, DType::kF32), g0);
  Write(s.Reserve(1, 0, 3, DType::kF32), g1);
  s.Reduce();
  const GradView r = s.Reduced();
  ASSERT_EQ(r.dtype, DType::kF32);
  const float* out = static_cast<const float*>(r.data);
  EXPECT_EQ(out[0], (1e8f + -1e8f) + 1.0f);
  EXPECT_EQ(out[1], 6.0f);
  s.ZeroReduced(1, 3);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[0], 1.0f);
}

TEST(GradientSlotsTest, OneSixteenBitSlotIsTheReducedGradient) {
  GradientSlots s = Make(2, 1, DType::kBF16);
  s.AddParam(0, 2, false);
  GradientSlots::Target t = s.Reserve(0, 0, 2, DType::kBF16);
  const uint16_t bf[2] = {0x3f80, 0x4000};  // 1.0, 2.0
  std::memcpy(t.dest, bf, sizeof(bf));
  s.Reduce();
  const GradView r = s.Reduced();
  EXPECT_EQ(r.dtype, DType::kBF16);
  EXPECT_EQ(static_cast<const uint16_t*>(r.data)[1], 0x4000);
  s.ZeroReduced(0, 1);
  EXPECT_EQ(static_cast<const uint16_t*>(r.data)[0], 0);
}

TEST(GradientSlotsTest, SixteenBitSlotsAreWidenedAndSummed) {
  GradientSlots s = Make(2, 2, DType::kBF16);
  s.AddParam(0, 2, false);
  const uint16_t a[2] = {0x3f80, 0x4000}, b[2] = {0x4040, 0x4080};  // 1, 2 and 3, 4
  std::memcpy(s.Reserve(0, 0, 2, DType::kBF16).dest, a, sizeof(a));
  std::memcpy(s.Reserve(1, 0, 2, DType::kBF16).dest, b, sizeof(b));
  s.Reduce();
  const GradView r = s.Reduced();
  ASSERT_EQ(r.dtype, DType::kF32);
  EXPECT_EQ(static_cast<const float*>(r.data)[0], 4.0f);
  EXPECT_EQ(static_cast<const float*>(r.data)[1], 6.0f);
}

TEST(GradientSlotsTest, InitialValuesLandInTheFp32SlotZero) {
  GradientSlots s = Make(2, 2, DType::kF16);
  s.AddParam(0, 2, true);  // frozen parameters get initial values too
  const std::vector<float> init = {5.0f, 6.0f};
  Write(s.Reserve(0, 0, 2, DType::kF32), init);
  s.Land(0, 2);
  EXPECT_TRUE(s.InitComplete());
  EXPECT_EQ(s.initial_values()[1], 6.0f);
}

TEST(GradientSlotsTest, CrcCoversBytesRangesAndCounts) {
  GradientSlots s = Make(4, 1, DType::kF32);
  s.AddParam(0, 4, false);
  const uint32_t empty = s.Crc(0);
  GradientSlots::Target t = s.Reserve(0, 0, 2, DType::kF32);
  const uint32_t reserved = s.Crc(0);
  EXPECT_NE(reserved, empty);
  const std::vector<float> v = {1.0f, 2.0f};
  Write(t, v);
  const uint32_t written = s.Crc(0);
  EXPECT_NE(written, reserved);
  s.Land(0, 2);
  EXPECT_NE(s.Crc(0), written);
}

}  // namespace
}  // namespace zps::server
