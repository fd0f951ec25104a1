// Quantized weights in the Prefetcher and the quantized pieces of zps/worker/quantized_pieces.h:
// bandwidth-centric ranks (threads of one process, a real in-process all-gather among them)
// all-gather their slices as the serving copy's block records and dequantize after the gather,
// which gives a direct fetch's bits, with about a quarter of the fp32 all-gather's bytes; and
// with keep_quantized the buffers stay block records that dequantize to those same bits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/block_quant.h"
#include "zps/common/serving_quant.h"
#include "zps/testing/status_matchers.h"
#include "zps/worker/collectives.h"
#include "zps/worker/param_source.h"
#include "zps/worker/prefetcher.h"
#include "zps/worker/quantized_pieces.h"

namespace zps::worker {
namespace {

constexpr DType kWire = DType::kI8Block;

// Parameters of odd sizes on 1088-element chunks (4.25 blocks: every chunk's last block is short;
// parameters start 64-aligned, so pieces start inside 256-element blocks), fetched
// from a serving copy quantized per chunk as a shard's is. `quantized` false serves the same
// values (the dequantized copy) as fp32 on the wire: the all-gather of fp32 slices, the
// reference for the bytes.
class QuantSource : public ParamSource {
 public:
  explicit QuantSource(bool quantized) : quantized_(quantized) {
    std::vector<ParamSpec> specs;
    for (uint64_t n : {700u, 1u, 2500u, 333u, 64u, 1531u, 40000u, 30001u}) {
      specs.push_back({"p" + std::to_string(specs.size()), {static_cast<int64_t>(n)}});
    }
    layout_ = *Layout::Build(std::move(specs), {.chunk_elems = 1088});
    const QuantFormat f = ServingQuantFormat(kWire);
    for (uint32_t c = 0; c < layout_.num_chunks(); ++c) {
      const uint64_t n = layout_.chunk_size(c);
      std::vector<float> master(n);
      for (uint64_t i = 0; i < n; ++i) {
        // Blocks of zeros, of tiny and of huge values, and one with a NaN.
        const uint64_t g = c * 1088 + i;
        master[i] = g / 256 == 1   ? 0.0f
                    : g / 256 == 2 ? std::ldexp(float(int(i % 7) - 3), -121)
                    : g / 256 == 3 ? std::numeric_limits<float>::max() / float(1 + i % 5)
                    : g == 1500    ? std::numeric_limits<float>::quiet_NaN()
                                   : std::sin(float(g)) * float(1 + g % 3);
      }
      copies_.emplace_back(QuantizedBytes(f, n));
      QuantizeBlocks(f, master, copies_.back());
    }
  }

  const Layout& layout() const override { return layout_; }
  DType serving_dtype() const override { return DType::kF32; }
  DType wire_dtype() const override { return quantized_ ? kWire : DType::kF32; }
  std::chrono::milliseconds op_timeout() const override { return std::chrono::seconds(30); }
  FetchOp FetchAsync(uint32_t param, int64_t min_version) override {
    return FetchAsync(param, 0, layout_.param_numel(param), min_version);
  }
  // The values, dequantized piece by piece (as the Client does).
  FetchOp FetchAsync(uint32_t param, uint64_t begin, uint64_t length,
                     int64_t min_version) override {
    auto q = Quantized(param, begin, length, min_version);
    auto out = Buffer(param, begin, min_version, DType::kF32, length * sizeof(float));
    EXPECT_THAT(DequantizeBuffer(*q, DType::kF32, out->memory.data()), IsOk());
    return Done(out);
  }
  FetchOp FetchQuantizedAsync(uint32_t param, uint64_t begin, uint64_t length,
                              int64_t min_version) override {
    if (!quantized_) return ParamSource::FetchQuantizedAsync(param, begin, length, min_version);
    ++quantized_fetches;
    return Done(Quantized(param, begin, length, min_version));
  }

  std::atomic<int> quantized_fetches{0};

 private:
  static std::shared_ptr<ParamBuffer> Buffer(uint32_t param, uint64_t begin, int64_t version,
                                             DType dtype, size_t bytes) {
    auto mem = std::make_shared<std::vector<std::byte>>(bytes);
    auto b = std::make_shared<ParamBuffer>();
    b->param = param;
    b->begin = begin;
    b->version = version;
    b->dtype = dtype;
    b->memory = DeviceBuffer(mem->data(), mem->size(), [mem](std::byte*) mutable { mem.reset(); });
    return b;
  }
  static FetchOp Done(std::shared_ptr<ParamBuffer> b) {
    FetchPromise p(b->param);
    p.Set(std::move(b));
    return p.op();
  }
  // The covering blocks of each piece, copied out of the chunks' serving copies.
  std::shared_ptr<ParamBuffer> Quantized(uint32_t param, uint64_t begin, uint64_t length,
                                         int64_t version) {
    auto pieces = QuantizedPieces(layout_, kWire, param, begin, length);
    EXPECT_THAT(pieces, IsOk());
    auto b = Buffer(param, begin, version, kWire, QuantizedPiecesBytes(*pieces));
    auto lp = *layout_.Pieces(param, begin, length);
    for (size_t i = 0; i < lp.size(); ++i) {
      const QuantRange r =
          ServingRange(kWire, layout_.chunk_size(lp[i].chunk), lp[i].chunk_offset, lp[i].length);
      std::memcpy(b->memory.data() + (*pieces)[i].offset, copies_[lp[i].chunk].data() + r.offset,
                  r.bytes);
    }
    b->pieces = std::move(*pieces);
    return b;
  }

  bool quantized_;
  Layout layout_;
  std::vector<std::vector<std::byte>> copies_;  // per chunk
};

// `world` ranks in one process: an all-gather waits for every rank's block, then each copies
// all of them.
class Hub {
 public:
  explicit Hub(uint32_t world) : world_(world), blocks_(world) {}
  Status AllGather(uint32_t rank, std::span<std::byte> inout, size_t block) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t round = round_;
    blocks_[rank].assign(inout.begin() + rank * block, inout.begin() + (rank + 1) * block);
    if (++arrived_ == world_) {
      arrived_ = 0;
      done_ = blocks_;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    for (uint32_t q = 0; q < world_; ++q) {
      if (done_[q].size() != block) return InvalidArgument("ranks gather different sizes");
      std::memcpy(inout.data() + q * block, done_[q].data(), block);
    }
    return Status::Ok();
  }

 private:
  const uint32_t world_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t arrived_ = 0;
  uint64_t round_ = 0;
  std::vector<std::vector<std::byte>> blocks_, done_;
};

class HubRank : public Collectives {
 public:
  HubRank(Hub* hub, uint32_t rank, uint32_t world) : hub_(hub), rank_(rank), world_(world) {}
  uint32_t rank() const override { return rank_; }
  uint32_t world_size() const override { return world_; }
  Status ReduceScatter(std::span<float>) override { return Unimplemented("not used"); }
  Status AllReduce(std::span<float>) override { return Unimplemented("not used"); }
  Status AllGather(std::span<std::byte> inout, size_t block_bytes) override {
    if (inout.size() != world_ * block_bytes) return InvalidArgument("not world blocks");
    return hub_->AllGather(rank_, inout, block_bytes);
  }

 private:
  Hub* hub_;
  uint32_t rank_, world_;
};

struct RankResult {
  std::vector<std::vector<std::byte>> values;  // step 1's fp32 bytes, per parameter
  PrefetchStats stats;
};

// `world` ranks acquire every parameter (one group each) for 2 steps: step 0 records the plan,
// step 1 gathers it. Returns each rank's step-1 values as fp32 (dequantized from kept buffers).
std::vector<RankResult> RunRanks(uint32_t world, bool quantized, bool keep_quantized) {
  QuantSource src(quantized);
  Hub hub(world);
  std::vector<RankResult> out(world);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      HubRank comm(&hub, r, world);
      Prefetcher p(&src, {.prefetch_bytes = 0, .gather = &comm, .keep_quantized = keep_quantized});
      for (int64_t step = 0; step < 2; ++step) {
        p.BeginStep(step);
        for (uint32_t id = 0; id < src.layout().num_params(); ++id) {
          auto got = p.Acquire({&id, 1});
          ASSERT_THAT(got, IsOk());
          const ParamBuffer& b = *(*got)[0];
          if (step == 1) {
            std::vector<std::byte> v(src.layout().param_numel(id) * sizeof(float));
            if (IsBlockQuantized(b.dtype)) {
              EXPECT_TRUE(keep_quantized);
              EXPECT_THAT(DequantizeBuffer(b, DType::kF32, v.data()), IsOk());
            } else {
              EXPECT_EQ(b.bytes().size(), v.size());
              std::memcpy(v.data(), b.bytes().data(), v.size());
            }
            out[r].values.push_back(std::move(v));
          }
          p.Release({&id, 1});
        }
        ASSERT_THAT(p.EndStep(), IsOk());
      }
      out[r].stats = p.stats();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// What a direct fetch gives: each parameter whole, dequantized by the source.
std::vector<std::vector<std::byte>> Direct() {
  QuantSource src(true);
  std::vector<std::vector<std::byte>> out;
  for (uint32_t id = 0; id < src.layout().num_params(); ++id) {
    auto b = src.FetchAsync(id, 0).Wait(src.op_timeout());
    EXPECT_THAT(b, IsOk());
    out.emplace_back((*b)->bytes().begin(), (*b)->bytes().end());
  }
  return out;
}

TEST(QuantizedPieces, CoverEachLayoutPieceBackToBack) {
  QuantSource src(true);
  // p2 (2500 elements) spans three chunks.
  auto all = QuantizedPieces(src.layout(), kWire, 2, 0, 2500);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(QuantizedPiecesElems(*all), 2500u);
  uint64_t at = 0;
  for (const QuantPiece& p : *all) {
    EXPECT_EQ(p.offset, at);
    EXPECT_LT(p.skip, kWeightQuantBlock);
    at += p.bytes;
  }
  EXPECT_EQ(QuantizedPiecesBytes(*all), at);
  EXPECT_THAT(QuantizedPieces(src.layout(), DType::kBF16, 2, 0, 10),
              StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(QuantizedPieces(src.layout(), kWire, 2, 2000, 600), StatusIs(Code::kOutOfRange));
  EXPECT_THAT(QuantizedPieces(src.layout(), kWire, 9, 0, 0), StatusIs(Code::kOutOfRange));
}

TEST(QuantizedPieces, DequantizeBufferRefusesPiecesOutsideTheBuffer) {
  QuantSource src(true);
  auto b = src.FetchQuantizedAsync(2, 0, 2500, 0).Wait(src.op_timeout());
  ASSERT_THAT(b, IsOk());
  std::vector<float> out(2500);
  ASSERT_THAT(DequantizeBuffer(**b, DType::kF32, out.data()), IsOk());
  ParamBuffer bad;
  bad.dtype = kWire;
  bad.pieces = (*b)->pieces;
  bad.pieces.back().bytes += 1;  // one byte past the buffer's end
  auto mem = std::make_shared<std::vector<std::byte>>((*b)->bytes().begin(), (*b)->bytes().end());
  bad.memory = DeviceBuffer(mem->data(), mem->size(), [mem](std::byte*) mutable { mem.reset(); });
  EXPECT_THAT(DequantizeBuffer(bad, DType::kF32, out.data()), StatusIs(Code::kDataLoss));
  bad.dtype = DType::kBF16;
  EXPECT_THAT(DequantizeBuffer(bad, DType::kF32, out.data()), StatusIs(Code::kInvalidArgument));
}

TEST(QuantizedGather, BandwidthCentricGathersBlockRecordsAndGivesADirectFetchsBits) {
  const auto direct = Direct();
  for (uint32_t world : {2u, 3u}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const auto q = RunRanks(world, /*quantized=*/true, /*keep_quantized=*/false);
    const auto f = RunRanks(world, /*quantized=*/false, /*keep_quantized=*/false);
    for (uint32_t r = 0; r < world; ++r) {
      EXPECT_EQ(q[r].stats.gathers, direct.size());
      ASSERT_EQ(q[r].values.size(), direct.size());
      for (size_t id = 0; id < direct.size(); ++id) {
        EXPECT_EQ(q[r].values[id], direct[id]) << "parameter " << id << " on rank " << r;
        EXPECT_EQ(f[r].values[id], direct[id]) << "parameter " << id << " on rank " << r;
      }
      // Block records (1 + 4/256 bytes an element, plus the blocks a slice boundary shares)
      // against fp32's 4: about a quarter.
      EXPECT_GT(q[r].stats.gather_bytes, 0u);
      EXPECT_LT(q[r].stats.gather_bytes * 10, f[r].stats.gather_bytes * 3)
          << q[r].stats.gather_bytes << " against " << f[r].stats.gather_bytes;
    }
  }
}

TEST(QuantizedGather, KeptQuantizedBuffersDequantizeToADirectFetchsBits) {
  const auto direct = Direct();
  const auto q = RunRanks(3, /*quantized=*/true, /*keep_quantized=*/true);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(q[r].stats.gathers, direct.size());
    for (size_t id = 0; id < direct.size(); ++id) {
      EXPECT_EQ(q[r].values[id], direct[id]) << "parameter " << id << " on rank " << r;
    }
  }
}

}  // namespace
}  // namespace zps::worker
