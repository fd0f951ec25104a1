// bench.h — the sub-command table of zps-bench.
//
// A sub-command lives in its own file (optimizer_bench.cc, transport_bench.cc, ...) and registers
// itself with one line at namespace scope:
//
//   ZPS_BENCH_SUBCOMMAND("transport", "UCX/TCP data-plane throughput", RunTransportBench);
//
// where `int RunTransportBench(int argc, char** argv)` receives argv[0] == "transport" followed by
// the sub-command's own flags (parse them with zps::Flags, so --help works), and returns the
// process exit code. bench/CMakeLists.txt picks up every bench/*_bench.cc on its own.
//
// Thread-safety: registration happens during static initialisation, before main().
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"

namespace zps::bench {

using SubcommandFn = int (*)(int argc, char** argv);

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  SubcommandFn run;
};

/// Adds a sub-command; returns true so it can initialise a static. Duplicate names abort at
/// start-up (a build mistake, not a runtime condition).
bool RegisterSubcommand(Subcommand cmd);
/// All registered sub-commands, sorted by name.
const std::vector<Subcommand>& Subcommands();

/// Prints "zps-bench <cmd>: <status>" to stderr and returns the exit code 1.
inline int Fail(std::string_view cmd, const Status& s) {
  std::fprintf(stderr, "zps-bench %.*s: %s\n", static_cast<int>(cmd.size()), cmd.data(),
               s.ToString().c_str());
  return 1;
}

/// The non-empty items of a comma-separated flag value ("a,,b" gives {"a", "b"}).
inline std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

/// CPU seconds of the whole process so far (every thread; user + system).
double CpuSeconds();
/// Syncs every regular file under `dir` and drops it from the page cache, so that the next read
/// comes from the disk. Files that cannot be opened are skipped.
void DropCache(const std::string& dir);

}  // namespace zps::bench

#define ZPS_BENCH_CONCAT_INNER_(a, b) a##b
#define ZPS_BENCH_CONCAT_(a, b) ZPS_BENCH_CONCAT_INNER_(a, b)
#define ZPS_BENCH_SUBCOMMAND(name, summary, fn)                                           \
  [[maybe_unused]] static const bool ZPS_BENCH_CONCAT_(zps_bench_registered_, __LINE__) = \
      ::zps::bench::RegisterSubcommand({name, summary, fn})
