// zps-bench: benchmark programs that print numbers (JSON lines with --json), one sub-command per
// subsystem. See bench.h for how a sub-command registers itself.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bench.h"

namespace zps::bench {

namespace {
std::vector<Subcommand>& Table() {
  static std::vector<Subcommand> table;  // function-local: safe from static-init order
  return table;
}
}  // namespace

bool RegisterSubcommand(Subcommand cmd) {
  auto& t = Table();
  for (const auto& c : t) {
    if (c.name == cmd.name) {
      std::fprintf(stderr, "zps-bench: sub-command '%.*s' registered twice\n",
                   static_cast<int>(cmd.name.size()), cmd.name.data());
      std::abort();
    }
  }
  t.push_back(cmd);
  std::sort(t.begin(), t.end(),
            [](const Subcommand& a, const Subcommand& b) { return a.name < b.name; });
  return true;
}

const std::vector<Subcommand>& Subcommands() { return Table(); }

}  // namespace zps::bench

namespace {
void Usage(FILE* out) {
  std::fprintf(out, "usage: zps-bench <sub-command> [--help] [flags]\n\nsub-commands:\n");
  int width = 0;
  for (const auto& c : zps::bench::Subcommands())
    width = std::max(width, static_cast<int>(c.name.size()));
  for (const auto& c : zps::bench::Subcommands()) {
    std::fprintf(out, "  %-*.*s  %.*s\n", width, static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    Usage(stdout);
    return 0;
  }
  for (const auto& c : zps::bench::Subcommands()) {
    if (c.name == cmd) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "zps-bench: unknown sub-command '%s'\n\n", argv[1]);
  Usage(stderr);
  return 2;
}
