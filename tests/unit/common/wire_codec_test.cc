// The generic codec of wire_codec.h, one codec at a time, and a small field table of its own.
#include "zps/common/wire_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zps/testing/status_matchers.h"

namespace zps::wire {
namespace {

std::vector<std::byte> B(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

template <typename C>
std::vector<std::byte> Write(const typename C::Value& v) {
  ByteWriter w;
  C::Write(w, v);
  return w.Take();
}

/// Reads one C from `b`, which it must fill exactly.
template <typename C>
Result<typename C::Value> Read(std::span<const std::byte> b) {
  ByteReader r(b);
  ZPS_ASSIGN_OR_RETURN(auto v, C::Read(r, "f"));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("test"));
  return v;
}

TEST(WireCodec, IntsAreLittleEndianWithinTheirBounds) {
  EXPECT_EQ(Write<U32>(0x01020304), B({4, 3, 2, 1}));
  EXPECT_EQ(Write<I64>(-2), B({0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}));
  EXPECT_EQ(*Read<U16>(B({1, 2})), 0x0201);
  EXPECT_THAT(Read<U32>(B({1, 2, 3})), StatusIs(Code::kInvalidArgument));
  using Small = Int<uint32_t, 2, 5>;
  EXPECT_THAT(Read<Small>(Write<Small>(1)), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(*Read<Small>(Write<Small>(2)), 2u);
  EXPECT_EQ(*Read<Small>(Write<Small>(5)), 5u);
  EXPECT_THAT(Read<Small>(Write<Small>(6)),
              StatusIs(Code::kInvalidArgument, "f = 6 is outside 2..5"));
  using NonNegative = Int<int64_t, 0>;
  EXPECT_THAT(Read<NonNegative>(Write<NonNegative>(-1)), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(NonNegative::Bound(), "≥ 0");
  EXPECT_EQ(Small::Type(), "u32");
  EXPECT_EQ(U32::Bound(), "");
}

TEST(WireCodec, FloatsAndBools) {
  EXPECT_EQ(*Read<F64>(Write<F64>(-0.5)), -0.5);
  using Positive = Float<double, FloatCheck::kPositiveFinite>;
  EXPECT_THAT(Read<Positive>(Write<Positive>(0.0)), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<Positive>(Write<Positive>(1.0 / 0.0)), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(*Read<Positive>(Write<Positive>(2.0)), 2.0);
  EXPECT_EQ(Write<Bool>(true), B({1}));
  EXPECT_THAT(Read<Bool>(B({2})), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(*Read<NonZeroBool>(B({2})), true);
  EXPECT_EQ(*Read<NonZeroBool>(B({0})), false);
}

enum class Color : uint8_t { kRed = 0, kGreen = 1, kBlue = 2 };

TEST(WireCodec, EnumsRefuseUnknownValues) {
  using C = Enum<Color, Color::kBlue>;
  EXPECT_EQ(Write<C>(Color::kGreen), B({1}));
  EXPECT_EQ(*Read<C>(B({2})), Color::kBlue);
  EXPECT_THAT(Read<C>(B({3})), StatusIs(Code::kInvalidArgument, "f: unknown value 3"));
  EXPECT_EQ(C::Bound(), "0..2");
}

TEST(WireCodec, StringsAndBlobsCheckTheirLengths) {
  using S = Str<4, 1>;
  EXPECT_EQ(Write<S>("ab"), B({2, 0, 0, 0, 'a', 'b'}));
  EXPECT_EQ(*Read<S>(B({2, 0, 0, 0, 'a', 'b'})), "ab");
  EXPECT_THAT(Read<S>(Write<S>("")), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<S>(Write<S>("abcde")), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<S>(B({2, 0, 0, 0, 'a'})), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(Write<CutStr<3>>("abcdef"), Write<CutStr<3>>("abc"));
  using K = Bytes<3, 1>;
  EXPECT_EQ(*Read<K>(B({1, 0, 0, 0, 9})), B({9}));
  EXPECT_THAT(Read<K>(B({0, 0, 0, 0})), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<K>(B({4, 0, 0, 0, 1, 2, 3, 4})), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(K::Bound(), "1..3 B");
  EXPECT_EQ((Bytes<4096>::Bound()), "≤ 4 KiB");
  EXPECT_EQ((Bytes<512u << 20>::Bound()), "≤ 512 MiB");
}

TEST(WireCodec, PodArraysAreWholeElements) {
  using A = PodArray<float, 2>;
  const std::vector<float> v = {1.0f, -2.0f};
  EXPECT_EQ(*Read<A>(Write<A>(v)), v);
  EXPECT_EQ(Read<A>(Write<A>({}))->size(), 0u);
  EXPECT_THAT(Read<A>(Write<A>({1.0f, 2.0f, 3.0f})), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<A>(B({3, 0, 0, 0, 1, 2, 3})), StatusIs(Code::kInvalidArgument));
}

TEST(WireCodec, ListsCheckCountsAndOrder) {
  using L = List<U32, 3, 1>;
  EXPECT_EQ(Write<L>({7}), B({1, 0, 0, 0, 7, 0, 0, 0}));
  EXPECT_THAT(Read<L>(Write<L>({})), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<L>(Write<L>({1, 2, 3, 4})), StatusIs(Code::kInvalidArgument));
  // Fixed-size elements: a count the input cannot hold is refused at once.
  EXPECT_THAT(Read<List<U32>>(B({0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4})),
              StatusIs(Code::kInvalidArgument, "f: count 4294967295 is more than the input holds"));
  using Up = List<Int<int64_t, 0>, 8, 0, Order::kStrictlyAscending>;
  EXPECT_EQ(*Read<Up>(Write<Up>({0, 4, 9})), (std::vector<int64_t>{0, 4, 9}));
  EXPECT_THAT(Read<Up>(Write<Up>({4, 4})), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(Read<Up>(Write<Up>({-1})), StatusIs(Code::kInvalidArgument));
  using P = List<Pair<U32, U8>>;
  EXPECT_EQ(*Read<P>(Write<P>({{1, 2}})), (P::Value{{1, 2}}));
  EXPECT_EQ((Pair<U32, U8>::kFixedSize), 5u);
  EXPECT_EQ(Up::Bound(), "n ≤ 8; each ≥ 0");
  EXPECT_EQ(L::Bound(), "n 1..3");
  EXPECT_EQ(L::Size(), "4 + n × 4");
  EXPECT_EQ((List<Str<8>>::Size()), "4 + n × (4 + len)");
}

struct Inner {
#define ZPS_TEST_INNER(X) \
  X(a, 0, "first", U16)   \
  X(b, false, "second", Bool)
  ZPS_WIRE_FIELDS(Inner, ZPS_TEST_INNER)
};

struct Outer {
#define ZPS_TEST_OUTER(X)               \
  X(id, 0, "an id", U32)                \
  X(inner, {}, "nested", Struct<Inner>) \
  X(name, {}, "a name", Str<8>)         \
  X(extra, 1, "optional", Trailing<Int<uint32_t, 1, 9>, 1>)
  ZPS_WIRE_FIELDS(Outer, ZPS_TEST_OUTER)
};

TEST(WireCodec, StructsEncodeTheirFieldsInTableOrder) {
  EXPECT_EQ(kStructFixedSize<Inner>, 3u);
  EXPECT_EQ(kStructFixedSize<Outer>, 0u);
  Outer o{5, {0x0102, true}, "n", 1};
  const auto bytes = Encode(o);
  EXPECT_EQ(bytes, B({5, 0, 0, 0, 2, 1, 1, 1, 0, 0, 0, 'n'}));
  auto back = Decode<Outer>(bytes);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->inner.a, 0x0102);
  EXPECT_EQ(back->extra, 1u);
  o.extra = 3;
  EXPECT_EQ(Encode(o).size(), bytes.size() + 4);
  EXPECT_EQ(Decode<Outer>(Encode(o))->extra, 3u);
  o.extra = 10;
  EXPECT_THAT(Decode<Outer>(Encode(o)), StatusIs(Code::kInvalidArgument));
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THAT(Decode<Outer>(longer), StatusIs(Code::kInvalidArgument));
}

TEST(WireCodec, FieldTableRendersTheDeclaration) {
  EXPECT_EQ(FieldTable<Outer>(),
            "| field | type | bytes | bound | meaning |\n"
            "|---|---|---|---|---|\n"
            "| `id` | u32 | 4 |  | an id |\n"
            "| `inner` | Inner | 3 |  | nested |\n"
            "| `name` | str | 4 + len | ≤ 8 B | a name |\n"
            "| `extra` | u32 (optional) | 0 or 4 | 1..9 | optional |\n");
}

}  // namespace
}  // namespace zps::wire
