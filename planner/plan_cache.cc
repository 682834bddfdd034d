#include "planner/plan_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/base/config.h"
#include "absl/hash/hash.h"
#include "common/little_endian.h"

// XXH3 compiled in from the header (libxxhash-dev): nothing to link.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace cairn::planner {
namespace {

// ---- A stable 128-bit hash (MurmurHash3 x64-128 construction). ----

inline uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

void Hash128(absl::string_view data, uint64_t* out_h1, uint64_t* out_h2) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const size_t len = data.size();
  const size_t nblocks = len / 16;
  uint64_t h1 = 0, h2 = 0;  // seed 0
  constexpr uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr uint64_t c2 = 0x4cf5ad432745937fULL;
  for (size_t i = 0; i < nblocks; ++i) {
    uint64_t k1 = little_endian::Load64(p + i * 16);
    uint64_t k2 = little_endian::Load64(p + i * 16 + 8);
    k1 *= c1;
    k1 = Rotl64(k1, 31);
    k1 *= c2;
    h1 ^= k1;
    h1 = Rotl64(h1, 27);
    h1 += h2;
    h1 = h1 * 5 + 0x52dce729;
    k2 *= c2;
    k2 = Rotl64(k2, 33);
    k2 *= c1;
    h2 ^= k2;
    h2 = Rotl64(h2, 31);
    h2 += h1;
    h2 = h2 * 5 + 0x38495ab5;
  }
  const unsigned char* tail = p + nblocks * 16;
  uint64_t k1 = 0, k2 = 0;
  const size_t rem = len & 15;
  for (size_t i = rem; i > 8; --i) k2 = (k2 << 8) | tail[i - 1];
  if (rem > 8) {
    k2 *= c2;
    k2 = Rotl64(k2, 33);
    k2 *= c1;
    h2 ^= k2;
  }
  for (size_t i = std::min<size_t>(rem, 8); i > 0; --i) {
    k1 = (k1 << 8) | tail[i - 1];
  }
  if (rem > 0) {
    k1 *= c1;
    k1 = Rotl64(k1, 31);
    k1 *= c2;
    h1 ^= k1;
  }
  h1 ^= static_cast<uint64_t>(len);
  h2 ^= static_cast<uint64_t>(len);
  h1 += h2;
  h2 += h1;
  h1 = Fmix64(h1);
  h2 = Fmix64(h2);
  h1 += h2;
  h2 += h1;
  *out_h1 = h1;
  *out_h2 = h2;
}

void AppendHex64(uint64_t v, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int shift = 60; shift >= 0; shift -= 4) {
    out->push_back(kDigits[(v >> shift) & 0xf]);
  }
}

// ---- Canonical encoding of write items. ----

// Every field, fixed-width or length-prefixed: distinct items never share an
// encoding, and an encoding never is a prefix of another item's.
std::string EncodeItem(const WriteItem& item) {
  StableKey out;
  out.Reserve(48 + item.fqn.size() +
              8 * (item.global_shape.size() + 2 * item.box.offsets.size()));
  out.PutU64(static_cast<uint64_t>(item.kind));
  out.PutString(item.fqn);
  out.PutU64(static_cast<uint64_t>(item.dtype));
  out.PutInts(item.global_shape);
  out.PutInts(item.box.offsets);
  out.PutInts(item.box.sizes);
  out.PutU64(item.length);
  return out.Take();
}

size_t KeyBytes(const PlanCache::Key& key) {
  size_t n = sizeof(PlanCache::Key) + key.job.size() +
             key.storage_settings.size() +
             key.fingerprints.size() * sizeof(std::string);
  for (const std::string& f : key.fingerprints) n += f.size();
  return n;
}

}  // namespace

void StableKey::PutU64(uint64_t v) { little_endian::Append64(&bytes_, v); }

void StableKey::PutString(absl::string_view s) {
  PutU64(s.size());
  bytes_.append(s.data(), s.size());
}

void StableKey::PutInts(absl::Span<const int64_t> values) {
  PutU64(values.size());
#ifdef ABSL_IS_LITTLE_ENDIAN
  bytes_.append(reinterpret_cast<const char*>(values.data()),
                sizeof(int64_t) * values.size());
#else
  for (int64_t v : values) PutInt(v);
#endif
}

std::string StableHash128Hex(absl::string_view data) {
  uint64_t h1, h2;
  Hash128(data, &h1, &h2);
  std::string out;
  out.reserve(32);
  AppendHex64(h1, &out);
  AppendHex64(h2, &out);
  return out;
}

namespace {

XXH3_state_t* State(unsigned char* bytes) {
  return reinterpret_cast<XXH3_state_t*>(bytes);
}

std::string Hex128(XXH128_hash_t h) {
  std::string out;
  out.reserve(32);
  AppendHex64(h.high64, &out);
  AppendHex64(h.low64, &out);
  return out;
}

}  // namespace

StreamedKeyHash::StreamedKeyHash() {
  static_assert(sizeof(XXH3_state_t) <= sizeof(state_) &&
                alignof(XXH3_state_t) <= 64);
  new (state_) XXH3_state_t;
  XXH3_128bits_reset(State(state_));
}

void StreamedKeyHash::Update(const void* data, size_t n) {
  XXH3_128bits_update(State(state_), data, n);
}

void StreamedKeyHash::PutU64(uint64_t v) {
  char b[8];
  little_endian::Store64(b, v);
  Update(b, 8);
}

void StreamedKeyHash::PutString(absl::string_view s) {
  PutU64(s.size());
  Update(s.data(), s.size());
}

void StreamedKeyHash::PutInts(absl::Span<const int64_t> values) {
  PutU64(values.size());
#ifdef ABSL_IS_LITTLE_ENDIAN
  Update(values.data(), sizeof(int64_t) * values.size());
#else
  for (int64_t v : values) PutInt(v);
#endif
}

std::string StreamedKeyHash::Hex() const {
  return Hex128(
      XXH3_128bits_digest(reinterpret_cast<const XXH3_state_t*>(state_)));
}

std::string StreamedKeyHashOf(absl::string_view data) {
  return Hex128(XXH3_128bits(data.data(), data.size()));
}

std::string FingerprintLocalPlan(const LocalSavePlan& plan) {
  std::vector<std::string> encoded;
  encoded.reserve(plan.items.size());
  size_t total = 8;
  for (const WriteItem& item : plan.items) {
    encoded.push_back(EncodeItem(item));
    total += encoded.back().size();
  }
  std::sort(encoded.begin(), encoded.end());
  StableKey canonical;
  canonical.Reserve(total);
  canonical.PutU64(encoded.size());
  for (const std::string& e : encoded) canonical.Append(e);
  return StableHash128Hex(canonical.bytes());
}

std::string PlanId(const PlanCache::Key& key, absl::string_view planner_build) {
  StableKey canonical;
  size_t total =
      64 + planner_build.size() + key.job.size() + key.storage_settings.size();
  for (const std::string& f : key.fingerprints) total += 8 + f.size();
  canonical.Reserve(total);
  canonical.PutString("cairn global save plan id v1");
  canonical.PutString(planner_build);
  canonical.PutString(key.job);
  canonical.PutU64(static_cast<uint64_t>(key.world_size));
  canonical.PutString(key.storage_settings);
  canonical.PutU64(key.fingerprints.size());
  for (const std::string& f : key.fingerprints) canonical.PutString(f);
  return StableHash128Hex(canonical.bytes());
}

size_t ApproximatePlanBytes(const GlobalSavePlan& plan) {
  size_t n = sizeof(GlobalSavePlan) +
             plan.ranks.capacity() * sizeof(RankSavePlan) +
             plan.entries.capacity() * sizeof(PlannedEntry);
  for (const RankSavePlan& r : plan.ranks) {
    n += r.writes.capacity() * sizeof(PlannedWrite) +
         r.coords.capacity() * sizeof(int64_t) + r.object_key.capacity();
  }
  for (const PlannedEntry& e : plan.entries) {
    n += e.fqn.capacity() + 8 * e.global_shape.capacity();
  }
  return n;
}

size_t PlanCache::KeyPtrHash::operator()(const Key* key) const {
  if (constant) return 0;
  return absl::HashOf(key->job, key->world_size, key->fingerprints,
                      key->storage_settings);
}

PlanCache::PlanCache(size_t max_bytes) : PlanCache(max_bytes, false) {}

PlanCache::PlanCache(size_t max_bytes, bool colliding_hashes)
    : max_bytes_(max_bytes),
      index_(/*bucket_count=*/16, KeyPtrHash{colliding_hashes}) {}

std::unique_ptr<PlanCache> PlanCache::NewWithCollidingHashesForTest(
    size_t max_bytes) {
  return std::unique_ptr<PlanCache>(new PlanCache(max_bytes, true));
}

std::shared_ptr<const GlobalSavePlan> PlanCache::Lookup(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(&key);  // full-key equality (KeyPtrEq)
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->plan;
}

size_t PlanCache::Insert(const Key& key,
                         std::shared_ptr<const GlobalSavePlan> plan) {
  if (plan == nullptr) return 0;
  const size_t charge = KeyBytes(key) + ApproximatePlanBytes(*plan);
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(&key); it != index_.end()) {
    // Erase the index entry before the list node its key pointer refers to.
    const LruList::iterator node = it->second;
    index_.erase(it);
    bytes_ -= node->charge;
    lru_.erase(node);
  }
  if (charge > max_bytes_) return charge;
  lru_.push_front(Entry{key, std::move(plan), charge});
  index_.emplace(&lru_.front().key, lru_.begin());
  bytes_ += charge;
  EvictLocked();
  return 0;
}

void PlanCache::EraseJob(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->key.job == job) {
      index_.erase(&it->key);  // before the node (and its key) goes
      bytes_ -= it->charge;
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

void PlanCache::EvictLocked() {
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    Entry& victim = lru_.back();
    index_.erase(&victim.key);
    bytes_ -= victim.charge;
    lru_.pop_back();
  }
}

size_t PlanCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

size_t PlanCache::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace cairn::planner
