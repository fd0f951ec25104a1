// zps-bench capacity: full training steps, through the protocol, for a model whose fp32 master +
// Adam m + v is several times the shard's memory budget (docs/nvme.md, "Capacity").
//
//   zps-bench capacity --dir /work/tmp-capacity --params 1GB --memory-budget 2GiB --steps 3
//
// Method. An in-process zps-server (one shard, the coordinator) with --memory-budget and
// --spill-dir, and a worker Client on 127.0.0.1 (UCX, --tls). The job: `params` fp32 parameters
// in parameters of `param-elems` elements, AdamW, server-sum, world size 1. Rank 0 registers the
// job and pushes the initial values (these land in the shard's store: RAM up to the budget, the
// rest written to the spill file). Then each step pushes a synthetic fp32 gradient for every
// parameter, waits for the commit, and fetches every parameter at the new version (the bf16
// serving copies): the same calls a training worker makes, minus the model.
//
// Reported per step: push, update (commit decision + the optimizer pass through the spill
// pipeline, until the first fetch of the new version returns), fetch and total seconds; the
// process's block-device read and write rates over the step (/proc/self/io: the spill files are
// O_DIRECT, so this is the spill I/O); RSS and peak RSS (shard and worker share this process).
// The spill files live under --dir and are removed at exit.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench.h"
#include "zps/common/bytes.h"
#include "zps/common/config.h"
#include "zps/common/logging.h"
#include "zps/server/job.h"
#include "zps/server/shard_server.h"
#include "zps/worker/client.h"

namespace zps::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string dir = "/work/tmp-capacity";  // Default: /work/tmp-capacity (created, removed).
  uint64_t params = 1000000000;            // Default: 1B parameters.
  uint64_t param_elems = 16ull << 20;      // Default: 16 Mi elements per parameter.
  uint64_t chunk_elems = 4ull << 20;       // Default: 4 Mi elements per chunk.
  uint64_t memory_budget = 2ull << 30;     // Default: 2 GiB.
  uint64_t serving_budget = 0;             // Default: 0 = every serving copy in RAM.
  int steps = 3;                           // Default: 3.
  std::string tls = "tcp";                 // Default: tcp.
  int optimizer_threads = 2;               // Default: 2.
};

constexpr char kToken[] = "zps-bench-capacity";

struct IoCounters {
  uint64_t read = 0, write = 0;  // bytes the block layer moved for this process
};

IoCounters ReadIo() {
  IoCounters c;
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (in >> key >> v) {
    if (key == "read_bytes:") c.read = v;
    if (key == "write_bytes:") c.write = v;
  }
  return c;
}

// VmRSS and VmHWM in bytes.
std::pair<uint64_t, uint64_t> ReadRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  uint64_t rss = 0, hwm = 0;
  while (std::getline(in, line)) {
    auto kib = [&](const char* key) -> uint64_t {
      return std::stoull(line.substr(std::string(key).size())) * 1024;
    };
    if (line.rfind("VmRSS:", 0) == 0) rss = kib("VmRSS:");
    if (line.rfind("VmHWM:", 0) == 0) hwm = kib("VmHWM:");
  }
  return {rss, hwm};
}

double Secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double GiB(uint64_t b) { return static_cast<double>(b) / (1ull << 30); }

Status RunCapacity(const Options& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.dir + "/spill", ec);
  if (ec) return IoError("cannot create " + o.dir + ": " + ec.message());
  const auto t_start = Clock::now();
  const int nparams = static_cast<int>((o.params + o.param_elems - 1) / o.param_elems);
  const uint64_t total = static_cast<uint64_t>(nparams) * o.param_elems;
  std::printf(
      "capacity: %d parameters x %llu = %.3f B parameters; master+m+v %.2f GiB; budget "
      "%.2f GiB (%.1fx); serving budget %.2f GiB; spill dir %s/spill; UCX %s\n",
      nparams, static_cast<unsigned long long>(o.param_elems), total / 1e9, GiB(total * 12),
      GiB(o.memory_budget), static_cast<double>(total * 12) / static_cast<double>(o.memory_budget),
      GiB(o.serving_budget), o.dir.c_str(), o.tls.c_str());
  std::fflush(stdout);

  server::ShardServerOptions so;
  so.port = 0;
  so.bind_address = "127.0.0.1";
  so.token = kToken;
  so.ucx_tls = o.tls;
  so.metrics_port = 0;
  so.optimizer_threads = o.optimizer_threads;
  so.memory_budget = o.memory_budget;
  so.serving_budget = o.serving_budget;
  so.spill_dir = o.dir + "/spill";  // no --data-dir: no checkpoints (a 12 GB one at shutdown)
  ZPS_ASSIGN_OR_RETURN(auto server, server::ShardServer::Create(so));
  ZPS_RETURN_IF_ERROR(server->Start());

  std::vector<ParamSpec> specs;
  for (int i = 0; i < nparams; ++i) {
    specs.push_back({"p" + std::to_string(i), {static_cast<int64_t>(o.param_elems)}});
  }
  ZPS_ASSIGN_OR_RETURN(
      Layout layout,
      Layout::Build(specs, {.chunk_elems = o.chunk_elems, .align_elems = 64, .num_shards = 1}));
  server::JobSpec job{std::move(layout), {}, {}, {}};
  job.optimizer.kind = server::OptimizerKind::kAdamW;
  worker::WorkerOptions wo;
  wo.endpoint = "127.0.0.1:" + std::to_string(server->port());
  wo.token = kToken;
  wo.ucx_tls = o.tls;
  const auto t_connect = Clock::now();
  ZPS_ASSIGN_OR_RETURN(auto client, worker::Client::Connect(wo, job.Serialize(), job.Hash()));
  const auto t_joined = Clock::now();

  std::vector<float> buf(o.param_elems);
  for (uint64_t i = 0; i < buf.size(); ++i)
    buf[i] = 0.02f * std::sin(0.001f * static_cast<float>(i));
  IoCounters io0 = ReadIo();
  for (int p = 0; p < nparams; ++p) ZPS_RETURN_IF_ERROR(client->PushInitial(p, buf));
  ZPS_RETURN_IF_ERROR(client->FlushPushes());
  ZPS_ASSIGN_OR_RETURN(auto first, client->Fetch(0, 0));
  const std::vector<std::byte> initial(first->bytes().begin(), first->bytes().begin() + 64);
  first.reset();
  const auto t_init = Clock::now();
  IoCounters io1 = ReadIo();
  auto [rss0, hwm0] = ReadRss();
  std::printf(
      "setup: shard start + job + spill files %.1f s; initial values pushed and stored "
      "%.1f s (%.2f GiB written to disk); RSS %.2f GiB (peak %.2f)\n",
      Secs(t_connect, t_joined), Secs(t_joined, t_init), GiB(io1.write - io0.write), GiB(rss0),
      GiB(hwm0));
  std::fflush(stdout);

  std::vector<double> step_secs;
  for (int64_t step = 0; step < o.steps; ++step) {
    const float g = 1e-3f * static_cast<float>(step + 1);
    for (uint64_t i = 0; i < buf.size(); ++i) buf[i] = g * std::cos(0.002f * static_cast<float>(i));
    const IoCounters a = ReadIo();
    const auto t0 = Clock::now();
    for (int p = 0; p < nparams; ++p) ZPS_RETURN_IF_ERROR(client->PushGrad(p, step, buf));
    ZPS_RETURN_IF_ERROR(client->FlushPushes());
    const auto t1 = Clock::now();
    ZPS_ASSIGN_OR_RETURN(msg::CommitInfo ci, client->AwaitCommit(step));
    if (ci.skip) return Internal("step " + std::to_string(step) + " was skipped");
    ZPS_RETURN_IF_ERROR(client->Fetch(0, step + 1).status());
    const auto t2 = Clock::now();
    const IoCounters b = ReadIo();
    for (int p = 1; p < nparams; ++p) ZPS_RETURN_IF_ERROR(client->Fetch(p, step + 1).status());
    const auto t3 = Clock::now();
    auto [rss, hwm] = ReadRss();
    const double upd = Secs(t1, t2);
    step_secs.push_back(Secs(t0, t3));
    std::printf(
        "step %lld: push %.2f s, update %.2f s (spill read %.0f MB/s, write %.0f MB/s "
        "over the update; %.2f + %.2f GiB), fetch %.2f s, step %.2f s "
        "(%.0f Mparam/s); RSS %.2f GiB (peak %.2f)\n",
        static_cast<long long>(step), Secs(t0, t1), upd, (b.read - a.read) / upd / 1e6,
        (b.write - a.write) / upd / 1e6, GiB(b.read - a.read), GiB(b.write - a.write), Secs(t2, t3),
        Secs(t0, t3), total / Secs(t0, t3) / 1e6, GiB(rss), GiB(hwm));
    std::fflush(stdout);
  }
  ZPS_ASSIGN_OR_RETURN(auto last, client->Fetch(0, o.steps));
  if (std::equal(initial.begin(), initial.end(), last->bytes().begin())) {
    return Internal("the parameters did not change over the steps");
  }
  last.reset();
  client.reset();
  server->Stop();
  ZPS_RETURN_IF_ERROR(server->Wait());
  server.reset();
  std::sort(step_secs.begin(), step_secs.end());
  std::printf("capacity: OK; median step %.2f s; %.1f s wall in all\n",
              step_secs[step_secs.size() / 2], Secs(t_start, Clock::now()));
  return Status::Ok();
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench capacity",
          "Full steps (push, commit + spilled optimizer pass, fetch) through a real shard server "
          "whose chunk state is several times its memory budget.");
  f.Add("dir", "working directory (spill files under <dir>/spill; removed at exit)", &o.dir);
  f.AddBytes("params", "parameters in all (1GB = 1e9, 1G = 2^30; default 1e9)", &o.params);
  f.AddBytes("param-elems", "elements per parameter", &o.param_elems);
  f.AddBytes("chunk-elems", "elements per chunk", &o.chunk_elems);
  f.AddBytes("memory-budget", "the shard's --memory-budget", &o.memory_budget);
  f.AddBytes("serving-budget", "the shard's --serving-budget (0 = all serving copies in RAM)",
             &o.serving_budget);
  f.Add("steps", "training steps", &o.steps, 1, 1000);
  f.Add("tls", "UCX transports (tcp, or e.g. posix,cma,self)", &o.tls);
  f.Add("optimizer-threads", "the shard's optimizer threads", &o.optimizer_threads, 1, 256);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench capacity: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  if (o.params == 0 || o.param_elems == 0 || o.chunk_elems == 0) {
    std::fprintf(stderr, "zps-bench capacity: sizes must be > 0\n");
    return 2;
  }
  log::SetLevel(log::Level::kWarning);
  Status st = RunCapacity(o);
  std::error_code ec;
  std::filesystem::remove_all(o.dir, ec);
  if (!st.ok()) {
    std::fprintf(stderr, "zps-bench capacity: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("capacity", "full steps through a shard whose state is 5x+ its budget", Run);

}  // namespace zps::bench
