#include "job_json.h"

#include <string>

#include "zps/common/json_fields.h"

namespace zps::capi {

Result<JobSpec> JobFromJson(std::string_view json) { return JobSpecFromJson(json); }

Result<ConnectOptions> OptionsFromJson(std::string_view json) {
  ZPS_ASSIGN_OR_RETURN(auto doc, JsonFields::Parse(json, "the connect options"));
  JsonFields f(doc, "options");
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
  ZPS_RETURN_IF_ERROR(f.Bool("keep_quantized", &o.prefetch.keep_quantized));
  ZPS_RETURN_IF_ERROR(f.Bool("grad_error_feedback", &o.worker.grad_error_feedback));
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
