// zps/common/metrics.h — Prometheus metrics: a Registry of metric families, handles for the hot
// path, the text exposition format (0.0.4), and an HTTP Exporter for /metrics, /healthz, /readyz.
//
//   metrics::Registry reg;
//   ZPS_ASSIGN_OR_RETURN(auto* fam, reg.AddCounter("zps_fetch_bytes_total", "Bytes served."));
//   ZPS_ASSIGN_OR_RETURN(metrics::Counter fetched, fam->Add({}));     // at start-up
//   fetched.Inc(n);                                                    // hot path: one atomic add
//   ZPS_ASSIGN_OR_RETURN(auto exporter, metrics::Exporter::Start({.port = 9464}, &reg, live, ready));
//
// Modelled on prometheus-cpp (which Debian 12 does not package; see docs/metrics.md): a Family is
// one metric name with fixed label names; Family::Add resolves one set of label values into a
// handle ONCE, at start-up. Handles (Counter, Gauge, Histogram) are small copyable pointers to
// atomics owned by the Family; their operations take no lock and do no lookup:
//   Counter::Inc      one relaxed fetch_add on a uint64_t,
//   Gauge::Set/Inc    one relaxed store / CAS loop on a double,
//   Histogram::Observe a binary search over the bucket bounds, one fetch_add on the bucket and
//                     one CAS loop on the sum (the count is the sum of the buckets).
// Unlike prometheus-cpp, Histogram::Observe takes no mutex, so per-thread batching is not needed.
//
// A default-constructed handle is detached: its operations are valid no-ops and Value() is 0. Code
// that may run without a registry (a library used with metrics off) keeps detached handles.
//
// Thread-safety: Registry::Add*, Family::Add and Registry::Serialize are safe from any thread
// (a mutex per registry and per family, never taken by handle operations). Handle operations are
// safe from any thread. Handles stay valid as long as the Registry that issued them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"

namespace zps::metrics {

/// Label values, in the order of the family's label names.
using LabelValues = std::vector<std::string>;

namespace internal {
struct HistogramCell {
  explicit HistogramCell(const std::vector<double>* b);
  const std::vector<double>* bounds;               // owned by the family; excludes +Inf
  std::unique_ptr<std::atomic<uint64_t>[]> buckets;  // bounds->size() + 1 (last = +Inf)
  std::atomic<double> sum{0.0};
};
}  // namespace internal

/// A monotonically increasing integer count (bytes, events).
class Counter {
 public:
  Counter() = default;  // detached
  void Inc(uint64_t n = 1) const {
    if (cell_ != nullptr) cell_->fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t Value() const { return cell_ ? cell_->load(std::memory_order_relaxed) : 0; }
  bool attached() const { return cell_ != nullptr; }

 private:
  friend class CounterFamily;
  explicit Counter(std::atomic<uint64_t>* cell) : cell_(cell) {}
  std::atomic<uint64_t>* cell_ = nullptr;
};

/// A value that goes up and down.
class Gauge {
 public:
  Gauge() = default;  // detached
  void Set(double v) const {
    if (cell_ != nullptr) cell_->store(v, std::memory_order_relaxed);
  }
  void Inc(double v = 1.0) const {
    if (cell_ != nullptr) cell_->fetch_add(v, std::memory_order_relaxed);
  }
  void Dec(double v = 1.0) const { Inc(-v); }
  /// Sets the gauge to the current Unix time in seconds.
  void SetToCurrentTime() const;
  double Value() const { return cell_ ? cell_->load(std::memory_order_relaxed) : 0.0; }
  bool attached() const { return cell_ != nullptr; }

 private:
  friend class GaugeFamily;
  explicit Gauge(std::atomic<double>* cell) : cell_(cell) {}
  std::atomic<double>* cell_ = nullptr;
};

/// Observations counted into fixed buckets, plus their sum.
class Histogram {
 public:
  Histogram() = default;  // detached
  void Observe(double v) const;
  /// Observes the seconds elapsed since `start` (steady clock).
  void ObserveSince(std::chrono::steady_clock::time_point start) const {
    Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  /// Observations so far (sum of the buckets) and their sum.
  uint64_t Count() const;
  double Sum() const;
  /// Per-bucket (non-cumulative) counts, the last one being +Inf.
  std::vector<uint64_t> BucketCounts() const;
  bool attached() const { return cell_ != nullptr; }

 private:
  friend class HistogramFamily;
  explicit Histogram(internal::HistogramCell* cell) : cell_(cell) {}
  internal::HistogramCell* cell_ = nullptr;
};

enum class Type { kCounter, kGauge, kHistogram };

/// One metric name with its help text, type and label names. Owned by a Registry.
class Family {
 public:
  virtual ~Family() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  Type type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  /// Appends this family in the text exposition format (HELP, TYPE, then one line per series,
  /// series ordered by label values). Thread-safe.
  virtual void Serialize(std::string& out) const = 0;

 protected:
  Family(std::string name, std::string help, Type type, std::vector<std::string> label_names)
      : name_(std::move(name)), help_(std::move(help)), type_(type),
        label_names_(std::move(label_names)) {}
  /// Errors: InvalidArgument when `values` does not match the label names in count.
  Status CheckValues(const LabelValues& values) const;

  const std::string name_, help_;
  const Type type_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;  // guards the children maps of the subclasses
};

class CounterFamily final : public Family {
 public:
  /// Resolves `values` into a handle; the same values give the same series. Not for hot paths.
  /// Errors: InvalidArgument (wrong number of values).
  Result<Counter> Add(const LabelValues& values);
  void Serialize(std::string& out) const override;

 private:
  friend class Registry;
  using Family::Family;
  std::map<LabelValues, std::unique_ptr<std::atomic<uint64_t>>> children_;  // guarded by mu_
};

class GaugeFamily final : public Family {
 public:
  /// As CounterFamily::Add.
  Result<Gauge> Add(const LabelValues& values);
  void Serialize(std::string& out) const override;

 private:
  friend class Registry;
  using Family::Family;
  std::map<LabelValues, std::unique_ptr<std::atomic<double>>> children_;  // guarded by mu_
};

class HistogramFamily final : public Family {
 public:
  /// As CounterFamily::Add.
  Result<Histogram> Add(const LabelValues& values);
  void Serialize(std::string& out) const override;
  /// The upper bounds, strictly increasing, without +Inf.
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  friend class Registry;
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds)
      : Family(std::move(name), std::move(help), Type::kHistogram, std::move(label_names)),
        bounds_(std::move(bounds)) {}
  const std::vector<double> bounds_;
  std::map<LabelValues, std::unique_ptr<internal::HistogramCell>> children_;  // guarded by mu_
};

/// Owns every family of a process (one per process in practice; tests make their own).
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// Each Add* errors with InvalidArgument for a name that is not a Prometheus metric name
  /// ([a-zA-Z_:][a-zA-Z0-9_:]*), a label name that is not one ([a-zA-Z_][a-zA-Z0-9_]*, not
  /// starting with "__") or is repeated, and AlreadyExists when the name (or, for a histogram,
  /// one of its _bucket/_sum/_count series names) is taken.
  Result<CounterFamily*> AddCounter(std::string name, std::string help,
                                    std::vector<std::string> label_names = {});
  Result<GaugeFamily*> AddGauge(std::string name, std::string help,
                                std::vector<std::string> label_names = {});
  /// `bounds`: finite, strictly increasing upper bounds (+Inf is implicit). A label named "le" is
  /// refused (InvalidArgument).
  Result<HistogramFamily*> AddHistogram(std::string name, std::string help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds);

  /// Every family, in registration order, in the text exposition format 0.0.4.
  std::string Serialize() const;

 private:
  Status Reserve(const std::string& name, const std::vector<std::string>& label_names,
                 Type type);  // needs mu_
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family>> families_;  // guarded by mu_
  std::vector<std::string> taken_;                 // guarded by mu_: exposed series names
};

/// `count` bounds start, start*factor, ... ZPS_CHECKs start > 0, factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

/// The Content-Type of the text exposition format.
inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

/// Formats a sample value as the exposition format wants it: shortest round-trip decimal, or
/// "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);
/// Escapes a label value (backslash, double quote, newline) or, with `help`, a HELP text
/// (backslash, newline).
std::string Escape(std::string_view s, bool help = false);

/// The project version and the git revision the build was configured at ("unknown" outside git).
std::string_view BuildVersion();
std::string_view BuildRevision();

// ---- HTTP exporter ------------------------------------------------------------------------------

struct ExporterOptions {
  std::string bind_address = "0.0.0.0";  // Default: all interfaces. Tests use "127.0.0.1".
  uint16_t port = 9464;                  // Default: 9464; 0 = ephemeral (read back with port()).
  size_t max_request_bytes = 8192;       // Default: 8 KiB of request line + headers; more: 431.
  int request_timeout_ms = 5000;         // Default: 5 s to send the request and read the reply.
  size_t max_connections = 64;           // Default: 64 open at once; more are closed at once.
  std::string thread_name = "metrics-http";  // Default: "metrics-http". The io thread's name.
};

/// A health probe: OK means healthy / ready; an error's text becomes the 503 body.
/// Runs on the exporter's io thread: it must be fast, non-blocking and thread-safe.
using Probe = std::function<Status()>;

/// A small HTTP/1.1 server on its own io thread (Boost.Asio inside; no Asio in this header).
///   GET|HEAD /metrics  200, the registry in the text format
///   GET|HEAD /healthz  200 "ok" when `liveness` is OK, else 503 with its message
///   GET|HEAD /readyz   200 "ok" when `readiness` is OK, else 503 with its message
///   other paths 404; other methods 405; a malformed request 400; a request head over
///   max_request_bytes 431. Every reply closes the connection (Connection: close). A client that
///   has not sent a full request head, or not read the reply, within request_timeout_ms is
///   dropped, so slow or garbage clients cost one socket each for a bounded time.
/// Thread-safety: Stop and port() are safe from any thread; Stop must not run inside a Probe.
class Exporter {
 public:
  /// Binds, listens and starts the io thread. `registry` must outlive the Exporter; an empty
  /// probe counts as always OK. Errors: InvalidArgument (bad address, zero limits), IoError (bind
  /// or listen failed, e.g. the port is in use).
  static Result<std::unique_ptr<Exporter>> Start(const ExporterOptions& options,
                                                 const Registry* registry, Probe liveness,
                                                 Probe readiness);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  /// Closes the listener and every connection and joins the io thread. Idempotent.
  void Stop();
  /// The bound port (the real one when ExporterOptions::port was 0).
  uint16_t port() const;

  struct Impl;  // internal

 private:
  explicit Exporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::metrics
