#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "checkpoint_codec.h"
#include "ckpt_test_util.h"
#include "fault_fs.h"
#include "zps/server/checkpoint.h"
#include "zps/testing/status_matchers.h"

namespace rocksdb::crc32c {
uint32_t Extend(uint32_t crc, const char* buf, size_t size);  // util/crc32c.h, not installed
}  // namespace rocksdb::crc32c

namespace zps::server::testing {
namespace {

CheckpointOptions SmallOptions() {
  CheckpointOptions o;
  o.slice_bytes = 4096;  // a 1536-element chunk is two slices, the second partial
  o.write_buffer_bytes = 4ull << 20;
  return o;
}

std::unique_ptr<CheckpointStore> OpenStore(const std::string& dir, const CheckpointOptions& o) {
  auto s = CheckpointStore::Open(dir, o);
  EXPECT_THAT(s, IsOk());
  return s.ok() ? std::move(*s) : nullptr;
}

std::string DataKey(int64_t step, uint32_t chunk, uint8_t kind, uint32_t slice) {
  std::string k = "d";
  for (int i = 7; i >= 0; --i) k.push_back(static_cast<char>((uint64_t(step) >> (8 * i)) & 0xff));
  for (int i = 3; i >= 0; --i) k.push_back(static_cast<char>((chunk >> (8 * i)) & 0xff));
  k.push_back(static_cast<char>(kind));
  for (int i = 3; i >= 0; --i) k.push_back(static_cast<char>((slice >> (8 * i)) & 0xff));
  return k;
}

// Rewrites one stored value with a byte flipped, through a raw DB write (the store is closed).
void FlipByte(const std::string& dir, const std::string& key, size_t at) {
  rocksdb::Options o;
  o.enable_blob_files = true;
  o.min_blob_size = 4096;
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(o, dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string v;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), key, &v).ok());
  ASSERT_LT(at, v.size());
  v[at] = static_cast<char>(v[at] ^ 0x10);
  rocksdb::WriteOptions wo;
  wo.sync = true;
  ASSERT_TRUE(db->Put(wo, key, v).ok());
  ASSERT_TRUE(db->Close().ok());
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = OpenStore(dir_.sub("db"), SmallOptions());
    ASSERT_NE(store_, nullptr);
    ASSERT_THAT(store_->SetIdentity(layout_, 0), IsOk());
  }
  TempDir dir_;
  Layout layout_ = SmallLayout(1, 1536);
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(CheckpointStoreTest, RoundTripsChunksStateAndCatalog) {
  ASSERT_EQ(layout_.num_chunks(), 2u);
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 10), IsOk());
  ExpectCheckpoint(*store_, layout_, 0, 10);
  auto list = store_->ListCheckpoints(true);
  ASSERT_THAT(list, IsOk());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 10);
  EXPECT_EQ((*list)[0].verification, Verification::kVerified);
  EXPECT_EQ((*list)[0].chunks.size(), 2u);
  EXPECT_EQ((*list)[0].chunks[1].version, 11);
  EXPECT_EQ((*list)[0].layout_hash, layout_.Hash());
  EXPECT_EQ((*list)[0].bytes, layout_.total_elems() * 12 + 8);  // tensors + "state@10"

  std::vector<std::pair<uint32_t, int64_t>> versions = {{0, 5}, {1, 6}};
  ASSERT_THAT(store_->PutChunkVersions(versions), IsOk());
  const std::string blob = "placement";
  ASSERT_TRUE(
      store_->PutCatalog("custom", std::as_bytes(std::span(blob.data(), blob.size()))).ok());
  store_.reset();
  store_ = OpenStore(dir_.sub("db"), SmallOptions());
  auto got = store_->GetChunkVersions();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, versions);
  auto l = store_->GetLayout();
  ASSERT_THAT(l, IsOk());
  EXPECT_EQ(l->Hash(), layout_.Hash());
  EXPECT_EQ(store_->GetCatalog("custom")->size(), blob.size());
  EXPECT_EQ(store_->GetCatalog("nope").status().code(), Code::kNotFound);
  EXPECT_EQ(store_->SetIdentity(layout_, 0).code(), Code::kOk);
  EXPECT_EQ(store_->SetIdentity(SmallLayout(1, 1024), 0).code(), Code::kFailedPrecondition);
  ExpectCheckpoint(*store_, layout_, 0, 10);
  // Partial reads: the master alone.
  std::vector<float> master(layout_.chunk_size(1));
  ASSERT_THAT(store_->LoadChunk(10, 1, {master, {}, {}}), IsOk());
  EXPECT_EQ(master, MakeChunk(layout_, 1, 10).master);
  EXPECT_EQ(store_->LoadChunk(11, 1, {master, {}, {}}).code(), Code::kNotFound);
  EXPECT_EQ(store_->LoadChunk(10, 7, {master, {}, {}}).code(), Code::kNotFound);
}

// Slices are striped over write threads; any count gives the same checkpoint (6 slices per
// chunk here, so 1, 2, 3 and 5 threads all split a chunk differently).
TEST(CheckpointStore, AnyWriteThreadCountStoresTheSameCheckpoint) {
  const Layout layout = SmallLayout(1, 1536);
  for (int threads : {1, 2, 3, 5}) {
    SCOPED_TRACE("write_threads " + std::to_string(threads));
    TempDir dir;
    CheckpointOptions o = SmallOptions();
    o.write_threads = threads;
    auto store = OpenStore(dir.sub("db"), o);
    ASSERT_NE(store, nullptr);
    ASSERT_THAT(store->SetIdentity(layout, 0), IsOk());
    ASSERT_THAT(WriteCheckpoint(*store, layout, 0, 7), IsOk());
    ExpectCheckpoint(*store, layout, 0, 7);
    auto list = store->ListCheckpoints(true);
    ASSERT_THAT(list, IsOk());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].verification, Verification::kVerified);
    EXPECT_EQ((*list)[0].bytes, layout.total_elems() * 12 + 7);  // tensors + "state@7"
  }
  CheckpointOptions bad = SmallOptions();
  bad.write_threads = 0;
  EXPECT_EQ(bad.Validate().code(), Code::kInvalidArgument);
}

// The nice values of this process's threads named `name` (from /proc/self/task).
std::vector<int> NiceOfThreadsNamed(const std::string& name) {
  std::vector<int> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string c;
    if (!std::getline(comm, c) || c != name) continue;
    const auto tid = static_cast<id_t>(std::stol(task.path().filename().string()));
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, tid);
    if (errno == 0) out.push_back(nice);
  }
  return out;
}

// A low-priority store (a background checkpoint's) runs its framing helpers at nice 19, as its
// writer does; an ordinary one leaves them at the process's priority.
TEST(CheckpointStore, LowPriorityStoreNicesItsWriteHelpers) {
  const Layout layout = SmallLayout(1, 1536);
  const int process_nice = ::getpriority(PRIO_PROCESS, 0);
  for (bool low : {false, true}) {
    SCOPED_TRACE(low ? "low_priority" : "normal");
    TempDir dir;
    CheckpointOptions o = SmallOptions();
    o.write_threads = 2;
    o.low_priority = low;
    auto store = OpenStore(dir.sub("db"), o);
    ASSERT_NE(store, nullptr);
    ASSERT_THAT(store->SetIdentity(layout, 0), IsOk());
    ASSERT_THAT(WriteCheckpoint(*store, layout, 0, 3), IsOk());  // the helper has started and run
    const std::vector<int> nices = NiceOfThreadsNamed("zps-ckpt-w-1");
    ASSERT_EQ(nices.size(), 1u);
    EXPECT_EQ(nices[0], low ? 19 : process_nice);
  }
}

TEST_F(CheckpointStoreTest, WriterRules) {
  auto w = store_->BeginCheckpoint(1);
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ(store_->BeginCheckpoint(2).status().code(), Code::kFailedPrecondition);
  auto d = MakeChunk(layout_, 0, 1);
  EXPECT_EQ((*w)->AddChunk(5, 0, d.tensors()).code(), Code::kOutOfRange);
  ChunkTensors no_v = d.tensors();
  no_v.v = {};
  EXPECT_EQ((*w)->AddChunk(0, 0, no_v).code(), Code::kInvalidArgument);
  ASSERT_THAT((*w)->AddChunk(0, 0, d.tensors()), IsOk());
  EXPECT_EQ((*w)->AddChunk(0, 0, d.tensors()).code(), Code::kInvalidArgument);
  EXPECT_EQ((*w)->Commit().code(), Code::kFailedPrecondition);  // chunk 1 missing
  w->reset();                                                   // aborts
  EXPECT_TRUE(store_->ListCheckpoints(false)->empty());
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 1), IsOk());
  EXPECT_EQ(store_->BeginCheckpoint(1).status().code(), Code::kAlreadyExists);
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 2), IsOk());
  // Rollback to 1, then step 2 can be written again (with other contents).
  ASSERT_THAT(store_->DropCheckpointsAfter(1), IsOk());
  EXPECT_EQ(store_->ListCheckpoints(false)->size(), 1u);
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 2), IsOk());
  ExpectCheckpoint(*store_, layout_, 0, 2);
}

TEST(CheckpointStore, NeedsIdentityAndValidOptions) {
  TempDir dir;
  auto store = OpenStore(dir.sub("db"), {});
  EXPECT_EQ(store->BeginCheckpoint(0).status().code(), Code::kFailedPrecondition);
  CheckpointOptions bad;
  bad.slice_bytes = 100;
  EXPECT_EQ(CheckpointStore::Open(dir.sub("db2"), bad).status().code(), Code::kInvalidArgument);
  CheckpointOptions missing;
  missing.create_if_missing = false;
  EXPECT_EQ(CheckpointStore::Open(dir.sub("nope"), missing).status().code(), Code::kNotFound);
  // A second opener of a live store gets a clear error; a read-only one works beside it.
  EXPECT_EQ(CheckpointStore::Open(dir.sub("db"), {}).status().code(), Code::kUnavailable);
  CheckpointOptions ro;
  ro.read_only = true;
  auto reader = CheckpointStore::Open(dir.sub("db"), ro);
  ASSERT_THAT(reader, IsOk());
  EXPECT_EQ((*reader)->PutCatalog("x", {}).code(), Code::kFailedPrecondition);
}

TEST(CheckpointStore, KeepsLastNAndReclaimsSpace) {
  TempDir dir;
  auto layout = *Layout::Build({{"w", {1 << 18}}}, {.chunk_elems = 1 << 16, .num_shards = 1});
  CheckpointOptions o;
  o.keep = 2;
  o.write_buffer_bytes = 8ull << 20;
  auto store = OpenStore(dir.sub("db"), o);
  ASSERT_THAT(store->SetIdentity(layout, 0), IsOk());
  const uint64_t one = layout.total_elems() * 12;  // 3 MiB
  for (int64_t step = 0; step < 6; ++step) {
    ASSERT_THAT(WriteCheckpoint(*store, layout, 0, step), IsOk());
    EXPECT_LE(store->DiskBytes(), 3 * one + (1 << 20)) << "after step " << step;
  }
  auto list = store->ListCheckpoints(false);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 4);
  EXPECT_EQ((*list)[1].step, 5);
  ExpectCheckpoint(*store, layout, 0, 4);
  ExpectCheckpoint(*store, layout, 0, 5);
}

// The newest checkpoint complete on every shard survives garbage collection while newer local
// ones pile up (another shard failing its checkpoints, e.g. on a full disk).
TEST(CheckpointStore, ProtectedCheckpointOutlivesKeep) {
  TempDir dir;
  auto layout = *Layout::Build({{"w", {1 << 14}}}, {.chunk_elems = 1 << 12, .num_shards = 1});
  CheckpointOptions o;
  o.keep = 2;
  auto store = OpenStore(dir.sub("db"), o);
  ASSERT_THAT(store->SetIdentity(layout, 0), IsOk());
  ASSERT_THAT(WriteCheckpoint(*store, layout, 0, 5), IsOk());
  store->Protect(5);
  for (int64_t step : {10, 15, 20}) ASSERT_THAT(WriteCheckpoint(*store, layout, 0, step), IsOk());

  auto steps = [&] {
    auto list = store->ListCheckpoints(false);
    std::vector<int64_t> out;
    for (const auto& c : *list) out.push_back(c.step);
    return out;
  };
  EXPECT_EQ(steps(), (std::vector<int64_t>{5, 15, 20}));
  ExpectCheckpoint(*store, layout, 0, 5);
  store->Protect(20);  // now complete everywhere: 5 goes with the next collection
  ASSERT_THAT(WriteCheckpoint(*store, layout, 0, 25), IsOk());
  EXPECT_EQ(steps(), (std::vector<int64_t>{20, 25}));
}

Layout KillLayout() {
  return *Layout::Build({{"w", {3 << 16}}, {"b", {100}}},
                        {.chunk_elems = 1 << 16, .num_shards = 1});
}

// The writer of KilledWriterNeverBreaksTheLastCheckpoint, in a fresh process (exec'd: a forked
// copy of a process that already ran RocksDB has no background threads). Skipped otherwise.
TEST(CheckpointWriterChild, WriteForever) {
  const char* db = std::getenv("ZPS_CKPT_CHILD_DB");
  if (db == nullptr) GTEST_SKIP() << "only run as the child of a kill test";
  auto layout = KillLayout();
  auto s = CheckpointStore::Open(db, {});
  if (!s.ok()) _exit(3);
  auto latest = (*s)->LatestComplete(false);
  for (int64_t step = latest.ok() ? latest->step + 1 : 0;; ++step) {
    if (!WriteCheckpoint(**s, layout, 0, step).ok()) _exit(4);
  }
}

// A writer killed (SIGKILL) at any point leaves the last committed checkpoint loadable, and its
// own leftovers are removed at the next open.
TEST(CheckpointStore, KilledWriterNeverBreaksTheLastCheckpoint) {
  TempDir dir;
  auto layout = KillLayout();
  const std::string db = dir.sub("db");
  {
    auto store = OpenStore(db, {});
    ASSERT_THAT(store->SetIdentity(layout, 0), IsOk());
    ASSERT_THAT(WriteCheckpoint(*store, layout, 0, 0), IsOk());
  }
  std::mt19937 rng(42);
  int64_t last = 0;
  for (int round = 0; round < 6; ++round) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("ZPS_CKPT_CHILD_DB", db.c_str(), 1);
      ::execl("/proc/self/exe", "test_checkpoint", "--gtest_filter=CheckpointWriterChild.*",
              static_cast<char*>(nullptr));
      _exit(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 700));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited early with " << WEXITSTATUS(wstatus);
    auto store = OpenStore(db, {});
    auto latest = store->LatestComplete(true);
    ASSERT_THAT(latest, IsOk());
    EXPECT_GE(latest->step, last);
    last = latest->step;
    ExpectCheckpoint(*store, layout, 0, latest->step);
    auto list = store->ListCheckpoints(true);
    for (const auto& c : *list) EXPECT_EQ(c.verification, Verification::kVerified);
  }
  EXPECT_GT(last, 0) << "the child never committed a checkpoint";
}

TEST_F(CheckpointStoreTest, CorruptValueIsDataLossAndFallsBack) {
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 1), IsOk());
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 2), IsOk());
  store_.reset();
  FlipByte(dir_.sub("db"), DataKey(2, 1, /*v=*/2, 0), 100);
  store_ = OpenStore(dir_.sub("db"), SmallOptions());
  std::vector<float> v(layout_.chunk_size(1));
  Status s = store_->LoadChunk(2, 1, {{}, {}, std::as_writable_bytes(std::span(v))});
  EXPECT_EQ(s.code(), Code::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("chunk 1 v slice 0"), std::string::npos) << s.message();
  // The other tensors of the chunk are intact.
  std::vector<float> master(layout_.chunk_size(1));
  EXPECT_THAT(store_->LoadChunk(2, 1, {master, {}, {}}), IsOk());
  auto list = store_->ListCheckpoints(true);
  ASSERT_THAT(list, IsOk());
  EXPECT_EQ((*list)[0].verification, Verification::kVerified);
  EXPECT_EQ((*list)[1].verification, Verification::kCorrupt);
  auto latest = store_->LatestComplete(true);
  ASSERT_THAT(latest, IsOk());
  EXPECT_EQ(latest->step, 1);
  ExpectCheckpoint(*store_, layout_, 0, 1);
}

// Data reads skip RocksDB's own blob-record CRC (the value's CRC32C covers key and payload):
// a byte flipped inside a blob file on disk must still be DATA_LOSS.
TEST_F(CheckpointStoreTest, CorruptBlobFileOnDiskIsDataLoss) {
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 1), IsOk());
  store_.reset();
  std::string blob;
  for (const auto& e : std::filesystem::directory_iterator(dir_.sub("db"))) {
    if (e.path().extension() == ".blob" &&
        (blob.empty() || e.file_size() > std::filesystem::file_size(blob))) {
      blob = e.path();
    }
  }
  ASSERT_FALSE(blob.empty());
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    const auto at = static_cast<std::streamoff>(std::filesystem::file_size(blob) / 2);
    char c = 0;
    f.seekg(at);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(at);
    f.write(&c, 1);
  }
  store_ = OpenStore(dir_.sub("db"), SmallOptions());
  auto list = store_->ListCheckpoints(true);
  ASSERT_THAT(list, IsOk());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].verification, Verification::kCorrupt);
  EXPECT_NE((*list)[0].problem.find("CRC32C mismatch"), std::string::npos) << (*list)[0].problem;
}

// The statically linked RocksDB's CRC32C is redirected to the hardware one (checkpoint_db.cc,
// --wrap); both must give the same values, or RocksDB files would not read back.
extern "C" uint32_t __real__ZN7rocksdb6crc32c6ExtendEjPKcm(uint32_t, const char*, size_t);
TEST(CheckpointStore, RocksCrc32cRedirectMatchesRocksDb) {
  std::mt19937 rng(3);
  for (size_t n : {0u, 1u, 17u, 4096u, 12288u, 100001u, 1u << 20}) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    const uint32_t seed = rng();
    EXPECT_EQ(rocksdb::crc32c::Extend(seed, s.data(), n),
              __real__ZN7rocksdb6crc32c6ExtendEjPKcm(seed, s.data(), n))
        << n;
  }
}

TEST_F(CheckpointStoreTest, CorruptManifestFallsBack) {
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 1), IsOk());
  ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 2), IsOk());
  store_.reset();
  std::string key = "m";
  for (int i = 7; i >= 0; --i) key.push_back(static_cast<char>((uint64_t{2} >> (8 * i)) & 0xff));
  FlipByte(dir_.sub("db"), key, 20);
  store_ = OpenStore(dir_.sub("db"), SmallOptions());
  EXPECT_EQ(store_->OpenCheckpoint(2).status().code(), Code::kDataLoss);
  auto latest = store_->LatestComplete(false);
  ASSERT_THAT(latest, IsOk());
  EXPECT_EQ(latest->step, 1);
  auto list = store_->ListCheckpoints(false);
  EXPECT_EQ((*list)[1].verification, Verification::kCorrupt);
}

// A manifest's chunk list is ascending, so FindChunk can search it; one that is not is refused
// as corrupt rather than read with chunks missing.
TEST(CheckpointManifest, ChunkListIsAscendingAndSearched) {
  internal::Manifest m;
  m.info.step = 7;
  m.slice_bytes = 4096;
  for (uint32_t c : {2u, 5u, 9u}) m.info.chunks.push_back({.chunk = c, .version = c, .elems = 64});
  auto decoded = internal::DecodeManifest(7, internal::EncodeManifest(m));
  ASSERT_THAT(decoded, IsOk());
  for (uint32_t c = 0; c < 12; ++c) {
    const ChunkEntry* e = decoded->info.FindChunk(c);
    if (c == 2 || c == 5 || c == 9) {
      ASSERT_NE(e, nullptr) << c;
      EXPECT_EQ(e->chunk, c);
      EXPECT_EQ(e->version, c);
    } else {
      EXPECT_EQ(e, nullptr) << c;
    }
  }
  std::swap(m.info.chunks[0], m.info.chunks[1]);
  EXPECT_EQ(internal::DecodeManifest(7, internal::EncodeManifest(m)).status().code(),
            Code::kDataLoss);
  m.info.chunks[0] = m.info.chunks[1];  // the same chunk twice
  EXPECT_EQ(internal::DecodeManifest(7, internal::EncodeManifest(m)).status().code(),
            Code::kDataLoss);
}

// ---- injected I/O faults

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CheckpointOptions o = SmallOptions();
    o.env = fenv_.env.get();
    store_ = OpenStore(dir_.sub("db"), o);
    ASSERT_THAT(store_->SetIdentity(layout_, 0), IsOk());
    ASSERT_THAT(WriteCheckpoint(*store_, layout_, 0, 1), IsOk());
  }
  // Reopens without faults and checks that step 1 is the latest and intact.
  void ExpectOnlyStepOneAfterReopen() {
    store_.reset();
    fenv_.faults.fail_append = fenv_.faults.no_space = fenv_.faults.fail_sync = false;
    store_ = OpenStore(dir_.sub("db"), SmallOptions());
    ASSERT_NE(store_, nullptr);
    auto latest = store_->LatestComplete(true);
    ASSERT_THAT(latest, IsOk());
    EXPECT_EQ(latest->step, 1);
    ExpectCheckpoint(*store_, layout_, 0, 1);
    EXPECT_EQ(store_->ListCheckpoints(false)->size(), 1u);
  }
  // Begins checkpoint 2, arms `fault`, adds every chunk and commits; returns the first error.
  Status WriteWithFault(std::atomic<bool>& fault) {
    ZPS_ASSIGN_OR_RETURN(auto w, store_->BeginCheckpoint(2));
    fault = true;
    for (uint32_t c : layout_.ChunksOfShard(0)) {
      auto d = MakeChunk(layout_, c, 2);
      ZPS_RETURN_IF_ERROR(w->AddChunk(c, 3, d.tensors()));
    }
    return w->Commit();
  }
  TempDir dir_;
  FaultEnv fenv_;
  Layout layout_ = SmallLayout(1, 1536);
  std::unique_ptr<CheckpointStore> store_;
};

TEST_F(FaultTest, WriteErrorDuringFlushFailsTheCommit) {
  Status s = WriteWithFault(fenv_.faults.fail_append);
  EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("injected write failure"), std::string::npos) << s.message();
  ExpectOnlyStepOneAfterReopen();
}

TEST_F(FaultTest, SyncErrorFailsTheCommit) {
  Status s = WriteWithFault(fenv_.faults.fail_sync);
  EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
  ExpectOnlyStepOneAfterReopen();
}

TEST_F(FaultTest, NoSpaceIsResourceExhausted) {
  Status s = WriteWithFault(fenv_.faults.no_space);
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  ExpectOnlyStepOneAfterReopen();
}

TEST_F(FaultTest, ReadErrorIsIoErrorNotCorruption) {
  // Reopen so blob files are opened through the faulting wrapper afresh.
  store_.reset();
  CheckpointOptions o = SmallOptions();
  o.env = fenv_.env.get();
  store_ = OpenStore(dir_.sub("db"), o);
  fenv_.faults.fail_blob_read = true;
  std::vector<float> master(layout_.chunk_size(0));
  Status s = store_->LoadChunk(1, 0, {master, {}, {}});
  EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
  EXPECT_EQ(store_->ListCheckpoints(true).status().code(), Code::kIoError);
  EXPECT_EQ(store_->LatestComplete(true).status().code(), Code::kIoError);
  fenv_.faults.fail_blob_read = false;
  ExpectCheckpoint(*store_, layout_, 0, 1);
}

// Disk full on a real, small filesystem: an 8 MiB tmpfs mounted for the test (needs
// CAP_SYS_ADMIN; skipped otherwise — NoSpaceIsResourceExhausted covers the error path).
TEST(CheckpointDiskFull, SmallTmpfs) {
  TempDir dir;
  const std::string mnt = dir.sub("mnt");
  std::filesystem::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  // 3 MiB of tensors per checkpoint; keep 5, so the fourth or so cannot fit.
  auto layout = *Layout::Build({{"w", {1 << 18}}}, {.chunk_elems = 1 << 16, .num_shards = 1});
  CheckpointOptions o;
  o.keep = 5;
  o.write_buffer_bytes = 8ull << 20;
  auto store = OpenStore(mnt + "/db", o);
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->SetIdentity(layout, 0), IsOk());
  Status s;
  int64_t step = 0;
  for (; step < 10; ++step) {
    s = WriteCheckpoint(*store, layout, 0, step);
    if (!s.ok()) break;
  }
  ASSERT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("disk full"), std::string::npos) << s.message();
  ASSERT_GT(step, 0);
  store.reset();
  // Everything committed before the failure is intact (read-only: a full disk may refuse the
  // files a writable open creates).
  CheckpointOptions ro = o;
  ro.read_only = true;
  auto reader = OpenStore(mnt + "/db", ro);
  ASSERT_NE(reader, nullptr);
  auto latest = reader->LatestComplete(true);
  ASSERT_THAT(latest, IsOk());
  EXPECT_EQ(latest->step, step - 1);
  ExpectCheckpoint(*reader, layout, 0, step - 1);
}

}  // namespace
}  // namespace zps::server::testing
