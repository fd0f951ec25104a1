// ChunkLayout (what a chunk stores, per kind) and ChunkBuffers (a chunk's optimizer state).
#include "shard/chunk_layout.h"

#include <gtest/gtest.h>

#include <numeric>

#include "zps/common/crc32c.h"
#include "zps/server/nvme.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

OptimizerConfig Opt(OptimizerKind kind, float momentum = 0.0f) {
  OptimizerConfig o;
  o.kind = kind;
  o.momentum = momentum;
  return o;
}

TEST(ChunkLayoutTest, AdamKeepsMasterMomentsAndServing) {
  const ChunkLayout l = ChunkLayout::For(Opt(OptimizerKind::kAdamW), DType::kBF16);
  for (StateKind k : {StateKind::kMaster, StateKind::kM, StateKind::kV, StateKind::kServing}) {
    EXPECT_TRUE(l.has(k)) << l.info(k).name;
  }
  EXPECT_EQ(l.moments(), 2u);
  EXPECT_EQ(l.info(StateKind::kMaster).dtype, DType::kF32);
  EXPECT_EQ(l.info(StateKind::kV).element_bytes, 4u);
  EXPECT_EQ(l.serving_dtype(), DType::kBF16);
  EXPECT_EQ(l.serving_words(10), 10u);
  EXPECT_EQ(l.bytes(StateKind::kServing, 10), 20u);
  EXPECT_EQ(l.serving_stride(10), 64u);  // one cache line
  EXPECT_EQ(l.serving_stride(32), 64u);
  EXPECT_EQ(l.serving_stride(33), 128u);
}

TEST(ChunkLayoutTest, SgdKeepsMomentumOnlyWhenAsked) {
  const ChunkLayout plain = ChunkLayout::For(Opt(OptimizerKind::kSgd), DType::kF16);
  EXPECT_FALSE(plain.has(StateKind::kM));
  EXPECT_FALSE(plain.has(StateKind::kV));
  EXPECT_EQ(plain.moments(), 0u);
  EXPECT_EQ(plain.bytes(StateKind::kM, 100), 0u);
  const ChunkLayout momentum = ChunkLayout::For(Opt(OptimizerKind::kSgd, 0.9f), DType::kF16);
  EXPECT_TRUE(momentum.has(StateKind::kM));
  EXPECT_FALSE(momentum.has(StateKind::kV));
  EXPECT_EQ(momentum.moments(), 1u);
}

TEST(ChunkLayoutTest, Fp32ServingIsTwoWordsAnElement) {
  const ChunkLayout l = ChunkLayout::For(Opt(OptimizerKind::kAdam), DType::kF32);
  EXPECT_EQ(l.serving_words(16), 32u);
  EXPECT_EQ(l.bytes(StateKind::kServing, 16), 64u);
  const QuantRange r = l.serving_range(16, 3, 5);
  EXPECT_EQ(r.offset, 12u);
  EXPECT_EQ(r.bytes, 20u);
  EXPECT_EQ(r.skip, 0u);
}

// Quantized weights: blocks of kWeightQuantBlock (256) elements from the chunk's start, each a
// 4-byte scale and 256 codes; a fetch carries its covering blocks.
TEST(ChunkLayoutTest, Int8BlockServingIsBlocksFromTheChunkStart) {
  const ChunkLayout l = ChunkLayout::For(Opt(OptimizerKind::kAdam), DType::kI8Block);
  EXPECT_EQ(l.serving_dtype(), DType::kI8Block);
  EXPECT_EQ(l.bytes(StateKind::kServing, 600), 2u * 260 + 4 + 88);
  EXPECT_EQ(l.serving_words(600), 306u);
  EXPECT_EQ(l.bytes(StateKind::kServing, 257), 265u);  // a short last block: 4 + 1
  EXPECT_EQ(l.serving_words(257), 133u);               // one pad byte
  EXPECT_EQ(l.serving_stride(600), 640u);
  const QuantRange inside = l.serving_range(600, 300, 10);  // inside block 1
  EXPECT_EQ(inside.offset, 260u);
  EXPECT_EQ(inside.bytes, 260u);
  EXPECT_EQ(inside.skip, 44u);
  const QuantRange across = l.serving_range(600, 250, 300);  // blocks 0 to 2, the last short
  EXPECT_EQ(across.offset, 0u);
  EXPECT_EQ(across.bytes, 612u);
  EXPECT_EQ(across.skip, 250u);
}

TEST(ChunkLayoutTest, SpareSetCountsEveryKindAligned) {
  const uint64_t n = 1000;
  const ChunkLayout adam = ChunkLayout::For(Opt(OptimizerKind::kAdam), DType::kBF16);
  EXPECT_EQ(adam.spare_set_bytes(n, true), AlignUp(n * 4) * 3 + AlignUp(n * 2));
  EXPECT_EQ(adam.spare_set_bytes(n, false), AlignUp(n * 4) * 3);  // copies made on fetch
  const ChunkLayout sgd = ChunkLayout::For(Opt(OptimizerKind::kSgd), DType::kF32);
  EXPECT_EQ(sgd.spare_set_bytes(n, true), AlignUp(n * 4) + AlignUp(n * 4));
  EXPECT_EQ(sgd.spare_set_bytes(n, false), AlignUp(n * 4));
}

TEST(ChunkBuffersTest, AllocatesTheKindsTheLayoutKeeps) {
  const ChunkLayout sgd = ChunkLayout::For(Opt(OptimizerKind::kSgd, 0.5f), DType::kBF16);
  auto b = ChunkBuffers::Allocate(sgd, 7);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(b->master.size(), 7u);
  EXPECT_EQ(b->m.size(), 7u * 4);  // fp32 moments, packed as their bytes
  EXPECT_EQ(b->v.size(), 0u);
  EXPECT_EQ(b->bytes(), 2 * 7 * sizeof(float));
  for (float x : b->master.span()) EXPECT_EQ(x, 0.0f);
  EXPECT_TRUE(b->spans().v.empty());
}

TEST(ChunkBuffersTest, CrcCopyZeroPrefixSwap) {
  const ChunkLayout adam = ChunkLayout::For(Opt(OptimizerKind::kAdam), DType::kBF16);
  auto a = ChunkBuffers::Allocate(adam, 5);
  auto b = ChunkBuffers::Allocate(adam, 5);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  std::iota(a->master.span().begin(), a->master.span().end(), 1.0f);
  std::iota(Fp32Moment(a->m.span()).begin(), Fp32Moment(a->m.span()).end(), 10.0f);
  std::iota(Fp32Moment(a->v.span()).begin(), Fp32Moment(a->v.span()).end(), 20.0f);
  // master, m, v in that order, as the shard's CRCs have always listed them.
  uint32_t want = Crc32c(std::as_bytes(a->master.span()));
  want = Crc32cExtend(want, a->m.span());
  want = Crc32cExtend(want, a->v.span());
  EXPECT_EQ(a->Crc(0), want);

  b->CopyFrom(*a);
  EXPECT_EQ(b->Crc(0), want);
  const ChunkState p = b->prefix(2);
  EXPECT_EQ(p.master.size(), 2u);
  EXPECT_EQ(Fp32Moment(p.v)[1], 21.0f);

  b->Zero();
  EXPECT_NE(b->Crc(0), want);
  const float* a_master = a->master.data();
  a->swap(*b);
  EXPECT_EQ(b->master.data(), a_master);
  EXPECT_EQ(b->Crc(0), want);
  EXPECT_EQ(a->bytes_of(StateKind::kV).data(), a->v.data());
}

TEST(ChunkLayoutTest, CompactMomentsArePackedWithTheirScalesApart) {
  OptimizerConfig o = Opt(OptimizerKind::kAdamW);
  for (StateDType d : {StateDType::kF32, StateDType::kBF16, StateDType::kInt8}) {
    o.state_dtype = d;
    const ChunkLayout l = ChunkLayout::For(o, DType::kBF16);
    const uint64_t n = 1000;  // int8: a last partial block
    EXPECT_EQ(l.state_dtype(), d);
    EXPECT_EQ(l.bytes(StateKind::kMaster, n), n * 4);
    EXPECT_EQ(l.bytes(StateKind::kM, n), MomentBytes(d, n));
    EXPECT_EQ(l.bytes(StateKind::kV, n), MomentBytes(d, n));
    const uint64_t code = d == StateDType::kF32 ? 4 : (d == StateDType::kBF16 ? 2 : 1);
    EXPECT_EQ(l.info(StateKind::kM).element_bytes, code);
    EXPECT_EQ(l.scale_bytes(StateKind::kM, n), MomentBytes(d, n) - n * code);
    EXPECT_EQ(l.scale_bytes(StateKind::kV, n) > 0, d == StateDType::kInt8);
    EXPECT_EQ(l.spare_set_bytes(n, true),
              AlignUp(n * 4) + 2 * AlignUp(MomentBytes(d, n)) + AlignUp(n * 2));
    auto b = ChunkBuffers::Allocate(l, n);
    ASSERT_THAT(b.status(), IsOk());
    EXPECT_EQ(b->dtype, d);
    EXPECT_EQ(b->m.size(), MomentBytes(d, n));
    EXPECT_EQ(b->bytes(), n * 4 + 2 * MomentBytes(d, n));
    const ChunkState p = b->prefix(640);  // a multiple of the int8 block
    EXPECT_EQ(p.master.size(), 640u);
    EXPECT_EQ(p.m.size(), MomentBytes(d, 640));
  }
}

}  // namespace
}  // namespace zps::server
