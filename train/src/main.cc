// zps-train: trains a byte-level transformer LM through zps.
//
//   zps-train                       # embedded default: a local cluster (2 shards + 2 workers)
//   zps-train --mode worker ...     # one rank of a job (ZPS_ENDPOINT, ZPS_TOKEN_FILE)
//   zps-train --mode reference ...  # the same training in one process, no server
//
// All ranks must be given the same model, data, optimizer and layout options: rank 0 registers
// the job and the others are checked against its hash.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "local_cluster.h"
#include "zps/common/config.h"
#include "zps/common/logging.h"
#include "zps/common/messages.h"
#include "zps/common/metrics.h"
#include "zps/common/process_metrics.h"
#include "zps/common/spill_budget.h"
#include "zps/server/job.h"
#include "zps/train/data.h"
#include "zps/train/job_flags.h"
#include "zps/train/model.h"
#include "zps/train/options.h"
#include "zps/train/reference.h"
#include "zps/train/worker_access.h"
#include "zps/worker/checked_collectives.h"
#include "zps/worker/client.h"
#include "zps/worker/collectives.h"
#include "zps/worker/gloo_collectives.h"

namespace zps::train {
namespace {

using Clock = std::chrono::steady_clock;

struct TrainOptions {
  std::string mode = "auto";        // Default: auto = worker when an endpoint is set, else local.
  std::string endpoint;             // Default: "". Coordinator host:port (ZPS_ENDPOINT).
  std::string token;                // Default: "".
  std::string token_file;           // Default: "".
  int rank = 0;                     // Default: 0.
  int world_size = 2;               // Default: 2 ranks.
  int shards = 2;                   // Default: 2 shards.
  int64_t steps = 400;              // Default: 400 steps (about two minutes on 2 idle cores).
  std::string optimizer = "adamw";  // Default: adamw.
  double lr = 3e-3;                 // Default: 3e-3.
  double weight_decay = 0.0;        // Default: 0.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Defaults: Adam's.
  double max_grad_norm = 1.0;                     // Default: 1.0 (0 = no clipping).
  // The servers' lr schedule (docs/optimizer.md): none, WarmupLR (warmup_min_lr 0 ->
  // warmup_max_lr = --lr), WarmupDecayLR (the same, then linear decay to 0 at total-num-steps)
  // or WarmupCosineLR (ratio of --lr; DeepSpeed's default ratios).
  std::string lr_schedule = "none";      // Default: none (constant --lr).
  int64_t warmup_num_steps = 1000;       // Default: 1000 (DeepSpeed's).
  int64_t total_num_steps = 0;           // Default: 0 = --steps.
  std::string warmup_type = "log";       // Default: log (DeepSpeed's).
  bool loss_scaling = false;             // Default: false. fp16 dynamic loss scaling (fp16 grads).
  double initial_loss_scale = 65536.0;   // Default: 2^16.
  std::string grad_dtype = "";           // Default: fp32, or fp16 with loss scaling.
  std::string serving_dtype = "";        // Default: bf16, or fp16 with loss scaling.
  std::string state_dtype = "fp32";      // Default: fp32. The shards' moments: fp32, bf16, int8.
  std::string reduction = "server-sum";  // Default: server-sum.

  // Quantized gradients: "" = off, int8 or int4 (shard.grad_dtype int8-block / int4-block).
  std::string quantized_grads;             // Default: "" (off).
  bool grad_error_feedback = true;         // Default: true. false: testing, no error feedback.
  int64_t reference_checkpoint_every = 0;  // Default: 0. Reference mode: the shards' cadence.

  std::string update = "sync";  // Default: sync (the job's update mode; reference: ignored).
  std::string fetch_strategy = "direct";  // Default: direct (each rank fetches whole parameters).
  uint64_t bucket_bytes = 16ull << 20;    // Default: 16 MiB of fp32 gradient per reduce-scatter.
  std::string
      gloo_hostname;  // Default: "" = 127.0.0.1 for a loopback endpoint, else the host name.
  uint64_t chunk_elems = 256u << 10;       // Default: 256 Ki elements (1 MiB of fp32) per chunk.
  int64_t inject_overflow_step = -1;       // Default: never.
  uint64_t prefetch_bytes = 256ull << 20;  // Default: 256 MiB.
  uint64_t max_live_bytes = 1ull << 30;    // Default: 1 GiB.
  std::string ucx_tls;                     // Default: "" (UCX_TLS or UCX's choice).
  int log_every = 10;                      // Default: every 10 steps.
  int64_t eval_every = 0;      // Default: 0 = the held-out loss at the start and the end only.
  bool print_crcs = false;     // Default: false. Print per-chunk state CRCs at the end.
  bool print_latency = false;  // Default: false. Worker: print its histograms at the end.
  std::string log_level = "warning";  // Default: warning (progress lines are printed anyway).
  int64_t op_timeout_s = 300;         // Default: 300 s for any single wait.
  int max_recoveries = 20;            // Default: 20. Rejoins after a lost shard/coordinator.
  int metrics_port = 0;  // Default: 0 = off. Worker: its /metrics port. Local: the base
                         // port (shard i: base+i, worker r: base+shards+r).
  std::string metrics_bind = "0.0.0.0";  // Default: all interfaces. Where /metrics listens.
  uint64_t shard_memory_budget = 0;      // Default: 0 = all in RAM. Local mode: each shard's
                                         // --memory-budget (spill under the cluster's temp dir).
                                         // Other modes ignore it.
  uint64_t shard_serving_budget = 0;     // Default: 0 = all in RAM. Local mode: each shard's
                                         // --serving-budget. Other modes ignore it.
  std::string work_dir;  // Default: "" = $TMPDIR, else /tmp. Local mode: where the cluster
                         // directory (logs, spill files) is made. Other modes ignore it.
  ModelConfig model;
  DataOptions data;
  std::string corpus;
  nlohmann::json job;  // the job-spec flags' JSON job description (JobFlags::Json)
};

// The job-spec flags go through `j`: each names its key in the JSON job description (BuildJob).
void Register(Flags& f, JobFlags& j, TrainOptions& o) {
  f.Add("mode", "auto, local (spawn a cluster), worker (one rank) or reference (in-process)",
        &o.mode);
  f.Add("endpoint", "coordinator host:port (worker mode)", &o.endpoint);
  f.Add("token", "shared auth secret (prefer token-file)", &o.token);
  f.Add("token-file", "file holding the shared auth secret", &o.token_file);
  f.Add("rank", "this worker's rank", &o.rank, 0, 65535);
  j.Add("world-size", "number of worker ranks", "shard.world_size", &o.world_size, 1, 65536);
  j.Add("shards", "number of shards in the job", "num_shards", &o.shards, 1, 4096);
  f.Add("steps", "training steps", &o.steps, 1, INT64_MAX / 2);
  j.Add("optimizer", "adam, adamw or sgd", "optimizer.type", &o.optimizer);
  j.Add("lr", "learning rate", "optimizer.lr", &o.lr);
  j.Add("weight-decay", "weight decay", "optimizer.weight_decay", &o.weight_decay);
  j.Add("beta1", "Adam beta1", "optimizer.beta1", &o.beta1);
  j.Add("beta2", "Adam beta2", "optimizer.beta2", &o.beta2);
  j.Add("eps", "Adam epsilon", "optimizer.eps", &o.eps);
  j.Add("max-grad-norm", "global gradient-norm clip (0 = off)", "commit.max_grad_norm",
        &o.max_grad_norm);
  j.Add("lr-schedule", "servers' lr schedule: none, WarmupLR, WarmupDecayLR or WarmupCosineLR",
        "shard.lr_schedule.type", &o.lr_schedule);
  j.Add("warmup-num-steps", "lr schedule warmup updates", "shard.lr_schedule.warmup_num_steps",
        &o.warmup_num_steps, 1, INT64_MAX / 2);
  j.Add("total-num-steps", "lr schedule total updates (0 = --steps)",
        "shard.lr_schedule.total_num_steps", &o.total_num_steps, 0, INT64_MAX / 2);
  j.Add("warmup-type", "lr schedule warmup: log or linear", "shard.lr_schedule.warmup_type",
        &o.warmup_type);
  j.Add("loss-scaling", "fp16 dynamic loss scaling (pushes fp16 gradients)",
        "commit.dynamic_loss_scale", &o.loss_scaling);
  j.Add("initial-loss-scale", "first loss scale with --loss-scaling", "commit.initial_loss_scale",
        &o.initial_loss_scale);
  j.Add("grad-dtype", "push dtype: fp32, fp16 or bf16 (default fp32; fp16 with loss scaling)",
        "shard.grad_dtype", &o.grad_dtype);
  f.Add("quantized-grads",
        "push block-quantized gradients with error feedback: int8 or int4 (the job's "
        "shard.grad_dtype; not with --grad-dtype)",
        &o.quantized_grads);
  f.Add("grad-error-feedback",
        "testing: with --quantized-grads, false quantizes every push on its own (no error "
        "feedback), to show what the feedback is for",
        &o.grad_error_feedback);
  f.Add("reference-checkpoint-every",
        "reference mode with --quantized-grads: the --checkpoint-every of the shards of the run "
        "to compare with (the workers zero their residuals at those steps; other modes ignore "
        "it)",
        &o.reference_checkpoint_every, 0, INT64_MAX / 2);
  j.Add("serving-dtype", "copy workers fetch: bf16, fp16 or fp32", "shard.serving_dtype",
        &o.serving_dtype);
  j.Add("state-dtype",
        "how the shards store the optimizer's moments beside the fp32 master: fp32, bf16 "
        "(stochastic rounding) or int8 (blockwise, dynamic map)",
        "optimizer.state_dtype", &o.state_dtype);
  j.Add("reduction",
        "server-sum (every rank pushes its whole gradient) or pre-reduced (the ranks "
        "reduce-scatter each gradient with Gloo; each pushes its slice)",
        "shard.reduction", &o.reduction);
  j.Add("update",
        "the shards' update mode: sync (optimizer after the commit) or speculative (each chunk "
        "as soon as its gradient is complete; bit-identical)",
        "shard.update", &o.update);
  f.Add("fetch-strategy",
        "direct (every rank fetches whole parameters) or bandwidth-centric (each rank fetches its "
        "slice, the ranks all-gather with Gloo)",
        &o.fetch_strategy);
  f.AddBytes("bucket-bytes",
             "pre-reduced: fp32 gradient bytes gathered (in push order) into one reduce-scatter; "
             "0 = one per parameter; the same on every rank",
             &o.bucket_bytes);
  f.Add("gloo-hostname",
        "address this rank's Gloo tcp device binds and advertises (default: 127.0.0.1 when the "
        "endpoint is on loopback, else the host name)",
        &o.gloo_hostname);
  j.AddBytes("chunk-elems", "elements per chunk of the flat parameter space", "chunk_elems",
             &o.chunk_elems);
  f.Add("inject-overflow-step", "test hook: an Inf gradient on rank 0 at this step",
        &o.inject_overflow_step, -1, INT64_MAX);
  f.AddBytes("prefetch-bytes", "bytes fetched ahead along the access trace (0 = off)",
             &o.prefetch_bytes);
  f.AddBytes("max-live-bytes", "fetched parameter bytes held at most", &o.max_live_bytes);
  f.Add("ucx-tls", "UCX transports (e.g. tcp, posix,cma,self)", &o.ucx_tls);
  f.Add("log-every", "print progress every N steps", &o.log_every, 1, 1000000);
  f.Add("eval-every",
        "rank 0 (and reference mode): also print the held-out loss after every N steps "
        "(0 = at the start and the end only)",
        &o.eval_every, 0, INT64_MAX / 2);
  f.Add("print-crcs", "print per-chunk CRC32C of the final state", &o.print_crcs);
  f.Add("print-latency",
        "worker: print this rank's fetch/push request and step duration histograms at the end "
        "(the buckets of its zps_request_duration_seconds and zps_step_duration_seconds)",
        &o.print_latency);
  f.Add("log-level", "debug, info, warning or error", &o.log_level);
  f.Add("op-timeout", "seconds any single wait may take", &o.op_timeout_s, 1, 86400);
  f.Add("max-recoveries", "times a worker re-joins after losing a shard or the coordinator",
        &o.max_recoveries, 0, 1000000);
  f.Add("metrics-port",
        "HTTP port for /metrics, /healthz, /readyz (0 = off); in local mode the first of "
        "shards+world-size consecutive ports (shards first, then workers)",
        &o.metrics_port, 0, 65535);
  f.Add("metrics-bind", "address the metrics endpoint listens on (worker mode)", &o.metrics_bind);
  f.AddBytes("shard-memory-budget",
             "local mode: each shard's --memory-budget (master + optimizer state in RAM; the rest "
             "spills to <work-dir>/zps-local-XXXXXX/shard-N-data/spill); 0 = all in RAM",
             &o.shard_memory_budget);
  f.AddBytes("shard-serving-budget",
             "local mode: each shard's --serving-budget (16-bit serving copies in RAM; the rest "
             "spills to <work-dir>/zps-local-XXXXXX/shard-N-data/spill); 0 = all in RAM",
             &o.shard_serving_budget);
  f.Add("work-dir",
        "local mode: where the cluster directory zps-local-XXXXXX is made (logs, token, the "
        "shards' spill files); default $TMPDIR, else /tmp",
        &o.work_dir);
  AddModelFlags(f, &o.model);
  AddDataFlags(f, &o.data, &o.corpus);
}

void PrintCrcs(const std::vector<std::pair<uint32_t, uint32_t>>& crcs) {
  for (const auto& [c, crc] : crcs) std::printf("chunk_crc %u %08x\n", c, crc);
}

// "state bytes per parameter: X (...; gradient slots Y)": every shard's state_bytes from its
// kStatus document (the zps_shard_state_bytes gauges' figures) over the model's parameters.
// X is the master, moments, scales and serving copies; the gradient slots are apart.
Status PrintStateBytes(worker::Client& client, int shards, uint64_t params) {
  uint64_t master = 0, moments = 0, scales = 0, serving = 0, grad = 0;
  for (uint32_t s = 0; s < static_cast<uint32_t>(shards); ++s) {
    ZPS_ASSIGN_OR_RETURN(auto reply, client.CallShard(s, msg::kStatus, {}));
    const auto j = nlohmann::json::parse(reinterpret_cast<const char*>(reply.data()),
                                         reinterpret_cast<const char*>(reply.data() + reply.size()),
                                         nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("state_bytes")) {
      return DataLoss("shard " + std::to_string(s) + "'s status has no state_bytes");
    }
    const auto& b = j["state_bytes"];
    auto get = [&](const char* k) { return b.value(k, uint64_t{0}); };
    master += get("master");
    moments += get("m") + get("v");
    scales += get("scales");
    serving += get("serving");
    grad += get("grad");
  }
  const double p = static_cast<double>(std::max<uint64_t>(params, 1));
  std::printf(
      "state bytes per parameter: %.2f (master %.2f, moments %.2f, scales %.2f, serving %.2f); "
      "gradient slots %.2f\n",
      static_cast<double>(master + moments + scales + serving) / p, master / p, moments / p,
      scales / p, serving / p, grad / p);
  return Status::Ok();
}

// "latency <rank> <what> <count> <sum_s> <upper bound>:<count> ... +Inf:<count>" (per-bucket,
// not cumulative): scripts/bench-load.sh adds the ranks' buckets and reads quantiles off them.
void PrintHistogram(int rank, const char* what, const metrics::Histogram& h,
                    const std::vector<double>& bounds) {
  const std::vector<uint64_t> counts = h.BucketCounts();
  std::string line = "latency " + std::to_string(rank) + " " + what + " " +
                     std::to_string(h.Count()) + " " + std::to_string(h.Sum());
  for (size_t i = 0; i < counts.size(); ++i) {
    char b[64];
    const auto n = static_cast<unsigned long long>(counts[i]);
    if (i < bounds.size()) {
      std::snprintf(b, sizeof(b), " %g:%llu", bounds[i], n);
    } else {
      std::snprintf(b, sizeof(b), " +Inf:%llu", n);
    }
    line += b;
  }
  std::printf("%s\n", line.c_str());
}

// ---- reference mode: the whole job in this process ------------------------------------------

Status RunReference(const TrainOptions& o) {
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, BuildJob(o.job, o.model, o.steps));
  ReferenceOptions ro;
  ro.layout = job.layout.options();
  ro.optimizer = job.optimizer;
  ro.commit = job.commit;
  ro.world = o.world_size;
  ro.serving_dtype = job.shard.serving_dtype;
  ro.lr_schedule = job.shard.lr_schedule;
  ro.grad_dtype = job.shard.grad_dtype;
  ro.residual_reset_every = o.reference_checkpoint_every;
  ro.grad_error_feedback = o.grad_error_feedback;
  ro.inject_overflow_step = o.inject_overflow_step;
  ZPS_ASSIGN_OR_RETURN(auto trainer, ReferenceTrainer::Create(o.model, ro, nullptr));
  ZPS_ASSIGN_OR_RETURN(std::string corpus, LoadCorpus(o.corpus));
  DataOptions d = o.data;
  d.seq_len = o.model.seq_len;
  d.world = o.world_size;
  ZPS_ASSIGN_OR_RETURN(auto loader, DataLoader::Create(corpus, d));
  std::vector<std::vector<uint8_t>> batches(o.world_size,
                                            std::vector<uint8_t>(loader->batch_bytes()));
  // The held-out loss on the windows rank 0 evaluates in worker mode, so the two modes print
  // comparable curves.
  const int eval_rows = std::min(loader->eval_windows(), 8);
  std::vector<uint8_t> eval_tokens(static_cast<size_t>(eval_rows) * (d.seq_len + 1));
  if (eval_rows > 0) ZPS_RETURN_IF_ERROR(loader->EvalBatch(0, eval_rows, eval_tokens));
  auto eval = [&]() -> Result<double> {
    if (eval_rows == 0) return std::nan("");
    return trainer->Evaluate(eval_tokens, eval_rows);
  };
  ZPS_ASSIGN_OR_RETURN(const double eval_start, eval());
  std::printf("reference: %llu parameters; held-out loss at start %.4f\n",
              static_cast<unsigned long long>(CountParams(o.model)), eval_start);
  auto t0 = Clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    auto ts = Clock::now();
    std::vector<std::span<const uint8_t>> views;
    for (int r = 0; r < o.world_size; ++r) {
      ZPS_RETURN_IF_ERROR(loader->BatchForRank(step, r, batches[r]));
      views.emplace_back(batches[r]);
    }
    ZPS_ASSIGN_OR_RETURN(auto res, trainer->Step(views, d.batch));
    double dt = std::chrono::duration<double>(Clock::now() - ts).count();
    if (step % o.log_every == 0 || step + 1 == o.steps || res.decision.skip) {
      std::printf("step %5lld  loss %.4f  rank0_loss %.6f  step_time %.3fs  %s\n",
                  static_cast<long long>(step), res.loss, res.rank_loss[0], dt,
                  res.decision.skip ? "(skipped)" : "");
      std::fflush(stdout);
    }
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) {
      ZPS_ASSIGN_OR_RETURN(const double e, eval());
      std::printf("held-out loss at step %lld: %.4f\n", static_cast<long long>(step + 1), e);
      std::fflush(stdout);
    }
  }
  double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("reference: %lld steps in %.1fs (%.3fs/step)\n", static_cast<long long>(o.steps),
              total, total / o.steps);
  ZPS_ASSIGN_OR_RETURN(const double eval_end, eval());
  std::printf("held-out loss %.4f -> %.4f (%.1f%% lower)\n", eval_start, eval_end,
              100.0 * (eval_start - eval_end) / eval_start);
  if (o.print_crcs) {
    std::vector<std::pair<uint32_t, uint32_t>> crcs;
    for (uint32_t c = 0; c < trainer->layout().num_chunks(); ++c) {
      ZPS_ASSIGN_OR_RETURN(uint32_t crc, trainer->ChunkCrc(c));
      crcs.emplace_back(c, crc);
    }
    PrintCrcs(crcs);
  }
  return Status::Ok();
}

// ---- worker mode: one rank against a running job --------------------------------------------

Result<double> EvalLoss(Model& model, WorkerAccess& access, const DataLoader& loader,
                        int64_t version) {
  const int rows = std::min(loader.eval_windows(), 8);
  if (rows == 0) return std::nan("");
  std::vector<uint8_t> tokens(static_cast<size_t>(rows) * (loader.options().seq_len + 1));
  ZPS_RETURN_IF_ERROR(loader.EvalBatch(0, rows, tokens));
  access.BeginStep(version, false);
  auto loss = model.Evaluate(tokens, rows, access);
  return loss;
}

// A step failed because a shard or the coordinator went away or rolled the job back: re-join
// and resume from the step the coordinator says.
bool Recoverable(const Status& s) {
  switch (s.code()) {
    case Code::kUnavailable:
    case Code::kDeadlineExceeded:
    case Code::kFailedPrecondition:
    case Code::kUnauthenticated:
    case Code::kCancelled:
      return true;
    default:
      return false;
  }
}

// Test hook (tests/integration/recovery/worker_death.sh): ZPS_TEST_CRASH_AT=<point>:<step>
// makes this worker SIGKILL itself there. worker-push: after its third gradient push of the
// step has landed (the step half pushed; in pre-reduced mode: after its third gradient went
// into the bucket, which a bucket as large as the model has not reduced yet); worker-slice
// (pre-reduced): after its second slice push of a reduced bucket has landed; worker-commit:
// after every push of the step landed, before it waits for the decision.
void MaybeCrashAt(std::string_view point, int64_t step) {
  static const std::string spec = [] {
    const char* e = std::getenv("ZPS_TEST_CRASH_AT");
    return std::string(e ? e : "");
  }();
  if (spec.empty() || spec != std::string(point) + ":" + std::to_string(step)) return;
  std::fprintf(stderr, "ZPS_TEST_CRASH_AT=%s: killing this process\n", spec.c_str());
  std::fflush(stderr);
  ::raise(SIGKILL);
}

// Test hook (tests/integration/recovery/mismatch.sh): ZPS_TEST_SKIP_BUCKET=<bucket> makes this
// rank skip that gradient bucket's reduce-scatter in every step; <bucket>@<step> in the first
// attempt of that step only (a redone step, after the re-join, is left alone). The ranks then
// issue different collectives.
std::function<bool(int64_t, uint32_t)> SkipBucketHook() {
  const char* e = std::getenv("ZPS_TEST_SKIP_BUCKET");
  if (e == nullptr) return nullptr;
  const int64_t bucket = std::atoll(e);
  const char* at = std::strchr(e, '@');
  const int64_t at_step = at == nullptr ? -1 : std::atoll(at + 1);
  auto fired = std::make_shared<bool>(false);
  return [bucket, at_step, fired](int64_t step, uint32_t b) {
    if (b != bucket || (at_step >= 0 && (step != at_step || *fired))) return false;
    *fired = true;
    std::fprintf(stderr,
                 "ZPS_TEST_SKIP_BUCKET: skipping the reduce-scatter of bucket %u of step %lld\n", b,
                 static_cast<long long>(step));
    return true;
  };
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status RunWorker(const TrainOptions& o) {
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, BuildJob(o.job, o.model, o.steps));
  const auto spec = job.Serialize();
  // Metrics first, so /healthz answers while the worker joins; /readyz once it has joined.
  metrics::Registry registry;
  ZPS_ASSIGN_OR_RETURN(metrics::ProcessMetrics pm,
                       metrics::ProcessMetrics::Create(registry, "worker"));
  std::atomic<bool> joined{false};
  std::unique_ptr<metrics::Exporter> exporter;
  if (o.metrics_port != 0) {
    metrics::ExporterOptions eo;
    eo.bind_address = o.metrics_bind;
    eo.port = static_cast<uint16_t>(o.metrics_port);
    ZPS_ASSIGN_OR_RETURN(exporter, metrics::Exporter::Start(eo, &registry, nullptr, [&joined] {
                           return joined ? Status::Ok() : Unavailable("joining the job");
                         }));
  }
  worker::WorkerOptions wo;
  wo.metrics = &pm;
  wo.endpoint = o.endpoint;
  wo.token = o.token;
  wo.rank = static_cast<uint32_t>(o.rank);
  wo.ucx_tls = o.ucx_tls;
  wo.op_timeout = std::chrono::seconds(o.op_timeout_s);
  wo.grad_error_feedback = o.grad_error_feedback;
  ZPS_ASSIGN_OR_RETURN(auto model, Model::Create(o.model));
  ZPS_ASSIGN_OR_RETURN(std::string corpus, LoadCorpus(o.corpus));
  DataOptions d = o.data;
  d.seq_len = o.model.seq_len;
  d.rank = o.rank;
  d.world = o.world_size;
  ZPS_ASSIGN_OR_RETURN(auto loader, DataLoader::Create(corpus, d));
  const bool lead = o.rank == 0;

  if (o.fetch_strategy != "direct" && o.fetch_strategy != "bandwidth-centric") {
    return InvalidArgument("--fetch-strategy must be direct or bandwidth-centric, not '" +
                           o.fetch_strategy + "'");
  }
  const bool pre_reduced = job.shard.mode == server::ReductionMode::kPreReduced;
  const bool bandwidth_centric = o.fetch_strategy == "bandwidth-centric";
  std::string gloo_host = o.gloo_hostname;
  if (gloo_host.empty()) {
    auto hp = SplitHostPort(o.endpoint);
    if (hp.ok() && (hp->first == "localhost" || hp->first.rfind("127.", 0) == 0)) {
      gloo_host = "127.0.0.1";
    }
  }

  std::unique_ptr<worker::Client> client;
  std::unique_ptr<worker::Collectives> collectives;
  std::unique_ptr<WorkerAccess> access_ptr;
  std::unique_ptr<WorkerAccess> eval_ptr;  // rank 0's evaluation: direct fetches, no collectives
  // (Re)joins the job; a job starting over (resume step 0) gets rank 0's initial values.
  // `in_collectives`: the failure came from building the communicator (the job itself was
  // joined), which join_retrying tries again.
  bool in_collectives = false;
  const auto skip_bucket = SkipBucketHook();  // outlives each join's WorkerAccess
  auto join = [&]() -> Status {
    in_collectives = false;
    eval_ptr.reset();
    access_ptr.reset();
    collectives.reset();
    client.reset();
    ZPS_ASSIGN_OR_RETURN(client, worker::Client::Connect(wo, spec, job.Hash()));
    if ((pre_reduced || bandwidth_centric) && o.world_size > 1) {
      // One communicator per join: the kv generation (the coordinator's epoch) and the resume
      // step scope its rendezvous keys, so a rebuilt one never meets stale addresses.
      worker::GlooOptions go;
      go.endpoint = o.endpoint;
      go.token = o.token;
      go.rank = static_cast<uint32_t>(o.rank);
      go.world_size = static_cast<uint32_t>(o.world_size);
      go.prefix = "zps-train/gloo/resume" + std::to_string(client->resume_step());
      go.hostname = gloo_host;
      go.timeout = wo.op_timeout;
      auto made = worker::GlooCollectives::Create(go);
      if (!made.ok()) {
        in_collectives = true;
        return made.status().WithContext("building the communicator");
      }
      collectives = std::move(*made);
    } else if (pre_reduced || bandwidth_centric) {
      collectives = std::make_unique<worker::LocalCollectives>();
    }
    if (client->resume_step() == 0 && lead) {
      for (uint32_t p = 0; p < model->num_params(); ++p) {
        std::vector<float> values(client->layout().param_numel(p));
        ZPS_RETURN_IF_ERROR(InitParam(model->decls()[p], o.model.seed, values));
        ZPS_RETURN_IF_ERROR(client->PushInitial(p, values));
      }
      ZPS_RETURN_IF_ERROR(client->FlushPushes());
    }
    worker::PrefetchOptions po{o.prefetch_bytes, o.max_live_bytes};
    if (bandwidth_centric) po.gather = collectives.get();
    po.same_first_step = true;  // every rank trains the same model: the same acquires
    access_ptr =
        std::make_unique<WorkerAccess>(client.get(), po, pre_reduced ? collectives.get() : nullptr,
                                       o.bucket_bytes / sizeof(float));
    if (std::getenv("ZPS_TEST_CRASH_AT") != nullptr) {
      access_ptr->set_after_push([&client](int64_t step, int pushes) {
        if (pushes != 3) return;
        (void)client->FlushPushes();  // they have landed on the shards
        MaybeCrashAt("worker-push", step);
      });
      access_ptr->set_after_slice([&client](int64_t step, int slices) {
        if (slices != 2) return;
        (void)client->FlushPushes();  // they have landed on the shards
        MaybeCrashAt("worker-slice", step);
      });
    }
    if (skip_bucket) access_ptr->set_skip_bucket(skip_bucket);
    eval_ptr = std::make_unique<WorkerAccess>(
        client.get(), worker::PrefetchOptions{o.prefetch_bytes, o.max_live_bytes});
    return Status::Ok();
  };
  int recoveries = 0;
  // A communicator that could not be built (pre-reduced: another rank re-joined meanwhile and
  // started a newer worker generation, or a peer died during the rendezvous) is built again in
  // a new join; a failure to join the job itself (it stopped, a bad spec) is final.
  auto join_retrying = [&]() -> Status {
    for (;;) {
      Status s = join();
      if (s.ok() || !in_collectives || !Recoverable(s) || recoveries >= o.max_recoveries) {
        return s;
      }
      ++recoveries;
      std::fprintf(stderr, "zps-train (rank %d): %s; joining again (recovery %d of at most %d)\n",
                   o.rank, s.ToString().c_str(), recoveries, o.max_recoveries);
    }
  };
  ZPS_RETURN_IF_ERROR(join_retrying());
  joined = true;
  const int64_t start = client->resume_step();
  std::fprintf(stderr, "zps-train (rank %d): joined the job at step %lld\n", o.rank,
               static_cast<long long>(start));
  double eval_start = std::nan("");
  if (lead && start == 0) {
    ZPS_ASSIGN_OR_RETURN(eval_start, EvalLoss(*model, *eval_ptr, *loader, 0));
    std::printf("rank 0: %llu parameters, %u chunks on %d shards; held-out loss at start %.4f\n",
                static_cast<unsigned long long>(CountParams(o.model)),
                client->layout().num_chunks(), o.shards, eval_start);
  }
  double loss_scale = client->job().loss_scale;
  std::vector<uint8_t> batch(loader->batch_bytes());
  std::vector<double> losses;
  const double tokens_per_step = static_cast<double>(o.world_size) * d.batch * d.seq_len;
  auto t_start = Clock::now();
  auto t_window = t_start;
  uint64_t fetched0 = client->fetched_bytes(), pushed0 = client->pushed_bytes();
  double step_time_sum = 0;
  bool recovering = false;
  int64_t mismatch_step = -1;  // the step of the last collective mismatch
  auto failure_seen = Clock::now();
  for (int64_t step = start; step < o.steps; ++step) {
    auto ts = Clock::now();
    pm.current_step.Set(static_cast<double>(step));
    ZPS_RETURN_IF_ERROR(loader->Batch(step, batch));
    StepOutput out;
    msg::CommitInfo commit;
    Status st = [&]() -> Status {
      WorkerAccess& access = *access_ptr;
      access.BeginStep(step, step == o.inject_overflow_step && lead);
      auto r = model->TrainStep(batch, d.batch, static_cast<float>(loss_scale), access);
      Status ended = access.EndStep();
      if (!r.ok()) return r.status();
      ZPS_RETURN_IF_ERROR(ended);
      out = *r;
      ZPS_RETURN_IF_ERROR(access.FlushGradients());
      ZPS_RETURN_IF_ERROR(client->FlushPushes());
      MaybeCrashAt("worker-commit", step);
      ZPS_ASSIGN_OR_RETURN(commit, client->AwaitCommit(step));
      return Status::Ok();
    }()
                             .WithContext("step " + std::to_string(step));
    if (!st.ok()) {
      // Ranks that issued different collectives recover as from a dead rank: every rank sees the
      // mismatch in the same descriptor exchange, re-joins, and redoes the step from the
      // servers' state. A mismatch again in the redone step is in the program itself (ranks
      // that diverge deterministically): every rank ends the job with it instead of looping.
      if (worker::IsCollectiveMismatch(st)) {
        if (mismatch_step == step) {
          return Status(st.code(), st.message() +
                                       " (again in the step redone after re-joining: the ranks "
                                       "diverge deterministically; not retried)");
        }
        mismatch_step = step;
      }
      if (!Recoverable(st) || recoveries >= o.max_recoveries) return st;
      ++recoveries;
      if (!recovering) failure_seen = Clock::now();
      recovering = true;
      std::fprintf(stderr,
                   "zps-train (rank %d): %s; re-joining the job (recovery %d of at most %d)\n",
                   o.rank, st.ToString().c_str(), recoveries, o.max_recoveries);
      ZPS_RETURN_IF_ERROR(join_retrying().WithContext("re-joining after a failure"));
      const int64_t resume = client->resume_step();
      std::fprintf(stderr, "zps-train (rank %d): re-joined; resuming at step %lld\n", o.rank,
                   static_cast<long long>(resume));
      losses.resize(static_cast<size_t>(std::max<int64_t>(0, resume - start)));
      loss_scale = client->job().loss_scale;
      step = resume - 1;  // the loop's ++ makes it `resume`
      continue;
    }
    if (recovering && lead) {
      std::printf(
          "recovery: resumed at step %lld; first resumed step done %.3fs after the failure "
          "was seen (unix_ms %lld)\n",
          static_cast<long long>(step),
          std::chrono::duration<double>(Clock::now() - failure_seen).count(),
          static_cast<long long>(UnixMillis()));
      std::fflush(stdout);
    }
    recovering = false;
    loss_scale = commit.next_loss_scale;
    losses.push_back(out.loss);
    step_time_sum += std::chrono::duration<double>(Clock::now() - ts).count();
    pm.step_duration.ObserveSince(ts);
    if (lead &&
        ((step + 1) % o.log_every == 0 || step + 1 == o.steps || step == start || commit.skip)) {
      auto now = Clock::now();
      double window = std::chrono::duration<double>(now - t_window).count();
      int64_t n = step == start ? 1 : std::min<int64_t>(o.log_every, step + 1 - start);
      double fetch_mbps = (client->fetched_bytes() - fetched0) / window / 1e6;
      double push_mbps = (client->pushed_bytes() - pushed0) / window / 1e6;
      std::printf(
          "step %5lld  loss %.4f  norm %.3f%s  tokens/s %.0f  fetch %.1f MB/s  push %.1f MB/s"
          "  step %.3fs\n",
          static_cast<long long>(step), out.loss, commit.global_norm,
          commit.skip ? " (skipped: overflow)" : "", tokens_per_step * n / window, fetch_mbps,
          push_mbps, window / n);
      std::fflush(stdout);
      t_window = now;
      fetched0 = client->fetched_bytes();
      pushed0 = client->pushed_bytes();
    }
    // After the step's commit the shards serve version step + 1, and they cannot move past it
    // until this rank pushes the next step, so the evaluation sees exactly that version.
    if (lead && o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) {
      ZPS_ASSIGN_OR_RETURN(const double e, EvalLoss(*model, *eval_ptr, *loader, step + 1));
      std::printf("held-out loss at step %lld: %.4f\n", static_cast<long long>(step + 1), e);
      std::fflush(stdout);
    }
  }
  double total = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (o.print_latency) {
    PrintHistogram(o.rank, "fetch", pm.request_duration[metrics::kFetch],
                   metrics::RequestDurationBuckets());
    PrintHistogram(o.rank, "push", pm.request_duration[metrics::kPush],
                   metrics::RequestDurationBuckets());
    PrintHistogram(o.rank, "step", pm.step_duration, metrics::StepDurationBuckets());
    std::fflush(stdout);
  }
  if (lead) {
    const auto& ps = access_ptr->prefetch_stats();
    size_t k = std::min<size_t>(10, losses.size());
    double first = 0, last = 0;
    for (size_t i = 0; i < k; ++i) {
      first += losses[i];
      last += losses[losses.size() - 1 - i];
    }
    std::printf(
        "summary: %lld steps in %.1fs, %.3fs/step; train loss %.4f -> %.4f (mean of %zu "
        "steps)\n",
        static_cast<long long>(o.steps - start), total,
        step_time_sum / std::max<size_t>(1, losses.size()), first / std::max<size_t>(1, k),
        last / std::max<size_t>(1, k), k);
    std::printf(
        "prefetch: %llu acquires, %llu hits, %llu fetched ahead, %llu trace rebuilds, "
        "%llu gathered, %.2fs waiting for data\n",
        static_cast<unsigned long long>(ps.acquires), static_cast<unsigned long long>(ps.hits),
        static_cast<unsigned long long>(ps.prefetches),
        static_cast<unsigned long long>(ps.trace_rebuilds),
        static_cast<unsigned long long>(ps.gathers),
        std::chrono::duration<double>(ps.wait).count());
    ZPS_ASSIGN_OR_RETURN(double eval_end, EvalLoss(*model, *eval_ptr, *loader, o.steps));
    if (!std::isnan(eval_start)) {
      std::printf("held-out loss %.4f -> %.4f (%.1f%% lower)\n", eval_start, eval_end,
                  100.0 * (eval_start - eval_end) / eval_start);
    } else {
      std::printf("held-out loss %.4f\n", eval_end);
    }
    if (o.print_crcs) {
      std::vector<std::pair<uint32_t, uint32_t>> all;
      for (uint32_t s = 0; s < static_cast<uint32_t>(o.shards); ++s) {
        msg::ChunkCrcsRequest req{o.steps};
        for (int attempt = 0;; ++attempt) {
          auto r = client->CallShard(s, msg::kChunkCrcs, req.Encode());
          if (r.ok()) {
            ZPS_ASSIGN_OR_RETURN(auto crcs, msg::ChunkCrcs::Decode(*r));
            all.insert(all.end(), crcs.crcs.begin(), crcs.crcs.end());
            break;
          }
          if (r.status().code() != Code::kUnavailable || attempt > 500) return r.status();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
      std::sort(all.begin(), all.end());
      PrintCrcs(all);
    }
    ZPS_RETURN_IF_ERROR(PrintStateBytes(
        *client, static_cast<int>(client->layout().options().num_shards), CountParams(o.model)));
  }
  return Status::Ok();
}

Status RunLocal(const TrainOptions& o, int argc, char** argv) {
  // A budget no shard could start with is refused before any starts, with the shards' advice.
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, BuildJob(o.job, o.model, o.steps));
  ZPS_RETURN_IF_ERROR(
      CheckJobMemoryBudget(job, o.shard_memory_budget).WithContext("--shard-memory-budget"));
  LocalCluster cluster;
  cluster.shards = o.shards;
  cluster.workers = o.world_size;
  cluster.ucx_tls = o.ucx_tls;
  cluster.metrics_port = o.metrics_port;
  cluster.shard_memory_budget = o.shard_memory_budget;
  cluster.shard_serving_budget = o.shard_serving_budget;
  cluster.work_dir = o.work_dir;
  return RunLocalCluster(cluster, argc, argv);
}

}  // namespace
}  // namespace zps::train

int main(int argc, char** argv) {
  using namespace zps;
  using namespace zps::train;
  TrainOptions o;
  o.data.batch = 8;
  Flags flags("zps-train",
              "Trains a byte-level decoder-only transformer through zps. With no endpoint it "
              "starts a local cluster (--shards zps-server processes and --world-size workers on "
              "loopback) and trains on the Debian license texts.");
  JobFlags job_flags(&flags);
  Register(flags, job_flags, o);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "zps-train: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  if (*parsed == ParseOutcome::kHelpShown) return 0;
  auto job = job_flags.Json();
  if (!job.ok()) {
    std::fprintf(stderr, "zps-train: %s\n", job.status().ToString().c_str());
    return 2;
  }
  o.job = std::move(*job);
  if (!o.quantized_grads.empty()) {
    std::string bad;
    if (o.quantized_grads != "int8" && o.quantized_grads != "int4") {
      bad = "--quantized-grads must be int8 or int4, not '" + o.quantized_grads + "'";
    } else if (!o.grad_dtype.empty()) {
      bad = "--quantized-grads and --grad-dtype both set the push dtype: give one";
    }
    if (!bad.empty()) {
      std::fprintf(stderr, "zps-train: %s\n", bad.c_str());
      return 2;
    }
    o.job["shard"]["grad_dtype"] = o.quantized_grads + "-block";  // the DType's name
  }
  auto level = log::ParseLevel(o.log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "zps-train: %s\n", level.status().ToString().c_str());
    return 2;
  }
  log::SetLevel(*level);
  Status s = o.model.Validate();
  if (s.ok() && !o.token_file.empty()) {
    auto t = ReadTokenFile(o.token_file);
    if (t.ok())
      o.token = *t;
    else
      s = t.status();
  }
  std::string mode = o.mode;
  if (mode == "auto") mode = o.endpoint.empty() ? "local" : "worker";
  if (s.ok()) {
    if (mode == "reference")
      s = RunReference(o);
    else if (mode == "worker")
      s = o.token.empty()
              ? InvalidArgument("worker mode needs a token (--token-file or ZPS_TOKEN_FILE)")
              : RunWorker(o);
    else if (mode == "local")
      s = RunLocal(o, argc, argv);
    else
      s = InvalidArgument("--mode must be auto, local, worker or reference");
  }
  if (!s.ok()) {
    std::fprintf(stderr, "zps-train (rank %d): %s\n", o.rank, s.ToString().c_str());
    return 1;
  }
  return 0;
}
