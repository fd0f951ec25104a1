#include "zps/worker/nccl_collectives.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_api.h"
#include "nccl_api.h"
#include "zps/common/logging.h"
#include "zps/worker/coordinator_kv.h"

namespace zps::worker {

using cuda::CudaStatus;
using nccl::NcclStatus;

Status NcclAvailable() { return nccl::LoadNcclApi().status(); }

struct NcclCollectives::Impl {
  NcclOptions opts;
  const cuda::Api* cu = nullptr;
  const nccl::Api* nc = nullptr;
  std::unique_ptr<CoordinatorKv> kv;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the communicator's own
  cudaEvent_t event = nullptr;
  uintptr_t caller = 0;     // the caller's stream
  void* scratch = nullptr;  // padded reduce-scatter buffer (device)
  size_t scratch_bytes = 0;
  Status broken;  // the error that aborted the communicator

  ~Impl() {
    if (comm != nullptr) {
      // Every op waited for its completion, so nothing is outstanding: destroy returns. After
      // an error the communicator was aborted already (comm reset to null).
      const ncclResult_t r = nc->CommDestroy(comm);
      if (r != ncclSuccess)
        ZPS_LOG(WARNING) << NcclStatus(*nc, r, "ncclCommDestroy", nullptr).ToString();
    }
    if (scratch != nullptr) (void)cu->Free(scratch);
    if (event != nullptr) (void)cu->EventDestroy(event);
    if (stream != nullptr) (void)cu->StreamDestroy(stream);
  }

  Status Fail(Status s) {
    if (comm != nullptr) {
      (void)nc->CommAbort(comm);
      comm = nullptr;
    }
    ZPS_LOG(WARNING) << "nccl rank " << opts.rank << ": " << s.ToString()
                     << "; communicator aborted";
    broken = s;
    return s;
  }

  // Before an op: the op's stream waits for what the caller queued so far (host buffers: the
  // host already holds the input; nothing on a device stream to wait for).
  Status Begin() {
    if (!broken.ok()) return broken;
    ZPS_CUDA_RETURN_IF_ERROR(*cu, cu->SetDevice(opts.device), "cudaSetDevice");
    if (opts.host_buffers) return Status::Ok();
    ZPS_CUDA_RETURN_IF_ERROR(*cu, cu->EventRecord(event, reinterpret_cast<cudaStream_t>(caller)),
                             "cudaEventRecord");
    ZPS_CUDA_RETURN_IF_ERROR(*cu, cu->StreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
    return Status::Ok();
  }

  // The device scratch, at least `bytes` long.
  Status Scratch(size_t bytes) {
    if (scratch_bytes >= bytes) return Status::Ok();
    if (scratch != nullptr) (void)cu->Free(scratch);
    scratch = nullptr;
    scratch_bytes = 0;
    ZPS_CUDA_RETURN_IF_ERROR(*cu, cu->Malloc(&scratch, bytes), "cudaMalloc of the nccl scratch");
    scratch_bytes = bytes;
    return Status::Ok();
  }

  // The copy kinds between the caller's spans and the scratch.
  cudaMemcpyKind In() const {
    return opts.host_buffers ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
  }
  cudaMemcpyKind Out() const {
    return opts.host_buffers ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
  }

  // After an op was enqueued (`r` its result): waits for it, bounded, watching the
  // communicator's async error; the caller's stream then waits for it too.
  Status Finish(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) return Fail(NcclStatus(*nc, r, what, comm));
    cudaError_t e = cu->EventRecord(event, stream);
    if (e != cudaSuccess) return Fail(CudaStatus(*cu, e, "cudaEventRecord"));
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    while (true) {
      e = cu->EventQuery(event);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return Fail(CudaStatus(*cu, e, what));
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = nc->CommGetAsyncError(comm, &async);
      if (q != ncclSuccess) return Fail(NcclStatus(*nc, q, "ncclCommGetAsyncError", comm));
      if (async != ncclSuccess && async != ncclInProgress) {
        return Fail(NcclStatus(*nc, async, what, comm));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Fail(DeadlineExceeded(std::string("nccl ") + what + " did not complete within " +
                                     std::to_string(opts.timeout.count()) + " ms"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (opts.host_buffers) return Status::Ok();  // the results are on the host already
    e = cu->StreamWaitEvent(reinterpret_cast<cudaStream_t>(caller), event, 0);
    if (e != cudaSuccess) return Fail(CudaStatus(*cu, e, "cudaStreamWaitEvent"));
    return Status::Ok();
  }
};

NcclCollectives::NcclCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCollectives::~NcclCollectives() = default;

Result<std::unique_ptr<NcclCollectives>> NcclCollectives::Create(const NcclOptions& options) {
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return InvalidArgument("nccl: rank " + std::to_string(options.rank) + " of world size " +
                           std::to_string(options.world_size));
  }
  if (options.prefix.empty()) return InvalidArgument("nccl: empty rendezvous prefix");
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  ZPS_ASSIGN_OR_RETURN(impl->cu, cuda::LoadCudaApi());
  ZPS_ASSIGN_OR_RETURN(impl->nc, nccl::LoadNcclApi());
  const cuda::Api& cu = *impl->cu;
  const nccl::Api& nc = *impl->nc;
  ZPS_CUDA_RETURN_IF_ERROR(cu, cu.SetDevice(options.device), "cudaSetDevice");
  ZPS_CUDA_RETURN_IF_ERROR(cu, cu.StreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking),
                           "cudaStreamCreateWithFlags");
  ZPS_CUDA_RETURN_IF_ERROR(cu, cu.EventCreateWithFlags(&impl->event, cudaEventDisableTiming),
                           "cudaEventCreateWithFlags");
  if (options.world_size == 1) {
    return std::unique_ptr<NcclCollectives>(new NcclCollectives(std::move(impl)));
  }
  ZPS_ASSIGN_OR_RETURN(impl->kv, CoordinatorKv::Connect({.endpoint = options.endpoint,
                                                         .token = options.token,
                                                         .rank = options.rank,
                                                         .connect_timeout = options.timeout}));
  // The unique id through the kv; then a barrier (every rank announced), so that no rank
  // enters ncclCommInitRank, which has no timeout, before every other one is known to be alive.
  ncclUniqueId id;
  const std::string id_key = options.prefix + "/id";
  if (options.rank == 0) {
    ZPS_RETURN_IF_ERROR(NcclStatus(nc, nc.GetUniqueId(&id), "ncclGetUniqueId", nullptr));
    ZPS_RETURN_IF_ERROR(impl->kv->Set(
        id_key, std::as_bytes(std::span<const char>(id.internal, sizeof(id.internal)))));
  } else {
    ZPS_ASSIGN_OR_RETURN(auto v, impl->kv->Get(id_key, options.timeout));
    if (v.size() != sizeof(id.internal)) {
      return InvalidArgument("nccl: the unique id under " + id_key + " has " +
                             std::to_string(v.size()) + " bytes");
    }
    std::memcpy(id.internal, v.data(), sizeof(id.internal));
  }
  const std::byte one{1};
  ZPS_RETURN_IF_ERROR(
      impl->kv->Set(options.prefix + "/arrived/" + std::to_string(options.rank), {&one, 1}));
  for (uint32_t r = 0; r < options.world_size; ++r) {
    ZPS_RETURN_IF_ERROR(
        impl->kv->Get(options.prefix + "/arrived/" + std::to_string(r), options.timeout).status());
  }
  ZPS_RETURN_IF_ERROR(NcclStatus(nc,
                                 nc.CommInitRank(&impl->comm, static_cast<int>(options.world_size),
                                                 id, static_cast<int>(options.rank)),
                                 "ncclCommInitRank", nullptr));
  ZPS_LOG(INFO) << "nccl: rank " << options.rank << " of " << options.world_size << " on device "
                << options.device << " (" << options.prefix << ")";
  return std::unique_ptr<NcclCollectives>(new NcclCollectives(std::move(impl)));
}

void NcclCollectives::set_stream(uintptr_t stream) { impl_->caller = stream; }
uint32_t NcclCollectives::rank() const { return impl_->opts.rank; }
uint32_t NcclCollectives::world_size() const { return impl_->opts.world_size; }

Status NcclCollectives::ReduceScatter(std::span<float> inout) {
  Impl& d = *impl_;
  const uint32_t world = d.opts.world_size;
  if (world == 1 || inout.empty()) return Status::Ok();
  const uint64_t n = inout.size();
  const uint64_t s = SliceElems(n, world);
  const size_t padded_bytes = PaddedCount(n, world) * sizeof(float);
  ZPS_RETURN_IF_ERROR(d.Begin());
  ZPS_RETURN_IF_ERROR(d.Scratch(padded_bytes));
  auto* buf = static_cast<float*>(d.scratch);
  ZPS_CUDA_RETURN_IF_ERROR(
      *d.cu, d.cu->MemcpyAsync(buf, inout.data(), n * sizeof(float), d.In(), d.stream),
      "cudaMemcpyAsync");
  if (padded_bytes > n * sizeof(float)) {
    ZPS_CUDA_RETURN_IF_ERROR(
        *d.cu, d.cu->MemsetAsync(buf + n, 0, padded_bytes - n * sizeof(float), d.stream),
        "cudaMemsetAsync");
  }
  // In place: rank r's output is block r of the padded buffer, i.e. its RankSlice.
  float* mine = buf + static_cast<size_t>(d.opts.rank) * s;
  ncclResult_t r = d.nc->ReduceScatter(buf, mine, s, ncclFloat32, ncclSum, d.comm, d.stream);
  if (r == ncclSuccess || r == ncclInProgress) {
    const SliceRange slice = RankSlice(n, world, d.opts.rank);
    if (slice.length > 0) {
      const cudaError_t e = d.cu->MemcpyAsync(inout.data() + slice.begin, mine,
                                              slice.length * sizeof(float), d.Out(), d.stream);
      if (e != cudaSuccess) return d.Fail(CudaStatus(*d.cu, e, "cudaMemcpyAsync"));
    }
  }
  return d.Finish(r, "reduce-scatter");
}

Status NcclCollectives::AllGather(std::span<std::byte> inout, size_t block_bytes) {
  Impl& d = *impl_;
  const uint32_t world = d.opts.world_size;
  if (inout.size() != block_bytes * world) {
    return InvalidArgument("all-gather: " + std::to_string(inout.size()) + " bytes, expected " +
                           std::to_string(world) + " blocks of " + std::to_string(block_bytes));
  }
  if (world == 1 || block_bytes == 0) return Status::Ok();
  ZPS_RETURN_IF_ERROR(d.Begin());
  const size_t offset = static_cast<size_t>(d.opts.rank) * block_bytes;
  if (!d.opts.host_buffers) {
    std::byte* mine = inout.data() + offset;
    return d.Finish(d.nc->AllGather(mine, inout.data(), block_bytes, ncclUint8, d.comm, d.stream),
                    "all-gather");
  }
  // Host buffers: this rank's block to the scratch, gathered there, and all of it back.
  ZPS_RETURN_IF_ERROR(d.Scratch(inout.size()));
  auto* buf = static_cast<std::byte*>(d.scratch);
  ZPS_CUDA_RETURN_IF_ERROR(*d.cu,
                           d.cu->MemcpyAsync(buf + offset, inout.data() + offset, block_bytes,
                                             cudaMemcpyHostToDevice, d.stream),
                           "cudaMemcpyAsync");
  ncclResult_t r = d.nc->AllGather(buf + offset, buf, block_bytes, ncclUint8, d.comm, d.stream);
  if (r == ncclSuccess || r == ncclInProgress) {
    const cudaError_t e =
        d.cu->MemcpyAsync(inout.data(), buf, inout.size(), cudaMemcpyDeviceToHost, d.stream);
    if (e != cudaSuccess) return d.Fail(CudaStatus(*d.cu, e, "cudaMemcpyAsync"));
  }
  return d.Finish(r, "all-gather");
}

Status NcclCollectives::AllReduce(std::span<float> inout) {
  Impl& d = *impl_;
  if (d.opts.world_size == 1 || inout.empty()) return Status::Ok();
  ZPS_RETURN_IF_ERROR(d.Begin());
  if (!d.opts.host_buffers) {
    return d.Finish(d.nc->AllReduce(inout.data(), inout.data(), inout.size(), ncclFloat32, ncclSum,
                                    d.comm, d.stream),
                    "all-reduce");
  }
  ZPS_RETURN_IF_ERROR(d.Scratch(inout.size_bytes()));
  auto* buf = static_cast<float*>(d.scratch);
  ZPS_CUDA_RETURN_IF_ERROR(
      *d.cu,
      d.cu->MemcpyAsync(buf, inout.data(), inout.size_bytes(), cudaMemcpyHostToDevice, d.stream),
      "cudaMemcpyAsync");
  ncclResult_t r = d.nc->AllReduce(buf, buf, inout.size(), ncclFloat32, ncclSum, d.comm, d.stream);
  if (r == ncclSuccess || r == ncclInProgress) {
    const cudaError_t e =
        d.cu->MemcpyAsync(inout.data(), buf, inout.size_bytes(), cudaMemcpyDeviceToHost, d.stream);
    if (e != cudaSuccess) return d.Fail(CudaStatus(*d.cu, e, "cudaMemcpyAsync"));
  }
  return d.Finish(r, "all-reduce");
}

}  // namespace zps::worker
