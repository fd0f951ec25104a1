// zps-bench collectives: Gloo all-reduce, reduce-scatter and all-gather of a given size among
// --world ranks (threads of this process, each with its own GlooCollectives over tcp loopback),
// rendezvous through a running coordinator (--endpoint, --token-file). The reference beside
// zps-train's collectives modes (scripts/bench-collectives.sh).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/worker/gloo_collectives.h"

namespace zps::bench {
namespace {

struct Options {
  std::string endpoint;
  std::string token_file;
  int world = 4;
  uint64_t bytes = 1u << 20;
  int iters = 10;
  std::string hostname = "127.0.0.1";
};

int RunCollectivesBench(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench collectives",
              "Gloo all-reduce / reduce-scatter / all-gather of --bytes (fp32) among --world "
              "ranks (threads, tcp loopback), rendezvous through the coordinator at --endpoint.");
  flags.Add("endpoint", "coordinator host:port", &o.endpoint);
  flags.Add("token-file", "file holding the shared auth secret", &o.token_file);
  flags.Add("world", "ranks", &o.world, 1, 64);
  flags.AddBytes("bytes", "bytes per rank per operation (fp32 elements x 4)", &o.bytes);
  flags.Add("iters", "timed iterations per operation (after one warm-up)", &o.iters, 1, 100000);
  flags.Add("hostname", "address the Gloo devices bind", &o.hostname);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail("collectives", parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  auto token = ReadTokenFile(o.token_file);
  if (!token.ok()) return Fail("collectives", token.status());
  const size_t n = o.bytes / 4;
  const auto prefix =
      "bench/gloo/" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  struct Times {
    double allreduce = 0, reduce_scatter = 0, all_gather = 0;
  };
  std::vector<Times> times(o.world);
  std::vector<Status> errors(o.world);
  std::vector<std::thread> threads;
  for (int r = 0; r < o.world; ++r) {
    threads.emplace_back([&, r] {
      worker::GlooOptions go{
          o.endpoint, *token,    static_cast<uint32_t>(r), static_cast<uint32_t>(o.world),
          prefix,     o.hostname};
      auto c = worker::GlooCollectives::Create(go);
      if (!c.ok()) {
        errors[r] = c.status();
        return;
      }
      std::vector<float> buf(n, 1.0f);
      std::vector<std::byte> gathered(worker::SliceElems(n, o.world) * 4 * o.world);
      const size_t block = gathered.size() / o.world;
      auto timed = [&](auto&& op) -> Result<double> {
        ZPS_RETURN_IF_ERROR(op());  // warm-up
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < o.iters; ++i) ZPS_RETURN_IF_ERROR(op());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
               o.iters;
      };
      auto ar = timed([&] { return (*c)->AllReduce(buf); });
      auto rs = timed([&] { return (*c)->ReduceScatter(buf); });
      auto ag = timed([&] { return (*c)->AllGather(gathered, block); });
      if (!ar.ok() || !rs.ok() || !ag.ok()) {
        errors[r] = !ar.ok() ? ar.status() : !rs.ok() ? rs.status() : ag.status();
        return;
      }
      times[r] = {*ar, *rs, *ag};
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.ok()) return Fail("collectives", e);
  }
  Times worst;
  for (const auto& t : times) {
    worst.allreduce = std::max(worst.allreduce, t.allreduce);
    worst.reduce_scatter = std::max(worst.reduce_scatter, t.reduce_scatter);
    worst.all_gather = std::max(worst.all_gather, t.all_gather);
  }
  std::printf(
      "{\"world\": %d, \"bytes\": %llu, \"iters\": %d, \"allreduce_s\": %.6f, "
      "\"reduce_scatter_s\": %.6f, \"all_gather_s\": %.6f}\n",
      o.world, static_cast<unsigned long long>(n * 4), o.iters, worst.allreduce,
      worst.reduce_scatter, worst.all_gather);
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("collectives", "Gloo all-reduce / reduce-scatter / all-gather (tcp loopback)",
                     RunCollectivesBench);

}  // namespace zps::bench
