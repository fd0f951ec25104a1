// A stand-in for libcudart, for tests on machines without a GPU (CI): the CUDA backend opens it
// instead of the real runtime when ZPS_CUDART names it. "Device" memory is host memory, every
// copy runs at once (so every event is complete), one device. It exercises the backend's and
// the worker library's logic around the runtime — staging slots registered with UCX, fetches
// into them, copies, pushes from "device" memory — never CUDA itself: stream ordering and
// asynchrony are not modelled, and only a real GPU (label gpu) tests those.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

namespace {
int Devices() {
  const char* v = std::getenv("ZPS_FAKE_CUDA_DEVICES");
  return v != nullptr ? std::atoi(v) : 1;
}
struct Handle {
  int unused = 0;
};
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = Devices();
  return Devices() > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int device) {
  return device >= 0 && device < Devices() ? cudaSuccess : cudaErrorInvalidDevice;
}
const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}
const char* cudaGetErrorString(cudaError_t) { return "fake CUDA runtime"; }
cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int) {
  *p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t size) {
  *p = std::malloc(size);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t) {
  std::memset(dst, v, n);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new Handle);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<Handle*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new Handle);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Handle*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 0;
  return cudaSuccess;
}

}  // extern "C"
