#include "zps/worker/client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "fetch_op_state.h"
#include "grad_residual.h"
#include "region_arena.h"
#include "serving_directory.h"
#include "zps/common/config.h"
#include "zps/common/grad_quant.h"
#include "zps/common/logging.h"
#include "zps/common/rpc.h"
#include "zps/common/serving_quant.h"
#include "zps/common/staging_pool.h"
#include "zps/common/stream_copy.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/ucx.h"
#include "zps/worker/quantized_pieces.h"

namespace zps::worker {

using namespace std::chrono_literals;

// ---- Client ---------------------------------------------------------------------------------

struct Client::Impl {
  using Clock = std::chrono::steady_clock;
  struct FetchPiece {
    std::shared_ptr<FetchOp::State> op;
    size_t byte_offset = 0;
    size_t bytes = 0;
    uint32_t shard = 0;
    Clock::time_point start;
    uint32_t chunk = 0;        // for the serving directory (FetchRma replies)
    uint64_t wire_offset = 0;  // the piece's first byte in the chunk's serving copy
    // Quantized weights: the piece's covering blocks land in `blocks` (block_bytes of them, in a
    // buffer from Impl::quant_blocks, which gets it back when the piece goes) and are
    // dequantized into the buffer at byte_offset, from element `skip` of the first block, when
    // the piece completes. Null otherwise: the bytes land in the buffer itself.
    std::shared_ptr<std::byte[]> blocks;
    size_t block_bytes = 0;
    size_t skip = 0;
    uint64_t elems = 0;

    size_t wire_bytes() const { return blocks ? block_bytes : bytes; }
    std::span<std::byte> landing() const {
      if (blocks) return {blocks.get(), block_bytes};
      return {op->buffer->memory.data() + byte_offset, bytes};
    }
  };
  struct PendingPush {
    uint32_t shard = 0;
    Clock::time_point start;
    // A push by RMA: the staging block the shard reads, held until the shard's reply.
    std::shared_ptr<const void> rma_block;
  };

  WorkerOptions opts;
  metrics::ProcessMetrics pm;  // detached handles when opts.metrics is null
  Device* device = nullptr;
  std::unique_ptr<ucx::Context> ucx_context;
  std::unique_ptr<ucx::Worker> ucx;
  std::unique_ptr<rpc::Client> coord;
  std::vector<std::unique_ptr<rpc::Client>> shard_rpc;
  std::vector<uint64_t> session;   // per shard
  std::vector<ucx::Endpoint> eps;  // per shard
  msg::JoinReply job;
  std::optional<Layout> layout;
  std::atomic<uint64_t> next_request{1};
  std::atomic<uint64_t> fetched{0}, pushed{0};
  StagingPool staging;  // the copies pushes hold while UCX sends them
  // Host parameter buffers when no Device was given: reused, so that a fetch does not page
  // fault its way through fresh memory (a 64 MiB buffer is a fresh mmap every time otherwise).
  StagingPool host_params;
  // The covering blocks fetches of a block-quantized serving copy land in (FetchPiece::blocks):
  // reused, as host_params, rather than a fresh buffer per piece. Acquired by the threads that
  // fetch, released by the progress thread when a piece completes (StagingPool's own lock).
  StagingPool quant_blocks{size_t{64} << 20};
  bool fetch_rma = false;  // set at SetupUcx: ask for kAmFetchRma (reply with address + rkey)
  // One-sided fetches of published versions (fetch_rma and WorkerOptions::direct_fetch): made
  // at ConnectShards, once the session tokens are known, while the progress thread already
  // runs; it reads `dir` (null until then), which is set once, after `directory_owner`.
  std::unique_ptr<ServingDirectory> directory_owner;
  std::atomic<ServingDirectory*> dir{nullptr};
  ServingDirectory* Directory() const { return dir.load(std::memory_order_acquire); }
  std::atomic<uint64_t> direct_fetches{0};
  std::atomic<uint64_t> notices{0};  // serving notices accepted
  // Pushes by RMA (kAmPushRma): their staging blocks come from here (null: pushes go by AM).
  // Declared after `ucx`: destroyed before the Worker, whose pending operations may still hold
  // blocks (which keep the region alive until then, and the Context outlives both).
  std::unique_ptr<RegionArena> push_arena;
  // The error-feedback residuals of a job with block-quantized gradients (null otherwise): made
  // at Connect, so a re-joined Client starts from zero residuals (docs/checkpoints.md).
  std::unique_ptr<GradResiduals> residuals;

  Mutex mu;
  CondVar push_cv;
  std::unordered_map<uint64_t, FetchPiece> fetches GUARDED_BY(mu);
  std::unordered_map<uint64_t, PendingPush> pushes GUARDED_BY(mu);
  // "by shard 1" / "by shards 0, 1": who has not answered the pending pushes.
  std::string PendingShards() const REQUIRES(mu) {
    std::vector<uint32_t> who;
    for (const auto& [req, p] : pushes) {
      if (std::find(who.begin(), who.end(), p.shard) == who.end()) who.push_back(p.shard);
    }
    std::sort(who.begin(), who.end());
    std::string out = who.size() == 1 ? "by shard " : "by shards ";
    for (size_t i = 0; i < who.size(); ++i) out += (i ? ", " : "") + std::to_string(who[i]);
    return out;
  }
  Status push_error GUARDED_BY(mu);
  // RMA staging blocks of pushes that failed without the shard's answer (endpoint failed): the
  // shard may still be reading one, so it is never reused (the arena then has less room;
  // pushes fall back to AM when it is full).
  std::vector<std::shared_ptr<const void>> quarantined GUARDED_BY(mu);

  void EndRequest(metrics::Op op, Clock::time_point start) const {
    pm.inflight[op].Dec();
    pm.request_duration[op].ObserveSince(start);
  }
  std::optional<FetchPiece> TakeFetch(uint64_t request) {
    MutexLock lock(&mu);
    auto it = fetches.find(request);
    if (it == fetches.end()) return std::nullopt;
    FetchPiece p = std::move(it->second);
    fetches.erase(it);
    return p;
  }
  // `replied`: the shard answered, so it is done with the push's bytes (it answers a push by
  // RMA only after its get completed, or before starting it).
  void FinishPush(uint64_t request, const Status& s, bool replied = false) {
    Clock::time_point start;
    {
      MutexLock lock(&mu);
      auto it = pushes.find(request);
      if (it == pushes.end()) return;
      start = it->second.start;
      const uint32_t shard = it->second.shard;
      if (!s.ok() && !replied && it->second.rma_block) {
        quarantined.push_back(std::move(it->second.rma_block));
      }
      pushes.erase(it);
      if (!s.ok() && push_error.ok()) push_error = ShardError(shard, s);
    }
    EndRequest(metrics::kPush, start);
    push_cv.SignalAll();
  }
  // A data-plane error that names the shard (and its endpoint), unless it already does.
  Status ShardError(uint32_t shard, const Status& s) const {
    const std::string name = "shard " + std::to_string(shard);
    if (s.ok() || s.message().rfind(name, 0) == 0) return s;
    return s.WithContext(name + " at " + job.shard_endpoints[shard]);
  }
  void FailShard(uint32_t shard, const Status& s) {
    if (ServingDirectory* d = Directory()) d->Forget(shard);
    std::vector<FetchPiece> failed;
    std::vector<uint64_t> failed_pushes;
    {
      MutexLock lock(&mu);
      for (auto it = fetches.begin(); it != fetches.end();) {
        if (it->second.shard == shard) {
          failed.push_back(std::move(it->second));
          it = fetches.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& [req, pending] : pushes) {
        if (pending.shard == shard) failed_pushes.push_back(req);
      }
    }
    for (auto& p : failed) {
      EndRequest(metrics::kFetch, p.start);
      p.op->Complete(p.shard, s, -1);
    }
    for (uint64_t r : failed_pushes) FinishPush(r, s);
  }

  // Shared memory gives no UCX peer-failure reports: a shard whose control-plane connection
  // broke is declared failed here (Worker::Fail), which fails what waits on it.
  std::thread watch;
  // Sessions the shards fenced (a kNoticeForget: the shard began a rollback or lost the
  // coordinator, and closes the session's endpoint, so nothing sent on it will be answered).
  // A notice may come while ConnectShards still connects other shards (a shard that fences
  // right after this worker's hello): its token waits here until `eps` is complete.
  Mutex fence_mu;
  std::unordered_set<uint64_t> fenced GUARDED_BY(fence_mu);
  bool shards_connected GUARDED_BY(fence_mu) = false;
  // The endpoints of the shards whose sessions were fenced, once every shard is connected.
  std::vector<ucx::Endpoint> FencedEndpoints() const REQUIRES(fence_mu) {
    std::vector<ucx::Endpoint> out;
    if (!shards_connected) return out;
    for (size_t i = 0; i < eps.size(); ++i) {
      if (fenced.count(session[i]) != 0) out.push_back(eps[i]);
    }
    return out;
  }
  // Fails each endpoint: every operation pending on it, and every later one, ends with
  // Unavailable at once (the caller re-joins) rather than at the op timeout.
  void FailFenced(const std::vector<ucx::Endpoint>& fenced_eps) {
    for (const auto& ep : fenced_eps) {
      ucx->Fail(ep, msg::SessionFencedError());
    }
  }
  void SessionFenced(uint64_t token) {
    std::vector<ucx::Endpoint> fenced_eps;
    {
      MutexLock lock(&fence_mu);
      fenced.insert(token);
      fenced_eps = FencedEndpoints();
    }
    FailFenced(fenced_eps);
  }

  Mutex watch_mu;
  CondVar watch_cv;
  bool watch_stop GUARDED_BY(watch_mu) = false;
  void WatchShards();
  bool device_attached = false;  // device->AttachUcx succeeded: DetachUcx before the context goes
  ~Impl() {
    StopWatch();
    if (ucx) ucx->Stop();  // no receive lands in the device's memory after this
    if (device_attached) device->DetachUcx();
  }
  void StopWatch() {
    {
      MutexLock lock(&watch_mu);
      watch_stop = true;
    }
    watch_cv.SignalAll();
    if (watch.joinable()) watch.join();
  }

  Status SetupUcx();
  // The header of a message from a shard, or nullopt once a malformed one (`what`: "fetch
  // reply") is counted as a protocol error and logged.
  template <typename Header>
  std::optional<Header> DecodeHeader(ucx::AmMessage& m, const char* what) {
    auto h = Header::Decode(m.header());
    if (h.ok()) return std::move(*h);
    pm.ProtocolError("invalid_argument");
    ZPS_LOG(WARNING) << "malformed " << what << ": " << h.status().ToString();
    return std::nullopt;
  }
  void OnFetchReply(ucx::AmMessage& m);
  void OnFetchRmaReply(ucx::AmMessage& m);
  void OnServingNotice(ucx::AmMessage& m);
  void FinishFetch(const FetchPiece& piece, const Status& s, int64_t version);
  Status JoinJob(std::span<const std::byte> spec, uint64_t hash);
  Status ConnectShards();
  // `micro` in [0, job.accumulation_steps): the contributor index sent is rank * k + micro.
  // Elements [begin, begin + length) of the parameter (length UINT64_MAX: to its end); `data`
  // holds them from its start.
  Status SendPush(uint32_t param, int64_t step, DType dtype, const std::byte* data,
                  std::shared_ptr<const void> owner, bool in_arena, uint32_t micro,
                  uint64_t begin = 0, uint64_t length = UINT64_MAX);
  Status QuantizedRefused() const {
    return InvalidArgument(std::string("the job pushes ") + std::string(DTypeName(job.grad_dtype)) +
                           " block-quantized gradients: push fp32 (PushGrad, PushGradRange), "
                           "which the Client quantizes with error feedback");
  }
  Status CheckMicro(uint32_t micro) const {
    if (micro < job.accumulation_steps) return Status::Ok();
    return InvalidArgument("micro-batch " + std::to_string(micro) + " of a job with " +
                           std::to_string(job.accumulation_steps) + " micro-batches a step");
  }
  // A gradient of `param` pushed as `bytes` bytes already in the job's grad dtype (`what`: "raw",
  // "shared"). Errors: InvalidArgument (micro-batch, a block-quantized job, the length),
  // OutOfRange (the parameter).
  Status CheckBytesGrad(uint32_t param, size_t bytes, uint32_t micro, const char* what) const {
    ZPS_RETURN_IF_ERROR(CheckMicro(micro));
    if (param >= layout->num_params()) return OutOfRange("parameter id " + std::to_string(param));
    if (IsBlockQuantized(job.grad_dtype)) return QuantizedRefused();
    if (bytes != layout->param_numel(param) * DTypeSize(job.grad_dtype)) {
      return InvalidArgument(std::string(what) + " gradient has the wrong byte length");
    }
    return Status::Ok();
  }
  // A push staging buffer: from the RMA arena when pushes go by RMA and it has room, else from
  // the heap pool. `in_arena` says which.
  std::shared_ptr<std::byte[]> AcquireStaging(size_t bytes, bool* in_arena) {
    if (push_arena) {
      if (auto block = push_arena->Acquire(bytes)) {
        *in_arena = true;
        return block;
      }
    }
    *in_arena = false;
    return staging.Acquire(bytes);
  }
  // `grad` converted to the job's grad dtype in a staging buffer (AcquireStaging). A quantized
  // job's gradient (elements [begin, ...) of `param`) is encoded piece by piece, with error
  // feedback (GradResiduals).
  Result<std::shared_ptr<std::byte[]>> StageGrad(uint32_t param, uint64_t begin,
                                                 std::span<const float> grad, bool* in_arena) {
    const DType dt = job.grad_dtype;
    if (IsBlockQuantized(dt)) {
      ZPS_ASSIGN_OR_RETURN(auto pieces, layout->Pieces(param, begin, grad.size()));
      std::vector<uint64_t> lengths;
      size_t bytes = 0;
      for (const Piece& p : pieces) {
        lengths.push_back(p.length);
        bytes += PushBytes(dt, p.length);
      }
      auto data = AcquireStaging(bytes, in_arena);
      ZPS_RETURN_IF_ERROR(residuals->Encode(param, begin, grad, lengths, {data.get(), bytes}));
      return data;
    }
    // Not zero-initialised: every byte is written below.
    auto data = AcquireStaging(grad.size() * DTypeSize(dt), in_arena);
    // Streaming stores: the block is read next by another core (the shard's RMA get, or the
    // progress thread that sends it), never by this one (stream_copy.h).
    if (dt == DType::kF32) {
      StreamCopy({data.get(), grad.size() * sizeof(float)}, std::as_bytes(grad));
    } else {
      std::span<uint16_t> out(reinterpret_cast<uint16_t*>(data.get()), grad.size());
      if (dt == DType::kF16)
        StreamConvertF32ToF16(grad, out);
      else
        StreamConvertF32ToBF16(grad, out);
    }
    return data;
  }
};

// Payloads from this size up go by rendezvous, whatever UCX_RNDV_THRESH says.
constexpr size_t kRendezvousMin = 64 * 1024;

void Client::Impl::FinishFetch(const FetchPiece& piece, const Status& s, int64_t version) {
  if (s.ok()) {
    fetched += piece.wire_bytes();
    pm.fetch_bytes.Inc(piece.wire_bytes());
  }
  if (s.ok() && piece.blocks) {
    // Every Device's buffers are host memory (the CUDA backend's are pinned staging slots, which
    // it copies to the GPU afterwards): dequantized on the CPU with the SIMD codec.
    DequantizeRange(ServingQuantFormat(job.serving_dtype), piece.landing(), piece.skip, piece.elems,
                    DequantTarget::kF32, piece.op->buffer->memory.data() + piece.byte_offset);
  }
  EndRequest(metrics::kFetch, piece.start);
  piece.op->Complete(piece.shard, ShardError(piece.shard, s), version);
}

void Client::Impl::OnFetchReply(ucx::AmMessage& m) {
  auto h = DecodeHeader<msg::FetchReplyHeader>(m, "fetch reply");
  if (!h) return;
  auto piece = TakeFetch(h->request);
  if (!piece) return;  // timed out or failed already
  if (h->code != 0) return FinishFetch(*piece, msg::StatusFromWire(h->code, h->message), -1);
  if (m.data_length() != piece->wire_bytes()) {
    pm.ProtocolError("invalid_argument");
    return FinishFetch(*piece,
                       DataLoss("fetch reply carries " + std::to_string(m.data_length()) +
                                " bytes, expected " + std::to_string(piece->wire_bytes())),
                       -1);
  }
  std::span<std::byte> dest = piece->landing();
  Status s = m.Receive(dest, [this, piece = std::move(*piece), version = h->version](Status st) {
    FinishFetch(piece, st, version);
  });
  (void)s;  // also reported through the callback
}

void Client::Impl::OnFetchRmaReply(ucx::AmMessage& m) {
  auto h = DecodeHeader<msg::FetchRmaReplyHeader>(m, "fetch reply");
  if (!h) return;
  auto piece = TakeFetch(h->request);
  if (!piece) return;  // timed out or failed already
  if (h->code != 0) {
    if (ServingDirectory* d = Directory()) d->Forget(piece->shard);
    return FinishFetch(*piece, msg::StatusFromWire(h->code, h->message), -1);
  }
  if (h->rkey.empty()) {
    pm.ProtocolError("invalid_argument");
    return FinishFetch(*piece, DataLoss("fetch reply without an rkey"), -1);
  }
  // The range stays unchanged at this version until this worker pushes for the chunk, which it
  // does only after the fetch completed: read it straight into the parameter buffer.
  std::span<std::byte> dest = piece->landing();
  const uint32_t shard = piece->shard;
  if (ServingDirectory* d = Directory()) {
    // Byte offsets (elements of one byte): a quantized copy's ranges are its covering blocks.
    d->Learn(shard, piece->chunk, piece->wire_offset, 1, h->version, h->remote_address, h->rkey,
             h->bank_delta);
  }
  ucx->Get(eps[shard], dest, h->remote_address, h->rkey, nullptr,
           [this, piece = std::move(*piece), version = h->version](Status st) {
             FinishFetch(piece, st, version);
           });
}

void Client::Impl::OnServingNotice(ucx::AmMessage& m) {
  auto h = DecodeHeader<msg::ServingNoticeHeader>(m, "serving notice");
  if (!h) return;
  if (h->version == msg::ServingNoticeHeader::kNoticeForget) SessionFenced(h->session);
  ServingDirectory* d = Directory();
  if (d == nullptr) return;  // fetches ask every time (or not connected yet): nothing to learn
  // The shard is named by its session token (each shard issued its own).
  for (uint32_t i = 0; i < session.size(); ++i) {
    if (session[i] != h->session) continue;
    Status s = d->Notice(i, h->session, h->version);
    if (s.ok()) ++notices;
    if (!s.ok()) {
      pm.ProtocolError(s.code() == Code::kUnauthenticated ? "unauthenticated" : "stale_step");
      ZPS_LOG(DEBUG) << "serving notice from shard " << i << " refused: " << s.ToString();
    }
    return;
  }
  pm.ProtocolError("unauthenticated");
  ZPS_LOG(DEBUG) << "serving notice with an unknown session token refused";
}

Status Client::Impl::SetupUcx() {
  ZPS_ASSIGN_OR_RETURN(ucx_context, ucx::Context::Create({.transports = opts.ucx_tls}));
  ZPS_ASSIGN_OR_RETURN(
      ucx, ucx::Worker::Create(*ucx_context, {.thread_name = "worker-ucx", .spin = opts.ucx_spin}));
  ZPS_RETURN_IF_ERROR(pm.SetUcxTransports(*ucx_context));
  if (device != nullptr) {
    ZPS_RETURN_IF_ERROR(device->AttachUcx(*ucx_context));
    device_attached = true;
  }
  if (opts.fetch_mode == "rma") {
    fetch_rma = true;
  } else if (opts.fetch_mode == "auto") {
    // Shared memory only: RMA get from UCX-allocated memory is a plain copy (1.0x of ucp_get);
    // over tcp UCX emulates RMA, and AM rendezvous is faster (docs/data-plane.md).
    fetch_rma = !ucx_context->peer_failure_capable();
  } else if (opts.fetch_mode != "am") {
    return InvalidArgument("fetch_mode must be auto, am or rma; got '" + opts.fetch_mode + "'");
  }
  bool push_rma = false;
  if (opts.push_mode == "rma") {
    push_rma = true;
  } else if (opts.push_mode == "auto") {
    push_rma = !ucx_context->peer_failure_capable();  // shared memory only, as for fetches
  } else if (opts.push_mode != "am") {
    return InvalidArgument("push_mode must be auto, am or rma; got '" + opts.push_mode + "'");
  }
  if (push_rma && opts.rma_push_bytes > 0) {
    auto region = ucx_context->Allocate(opts.rma_push_bytes);
    if (region.ok()) {
      push_arena = std::make_unique<RegionArena>(std::move(*region));
    } else {
      ZPS_LOG(WARNING) << "pushes go by AM: UCX could not allocate the RMA staging region: "
                       << region.status().ToString();
    }
  }
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmFetchReply, [this](ucx::AmMessage& m) { OnFetchReply(m); }));
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmFetchRmaReply, [this](ucx::AmMessage& m) { OnFetchRmaReply(m); }));
  ZPS_RETURN_IF_ERROR(
      ucx->SetAmHandler(msg::kAmServingNotice, [this](ucx::AmMessage& m) { OnServingNotice(m); }));
  ZPS_RETURN_IF_ERROR(ucx->SetAmHandler(msg::kAmPushReply, [this](ucx::AmMessage& m) {
    auto h = DecodeHeader<msg::PushReplyHeader>(m, "push reply");
    if (!h) return;
    FinishPush(h->request, msg::StatusFromWire(h->code, h->message), /*replied=*/true);
  }));
  return ucx->Start();
}

Status Client::Impl::JoinJob(std::span<const std::byte> spec, uint64_t hash) {
  ZPS_ASSIGN_OR_RETURN(auto hp, SplitHostPort(opts.endpoint));
  const auto deadline = std::chrono::steady_clock::now() + opts.connect_timeout;
  auto backoff = 100ms;
  Status last;
  msg::Join join{opts.rank, hash, {}};
  if (opts.rank == 0) join.job_spec.assign(spec.begin(), spec.end());
  const auto payload = join.Encode();
  while (std::chrono::steady_clock::now() < deadline) {
    if (!coord || !coord->connected()) {
      rpc::ClientOptions co{hp.first,   hp.second,
                            opts.token, rpc::PeerRole::kTool,
                            opts.rank,  "worker-" + std::to_string(opts.rank),
                            {},         5000};
      auto c = rpc::Client::Connect(co);
      if (!c.ok()) {
        last = c.status();
        if (last.code() == Code::kUnauthenticated || last.code() == Code::kFailedPrecondition ||
            last.code() == Code::kInvalidArgument) {
          return last;
        }
      } else {
        coord = std::move(*c);
      }
    }
    if (coord && coord->connected()) {
      auto r = coord->Call(msg::kJoin, payload, 30s);
      if (r.ok()) {
        ZPS_ASSIGN_OR_RETURN(job, msg::JoinReply::Decode(*r));
        ZPS_ASSIGN_OR_RETURN(Layout l, Layout::Deserialize(job.layout));
        layout = std::move(l);
        return Status::Ok();
      }
      last = r.status();
      if (last.code() != Code::kUnavailable) return last.WithContext("join");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  return Unavailable("could not join the job at " + opts.endpoint + " within " +
                     std::to_string(opts.connect_timeout.count()) + " ms: " + last.ToString());
}

Status Client::Impl::ConnectShards() {
  const size_t n = job.shard_endpoints.size();
  shard_rpc.resize(n);
  session.resize(n);
  eps.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    ZPS_ASSIGN_OR_RETURN(auto hp, SplitHostPort(job.shard_endpoints[i]));
    rpc::ClientOptions co{hp.first,       hp.second,
                          opts.token,     rpc::PeerRole::kWorker,
                          opts.rank,      "worker-" + std::to_string(opts.rank),
                          ucx->Address(), 5000};
    // A shard refuses workers (Unavailable) until it has loaded the job: retry with backoff.
    const auto deadline = std::chrono::steady_clock::now() + opts.connect_timeout;
    auto backoff = 20ms;
    for (;;) {
      auto c = rpc::Client::Connect(co);
      if (c.ok()) {
        shard_rpc[i] = std::move(*c);
        break;
      }
      if (c.status().code() != Code::kUnavailable || std::chrono::steady_clock::now() > deadline) {
        return c.status().WithContext("shard " + std::to_string(i) + " at " +
                                      job.shard_endpoints[i]);
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    session[i] = shard_rpc[i]->session_token();
    auto addr = shard_rpc[i]->hello_reply_extra();
    ZPS_ASSIGN_OR_RETURN(
        eps[i], ucx->Connect(addr, [this, i](const ucx::Endpoint&, const Status& s) {
          ZPS_LOG(WARNING) << "shard " << i << " data plane failed: " << s.ToString();
          FailShard(i, Unavailable("shard " + std::to_string(i) + " lost: " + s.message()));
        }));
  }
  if (fetch_rma && opts.direct_fetch) {
    directory_owner = std::make_unique<ServingDirectory>(
        session, job.reduction_mode == msg::ReductionMode::kServerSum);
    dir.store(directory_owner.get(), std::memory_order_release);
  }
  std::vector<ucx::Endpoint> fenced_eps;
  {
    MutexLock lock(&fence_mu);
    shards_connected = true;
    fenced_eps = FencedEndpoints();  // shards that fenced while the others were being connected
  }
  FailFenced(fenced_eps);
  return Status::Ok();
}

void Client::Impl::WatchShards() {
  log::SetThreadName("worker-watch");
  std::vector<bool> failed(eps.size(), false);
  MutexLock lock(&watch_mu);
  while (!watch_cv.WaitFor(lock, 200ms, [&]() REQUIRES(watch_mu) { return watch_stop; })) {
    for (size_t i = 0; i < eps.size(); ++i) {
      if (failed[i] || eps[i].peer_error_handling() || shard_rpc[i]->connected()) continue;
      failed[i] = true;
      ucx->Fail(eps[i],
                Unavailable("shard " + std::to_string(i) + ": control-plane connection lost"));
    }
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  impl_->StopWatch();
  if (impl_->ucx) impl_->ucx->Stop();
  for (auto& c : impl_->shard_rpc) {
    if (c) c->Close();
  }
  if (impl_->coord) impl_->coord->Close();
}

Result<std::unique_ptr<Client>> Client::Connect(const WorkerOptions& options,
                                                std::span<const std::byte> job_spec,
                                                uint64_t job_hash) {
  if (options.endpoint.empty()) return InvalidArgument("no coordinator endpoint (ZPS_ENDPOINT)");
  if (options.token.empty()) return InvalidArgument("no auth token");
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  if (options.metrics != nullptr) impl->pm = *options.metrics;
  impl->device = options.device;  // null: host memory from the Client's reusable pool
  ZPS_RETURN_IF_ERROR(impl->SetupUcx());
  ZPS_RETURN_IF_ERROR(impl->JoinJob(job_spec, job_hash));
  ZPS_RETURN_IF_ERROR(impl->ConnectShards());
  if (IsBlockQuantized(impl->job.grad_dtype)) {
    impl->residuals =
        std::make_unique<GradResiduals>(impl->job.grad_dtype, options.grad_error_feedback);
  }
  bool any_without_ucx_errors = false;
  for (const auto& ep : impl->eps) any_without_ucx_errors |= !ep.peer_error_handling();
  if (any_without_ucx_errors) impl->watch = std::thread([d = impl.get()] { d->WatchShards(); });
  ZPS_LOG(INFO) << "rank " << options.rank << " joined: " << impl->layout->num_params()
                << " parameters on " << impl->job.shard_endpoints.size()
                << " shards, resume at step " << impl->job.resume_step;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const Layout& Client::layout() const { return *impl_->layout; }
const msg::JoinReply& Client::job() const { return impl_->job; }
uint32_t Client::rank() const { return impl_->opts.rank; }
uint32_t Client::accumulation_steps() const { return impl_->job.accumulation_steps; }
std::chrono::milliseconds Client::op_timeout() const { return impl_->opts.op_timeout; }
uint64_t Client::fetched_bytes() const { return impl_->fetched.load(); }
uint64_t Client::pushed_bytes() const { return impl_->pushed.load(); }
uint64_t Client::direct_fetches() const { return impl_->direct_fetches.load(); }
uint64_t Client::serving_notices() const { return impl_->notices.load(); }

FetchOp Client::FetchAsync(uint32_t param, int64_t min_version) {
  if (param >= impl_->layout->num_params()) {
    auto st = std::make_shared<FetchOp::State>();
    st->buffer = std::make_shared<ParamBuffer>();
    st->buffer->param = param;
    {
      MutexLock lock(&st->mu);  // not shared yet; for the analysis
      st->error = OutOfRange("parameter id " + std::to_string(param) + " out of range");
    }
    return FetchOp(st);
  }
  return FetchAsync(param, 0, impl_->layout->param_numel(param), min_version);
}

FetchOp Client::FetchAsync(uint32_t param, uint64_t begin, uint64_t length, int64_t min_version) {
  return StartFetch(param, begin, length, min_version, /*quantized=*/false);
}

FetchOp Client::FetchQuantizedAsync(uint32_t param, uint64_t begin, uint64_t length,
                                    int64_t min_version) {
  if (!IsBlockQuantized(impl_->job.serving_dtype)) {
    return ParamSource::FetchQuantizedAsync(param, begin, length, min_version);
  }
  return StartFetch(param, begin, length, min_version, /*quantized=*/true);
}

FetchOp Client::StartFetch(uint32_t param, uint64_t begin, uint64_t length, int64_t min_version,
                           bool quantized) {
  auto st = std::make_shared<FetchOp::State>();
  st->buffer = std::make_shared<ParamBuffer>();
  st->buffer->param = param;
  st->buffer->begin = begin;
  st->buffer->dtype = quantized ? impl_->job.serving_dtype : serving_dtype();
  if (length == 0) {          // an empty slice (a rank beyond a small parameter's last element)
    MutexLock lock(&st->mu);  // not shared yet; for the analysis
    if (param >= impl_->layout->num_params() || begin > impl_->layout->param_numel(param)) {
      st->error =
          OutOfRange("parameter " + std::to_string(param) + " range at " + std::to_string(begin));
    }
    st->version = min_version;
    return FetchOp(st);
  }
  auto pieces = impl_->layout->Pieces(param, begin, length);
  if (!pieces.ok()) {
    {
      MutexLock lock(&st->mu);  // not shared yet; for the analysis
      st->error = pieces.status();
    }
    return FetchOp(st);
  }
  const DType served = impl_->job.serving_dtype;
  const size_t esize = DTypeSize(st->buffer->dtype);
  size_t bytes = length * esize;
  if (quantized) {
    auto qp = QuantizedPieces(*impl_->layout, served, param, begin, length);
    if (!qp.ok()) {
      MutexLock lock(&st->mu);  // not shared yet; for the analysis
      st->error = qp.status();
      return FetchOp(st);
    }
    st->buffer->pieces = std::move(*qp);
    bytes = QuantizedPiecesBytes(st->buffer->pieces);
  }
  if (impl_->device == nullptr) {
    auto mem = impl_->host_params.Acquire(bytes);
    std::byte* raw = mem.get();
    st->buffer->memory =
        DeviceBuffer(raw, bytes, [mem = std::move(mem)](std::byte*) mutable { mem.reset(); });
  } else {
    auto mem = impl_->device->Allocate(bytes);
    if (!mem.ok()) {
      {
        MutexLock lock(&st->mu);  // not shared yet; for the analysis
        st->error = mem.status();
      }
      return FetchOp(st);
    }
    st->buffer->memory = std::move(*mem);
  }
  {
    MutexLock lock(&st->mu);  // before any piece is sent
    st->remaining = pieces->size();
    for (const Piece& p : *pieces) st->waiting.push_back(impl_->layout->shard_of_chunk(p.chunk));
  }
  for (size_t i = 0; i < pieces->size(); ++i) {
    const Piece& p = (*pieces)[i];
    const uint32_t shard = impl_->layout->shard_of_chunk(p.chunk);
    const uint64_t req = impl_->next_request++;
    impl_->pm.inflight[metrics::kFetch].Inc();
    const QuantRange wire =
        ServingRange(served, impl_->layout->chunk_size(p.chunk), p.chunk_offset, p.length);
    Impl::FetchPiece fp{st,
                        (p.param_offset - begin) * esize,
                        p.length * esize,
                        shard,
                        Impl::Clock::now(),
                        p.chunk,
                        wire.offset};
    if (quantized) {  // the covering blocks land in the buffer itself, as they are
      fp.byte_offset = st->buffer->pieces[i].offset;
      fp.bytes = st->buffer->pieces[i].bytes;
    } else if (IsBlockQuantized(served)) {
      fp.blocks = impl_->quant_blocks.Acquire(wire.bytes);  // every byte is written by the fetch
      fp.block_bytes = wire.bytes;
      fp.skip = wire.skip;
      fp.elems = p.length;
    }
    if (ServingDirectory* d = impl_->Directory()) {
      // A published version whose address is known: read it without asking (no round trip).
      if (auto hit = d->Lookup(shard, p.chunk, fp.wire_offset, 1, min_version)) {
        ++impl_->direct_fetches;
        std::span<std::byte> dest = fp.landing();
        impl_->ucx->Get(
            impl_->eps[shard], dest, hit->address, hit->rkey, nullptr,
            [impl = impl_.get(), d, piece = std::move(fp), version = hit->version](Status s) {
              if (!s.ok()) d->Forget(piece.shard);
              impl->FinishFetch(piece, s, version);
            });
        continue;
      }
    }
    {
      MutexLock lock(&impl_->mu);
      impl_->fetches[req] = std::move(fp);
    }
    msg::FetchHeader h{impl_->session[shard], req, p.chunk, p.chunk_offset, p.length, min_version};
    impl_->ucx->SendAm(impl_->eps[shard], impl_->fetch_rma ? msg::kAmFetchRma : msg::kAmFetch,
                       h.Encode(), {}, nullptr, [impl = impl_.get(), req, shard](Status s) {
                         if (s.ok()) return;
                         if (auto piece = impl->TakeFetch(req)) {
                           impl->EndRequest(metrics::kFetch, piece->start);
                           piece->op->Complete(shard, impl->ShardError(shard, s), -1);
                         }
                       });
  }
  return FetchOp(st);
}

Result<std::shared_ptr<const ParamBuffer>> Client::Fetch(uint32_t param, int64_t min_version) {
  return FetchAsync(param, min_version).Wait(impl_->opts.op_timeout);
}

Status Client::Impl::SendPush(uint32_t param, int64_t step, DType dtype, const std::byte* data,
                              std::shared_ptr<const void> owner, bool in_arena, uint32_t micro,
                              uint64_t begin, uint64_t length) {
  ZPS_RETURN_IF_ERROR(CheckMicro(micro));
  if (param >= layout->num_params()) return OutOfRange("parameter id " + std::to_string(param));
  if (length == UINT64_MAX) length = layout->param_numel(param) - begin;
  ZPS_ASSIGN_OR_RETURN(auto pieces, layout->Pieces(param, begin, length));
  const uint32_t contributor = opts.rank * job.accumulation_steps + micro;
  // The pieces' bytes lie one after another in `data`, in piece order (a quantized piece is
  // encoded on its own: grad_quant.h).
  size_t byte_offset = 0;
  {
    MutexLock lock(&mu);
    if (!push_error.ok()) return push_error;
  }
  for (const Piece& p : pieces) {
    const uint32_t shard = layout->shard_of_chunk(p.chunk);
    const uint64_t req = next_request++;
    // Before it goes out: from now on the shard may rewrite the chunk's serving copy.
    if (ServingDirectory* d = Directory()) d->Pushed(p.chunk, step);
    pm.inflight[metrics::kPush].Inc();
    {
      MutexLock lock(&mu);
      // By RMA the shard reads the block after the AM went out: hold it until the reply.
      pushes[req] = {shard, Clock::now(), in_arena ? owner : nullptr};
    }
    msg::PushHeader h{session[shard], req,      step,        p.chunk,
                      p.chunk_offset, p.length, contributor, dtype};
    std::span<const std::byte> bytes(data + byte_offset, PushBytes(dtype, p.length));
    byte_offset += bytes.size();
    pushed += bytes.size();
    pm.push_bytes.Inc(bytes.size());
    auto on_sent = [this, req](Status s) {
      if (!s.ok()) FinishPush(req, s);
    };
    if (in_arena) {
      const ucx::MemoryRegion& region = push_arena->region();
      msg::PushRmaHeader rh{h,
                            reinterpret_cast<uintptr_t>(bytes.data()),
                            {region.rkey().begin(), region.rkey().end()}};
      ucx->SendAm(eps[shard], msg::kAmPushRma, rh.Encode(), {}, nullptr, std::move(on_sent));
      continue;
    }
    ucx::SendOptions so;
    so.force_rendezvous = bytes.size() >= kRendezvousMin;
    ucx->SendAm(eps[shard], msg::kAmPush, h.Encode(), bytes, owner, std::move(on_sent), so);
  }
  return Status::Ok();
}

Status Client::PushGrad(uint32_t param, int64_t step, std::span<const float> grad) {
  return PushGrad(param, step, grad, 0);
}

Status Client::PushGrad(uint32_t param, int64_t step, std::span<const float> grad, uint32_t micro) {
  ZPS_RETURN_IF_ERROR(impl_->CheckMicro(micro));
  const Layout& l = *impl_->layout;
  if (param >= l.num_params()) return OutOfRange("parameter id " + std::to_string(param));
  if (grad.size() != l.param_numel(param)) {
    return InvalidArgument("gradient of '" + l.spec(param).name + "' has " +
                           std::to_string(grad.size()) + " elements, expected " +
                           std::to_string(l.param_numel(param)));
  }
  const DType dt = impl_->job.grad_dtype;
  bool in_arena = false;
  ZPS_ASSIGN_OR_RETURN(auto data, impl_->StageGrad(param, 0, grad, &in_arena));
  const std::byte* bytes = data.get();
  return impl_->SendPush(param, step, dt, bytes, std::move(data), in_arena, micro);
}

Status Client::PushGradRaw(uint32_t param, int64_t step, std::span<const std::byte> grad) {
  return PushGradRaw(param, step, grad, 0);
}

Status Client::PushGradRaw(uint32_t param, int64_t step, std::span<const std::byte> grad,
                           uint32_t micro) {
  ZPS_RETURN_IF_ERROR(impl_->CheckBytesGrad(param, grad.size(), micro, "raw"));
  const DType dt = impl_->job.grad_dtype;
  bool in_arena = false;
  auto data = impl_->AcquireStaging(grad.size(), &in_arena);
  StreamCopy({data.get(), grad.size()}, grad);
  const std::byte* bytes = data.get();
  return impl_->SendPush(param, step, dt, bytes, std::move(data), in_arena, micro);
}

Status Client::PushGradShared(uint32_t param, int64_t step, std::span<const std::byte> grad,
                              std::shared_ptr<const void> owner) {
  return PushGradShared(param, step, grad, std::move(owner), 0);
}

Status Client::PushGradShared(uint32_t param, int64_t step, std::span<const std::byte> grad,
                              std::shared_ptr<const void> owner, uint32_t micro) {
  ZPS_RETURN_IF_ERROR(impl_->CheckBytesGrad(param, grad.size(), micro, "shared"));
  const DType dt = impl_->job.grad_dtype;
  const bool in_arena = impl_->push_arena != nullptr &&
                        impl_->push_arena->region().Contains(grad.data(), grad.size());
  return impl_->SendPush(param, step, dt, grad.data(), std::move(owner), in_arena, micro);
}

Status Client::PushGradRange(uint32_t param, int64_t step, uint64_t begin,
                             std::span<const float> grad, uint32_t micro) {
  ZPS_RETURN_IF_ERROR(impl_->CheckMicro(micro));
  const Layout& l = *impl_->layout;
  if (param >= l.num_params()) return OutOfRange("parameter id " + std::to_string(param));
  if (begin > l.param_numel(param) || grad.size() > l.param_numel(param) - begin) {
    return OutOfRange("gradient range [" + std::to_string(begin) + ", +" +
                      std::to_string(grad.size()) + ") of '" + l.spec(param).name + "' (" +
                      std::to_string(l.param_numel(param)) + " elements)");
  }
  if (grad.empty()) return Status::Ok();
  const DType dt = impl_->job.grad_dtype;
  bool in_arena = false;
  ZPS_ASSIGN_OR_RETURN(auto data, impl_->StageGrad(param, begin, grad, &in_arena));
  const std::byte* bytes = data.get();
  return impl_->SendPush(param, step, dt, bytes, std::move(data), in_arena, micro, begin,
                         grad.size());
}

std::shared_ptr<std::byte[]> Client::AllocatePushBuffer(size_t bytes) {
  bool in_arena = false;
  return impl_->AcquireStaging(bytes, &in_arena);
}

Status Client::PushInitial(uint32_t param, std::span<const float> values) {
  const Layout& l = *impl_->layout;
  if (param >= l.num_params()) return OutOfRange("parameter id " + std::to_string(param));
  if (values.size() != l.param_numel(param)) return InvalidArgument("initial values: wrong length");
  bool in_arena = false;
  auto data = impl_->AcquireStaging(values.size() * 4, &in_arena);
  StreamCopy({data.get(), values.size() * 4}, std::as_bytes(values));
  const std::byte* bytes = data.get();
  return impl_->SendPush(param, -1, DType::kF32, bytes, std::move(data), in_arena, 0);
}

Status Client::FlushPushes() {
  MutexLock lock(&impl_->mu);
  if (!impl_->push_cv.WaitFor(lock, impl_->opts.op_timeout,
                              [&]() REQUIRES(impl_->mu) { return impl_->pushes.empty(); })) {
    return DeadlineExceeded(std::to_string(impl_->pushes.size()) + " pushes unacknowledged (" +
                            impl_->PendingShards() + ") after " +
                            std::to_string(impl_->opts.op_timeout.count()) + " ms");
  }
  Status s = impl_->push_error;
  impl_->push_error = Status::Ok();
  return s;
}

Status Client::AwaitPushesBelow(size_t max_pending) {
  MutexLock lock(&impl_->mu);
  if (!impl_->push_cv.WaitFor(lock, impl_->opts.op_timeout, [&]() REQUIRES(impl_->mu) {
        return impl_->pushes.size() < std::max<size_t>(max_pending, 1) || !impl_->push_error.ok();
      })) {
    return DeadlineExceeded(std::to_string(impl_->pushes.size()) + " pushes unacknowledged (" +
                            impl_->PendingShards() + ") after " +
                            std::to_string(impl_->opts.op_timeout.count()) + " ms");
  }
  return impl_->push_error;
}

Result<msg::CommitInfo> Client::AwaitCommit(int64_t step) {
  msg::AwaitCommit req{step};
  impl_->pm.inflight[metrics::kControl].Inc();
  const auto start = Impl::Clock::now();
  auto reply = impl_->coord->Call(msg::kAwaitCommit, req.Encode(), impl_->opts.op_timeout);
  impl_->EndRequest(metrics::kControl, start);
  if (!reply.ok()) {
    if (reply.status().code() != Code::kDeadlineExceeded) {
      return reply.status().WithContext("coordinator at " + impl_->opts.endpoint);
    }
    impl_->pm.ProtocolError("timeout");
    // Say who the decision waits for: the coordinator's Status names the shards whose report
    // is missing (a shard cut off from the network, say).
    std::string who;
    auto st = impl_->coord->Call(msg::kStatus, {}, std::chrono::milliseconds(2000));
    if (st.ok()) {
      const std::string_view doc(reinterpret_cast<const char*>(st->data()), st->size());
      const auto at = doc.find("\"awaiting_reports\":[");
      if (at != std::string_view::npos) {
        const auto begin = at + std::string_view("\"awaiting_reports\":[").size();
        const auto end = doc.find(']', begin);
        if (end != std::string_view::npos && end > begin) {
          std::string list(doc.substr(begin, end - begin));
          const bool many = list.find(',') != std::string::npos;
          for (size_t i = list.find(','); i != std::string::npos; i = list.find(',', i + 2)) {
            list.replace(i, 1, ", ");
          }
          who = std::string("; the decision waits for the report of shard") + (many ? "s " : " ") +
                list;
        }
      }
    }
    return Status(reply.status().code(), reply.status().message() + who)
        .WithContext("coordinator at " + impl_->opts.endpoint);
  }
  ZPS_ASSIGN_OR_RETURN(msg::CommitInfo info, msg::CommitInfo::Decode(*reply));
  // The state after this step is checkpointed: the residuals restart from zero at the next
  // step, as they do in a job that rolls back to that checkpoint (docs/checkpoints.md).
  if (info.checkpoint && impl_->residuals) impl_->residuals->Reset();
  return info;
}

Result<std::vector<std::byte>> Client::CallShard(uint32_t ordinal, uint16_t type,
                                                 std::span<const std::byte> payload) {
  if (ordinal >= impl_->shard_rpc.size()) return OutOfRange("no shard " + std::to_string(ordinal));
  impl_->pm.inflight[metrics::kControl].Inc();
  const auto start = Impl::Clock::now();
  auto r = impl_->shard_rpc[ordinal]->Call(type, payload, impl_->opts.op_timeout);
  impl_->EndRequest(metrics::kControl, start);
  if (!r.ok()) return impl_->ShardError(ordinal, r.status());
  return r;
}

}  // namespace zps::worker
