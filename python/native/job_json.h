// job_json.h — the job description and the worker options of the C API, from JSON.
//
// The binding (zps.torch) sends the job it derived from the model and the user's config as one
// JSON document; JobFromJson turns it into a JobSpec through the job spec's own JSON codec
// (zps/common/job_spec.h, JobSpecFromJson), so the keys a binding may use are exactly the field
// lists declared there (docs/pytorch.md, "The job description", is generated from them).
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "zps/common/job_spec.h"
#include "zps/common/status.h"
#include "zps/worker/client.h"
#include "zps/worker/prefetcher.h"

namespace zps::capi {

/// Errors: InvalidArgument for malformed JSON, an unknown key, a missing or out-of-range value,
/// or a spec that fails JobSpec::Validate.
Result<JobSpec> JobFromJson(std::string_view json);

struct ConnectOptions {
  worker::WorkerOptions worker;
  worker::PrefetchOptions prefetch;
  /// Workers that reduce and gather among themselves (Gloo, rendezvous through the coordinator):
  /// "server-sum" (none), or "pre-reduced" (reduce-scatter each gradient, push the own slice).
  std::string reduction = "server-sum";  // Default: server-sum
  /// "direct" (each rank fetches whole parameters) or "bandwidth-centric" (slice, all-gather).
  std::string fetch_strategy = "direct";  // Default: direct
  /// The address this rank's Gloo device binds and advertises. Default: "" = 127.0.0.1 for a
  /// loopback endpoint, else the host name.
  std::string gloo_hostname;
  /// The CUDA device of this rank's parameters: >= 0 turns the CUDA backend on (pinned staging
  /// slots, copy stream; zps_fetch_to_device, zps_push_grad_device). Default: -1 = none.
  int cuda_device = -1;
  size_t cuda_slot_bytes = size_t{1} << 20;  // Default: 1 MiB per pinned staging slot.
  uint32_t cuda_slots = 512;                 // Default: 512 slots (512 MiB pinned).
  /// Who reduce-scatters device gradients in pre-reduced mode: "auto" (NCCL with a CUDA device
  /// where NCCL loads, else Gloo on the host), "gloo" or "nccl" (an error where it does not
  /// load). Default: auto.
  std::string collectives = "auto";
};

/// Errors: InvalidArgument for malformed JSON, an unknown key or a bad value.
Result<ConnectOptions> OptionsFromJson(std::string_view json);

}  // namespace zps::capi
