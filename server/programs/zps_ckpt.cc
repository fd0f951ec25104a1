// zps-ckpt — inspect, export and reshard shard checkpoints offline.
//
//   zps-ckpt inspect --data-dir D[,D2...] [--verify]
//   zps-ckpt export  --data-dir D0,D1,... --out model.safetensors [--step S] [--dtype fp32|bf16]
//                    [--max-shard-size 5GB]  (then --out is a directory: Hugging Face's sharded
//                    model-0000i-of-0000N.safetensors and model.safetensors.index.json)
//   zps-ckpt reshard --data-dir A,B --out C,D,E [--step S] [--coordinator-out DIR]
//                    [--world-size W --accumulation-steps K] [--state-dtype fp32|bf16|int8]
//                    (the job's stores for another shard count, or the same one: --out names
//                    shard 0's store first; the inputs are only read; --state-dtype converts
//                    the moments)
//   zps-ckpt save    --endpoint host:port --token-file F [--timeout S]
//                    (on-demand: the coordinator checkpoints every shard at the next step
//                    boundary; prints the step once it is complete on every shard)
//
// Stores are opened read-only, so inspect and export work beside a running shard (they see the
// state as of opening). Exit status: 0 success, 1 an error (printed as CODE: message), 2 bad usage.
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "zps/common/config.h"
#include "zps/common/dtype.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"
#include "zps/server/checkpoint.h"
#include "zps/server/checkpoint_export.h"
#include "zps/server/checkpoint_reshard.h"
#include "zps/server/shard_server.h"

namespace {

struct Options {
  std::string data_dir;         // Default: none — comma-separated checkpoint stores
  bool verify = false;          // Default: false — inspect reads every value
  int64_t step = -1;            // Default: -1 — the newest step committed on every shard
  std::string out;              // Default: none — export: output file; reshard: output stores
  std::string coordinator_out;  // Default: none — reshard: <parent of the first --out>/coordinator
  int64_t world_size = 0;       // Default: 0 — reshard: keep the job's
  int64_t accumulation = 0;     // Default: 0 — reshard: keep the job's
  std::string dtype = "fp32";   // Default: fp32
  std::string state_dtype;      // Default: none — reshard: keep the checkpoint's
  uint64_t max_shard_size = 0;  // Default: 0 — export: one file; else the sharded set's limit
  std::string endpoint;         // Default: none — save: the coordinator's control endpoint
  std::string token_file;       // Default: none — save: the shared auth secret's file
  int64_t timeout_s = 600;      // Default: 600 s — save: longest wait for the checkpoint
};

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string FormatTime(int64_t unix_ms) {
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

zps::Status Inspect(const Options& o) {
  auto dirs = SplitComma(o.data_dir);
  if (dirs.empty()) return zps::InvalidArgument("inspect needs --data-dir");
  zps::server::CheckpointOptions copts;
  copts.read_only = true;
  copts.create_if_missing = false;
  for (const auto& dir : dirs) {
    ZPS_ASSIGN_OR_RETURN(auto store, zps::server::CheckpointStore::Open(dir, copts));
    auto layout = store->GetLayout();
    auto shard = store->GetShard();
    if (layout.ok() && shard.ok()) {
      std::printf("%s: shard %u of %u, layout %016llx (%u params, %u chunks, %llu elements)\n",
                  dir.c_str(), *shard, layout->options().num_shards,
                  static_cast<unsigned long long>(layout->Hash()), layout->num_params(),
                  layout->num_chunks(), static_cast<unsigned long long>(layout->total_elems()));
    } else {
      std::printf("%s: no identity recorded (%s)\n", dir.c_str(),
                  layout.status().ToString().c_str());
    }
    ZPS_ASSIGN_OR_RETURN(auto list, store->ListCheckpoints(o.verify));
    std::printf("  %-12s %-21s %7s %14s %-5s  %s\n", "step", "created", "chunks", "bytes", "state",
                "status");
    for (const auto& c : list) {
      const bool corrupt = c.verification == zps::server::Verification::kCorrupt;
      std::printf("  %-12lld %-21s %7zu %14llu %-5s  %s%s%s\n", static_cast<long long>(c.step),
                  corrupt ? "-" : FormatTime(c.created_unix_ms).c_str(), c.chunks.size(),
                  static_cast<unsigned long long>(c.bytes),
                  corrupt ? "-" : std::string(zps::StateDTypeName(c.state_dtype)).c_str(),
                  std::string(zps::server::VerificationName(c.verification)).c_str(),
                  c.problem.empty() ? "" : ": ", c.problem.c_str());
    }
    if (list.empty()) std::printf("  (no checkpoints)\n");
    std::printf("  disk: %llu bytes of SST and blob files\n",
                static_cast<unsigned long long>(store->DiskBytes()));
  }
  return zps::Status::Ok();
}

zps::Status Export(const Options& o) {
  zps::server::ExportOptions e;
  e.data_dirs = SplitComma(o.data_dir);
  if (e.data_dirs.empty()) return zps::InvalidArgument("export needs --data-dir (one per shard)");
  if (o.out.empty()) return zps::InvalidArgument("export needs --out");
  e.step = o.step;
  e.out = o.out;
  e.max_shard_bytes = o.max_shard_size;
  ZPS_ASSIGN_OR_RETURN(e.dtype, zps::ParseDType(o.dtype));
  ZPS_ASSIGN_OR_RETURN(auto stats, zps::server::ExportSafetensors(e));
  std::printf(
      "exported step %lld: %llu parameters, %llu bytes (%s) in %u file%s to %s; peak buffer %llu "
      "bytes\n",
      static_cast<long long>(stats.step), static_cast<unsigned long long>(stats.params),
      static_cast<unsigned long long>(stats.file_bytes), o.dtype.c_str(), stats.files,
      stats.files == 1 ? "" : "s", o.out.c_str(),
      static_cast<unsigned long long>(stats.peak_buffer_bytes));
  return zps::Status::Ok();
}

zps::Status Reshard(const Options& o) {
  zps::server::KeepFreedMemory();
  zps::server::ReshardOptions r;
  r.inputs = SplitComma(o.data_dir);
  r.outputs = SplitComma(o.out);
  r.step = o.step;
  r.coordinator_out = o.coordinator_out;
  r.world_size = static_cast<uint32_t>(o.world_size);
  r.accumulation_steps = static_cast<uint32_t>(o.accumulation);
  if (!o.state_dtype.empty()) {
    ZPS_ASSIGN_OR_RETURN(r.state_dtype, zps::ParseStateDType(o.state_dtype));
  }
  if (r.inputs.empty())
    return zps::InvalidArgument("reshard needs --data-dir (every shard's store)");
  if (r.outputs.empty())
    return zps::InvalidArgument("reshard needs --out (one store per new shard)");
  ZPS_ASSIGN_OR_RETURN(auto stats, zps::server::ReshardCheckpoint(r));
  std::string moments;
  if (stats.state_dtype != stats.from_state_dtype) {
    moments = "; moments converted from " +
              std::string(zps::StateDTypeName(stats.from_state_dtype)) + " to " +
              std::string(zps::StateDTypeName(stats.state_dtype));
  }
  std::printf(
      "resharded step %lld from %u to %u shards: %u chunks, %llu bytes%s; coordinator catalog in "
      "%s\n",
      static_cast<long long>(stats.step), stats.from_shards, stats.to_shards, stats.chunks,
      static_cast<unsigned long long>(stats.bytes), moments.c_str(), stats.coordinator_dir.c_str());
  return zps::Status::Ok();
}

zps::Status Save(const Options& o) {
  if (o.endpoint.empty()) return zps::InvalidArgument("save needs --endpoint host:port");
  if (o.token_file.empty()) return zps::InvalidArgument("save needs --token-file");
  ZPS_ASSIGN_OR_RETURN(auto hp, zps::SplitHostPort(o.endpoint));
  ZPS_ASSIGN_OR_RETURN(std::string token, zps::ReadTokenFile(o.token_file));
  zps::rpc::ClientOptions co{hp.first, hp.second,  token, zps::rpc::PeerRole::kTool,
                             0,        "zps-ckpt", {},    5000};
  ZPS_ASSIGN_OR_RETURN(auto client, zps::rpc::Client::Connect(co));
  ZPS_ASSIGN_OR_RETURN(
      auto reply, client->Call(zps::msg::kCheckpointNow, {}, std::chrono::seconds(o.timeout_s)));
  ZPS_ASSIGN_OR_RETURN(auto done, zps::msg::CheckpointDone::Decode(reply));
  std::printf("checkpoint of step %lld complete on all %u shards\n",
              static_cast<long long>(done.step), done.shards);
  return zps::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  zps::Flags flags(
      "zps-ckpt",
      "Inspect, export and reshard zps shard checkpoints.\n"
      "  zps-ckpt inspect --data-dir D[,D2...] [--verify]\n"
      "  zps-ckpt export --data-dir D0,D1,... --out F.safetensors [--step S] "
      "[--dtype fp32|bf16]\n"
      "  zps-ckpt export --data-dir D0,D1,... --out DIR --max-shard-size 5GB [--step S] "
      "[--dtype fp32|bf16]\n"
      "      (Hugging Face's sharded form: DIR/model-00001-of-0000N.safetensors ... and "
      "DIR/model.safetensors.index.json)\n"
      "      A new job starts from either form with zt.initialize(model, config, "
      "init_from=path) (zps.torch).\n"
      "  zps-ckpt reshard --data-dir A,B --out C,D,E [--step S] [--coordinator-out DIR] "
      "[--world-size W --accumulation-steps K] [--state-dtype fp32|bf16|int8]\n"
      "  zps-ckpt save --endpoint host:port --token-file F [--timeout S]");
  flags.AllowPositional(1, "inspect|export|reshard|save");
  flags.Add("data-dir", "checkpoint store directories, comma-separated (export: one per shard)",
            &o.data_dir);
  flags.Add("verify", "inspect: read every value and check its CRC32C", &o.verify);
  flags.Add("step",
            "export, reshard: the checkpoint step; -1 = newest on every shard (reshard: every "
            "store's newest, which must agree)",
            &o.step, -1, INT64_MAX);
  flags.Add("out",
            "export: the output .safetensors file (with --max-shard-size, the directory of the "
            "set); reshard: the new stores, comma-separated, shard 0's first",
            &o.out);
  flags.Add("coordinator-out",
            "reshard: where the new coordinator catalog goes (default: coordinator/ beside the "
            "first --out)",
            &o.coordinator_out);
  flags.Add("world-size",
            "reshard: the workers from this step on (with --accumulation-steps; their product "
            "must stay the job's)",
            &o.world_size, 0, 65536);
  flags.Add("accumulation-steps", "reshard: micro-batches per rank and step from this step on",
            &o.accumulation, 0, 1024);
  flags.Add("dtype", "export: fp32 or bf16", &o.dtype);
  flags.Add("state-dtype",
            "reshard: convert Adam's moments (SGD's momentum) to fp32, bf16 or int8, and the "
            "job's optimizer.state_dtype with them; resume with that state dtype (default: keep "
            "the checkpoint's)",
            &o.state_dtype);
  flags.AddBytes("max-shard-size",
                 "export: write the sharded set, each file's tensor data at most this size "
                 "(5GB = 5e9 bytes, 4GiB = 2^32; a larger tensor gets a file of its own); 0 = "
                 "one file",
                 &o.max_shard_size);
  flags.Add("endpoint", "save: the coordinator's control endpoint host:port", &o.endpoint);
  flags.Add("token-file", "save: file holding the shared auth secret", &o.token_file);
  flags.Add("timeout", "save: seconds to wait for the checkpoint", &o.timeout_s, 1, 86400);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-ckpt: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == zps::ParseOutcome::kHelpShown) return 0;
  if (flags.positional().size() != 1) {
    std::fprintf(stderr,
                 "zps-ckpt: expected one command: inspect, export, reshard or save (see --help)\n");
    return 2;
  }
  const std::string& cmd = flags.positional()[0];
  zps::Status s;
  if (cmd == "inspect") {
    s = Inspect(o);
  } else if (cmd == "export") {
    s = Export(o);
  } else if (cmd == "reshard") {
    s = Reshard(o);
  } else if (cmd == "save") {
    s = Save(o);
  } else {
    std::fprintf(stderr, "zps-ckpt: unknown command '%s' (see --help)\n", cmd.c_str());
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "zps-ckpt %s: %s\n", cmd.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}
