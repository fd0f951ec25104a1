#include "zps/tools/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/serving_quant.h"

namespace zps::plan {
namespace {

constexpr double kScaleBytes = 4;  // one fp32 scale per quantization block

// A quantity in B, kB, MB, GB, TB (powers of 1000, as link rates are).
std::string Si(double bytes) {
  static const char* const kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (std::fabs(bytes) >= 1000 && u < 5) {
    bytes /= 1000;
    ++u;
  }
  char b[48];
  std::snprintf(b, sizeof(b), u == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[u]);
  return b;
}

std::string Seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), s < 1 ? "%.1f ms" : "%.2f s", s < 1 ? s * 1e3 : s);
  return b;
}

// Bits of a quantized format, 0 for the others.
uint8_t QuantBits(Format f) { return f == Format::kInt8 ? 8 : f == Format::kInt4 ? 4 : 0; }

// What one host's link carries in a step, by the phase that moves it: with the fetches (the
// forward, and the backward again with a second pass) or with the pushes (the backward).
struct HostTraffic {
  LinkBytes fetch, push;

  LinkBytes Total() const { return {fetch.out + push.out, fetch.in + push.in}; }
  // The busier direction of a phase that moves `fetch_share` of the fetch side and `push_share`
  // of the push side; both directions run at once.
  double Busier(double fetch_share, double push_share) const {
    return std::max(fetch_share * fetch.out + push_share * push.out,
                    fetch_share * fetch.in + push_share * push.in);
  }
};

// Bytes one fetch and one push of the whole model move, summed over the layout's pieces as the
// workers send them (plan.h says why this is exact where ElementBytes is an average).
struct ModelBytes {
  double fetch = 0;
  double push = 0;
};

Result<ModelBytes> PieceBytes(const PlanInput& in, uint32_t shards) {
  std::vector<ParamSpec> specs;
  specs.reserve(in.tensors.size());
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    specs.push_back({"t" + std::to_string(i), {static_cast<int64_t>(in.tensors[i])}});
  }
  const uint8_t fetch_bits = QuantBits(in.fetch), grad_bits = QuantBits(in.grad);
  const uint32_t align = in.align_elems != 0 ? in.align_elems
                         : fetch_bits != 0   ? static_cast<uint32_t>(in.weight_block)
                                             : LayoutOptions{}.align_elems;
  ZPS_ASSIGN_OR_RETURN(Layout layout,
                       Layout::Build(std::move(specs), {in.chunk_elems, align, shards}));
  const QuantFormat wf{fetch_bits, static_cast<uint32_t>(in.weight_block)};
  const QuantFormat gf{grad_bits, static_cast<uint32_t>(in.grad_block)};
  const double fetch_elem = ElementBytes(in.fetch, in.weight_block);
  const double grad_elem = ElementBytes(in.grad, in.grad_block);
  ModelBytes b;
  for (uint32_t p = 0; p < layout.num_params(); ++p) {
    ZPS_ASSIGN_OR_RETURN(auto pieces, layout.Pieces(p, 0, layout.param_numel(p)));
    for (const Piece& piece : pieces) {
      b.fetch += fetch_bits != 0
                     ? static_cast<double>(QuantizedCovering(wf, layout.chunk_size(piece.chunk),
                                                             piece.chunk_offset,
                                                             piece.chunk_offset + piece.length)
                                               .bytes)
                     : static_cast<double>(piece.length) * fetch_elem;
      b.push += grad_bits != 0 ? static_cast<double>(QuantizedBytes(gf, piece.length))
                               : static_cast<double>(piece.length) * grad_elem;
    }
  }
  return b;
}

}  // namespace

Result<std::vector<uint64_t>> ParseTensorList(std::string_view json) {
  using Json = nlohmann::json;
  Json doc = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array() || doc.empty()) {
    return InvalidArgument("tensors: expected a non-empty JSON array of element counts or shapes");
  }
  auto positive = [](const Json& v) { return v.is_number_integer() && v.get<int64_t>() > 0; };
  std::vector<uint64_t> out;
  out.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const Json& t = doc[i];
    uint64_t n = 1;
    if (positive(t)) {
      n = t.get<uint64_t>();
    } else if (t.is_array() && !t.empty()) {
      for (const Json& d : t) {
        if (!positive(d)) {
          return InvalidArgument("tensors[" + std::to_string(i) +
                                 "]: a dimension is not a positive integer");
        }
        if (n > kMaxTotalElems / d.get<uint64_t>()) {
          return InvalidArgument("tensors[" + std::to_string(i) + "]: more than 2^40 elements");
        }
        n *= d.get<uint64_t>();
      }
    } else {
      return InvalidArgument("tensors[" + std::to_string(i) +
                             "]: not a positive element count or a shape");
    }
    out.push_back(n);
  }
  return out;
}

double ReduceScatterHostBytes(double bytes, int ranks, int ranks_per_host, bool gloo) {
  if (ranks <= ranks_per_host) return 0;
  if (!gloo) return (ranks - 1.0) / ranks * bytes;
  int steps = 0;  // log2 of the largest power-of-two block
  while ((int64_t{2} << steps) <= ranks) ++steps;
  const int block = 1 << steps;
  if (block > (1 << 22)) {
    // Too many ranks to walk: at most the whole buffer (the halving steps send 1 - g / block of
    // it off a host of g ranks, the slices its ranks send on at most g / block).
    return bytes;
  }
  auto host = [&](int rank) { return rank / ranks_per_host; };
  auto reversed = [&](int rank) {
    int r = 0;
    for (int i = 0; i < steps; ++i) r |= ((rank >> i) & 1) << (steps - 1 - i);
    return r;
  };
  std::vector<double> sent((block + ranks_per_host - 1) / ranks_per_host, 0.0);
  for (int rank = 0; rank < block; ++rank) {
    for (int i = 0; i < steps; ++i) {
      if (host(rank ^ (1 << i)) != host(rank)) sent[host(rank)] += bytes / (2 << i);
    }
    // The slice this rank holds after halving is reversed(rank)'s, sent on unless it is its own.
    const int owner = reversed(rank);
    if (host(owner) != host(rank)) sent[host(rank)] += bytes / block;
  }
  return *std::max_element(sent.begin(), sent.end());
}

Result<Format> ParseFormat(std::string_view text) {
  if (text == "int8") return Format::kInt8;
  if (text == "int4") return Format::kInt4;
  auto d = ParseDType(text);
  if (!d.ok()) {
    return InvalidArgument("unknown format '" + std::string(text) +
                           "' (fp32, fp16, bf16, int8 or int4)");
  }
  switch (*d) {
    case DType::kF32:
      return Format::kFp32;
    case DType::kF16:
      return Format::kFp16;
    case DType::kBF16:
      return Format::kBf16;
    case DType::kI8Block:
      return Format::kInt8;
    case DType::kI4Block:
      return Format::kInt4;
  }
  return Internal("unhandled dtype");
}

std::string_view FormatName(Format f) {
  switch (f) {
    case Format::kFp32:
      return "fp32";
    case Format::kFp16:
      return "fp16";
    case Format::kBf16:
      return "bf16";
    case Format::kInt8:
      return "int8";
    case Format::kInt4:
      return "int4";
  }
  return "?";
}

double ElementBytes(Format f, uint64_t block) {
  const double scale = kScaleBytes / static_cast<double>(std::max<uint64_t>(block, 1));
  switch (f) {
    case Format::kFp32:
      return static_cast<double>(DTypeSize(DType::kF32));
    case Format::kFp16:
      return static_cast<double>(DTypeSize(DType::kF16));
    case Format::kBf16:
      return static_cast<double>(DTypeSize(DType::kBF16));
    case Format::kInt8:
      return 1 + scale;
    case Format::kInt4:
      return 0.5 + scale;
  }
  return 0;
}

double WindowElementBytes(Format fetch) {
  switch (fetch) {
    case Format::kFp32:
    case Format::kInt8:
    case Format::kInt4:
      return static_cast<double>(DTypeSize(DType::kF32));
    case Format::kFp16:
      return static_cast<double>(DTypeSize(DType::kF16));
    case Format::kBf16:
      return static_cast<double>(DTypeSize(DType::kBF16));
  }
  return 0;
}

Result<double> StateBytesPerParam(Format state, Format serving, uint64_t block) {
  double moment = 0;
  switch (state) {
    case Format::kFp32:
      moment = static_cast<double>(DTypeSize(DType::kF32));
      break;
    case Format::kBf16:
      moment = static_cast<double>(DTypeSize(DType::kBF16));
      break;
    case Format::kInt8:
      moment = 1;  // the block scales of int8 moments are not counted (docs/scaling.md)
      break;
    default:
      return InvalidArgument("the optimizer state can be fp32, bf16 or int8, not " +
                             std::string(FormatName(state)));
  }
  const double master = static_cast<double>(DTypeSize(DType::kF32));
  return master + 2 * moment + ElementBytes(serving, block);
}

Result<Plan> MakePlan(const PlanInput& input) {
  PlanInput in = input;
  if (!in.tensors.empty()) {
    double sum = 0;
    for (uint64_t n : in.tensors) sum += static_cast<double>(n);
    if (in.params > 0 && in.params != sum) {
      return InvalidArgument("--params " + std::to_string(in.params) +
                             " differs from the tensors' sum " + std::to_string(sum));
    }
    in.params = sum;
  }
  if (!(in.params > 0)) return InvalidArgument("--params must be > 0");
  if (in.nodes < 1 || in.gpus_per_node < 1) {
    return InvalidArgument("--nodes and --gpus-per-node must be >= 1");
  }
  if (in.shards < 0) return InvalidArgument("--shards must be >= 0 (0 = one per node)");
  if (!(in.link_gbps > 0) || !(in.link_efficiency > 0) || in.link_efficiency > 1) {
    return InvalidArgument("--link-gbps must be > 0 and --link-efficiency in (0, 1]");
  }
  if (!(in.optimizer_rate > 0)) return InvalidArgument("--optimizer-rate must be > 0");
  if (in.nvme_gbytes_s < 0 || in.shard_ram_bytes < 0 || in.compute_s < 0 || in.tokens_per_gpu < 0 ||
      in.gpu_tflops < 0 || in.worker_live_bytes < 0 || in.prefetch_bytes < 0 ||
      in.bucket_bytes < 0) {
    return InvalidArgument("sizes, rates and times must not be negative");
  }
  if (in.weight_block < 1 || in.grad_block < 1) {
    return InvalidArgument("--weight-block and --grad-block must be >= 1");
  }
  Plan p;
  const double P = in.params;
  p.workers = in.nodes * in.gpus_per_node;
  p.shards = in.shards > 0 ? in.shards : in.nodes;
  if (p.shards > P) return InvalidArgument("more shards than parameters");
  p.shard_hosts = in.colocated ? in.nodes : p.shards;
  const double W = p.workers, S = p.shards, N = in.nodes, G = in.gpus_per_node;
  p.fetch_bytes = ElementBytes(in.fetch, in.weight_block);
  p.grad_bytes = ElementBytes(in.grad, in.grad_block);
  // One fetch and one push of the whole model.
  ModelBytes model{P * p.fetch_bytes, P * p.grad_bytes};
  if (!in.tensors.empty()) {
    ZPS_ASSIGN_OR_RETURN(model, PieceBytes(in, static_cast<uint32_t>(p.shards)));
    p.fetch_bytes = model.fetch / P;  // the pieces' average
    p.grad_bytes = model.push / P;
  }
  ZPS_ASSIGN_OR_RETURN(p.state_bytes, StateBytesPerParam(in.state, in.fetch, in.weight_block));
  p.window_bytes = WindowElementBytes(in.fetch);
  // Forward and backward share one fetch when the whole model, as the worker holds it, fits in
  // the live window.
  p.fetch_passes = P * p.window_bytes <= in.worker_live_bytes ? 1 : 2;
  const double f = p.fetch_bytes * p.fetch_passes, g = p.grad_bytes;
  const double fetch_all = model.fetch * p.fetch_passes, push_all = model.push;
  constexpr double kFp32 = 4;  // the collectives reduce fp32 gradients

  // One rank: what it exchanges with the shards, and with the other ranks.
  const double from_shards = in.bandwidth_centric ? fetch_all / W : fetch_all;
  const double to_shards = in.pre_reduced ? push_all / W : push_all;
  const double gather = in.bandwidth_centric ? (W - 1) / W * P * f : 0;  // all-gather, each way
  // The reduce-scatter: what one rank sends (the busiest, as if alone on its host), and what
  // leaves the busiest host.
  const double scatter =
      in.pre_reduced ? ReduceScatterHostBytes(P * kFp32, p.workers, 1, in.gloo_collectives) : 0;
  p.worker_rank = {to_shards + gather + scatter, from_shards + gather + scatter};
  // A host's ranks form one stretch of the all-gather's ring: only one edge leaves the host, and
  // it carries what one rank's edge does. One host alone: the collectives never leave it.
  const double host_gather = N > 1 ? gather : 0;
  const double host_scatter =
      in.pre_reduced
          ? ReduceScatterHostBytes(P * kFp32, p.workers, in.gpus_per_node, in.gloo_collectives)
          : 0;

  p.shard_in = in.pre_reduced ? push_all / S : W * push_all / S;
  p.shard_out = in.bandwidth_centric ? fetch_all / S : W * fetch_all / S;
  // Colocated, the shards spread evenly over the nodes and 1/N of a node's shard traffic stays
  // on the node; on their own hosts, every byte to or from a shard crosses the worker's link.
  const double remote = in.colocated ? (N - 1) / N : 1, node_shards = in.colocated ? S / N : 0;
  const HostTraffic worker{
      {host_gather + node_shards * p.shard_out * remote, G * from_shards * remote + host_gather},
      {G * to_shards * remote + host_scatter, host_scatter + node_shards * p.shard_in * remote}};
  // A shard host's (separate hosts only).
  const HostTraffic shard =
      in.colocated ? HostTraffic{} : HostTraffic{{p.shard_out, 0}, {0, p.shard_in}};
  p.worker_host = worker.Total();
  p.shard_host = shard.Total();

  // Memory per shard.
  const double n = P / S;
  const double serving = ElementBytes(in.fetch, in.weight_block);
  const double slots = in.pre_reduced ? 1 : W;
  // 16-bit (or quantized) gradients add one fp32 slot for the initial values and the sum.
  p.shard_grad_bytes = n * (slots * g + (g < kFp32 ? kFp32 : 0));
  p.shard_state_bytes = n * p.state_bytes;
  const double optimizer_state = n * (p.state_bytes - serving);
  double resident = optimizer_state;
  if (in.shard_ram_bytes > 0 && optimizer_state > in.shard_ram_bytes) {
    resident = in.shard_ram_bytes;
    p.shard_nvme_bytes = optimizer_state - in.shard_ram_bytes;
  }
  p.shard_ram_bytes = resident + n * serving + p.shard_grad_bytes;

  // Memory per worker.
  p.worker_window_bytes = std::min(in.worker_live_bytes, P * p.window_bytes) +
                          std::min(in.prefetch_bytes, P * p.window_bytes);
  if (in.pre_reduced) {
    const double bucket = std::min(in.bucket_bytes, P * kFp32);
    p.worker_bucket_bytes = bucket + bucket / W;
  }
  if (in.grad == Format::kInt8 || in.grad == Format::kInt4) {
    p.worker_residual_bytes = (in.pre_reduced ? P / W : P) * kFp32;
  }

  // Step time. The forward moves 1/passes of the fetch-side bytes; the backward the rest of them
  // and the pushes. The next step's fetches wait for the update, which waits for the pushes, so
  // on one link the two phases follow each other; within a phase both directions run at once.
  const double rate = in.link_gbps * 1e9 / 8 * in.link_efficiency;
  const double busiest =
      std::max({p.worker_host.out, p.worker_host.in, p.shard_host.out, p.shard_host.in});
  p.t_network = busiest / rate;
  const double forward_share = 1.0 / p.fetch_passes;
  p.t_network_forward =
      std::max(worker.Busier(forward_share, 0), shard.Busier(forward_share, 0)) / rate;
  p.t_network_backward =
      std::max(worker.Busier(1 - forward_share, 1), shard.Busier(1 - forward_share, 1)) / rate;
  if (in.compute_s > 0) {
    p.t_compute = in.compute_s;
  } else if (in.tokens_per_gpu > 0 && in.gpu_tflops > 0) {
    p.t_compute = 6 * P * in.tokens_per_gpu / (in.gpu_tflops * 1e12);
  }
  p.t_optimizer = n / in.optimizer_rate;
  if (p.shard_nvme_bytes > 0) {
    if (!(in.nvme_gbytes_s > 0)) {
      return InvalidArgument("the state spills " + Si(p.shard_nvme_bytes) +
                             " per shard to NVMe: give --nvme-gbytes-s");
    }
    // Every spilled byte is read and written back once a step; the host's shards share its
    // drives.
    p.t_nvme = 2 * p.shard_nvme_bytes * (S / p.shard_hosts) / (in.nvme_gbytes_s * 1e9);
  }
  // The forward is a third of the compute, the backward two thirds (twice the FLOPs).
  const double update = std::max(p.t_optimizer, p.t_nvme);
  p.t_lower = std::max(p.t_network, p.t_compute) + update;
  p.t_scatter = host_scatter / rate;
  const double backward = 2 * p.t_compute / 3 + (in.serial_collectives ? p.t_scatter : 0);
  p.t_expected = std::max(p.t_network_forward, p.t_compute / 3) +
                 std::max(p.t_network_backward, backward) + update;
  p.t_upper = p.t_network_forward + p.t_network_backward + p.t_compute + p.t_optimizer + p.t_nvme;
  return p;
}

std::string FormatPlan(const PlanInput& in, const Plan& p) {
  std::string s;
  char b[512];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(b, sizeof(b), fmt, args...);
    s += b;
  };
  line("model: %.3g parameters; %d workers (%d nodes x %d GPUs), %d shards on %s\n", in.params,
       p.workers, in.nodes, in.gpus_per_node, p.shards,
       in.colocated ? "the worker nodes" : "their own hosts");
  if (!in.tensors.empty()) {
    line("tensors: %zu, in chunks of %llu elements (bytes per step summed over their pieces)\n",
         in.tensors.size(), static_cast<unsigned long long>(in.chunk_elems));
  }
  line(
      "modes: fetch %s (%.3g B/param, %d pass%s), grads %s (%.3g B/param), state %s "
      "(%.3g B/param), %s, %s fetches, %s collectives\n",
      std::string(FormatName(in.fetch)).c_str(), p.fetch_bytes, p.fetch_passes,
      p.fetch_passes == 1 ? "" : "es", std::string(FormatName(in.grad)).c_str(), p.grad_bytes,
      std::string(FormatName(in.state)).c_str(), p.state_bytes,
      in.pre_reduced ? "pre-reduced" : "server-sum",
      in.bandwidth_centric ? "bandwidth-centric" : "direct", in.gloo_collectives ? "gloo" : "ring");
  line("links: %.4g Gbit/s each way per host at %.0f%% efficiency; NVMe %.4g GB/s per host\n",
       in.link_gbps, in.link_efficiency * 100, in.nvme_gbytes_s);
  s += "memory per shard:\n";
  line("  state (master + moments + serving copy)  %s\n", Si(p.shard_state_bytes).c_str());
  line("  gradient slots                           %s\n", Si(p.shard_grad_bytes).c_str());
  line("  RAM                                      %s\n", Si(p.shard_ram_bytes).c_str());
  line("  NVMe                                     %s\n", Si(p.shard_nvme_bytes).c_str());
  s += "memory per worker:\n";
  line("  live window + prefetch                   %s\n", Si(p.worker_window_bytes).c_str());
  line("  pre-reduced bucket                       %s\n", Si(p.worker_bucket_bytes).c_str());
  line("  error-feedback residual                  %s\n", Si(p.worker_residual_bytes).c_str());
  s += "bytes per step (out / in):\n";
  line("  one worker rank                          %s / %s\n", Si(p.worker_rank.out).c_str(),
       Si(p.worker_rank.in).c_str());
  line("  %-41s%s / %s\n", in.colocated ? "one node's link" : "one worker host's link",
       Si(p.worker_host.out).c_str(), Si(p.worker_host.in).c_str());
  if (!in.colocated) {
    line("  one shard host's link                    %s / %s\n", Si(p.shard_host.out).c_str(),
         Si(p.shard_host.in).c_str());
  }
  line("  one shard (fetches served / pushes)      %s / %s\n", Si(p.shard_out).c_str(),
       Si(p.shard_in).c_str());
  s += "step time:\n";
  line("  network, busiest link direction          %s\n", Seconds(p.t_network).c_str());
  line("  network, forward then backward           %s + %s\n", Seconds(p.t_network_forward).c_str(),
       Seconds(p.t_network_backward).c_str());
  if (in.pre_reduced) {
    line("  reduce-scatter (in the backward)         %s%s\n", Seconds(p.t_scatter).c_str(),
         in.serial_collectives ? ", after the compute" : "");
  }
  line("  compute (forward + backward)             %s\n", Seconds(p.t_compute).c_str());
  line("  optimizer pass                           %s\n", Seconds(p.t_optimizer).c_str());
  line("  NVMe                                     %s\n", Seconds(p.t_nvme).c_str());
  line("  bounds                                   %s .. %s\n", Seconds(p.t_lower).c_str(),
       Seconds(p.t_upper).c_str());
  line("  expected                                 %s\n", Seconds(p.t_expected).c_str());
  return s;
}

std::string PlanJson(const PlanInput& in, const Plan& p) {
  char b[2048];
  std::snprintf(
      b, sizeof(b),
      "{\"params\": %.17g, \"workers\": %d, \"shards\": %d, \"fetch\": \"%s\", \"grad\": \"%s\", "
      "\"state\": \"%s\", \"reduction\": \"%s\", \"collectives\": \"%s\", \"fetch_passes\": %d, "
      "\"state_bytes\": %.17g, "
      "\"shard_ram_bytes\": %.17g, \"shard_nvme_bytes\": %.17g, \"shard_grad_bytes\": %.17g, "
      "\"worker_window_bytes\": %.17g, \"worker_residual_bytes\": %.17g, "
      "\"worker_host_out\": %.17g, \"worker_host_in\": %.17g, \"shard_host_out\": %.17g, "
      "\"shard_host_in\": %.17g, \"shard_in\": %.17g, \"shard_out\": %.17g, "
      "\"t_network\": %.6g, \"t_network_forward\": %.6g, \"t_network_backward\": %.6g, "
      "\"t_scatter\": %.6g, \"t_compute\": %.6g, \"t_optimizer\": %.6g, \"t_nvme\": %.6g, "
      "\"t_lower\": %.6g, "
      "\"t_expected\": %.6g, \"t_upper\": %.6g}",
      in.params, p.workers, p.shards, std::string(FormatName(in.fetch)).c_str(),
      std::string(FormatName(in.grad)).c_str(), std::string(FormatName(in.state)).c_str(),
      in.pre_reduced ? "pre-reduced" : "server-sum", in.gloo_collectives ? "gloo" : "ring",
      p.fetch_passes, p.state_bytes, p.shard_ram_bytes, p.shard_nvme_bytes, p.shard_grad_bytes,
      p.worker_window_bytes, p.worker_residual_bytes, p.worker_host.out, p.worker_host.in,
      p.shard_host.out, p.shard_host.in, p.shard_in, p.shard_out, p.t_network, p.t_network_forward,
      p.t_network_backward, p.t_scatter, p.t_compute, p.t_optimizer, p.t_nvme, p.t_lower,
      p.t_expected, p.t_upper);
  return b;
}

}  // namespace zps::plan
