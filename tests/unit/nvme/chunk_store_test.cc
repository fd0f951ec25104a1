// ChunkStore tests: placement, bit-identity of a spilled store with a RAM-only one under the same
// optimizer updates, single-chunk access, and fault handling (fault-injecting engine, disk full).
#include "zps/server/chunk_store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "zps/server/optimizer.h"
#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using zps::testing::SpillDir;

// Sizes chosen to exercise padding (not multiples of 1024) and multi-piece records.
// Repeated four times (32 chunks, ~35 MB of state) so the data outweighs the pipeline buffers.
const std::vector<uint64_t> kChunks = [] {
  std::vector<uint64_t> v;
  for (int r = 0; r < 4; ++r) {
    for (uint64_t n : {100000, 65536, 3, 250000, 77777, 131072, 1, 99999}) v.push_back(n);
  }
  return v;
}();

ChunkStoreOptions SmallOptions(const std::string& prefix, uint64_t budget, uint64_t serving) {
  ChunkStoreOptions o;
  o.spill_dir = SpillDir();
  // One name per process: ctest -j runs the cases (each a process) side by side in one dir.
  o.file_prefix = prefix + "-" + std::to_string(::getpid());
  o.memory_budget = budget;
  o.serving_memory_budget = serving;
  o.io_bytes = 64 << 10;
  o.queue_depth = 8;
  return o;
}

float Grad(uint32_t c, int64_t step, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u + c * 40503u + step * 9973u);
  return (static_cast<float>(h % 2001) - 1000.0f) * 1e-4f;
}

// Runs `steps` AdamW updates (with an init pass) over `ids` in the given order.
void Train(ChunkStore& store, const Optimizer& opt, std::span<const uint32_t> ids, int steps) {
  PassOptions init;
  init.read_state = false;
  init.serving = true;
  ASSERT_TRUE(store
                  .ForEachChunk(ids, init,
                                [](uint32_t c, const ChunkSpans& s) {
                                  for (size_t i = 0; i < s.state.master.size(); ++i) {
                                    s.state.master[i] = 0.01f * static_cast<float>((i + c) % 97);
                                    s.serving[i] = 0;
                                  }
                                  std::fill(s.state.m.begin(), s.state.m.end(), std::byte{0});
                                  std::fill(s.state.v.begin(), s.state.v.end(), std::byte{0});
                                  return Status::Ok();
                                })
                  .ok());
  std::vector<float> g;
  for (int64_t step = 1; step <= steps; ++step) {
    PassOptions pass;
    pass.serving = true;
    Status st = store.ForEachChunk(ids, pass, [&](uint32_t c, const ChunkSpans& s) {
      g.resize(s.state.master.size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(c, step, i);
      UpdateParams p;
      p.step = step;
      p.out16 = s.serving;
      p.out_dtype = DType::kBF16;
      return opt.Update(s.state, GradView{g.data(), DType::kF32, g.size()}, p);
    });
    ASSERT_THAT(st, IsOk());
  }
}

// fp32 moments (the store's default state dtype) as the packed bytes the store takes.
std::span<std::byte> B(std::vector<float>& v) { return std::as_writable_bytes(std::span(v)); }

struct Snapshot {
  std::vector<float> master, m, v;
  std::vector<uint16_t> serving;
};

Snapshot Read(ChunkStore& store, uint32_t c) {
  Snapshot s;
  const size_t n = store.chunk_elems(c);
  s.master.resize(n), s.m.resize(n), s.v.resize(n), s.serving.resize(n);
  EXPECT_THAT(store.ReadChunk(c, s.master, B(s.m), B(s.v)), IsOk());
  EXPECT_THAT(store.ReadServing(c, s.serving), IsOk());
  return s;
}

bool Same(const Snapshot& a, const Snapshot& b) {
  auto eq = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  return eq(a.master, b.master) && eq(a.m, b.m) && eq(a.v, b.v) && eq(a.serving, b.serving);
}

std::unique_ptr<Optimizer> MakeOptimizer() {
  OptimizerConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.01f;
  auto opt = Optimizer::Create(cfg, nullptr);
  EXPECT_THAT(opt, IsOk());
  return std::move(*opt);
}

TEST(ChunkStore, PlacementFollowsBudgets) {
  auto all = ChunkStore::Create(SmallOptions("cs-place-a", 1ull << 30, 1ull << 30), kChunks);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ((*all)->stats().state_resident, kChunks.size());
  EXPECT_EQ((*all)->stats().state_file_bytes, 0u);

  // Buffers: 5 slots x largest record (250000 x 4 -> 1003520 B x 3 arrays).
  const uint64_t bufs = 5 * 3 * AlignUp(250000 * 4);
  const uint64_t budget = bufs + 3 * AlignUp(100000 * 4) + 3 * 4096;
  auto some = ChunkStore::Create(SmallOptions("cs-place-b", budget, 0), kChunks);
  ASSERT_FALSE(some.ok());  // serving budget 0 cannot hold its buffers
  EXPECT_EQ(some.status().code(), Code::kResourceExhausted);
  some = ChunkStore::Create(SmallOptions("cs-place-b", budget, 5 * AlignUp(250000 * 2)), kChunks);
  ASSERT_THAT(some, IsOk());
  auto st = (*some)->stats();
  EXPECT_TRUE((*some)->state_resident(0));
  EXPECT_FALSE((*some)->state_resident(1));
  EXPECT_TRUE((*some)->state_resident(2));  // 3 elements still fit after chunk 0
  EXPECT_EQ(st.serving_resident, 0u);
  EXPECT_GT(st.state_file_bytes, 0u);

  auto tiny = ChunkStore::Create(SmallOptions("cs-place-c", 1 << 20, 1 << 30), kChunks);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), Code::kResourceExhausted);
  EXPECT_NE(tiny.status().message().find("memory_budget"), std::string::npos);
}

// The core guarantee: the same updates give bit-identical state whether chunks live in RAM or on
// disk, in any pass order and with any pipeline depth.
TEST(ChunkStore, SpilledMatchesRamBitForBit) {
  auto opt = MakeOptimizer();
  std::vector<uint32_t> ids(kChunks.size());
  std::iota(ids.begin(), ids.end(), 0u);
  auto ram = ChunkStore::Create(SmallOptions("cs-ram", 1ull << 30, 1ull << 30), kChunks);
  ASSERT_THAT(ram, IsOk());
  Train(**ram, *opt, ids, 4);

  const uint64_t bufs = 5 * 3 * AlignUp(250000 * 4), sbufs = 5 * AlignUp(250000 * 2);
  for (int variant = 0; variant < 3; ++variant) {
    auto o = SmallOptions("cs-spill", bufs + (1 << 20), sbufs + (64 << 10));
    if (variant == 1) o.read_ahead = o.write_behind = 1, o.queue_depth = 2, o.io_bytes = 32 << 10;
    if (variant == 2) o.register_buffers = true, o.io_bytes = 1 << 20;
    auto spill = ChunkStore::Create(o, kChunks);
    ASSERT_THAT(spill, IsOk());
    EXPECT_GE((*spill)->stats().chunks - (*spill)->stats().state_resident, 5u);
    std::vector<uint32_t> order = ids;
    if (variant == 1) std::reverse(order.begin(), order.end());
    Train(**spill, *opt, order, 4);
    for (uint32_t c : ids) {
      EXPECT_TRUE(Same(Read(**ram, c), Read(**spill, c)))
          << "variant " << variant << " chunk " << c;
    }
    EXPECT_GT((*spill)->stats().bytes_read, 0u);
  }
}

// Only the serving copies spill (the shard's --serving-budget without --memory-budget): no state
// file and no state pipeline buffers; resident serving records live in the caller's memory.
TEST(ChunkStore, ServingAloneSpillsIntoCallerMemory) {
  auto opt = MakeOptimizer();
  std::vector<uint32_t> ids(kChunks.size());
  std::iota(ids.begin(), ids.end(), 0u);
  auto ram = ChunkStore::Create(SmallOptions("cs-sv-ram", 1ull << 30, 1ull << 30), kChunks);
  ASSERT_THAT(ram, IsOk());
  Train(**ram, *opt, ids, 3);

  const uint64_t sbufs = 5 * AlignUp(250000 * 2);
  auto o = SmallOptions("cs-sv-spill", 1ull << 30, sbufs + AlignUp(100000 * 2));
  std::vector<std::byte> mem;
  o.serving_ram_alloc = [&](size_t bytes) -> Result<std::span<std::byte>> {
    mem.resize(bytes + 64);
    auto base = reinterpret_cast<uintptr_t>(mem.data());
    return std::span<std::byte>(mem.data() + ((base + 63) / 64 * 64 - base), bytes);
  };
  auto spill = ChunkStore::Create(o, kChunks);
  ASSERT_THAT(spill, IsOk());
  const ChunkStoreStats st = (*spill)->stats();
  EXPECT_EQ(st.state_resident, kChunks.size());
  EXPECT_EQ(st.state_file_bytes, 0u);
  EXPECT_EQ(st.serving_resident, 1u);  // chunk 0 only
  EXPECT_EQ(st.serving_buffer_bytes, sbufs);
  EXPECT_EQ(st.buffer_bytes, sbufs);  // no state pipeline buffers
  ASSERT_EQ(mem.size(), AlignUp(100000 * 2) + 64);
  const std::span<uint16_t> r0 = (*spill)->ResidentServing(0);
  ASSERT_EQ(r0.size(), 100000u);
  EXPECT_GE(reinterpret_cast<std::byte*>(r0.data()), mem.data());
  EXPECT_LT(reinterpret_cast<std::byte*>(r0.data()), mem.data() + mem.size());
  EXPECT_TRUE((*spill)->ResidentServing(1).empty());
  EXPECT_TRUE((*spill)->ResidentServing(999).empty());

  Train(**spill, *opt, ids, 3);
  EXPECT_GT((*spill)->stats().serving_bytes_written, 0u);
  for (uint32_t c : ids) {
    EXPECT_TRUE(Same(Read(**ram, c), Read(**spill, c))) << "chunk " << c;
  }
  const ChunkStoreStats after = (*spill)->stats();
  EXPECT_GT(after.serving_bytes_read, 0u);
  EXPECT_EQ(after.bytes_read, after.serving_bytes_read);  // no state was read from disk
  // The resident record is the memory the pass wrote: it matches ReadServing.
  std::vector<uint16_t> copy(100000);
  ASSERT_THAT((*spill)->ReadServing(0, copy), IsOk());
  EXPECT_TRUE(std::equal(copy.begin(), copy.end(), r0.begin()));
}

TEST(ChunkStore, SingleChunkRoundTripAndBadArguments) {
  const uint64_t bufs = 5 * 3 * AlignUp(250000 * 4), sbufs = 5 * AlignUp(250000 * 2);
  auto s = ChunkStore::Create(SmallOptions("cs-single", bufs, sbufs), kChunks);
  ASSERT_THAT(s, IsOk());
  ChunkStore& store = **s;
  const uint32_t c = 3;
  ASSERT_FALSE(store.state_resident(c));
  std::vector<float> a(kChunks[c]), b(kChunks[c]), d(kChunks[c]);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 1.0f * i, b[i] = -2.0f * i, d[i] = 0.5f * i;
  ASSERT_THAT(store.WriteChunk(c, a, B(b), B(d)), IsOk());
  std::vector<uint16_t> sv(kChunks[c], 0x3f80);
  ASSERT_THAT(store.WriteServing(c, sv), IsOk());
  Snapshot got = Read(store, c);
  EXPECT_EQ(got.master, a);
  EXPECT_EQ(got.m, b);
  EXPECT_EQ(got.v, d);
  EXPECT_EQ(got.serving, sv);
  EXPECT_EQ(store.ReadChunk(c, a, B(b), {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(store.ReadServing(99, sv).code(), Code::kInvalidArgument);
  const uint32_t rep[] = {1, 2, 1};
  bool called = false;
  EXPECT_EQ(store
                .ForEachChunk(rep, {},
                              [&](uint32_t, const ChunkSpans&) {
                                called = true;
                                return Status::Ok();
                              })
                .code(),
            Code::kInvalidArgument);
  EXPECT_FALSE(called);
}

// VisitMaster hands fn the master a WriteChunk stored, of a resident chunk in place and of a
// spilled one read back alone: the record's master bytes, not its moments.
TEST(ChunkStore, VisitMasterReadsTheMasterAlone) {
  const uint64_t bufs = 5 * 3 * AlignUp(250000 * 4), sbufs = 5 * AlignUp(250000 * 2);
  auto s =
      ChunkStore::Create(SmallOptions("cs-master", bufs + 3 * AlignUp(100000 * 4), sbufs), kChunks);
  ASSERT_THAT(s, IsOk());
  ChunkStore& store = **s;
  ASSERT_TRUE(store.state_resident(0));
  for (uint32_t c : {0u, 3u, 4u}) {
    const uint32_t spilled = store.state_resident(c) ? 0 : 1;
    ASSERT_EQ(spilled, c == 0 ? 0u : 1u) << "chunk " << c;
    std::vector<float> a(kChunks[c]), m(kChunks[c], 7.0f), v(kChunks[c], 9.0f);
    for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) + c;
    ASSERT_THAT(store.WriteChunk(c, a, B(m), B(v)), IsOk());
    const uint64_t before = store.stats().bytes_read;
    std::vector<float> got;
    ASSERT_THAT(
        store.VisitMaster(c, [&](std::span<const float> x) { got.assign(x.begin(), x.end()); }),
        IsOk());
    EXPECT_EQ(got, a) << "chunk " << c;
    EXPECT_EQ(store.stats().bytes_read - before, spilled * AlignUp(kChunks[c] * 4))
        << "chunk " << c;
  }
  bool called = false;
  EXPECT_EQ(store.VisitMaster(99, [&](std::span<const float>) { called = true; }).code(),
            Code::kInvalidArgument);
  EXPECT_FALSE(called);
}

// Wraps the real engine; fails chosen requests (by op and ordinal) with a given result.
class FaultEngine final : public IoEngine {
 public:
  FaultEngine(std::unique_ptr<IoEngine> inner, IoRequest::Op op, int nth, int32_t res)
      : inner_(std::move(inner)), op_(op), nth_(nth), res_(res) {}
  uint32_t depth() const override { return inner_->depth(); }
  uint32_t in_flight() const override { return inner_->in_flight(); }
  Status Push(const IoRequest& req) override {
    IoRequest r = req;
    r.tag = next_id_++;
    const bool fail = req.op == op_ && count_[static_cast<int>(req.op)]++ == nth_;
    orig_[r.tag] = {req.tag, fail};
    return inner_->Push(r);
  }
  Status Flush() override { return inner_->Flush(); }
  Result<IoCompletion> Wait() override {
    ZPS_ASSIGN_OR_RETURN(IoCompletion c, inner_->Wait());
    auto [tag, fail] = orig_.at(c.tag);
    orig_.erase(c.tag);
    c.tag = tag;
    if (fail) c.res = res_;
    return c;
  }

 private:
  std::unique_ptr<IoEngine> inner_;
  IoRequest::Op op_;
  int nth_;
  int32_t res_;
  int count_[2] = {0, 0};
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::pair<uint64_t, bool>> orig_;
};

struct FaultCase {
  IoRequest::Op op;
  int nth;
  int32_t res;
  Code want;
};

class ChunkStoreFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(ChunkStoreFaultTest, ErrorIsClearAndNothingIsSilentlyWrong) {
  const FaultCase fc = GetParam();
  auto opt = MakeOptimizer();
  std::vector<uint32_t> ids(kChunks.size());
  std::iota(ids.begin(), ids.end(), 0u);
  const uint64_t bufs = 5 * 3 * AlignUp(250000 * 4), sbufs = 5 * AlignUp(250000 * 2);
  auto o = SmallOptions("cs-fault", bufs, sbufs);  // everything spilled
  bool armed = false;
  o.wrap_engine = [&](std::unique_ptr<IoEngine> e) -> std::unique_ptr<IoEngine> {
    armed = true;
    return std::make_unique<FaultEngine>(std::move(e), fc.op, fc.nth, fc.res);
  };
  auto s = ChunkStore::Create(o, kChunks);
  ASSERT_THAT(s, IsOk());
  ASSERT_TRUE(armed);
  ChunkStore& store = **s;
  // Reference: values written one chunk at a time do not go through the fault (writes are
  // counted, so the write cases use a large ordinal that the pass below reaches).
  std::vector<Snapshot> before;
  PassOptions pass;
  std::vector<uint32_t> visited;
  Status st = store.ForEachChunk(ids, pass, [&](uint32_t c, const ChunkSpans& sp) {
    visited.push_back(c);
    for (auto& x : sp.state.master) x += 1.0f;
    return Status::Ok();
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), fc.want) << st.ToString();
  EXPECT_NE(st.message().find("chunk"), std::string::npos) << st.ToString();
  if (fc.op == IoRequest::Op::kRead) {
    // The chunk whose read failed was not handed to fn and is unchanged (still zero).
    ASSERT_LT(visited.size(), ids.size());
    const uint32_t failed = ids[visited.size()];
    std::vector<float> m(kChunks[failed]), mm(kChunks[failed]), v(kChunks[failed]);
    ASSERT_THAT(store.ReadChunk(failed, m, B(mm), B(v)), IsOk());
    for (float x : m) ASSERT_EQ(x, 0.0f);
    for (uint32_t c : visited) {  // visited chunks were written back: master == 1
      std::vector<float> a(kChunks[c]), b(kChunks[c]), d(kChunks[c]);
      ASSERT_THAT(store.ReadChunk(c, a, B(b), B(d)), IsOk());
      for (float x : a) ASSERT_EQ(x, 1.0f);
    }
  } else {
    // Exactly one record is lost; reading it is DataLoss, and so is a pass over it, until it
    // is rewritten in full.
    int lost = -1;
    for (uint32_t c : ids) {
      std::vector<float> a(kChunks[c]), b(kChunks[c]), d(kChunks[c]);
      Status r = store.ReadChunk(c, a, B(b), B(d));
      if (!r.ok()) {
        EXPECT_EQ(r.code(), Code::kDataLoss) << r.ToString();
        EXPECT_EQ(lost, -1);
        lost = static_cast<int>(c);
      }
    }
    ASSERT_GE(lost, 0);
    const uint32_t one[] = {static_cast<uint32_t>(lost)};
    EXPECT_EQ(store.ForEachChunk(one, {}, [](uint32_t, const ChunkSpans&) { return Status::Ok(); })
                  .code(),
              Code::kDataLoss);
    std::vector<float> a(kChunks[lost], 3.0f), b(kChunks[lost]), d(kChunks[lost]);
    ASSERT_THAT(store.WriteChunk(lost, a, B(b), B(d)), IsOk());
    std::vector<float> a2(kChunks[lost]);
    ASSERT_THAT(store.ReadChunk(lost, a2, B(b), B(d)), IsOk());
    EXPECT_EQ(a2, a);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, ChunkStoreFaultTest,
    ::testing::Values(FaultCase{IoRequest::Op::kRead, 20, -EIO, Code::kIoError},
                      FaultCase{IoRequest::Op::kRead, 30, 4096, Code::kIoError},  // short read
                      FaultCase{IoRequest::Op::kWrite, 25, -EIO, Code::kIoError},
                      FaultCase{IoRequest::Op::kWrite, 40, -ENOSPC, Code::kResourceExhausted}));

// A function error stops the pass without writing the chunk back.
TEST(ChunkStore, FnErrorStopsThePass) {
  const uint64_t bufs = 5 * 3 * AlignUp(250000 * 4), sbufs = 5 * AlignUp(250000 * 2);
  auto s = ChunkStore::Create(SmallOptions("cs-fnerr", bufs, sbufs), kChunks);
  ASSERT_THAT(s, IsOk());
  const uint32_t ids[] = {0, 1, 3, 4};
  int calls = 0;
  Status st = (*s)->ForEachChunk(ids, {}, [&](uint32_t c, const ChunkSpans& sp) {
    ++calls;
    for (auto& x : sp.state.master) x = 5.0f;
    return c == 3 ? InvalidArgument("boom") : Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(calls, 3);
  std::vector<float> a(kChunks[3]), b(kChunks[3]), d(kChunks[3]);
  ASSERT_THAT((*s)->ReadChunk(3, a, B(b), B(d)), IsOk());
  for (float x : a) ASSERT_EQ(x, 0.0f);
  std::vector<float> a1(kChunks[1]), b1(kChunks[1]), d1(kChunks[1]);
  ASSERT_THAT((*s)->ReadChunk(1, a1, B(b1), B(d1)), IsOk());
  for (float x : a1) ASSERT_EQ(x, 5.0f);
}

// A small filesystem made for the test: the spill files do not fit -> ResourceExhausted at
// Create; a store that fits works there (buffered fallback if the filesystem refuses O_DIRECT).
TEST(ChunkStore, DiskFullIsResourceExhausted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs";
  char tmpl[] = "/tmp/zps-nvme-full-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=16m") != 0) {
    ::rmdir(dir.c_str());
    GTEST_SKIP() << "cannot mount tmpfs: " << std::strerror(errno);
  }
  {
    std::vector<uint64_t> big(10, 1 << 20);  // 10 chunks x 12 MiB of state
    ChunkStoreOptions o;
    o.spill_dir = dir;
    o.memory_budget = 5 * 12ull << 20;
    o.serving_memory_budget = 1ull << 30;
    o.allow_buffered_fallback = true;
    auto s = ChunkStore::Create(o, big);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kResourceExhausted) << s.status().ToString();
    EXPECT_NE(s.status().message().find("disk full"), std::string::npos);
    struct stat st {};
    EXPECT_NE(::stat((dir + "/zps-spill-state.zps").c_str(), &st), 0);  // nothing left behind

    std::vector<uint64_t> fits(8, 1 << 16);  // 8 x 768 KiB: 5 buffer slots + 1 in RAM + 7 spilled
    o.memory_budget = 6 * 768ull << 10;
    auto ok = ChunkStore::Create(o, fits);
    ASSERT_THAT(ok, IsOk());
    std::vector<uint32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
    PassOptions pass;
    EXPECT_TRUE((*ok)
                    ->ForEachChunk(ids, pass,
                                   [](uint32_t, const ChunkSpans& sp) {
                                     sp.state.master[0] += 1.0f;
                                     return Status::Ok();
                                   })
                    .ok());
  }
  ::umount2(dir.c_str(), MNT_DETACH);
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace zps::server
