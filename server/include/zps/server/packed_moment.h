// zps/server/packed_moment.h — conversions between fp32 and the packed moments of the optimizer's
// compact state (the formats: zps/server/optimizer.h, "packed moments").
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "zps/common/job_spec.h"
#include "zps/common/status.h"

namespace zps::server {

/// Which int8 map a moment uses: m and SGD's momentum buffer are signed, v is unsigned.
enum class MomentKind : uint8_t { kM = 0, kV = 1 };

/// Packs values.size() floats into `packed` (MomentBytes(dtype, n) bytes): fp32 as they are,
/// bf16 rounded to nearest even, int8 quantized per block exactly as the update packs. For
/// conversions (state written in another dtype, an fp32 export) and tests; the update itself
/// packs bf16 m the same way and bf16 v with its dithered rounding. Errors: InvalidArgument when
/// packed has the wrong size.
Status PackMoment(StateDType dtype, MomentKind kind, std::span<const float> values,
                  std::span<std::byte> packed);
/// The floats of a packed moment (int8: code value x block scale, as the update unpacks).
/// Errors: InvalidArgument when packed has the wrong size.
Status UnpackMoment(StateDType dtype, MomentKind kind, std::span<const std::byte> packed,
                    std::span<float> values);

}  // namespace zps::server
