// ReshardCheckpoint and CheckpointWriter::CopyChunk in-process (the multi-process runs are
// tests/integration/reshard/reshard.sh), and the read-only open after a compaction.
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "ckpt_test_util.h"
#include "zps/server/checkpoint.h"
#include "zps/server/checkpoint_catalog.h"
#include "zps/server/checkpoint_reshard.h"
#include "zps/server/optimizer.h"
#include "zps/server/packed_moment.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {
namespace {

namespace fs = std::filesystem;

CheckpointOptions Small() {
  CheckpointOptions o;
  o.slice_bytes = 4096;  // a 1536-element chunk is two slices: the outputs must keep this size
  o.write_buffer_bytes = 4ull << 20;
  return o;
}

JobSpec SmallJob(uint32_t shards, float lr = 1e-3f) {
  JobSpec j;
  j.layout = SmallLayout(shards, 1536);
  j.optimizer.lr = lr;
  return j;
}

// The stores of a job of `shards` shards under `root`/s<i>/checkpoints, with checkpoints of
// `steps` (each chunk's values from MakeChunk, so any store can be checked against them).
std::vector<std::string> MakeJob(const std::string& root, uint32_t shards,
                                 std::initializer_list<int64_t> steps, float lr = 1e-3f) {
  std::vector<std::string> dirs;
  const JobSpec job = SmallJob(shards, lr);
  for (uint32_t s = 0; s < shards; ++s) {
    dirs.push_back(root + "/s" + std::to_string(s) + "/checkpoints");
    fs::create_directories(root + "/s" + std::to_string(s));
    auto store = CheckpointStore::Open(dirs.back(), Small());
    EXPECT_THAT(store, IsOk());
    EXPECT_THAT((*store)->SetIdentity(job.layout, s), IsOk());
    EXPECT_THAT((*store)->PutJobSpec(job), IsOk());
    for (int64_t step : steps) EXPECT_THAT(WriteCheckpoint(**store, job.layout, s, step), IsOk());
  }
  return dirs;
}

std::vector<std::string> Outputs(const std::string& root, uint32_t shards) {
  std::vector<std::string> out;
  for (uint32_t s = 0; s < shards; ++s)
    out.push_back(root + "/s" + std::to_string(s) + "/checkpoints");
  return out;
}

CheckpointOptions ReadOnly() {
  CheckpointOptions o;
  o.read_only = true;
  o.create_if_missing = false;
  return o;
}

TEST(Reshard, TwoToThreeMovesEveryChunkAndTheState) {
  TempDir dir;
  auto in = MakeJob(dir.sub("a"), 2, {10, 20});
  ReshardOptions o;
  o.inputs = {in[1], in[0]};  // any order
  o.outputs = Outputs(dir.sub("b"), 3);
  auto stats = ReshardCheckpoint(o);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->step, 20);
  EXPECT_EQ(stats->from_shards, 2u);
  EXPECT_EQ(stats->to_shards, 3u);
  EXPECT_EQ(stats->coordinator_dir, dir.sub("b") + "/s0/coordinator");
  const Layout three = SmallJob(3).layout;
  for (uint32_t s = 0; s < 3; ++s) {
    auto store = CheckpointStore::Open(o.outputs[s], ReadOnly());
    ASSERT_THAT(store, IsOk());
    auto layout = (*store)->GetLayout();
    ASSERT_THAT(layout, IsOk());
    EXPECT_EQ(layout->Hash(), three.Hash());
    EXPECT_EQ(*(*store)->GetShard(), s);
    EXPECT_EQ((*store)->GetJobSpec()->Hash(), SmallJob(3).Hash());
    ExpectCheckpoint(**store, three, s, 20);  // values, versions and state blob
    auto list = (*store)->ListCheckpoints(/*verify=*/true);
    ASSERT_THAT(list, IsOk());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].verification, Verification::kVerified);
  }
  // The coordinator catalog: the job on 3 shards, the step, checkpoint 20 complete.
  CheckpointOptions co;
  auto catalog = CoordinatorCatalog::Open(stats->coordinator_dir, co);
  ASSERT_THAT(catalog, IsOk());
  EXPECT_EQ((*catalog)->GetJobSpec()->Hash(), SmallJob(3).Hash());
  EXPECT_EQ(*(*catalog)->GetStep(), 20);
  EXPECT_EQ(*(*catalog)->LatestGlobalComplete(), 20);
}

TEST(Reshard, ToOneAndBackAndAnOlderStep) {
  TempDir dir;
  auto in = MakeJob(dir.sub("a"), 3, {10, 20});
  ReshardOptions o;
  o.inputs = in;
  o.outputs = Outputs(dir.sub("one"), 1);
  o.step = 10;
  ASSERT_THAT(ReshardCheckpoint(o), IsOk());
  ReshardOptions back;
  back.inputs = o.outputs;
  back.outputs = Outputs(dir.sub("four"), 4);
  ASSERT_THAT(ReshardCheckpoint(back), IsOk());
  const Layout four = SmallJob(4).layout;
  for (uint32_t s = 0; s < 4; ++s) {
    auto store = CheckpointStore::Open(back.outputs[s], ReadOnly());
    ASSERT_THAT(store, IsOk());
    ExpectCheckpoint(**store, four, s, 10);
  }
}

// The packed bytes of `values` in `dtype` (what a conversion must have written).
std::vector<std::byte> Packed(StateDType dtype, MomentKind kind, const std::vector<float>& values) {
  std::vector<std::byte> out(MomentBytes(dtype, values.size()));
  EXPECT_THAT(PackMoment(dtype, kind, values, out), IsOk());
  return out;
}

std::vector<float> Unpacked(StateDType dtype, MomentKind kind, const std::vector<std::byte>& b,
                            size_t n) {
  std::vector<float> out(n);
  EXPECT_THAT(UnpackMoment(dtype, kind, b, out), IsOk());
  return out;
}

// Every local chunk of `step` in the store: the master and version of MakeChunk's, m and v
// MakeChunk's fp32 moments packed in `dtype` (through `via` first, when given: a second
// conversion), and the state blob and job spec of the conversion.
void ExpectConverted(const std::string& dir, uint32_t shards, uint32_t shard, int64_t step,
                     StateDType dtype, std::optional<StateDType> via = std::nullopt) {
  auto store = CheckpointStore::Open(dir, ReadOnly());
  ASSERT_THAT(store, IsOk());
  auto job = (*store)->GetJobSpec();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->optimizer.state_dtype, dtype);
  const Layout l = SmallJob(shards).layout;
  auto r = (*store)->OpenCheckpoint(step);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)->info().state_dtype, dtype);
  for (const ChunkEntry& e : (*r)->info().chunks) EXPECT_EQ(e.version, step + 1);
  for (uint32_t c : l.ChunksOfShard(shard)) {
    const ChunkData want = MakeChunk(l, c, step);
    const size_t n = want.master.size();
    std::vector<float> master(n);
    std::vector<std::byte> m(MomentBytes(dtype, n)), v(MomentBytes(dtype, n));
    ASSERT_THAT((*r)->ReadChunk(c, {master, m, v}), IsOk());
    EXPECT_EQ(master, want.master) << "chunk " << c;
    std::vector<float> wm = want.m, wv = want.v;
    if (via) {
      wm = Unpacked(*via, MomentKind::kM, Packed(*via, MomentKind::kM, wm), n);
      wv = Unpacked(*via, MomentKind::kV, Packed(*via, MomentKind::kV, wv), n);
    }
    EXPECT_EQ(m, Packed(dtype, MomentKind::kM, wm)) << "chunk " << c;
    EXPECT_EQ(v, Packed(dtype, MomentKind::kV, wv)) << "chunk " << c;
  }
  auto state = (*r)->ReadState();
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(state->data()), state->size()),
            "state@" + std::to_string(step));
  auto list = (*store)->ListCheckpoints(/*verify=*/true);
  ASSERT_THAT(list, IsOk());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].verification, Verification::kVerified);
}

// Reshards `inputs` onto `shards` stores under `root` with their moments in `dtype`; returns
// the new stores.
std::vector<std::string> Convert(const std::vector<std::string>& inputs, const std::string& root,
                                 uint32_t shards, StateDType dtype, ReshardStats* stats = nullptr) {
  ReshardOptions o;
  o.inputs = inputs;
  o.outputs = Outputs(root, shards);
  o.state_dtype = dtype;
  auto r = ReshardCheckpoint(o);
  EXPECT_THAT(r, IsOk());
  if (stats != nullptr && r.ok()) *stats = *r;
  return o.outputs;
}

TEST(Reshard, ConvertsTheMomentsToAnotherStateDtype) {
  TempDir dir;
  auto in = MakeJob(dir.sub("a"), 2, {10, 20});
  // fp32 -> int8 on 3 shards, then int8 -> bf16 on 2, then bf16 -> bf16 (a copy).
  ReshardStats stats;
  auto int8 = Convert(in, dir.sub("int8"), 3, StateDType::kInt8, &stats);
  EXPECT_EQ(stats.from_state_dtype, StateDType::kF32);
  EXPECT_EQ(stats.state_dtype, StateDType::kInt8);
  for (uint32_t s = 0; s < 3; ++s) ExpectConverted(int8[s], 3, s, 20, StateDType::kInt8);
  CheckpointOptions co;
  auto catalog = CoordinatorCatalog::Open(stats.coordinator_dir, co);
  ASSERT_THAT(catalog, IsOk());
  EXPECT_EQ((*catalog)->GetJobSpec()->optimizer.state_dtype, StateDType::kInt8);

  auto bf16 = Convert(int8, dir.sub("bf16"), 2, StateDType::kBF16);
  for (uint32_t s = 0; s < 2; ++s) {
    ExpectConverted(bf16[s], 2, s, 20, StateDType::kBF16, StateDType::kInt8);
  }
  auto same = Convert(bf16, dir.sub("same"), 2, StateDType::kBF16);  // the bytes as they are
  for (uint32_t s = 0; s < 2; ++s) {
    ExpectConverted(same[s], 2, s, 20, StateDType::kBF16, StateDType::kInt8);
  }

  // fp32 -> bf16 on 1 shard, then -> fp32 on 2: the bf16 values, widened exactly.
  auto back = Convert(Convert(in, dir.sub("one"), 1, StateDType::kBF16), dir.sub("fp32"), 2,
                      StateDType::kF32);
  for (uint32_t s = 0; s < 2; ++s) {
    ExpectConverted(back[s], 2, s, 20, StateDType::kF32, StateDType::kBF16);
  }
}

// int8 moments need every parameter to start on a block: a job aligned to 32 elements is refused
// before anything is written.
TEST(Reshard, ConversionToInt8NeedsBlockAlignedParameters) {
  TempDir dir;
  JobSpec job;
  auto layout = Layout::Build({{"a", {100}}, {"b", {70}}},
                              {.chunk_elems = 1024, .align_elems = 32, .num_shards = 1});
  ASSERT_THAT(layout, IsOk());
  job.layout = *layout;
  const std::string in = dir.sub("a/s0/checkpoints");
  fs::create_directories(dir.sub("a/s0"));
  {
    auto store = CheckpointStore::Open(in, Small());
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->SetIdentity(job.layout, 0), IsOk());
    ASSERT_THAT((*store)->PutJobSpec(job), IsOk());
    ASSERT_THAT(WriteCheckpoint(**store, job.layout, 0, 10), IsOk());
  }
  ReshardOptions o;
  o.inputs = {in};
  o.outputs = Outputs(dir.sub("out"), 1);
  o.state_dtype = StateDType::kInt8;
  auto r = ReshardCheckpoint(o);
  ASSERT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_NE(r.status().message().find("align_elems"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(fs::exists(dir.sub("out")));
  // bf16 has no blocks: the same job converts.
  o.state_dtype = StateDType::kBF16;
  ASSERT_THAT(ReshardCheckpoint(o), IsOk());
}

// Bad input: a clear error, the inputs untouched, nothing left at the outputs.
class ReshardBadInput : public ::testing::Test {
 protected:
  void Expect(const ReshardOptions& o, Code code, const std::string& what) {
    auto r = ReshardCheckpoint(o);
    ASSERT_THAT(r, StatusIs(code));
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
    for (const auto& out : o.outputs) EXPECT_FALSE(fs::exists(out)) << out;
    EXPECT_FALSE(fs::exists(dir_.sub("out"))) << "the outputs' parent was left behind";
    for (uint32_t s = 0; s < 2; ++s) {
      auto store = CheckpointStore::Open(in_[s], ReadOnly());
      ASSERT_THAT(store, IsOk());
      ExpectCheckpoint(**store, SmallJob(2).layout, s, 20);
    }
  }
  TempDir dir_;
  std::vector<std::string> in_ = MakeJob(dir_.sub("a"), 2, {10, 20});
  std::vector<std::string> out_ = Outputs(dir_.sub("out"), 3);
};

TEST_F(ReshardBadInput, AStoreMissing) {
  Expect({.inputs = {in_[1]}, .outputs = out_}, Code::kInvalidArgument,
         "the store of shard 0 is missing");
}

TEST_F(ReshardBadInput, StoresOfTwoJobs) {
  auto other = MakeJob(dir_.sub("other"), 2, {20}, /*lr=*/2e-3f);
  Expect({.inputs = {in_[0], other[1]}, .outputs = out_}, Code::kInvalidArgument,
         "stores of two different jobs");
}

TEST_F(ReshardBadInput, AStoreOfAnotherStep) {
  auto stale = MakeJob(dir_.sub("stale"), 2, {10});
  Expect({.inputs = {in_[0], stale[1]}, .outputs = out_}, Code::kInvalidArgument,
         "newest checkpoints are of different steps");
  Expect({.inputs = {in_[0], stale[1]}, .outputs = out_, .step = 20}, Code::kNotFound,
         "has no checkpoint of step 20 (it holds 10)");
}

TEST_F(ReshardBadInput, ACorruptValue) {
  // Shard 1's chunk 1 master, one byte flipped (a raw write; the store is closed).
  auto copy = dir_.sub("corrupt/checkpoints");
  fs::create_directories(copy);
  fs::copy(in_[1], copy, fs::copy_options::recursive);
  {
    rocksdb::Options ro;
    ro.enable_blob_files = true;
    ro.min_blob_size = 4096;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(ro, copy, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string key = "d";
    for (int i = 7; i >= 0; --i) key.push_back(static_cast<char>((uint64_t{20} >> (8 * i)) & 0xff));
    for (uint32_t v : {0u, 0u, 0u, 1u}) key.push_back(static_cast<char>(v));  // chunk 1
    key.push_back(0);                                                         // master
    for (uint32_t v : {0u, 0u, 0u, 0u}) key.push_back(static_cast<char>(v));  // slice 0
    std::string v;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), key, &v).ok());
    v[100] = static_cast<char>(v[100] ^ 0x10);
    rocksdb::WriteOptions wo;
    wo.sync = true;
    ASSERT_TRUE(db->Put(wo, key, v).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  Expect({.inputs = {in_[0], copy}, .outputs = out_}, Code::kDataLoss, "chunk 1: CRC32C mismatch");
}

TEST_F(ReshardBadInput, OutputsThatAreNotNew) {
  auto same = ReshardCheckpoint({.inputs = in_, .outputs = {dir_.sub("out/x"), in_[0]}});
  ASSERT_THAT(same, StatusIs(Code::kInvalidArgument));
  EXPECT_NE(same.status().message().find("is one of the inputs"), std::string::npos);
  auto other = MakeJob(dir_.sub("other"), 1, {20});
  auto r = ReshardCheckpoint({.inputs = in_, .outputs = {dir_.sub("out/y"), other[0]}});
  ASSERT_THAT(r, StatusIs(Code::kFailedPrecondition));
  EXPECT_NE(r.status().message().find("exists and is not empty"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_.sub("out")));
}

TEST(Reshard, WorkerCountChangesOnlyWithTheGlobalBatchKept) {
  TempDir dir;
  auto in = MakeJob(dir.sub("a"), 2, {20});  // world size 1, accumulation 1
  auto r = ReshardCheckpoint({.inputs = in,
                              .outputs = Outputs(dir.sub("b"), 2),
                              .world_size = 2,
                              .accumulation_steps = 2});
  ASSERT_THAT(r, StatusIs(Code::kInvalidArgument));
  EXPECT_NE(r.status().message().find("2 x accumulation 2 = 4 contributions a step, the job has "
                                      "1 x 1 = 1"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_FALSE(fs::exists(dir.sub("b")));
  ASSERT_THAT(
      ReshardCheckpoint({.inputs = in, .outputs = Outputs(dir.sub("b"), 2), .world_size = 1}),
      StatusIs(Code::kInvalidArgument));
  // The same global batch: the job spec says so, and the checkpoint is that of the job.
  JobSpec job = SmallJob(2);
  job.shard.world_size = 4;
  ASSERT_THAT(job.Validate(), IsOk());
  auto c = MakeJob(dir.sub("c"), 2, {20});
  for (const auto& d : c) {
    auto store = CheckpointStore::Open(d, Small());
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->PutJobSpec(job), IsOk());
  }
  ASSERT_THAT(ReshardCheckpoint({.inputs = c,
                                 .outputs = Outputs(dir.sub("d"), 3),
                                 .world_size = 2,
                                 .accumulation_steps = 2}),
              IsOk());
  auto store = CheckpointStore::Open(Outputs(dir.sub("d"), 3)[1], ReadOnly());
  ASSERT_THAT(store, IsOk());
  auto got = (*store)->GetJobSpec();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->shard.world_size, 2u);
  EXPECT_EQ(got->shard.accumulation_steps, 2u);
  EXPECT_EQ(got->layout.options().num_shards, 3u);
}

// RocksDB opens a read-only database with one table file per level as a CompactedDBImpl, whose
// Get did not resolve blob values (facebook/rocksdb#12503): after a compaction every tensor
// read through a read-only store (zps-ckpt export, inspect, reshard) was "missing".
TEST(CheckpointStoreReadOnly, ReadsValuesAfterACompaction) {
  TempDir dir;
  const Layout l = SmallLayout(1, 1536);
  {
    CheckpointOptions o = Small();
    o.keep = 1;  // each commit deletes and compacts the previous checkpoint's range
    auto store = CheckpointStore::Open(dir.sub("db"), o);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->SetIdentity(l, 0), IsOk());
    for (int64_t step : {1, 2, 3}) ASSERT_THAT(WriteCheckpoint(**store, l, 0, step), IsOk());
  }
  {
    // Down to one table file: the shape that took the CompactedDBImpl path.
    rocksdb::Options ro;
    ro.enable_blob_files = true;
    ro.min_blob_size = 4096;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(ro, dir.sub("db"), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    rocksdb::CompactRangeOptions co;
    co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    ASSERT_TRUE(db->CompactRange(co, nullptr, nullptr).ok());
    ASSERT_TRUE(db->Close().ok());
  }
  auto store = CheckpointStore::Open(dir.sub("db"), ReadOnly());
  ASSERT_THAT(store, IsOk());
  ExpectCheckpoint(**store, l, 0, 3);
}

// The online path's copy (online_reshard.h): values read page by page with ReadStored and
// written with PutStored, as a shard does with a peer's chunks, give the store CopyChunk gives.
std::vector<StoredValue> ReadAll(const CheckpointReader& r, uint32_t chunk, size_t page) {
  std::vector<StoredValue> all;
  std::string after;
  bool more = true;
  while (more) {
    auto values = r.ReadStored(chunk, after, page, &more);
    EXPECT_THAT(values, IsOk());
    if (!values.ok() || values->empty()) break;
    after = values->back().key;
    all.insert(all.end(), values->begin(), values->end());
  }
  return all;
}

TEST(ReshardOnline, PutStoredWritesWhatCopyChunkWould) {
  TempDir dir;
  auto in = MakeJob(dir.sub("a"), 2, {20});
  std::vector<std::unique_ptr<CheckpointStore>> stores;
  std::vector<std::unique_ptr<CheckpointReader>> readers;
  for (const auto& d : in) {
    auto s = CheckpointStore::Open(d, ReadOnly());
    ASSERT_THAT(s, IsOk());
    auto r = (*s)->OpenCheckpoint(20);
    ASSERT_THAT(r, IsOk());
    stores.push_back(std::move(*s));
    readers.push_back(std::move(*r));
  }
  const JobSpec three = SmallJob(3);
  // Through write batches (the online path's) and as table files moved in (zps-ckpt reshard's).
  for (uint32_t j = 0; j < 6; ++j) {
    const std::string out = dir.sub("b") + "/s" + std::to_string(j);
    fs::create_directories(dir.sub("b"));
    CheckpointOptions o = Small();
    o.ingest_copies = j >= 3;
    auto store = CheckpointStore::Open(out, o);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->SetIdentity(three.layout, j % 3), IsOk());
    auto w = (*store)->BeginCheckpoint(20);
    ASSERT_THAT(w, IsOk());
    for (uint32_t c : three.layout.ChunksOfShard(j % 3)) {
      const CheckpointReader& from = *readers[c % 2];
      // 1000-byte pages: every slice of a chunk comes in a page of its own.
      ASSERT_THAT((*w)->PutStored(from.EncodedManifest(), c, ReadAll(from, c, 1000)), IsOk());
    }
    ASSERT_THAT((*w)->PutStored(readers[0]->EncodedManifest(), kStoredStateChunk,
                                ReadAll(*readers[0], kStoredStateChunk, 1000)),
                IsOk());
    ASSERT_THAT((*w)->Commit(), IsOk());
    ExpectCheckpoint(**store, three.layout, j % 3, 20);
  }
}

TEST(ReshardOnline, PutStoredRefusesACorruptValueAndAnotherChunksKey) {
  TempDir dir;
  auto in = MakeJob(dir.sub("a"), 2, {20});
  auto src = CheckpointStore::Open(in[0], ReadOnly());
  ASSERT_THAT(src, IsOk());
  auto reader = (*src)->OpenCheckpoint(20);
  ASSERT_THAT(reader, IsOk());
  const JobSpec three = SmallJob(3);
  const uint32_t chunk = 0;  // on shard 0 of 2 and of 3
  auto values = ReadAll(**reader, chunk, 1 << 20);
  ASSERT_FALSE(values.empty());
  bool ingest = false;
  auto attempt = [&](std::vector<StoredValue> v) {
    fs::create_directories(dir.sub("b"));
    CheckpointOptions o = Small();
    o.ingest_copies = ingest;
    auto store = CheckpointStore::Open(dir.sub("b") + "/x", o);
    EXPECT_THAT(store, IsOk());
    EXPECT_THAT((*store)->SetIdentity(three.layout, 0), IsOk());
    auto w = (*store)->BeginCheckpoint(20);
    EXPECT_THAT(w, IsOk());
    Status s = (*w)->PutStored((*reader)->EncodedManifest(), chunk, v);
    // A refused copy leaves no table file behind.
    for (const auto& e : fs::directory_iterator(dir.sub("b") + "/x")) {
      EXPECT_FALSE(e.path().filename().string().starts_with("copy-")) << e.path();
    }
    w->reset();
    store->reset();
    fs::remove_all(dir.sub("b") + "/x");
    return s;
  };
  auto corrupt = values;
  corrupt.back().value[corrupt.back().value.size() / 2] ^= 0x01;
  // Chunk 1's values (from shard 1 of 2) offered as chunk 0's.
  auto src1 = CheckpointStore::Open(in[1], ReadOnly());
  ASSERT_THAT(src1, IsOk());
  auto reader1 = (*src1)->OpenCheckpoint(20);
  ASSERT_THAT(reader1, IsOk());
  auto other = ReadAll(**reader1, 1, 1 << 20);
  ASSERT_FALSE(other.empty());
  // Values out of key order (ReadStored hands them out ascending; a table file takes no other).
  ASSERT_GE(values.size(), 2u);
  auto swapped = values;
  std::swap(swapped[0], swapped[1]);
  for (bool i : {false, true}) {
    SCOPED_TRACE(i ? "as table files" : "through write batches");
    ingest = i;
    EXPECT_THAT(attempt(corrupt), StatusIs(Code::kDataLoss));
    EXPECT_THAT(attempt(other), StatusIs(Code::kDataLoss));
    EXPECT_THAT(attempt({}), StatusIs(Code::kDataLoss));
    EXPECT_THAT(attempt(swapped), StatusIs(Code::kDataLoss));
    EXPECT_THAT(attempt(values), IsOk());
  }
}

TEST(ReshardCopy, AWritableOpenRemovesATableFileACrashLeftBehind) {
  TempDir dir;
  const std::string store_dir = dir.sub("s");
  {
    auto store = CheckpointStore::Open(store_dir, Small());
    ASSERT_THAT(store, IsOk());
  }
  // What a copy killed before its table file was moved in leaves (CheckpointWriter::CopyChunk).
  const std::string left = store_dir + "/copy-20-0.sst";
  std::FILE* f = std::fopen(left.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("half a table", f);
  std::fclose(f);
  {
    auto ro = CheckpointStore::Open(store_dir, ReadOnly());
    ASSERT_THAT(ro, IsOk());
  }
  EXPECT_TRUE(fs::exists(left)) << "a read-only open changes nothing";
  auto store = CheckpointStore::Open(store_dir, Small());
  ASSERT_THAT(store, IsOk());
  EXPECT_FALSE(fs::exists(left));
}

}  // namespace
}  // namespace zps::server::testing
