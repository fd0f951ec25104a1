// Kernels of the model. Determinism rules (model.h): each output element is a fixed sequence of
// IEEE fp32 multiplies and adds, so vectorising across output elements (any width) does not change
// a bit. The target does not contract a*b+c into FMA (-ffp-contract=off) and reductions are
// written as explicit sequential sums. The GEMM is cloned for AVX2 only for speed: the AVX2 clone
// computes the same operations, 8 elements at a time.
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace zps::train::kernels {
namespace {

constexpr int kMr = 6;   // rows per micro-tile
constexpr int kNr = 16;  // columns per micro-tile: two 8-float vectors

// GCC vector extension: elementwise IEEE mul and add (no contraction with -ffp-contract=off), so
// a vector lane computes exactly what the scalar code would. Two SSE registers on the default
// target, one AVX register in the AVX2 clone.
typedef float V8 __attribute__((vector_size(32)));

// Loads and stores by memcpy (unaligned); by pointer, so no vector crosses a call boundary.
__attribute__((always_inline)) inline void Load8(V8* v, const float* p) {
  std::memcpy(v, p, sizeof(V8));
}
__attribute__((always_inline)) inline void Store8(float* p, const V8* v) {
  std::memcpy(p, v, sizeof(V8));
}

// C[i0.., j0..j0+16) for MR rows: A rows of stride lda, B rows of stride ldb (its column j0
// first), C rows of stride ldc; bias points at bias[j0] (or is null).
template <int MR>
__attribute__((always_inline)) inline void MicroTile(const float* A, int64_t lda, const float* B,
                                                     int64_t ldb, const float* bias, float* C,
                                                     int64_t ldc, int K, bool accumulate) {
  V8 acc[MR][2];
  for (int r = 0; r < MR; ++r) {
    float* c = C + r * ldc;
    for (int h = 0; h < 2; ++h) {
      if (accumulate) {
        Load8(&acc[r][h], c + 8 * h);
      } else if (bias != nullptr) {
        Load8(&acc[r][h], bias + 8 * h);
      } else {
        acc[r][h] = V8{};
      }
    }
  }
  const float* a[MR];
  for (int r = 0; r < MR; ++r) a[r] = A + r * lda;
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    V8 b0, b1;
    Load8(&b0, b);
    Load8(&b1, b + 8);
    for (int r = 0; r < MR; ++r) {
      const float s = a[r][k];
      const V8 av = {s, s, s, s, s, s, s, s};
      acc[r][0] += av * b0;
      acc[r][1] += av * b1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    float* c = C + r * ldc;
    Store8(c, &acc[r][0]);
    Store8(c + 8, &acc[r][1]);
  }
}

// Rows [i0, i0 + mr) of C against one 16-column panel of B (as MicroTile takes it).
__attribute__((always_inline)) inline void PanelRows(int mr, const float* A, int64_t lda,
                                                     const float* B, int64_t ldb, const float* bias,
                                                     float* C, int64_t ldc, int K,
                                                     bool accumulate) {
  switch (mr) {
    case 6:
      return MicroTile<6>(A, lda, B, ldb, bias, C, ldc, K, accumulate);
    case 5:
      return MicroTile<5>(A, lda, B, ldb, bias, C, ldc, K, accumulate);
    case 4:
      return MicroTile<4>(A, lda, B, ldb, bias, C, ldc, K, accumulate);
    case 3:
      return MicroTile<3>(A, lda, B, ldb, bias, C, ldc, K, accumulate);
    case 2:
      return MicroTile<2>(A, lda, B, ldb, bias, C, ldc, K, accumulate);
    default:
      return MicroTile<1>(A, lda, B, ldb, bias, C, ldc, K, accumulate);
  }
}

// Edge tiles: same per-element order, no vector shape. B(k, j) is B[k * bk + j * bj].
inline void EdgeTile(const float* A, const float* B, int64_t bk, int64_t bj, const float* bias,
                     float* C, int K, int N, int i0, int mr, int j0, int nr, bool accumulate) {
  for (int r = 0; r < mr; ++r) {
    float* c = C + static_cast<int64_t>(i0 + r) * N + j0;
    const float* a = A + static_cast<int64_t>(i0 + r) * K;
    for (int j = 0; j < nr; ++j) {
      float s = accumulate ? c[j] : (bias ? bias[j0 + j] : 0.0f);
      const float* b = B + (j0 + j) * bj;
      for (int k = 0; k < K; ++k) s += a[k] * b[k * bk];
      c[j] = s;
    }
  }
}

}  // namespace

__attribute__((target_clones("avx2", "default"))) void Gemm(const float* A, const float* B,
                                                            const float* bias, float* C, int M,
                                                            int K, int N, bool accumulate) {
  const int n_full = N - N % kNr;
  for (int i0 = 0; i0 < M; i0 += kMr) {
    const int mr = std::min(kMr, M - i0);
    const float* a = A + static_cast<int64_t>(i0) * K;
    float* c = C + static_cast<int64_t>(i0) * N;
    for (int j0 = 0; j0 < n_full; j0 += kNr) {
      PanelRows(mr, a, K, B + j0, N, bias ? bias + j0 : nullptr, c + j0, N, K, accumulate);
    }
    if (n_full < N) EdgeTile(A, B, N, 1, bias, C, K, N, i0, mr, n_full, N - n_full, accumulate);
  }
}

__attribute__((target_clones("avx2", "default"))) void GemmTransB(const float* A, const float* Bt,
                                                                  float* C, int M, int K, int N) {
  // One 16-column panel of B at a time, copied out of Bt's rows into MicroTile's layout (k-major,
  // 16 floats a row): it stays in cache for every row tile of A, and B is never transposed whole.
  thread_local std::vector<float> panel;
  panel.resize(static_cast<size_t>(K) * kNr);
  const int n_full = N - N % kNr;
  for (int j0 = 0; j0 < n_full; j0 += kNr) {
    const float* rows = Bt + static_cast<int64_t>(j0) * K;
    for (int k0 = 0; k0 < K; k0 += 64) {  // 16 rows x 64 columns of Bt at a time, in L1
      const int k1 = std::min(K, k0 + 64);
      for (int jj = 0; jj < kNr; ++jj) {
        const float* row = rows + static_cast<int64_t>(jj) * K;
        for (int k = k0; k < k1; ++k) panel[static_cast<size_t>(k) * kNr + jj] = row[k];
      }
    }
    for (int i0 = 0; i0 < M; i0 += kMr) {
      PanelRows(std::min(kMr, M - i0), A + static_cast<int64_t>(i0) * K, K, panel.data(), kNr,
                nullptr, C + static_cast<int64_t>(i0) * N + j0, N, K, false);
    }
  }
  if (n_full < N) {
    for (int i0 = 0; i0 < M; i0 += kMr) {
      EdgeTile(A, Bt, 1, K, nullptr, C, K, N, i0, std::min(kMr, M - i0), n_full, N - n_full, false);
    }
  }
}

void Transpose(const float* src, float* dst, int rows, int cols) {
  constexpr int kB = 32;
  for (int i0 = 0; i0 < rows; i0 += kB) {
    for (int j0 = 0; j0 < cols; j0 += kB) {
      const int i1 = std::min(rows, i0 + kB), j1 = std::min(cols, j0 + kB);
      for (int i = i0; i < i1; ++i)
        for (int j = j0; j < j1; ++j)
          dst[static_cast<int64_t>(j) * rows + i] = src[static_cast<int64_t>(i) * cols + j];
    }
  }
}

void LayerNormForward(const float* x, const float* g, const float* b, float* out, float* mean,
                      float* rstd, int N, int D) {
  constexpr float kEps = 1e-5f;
  for (int n = 0; n < N; ++n) {
    const float* xr = x + static_cast<int64_t>(n) * D;
    float* o = out + static_cast<int64_t>(n) * D;
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += xr[d];
    const float mu = s / static_cast<float>(D);
    float v = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float c = xr[d] - mu;
      v += c * c;
    }
    const float rs = 1.0f / std::sqrt(v / static_cast<float>(D) + kEps);
    for (int d = 0; d < D; ++d) o[d] = (xr[d] - mu) * rs * g[d] + b[d];
    mean[n] = mu;
    rstd[n] = rs;
  }
}

void LayerNormBackward(const float* dout, const float* x, const float* mean, const float* rstd,
                       const float* g, float* dx, float* dg, float* db, int N, int D) {
  for (int n = 0; n < N; ++n) {
    const float* dor = dout + static_cast<int64_t>(n) * D;
    const float* xr = x + static_cast<int64_t>(n) * D;
    float* dxr = dx + static_cast<int64_t>(n) * D;
    const float mu = mean[n], rs = rstd[n];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float xhat = (xr[d] - mu) * rs;
      const float dxhat = dor[d] * g[d];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dg[d] += dor[d] * xhat;
      db[d] += dor[d];
    }
    const float m1 = sum_dxhat / static_cast<float>(D);
    const float m2 = sum_dxhat_xhat / static_cast<float>(D);
    for (int d = 0; d < D; ++d) {
      const float xhat = (xr[d] - mu) * rs;
      dxr[d] = rs * (dor[d] * g[d] - m1 - xhat * m2);
    }
  }
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void GeluForward(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

void AttentionForward(const float* qkv, float* probs, float* y, int B, int T, int D, int H) {
  const int hd = D / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t row = 3LL * D;
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<int64_t>(b) * T * row;
    for (int h = 0; h < H; ++h) {
      float* P = probs + (static_cast<int64_t>(b) * H + h) * T * T;
      for (int i = 0; i < T; ++i) {
        const float* q = base + i * row + h * hd;
        float* p = P + static_cast<int64_t>(i) * T;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j <= i; ++j) {
          const float* k = base + j * row + D + h * hd;
          float s = 0.0f;
          for (int d = 0; d < hd; ++d) s += q[d] * k[d];
          s *= scale;
          p[j] = s;
          mx = std::max(mx, s);
        }
        float sum = 0.0f;
        for (int j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= i; ++j) p[j] *= inv;
        for (int j = i + 1; j < T; ++j) p[j] = 0.0f;
        float* yo = y + (static_cast<int64_t>(b) * T + i) * D + h * hd;
        for (int d = 0; d < hd; ++d) yo[d] = 0.0f;
        for (int j = 0; j <= i; ++j) {
          const float* v = base + j * row + 2 * D + h * hd;
          const float pj = p[j];
          for (int d = 0; d < hd; ++d) yo[d] += pj * v[d];
        }
      }
    }
  }
}

void AttentionBackward(const float* qkv, const float* probs, const float* dy, float* dqkv, int B,
                       int T, int D, int H) {
  const int hd = D / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t row = 3LL * D;
  std::memset(dqkv, 0, sizeof(float) * static_cast<size_t>(B) * T * row);
  std::vector<float> dp(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<int64_t>(b) * T * row;
    float* dbase = dqkv + static_cast<int64_t>(b) * T * row;
    for (int h = 0; h < H; ++h) {
      const float* P = probs + (static_cast<int64_t>(b) * H + h) * T * T;
      for (int i = 0; i < T; ++i) {
        const float* p = P + static_cast<int64_t>(i) * T;
        const float* dyi = dy + (static_cast<int64_t>(b) * T + i) * D + h * hd;
        const float* q = base + i * row + h * hd;
        float* dq = dbase + i * row + h * hd;
        float s = 0.0f;
        for (int j = 0; j <= i; ++j) {
          const float* v = base + j * row + 2 * D + h * hd;
          float* dv = dbase + j * row + 2 * D + h * hd;
          float acc = 0.0f;
          for (int d = 0; d < hd; ++d) acc += dyi[d] * v[d];
          dp[j] = acc;
          const float pj = p[j];
          for (int d = 0; d < hd; ++d) dv[d] += pj * dyi[d];
          s += pj * acc;
        }
        for (int j = 0; j <= i; ++j) {
          const float ds = p[j] * (dp[j] - s) * scale;
          const float* k = base + j * row + D + h * hd;
          float* dk = dbase + j * row + D + h * hd;
          for (int d = 0; d < hd; ++d) dq[d] += ds * k[d];
          for (int d = 0; d < hd; ++d) dk[d] += ds * q[d];
        }
      }
    }
  }
}

double CrossEntropy(const float* logits, const uint8_t* targets, float* dlogits, float grad_scale,
                    int N, int V) {
  double total = 0.0;
  for (int n = 0; n < N; ++n) {
    const float* l = logits + static_cast<int64_t>(n) * V;
    float mx = l[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, l[v]);
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    const float lse = mx + std::log(sum);
    total += static_cast<double>(lse - l[targets[n]]);
    if (dlogits != nullptr) {
      float* dl = dlogits + static_cast<int64_t>(n) * V;
      const float inv = 1.0f / sum;
      for (int v = 0; v < V; ++v) dl[v] = std::exp(l[v] - mx) * inv * grad_scale;
      dl[targets[n]] -= grad_scale;
    }
  }
  return total / static_cast<double>(N);
}

void ColumnSum(const float* x, float* out, int N, int D, bool accumulate) {
  if (!accumulate) std::fill(out, out + D, 0.0f);
  for (int n = 0; n < N; ++n) {
    const float* r = x + static_cast<int64_t>(n) * D;
    for (int d = 0; d < D; ++d) out[d] += r[d];
  }
}

}  // namespace zps::train::kernels
