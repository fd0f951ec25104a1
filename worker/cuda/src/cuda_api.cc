#include "cuda_api.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include "dl_open.h"
#include "zps/common/logging.h"

namespace zps::worker::cuda {

namespace {

struct Loaded {
  Api api;
  Status status;
};

Loaded Load() {
  Loaded out;
  std::string tried;
  void* handle = internal::OpenFirst(
      {std::getenv("ZPS_CUDART"), "libcudart.so.13", "libcudart.so.12", "libcudart.so"}, tried);
  if (handle == nullptr) {
    out.status = FailedPrecondition("no CUDA device: the CUDA runtime (libcudart) is not found (" +
                                    tried + "); set ZPS_CUDART to its path");
    return out;
  }
  internal::SymbolBinder bind(handle);
  Api& a = out.api;
  bind(a.GetDeviceCount, "cudaGetDeviceCount");
  bind(a.SetDevice, "cudaSetDevice");
  bind(a.GetErrorName, "cudaGetErrorName");
  bind(a.GetErrorString, "cudaGetErrorString");
  bind(a.HostAlloc, "cudaHostAlloc");
  bind(a.FreeHost, "cudaFreeHost");
  bind(a.Malloc, "cudaMalloc");
  bind(a.Free, "cudaFree");
  bind(a.MemcpyAsync, "cudaMemcpyAsync");
  bind(a.MemsetAsync, "cudaMemsetAsync");
  bind(a.StreamCreateWithFlags, "cudaStreamCreateWithFlags");
  bind(a.StreamDestroy, "cudaStreamDestroy");
  bind(a.StreamSynchronize, "cudaStreamSynchronize");
  bind(a.StreamWaitEvent, "cudaStreamWaitEvent");
  bind(a.EventCreateWithFlags, "cudaEventCreateWithFlags");
  bind(a.EventDestroy, "cudaEventDestroy");
  bind(a.EventRecord, "cudaEventRecord");
  bind(a.EventQuery, "cudaEventQuery");
  bind(a.EventSynchronize, "cudaEventSynchronize");
  bind(a.RuntimeGetVersion, "cudaRuntimeGetVersion");
  if (!bind.missing().empty()) {
    out.status = FailedPrecondition("no CUDA device: the CUDA runtime lacks " + bind.missing());
    return out;
  }
  int version = 0;
  (void)a.RuntimeGetVersion(&version);
  ZPS_LOG(DEBUG) << "cuda: runtime " << version << " loaded";
  return out;
}

}  // namespace

Result<const Api*> LoadCudaApi() {
  static const Loaded* loaded = new Loaded(Load());  // never freed: the runtime is never unloaded
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->api;
}

Status CudaStatus(const Api& api, cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return Status::Ok();
  const char* name = api.GetErrorName != nullptr ? api.GetErrorName(e) : "cudaError";
  const char* text = api.GetErrorString != nullptr ? api.GetErrorString(e) : "";
  std::string msg = std::string(what) + ": " + (name != nullptr ? name : "?") + " (" +
                    (text != nullptr ? text : "") + ")";
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
      return FailedPrecondition("no CUDA device: " + msg);
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return InvalidArgument(msg);
    default:
      return Internal(msg);
  }
}

}  // namespace zps::worker::cuda
