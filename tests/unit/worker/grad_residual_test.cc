// Error feedback of block-quantized gradient pushes (worker/src/grad_residual.h): over many
// pushes, what the shards receive (the dequantized pieces) sums to the true gradients' sum
// within one block-quantum, for int8 and int4, and without the feedback it does not; each piece
// decodes on its own; Reset zeroes the residuals.
#include "grad_residual.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "zps/common/grad_quant.h"
#include "zps/testing/status_matchers.h"

namespace zps::worker {
namespace {

// Pieces of a range as a push splits it: two blocks and a bit, a short one, a long one.
const std::vector<uint64_t> kPieces = {2 * kGradQuantBlock + 100, 300, 3 * kGradQuantBlock};

uint64_t Elems() { return std::accumulate(kPieces.begin(), kPieces.end(), uint64_t{0}); }

size_t Bytes(DType dt) {
  size_t n = 0;
  for (uint64_t p : kPieces) n += PushBytes(dt, p);
  return n;
}

// Decodes each piece on its own and adds it to `sum`.
void DecodeAdd(DType dt, std::span<const std::byte> encoded, std::vector<double>& sum) {
  const QuantFormat f = GradQuantFormat(dt);
  uint64_t at = 0;
  size_t byte_at = 0;
  std::vector<float> out;
  for (uint64_t n : kPieces) {
    const size_t nb = PushBytes(dt, n);
    out.assign(n, 0.0f);
    DequantizeBlocks(f, encoded.subspan(byte_at, nb), out);
    for (uint64_t i = 0; i < n; ++i) sum[at + i] += out[i];
    at += n;
    byte_at += nb;
  }
}

// The quantum of a block of values `x` (absmax / the largest code).
double Quantum(DType dt, std::span<const float> x) {
  float m = 0.0f;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m / (dt == DType::kI4Block ? 7.0 : 127.0);
}

class GradResidualsTest : public ::testing::TestWithParam<DType> {};

TEST_P(GradResidualsTest, PushedSumStaysWithinOneQuantumOfTheTrueSum) {
  const DType dt = GetParam();
  GradResiduals with(dt), without(dt, /*feedback=*/false);
  const uint64_t n = Elems();
  std::vector<double> truth(n, 0.0), got(n, 0.0), got_without(n, 0.0);
  std::vector<std::byte> encoded(Bytes(dt));
  std::mt19937 rng(3);
  // A small steady signal under larger noise: a per-step quantizer rounds much of the signal
  // away, and only the feedback gets it through over the steps.
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> g(n);
  double max_quantum = 0.0;
  constexpr int kSteps = 300;
  for (int step = 0; step < kSteps; ++step) {
    for (uint64_t i = 0; i < n; ++i) {
      g[i] = 0.02f * static_cast<float>(i % 7) + noise(rng);
      truth[i] += g[i];
    }
    ASSERT_THAT(with.Encode(5, 0, g, kPieces, encoded), IsOk());
    DecodeAdd(dt, encoded, got);
    ASSERT_THAT(without.Encode(5, 0, g, kPieces, encoded), IsOk());
    DecodeAdd(dt, encoded, got_without);
  }
  // The residual is what is still owed: truth - got, exactly as far as fp32 sums go, and one
  // block-quantum at most (of the last push's values g + r, whose absmax the noise bounds).
  const std::vector<float> r = with.Residual(5, 0, n);
  ASSERT_EQ(r.size(), n);
  uint64_t at = 0;
  double worst = 0.0, worst_without = 0.0;
  for (uint64_t len : kPieces) {
    for (uint64_t b = 0; b < len; b += kGradQuantBlock) {
      const uint64_t e = std::min<uint64_t>(len, b + kGradQuantBlock);
      std::vector<float> last(g.begin() + at + b, g.begin() + at + e);
      for (uint64_t i = 0; i < last.size(); ++i) last[i] += r[at + b + i];
      const double q = Quantum(dt, last);
      max_quantum = std::max(max_quantum, q);
      for (uint64_t i = at + b; i < at + e; ++i) {
        const double err = std::fabs(truth[i] - got[i]);
        // fp32 sums of ~300 terms of O(1): allow their rounding beside the quantum.
        EXPECT_LE(err, q + 1e-3) << "element " << i;
        worst = std::max(worst, err);
        worst_without = std::max(worst_without, std::fabs(truth[i] - got_without[i]));
      }
    }
    at += len;
  }
  // Without feedback the rounding errors add up over the steps (a random walk of kSteps terms).
  EXPECT_GT(worst_without, 4 * max_quantum) << "worst with feedback " << worst;
}

TEST_P(GradResidualsTest, EachPieceDecodesOnItsOwnAndResetZeroes) {
  const DType dt = GetParam();
  GradResiduals res(dt);
  const uint64_t n = Elems();
  std::vector<float> g(n);
  for (uint64_t i = 0; i < n; ++i) g[i] = std::sin(static_cast<float>(i)) * (1 + i % 5);
  std::vector<std::byte> encoded(Bytes(dt));
  ASSERT_THAT(res.Encode(1, 64, g, kPieces, encoded), IsOk());
  // The first push has no residual: each piece is QuantizeBlocks of its own values.
  uint64_t at = 0;
  size_t byte_at = 0;
  for (uint64_t len : kPieces) {
    std::vector<std::byte> alone(PushBytes(dt, len));
    QuantizeBlocks(GradQuantFormat(dt), std::span<const float>(g).subspan(at, len), alone);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), encoded.begin() + byte_at))
        << "piece at " << at;
    at += len;
    byte_at += alone.size();
  }
  std::vector<float> r = res.Residual(1, 64, n);
  EXPECT_TRUE(std::any_of(r.begin(), r.end(), [](float v) { return v != 0.0f; }));
  EXPECT_TRUE(res.Residual(1, 0, n).empty());  // another range
  res.Reset();
  r = res.Residual(1, 64, n);
  EXPECT_TRUE(std::all_of(r.begin(), r.end(), [](float v) { return v == 0.0f; }));
  // After Reset a push encodes as a first one does.
  std::vector<std::byte> again(encoded.size());
  ASSERT_THAT(res.Encode(1, 64, g, kPieces, again), IsOk());
  EXPECT_EQ(again, encoded);
}

TEST_P(GradResidualsTest, LengthsThatDoNotAddUpAreRefused) {
  const DType dt = GetParam();
  GradResiduals res(dt);
  std::vector<float> g(Elems(), 1.0f);
  std::vector<std::byte> encoded(Bytes(dt));
  EXPECT_THAT(res.Encode(0, 0, std::span<const float>(g).first(g.size() - 1), kPieces, encoded),
              StatusIs(Code::kInvalidArgument));
  std::vector<std::byte> short_out(encoded.size() - 1);
  EXPECT_THAT(res.Encode(0, 0, g, kPieces, short_out), StatusIs(Code::kInvalidArgument));
  EXPECT_TRUE(res.Residual(0, 0, g.size()).empty());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GradResidualsTest,
                         ::testing::Values(DType::kI8Block, DType::kI4Block),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return i.param == DType::kI8Block ? "int8" : "int4";
                         });

}  // namespace
}  // namespace zps::worker
