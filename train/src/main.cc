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
#include "zps/train/held_out.h"
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

// The --corpus data as rank `rank` of the job's world reads it. Both modes build their loader
// here: the reference trains on the batches the workers train on.
Result<std::unique_ptr<DataLoader>> MakeLoader(const TrainOptions& o, int rank) {
  ZPS_ASSIGN_OR_RETURN(std::string corpus, LoadCorpus(o.corpus));
  DataOptions d = o.data;
  d.seq_len = o.model.seq_len;
  d.rank = rank;
  d.world = o.world_size;
  return DataLoader::Create(std::move(corpus), d);
}

// ---- reference mode: the whole job in this process ------------------------------------------

Status RunReference(const TrainOptions& o) {
  ZPS_ASSIGN_OR_RETURN(server::JobSpec job, BuildJob(o.job, o.model, o.steps));
  ReferenceOptions ro;
  ro.layout = job.layout.options();
  ro.optimizer = job.optimizer;
  ro.commit = job.commit;
  ro.world = o.world_size;
  // Quantized weights: the reference's own int8 copy (ReferenceOptions::quantized_weights_block).
  if (job.shard.serving_dtype == DType::kI8Block) {
    ro.quantized_weights_block = kWeightQuantBlock;
  } else {
    ro.serving_dtype = job.shard.serving_dtype;
  }
  ro.lr_schedule = job.shard.lr_schedule;
  ro.grad_dtype = job.shard.grad_dtype;
  ro.residual_reset_every = o.reference_checkpoint_every;
  ro.grad_error_feedback = o.grad_error_feedback;
  ro.inject_overflow_step = o.inject_overflow_step;
  ZPS_ASSIGN_OR_RETURN(auto trainer, ReferenceTrainer::Create(o.model, ro, nullptr));
  ZPS_ASSIGN_OR_RETURN(auto loader, MakeLoader(o, 0));  // every rank's batches (BatchForRank)
  const DataOptions& d = loader->options();
  std::vector<std::vector<uint8_t>> batches(o.world_size,
                                            std::vector<uint8_t>(loader->batch_bytes()));
  // The held-out loss over the windows rank 0 evaluates in worker mode (HeldOutSet), so the two
  // modes print the same figures.
  ZPS_ASSIGN_OR_RETURN(const HeldOutSet held_out, HeldOutSet::Create(*loader, d.batch));
  auto eval = [&]() -> Result<double> {
    return held_out.Loss(
        [&](std::span<const uint8_t> tokens, int rows) { return trainer->Evaluate(tokens, rows); });
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

// The held-out loss (HeldOutSet) of the parameters at `version`: each batch fetched as one pass.
Result<double> EvalLoss(Model& model, WorkerAccess& access, const HeldOutSet& held_out,
                        int64_t version) {
  return held_out.Loss([&](std::span<const uint8_t> tokens, int rows) {
    access.BeginStep(version, false);
    return model.Evaluate(tokens, rows, access);
  });
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
  ZPS_ASSIGN_OR_RETURN(auto loader, MakeLoader(o, o.rank));
  const DataOptions& d = loader->options();
  ZPS_ASSIGN_OR_RETURN(const HeldOutSet held_out, HeldOutSet::Create(*loader, d.batch));
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
  // `after_join`: the failure came after the job itself was joined (building the communicator,
  // or rank 0's initial values), which join_retrying tries again.
  bool after_join = false;
  const auto skip_bucket = SkipBucketHook();  // outlives each join's WorkerAccess
  auto join = [&]() -> Status {
    after_join = false;
    eval_ptr.reset();
    access_ptr.reset();
    collectives.reset();
    client.reset();
    ZPS_ASSIGN_OR_RETURN(client, worker::Client::Connect(wo, spec, job.Hash()));
    after_join = true;
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
      if (!made.ok()) return made.status().WithContext("building the communicator");
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
  // started a newer worker generation, or a peer died during the rendezvous), or rank 0's
  // initial values refused because the job moved past step 0 while it joined (its own pushes
  // of step 0 completed that step), are tried again in a new join; a failure to join the job
  // itself (it stopped, a bad spec) is final.
  auto join_retrying = [&]() -> Status {
    for (;;) {
      Status s = join();
      if (s.ok() || !after_join || !Recoverable(s) || recoveries >= o.max_recoveries) {
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
    ZPS_ASSIGN_OR_RETURN(eval_start, EvalLoss(*model, *eval_ptr, held_out, 0));
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
      ZPS_ASSIGN_OR_RETURN(const double e, EvalLoss(*model, *eval_ptr, held_out, step + 1));
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
    ZPS_ASSIGN_OR_RETURN(double eval_end, EvalLoss(*model, *eval_ptr, held_out, o.steps));
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
  cluster.shard_serving_copies = o.shard_serving_copies;
  cluster.work_dir = o.work_dir;
  return RunLocalCluster(cluster, argc, argv);
}

}  // namespace
}  // namespace zps::train

int main(int argc, char** argv) {
  using namespace zps;
  using namespace zps::train;
  TrainOptions o;
  Flags flags("zps-train",
              "Trains a byte-level decoder-only transformer through zps. With no endpoint it "
              "starts a local cluster (--shards zps-server processes and --world-size workers on "
              "loopback) and trains on the Debian license texts.");
  JobFlags job_flags(&flags);
  AddTrainFlags(flags, job_flags, &o);
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
  if (Status q = ApplyQuantizedFlags(&o); !q.ok()) {
    std::fprintf(stderr, "zps-train: %s\n", q.message().c_str());
    return 2;
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
