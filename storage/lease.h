// The storage lease: one writer process (cairnd, or an offline `cairn rm` /
// `cairn gc`) per storage root at a time. Two cairnd on one storage would
// each recover (delete) the other's in-flight saves, and an offline delete
// under a running cairnd leaves it listing checkpoints whose MANIFEST is gone.
//
// Built on the ShardStore interface alone, so it works on every driver:
//
//   <root>/cairn-lease.<generation, 16 digits>    one object per holder
//
// The object with the highest generation is the lease; it records who holds
// it (LeaseRecord: a random holder id, role, host, pid, listen address, when
// it was acquired and last renewed, its TTL, whether it was released) as
// "key: value" lines an operator can read. Objects at the root are not jobs
// (ListJobs lists directories), so the lease is never taken for a checkpoint.
//
// Acquire: read the highest generation G. Held (not released, renewed less
// than its TTL ago, and its process not known dead, below) -> refused at
// once with FAILED_PRECONDITION naming the holder and when it expires, or
// waited for (LeaseOptions::wait). Free -> create generation G + 1 with
// ShardStore::PutIfAbsent: of two processes taking over together exactly one
// creates it; the other sees the winner's record and is refused. The
// generation is the fencing token: a holder that finds a higher generation
// than its own has lost the lease for good. Generations below the new one
// are deleted.
//
// A store that cannot create only-if-absent (PutIfAbsent UNIMPLEMENTED, or an
// S3 server that ignores `If-None-Match: *`, which Acquire detects by
// creating its object a second time) gets Put, a settle delay
// (LeaseOptions::settle) and a read-back: the holder id read back must still
// be ours. Two processes whose Puts land more than the settle delay apart
// are told apart; closer ones may both see their own id (each read came
// before the other's write landed) and both run. A warning names the store.
//
// A dead holder on this machine (same host name, boot id and pid namespace;
// its pid gone or now another process) frees the lease at once: a cairnd
// restarted after a crash does not wait out the TTL. Holders elsewhere free
// it when it expires: renewed_unix_micros + ttl, by the clock of the process
// that reads it, so the hosts' clocks must agree to well within a third of
// the TTL (NTP).
//
// Renewal: a thread rewrites the record (Put) every ttl / 3 (every second
// after a failure) and lists the generations. Check() tells whether the
// holder may still change the storage:
//   * OK: the last renewal started less than 2/3 ttl ago;
//   * UNAVAILABLE: renewals have failed for 2/3 ttl (the storage is not
//     answering): the holder must stop changing the storage (a reader of the
//     record still sees it held for the last third of the TTL, the margin for
//     clock skew and for a change already under way); OK again once a renewal
//     succeeds in time;
//   * FAILED_PRECONDITION (lost for good): a full TTL passed without a
//     renewal (another process may have taken over and run its recovery), or
//     a higher generation exists (it did), naming the new holder.
// A change the holder started before Check() turned non-OK can still land
// after another process took over: callers check before each change, and
// keep changes short against the TTL.
//
// Release (and the destructor): stops renewing and rewrites the record as
// released, so the next holder takes over at once.
//
// Thread-safe.
#ifndef CAIRN_STORAGE_LEASE_H_
#define CAIRN_STORAGE_LEASE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/shard_store.h"

namespace cairn::storage {

inline constexpr char kLeasePrefix[] = "cairn-lease.";

// "cairn-lease.0000000000000007".
std::string LeaseKey(int64_t generation);

// What a lease object says.
struct LeaseRecord {
  int64_t generation = 0;  // from the key, not stored in the body
  std::string holder_id;   // random, per acquisition
  std::string role;        // "cairnd", "cairn rm", "cairn gc"
  std::string host;
  int64_t pid = 0;
  std::string address;  // where the holder serves ("" for the CLI)
  std::string detail;   // free text: cairnd's catalog directory
  int64_t acquired_unix_micros = 0;
  int64_t renewed_unix_micros = 0;
  int64_t ttl_micros = 0;
  bool released = false;
  // Identify the holder's process on its machine (the dead-holder check).
  std::string boot_id;
  std::string pid_namespace;
  uint64_t start_ticks = 0;

  absl::Time expires() const {
    return absl::FromUnixMicros(renewed_unix_micros + ttl_micros);
  }
  // "cairnd (pid 12 on host n1, serving 10.0.0.5:7070, catalog /c)".
  std::string Holder() const;
  // Holder() plus the lease's times as seen at `now`: "..., lease renewed
  // 2025-01-02T03:04:05Z (4 s ago), expires 2025-...Z (in 26 s)".
  std::string Describe(absl::Time now) const;

  std::string Serialize() const;
  // DATA_LOSS naming `key` when the body is not a lease record.
  static absl::StatusOr<LeaseRecord> Parse(absl::string_view key,
                                           absl::string_view body);
};

// Whether a record still holds the storage at `now`.
enum class LeaseState {
  kHeld,
  kReleased,
  kExpired,
  kHolderDead,  // its process on this machine is gone
};
LeaseState EvaluateLease(const LeaseRecord& record, absl::Time now);
absl::string_view LeaseStateName(LeaseState state);

// The lease as it stands (the highest generation); nullopt when the storage
// was never leased. Errors of the store; DATA_LOSS for a damaged record.
absl::StatusOr<std::optional<LeaseRecord>> ReadLease(ShardStore& store);

struct LeaseOptions {
  std::string role = "cairnd";
  std::string address;
  std::string detail;
  // How long a record stays held without renewal. Default: 30 s.
  absl::Duration ttl = absl::Seconds(30);
  // Acquire waits this long for a held lease to be released or expire
  // before refusing. Default: 0 (refuse at once).
  absl::Duration wait = absl::ZeroDuration();
  // Stores without create-only puts: the delay between writing the record
  // and reading it back (see the top). Default: 2 s.
  absl::Duration settle = absl::Seconds(2);
  // Called once, from the renewal thread, when the lease is lost for good
  // (Check() turned FAILED_PRECONDITION), with that status.
  std::function<void(const absl::Status&)> on_lost;
};

class StorageLease {
 public:
  // Takes the lease of `store`, which must outlive the lease. Starts the
  // renewal thread. FAILED_PRECONDITION naming the holder (LeaseRecord::
  // Describe) when another holds it (after options.wait); INVALID_ARGUMENT
  // for a TTL under 1 s; errors of the store.
  static absl::StatusOr<std::unique_ptr<StorageLease>> Acquire(
      ShardStore& store, LeaseOptions options);

  // Release().
  ~StorageLease();
  StorageLease(const StorageLease&) = delete;
  StorageLease& operator=(const StorageLease&) = delete;

  // Whether the holder may change the storage now (see the top): OK,
  // UNAVAILABLE (renewals overdue) or FAILED_PRECONDITION (lost).
  absl::Status Check() const;
  // Stops renewing and marks the record released (unless the lease was
  // lost). Idempotent; the error of the final write, if any.
  absl::Status Release();

  // Updates the address recorded (cairnd learns its port after binding)
  // and rewrites the record before returning.
  void SetAddress(std::string address);

  // The record as last written.
  LeaseRecord record() const;
  // The record this acquisition replaced (nullopt for a first lease).
  const std::optional<LeaseRecord>& previous() const { return previous_; }
  // Whether Acquire had to fall back to Put + settle (see the top).
  bool create_only_unsupported() const { return fallback_; }

  // Tests: stops renewing without releasing, and forgets that this process
  // holds the lease, as if the holder had been killed (kill -9).
  void AbandonForTest();
  // Tests: runs one renewal now.
  void RenewNowForTest();

 private:
  StorageLease(ShardStore& store, LeaseOptions options, LeaseRecord record,
               std::optional<LeaseRecord> previous, bool fallback);
  void RenewLoop();
  // One renewal: Put of the record, then the generation check.
  void RenewOnce();
  void StopThread();
  void MarkLost(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool WakeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; }

  ShardStore& store_;
  const LeaseOptions options_;
  const std::optional<LeaseRecord> previous_;
  const bool fallback_;
  const std::string key_;

  // Renewals run one at a time (the thread's, SetAddress's, tests').
  absl::Mutex renew_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  LeaseRecord record_ ABSL_GUARDED_BY(mu_);
  // Monotonic start of the last renewal that succeeded in time.
  absl::Time last_renewed_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  bool lost_reported_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_LEASE_H_
