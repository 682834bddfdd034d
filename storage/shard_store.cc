// ShardStore helpers shared by every backend: key validation, the URI-scheme
// registry (drivers add themselves; nothing here knows a scheme) and the
// default ListChildren.
//
// Key rules exist to keep every backend's objects inside its root: a key is a
// relative path of non-empty segments that are neither "." nor "..", so
// joining it under a root can never climb out of the root.
#include "storage/shard_store.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace cairn::storage {
namespace {

constexpr absl::string_view kTempSegmentPrefix = ".cairn-tmp";

// Printable form of a key for error messages (NULs and control bytes
// escaped, long keys cut).
std::string Quote(absl::string_view key) {
  std::string out = "'";
  size_t n = 0;
  for (char c : key) {
    if (++n > 200) {
      absl::StrAppend(&out, "...(", key.size(), " bytes)");
      break;
    }
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

absl::Status CheckSegment(absl::string_view segment, absl::string_view what,
                          absl::string_view full) {
  if (segment.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " ", Quote(full),
                     ": empty path segment (leading, trailing or double '/')"));
  }
  if (segment == "." || segment == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid ", what, " ", Quote(full), ": '", segment, "' segment"));
  }
  if (absl::StartsWith(segment, kTempSegmentPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " ", Quote(full), ": segment '", segment,
                     "' uses the reserved prefix '", kTempSegmentPrefix, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckCommon(absl::string_view s, absl::string_view what) {
  if (s.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " ", Quote(s), ": ", s.size(),
                     " bytes, more than ", kMaxKeyBytes));
  }
  if (s.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " ", Quote(s), ": contains NUL"));
  }
  if (absl::StartsWith(s, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid ", what, " ", Quote(s), ": absolute (leading '/')"));
  }
  return absl::OkStatus();
}

struct Registry {
  absl::Mutex mu;
  std::map<std::string, ShardStoreFactory, std::less<>> factories
      ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* const registry = new Registry;  // never destroyed
  return *registry;
}

}  // namespace

absl::Status ValidateKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("invalid key '': empty");
  CAIRN_RETURN_IF_ERROR(CheckCommon(key, "key"));
  for (absl::string_view segment : absl::StrSplit(key, '/')) {
    CAIRN_RETURN_IF_ERROR(CheckSegment(segment, "key", key));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefix(absl::string_view prefix) {
  if (prefix.empty()) return absl::OkStatus();
  CAIRN_RETURN_IF_ERROR(CheckCommon(prefix, "prefix"));
  std::vector<absl::string_view> segments = absl::StrSplit(prefix, '/');
  // Every segment but the last is complete; the last one is a partial name
  // (possibly empty when the prefix ends in '/'). A partial "." or ".." can
  // still begin a valid segment ("..a"), so only complete ones are checked.
  for (size_t i = 0; i + 1 < segments.size(); ++i) {
    CAIRN_RETURN_IF_ERROR(CheckSegment(segments[i], "prefix", prefix));
  }
  return absl::OkStatus();
}

absl::Status ObjectWriter::RewritePrefix(absl::Span<const char> data) {
  return absl::FailedPreconditionError(absl::StrCat(
      "this writer cannot rewrite the first ", data.size(),
      " bytes it wrote (its store's CanRewritePrefix() is false)"));
}

absl::Status ShardStore::PutIfAbsent(absl::string_view key,
                                     absl::Span<const char> data) {
  CAIRN_RETURN_IF_ERROR(ValidateKey(key));
  return absl::UnimplementedError(
      absl::StrCat("store ", uri(), " cannot create '", key, "' (", data.size(),
                   " bytes) only if absent"));
}

absl::Status ShardStore::DeleteAbandonedWrites(absl::string_view dir_prefix) {
  if (!dir_prefix.empty() && !absl::EndsWith(dir_prefix, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeleteAbandonedWrites: prefix ", Quote(dir_prefix),
                     " must be empty or end in '/'"));
  }
  return ValidatePrefix(dir_prefix);
}

absl::StatusOr<std::vector<std::string>> ShardStore::ListChildren(
    absl::string_view dir_prefix) {
  if (!dir_prefix.empty() && !absl::EndsWith(dir_prefix, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListChildren: prefix ", Quote(dir_prefix),
                     " must be empty or end in '/'"));
  }
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> keys, List(dir_prefix));
  std::vector<std::string> children;
  for (const std::string& key : keys) {
    absl::string_view rest = absl::string_view(key).substr(dir_prefix.size());
    const size_t slash = rest.find('/');
    std::string child(
        slash == absl::string_view::npos ? rest : rest.substr(0, slash + 1));
    if (children.empty() || children.back() != child) {
      children.push_back(std::move(child));
    }
  }
  // "a" (an object) and "a/" (a subtree) may interleave with "a-b"; sort.
  std::sort(children.begin(), children.end());
  children.erase(std::unique(children.begin(), children.end()), children.end());
  return children;
}

void RegisterShardStoreScheme(absl::string_view scheme,
                              ShardStoreFactory factory) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.factories[std::string(scheme)] = std::move(factory);
}

std::vector<std::string> RegisteredShardStoreSchemes() {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> schemes;
  for (const auto& [scheme, factory] : registry.factories) {
    schemes.push_back(scheme);
  }
  return schemes;  // sorted: the map is
}

absl::StatusOr<std::unique_ptr<ShardStore>> OpenShardStore(
    absl::string_view uri, const StoreOptions& options) {
  if (options.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store '", uri, "': io_threads must be >= 1, got ",
                     options.io_threads));
  }
  absl::string_view scheme;
  absl::string_view rest;
  if (absl::StartsWith(uri, "/")) {
    scheme = "file";  // a bare absolute path
    rest = uri;
  } else {
    const size_t sep = uri.find("://");
    if (sep == absl::string_view::npos || sep == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed store URI '", uri,
          "': expected scheme://..., e.g. file:///data/ckpt or mem://"));
    }
    scheme = uri.substr(0, sep);
    rest = uri.substr(sep + 3);
  }
  ShardStoreFactory factory;
  std::vector<std::string> registered;
  {
    Registry& registry = GetRegistry();
    absl::MutexLock lock(&registry.mu);
    auto it = registry.factories.find(scheme);
    if (it != registry.factories.end()) {
      factory = it->second;
    } else {
      for (const auto& entry : registry.factories) {
        registered.push_back(entry.first);
      }
    }
  }
  if (factory) return factory(rest, options);
  return absl::InvalidArgumentError(absl::StrCat(
      "store URI '", uri, "': unsupported scheme '", scheme, "' (registered: ",
      registered.empty() ? "none, no storage driver is linked"
                         : absl::StrJoin(registered, ", "),
      ")"));
}

absl::StatusOr<std::string> ReadObject(ShardStore& store, absl::string_view key,
                                       uint64_t max_bytes) {
  CAIRN_ASSIGN_OR_RETURN(uint64_t size, store.Size(key));
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("object '", key, "' in ", store.uri(), " is ", size,
                     " bytes, more than the limit of ", max_bytes));
  }
  std::string out(size, '\0');
  CAIRN_ASSIGN_OR_RETURN(size_t n,
                         store.Read(key, ByteRange{0, size},
                                    absl::Span<char>(out.data(), out.size())));
  out.resize(n);
  return out;
}

}  // namespace cairn::storage
