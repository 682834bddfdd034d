#include "server/coordinator/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "grpc/grpc_security.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace cairn::coordinator {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 1024;
constexpr absl::string_view kCertPrefix = "cert:";

std::array<unsigned char, 32> Sha256(absl::string_view data) {
  std::array<unsigned char, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
         digest.data());
  return digest;
}

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == '-' || c == '@' || c == ':';
}

absl::StatusOr<Role> ParseRole(absl::string_view s) {
  if (s == "reader") return Role::kReader;
  if (s == "writer") return Role::kWriter;
  if (s == "agent") return Role::kAgent;
  if (s == "admin") return Role::kAdmin;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", absl::CHexEscape(s.substr(0, 32)),
                   "' (expected reader, writer, agent or admin)"));
}

absl::Status CheckGlob(absl::string_view glob) {
  if (glob.empty() || glob.size() > 256) {
    return absl::InvalidArgumentError("job glob must be 1 to 256 characters");
  }
  for (char c : glob) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-' && c != '*' && c != '?') {
      return absl::InvalidArgumentError(absl::StrCat(
          "job glob '", absl::CHexEscape(glob),
          "' may only hold [A-Za-z0-9._-] (job name characters), * and ?"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kWriter:
      return "writer";
    case Role::kAgent:
      return "agent";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::string_view ActionName(Action action) {
  switch (action) {
    case Action::kRead:
      return "read";
    case Action::kListAgents:
      return "list_agents";
    case Action::kSave:
      return "save";
    case Action::kRegisterAgent:
      return "register_agent";
    case Action::kDelete:
      return "delete";
    case Action::kGarbageCollect:
      return "gc";
    case Action::kAbort:
      return "abort";
    case Action::kForgetAgent:
      return "forget_agent";
    case Action::kSetPolicy:
      return "set_policy";
    case Action::kPersist:
      return "persist";
  }
  return "?";
}

absl::string_view ActionPhrase(Action action) {
  switch (action) {
    case Action::kRead:
      return "read checkpoints";
    case Action::kListAgents:
      return "list agents";
    case Action::kSave:
      return "save checkpoints";
    case Action::kRegisterAgent:
      return "register agents";
    case Action::kDelete:
      return "delete checkpoints";
    case Action::kGarbageCollect:
      return "garbage-collect checkpoints";
    case Action::kAbort:
      return "abort other processes' saves";
    case Action::kForgetAgent:
      return "forget agents";
    case Action::kSetPolicy:
      return "set checkpoint policies";
    case Action::kPersist:
      return "persist checkpoints";
  }
  return "?";
}

Role RequiredRole(Action action) {
  switch (action) {
    case Action::kRead:
    case Action::kListAgents:
      return Role::kReader;
    case Action::kSave:
    case Action::kPersist:
      return Role::kWriter;
    case Action::kRegisterAgent:
      return Role::kAgent;
    case Action::kDelete:
    case Action::kGarbageCollect:
    case Action::kAbort:
    case Action::kForgetAgent:
    case Action::kSetPolicy:
      return Role::kAdmin;
  }
  return Role::kAdmin;
}

bool GlobMatch(absl::string_view glob, absl::string_view job) {
  // Greedy with backtracking to the last `*`: O(|glob| * |job|) worst case.
  size_t g = 0, j = 0;
  size_t star = absl::string_view::npos, star_j = 0;
  while (j < job.size()) {
    if (g < glob.size() && (glob[g] == '?' || glob[g] == job[j])) {
      ++g;
      ++j;
    } else if (g < glob.size() && glob[g] == '*') {
      star = g++;
      star_j = j;
    } else if (star != absl::string_view::npos) {
      g = star + 1;
      j = ++star_j;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

std::string TokenFingerprint(absl::string_view token) {
  const std::array<unsigned char, 32> d = Sha256(token);
  return absl::StrFormat("%02x%02x%02x%02x", d[0], d[1], d[2], d[3]);
}

bool Principal::Allows(Action action, absl::string_view job) const {
  const Role needed = RequiredRole(action);
  for (const Grant& g : grants) {
    if (g.role < needed) continue;
    if (job.empty() ? g.job_glob == "*" : GlobMatch(g.job_glob, job)) {
      return true;
    }
  }
  return false;
}

Role Principal::MaxRole() const {
  Role r = Role::kReader;
  for (const Grant& g : grants) r = std::max(r, g.role);
  return r;
}

absl::StatusOr<AuthTable> AuthTable::Parse(absl::string_view text,
                                           absl::string_view source) {
  AuthTable table;
  // Credential key -> (is certificate, index, line of its first grant).
  struct Seen {
    bool certificate;
    size_t index;
    int line;
    bool named;
  };
  std::map<std::string, Seen> seen;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " line ", line_no, ": ", what));
    };
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() < 3 || fields.size() > 4) {
      return error(
          absl::StrCat("expected 'CREDENTIAL ROLE JOBGLOB [NAME]', got ",
                       fields.size(), " fields"));
    }
    const absl::string_view credential = fields[0];
    absl::StatusOr<Role> role = ParseRole(fields[1]);
    if (!role.ok()) return error(role.status().message());
    if (absl::Status s = CheckGlob(fields[2]); !s.ok()) {
      return error(s.message());
    }
    std::string name;
    if (fields.size() == 4) {
      name = std::string(fields[3]);
      for (char c : name) {
        if (!IsNameChar(c)) {
          return error(absl::StrCat("name '", absl::CHexEscape(name),
                                    "' may only hold [A-Za-z0-9._@:-]"));
        }
      }
    }
    const bool certificate = absl::StartsWith(credential, kCertPrefix);
    std::string key;
    if (certificate) {
      const absl::string_view id = credential.substr(kCertPrefix.size());
      if (!(absl::StartsWith(id, "CN=") || absl::StartsWith(id, "SAN=")) ||
          id.size() == id.find('=') + 1) {
        return error(
            absl::StrCat("certificate identity '", absl::CHexEscape(credential),
                         "' must be cert:CN=<common name> or cert:SAN=<name>"));
      }
      key = std::string(credential);
    } else {
      // Never echo the token: only its length and the offending position.
      if (credential.size() < kMinTokenBytes ||
          credential.size() > kMaxTokenBytes) {
        return error(absl::StrCat("token of ", credential.size(),
                                  " characters: tokens must have ",
                                  kMinTokenBytes, " to ", kMaxTokenBytes));
      }
      for (size_t i = 0; i < credential.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(credential[i]);
        if (c < 0x21 || c > 0x7e) {
          return error(
              absl::StrCat("token has a non-printable or non-ASCII "
                           "character at position ",
                           i + 1));
        }
      }
      const std::array<unsigned char, 32> d = Sha256(credential);
      key = std::string(reinterpret_cast<const char*>(d.data()), d.size());
    }
    const Grant grant{*role, std::string(fields[2])};
    auto it = seen.find(key);
    if (it == seen.end()) {
      Principal p;
      p.name = !name.empty() ? name
               : certificate
                   ? std::string(credential)
                   : absl::StrCat("token:", TokenFingerprint(credential));
      p.grants.push_back(grant);
      size_t index;
      if (certificate) {
        index = table.certificates_.size();
        table.certificates_.push_back(
            {std::string(credential.substr(kCertPrefix.size())), std::move(p)});
      } else {
        index = table.tokens_.size();
        TokenEntry e;
        std::memcpy(e.digest.data(), key.data(), e.digest.size());
        e.principal = std::move(p);
        table.tokens_.push_back(std::move(e));
      }
      seen.emplace(std::move(key),
                   Seen{certificate, index, line_no, !name.empty()});
      continue;
    }
    Principal& p = it->second.certificate
                       ? table.certificates_[it->second.index].principal
                       : table.tokens_[it->second.index].principal;
    if (!name.empty()) {
      if (it->second.named && name != p.name) {
        return error(absl::StrCat("name '", name,
                                  "' differs from the name this credential "
                                  "has on line ",
                                  it->second.line, " ('", p.name, "')"));
      }
      p.name = name;
      it->second.named = true;
    }
    p.grants.push_back(grant);
  }
  return table;
}

absl::StatusOr<AuthTable> AuthTable::Load(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read auth token file ",
                                            path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & S_IRWXO) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "auth token file %s is accessible by other users (mode %04o): it "
        "holds secrets; chmod o-rwx it (e.g. 0600, or 0640 for a group)",
        path, st.st_mode & 07777));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read auth token file ", path));
  }
  return Parse(text.str(), path);
}

const Principal* AuthTable::FindToken(absl::string_view token) const {
  const std::array<unsigned char, 32> d = Sha256(token);
  const Principal* found = nullptr;
  // Every entry is compared whole: the time does not depend on how many
  // leading bytes of a digest match.
  for (const TokenEntry& e : tokens_) {
    const bool equal = CRYPTO_memcmp(e.digest.data(), d.data(), d.size()) == 0;
    if (equal && found == nullptr) found = &e.principal;
  }
  return found;
}

const Principal* AuthTable::FindCertificate(absl::string_view identity) const {
  for (const CertificateEntry& e : certificates_) {
    if (e.identity == identity) return &e.principal;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Create(
    std::string path) {
  absl::StatusOr<AuthTable> table = AuthTable::Load(path);
  if (!table.ok()) return table.status();
  std::unique_ptr<Authorizer> a(new Authorizer(std::move(path)));
  a->table_ = std::make_shared<const AuthTable>(*std::move(table));
  return a;
}

absl::Status Authorizer::Reload() {
  absl::StatusOr<AuthTable> table = AuthTable::Load(path_);
  if (!table.ok()) return table.status();
  auto next = std::make_shared<const AuthTable>(*std::move(table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authorizer::Authenticate(
    absl::string_view authorization_metadata,
    const grpc::AuthContext* auth_context,
    absl::string_view* failure_reason) const {
  return AuthenticateIdentities(authorization_metadata,
                                auth_context == nullptr
                                    ? std::vector<std::string>()
                                    : CertificateIdentities(*auth_context),
                                failure_reason);
}

absl::StatusOr<Caller> Authorizer::AuthenticateIdentities(
    absl::string_view authorization_metadata,
    const std::vector<std::string>& certificate_identities,
    absl::string_view* failure_reason) const {
  absl::string_view unused;
  absl::string_view& reason = failure_reason ? *failure_reason : unused;
  Caller caller;
  {
    absl::MutexLock lock(&mu_);
    caller.table = table_;
  }
  if (!authorization_metadata.empty()) {
    absl::string_view v = absl::StripAsciiWhitespace(authorization_metadata);
    constexpr absl::string_view kScheme = "bearer ";
    if (v.size() <= kScheme.size() ||
        !absl::EqualsIgnoreCase(v.substr(0, kScheme.size()), kScheme)) {
      reason = "malformed";
      return absl::UnauthenticatedError(
          "malformed credentials: the 'authorization' metadata must be "
          "'Bearer <token>'");
    }
    absl::string_view token =
        absl::StripLeadingAsciiWhitespace(v.substr(kScheme.size()));
    caller.principal = caller.table->FindToken(token);
    if (caller.principal == nullptr) {
      reason = "unknown_token";
      return absl::UnauthenticatedError(
          "unknown token (not in cairnd's --auth-tokens file)");
    }
    return caller;
  }
  for (const std::string& id : certificate_identities) {
    caller.principal = caller.table->FindCertificate(id);
    if (caller.principal != nullptr) return caller;
  }
  if (!certificate_identities.empty()) {
    reason = "unknown_certificate";
    return absl::UnauthenticatedError(absl::StrCat(
        "unknown client certificate (", certificate_identities.front(),
        ": no cert: line of cairnd's --auth-tokens file names it) and no "
        "token"));
  }
  reason = "no_credentials";
  return absl::UnauthenticatedError(
      "no credentials: cairnd requires a token (CAIRN_TOKEN, sent as "
      "'authorization: Bearer <token>') or a known client certificate");
}

std::vector<std::string> CertificateIdentities(const grpc::AuthContext& ctx) {
  std::vector<std::string> ids;
  if (!ctx.IsPeerAuthenticated()) return ids;
  for (const grpc::string_ref& cn :
       ctx.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    ids.push_back(absl::StrCat("CN=", absl::string_view(cn.data(), cn.size())));
  }
  for (const char* property :
       {GRPC_X509_SAN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME,
        GRPC_PEER_URI_PROPERTY_NAME, GRPC_PEER_EMAIL_PROPERTY_NAME,
        GRPC_PEER_IP_PROPERTY_NAME}) {
    for (const grpc::string_ref& san : ctx.FindPropertyValues(property)) {
      std::string id =
          absl::StrCat("SAN=", absl::string_view(san.data(), san.size()));
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
        ids.push_back(std::move(id));
      }
    }
  }
  return ids;
}

namespace {

// The values of property `name` of a core auth context.
std::vector<std::string> CoreProperties(const grpc_auth_context* ctx,
                                        const char* name) {
  std::vector<std::string> values;
  grpc_auth_property_iterator it =
      grpc_auth_context_find_properties_by_name(ctx, name);
  for (const grpc_auth_property* p = grpc_auth_property_iterator_next(&it);
       p != nullptr; p = grpc_auth_property_iterator_next(&it)) {
    values.emplace_back(p->value, p->value_length);
  }
  return values;
}

// grpc_auth_metadata_processor's state.
struct ProcessorState {
  const Authorizer* authorizer;
  std::string guarded_prefix;
  AuthRefusalObserver on_refused;
};

absl::string_view SliceView(const grpc_slice& s) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
      GRPC_SLICE_LENGTH(s));
}

void ProcessMetadata(void* state, grpc_auth_context* context,
                     const grpc_metadata* md, size_t num_md,
                     grpc_process_auth_metadata_done_cb cb, void* user_data) {
  const auto* st = static_cast<const ProcessorState*>(state);
  absl::string_view path;
  absl::string_view authorization;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = SliceView(md[i].key);
    if (key == ":path") {
      path = SliceView(md[i].value);
    } else if (key == "authorization") {
      authorization = SliceView(md[i].value);
    }
  }
  // Health (and reflection, where served) stay open; a call of another
  // path gRPC answers UNIMPLEMENTED without reading its message.
  if (!absl::StartsWith(path, st->guarded_prefix)) {
    cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  absl::string_view reason;
  absl::StatusOr<Caller> caller = st->authorizer->AuthenticateIdentities(
      authorization, CertificateIdentities(context), &reason);
  if (caller.ok()) {
    cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  if (st->on_refused) {
    st->on_refused(reason, absl::StripPrefix(path, "/"),
                   caller.status().message());
  }
  // gRPC copies the details before this returns.
  const std::string details(caller.status().message());
  cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
     details.c_str());
}

void DestroyProcessor(void* state) {
  delete static_cast<ProcessorState*>(state);
}

}  // namespace

std::vector<std::string> CertificateIdentities(const grpc_auth_context* ctx) {
  std::vector<std::string> ids;
  if (ctx == nullptr || !grpc_auth_context_peer_is_authenticated(ctx)) {
    return ids;
  }
  for (const std::string& cn :
       CoreProperties(ctx, GRPC_X509_CN_PROPERTY_NAME)) {
    ids.push_back(absl::StrCat("CN=", cn));
  }
  for (const char* property :
       {GRPC_X509_SAN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME,
        GRPC_PEER_URI_PROPERTY_NAME, GRPC_PEER_EMAIL_PROPERTY_NAME,
        GRPC_PEER_IP_PROPERTY_NAME}) {
    for (const std::string& san : CoreProperties(ctx, property)) {
      std::string id = absl::StrCat("SAN=", san);
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
        ids.push_back(std::move(id));
      }
    }
  }
  return ids;
}

grpc_auth_metadata_processor NewAuthMetadataProcessor(
    const Authorizer* authorizer, std::string guarded_prefix,
    AuthRefusalObserver on_refused) {
  grpc_auth_metadata_processor p;
  p.process = &ProcessMetadata;
  p.destroy = &DestroyProcessor;
  p.state = new ProcessorState{authorizer, std::move(guarded_prefix),
                               std::move(on_refused)};
  return p;
}

}  // namespace cairn::coordinator
