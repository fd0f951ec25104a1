// The job spec's codecs, all driven by the field lists of job_spec.h: enum names, the binary form
// (JobSpec and the optimizer record), the JSON job description, and the docs' tables.
#include "zps/common/job_spec.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "zps/common/bytes.h"
#include "zps/common/crc32c.h"
#include "zps/common/json_fields.h"
#include "zps/common/serving_quant.h"

namespace zps {
namespace {

using Json = nlohmann::json;

// ---- enums ----------------------------------------------------------------------------------

template <typename E>
struct EnumInfo;

#define ZPS_ENUM_ENTRY(id, value, name) std::pair{E::id, std::string_view(name)},
#define ZPS_ENUM_INFO(Type, LIST, WHAT)                                                 \
  template <>                                                                           \
  struct EnumInfo<Type> {                                                               \
    using E = Type;                                                                     \
    static constexpr std::string_view kWhat = WHAT;                                     \
    static constexpr std::pair<E, std::string_view> kValues[] = {LIST(ZPS_ENUM_ENTRY)}; \
  };
ZPS_ENUM_INFO(ReductionMode, ZPS_REDUCTION_MODE_VALUES, "reduction mode")
ZPS_ENUM_INFO(UpdateMode, ZPS_UPDATE_MODE_VALUES, "update mode")
ZPS_ENUM_INFO(OptimizerKind, ZPS_OPTIMIZER_KIND_VALUES, "optimizer")
ZPS_ENUM_INFO(LrScheduleKind, ZPS_LR_SCHEDULE_KIND_VALUES, "lr schedule")
ZPS_ENUM_INFO(WarmupType, ZPS_WARMUP_TYPE_VALUES, "lr schedule: warmup_type")
ZPS_ENUM_INFO(StateDType, ZPS_STATE_DTYPE_VALUES, "optimizer: state_dtype")
#undef ZPS_ENUM_INFO
#undef ZPS_ENUM_ENTRY

template <typename T>
concept NamedEnum = requires {
  EnumInfo<T>::kValues;
};

template <NamedEnum E>
std::string_view NameOf(E e) {
  for (const auto& [v, name] : EnumInfo<E>::kValues) {
    if (v == e) return name;
  }
  return "unknown";
}

// "a, b or c".
std::string Alternatives(std::span<const std::string_view> names, std::string_view last_sep) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? last_sep : ", ";
    out += names[i];
  }
  return out;
}

template <NamedEnum E>
std::vector<std::string_view> NamesOf() {
  std::vector<std::string_view> names;
  for (const auto& [v, name] : EnumInfo<E>::kValues) names.push_back(name);
  return names;
}

template <NamedEnum E>
Result<E> ParseEnum(std::string_view text) {
  for (const auto& [v, name] : EnumInfo<E>::kValues) {
    if (name == text) return v;
  }
  return InvalidArgument(std::string(EnumInfo<E>::kWhat) + " must be " +
                         Alternatives(NamesOf<E>(), " or ") + "; got '" + std::string(text) + "'");
}

template <NamedEnum E>
bool KnownByte(uint8_t b) {
  for (const auto& [v, name] : EnumInfo<E>::kValues) {
    if (static_cast<uint8_t>(v) == b) return true;
  }
  return false;
}

// ---- field descriptors ------------------------------------------------------------------------

template <typename S, typename T>
struct Field {
  using Type = T;
  std::string_view member;
  T S::*ptr;
  std::string_view key;
  uint32_t version;
  double lo;
  double hi;
  std::string_view doc;
};

template <typename S>
struct Schema;

#define ZPS_FIELD_DESC(type, member, def, key, version, lo, hi, doc) \
  Field<Self, type>{#member, &Self::member, key, version, lo, hi, doc},
#define ZPS_SCHEMA(S, LIST)                                           \
  template <>                                                         \
  struct Schema<S> {                                                  \
    using Self = S;                                                   \
    static constexpr auto kFields = std::tuple{LIST(ZPS_FIELD_DESC)}; \
  };
ZPS_SCHEMA(OptimizerConfig, ZPS_OPTIMIZER_CONFIG_FIELDS)
ZPS_SCHEMA(CommitConfig, ZPS_COMMIT_CONFIG_FIELDS)
ZPS_SCHEMA(LrScheduleConfig, ZPS_LR_SCHEDULE_CONFIG_FIELDS)
ZPS_SCHEMA(ParamGroup, ZPS_PARAM_GROUP_FIELDS)
ZPS_SCHEMA(ShardJob, ZPS_SHARD_JOB_FIELDS)

// The layout's JSON keys (the layout's binary form is Layout::Serialize, a blob in the job spec;
// LayoutOptions keeps its own defaults, so the default column is unused here).
#define ZPS_LAYOUT_JSON_FIELDS(X)                                                              \
  X(uint64_t, chunk_elems, 0, "chunk_elems", 1, 1, 1e12,                                       \
    "elements per chunk (zps.torch sends zps.chunk_elems)")                                    \
  X(uint32_t, align_elems, 0, "align_elems", 1, 1, 1 << 20,                                    \
    "every parameter starts at a multiple of this many elements (without it: 64, or 256, the " \
    "weight block, with an int8-block serving copy)")                                          \
  X(uint32_t, num_shards, 0, "num_shards", 1, 1, 65536, "server shards the chunks are spread over")
ZPS_SCHEMA(LayoutOptions, ZPS_LAYOUT_JSON_FIELDS)
#undef ZPS_SCHEMA
#undef ZPS_FIELD_DESC

template <typename T>
concept Record = requires {
  Schema<T>::kFields;
};

// Calls fn(field) for each field of S in list order, stopping at the first error.
template <Record S, typename Fn>
Status ForEachField(Fn&& fn) {
  Status st;
  std::apply([&](const auto&... f) { (void)((st = fn(f)).ok() && ...); }, Schema<S>::kFields);
  return st;
}

// A default-constructed S: the defaults of the field list.
template <typename S>
const S& DefaultOf() {
  static const S kDefault{};
  return kDefault;
}

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// ---- binary -----------------------------------------------------------------------------------

// Lists longer than this are refused before anything is allocated.
constexpr uint32_t kMaxListLength = 1u << 24;

template <typename T>
void Put(ByteWriter& w, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    w.U8(v ? 1 : 0);
  } else if constexpr (std::is_enum_v<T>) {  // the named enums and DType: one byte
    w.U8(static_cast<uint8_t>(v));
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    w.U8(v);
  } else if constexpr (std::is_same_v<T, uint32_t>) {
    w.U32(v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    w.I64(v);
  } else if constexpr (std::is_same_v<T, float>) {
    w.F32(v);
  } else if constexpr (std::is_same_v<T, double>) {
    w.F64(v);
  } else if constexpr (IsVector<T>::value) {
    w.U32(static_cast<uint32_t>(v.size()));
    for (const auto& e : v) Put(w, e);
  } else {
    static_assert(Record<T>, "no binary encoding for this field type");
    (void)ForEachField<T>([&](const auto& f) {
      Put(w, v.*f.ptr);
      return Status::Ok();
    });
  }
}

// The encoded size of one T (a lower bound for a list element), for length checks.
template <typename T>
size_t EncodedSize() {
  ByteWriter w;
  Put(w, T{});
  return w.size();
}

template <typename T>
Status Get(ByteReader& r, const std::string& label, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    ZPS_ASSIGN_OR_RETURN(uint8_t b, r.U8(label));
    if (b > 1) return InvalidArgument(label + ": bad boolean " + std::to_string(b));
    *out = b == 1;
  } else if constexpr (std::is_same_v<T, DType>) {
    ZPS_ASSIGN_OR_RETURN(uint8_t b, r.U8(label));
    ZPS_ASSIGN_OR_RETURN(*out, DTypeFromByte(b));
  } else if constexpr (NamedEnum<T>) {
    ZPS_ASSIGN_OR_RETURN(uint8_t b, r.U8(label));
    if (!KnownByte<T>(b)) return InvalidArgument(label + " " + std::to_string(b) + " is unknown");
    *out = static_cast<T>(b);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    ZPS_ASSIGN_OR_RETURN(*out, r.U8(label));
  } else if constexpr (std::is_same_v<T, uint32_t>) {
    ZPS_ASSIGN_OR_RETURN(*out, r.U32(label));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    ZPS_ASSIGN_OR_RETURN(*out, r.I64(label));
  } else if constexpr (std::is_same_v<T, float>) {
    ZPS_ASSIGN_OR_RETURN(*out, r.F32(label));
  } else if constexpr (std::is_same_v<T, double>) {
    ZPS_ASSIGN_OR_RETURN(*out, r.F64(label));
  } else if constexpr (IsVector<T>::value) {
    using E = typename T::value_type;
    ZPS_ASSIGN_OR_RETURN(uint32_t n, r.U32(label));
    if (n > kMaxListLength || n * EncodedSize<E>() > r.remaining()) {
      return InvalidArgument(label + ": bad length " + std::to_string(n));
    }
    out->assign(n, E{});
    for (E& e : *out) ZPS_RETURN_IF_ERROR(Get(r, label, &e));
  } else {
    static_assert(Record<T>, "no binary decoding for this field type");
    return ForEachField<T>(
        [&](const auto& f) { return Get(r, label + "." + std::string(f.member), &(out->*f.ptr)); });
  }
  return Status::Ok();
}

// The fields of `s` that appear in binary version `v`.
template <Record S>
void PutVersion(ByteWriter& w, const S& s, uint32_t v) {
  (void)ForEachField<S>([&](const auto& f) {
    if (f.version == v) Put(w, s.*f.ptr);
    return Status::Ok();
  });
}

template <Record S>
Status GetVersion(ByteReader& r, S* s, uint32_t v) {
  return ForEachField<S>([&](const auto& f) {
    return f.version == v ? Get(r, "job." + std::string(f.member), &(s->*f.ptr)) : Status::Ok();
  });
}

// The highest version of a field of `s` that is not at its default (1 if none).
template <Record S>
uint32_t VersionNeeded(const S& s) {
  uint32_t v = 1;
  (void)ForEachField<S>([&](const auto& f) {
    if (!(s.*f.ptr == DefaultOf<S>().*f.ptr)) v = std::max(v, f.version);
    return Status::Ok();
  });
  return v;
}

constexpr uint32_t kJobMagic = 0x5a50534au;  // "ZPSJ"
constexpr size_t kMaxLayoutBytes = 512u << 20;
constexpr size_t kMaxOptimizerBytes = 4096;

// The optimizer record: "ZOPT", u16 version, u16 body length, the body (the fields of versions
// 1 to the record's, in list order), u32 CRC32C of everything before it. A later version appends
// fields; readers reject versions they do not know.
constexpr char kOptMagic[4] = {'Z', 'O', 'P', 'T'};
constexpr uint16_t kOptVersion = 2;
constexpr size_t kOptHeader = 8;

// The JobSpec version that carries an optimizer record of version `v` (record version 2 came
// with job spec version 4).
constexpr uint32_t JobVersionOfOptRecord(uint32_t v) { return v <= 1 ? 1 : 4; }

// The binary version a field of S is documented under in the job spec's tables.
template <typename S>
uint32_t JobVersionOf(uint32_t field_version) {
  if constexpr (std::is_same_v<S, OptimizerConfig>) {
    return JobVersionOfOptRecord(field_version);
  } else {
    return field_version;
  }
}

// ---- JSON -------------------------------------------------------------------------------------

template <typename T>
std::string KeysOf() {
  std::vector<std::string_view> keys;
  (void)ForEachField<T>([&](const auto& f) {
    keys.push_back(f.key);
    return Status::Ok();
  });
  return "{" + Alternatives(keys, ", ") + "}";
}

template <Record S>
Status RecordFromJson(const Json& j, const std::string& where, S* s);

template <typename S, typename T>
Status FieldFromJson(JsonFields& in, const Field<S, T>& f, T* out) {
  const std::string key(f.key);
  if constexpr (std::is_same_v<T, bool>) {
    return in.Bool(key, out);
  } else if constexpr (std::is_arithmetic_v<T>) {
    return in.Number(key, out, f.lo, f.hi);
  } else if constexpr (std::is_same_v<T, DType> || NamedEnum<T>) {
    std::string text;
    ZPS_RETURN_IF_ERROR(in.String(key, &text));
    if (in.Get(key) == nullptr) return Status::Ok();
    if constexpr (std::is_same_v<T, DType>) {
      ZPS_ASSIGN_OR_RETURN(*out, ParseDType(text));
    } else {
      ZPS_ASSIGN_OR_RETURN(*out, ParseEnum<T>(text));
    }
    return Status::Ok();
  } else if constexpr (IsVector<T>::value) {
    using E = typename T::value_type;
    const Json* v = in.Get(key);
    if (v == nullptr) return Status::Ok();
    if constexpr (Record<E>) {
      if (!v->is_array()) return in.Bad(key, "a list of " + KeysOf<E>());
      for (size_t i = 0; i < v->size(); ++i) {
        E e;
        ZPS_RETURN_IF_ERROR(
            RecordFromJson((*v)[i], in.where() + "." + key + "[" + std::to_string(i) + "]", &e));
        out->push_back(e);
      }
    } else {
      const auto lo = static_cast<int64_t>(f.lo), hi = static_cast<int64_t>(f.hi);
      if (!v->is_array()) return in.Bad(key, "a list of integers");
      out->reserve(v->size());
      for (const auto& e : *v) {
        if (!e.is_number_integer() || e.get<int64_t>() < lo || e.get<int64_t>() > hi) {
          return in.Bad(key,
                        "integers in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        }
        out->push_back(static_cast<E>(e.get<int64_t>()));
      }
    }
    return Status::Ok();
  } else {
    static_assert(Record<T>, "no JSON decoding for this field type");
    const Json* v = in.Get(key);
    return v == nullptr ? Status::Ok() : RecordFromJson(*v, in.where() + "." + key, out);
  }
}

template <Record S>
Status RecordFields(JsonFields& in, S* s) {
  return ForEachField<S>([&](const auto& f) { return FieldFromJson(in, f, &(s->*f.ptr)); });
}

template <Record S>
Status RecordFromJson(const Json& j, const std::string& where, S* s) {
  JsonFields in(j, where);
  ZPS_RETURN_IF_ERROR(in.Check());
  ZPS_RETURN_IF_ERROR(RecordFields(in, s));
  return in.Finish();
}

Result<std::vector<ParamSpec>> ParamsFromJson(const Json& list) {
  if (!list.is_array() || list.empty()) {
    return InvalidArgument("job.params must be a non-empty list");
  }
  std::vector<ParamSpec> specs;
  specs.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    JsonFields f(list[i], "job.params[" + std::to_string(i) + "]");
    ZPS_RETURN_IF_ERROR(f.Check());
    ParamSpec s;
    ZPS_RETURN_IF_ERROR(f.String("name", &s.name));
    const Json* shape = f.Get("shape");
    if (shape == nullptr || !shape->is_array()) return f.Bad("shape", "a list of dimensions");
    for (const auto& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0) {
        return f.Bad("shape", "positive integers");
      }
      s.shape.push_back(d.get<int64_t>());
    }
    // A 0-dimensional tensor (a scalar parameter) is one element.
    if (s.shape.empty()) s.shape.push_back(1);
    ZPS_RETURN_IF_ERROR(f.Finish());
    specs.push_back(std::move(s));
  }
  return specs;
}

// ---- docs -------------------------------------------------------------------------------------

// The shortest text that reads back as the same value.
template <typename F>
std::string Number(F x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  return ec == std::errc() ? std::string(buf, end) : "?";
}

template <typename T>
std::string TypeText() {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_same_v<T, DType>) {
    return "fp32, fp16 or bf16";
  } else if constexpr (NamedEnum<T>) {
    return Alternatives(NamesOf<T>(), " or ");
  } else if constexpr (std::is_same_v<T, float>) {
    return "f32";
  } else if constexpr (std::is_same_v<T, double>) {
    return "f64";
  } else if constexpr (std::is_integral_v<T>) {
    return (std::is_signed_v<T> ? "i" : "u") + std::to_string(8 * sizeof(T));
  } else if constexpr (IsVector<T>::value) {
    using E = typename T::value_type;
    if constexpr (Record<E>) {
      return "list of " + KeysOf<E>();
    } else {
      return "list of " + TypeText<E>();
    }
  } else {
    return "object";
  }
}

template <typename T>
std::string ValueText(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, DType>) {
    return std::string(DTypeName(v));
  } else if constexpr (NamedEnum<T>) {
    return std::string(NameOf(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    return Number(v);
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (IsVector<T>::value) {
    return v.empty() ? "[]" : "(" + std::to_string(v.size()) + " entries)";
  } else {
    return "";
  }
}

std::string Bound(double x) { return x == job_limits::kFloatMax ? "FLT_MAX" : Number(x); }
std::string Range(double lo, double hi) { return "[" + Bound(lo) + ", " + Bound(hi) + "]"; }

// One row per JSON key of S (nested records and lists of records expanded below their key).
// `version` > 0: the binary version every field is carried in (a nested record's parent's).
template <Record S>
void JsonRows(std::string& out, const std::string& prefix, uint32_t version, bool with_default) {
  (void)ForEachField<S>([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    const std::string key = prefix + std::string(f.key);
    const uint32_t v = version > 0 ? version : JobVersionOf<S>(f.version);
    std::string type = TypeText<T>();
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      type += " in " + Range(f.lo, f.hi);
    if constexpr (IsVector<T>::value) {
      if constexpr (!Record<typename T::value_type>) type += " in " + Range(f.lo, f.hi);
    }
    const std::string def = with_default ? ValueText(DefaultOf<S>().*f.ptr) : "";
    out += "| `" + key + "` | " + type + " | " + (def.empty() ? "" : "`" + def + "`") + " | " +
           std::to_string(v) + " | " + std::string(f.doc) + " |\n";
    if constexpr (Record<T>) {
      JsonRows<T>(out, key + ".", v, true);
    } else if constexpr (IsVector<T>::value) {
      if constexpr (Record<typename T::value_type>) {
        JsonRows<typename T::value_type>(out, key + "[].", v, true);
      }
    }
    return Status::Ok();
  });
}

template <typename T>
std::string WireType() {
  if constexpr (NamedEnum<T>) {
    std::string text = "u8:";
    for (const auto& [v, name] : EnumInfo<T>::kValues) {
      text += " " + std::to_string(static_cast<int>(v)) + " " + std::string(name) + ",";
    }
    text.pop_back();
    return text;
  } else if constexpr (std::is_same_v<T, bool>) {
    return "u8: 0 false, 1 true";
  } else if constexpr (std::is_enum_v<T>) {  // DType
    return "u8 (DType)";
  } else if constexpr (std::is_arithmetic_v<T>) {
    return TypeText<T>();
  } else if constexpr (IsVector<T>::value) {
    using E = typename T::value_type;
    if constexpr (Record<E>) {
      std::vector<std::string> parts;
      (void)ForEachField<E>([&](const auto& f) {
        parts.push_back(std::string(f.member) + " " +
                        WireType<typename std::decay_t<decltype(f)>::Type>());
        return Status::Ok();
      });
      std::string inner;
      for (size_t i = 0; i < parts.size(); ++i) inner += (i ? ", " : "") + parts[i];
      return "u32 n, n × (" + inner + ")";
    } else {
      return "u32 n, n × " + WireType<E>();
    }
  } else {
    return "";
  }
}

// One row per binary field of S with version `v` (all of them when v == 0), nested records inline.
template <Record S>
void WireRows(std::string& out, const std::string& prefix, uint32_t v, uint32_t shown_version) {
  (void)ForEachField<S>([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    if (v != 0 && f.version != v) return Status::Ok();
    const std::string name = prefix + std::string(f.member);
    const uint32_t shown = shown_version > 0 ? shown_version : f.version;
    if constexpr (Record<T>) {
      WireRows<T>(out, name + ".", 0, shown);
    } else {
      out += "| `" + name + "` | " + WireType<T>() + " | " + std::to_string(shown) + " |\n";
    }
    return Status::Ok();
  });
}

}  // namespace

// ---- enum names -------------------------------------------------------------------------------

std::string_view ReductionModeName(ReductionMode m) { return NameOf(m); }
std::string_view UpdateModeName(UpdateMode m) { return NameOf(m); }
std::string_view OptimizerKindName(OptimizerKind kind) { return NameOf(kind); }
std::string_view LrScheduleKindName(LrScheduleKind kind) { return NameOf(kind); }
std::string_view WarmupTypeName(WarmupType type) { return NameOf(type); }
std::string_view StateDTypeName(StateDType dtype) { return NameOf(dtype); }
Result<ReductionMode> ParseReductionMode(std::string_view text) {
  return ParseEnum<ReductionMode>(text);
}
Result<UpdateMode> ParseUpdateMode(std::string_view text) { return ParseEnum<UpdateMode>(text); }
Result<OptimizerKind> ParseOptimizerKind(std::string_view text) {
  return ParseEnum<OptimizerKind>(text);
}
Result<LrScheduleKind> ParseLrScheduleKind(std::string_view text) {
  return ParseEnum<LrScheduleKind>(text);
}
Result<WarmupType> ParseWarmupType(std::string_view text) { return ParseEnum<WarmupType>(text); }
Result<StateDType> ParseStateDType(std::string_view text) { return ParseEnum<StateDType>(text); }

// ---- OptimizerConfig record -------------------------------------------------------------------

std::vector<std::byte> OptimizerConfig::Serialize() const {
  const uint32_t version = VersionNeeded(*this);
  ByteWriter body;
  for (uint32_t v = 1; v <= version; ++v) PutVersion(body, *this, v);
  ByteWriter w;
  for (char c : kOptMagic) w.U8(static_cast<uint8_t>(c));
  w.U16(static_cast<uint16_t>(version));
  w.U16(static_cast<uint16_t>(body.size()));
  w.Raw(body.buffer().data(), body.size());
  w.U32(Crc32c(w.buffer()));
  return w.Take();
}

Result<OptimizerConfig> OptimizerConfig::Deserialize(std::span<const std::byte> bytes) {
  if (bytes.size() < kOptHeader) {
    return InvalidArgument("optimizer config: " + std::to_string(bytes.size()) +
                           " bytes is too short for a header");
  }
  if (std::memcmp(bytes.data(), kOptMagic, 4) != 0) {
    return InvalidArgument("optimizer config: bad magic (not an optimizer config)");
  }
  ByteReader header(bytes.subspan(4, 4));
  ZPS_ASSIGN_OR_RETURN(uint16_t version, header.U16("optimizer.version"));
  ZPS_ASSIGN_OR_RETURN(uint16_t body_len, header.U16("optimizer.length"));
  if (version < 1 || version > kOptVersion) {
    return InvalidArgument("optimizer config: unsupported version " + std::to_string(version) +
                           " (this build reads versions 1 to " + std::to_string(kOptVersion) + ")");
  }
  ByteWriter defaults;
  for (uint32_t v = 1; v <= version; ++v) PutVersion(defaults, OptimizerConfig{}, v);
  const size_t body_want = defaults.size();
  if (body_len != body_want || bytes.size() != kOptHeader + body_want + 4) {
    return InvalidArgument("optimizer config: wrong length " + std::to_string(bytes.size()) +
                           " (body " + std::to_string(body_len) + ") for version " +
                           std::to_string(version));
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  if (Crc32c(bytes.first(bytes.size() - 4)) != stored_crc) {
    return DataLoss("optimizer config: checksum mismatch");
  }
  ByteReader r(bytes.subspan(kOptHeader, body_want));
  OptimizerConfig c;
  for (uint32_t v = 1; v <= version; ++v) {
    ZPS_RETURN_IF_ERROR(ForEachField<OptimizerConfig>([&](const auto& f) {
      return f.version == v
                 ? Get(r, "optimizer config: optimizer." + std::string(f.member), &(c.*f.ptr))
                 : Status::Ok();
    }));
  }
  ZPS_RETURN_IF_ERROR(c.Validate());
  return c;
}

// ---- JobSpec ----------------------------------------------------------------------------------

std::vector<std::byte> JobSpec::Serialize() const {
  const uint32_t version = std::max({VersionNeeded(shard), VersionNeeded(commit),
                                     JobVersionOfOptRecord(VersionNeeded(optimizer))});
  ByteWriter w;
  w.U32(kJobMagic);
  w.U32(version);
  for (uint32_t v = 1; v <= version; ++v) {
    if (v == 1) w.Blob(layout.Serialize());
    PutVersion(w, shard, v);
    if (v == 1) w.Blob(optimizer.Serialize());
    PutVersion(w, commit, v);
  }
  return w.Take();
}

Result<JobSpec> JobSpec::Deserialize(std::span<const std::byte> bytes) {
  ByteReader r(bytes);
  ZPS_ASSIGN_OR_RETURN(uint32_t magic, r.U32("job.magic"));
  if (magic != kJobMagic) return InvalidArgument("not a zps job spec (bad magic)");
  ZPS_ASSIGN_OR_RETURN(uint32_t version, r.U32("job.version"));
  if (version < 1 || version > kJobSpecVersion) {
    return InvalidArgument("unsupported job spec version " + std::to_string(version) +
                           " (this build reads 1 to " + std::to_string(kJobSpecVersion) + ")");
  }
  ZPS_ASSIGN_OR_RETURN(auto layout_bytes, r.Blob("job.layout", kMaxLayoutBytes));
  ZPS_ASSIGN_OR_RETURN(Layout layout, Layout::Deserialize(layout_bytes));
  JobSpec j{std::move(layout), {}, {}, {}};
  for (uint32_t v = 1; v <= version; ++v) {
    ZPS_RETURN_IF_ERROR(GetVersion(r, &j.shard, v));
    if (v == 1) {
      ZPS_ASSIGN_OR_RETURN(auto opt_bytes, r.Blob("job.optimizer", kMaxOptimizerBytes));
      ZPS_ASSIGN_OR_RETURN(j.optimizer, OptimizerConfig::Deserialize(opt_bytes));
    }
    ZPS_RETURN_IF_ERROR(GetVersion(r, &j.commit, v));
  }
  if (JobVersionOfOptRecord(VersionNeeded(j.optimizer)) > version) {
    return InvalidArgument("job spec version " + std::to_string(version) +
                           " carries an optimizer record of a later version (optimizer.state_dtype "
                           "needs job spec version 4)");
  }
  ZPS_RETURN_IF_ERROR(r.ExpectEnd("job spec"));
  ZPS_RETURN_IF_ERROR(j.Validate());
  return j;
}

uint64_t JobSpec::Hash() const {
  auto bytes = Serialize();
  uint64_t h = 1469598103934665603ull;
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 1099511628211ull;
  }
  return h;
}

Status JobSpec::Validate() const {
  ZPS_RETURN_IF_ERROR(optimizer.Validate());
  ZPS_RETURN_IF_ERROR(ValidateShardJob(shard, layout, optimizer));
  ZPS_RETURN_IF_ERROR(commit.Validate());
  return Status::Ok();
}

Result<JobSpec> JobSpecFromJson(std::string_view json) {
  ZPS_ASSIGN_OR_RETURN(Json doc, JsonFields::Parse(json, "the job description"));
  JsonFields f(doc, "job");
  ZPS_RETURN_IF_ERROR(f.Check());
  const Json* params = f.Get("params");
  if (params == nullptr) return InvalidArgument("job.params is missing");
  ZPS_ASSIGN_OR_RETURN(auto specs, ParamsFromJson(*params));
  OptimizerConfig optimizer;
  CommitConfig commit;
  ShardJob shard;
  if (const Json* o = f.Get("optimizer")) {
    ZPS_RETURN_IF_ERROR(RecordFromJson(*o, "job.optimizer", &optimizer));
  }
  if (const Json* c = f.Get("commit")) {
    ZPS_RETURN_IF_ERROR(RecordFromJson(*c, "job.commit", &commit));
  }
  if (const Json* s = f.Get("shard")) {
    ZPS_RETURN_IF_ERROR(RecordFromJson(*s, "job.shard", &shard));
  }
  // Without an "align_elems", the serving copy's: a block-quantized copy puts every parameter
  // on blocks of its own (ServingAlignElems).
  LayoutOptions lo{.align_elems = ServingAlignElems(shard.serving_dtype)};
  ZPS_RETURN_IF_ERROR(RecordFields(f, &lo));
  ZPS_ASSIGN_OR_RETURN(Layout layout, Layout::Build(std::move(specs), lo));
  JobSpec job{std::move(layout), std::move(shard), optimizer, commit};
  ZPS_RETURN_IF_ERROR(f.Finish());
  ZPS_RETURN_IF_ERROR(job.Validate());
  return job;
}

std::string JobSpecDocTable(std::string_view which) {
  std::string out;
  if (which == "json") {
    out += "| key | type | default | binary version | meaning |\n";
    out += "|---|---|---|---|---|\n";
    out +=
        "| `params` | list of {name, shape} | | 1 | the parameters in order; a shape [] is one "
        "element |\n";
    JsonRows<LayoutOptions>(out, "", 0, true);
    JsonRows<OptimizerConfig>(out, "optimizer.", 0, true);
    JsonRows<CommitConfig>(out, "commit.", 0, true);
    JsonRows<ShardJob>(out, "shard.", 0, true);
  } else if (which == "binary") {
    out += "| field | encoding | version |\n";
    out += "|---|---|---|\n";
    out += "| magic | u32 0x5a50534a (\"ZPSJ\") | 1 |\n";
    out += "| version | u32 | 1 |\n";
    for (uint32_t v = 1; v <= kJobSpecVersion; ++v) {
      if (v == 1) out += "| `layout` | u32 length + Layout::Serialize (\"ZPSL\") | 1 |\n";
      WireRows<ShardJob>(out, "shard.", v, 0);
      if (v == 1) {
        out +=
            "| `optimizer` | u32 length + record: \"ZOPT\", u16 record version (1; 2 from job "
            "version 4), u16 body length, body, u32 CRC32C | 1 |\n";
        WireRows<OptimizerConfig>(out, "optimizer.", 1, 1);
      }
      if (v == JobVersionOfOptRecord(2)) {
        out +=
            "| `optimizer` (record version 2) | no field here: the record above is version 2 "
            "and its body appends | 4 |\n";
        WireRows<OptimizerConfig>(out, "optimizer.", 2, v);
      }
      WireRows<CommitConfig>(out, "commit.", v, 0);
    }
  }
  return out;
}

uint64_t MomentBytes(StateDType dtype, uint64_t n) {
  switch (dtype) {
    case StateDType::kBF16:
      return 2 * n;
    case StateDType::kInt8:
      // Each block: kInt8StateBlockElems codes, then its bf16 scale.
      return (n + kInt8StateBlockElems - 1) / kInt8StateBlockElems * (kInt8StateBlockElems + 2);
    case StateDType::kF32:
      break;
  }
  return 4 * n;
}

}  // namespace zps
