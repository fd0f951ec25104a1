// cuda_api.h (worker/cuda internal) — the CUDA runtime, opened with dlopen, and the one
// conversion of cudaError_t into a Status.
//
// The table holds the runtime functions the backend and the NCCL collectives call; the headers
// (CUDA toolkit) give their types, the library is found at run time (ZPS_CUDART, else
// libcudart.so.13, libcudart.so.12, libcudart.so), so nothing links libcudart. The library is
// opened once per process and never closed (the CUDA runtime does not support unloading).
//
// Thread-safety: LoadCudaApi may be called from any thread; the table is immutable.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "zps/common/status.h"

namespace zps::worker::cuda {

struct Api {
  decltype(&::cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::cudaSetDevice) SetDevice = nullptr;
  decltype(&::cudaGetErrorName) GetErrorName = nullptr;
  decltype(&::cudaGetErrorString) GetErrorString = nullptr;
  decltype(&::cudaHostAlloc) HostAlloc = nullptr;
  decltype(&::cudaFreeHost) FreeHost = nullptr;
  decltype(&::cudaMalloc) Malloc = nullptr;
  decltype(&::cudaFree) Free = nullptr;
  decltype(&::cudaMemcpyAsync) MemcpyAsync = nullptr;
  decltype(&::cudaMemsetAsync) MemsetAsync = nullptr;
  decltype(&::cudaStreamCreateWithFlags) StreamCreateWithFlags = nullptr;
  decltype(&::cudaStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cudaStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cudaStreamWaitEvent) StreamWaitEvent = nullptr;
  decltype(&::cudaEventCreateWithFlags) EventCreateWithFlags = nullptr;
  decltype(&::cudaEventDestroy) EventDestroy = nullptr;
  decltype(&::cudaEventRecord) EventRecord = nullptr;
  decltype(&::cudaEventQuery) EventQuery = nullptr;
  decltype(&::cudaEventSynchronize) EventSynchronize = nullptr;
  decltype(&::cudaRuntimeGetVersion) RuntimeGetVersion = nullptr;
};

/// The runtime, loaded on first use. Errors: FailedPrecondition "no CUDA device: <library>
/// not found" (or a symbol missing), the same Status on every later call.
Result<const Api*> LoadCudaApi();

/// THE conversion of a cudaError_t: Ok for cudaSuccess; FailedPrecondition for no device or
/// driver, ResourceExhausted for allocation failures, InvalidArgument for invalid values or
/// devices, Internal otherwise; the message names `what`, the error's name and text.
Status CudaStatus(const Api& api, cudaError_t e, std::string_view what);

/// Calls CudaStatus and returns it from the enclosing function when it is not Ok.
#define ZPS_CUDA_RETURN_IF_ERROR(api, call, what)                           \
  do {                                                                      \
    const cudaError_t zps_cuda_err_ = (call);                               \
    if (zps_cuda_err_ != cudaSuccess)                                       \
      return ::zps::worker::cuda::CudaStatus((api), zps_cuda_err_, (what)); \
  } while (false)

}  // namespace zps::worker::cuda
