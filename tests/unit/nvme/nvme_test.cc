// Tests of the NVMe building blocks: error mapping, spill files, buffer pool, io_uring engine.
#include "zps/server/nvme.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zps/testing/spill_dir.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using zps::testing::SpillDir;

TEST(ErrnoError, DiskFullIsResourceExhaustedOtherwiseIoError) {
  EXPECT_EQ(ErrnoError("write x", ENOSPC).code(), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoError("write x", EFBIG).code(), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoError("write x", EDQUOT).code(), Code::kResourceExhausted);
  Status st = ErrnoError("read y", EIO);
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_NE(st.message().find("read y"), std::string::npos);
}

TEST(SpillFile, PreallocatedAndRemovedOnClose) {
  std::string path;
  {
    auto f = SpillFile::Create(SpillDir(), "nvme-test-prealloc.zps", 8 << 20, {});
    ASSERT_THAT(f, IsOk());
    path = (*f)->path();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 8 << 20);
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{8} << 20);  // really allocated
  }
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

TEST(SpillFile, MissingDirectoryIsNotFound) {
  auto f = SpillFile::Create("/nonexistent-zps-dir", "x.zps", 4096, {});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kNotFound);
}

TEST(AlignedBufferPool, AlignedAndSized) {
  auto p = AlignedBufferPool::Create(3, 5000);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ((*p)->buffer_bytes(), 8192u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*p)->buffer(i)) % kDirectAlign, 0u);
  }
  EXPECT_EQ(AlignedBufferPool::Create(0, 10).status().code(), Code::kInvalidArgument);
}

class UringEngineTest : public ::testing::TestWithParam<bool> {};

// Writes a pattern through the engine and reads it back, with and without registered buffers.
TEST_P(UringEngineTest, WriteThenReadBack) {
  auto file = SpillFile::Create(SpillDir(), "nvme-test-engine.zps", 4 << 20, {});
  ASSERT_THAT(file, IsOk());
  auto pool = AlignedBufferPool::Create(2, 4 << 20);
  ASSERT_THAT(pool, IsOk());
  UringOptions o;
  o.depth = 4;
  if (GetParam()) o.fixed_buffers = {(*pool)->region()};
  auto eng = CreateUringEngine(o);
  ASSERT_THAT(eng, IsOk());
  IoEngine& e = **eng;
  std::byte* w = (*pool)->buffer(0);
  std::byte* r = (*pool)->buffer(1);
  for (size_t i = 0; i < (4u << 20); ++i) w[i] = static_cast<std::byte>(i * 7 + 3);
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(e.Push({IoRequest::Op::kWrite, (*file)->fd(), w + i * (1 << 20), 1 << 20,
                        uint64_t{i} << 20, i})
                    .ok());
  }
  EXPECT_EQ(e.Push({IoRequest::Op::kWrite, (*file)->fd(), w, 4096, 0, 9}).code(),
            Code::kFailedPrecondition);  // depth exceeded
  for (int i = 0; i < 4; ++i) {
    auto c = e.Wait();
    ASSERT_THAT(c, IsOk());
    EXPECT_EQ(c->res, 1 << 20);
  }
  EXPECT_EQ(e.Wait().status().code(), Code::kFailedPrecondition);  // nothing in flight
  ASSERT_THAT(e.Push({IoRequest::Op::kRead, (*file)->fd(), r, 4 << 20, 0, 5}), IsOk());
  auto c = e.Wait();
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->tag, 5u);
  EXPECT_EQ(c->res, 4 << 20);
  EXPECT_EQ(std::memcmp(w, r, 4 << 20), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixed, UringEngineTest, ::testing::Bool());

TEST(UringEngine, BadFdIsACompletionError) {
  auto pool = AlignedBufferPool::Create(1, 4096);
  ASSERT_THAT(pool, IsOk());
  auto eng = CreateUringEngine({});
  ASSERT_THAT(eng, IsOk());
  ASSERT_THAT((*eng)->Push({IoRequest::Op::kRead, 1 << 20, (*pool)->buffer(0), 4096, 0, 1}),
              IsOk());
  auto c = (*eng)->Wait();
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->res, -EBADF);
  EXPECT_EQ(ErrnoError("read", -c->res).code(), Code::kIoError);
}

TEST(UringEngine, BadDepth) {
  UringOptions o;
  o.depth = 0;
  EXPECT_EQ(CreateUringEngine(o).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::server
