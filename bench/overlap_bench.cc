// zps-bench overlap: the step time of --update sync against --update speculative, through a
// real zps-server shard (in this process, the coordinator) and a worker Client on loopback,
// beside two references measured in the same run: max(compute, pass) and compute + pass.
//
//   zps-bench overlap                          # 8 layers x 2 Mi elements, compute = the pass
//   zps-bench overlap --compute-ms 200 --threads 2
//
// zps-bench checkpoint-stall: the step time while checkpoints are written, in the background
// (--checkpoint-mode background) and synchronously (the earlier behaviour), beside the same run
// without checkpoints.
//
//   zps-bench checkpoint-stall --dir /nvme/tmp --state-bytes 1GiB --every 4
//
// Method (both). One parameter per layer. A step: fetch every layer at version `step`
// (forward, no compute), then backward from the last layer to the first: sleep compute/layers
// ("GPU compute": the cores stay free for the shard), then push that layer's real fp32
// gradient. The step time is the time from one step's last fetch to the next one's, so it holds
// the compute, what the shard does after the last push (reduce, report, decide, update,
// publish) and the fetches. The pass is measured in the same process before the runs: a sync
// ShardState of the same layout and thread count, ReduceStep + ApplyCommit timed after all
// gradients landed (the work a sync shard does after the last push), median of 3.
// Modes (overlap): sync; speculative (no clipping: every speculated chunk is published);
// speculative-clip (clipping fires on every step: every chunk is redone at the commit, the
// worst case).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/aligned_buffer.h"
#include "zps/common/config.h"
#include "zps/common/logging.h"
#include "zps/common/thread_pool.h"
#include "zps/server/job.h"
#include "zps/server/optimizer.h"
#include "zps/server/shard_server.h"
#include "zps/server/shard_state.h"
#include "zps/worker/client.h"

namespace zps::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kToken[] = "zps-bench-overlap";

struct RigOptions {
  int layers = 8;
  uint64_t layer_elems = 2u << 20;
  uint64_t chunk_elems = 0;  // 0 = layer_elems (one chunk a layer)
  int threads = 1;
  std::string tls = "shm";
  std::string serving_copies = "stored";  // the shard's --serving-copies
  server::UpdateMode update = server::UpdateMode::kSync;
  double max_grad_norm = 0.0;
  std::string data_dir;
  int64_t checkpoint_every = 0;
  std::string checkpoint_mode = "background";
  double checkpoint_pace = 0.0;
};

Result<Layout> MakeLayout(const RigOptions& o) {
  std::vector<ParamSpec> specs;
  for (int i = 0; i < o.layers; ++i) {
    specs.push_back({"layer" + std::to_string(i), {static_cast<int64_t>(o.layer_elems)}});
  }
  return Layout::Build(specs, {.chunk_elems = o.chunk_elems ? o.chunk_elems : o.layer_elems,
                               .align_elems = 64,
                               .num_shards = 1});
}

Result<server::JobSpec> MakeJob(const RigOptions& o) {
  ZPS_ASSIGN_OR_RETURN(Layout layout, MakeLayout(o));
  server::JobSpec job{std::move(layout), {}, {}, {}};
  job.shard.grad_dtype = DType::kF32;
  job.shard.update_mode = o.update;
  job.optimizer.kind = server::OptimizerKind::kAdamW;
  job.optimizer.weight_decay = 0.01f;
  job.commit.max_grad_norm = o.max_grad_norm;
  ZPS_RETURN_IF_ERROR(job.Validate());
  return job;
}

// The pass a sync shard runs after the last push: ReduceStep + ApplyCommit, median of 3.
Result<double> MeasurePass(const RigOptions& o) {
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, MakeJob(o));
  job.shard.update_mode = server::UpdateMode::kSync;
  ZPS_ASSIGN_OR_RETURN(auto pool, ThreadPool::Create({.name = "bench-pass", .threads = o.threads}));
  ZPS_ASSIGN_OR_RETURN(const server::ServingCopies copies,
                       server::ParseServingCopies(o.serving_copies));
  ZPS_ASSIGN_OR_RETURN(auto st, server::ShardState::Create(job.layout, 0, job.shard, job.optimizer,
                                                           pool.get(), std::nullopt, {}, copies));
  auto push_all = [&](int64_t step, float value) -> Status {
    for (uint32_t c : st->chunk_ids()) {
      // One push per parameter piece of the chunk.
      for (uint32_t p = 0; p < job.layout.num_params(); ++p) {
        ZPS_ASSIGN_OR_RETURN(auto pieces, job.layout.Pieces(p));
        for (const Piece& piece : pieces) {
          if (piece.chunk != c) continue;
          ZPS_ASSIGN_OR_RETURN(
              auto t, st->BeginPush({step, c, piece.chunk_offset, piece.length, 0, DType::kF32}));
          auto dst = t.destination();
          std::fill_n(reinterpret_cast<float*>(dst.data()), piece.length, value);
          ZPS_RETURN_IF_ERROR(st->FinishPush(std::move(t), Status::Ok()));
        }
      }
    }
    return Status::Ok();
  };
  ZPS_RETURN_IF_ERROR(push_all(server::kInitStep, 0.5f));
  std::vector<double> t;
  for (int64_t step = 0; step < 4; ++step) {
    ZPS_RETURN_IF_ERROR(push_all(step, 1e-3f));
    const auto t0 = Clock::now();
    ZPS_RETURN_IF_ERROR(st->ReduceStep(step).status());
    ZPS_RETURN_IF_ERROR(st->ApplyCommit({step, false, 1.0f, step + 1}));
    if (step > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Rig {
  std::unique_ptr<server::ShardServer> server;
  std::unique_ptr<worker::Client> client;  // destroyed first
  ~Rig() {
    client.reset();
    if (server) server->Stop();
  }
};

Result<std::unique_ptr<Rig>> StartRig(const RigOptions& o) {
  auto rig = std::make_unique<Rig>();
  server::ShardServerOptions so;
  so.port = 0;
  so.bind_address = "127.0.0.1";
  so.token = kToken;
  so.ucx_tls = o.tls;
  so.serving_copies = o.serving_copies;
  so.metrics_port = 0;
  so.optimizer_threads = o.threads;
  so.data_dir = o.data_dir;
  so.checkpoint_every = o.checkpoint_every;
  so.checkpoint_mode = o.checkpoint_mode;
  so.checkpoint_pace = o.checkpoint_pace;
  ZPS_ASSIGN_OR_RETURN(rig->server, server::ShardServer::Create(so));
  ZPS_RETURN_IF_ERROR(rig->server->Start());
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, MakeJob(o));
  worker::WorkerOptions wo;
  wo.endpoint = "127.0.0.1:" + std::to_string(rig->server->port());
  wo.token = kToken;
  wo.ucx_tls = o.tls;
  // Room for every layer's gradient buffer (RunSteps) in the push region.
  wo.rma_push_bytes =
      std::max(wo.rma_push_bytes,
               static_cast<size_t>(o.layers * o.layer_elems * sizeof(float)) + (size_t{64} << 20));
  ZPS_ASSIGN_OR_RETURN(rig->client, worker::Client::Connect(wo, job.Serialize(), job.Hash()));
  std::vector<float> init(o.layer_elems, 0.5f);
  for (int i = 0; i < o.layers; ++i) ZPS_RETURN_IF_ERROR(rig->client->PushInitial(i, init));
  ZPS_RETURN_IF_ERROR(rig->client->FlushPushes());
  return rig;
}

// Fetches every layer at `version`; returns the seconds it took.
Result<double> FetchAll(worker::Client& c, const RigOptions& o, int64_t version) {
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<const worker::ParamBuffer>> held;
  std::vector<worker::FetchOp> ops;
  for (int l = 0; l < o.layers; ++l) ops.push_back(c.FetchAsync(l, version));
  for (auto& op : ops) {
    ZPS_ASSIGN_OR_RETURN(auto buf, op.Wait(c.op_timeout()));
    held.push_back(std::move(buf));
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct StepTimes {
  std::vector<double> step;   // last fetch to last fetch, steps[0] excluded
  std::vector<double> fetch;  // a second fetch of the published version: the transfer alone
  // Where a step's time went, on the worker's thread (steps[0] excluded): the backward loop
  // (sleeps + PushGradShared calls), the wait for the last push's
  // acknowledgement, and the wait for the new version (the shard's work after the last push,
  // then the fetch).
  std::vector<double> backward, flush, await_version;
};

// Runs `steps` steps.
Result<StepTimes> RunSteps(worker::Client& c, const RigOptions& o, int64_t steps,
                           double compute_s) {
  // The gradients are where a GPU's copy engine would put them: in buffers of the Client's push
  // region (AllocatePushBuffer), pushed from there without a copy (PushGradShared), so the
  // worker's thread spends the step asleep ("computing"), as a GPU worker's CPU does; they do
  // not change between steps, and each step's pushes are flushed before the next writes none.
  std::vector<std::shared_ptr<std::byte[]>> grads;
  for (int l = 0; l < o.layers; ++l) {
    grads.push_back(c.AllocatePushBuffer(o.layer_elems * sizeof(float)));
    std::fill_n(reinterpret_cast<float*>(grads.back().get()), o.layer_elems, 1e-3f);
  }
  const auto per_layer = std::chrono::duration<double>(compute_s / o.layers);
  StepTimes out;
  Clock::time_point last{};
  Clock::time_point flushed{};
  auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  for (int64_t step = 0; step < steps; ++step) {
    ZPS_RETURN_IF_ERROR(FetchAll(c, o, step).status());
    const auto fetched = Clock::now();
    if (step > 0) {
      out.step.push_back(secs(last, fetched));
      out.await_version.push_back(secs(flushed, fetched));
    }
    ZPS_ASSIGN_OR_RETURN(double again, FetchAll(c, o, step));
    if (step > 0) out.fetch.push_back(again);
    last = Clock::now();  // the second fetch is not part of the step
    for (int l = o.layers - 1; l >= 0; --l) {
      std::this_thread::sleep_for(per_layer);
      ZPS_RETURN_IF_ERROR(c.PushGradShared(
          l, step, std::span<const std::byte>(grads[l].get(), o.layer_elems * sizeof(float)),
          grads[l]));
    }
    const auto pushed = Clock::now();
    ZPS_RETURN_IF_ERROR(c.FlushPushes());
    flushed = Clock::now();
    if (step + 1 < steps) {
      out.backward.push_back(secs(last, pushed));
      out.flush.push_back(secs(pushed, flushed));
    }
  }
  return out;
}

double Mean(const std::vector<double>& v, size_t from = 0, size_t to = SIZE_MAX) {
  to = std::min(to, v.size());
  if (from >= to) return 0.0;
  return std::accumulate(v.begin() + from, v.begin() + to, 0.0) / (to - from);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- overlap -----------------------------------------------------------------------------

// The speculative update runs out of place (it reads the live master, m and v and writes a
// spare), the synchronous one in place. Measured in the same run over every layer (the pass's
// working set), with the pass's thread count: alternating passes, the median of 5 of each (after
// a warm-up), divided by the layer count. On a machine where writing to other lines costs more
// than rewriting the ones just read, speculation hides the pass only where the backward compute
// is at least this much longer than the in-place pass.
struct PlaceTimes {
  double in_place = 0.0, out_of_place = 0.0;  // seconds per layer
};

Result<PlaceTimes> MeasurePlaces(const RigOptions& o) {
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, MakeJob(o));
  ZPS_ASSIGN_OR_RETURN(auto pool,
                       ThreadPool::Create({.name = "bench-place", .threads = o.threads}));
  ZPS_ASSIGN_OR_RETURN(auto opt, server::Optimizer::Create(job.optimizer, pool.get()));
  ZPS_ASSIGN_OR_RETURN(const server::ServingCopies copies,
                       server::ParseServingCopies(o.serving_copies));
  const uint64_t n = o.layer_elems;
  // Per layer: live master, m, v (0-2), a spare set (3-5), the gradient (6) and the 16-bit
  // copy (`out`, not written when copies are made on fetch): the pass's whole working set, as the
  // shard has it (beyond the last-level cache at the bench's sizes, as a real shard's state is).
  struct Layer {
    std::vector<AlignedBuffer<float>> f;
    AlignedBuffer<uint16_t> out;
  };
  std::vector<Layer> layers(static_cast<size_t>(o.layers));
  for (Layer& l : layers) {
    for (int k = 0; k < 7; ++k) {
      ZPS_ASSIGN_OR_RETURN(auto b, AlignedBuffer<float>::Allocate(n));
      std::fill_n(b.data(), n, k == 6 ? 1e-3f : 0.5f);
      l.f.push_back(std::move(b));
    }
    ZPS_ASSIGN_OR_RETURN(l.out, AlignedBuffer<uint16_t>::Allocate(n));
  }
  // One pass over every layer, in place or ping-pong (live -> spare, then swapped, as a
  // published speculation leaves them).
  auto pass = [&](bool place_out, int64_t step) -> Status {
    for (Layer& l : layers) {
      server::UpdateParams up;
      up.step = step;
      if (copies == server::ServingCopies::kStored) up.out16 = l.out.span();  // else none
      auto bytes = [&](int k) { return std::as_writable_bytes(l.f[k].span()); };
      server::ChunkState st{l.f[0].span(), bytes(1), bytes(2)};
      if (place_out) {
        st = {l.f[3].span(), bytes(4), bytes(5)};
        up.source = server::ConstChunkState{l.f[0].span(), bytes(1), bytes(2)};
      }
      ZPS_RETURN_IF_ERROR(opt->Update(st, {l.f[6].data(), DType::kF32, n}, up));
      if (place_out) {
        for (int k = 0; k < 3; ++k) std::swap(l.f[k], l.f[k + 3]);
      }
    }
    return Status::Ok();
  };
  std::vector<double> t[2];
  for (int r = 0; r < 6; ++r) {
    for (int place_out = 0; place_out < 2; ++place_out) {  // alternating: the same load on both
      const auto t0 = Clock::now();
      ZPS_RETURN_IF_ERROR(pass(place_out != 0, r + 1));
      if (r > 0) t[place_out].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  PlaceTimes pt;
  pt.in_place = Median(t[0]) / o.layers;
  pt.out_of_place = Median(t[1]) / o.layers;
  return pt;
}

struct OverlapOptions {
  RigOptions rig;
  double compute_ms = -1.0;  // Default: -1 = the measured pass.
  int64_t steps = 12;        // Default: 12 (the first is not timed).
  std::string modes = "sync,speculative,speculative-clip";
};

int RunOverlap(int argc, char** argv) {
  OverlapOptions o;
  Flags f("zps-bench overlap",
          "Step time of sync vs speculative updates beside max(compute, pass) and compute + pass.");
  f.Add("layers", "layers (one parameter each)", &o.rig.layers, 1, 4096);
  f.AddBytes("layer-elems", "elements per layer", &o.rig.layer_elems);
  f.AddBytes("chunk-elems", "elements per chunk (0 = one chunk a layer)", &o.rig.chunk_elems);
  f.Add("threads", "the shard's optimizer threads", &o.rig.threads, 1, 256);
  f.Add("tls", "UCX transports (shm, tcp)", &o.rig.tls);
  f.Add("compute-ms", "emulated backward compute per step, ms (-1 = the measured pass)",
        &o.compute_ms);
  f.Add("steps", "steps per mode (the first is not timed)", &o.steps, 3, 100000);
  f.Add("modes", "comma-separated: sync, speculative, speculative-clip", &o.modes);
  f.Add("serving-copies",
        "the shard's --serving-copies: stored, or on-fetch (each fetch converts the master)",
        &o.rig.serving_copies);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) return Fail("overlap", parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  if (auto copies = server::ParseServingCopies(o.rig.serving_copies); !copies.ok()) {
    return Fail("overlap", copies.status());
  }
  log::SetLevel(log::Level::kWarning);
  auto pass = MeasurePass(o.rig);
  if (!pass.ok()) return Fail("overlap", pass.status());
  const double compute = o.compute_ms >= 0 ? o.compute_ms / 1000.0 : *pass;
  const double mx = std::max(compute, *pass), sum = compute + *pass;
  std::printf(
      "overlap: %d layers x %llu elements (AdamW, %.0f MiB of state), %d optimizer "
      "thread(s), ucx %s, serving copies %s\n",
      o.rig.layers, static_cast<unsigned long long>(o.rig.layer_elems),
      o.rig.layers * o.rig.layer_elems * 12.0 / (1 << 20), o.rig.threads, o.rig.tls.c_str(),
      o.rig.serving_copies.c_str());
  std::printf(
      "references: compute %.3f s, pass %.3f s, max(compute, pass) %.3f s, "
      "compute + pass %.3f s\n",
      compute, *pass, mx, sum);
  auto places = MeasurePlaces(o.rig);
  if (!places.ok()) return Fail("overlap", places.status());
  const double oop = places->out_of_place / places->in_place;
  std::printf(
      "one layer's update: in place (sync) %.4f s, out of place (speculative) %.4f s "
      "= %.2f x: the speculative pass is about %.3f s\n",
      places->in_place, places->out_of_place, oop, *pass * oop);
  for (const std::string& mode : SplitList(o.modes)) {
    RigOptions r = o.rig;
    if (mode == "sync") {
      r.update = server::UpdateMode::kSync;
    } else if (mode == "speculative" || mode == "speculative-clip") {
      r.update = server::UpdateMode::kSpeculative;
      if (mode == "speculative-clip") r.max_grad_norm = 1e-9;  // clips every step
    } else {
      return Fail("overlap", InvalidArgument("unknown mode '" + mode + "'"));
    }
    auto rig = StartRig(r);
    if (!rig.ok()) return Fail("overlap", rig.status());
    auto times = RunSteps(*(*rig)->client, r, o.steps, compute);
    if (!times.ok()) return Fail("overlap", times.status());
    const double med = Median(times->step), fetch = Median(times->fetch);
    std::printf(
        "%-17s step %.3f s (median of %zu; mean %.3f)  = %.2f x max(compute, pass), "
        "%.2f x (compute + pass); fetch of a published version %.3f s: step - fetch = "
        "%.2f x max(compute, pass)\n",
        mode.c_str(), med, times->step.size(), Mean(times->step), med / mx, med / sum, fetch,
        (med - fetch) / mx);
    std::printf(
        "%-17s   of which (medians): backward loop %.3f s (compute %.3f s + sending), last push "
        "acknowledged %.3f s later, new version fetched %.3f s "
        "after that\n",
        "", Median(times->backward), compute, Median(times->flush), Median(times->await_version));
    if (mode == "speculative") {
      // What no schedule of this rig can beat with one speculation thread: it updates the L
      // chunks one after another (the out-of-place pass), from the first gradient on (compute
      // / L into the step), and the last chunk no earlier than the last push (compute); then
      // the fetch of the new version, which this rig's forward has no compute to hide. Commit
      // round trips and sending are left out, so the floor is low.
      const double spec_pass = *pass * oop, layers = o.rig.layers;
      const double floor =
          std::max(compute / layers + spec_pass, compute + spec_pass / layers) + fetch;
      std::printf(
          "%-17s   floor of this rig: %.3f s = %.2f x max(compute, pass) (max(compute / "
          "layers + speculative pass, compute + speculative pass / layers) + fetch); "
          "the step is %.2f x the floor\n",
          "", floor, floor / mx, med / floor);
    }
    std::fflush(stdout);
  }
  return 0;
}

// ---- checkpoint-stall --------------------------------------------------------------------

struct StallOptions {
  RigOptions rig;
  uint64_t state_bytes = 1ull << 30;  // Default: 1 GiB of master + m + v.
  std::string dir;                    // Default: none (required); checkpoints go below it.
  int64_t every = 16;                 // Default: a checkpoint every 16 steps.
  int64_t steps = 34;                 // Default: 34 (checkpoints at 16 and 32).
  double compute_ms = -1.0;           // Default: -1 = the measured pass.
  double pace = 0.75;                 // Default: 0.75 (the server's default is 0: unpaced).
  std::string update = "sync";        // Default: sync (--update of the job).
};

int RunStall(int argc, char** argv) {
  StallOptions o;
  o.rig.layers = 16;
  Flags f("zps-bench checkpoint-stall",
          "Step time while checkpoints are written: background vs sync vs none, same run.");
  f.AddBytes("state-bytes", "fp32 master + m + v of the shard", &o.state_bytes);
  f.Add("dir", "directory for the shards' --data-dir (required)", &o.dir);
  f.Add("every", "checkpoint every N steps", &o.every, 1, 1000000);
  f.Add("steps", "steps per mode (the first is not timed)", &o.steps, 3, 100000);
  f.Add("layers", "layers (one parameter each)", &o.rig.layers, 1, 4096);
  f.Add("threads", "the shard's optimizer threads", &o.rig.threads, 1, 256);
  f.Add("tls", "UCX transports (shm, tcp)", &o.rig.tls);
  f.Add("compute-ms", "emulated backward compute per step, ms (-1 = the measured pass)",
        &o.compute_ms);
  f.Add("pace", "--checkpoint-pace of the paced background mode", &o.pace);
  f.Add("update", "the job's update mode: sync or speculative", &o.update);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) return Fail("checkpoint-stall", parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  if (o.dir.empty()) return Fail("checkpoint-stall", InvalidArgument("--dir is required"));
  auto update = server::ParseUpdateMode(o.update);
  if (!update.ok()) return Fail("checkpoint-stall", update.status());
  o.rig.update = *update;
  log::SetLevel(std::getenv("ZPS_BENCH_DEBUG") ? log::Level::kDebug : log::Level::kWarning);
  o.rig.layer_elems = std::max<uint64_t>(64, o.state_bytes / 12 / o.rig.layers / 64 * 64);
  o.rig.chunk_elems = 4u << 20;
  auto pass = MeasurePass(o.rig);
  if (!pass.ok()) return Fail("checkpoint-stall", pass.status());
  const double compute = o.compute_ms >= 0 ? o.compute_ms / 1000.0 : *pass;
  std::printf(
      "checkpoint-stall: %d layers x %llu elements (%.2f GiB of state), checkpoint "
      "every %lld steps, compute %.3f s, pass %.3f s, ucx %s, update %s\n",
      o.rig.layers, static_cast<unsigned long long>(o.rig.layer_elems),
      o.rig.layers * o.rig.layer_elems * 12.0 / (1 << 30), static_cast<long long>(o.every), compute,
      *pass, o.rig.tls.c_str(), o.update.c_str());
  double base = 0.0;
  // background-0: the background write at --checkpoint-pace 0 (as fast as it goes); background:
  // paced (--pace).
  for (const std::string mode : {"none", "sync", "background-0", "background"}) {
    RigOptions r = o.rig;
    const std::string dir = o.dir + "/zps-stall-" + std::to_string(::getpid()) + "-" + mode;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (mode != "none") {
      r.data_dir = dir;
      r.checkpoint_every = o.every;
      r.checkpoint_mode = mode == "sync" ? "sync" : "background";
      r.checkpoint_pace = mode == "background" ? o.pace : 0.0;
    }
    std::vector<double> times;
    {
      auto rig = StartRig(r);
      if (!rig.ok()) return Fail("checkpoint-stall", rig.status());
      auto t = RunSteps(*(*rig)->client, r, o.steps, compute);
      if (!t.ok()) return Fail("checkpoint-stall", t.status());
      times = std::move(t->step);
    }
    std::filesystem::remove_all(dir, ec);
    // times[i] is step i: from its backward to the fetch of version i + 1. The checkpoint of
    // step k*every is ordered at the commit of step k*every - 1, which publishes version
    // k*every; the shard then writes it (sync) or snapshots it (background, or waits for the
    // previous write first) before it takes step k*every's gradients: step k*every is where a
    // synchronous checkpoint stalls; the later steps are the ones a background write runs
    // beside.
    std::vector<double> at, beside;
    for (size_t i = 0; i < times.size(); ++i) {
      const int64_t step = static_cast<int64_t>(i);
      if (step < o.every) continue;
      (step % o.every == 0 ? at : beside).push_back(times[i]);
    }
    const double all = Mean(times);
    if (mode == "none") base = all;
    auto x = [&](double v) { return base > 0 ? v / base : 1.0; };
    std::string line;
    for (double t : times) line += " " + std::to_string(t).substr(0, 5);
    std::printf(
        "%-12s mean step %.3f s (%.2f x none); at the checkpoint steps %.3f s (%.2f x); "
        "the steps between %.3f s (%.2f x); steps:%s\n",
        mode.c_str(), all, x(all), Mean(at), x(Mean(at)), Mean(beside), x(Mean(beside)),
        line.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("overlap", "step time: sync vs speculative updates vs max/sum references",
                     RunOverlap);
ZPS_BENCH_SUBCOMMAND("checkpoint-stall",
                     "step time while checkpoints are written (background vs sync vs none)",
                     RunStall);

}  // namespace zps::bench
