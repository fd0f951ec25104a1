// zps/common/metrics.h — Prometheus metrics over prometheus-cpp (Debian's prometheus-cpp-dev): a
// Registry of metric families, handles for the hot path, the text exposition format (0.0.4, by
// prometheus-cpp's TextSerializer), and an HTTP Exporter (CivetWeb) for /metrics, /healthz and
// /readyz on one port.
//
//   metrics::Registry reg;
//   ZPS_ASSIGN_OR_RETURN(auto* fam, reg.AddCounter("zps_fetch_bytes_total", "Bytes served."));
//   ZPS_ASSIGN_OR_RETURN(metrics::Counter fetched, fam->Add({}));     // at start-up
//   fetched.Inc(n);                                                    // hot path
//   ZPS_ASSIGN_OR_RETURN(auto exporter, metrics::Exporter::Start({.port = 9464}, &reg, live,
//   ready));
//
// The Registry owns a prometheus::Registry. A Family is one metric name with fixed label names
// (prometheus-cpp's families take any labels; this layer checks the names and their count, so a
// family's series all have the same label set). Family::Add resolves one set of label values
// into a handle ONCE, at start-up, through prometheus::Family::Add; never call it on a hot path.
// Handles (Counter, Gauge, Histogram) are small copyable pointers to the prometheus-cpp metric
// objects, and their operations do no lookup:
//   Counter::Inc       prometheus::Counter::Increment: a CAS loop on an atomic double,
//   Gauge::Set/Inc     prometheus::Gauge::Set/Increment: a store / CAS loop on an atomic double,
//   Histogram::Observe prometheus::Histogram::Observe: a linear search over the bounds and two
//                      increments under the histogram's mutex, ~40 ns; one per request, against
//                      tens of microseconds per request, so no per-thread batching (measured:
//                      docs/benchmarks.md, "Metrics: prometheus-cpp's histogram mutex").
//
// A default-constructed handle is detached: its operations are valid no-ops and Value() is 0. Code
// that may run without a registry (a library used with metrics off) keeps detached handles.
//
// Errors: every exception prometheus-cpp or CivetWeb may throw is caught in this module and
// returned as a Status; no call here throws.
//
// Thread-safety: Registry::Add*, Family::Add, Registry::Collect and Registry::Serialize are safe
// from any thread (a mutex per registry and per family). Handle operations are safe from any
// thread. Handles stay valid as long as the Registry that issued them.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

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
#include "zps/common/thread_annotations.h"

namespace zps::metrics {

/// Label values, in the order of the family's label names.
using LabelValues = std::vector<std::string>;

/// A monotonically increasing count (bytes, events). Values are exact up to 2^53.
class Counter {
 public:
  Counter() = default;  // detached
  void Inc(uint64_t n = 1) const {
    if (cell_ != nullptr) cell_->Increment(static_cast<double>(n));
  }
  uint64_t Value() const { return cell_ ? static_cast<uint64_t>(cell_->Value()) : 0; }
  bool attached() const { return cell_ != nullptr; }

 private:
  friend class CounterFamily;
  explicit Counter(prometheus::Counter* cell) : cell_(cell) {}
  prometheus::Counter* cell_ = nullptr;
};

/// A value that goes up and down.
class Gauge {
 public:
  Gauge() = default;  // detached
  void Set(double v) const {
    if (cell_ != nullptr) cell_->Set(v);
  }
  void Inc(double v = 1.0) const {
    if (cell_ != nullptr) cell_->Increment(v);
  }
  void Dec(double v = 1.0) const { Inc(-v); }
  /// Sets the gauge to the current Unix time in seconds.
  void SetToCurrentTime() const {
    if (cell_ != nullptr) cell_->SetToCurrentTime();
  }
  double Value() const { return cell_ ? cell_->Value() : 0.0; }
  bool attached() const { return cell_ != nullptr; }

 private:
  friend class GaugeFamily;
  explicit Gauge(prometheus::Gauge* cell) : cell_(cell) {}
  prometheus::Gauge* cell_ = nullptr;
};

/// Observations counted into fixed buckets (upper bounds inclusive), plus their sum.
class Histogram {
 public:
  Histogram() = default;  // detached
  void Observe(double v) const {
    if (cell_ != nullptr) cell_->Observe(v);
  }
  /// Observes the seconds elapsed since `start` (steady clock).
  void ObserveSince(std::chrono::steady_clock::time_point start) const {
    Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  /// Observations so far and their sum (one consistent snapshot each; not for hot paths).
  uint64_t Count() const;
  double Sum() const;
  /// Per-bucket (non-cumulative) counts, the last one being +Inf.
  std::vector<uint64_t> BucketCounts() const;
  bool attached() const { return cell_ != nullptr; }

 private:
  friend class HistogramFamily;
  explicit Histogram(prometheus::Histogram* cell) : cell_(cell) {}
  prometheus::Histogram* cell_ = nullptr;
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

 protected:
  Family(std::string name, std::string help, Type type, std::vector<std::string> label_names)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        label_names_(std::move(label_names)) {}
  /// The labels for `values`. Errors: InvalidArgument when `values` does not match the label
  /// names in count.
  Result<prometheus::Labels> ToLabels(const LabelValues& values) const;

  const std::string name_, help_;
  const Type type_;
  const std::vector<std::string> label_names_;
};

class CounterFamily final : public Family {
 public:
  /// Resolves `values` into a handle; the same values give the same series. Not for hot paths.
  /// Errors: InvalidArgument (wrong number of values), Internal (prometheus-cpp refused it).
  Result<Counter> Add(const LabelValues& values);

 private:
  friend class Registry;
  CounterFamily(std::string name, std::string help, std::vector<std::string> label_names,
                prometheus::Family<prometheus::Counter>* family)
      : Family(std::move(name), std::move(help), Type::kCounter, std::move(label_names)),
        family_(family) {}
  prometheus::Family<prometheus::Counter>* const family_;  // owned by the prometheus::Registry
};

class GaugeFamily final : public Family {
 public:
  /// As CounterFamily::Add.
  Result<Gauge> Add(const LabelValues& values);

 private:
  friend class Registry;
  GaugeFamily(std::string name, std::string help, std::vector<std::string> label_names,
              prometheus::Family<prometheus::Gauge>* family)
      : Family(std::move(name), std::move(help), Type::kGauge, std::move(label_names)),
        family_(family) {}
  prometheus::Family<prometheus::Gauge>* const family_;
};

class HistogramFamily final : public Family {
 public:
  /// As CounterFamily::Add.
  Result<Histogram> Add(const LabelValues& values);
  /// The upper bounds, strictly increasing, without +Inf.
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  friend class Registry;
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds, prometheus::Family<prometheus::Histogram>* family)
      : Family(std::move(name), std::move(help), Type::kHistogram, std::move(label_names)),
        bounds_(std::move(bounds)),
        family_(family) {}
  const std::vector<double> bounds_;
  prometheus::Family<prometheus::Histogram>* const family_;
};

/// Owns every family of a process (one per process in practice; tests make their own), and the
/// prometheus::Registry under them.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// Each Add* errors with InvalidArgument for a name that is not a Prometheus metric name
  /// ([a-zA-Z_:][a-zA-Z0-9_:]*), a label name that is not one ([a-zA-Z_][a-zA-Z0-9_]*, not
  /// starting with "__") or is repeated, and AlreadyExists when the name (or, for a histogram,
  /// one of its _bucket/_sum/_count series names) is taken; Internal when prometheus-cpp refuses
  /// what these checks let through.
  Result<CounterFamily*> AddCounter(std::string name, std::string help,
                                    std::vector<std::string> label_names = {});
  Result<GaugeFamily*> AddGauge(std::string name, std::string help,
                                std::vector<std::string> label_names = {});
  /// `bounds`: finite, strictly increasing upper bounds (+Inf is implicit). A label named "le" is
  /// refused (InvalidArgument).
  Result<HistogramFamily*> AddHistogram(std::string name, std::string help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds);

  /// Every family in registration order, each family's series sorted by label values and their
  /// labels in the family's label-name order (prometheus-cpp keeps neither order).
  std::vector<prometheus::MetricFamily> Collect() const;

  /// Collect() in the text exposition format 0.0.4 (prometheus::TextSerializer). HELP texts are
  /// escaped (backslash, newline) here, since prometheus-cpp 1.0 writes them as given.
  /// Errors: none (a serializer exception, which the standard streams do not throw by default,
  /// yields an empty string and is logged).
  std::string Serialize() const;

 private:
  Status Reserve(const std::string& name, const std::vector<std::string>& label_names, Type type)
      REQUIRES(mu_);
  mutable Mutex mu_;
  std::unique_ptr<prometheus::Registry> registry_;
  std::vector<std::unique_ptr<Family>> families_ GUARDED_BY(mu_);  // in registration order
  std::vector<std::string> taken_ GUARDED_BY(mu_);                 // exposed series names
};

/// `count` bounds start, start*factor, ... ZPS_CHECKs start > 0, factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

/// The Content-Type of the text exposition format.
inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

/// Formats a sample value in shortest round-trip decimal, or "+Inf", "-Inf", "NaN" (as the
/// exposition format reads it; prometheus-cpp itself writes "Nan", which Prometheus also reads).
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
  size_t max_request_bytes = 8192;       // Default: 8 KiB of request line + headers; more: 4xx.
  int request_timeout_ms = 5000;         // Default: 5 s to send the request and read the reply.
  size_t max_connections = 8;            // Default: 8 served at once (CivetWeb worker threads);
                                         // more wait in the accept queue.
  std::string thread_name = "metrics-http";  // Default: "metrics-http". The server threads' name.
};

/// A health probe: OK means healthy / ready; an error's text becomes the 503 body.
/// Runs on one of the exporter's threads, possibly on several at once: it must be fast,
/// non-blocking and thread-safe.
using Probe = std::function<Status()>;

/// An HTTP/1.1 server (CivetWeb, its own threads; no CivetWeb in this header) on one port:
///   GET|HEAD /metrics  200, the registry in the text format
///   GET|HEAD /healthz  200 "ok" when `liveness` is OK, else 503 with its message
///   GET|HEAD /readyz   200 "ok" when `readiness` is OK, else 503 with its message
///   other paths 404; other methods 405 (with Allow: GET, HEAD); a malformed request, or a
///   request head over max_request_bytes, a 4xx from CivetWeb. Keep-alive is off: every reply
///   closes the connection. A client that has not sent a full request head within
///   request_timeout_ms is dropped, so slow or garbage clients hold a server thread for a bounded
///   time.
/// Thread-safety: Stop and port() are safe from any thread; Stop must not run inside a Probe.
class Exporter {
 public:
  /// Binds, listens and starts the server threads. `registry` must outlive the Exporter; an empty
  /// probe counts as always OK. Errors: InvalidArgument (bad address, zero limits), IoError (bind
  /// or listen failed, e.g. the port is in use).
  static Result<std::unique_ptr<Exporter>> Start(const ExporterOptions& options,
                                                 const Registry* registry, Probe liveness,
                                                 Probe readiness);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  /// Closes the listener and every connection and joins the server threads. Idempotent.
  void Stop();
  /// The bound port (the real one when ExporterOptions::port was 0).
  uint16_t port() const;

  struct Impl;  // internal

 private:
  explicit Exporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zps::metrics
