// zps-bench transport: fetch and push throughput through the REAL shard server and worker
// library (control plane, session tokens, validation, coverage tracking, all of it), on one
// transport, for a range of request sizes. scripts/bench-transport.sh runs it beside
// ucx_perftest on the same transport in the same run.
//
//   zps-bench transport --tls tcp --json
//   zps-bench transport --tls shm --sizes 4MiB,16MiB,64MiB --window 4
//
// Method. For each size S a zps-server shard (one shard, the coordinator) and a worker Client
// are started on 127.0.0.1 with a job whose parameters are each exactly one chunk. The shard
// runs in a second process (this program re-executed with --serve), as in a deployment and as
// ucx_perftest runs its two sides; --in-process keeps it in this process instead.
//   fetch: parameters of S/2 elements (S bytes of bf16); `window` fetches in flight, each a
//          whole parameter = one request of S bytes, round-robin over --params parameters,
//          until bytes-per-rep have arrived. With --serving-copies on-fetch the shard keeps no
//          copies and converts a master per fetch: more parameters than its 4 staging buffers
//          (e.g. --params 8) make every fetch a conversion, fewer let its cache answer.
//   push:  parameters of S/e elements (S bytes of gradient in the job's --grad-dtype, e bytes
//          an element: fp32 by default; PushGrad converts the fp32 input); one step pushes every
//          parameter (`window` unacknowledged at most, as a training loop bounds the copies
//          its pushes hold), timed until every push is acknowledged; the commit and
//          the optimizer update that follow are not timed. "push" uses PushGrad (which
//          copies the gradient before it returns), "push_shared" PushGradShared (no copy) from
//          a buffer made by Client::AllocatePushBuffer.
// Each case runs `reps` times after a warm-up; the JSON line gives the median and the best.
// GB/s = 1e9 bytes per second.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/dtype.h"
#include "zps/common/logging.h"
#include "zps/server/job.h"
#include "zps/server/shard_server.h"
#include "zps/worker/client.h"

namespace zps::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string tls = "tcp";                     // Default: tcp. "shm" = posix,cma,self.
  std::string sizes = "4MiB,16MiB,64MiB";      // Default: 4, 16, 64 MiB per request.
  std::string ops = "fetch,push,push_shared";  // Default: all three.
  uint64_t bytes_per_rep = 512ull << 20;       // Default: 512 MiB moved per repetition.
  int reps = 3;                                // Default: 3 (after one warm-up).
  int window = 2;                              // Default: 2 requests in flight.
  bool json = false;                           // Default: false (a table).
  std::string fetch_mode = "auto";             // Default: auto (rma on shared memory, else am).
  std::string push_mode = "auto";              // Default: auto (rma on shared memory, else am).
  bool direct_fetch = true;                    // Default: true (one-sided fetch of known versions).
  std::string grad_dtype = "fp32";             // Default: fp32 (the job's gradient type).
  int spin_us = -1;                            // Default: -1 = the shard's and worker's defaults.
  int shard_spin_us = -1;                      // Default: -1 = spin_us.
  int worker_spin_us = -1;                     // Default: -1 = spin_us.
  bool in_process = false;                     // Default: false (the shard in a second process).
  std::string serving_copies = "stored";       // Default: stored (the shard's --serving-copies).
  int params = 0;                              // Default: 0 = max(window, 2) (fetch).
  int shard_threads = 1;                       // Default: 1 (the shard's --threads).
  bool serve = false;                          // Internal: run as that second process.
};

constexpr char kToken[] = "zps-bench-transport";

server::ShardServerOptions ShardOptions(const Options& o) {
  server::ShardServerOptions so;
  so.port = 0;
  so.bind_address = "127.0.0.1";
  so.token = kToken;
  so.ucx_tls = o.tls;
  so.metrics_port = 0;
  so.optimizer_threads = o.shard_threads;
  so.serving_copies = o.serving_copies;
  if (o.spin_us >= 0) so.ucx_spin_us = o.spin_us;
  if (o.shard_spin_us >= 0) so.ucx_spin_us = o.shard_spin_us;
  return so;
}

/// The shard as a second process: this program re-executed with --serve. It prints
/// "PORT <n>" once serving and stops when its stdin closes (our end, in the destructor).
class ShardProcess {
 public:
  static Result<std::unique_ptr<ShardProcess>> Spawn(const Options& o) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
    if (pipe2(out, O_CLOEXEC) != 0) {
      int e = errno;
      close(in[0]);
      close(in[1]);
      return ErrnoError("pipe2", e);
    }
    const int shard_spin = o.shard_spin_us >= 0 ? o.shard_spin_us : o.spin_us;
    std::vector<std::string> args = {"zps-bench",
                                     "transport",
                                     "--serve",
                                     "--tls",
                                     o.tls,
                                     "--shard-spin-us",
                                     std::to_string(shard_spin),
                                     "--serving-copies",
                                     o.serving_copies,
                                     "--shard-threads",
                                     std::to_string(o.shard_threads)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) return ErrnoError("fork", errno);
    if (pid == 0) {  // only async-signal-safe calls until exec
      dup2(in[0], 0);
      dup2(out[1], 1);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    std::unique_ptr<ShardProcess> p(new ShardProcess());
    p->pid_ = pid;
    p->stdin_fd_ = in[1];
    FILE* f = fdopen(out[0], "r");
    char line[256];
    while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
      unsigned port = 0;
      if (std::sscanf(line, "PORT %u", &port) == 1) {
        p->port_ = static_cast<uint16_t>(port);
        break;
      }
    }
    if (f != nullptr) std::fclose(f);
    if (p->port_ == 0) return Unavailable("the shard process did not start (see its stderr)");
    return p;
  }
  ~ShardProcess() {
    close(stdin_fd_);
    for (int i = 0; i < 1000 && waitpid(pid_, nullptr, WNOHANG) != pid_; ++i) usleep(10000);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  uint16_t port() const { return port_; }

 private:
  ShardProcess() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  uint16_t port_ = 0;
};

// --serve: one shard (the coordinator) until stdin closes.
int Serve(const Options& o) {
  auto server = server::ShardServer::Create(ShardOptions(o));
  Status st = server.ok() ? (*server)->Start() : server.status();
  if (!st.ok()) {
    std::fprintf(stderr, "zps-bench transport --serve: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("PORT %u\n", static_cast<unsigned>((*server)->port()));
  std::fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  (*server)->Stop();
  return 0;
}

struct Rig {
  std::unique_ptr<server::ShardServer> server;  // --in-process
  std::unique_ptr<ShardProcess> process;        // otherwise
  std::unique_ptr<worker::Client> client;       // destroyed first
};

Result<Rig> StartRig(const Options& o, uint64_t param_elems, int params) {
  Rig rig;
  uint16_t port = 0;
  if (o.in_process) {
    ZPS_ASSIGN_OR_RETURN(rig.server, server::ShardServer::Create(ShardOptions(o)));
    ZPS_RETURN_IF_ERROR(rig.server->Start());
    port = rig.server->port();
  } else {
    ZPS_ASSIGN_OR_RETURN(rig.process, ShardProcess::Spawn(o));
    port = rig.process->port();
  }
  std::vector<ParamSpec> specs;
  for (int i = 0; i < params; ++i) {
    specs.push_back({"p" + std::to_string(i), {static_cast<int64_t>(param_elems)}});
  }
  ZPS_ASSIGN_OR_RETURN(
      Layout layout,
      Layout::Build(specs, {.chunk_elems = param_elems, .align_elems = 64, .num_shards = 1}));
  server::JobSpec job{std::move(layout), {}, {}, {}};
  job.optimizer.kind = server::OptimizerKind::kSgd;  // the cheapest update between push rounds
  ZPS_ASSIGN_OR_RETURN(job.shard.grad_dtype, ParseDType(o.grad_dtype));
  worker::WorkerOptions wo;
  wo.endpoint = "127.0.0.1:" + std::to_string(port);
  wo.token = kToken;
  wo.ucx_tls = o.tls;
  wo.fetch_mode = o.fetch_mode;
  wo.push_mode = o.push_mode;
  wo.direct_fetch = o.direct_fetch;
  if (o.spin_us >= 0) wo.ucx_spin = std::chrono::microseconds(o.spin_us);
  if (o.worker_spin_us >= 0) wo.ucx_spin = std::chrono::microseconds(o.worker_spin_us);
  ZPS_ASSIGN_OR_RETURN(rig.client, worker::Client::Connect(wo, job.Serialize(), job.Hash()));
  std::vector<float> init(param_elems, 0.5f);
  for (int i = 0; i < params; ++i) ZPS_RETURN_IF_ERROR(rig.client->PushInitial(i, init));
  ZPS_RETURN_IF_ERROR(rig.client->FlushPushes());
  return rig;
}

// Fetches whole parameters round-robin with `window` in flight until `bytes` arrived.
Result<double> FetchRep(worker::Client& c, int params, uint64_t bytes, int window) {
  std::deque<worker::FetchOp> inflight;
  uint64_t issued = 0, done = 0;
  const uint64_t per = c.layout().param_numel(0) * 2;
  int next = 0;
  auto t0 = Clock::now();
  while (done < bytes) {
    while (static_cast<int>(inflight.size()) < window && issued < bytes) {
      inflight.push_back(c.FetchAsync(next, 0));
      next = (next + 1) % params;
      issued += per;
    }
    ZPS_RETURN_IF_ERROR(inflight.front().Wait(c.op_timeout()).status());
    inflight.pop_front();
    done += per;
  }
  return done / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
}

// One step of pushes of every parameter; returns GB/s of the pushes (until acknowledged).
// `shared`: PushGradShared (no copy: the bytes go from the caller's buffer), else PushGrad
// (which copies into a staging buffer before it returns).
Result<double> PushRep(worker::Client& c, int params, int64_t step, int window, bool shared) {
  const uint64_t n = c.layout().param_numel(0);
  const DType dt = c.job().grad_dtype;
  const size_t esize = DTypeSize(dt);
  // push_shared sends from a buffer the Client allocated (in its UCX staging region when
  // pushes go by RMA, so the shard reads it with no copy on either side), in the job's type.
  std::shared_ptr<std::byte[]> shared_buf = c.AllocatePushBuffer(shared ? n * esize : 0);
  const std::span<const std::byte> grad_bytes(shared_buf.get(), shared ? n * esize : 0);
  if (shared && dt == DType::kF32) {
    std::span<float> g(reinterpret_cast<float*>(shared_buf.get()), n);
    std::fill(g.begin(), g.end(), 1e-3f);
  } else if (shared) {
    std::span<uint16_t> g(reinterpret_cast<uint16_t*>(shared_buf.get()), n);
    std::fill(g.begin(), g.end(), dt == DType::kF16 ? FloatToHalf(1e-3f) : FloatToBf16(1e-3f));
  }
  std::vector<float> grad(shared ? 0 : n, 1e-3f);
  // Wait until the shard published this step (the previous update is done), untimed.
  ZPS_RETURN_IF_ERROR(c.Fetch(0, step).status());
  auto t0 = Clock::now();
  for (int p = 0; p < params; ++p) {
    ZPS_RETURN_IF_ERROR(c.AwaitPushesBelow(window));  // a sliding window of pushes in flight
    ZPS_RETURN_IF_ERROR(shared ? c.PushGradShared(p, step, grad_bytes, shared_buf)
                               : c.PushGrad(p, step, grad));
  }
  ZPS_RETURN_IF_ERROR(c.FlushPushes());
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ZPS_RETURN_IF_ERROR(c.AwaitCommit(step).status());
  return static_cast<double>(params * n * esize) / secs / 1e9;
}

void Print(const Options& o, const char* op, uint64_t size, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double median = v[v.size() / 2], best = v.back();
  if (o.json) {
    std::printf(
        "{\"bench\":\"transport\",\"op\":\"%s\",\"tls\":\"%s\",\"size_bytes\":%llu,"
        "\"gb_per_s\":%.3f,\"best_gb_per_s\":%.3f,\"reps\":%zu,\"window\":%d,"
        "\"fetch_mode\":\"%s\",\"push_mode\":\"%s\",\"shard\":\"%s\","
        "\"serving_copies\":\"%s\"}\n",
        op, o.tls.c_str(), static_cast<unsigned long long>(size), median, best, v.size(), o.window,
        o.fetch_mode.c_str(), o.push_mode.c_str(), o.in_process ? "in_process" : "process",
        o.serving_copies.c_str());
  } else {
    std::printf("%-6s %-4s %10llu B  median %7.3f GB/s  best %7.3f GB/s\n", op, o.tls.c_str(),
                static_cast<unsigned long long>(size), median, best);
  }
  std::fflush(stdout);
}

Status RunCase(const Options& o, const std::string& op, uint64_t size) {
  if (op == "fetch") {
    const uint64_t elems = size / 2;
    const int params = o.params > 0 ? o.params : std::max(o.window, 2);
    ZPS_ASSIGN_OR_RETURN(Rig rig, StartRig(o, elems, params));
    ZPS_RETURN_IF_ERROR(FetchRep(*rig.client, params, size * params, o.window).status());
    std::vector<double> v;
    for (int r = 0; r < o.reps; ++r) {
      ZPS_ASSIGN_OR_RETURN(double g, FetchRep(*rig.client, params, o.bytes_per_rep, o.window));
      v.push_back(g);
    }
    Print(o, "fetch", size, v);
    return Status::Ok();
  }
  if (op == "push" || op == "push_shared") {
    const bool shared = op == "push_shared";
    ZPS_ASSIGN_OR_RETURN(DType dt, ParseDType(o.grad_dtype));
    const uint64_t elems = size / DTypeSize(dt);
    const int params = static_cast<int>(std::clamp<uint64_t>(o.bytes_per_rep / size, 2, 256));
    ZPS_ASSIGN_OR_RETURN(Rig rig, StartRig(o, elems, params));
    ZPS_RETURN_IF_ERROR(PushRep(*rig.client, params, 0, o.window, shared).status());
    std::vector<double> v;
    for (int r = 0; r < o.reps; ++r) {
      ZPS_ASSIGN_OR_RETURN(double g, PushRep(*rig.client, params, r + 1, o.window, shared));
      v.push_back(g);
    }
    Print(o, op.c_str(), size, v);
    return Status::Ok();
  }
  return InvalidArgument("unknown op '" + op + "' (fetch, push, push_shared)");
}

int Run(int argc, char** argv) {
  Options o;
  Flags f("zps-bench transport",
          "Fetch and push throughput through a real zps-server and worker Client on loopback.");
  f.Add("tls", "UCX transports: tcp, shm (posix,cma,self), or a UCX_TLS list", &o.tls);
  f.Add("sizes", "request sizes, comma-separated (e.g. 4MiB,16MiB,64MiB)", &o.sizes);
  f.Add("ops", "fetch, push (PushGrad: copies first), push_shared (PushGradShared: no copy)",
        &o.ops);
  f.AddBytes("bytes-per-rep", "bytes moved per repetition", &o.bytes_per_rep);
  f.Add("reps", "repetitions after a warm-up", &o.reps, 1, 1000);
  f.Add("window", "requests in flight", &o.window, 1, 64);
  f.Add("json", "one JSON object per line", &o.json);
  f.Add("fetch-mode", "auto (rma on shared memory, else am), am or rma", &o.fetch_mode);
  f.Add("push-mode",
        "auto (rma on shared memory, else am), am or rma (push only; push_shared "
        "is always am)",
        &o.push_mode);
  f.Add("direct-fetch",
        "with RMA fetches, read a known published version without a request (false: ask "
        "every time, the path before protocol 3)",
        &o.direct_fetch);
  f.Add("grad-dtype",
        "the job's gradient type: fp32, fp16 or bf16 (push: PushGrad converts its "
        "fp32 input to it; S bytes a request in that type)",
        &o.grad_dtype);
  f.Add("spin-us", "UCX progress-thread polling in shard and worker, µs (-1: their defaults)",
        &o.spin_us, -1, 1000000);
  f.Add("shard-spin-us", "as spin-us, for the shard only", &o.shard_spin_us, -1, 1000000);
  f.Add("worker-spin-us", "as spin-us, for the worker only", &o.worker_spin_us, -1, 1000000);
  f.Add("in-process", "run the shard in this process (default: a second process)", &o.in_process);
  f.Add("serving-copies",
        "the shard's --serving-copies: stored, or on-fetch (none kept: each fetch converts the "
        "master)",
        &o.serving_copies);
  f.Add("params", "fetch: parameters fetched round-robin (0 = max(window, 2))", &o.params, 0, 4096);
  f.Add("shard-threads",
        "the shard's --threads (its pool: the optimizer, and the conversions of on-fetch copies)",
        &o.shard_threads, 1, 1024);
  f.Add("serve", "internal: run as the shard process (prints PORT, stops at stdin EOF)", &o.serve);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench transport: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  log::SetLevel(log::Level::kWarning);
  if (auto copies = server::ParseServingCopies(o.serving_copies); !copies.ok()) {
    std::fprintf(stderr, "zps-bench transport: %s\n", copies.status().ToString().c_str());
    return 2;
  }
  if (o.serve) return Serve(o);
  for (const std::string& s : SplitList(o.sizes)) {
    auto size = ParseBytes(s);
    if (!size.ok() || *size < 1024 || *size % 64 != 0) {
      std::fprintf(stderr, "zps-bench transport: bad size '%s'\n", s.c_str());
      return 2;
    }
    for (const std::string& op : SplitList(o.ops)) {
      Status st = RunCase(o, op, *size);
      if (!st.ok()) {
        std::fprintf(stderr, "zps-bench transport %s %s: %s\n", op.c_str(), s.c_str(),
                     st.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("transport", "fetch/push through a real shard server and worker (UCX)", Run);

}  // namespace zps::bench
