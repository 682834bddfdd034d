// Prometheus metrics: counters, gauges and histograms, optionally labelled,
// in a registry that renders the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
// Hand-written because prometheus-cpp is not packaged in Debian.
//
// Hot path: updating a metric is one atomic read-modify-write (a histogram:
// two, bucket and sum); no lock. Looking up a labelled child takes a reader
// lock on its family, so code that updates one child often keeps the pointer
// (children live as long as the registry).
//
// Example:
//   Registry registry;
//   Counter* saved = registry.AddCounter("cairn_bytes_saved_total",
//                                        "Bytes of committed checkpoints.");
//   Family<Histogram>* latency = registry.AddHistogramFamily(
//       "cairn_rpc_duration_seconds", "RPC latency.", {"method"},
//       Histogram::LatencyBuckets());
//   saved->Increment(4096);
//   latency->Get({"BeginSave"})->Observe(0.012);
//   std::string text = registry.Render();
//
// Thread-safe: every method of every class here may be called concurrently.
#ifndef CAIRN_COMMON_METRICS_H_
#define CAIRN_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cairn::metrics {

// A value that only goes up (resets to 0 when the process restarts).
class Counter {
 public:
  // `amount` must be >= 0 (a negative one is ignored: counters never fall).
  void Increment(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount);
  void Sub(double amount) { Add(-amount); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted in fixed buckets (upper bounds, inclusive, as
// Prometheus's `le`), plus their sum and count.
class Histogram {
 public:
  // `bounds`: strictly increasing, finite; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts, one per bound plus +Inf (== count()).
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const;

  // Latencies in seconds: 1 ms to 10 min.
  static std::vector<double> LatencyBuckets();
  // Sizes in bytes: 4 KiB to 64 GiB, powers of 4.
  static std::vector<double> ByteBuckets();

 private:
  const std::vector<double> bounds_;
  // Non-cumulative: counts_[i] counts values in (bounds_[i-1], bounds_[i]];
  // the last one those above every bound.
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// Children of one metric by label values (in the order of the family's label
// names). An unlabelled metric is a family without label names.
template <typename T>
class Family {
 public:
  // The child with these label values, created on first use; the pointer
  // stays valid as long as the registry. `values` must have one entry per
  // label name (a programming error otherwise: aborts with the metric's
  // name).
  T* Get(const std::vector<std::string>& values);
  // Forgets a child (e.g. a job that no longer exists); pointers to it stay
  // valid but it is no longer rendered.
  void Remove(const std::vector<std::string>& values);

 private:
  friend class Registry;
  Family(std::string name, std::vector<std::string> label_names,
         std::vector<double> bounds)
      : name_(std::move(name)),
        label_names_(std::move(label_names)),
        bounds_(std::move(bounds)) {}

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::shared_ptr<T>> children_
      ABSL_GUARDED_BY(mu_);
  // Removed children, kept so pointers handed out stay valid.
  std::vector<std::shared_ptr<T>> removed_ ABSL_GUARDED_BY(mu_);
};

// One sample of a callback gauge.
struct Sample {
  std::vector<std::string> label_values;
  double value = 0;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
  // [a-zA-Z_][a-zA-Z0-9_]* (not starting with "__", not "le"), and a name may
  // be registered once: anything else is a programming error and aborts
  // naming the metric.
  Counter* AddCounter(const std::string& name, const std::string& help);
  Gauge* AddGauge(const std::string& name, const std::string& help);
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds);
  Family<Counter>* AddCounterFamily(const std::string& name,
                                    const std::string& help,
                                    std::vector<std::string> label_names);
  Family<Gauge>* AddGaugeFamily(const std::string& name,
                                const std::string& help,
                                std::vector<std::string> label_names);
  Family<Histogram>* AddHistogramFamily(const std::string& name,
                                        const std::string& help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds);
  // A gauge whose value `fn` computes at every Render (e.g. a catalog's
  // size). `fn` runs on the scraping thread, without any lock of the
  // registry held, and must be thread-safe.
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> fn);
  // The same with labels: `fn` returns every child's label values (one per
  // label name; samples with the wrong number are dropped) and value.
  void AddCallbackGaugeFamily(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names,
                              std::function<std::vector<Sample>()> fn);

  // Every metric in the text exposition format 0.0.4, sorted by name;
  // children sorted by label values.
  std::string Render() const;

  // The Content-Type of Render's output.
  static constexpr char kContentType[] = "text/plain; version=0.0.4";

 private:
  struct Entry;
  Entry& Register(const std::string& name, const std::string& help,
                  MetricType type, const std::vector<std::string>& label_names);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

// Text format helpers (exposed for tests).
namespace internal {
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(std::string_view value);
// HELP text with \ and newline escaped.
std::string EscapeHelp(std::string_view help);
// Shortest text that reads back as `value`; +Inf, -Inf, NaN.
std::string FormatValue(double value);
}  // namespace internal

}  // namespace cairn::metrics

#endif  // CAIRN_COMMON_METRICS_H_
