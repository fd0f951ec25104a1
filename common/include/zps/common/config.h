// zps/common/config.h — one way to fill an options struct: config file, then ZPS_* environment,
// then command-line flags, each overriding the one before.
//
//   ServerOptions opts;                      // in-class defaults
//   zps::Flags flags("zps-server", "A zps shard.");
//   flags.Add("port", "control-plane TCP port", &opts.port);
//   ZPS_ASSIGN_OR_RETURN(auto outcome, flags.Parse(argc, argv));
//   if (outcome == zps::ParseOutcome::kHelpShown) return 0;
//
// Sources, in order:
//   1. A JSON config file: `--config PATH` or ZPS_CONFIG. A flat object whose keys are option names
//      (`"memory-budget": "2GiB"`, `"port": 7000`). Unknown keys are an error.
//   2. Environment: option `memory-budget` reads ZPS_MEMORY_BUDGET.
//   3. Flags: `--memory-budget=2GiB` or `--memory-budget 2GiB`; a bool flag alone means true.
// A value that is present but does not parse, or is out of range, is an error naming its source.
// Nothing silently falls back to the default.
//
// Thread-safety: a Flags object is used from one thread, once, in main().
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zps/common/status.h"

namespace zps {

/// Parses a byte size: "4096", "64KiB", "2GiB", "1.5G", "512MB" (powers of 1024 and 1000).
Result<uint64_t> ParseBytes(std::string_view text);
/// Parses a signed integer with bounds, e.g. ParseInt("7", 0, 10).
Result<int64_t> ParseInt(std::string_view text, int64_t min, int64_t max);
Result<double> ParseDouble(std::string_view text);
/// "1/0", "true/false", "yes/no", "on/off".
Result<bool> ParseBool(std::string_view text);

/// Splits "host:port" (or "[v6]:port"). Errors: InvalidArgument.
Result<std::pair<std::string, uint16_t>> SplitHostPort(std::string_view endpoint);

/// Reads a shared-secret file (trailing whitespace trimmed). Errors: NotFound when it cannot be
/// read, InvalidArgument when it is empty.
Result<std::string> ReadTokenFile(const std::string& path);

enum class ParseOutcome { kRun, kHelpShown };

class Flags {
 public:
  Flags(std::string program, std::string summary);

  /// Registers an option. The field's value at registration is its default (shown by --help).
  void Add(std::string name, std::string help, std::string* field);
  void Add(std::string name, std::string help, bool* field);
  void Add(std::string name, std::string help, double* field);
  void Add(std::string name, std::string help, int64_t* field, int64_t min, int64_t max);
  void Add(std::string name, std::string help, int* field, int min, int max);
  /// A byte size ("2GiB").
  void AddBytes(std::string name, std::string help, uint64_t* field);
  /// Any other type: `set` parses the text and stores it, or returns an error.
  void AddCustom(std::string name, std::string help, std::string default_text,
                 std::function<Status(std::string_view)> set);

  /// Words that are not flags (sub-commands). Only allowed when `max_positional` > 0.
  void AllowPositional(size_t max_positional, std::string usage);
  const std::vector<std::string>& positional() const { return positional_; }

  /// Fills the registered fields from the three sources. Prints help and returns kHelpShown for
  /// --help / -h. Errors: InvalidArgument for an unknown option, a bad value or a bad file;
  /// NotFound when the config file does not exist.
  Result<ParseOutcome> Parse(int argc, const char* const* argv);
  Result<ParseOutcome> Parse(int argc, char** argv) {
    return Parse(argc, const_cast<const char* const*>(argv));
  }

  std::string Help() const;

 private:
  struct Option {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<Status(std::string_view)> set;
  };
  const Option* Find(std::string_view name) const;
  Status Apply(const Option& opt, std::string_view value, std::string_view source) const;
  Status ApplyFile(const std::string& path) const;

  std::string program_;
  std::string summary_;
  std::string positional_usage_;
  size_t max_positional_ = 0;
  std::vector<Option> options_;
  std::vector<std::string> positional_;
};

/// The environment variable name for an option: "memory-budget" -> "ZPS_MEMORY_BUDGET".
std::string EnvName(std::string_view option);

}  // namespace zps
