#include "zps/common/logging.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace zps::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
thread_local char t_name[32] = "";

char LevelChar(Level level) {
  switch (level) {
    case Level::kDebug:
      return 'D';
    case Level::kInfo:
      return 'I';
    case Level::kWarning:
      return 'W';
    case Level::kError:
      return 'E';
  }
  return '?';
}

const char* BaseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetLevel(Level level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }
Level GetLevel() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }

Result<Level> ParseLevel(std::string_view text) {
  if (text == "debug") return Level::kDebug;
  if (text == "info") return Level::kInfo;
  if (text == "warning" || text == "warn") return Level::kWarning;
  if (text == "error") return Level::kError;
  return InvalidArgument("log level must be one of debug, info, warning, error; got '" +
                         std::string(text) + "'");
}

void SetThreadName(std::string_view name) {
  size_t n = std::min(name.size(), sizeof(t_name) - 1);
  std::memcpy(t_name, name.data(), n);
  t_name[n] = '\0';
  char short_name[16];
  size_t m = std::min<size_t>(n, 15);
  std::memcpy(short_name, name.data(), m);
  short_name[m] = '\0';
  pthread_setname_np(pthread_self(), short_name);
}

Record::Record(Level level, const char* file, int line) : level_(level) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  auto micros = duration_cast<microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[96];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long>(micros));
  out_ << LevelChar(level) << ' ' << stamp << ' ' << getpid();
  if (t_name[0] != '\0') out_ << ' ' << t_name;
  out_ << ' ' << BaseName(file) << ':' << line << "] ";
}

Record::~Record() {
  out_ << '\n';
  std::string line = out_.str();
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  (void)level_;
}

void CheckFailed(const char* cond, const char* file, int line) {
  { Record(Level::kError, file, line).stream() << "CHECK failed: " << cond; }
  std::abort();
}

}  // namespace zps::log
