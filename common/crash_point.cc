#include "common/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace cairn {
namespace crash_point_internal {
namespace {

struct Spec {
  std::string name;        // without the trailing '*'
  bool prefix = false;     // NAME*: every point starting with `name`
  int64_t nth = 1;         // NAME@N: die on the N-th hit
  double probability = 0;  // NAME%P: die on each hit with this probability
  std::atomic<int64_t> hits{0};
};

using Specs = std::vector<std::unique_ptr<Spec>>;

// Replaced only by SetCrashPointsForTest (the old table is leaked: a point
// may be running concurrently in a test that did not stop its threads).
Specs* specs = nullptr;

void WriteStderr(const std::string& line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Parses `text`; returns false if an entry was malformed (and says which on
// stderr).
bool Parse(absl::string_view text, Specs* out) {
  bool ok = true;
  for (absl::string_view entry :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    auto spec = std::make_unique<Spec>();
    absl::string_view name = entry;
    bool good = true;
    if (size_t at = entry.find('@'); at != absl::string_view::npos) {
      name = entry.substr(0, at);
      good =
          absl::SimpleAtoi(entry.substr(at + 1), &spec->nth) && spec->nth >= 1;
    } else if (size_t pct = entry.find('%'); pct != absl::string_view::npos) {
      name = entry.substr(0, pct);
      good = absl::SimpleAtod(entry.substr(pct + 1), &spec->probability) &&
             spec->probability > 0 && spec->probability <= 1;
    }
    if (absl::ConsumeSuffix(&name, "*")) spec->prefix = true;
    if (name.empty() && !spec->prefix) good = false;
    if (!good) {
      WriteStderr(
          absl::StrCat("cairn: ignoring malformed CAIRN_CRASH_POINTS "
                       "entry '",
                       entry, "' (NAME, NAME@N or NAME%P)\n"));
      ok = false;
      continue;
    }
    spec->name = std::string(name);
    out->push_back(std::move(spec));
  }
  return ok;
}

bool ArmFromEnvironment() {
  const char* env = std::getenv("CAIRN_CRASH_POINTS");
  if (env == nullptr || *env == '\0') return false;
  auto* parsed = new Specs;
  Parse(env, parsed);
  specs = parsed;
  return !parsed->empty();
}

double UniformDouble() {
  thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(::getpid()) ^
           std::hash<std::thread::id>()(std::this_thread::get_id());
  }());
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

bool armed = ArmFromEnvironment();

void Hit(const char* name) {
  const Specs* table = specs;
  if (table == nullptr) return;
  const absl::string_view point(name);
  for (const std::unique_ptr<Spec>& spec : *table) {
    const bool match = spec->prefix ? absl::StartsWith(point, spec->name)
                                    : point == spec->name;
    if (!match) continue;
    const int64_t hit = spec->hits.fetch_add(1) + 1;
    const bool die = spec->probability > 0 ? UniformDouble() < spec->probability
                                           : hit == spec->nth;
    if (!die) continue;
    WriteStderr(absl::StrCat("cairn: crash point '", point, "' hit ", hit,
                             ": SIGKILL\n"));
    ::kill(::getpid(), SIGKILL);
    // SIGKILL cannot be caught or blocked; never returns.
    for (;;) ::pause();
  }
}

}  // namespace crash_point_internal

bool SetCrashPointsForTest(absl::string_view text) {
  auto* parsed = new crash_point_internal::Specs;
  const bool ok = crash_point_internal::Parse(text, parsed);
  crash_point_internal::specs = parsed;
  crash_point_internal::armed = !parsed->empty();
  return ok;
}

}  // namespace cairn
