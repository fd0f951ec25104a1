#include "zps/train/job_flags.h"

#include <cmath>
#include <utility>

namespace zps::train {

namespace {

std::vector<std::string> Split(const std::string& key) {
  std::vector<std::string> path;
  size_t start = 0;
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
    path.push_back(key.substr(start, dot - start));
    start = dot + 1;
  }
  path.push_back(key.substr(start));
  return path;
}

// The object at `path` in `j` (made when absent), or null when something else is there.
nlohmann::json* At(nlohmann::json& j, const std::vector<std::string>& path, size_t depth) {
  nlohmann::json* at = &j;
  for (size_t i = 0; i < depth; ++i) {
    if (!at->is_object()) return nullptr;
    at = &(*at)[path[i]];
    if (at->is_null()) *at = nlohmann::json::object();
  }
  return at->is_object() ? at : nullptr;
}

// o[key] when `o` is an object that has it, else `otherwise` (never throws, unlike json::value).
nlohmann::json Value(const nlohmann::json& o, const char* key, nlohmann::json otherwise) {
  if (!o.is_object()) return otherwise;
  auto it = o.find(key);
  return it == o.end() ? otherwise : *it;
}

}  // namespace

void JobFlags::Bind(std::string name, const std::string& key, std::function<nlohmann::json()> get) {
  bound_.push_back({std::move(name), key, Split(key), std::move(get)});
}

void JobFlags::Add(std::string name, std::string help, std::string key, std::string* field) {
  Bind(name, key, [field]() -> nlohmann::json {
    return field->empty() ? nlohmann::json() : nlohmann::json(*field);
  });
  flags_->Add(std::move(name), std::move(help), field);
}

void JobFlags::Add(std::string name, std::string help, std::string key, bool* field) {
  Bind(name, key, [field] { return nlohmann::json(*field); });
  flags_->Add(std::move(name), std::move(help), field);
}

void JobFlags::Add(std::string name, std::string help, std::string key, double* field) {
  Bind(name, key, [field] { return nlohmann::json(*field); });
  flags_->Add(std::move(name), std::move(help), field);
}

void JobFlags::Add(std::string name, std::string help, std::string key, int64_t* field, int64_t min,
                   int64_t max) {
  Bind(name, key, [field] { return nlohmann::json(*field); });
  flags_->Add(std::move(name), std::move(help), field, min, max);
}

void JobFlags::Add(std::string name, std::string help, std::string key, int* field, int min,
                   int max) {
  Bind(name, key, [field] { return nlohmann::json(*field); });
  flags_->Add(std::move(name), std::move(help), field, min, max);
}

void JobFlags::AddBytes(std::string name, std::string help, std::string key, uint64_t* field) {
  Bind(name, key, [field] { return nlohmann::json(*field); });
  flags_->AddBytes(std::move(name), std::move(help), field);
}

std::vector<JobFlags::Binding> JobFlags::Bindings() const {
  std::vector<Binding> out;
  for (const Bound& b : bound_) out.push_back({b.flag, b.key});
  return out;
}

Result<nlohmann::json> JobFlags::Json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const Bound& b : bound_) {
    nlohmann::json v = b.get();
    if (v.is_null()) continue;
    // JSON would write a NaN or an infinity as null, which reads back as the default.
    if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      return InvalidArgument("--" + b.flag + " must be a finite number");
    }
    nlohmann::json* obj = At(j, b.path, b.path.size() - 1);
    if (obj == nullptr) {
      return InvalidArgument("--" + b.flag + ": the job key of a flag is inside another's value");
    }
    (*obj)[b.path.back()] = std::move(v);
  }
  return j;
}

Result<JobSpec> BuildJob(nlohmann::json j, const ModelConfig& model, int64_t steps) {
  if (!j.is_object()) return InvalidArgument("the job description must be a JSON object");
  nlohmann::json& params = j["params"] = nlohmann::json::array();
  for (const ParamSpec& p : LayoutSpecs(Specs(model))) {
    params.push_back({{"name", p.name}, {"shape", p.shape}});
  }
  // align_elems left out: the codec puts it at the serving copy's (ServingAlignElems).
  j.erase("align_elems");
  nlohmann::json& shard = j["shard"];
  nlohmann::json& commit = j["commit"];
  if (shard.is_null()) shard = nlohmann::json::object();
  if (commit.is_null()) commit = nlohmann::json::object();
  // A value of the wrong type is left as it is, for JobSpecFromJson to name.
  if (!shard.is_object() || !commit.is_object()) return JobSpecFromJson(j.dump());
  commit["grad_divisor"] = Value(shard, "world_size", 1);
  if (Value(commit, "dynamic_loss_scale", false) == true) {
    for (const char* k : {"grad_dtype", "serving_dtype"}) {
      if (Value(shard, k, nullptr).is_null()) shard[k] = "fp16";
    }
  }
  nlohmann::json& ls = shard["lr_schedule"];
  if (ls.is_object() && Value(ls, "type", "none") != "none") {
    ls["warmup_min_lr"] = 0.0;
    ls["warmup_max_lr"] = Value(Value(j, "optimizer", nullptr), "lr", nullptr);
    if (Value(ls, "total_num_steps", 0) == 0) ls["total_num_steps"] = steps;
  } else {
    // No schedule: its other flags are unused, but a wrong value among them is still an error.
    if (!ls.is_null()) ZPS_RETURN_IF_ERROR(JobSpecFromJson(j.dump()).status());
    shard.erase("lr_schedule");  // every schedule field at its default: job spec version 1
  }
  return JobSpecFromJson(j.dump());
}

}  // namespace zps::train
