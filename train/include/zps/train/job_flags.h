// zps/train/job_flags.h — zps-train's job-spec flags. Each one names the key of the JSON job
// description it sets (the object zps.torch sends), and zps-train's job is that object decoded by
// the one JSON codec of zps/common/job_spec.h (JobSpecFromJson): a new job-spec field is a new
// flag with its key, and nothing else here.
//
// Thread-safety: used from main(), once, like zps::Flags itself.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zps/common/config.h"
#include "zps/common/job_spec.h"
#include "zps/common/status.h"
#include "zps/train/model.h"

namespace zps::train {

/// Registers flags on a zps::Flags (as Flags::Add, the field's value at registration is its
/// default) and records, for each, the key of the JSON job description its value goes to: a dotted
/// path such as "optimizer.lr" or "shard.lr_schedule.type". The fields must outlive Json().
class JobFlags {
 public:
  explicit JobFlags(Flags* flags) : flags_(flags) {}

  void Add(std::string name, std::string help, std::string key, std::string* field);
  void Add(std::string name, std::string help, std::string key, bool* field);
  void Add(std::string name, std::string help, std::string key, double* field);
  void Add(std::string name, std::string help, std::string key, int64_t* field, int64_t min,
           int64_t max);
  void Add(std::string name, std::string help, std::string key, int* field, int min, int max);
  /// A byte size ("2GiB"), as Flags::AddBytes.
  void AddBytes(std::string name, std::string help, std::string key, uint64_t* field);

  /// Every registered flag's current value at its key. An empty string is a flag not given: its
  /// key is left out (the codec's default applies). Errors: InvalidArgument naming the flag of a
  /// number that is not finite (JSON has no such number).
  Result<nlohmann::json> Json() const;

  /// A registered flag (without "--") and its key, in registration order.
  struct Binding {
    std::string flag;
    std::string key;
  };
  std::vector<Binding> Bindings() const;

 private:
  struct Bound {
    std::string flag;
    std::string key;
    std::vector<std::string> path;        // the key, split at its dots
    std::function<nlohmann::json()> get;  // the value (null: left out)
  };
  void Bind(std::string name, const std::string& key, std::function<nlohmann::json()> get);

  Flags* flags_;
  std::vector<Bound> bound_;
};

/// zps-train's job: `flags` (JobFlags::Json) completed with what zps-train derives from its other
/// options, then decoded by JobSpecFromJson:
///   - params: the model's parameters (Specs(model)); align_elems left out, so JobSpecFromJson
///     takes ServingAlignElems of shard.serving_dtype (64; with int8-block weights, one weight
///     block: no block holds two parameters);
///   - commit.grad_divisor: shard.world_size (gradients are averaged over the ranks);
///   - with commit.dynamic_loss_scale, shard.grad_dtype and shard.serving_dtype are fp16 unless
///     given;
///   - shard.lr_schedule: left out when its type is none (or absent), once its values are
///     checked; otherwise warmup_max_lr is optimizer.lr (warmup_min_lr 0), and a total_num_steps
///     of 0 (or absent) is `steps`.
/// Errors: InvalidArgument (JobSpecFromJson's: a bad value, named by its key; Validate's).
Result<JobSpec> BuildJob(nlohmann::json flags, const ModelConfig& model, int64_t steps);

}  // namespace zps::train
