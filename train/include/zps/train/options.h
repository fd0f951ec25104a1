// zps/train/options.h — zps-train's command-line options: its options struct and the one function
// that registers every flag of it (zps-train's main() and tests/unit/train/job_flags_test.cc both
// call AddTrainFlags, so the test checks the flags and defaults zps-train has), and the model's
// and the data's flags it includes.
//
// Thread-safety: used from main(), once, like zps::Flags itself.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "zps/common/config.h"
#include "zps/train/data.h"
#include "zps/train/job_flags.h"
#include "zps/train/model.h"

namespace zps::train {

/// Registers --d-model, --n-layers, --n-heads, --d-ff, --seq-len and --model-seed, writing into
/// *config (whose current values are the defaults shown by --help). Call config->Validate() after
/// Flags::Parse: the cross-field rules (d_model % n_heads) are checked there.
void AddModelFlags(Flags& flags, ModelConfig* config);

/// Registers --batch, --data-seed, --eval-windows and --corpus (a file or a directory; empty = the
/// Debian license texts). Rank and world come from the job, not from these flags.
void AddDataFlags(Flags& flags, DataOptions* data, std::string* corpus);

/// zps-train's options, with its defaults (shown by --help).
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
  // Default: "" = off. int8: the serving copy is int8 blocks (shard.serving_dtype int8-block;
  // ApplyQuantizedFlags).
  std::string quantized_weights;

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

  // Quantized gradients: "" = off, int8 or int4 (shard.grad_dtype int8-block / int4-block;
  // ApplyQuantizedFlags).
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
  std::string shard_serving_copies = "stored";  // Default: stored. Local mode: each shard's
                                                // --serving-copies. Other modes ignore it.
  std::string work_dir;  // Default: "" = $TMPDIR, else /tmp. Local mode: where the cluster
                         // directory (logs, spill files) is made. Other modes ignore it.
  ModelConfig model;
  DataOptions data;
  std::string corpus;
  nlohmann::json job;  // the job-spec flags' JSON job description (JobFlags::Json), after Parse
};

/// Registers every zps-train flag, writing into *o (whose current values are the defaults shown by
/// --help): the job-spec flags through `job` (each names its key in the JSON job description that
/// BuildJob completes), the others, and the model's and the data's (AddModelFlags, AddDataFlags).
/// After Flags::Parse, o->job is to be set from job.Json().
void AddTrainFlags(Flags& flags, JobFlags& job, TrainOptions* o);

/// Folds --quantized-grads and --quantized-weights, once o->job is set, into its
/// shard.grad_dtype and shard.serving_dtype (the flag's value and "-block": int8-block,
/// int4-block). Each is a block-quantized choice of a field that a plain dtype flag
/// (--grad-dtype, --serving-dtype) also sets. Errors: InvalidArgument, the message naming the
/// flag, for a value that is not one of its formats (--quantized-grads: int8 or int4;
/// --quantized-weights: int8) and for both flags of one field given. On error o->job is as it
/// was.
Status ApplyQuantizedFlags(TrainOptions* o);

}  // namespace zps::train
