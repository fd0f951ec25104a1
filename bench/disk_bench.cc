// zps-bench disk: the directory's sequential O_DIRECT ceiling, measured the way
// scripts/bench-checkpoint.sh and scripts/bench-spill.sh run fio (--rw=write then --rw=read,
// --bs=1M, --direct=1, --ioengine=io_uring, --iodepth=16), with nothing but the I/O in the loop.
//
// It exists for machines without fio (the benchmark scripts still use fio when it is there, and
// print both): same engine (server/nvme.h), same block size and depth, one preallocated file.
// MB/s is 10^6 bytes per second, as fio's. The file is removed at exit.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>

#include "bench.h"
#include "zps/common/config.h"
#include "zps/server/nvme.h"

namespace zps::bench {
namespace {

using server::AlignedBufferPool;
using server::IoRequest;
using server::SpillFile;

struct Options {
  std::string dir;              // Default: "" (required)
  uint64_t bytes = 1ull << 30;  // Default: 1 GiB
  uint64_t block = 1ull << 20;  // Default: 1 MiB
  int depth = 16;               // Default: 16
  int reps = 1;                 // Default: 1
  bool json = false;            // Default: false
};

int Fail(const Status& s) { return bench::Fail("disk", s); }

// One sequential pass over the file; returns seconds.
Result<double> Pass(server::IoEngine& io, const SpillFile& file, const AlignedBufferPool& pool,
                    IoRequest::Op op, uint64_t bytes, uint64_t block) {
  const uint64_t blocks = bytes / block;
  uint64_t issued = 0, done = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (done < blocks) {
    while (issued < blocks && io.in_flight() < io.depth()) {
      const size_t slot = issued % pool.count();
      ZPS_RETURN_IF_ERROR(io.Push({.op = op,
                                   .fd = file.fd(),
                                   .buf = pool.buffer(slot),
                                   .len = static_cast<uint32_t>(block),
                                   .offset = issued * block,
                                   .tag = issued}));
      ++issued;
    }
    ZPS_ASSIGN_OR_RETURN(auto c, io.Wait());
    if (c.res < 0) return ErrnoError("disk bench i/o at block " + std::to_string(c.tag), -c.res);
    if (static_cast<uint64_t>(c.res) != block) {
      return IoError("short i/o at block " + std::to_string(c.tag));
    }
    ++done;
  }
  if (op == IoRequest::Op::kWrite && ::fdatasync(file.fd()) != 0) {
    return ErrnoError("fdatasync " + file.path(), errno);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Run(int argc, char** argv) {
  Options o;
  Flags flags("zps-bench disk",
              "Sequential O_DIRECT io_uring write then read of one file (fio's settings).");
  flags.Add("dir", "directory to measure (a file is created there and removed)", &o.dir);
  flags.AddBytes("bytes", "file size", &o.bytes);
  flags.AddBytes("block", "bytes per request", &o.block);
  flags.Add("depth", "requests in flight", &o.depth, 1, 1024);
  flags.Add("reps", "write+read repetitions", &o.reps, 1, 100);
  flags.Add("json", "print one JSON object per line", &o.json);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) return Fail(parsed.status());
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  if (o.dir.empty()) return Fail(InvalidArgument("--dir is required"));
  if (o.block == 0 || o.block % server::kDirectAlign != 0 || o.block > (64ull << 20)) {
    return Fail(InvalidArgument("--block must be a multiple of 4096 up to 64 MiB"));
  }
  o.bytes = o.bytes / o.block * o.block;
  if (o.bytes == 0) return Fail(InvalidArgument("--bytes is smaller than --block"));

  auto file = SpillFile::Create(o.dir, "zps-bench-disk.tmp", o.bytes, {});
  if (!file.ok()) return Fail(file.status());
  auto pool = AlignedBufferPool::Create(static_cast<size_t>(o.depth), o.block);
  if (!pool.ok()) return Fail(pool.status());
  for (size_t i = 0; i < (*pool)->count(); ++i) {
    std::fill_n((*pool)->buffer(i), (*pool)->buffer_bytes(), std::byte{0x5a});
  }
  auto io = server::CreateUringEngine({.depth = static_cast<uint32_t>(o.depth)});
  if (!io.ok()) return Fail(io.status());
  for (int rep = 0; rep < o.reps; ++rep) {
    auto w = Pass(**io, **file, **pool, IoRequest::Op::kWrite, o.bytes, o.block);
    if (!w.ok()) return Fail(w.status());
    auto r = Pass(**io, **file, **pool, IoRequest::Op::kRead, o.bytes, o.block);
    if (!r.ok()) return Fail(r.status());
    const double mb = static_cast<double>(o.bytes) / 1e6;
    if (o.json) {
      std::printf(
          "{\"bench\":\"disk\",\"bytes\":%llu,\"block\":%llu,\"depth\":%d,"
          "\"write_mbps\":%.0f,\"read_mbps\":%.0f}\n",
          static_cast<unsigned long long>(o.bytes), static_cast<unsigned long long>(o.block),
          o.depth, mb / *w, mb / *r);
    } else {
      std::printf("rep %d: sequential O_DIRECT write %.0f MB/s, read %.0f MB/s (%llu KiB x %d)\n",
                  rep, mb / *w, mb / *r, static_cast<unsigned long long>(o.block >> 10), o.depth);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

ZPS_BENCH_SUBCOMMAND("disk", "sequential O_DIRECT io_uring ceiling of a directory (fio's settings)",
                     Run);

}  // namespace zps::bench
