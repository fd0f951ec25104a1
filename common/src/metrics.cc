// zps::metrics — registry, handles and the text exposition format (0.0.4). The HTTP exporter is
// in metrics_http.cc.
#include "zps/common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

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

// Writes `name{l1="v1",l2="v2"[,extra_name="extra_value"]} `.
void WriteSeries(std::string& out, std::string_view name, const std::vector<std::string>& names,
                 const LabelValues& values, std::string_view extra_name = {},
                 std::string_view extra_value = {}) {
  out += name;
  if (!names.empty() || !extra_name.empty()) {
    out += '{';
    bool first = true;
    for (size_t i = 0; i < names.size(); ++i) {
      if (!first) out += ',';
      first = false;
      out += names[i];
      out += "=\"";
      out += Escape(values[i]);
      out += '"';
    }
    if (!extra_name.empty()) {
      if (!first) out += ',';
      out += extra_name;
      out += "=\"";
      out += extra_value;
      out += '"';
    }
    out += '}';
  }
  out += ' ';
}

void WriteHeader(std::string& out, const Family& f, std::string_view type) {
  out += "# HELP ";
  out += f.name();
  out += ' ';
  out += Escape(f.help(), /*help=*/true);
  out += "\n# TYPE ";
  out += f.name();
  out += ' ';
  out += type;
  out += '\n';
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

internal::HistogramCell::HistogramCell(const std::vector<double>* b)
    : bounds(b), buckets(new std::atomic<uint64_t>[b->size() + 1]) {
  for (size_t i = 0; i <= b->size(); ++i) buckets[i].store(0, std::memory_order_relaxed);
}

void Gauge::SetToCurrentTime() const {
  Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void Histogram::Observe(double v) const {
  if (cell_ == nullptr) return;
  const std::vector<double>& b = *cell_->bounds;
  // First bound >= v (bucket "le" is inclusive); NaN lands in +Inf.
  size_t i = std::isnan(v) ? b.size()
                           : static_cast<size_t>(std::lower_bound(b.begin(), b.end(), v) - b.begin());
  cell_->buckets[i].fetch_add(1, std::memory_order_relaxed);
  cell_->sum.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  if (cell_ == nullptr) return {};
  std::vector<uint64_t> out(cell_->bounds->size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = cell_->buckets[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t Histogram::Count() const {
  uint64_t n = 0;
  for (uint64_t c : BucketCounts()) n += c;
  return n;
}

double Histogram::Sum() const { return cell_ ? cell_->sum.load(std::memory_order_relaxed) : 0.0; }

// ---- families -----------------------------------------------------------------------------------

Status Family::CheckValues(const LabelValues& values) const {
  if (values.size() != label_names_.size()) {
    return InvalidArgument("metric " + name_ + " has " + std::to_string(label_names_.size()) +
                           " labels, got " + std::to_string(values.size()) + " values");
  }
  return Status::Ok();
}

Result<Counter> CounterFamily::Add(const LabelValues& values) {
  ZPS_RETURN_IF_ERROR(CheckValues(values));
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = children_[values];
  if (!slot) slot = std::make_unique<std::atomic<uint64_t>>(0);
  return Counter(slot.get());
}

void CounterFamily::Serialize(std::string& out) const {
  WriteHeader(out, *this, "counter");
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, cell] : children_) {
    WriteSeries(out, name_, label_names_, values);
    out += std::to_string(cell->load(std::memory_order_relaxed));
    out += '\n';
  }
}

Result<Gauge> GaugeFamily::Add(const LabelValues& values) {
  ZPS_RETURN_IF_ERROR(CheckValues(values));
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = children_[values];
  if (!slot) slot = std::make_unique<std::atomic<double>>(0.0);
  return Gauge(slot.get());
}

void GaugeFamily::Serialize(std::string& out) const {
  WriteHeader(out, *this, "gauge");
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, cell] : children_) {
    WriteSeries(out, name_, label_names_, values);
    out += FormatValue(cell->load(std::memory_order_relaxed));
    out += '\n';
  }
}

Result<Histogram> HistogramFamily::Add(const LabelValues& values) {
  ZPS_RETURN_IF_ERROR(CheckValues(values));
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = children_[values];
  if (!slot) slot = std::make_unique<internal::HistogramCell>(&bounds_);
  return Histogram(slot.get());
}

void HistogramFamily::Serialize(std::string& out) const {
  WriteHeader(out, *this, "histogram");
  const std::string bucket = name_ + "_bucket", sum = name_ + "_sum", count = name_ + "_count";
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, cell] : children_) {
    // Read each bucket once; the cumulative counts and _count come from the same snapshot, so
    // they are monotonic and +Inf equals _count even while observations race with the scrape.
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += cell->buckets[i].load(std::memory_order_relaxed);
      WriteSeries(out, bucket, label_names_, values, "le",
                  i < bounds_.size() ? FormatValue(bounds_[i]) : "+Inf");
      out += std::to_string(cumulative);
      out += '\n';
    }
    WriteSeries(out, sum, label_names_, values);
    out += FormatValue(cell->sum.load(std::memory_order_relaxed));
    out += '\n';
    WriteSeries(out, count, label_names_, values);
    out += std::to_string(cumulative);
    out += '\n';
  }
}

// ---- registry -----------------------------------------------------------------------------------

Status Registry::Reserve(const std::string& name, const std::vector<std::string>& label_names,
                         Type type) {
  if (!ValidMetricName(name)) return InvalidArgument("'" + name + "' is not a metric name");
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& l = label_names[i];
    if (!ValidLabelName(l)) return InvalidArgument("'" + l + "' is not a label name (" + name + ")");
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

Result<CounterFamily*> Registry::AddCounter(std::string name, std::string help,
                                            std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  ZPS_RETURN_IF_ERROR(Reserve(name, label_names, Type::kCounter));
  auto* f = new CounterFamily(std::move(name), std::move(help), Type::kCounter,
                              std::move(label_names));
  families_.emplace_back(f);
  return f;
}

Result<GaugeFamily*> Registry::AddGauge(std::string name, std::string help,
                                        std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  ZPS_RETURN_IF_ERROR(Reserve(name, label_names, Type::kGauge));
  auto* f = new GaugeFamily(std::move(name), std::move(help), Type::kGauge,
                            std::move(label_names));
  families_.emplace_back(f);
  return f;
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
  std::lock_guard<std::mutex> lock(mu_);
  ZPS_RETURN_IF_ERROR(Reserve(name, label_names, Type::kHistogram));
  auto* f = new HistogramFamily(std::move(name), std::move(help), std::move(label_names),
                                std::move(bounds));
  families_.emplace_back(f);
  return f;
}

std::string Registry::Serialize() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  out.reserve(families_.size() * 256);
  for (const auto& f : families_) f->Serialize(out);
  return out;
}

}  // namespace zps::metrics
