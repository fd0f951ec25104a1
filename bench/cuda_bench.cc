// zps-bench cuda: the CUDA backend on one GPU, each figure beside its ceiling in the same run.
// scripts/gpu-check.sh runs it on a GPU machine; without a device it prints "no CUDA device"
// and exits 0 with nothing measured.
//
//   zps-bench cuda --json
//   zps-bench cuda --size 64MiB --params 8 --tls tcp
//
// Method. One zps-server shard (the coordinator) in this process on 127.0.0.1 and a worker
// Client whose fetch buffers are the backend's pinned staging slots (WorkerOptions::device =
// CudaBackend::staging(), registered with the Client's UCX context). Parameters of `size`
// bytes of bf16 (size/2 elements), one chunk each.
//   h2d_ceiling: cudaMemcpyAsync of `size` bytes from a pinned slot to device memory on the
//                backend's copy stream (CopyToDevice, max_inflight in flight), `params` copies
//                per repetition: what a fetch into the device can reach at most.
//   fetch_h2d:   every parameter fetched from the shard into a slot (2 in flight) and copied to
//                its device buffer as soon as it arrived, until the last copy completed.
//   fetch_host:  the same fetches without the copies (the transport alone), for reference.
//   d2h_ceiling: cudaMemcpyAsync device -> pinned slot (CopyToHost), the push's first half.
//   push_d2h:    every gradient (fp32, `size` bytes) read from device memory into a slot
//                (CopyToHost) and pushed (PushGrad), until every push is acknowledged.
//   push_host:   the same pushes from host memory, for reference.
// Each op runs `reps` times after a warm-up; the JSON line gives the median and the best GB/s
// (1e9 bytes per second).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/logging.h"
#include "zps/server/job.h"
#include "zps/server/shard_server.h"
#include "zps/worker/client.h"
#include "zps/worker/cuda_backend.h"

namespace zps::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kToken[] = "zps-bench-cuda";

struct Options {
  int device = 0;               // Default: 0.
  uint64_t size = 64ull << 20;  // Default: 64 MiB per parameter (and gradient).
  int params = 8;               // Default: 8.
  int reps = 3;                 // Default: 3 (after one warm-up).
  std::string tls = "tcp";      // Default: tcp.
  bool json = false;            // Default: false (a table).
};

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void Print(const Options& o, const char* op, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const double median = v[v.size() / 2], best = v.back();
  if (o.json) {
    std::printf(
        "{\"bench\":\"cuda\",\"op\":\"%s\",\"tls\":\"%s\",\"size_bytes\":%llu,"
        "\"params\":%d,\"gb_per_s\":%.3f,\"best_gb_per_s\":%.3f,\"reps\":%zu}\n",
        op, o.tls.c_str(), static_cast<unsigned long long>(o.size), o.params, median, best,
        v.size());
  } else {
    std::printf("%-12s %-4s %10llu B x %d  median %7.3f GB/s  best %7.3f GB/s\n", op, o.tls.c_str(),
                static_cast<unsigned long long>(o.size), o.params, median, best);
  }
  std::fflush(stdout);
}

template <typename Fn>
Status Measure(const Options& o, const char* op, Fn&& rep) {
  ZPS_RETURN_IF_ERROR(rep().status());  // warm-up
  std::vector<double> v;
  for (int r = 0; r < o.reps; ++r) {
    ZPS_ASSIGN_OR_RETURN(double g, rep());
    v.push_back(g);
  }
  Print(o, op, v);
  return Status::Ok();
}

Status RunAll(const Options& o) {
  const uint64_t size = o.size;
  ZPS_ASSIGN_OR_RETURN(
      auto be, worker::CudaBackend::Create(
                   {.device = o.device,
                    .slot_bytes = 1 << 20,
                    .slots = static_cast<uint32_t>(std::max<uint64_t>(64, (size * 16) >> 20)),
                    .max_inflight = 4}));
  std::vector<worker::DeviceBuffer> dev;
  for (int i = 0; i < o.params; ++i) {
    ZPS_ASSIGN_OR_RETURN(auto d, be->AllocateDeviceMemory(size * 2));
    dev.push_back(std::move(d));
  }
  // The ceilings: plain async copies between a pinned slot and the device.
  auto h2d = [&]() -> Result<double> {
    ZPS_ASSIGN_OR_RETURN(auto slot, be->staging()->Allocate(size));
    auto keep = std::make_shared<worker::DeviceBuffer>(std::move(slot));
    const auto t0 = Clock::now();
    for (int i = 0; i < o.params; ++i) {
      ZPS_RETURN_IF_ERROR(be->CopyToDevice(dev[i].data(), {keep->data(), size}, keep, 0));
    }
    ZPS_RETURN_IF_ERROR(be->Synchronize());
    return size * o.params / Since(t0) / 1e9;
  };
  ZPS_RETURN_IF_ERROR(Measure(o, "h2d_ceiling", h2d));
  auto d2h = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    for (int i = 0; i < o.params; ++i) {
      ZPS_RETURN_IF_ERROR(be->CopyToHost(dev[i].data(), size, 0).status());
    }
    return size * o.params / Since(t0) / 1e9;
  };
  ZPS_RETURN_IF_ERROR(Measure(o, "d2h_ceiling", d2h));

  // The shard, in this process, and a Client fetching into the staging slots.
  server::ShardServerOptions so;
  so.port = 0;
  so.bind_address = "127.0.0.1";
  so.token = kToken;
  so.ucx_tls = o.tls;
  so.metrics_port = 0;
  so.optimizer_threads = 1;
  ZPS_ASSIGN_OR_RETURN(auto server, server::ShardServer::Create(so));
  ZPS_RETURN_IF_ERROR(server->Start());
  const uint64_t elems = size / 2;
  std::vector<ParamSpec> specs;
  for (int i = 0; i < o.params; ++i) {
    specs.push_back({"p" + std::to_string(i), {static_cast<int64_t>(elems)}});
  }
  ZPS_ASSIGN_OR_RETURN(
      Layout layout,
      Layout::Build(specs, {.chunk_elems = elems, .align_elems = 64, .num_shards = 1}));
  server::JobSpec job{std::move(layout), {}, {}, {}};
  job.optimizer.kind = server::OptimizerKind::kSgd;
  worker::WorkerOptions wo;
  wo.endpoint = "127.0.0.1:" + std::to_string(server->port());
  wo.token = kToken;
  wo.ucx_tls = o.tls;
  wo.device = be->staging();
  {
    ZPS_ASSIGN_OR_RETURN(auto client, worker::Client::Connect(wo, job.Serialize(), job.Hash()));
    std::vector<float> init(elems, 0.5f);
    for (int i = 0; i < o.params; ++i) ZPS_RETURN_IF_ERROR(client->PushInitial(i, init));
    ZPS_RETURN_IF_ERROR(client->FlushPushes());
    int64_t step = 0;
    auto fetch = [&](bool to_device) -> Result<double> {
      std::deque<std::pair<int, worker::FetchOp>> inflight;
      const auto t0 = Clock::now();
      int next = 0;
      while (next < o.params || !inflight.empty()) {
        while (next < o.params && inflight.size() < 2) {
          inflight.emplace_back(next, client->FetchAsync(next, step));
          ++next;
        }
        auto [i, op] = std::move(inflight.front());
        inflight.pop_front();
        ZPS_ASSIGN_OR_RETURN(auto buf, op.Wait(client->op_timeout()));
        if (to_device) ZPS_RETURN_IF_ERROR(be->CopyToDevice(dev[i].data(), buf->bytes(), buf, 0));
      }
      ZPS_RETURN_IF_ERROR(be->Synchronize());
      return size * o.params / Since(t0) / 1e9;
    };
    auto fetch_host = [&] { return fetch(false); };
    auto fetch_h2d = [&] { return fetch(true); };
    ZPS_RETURN_IF_ERROR(Measure(o, "fetch_host", fetch_host));
    ZPS_RETURN_IF_ERROR(Measure(o, "fetch_h2d", fetch_h2d));
    // Pushes: fp32 gradients of `elems` elements (size * 2 bytes each); one step per rep.
    const uint64_t grad_bytes = elems * sizeof(float);
    std::vector<float> host_grad(elems, 1e-3f);
    auto push = [&](bool from_device) -> Result<double> {
      ZPS_RETURN_IF_ERROR(client->Fetch(0, step).status());  // the previous update is done
      const auto t0 = Clock::now();
      for (int i = 0; i < o.params; ++i) {
        ZPS_RETURN_IF_ERROR(client->AwaitPushesBelow(2));
        if (from_device) {
          ZPS_ASSIGN_OR_RETURN(auto h, be->CopyToHost(dev[i].data(), grad_bytes, 0));
          ZPS_RETURN_IF_ERROR(
              client->PushGrad(i, step, {reinterpret_cast<const float*>(h.data()), elems}));
        } else {
          ZPS_RETURN_IF_ERROR(client->PushGrad(i, step, host_grad));
        }
      }
      ZPS_RETURN_IF_ERROR(client->FlushPushes());
      const double secs = Since(t0);
      ZPS_RETURN_IF_ERROR(client->AwaitCommit(step).status());
      ++step;
      return grad_bytes * o.params / secs / 1e9;
    };
    // The device gradients: finite values, written once.
    for (int i = 0; i < o.params; ++i) {
      auto h = std::make_shared<std::vector<float>>(host_grad);
      ZPS_RETURN_IF_ERROR(
          be->CopyToDevice(dev[i].data(), std::as_bytes(std::span<const float>(*h)), h, 0));
    }
    ZPS_RETURN_IF_ERROR(be->Synchronize());
    auto push_host = [&] { return push(false); };
    auto push_d2h = [&] { return push(true); };
    ZPS_RETURN_IF_ERROR(Measure(o, "push_host", push_host));
    ZPS_RETURN_IF_ERROR(Measure(o, "push_d2h", push_d2h));
    const auto st = be->stats();
    std::printf(
        "{\"bench\":\"cuda\",\"stats\":{\"overflow_allocs\":%llu,\"inflight_waits\":%llu}}\n",
        static_cast<unsigned long long>(st.overflow_allocs),
        static_cast<unsigned long long>(st.inflight_waits));
  }
  server->Stop();
  return Status::Ok();
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench cuda",
          "The CUDA backend on one GPU: fetch into the device and push from it through a real "
          "zps-server on loopback, beside cudaMemcpyAsync from pinned memory (the ceiling).");
  f.Add("device", "CUDA device ordinal", &o.device, 0, 1024);
  f.AddBytes("size", "bytes per parameter fetch (bf16) and per copy", &o.size);
  f.Add("params", "parameters (and gradients) per repetition", &o.params, 1, 1024);
  f.Add("reps", "repetitions after a warm-up", &o.reps, 1, 1000);
  f.Add("tls", "UCX transports: tcp, shm (posix,cma,self), or a UCX_TLS list", &o.tls);
  f.Add("json", "one JSON object per line", &o.json);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench cuda: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  log::SetLevel(log::Level::kWarning);
  if (Status avail = worker::CudaAvailable(o.device); !avail.ok()) {
    std::printf("zps-bench cuda: %s; nothing measured\n", avail.ToString().c_str());
    return 0;
  }
  if (o.size < 4096 || o.size % 64 != 0) {
    std::fprintf(stderr, "zps-bench cuda: --size must be a multiple of 64, at least 4096\n");
    return 2;
  }
  Status st = RunAll(o);
  if (!st.ok()) return Fail("cuda", st);
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("cuda", "the CUDA backend: fetch to / push from a GPU vs pinned memcpy", Run);

}  // namespace zps::bench
