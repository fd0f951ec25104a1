#include "zps/common/process_metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "zps/common/ucx.h"

namespace zps::metrics {

size_t ProtocolErrorIndex(std::string_view kind) {
  for (size_t i = 0; i < kProtocolErrorKinds.size(); ++i) {
    if (kProtocolErrorKinds[i] == kind) return i;
  }
  static const size_t kFallback = [] {
    for (size_t i = 0; i < kProtocolErrorKinds.size(); ++i) {
      if (kProtocolErrorKinds[i] == "invalid_argument") return i;
    }
    return size_t{0};
  }();
  return kFallback;
}

std::vector<double> RequestDurationBuckets() { return ExponentialBuckets(25e-6, 2.0, 20); }
std::vector<double> StepDurationBuckets() { return ExponentialBuckets(1e-3, 2.0, 20); }

std::vector<std::string> UcxTransportClasses(const ucx::Context& context) {
  // ucp_context_print_info lists the resources the context enabled, one per line:
  //   "#      resource 1  :  md 1  dev 1  flags -- tcp/lo"
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == nullptr) return {};
  ucp_context_print_info(context.raw(), f);
  std::fclose(f);
  std::string info(text, len);
  std::free(text);

  std::vector<std::string> out;
  std::istringstream in(info);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("resource") == std::string::npos) continue;
    size_t dash = line.find("-- ");
    if (dash == std::string::npos) continue;
    std::string tl = line.substr(dash + 3);
    tl = tl.substr(0, tl.find('/'));
    std::string cls;
    if (tl == "tcp") {
      cls = "tcp";
    } else if (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "knem" || tl == "xpmem") {
      cls = "shm";
    } else if (tl.rfind("rc", 0) == 0 || tl.rfind("ud", 0) == 0 || tl.rfind("dc", 0) == 0 ||
               tl == "ib") {
      cls = "rdma";
    } else {
      continue;  // self (loopback inside one worker), cuda_*, rocm_*, ...
    }
    if (std::find(out.begin(), out.end(), cls) == out.end()) out.push_back(cls);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<ProcessMetrics> ProcessMetrics::Create(Registry& r, std::string_view role) {
  ProcessMetrics m;
  ZPS_ASSIGN_OR_RETURN(
      auto* build,
      r.AddGauge("zps_build_info", "Always 1; the labels say which build runs in which role.",
                 {"version", "revision", "role"}));
  ZPS_ASSIGN_OR_RETURN(Gauge b, build->Add({std::string(BuildVersion()),
                                            std::string(BuildRevision()), std::string(role)}));
  b.Set(1);
  ZPS_ASSIGN_OR_RETURN(auto* step,
                       r.AddGauge("zps_current_step",
                                  "Index of the training step in progress (= steps committed)."));
  ZPS_ASSIGN_OR_RETURN(m.current_step, step->Add({}));
  ZPS_ASSIGN_OR_RETURN(
      auto* sd, r.AddHistogram("zps_step_duration_seconds", "Wall time of one training step.", {},
                               StepDurationBuckets()));
  ZPS_ASSIGN_OR_RETURN(m.step_duration, sd->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* fb, r.AddCounter("zps_fetch_bytes_total",
                                              "Bytes of 16-bit parameters served (shard) or "
                                              "received (worker) by fetches."));
  ZPS_ASSIGN_OR_RETURN(m.fetch_bytes, fb->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* pb, r.AddCounter("zps_push_bytes_total",
                                              "Bytes of gradients received (shard) or sent "
                                              "(worker) by pushes."));
  ZPS_ASSIGN_OR_RETURN(m.push_bytes, pb->Add({}));
  ZPS_ASSIGN_OR_RETURN(auto* rd, r.AddHistogram("zps_request_duration_seconds",
                                                "Duration of one request, by operation.", {"op"},
                                                RequestDurationBuckets()));
  ZPS_ASSIGN_OR_RETURN(auto* in,
                       r.AddGauge("zps_inflight_requests",
                                  "Requests being served (shard) or awaited (worker).", {"op"}));
  for (size_t i = 0; i < kOpNames.size(); ++i) {
    ZPS_ASSIGN_OR_RETURN(m.request_duration[i], rd->Add({std::string(kOpNames[i])}));
    ZPS_ASSIGN_OR_RETURN(m.inflight[i], in->Add({std::string(kOpNames[i])}));
  }
  ZPS_ASSIGN_OR_RETURN(auto* pe,
                       r.AddCounter("zps_protocol_errors_total",
                                    "Frames and requests rejected, by reason.", {"kind"}));
  for (size_t i = 0; i < kProtocolErrorKinds.size(); ++i) {
    ZPS_ASSIGN_OR_RETURN(m.protocol_errors[i], pe->Add({std::string(kProtocolErrorKinds[i])}));
  }
  ZPS_ASSIGN_OR_RETURN(
      m.ucx_transport,
      r.AddGauge("zps_ucx_transport_info",
                 "1 for each UCX transport class the data plane has enabled.", {"transport"}));
  return m;
}

Status ProcessMetrics::SetUcxTransports(const ucx::Context& context) {
  if (ucx_transport == nullptr) return Status::Ok();
  for (const std::string& cls : UcxTransportClasses(context)) {
    ZPS_ASSIGN_OR_RETURN(Gauge g, ucx_transport->Add({cls}));
    g.Set(1);
  }
  return Status::Ok();
}

}  // namespace zps::metrics
