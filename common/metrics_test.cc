#include "common/metrics.h"

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics_http.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace cairn::metrics {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MetricsTest, RendersASmallRegistryExactly) {
  Registry r;
  Counter* bytes = r.AddCounter("cairn_bytes_total", "Bytes moved.");
  Gauge* inflight = r.AddGauge("cairn_inflight", "Saves in flight.");
  Family<Counter>* rpcs = r.AddCounterFamily(
      "cairn_rpcs_total", "RPCs by method and code.", {"method", "code"});
  Histogram* h = r.AddHistogram("cairn_latency_seconds", "Latency.", {0.5, 1});
  r.AddCallbackGaugeFamily("cairn_job_steps", "Steps per job.", {"job"}, [] {
    return std::vector<Sample>{{{"b"}, 2}, {{"a"}, 1.5}};
  });
  bytes->Increment(4096);
  bytes->Increment(1);
  inflight->Set(3);
  inflight->Sub(1);
  rpcs->Get({"Save", "OK"})->Increment();
  rpcs->Get({"Save", "OK"})->Increment();
  rpcs->Get({"Load", "NOT_FOUND"})->Increment();
  h->Observe(0.5);   // le=0.5 is inclusive
  h->Observe(0.75);  // le=1
  h->Observe(7);     // +Inf only
  EXPECT_EQ(r.Render(),
            "# HELP cairn_bytes_total Bytes moved.\n"
            "# TYPE cairn_bytes_total counter\n"
            "cairn_bytes_total 4097\n"
            "# HELP cairn_inflight Saves in flight.\n"
            "# TYPE cairn_inflight gauge\n"
            "cairn_inflight 2\n"
            "# HELP cairn_job_steps Steps per job.\n"
            "# TYPE cairn_job_steps gauge\n"
            "cairn_job_steps{job=\"a\"} 1.5\n"
            "cairn_job_steps{job=\"b\"} 2\n"
            "# HELP cairn_latency_seconds Latency.\n"
            "# TYPE cairn_latency_seconds histogram\n"
            "cairn_latency_seconds_bucket{le=\"0.5\"} 1\n"
            "cairn_latency_seconds_bucket{le=\"1\"} 2\n"
            "cairn_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "cairn_latency_seconds_sum 8.25\n"
            "cairn_latency_seconds_count 3\n"
            "# HELP cairn_rpcs_total RPCs by method and code.\n"
            "# TYPE cairn_rpcs_total counter\n"
            "cairn_rpcs_total{method=\"Load\",code=\"NOT_FOUND\"} 1\n"
            "cairn_rpcs_total{method=\"Save\",code=\"OK\"} 2\n");
}

TEST(MetricsTest, LabelledHistogramPutsLeLast) {
  Registry r;
  Family<Histogram>* f =
      r.AddHistogramFamily("x_seconds", "X.", {"method"}, {0.25});
  f->Get({"A"})->Observe(0.1);
  EXPECT_EQ(r.Render(),
            "# HELP x_seconds X.\n"
            "# TYPE x_seconds histogram\n"
            "x_seconds_bucket{method=\"A\",le=\"0.25\"} 1\n"
            "x_seconds_bucket{method=\"A\",le=\"+Inf\"} 1\n"
            "x_seconds_sum{method=\"A\"} 0.1\n"
            "x_seconds_count{method=\"A\"} 1\n");
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  Registry r;
  r.AddGaugeFamily("g", "Help with \\ and\nnewline \"quoted\".", {"job"})
      ->Get({"a\"b\\c\nd"})
      ->Set(1);
  EXPECT_EQ(r.Render(),
            "# HELP g Help with \\\\ and\\nnewline \"quoted\".\n"
            "# TYPE g gauge\n"
            "g{job=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(MetricsTest, FormatsSpecialAndShortestValues) {
  EXPECT_EQ(internal::FormatValue(0.1), "0.1");
  EXPECT_EQ(internal::FormatValue(0.0025), "0.0025");
  EXPECT_EQ(internal::FormatValue(68719476736.0), "68719476736");
  EXPECT_EQ(internal::FormatValue(-2), "-2");
  EXPECT_EQ(internal::FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(internal::FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(internal::FormatValue(NAN), "NaN");
  const double third = 1.0 / 3;
  EXPECT_EQ(std::stod(internal::FormatValue(third)), third);
}

TEST(MetricsTest, CounterIgnoresNegativeIncrements) {
  Counter c;
  c.Increment(5);
  c.Increment(-3);
  c.Increment(NAN);
  EXPECT_EQ(c.value(), 5);
}

TEST(MetricsTest, RemovedChildIsNotRenderedAndItsPointerStaysValid) {
  Registry r;
  Family<Gauge>* f = r.AddGaugeFamily("g", "G.", {"job"});
  Gauge* a = f->Get({"a"});
  f->Get({"b"})->Set(2);
  f->Remove({"a"});
  a->Set(5);  // still valid memory
  EXPECT_EQ(r.Render(), "# HELP g G.\n# TYPE g gauge\ng{job=\"b\"} 2\n");
  EXPECT_NE(f->Get({"a"}), a);  // a fresh child
}

TEST(MetricsTest, CallbackSamplesWithWrongLabelCountAreDropped) {
  Registry r;
  r.AddCallbackGaugeFamily("g", "G.", {"job"}, [] {
    return std::vector<Sample>{{{"a", "extra"}, 1}, {{"b"}, 2}};
  });
  r.AddCallbackGauge("h", "H.", [] { return 42.0; });
  EXPECT_EQ(r.Render(),
            "# HELP g G.\n# TYPE g gauge\ng{job=\"b\"} 2\n"
            "# HELP h H.\n# TYPE h gauge\nh 42\n");
}

// Bucket math against a brute-force count of random values (some exactly on
// a bound).
TEST(MetricsTest, HistogramBucketsMatchBruteForceCount) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> value(-1, 700);
  for (int round = 0; round < 50; ++round) {
    const std::vector<double> bounds = Histogram::LatencyBuckets();
    Histogram h(bounds);
    std::vector<double> values;
    for (int i = 0; i < 1000; ++i) {
      double v = value(rng);
      if (i % 7 == 0) v = bounds[rng() % bounds.size()];
      values.push_back(v);
      h.Observe(v);
    }
    const std::vector<uint64_t> counts = h.CumulativeCounts();
    ASSERT_EQ(counts.size(), bounds.size() + 1);
    double sum = 0;
    for (double v : values) sum += v;
    for (size_t b = 0; b < bounds.size(); ++b) {
      uint64_t expected = 0;
      for (double v : values) expected += v <= bounds[b] ? 1 : 0;
      ASSERT_EQ(counts[b], expected) << "le=" << bounds[b];
    }
    EXPECT_EQ(counts.back(), values.size());
    EXPECT_EQ(h.count(), values.size());
    EXPECT_NEAR(h.sum(), sum, 1e-6 * std::abs(sum));
  }
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry r;
  Counter* c = r.AddCounter("c_total", "C.");
  Family<Counter>* f = r.AddCounterFamily("f_total", "F.", {"t"});
  Histogram* h = r.AddHistogram("h_seconds", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        f->Get({std::to_string(i % 3)})->Increment(2);
        h->Observe(t % 2 == 0 ? 0.5 : 2);
        if (i % 1000 == 0) (void)r.Render();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 40000);
  EXPECT_EQ(
      f->Get({"0"})->value() + f->Get({"1"})->value() + f->Get({"2"})->value(),
      80000);
  EXPECT_EQ(h->CumulativeCounts()[0], 20000u);
  EXPECT_EQ(h->count(), 40000u);
  EXPECT_EQ(h->sum(), 20000 * 0.5 + 20000 * 2);
}

TEST(MetricsDeathTest, BadNamesAndDuplicatesAbortNamingTheMetric) {
  Registry r;
  r.AddCounter("dup_total", "D.");
  EXPECT_DEATH(r.AddCounter("dup_total", "D."), "'dup_total' registered twice");
  EXPECT_DEATH(r.AddGauge("bad-name", "B."), "invalid metric name 'bad-name'");
  EXPECT_DEATH(r.AddGaugeFamily("g", "G.", {"__x"}), "invalid label name");
  EXPECT_DEATH(r.AddHistogramFamily("h", "H.", {"le"}, {1}),
               "invalid label name 'le'");
  EXPECT_DEATH(r.AddHistogram("h2", "H.", {2, 1}), "strictly increasing");
  Family<Gauge>* f = r.AddGaugeFamily("two", "T.", {"a", "b"});
  EXPECT_DEATH(f->Get({"x"}), "two: 1 label values for 2 labels");
}

}  // namespace
}  // namespace cairn::metrics

namespace cairn::metrics {
namespace {

TEST(MetricsHttpServerTest, ServesMetricsAnd404Elsewhere) {
  Registry r;
  r.AddCounter("cairn_x_total", "X.")->Increment(3);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> s =
      MetricsHttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_GT((*s)->port(), 0);
  httplib::Client client("127.0.0.1", (*s)->port());
  httplib::Result got = client.Get("/metrics");
  ASSERT_TRUE(got) << httplib::to_string(got.error());
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_EQ(got->body, r.Render());
  EXPECT_THAT(got->body, HasSubstr("cairn_x_total 3\n"));
  httplib::Result other = client.Get("/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST(MetricsHttpServerTest, PortInUseAndBadAddressAreClearErrors) {
  Registry r;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first =
      MetricsHttpServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(taken, &r);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(
      second,
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr(absl::StrCat("cannot serve metrics on ", taken))));
  for (const char* bad : {"localhost", "127.0.0.1:http", "1.2.3.4:70000"}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> s =
        MetricsHttpServer::Start(bad, &r);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad)))
        << bad;
  }
}

}  // namespace
}  // namespace cairn::metrics
