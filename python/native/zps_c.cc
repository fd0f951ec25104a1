// The C API (zps_c.h) over zps::worker::Client and Prefetcher. Each entry point catches every
// exception (the module edge), turns failures into a code plus a thread-local message, and writes
// its outputs only on success.
#include "zps_c.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "job_json.h"
#include "zps/common/dtype.h"
#include "zps/common/logging.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/common/serving_quant.h"
#include "zps/common/spill_budget.h"
#include "zps/common/thread_annotations.h"
#include "zps/worker/bucket_reducer.h"
#include "zps/worker/client.h"
#include "zps/worker/collectives.h"
#include "zps/worker/gloo_collectives.h"
#include "zps/worker/prefetcher.h"
#include "zps/worker/quantized_pieces.h"
#if ZPS_C_WITH_CUDA
#include "zps/worker/cuda_backend.h"
#include "zps/worker/nccl_collectives.h"
#endif

struct zps_client {
#if ZPS_C_WITH_CUDA
  // Before `client`: the Client allocates from its staging slots, so it goes first.
  std::unique_ptr<zps::worker::CudaBackend> cuda;      // null: no options.cuda_device
  std::unique_ptr<zps::worker::NcclCollectives> nccl;  // pre-reduced device gradients
#endif
  std::unique_ptr<zps::worker::Client> client;
  zps::worker::WorkerOptions options;
  // Gloo among the ranks, one communicator per job: `collectives` for pre-reduced gradients
  // (driven by the reducer's thread), `gather` for bandwidth-centric fetches (by the training
  // thread), so that neither waits behind the other. Null where the mode does not use them.
  std::unique_ptr<zps::worker::Collectives> collectives;
  std::unique_ptr<zps::worker::Collectives> gather;
  std::unique_ptr<zps::worker::BucketReducer> reducer;  // pre-reduced with world > 1
  bool pre_reduced = false;
  zps::Mutex mu;  // serialises the prefetcher and `held` (one training thread drives them)
  std::unique_ptr<zps::worker::Prefetcher> prefetcher PT_GUARDED_BY(mu);
  std::map<uint32_t, std::shared_ptr<const zps::worker::ParamBuffer>> held
      GUARDED_BY(mu);           // by zps_acquire and zps_acquire_quantized
  bool keep_quantized = false;  // options.keep_quantized with quantized weights
};

namespace {

thread_local std::string g_error;

[[maybe_unused]] constexpr char kNoCudaBuild[] =
    "no CUDA device: libzps_c.so was built without the CUDA backend (no CUDA toolkit)";

int Fail(const zps::Status& s) {
  g_error = std::string(zps::CodeName(s.code())) + ": " + s.message();
  return static_cast<int>(s.code());
}

// Runs `fn` (returning Status) at the module edge: no exception crosses into C.
template <typename Fn>
int Guard(Fn&& fn) {
  try {
    zps::Status s = fn();
    if (s.ok()) return 0;
    return Fail(s);
  } catch (const std::exception& e) {
    return Fail(zps::Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return Fail(zps::Internal("unexpected exception"));
  }
}

zps::Status NeedClient(const zps_client* c) {
  if (c == nullptr || !c->client) return zps::InvalidArgument("null zps_client");
  return zps::Status::Ok();
}

// The buffers handed out as they are (zps_acquire, zps_fetch_to_device) must hold values.
zps::Status NeedDequantized(const zps_client* c) {
  if (!c->keep_quantized) return zps::Status::Ok();
  return zps::FailedPrecondition(
      "options.keep_quantized: parameters are handed out quantized (zps_acquire_quantized) or "
      "dequantized on the CPU (zps_fetch_into)");
}

// Acquires `param` from the prefetcher and holds it until zps_release.
zps::Result<std::shared_ptr<const zps::worker::ParamBuffer>> Hold(zps_client* c, uint32_t param)
    REQUIRES(c->mu) {
  if (c->held.count(param)) {
    return zps::FailedPrecondition("parameter " + std::to_string(param) + " is already acquired");
  }
  ZPS_ASSIGN_OR_RETURN(auto buffers, c->prefetcher->Acquire({&param, 1}));
  c->held[param] = buffers[0];
  return buffers[0];
}

zps::Result<zps::DType> DTypeOf(int32_t v) {
  if (v < 0 || v > 2) return zps::InvalidArgument("unknown dtype " + std::to_string(v));
  return static_cast<zps::DType>(v);
}

// Writes `n` elements of `from` (in `src`) into `dst` as `to`.
void Convert(const std::byte* src, zps::DType from, void* dst, zps::DType to, size_t n) {
  using zps::DType;
  if (from == to) {
    std::memcpy(dst, src, n * zps::DTypeSize(from));
    return;
  }
  const auto* s16 = reinterpret_cast<const uint16_t*>(src);
  if (to == DType::kF32) {
    std::span<float> out(static_cast<float*>(dst), n);
    if (from == DType::kBF16)
      zps::ConvertBF16ToF32({s16, n}, out);
    else
      zps::ConvertF16ToF32({s16, n}, out);
    return;
  }
  // To a 16-bit type: through fp32 (exact from the other 16-bit type only for fp32 sources).
  auto* d16 = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    float f = zps::LoadAsFloat(src, from, i);
    d16[i] = to == DType::kBF16 ? zps::FloatToBf16(f) : zps::FloatToHalf(f);
  }
}

}  // namespace

#if ZPS_C_WITH_CUDA
namespace {
zps::Status NeedCuda(const zps_client* c) {
  ZPS_RETURN_IF_ERROR(NeedClient(c));
  if (!c->cuda)
    return zps::FailedPrecondition("the client has no CUDA backend (options.cuda_device)");
  return zps::Status::Ok();
}
}  // namespace
#endif

extern "C" {

int zps_c_api_version(void) { return ZPS_C_API_VERSION; }

const char* zps_last_error(void) { return g_error.c_str(); }

const char* zps_code_name(int code) {
  if (code < 0 || code > static_cast<int>(zps::Code::kCancelled)) return "UNKNOWN";
  return zps::CodeName(static_cast<zps::Code>(code)).data();
}

int zps_job_hash(const char* job_json, uint64_t* out) {
  return Guard([&]() -> zps::Status {
    if (job_json == nullptr || out == nullptr) return zps::InvalidArgument("null argument");
    ZPS_ASSIGN_OR_RETURN(auto job, zps::capi::JobFromJson(job_json));
    *out = job.Hash();
    return zps::Status::Ok();
  });
}

int zps_check_memory_budget(const char* job_json, uint64_t memory_budget) {
  return Guard([&]() -> zps::Status {
    if (job_json == nullptr) return zps::InvalidArgument("null argument");
    ZPS_ASSIGN_OR_RETURN(auto job, zps::capi::JobFromJson(job_json));
    return zps::CheckJobMemoryBudget(job, memory_budget);
  });
}

}  // extern "C"

namespace {

zps::Result<zps::rpc::ClientOptions> ToolOptions(const std::string& endpoint,
                                                 const std::string& token) {
  auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size()) {
    return zps::InvalidArgument("endpoint " + endpoint + " is not host:port");
  }
  int port = 0;
  for (char ch : endpoint.substr(colon + 1)) {
    if (ch < '0' || ch > '9' || (port = port * 10 + (ch - '0')) > 65535) {
      return zps::InvalidArgument("endpoint " + endpoint + " has a bad port");
    }
  }
  zps::rpc::ClientOptions co;
  co.host = endpoint.substr(0, colon);
  co.port = static_cast<uint16_t>(port);
  co.token = token;
  co.role = zps::rpc::PeerRole::kTool;
  co.name = "zps.torch";
  return co;
}

}  // namespace

extern "C" {

int zps_cluster_shards(const char* endpoint, const char* token, int64_t timeout_ms, uint32_t* out) {
  return Guard([&]() -> zps::Status {
    if (endpoint == nullptr || token == nullptr || out == nullptr || timeout_ms <= 0) {
      return zps::InvalidArgument("bad argument");
    }
    ZPS_ASSIGN_OR_RETURN(auto co, ToolOptions(endpoint, token));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    zps::Status last;
    while (true) {
      auto rpc = zps::rpc::Client::Connect(co);
      if (rpc.ok()) {
        ZPS_ASSIGN_OR_RETURN(
            auto reply, (*rpc)->Call(zps::msg::kStatus, {}, std::chrono::milliseconds(timeout_ms)));
        auto doc = nlohmann::json::parse(
            std::string(reinterpret_cast<const char*>(reply.data()), reply.size()), nullptr, false);
        if (doc.is_discarded() || !doc.contains("shards") || !doc["shards"].is_number_unsigned()) {
          return zps::InvalidArgument("the coordinator's status has no shard count");
        }
        *out = doc["shards"].get<uint32_t>();
        return zps::Status::Ok();
      }
      last = rpc.status();
      if (last.code() != zps::Code::kUnavailable || std::chrono::steady_clock::now() >= deadline) {
        return last;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

int zps_connect(const char* options_json, const char* job_json, zps_client** out) {
  return Guard([&]() -> zps::Status {
    if (options_json == nullptr || job_json == nullptr || out == nullptr) {
      return zps::InvalidArgument("null argument");
    }
    ZPS_ASSIGN_OR_RETURN(auto opts, zps::capi::OptionsFromJson(options_json));
    ZPS_ASSIGN_OR_RETURN(auto job, zps::capi::JobFromJson(job_json));
    const auto spec = job.Serialize();
    auto c = std::make_unique<zps_client>();
    if (opts.cuda_device >= 0) {
#if ZPS_C_WITH_CUDA
      ZPS_ASSIGN_OR_RETURN(c->cuda,
                           zps::worker::CudaBackend::Create({.device = opts.cuda_device,
                                                             .slot_bytes = opts.cuda_slot_bytes,
                                                             .slots = opts.cuda_slots}));
      opts.worker.device = c->cuda->staging();
#else
      return zps::FailedPrecondition(kNoCudaBuild);
#endif
    } else if (opts.collectives == "nccl") {
      return zps::InvalidArgument("options.collectives nccl needs options.cuda_device");
    }
    c->options = opts.worker;
    ZPS_ASSIGN_OR_RETURN(c->client, zps::worker::Client::Connect(opts.worker, spec, job.Hash()));
    const uint32_t world = c->client->job().world_size;
    c->pre_reduced = opts.reduction == "pre-reduced";
    if (c->pre_reduced != (job.shard.mode == zps::ReductionMode::kPreReduced)) {
      return zps::InvalidArgument("options.reduction and job.shard.reduction disagree");
    }
    if (world > 1 && (c->pre_reduced || opts.fetch_strategy == "bandwidth-centric")) {
      zps::worker::GlooOptions go;
      go.endpoint = opts.worker.endpoint;
      go.token = opts.worker.token;
      go.rank = opts.worker.rank;
      go.world_size = world;
      go.hostname = opts.gloo_hostname;
      if (go.hostname.empty() && go.endpoint.rfind("127.", 0) == 0) go.hostname = "127.0.0.1";
      go.timeout = opts.worker.op_timeout;
      const std::string prefix = "zps.torch/gloo/resume" + std::to_string(c->client->resume_step());
      if (c->pre_reduced) {
        go.prefix = prefix;
        ZPS_ASSIGN_OR_RETURN(c->collectives, zps::worker::GlooCollectives::Create(go));
      }
      if (opts.fetch_strategy == "bandwidth-centric") {
        go.prefix = prefix + "/gather";
        ZPS_ASSIGN_OR_RETURN(c->gather, zps::worker::GlooCollectives::Create(go));
        opts.prefetch.gather = c->gather.get();
      }
    }
#if ZPS_C_WITH_CUDA
    // Device gradients in pre-reduced mode: NCCL, one communicator per job generation (the
    // prefix names the resume step, as Gloo's; a rollback or re-join makes a new zps_client).
    // It reduces the buckets of the BucketReducer (host buffers, staged through device scratch)
    // in the buckets' order, so that ranks that differ reduce the same buckets, as with Gloo.
    if (world > 1 && c->pre_reduced && c->cuda && opts.collectives != "gloo") {
      zps::Status avail = zps::worker::NcclAvailable();
      if (avail.ok() || opts.collectives == "nccl") {
        ZPS_RETURN_IF_ERROR(avail);
        zps::worker::NcclOptions no;
        no.endpoint = opts.worker.endpoint;
        no.token = opts.worker.token;
        no.rank = opts.worker.rank;
        no.world_size = world;
        no.prefix = "zps.torch/nccl/resume" + std::to_string(c->client->resume_step());
        no.device = opts.cuda_device;
        no.timeout = opts.worker.op_timeout;
        no.host_buffers = true;
        ZPS_ASSIGN_OR_RETURN(c->nccl, zps::worker::NcclCollectives::Create(no));
      } else {
        ZPS_LOG(WARNING) << "zps.torch: " << avail.ToString()
                         << "; device gradients are reduce-scattered on the host with Gloo";
      }
    }
#endif
    // pre-reduced: every gradient goes into its bucket, reduce-scattered in the buckets' order
    // (with NCCL where device gradients use it, else Gloo).
    if (world > 1 && c->pre_reduced) {
      zps::worker::Collectives* reduce_comm = c->collectives.get();
#if ZPS_C_WITH_CUDA
      if (c->nccl) reduce_comm = c->nccl.get();
#endif
      zps::worker::BucketReducerOptions ro;
      // Test hooks (tests/torch/test_divergent.py, test_torchrun_restart.py): small buckets,
      // and a rank that skips one bucket's collective: ZPS_TEST_SKIP_BUCKET=<bucket> in every
      // step, <bucket>@<step> in that step only.
      if (const char* skip = std::getenv("ZPS_TEST_SKIP_BUCKET"); skip != nullptr) {
        ro.skip_bucket = std::atoll(skip);
        if (const char* at = std::strchr(skip, '@'); at != nullptr) {
          ro.skip_step = std::atoll(at + 1);
        }
      }
      if (const char* bytes = std::getenv("ZPS_TEST_BUCKET_BYTES"); bytes != nullptr) {
        ro.bucket_bytes = std::strtoull(bytes, nullptr, 10);
      }
      zps::worker::Client* client = c->client.get();
      ZPS_ASSIGN_OR_RETURN(c->reducer, zps::worker::BucketReducer::Create(
                                           client->layout(), job.shard.frozen, reduce_comm,
                                           [client](uint32_t param, int64_t step, uint64_t begin,
                                                    std::span<const float> g, uint32_t micro) {
                                             return client->PushGradRange(param, step, begin, g,
                                                                          micro);
                                           },
                                           ro));
    }
    c->keep_quantized =
        opts.prefetch.keep_quantized && zps::IsBlockQuantized(job.shard.serving_dtype);
    c->prefetcher = std::make_unique<zps::worker::Prefetcher>(c->client.get(), opts.prefetch);
    *out = c.release();
    return zps::Status::Ok();
  });
}

void zps_close(zps_client* c) {
  try {
    delete c;
  } catch (...) {
    // A destructor that throws is a bug in the library; nothing sensible to do at the C edge.
  }
}

int zps_job_info_get(zps_client* c, zps_job_info* out) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (out == nullptr) return zps::InvalidArgument("null argument");
    const auto& job = c->client->job();
    zps_job_info info{};
    info.resume_step = job.resume_step;
    info.loss_scale = job.loss_scale;
    info.world_size = job.world_size;
    info.rank = c->client->rank();
    info.num_params = c->client->layout().num_params();
    info.num_shards = static_cast<uint32_t>(job.shard_endpoints.size());
    info.serving_dtype = static_cast<int32_t>(c->client->serving_dtype());  // what fetches hold
    info.grad_dtype = static_cast<int32_t>(job.grad_dtype);
    info.job_hash = job.job_hash;
    if (zps::IsBlockQuantized(job.serving_dtype)) {
      const zps::QuantFormat f = zps::ServingQuantFormat(job.serving_dtype);
      info.quant_bits = f.bits;
      info.quant_block = f.block;
    }
    *out = info;
    return zps::Status::Ok();
  });
}

int zps_stats_get(zps_client* c, zps_stats* out) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (out == nullptr) return zps::InvalidArgument("null argument");
    zps::MutexLock lock(&c->mu);
    const auto& ps = c->prefetcher->stats();
    zps_stats s{};
    s.fetched_bytes = c->client->fetched_bytes();
    s.pushed_bytes = c->client->pushed_bytes();
    s.live_bytes = c->prefetcher->live_bytes();
    s.acquires = ps.acquires;
    s.hits = ps.hits;
    s.prefetches = ps.prefetches;
    s.trace_rebuilds = ps.trace_rebuilds;
    s.wait_ns = static_cast<uint64_t>(ps.wait.count());
    s.gather_bytes = ps.gather_bytes;
    *out = s;
    return zps::Status::Ok();
  });
}

int zps_push_initial(zps_client* c, uint32_t param, const float* values, uint64_t numel) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (values == nullptr && numel > 0) return zps::InvalidArgument("null values");
    return c->client->PushInitial(param, {values, numel});
  });
}

int zps_begin_step(zps_client* c, int64_t step) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    zps::MutexLock lock(&c->mu);
    c->prefetcher->BeginStep(step);
    return zps::Status::Ok();
  });
}

int zps_end_step(zps_client* c) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    zps::MutexLock lock(&c->mu);
    return c->prefetcher->EndStep();
  });
}

int zps_fetch_into(zps_client* c, const uint32_t* ids, size_t n, void* const* dst,
                   const int32_t* dst_dtype) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (n == 0) return zps::Status::Ok();
    if (ids == nullptr || dst == nullptr || dst_dtype == nullptr) {
      return zps::InvalidArgument("null argument");
    }
    std::vector<zps::DType> to(n);
    for (size_t i = 0; i < n; ++i) {
      ZPS_ASSIGN_OR_RETURN(to[i], DTypeOf(dst_dtype[i]));
      if (dst[i] == nullptr) return zps::InvalidArgument("null destination");
    }
    zps::MutexLock lock(&c->mu);
    std::span<const uint32_t> id_span(ids, n);
    ZPS_ASSIGN_OR_RETURN(auto buffers, c->prefetcher->Acquire(id_span));
    zps::Status s;
    for (size_t i = 0; i < n && s.ok(); ++i) {
      const auto& b = *buffers[i];
      if (zps::IsBlockQuantized(b.dtype)) {  // keep_quantized: the SIMD codec, into dst's dtype
        s = zps::worker::DequantizeBuffer(b, to[i], dst[i]);
      } else {
        Convert(b.memory.data(), b.dtype, dst[i], to[i], c->client->layout().param_numel(ids[i]));
      }
    }
    c->prefetcher->Release(id_span);
    return s;
  });
}

int zps_acquire(zps_client* c, uint32_t param, const void** data, uint64_t* bytes) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (data == nullptr || bytes == nullptr) return zps::InvalidArgument("null argument");
    ZPS_RETURN_IF_ERROR(NeedDequantized(c));
    zps::MutexLock lock(&c->mu);
    ZPS_ASSIGN_OR_RETURN(auto buffer, Hold(c, param));
    *data = buffer->memory.data();
    *bytes = buffer->memory.size();
    return zps::Status::Ok();
  });
}

int zps_acquire_quantized(zps_client* c, uint32_t param, const void** data, uint64_t* bytes,
                          zps_quant_piece* pieces, size_t cap, size_t* n) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (data == nullptr || bytes == nullptr || n == nullptr || (pieces == nullptr && cap > 0)) {
      return zps::InvalidArgument("null argument");
    }
    if (!c->keep_quantized) {
      return zps::FailedPrecondition(
          "zps_acquire_quantized needs options.keep_quantized and quantized weights");
    }
    zps::MutexLock lock(&c->mu);
    ZPS_ASSIGN_OR_RETURN(auto buffer, Hold(c, param));
    if (buffer->pieces.size() > cap) {
      c->held.erase(param);
      c->prefetcher->Release({&param, 1});
      return zps::OutOfRange("parameter " + std::to_string(param) + " has " +
                             std::to_string(buffer->pieces.size()) + " pieces, more than " +
                             std::to_string(cap));
    }
    *data = buffer->memory.data();
    *bytes = buffer->memory.size();
    for (size_t i = 0; i < buffer->pieces.size(); ++i) {
      const auto& p = buffer->pieces[i];
      pieces[i] = {p.elems, p.skip, p.offset, p.bytes};
    }
    *n = buffer->pieces.size();
    return zps::Status::Ok();
  });
}

int zps_dequantize_blocks(const void* blocks, uint64_t bytes, uint32_t bits, uint32_t block,
                          uint64_t skip, uint64_t elems, int32_t dst_dtype, void* dst) {
  return Guard([&]() -> zps::Status {
    if ((blocks == nullptr && bytes > 0) || (dst == nullptr && elems > 0)) {
      return zps::InvalidArgument("null argument");
    }
    if (bits > 255) return zps::InvalidArgument("bad block format");
    const zps::QuantFormat f{static_cast<uint8_t>(bits), block};
    ZPS_RETURN_IF_ERROR(zps::ValidateQuantFormat(f));
    ZPS_ASSIGN_OR_RETURN(zps::DType to, DTypeOf(dst_dtype));
    zps::worker::ParamBuffer b;
    b.dtype = bits == 8 ? zps::DType::kI8Block : zps::DType::kI4Block;
    if (zps::ServingQuantFormat(b.dtype).block != block) {
      return zps::InvalidArgument("block must be " +
                                  std::to_string(zps::ServingQuantFormat(b.dtype).block));
    }
    auto* raw = const_cast<std::byte*>(static_cast<const std::byte*>(blocks));
    b.memory = zps::worker::DeviceBuffer(raw, bytes, [](std::byte*) {});  // not owned
    // The records the run covers: from the one that holds element `skip` (the buffer may hold
    // more before and after them).
    const uint64_t stride = zps::QuantizedBlockStride(f);
    const uint64_t offset = std::min<uint64_t>(skip / block * stride, bytes);
    const uint64_t covering = (skip % block + elems + block - 1) / block * stride;
    if (elems > 0) {
      b.pieces.push_back({elems, skip % block, offset, std::min(bytes - offset, covering)});
    }
    zps::Status s = zps::worker::DequantizeBuffer(b, to, dst);
    if (s.code() == zps::Code::kDataLoss) return zps::InvalidArgument(s.message());
    return s;
  });
}

int zps_release(zps_client* c, uint32_t param) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    zps::MutexLock lock(&c->mu);
    if (c->held.erase(param) == 0) {
      return zps::FailedPrecondition("parameter " + std::to_string(param) + " is not acquired");
    }
    c->prefetcher->Release({&param, 1});
    return zps::Status::Ok();
  });
}

int zps_push_grad(zps_client* c, uint32_t param, int64_t step, float* grad, uint64_t numel,
                  uint32_t micro) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (grad == nullptr && numel > 0) return zps::InvalidArgument("null gradient");
    if (!c->reducer) return c->client->PushGrad(param, step, {grad, numel}, micro);
    // pre-reduced: into the parameter's bucket, reduce-scattered in the buckets' order.
    return c->reducer->Add(param, step, micro, {grad, numel});
  });
}

int zps_await_pushes_below(zps_client* c, uint64_t max_pending) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    return c->client->AwaitPushesBelow(static_cast<size_t>(max_pending));
  });
}

int zps_flush(zps_client* c) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    // pre-reduced: every complete bucket reduced and pushed first. Not Finish: a flush may come
    // in the middle of a backward pass (zps.torch completes each micro-batch's buckets itself,
    // with zeros for the parameters that got no gradient, before its flush).
    if (c->reducer) ZPS_RETURN_IF_ERROR(c->reducer->Drain());
    return c->client->FlushPushes();
  });
}

int zps_await_commit(zps_client* c, int64_t step, zps_commit_info* out) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (out == nullptr) return zps::InvalidArgument("null argument");
    ZPS_ASSIGN_OR_RETURN(auto ci, c->client->AwaitCommit(step));
    zps_commit_info info{};
    info.step = ci.step;
    info.skip = ci.skip ? 1 : 0;
    info.grad_scale = ci.grad_scale;
    info.global_norm = ci.global_norm;
    info.loss_scale = ci.loss_scale;
    info.next_loss_scale = ci.next_loss_scale;
    info.optimizer_step = ci.optimizer_step;
    info.checkpoint = ci.checkpoint ? 1 : 0;
    *out = info;
    return zps::Status::Ok();
  });
}

int zps_read_master(zps_client* c, uint32_t param, int64_t min_version, float* dst) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (dst == nullptr) return zps::InvalidArgument("null destination");
    const zps::Layout& layout = c->client->layout();
    ZPS_ASSIGN_OR_RETURN(auto pieces, layout.Pieces(param));
    const auto deadline = std::chrono::steady_clock::now() + c->client->op_timeout();
    for (const auto& piece : pieces) {
      for (uint64_t done = 0; done < piece.length;) {
        zps::msg::ReadMasterRequest req;
        req.min_version = min_version;
        req.chunk = piece.chunk;
        req.offset = piece.chunk_offset + done;
        req.length = std::min(piece.length - done, zps::msg::kMaxReadMaster);
        auto reply = c->client->CallShard(layout.shard_of_chunk(piece.chunk), zps::msg::kReadMaster,
                                          req.Encode());
        if (!reply.ok()) {
          // Unavailable: the shard has not published min_version yet; wait and ask again.
          if (reply.status().code() != zps::Code::kUnavailable ||
              std::chrono::steady_clock::now() >= deadline) {
            return reply.status();
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          continue;
        }
        ZPS_ASSIGN_OR_RETURN(auto range, zps::msg::MasterRange::Decode(*reply));
        if (range.values.size() != req.length) {
          return zps::InvalidArgument("ReadMaster reply of the wrong length");
        }
        std::memcpy(dst + piece.param_offset + done, range.values.data(),
                    req.length * sizeof(float));
        done += req.length;
      }
    }
    return zps::Status::Ok();
  });
}

int zps_shard_status(zps_client* c, uint32_t ordinal, char* buf, size_t len) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (buf == nullptr || len == 0) return zps::InvalidArgument("null buffer");
    ZPS_ASSIGN_OR_RETURN(auto reply, c->client->CallShard(ordinal, zps::msg::kStatus, {}));
    if (reply.size() + 1 > len) return zps::OutOfRange("status does not fit the buffer");
    std::memcpy(buf, reply.data(), reply.size());
    buf[reply.size()] = '\0';
    return zps::Status::Ok();
  });
}

int zps_chunk_crcs(zps_client* c, uint32_t ordinal, int64_t min_version, uint32_t* chunks,
                   uint32_t* crcs, size_t cap, size_t* n) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (chunks == nullptr || crcs == nullptr || n == nullptr) {
      return zps::InvalidArgument("null buffer");
    }
    zps::msg::ChunkCrcsRequest req{min_version};
    ZPS_ASSIGN_OR_RETURN(auto reply,
                         c->client->CallShard(ordinal, zps::msg::kChunkCrcs, req.Encode()));
    ZPS_ASSIGN_OR_RETURN(auto got, zps::msg::ChunkCrcs::Decode(reply));
    if (got.crcs.size() > cap) {
      return zps::OutOfRange("shard " + std::to_string(ordinal) + " has " +
                             std::to_string(got.crcs.size()) + " chunks, more than " +
                             std::to_string(cap));
    }
    for (size_t i = 0; i < got.crcs.size(); ++i) {
      chunks[i] = got.crcs[i].first;
      crcs[i] = got.crcs[i].second;
    }
    *n = got.crcs.size();
    return zps::Status::Ok();
  });
}

int zps_checkpoint_now(zps_client* c, int64_t timeout_ms, int64_t* step) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (step == nullptr || timeout_ms <= 0) return zps::InvalidArgument("bad argument");
    ZPS_ASSIGN_OR_RETURN(auto co, ToolOptions(c->options.endpoint, c->options.token));
    ZPS_ASSIGN_OR_RETURN(auto rpc, zps::rpc::Client::Connect(co));
    ZPS_ASSIGN_OR_RETURN(
        auto reply, rpc->Call(zps::msg::kCheckpointNow, {}, std::chrono::milliseconds(timeout_ms)));
    ZPS_ASSIGN_OR_RETURN(auto done, zps::msg::CheckpointDone::Decode(reply));
    *step = done.step;
    return zps::Status::Ok();
  });
}

int zps_cuda_available(int device) {
  return Guard([&]() -> zps::Status {
#if ZPS_C_WITH_CUDA
    return zps::worker::CudaAvailable(device);
#else
    (void)device;
    return zps::FailedPrecondition(kNoCudaBuild);
#endif
  });
}

int zps_fetch_to_device(zps_client* c, const uint32_t* ids, size_t n, void* const* dst,
                        uint64_t stream) {
  return Guard([&]() -> zps::Status {
#if ZPS_C_WITH_CUDA
    ZPS_RETURN_IF_ERROR(NeedCuda(c));
    ZPS_RETURN_IF_ERROR(NeedDequantized(c));
    if (n == 0) return zps::Status::Ok();
    if (ids == nullptr || dst == nullptr) return zps::InvalidArgument("null argument");
    for (size_t i = 0; i < n; ++i) {
      if (dst[i] == nullptr) return zps::InvalidArgument("null destination");
    }
    zps::MutexLock lock(&c->mu);
    std::span<const uint32_t> id_span(ids, n);
    ZPS_ASSIGN_OR_RETURN(auto buffers, c->prefetcher->Acquire(id_span));
    zps::Status s;
    for (size_t i = 0; i < n && s.ok(); ++i) {
      // The copy holds the fetched buffer (its pinned slot) until its event completed.
      s = c->cuda->CopyToDevice(dst[i], buffers[i]->bytes(), buffers[i],
                                static_cast<uintptr_t>(stream));
    }
    c->prefetcher->Release(id_span);
    return s;
#else
    (void)c, (void)ids, (void)n, (void)dst, (void)stream;
    return zps::FailedPrecondition(kNoCudaBuild);
#endif
  });
}

int zps_push_grad_device(zps_client* c, uint32_t param, int64_t step, void* grad,
                         int32_t grad_dtype, uint64_t numel, uint32_t micro, uint64_t stream) {
  return Guard([&]() -> zps::Status {
#if ZPS_C_WITH_CUDA
    ZPS_RETURN_IF_ERROR(NeedCuda(c));
    if (grad == nullptr && numel > 0) return zps::InvalidArgument("null gradient");
    ZPS_ASSIGN_OR_RETURN(zps::DType from, DTypeOf(grad_dtype));
    const auto st = static_cast<uintptr_t>(stream);
    const size_t esize = zps::DTypeSize(from);
    if (!c->pre_reduced || !c->collectives) {
      ZPS_ASSIGN_OR_RETURN(auto host, c->cuda->CopyToHost(grad, numel * esize, st));
      if (from == zps::DType::kF32) {
        return c->client->PushGrad(param, step,
                                   {reinterpret_cast<const float*>(host.data()), numel}, micro);
      }
      if (from == c->client->job().grad_dtype) {
        return c->client->PushGradRaw(param, step, {host.data(), numel * esize}, micro);
      }
      std::vector<float> f32(numel);
      Convert(host.data(), from, f32.data(), zps::DType::kF32, numel);
      return c->client->PushGrad(param, step, f32, micro);
    }
    if (from != zps::DType::kF32) {
      return zps::InvalidArgument("pre-reduced device gradients must be fp32");
    }
    // The whole gradient to a pinned slot, then into its bucket (copied there): the buckets are
    // reduce-scattered in their order by the reducer's thread, with NCCL (through device
    // scratch) or Gloo.
    ZPS_ASSIGN_OR_RETURN(auto host, c->cuda->CopyToHost(grad, numel * sizeof(float), st));
    return c->reducer->Add(param, step, micro,
                           {reinterpret_cast<const float*>(host.data()), numel});
#else
    (void)c, (void)param, (void)step, (void)grad, (void)grad_dtype, (void)numel, (void)micro,
        (void)stream;
    return zps::FailedPrecondition(kNoCudaBuild);
#endif
  });
}

int zps_cuda_info(zps_client* c, char* buf, size_t len) {
  return Guard([&]() -> zps::Status {
    ZPS_RETURN_IF_ERROR(NeedClient(c));
    if (buf == nullptr || len == 0) return zps::InvalidArgument("null buffer");
    nlohmann::json doc;
    doc["collectives"] = c->collectives || c->gather ? "gloo" : "none";
#if ZPS_C_WITH_CUDA
    if (c->nccl) doc["collectives"] = "nccl";
    if (c->cuda) {
      const auto s = c->cuda->stats();
      doc["device"] = c->cuda->device();
      doc["h2d_bytes"] = s.h2d_bytes;
      doc["d2h_bytes"] = s.d2h_bytes;
      doc["overflow_allocs"] = s.overflow_allocs;
      doc["inflight_waits"] = s.inflight_waits;
      doc["free_slots"] = s.free_slots;
    } else {
      doc["device"] = -1;
    }
#else
    doc["device"] = -1;
#endif
    const std::string text = doc.dump();
    if (text.size() + 1 > len) return zps::OutOfRange("cuda info does not fit the buffer");
    std::memcpy(buf, text.c_str(), text.size() + 1);
    return zps::Status::Ok();
  });
}

}  // extern "C"
