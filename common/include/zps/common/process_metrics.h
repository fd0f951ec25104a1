// zps/common/process_metrics.h — the metrics of docs/metrics.md that shards and workers share,
// resolved into handles at start-up. The shard adds its own (optimizer, memory, checkpoint, NVMe,
// connected workers) in server/src/shard/shard_server.cc.
//
//   metrics::Registry reg;
//   ZPS_ASSIGN_OR_RETURN(auto pm, metrics::ProcessMetrics::Create(reg, "shard"));
//   pm.fetch_bytes.Inc(n);
//   pm.inflight[metrics::kFetch].Inc();
//   pm.protocol_errors[metrics::ProtocolErrorIndex("bad_crc")].Inc();
//
// A default-constructed ProcessMetrics has detached handles (every operation is a no-op): what a
// library uses when its caller gave it no registry.
//
// Thread-safety: as the handles (metrics.h): any thread; counters and gauges are lock-free,
// histograms take prometheus-cpp's per-histogram mutex.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/metrics.h"
#include "zps/common/status.h"

namespace zps::ucx {
class Context;
}

namespace zps::metrics {

/// The `op` label values of zps_request_duration_seconds and zps_inflight_requests.
enum Op : int { kFetch = 0, kPush = 1, kControl = 2 };
inline constexpr std::array<std::string_view, 3> kOpNames = {"fetch", "push", "control"};

/// The bounded `kind` set of zps_protocol_errors_total, every one exported from start at 0.
inline constexpr std::array<std::string_view, 12> kProtocolErrorKinds = {
    "bad_magic",  "bad_version",    "oversize",        "truncated",
    "bad_crc",    "unknown_type",   "unauthenticated", "invalid_argument",
    "stale_step", "duplicate_push", "timeout",         "too_many_connections"};
/// The index of `kind` in kProtocolErrorKinds; an unknown kind maps to "invalid_argument".
size_t ProtocolErrorIndex(std::string_view kind);

/// The UCX transport classes ("tcp", "shm", "rdma") a context has enabled, from its resource list
/// (ucp_context_print_info): tcp -> tcp; posix, sysv, cma, knem, xpmem -> shm; rc, ud, dc (any
/// variant) and ib -> rdma. Sorted, without duplicates.
std::vector<std::string> UcxTransportClasses(const ucx::Context& context);

struct ProcessMetrics {
  Gauge current_step;                         // zps_current_step
  Histogram step_duration;                    // zps_step_duration_seconds
  Counter fetch_bytes;                        // zps_fetch_bytes_total
  Counter push_bytes;                         // zps_push_bytes_total
  std::array<Histogram, 3> request_duration;  // zps_request_duration_seconds{op}
  std::array<Gauge, 3> inflight;              // zps_inflight_requests{op}
  std::array<Counter, kProtocolErrorKinds.size()> protocol_errors;  // zps_protocol_errors_total
  GaugeFamily* ucx_transport = nullptr;  // zps_ucx_transport_info{transport}

  /// Registers the shared families in `registry` and zps_build_info{version,revision,role} = 1.
  /// `role`: "shard" or "worker". Errors: from the registry (AlreadyExists if called twice).
  static Result<ProcessMetrics> Create(Registry& registry, std::string_view role);

  /// Sets zps_ucx_transport_info{transport} = 1 for each class of UcxTransportClasses(context).
  /// A no-op on a detached ProcessMetrics.
  Status SetUcxTransports(const ucx::Context& context);

  void ProtocolError(std::string_view kind) const {
    protocol_errors[ProtocolErrorIndex(kind)].Inc();
  }
};

/// Bucket bounds used by the contract histograms (seconds).
std::vector<double> RequestDurationBuckets();  // 25 us .. ~13 s
std::vector<double> StepDurationBuckets();     // 1 ms .. ~9 min

}  // namespace zps::metrics
