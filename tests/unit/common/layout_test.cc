#include "zps/common/layout.h"

#include <gtest/gtest.h>

#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

std::vector<ParamSpec> Specs() {
  return {{"emb", {256, 10}}, {"w1", {10, 7}}, {"b1", {7}}, {"head", {10, 256}}};
}

TEST(Layout, AlignsAndChunks) {
  auto l = Layout::Build(Specs(), {.chunk_elems = 1024, .align_elems = 64, .num_shards = 2});
  ASSERT_THAT(l, IsOk());
  EXPECT_EQ(l->param_offset(0), 0u);
  EXPECT_EQ(l->param_offset(1), 2560u);        // 2560 is a multiple of 64
  EXPECT_EQ(l->param_offset(2), 2560u + 128);  // 70 -> aligned up to 128
  EXPECT_EQ(l->param_offset(3), 2560u + 192);
  EXPECT_EQ(l->total_elems(), 2560u + 192 + 2560);
  EXPECT_EQ(l->num_chunks(), 6u);
  EXPECT_EQ(l->chunk_size(5), 5312u - 5 * 1024);
  EXPECT_EQ(l->ChunksOfShard(1), (std::vector<uint32_t>{1, 3, 5}));
}

TEST(Layout, PiecesCoverTheParameterExactly) {
  auto l = Layout::Build(Specs(), {.chunk_elems = 1024, .align_elems = 64, .num_shards = 2});
  ASSERT_THAT(l, IsOk());
  auto p = l->Pieces(0);
  ASSERT_THAT(p, IsOk());
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].chunk, 0u);
  EXPECT_EQ((*p)[1].param_offset, 1024u);
  EXPECT_EQ((*p)[2].length, 512u);
  auto q = l->Pieces(3, 100, 1000);
  ASSERT_THAT(q, IsOk());
  uint64_t sum = 0;
  for (auto& piece : *q) sum += piece.length;
  EXPECT_EQ(sum, 1000u);
  EXPECT_EQ((*q)[0].chunk_offset, (2560u + 192 + 100) % 1024);
  EXPECT_EQ(l->Pieces(9).status().code(), Code::kOutOfRange);
  EXPECT_EQ(l->Pieces(UINT32_MAX, 0, 1).status().code(), Code::kOutOfRange);
  EXPECT_EQ(l->Pieces(2, 5, 3).status().code(), Code::kOutOfRange);
}

TEST(Layout, SerializeRoundTripAndHash) {
  auto l = Layout::Build(Specs(), {.chunk_elems = 1024, .align_elems = 64, .num_shards = 2});
  ASSERT_THAT(l, IsOk());
  auto bytes = l->Serialize();
  auto back = Layout::Deserialize(bytes);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->Hash(), l->Hash());
  auto other = Layout::Build(Specs(), {.chunk_elems = 2048, .align_elems = 64, .num_shards = 2});
  ASSERT_THAT(other, IsOk());
  EXPECT_NE(other->Hash(), l->Hash());
  // Every truncation is rejected, never read past the end.
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(Layout::Deserialize(std::span(bytes).first(n)).ok()) << n;
  }
  bytes[0] = std::byte{0};
  EXPECT_EQ(Layout::Deserialize(bytes).status().code(), Code::kDataLoss);
}

TEST(Layout, RejectsBadSpecs) {
  EXPECT_FALSE(Layout::Build({}, {}).ok());
  EXPECT_FALSE(Layout::Build({{"a", {2}}, {"a", {3}}}, {}).ok());
  EXPECT_FALSE(Layout::Build({{"a", {0}}}, {}).ok());
  EXPECT_FALSE(Layout::Build({{"a", {-4}}}, {}).ok());
  EXPECT_FALSE(Layout::Build({{"", {4}}}, {}).ok());
  EXPECT_FALSE(Layout::Build({{"a", {4}}}, {.chunk_elems = 100, .align_elems = 64}).ok());
  EXPECT_FALSE(Layout::Build({{"a", {4}}}, {.num_shards = 0}).ok());
  EXPECT_FALSE(Layout::Build({{"a", {1ll << 30, 1ll << 30}}}, {}).ok());
}

}  // namespace
}  // namespace zps
