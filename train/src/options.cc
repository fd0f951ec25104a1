#include "zps/train/options.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zps::train {

void AddModelFlags(Flags& flags, ModelConfig* c) {
  flags.Add("d-model", "model width (multiple of --n-heads)", &c->d_model, 1, 65536);
  flags.Add("n-layers", "transformer blocks", &c->n_layers, 1, 4096);
  flags.Add("n-heads", "attention heads per block", &c->n_heads, 1, 65536);
  flags.Add("d-ff", "MLP hidden width", &c->d_ff, 1, 262144);
  flags.Add("seq-len", "context length in bytes", &c->seq_len, 1, 65536);
  flags.AddCustom("model-seed", "seed of the parameter initialiser", std::to_string(c->seed),
                  [c](std::string_view text) -> Status {
                    ZPS_ASSIGN_OR_RETURN(int64_t v, ParseInt(text, 0, INT64_MAX));
                    c->seed = static_cast<uint64_t>(v);
                    return Status::Ok();
                  });
}

void AddDataFlags(Flags& flags, DataOptions* d, std::string* corpus) {
  flags.Add("batch", "sequences per rank per step", &d->batch, 1, 1 << 20);
  flags.Add("eval-windows",
            "held-out windows at the corpus end; the held-out loss is their mean, evaluated "
            "--batch windows at a time",
            &d->eval_windows, 0, 1 << 20);
  flags.AddCustom("data-seed", "seed of the data order", std::to_string(d->seed),
                  [d](std::string_view text) -> Status {
                    ZPS_ASSIGN_OR_RETURN(int64_t v, ParseInt(text, 0, INT64_MAX));
                    d->seed = static_cast<uint64_t>(v);
                    return Status::Ok();
                  });
  flags.Add("corpus", "training text: a file or directory (empty: /usr/share/common-licenses)",
            corpus);
}

void AddTrainFlags(Flags& flags, JobFlags& job, TrainOptions* o) {
  flags.Add("mode", "auto, local (spawn a cluster), worker (one rank) or reference (in-process)",
            &o->mode);
  flags.Add("quantized-weights",
            "int8: workers read an int8 block-quantized copy of the weights (one fp32 scale per "
            "256 elements; shard.serving_dtype int8-block)",
            &o->quantized_weights);
  flags.Add("endpoint", "coordinator host:port (worker mode)", &o->endpoint);
  flags.Add("token", "shared auth secret (prefer token-file)", &o->token);
  flags.Add("token-file", "file holding the shared auth secret", &o->token_file);
  flags.Add("rank", "this worker's rank", &o->rank, 0, 65535);
  job.Add("world-size", "number of worker ranks", "shard.world_size", &o->world_size, 1, 65536);
  job.Add("shards", "number of shards in the job", "num_shards", &o->shards, 1, 4096);
  flags.Add("steps", "training steps", &o->steps, 1, INT64_MAX / 2);
  job.Add("optimizer", "adam, adamw or sgd", "optimizer.type", &o->optimizer);
  job.Add("lr", "learning rate", "optimizer.lr", &o->lr);
  job.Add("weight-decay", "weight decay", "optimizer.weight_decay", &o->weight_decay);
  job.Add("beta1", "Adam beta1", "optimizer.beta1", &o->beta1);
  job.Add("beta2", "Adam beta2", "optimizer.beta2", &o->beta2);
  job.Add("eps", "Adam epsilon", "optimizer.eps", &o->eps);
  job.Add("max-grad-norm", "global gradient-norm clip (0 = off)", "commit.max_grad_norm",
          &o->max_grad_norm);
  job.Add("lr-schedule", "servers' lr schedule: none, WarmupLR, WarmupDecayLR or WarmupCosineLR",
          "shard.lr_schedule.type", &o->lr_schedule);
  job.Add("warmup-num-steps", "lr schedule warmup updates", "shard.lr_schedule.warmup_num_steps",
          &o->warmup_num_steps, 1, INT64_MAX / 2);
  job.Add("total-num-steps", "lr schedule total updates (0 = --steps)",
          "shard.lr_schedule.total_num_steps", &o->total_num_steps, 0, INT64_MAX / 2);
  job.Add("warmup-type", "lr schedule warmup: log or linear", "shard.lr_schedule.warmup_type",
          &o->warmup_type);
  job.Add("loss-scaling", "fp16 dynamic loss scaling (pushes fp16 gradients)",
          "commit.dynamic_loss_scale", &o->loss_scaling);
  job.Add("initial-loss-scale", "first loss scale with --loss-scaling", "commit.initial_loss_scale",
          &o->initial_loss_scale);
  job.Add("grad-dtype", "push dtype: fp32, fp16 or bf16 (default fp32; fp16 with loss scaling)",
          "shard.grad_dtype", &o->grad_dtype);
  flags.Add("quantized-grads",
            "push block-quantized gradients with error feedback: int8 or int4 (the job's "
            "shard.grad_dtype; not with --grad-dtype)",
            &o->quantized_grads);
  flags.Add("grad-error-feedback",
            "testing: with --quantized-grads, false quantizes every push on its own (no error "
            "feedback), to show what the feedback is for",
            &o->grad_error_feedback);
  flags.Add("reference-checkpoint-every",
            "reference mode with --quantized-grads: the --checkpoint-every of the shards of the "
            "run to compare with (the workers zero their residuals at those steps; other modes "
            "ignore it)",
            &o->reference_checkpoint_every, 0, INT64_MAX / 2);
  job.Add("serving-dtype", "copy workers fetch: bf16, fp16 or fp32", "shard.serving_dtype",
          &o->serving_dtype);
  job.Add("state-dtype",
          "how the shards store the optimizer's moments beside the fp32 master: fp32, bf16 "
          "(m rounded to nearest, v up or down by a dither over steps) or int8 (blockwise, dynamic "
          "map)",
          "optimizer.state_dtype", &o->state_dtype);
  job.Add("reduction",
          "server-sum (every rank pushes its whole gradient) or pre-reduced (the ranks "
          "reduce-scatter each gradient with Gloo; each pushes its slice)",
          "shard.reduction", &o->reduction);
  job.Add("update",
          "the shards' update mode: sync (optimizer after the commit) or speculative (each chunk "
          "as soon as its gradient is complete; bit-identical)",
          "shard.update", &o->update);
  flags.Add(
      "fetch-strategy",
      "direct (every rank fetches whole parameters) or bandwidth-centric (each rank fetches its "
      "slice, the ranks all-gather with Gloo)",
      &o->fetch_strategy);
  flags.AddBytes(
      "bucket-bytes",
      "pre-reduced: fp32 gradient bytes gathered (in push order) into one reduce-scatter; "
      "0 = one per parameter; the same on every rank",
      &o->bucket_bytes);
  flags.Add("gloo-hostname",
            "address this rank's Gloo tcp device binds and advertises (default: 127.0.0.1 when the "
            "endpoint is on loopback, else the host name)",
            &o->gloo_hostname);
  job.AddBytes("chunk-elems", "elements per chunk of the flat parameter space", "chunk_elems",
               &o->chunk_elems);
  flags.Add("inject-overflow-step", "test hook: an Inf gradient on rank 0 at this step",
            &o->inject_overflow_step, -1, INT64_MAX);
  flags.AddBytes("prefetch-bytes", "bytes fetched ahead along the access trace (0 = off)",
                 &o->prefetch_bytes);
  flags.AddBytes("max-live-bytes", "fetched parameter bytes held at most", &o->max_live_bytes);
  flags.Add("ucx-tls", "UCX transports (e.g. tcp, posix,cma,self)", &o->ucx_tls);
  flags.Add("log-every", "print progress every N steps", &o->log_every, 1, 1000000);
  flags.Add("eval-every",
            "rank 0 (and reference mode): also print the held-out loss after every N steps "
            "(0 = at the start and the end only)",
            &o->eval_every, 0, INT64_MAX / 2);
  flags.Add("print-crcs", "print per-chunk CRC32C of the final state", &o->print_crcs);
  flags.Add("print-latency",
            "worker: print this rank's fetch/push request and step duration histograms at the end "
            "(the buckets of its zps_request_duration_seconds and zps_step_duration_seconds)",
            &o->print_latency);
  flags.Add("log-level", "debug, info, warning or error", &o->log_level);
  flags.Add("op-timeout", "seconds any single wait may take", &o->op_timeout_s, 1, 86400);
  flags.Add("max-recoveries", "times a worker re-joins after losing a shard or the coordinator",
            &o->max_recoveries, 0, 1000000);
  flags.Add("metrics-port",
            "HTTP port for /metrics, /healthz, /readyz (0 = off); in local mode the first of "
            "shards+world-size consecutive ports (shards first, then workers)",
            &o->metrics_port, 0, 65535);
  flags.Add("metrics-bind", "address the metrics endpoint listens on (worker mode)",
            &o->metrics_bind);
  flags.AddBytes(
      "shard-memory-budget",
      "local mode: each shard's --memory-budget (master + optimizer state in RAM; the rest "
      "spills to <work-dir>/zps-local-XXXXXX/shard-N-data/spill); 0 = all in RAM",
      &o->shard_memory_budget);
  flags.AddBytes(
      "shard-serving-budget",
      "local mode: each shard's --serving-budget (16-bit serving copies in RAM; the rest "
      "spills to <work-dir>/zps-local-XXXXXX/shard-N-data/spill); 0 = all in RAM",
      &o->shard_serving_budget);
  flags.Add("shard-serving-copies",
            "local mode: each shard's --serving-copies: stored, or on-fetch (no serving copies "
            "kept, 2 bytes a parameter fewer; each fetch converts the master, read back from the "
            "spill files if it spilled; no serving budget)",
            &o->shard_serving_copies);
  flags.Add("work-dir",
            "local mode: where the cluster directory zps-local-XXXXXX is made (logs, token, the "
            "shards' spill files); default $TMPDIR, else /tmp",
            &o->work_dir);
  AddModelFlags(flags, &o->model);
  AddDataFlags(flags, &o->data, &o->corpus);
}

Status ApplyQuantizedFlags(TrainOptions* o) {
  // A block-quantized choice of a job field that a plain dtype flag also sets.
  struct QuantizedFlag {
    std::string_view flag;                  // the quantized flag, e.g. "quantized-grads"
    const std::string& value;               // its value ("" = not given)
    std::vector<std::string_view> formats;  // the values it takes
    std::string_view must_be;     // the message's words between "--<flag>" and the bad value
    std::string_view plain_flag;  // the plain dtype flag of the same field
    const std::string& plain;     // its value ("" = not given)
    std::string_view sets;        // what both set, in the message
    const char* field;            // the field under "shard" in the job
  };
  const QuantizedFlag flags[] = {
      {"quantized-grads",
       o->quantized_grads,
       {"int8", "int4"},
       "must be int8 or int4, not",
       "grad-dtype",
       o->grad_dtype,
       "the push dtype",
       "grad_dtype"},
      {"quantized-weights",
       o->quantized_weights,
       {"int8"},
       "must be int8; got",
       "serving-dtype",
       o->serving_dtype,
       "the serving copy",
       "serving_dtype"},
  };
  for (const QuantizedFlag& q : flags) {
    if (q.value.empty()) continue;
    const std::string flag(q.flag);
    if (std::find(q.formats.begin(), q.formats.end(), q.value) == q.formats.end()) {
      return InvalidArgument("--" + flag + " " + std::string(q.must_be) + " '" + q.value + "'");
    }
    if (!q.plain.empty()) {
      return InvalidArgument("--" + flag + " and --" + std::string(q.plain_flag) + " both set " +
                             std::string(q.sets) + ": give one");
    }
  }
  for (const QuantizedFlag& q : flags) {
    if (!q.value.empty()) o->job["shard"][q.field] = q.value + "-block";  // the DType's name
  }
  return Status::Ok();
}

}  // namespace zps::train
