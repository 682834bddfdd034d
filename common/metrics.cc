#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cairn::metrics {
namespace {

void AddTo(std::atomic<double>& a, double amount) {
  double old = a.load(std::memory_order_relaxed);
  while (
      !a.compare_exchange_weak(old, old + amount, std::memory_order_relaxed)) {
  }
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "cairn metrics: %s\n", message.c_str());
  std::abort();
}

bool ValidName(std::string_view name, bool label) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool ok =
        letter || (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

template <typename T>
std::shared_ptr<T> MakeChild(const std::vector<double>& bounds);
template <>
std::shared_ptr<Counter> MakeChild(const std::vector<double>&) {
  return std::make_shared<Counter>();
}
template <>
std::shared_ptr<Gauge> MakeChild(const std::vector<double>&) {
  return std::make_shared<Gauge>();
}
template <>
std::shared_ptr<Histogram> MakeChild(const std::vector<double>& bounds) {
  return std::make_shared<Histogram>(bounds);
}

// `{a="x",b="y"}` (empty without labels), with `extra` (e.g. le) last.
std::string Labels(const std::vector<std::string>& names,
                   const std::vector<std::string>& values,
                   const std::string& extra = "") {
  if (names.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, names[i], "=\"",
                    internal::EscapeLabelValue(values[i]), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, names.empty() ? "" : ",", extra);
  out += "}";
  return out;
}

}  // namespace

namespace internal {

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) return absl::StrCat(value);
  return std::string(buf, end);
}

}  // namespace internal

void Counter::Increment(double amount) {
  if (!(amount > 0)) return;
  AddTo(value_, amount);
}

void Gauge::Add(double amount) { AddTo(value_, amount); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      Die("histogram bounds must be finite and strictly increasing");
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i] = 0;
}

void Histogram::Observe(double value) {
  // The first bound >= value: `le` is inclusive. NaN lands in +Inf.
  const size_t i =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AddTo(sum_, value);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

uint64_t Histogram::count() const { return CumulativeCounts().back(); }

std::vector<double> Histogram::LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1,     2.5,    5,     10,   25,    60,   120, 300,  600};
}

std::vector<double> Histogram::ByteBuckets() {
  std::vector<double> out;
  for (double b = 4096; b <= 64.0 * (1ull << 30); b *= 4) out.push_back(b);
  return out;
}

template <typename T>
T* Family<T>::Get(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    Die(absl::StrCat(name_, ": ", values.size(), " label values for ",
                     label_names_.size(), " labels (",
                     absl::StrJoin(label_names_, ","), ")"));
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = children_.find(values);
    if (it != children_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<T>& child = children_[values];
  if (child == nullptr) child = MakeChild<T>(bounds_);
  return child.get();
}

template <typename T>
void Family<T>::Remove(const std::vector<std::string>& values) {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(values);
  if (it == children_.end()) return;
  removed_.push_back(std::move(it->second));
  children_.erase(it);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

struct Registry::Entry {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<std::string> label_names;
  // Exactly one of these is set.
  std::unique_ptr<Family<Counter>> counters;
  std::unique_ptr<Family<Gauge>> gauges;
  std::unique_ptr<Family<Histogram>> histograms;
  std::function<std::vector<Sample>()> callback;
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Entry& Registry::Register(
    const std::string& name, const std::string& help, MetricType type,
    const std::vector<std::string>& label_names) {
  if (!ValidName(name, /*label=*/false)) {
    Die(absl::StrCat("invalid metric name '", name, "'"));
  }
  for (const std::string& l : label_names) {
    if (!ValidName(l, /*label=*/true) || l.rfind("__", 0) == 0 ||
        (type == MetricType::kHistogram && l == "le")) {
      Die(absl::StrCat(name, ": invalid label name '", l, "'"));
    }
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Entry>& e = entries_[name];
  if (e != nullptr) Die(absl::StrCat("metric '", name, "' registered twice"));
  e = std::make_unique<Entry>();
  e->name = name;
  e->help = help;
  e->type = type;
  e->label_names = label_names;
  return *e;
}

Counter* Registry::AddCounter(const std::string& name,
                              const std::string& help) {
  return AddCounterFamily(name, help, {})->Get({});
}

Gauge* Registry::AddGauge(const std::string& name, const std::string& help) {
  return AddGaugeFamily(name, help, {})->Get({});
}

Histogram* Registry::AddHistogram(const std::string& name,
                                  const std::string& help,
                                  std::vector<double> bounds) {
  return AddHistogramFamily(name, help, {}, std::move(bounds))->Get({});
}

Family<Counter>* Registry::AddCounterFamily(
    const std::string& name, const std::string& help,
    std::vector<std::string> label_names) {
  Entry& e = Register(name, help, MetricType::kCounter, label_names);
  e.counters.reset(new Family<Counter>(name, std::move(label_names), {}));
  return e.counters.get();
}

Family<Gauge>* Registry::AddGaugeFamily(const std::string& name,
                                        const std::string& help,
                                        std::vector<std::string> label_names) {
  Entry& e = Register(name, help, MetricType::kGauge, label_names);
  e.gauges.reset(new Family<Gauge>(name, std::move(label_names), {}));
  return e.gauges.get();
}

Family<Histogram>* Registry::AddHistogramFamily(
    const std::string& name, const std::string& help,
    std::vector<std::string> label_names, std::vector<double> bounds) {
  Histogram check(bounds);  // dies on bad bounds now, not at first use
  Entry& e = Register(name, help, MetricType::kHistogram, label_names);
  e.histograms.reset(
      new Family<Histogram>(name, std::move(label_names), std::move(bounds)));
  return e.histograms.get();
}

void Registry::AddCallbackGauge(const std::string& name,
                                const std::string& help,
                                std::function<double()> fn) {
  AddCallbackGaugeFamily(name, help, {}, [fn = std::move(fn)] {
    return std::vector<Sample>{{{}, fn()}};
  });
}

void Registry::AddCallbackGaugeFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::string>& label_names,
    std::function<std::vector<Sample>()> fn) {
  Entry& e = Register(name, help, MetricType::kGauge, label_names);
  e.callback = std::move(fn);
}

std::string Registry::Render() const {
  // Snapshot the entries, then render without mu_ (callbacks may be slow).
  std::vector<const Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, e] : entries_) entries.push_back(e.get());
  }
  std::string out;
  for (const Entry* e : entries) {
    const char* type = e->type == MetricType::kCounter ? "counter"
                       : e->type == MetricType::kGauge ? "gauge"
                                                       : "histogram";
    absl::StrAppend(&out, "# HELP ", e->name, " ",
                    internal::EscapeHelp(e->help), "\n# TYPE ", e->name, " ",
                    type, "\n");
    auto line = [&](const char* suffix, const std::string& labels,
                    double value) {
      absl::StrAppend(&out, e->name, suffix, labels, " ",
                      internal::FormatValue(value), "\n");
    };
    if (e->callback) {
      std::vector<Sample> samples = e->callback();
      std::sort(samples.begin(), samples.end(),
                [](const Sample& a, const Sample& b) {
                  return a.label_values < b.label_values;
                });
      for (const Sample& s : samples) {
        if (s.label_values.size() != e->label_names.size()) continue;
        line("", Labels(e->label_names, s.label_values), s.value);
      }
    } else if (e->counters != nullptr || e->gauges != nullptr) {
      auto render = [&](auto& family) {
        absl::ReaderMutexLock lock(&family.mu_);
        for (const auto& [values, child] : family.children_) {
          line("", Labels(e->label_names, values), child->value());
        }
      };
      if (e->counters != nullptr) render(*e->counters);
      if (e->gauges != nullptr) render(*e->gauges);
    } else {
      Family<Histogram>& family = *e->histograms;
      absl::ReaderMutexLock lock(&family.mu_);
      for (const auto& [values, h] : family.children_) {
        // Sum read before the counts: an Observe racing with the scrape may
        // show in the counts and not the sum, never the other way round.
        const double sum = h->sum();
        const std::vector<uint64_t> counts = h->CumulativeCounts();
        for (size_t i = 0; i < counts.size(); ++i) {
          const std::string le = i < h->bounds().size()
                                     ? internal::FormatValue(h->bounds()[i])
                                     : "+Inf";
          line("_bucket",
               Labels(e->label_names, values, absl::StrCat("le=\"", le, "\"")),
               static_cast<double>(counts[i]));
        }
        line("_sum", Labels(e->label_names, values), sum);
        line("_count", Labels(e->label_names, values),
             static_cast<double>(counts.back()));
      }
    }
  }
  return out;
}

}  // namespace cairn::metrics
