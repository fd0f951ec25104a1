// Registry, handles and the text exposition format (prometheus-cpp's TextSerializer underneath:
// histograms come as _count, _sum, then the buckets, and NaN as "Nan", which Prometheus and
// promtool read case-insensitively).
#include "zps/common/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "zps/common/process_metrics.h"
#include "zps/testing/status_matchers.h"

namespace zps::metrics {
namespace {

TEST(Metrics, CounterExposition) {
  Registry r;
  auto fam = r.AddCounter("zps_x_total", "Things.\nSecond line \\ done.", {"kind"});
  ASSERT_THAT(fam, IsOk());
  auto a = (*fam)->Add({"b\"q\\n\n"});
  auto b = (*fam)->Add({"a"});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  a->Inc(5);
  b->Inc();
  EXPECT_EQ(a->Value(), 5u);
  EXPECT_EQ(r.Serialize(),
            "# HELP zps_x_total Things.\\nSecond line \\\\ done.\n"
            "# TYPE zps_x_total counter\n"
            "zps_x_total{kind=\"a\"} 1\n"
            "zps_x_total{kind=\"b\\\"q\\\\n\\n\"} 5\n");
}

TEST(Metrics, SameLabelsSameSeries) {
  Registry r;
  auto fam = *r.AddCounter("c_total", "c", {"op"});
  Counter x = *fam->Add({"fetch"});
  Counter y = *fam->Add({"fetch"});
  x.Inc(2);
  y.Inc(3);
  EXPECT_EQ(x.Value(), 5u);
}

TEST(Metrics, GaugeAndValues) {
  Registry r;
  Gauge g = *(*r.AddGauge("g", "a gauge"))->Add({});
  g.Set(2.5);
  g.Inc(1);
  g.Dec(0.5);
  EXPECT_DOUBLE_EQ(g.Value(), 3.0);
  EXPECT_EQ(r.Serialize(), "# HELP g a gauge\n# TYPE g gauge\ng 3\n");
  g.Set(std::numeric_limits<double>::infinity());
  EXPECT_NE(r.Serialize().find("g +Inf\n"), std::string::npos);
  g.Set(std::nan(""));
  EXPECT_NE(r.Serialize().find("g Nan\n"), std::string::npos);
  g.SetToCurrentTime();
  EXPECT_GT(g.Value(), 1.6e9);
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(-1e-7), "-1e-07");
  EXPECT_EQ(FormatValue(123456789.0), "123456789");
}

TEST(Metrics, HistogramBucketsSumCount) {
  Registry r;
  auto fam = *r.AddHistogram("h_seconds", "h", {"op"}, {0.1, 1, 10});
  Histogram h = *fam->Add({"push"});
  h.Observe(0.1);  // le 0.1 is inclusive
  h.Observe(0.5);
  h.Observe(5);
  h.Observe(100);
  h.Observe(-1);  // below every bound: first bucket
  EXPECT_EQ(h.Count(), 5u);
  EXPECT_DOUBLE_EQ(h.Sum(), 104.6);
  EXPECT_EQ(h.BucketCounts(), (std::vector<uint64_t>{2, 1, 1, 1}));
  EXPECT_EQ(r.Serialize(),
            "# HELP h_seconds h\n# TYPE h_seconds histogram\n"
            "h_seconds_count{op=\"push\"} 5\n"
            "h_seconds_sum{op=\"push\"} 104.6\n"
            "h_seconds_bucket{op=\"push\",le=\"0.1\"} 2\n"
            "h_seconds_bucket{op=\"push\",le=\"1\"} 3\n"
            "h_seconds_bucket{op=\"push\",le=\"10\"} 4\n"
            "h_seconds_bucket{op=\"push\",le=\"+Inf\"} 5\n");
}

TEST(Metrics, HistogramWithoutLabels) {
  Registry r;
  Histogram h = *(*r.AddHistogram("h", "h", {}, {1}))->Add({});
  h.Observe(2);
  EXPECT_NE(
      r.Serialize().find("h_count 1\nh_sum 2\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 1\n"),
      std::string::npos);
}

TEST(Metrics, RegistrationErrors) {
  Registry r;
  EXPECT_EQ(r.AddCounter("1bad", "x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.AddCounter("bad-name", "x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.AddCounter("ok", "x", {"__reserved"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.AddCounter("ok", "x", {"a", "a"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.AddHistogram("h", "x", {"le"}, {1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.AddHistogram("h", "x", {}, {2, 1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.AddHistogram("h", "x", {}, {1, INFINITY}).status().code(), Code::kInvalidArgument);
  ASSERT_THAT(r.AddCounter("ok", "x"), IsOk());
  EXPECT_EQ(r.AddGauge("ok", "x").status().code(), Code::kAlreadyExists);
  ASSERT_THAT(r.AddHistogram("h", "x", {}, {1}), IsOk());
  EXPECT_EQ(r.AddGauge("h_count", "x").status().code(), Code::kAlreadyExists);
  auto fam = *r.AddGauge("two", "x", {"a", "b"});
  EXPECT_EQ(fam->Add({"only one"}).status().code(), Code::kInvalidArgument);
}

TEST(Metrics, DetachedHandlesAreNoOps) {
  Counter c;
  Gauge g;
  Histogram h;
  c.Inc(3);
  g.Set(4);
  h.Observe(1);
  EXPECT_EQ(c.Value(), 0u);
  EXPECT_EQ(g.Value(), 0.0);
  EXPECT_EQ(h.Count(), 0u);
  ProcessMetrics pm;  // detached: what a library gets without a registry
  pm.fetch_bytes.Inc(1);
  pm.ProtocolError("bad_crc");
  pm.inflight[kPush].Inc();
}

TEST(Metrics, ConcurrentUpdatesAreExact) {
  Registry r;
  Counter c = *(*r.AddCounter("c_total", "c"))->Add({});
  Gauge g = *(*r.AddGauge("g", "g"))->Add({});
  Histogram h = *(*r.AddHistogram("h", "h", {}, {0.5}))->Add({});
  constexpr int kThreads = 4, kIters = 100000;
  std::vector<std::thread> ts;
  std::atomic<bool> stop{false};
  std::thread scraper([&] {
    while (!stop) {
      std::string s = r.Serialize();
      ASSERT_NE(s.find("# TYPE h histogram"), std::string::npos);
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        c.Inc();
        g.Inc();
        h.Observe(i % 2 ? 1.0 : 0.25);
      }
    });
  }
  for (auto& t : ts) t.join();
  stop = true;
  scraper.join();
  EXPECT_EQ(c.Value(), uint64_t{kThreads} * kIters);
  EXPECT_DOUBLE_EQ(g.Value(), double{kThreads} * kIters);
  EXPECT_EQ(h.Count(), uint64_t{kThreads} * kIters);
  EXPECT_EQ(h.BucketCounts()[0], uint64_t{kThreads} * kIters / 2);
  EXPECT_DOUBLE_EQ(h.Sum(), kThreads * (kIters / 2) * 1.25);
}

TEST(Metrics, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  auto rb = RequestDurationBuckets();
  EXPECT_TRUE(std::is_sorted(rb.begin(), rb.end()));
}

TEST(ProcessMetrics, EveryContractSeriesFromStart) {
  Registry r;
  auto pm = ProcessMetrics::Create(r, "shard");
  ASSERT_THAT(pm, IsOk());
  std::string s = r.Serialize();
  EXPECT_NE(s.find("zps_build_info{version=\""), std::string::npos);
  EXPECT_NE(s.find("role=\"shard\"} 1\n"), std::string::npos);
  for (auto kind : kProtocolErrorKinds) {
    EXPECT_NE(s.find("zps_protocol_errors_total{kind=\"" + std::string(kind) + "\"} 0\n"),
              std::string::npos)
        << kind;
  }
  for (auto op : kOpNames) {
    EXPECT_NE(s.find("zps_inflight_requests{op=\"" + std::string(op) + "\"} 0\n"),
              std::string::npos);
    EXPECT_NE(s.find("zps_request_duration_seconds_count{op=\"" + std::string(op) + "\"} 0\n"),
              std::string::npos);
  }
  pm->ProtocolError("bad_crc");
  pm->ProtocolError("something new");  // unknown kinds are counted, as invalid_argument
  EXPECT_EQ(pm->protocol_errors[ProtocolErrorIndex("bad_crc")].Value(), 1u);
  EXPECT_EQ(pm->protocol_errors[ProtocolErrorIndex("invalid_argument")].Value(), 1u);
  EXPECT_EQ(ProcessMetrics::Create(r, "shard").status().code(), Code::kAlreadyExists);
  EXPECT_FALSE(BuildVersion().empty());
  EXPECT_FALSE(BuildRevision().empty());
}

}  // namespace
}  // namespace zps::metrics
