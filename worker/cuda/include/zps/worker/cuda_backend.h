// zps/worker/cuda_backend.h — the CUDA device backend of the worker library (target
// zps::worker_cuda, built when the CUDA toolkit is found): pinned host staging slots that UCX
// receives into, and the host<->device copies on a copy stream of its own, tracked by events.
//
//   auto be = zps::worker::CudaBackend::Create({.device = 0});   // FailedPrecondition: no GPU
//   opts.device = (*be)->staging();               // fetches land in pinned, UCX-registered slots
//   auto client = zps::worker::Client::Connect(opts, spec, hash);
//   auto buf = (*client)->Fetch(param, step);
//   (*be)->CopyToDevice(dst_dev, buf->bytes(), buf, stream);     // H2D, ordered on `stream`
//   auto host = (*be)->CopyToHost(grad_dev, bytes, stream);      // D2H into a slot, then push
//
// Loading: the backend opens the CUDA runtime with dlopen (ZPS_CUDART, else libcudart.so.13,
// .so.12, .so) when Create or CudaAvailable is first called, so no zps binary or library needs
// libcudart to start: on a machine without it, or without a driver or device, both return
// FailedPrecondition naming what is missing ("no CUDA device: ..."), and nothing else changes.
// cudaError_t becomes a Status in one function (CudaStatus, src/cuda_api.cc).
//
// Ordering (no record_stream): a copy waits for the work already queued on the caller's
// `stream` (an event recorded there), runs on the backend's copy stream, and `stream` waits for
// the copy's event, so later work on `stream` sees the data and memory freed on `stream`
// afterwards is not reused before the copy is done.
//
// Bounds: `slots` pinned slots of `slot_bytes` in one region, allocated (cudaHostAlloc) at
// Create and registered with the Client's UCX context (Device::AttachUcx: one ucp_mem_map). A
// buffer takes the first run of contiguous free slots that holds it; one that finds no such run
// gets a pinned buffer of its own (counted in Stats::overflow_allocs; freed when released), so
// staging never blocks. At most `max_inflight` copies are in flight; a
// copy holds its source (the slot) until its event completes, so a slot is reused only then.
//
// Thread-safety: every method is thread-safe (copies are issued under one mutex). The backend
// must outlive the Clients that use staging() and every buffer they handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "zps/common/status.h"
#include "zps/worker/device.h"

namespace zps::worker {

struct CudaOptions {
  int device = 0;                       // Default: 0. The CUDA device ordinal.
  size_t slot_bytes = size_t{1} << 20;  // Default: 1 MiB per pinned staging slot.
  uint32_t slots = 512;                 // Default: 512 slots (512 MiB pinned).
  uint32_t max_inflight = 4;            // Default: 4 copies in flight on the copy stream.
};

/// Whether device `device` can be used: Ok, or FailedPrecondition naming why not ("no CUDA
/// device: libcudart.so not found", "... cudaGetDeviceCount: ..."); InvalidArgument for an
/// ordinal beyond the devices present. Cheap after the first call.
Status CudaAvailable(int device = 0);

class CudaBackend {
 public:
  /// Loads the runtime, creates the copy stream and events and allocates the slots.
  /// Errors: FailedPrecondition (no runtime, driver or device), InvalidArgument (options),
  /// ResourceExhausted (pinned memory), Internal.
  static Result<std::unique_ptr<CudaBackend>> Create(const CudaOptions& options);
  ~CudaBackend();
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  /// The pinned host Device that hands out staging slots (WorkerOptions::device).
  Device* staging();

  /// Copies `src` (host memory; pinned for an asynchronous copy) to device memory `dst`, after
  /// the work queued on `stream` (a cudaStream_t as an integer, 0 = the legacy default stream),
  /// which then waits for the copy. Returns once queued; `keep` is held until the copy is done.
  /// Errors: from CUDA (the copy is not queued).
  Status CopyToDevice(void* dst, std::span<const std::byte> src, std::shared_ptr<const void> keep,
                      uintptr_t stream);
  /// Copies `bytes` from device memory `src` (after the work queued on `stream`) into a staging
  /// slot and returns it once the bytes are on the host; the buffer holds the slot until dropped.
  /// Errors: from CUDA, ResourceExhausted.
  Result<DeviceBuffer> CopyToHost(const void* src, size_t bytes, uintptr_t stream);
  /// Waits for every copy queued so far. Errors: from CUDA.
  Status Synchronize();

  /// Device memory (cudaMalloc), freed when the buffer goes; for tests and benchmarks.
  Result<DeviceBuffer> AllocateDeviceMemory(size_t bytes);
  /// The stream copies run on (a cudaStream_t as an integer).
  uintptr_t copy_stream() const;
  int device() const;

  struct Stats {
    uint64_t h2d_bytes = 0;
    uint64_t d2h_bytes = 0;
    uint64_t overflow_allocs = 0;  // pinned buffers allocated outside the slots
    uint64_t inflight_waits = 0;   // copies that waited for the oldest (max_inflight reached)
    uint32_t free_slots = 0;
  };
  Stats stats() const;

  struct Impl;

 private:
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::worker
