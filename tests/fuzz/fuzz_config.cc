// Fuzz target: the config file parser (zps::Flags reading a JSON config file, as every binary
// does with --config), over options of every kind.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fuzz_util.h"
#include "zps/common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char tmpl[] = "/tmp/zps-fuzz-config-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    return std::string(tmpl);
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  std::string s = "x";
  bool b = false;
  double d = 0;
  int64_t i64 = 0;
  int i = 0;
  uint64_t bytes = 0;
  std::string custom;
  zps::Flags flags("fuzz", "config parser fuzz target");
  flags.Add("name", "a string", &s);
  flags.Add("on", "a bool", &b);
  flags.Add("ratio", "a double", &d);
  flags.Add("steps", "an int64", &i64, -5, 1000000);
  flags.Add("port", "an int", &i, 0, 65535);
  flags.AddBytes("budget", "a byte size", &bytes);
  flags.AddCustom("mode", "a custom value", "a", [&](std::string_view v) -> zps::Status {
    if (v != "a" && v != "b") return zps::InvalidArgument("mode must be a or b");
    custom = v;
    return zps::Status::Ok();
  });
  const char* argv[] = {"fuzz", "--config", path.c_str()};
  auto r = flags.Parse(3, argv);
  if (r.ok()) ZPS_FUZZ_CHECK(i >= 0 && i <= 65535 && i64 >= -5 && i64 <= 1000000);
  return 0;
}
