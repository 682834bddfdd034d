// FaultInjectionStore: a ShardStore decorator that injects I/O faults, in
// the spirit of RocksDB's FaultInjectionTestFS. Tests (storage's own and the
// coordinator's) wrap a real store with it and program faults:
//
//   * rules (AddRule): "the k-th matching call fails / writes short / crashes
//     before rename / returns corrupted bytes", matched by operation and key
//     substring, optionally repeating;
//   * FailNthWrite(n): the n-th write call (Append, Close or Put, counted
//     from now, 1-based) fails;
//   * SetSpaceLimit(bytes): a disk with `bytes` free: writes that would exceed
//     it fail with RESOURCE_EXHAUSTED ("No space left on device"), leaving
//     nothing visible;
//   * CrashAtMutation(n): the process "dies" during the n-th mutating call
//     (Append, Close, Put, Delete, DeletePrefix): that call does not take
//     effect (a Close/Put leaves only its temp file, as a real crash between
//     write and rename would), and every later call fails with UNAVAILABLE.
//     Tests then reopen the base store, as a restarted process would, and
//     check what survived. mutation_count() tells how many crash points a
//     scenario has.
//
// Example:
//   auto base = OpenShardStore("file:///tmp/x").value();
//   FaultInjectionStore store(base.get());
//   store.AddRule({.ops = kFaultRead, .key_contains = "data-0",
//                  .action = FaultAction::kCorruptRead});
//   EXPECT_EQ(VerifyCheckpoint(store, manifest).code(),
//             absl::StatusCode::kDataLoss);
//
// Thread-safe: every method may be called concurrently; the wrapped store
// must be thread-safe too (every ShardStore is). Writers created by the
// wrapper must not outlive it.
#ifndef CAIRN_STORAGE_TESTING_FAULT_INJECTION_STORE_H_
#define CAIRN_STORAGE_TESTING_FAULT_INJECTION_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "storage/shard_store.h"

namespace cairn::storage {

// Operations a rule can match (bit mask).
enum FaultOp : uint32_t {
  kFaultNewWriter = 1u << 0,
  kFaultAppend = 1u << 1,
  kFaultClose = 1u << 2,
  kFaultPut = 1u << 3,   // Put and PutIfAbsent
  kFaultRead = 1u << 4,  // Read and ReadRanges
  kFaultSize = 1u << 5,
  kFaultList = 1u << 6,    // List and ListChildren
  kFaultDelete = 1u << 7,  // Delete and DeletePrefix
  kFaultAnyWrite = kFaultAppend | kFaultClose | kFaultPut,
  kFaultAnyOp = 0xffu,
};

enum class FaultAction {
  // The call fails with `status` and has no effect.
  kFail,
  // Append/Put: only the first half of the bytes is written, then the call
  // fails with `status` (a device that stopped mid-write). Nothing visible.
  kShortWrite,
  // Append/Put: only the first half is written and the call reports OK (a
  // lying device or a buggy filesystem); checksums must catch it.
  kSilentShortWrite,
  // Close/Put: the data is written but the process "dies" before the rename:
  // the call fails with `status`, only the temp file remains.
  kCrashBeforeRename,
  // Read/ReadRanges: succeeds, but one bit of the returned bytes is flipped
  // (bit 0 of the byte in the middle of the first non-empty range).
  kCorruptRead,
};

struct FaultRule {
  uint32_t ops = kFaultAnyWrite;  // FaultOp mask
  std::string key_contains;       // "" matches every key
  int64_t skip = 0;   // matching calls that pass untouched before firing
  int64_t count = 1;  // how many matching calls it fires on; -1 = forever
  FaultAction action = FaultAction::kFail;
  absl::Status status = absl::UnavailableError("injected fault");
};

class FaultInjectionStore : public ShardStore {
 public:
  // Does not take ownership of `base`, which must outlive this store.
  explicit FaultInjectionStore(ShardStore* base);
  // Takes ownership.
  explicit FaultInjectionStore(std::unique_ptr<ShardStore> base);
  ~FaultInjectionStore() override;

  // Adds a rule; returns its id. Rules are tried in insertion order; the first
  // that fires wins.
  int AddRule(FaultRule rule);
  // How many times rule `id` fired.
  int64_t fired(int id) const;
  // Removes every rule, the space limit and the crash point, and revives a
  // crashed store. Counters are kept.
  void Reset();

  // The n-th write call (Append, Close or Put) from now fails with `status`.
  void FailNthWrite(int64_t n, absl::Status status = absl::UnavailableError(
                                   "injected write failure"));
  // At most `bytes` more bytes may be appended/put; a write that would exceed
  // it fails with RESOURCE_EXHAUSTED and the object never becomes visible.
  void SetSpaceLimit(uint64_t bytes);
  // Crash during the n-th mutating call from now (1-based); 0 disables.
  void CrashAtMutation(int64_t n);
  bool crashed() const;

  // Counters since construction.
  int64_t mutation_count() const;  // Append, Close, Put, Delete, DeletePrefix
  int64_t write_count() const;     // Append, Close, Put
  int64_t read_count() const;      // Read, ReadRanges
  uint64_t bytes_written() const;  // by Append and Put

  ShardStore& base() { return *base_; }

  // ShardStore.
  std::string uri() const override;
  bool CanRewritePrefix() const override { return base_->CanRewritePrefix(); }
  using ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key, const WriterOptions& options) override;
  absl::Status Put(absl::string_view key, absl::Span<const char> data) override;
  absl::Status PutIfAbsent(absl::string_view key,
                           absl::Span<const char> data) override;
  absl::StatusOr<size_t> Read(absl::string_view key, ByteRange range,
                              absl::Span<char> out) override;
  absl::Status ReadRanges(absl::string_view key,
                          absl::Span<const ByteRange> ranges,
                          absl::Span<const absl::Span<char>> outs) override;
  absl::StatusOr<uint64_t> Size(absl::string_view key) override;
  absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) override;
  absl::StatusOr<std::vector<std::string>> ListChildren(
      absl::string_view dir_prefix) override;
  absl::Status Delete(absl::string_view key) override;
  absl::Status DeletePrefix(absl::string_view prefix) override;
  absl::Status DeleteAbandonedWrites(absl::string_view dir_prefix) override;

  // What a call should do; used by the writer class. Public for it only.
  struct Decision {
    enum Kind {
      kPass,
      kFail,
      kShortWrite,
      kSilentShortWrite,
      kCrash,
      kCrashBeforeRename,
      kCorruptRead,
      kNoSpace
    };
    Kind kind = kPass;
    absl::Status status;
  };
  // Counts the call and decides its fate. `bytes` is the payload of a write.
  Decision Decide(FaultOp op, absl::string_view key, uint64_t bytes);

 private:
  struct RuleState {
    FaultRule rule;
    int64_t seen = 0;
    int64_t fired = 0;
  };

  std::unique_ptr<ShardStore> owned_;
  ShardStore* const base_;

  mutable absl::Mutex mu_;
  std::vector<RuleState> rules_ ABSL_GUARDED_BY(mu_);
  int64_t fail_write_at_ ABSL_GUARDED_BY(mu_) = 0;  // absolute write_count_
  absl::Status fail_write_status_ ABSL_GUARDED_BY(mu_);
  bool space_limited_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t space_left_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t crash_at_ ABSL_GUARDED_BY(mu_) = 0;  // absolute mutation_count_
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t mutation_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t write_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t read_count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_TESTING_FAULT_INJECTION_STORE_H_
