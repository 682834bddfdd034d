// The memory ShardStore: std::map<key, shared_ptr<const string>> under one
// mutex. Reads copy out of an immutable snapshot taken under the lock, so a
// concurrent replace never tears a read. See memory_shard_store.h.
#include "storage/memory/memory_shard_store.h"

#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "storage/store_util.h"

namespace cairn::storage {
namespace {

using Blob = std::shared_ptr<const std::string>;

struct MemoryState {
  absl::Mutex mu;
  std::map<std::string, Blob, std::less<>> objects ABSL_GUARDED_BY(mu);
};

class MemoryObjectWriter;

class MemoryShardStore : public ShardStore {
 public:
  MemoryShardStore(std::string uri, std::shared_ptr<MemoryState> state)
      : uri_(std::move(uri)), state_(std::move(state)) {}

  std::string uri() const override { return uri_; }

  bool CanRewritePrefix() const override { return true; }
  using ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key, const WriterOptions& options) override;

  absl::Status Put(absl::string_view key,
                   absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    Publish(key, std::make_shared<const std::string>(data.data(), data.size()));
    return absl::OkStatus();
  }

  absl::Status PutIfAbsent(absl::string_view key,
                           absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    auto blob = std::make_shared<const std::string>(data.data(), data.size());
    absl::MutexLock lock(&state_->mu);
    if (!state_->objects.try_emplace(std::string(key), std::move(blob))
             .second) {
      return absl::AlreadyExistsError(
          absl::StrCat("object '", key, "' already exists in ", uri_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(absl::string_view key, ByteRange range,
                              absl::Span<char> out) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    CAIRN_RETURN_IF_ERROR(internal::CheckOutBuffer(key, range, out.size()));
    CAIRN_ASSIGN_OR_RETURN(Blob blob, Get(key));
    CAIRN_RETURN_IF_ERROR(internal::CheckRange(uri_, key, range, blob->size()));
    if (range.length > 0) {
      std::memcpy(out.data(), blob->data() + range.offset, range.length);
    }
    return static_cast<size_t>(range.length);
  }

  absl::Status ReadRanges(absl::string_view key,
                          absl::Span<const ByteRange> ranges,
                          absl::Span<const absl::Span<char>> outs) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    CAIRN_RETURN_IF_ERROR(internal::CheckRangeBuffers(key, ranges, outs));
    CAIRN_ASSIGN_OR_RETURN(Blob blob, Get(key));
    for (const ByteRange& r : ranges) {
      CAIRN_RETURN_IF_ERROR(internal::CheckRange(uri_, key, r, blob->size()));
    }
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (ranges[i].length > 0) {
        std::memcpy(outs[i].data(), blob->data() + ranges[i].offset,
                    ranges[i].length);
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size(absl::string_view key) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    CAIRN_ASSIGN_OR_RETURN(Blob blob, Get(key));
    return blob->size();
  }

  absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) override {
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(prefix));
    std::vector<std::string> keys;
    absl::MutexLock lock(&state_->mu);
    for (auto it = state_->objects.lower_bound(prefix);
         it != state_->objects.end() && absl::StartsWith(it->first, prefix);
         ++it) {
      keys.push_back(it->first);
    }
    return keys;
  }

  absl::Status Delete(absl::string_view key) override {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    Blob doomed;  // freed outside the lock
    absl::MutexLock lock(&state_->mu);
    auto it = state_->objects.find(key);
    if (it == state_->objects.end()) {
      return internal::ObjectNotFound(uri_, key);
    }
    doomed = std::move(it->second);
    state_->objects.erase(it);
    return absl::OkStatus();
  }

  absl::Status DeletePrefix(absl::string_view prefix) override {
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(prefix));
    std::vector<Blob> doomed;
    absl::MutexLock lock(&state_->mu);
    auto it = state_->objects.lower_bound(prefix);
    while (it != state_->objects.end() && absl::StartsWith(it->first, prefix)) {
      doomed.push_back(std::move(it->second));
      it = state_->objects.erase(it);
    }
    return absl::OkStatus();
  }

  void Publish(absl::string_view key, Blob blob) {
    Blob old;
    absl::MutexLock lock(&state_->mu);
    auto [it, inserted] = state_->objects.try_emplace(std::string(key));
    old = std::move(it->second);
    it->second = std::move(blob);
  }

 private:
  absl::StatusOr<Blob> Get(absl::string_view key) {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->objects.find(key);
    if (it == state_->objects.end()) {
      return internal::ObjectNotFound(uri_, key);
    }
    return it->second;
  }

  // Constant after construction.
  const std::string uri_;
  const std::shared_ptr<MemoryState> state_;
};

class MemoryObjectWriter : public ObjectWriter {
 public:
  MemoryObjectWriter(MemoryShardStore* store, std::string key)
      : store_(store), key_(std::move(key)) {}

  absl::Status Append(absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(CheckOpen("Append"));
    buffer_.append(data.data(), data.size());
    written_ += data.size();
    return absl::OkStatus();
  }

  absl::Status Close() override {
    CAIRN_RETURN_IF_ERROR(CheckOpen("Close"));
    closed_ = true;
    store_->Publish(key_,
                    std::make_shared<const std::string>(std::move(buffer_)));
    buffer_ = std::string();
    return absl::OkStatus();
  }

  uint64_t bytes_written() const override { return written_; }

  absl::Status RewritePrefix(absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(CheckOpen("RewritePrefix"));
    if (data.size() > buffer_.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RewritePrefix of ", data.size(), " bytes on the writer of '", key_,
          "', which has ", buffer_.size()));
    }
    std::memcpy(buffer_.data(), data.data(), data.size());
    return absl::OkStatus();
  }

  void SimulateCrashForTest() override {
    crashed_ = true;
    buffer_ = std::string();
  }

 private:
  absl::Status CheckOpen(absl::string_view op) const {
    if (crashed_) {
      return absl::FailedPreconditionError(absl::StrCat(
          op, " on the writer of '", key_, "' after a simulated crash"));
    }
    if (closed_) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, " on the writer of '", key_, "' after Close()"));
    }
    return absl::OkStatus();
  }

  MemoryShardStore* const store_;
  const std::string key_;
  std::string buffer_;
  uint64_t written_ = 0;
  bool closed_ = false;
  bool crashed_ = false;
};

absl::StatusOr<std::unique_ptr<ObjectWriter>> MemoryShardStore::NewWriter(
    absl::string_view key, const WriterOptions& /*options*/) {
  CAIRN_RETURN_IF_ERROR(ValidateKey(key));
  return std::make_unique<MemoryObjectWriter>(this, std::string(key));
}

bool ValidStoreName(absl::string_view name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Every memory store of the process by name. Stores opened as "mem://name"
// are pinned (live until exit); private ones ("mem://" -> ".anon-N") are
// freed with their last handle.
struct NamedStores {
  absl::Mutex mu;
  std::map<std::string, std::weak_ptr<MemoryState>, std::less<>> states
      ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<MemoryState>> pinned ABSL_GUARDED_BY(mu);
  uint64_t next_anon ABSL_GUARDED_BY(mu) = 0;
};

NamedStores& GetNamedStores() {
  static NamedStores* const stores = new NamedStores;  // never destroyed
  return *stores;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardStore>> OpenMemoryShardStore(
    absl::string_view name) {
  if (!ValidStoreName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid memory store name '", name,
                     "': use mem:// or mem://name with name [A-Za-z0-9._-]+"));
  }
  NamedStores& stores = GetNamedStores();
  absl::MutexLock lock(&stores.mu);
  std::string key(name);
  if (key.empty()) {
    key = absl::StrCat(".anon-", stores.next_anon++);
  }
  std::shared_ptr<MemoryState> state = stores.states[key].lock();
  if (state == nullptr) {
    state = std::make_shared<MemoryState>();
    stores.states[key] = state;
    if (!name.empty()) stores.pinned.push_back(state);
  }
  return std::make_unique<MemoryShardStore>(absl::StrCat("mem://", key),
                                            std::move(state));
}

namespace {

// "mem://" and "mem://name"; the store options do not apply.
const ShardStoreRegistrar kMemScheme("mem", [](absl::string_view rest,
                                               const StoreOptions&) {
  return OpenMemoryShardStore(rest);
});

}  // namespace

}  // namespace cairn::storage
