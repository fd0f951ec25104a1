// zps/common/wire_codec.h — the generic codec behind every message in messages.h.
//
// A message declares its fields once, as an X-macro list of rows
//   X(member, default, "meaning", Codec)
// and ZPS_WIRE_FIELDS turns the list into the struct's members (in that order, so aggregate
// initialisation follows the list), a constexpr table of the fields, and with ZPS_WIRE_MESSAGE the
// Encode/Decode declarations. Encode writes the fields in list order; Decode reads them back,
// validates each with its codec and refuses trailing bytes; FieldTable renders the list as the
// markdown table docs/protocol.md carries (tests/unit/common/protocol_doc_test.cc compares them).
//
// A codec is a type with
//   using Value = ...;                                      the member's C++ type
//   static void Write(ByteWriter&, const Value&);
//   static Result<Value> Read(ByteReader&, std::string_view field);
//   static constexpr size_t kFixedSize;                     bytes on the wire; 0 when it varies
//   static std::string Type(), Size(), Bound();             the doc table's columns
// Read returns InvalidArgument (naming the field) for anything malformed: a short input, a length,
// count or value out of its declared bound, an unknown enum value. It never reads past the input,
// and checks every length and count before it allocates. Integers are little-endian (bytes.h);
// `str` and `blob` are a u32 length followed by the bytes.
//
// Thread-safety: pure functions and value types.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "zps/common/bytes.h"
#include "zps/common/status.h"

namespace zps::wire {

namespace detail {
template <typename T>
constexpr std::string_view IntName() {
  if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  if constexpr (std::is_same_v<T, uint16_t>) return "u16";
  if constexpr (std::is_same_v<T, uint32_t>) return "u32";
  if constexpr (std::is_same_v<T, uint64_t>) return "u64";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, int64_t>) return "i64";
}
/// A byte count as the doc writes it: "4 KiB", "512 MiB", or the number.
inline std::string HumanBytes(uint64_t n) {
  if (n >= (uint64_t{1} << 20) && n % (uint64_t{1} << 20) == 0) {
    return std::to_string(n >> 20) + " MiB";
  }
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}
/// Whether v lies outside [lo, hi], without comparisons a bound makes always false.
template <typename T, T kLo, T kHi>
constexpr bool Outside(T v) {
  bool out = false;
  if constexpr (kLo != std::numeric_limits<T>::min()) out = out || v < kLo;
  if constexpr (kHi != std::numeric_limits<T>::max()) out = out || v > kHi;
  return out;
}
}  // namespace detail

// ---- scalars ----

/// A little-endian integer of type T in [kMin, kMax].
template <typename T, T kMin = std::numeric_limits<T>::min(),
          T kMax = std::numeric_limits<T>::max()>
struct Int {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  static_assert(kMin <= kMax);
  using Value = T;
  static constexpr size_t kFixedSize = sizeof(T);

  static void Write(ByteWriter& w, T v) { w.Raw(&v, sizeof v); }
  static Result<T> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(auto raw, r.Take(field, sizeof(T)));
    T v;
    std::memcpy(&v, raw.data(), sizeof v);
    if (detail::Outside<T, kMin, kMax>(v)) {
      return InvalidArgument(std::string(field) + " = " + std::to_string(v) + " is outside " +
                             Bound());
    }
    return v;
  }
  static std::string Type() { return std::string(detail::IntName<T>()); }
  static std::string Size() { return std::to_string(sizeof(T)); }
  static std::string Bound() {
    constexpr bool lo = kMin != std::numeric_limits<T>::min();
    constexpr bool hi = kMax != std::numeric_limits<T>::max();
    if constexpr (lo && hi) return std::to_string(kMin) + ".." + std::to_string(kMax);
    if constexpr (lo) return "≥ " + std::to_string(kMin);
    if constexpr (hi) return "≤ " + std::to_string(kMax);
    return "";
  }
};

using U8 = Int<uint8_t>;
using U16 = Int<uint16_t>;
using U32 = Int<uint32_t>;
using U64 = Int<uint64_t>;
using I64 = Int<int64_t>;

enum class FloatCheck { kAny, kPositiveFinite };

/// An IEEE float of type T (f32 or f64), any value or positive and finite.
template <typename T, FloatCheck kCheck = FloatCheck::kAny>
struct Float {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  using Value = T;
  static constexpr size_t kFixedSize = sizeof(T);

  static void Write(ByteWriter& w, T v) { w.Raw(&v, sizeof v); }
  static Result<T> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(auto raw, r.Take(field, sizeof(T)));
    T v;
    std::memcpy(&v, raw.data(), sizeof v);
    if constexpr (kCheck == FloatCheck::kPositiveFinite) {
      if (!(v > 0) || !std::isfinite(v)) {
        return InvalidArgument(std::string(field) + " must be positive and finite");
      }
    }
    return v;
  }
  static std::string Type() { return sizeof(T) == 4 ? "f32" : "f64"; }
  static std::string Size() { return std::to_string(sizeof(T)); }
  static std::string Bound() { return kCheck == FloatCheck::kAny ? "" : "> 0, finite"; }
};

using F32 = Float<float>;
using F64 = Float<double>;

enum class BoolRead {
  kStrict,   ///< 0 or 1; anything else is InvalidArgument
  kNonZero,  ///< any nonzero byte is true (fields older decoders read that way)
};

/// A bool as a u8; written as 0 or 1.
template <BoolRead kRead>
struct BoolCodec {
  using Value = bool;
  static constexpr size_t kFixedSize = 1;

  static void Write(ByteWriter& w, bool v) { w.U8(v ? 1 : 0); }
  static Result<bool> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(uint8_t v, U8::Read(r, field));
    if (kRead == BoolRead::kStrict && v > 1) {
      return InvalidArgument(std::string(field) + " must be 0 or 1");
    }
    return v != 0;
  }
  static std::string Type() { return "u8"; }
  static std::string Size() { return "1"; }
  static std::string Bound() { return kRead == BoolRead::kStrict ? "0..1" : "nonzero: true"; }
};

using Bool = BoolCodec<BoolRead::kStrict>;
using NonZeroBool = BoolCodec<BoolRead::kNonZero>;

/// A scoped enum E whose values are 0..kLast, as its (unsigned) underlying integer; any other
/// value is InvalidArgument.
template <typename E, E kLast>
struct Enum {
  static_assert(std::is_enum_v<E>);
  using Raw = std::underlying_type_t<E>;
  static_assert(std::is_unsigned_v<Raw>);
  using Value = E;
  static constexpr size_t kFixedSize = sizeof(Raw);

  static void Write(ByteWriter& w, E v) { Int<Raw>::Write(w, static_cast<Raw>(v)); }
  static Result<E> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(Raw v, Int<Raw>::Read(r, field));
    if (v > static_cast<Raw>(kLast)) {
      return InvalidArgument(std::string(field) + ": unknown value " + std::to_string(v));
    }
    return static_cast<E>(v);
  }
  static std::string Type() { return Int<Raw>::Type(); }
  static std::string Size() { return Int<Raw>::Size(); }
  static std::string Bound() { return "0.." + std::to_string(static_cast<Raw>(kLast)); }
};

// ---- byte runs ----

enum class Overlong {
  kRefuse,  ///< the encoder writes it whole; the decoder refuses it
  kCut,     ///< the encoder cuts it to the bound (error messages)
};

/// A u32-length-prefixed string of kMin..kMax bytes.
template <size_t kMax, size_t kMin = 0, Overlong kOverlong = Overlong::kRefuse>
struct Str {
  using Value = std::string;
  static constexpr size_t kFixedSize = 0;

  static void Write(ByteWriter& w, std::string_view v) {
    w.Str(kOverlong == Overlong::kCut ? v.substr(0, kMax) : v);
  }
  static Result<std::string> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(std::string v, r.Str(field, kMax));
    if (v.size() < kMin) {
      return InvalidArgument(std::string(field) + " is shorter than " + std::to_string(kMin) +
                             " bytes");
    }
    return v;
  }
  static std::string Type() { return "str"; }
  static std::string Size() { return "4 + len"; }
  static std::string Bound() {
    std::string b = kMin > 0 ? std::to_string(kMin) + ".." + detail::HumanBytes(kMax)
                             : "≤ " + detail::HumanBytes(kMax);
    return kOverlong == Overlong::kCut ? b + ", cut by the sender" : b;
  }
};

/// A string the sender cuts to kMax bytes (error messages).
template <size_t kMax>
using CutStr = Str<kMax, 0, Overlong::kCut>;

/// A u32-length-prefixed byte run of kMin..kMax bytes.
template <size_t kMax, size_t kMin = 0>
struct Bytes {
  using Value = std::vector<std::byte>;
  static constexpr size_t kFixedSize = 0;

  static void Write(ByteWriter& w, std::span<const std::byte> v) { w.Blob(v); }
  static Result<Value> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(auto v, r.Blob(field, kMax));
    if (v.size() < kMin) {
      return InvalidArgument(std::string(field) + " is shorter than " + std::to_string(kMin) +
                             " bytes");
    }
    return Value(v.begin(), v.end());
  }
  static std::string Type() { return "blob"; }
  static std::string Size() { return "4 + len"; }
  static std::string Bound() {
    return kMin > 0 ? std::to_string(kMin) + ".." + detail::HumanBytes(kMax)
                    : "≤ " + detail::HumanBytes(kMax);
  }
};

/// At most kMaxCount trivially copyable elements (e.g. fp32 values), sent as a blob of their
/// bytes; a length that is not a whole number of elements is InvalidArgument.
template <typename T, size_t kMaxCount>
struct PodArray {
  static_assert(std::is_trivially_copyable_v<T>);
  using Value = std::vector<T>;
  static constexpr size_t kFixedSize = 0;

  static void Write(ByteWriter& w, const Value& v) { w.Blob(std::as_bytes(std::span<const T>(v))); }
  static Result<Value> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(auto raw, r.Blob(field, kMaxCount * sizeof(T)));
    if (raw.size() % sizeof(T) != 0) {
      return InvalidArgument(std::string(field) + ": length " + std::to_string(raw.size()) +
                             " is not a multiple of " + std::to_string(sizeof(T)));
    }
    Value v(raw.size() / sizeof(T));
    // memcpy from an empty span's null pointer is undefined, even for 0 bytes (UBSan).
    if (!raw.empty()) std::memcpy(v.data(), raw.data(), raw.size());
    return v;
  }
  static std::string Type() { return "blob"; }
  static std::string Size() { return "4 + " + std::to_string(sizeof(T)) + " × n"; }
  static std::string Bound() { return "≤ " + std::to_string(kMaxCount) + " elements"; }
};

// ---- composites ----

/// The end of a field table (the X-macro's rows each end in a comma).
struct End {};

/// One row of a field table: the member and its codec, with the doc table's name and meaning.
template <auto kMember, typename Codec>
struct Field {
  using codec = Codec;
  std::string_view name;
  std::string_view doc;
};

namespace detail {
template <typename S, typename F>
constexpr size_t FixedSizeOf() {
  if constexpr (std::is_same_v<F, End>) {
    return 0;
  } else {
    return F::codec::kFixedSize;
  }
}
template <typename S, typename Tuple>
struct FixedSum;
template <typename S, typename... F>
struct FixedSum<S, std::tuple<F...>> {
  // 0 (varies) when any field varies.
  static constexpr size_t value = ((std::is_same_v<F, End> || FixedSizeOf<S, F>() > 0) && ...)
                                      ? (FixedSizeOf<S, F>() + ...)
                                      : 0;
};
}  // namespace detail

/// Bytes of a wire struct S when every field has a fixed size, else 0.
template <typename S>
inline constexpr size_t kStructFixedSize = detail::FixedSum<S, decltype(S::WireFields())>::value;

template <typename S>
void WriteFields(ByteWriter& w, const S& s);
template <typename S>
Status ReadFields(ByteReader& r, S& s);

/// A wire struct (declared with ZPS_WIRE_FIELDS) inline: its fields, no length.
template <typename S>
struct Struct {
  using Value = S;
  static constexpr size_t kFixedSize = kStructFixedSize<S>;

  static void Write(ByteWriter& w, const S& v) { WriteFields(w, v); }
  static Result<S> Read(ByteReader& r, std::string_view /*field*/) {
    S v;
    ZPS_RETURN_IF_ERROR(ReadFields(r, v));
    return v;
  }
  static std::string Type() { return std::string(S::kWireName); }
  static std::string Size() { return kFixedSize > 0 ? std::to_string(kFixedSize) : "varies"; }
  static std::string Bound() { return ""; }
};

/// A pair of values, one after the other.
template <typename A, typename B>
struct Pair {
  using Value = std::pair<typename A::Value, typename B::Value>;
  static constexpr size_t kFixedSize =
      A::kFixedSize > 0 && B::kFixedSize > 0 ? A::kFixedSize + B::kFixedSize : 0;

  static void Write(ByteWriter& w, const Value& v) {
    A::Write(w, v.first);
    B::Write(w, v.second);
  }
  static Result<Value> Read(ByteReader& r, std::string_view field) {
    Value v;
    ZPS_ASSIGN_OR_RETURN(v.first, A::Read(r, field));
    ZPS_ASSIGN_OR_RETURN(v.second, B::Read(r, field));
    return v;
  }
  static std::string Type() { return "(" + A::Type() + ", " + B::Type() + ")"; }
  static std::string Size() {
    return kFixedSize > 0 ? std::to_string(kFixedSize) : A::Size() + " + " + B::Size();
  }
  static std::string Bound() { return ""; }
};

enum class Order { kAny, kStrictlyAscending };

/// A u32 count n in kMinCount..kMaxCount, then n elements. When the elements have a fixed size,
/// a count the remaining input cannot hold is refused before anything is allocated.
template <typename Elem, uint32_t kMaxCount = std::numeric_limits<uint32_t>::max(),
          uint32_t kMinCount = 0, Order kOrder = Order::kAny>
struct List {
  using Value = std::vector<typename Elem::Value>;
  static constexpr size_t kFixedSize = 0;

  static void Write(ByteWriter& w, const Value& v) {
    w.U32(static_cast<uint32_t>(v.size()));
    for (const auto& e : v) Elem::Write(w, e);
  }
  static Result<Value> Read(ByteReader& r, std::string_view field) {
    ZPS_ASSIGN_OR_RETURN(uint32_t n, U32::Read(r, field));
    if (detail::Outside<uint32_t, kMinCount, kMaxCount>(n)) {
      return InvalidArgument(std::string(field) + ": count " + std::to_string(n) + " is outside " +
                             Bound());
    }
    Value v;
    if constexpr (Elem::kFixedSize > 0) {
      if (uint64_t{n} * Elem::kFixedSize > r.remaining()) {
        return InvalidArgument(std::string(field) + ": count " + std::to_string(n) +
                               " is more than the input holds");
      }
      v.reserve(n);
    }
    for (uint32_t i = 0; i < n; ++i) {
      ZPS_ASSIGN_OR_RETURN(auto e, Elem::Read(r, field));
      if constexpr (kOrder == Order::kStrictlyAscending) {
        if (!v.empty() && !(v.back() < e)) {
          return InvalidArgument(std::string(field) + " must be strictly ascending");
        }
      }
      v.push_back(std::move(e));
    }
    return v;
  }
  static std::string Type() {
    std::string t = "u32 n + n × " + Elem::Type();
    return kOrder == Order::kStrictlyAscending ? t + ", ascending" : t;
  }
  static std::string Size() {
    const std::string e = Elem::Size();
    return "4 + n × " + (e.find(' ') == std::string::npos ? e : "(" + e + ")");
  }
  static std::string Bound() {
    constexpr bool lo = kMinCount > 0;
    constexpr bool hi = kMaxCount != std::numeric_limits<uint32_t>::max();
    std::string b = lo && hi ? "n " + std::to_string(kMinCount) + ".." + std::to_string(kMaxCount)
                    : hi     ? "n ≤ " + std::to_string(kMaxCount)
                    : lo     ? "n ≥ " + std::to_string(kMinCount)
                             : "";
    const std::string each = Elem::Bound();
    if (each.empty()) return b;
    return b.empty() ? "each " + each : b + "; each " + each;
  }
};

/// An optional last field that older peers omit: written only when the value is not kDefault,
/// and read only when input is left (else kDefault).
template <typename C, typename C::Value kDefault>
struct Trailing {
  using Value = typename C::Value;
  static constexpr size_t kFixedSize = 0;
  static constexpr bool kIsTrailing = true;

  static void Write(ByteWriter& w, const Value& v) {
    if (v != kDefault) C::Write(w, v);
  }
  static Result<Value> Read(ByteReader& r, std::string_view field) {
    if (r.remaining() == 0) return kDefault;
    return C::Read(r, field);
  }
  static std::string Type() { return C::Type() + " (optional)"; }
  static std::string Size() { return "0 or " + C::Size(); }
  static std::string Bound() { return C::Bound(); }
};

// ---- whole structs ----

/// The C++ type a codec decodes to.
template <typename C>
using ValueOf = typename C::Value;

namespace detail {
template <typename S, auto kMember, typename C>
void WriteField(ByteWriter& w, const S& s, const Field<kMember, C>& /*f*/) {
  C::Write(w, s.*kMember);
}
template <typename S>
void WriteField(ByteWriter& /*w*/, const S& /*s*/, const End& /*f*/) {}

template <typename S, auto kMember, typename C>
bool ReadField(ByteReader& r, S& s, const Field<kMember, C>& f, Status& st) {
  auto v = C::Read(r, f.name);
  if (!v.ok()) {
    st = v.status();
    return false;
  }
  s.*kMember = std::move(v).value();
  return true;
}
template <typename S>
bool ReadField(ByteReader& /*r*/, S& /*s*/, const End& /*f*/, Status& /*st*/) {
  return true;
}

template <typename F>
constexpr bool IsTrailing() {
  if constexpr (std::is_same_v<F, End>) {
    return false;
  } else {
    return requires { F::codec::kIsTrailing; };
  }
}
template <typename Tuple>
struct TrailingLast;
template <typename... F>
struct TrailingLast<std::tuple<F...>> {
  // Positions of trailing fields; each must be the one before End (the last row).
  static constexpr bool value = [] {
    constexpr bool trailing[] = {IsTrailing<F>()...};
    for (size_t i = 0; i + 2 < sizeof...(F); ++i) {
      if (trailing[i]) return false;
    }
    return true;
  }();
};
}  // namespace detail

/// Writes the fields of S in table order.
template <typename S>
void WriteFields(ByteWriter& w, const S& s) {
  static constexpr auto kFields = S::WireFields();
  std::apply([&](const auto&... f) { (detail::WriteField(w, s, f), ...); }, kFields);
}

/// Reads the fields of S in table order; stops at the first error.
template <typename S>
Status ReadFields(ByteReader& r, S& s) {
  static_assert(detail::TrailingLast<decltype(S::WireFields())>::value,
                "a Trailing field must be the last row of its table");
  static constexpr auto kFields = S::WireFields();
  Status st;
  std::apply([&](const auto&... f) { (detail::ReadField(r, s, f, st) && ...); }, kFields);
  return st;
}

/// The encoding of a message.
template <typename M>
std::vector<std::byte> Encode(const M& m) {
  ByteWriter w;
  WriteFields(w, m);
  return w.Take();
}

/// Decodes a message that must fill `b` exactly.
template <typename M>
Result<M> Decode(std::span<const std::byte> b) {
  ByteReader r(b);
  M m;
  ZPS_RETURN_IF_ERROR(ReadFields(r, m));
  ZPS_RETURN_IF_ERROR(r.ExpectEnd(M::kWireName));
  return m;
}

/// The markdown table of S's fields: | field | type | bytes | bound | meaning |.
template <typename S>
std::string FieldTable() {
  std::string out =
      "| field | type | bytes | bound | meaning |\n"
      "|---|---|---|---|---|\n";
  auto row = [&](const auto& f) {
    using F = std::decay_t<decltype(f)>;
    if constexpr (!std::is_same_v<F, End>) {
      using C = typename F::codec;
      out += "| `" + std::string(f.name) + "` | " + C::Type() + " | " + C::Size() + " | " +
             C::Bound() + " | " + std::string(f.doc) + " |\n";
    }
  };
  std::apply([&](const auto&... f) { (row(f), ...); }, S::WireFields());
  return out;
}

}  // namespace zps::wire

// One row: X(member, default, "meaning", Codec...). The codec is last and variadic so that
// template arguments may contain commas.
#define ZPS_WIRE_MEMBER_(name, init, doc, ...) ::zps::wire::ValueOf<__VA_ARGS__> name = init;
#define ZPS_WIRE_ROW_(name, init, doc, ...) \
  ::zps::wire::Field<&WireSelf::name, __VA_ARGS__>{#name, doc},

/// Declares, inside `struct Name`, the members listed by FIELDS (an X-macro taking the row macro)
/// and the table the generic codec and the doc test read.
#define ZPS_WIRE_FIELDS(Name, FIELDS)                  \
  FIELDS(ZPS_WIRE_MEMBER_)                             \
  using WireSelf = Name;                               \
  static constexpr std::string_view kWireName = #Name; \
  static constexpr auto WireFields() { return std::tuple{FIELDS(ZPS_WIRE_ROW_)::zps::wire::End{}}; }

/// ZPS_WIRE_FIELDS plus Encode/Decode (defined by ZPS_WIRE_DEFINE_CODEC in one .cc file).
#define ZPS_WIRE_MESSAGE(Name, FIELDS)   \
  ZPS_WIRE_FIELDS(Name, FIELDS)          \
  std::vector<std::byte> Encode() const; \
  static ::zps::Result<Name> Decode(std::span<const std::byte> b);

#define ZPS_WIRE_DEFINE_CODEC(Name)                                                  \
  std::vector<std::byte> Name::Encode() const { return ::zps::wire::Encode(*this); } \
  ::zps::Result<Name> Name::Decode(std::span<const std::byte> b) {                   \
    return ::zps::wire::Decode<Name>(b);                                             \
  }
