// The GEMM must give exactly the bits of the naive loop (k ascending into each element), whatever
// the vector width the CPU dispatch picked: that is the determinism contract of model.h.
#include "kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace zps::train::kernels {
namespace {

TEST(KernelsTest, GemmBitIdenticalToNaiveLoop) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto [M, K, N] : {std::tuple{1, 1, 1}, {7, 5, 3}, {6, 33, 16}, {13, 64, 47}, {32, 17, 96}}) {
    std::vector<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(K) * N), bias(N),
        C(static_cast<size_t>(M) * N);
    for (auto* v : {&A, &B, &bias, &C})
      for (auto& x : *v) x = u(rng);
    for (int mode = 0; mode < 3; ++mode) {  // 0: zero init, 1: bias, 2: accumulate into C
      std::vector<float> want = C, got = C;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          float s = mode == 2 ? want[i * N + j] : (mode == 1 ? bias[j] : 0.0f);
          for (int k = 0; k < K; ++k) s += A[i * K + k] * B[k * N + j];
          want[i * N + j] = s;
        }
      Gemm(A.data(), B.data(), mode == 1 ? bias.data() : nullptr, got.data(), M, K, N, mode == 2);
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << M << "x" << K << "x" << N << " mode " << mode;
    }
  }
}

// GemmTransB over a matrix stored transposed has the bits of Gemm over the matrix itself, at
// shapes with and without edge columns and row tiles, and a K longer than its 64-column blocks.
TEST(KernelsTest, GemmTransBBitIdenticalToGemmOverTheTranspose) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto [M, K, N] :
       {std::tuple{1, 1, 1}, {7, 5, 3}, {6, 33, 16}, {13, 130, 47}, {16, 64, 96}, {2, 200, 35}}) {
    std::vector<float> A(static_cast<size_t>(M) * K), Bt(static_cast<size_t>(N) * K), B(Bt.size()),
        want(static_cast<size_t>(M) * N), got(want.size(), 7.0f);
    for (auto* v : {&A, &Bt})
      for (auto& x : *v) x = u(rng);
    Transpose(Bt.data(), B.data(), N, K);
    Gemm(A.data(), B.data(), nullptr, want.data(), M, K, N, false);
    GemmTransB(A.data(), Bt.data(), got.data(), M, K, N);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
        << M << "x" << K << "x" << N;
  }
}

TEST(KernelsTest, TransposeRoundTrip) {
  std::vector<float> a(37 * 70), t(a.size()), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  Transpose(a.data(), t.data(), 37, 70);
  EXPECT_EQ(t[5 * 37 + 3], a[3 * 70 + 5]);
  Transpose(t.data(), b.data(), 70, 37);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace zps::train::kernels
