// zps/common/stream_copy.h — a copy whose stores bypass the caches (non-temporal stores), for a
// staging buffer that another core reads next.
//
//   StreamCopy(staging_block, gradient_bytes);   // then the shard's RMA get reads the block
//
// Why: a worker's PushGrad copies the gradient into a staging block that the shard's progress
// thread, on another core, reads with an RMA get while the worker copies the next one. With
// ordinary stores each destination line is first read for ownership and then sits modified in
// this core's cache, where the reading core must fetch it from; with non-temporal stores the
// lines go to memory once. On the 2-core guest of docs/benchmarks.md ("Staging copies") that
// made a copying push at 16-64 MiB about 1.2x faster (medians of alternating runs), and at
// 1-4 MiB (which stay in its 32 MiB last-level cache, where the reader finds them) slower:
// hence the threshold below. Do not use
// it for a destination this core reads again soon.
//
// The bytes written are the same as memcpy's; only the cache behaviour differs. Copies below
// the threshold, and every copy when the active ISA (cpu.h) is scalar, are plain memcpy. The
// ranges must not overlap.
//
// Thread-safety: a pure function of its arguments (the stores are fenced before it returns, so
// another thread that learns of the copy through a later release, or a UCX message sent after
// it, sees the bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace zps {

/// The size from which StreamCopy streams: a quarter of the last-level cache (the kernel's
/// sysfs view, which in a VM is the guest's, unlike CPUID's), so that the blocks in flight and
/// what they are copied into would not fit it; within [1 MiB, 64 MiB]; 8 MiB when unknown.
/// Read once per process.
size_t StreamCopyThreshold();

/// Copies src.size() bytes into dst (which must hold at least that many), streaming from
/// StreamCopyThreshold() bytes up.
void StreamCopy(std::span<std::byte> dst, std::span<const std::byte> src);
/// The same, streaming from `stream_from` bytes up (tests use 0).
void StreamCopy(std::span<std::byte> dst, std::span<const std::byte> src, size_t stream_from);

/// ConvertF32ToF16 / ConvertF32ToBF16 (dtype.h), the same bits, with the 16-bit output
/// streamed from StreamCopyThreshold() output bytes up (a gradient staged in the job's 16-bit
/// gradient type). out.size() must be at least in.size().
void StreamConvertF32ToF16(std::span<const float> in, std::span<uint16_t> out);
void StreamConvertF32ToBF16(std::span<const float> in, std::span<uint16_t> out);
/// The same, streaming from `stream_from` output bytes up (tests use 0).
void StreamConvertF32ToF16(std::span<const float> in, std::span<uint16_t> out, size_t stream_from);
void StreamConvertF32ToBF16(std::span<const float> in, std::span<uint16_t> out, size_t stream_from);

}  // namespace zps
