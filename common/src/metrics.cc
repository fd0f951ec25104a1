// zps::metrics — the registry and handles over prometheus-cpp, and the text exposition format
// through prometheus::TextSerializer. The HTTP exporter is in metrics_http.cc.
#include "zps/common/metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <sstream>
#include <unordered_map>

#include "zps/common/logging.h"

#ifndef ZPS_VERSION
#define ZPS_VERSION "unknown"
#endif
#ifndef ZPS_REVISION
#define ZPS_REVISION "unknown"
#endif

namespace zps::metrics {
namespace {

bool ValidMetricName(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view n) {
  if (n.empty() || n.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string Escape(std::string_view s, bool help) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && !help) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string_view BuildVersion() { return ZPS_VERSION; }
std::string_view BuildRevision() { return ZPS_REVISION; }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  ZPS_CHECK(start > 0 && factor > 1 && count >= 1);
  std::vector<double> b;
  b.reserve(count);
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

// ---- handles ------------------------------------------------------------------------------------

uint64_t Histogram::Count() const { return cell_ ? cell_->Collect().histogram.sample_count : 0; }

double Histogram::Sum() const { return cell_ ? cell_->Collect().histogram.sample_sum : 0.0; }

std::vector<uint64_t> Histogram::BucketCounts() const {
  if (cell_ == nullptr) return {};
  const prometheus::ClientMetric m = cell_->Collect();
  std::vector<uint64_t> out;
  out.reserve(m.histogram.bucket.size() + 1);
  uint64_t previous = 0;
  for (const auto& b : m.histogram.bucket) {
    out.push_back(b.cumulative_count - previous);
    previous = b.cumulative_count;
  }
  if (m.histogram.bucket.empty() || !std::isinf(m.histogram.bucket.back().upper_bound)) {
    out.push_back(m.histogram.sample_count - previous);  // +Inf, when not listed
  }
  return out;
}

// ---- families -----------------------------------------------------------------------------------

Result<prometheus::Labels> Family::ToLabels(const LabelValues& values) const {
  if (values.size() != label_names_.size()) {
    return InvalidArgument("metric " + name_ + " has " + std::to_string(label_names_.size()) +
                           " labels, got " + std::to_string(values.size()) + " values");
  }
  prometheus::Labels labels;
  for (size_t i = 0; i < values.size(); ++i) labels.emplace(label_names_[i], values[i]);
  return labels;
}

Result<Counter> CounterFamily::Add(const LabelValues& values) {
  ZPS_ASSIGN_OR_RETURN(prometheus::Labels labels, ToLabels(values));
  try {
    return Counter(&family_->Add(labels));
  } catch (const std::exception& e) {
    return Internal("metric " + name_ + ": prometheus-cpp: " + e.what());
  }
}

Result<Gauge> GaugeFamily::Add(const LabelValues& values) {
  ZPS_ASSIGN_OR_RETURN(prometheus::Labels labels, ToLabels(values));
  try {
    return Gauge(&family_->Add(labels));
  } catch (const std::exception& e) {
    return Internal("metric " + name_ + ": prometheus-cpp: " + e.what());
  }
}

Result<Histogram> HistogramFamily::Add(const LabelValues& values) {
  ZPS_ASSIGN_OR_RETURN(prometheus::Labels labels, ToLabels(values));
  try {
    return Histogram(&family_->Add(labels, bounds_));
  } catch (const std::exception& e) {
    return Internal("metric " + name_ + ": prometheus-cpp: " + e.what());
  }
}

// ---- registry -----------------------------------------------------------------------------------

// Throw: a name registered twice is a bug here (Reserve refuses it first), never a silent merge.
Registry::Registry()
    : registry_(
          std::make_unique<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}

Registry::~Registry() = default;

Status Registry::Reserve(const std::string& name, const std::vector<std::string>& label_names,
                         Type type) {
  if (!ValidMetricName(name)) return InvalidArgument("'" + name + "' is not a metric name");
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!ValidLabelName(l))
      return InvalidArgument("'" + l + "' is not a label name (" + name + ")");
    if (type == Type::kHistogram && l == "le") {
      return InvalidArgument("histogram " + name + " may not have a label named le");
    }
    for (size_t j = 0; j < i; ++j) {
      if (label_names[j] == l) return InvalidArgument("label " + l + " repeated in " + name);
    }
  }
  std::vector<std::string> names = {name};
  if (type == Type::kHistogram) {
    names.push_back(name + "_bucket");
    names.push_back(name + "_sum");
    names.push_back(name + "_count");
  }
  for (const auto& n : names) {
    if (std::find(taken_.begin(), taken_.end(), n) != taken_.end()) {
      return AlreadyExists("metric name " + n + " is already registered");
    }
  }
  taken_.insert(taken_.end(), names.begin(), names.end());
  return Status::Ok();
}

namespace {
// prometheus-cpp's registration throws std::invalid_argument; Reserve has refused everything that
// would, so this is a guard, not a path.
template <typename Builder>
auto RegisterWith(Builder builder, const std::string& name, const std::string& help,
                  prometheus::Registry& registry) -> decltype(&builder.Register(registry)) {
  return &builder.Name(name).Help(Escape(help, /*help=*/true)).Register(registry);
}
}  // namespace

Result<CounterFamily*> Registry::AddCounter(std::string name, std::string help,
                                            std::vector<std::string> label_names) {
  MutexLock lock(&mu_);
  ZPS_RETURN_IF_ERROR(Reserve(name, label_names, Type::kCounter));
  try {
    auto* pf = RegisterWith(prometheus::BuildCounter(), name, help, *registry_);
    auto* f = new CounterFamily(std::move(name), std::move(help), std::move(label_names), pf);
    families_.emplace_back(f);
    return f;
  } catch (const std::exception& e) {
    return Internal("metric " + name + ": prometheus-cpp: " + e.what());
  }
}

Result<GaugeFamily*> Registry::AddGauge(std::string name, std::string help,
                                        std::vector<std::string> label_names) {
  MutexLock lock(&mu_);
  ZPS_RETURN_IF_ERROR(Reserve(name, label_names, Type::kGauge));
  try {
    auto* pf = RegisterWith(prometheus::BuildGauge(), name, help, *registry_);
    auto* f = new GaugeFamily(std::move(name), std::move(help), std::move(label_names), pf);
    families_.emplace_back(f);
    return f;
  } catch (const std::exception& e) {
    return Internal("metric " + name + ": prometheus-cpp: " + e.what());
  }
}

Result<HistogramFamily*> Registry::AddHistogram(std::string name, std::string help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      return InvalidArgument("histogram " + name +
                             ": bucket bounds must be finite and strictly increasing");
    }
  }
  MutexLock lock(&mu_);
  ZPS_RETURN_IF_ERROR(Reserve(name, label_names, Type::kHistogram));
  try {
    auto* pf = RegisterWith(prometheus::BuildHistogram(), name, help, *registry_);
    auto* f = new HistogramFamily(std::move(name), std::move(help), std::move(label_names),
                                  std::move(bounds), pf);
    families_.emplace_back(f);
    return f;
  } catch (const std::exception& e) {
    return Internal("metric " + name + ": prometheus-cpp: " + e.what());
  }
}

std::vector<prometheus::MetricFamily> Registry::Collect() const {
  MutexLock lock(&mu_);
  std::vector<prometheus::MetricFamily> collected;
  try {
    collected = registry_->Collect();
  } catch (const std::exception& e) {
    ZPS_LOG(ERROR) << "metrics: prometheus-cpp Collect: " << e.what();
    return {};
  }
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < collected.size(); ++i) by_name.emplace(collected[i].name, i);
  std::vector<prometheus::MetricFamily> out;
  out.reserve(collected.size());
  for (const auto& f : families_) {
    auto it = by_name.find(f->name());
    if (it == by_name.end()) continue;
    prometheus::MetricFamily& mf = collected[it->second];
    const auto& names = f->label_names();
    for (auto& m : mf.metric) {  // labels in declared order (prometheus-cpp sorts them by name)
      std::vector<prometheus::ClientMetric::Label> ordered;
      ordered.reserve(m.label.size());
      for (const auto& n : names) {
        for (auto& l : m.label) {
          if (l.name == n) ordered.push_back(std::move(l));
        }
      }
      m.label = std::move(ordered);
    }
    std::sort(mf.metric.begin(), mf.metric.end(),
              [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
                return std::lexicographical_compare(
                    a.label.begin(), a.label.end(), b.label.begin(), b.label.end(),
                    [](const auto& x, const auto& y) { return x.value < y.value; });
              });
    out.push_back(std::move(mf));
  }
  return out;
}

std::string Registry::Serialize() const {
  const std::vector<prometheus::MetricFamily> families = Collect();
  try {
    return prometheus::TextSerializer().Serialize(families);
  } catch (const std::exception& e) {
    ZPS_LOG(ERROR) << "metrics: prometheus-cpp TextSerializer: " << e.what();
    return {};
  }
}

}  // namespace zps::metrics
