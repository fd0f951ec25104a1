#include "zps/common/cpu.h"

#include <cpuid.h>

#include <cstdlib>
#include <string>

namespace zps {
namespace {
// F16C (CPUID.1:ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool HasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
}  // namespace

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Result<Isa> ParseIsa(std::string_view text) {
  if (text == "scalar") return Isa::kScalar;
  if (text == "avx2") return Isa::kAvx2;
  if (text == "avx512") return Isa::kAvx512;
  return InvalidArgument("ISA must be scalar, avx2 or avx512; got '" + std::string(text) + "'");
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case Isa::kAvx512:
      return IsaSupported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
  }
  return false;
}

Isa DetectIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Result<Isa> ActiveIsa() {
  static const Result<Isa> active = []() -> Result<Isa> {
    const char* env = std::getenv("ZPS_ISA");
    if (env == nullptr || *env == '\0') return DetectIsa();
    ZPS_ASSIGN_OR_RETURN(Isa want, ParseIsa(env));
    if (!IsaSupported(want)) {
      return InvalidArgument("ZPS_ISA=" + std::string(env) + " but this CPU does not support it");
    }
    return want;
  }();
  return active;
}

}  // namespace zps
