// FaultInjectionStore: every call first asks Decide() what to do (under one
// mutex: counters, crash point, write failure, space budget, rules in
// order), then forwards to the base store, or fakes the fault on top of it.
// Writers are wrapped so Append/Close go through Decide() too; a failed
// wrapped writer drops its base writer, which aborts it (nothing visible),
// while a "crash" calls SimulateCrashForTest() so the base leaves what a
// dead process would leave.
#include "storage/testing/fault_injection_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cairn::storage {
namespace {

bool IsMutation(FaultOp op) {
  return op == kFaultAppend || op == kFaultClose || op == kFaultPut ||
         op == kFaultDelete;
}
bool IsWrite(FaultOp op) {
  return op == kFaultAppend || op == kFaultClose || op == kFaultPut;
}

const char* OpName(FaultOp op) {
  switch (op) {
    case kFaultNewWriter:
      return "NewWriter";
    case kFaultAppend:
      return "Append";
    case kFaultClose:
      return "Close";
    case kFaultPut:
      return "Put";
    case kFaultRead:
      return "Read";
    case kFaultSize:
      return "Size";
    case kFaultList:
      return "List";
    case kFaultDelete:
      return "Delete";
    default:
      return "op";
  }
}

void FlipBit(absl::Span<char> data) {
  if (data.empty()) return;
  data[data.size() / 2] ^= 1;
}

using Decision = FaultInjectionStore::Decision;

class FaultObjectWriter : public ObjectWriter {
 public:
  FaultObjectWriter(FaultInjectionStore* store, std::string key,
                    std::unique_ptr<ObjectWriter> base)
      : store_(store), key_(std::move(key)), base_(std::move(base)) {}

  absl::Status Append(absl::Span<const char> data) override {
    if (!status_.ok()) return status_;
    if (base_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("Append to the writer of '", key_, "' after Close()"));
    }
    const Decision d = store_->Decide(kFaultAppend, key_, data.size());
    switch (d.kind) {
      case Decision::kPass: {
        absl::Status s = base_->Append(data);
        if (!s.ok()) return Die(s, /*crash=*/false);
        written_ += data.size();
        return absl::OkStatus();
      }
      case Decision::kSilentShortWrite: {
        absl::Status s = base_->Append(data.subspan(0, data.size() / 2));
        if (!s.ok()) return Die(s, /*crash=*/false);
        written_ += data.size();  // the lie
        return absl::OkStatus();
      }
      case Decision::kShortWrite:
        base_->Append(data.subspan(0, data.size() / 2)).IgnoreError();
        return Die(d.status, /*crash=*/false);
      default:
        return DieBy(d);
    }
  }

  absl::Status Close() override {
    if (!status_.ok()) return status_;
    if (base_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("Close of the writer of '", key_, "' called twice"));
    }
    const Decision d = store_->Decide(kFaultClose, key_, 0);
    switch (d.kind) {
      case Decision::kPass:
      case Decision::kSilentShortWrite:
      case Decision::kCorruptRead: {
        absl::Status s = base_->Close();
        if (!s.ok()) return Die(s, /*crash=*/false);
        base_.reset();
        return absl::OkStatus();
      }
      default:
        return DieBy(d);
    }
  }

  uint64_t bytes_written() const override { return written_; }

  // A write like Append (the same rules and counters; it adds no bytes).
  absl::Status RewritePrefix(absl::Span<const char> data) override {
    if (!status_.ok()) return status_;
    if (base_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RewritePrefix on the writer of '", key_, "' after Close()"));
    }
    const Decision d = store_->Decide(kFaultAppend, key_, 0);
    switch (d.kind) {
      case Decision::kPass:
      case Decision::kSilentShortWrite:  // the lie: half of it rewritten
        // The base's own errors are its own (a prefix longer than what was
        // written is refused; the writer lives on).
        return base_->RewritePrefix(d.kind == Decision::kPass
                                        ? data
                                        : data.subspan(0, data.size() / 2));
      case Decision::kShortWrite:
        base_->RewritePrefix(data.subspan(0, data.size() / 2)).IgnoreError();
        return Die(d.status, /*crash=*/false);
      default:
        return DieBy(d);
    }
  }

  void SimulateCrashForTest() override {
    if (base_ != nullptr) base_->SimulateCrashForTest();
    base_.reset();
    if (status_.ok()) {
      status_ = absl::FailedPreconditionError(
          absl::StrCat("writer of '", key_, "' after a simulated crash"));
    }
  }

 private:
  // Die of a decision that is not a pass.
  absl::Status DieBy(const Decision& d) {
    return Die(d.status, /*crash=*/d.kind == Decision::kCrash ||
                             d.kind == Decision::kCrashBeforeRename);
  }

  // The writer is dead from now on: a crash leaves the base's leftovers,
  // anything else aborts the base writer.
  absl::Status Die(absl::Status s, bool crash) {
    if (base_ != nullptr && crash) base_->SimulateCrashForTest();
    base_.reset();
    status_ = s;
    return s;
  }

  FaultInjectionStore* const store_;
  const std::string key_;
  std::unique_ptr<ObjectWriter> base_;
  uint64_t written_ = 0;
  absl::Status status_;
};

}  // namespace

FaultInjectionStore::FaultInjectionStore(ShardStore* base) : base_(base) {}

FaultInjectionStore::FaultInjectionStore(std::unique_ptr<ShardStore> base)
    : owned_(std::move(base)), base_(owned_.get()) {}

FaultInjectionStore::~FaultInjectionStore() = default;

int FaultInjectionStore::AddRule(FaultRule rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back(RuleState{std::move(rule)});
  return static_cast<int>(rules_.size()) - 1;
}

int64_t FaultInjectionStore::fired(int id) const {
  absl::MutexLock lock(&mu_);
  if (id < 0 || id >= static_cast<int>(rules_.size())) return 0;
  return rules_[id].fired;
}

void FaultInjectionStore::Reset() {
  absl::MutexLock lock(&mu_);
  rules_.clear();
  fail_write_at_ = 0;
  space_limited_ = false;
  crash_at_ = 0;
  crashed_ = false;
}

void FaultInjectionStore::FailNthWrite(int64_t n, absl::Status status) {
  absl::MutexLock lock(&mu_);
  fail_write_at_ = n > 0 ? write_count_ + n : 0;
  fail_write_status_ = std::move(status);
}

void FaultInjectionStore::SetSpaceLimit(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  space_limited_ = true;
  space_left_ = bytes;
}

void FaultInjectionStore::CrashAtMutation(int64_t n) {
  absl::MutexLock lock(&mu_);
  crash_at_ = n > 0 ? mutation_count_ + n : 0;
}

bool FaultInjectionStore::crashed() const {
  absl::MutexLock lock(&mu_);
  return crashed_;
}

int64_t FaultInjectionStore::mutation_count() const {
  absl::MutexLock lock(&mu_);
  return mutation_count_;
}

int64_t FaultInjectionStore::write_count() const {
  absl::MutexLock lock(&mu_);
  return write_count_;
}

int64_t FaultInjectionStore::read_count() const {
  absl::MutexLock lock(&mu_);
  return read_count_;
}

uint64_t FaultInjectionStore::bytes_written() const {
  absl::MutexLock lock(&mu_);
  return bytes_written_;
}

FaultInjectionStore::Decision FaultInjectionStore::Decide(FaultOp op,
                                                          absl::string_view key,
                                                          uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (crashed_) {
    return {Decision::kFail,
            absl::UnavailableError(absl::StrCat(
                "store ", base_->uri(), " is down after a simulated crash (",
                OpName(op), " of '", key, "')"))};
  }
  if (IsMutation(op)) {
    ++mutation_count_;
    if (crash_at_ > 0 && mutation_count_ == crash_at_) {
      crashed_ = true;
      crash_at_ = 0;
      return {Decision::kCrash, absl::UnavailableError(absl::StrCat(
                                    "simulated crash during ", OpName(op),
                                    " of '", key, "' in ", base_->uri()))};
    }
  }
  if (IsWrite(op)) {
    ++write_count_;
    if (fail_write_at_ > 0 && write_count_ == fail_write_at_) {
      fail_write_at_ = 0;
      return {Decision::kFail,
              absl::Status(fail_write_status_.code(),
                           absl::StrCat(fail_write_status_.message(), " (",
                                        OpName(op), " of '", key, "')"))};
    }
  }
  if (op == kFaultRead) ++read_count_;
  for (RuleState& r : rules_) {
    if ((r.rule.ops & op) == 0) continue;
    if (!r.rule.key_contains.empty() &&
        !absl::StrContains(key, r.rule.key_contains)) {
      continue;
    }
    ++r.seen;
    if (r.seen <= r.rule.skip) continue;
    if (r.rule.count >= 0 && r.fired >= r.rule.count) continue;
    ++r.fired;
    Decision d;
    d.status = r.rule.status.ok() ? absl::UnavailableError("injected fault")
                                  : r.rule.status;
    d.status = absl::Status(
        d.status.code(),
        absl::StrCat(d.status.message(), " (", OpName(op), " of '", key, "')"));
    switch (r.rule.action) {
      case FaultAction::kFail:
        d.kind = Decision::kFail;
        break;
      case FaultAction::kShortWrite:
        d.kind = (op == kFaultAppend || op == kFaultPut) ? Decision::kShortWrite
                                                         : Decision::kFail;
        break;
      case FaultAction::kSilentShortWrite:
        d.kind = (op == kFaultAppend || op == kFaultPut)
                     ? Decision::kSilentShortWrite
                     : Decision::kPass;
        break;
      case FaultAction::kCrashBeforeRename:
        d.kind = (op == kFaultClose || op == kFaultPut)
                     ? Decision::kCrashBeforeRename
                     : Decision::kFail;
        break;
      case FaultAction::kCorruptRead:
        d.kind = op == kFaultRead ? Decision::kCorruptRead : Decision::kPass;
        break;
    }
    return d;
  }
  if (IsWrite(op) && bytes > 0 && space_limited_) {
    if (bytes > space_left_) {
      space_left_ = 0;
      return {Decision::kNoSpace,
              absl::ResourceExhaustedError(absl::StrCat(
                  "No space left on device (injected): ", OpName(op), " of ",
                  bytes, " bytes to '", key, "' in ", base_->uri()))};
    }
    space_left_ -= bytes;
  }
  if (IsWrite(op)) bytes_written_ += bytes;
  return {};
}

std::string FaultInjectionStore::uri() const { return base_->uri(); }

absl::StatusOr<std::unique_ptr<ObjectWriter>> FaultInjectionStore::NewWriter(
    absl::string_view key, const WriterOptions& options) {
  const Decision d = Decide(kFaultNewWriter, key, 0);
  if (d.kind != Decision::kPass) return d.status;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> base =
      base_->NewWriter(key, options);
  if (!base.ok()) return base.status();
  return std::unique_ptr<ObjectWriter>(
      new FaultObjectWriter(this, std::string(key), std::move(base).value()));
}

absl::Status FaultInjectionStore::Put(absl::string_view key,
                                      absl::Span<const char> data) {
  const Decision d = Decide(kFaultPut, key, data.size());
  switch (d.kind) {
    case Decision::kPass:
    case Decision::kCorruptRead:
      return base_->Put(key, data);
    case Decision::kSilentShortWrite:
      return base_->Put(key, data.subspan(0, data.size() / 2));
    case Decision::kShortWrite: {
      absl::StatusOr<std::unique_ptr<ObjectWriter>> w = base_->NewWriter(key);
      if (w.ok()) (*w)->Append(data.subspan(0, data.size() / 2)).IgnoreError();
      return d.status;  // the writer is dropped: aborted, nothing visible
    }
    case Decision::kCrash:
    case Decision::kCrashBeforeRename: {
      absl::StatusOr<std::unique_ptr<ObjectWriter>> w = base_->NewWriter(key);
      if (w.ok()) {
        (*w)->Append(data).IgnoreError();
        (*w)->SimulateCrashForTest();
      }
      return d.status;
    }
    default:
      return d.status;
  }
}

// Faulted as a Put (kFaultPut rules match it).
absl::Status FaultInjectionStore::PutIfAbsent(absl::string_view key,
                                              absl::Span<const char> data) {
  const Decision d = Decide(kFaultPut, key, data.size());
  switch (d.kind) {
    case Decision::kPass:
    case Decision::kCorruptRead:
      return base_->PutIfAbsent(key, data);
    case Decision::kSilentShortWrite:
      return base_->PutIfAbsent(key, data.subspan(0, data.size() / 2));
    case Decision::kShortWrite: {
      absl::StatusOr<std::unique_ptr<ObjectWriter>> w = base_->NewWriter(key);
      if (w.ok()) (*w)->Append(data.subspan(0, data.size() / 2)).IgnoreError();
      return d.status;  // the writer is dropped: aborted, nothing visible
    }
    case Decision::kCrash:
    case Decision::kCrashBeforeRename: {
      absl::StatusOr<std::unique_ptr<ObjectWriter>> w = base_->NewWriter(key);
      if (w.ok()) {
        (*w)->Append(data).IgnoreError();
        (*w)->SimulateCrashForTest();
      }
      return d.status;
    }
    default:
      return d.status;
  }
}

absl::StatusOr<size_t> FaultInjectionStore::Read(absl::string_view key,
                                                 ByteRange range,
                                                 absl::Span<char> out) {
  const Decision d = Decide(kFaultRead, key, 0);
  if (d.kind != Decision::kPass && d.kind != Decision::kCorruptRead) {
    return d.status;
  }
  absl::StatusOr<size_t> n = base_->Read(key, range, out);
  if (n.ok() && d.kind == Decision::kCorruptRead) FlipBit(out.subspan(0, *n));
  return n;
}

absl::Status FaultInjectionStore::ReadRanges(
    absl::string_view key, absl::Span<const ByteRange> ranges,
    absl::Span<const absl::Span<char>> outs) {
  const Decision d = Decide(kFaultRead, key, 0);
  if (d.kind != Decision::kPass && d.kind != Decision::kCorruptRead) {
    return d.status;
  }
  absl::Status s = base_->ReadRanges(key, ranges, outs);
  if (s.ok() && d.kind == Decision::kCorruptRead) {
    for (const absl::Span<char>& out : outs) {
      if (!out.empty()) {
        FlipBit(out);
        break;
      }
    }
  }
  return s;
}

absl::StatusOr<uint64_t> FaultInjectionStore::Size(absl::string_view key) {
  const Decision d = Decide(kFaultSize, key, 0);
  if (d.kind == Decision::kFail || d.kind == Decision::kCrash) return d.status;
  return base_->Size(key);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionStore::List(
    absl::string_view prefix) {
  const Decision d = Decide(kFaultList, prefix, 0);
  if (d.kind == Decision::kFail || d.kind == Decision::kCrash) return d.status;
  return base_->List(prefix);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionStore::ListChildren(
    absl::string_view dir_prefix) {
  const Decision d = Decide(kFaultList, dir_prefix, 0);
  if (d.kind == Decision::kFail || d.kind == Decision::kCrash) return d.status;
  return base_->ListChildren(dir_prefix);
}

absl::Status FaultInjectionStore::Delete(absl::string_view key) {
  const Decision d = Decide(kFaultDelete, key, 0);
  if (d.kind == Decision::kFail || d.kind == Decision::kCrash) return d.status;
  return base_->Delete(key);
}

absl::Status FaultInjectionStore::DeletePrefix(absl::string_view prefix) {
  const Decision d = Decide(kFaultDelete, prefix, 0);
  if (d.kind == Decision::kFail || d.kind == Decision::kCrash) return d.status;
  return base_->DeletePrefix(prefix);
}

absl::Status FaultInjectionStore::DeleteAbandonedWrites(
    absl::string_view dir_prefix) {
  const Decision d = Decide(kFaultDelete, dir_prefix, 0);
  if (d.kind == Decision::kFail || d.kind == Decision::kCrash) return d.status;
  return base_->DeleteAbandonedWrites(dir_prefix);
}

}  // namespace cairn::storage
