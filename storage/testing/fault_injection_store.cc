#include "storage/testing/fault_injection_store.h"

namespace cairn::storage {

FaultInjectionStore::FaultInjectionStore(ShardStore* base) : base_(base) {}
FaultInjectionStore::FaultInjectionStore(std::unique_ptr<ShardStore> base)
    : owned_(std::move(base)), base_(owned_.get()) {}
FaultInjectionStore::~FaultInjectionStore() = default;
int FaultInjectionStore::AddRule(FaultRule) { return 0; }
int64_t FaultInjectionStore::fired(int) const { return 0; }
void FaultInjectionStore::Reset() {}
void FaultInjectionStore::FailNthWrite(int64_t, absl::Status) {}
void FaultInjectionStore::SetSpaceLimit(uint64_t) {}
void FaultInjectionStore::CrashAtMutation(int64_t) {}
bool FaultInjectionStore::crashed() const { return false; }
int64_t FaultInjectionStore::mutation_count() const { return 0; }
int64_t FaultInjectionStore::write_count() const { return 0; }
int64_t FaultInjectionStore::read_count() const { return 0; }
uint64_t FaultInjectionStore::bytes_written() const { return 0; }
std::string FaultInjectionStore::uri() const { return base_->uri(); }
absl::StatusOr<std::unique_ptr<ObjectWriter>> FaultInjectionStore::NewWriter(
    absl::string_view key) {
  return base_->NewWriter(key);
}
absl::Status FaultInjectionStore::Put(absl::string_view key,
                                      absl::Span<const char> data) {
  return base_->Put(key, data);
}
absl::StatusOr<size_t> FaultInjectionStore::Read(absl::string_view key,
                                                 ByteRange range,
                                                 absl::Span<char> out) {
  return base_->Read(key, range, out);
}
absl::Status FaultInjectionStore::ReadRanges(
    absl::string_view key, absl::Span<const ByteRange> ranges,
    absl::Span<const absl::Span<char>> outs) {
  return base_->ReadRanges(key, ranges, outs);
}
absl::StatusOr<uint64_t> FaultInjectionStore::Size(absl::string_view key) {
  return base_->Size(key);
}
absl::StatusOr<std::vector<std::string>> FaultInjectionStore::List(
    absl::string_view prefix) {
  return base_->List(prefix);
}
absl::StatusOr<std::vector<std::string>> FaultInjectionStore::ListChildren(
    absl::string_view dir_prefix) {
  return base_->ListChildren(dir_prefix);
}
absl::Status FaultInjectionStore::Delete(absl::string_view key) {
  return base_->Delete(key);
}
absl::Status FaultInjectionStore::DeletePrefix(absl::string_view prefix) {
  return base_->DeletePrefix(prefix);
}
FaultInjectionStore::Decision FaultInjectionStore::Decide(FaultOp,
                                                          absl::string_view,
                                                          uint64_t) {
  return {};
}

}  // namespace cairn::storage
