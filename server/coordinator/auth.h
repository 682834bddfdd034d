// Who may call cairnd, and what they may do: bearer tokens and mTLS client
// certificates mapped to a role on the jobs matching a glob, read from the
// --auth-tokens file.
//
// The file has one grant per line, `#` comments and blank lines ignored:
//   CREDENTIAL ROLE JOBGLOB [NAME]
// CREDENTIAL is a bearer token (16 to 1024 printable ASCII characters, sent
// by clients as the gRPC metadata `authorization: Bearer <token>`), or
// `cert:CN=<name>` / `cert:SAN=<name>`: a client certificate (mTLS) whose
// subject common name / a subject alternative name (DNS, URI, email or IP)
// is <name>. ROLE is one of (each includes the ones before it):
//   reader  list, show, plan and verify loads, list agents
//   writer  + save (BeginSave, CommitSave, AbortSave of its own save)
//   agent   + register a cairn-agent (RegisterAgent)
//   admin   + delete, gc, abort anyone's save, forget an agent
// JOBGLOB selects the jobs: `*` any run of characters, `?` one character,
// anything else itself (job names are [A-Za-z0-9._-]); actions on no job
// (the agent registry) need a grant on `*`. NAME ([A-Za-z0-9._@-]) is what
// audit lines and errors call the identity; without it a token is
// `token:<first 8 hex digits of its SHA-256>` and a certificate its
// CREDENTIAL. A credential may have several lines (e.g. writer on
// `team-a-*` and reader on `*`): it may do what any of them allows.
//
// The file must not be readable or writable by others (mode o-rwx, e.g.
// 0600 or 0640): it holds secrets. Errors name the file and the line, never
// the token. Only SHA-256 digests of tokens are kept in memory, compared in
// constant time (CRYPTO_memcmp over every entry).
//
// Thread-safe: every method may be called concurrently; Reload swaps the
// table atomically for calls that start after it.
#ifndef CAIRN_SERVER_COORDINATOR_AUTH_H_
#define CAIRN_SERVER_COORDINATOR_AUTH_H_

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpc/grpc_security.h"

namespace grpc {
class AuthContext;
}  // namespace grpc

namespace cairn::coordinator {

enum class Role { kReader = 1, kWriter = 2, kAgent = 3, kAdmin = 4 };
absl::string_view RoleName(Role role);

// What a call does. Each needs a minimum role (see the file comment).
enum class Action {
  kRead,           // list, show, plan/verify a load, gc --dry-run
  kListAgents,     // no job
  kSave,           // BeginSave, CommitSave, AbortSave of the caller's save
  kRegisterAgent,  // no job
  kDelete,
  kGarbageCollect,
  kAbort,        // AbortSave without the caller's process id: anyone's save
  kForgetAgent,  // no job
  kSetPolicy,    // SetJobPolicy
  kPersist,      // PersistCheckpoint: a memory checkpoint to storage
};
absl::string_view ActionName(Action action);  // "delete", "gc", ...
// The phrase of a PERMISSION_DENIED message: "delete checkpoints".
absl::string_view ActionPhrase(Action action);
Role RequiredRole(Action action);

// True when `job` matches `glob` (`*` any run, `?` one character).
bool GlobMatch(absl::string_view glob, absl::string_view job);

// The first 8 hex digits of SHA-256(token): names a token in logs without
// revealing it.
std::string TokenFingerprint(absl::string_view token);

struct Grant {
  Role role = Role::kReader;
  std::string job_glob;
};

// A caller the table knows: its name and grants.
struct Principal {
  std::string name;
  std::vector<Grant> grants;

  // True when a grant allows `action` on `job` (empty for actions on no
  // job: only grants on `*` apply).
  bool Allows(Action action, absl::string_view job) const;
  // The highest role among the grants (for messages).
  Role MaxRole() const;
};

// The parsed file.
class AuthTable {
 public:
  // `source` names the file in errors.
  static absl::StatusOr<AuthTable> Parse(absl::string_view text,
                                         absl::string_view source);
  // Reads and parses `path`; FAILED_PRECONDITION when others may read or
  // write it.
  static absl::StatusOr<AuthTable> Load(const std::string& path);

  // The principal whose token this is, or nullptr. Compares the token's
  // digest with every token entry's, in constant time per entry.
  const Principal* FindToken(absl::string_view token) const;
  // The principal of a certificate identity ("CN=alice" or "SAN=host"), or
  // nullptr.
  const Principal* FindCertificate(absl::string_view identity) const;

  size_t num_tokens() const { return tokens_.size(); }
  size_t num_certificates() const { return certificates_.size(); }

 private:
  using Digest = std::array<unsigned char, 32>;
  struct TokenEntry {
    Digest digest;
    Principal principal;
  };
  struct CertificateEntry {
    std::string identity;  // "CN=..." or "SAN=..."
    Principal principal;
  };
  std::vector<TokenEntry> tokens_;
  std::vector<CertificateEntry> certificates_;
};

// The outcome of authenticating a call.
struct Caller {
  // Set when authenticated; shares the table it points into, so a reload
  // during the call does not free it.
  std::shared_ptr<const AuthTable> table;
  const Principal* principal = nullptr;
};

class Authorizer {
 public:
  // Loads `path` (errors as AuthTable::Load).
  static absl::StatusOr<std::unique_ptr<Authorizer>> Create(std::string path);

  // Re-reads the file. On error the table in use is kept and the error
  // (naming the file and line) is returned.
  absl::Status Reload();

  // Who is calling: the bearer token of `authorization_metadata` (the value
  // of the `authorization` header; empty when absent) or else the client
  // certificate in `auth_context` (may be null). UNAUTHENTICATED "no
  // credentials", "unknown token" or naming an unknown certificate
  // identity; the token never appears in the message. On failure
  // `*failure_reason` (when not null) is "no_credentials", "malformed",
  // "unknown_token" or "unknown_certificate" (metric labels).
  absl::StatusOr<Caller> Authenticate(
      absl::string_view authorization_metadata,
      const grpc::AuthContext* auth_context,
      absl::string_view* failure_reason = nullptr) const;
  // The same with the client certificate's identities (as
  // CertificateIdentities returns them) instead of its auth context.
  absl::StatusOr<Caller> AuthenticateIdentities(
      absl::string_view authorization_metadata,
      const std::vector<std::string>& certificate_identities,
      absl::string_view* failure_reason = nullptr) const;

  const std::string& path() const { return path_; }
  // The table in use.
  std::shared_ptr<const AuthTable> table() const {
    absl::MutexLock lock(&mu_);
    return table_;
  }

 private:
  explicit Authorizer(std::string path) : path_(std::move(path)) {}

  // Constant after construction.
  const std::string path_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const AuthTable> table_ ABSL_GUARDED_BY(mu_);
};

// The certificate identities of a TLS peer, as AuthTable::FindCertificate
// takes them: "CN=<common name>" then "SAN=<name>" per subject alternative
// name. Empty when the peer presented no certificate.
std::vector<std::string> CertificateIdentities(const grpc::AuthContext& ctx);
// The same from gRPC core's auth context (an AuthMetadataProcessor's).
std::vector<std::string> CertificateIdentities(const grpc_auth_context* ctx);

// Told of every call the processor below refuses: the failure reason (as
// Authenticate's), the method ("cairn.v1.Coordinator/ListCheckpoints") and
// the UNAUTHENTICATED message. Runs on gRPC's thread: must not block.
using AuthRefusalObserver =
    std::function<void(absl::string_view reason, absl::string_view method,
                       absl::string_view message)>;

// A core auth metadata processor (grpc_server_credentials_set_auth_metadata_
// processor) that authenticates every call whose path starts with
// `guarded_prefix` ("/cairn.v1.Coordinator/") as Authenticate does and ends
// it with UNAUTHENTICATED (the same message) when that fails. It runs on the
// call's metadata, before gRPC reads the request: a caller without
// credentials never gets its request body buffered (or even accepted by
// flow control beyond the first window). Other paths (grpc.health.v1)
// pass. The processor takes no reference to `authorizer`, which must
// outlive the server; the credentials own (and destroy) the processor.
grpc_auth_metadata_processor NewAuthMetadataProcessor(
    const Authorizer* authorizer, std::string guarded_prefix,
    AuthRefusalObserver on_refused);

}  // namespace cairn::coordinator

#endif  // CAIRN_SERVER_COORDINATOR_AUTH_H_
