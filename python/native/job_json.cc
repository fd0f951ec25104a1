#include "job_json.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace zps::capi {
namespace {

using Json = nlohmann::json;

// Reads the keys of one JSON object; Finish() names any key nobody asked for.
class Fields {
 public:
  Fields(const Json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Status Check() const {
    if (!obj_.is_object()) return InvalidArgument(where_ + " must be a JSON object");
    return Status::Ok();
  }
  const Json* Get(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
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
  Status Bool(const std::string& key, bool* out) {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Bad(key, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(const std::string& key, std::string* out) {
    const Json* v = Get(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_string()) return Bad(key, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  Status Finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) return InvalidArgument("unknown key " + where_ + "." + it.key());
    }
    return Status::Ok();
  }
  Status Bad(const std::string& key, const std::string& what) const {
    return InvalidArgument(where_ + "." + key + " must be " + what);
  }
  const std::string& where() const { return where_; }

 private:
  const Json& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

Result<Json> Parse(std::string_view text, const char* what) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgument(std::string(what) + " is not valid JSON");
  return doc;
}

Result<std::vector<ParamSpec>> ParamsFromJson(const Json& list) {
  if (!list.is_array() || list.empty())
    return InvalidArgument("job.params must be a non-empty list");
  std::vector<ParamSpec> specs;
  specs.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    Fields f(list[i], "job.params[" + std::to_string(i) + "]");
    ZPS_RETURN_IF_ERROR(f.Check());
    ParamSpec s;
    ZPS_RETURN_IF_ERROR(f.String("name", &s.name));
    const Json* shape = f.Get("shape");
    if (shape == nullptr || !shape->is_array()) return f.Bad("shape", "a list of dimensions");
    for (const auto& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0)
        return f.Bad("shape", "positive integers");
      s.shape.push_back(d.get<int64_t>());
    }
    // A 0-dimensional tensor (a scalar parameter) is one element.
    if (s.shape.empty()) s.shape.push_back(1);
    ZPS_RETURN_IF_ERROR(f.Finish());
    specs.push_back(std::move(s));
  }
  return specs;
}

Status OptimizerFromJson(const Json& j, server::OptimizerConfig* o) {
  Fields f(j, "job.optimizer");
  ZPS_RETURN_IF_ERROR(f.Check());
  std::string kind = std::string(server::OptimizerKindName(o->kind));
  ZPS_RETURN_IF_ERROR(f.String("type", &kind));
  ZPS_ASSIGN_OR_RETURN(o->kind, server::ParseOptimizerKind(kind));
  constexpr double kMax = std::numeric_limits<float>::max();
  ZPS_RETURN_IF_ERROR(f.Number("lr", &o->lr, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("beta1", &o->beta1, 0, 1));
  ZPS_RETURN_IF_ERROR(f.Number("beta2", &o->beta2, 0, 1));
  ZPS_RETURN_IF_ERROR(f.Number("eps", &o->eps, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("weight_decay", &o->weight_decay, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Bool("bias_correction", &o->bias_correction));
  ZPS_RETURN_IF_ERROR(f.Number("momentum", &o->momentum, 0, 1));
  ZPS_RETURN_IF_ERROR(f.Bool("nesterov", &o->nesterov));
  return f.Finish();
}

Status CommitFromJson(const Json& j, server::CommitConfig* c) {
  Fields f(j, "job.commit");
  ZPS_RETURN_IF_ERROR(f.Check());
  constexpr double kMax = 1e300;
  ZPS_RETURN_IF_ERROR(f.Number("max_grad_norm", &c->max_grad_norm, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("grad_divisor", &c->grad_divisor, 1e-30, kMax));
  ZPS_RETURN_IF_ERROR(f.Bool("dynamic_loss_scale", &c->dynamic_loss_scale));
  ZPS_RETURN_IF_ERROR(f.Number("initial_loss_scale", &c->initial_loss_scale, 1e-30, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("scale_factor", &c->scale_factor, 1, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("scale_window", &c->scale_window, 1, 1e15));
  ZPS_RETURN_IF_ERROR(f.Number("min_loss_scale", &c->min_loss_scale, 1e-30, kMax));
  return f.Finish();
}

Status ScheduleFromJson(const Json& j, server::LrScheduleConfig* c) {
  Fields f(j, "job.shard.lr_schedule");
  ZPS_RETURN_IF_ERROR(f.Check());
  std::string kind = std::string(server::LrScheduleKindName(c->kind));
  std::string warmup = c->warmup_type == server::WarmupType::kLog ? "log" : "linear";
  ZPS_RETURN_IF_ERROR(f.String("type", &kind));
  ZPS_ASSIGN_OR_RETURN(c->kind, server::ParseLrScheduleKind(kind));
  constexpr double kMax = 1e300;
  ZPS_RETURN_IF_ERROR(f.Number("warmup_min_lr", &c->warmup_min_lr, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("warmup_max_lr", &c->warmup_max_lr, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("warmup_num_steps", &c->warmup_num_steps, 0, 1e15));
  ZPS_RETURN_IF_ERROR(f.String("warmup_type", &warmup));
  ZPS_ASSIGN_OR_RETURN(c->warmup_type, server::ParseWarmupType(warmup));
  ZPS_RETURN_IF_ERROR(f.Number("total_num_steps", &c->total_num_steps, 0, 1e15));
  ZPS_RETURN_IF_ERROR(f.Number("warmup_min_ratio", &c->warmup_min_ratio, 0, kMax));
  ZPS_RETURN_IF_ERROR(f.Number("cos_min_ratio", &c->cos_min_ratio, 0, kMax));
  return f.Finish();
}

template <typename T>
Status IntList(Fields& f, const std::string& key, std::vector<T>* out, int64_t hi) {
  const Json* v = f.Get(key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_array()) return f.Bad(key, "a list of integers");
  out->reserve(v->size());
  for (const auto& e : *v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > hi) {
      return f.Bad(key, "integers in [0, " + std::to_string(hi) + "]");
    }
    out->push_back(static_cast<T>(e.get<int64_t>()));
  }
  return Status::Ok();
}

Status ShardFromJson(const Json& j, server::ShardJob* s) {
  Fields f(j, "job.shard");
  ZPS_RETURN_IF_ERROR(f.Check());
  std::string reduction = std::string(server::ReductionModeName(s->mode));
  std::string grad = std::string(DTypeName(s->grad_dtype));
  std::string serving = std::string(DTypeName(s->serving_dtype));
  std::string update = std::string(server::UpdateModeName(s->update_mode));
  ZPS_RETURN_IF_ERROR(f.String("reduction", &reduction));
  ZPS_RETURN_IF_ERROR(f.String("update", &update));
  ZPS_RETURN_IF_ERROR(f.Number("world_size", &s->world_size, 1, 65536));
  ZPS_RETURN_IF_ERROR(f.String("grad_dtype", &grad));
  ZPS_RETURN_IF_ERROR(f.String("serving_dtype", &serving));
  ZPS_RETURN_IF_ERROR(f.Number("accumulation_steps", &s->accumulation_steps, 1, 1024));
  if (const Json* groups = f.Get("param_groups")) {
    if (!groups->is_array()) return f.Bad("param_groups", "a list of {lr, weight_decay}");
    for (size_t i = 0; i < groups->size(); ++i) {
      Fields g((*groups)[i], "job.shard.param_groups[" + std::to_string(i) + "]");
      ZPS_RETURN_IF_ERROR(g.Check());
      server::ParamGroup pg;
      constexpr double kMax = std::numeric_limits<float>::max();
      ZPS_RETURN_IF_ERROR(g.Number("lr", &pg.lr, 0, kMax));
      ZPS_RETURN_IF_ERROR(g.Number("weight_decay", &pg.weight_decay, 0, kMax));
      ZPS_RETURN_IF_ERROR(g.Finish());
      s->param_groups.push_back(pg);
    }
  }
  ZPS_RETURN_IF_ERROR(IntList(f, "param_group", &s->param_group, 1 << 20));
  ZPS_RETURN_IF_ERROR(IntList(f, "frozen", &s->frozen, 1));
  if (const Json* ls = f.Get("lr_schedule"))
    ZPS_RETURN_IF_ERROR(ScheduleFromJson(*ls, &s->lr_schedule));
  ZPS_ASSIGN_OR_RETURN(s->mode, server::ParseReductionMode(reduction));
  ZPS_ASSIGN_OR_RETURN(s->update_mode, server::ParseUpdateMode(update));
  ZPS_ASSIGN_OR_RETURN(s->grad_dtype, ParseDType(grad));
  ZPS_ASSIGN_OR_RETURN(s->serving_dtype, ParseDType(serving));
  return f.Finish();
}

}  // namespace

Result<server::JobSpec> JobFromJson(std::string_view json) {
  ZPS_ASSIGN_OR_RETURN(Json doc, Parse(json, "the job description"));
  Fields f(doc, "job");
  ZPS_RETURN_IF_ERROR(f.Check());
  const Json* params = f.Get("params");
  if (params == nullptr) return InvalidArgument("job.params is missing");
  ZPS_ASSIGN_OR_RETURN(auto specs, ParamsFromJson(*params));
  LayoutOptions lo;
  ZPS_RETURN_IF_ERROR(f.Number("chunk_elems", &lo.chunk_elems, 1, 1e12));
  ZPS_RETURN_IF_ERROR(f.Number("align_elems", &lo.align_elems, 1, 1 << 20));
  ZPS_RETURN_IF_ERROR(f.Number("num_shards", &lo.num_shards, 1, 65536));
  ZPS_ASSIGN_OR_RETURN(Layout layout, Layout::Build(std::move(specs), lo));
  server::JobSpec job{std::move(layout), {}, {}, {}};
  if (const Json* o = f.Get("optimizer"))
    ZPS_RETURN_IF_ERROR(OptimizerFromJson(*o, &job.optimizer));
  if (const Json* c = f.Get("commit")) ZPS_RETURN_IF_ERROR(CommitFromJson(*c, &job.commit));
  if (const Json* s = f.Get("shard")) ZPS_RETURN_IF_ERROR(ShardFromJson(*s, &job.shard));
  ZPS_RETURN_IF_ERROR(f.Finish());
  ZPS_RETURN_IF_ERROR(job.Validate());
  return job;
}

Result<ConnectOptions> OptionsFromJson(std::string_view json) {
  ZPS_ASSIGN_OR_RETURN(Json doc, Parse(json, "the connect options"));
  Fields f(doc, "options");
  ZPS_RETURN_IF_ERROR(f.Check());
  ConnectOptions o;
  ZPS_RETURN_IF_ERROR(f.String("endpoint", &o.worker.endpoint));
  ZPS_RETURN_IF_ERROR(f.String("token", &o.worker.token));
  ZPS_RETURN_IF_ERROR(f.Number("rank", &o.worker.rank, 0, 65535));
  ZPS_RETURN_IF_ERROR(f.String("ucx_tls", &o.worker.ucx_tls));
  ZPS_RETURN_IF_ERROR(f.String("fetch_mode", &o.worker.fetch_mode));
  ZPS_RETURN_IF_ERROR(f.String("push_mode", &o.worker.push_mode));
  int64_t op_ms = o.worker.op_timeout.count(), connect_ms = o.worker.connect_timeout.count();
  ZPS_RETURN_IF_ERROR(f.Number("op_timeout_ms", &op_ms, 1, 1e10));
  ZPS_RETURN_IF_ERROR(f.Number("connect_timeout_ms", &connect_ms, 1, 1e10));
  o.worker.op_timeout = std::chrono::milliseconds(op_ms);
  o.worker.connect_timeout = std::chrono::milliseconds(connect_ms);
  ZPS_RETURN_IF_ERROR(f.Number("prefetch_bytes", &o.prefetch.prefetch_bytes, 0, 1e15));
  ZPS_RETURN_IF_ERROR(f.Number("max_live_bytes", &o.prefetch.max_live_bytes, 0, 1e15));
  ZPS_RETURN_IF_ERROR(f.String("reduction", &o.reduction));
  ZPS_RETURN_IF_ERROR(f.String("fetch_strategy", &o.fetch_strategy));
  ZPS_RETURN_IF_ERROR(f.String("gloo_hostname", &o.gloo_hostname));
  ZPS_RETURN_IF_ERROR(f.Number("cuda_device", &o.cuda_device, -1, 1024));
  ZPS_RETURN_IF_ERROR(f.Number("cuda_slot_bytes", &o.cuda_slot_bytes, 4096, 1e12));
  ZPS_RETURN_IF_ERROR(f.Number("cuda_slots", &o.cuda_slots, 1, 1 << 20));
  ZPS_RETURN_IF_ERROR(f.String("collectives", &o.collectives));
  if (o.collectives != "auto" && o.collectives != "gloo" && o.collectives != "nccl") {
    return f.Bad("collectives", "auto, gloo or nccl");
  }
  if (o.reduction != "server-sum" && o.reduction != "pre-reduced") {
    return f.Bad("reduction", "server-sum or pre-reduced");
  }
  if (o.fetch_strategy != "direct" && o.fetch_strategy != "bandwidth-centric") {
    return f.Bad("fetch_strategy", "direct or bandwidth-centric");
  }
  ZPS_RETURN_IF_ERROR(f.Finish());
  return o;
}

}  // namespace zps::capi
