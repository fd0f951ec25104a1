// Writes the seed corpora (tests/fuzz/corpus/<target>/seed-*) from real encodings, so that the
// fuzzers start past the magic numbers, lengths and CRCs. Run once when a format changes:
//   build/bin/fuzz_make_seeds tests/fuzz/corpus
// (libFuzzer's -merge then adds what a run found; see scripts/fuzz.sh).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zps/common/bytes.h"
#include "zps/common/frame.h"
#include "zps/common/layout.h"
#include "zps/common/messages.h"
#include "zps/server/job.h"

namespace {

namespace msg = zps::msg;
std::filesystem::path root;
int written = 0;

void Write(const std::string& target, const std::string& name, const std::vector<std::byte>& b) {
  auto dir = root / target;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / ("seed-" + name), std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  ++written;
}
std::vector<std::byte> Tagged(uint8_t tag, const std::vector<std::byte>& body) {
  std::vector<std::byte> out(body.size() + 1);
  out[0] = std::byte{tag};
  for (size_t i = 0; i < body.size(); ++i) out[i + 1] = body[i];
  return out;
}
std::vector<std::byte> Text(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()),
          reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds CORPUS_DIR\n");
    return 2;
  }
  root = argv[1];
  auto layout = zps::Layout::Build({{"a", {100}}, {"b", {30}}, {"c", {7, 9}}},
                                   {.chunk_elems = 128, .align_elems = 64, .num_shards = 2});
  if (!layout.ok()) return 1;
  zps::server::JobSpec job{*layout, {}, {}, {}};
  job.shard.world_size = 2;
  const auto spec = job.Serialize();
  zps::server::JobSpec job2 = job;
  job2.shard.accumulation_steps = 4;
  job2.shard.param_groups = {{1e-3f, 0.01f}, {5e-4f, 0.0f}};
  job2.shard.param_group = {0, 1, 1};
  job2.shard.frozen = {0, 0, 1};

  // frame
  Write("frame", "join", zps::EncodeFrame(msg::kJoin, 7, msg::Join{1, job.Hash(), spec}.Encode()));
  Write("frame", "empty", zps::EncodeFrame(msg::kStatus, 1, {}));
  Write("frame", "error",
        zps::EncodeFrame(0xFFFF, 3, zps::EncodeErrorPayload(zps::Unavailable("shard 1 is gone"))));
  // messages (tag = the case in fuzz_messages.cc)
  msg::JoinReply jr;
  jr.shard_endpoints = {"10.0.0.1:7070", "10.0.0.2:7070"};
  jr.layout = layout->Serialize();
  jr.world_size = 2;
  msg::Report rep{12, 1, {{1, 0.5, false}, {3, 2.0, true}}};
  msg::ChunkCrcs crcs;
  crcs.version = 5;
  crcs.crcs = {{0, 0x1234}, {2, 0x5678}};
  msg::ReshardInfo info{1, 2, layout->Hash(), job.Hash(), 15, spec, Text("manifest")};
  msg::ReshardValues values{{"k1", "k2"}, {"v1", "v2"}, true};
  const std::vector<std::vector<std::byte>> m = {msg::ChunkCrcsRequest{3}.Encode(),
                                                 msg::ReadMasterRequest{1, 2, 0, 64}.Encode(),
                                                 msg::MasterRange{}.Encode(),
                                                 crcs.Encode(),
                                                 msg::RegisterShard{1, "10.0.0.2:7070"}.Encode(),
                                                 msg::Join{0, job.Hash(), spec}.Encode(),
                                                 jr.Encode(),
                                                 rep.Encode(),
                                                 msg::CommitInfo{}.Encode(),
                                                 msg::AwaitCommit{12}.Encode(),
                                                 msg::CheckpointReport{}.Encode(),
                                                 msg::ShardSync{}.Encode(),
                                                 msg::ShardSyncReply{}.Encode(),
                                                 msg::CheckpointDone{}.Encode(),
                                                 msg::KvSet{0, "zps/key", Text("value")}.Encode(),
                                                 msg::KvGet{0, "zps/key", 100}.Encode(),
                                                 msg::KvReply{}.Encode(),
                                                 info.Encode(),
                                                 msg::ReshardFetch{15, 1, Text("k")}.Encode(),
                                                 values.Encode(),
                                                 msg::ReshardReport{1, 3, 15, true}.Encode(),
                                                 msg::ReshardStatus{3, 15, 2, false}.Encode()};
  for (size_t i = 0; i < m.size(); ++i) {
    Write("messages", std::to_string(i), Tagged(static_cast<uint8_t>(i), m[i]));
  }
  // am_headers
  msg::PushRmaHeader prma;
  prma.push = {5, 6, 12, 1, 0, 16, 1, zps::DType::kF16};
  prma.remote_address = 4096;
  prma.rkey = std::vector<std::byte>(24, std::byte{0x11});
  const std::vector<std::vector<std::byte>> am = {
      msg::FetchHeader{5, 6, 1, 0, 64, 12}.Encode(),
      msg::FetchReplyHeader{6, 0, 12, ""}.Encode(),
      msg::FetchRmaReplyHeader{}.Encode(),
      msg::PushHeader{5, 6, 12, 1, 0, 16, 1, zps::DType::kF16}.Encode(),
      prma.Encode(),
      msg::PushReplyHeader{6, 4, "stale step"}.Encode(),
      msg::ServingNoticeHeader{5, 12}.Encode()};
  for (size_t i = 0; i < am.size(); ++i) {
    Write("am_headers", std::to_string(i), Tagged(static_cast<uint8_t>(i), am[i]));
  }
  // job_layout
  Write("job_layout", "layout", Tagged(0, layout->Serialize()));
  Write("job_layout", "job-v1", Tagged(1, spec));
  Write("job_layout", "job-v2", Tagged(1, job2.Serialize()));
  // config
  Write("config", "all",
        Text(R"({"name": "n", "on": true, "ratio": 0.5, "steps": 7, )"
             R"("port": 7070, "budget": "64KiB", "mode": "b"})"));
  Write("config", "bad", Text(R"({"port": 70000})"));
  // checkpoint: key (8 bytes, big-endian) + a manifest (format 1) / a global record
  {
    zps::ByteWriter w;
    for (int i = 7; i >= 0; --i) w.U8(static_cast<uint8_t>(15 >> (8 * i)));
    w.U32(0x4d4b435a);  // "ZCKM"
    w.U32(1);
    w.I64(15);
    w.I64(1700000000000);
    w.U64(layout->Hash());
    w.U32(1);
    w.U64(1 << 20);
    w.U64(4096);
    w.U8(1);
    w.U64(32);
    w.U32(0xabcdef);
    w.U32(1);
    w.U32(1);
    w.I64(15);
    w.U64(128);
    Write("checkpoint", "manifest", w.Take());
  }
  {
    zps::ByteWriter w;
    for (int i = 0; i < 8; ++i) w.U8(0);
    w.I64(15);
    w.U32(2);
    w.U32(2);
    w.U32(0);
    w.U32(1);
    Write("checkpoint", "global", w.Take());
  }
  std::printf("%d seeds written under %s\n", written, root.c_str());
  return 0;
}
