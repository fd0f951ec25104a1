#include "zps/common/stream_copy.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "zps/common/cpu.h"
#include "zps/common/dtype.h"
#include "zps/common/simd_convert.h"

namespace zps {
namespace {

// Bytes from `p` to the next multiple of `align` (a power of two), at most `n`.
size_t HeadBytes(const std::byte* p, size_t align, size_t n) {
  const size_t head = (align - (reinterpret_cast<uintptr_t>(p) & (align - 1))) & (align - 1);
  return head < n ? head : n;
}

// Each copies the 64- or 32-byte-aligned bulk from `i` (dst + i aligned) and returns where it
// stopped; the caller copies the tail.
ZPS_TARGET_AVX512 size_t StreamAvx512(std::byte* dst, const std::byte* src, size_t i, size_t n) {
  for (; i + 256 <= n; i += 256) {
    const __m512i a = _mm512_loadu_si512(src + i);
    const __m512i b = _mm512_loadu_si512(src + i + 64);
    const __m512i c = _mm512_loadu_si512(src + i + 128);
    const __m512i d = _mm512_loadu_si512(src + i + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 192), d);
  }
  for (; i + 64 <= n; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  }
  _mm_sfence();
  return i;
}

ZPS_TARGET_AVX2 size_t StreamAvx2(std::byte* dst, const std::byte* src, size_t i, size_t n) {
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  for (; i + 32 <= n; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
  _mm_sfence();
  return i;
}

// 16 floats -> 16 halves (32 bytes) a store, from element `i` (out + i 32-byte aligned).
template <bool kBf16>
ZPS_TARGET_AVX512 size_t StreamTo16Avx512(const float* in, uint16_t* out, size_t i, size_t n) {
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(in + i);
    const __m256i h = kBf16 ? simd::F32ToBF16x16(v) : simd::F32ToF16x16(v);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), h);
  }
  _mm_sfence();
  return i;
}

// 8 floats -> 8 halves (16 bytes) a store, from element `i` (out + i 16-byte aligned).
template <bool kBf16>
ZPS_TARGET_AVX2 size_t StreamTo16Avx2(const float* in, uint16_t* out, size_t i, size_t n) {
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    const __m128i h = kBf16 ? simd::F32ToBF16x8(v) : simd::F32ToF16x8(v);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  _mm_sfence();
  return i;
}

template <bool kBf16>
void StreamTo16(std::span<const float> in, std::span<uint16_t> out, size_t stream_from) {
  const size_t n = in.size();
  auto isa = ActiveIsa();
  const Isa level = isa.ok() ? *isa : Isa::kScalar;
  if (n * sizeof(uint16_t) < stream_from || level == Isa::kScalar) {
    if (kBf16)
      ConvertF32ToBF16(in, out);
    else
      ConvertF32ToF16(in, out);
    return;
  }
  auto one = [](float f) { return kBf16 ? FloatToBf16(f) : FloatToHalf(f); };
  const size_t align = level == Isa::kAvx512 ? 32 : 16;
  const size_t head =
      HeadBytes(reinterpret_cast<const std::byte*>(out.data()), align, n * sizeof(uint16_t)) /
      sizeof(uint16_t);
  size_t i = 0;
  for (; i < head; ++i) out[i] = one(in[i]);
  i = level == Isa::kAvx512 ? StreamTo16Avx512<kBf16>(in.data(), out.data(), i, n)
                            : StreamTo16Avx2<kBf16>(in.data(), out.data(), i, n);
  for (; i < n; ++i) out[i] = one(in[i]);
}

// The largest data or unified cache of cpu0 in sysfs ("32768K"), or 0.
size_t SysfsLastLevelCache() {
  size_t best = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream type_file(dir + "/type"), size_file(dir + "/size");
    std::string type, size;
    if (!(type_file >> type) || !(size_file >> size)) break;
    if (type == "Instruction") continue;
    size_t value = 0;
    const auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), value);
    if (ec != std::errc()) continue;
    const char unit = end < size.data() + size.size() ? *end : ' ';
    if (unit == 'K')
      value <<= 10;
    else if (unit == 'M')
      value <<= 20;
    else if (unit == 'G')
      value <<= 30;
    best = std::max(best, value);
  }
  return best;
}

}  // namespace

size_t StreamCopyThreshold() {
  static const size_t threshold = [] {
    size_t llc = SysfsLastLevelCache();
    if (llc == 0) {
      const long conf = sysconf(_SC_LEVEL3_CACHE_SIZE);
      llc = conf > 0 ? static_cast<size_t>(conf) : size_t{32} << 20;
    }
    return std::clamp(llc / 4, size_t{1} << 20, size_t{64} << 20);
  }();
  return threshold;
}

void StreamCopy(std::span<std::byte> dst, std::span<const std::byte> src) {
  StreamCopy(dst, src, StreamCopyThreshold());
}

void StreamCopy(std::span<std::byte> dst, std::span<const std::byte> src, size_t stream_from) {
  const size_t n = src.size();
  if (n == 0) return;
  auto isa = ActiveIsa();
  const Isa level = isa.ok() ? *isa : Isa::kScalar;
  if (n < stream_from || level == Isa::kScalar) {
    std::memcpy(dst.data(), src.data(), n);
    return;
  }
  const size_t align = level == Isa::kAvx512 ? 64 : 32;
  const size_t head = HeadBytes(dst.data(), align, n);
  std::memcpy(dst.data(), src.data(), head);
  const size_t done = level == Isa::kAvx512 ? StreamAvx512(dst.data(), src.data(), head, n)
                                            : StreamAvx2(dst.data(), src.data(), head, n);
  std::memcpy(dst.data() + done, src.data() + done, n - done);
}

void StreamConvertF32ToF16(std::span<const float> in, std::span<uint16_t> out) {
  StreamTo16<false>(in, out, StreamCopyThreshold());
}
void StreamConvertF32ToBF16(std::span<const float> in, std::span<uint16_t> out) {
  StreamTo16<true>(in, out, StreamCopyThreshold());
}
void StreamConvertF32ToF16(std::span<const float> in, std::span<uint16_t> out, size_t stream_from) {
  StreamTo16<false>(in, out, stream_from);
}
void StreamConvertF32ToBF16(std::span<const float> in, std::span<uint16_t> out,
                            size_t stream_from) {
  StreamTo16<true>(in, out, stream_from);
}

}  // namespace zps
