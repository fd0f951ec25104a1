// zps-bench transport-raw: throughput of the UCX data-plane layer (zps/common/ucx.h) between two
// processes, for the fetch mechanisms a shard can serve (AM rendezvous or RMA get) and for the
// gradient push (AM rendezvous the other way). The figure to compare is ucx_perftest on the
// same transport in the same run: scripts/bench-transport.sh runs both and prints the ratios.
//
//   zps-bench transport-raw --tls tcp --json
//   zps-bench transport-raw --tls shm --sizes 4MiB,16MiB,64MiB --ops am_fetch,get,am_push
//
// Method. The process re-executes itself as the data source ("--role source"): fork + exec, so
// no UCX state crosses a fork. The source registers one region of the largest size and prints
// its worker address, rkey and pid; the fetcher (this process) connects. Each case keeps
// `window` operations in flight, each into its own registered buffer; the next operation is
// issued from the completion callback on the progress thread. A case runs `reps` times after a
// warm-up; the JSON line gives the median and the best.
//   am_fetch: fetcher sends a 16-byte request AM; the source answers from the region with a
//             rendezvous AM (through the reply endpoint, from its handler); the fetcher receives
//             it into its buffer (ucp_am_recv_data_nbx). This is the shard's fetch path.
//   get:      fetcher reads the region with ucp_get_nbx.
//   am_push:  fetcher sends a rendezvous AM from its buffer; the source receives it into the
//             region. This is the gradient push path.
// GB/s are 1e9 bytes per second.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/common/thread_annotations.h"
#include "zps/common/ucx.h"

namespace zps::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint16_t kFetchRequest = 10;  // fetcher → source: {offset, size}
constexpr uint16_t kFetchData = 11;     // source → fetcher: the data (rendezvous)
constexpr uint16_t kPush = 12;          // fetcher → source: data into the region

struct Request {
  uint64_t offset;  // in the source's region
  uint64_t size;
  uint64_t slot;  // the fetcher's buffer, echoed back in the reply header
};

struct Options {
  std::string role = "fetcher";                // Default: fetcher (the source is started by it)
  std::string tls = "tcp";                     // Default: tcp. "shm" = posix,cma,self.
  std::string sizes = "4MiB,16MiB,64MiB";      // Default: 4, 16, 64 MiB.
  std::string ops = "am_fetch,get,am_push";    // Default: all three.
  uint64_t bytes_per_rep = uint64_t{1} << 30;  // Default: 1 GiB moved per repetition.
  int reps = 3;                                // Default: 3 (after one warm-up).
  int window = 2;                              // Default: 2 operations in flight.
  int spin_us = 1000;                          // Default: 1 ms of polling before sleeping.
  bool json = false;                           // Default: false (a table).
  bool register_only = false;  // Default: false: the source region comes from Context::Allocate.
  bool auto_protocol = false;  // Default: false: AM payloads are forced to rendezvous.
  bool reply_ep = false;       // Default: false: the source replies through its own endpoint.
};

std::string Hex(std::span<const std::byte> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
    out.push_back(kDigits[static_cast<unsigned>(b) & 15]);
  }
  return out;
}

std::vector<std::byte> Unhex(std::string_view hex) {
  auto nibble = [](char c) -> unsigned {
    return c >= 'a' ? static_cast<unsigned>(c - 'a' + 10) : static_cast<unsigned>(c - '0');
  };
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std::byte((nibble(hex[2 * i]) << 4) | nibble(hex[2 * i + 1]));
  }
  return out;
}

Result<std::vector<uint64_t>> ParseSizes(const std::string& text) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    ZPS_ASSIGN_OR_RETURN(uint64_t v, ParseBytes(text.substr(start, comma - start)));
    if (v == 0) return InvalidArgument("sizes must be > 0");
    out.push_back(v);
    start = comma + 1;
  }
  return out;
}

/// Page-aligned, first-touched memory for registration.
struct Buffer {
  explicit Buffer(size_t n) : size(n) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, n) != 0) std::abort();
    data.reset(static_cast<std::byte*>(p));
    std::memset(p, 0x5a, n);
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;
  size_t size;
  std::span<std::byte> span() const { return {data.get(), size}; }
};

// ---------------------------------------------------------------------------------------------
// Source role

int RunSource(const Options& o, uint64_t max_size) {
  auto ctx = ucx::Context::Create({.transports = o.tls});
  if (!ctx.ok()) {
    std::fprintf(stderr, "source: %s\n", ctx.status().ToString().c_str());
    return 1;
  }
  auto worker_or = ucx::Worker::Create(
      **ctx, {.thread_name = "src-ucx", .spin = std::chrono::microseconds(o.spin_us)});
  if (!worker_or.ok()) return 1;
  ucx::Worker* worker = worker_or->get();
  // The region peers Get from is allocated by UCX (see Context::Allocate); --register-only
  // registers ordinary memory instead, to show the difference.
  std::unique_ptr<Buffer> region_mem;
  Result<std::unique_ptr<ucx::MemoryRegion>> region = InvalidArgument("unset");
  if (o.register_only) {
    region_mem = std::make_unique<Buffer>(max_size);
    region = (*ctx)->Register(region_mem->span());
  } else {
    region = (*ctx)->Allocate(max_size);
    if (region.ok()) std::memset((*region)->memory().data(), 0x5a, max_size);
  }
  if (!region.ok()) {
    std::fprintf(stderr, "source: %s\n", region.status().ToString().c_str());
    return 1;
  }
  const ucx::MemoryRegion* reg = region->get();

  bool force_rndv = !o.auto_protocol;
  // Replies go through an endpoint the source connects to the fetcher's address (as a shard
  // does with the worker address it got over the control plane); before it exists, or with
  // --reply-ep, through the message's reply endpoint.
  auto back = std::make_shared<ucx::Endpoint>();
  bool use_reply_ep = o.reply_ep;
  Status st = worker->SetAmHandler(
      kFetchRequest, [worker, reg, force_rndv, back, use_reply_ep](ucx::AmMessage& m) {
        Request r{};
        if (m.header().size() != sizeof(r)) return;
        std::memcpy(&r, m.header().data(), sizeof(r));
        if (r.offset > reg->memory().size() || r.size > reg->memory().size() - r.offset) return;
        ucx::SendOptions so;
        so.force_rendezvous = force_rndv;
        so.region = reg;
        // Inline on the progress thread, so the reply endpoint is valid.
        const ucx::Endpoint& to = use_reply_ep || !back->valid() ? m.reply_endpoint() : *back;
        worker->SendAm(to, kFetchData, m.header(), reg->memory().subspan(r.offset, r.size), nullptr,
                       nullptr, so);
      });
  if (st.ok()) {
    st = worker->SetAmHandler(kPush, [reg](ucx::AmMessage& m) {
      if (m.data_length() > reg->memory().size()) return;
      m.Receive(reg->memory(), nullptr).IgnoreError();
    });
  }
  if (st.ok()) st = worker->Start();
  if (!st.ok()) {
    std::fprintf(stderr, "source: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("ADDR %s\nRKEY %s\nRADDR %llu\nPID %d\nREADY\n", Hex(worker->Address()).c_str(),
              Hex(reg->rkey()).c_str(), static_cast<unsigned long long>(reg->remote_address()),
              static_cast<int>(getpid()));
  std::fflush(stdout);
  std::string line;
  char c;
  while (read(0, &c, 1) > 0) {
    if (c != '\n') {
      line.push_back(c);
      continue;
    }
    if (line.rfind("ADDR ", 0) == 0) {
      auto ep = worker->Connect(Unhex(line.substr(5)), {}, getppid());
      if (!ep.ok()) {
        std::fprintf(stderr, "source: %s\n", ep.status().ToString().c_str());
        return 1;
      }
      // Written on the progress thread, where the handler reads it.
      worker->Post([back, e = *ep] { *back = e; });
      std::printf("CONNECTED\n");
      std::fflush(stdout);
    }
    line.clear();
  }
  worker->Stop();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Fetcher role

struct Source {
  pid_t pid = -1;
  int stdin_fd = -1;
  FILE* out = nullptr;
  std::vector<std::byte> address, rkey;
  uint64_t remote_address = 0;
  ~Source() {
    if (stdin_fd >= 0) close(stdin_fd);
    if (out != nullptr) std::fclose(out);
    if (pid > 0) {
      for (int i = 0; i < 300 && waitpid(pid, nullptr, WNOHANG) != pid; ++i) usleep(10000);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

std::unique_ptr<Source> SpawnSource(const Options& o, uint64_t max_size) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return nullptr;
  std::string size_arg = std::to_string(max_size);
  std::string spin_arg = std::to_string(o.spin_us);
  pid_t pid = fork();
  if (pid < 0) return nullptr;
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    const char* argv[] = {"zps-bench",
                          "transport-raw",
                          "--role",
                          "source",
                          "--tls",
                          o.tls.c_str(),
                          "--sizes",
                          size_arg.c_str(),
                          "--spin-us",
                          spin_arg.c_str(),
                          o.register_only ? "--register-only=true" : "--register-only=false",
                          o.auto_protocol ? "--auto-protocol=true" : "--auto-protocol=false",
                          o.reply_ep ? "--reply-ep=true" : "--reply-ep=false",
                          nullptr};
    execv("/proc/self/exe", const_cast<char* const*>(argv));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  auto src = std::make_unique<Source>();
  src->pid = pid;
  src->stdin_fd = in[1];
  FILE* f = fdopen(out[0], "r");
  char line[8192];
  while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
    std::string s(line);
    while (!s.empty() && (s.back() == '\n')) s.pop_back();
    if (s.rfind("ADDR ", 0) == 0) src->address = Unhex(s.substr(5));
    if (s.rfind("RKEY ", 0) == 0) src->rkey = Unhex(s.substr(5));
    if (s.rfind("RADDR ", 0) == 0) src->remote_address = std::stoull(s.substr(6));
    if (s == "READY") break;
  }
  src->out = f;
  if (src->address.empty()) return nullptr;
  return src;
}

/// Runs one case: `count` operations of `size` bytes, `window` in flight. Returns seconds.
class Runner {
 public:
  Runner(ucx::Worker& worker, ucx::Endpoint ep, const Source& src,
         std::vector<std::unique_ptr<ucx::MemoryRegion>>& slots, bool force_rndv)
      : worker_(worker), ep_(ep), src_(src), slots_(slots), force_rndv_(force_rndv) {}

  Result<double> Run(const std::string& op, uint64_t size, int count, int window) {
    op_ = op;
    size_ = size;
    {
      MutexLock lock(&mu_);
      issued_ = 0;
      completed_ = 0;
      count_ = count;
      error_ = Status::Ok();
    }
    auto start = Clock::now();
    int initial = std::min(window, count);
    for (int i = 0; i < initial; ++i) {
      bool posted = worker_.Post([this, i] { Issue(static_cast<size_t>(i)); });
      if (!posted) return Cancelled("worker stopped");
    }
    MutexLock lock(&mu_);
    if (!cv_.WaitFor(lock, 120s,
                     [&]() REQUIRES(mu_) { return completed_ >= count_ || !error_.ok(); })) {
      return DeadlineExceeded("case did not finish in 120 s");
    }
    if (!error_.ok()) return error_;
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  /// The fetch reply arrives here (AM handler on the progress thread).
  void OnFetchData(ucx::AmMessage& m) {
    Request r{};
    std::memcpy(&r, m.header().data(), std::min(sizeof(r), m.header().size()));
    size_t slot = static_cast<size_t>(r.slot);
    if (slot >= slots_.size()) return;
    m.Receive(slots_[slot]->memory().first(m.data_length()), [this, slot](Status s) {
       Completed(slot, std::move(s));
     }).IgnoreError();
  }

 private:
  // Progress thread only.
  void Issue(size_t slot) {
    {
      MutexLock lock(&mu_);
      if (issued_ >= count_) return;
    }
    ++issued_;
    ucx::MemoryRegion& local = *slots_[slot];
    auto done = [this, slot](Status s) { Completed(slot, std::move(s)); };
    if (op_ == "get") {
      worker_.Get(ep_, local.memory().first(size_), src_.remote_address, src_.rkey, nullptr, done,
                  &local);
    } else if (op_ == "am_push") {
      ucx::SendOptions so;
      so.force_rendezvous = force_rndv_;
      so.region = &local;
      worker_.SendAm(ep_, kPush, {}, local.memory().first(size_), nullptr, done, so);
    } else {  // am_fetch: the request carries the slot; the source reads from offset 0
      Request r{0, size_, slot};
      auto header = std::as_bytes(std::span<const Request>(&r, 1));
      ucx::SendOptions so;
      so.force_eager = true;
      worker_.SendAm(
          ep_, kFetchRequest, header, {}, nullptr,
          [this](Status s) {
            if (!s.ok()) Fail(std::move(s));
          },
          so);
    }
  }

  void Completed(size_t slot, Status s) {
    if (!s.ok()) {
      Fail(std::move(s));
      return;
    }
    bool all = false;
    {
      MutexLock lock(&mu_);
      all = ++completed_ >= count_;
    }
    if (all) {
      cv_.SignalAll();
    } else {
      Issue(slot);
    }
  }

  void Fail(Status s) {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = std::move(s);
    cv_.SignalAll();
  }

  ucx::Worker& worker_;
  ucx::Endpoint ep_;
  const Source& src_;
  std::vector<std::unique_ptr<ucx::MemoryRegion>>& slots_;
  bool force_rndv_;
  std::string op_;
  uint64_t size_ = 0;
  int issued_ = 0;  // progress thread only
  Mutex mu_;
  CondVar cv_;
  int completed_ GUARDED_BY(mu_) = 0;
  int count_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);
};

int RunFetcher(const Options& o, const std::vector<uint64_t>& sizes) {
  uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  auto src = SpawnSource(o, max_size);
  if (src == nullptr) {
    std::fprintf(stderr, "zps-bench transport-raw: cannot start the source process\n");
    return 1;
  }
  auto ctx = ucx::Context::Create({.transports = o.tls});
  if (!ctx.ok()) {
    std::fprintf(stderr, "zps-bench transport-raw: %s\n", ctx.status().ToString().c_str());
    return 1;
  }
  auto worker_or = ucx::Worker::Create(
      **ctx, {.thread_name = "fetch-ucx", .spin = std::chrono::microseconds(o.spin_us)});
  if (!worker_or.ok()) return 1;
  ucx::Worker& worker = **worker_or;

  std::vector<Buffer> buffers;
  std::vector<std::unique_ptr<ucx::MemoryRegion>> slots;
  for (int i = 0; i < o.window; ++i) {
    buffers.emplace_back(max_size);
    auto r = (*ctx)->Register(buffers.back().span());
    if (!r.ok()) {
      std::fprintf(stderr, "zps-bench transport-raw: %s\n", r.status().ToString().c_str());
      return 1;
    }
    slots.push_back(std::move(*r));
  }

  std::unique_ptr<Runner> runner;
  Runner* runner_ptr = nullptr;
  Status st = worker.SetAmHandler(kFetchData, [&runner_ptr](ucx::AmMessage& m) {
    if (runner_ptr != nullptr) runner_ptr->OnFetchData(m);
  });
  if (st.ok()) st = worker.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "zps-bench transport-raw: %s\n", st.ToString().c_str());
    return 1;
  }
  auto ep = worker.Connect(src->address, {}, src->pid);
  if (!ep.ok()) {
    std::fprintf(stderr, "zps-bench transport-raw: %s\n", ep.status().ToString().c_str());
    return 1;
  }
  runner = std::make_unique<Runner>(worker, *ep, *src, slots, !o.auto_protocol);
  {  // let the source connect back to us (see RunSource)
    std::string line = "ADDR " + Hex(worker.Address()) + "\n";
    if (write(src->stdin_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      std::fprintf(stderr, "zps-bench transport-raw: cannot talk to the source\n");
      return 1;
    }
    char buf[256];
    if (std::fgets(buf, sizeof(buf), src->out) == nullptr) {
      std::fprintf(stderr, "zps-bench transport-raw: the source did not connect back\n");
      return 1;
    }
  }
  worker.Post([&runner_ptr, &runner] { runner_ptr = runner.get(); });

  if (!o.json) {
    std::printf("zps-bench transport-raw: tls=%s window=%d, median (best) of %d reps\n",
                o.tls.c_str(), o.window, o.reps);
    std::printf("%-9s %12s %10s %10s\n", "op", "size", "GB/s", "best");
  }
  int rc = 0;
  for (const std::string& op : SplitList(o.ops)) {
    if (op != "am_fetch" && op != "get" && op != "am_push") {
      std::fprintf(stderr, "zps-bench transport-raw: unknown op '%s'\n", op.c_str());
      return 2;
    }
    for (uint64_t size : sizes) {
      int count = static_cast<int>(std::max<uint64_t>(8, o.bytes_per_rep / size));
      std::vector<double> rates;
      for (int rep = -1; rep < o.reps; ++rep) {  // rep -1: warm-up (connection, registration)
        auto secs = runner->Run(op, size, rep < 0 ? std::max(2, count / 4) : count, o.window);
        if (!secs.ok()) {
          std::fprintf(stderr, "zps-bench transport-raw: %s %llu: %s\n", op.c_str(),
                       static_cast<unsigned long long>(size), secs.status().ToString().c_str());
          rc = 1;
          break;
        }
        if (rep >= 0) rates.push_back(static_cast<double>(size) * count / *secs / 1e9);
      }
      if (rates.empty()) continue;
      std::sort(rates.begin(), rates.end());
      double median = rates[rates.size() / 2];
      double best = rates.back();
      if (o.json) {
        std::printf(
            "{\"bench\":\"transport-raw\",\"op\":\"%s\",\"tls\":\"%s\",\"size_bytes\":%llu,"
            "\"gb_per_s\":%.3f,\"gb_per_s_best\":%.3f,\"window\":%d,\"iters\":%d,\"reps\":%d}\n",
            op.c_str(), o.tls.c_str(), static_cast<unsigned long long>(size), median, best,
            o.window, count, o.reps);
      } else {
        std::printf("%-9s %12llu %10.3f %10.3f\n", op.c_str(),
                    static_cast<unsigned long long>(size), median, best);
      }
      std::fflush(stdout);
    }
  }
  worker.Stop();
  return rc;
}

int RunTransportBench(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench transport-raw",
              "UCX data-plane throughput between two processes: AM rendezvous fetch, RMA get, "
              "AM rendezvous push. Compare with ucx_perftest (scripts/bench-transport.sh).");
  flags.Add("tls", "UCX transports: tcp, shm (= posix,cma,self), or a UCX_TLS list", &o.tls);
  flags.Add("sizes", "message sizes, comma-separated", &o.sizes);
  flags.Add("ops", "am_fetch, get, am_push (comma-separated)", &o.ops);
  flags.AddBytes("bytes-per-rep", "bytes moved per repetition (at least 8 messages)",
                 &o.bytes_per_rep);
  flags.Add("reps", "timed repetitions per case", &o.reps, 1, 100);
  flags.Add("window", "operations in flight", &o.window, 1, 64);
  flags.Add("spin-us", "progress-thread polling before sleeping, microseconds", &o.spin_us, 0,
            10000000);
  flags.Add("json", "print one JSON object per line", &o.json);
  flags.Add("register-only", "source region: register malloc'd memory instead of UCX-allocated",
            &o.register_only);
  flags.Add("auto-protocol", "let UCX choose eager/rendezvous for AM payloads", &o.auto_protocol);
  flags.Add("reply-ep",
            "am_fetch: the source answers through the AM reply endpoint instead of "
            "an endpoint it connects to the fetcher",
            &o.reply_ep);
  flags.Add("role", "internal: fetcher or source", &o.role);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-bench transport-raw: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  auto sizes = ParseSizes(o.sizes);
  if (!sizes.ok()) {
    std::fprintf(stderr, "zps-bench transport-raw: --sizes: %s\n",
                 sizes.status().ToString().c_str());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (o.role == "source") return RunSource(o, sizes->front());
  if (o.role != "fetcher") {
    std::fprintf(stderr, "zps-bench transport-raw: --role must be fetcher or source\n");
    return 2;
  }
  return RunFetcher(o, *sizes);
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("transport-raw", "UCX data-plane layer: AM-rndv fetch/push vs RMA get",
                     RunTransportBench);

}  // namespace zps::bench
