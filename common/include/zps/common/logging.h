// zps/common/logging.h — leveled logging over one backend (stderr, one line per record).
//
//   ZPS_LOG(INFO) << "shard " << ordinal << " listening on " << endpoint;
//
// A record is formatted into a local buffer and written with one write(2), so lines from several
// threads never interleave. Records below the process level are not formatted at all.
//
// Thread-safety: all functions are safe to call from any thread.
#pragma once

#include <sstream>
#include <string_view>

#include "zps/common/status.h"

namespace zps::log {

enum class Level : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

/// Sets the process-wide threshold. Default: kInfo.
void SetLevel(Level level);
Level GetLevel();
/// Parses "debug", "info", "warning" or "error".
Result<Level> ParseLevel(std::string_view text);
/// Names the calling thread in log records (and in /proc, truncated to 15 bytes).
void SetThreadName(std::string_view name);

/// Turns the stream expression into void, for the conditional in ZPS_LOG.
struct Voidify {
  void operator&(std::ostream&) {}
};

/// One log record; writes itself on destruction.
class Record {
 public:
  Record(Level level, const char* file, int line);
  ~Record();
  Record(const Record&) = delete;
  Record& operator=(const Record&) = delete;
  std::ostream& stream() { return out_; }

 private:
  Level level_;
  std::ostringstream out_;
};

}  // namespace zps::log

#define ZPS_LOG_LEVEL_DEBUG ::zps::log::Level::kDebug
#define ZPS_LOG_LEVEL_INFO ::zps::log::Level::kInfo
#define ZPS_LOG_LEVEL_WARNING ::zps::log::Level::kWarning
#define ZPS_LOG_LEVEL_ERROR ::zps::log::Level::kError

// An expression (not an if/else), so `if (x) ZPS_LOG(INFO) << ...;` has no dangling else.
#define ZPS_LOG(severity)                             \
  (ZPS_LOG_LEVEL_##severity < ::zps::log::GetLevel()) \
      ? (void)0                                       \
      : ::zps::log::Voidify() &                       \
            ::zps::log::Record(ZPS_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()

/// For broken internal invariants only, never for peer or file input: logs and aborts.
#define ZPS_CHECK(cond)                                              \
  do {                                                               \
    if (!(cond)) ::zps::log::CheckFailed(#cond, __FILE__, __LINE__); \
  } while (0)

namespace zps::log {
[[noreturn]] void CheckFailed(const char* cond, const char* file, int line);
}
