// A stand-in for libcudart, for tests on machines without a GPU (CI): the CUDA backend opens it
// instead of the real runtime when ZPS_CUDART names it. "Device" memory is host memory, one
// device. It exercises the backend's and the worker library's logic around the runtime —
// staging slots registered with UCX, fetches into them, copies, pushes from "device" memory —
// never CUDA itself; only a real GPU (label gpu) tests that.
//
// Copies run at once, unless ZPS_FAKE_CUDA_DEFER=1: then streams are queues, and work runs
// only when something waits for it (cudaEventSynchronize, cudaStreamSynchronize, a stream that
// waits for an event when its own work runs) or, one operation per call, when an event is
// queried. So a caller that reads a copy's result, or reuses or frees its source, before it
// waited for the copy's event sees stale bytes or a freed buffer — what a real GPU may show.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>

namespace {

int Devices() {
  const char* v = std::getenv("ZPS_FAKE_CUDA_DEVICES");
  return v != nullptr ? std::atoi(v) : 1;
}
bool Defer() {
  const char* v = std::getenv("ZPS_FAKE_CUDA_DEFER");
  return v != nullptr && v[0] == '1';
}

struct Stream {
  std::deque<std::function<void()>> ops;
  unsigned long long queued = 0;  // operations ever queued
  unsigned long long done = 0;    // operations run
};
struct Event {
  Stream* stream = nullptr;
  unsigned long long at = 0;  // done when stream->done >= at
};

std::recursive_mutex mu;
Stream legacy;  // stream 0

Stream* S(cudaStream_t s) { return s == nullptr ? &legacy : reinterpret_cast<Stream*>(s); }
Event* E(cudaEvent_t e) { return reinterpret_cast<Event*>(e); }

void RunOne(Stream* s) {
  auto op = std::move(s->ops.front());
  s->ops.pop_front();
  op();
  ++s->done;
}
void RunUntil(Stream* s, unsigned long long at) {
  while (s->done < at) RunOne(s);
}
void Enqueue(Stream* s, std::function<void()> op) {
  if (!Defer()) {
    op();
    ++s->queued;
    ++s->done;
    return;
  }
  s->ops.push_back(std::move(op));
  ++s->queued;
}

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
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  Enqueue(S(s), [=] { std::memmove(dst, src, n); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  Enqueue(S(s), [=] { std::memset(dst, v, n); });
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new Stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  // As CUDA, queued work still completes; the legacy stream's may wait for this one's, so it
  // runs first (no later operation may name a destroyed stream).
  RunUntil(&legacy, legacy.queued);
  RunUntil(S(s), S(s)->queued);
  delete S(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  RunUntil(S(s), S(s)->queued);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  Stream* other = E(e)->stream;
  const unsigned long long at = E(e)->at;  // the record as of now, as CUDA
  if (other != nullptr) Enqueue(S(s), [other, at] { RunUntil(other, at); });
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete E(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  E(e)->stream = S(s);
  E(e)->at = S(s)->queued;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  Event* ev = E(e);
  if (ev->stream == nullptr || ev->stream->done >= ev->at) return cudaSuccess;
  RunOne(ev->stream);  // some progress per query: a poll loop ends
  return cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (E(e)->stream != nullptr) RunUntil(E(e)->stream, E(e)->at);
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 0;
  return cudaSuccess;
}

}  // extern "C"
