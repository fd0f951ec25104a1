// zps/common/cpu.h — instruction-set levels and runtime dispatch.
//
// The active ISA is the best level the CPU supports, unless ZPS_ISA (scalar|avx2|avx512) asks
// for a lower one; tests use that to cover every path. Asking for a level the CPU lacks is an
// error, never a silent fallback.
//
// Thread-safety: all functions are safe from any thread. ActiveIsa() reads the environment once.
#pragma once

#include <string_view>

#include "zps/common/status.h"

namespace zps {

enum class Isa : int {
  kScalar = 0,
  kAvx2 = 1,    ///< AVX2 + FMA + F16C
  kAvx512 = 2,  ///< AVX-512 F, BW, VL, DQ
};

std::string_view IsaName(Isa isa);
Result<Isa> ParseIsa(std::string_view text);
/// The best ISA this CPU supports.
Isa DetectIsa();
/// True when this CPU can run `isa`.
bool IsaSupported(Isa isa);
/// The ISA selected by ZPS_ISA, or DetectIsa(). Errors: InvalidArgument for an unknown name or
/// an ISA this CPU lacks. Evaluated once per process and cached.
Result<Isa> ActiveIsa();

}  // namespace zps
