#include "zps/common/block_quant.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "block_quant_kernels.h"
#include "zps/common/cpu.h"
#include "zps/common/dtype.h"

namespace zps {
namespace {

using internal::BlockQuantKernels;
using internal::DequantOp;

// Below this absmax, qmax / absmax could overflow to Inf; such blocks are stored as zeros.
constexpr float kTinyAbsmax = 0x1p-120f;

size_t ScalarAbsmax(const float*, size_t, float*, bool*) { return 0; }
size_t ScalarAddAbsmax(const float*, float*, size_t, float*, bool*) { return 0; }
size_t ScalarCodes(int, const float*, size_t, float, float, uint8_t*) { return 0; }
size_t ScalarDequant(int, const uint8_t*, size_t, size_t, float, DequantOp, void*) { return 0; }

const BlockQuantKernels& Kernels() {
  static const BlockQuantKernels& k = [&]() -> const BlockQuantKernels& {
    static constexpr BlockQuantKernels scalar{&ScalarAbsmax, &ScalarAddAbsmax, &ScalarCodes,
                                              &ScalarDequant};
    auto isa = ActiveIsa();
    if (isa.ok() && *isa == Isa::kAvx512) return internal::BlockQuantAvx512();
    if (isa.ok() && *isa == Isa::kAvx2) return internal::BlockQuantAvx2();
    return scalar;
  }();
  return k;
}

float QMax(QuantFormat f) { return f.bits == 4 ? 7.0f : 127.0f; }

// Folds |x[from..len)| into absmax, noting a NaN or an Inf: the scalar end of the absmax kernels.
void FoldAbsmax(const float* x, size_t from, size_t len, float* absmax, bool* nonfinite) {
  for (size_t i = from; i < len; ++i) {
    const float a = std::fabs(x[i]);
    if (!(a <= std::numeric_limits<float>::max())) *nonfinite = true;
    *absmax = std::max(*absmax, a);
  }
}

// One block x[0..len), whose absmax and non-finite flag are known, into the record at rec.
// Returns the scale written.
float EncodeOne(const BlockQuantKernels& k, QuantFormat f, const float* x, size_t len, float absmax,
                bool nonfinite, std::byte* rec) {
  auto* codes = reinterpret_cast<uint8_t*>(rec + 4);
  const size_t code_bytes = QuantizedCodeBytes(f, len);
  float scale;
  if (nonfinite || absmax < kTinyAbsmax) {
    scale = nonfinite ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    std::memset(codes, 0, code_bytes);
  } else {
    const float qmax = QMax(f);
    scale = absmax / qmax;
    const float inv = qmax / absmax;
    size_t i = k.codes(f.bits, x, len, inv, qmax, codes);
    if (f.bits == 8) {
      for (; i < len; ++i) {
        codes[i] = static_cast<uint8_t>(static_cast<int8_t>(internal::RoundCode(x[i] * inv, qmax)));
      }
    } else {
      for (; i < len; i += 2) {
        const auto lo = static_cast<int>(internal::RoundCode(x[i] * inv, qmax));
        const int hi =
            i + 1 < len ? static_cast<int>(internal::RoundCode(x[i + 1] * inv, qmax)) : 0;
        codes[i / 2] = static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
      }
    }
  }
  std::memcpy(rec, &scale, sizeof(scale));
  return scale;
}

// One block: x[0..len) into the record at rec. Returns the scale written.
float QuantizeOne(const BlockQuantKernels& k, QuantFormat f, const float* x, size_t len,
                  std::byte* rec) {
  float absmax = 0.0f;
  bool nonfinite = false;
  FoldAbsmax(x, k.absmax(x, len, &absmax, &nonfinite), len, &absmax, &nonfinite);
  return EncodeOne(k, f, x, len, absmax, nonfinite, rec);
}

// Elements [from, from + n) of the block record at rec, through op.
void DequantizeOne(const BlockQuantKernels& k, QuantFormat f, const std::byte* rec, size_t from,
                   size_t n, DequantOp op, void* out) {
  float scale;
  std::memcpy(&scale, rec, sizeof(scale));
  const auto* codes = reinterpret_cast<const uint8_t*>(rec + 4);
  size_t i = 0;
  // int4 vector kernels start on a whole code byte.
  if (f.bits == 4 && (from & 1) && n > 0) i = 1;
  auto value = [&](size_t e) {
    const int c =
        f.bits == 8 ? static_cast<int8_t>(codes[e]) : internal::DecodeInt4(codes[e / 2], e);
    return static_cast<float>(c) * scale;
  };
  auto put = [&](size_t j, float v) {
    switch (op) {
      case DequantOp::kStore:
        static_cast<float*>(out)[j] = v;
        break;
      case DequantOp::kAdd:
        static_cast<float*>(out)[j] += v;
        break;
      case DequantOp::kSub:
        static_cast<float*>(out)[j] -= v;
        break;
      case DequantOp::kBF16:
        static_cast<uint16_t*>(out)[j] = FloatToBf16(v);
        break;
      case DequantOp::kF16:
        static_cast<uint16_t*>(out)[j] = FloatToHalf(v);
        break;
    }
  };
  if (i == 1) put(0, value(from));
  const size_t elem_size = (op == DequantOp::kBF16 || op == DequantOp::kF16) ? 2 : 4;
  i += k.dequant(f.bits, codes, from + i, n - i, scale, op,
                 static_cast<std::byte*>(out) + i * elem_size);
  for (; i < n; ++i) put(i, value(from + i));
}

// Walks elements [skip, skip + n) of a block stream starting at a block boundary.
void DequantizeStream(QuantFormat f, const std::byte* blocks, size_t skip, size_t n, DequantOp op,
                      void* out) {
  const auto& k = Kernels();
  const size_t elem_size = (op == DequantOp::kBF16 || op == DequantOp::kF16) ? 2 : 4;
  const size_t stride = QuantizedBlockStride(f);
  size_t b = skip / f.block, from = skip % f.block, done = 0;
  while (done < n) {
    const size_t len = std::min<size_t>(f.block - from, n - done);
    DequantizeOne(k, f, blocks + b * stride, from, len, op,
                  static_cast<std::byte*>(out) + done * elem_size);
    done += len;
    ++b;
    from = 0;
  }
}

}  // namespace

Status ValidateQuantFormat(QuantFormat f) {
  if (f.bits != 8 && f.bits != 4) {
    return InvalidArgument("quantization bits must be 8 or 4; got " + std::to_string(f.bits));
  }
  if (f.block == 0 || f.block % 64 != 0) {
    return InvalidArgument("quantization block must be a positive multiple of 64; got " +
                           std::to_string(f.block));
  }
  return Status::Ok();
}

QuantRange QuantizedCovering(QuantFormat f, size_t n, size_t begin, size_t end) {
  const size_t first = begin / f.block, last = (end - 1) / f.block;
  QuantRange r;
  r.offset = first * QuantizedBlockStride(f);
  r.bytes = std::min(QuantizedBytes(f, n), (last + 1) * QuantizedBlockStride(f)) - r.offset;
  r.skip = begin - first * f.block;
  return r;
}

void QuantizeBlocks(QuantFormat f, std::span<const float> in, std::span<std::byte> out) {
  const auto& k = Kernels();
  const size_t stride = QuantizedBlockStride(f);
  for (size_t b = 0, e = 0; e < in.size(); ++b, e += f.block) {
    QuantizeOne(k, f, in.data() + e, std::min<size_t>(f.block, in.size() - e),
                out.data() + b * stride);
  }
}

void DequantizeBlocks(QuantFormat f, std::span<const std::byte> in, std::span<float> out) {
  DequantizeStream(f, in.data(), 0, out.size(), DequantOp::kStore, out.data());
}

void DequantizeBlocksToBf16(QuantFormat f, std::span<const std::byte> in, std::span<uint16_t> out) {
  DequantizeStream(f, in.data(), 0, out.size(), DequantOp::kBF16, out.data());
}

void DequantizeBlocksToF16(QuantFormat f, std::span<const std::byte> in, std::span<uint16_t> out) {
  DequantizeStream(f, in.data(), 0, out.size(), DequantOp::kF16, out.data());
}

void DequantizeAddBlocks(QuantFormat f, std::span<const std::byte> in, std::span<float> acc) {
  DequantizeStream(f, in.data(), 0, acc.size(), DequantOp::kAdd, acc.data());
}

void QuantizeWithResidual(QuantFormat f, std::span<const float> g, std::span<float> residual,
                          std::span<std::byte> out) {
  const auto& k = Kernels();
  const size_t stride = QuantizedBlockStride(f);
  for (size_t b = 0, e = 0; e < g.size(); ++b, e += f.block) {
    const size_t len = std::min<size_t>(f.block, g.size() - e);
    float* r = residual.data() + e;
    // t = g + r in the absmax pass (the block then stays in L1 for the codes and the residual).
    float absmax = 0.0f;
    bool nonfinite = false;
    const size_t done = k.add_absmax(g.data() + e, r, len, &absmax, &nonfinite);
    for (size_t i = done; i < len; ++i) r[i] = g[e + i] + r[i];
    FoldAbsmax(r, done, len, &absmax, &nonfinite);
    std::byte* rec = out.data() + b * stride;
    const float scale = EncodeOne(k, f, r, len, absmax, nonfinite, rec);
    if (std::isnan(scale)) {
      std::fill(r, r + len, 0.0f);
      continue;
    }
    // r = t - deq(q): one multiply and one subtraction per element, as every ISA rounds them.
    DequantizeOne(k, f, rec, 0, len, DequantOp::kSub, r);
  }
}

void DequantizeRange(QuantFormat f, std::span<const std::byte> blocks, size_t skip,
                     size_t out_elems, DequantTarget target, void* out) {
  const DequantOp op = target == DequantTarget::kF32    ? DequantOp::kStore
                       : target == DequantTarget::kBF16 ? DequantOp::kBF16
                                                        : DequantOp::kF16;
  DequantizeStream(f, blocks.data(), skip, out_elems, op, out);
}

}  // namespace zps
