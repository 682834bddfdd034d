#include "storage/lease.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace cairn::storage {
namespace {

constexpr int kGenerationDigits = 16;
constexpr absl::string_view kHeader = "cairn storage lease";

// The monotonic clock as an absl::Time (only differences mean anything).
absl::Time MonoNow() {
  return absl::UnixEpoch() +
         absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

// Field 22 of /proc/<pid>/stat: the process's start time in clock ticks
// since boot (0 when unknown). The fields after the command name, which may
// hold spaces and parentheses, start after its last ')'.
uint64_t StartTicks(int64_t pid) {
  const std::string stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state): field 22 is fields[19].
  uint64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) return 0;
  return ticks;
}

struct Identity {
  std::string host;
  int64_t pid = 0;
  std::string boot_id;
  std::string pid_namespace;
  uint64_t start_ticks = 0;
};

const Identity& Self() {
  static const Identity* self = [] {
    auto* id = new Identity;
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) id->host = host;
    id->pid = getpid();
    id->boot_id = ReadSmallFile("/proc/sys/kernel/random/boot_id");
    char ns[128] = {};
    const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    if (n > 0) id->pid_namespace.assign(ns, static_cast<size_t>(n));
    id->start_ticks = StartTicks(id->pid);
    return id;
  }();
  return *self;
}

// Holder ids of the leases this process holds now (a record naming this
// pid is held only if its id is here: a lease of this process that was
// abandoned is a dead holder's).
absl::Mutex g_held_mu(absl::kConstInit);
absl::flat_hash_set<std::string>& HeldIds()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_held_mu) {
  static auto* ids = new absl::flat_hash_set<std::string>;
  return *ids;
}
void SetHeld(const std::string& id, bool held) {
  absl::MutexLock lock(&g_held_mu);
  if (held) {
    HeldIds().insert(id);
  } else {
    HeldIds().erase(id);
  }
}
bool HeldHere(const std::string& id) {
  absl::MutexLock lock(&g_held_mu);
  return HeldIds().contains(id);
}

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

// "4 s" for a duration, rounded to seconds.
std::string Seconds(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Seconds(d + absl::Milliseconds(500)), " s");
}

absl::StatusOr<int64_t> ParseGeneration(absl::string_view key) {
  absl::string_view digits = key;
  int64_t generation = 0;
  if (!absl::ConsumePrefix(&digits, kLeasePrefix) ||
      digits.size() != kGenerationDigits ||
      !absl::SimpleAtoi(digits, &generation) || generation <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' is not a lease object"));
  }
  return generation;
}

// The generations present, ascending.
absl::StatusOr<std::vector<int64_t>> ListGenerations(ShardStore& store) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                         store.List(kLeasePrefix));
  std::vector<int64_t> generations;
  for (const std::string& key : keys) {
    absl::StatusOr<int64_t> g = ParseGeneration(key);
    if (g.ok()) generations.push_back(*g);
  }
  std::sort(generations.begin(), generations.end());
  return generations;
}

absl::StatusOr<LeaseRecord> ReadRecord(ShardStore& store, int64_t generation) {
  const std::string key = LeaseKey(generation);
  CAIRN_ASSIGN_OR_RETURN(std::string body,
                         ReadObject(store, key, /*max_bytes=*/64 << 10));
  CAIRN_ASSIGN_OR_RETURN(LeaseRecord record, LeaseRecord::Parse(key, body));
  record.generation = generation;
  return record;
}

absl::Span<const char> Bytes(const std::string& s) {
  return absl::MakeConstSpan(s.data(), s.size());
}

}  // namespace

std::string LeaseKey(int64_t generation) {
  return absl::StrFormat("%s%0*d", kLeasePrefix, kGenerationDigits, generation);
}

std::string LeaseRecord::Holder() const {
  std::string out = absl::StrCat(role.empty() ? "unknown" : role, " (pid ", pid,
                                 " on host ", host);
  if (!address.empty()) absl::StrAppend(&out, ", serving ", address);
  if (!detail.empty()) absl::StrAppend(&out, ", ", detail);
  absl::StrAppend(&out, ")");
  return out;
}

std::string LeaseRecord::Describe(absl::Time now) const {
  const absl::Time renewed = absl::FromUnixMicros(renewed_unix_micros);
  const absl::Time expiry = expires();
  std::string out =
      absl::StrCat(Holder(), ", lease generation ", generation, " renewed ",
                   Rfc3339(renewed), " (", Seconds(now - renewed), " ago), ");
  if (released) {
    absl::StrAppend(&out, "released");
  } else if (expiry > now) {
    absl::StrAppend(&out, "expires ", Rfc3339(expiry), " (in ",
                    Seconds(expiry - now), ")");
  } else {
    absl::StrAppend(&out, "expired ", Rfc3339(expiry));
  }
  return out;
}

std::string LeaseRecord::Serialize() const {
  return absl::StrCat(
      kHeader, "\n", "holder: ", holder_id, "\n", "role: ", role, "\n",
      "host: ", host, "\n", "pid: ", pid, "\n", "address: ", address, "\n",
      "detail: ", detail, "\n", "acquired_unix_micros: ", acquired_unix_micros,
      "\n", "renewed_unix_micros: ", renewed_unix_micros, "\n",
      "ttl_micros: ", ttl_micros, "\n", "released: ", released ? 1 : 0, "\n",
      "boot_id: ", boot_id, "\n", "pid_namespace: ", pid_namespace, "\n",
      "start_ticks: ", start_ticks, "\n",
      // For a human reading the object.
      "renewed: ", Rfc3339(absl::FromUnixMicros(renewed_unix_micros)), "\n",
      "expires: ", Rfc3339(expires()), "\n");
}

absl::StatusOr<LeaseRecord> LeaseRecord::Parse(absl::string_view key,
                                               absl::string_view body) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("lease object '", key, "' is damaged: ", why,
                     " (remove it if no cairnd or cairn rm/gc runs)"));
  };
  std::vector<absl::string_view> lines = absl::StrSplit(body, '\n');
  if (lines.empty() || lines[0] != kHeader) return bad("no header line");
  LeaseRecord r;
  bool has_holder = false, has_renewed = false, has_ttl = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    const size_t colon = lines[i].find(": ");
    absl::string_view name = lines[i].substr(0, colon);
    absl::string_view value =
        colon == absl::string_view::npos ? "" : lines[i].substr(colon + 2);
    if (colon == absl::string_view::npos) {
      // "name:" with an empty value is written as "name: ".
      return bad(absl::StrCat("line ", i + 1, " is not 'name: value'"));
    }
    bool ok = true;
    if (name == "holder") {
      r.holder_id = std::string(value);
      has_holder = !value.empty();
    } else if (name == "role") {
      r.role = std::string(value);
    } else if (name == "host") {
      r.host = std::string(value);
    } else if (name == "pid") {
      ok = absl::SimpleAtoi(value, &r.pid);
    } else if (name == "address") {
      r.address = std::string(value);
    } else if (name == "detail") {
      r.detail = std::string(value);
    } else if (name == "acquired_unix_micros") {
      ok = absl::SimpleAtoi(value, &r.acquired_unix_micros);
    } else if (name == "renewed_unix_micros") {
      ok = absl::SimpleAtoi(value, &r.renewed_unix_micros);
      has_renewed = ok;
    } else if (name == "ttl_micros") {
      ok = absl::SimpleAtoi(value, &r.ttl_micros) && r.ttl_micros > 0;
      has_ttl = ok;
    } else if (name == "released") {
      r.released = value == "1";
      ok = value == "0" || value == "1";
    } else if (name == "boot_id") {
      r.boot_id = std::string(value);
    } else if (name == "pid_namespace") {
      r.pid_namespace = std::string(value);
    } else if (name == "start_ticks") {
      ok = absl::SimpleAtoi(value, &r.start_ticks);
    }
    // Other names (renewed, expires, newer fields) are for humans or later
    // versions.
    if (!ok) return bad(absl::StrCat("bad ", name, " '", value, "'"));
  }
  if (!has_holder || !has_renewed || !has_ttl) {
    return bad("holder, renewed_unix_micros or ttl_micros missing");
  }
  return r;
}

LeaseState EvaluateLease(const LeaseRecord& record, absl::Time now) {
  if (record.released) return LeaseState::kReleased;
  if (now >= record.expires()) return LeaseState::kExpired;
  const Identity& self = Self();
  // Only on this machine can the holder's process be looked up: the same
  // host name, boot and pid namespace.
  if (record.host.empty() || record.host != self.host ||
      record.boot_id.empty() || record.boot_id != self.boot_id ||
      record.pid_namespace.empty() ||
      record.pid_namespace != self.pid_namespace) {
    return LeaseState::kHeld;
  }
  if (record.pid == self.pid) {
    return HeldHere(record.holder_id) ? LeaseState::kHeld
                                      : LeaseState::kHolderDead;
  }
  if (record.pid <= 0) return LeaseState::kHeld;
  if (::kill(static_cast<pid_t>(record.pid), 0) != 0 && errno == ESRCH) {
    return LeaseState::kHolderDead;
  }
  // The pid runs, but is it still the holder's process (pids are reused)?
  const uint64_t ticks = StartTicks(record.pid);
  if (record.start_ticks != 0 && ticks != 0 && ticks != record.start_ticks) {
    return LeaseState::kHolderDead;
  }
  return LeaseState::kHeld;
}

absl::string_view LeaseStateName(LeaseState state) {
  switch (state) {
    case LeaseState::kHeld:
      return "it is held";
    case LeaseState::kReleased:
      return "it was released";
    case LeaseState::kExpired:
      return "it expired";
    case LeaseState::kHolderDead:
      return "its holder's process is gone";
  }
  return "?";
}

absl::StatusOr<std::optional<LeaseRecord>> ReadLease(ShardStore& store) {
  // A new holder deletes the generations below its own: one read between
  // the List and the Read may miss; list again.
  for (int attempt = 0;; ++attempt) {
    CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> generations,
                           ListGenerations(store));
    if (generations.empty()) return std::optional<LeaseRecord>();
    absl::StatusOr<LeaseRecord> r = ReadRecord(store, generations.back());
    if (absl::IsNotFound(r.status()) && attempt < 8) continue;
    CAIRN_RETURN_IF_ERROR(r.status());
    return std::optional<LeaseRecord>(*std::move(r));
  }
}

absl::StatusOr<std::unique_ptr<StorageLease>> StorageLease::Acquire(
    ShardStore& store, LeaseOptions options) {
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage lease TTL must be at least 1 s, got ",
                     absl::FormatDuration(options.ttl)));
  }
  const Identity& self = Self();
  LeaseRecord mine;
  mine.holder_id =
      absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(absl::BitGen()),
                      absl::Uniform<uint64_t>(absl::BitGen()));
  mine.role = options.role;
  mine.host = self.host;
  mine.pid = self.pid;
  mine.address = options.address;
  mine.detail = options.detail;
  mine.ttl_micros = absl::ToInt64Microseconds(options.ttl);
  mine.boot_id = self.boot_id;
  mine.pid_namespace = self.pid_namespace;
  mine.start_ticks = self.start_ticks;

  // Held from before it is written: another lease of this process that
  // reads the record must not take its pid for a dead holder's.
  SetHeld(mine.holder_id, true);
  absl::Cleanup not_held = [&] { SetHeld(mine.holder_id, false); };
  const absl::Time wait_until = absl::Now() + options.wait;
  bool logged_wait = false;
  bool fallback = false;
  for (int attempt = 0;; ++attempt) {
    CAIRN_ASSIGN_OR_RETURN(std::optional<LeaseRecord> current,
                           ReadLease(store));
    const absl::Time now = absl::Now();
    if (current.has_value()) {
      const LeaseState state = EvaluateLease(*current, now);
      if (state == LeaseState::kHeld) {
        const std::string held = absl::StrCat(
            "storage ", store.uri(), " is held by ", current->Describe(now));
        if (now >= wait_until) {
          return absl::FailedPreconditionError(absl::StrCat(
              held,
              options.wait > absl::ZeroDuration()
                  ? absl::StrCat(" (waited ", Seconds(options.wait), ")")
                  : "",
              ": only one cairnd (or offline cairn rm/gc) may use a storage "
              "at a time; stop it, or wait for its lease to expire"));
        }
        if (!logged_wait) {
          CAIRN_LOG(warn,
                    "{}: waiting up to {} for it to be released or "
                    "expire",
                    held, Seconds(wait_until - now));
          logged_wait = true;
        }
        absl::SleepFor(std::min(
            {absl::Seconds(1), wait_until - now,
             std::max(current->expires() - now, absl::Milliseconds(10))}));
        continue;
      }
    }
    const int64_t generation =
        current.has_value() ? current->generation + 1 : 1;
    const std::string key = LeaseKey(generation);
    mine.generation = generation;
    mine.acquired_unix_micros = absl::ToUnixMicros(now);
    mine.renewed_unix_micros = mine.acquired_unix_micros;
    const std::string body = mine.Serialize();
    absl::Status created = store.PutIfAbsent(key, Bytes(body));
    if (absl::IsAlreadyExists(created)) {
      // Another process took this generation first, or a retry of ours
      // did (its first answer was lost).
      absl::StatusOr<LeaseRecord> winner = ReadRecord(store, generation);
      if (!winner.ok() || winner->holder_id != mine.holder_id) {
        if (attempt > 100) return created;
        continue;  // evaluate the winner's record
      }
      created = absl::OkStatus();
    }
    if (absl::IsUnimplemented(created)) {
      fallback = true;
      CAIRN_RETURN_IF_ERROR(store.Put(key, Bytes(body)));
    } else {
      CAIRN_RETURN_IF_ERROR(created);
      // A server that ignores If-None-Match lets the same create succeed
      // twice.
      absl::Status again = store.PutIfAbsent(key, Bytes(body));
      if (again.ok()) {
        fallback = true;
      } else if (!absl::IsAlreadyExists(again)) {
        return again;
      }
    }
    if (fallback) {
      CAIRN_LOG(warn,
                "store {} cannot create an object only if it is absent: the "
                "storage lease is checked by reading it back after {} (two "
                "processes starting within that time of each other could "
                "both take it)",
                store.uri(), absl::FormatDuration(options.settle));
      absl::SleepFor(options.settle);
      absl::StatusOr<LeaseRecord> back = ReadRecord(store, generation);
      CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> generations,
                             ListGenerations(store));
      if (!back.ok() || back->holder_id != mine.holder_id ||
          generations.empty() || generations.back() != generation) {
        if (attempt > 100) {
          return absl::AbortedError(absl::StrCat(
              "storage ", store.uri(), ": lost the race for its lease"));
        }
        continue;
      }
    }
    // Ours. Older generations are history (best effort: a later holder
    // deletes what is left).
    for (int64_t old = generation - 1; old >= 1; --old) {
      absl::Status s = store.Delete(LeaseKey(old));
      if (absl::IsNotFound(s)) {
        if (old < generation - 1) break;  // deleted by an earlier holder
        continue;
      }
      if (!s.ok()) break;
    }
    if (current.has_value()) {
      const LeaseState state = EvaluateLease(*current, now);
      if (state == LeaseState::kReleased) {
        CAIRN_LOG(info, "storage {}: lease taken (generation {}) from {}",
                  store.uri(), generation, current->Describe(now));
      } else {
        CAIRN_LOG(warn,
                  "storage {}: lease taken over (generation {}) because {}; "
                  "its previous holder: {}",
                  store.uri(), generation, std::string(LeaseStateName(state)),
                  current->Describe(now));
      }
    } else {
      CAIRN_LOG(info, "storage {}: lease taken (generation {})", store.uri(),
                generation);
    }
    std::move(not_held).Cancel();
    return std::unique_ptr<StorageLease>(
        new StorageLease(store, std::move(options), std::move(mine),
                         std::move(current), fallback));
  }
}

StorageLease::StorageLease(ShardStore& store, LeaseOptions options,
                           LeaseRecord record,
                           std::optional<LeaseRecord> previous, bool fallback)
    : store_(store),
      options_(std::move(options)),
      previous_(std::move(previous)),
      fallback_(fallback),
      key_(LeaseKey(record.generation)),
      record_(std::move(record)) {
  // The record was written at its renewed time, just now.
  last_renewed_ =
      MonoNow() -
      (absl::Now() - absl::FromUnixMicros(record_.renewed_unix_micros));
  thread_ = std::thread([this] { RenewLoop(); });
}

StorageLease::~StorageLease() { Release().IgnoreError(); }

void StorageLease::StopThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status StorageLease::Release() {
  StopThread();
  absl::MutexLock renew(&renew_mu_);
  LeaseRecord record;
  {
    absl::MutexLock lock(&mu_);
    if (released_) return absl::OkStatus();
    // Renewals overdue (UNAVAILABLE) still leave the lease ours; expired or
    // taken over, it is not ours to mark.
    const bool ours = !absl::IsFailedPrecondition(CheckLocked());
    released_ = true;
    SetHeld(record_.holder_id, false);
    if (!ours) return absl::OkStatus();
    record_.released = true;
    record_.renewed_unix_micros = absl::ToUnixMicros(absl::Now());
    record = record_;
  }
  absl::Status s = store_.Put(key_, Bytes(record.Serialize()));
  if (s.ok()) {
    CAIRN_LOG(info, "storage {}: lease released (generation {})", store_.uri(),
              record.generation);
  } else {
    CAIRN_LOG(warn,
              "storage {}: cannot mark its lease released ({}); the next "
              "holder takes over when it expires",
              store_.uri(), s.ToString());
  }
  return s;
}

void StorageLease::AbandonForTest() {
  StopThread();
  absl::MutexLock lock(&mu_);
  released_ = true;
  SetHeld(record_.holder_id, false);
}

void StorageLease::RenewNowForTest() { RenewOnce(); }

void StorageLease::SetAddress(std::string address) {
  {
    absl::MutexLock lock(&mu_);
    record_.address = std::move(address);
  }
  RenewOnce();
}

LeaseRecord StorageLease::record() const {
  absl::MutexLock lock(&mu_);
  return record_;
}

absl::Status StorageLease::Check() const {
  absl::MutexLock lock(&mu_);
  return CheckLocked();
}

absl::Status StorageLease::CheckLocked() const {
  if (!lost_.ok()) return lost_;
  if (released_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the lease on storage ", store_.uri(), " was released"));
  }
  const absl::Duration ttl = options_.ttl;
  const absl::Duration since = MonoNow() - last_renewed_;
  if (since >= ttl) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the lease on storage ", store_.uri(), " expired: not renewed for ",
        Seconds(since), " (TTL ", Seconds(ttl), "; last error: ",
        last_error_.ToString(), "); another process may have taken it over"));
  }
  if (since >= ttl * 2 / 3) {
    return absl::UnavailableError(absl::StrCat(
        "the lease on storage ", store_.uri(), " could not be renewed for ",
        Seconds(since), " (TTL ", Seconds(ttl),
        "; last error: ", last_error_.ToString(),
        "): nothing is changed on the storage until a renewal succeeds"));
  }
  return absl::OkStatus();
}

void StorageLease::MarkLost(absl::Status status) {
  if (!lost_.ok()) return;
  lost_ = std::move(status);
  CAIRN_LOG(error, "{}", std::string(lost_.message()));
}

void StorageLease::RenewOnce() {
  absl::MutexLock renew(&renew_mu_);
  LeaseRecord record;
  {
    absl::MutexLock lock(&mu_);
    if (!lost_.ok() || released_) return;
    // A full TTL without renewal: others may have taken over already.
    if (absl::Status s = CheckLocked(); absl::IsFailedPrecondition(s)) {
      MarkLost(std::move(s));
      return;
    }
    record_.renewed_unix_micros = absl::ToUnixMicros(absl::Now());
    record = record_;
  }
  const absl::Time start = MonoNow();
  absl::Status s = store_.Put(key_, Bytes(record.Serialize()));
  absl::StatusOr<std::vector<int64_t>> generations =
      s.ok() ? ListGenerations(store_)
             : absl::StatusOr<std::vector<int64_t>>(s);
  absl::Status superseded;
  if (generations.ok() && !generations->empty() &&
      generations->back() > record.generation) {
    absl::StatusOr<LeaseRecord> winner =
        ReadRecord(store_, generations->back());
    superseded = absl::FailedPreconditionError(absl::StrCat(
        "the lease on storage ", store_.uri(), " was taken over by ",
        winner.ok() ? winner->Describe(absl::Now())
                    : absl::StrCat("generation ", generations->back()),
        " (this process held generation ", record.generation, ")"));
    // Our Put may have recreated an object the new holder had deleted.
    store_.Delete(key_).IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  if (!superseded.ok()) {
    MarkLost(std::move(superseded));
    return;
  }
  if (!generations.ok()) {
    last_error_ = generations.status();
    CAIRN_LOG(warn, "storage {}: renewing its lease failed: {}", store_.uri(),
              last_error_.ToString());
  } else if (MonoNow() < last_renewed_ + options_.ttl) {
    // Written before the previous record expired: nobody can have seen
    // the lease free in between, so the generations listed are the truth.
    last_renewed_ = start;
    last_error_ = absl::OkStatus();
  }
  if (absl::Status c = CheckLocked(); absl::IsFailedPrecondition(c)) {
    MarkLost(std::move(c));
  }
}

void StorageLease::RenewLoop() {
  while (true) {
    bool failing = false;
    {
      absl::MutexLock lock(&mu_);
      failing = !last_error_.ok();
      const absl::Duration every =
          failing ? std::min(absl::Seconds(1), options_.ttl / 3)
                  : options_.ttl / 3;
      mu_.AwaitWithDeadline(absl::Condition(this, &StorageLease::WakeLocked),
                            absl::Now() + every);
      if (stopping_) return;
    }
    RenewOnce();
    absl::Status lost;
    bool report = false;
    {
      absl::MutexLock lock(&mu_);
      if (!lost_.ok() && !lost_reported_) {
        lost_reported_ = true;
        report = true;
        lost = lost_;
      }
    }
    if (report) {
      if (options_.on_lost) options_.on_lost(lost);
      return;  // nothing more to renew
    }
  }
}

}  // namespace cairn::storage
