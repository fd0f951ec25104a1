// zps/common/json_fields.h — typed reads of one JSON object's keys that remember which keys were
// read, so Finish() can name a key nobody asked for. The error messages name the key by its path
// ("job.shard.world_size"); the job spec's JSON codec (job_spec.h) and the C API's options
// (python/native/job_json.cc) read their documents through it.
//
// Thread-safety: not thread-safe; one reader per object. The object must outlive the reader.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zps/common/status.h"

namespace zps {

class JsonFields {
 public:
  using Json = nlohmann::json;

  JsonFields(const Json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  /// Errors: InvalidArgument "<where> must be a JSON object".
  Status Check() const {
    if (!obj_.is_object()) return InvalidArgument(where_ + " must be a JSON object");
    return Status::Ok();
  }
  /// The value of `key`, or null when it is absent or null (both keep the default). Marks it read.
  const Json* Get(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  /// Reads a number in [lo, hi] (an integer for integral T; true and false read as 1 and 0).
  /// Absent: `out` unchanged. Errors: InvalidArgument naming the key.
  template <typename T>
  Status Number(const std::string& key, T* out, double lo, double hi) {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_number() && !v->is_boolean()) return Bad(key, "a number");
    double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      return InvalidArgument(where_ + "." + key + " = " + v->dump() + " is out of range [" +
                             std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    if constexpr (std::is_integral_v<T>) {
      if (d != std::floor(d)) return Bad(key, "an integer");
      *out = static_cast<T>(v->get<int64_t>());
    } else {
      *out = static_cast<T>(d);
    }
    return Status::Ok();
  }
  /// Errors: InvalidArgument "<path> must be true or false".
  Status Bool(const std::string& key, bool* out) {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Bad(key, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }
  /// Errors: InvalidArgument "<path> must be a string".
  Status String(const std::string& key, std::string* out) {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_string()) return Bad(key, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  /// Errors: InvalidArgument "unknown key <where>.<key>" for the first key never read.
  Status Finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) return InvalidArgument("unknown key " + where_ + "." + it.key());
    }
    return Status::Ok();
  }
  /// InvalidArgument "<where>.<key> must be <what>".
  Status Bad(const std::string& key, const std::string& what) const {
    return InvalidArgument(where_ + "." + key + " must be " + what);
  }
  const std::string& where() const { return where_; }

  /// Parses `text`. Errors: InvalidArgument "<what> is not valid JSON".
  static Result<Json> Parse(std::string_view text, std::string_view what) {
    Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return InvalidArgument(std::string(what) + " is not valid JSON");
    return doc;
  }

 private:
  const Json& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

}  // namespace zps
