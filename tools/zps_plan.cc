// zps-plan: predicts a zps job's memory per shard and worker, bytes per step on every link and
// the bounds and expected value of its step time, from a model size, a cluster shape and the
// job's modes.
//
//   zps-plan --params 70e9 --nodes 8 --gpus-per-node 8 --link-gbps 100
//   zps-plan --params 7e9 --nodes 1 --grad bf16 --pre-reduced --json
//   zps-plan --tensors model.json --nodes 4 --gpus-per-node 1 --fetch int8 --grad int4
//
// The measured constants (link efficiency, optimizer rate, compute time) can come from a JSON
// --config file as any other option; docs/scaling.md describes the model and its assumptions.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "zps/common/config.h"
#include "zps/tools/plan.h"

namespace {

using zps::plan::Format;
using zps::plan::PlanInput;

void AddFormat(zps::Flags& f, const char* name, const char* help, Format* field) {
  f.AddCustom(name, help, std::string(zps::plan::FormatName(*field)),
              [field](std::string_view text) -> zps::Status {
                ZPS_ASSIGN_OR_RETURN(*field, zps::plan::ParseFormat(text));
                return zps::Status::Ok();
              });
}

void AddCount(zps::Flags& f, const char* name, const char* help, double* field) {
  char def[32];
  std::snprintf(def, sizeof(def), "%g", *field);
  f.AddCustom(name, help, def, [field](std::string_view text) -> zps::Status {
    ZPS_ASSIGN_OR_RETURN(*field, zps::ParseDouble(text));
    return zps::Status::Ok();
  });
}

void AddByteSize(zps::Flags& f, const char* name, const char* help, double* field) {
  f.AddCustom(name, help, std::to_string(static_cast<uint64_t>(*field)),
              [field](std::string_view text) -> zps::Status {
                ZPS_ASSIGN_OR_RETURN(uint64_t v, zps::ParseBytes(text));
                *field = static_cast<double>(v);
                return zps::Status::Ok();
              });
}

}  // namespace

int main(int argc, char** argv) {
  PlanInput in;
  bool json = false, separate = false;
  std::string reduction = "server-sum", fetch_strategy = "direct", collectives = "ring";
  int64_t weight_block = static_cast<int64_t>(in.weight_block);
  int64_t grad_block = static_cast<int64_t>(in.grad_block);
  zps::Flags f("zps-plan",
               "Predicts a zps job: memory per shard (RAM, NVMe) and per worker, bytes per step "
               "on every link, and the step time: its lower bound (network overlapped with "
               "compute, NVMe with the optimizer), its expected value (the forward's fetches, then "
               "the backward's pushes, each phase overlapped with its compute) and its upper bound "
               "(nothing overlapped). Sizes per element: fp32 4, fp16/bf16 2, int8 1 and int4 0.5 "
               "bytes plus a 4-byte scale per block (--weight-block, --grad-block); shard state: "
               "fp32 master + 2 moments (fp32 4, bf16 2, int8 1 byte) + the serving copy in the "
               "fetch format: 14, 10 or 8 bytes a parameter with bf16 fetches. docs/scaling.md "
               "describes the model.");
  AddCount(f, "params", "parameters of the model (e.g. 70e9)", &in.params);
  std::string tensors_file;
  f.Add("tensors",
        "a JSON file: the model's tensors in registration order, each an element count or a "
        "shape ([[256, 512], 512, ...]); the quantized bytes are then those of the layout's "
        "pieces, exact, and --params is their sum",
        &tensors_file);
  int64_t chunk_elems = static_cast<int64_t>(in.chunk_elems);
  int64_t align_elems = in.align_elems;
  f.Add("chunk-elems", "with --tensors: elements per chunk (zps-train's --chunk-elems)",
        &chunk_elems, 1, int64_t{1} << 40);
  f.Add("align-elems",
        "with --tensors: each tensor's alignment in elements, the job's (0: zps-train's, "
        "--weight-block with an int8/int4 fetch, else 64)",
        &align_elems, 0, int64_t{1} << 30);
  f.Add("nodes", "worker hosts", &in.nodes, 1, 1 << 20);
  f.Add("gpus-per-node", "workers (ranks, one per GPU) per worker host", &in.gpus_per_node, 1,
        1024);
  f.Add("shards", "shards (0 = one per node)", &in.shards, 0, 1 << 20);
  f.Add("separate-shard-hosts",
        "each shard on its own host with its own link (default: the shards run on the worker "
        "nodes, spread evenly)",
        &separate);
  f.Add("link-gbps", "link rate per host, Gbit/s each way", &in.link_gbps);
  f.Add("link-efficiency", "payload fraction of the link rate (measured: bench-network.sh)",
        &in.link_efficiency);
  f.Add("nvme-gbytes-s", "NVMe GB/s per host (0 = none)", &in.nvme_gbytes_s);
  AddByteSize(f, "shard-ram", "RAM per shard for master + moments (0 = unlimited; over it spills)",
              &in.shard_ram_bytes);
  AddFormat(f, "fetch", "what workers fetch: bf16, fp16, fp32, int8 or int4", &in.fetch);
  AddFormat(f, "grad", "what workers push: fp32, bf16, fp16, int8 or int4", &in.grad);
  AddFormat(f, "state", "the optimizer's moments: fp32, bf16 or int8", &in.state);
  f.Add("weight-block", "elements per fp32 scale of int8/int4 fetches (the job's serving blocks)",
        &weight_block, 1, 1 << 30);
  f.Add("grad-block", "elements per fp32 scale of int8/int4 gradient pushes", &grad_block, 1,
        1 << 30);
  f.Add("reduction", "server-sum or pre-reduced", &reduction);
  f.Add("fetch-strategy", "direct or bandwidth-centric", &fetch_strategy);
  f.Add("collectives",
        "ring (NCCL on GPU workers) or gloo (zps's CPU workers: Gloo's halving-doubling "
        "reduce-scatter, which sends more than a ring)",
        &collectives);
  f.Add("serial-collectives",
        "the reduce-scatter runs on the training thread between the backward's layers "
        "(zps-train) instead of beside the backward (zps.torch): its time adds to the compute",
        &in.serial_collectives);
  AddByteSize(f, "worker-live-bytes", "a worker's live window (zps-train --max-live-bytes)",
              &in.worker_live_bytes);
  AddByteSize(f, "prefetch-bytes", "a worker's prefetch (zps-train --prefetch-bytes)",
              &in.prefetch_bytes);
  AddByteSize(f, "bucket-bytes", "pre-reduced bucket (zps-train --bucket-bytes)", &in.bucket_bytes);
  AddCount(f, "optimizer-rate",
           "parameters/s one shard's optimizer pass updates (zps-bench "
           "optimizer)",
           &in.optimizer_rate);
  f.Add("compute-s", "a worker's forward + backward per step, seconds", &in.compute_s);
  AddCount(f, "tokens-per-gpu", "tokens per GPU per step (with --gpu-tflops: 6 P T / FLOP/s)",
           &in.tokens_per_gpu);
  f.Add("gpu-tflops", "achieved TFLOP/s per GPU", &in.gpu_tflops);
  f.Add("json", "print one JSON line instead of the report", &json);
  auto parsed = f.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-plan: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == zps::ParseOutcome::kHelpShown) return 0;
  in.colocated = !separate;
  in.chunk_elems = static_cast<uint64_t>(chunk_elems);
  in.align_elems = static_cast<uint32_t>(align_elems);
  if (!tensors_file.empty()) {
    std::ifstream file(tensors_file);
    std::stringstream text;
    text << file.rdbuf();
    if (!file) {
      std::fprintf(stderr, "zps-plan: cannot read --tensors %s\n", tensors_file.c_str());
      return 2;
    }
    auto tensors = zps::plan::ParseTensorList(text.str());
    if (!tensors.ok()) {
      std::fprintf(stderr, "zps-plan: %s: %s\n", tensors_file.c_str(),
                   tensors.status().ToString().c_str());
      return 2;
    }
    in.tensors = std::move(*tensors);
    if (in.params == 0) {
      for (uint64_t n : in.tensors) in.params += static_cast<double>(n);
    }
  }
  in.weight_block = static_cast<uint64_t>(weight_block);
  in.grad_block = static_cast<uint64_t>(grad_block);
  if (reduction != "server-sum" && reduction != "pre-reduced") {
    std::fprintf(stderr, "zps-plan: --reduction must be server-sum or pre-reduced\n");
    return 2;
  }
  if (fetch_strategy != "direct" && fetch_strategy != "bandwidth-centric") {
    std::fprintf(stderr, "zps-plan: --fetch-strategy must be direct or bandwidth-centric\n");
    return 2;
  }
  if (collectives != "ring" && collectives != "gloo") {
    std::fprintf(stderr, "zps-plan: --collectives must be ring or gloo\n");
    return 2;
  }
  in.gloo_collectives = collectives == "gloo";
  in.pre_reduced = reduction == "pre-reduced";
  in.bandwidth_centric = fetch_strategy == "bandwidth-centric";
  auto plan = zps::plan::MakePlan(in);
  if (!plan.ok()) {
    std::fprintf(stderr, "zps-plan: %s\n", plan.status().ToString().c_str());
    return 2;
  }
  std::printf("%s\n",
              (json ? zps::plan::PlanJson(in, *plan) : zps::plan::FormatPlan(in, *plan)).c_str());
  return 0;
}
