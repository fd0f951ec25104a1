#include "zps/worker/cuda_backend.h"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_api.h"
#include "zps/common/logging.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/ucx.h"
#include "zps/worker/staging_slots.h"

namespace zps::worker {

using cuda::Api;
using cuda::CudaStatus;

namespace {

// RAII owners of the runtime's handles: each frees through the table it was made with.
struct StreamDeleter {
  const Api* api;
  void operator()(CUstream_st* s) const { (void)api->StreamDestroy(s); }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;
struct EventDeleter {
  const Api* api;
  void operator()(CUevent_st* e) const { (void)api->EventDestroy(e); }
};
using EventPtr = std::unique_ptr<CUevent_st, EventDeleter>;
struct PinnedDeleter {
  const Api* api;
  void operator()(std::byte* p) const { (void)api->FreeHost(p); }
};
using PinnedPtr = std::unique_ptr<std::byte, PinnedDeleter>;

cudaStream_t AsStream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// The backend's events, as InflightCopies sees them.
class CudaEvents final : public CopyEvents {
 public:
  CudaEvents(const Api* api, std::vector<EventPtr>* events) : api_(api), events_(events) {}
  Result<bool> Done(size_t i) override {
    const cudaError_t e = api_->EventQuery((*events_)[i].get());
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return CudaStatus(*api_, e, "cudaEventQuery");
  }
  Status Wait(size_t i) override {
    return CudaStatus(*api_, api_->EventSynchronize((*events_)[i].get()), "cudaEventSynchronize");
  }

 private:
  const Api* api_;
  std::vector<EventPtr>* events_;
};

}  // namespace

Status CudaAvailable(int device) {
  ZPS_ASSIGN_OR_RETURN(const Api* api, cuda::LoadCudaApi());
  int count = 0;
  ZPS_CUDA_RETURN_IF_ERROR(*api, api->GetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) return FailedPrecondition("no CUDA device: cudaGetDeviceCount found none");
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + " of " +
                           std::to_string(count));
  }
  return Status::Ok();
}

// The pinned staging slots as a Device (what the Client allocates fetch buffers from).
class PinnedStaging final : public Device {
 public:
  explicit PinnedStaging(CudaBackend::Impl* owner) : owner_(owner) {}
  std::string_view name() const override { return "cuda-pinned"; }
  Result<DeviceBuffer> Allocate(size_t bytes) override;
  Status AttachUcx(ucx::Context& context) override;
  void DetachUcx() override;

 private:
  CudaBackend::Impl* owner_;
};

struct CudaBackend::Impl {
  CudaOptions opts;
  const Api* api = nullptr;
  PinnedPtr region{nullptr, PinnedDeleter{nullptr}};  // every slot, one allocation
  std::unique_ptr<SlotPool> pool;
  StreamPtr copy{nullptr, StreamDeleter{nullptr}};
  std::vector<EventPtr> events;
  std::unique_ptr<CudaEvents> event_ops;
  Mutex mu;  // serialises copies: `inflight`, the events
  std::unique_ptr<InflightCopies> inflight PT_GUARDED_BY(mu);
  PinnedStaging staging{this};
  Mutex ucx_mu;
  std::vector<std::unique_ptr<ucx::MemoryRegion>> regions GUARDED_BY(ucx_mu);
  bool attached GUARDED_BY(ucx_mu) = false;
  std::atomic<uint64_t> h2d{0}, d2h{0}, overflow{0};

  Status Use() const { return CudaStatus(*api, api->SetDevice(opts.device), "cudaSetDevice"); }
  // A slot, or a pinned buffer of its own when none fits; freed or returned when dropped.
  Result<DeviceBuffer> Stage(size_t bytes) {
    if (auto run = pool->TryAcquire(bytes)) {
      SlotPool* p = pool.get();
      const SlotPool::Run r = *run;
      return DeviceBuffer(p->memory(r).data(), bytes, [p, r](std::byte*) { p->Release(r); });
    }
    ZPS_RETURN_IF_ERROR(Use());
    void* mem = nullptr;
    ZPS_CUDA_RETURN_IF_ERROR(*api,
                             api->HostAlloc(&mem, bytes == 0 ? 1 : bytes, cudaHostAllocPortable),
                             "cudaHostAlloc of " + std::to_string(bytes) + " bytes");
    if (overflow.fetch_add(1) == 0) {
      ZPS_LOG(INFO) << "cuda: a staging buffer of " << bytes << " bytes outside the "
                    << pool->size() << " slots of " << pool->slot_bytes()
                    << " bytes (no run of free slots fits); counted in overflow_allocs";
    }
    const Api* a = api;
    return DeviceBuffer(static_cast<std::byte*>(mem), bytes,
                        [a](std::byte* q) { (void)a->FreeHost(q); });
  }
  // Queues: `stream` -> copy stream -> copy -> event -> `stream` waits. Holds mu.
  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, uintptr_t stream,
              std::shared_ptr<const void> keep, bool wait) {
    MutexLock lock(&mu);
    ZPS_RETURN_IF_ERROR(Use());
    ZPS_ASSIGN_OR_RETURN(size_t ev, inflight->Acquire());
    cudaEvent_t e = events[ev].get();
    Status s = [&]() -> Status {
      ZPS_CUDA_RETURN_IF_ERROR(*api, api->EventRecord(e, AsStream(stream)), "cudaEventRecord");
      ZPS_CUDA_RETURN_IF_ERROR(*api, api->StreamWaitEvent(copy.get(), e, 0), "cudaStreamWaitEvent");
      ZPS_CUDA_RETURN_IF_ERROR(*api, api->MemcpyAsync(dst, src, bytes, kind, copy.get()),
                               "cudaMemcpyAsync");
      ZPS_CUDA_RETURN_IF_ERROR(*api, api->EventRecord(e, copy.get()), "cudaEventRecord");
      ZPS_CUDA_RETURN_IF_ERROR(*api, api->StreamWaitEvent(AsStream(stream), e, 0),
                               "cudaStreamWaitEvent");
      return Status::Ok();
    }();
    if (!s.ok()) {
      // The event may be recorded with the copy queued or not: wait for it before reuse.
      (void)api->StreamSynchronize(copy.get());
      inflight->Abandon(ev);
      ZPS_LOG(WARNING) << "cuda: " << s.ToString();
      return s;
    }
    if (wait) {
      Status w = event_ops->Wait(ev);
      inflight->Abandon(ev);  // done: free again at once
      return w;
    }
    inflight->Push(ev, std::move(keep));
    return Status::Ok();
  }
};

Result<DeviceBuffer> PinnedStaging::Allocate(size_t bytes) { return owner_->Stage(bytes); }

Status PinnedStaging::AttachUcx(ucx::Context& context) {
  MutexLock lock(&owner_->ucx_mu);
  if (owner_->attached) {
    return FailedPrecondition("the CUDA staging slots are registered with another Client");
  }
  // One registration (ucp_mem_map) for the whole region: every slot is inside it.
  const size_t n = owner_->pool->size();
  ZPS_ASSIGN_OR_RETURN(auto r, context.Register(owner_->pool->memory({0, n})));
  owner_->regions.clear();
  owner_->regions.push_back(std::move(r));
  owner_->attached = true;
  return Status::Ok();
}

void PinnedStaging::DetachUcx() {
  MutexLock lock(&owner_->ucx_mu);
  owner_->regions.clear();
  owner_->attached = false;
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  MutexLock lock(&impl_->mu);
  if (impl_->Use().ok()) {
    Status s = impl_->inflight->Drain();
    if (!s.ok()) ZPS_LOG(WARNING) << "cuda: draining copies: " << s.ToString();
  }
  // Slots go after the events and the stream that used them (member order in Impl).
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaOptions& options) {
  if (options.slots == 0 || options.slot_bytes == 0 || options.max_inflight == 0) {
    return InvalidArgument("cuda: slots, slot_bytes and max_inflight must be positive");
  }
  ZPS_RETURN_IF_ERROR(CudaAvailable(options.device));
  ZPS_ASSIGN_OR_RETURN(const Api* api, cuda::LoadCudaApi());
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->api = api;
  ZPS_RETURN_IF_ERROR(impl->Use());
  cudaStream_t s = nullptr;
  ZPS_CUDA_RETURN_IF_ERROR(*api, api->StreamCreateWithFlags(&s, cudaStreamNonBlocking),
                           "cudaStreamCreateWithFlags");
  impl->copy = StreamPtr(s, StreamDeleter{api});
  for (uint32_t i = 0; i < options.max_inflight; ++i) {
    cudaEvent_t e = nullptr;
    ZPS_CUDA_RETURN_IF_ERROR(*api, api->EventCreateWithFlags(&e, cudaEventDisableTiming),
                             "cudaEventCreateWithFlags");
    impl->events.emplace_back(e, EventDeleter{api});
  }
  const size_t total = options.slot_bytes * options.slots;
  void* mem = nullptr;
  ZPS_CUDA_RETURN_IF_ERROR(*api, api->HostAlloc(&mem, total, cudaHostAllocPortable),
                           "cudaHostAlloc of the " + std::to_string(total) + "-byte staging slots");
  impl->region = PinnedPtr(static_cast<std::byte*>(mem), PinnedDeleter{api});
  impl->pool = std::make_unique<SlotPool>(std::span<std::byte>(impl->region.get(), total),
                                          options.slot_bytes);
  impl->event_ops = std::make_unique<CudaEvents>(api, &impl->events);
  impl->inflight = std::make_unique<InflightCopies>(impl->event_ops.get(), options.max_inflight);
  ZPS_LOG(INFO) << "cuda: device " << options.device << ", " << options.slots
                << " pinned staging slots of " << options.slot_bytes << " bytes, "
                << options.max_inflight << " copies in flight at most";
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

Device* CudaBackend::staging() { return &impl_->staging; }

Status CudaBackend::CopyToDevice(void* dst, std::span<const std::byte> src,
                                 std::shared_ptr<const void> keep, uintptr_t stream) {
  if (src.empty()) return Status::Ok();
  if (dst == nullptr) return InvalidArgument("cuda: null destination");
  ZPS_RETURN_IF_ERROR(impl_->Copy(dst, src.data(), src.size(), cudaMemcpyHostToDevice, stream,
                                  std::move(keep), /*wait=*/false));
  impl_->h2d += src.size();
  return Status::Ok();
}

Result<DeviceBuffer> CudaBackend::CopyToHost(const void* src, size_t bytes, uintptr_t stream) {
  if (src == nullptr && bytes > 0) return InvalidArgument("cuda: null source");
  ZPS_ASSIGN_OR_RETURN(DeviceBuffer host, impl_->Stage(bytes));
  if (bytes > 0) {
    ZPS_RETURN_IF_ERROR(impl_->Copy(host.data(), src, bytes, cudaMemcpyDeviceToHost, stream,
                                    nullptr, /*wait=*/true));
    impl_->d2h += bytes;
  }
  return host;
}

Status CudaBackend::Synchronize() {
  MutexLock lock(&impl_->mu);
  ZPS_RETURN_IF_ERROR(impl_->Use());
  return impl_->inflight->Drain();
}

Result<DeviceBuffer> CudaBackend::AllocateDeviceMemory(size_t bytes) {
  ZPS_RETURN_IF_ERROR(impl_->Use());
  void* p = nullptr;
  const Api* api = impl_->api;
  ZPS_CUDA_RETURN_IF_ERROR(*api, api->Malloc(&p, bytes == 0 ? 1 : bytes),
                           "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return DeviceBuffer(static_cast<std::byte*>(p), bytes,
                      [api](std::byte* q) { (void)api->Free(q); });
}

uintptr_t CudaBackend::copy_stream() const {
  return reinterpret_cast<uintptr_t>(impl_->copy.get());
}
int CudaBackend::device() const { return impl_->opts.device; }

CudaBackend::Stats CudaBackend::stats() const {
  Stats s;
  s.h2d_bytes = impl_->h2d.load();
  s.d2h_bytes = impl_->d2h.load();
  s.overflow_allocs = impl_->overflow.load();
  {
    MutexLock lock(&impl_->mu);
    s.inflight_waits = impl_->inflight->waits();
  }
  s.free_slots = static_cast<uint32_t>(impl_->pool->free_count());
  return s;
}

}  // namespace zps::worker
