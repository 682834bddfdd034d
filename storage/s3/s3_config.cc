// ParseS3Uri: s3:// URI + AWS env vars + AWS shared files -> S3Config.
#include "storage/s3/s3_config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace cairn::storage::s3 {
namespace {

class SystemEnvironment : public Environment {
 public:
  std::optional<std::string> Get(absl::string_view name) const override {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) const override {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      if (errno == ENOENT) return absl::NotFoundError(path);
      return absl::UnavailableError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }
};

// Decodes %XX escapes ('+' stays '+': these are URIs, not forms).
absl::StatusOr<std::string> PercentDecode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    int v = 0;
    if (i + 2 >= s.size() ||
        !absl::ascii_isxdigit(static_cast<unsigned char>(s[i + 1])) ||
        !absl::ascii_isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad percent escape in '", s, "'"));
    }
    for (int k = 1; k <= 2; ++k) {
      char c = absl::ascii_tolower(s[i + k]);
      v = v * 16 + (c <= '9' ? c - '0' : c - 'a' + 10);
    }
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

// S3 bucket naming rules (the DNS-compatible subset every S3 accepts).
bool ValidBucketName(absl::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' ||
          c == '.')) {
      return false;
    }
  }
  auto alnum = [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c);
  };
  return alnum(b.front()) && alnum(b.back()) &&
         b.find("..") == absl::string_view::npos;
}

const std::set<std::string>& KnownParams() {
  static const auto* known = new std::set<std::string>{
      "endpoint",           "region",           "addressing",
      "ca_bundle",          "profile",          "part_bytes",
      "upload_concurrency", "read_concurrency", "single_put_max_bytes",
      "coalesce_gap_bytes", "max_attempts"};
  return *known;
}

std::string ExpandHome(const std::string& path, const Environment& env) {
  if (path.size() >= 1 && path[0] == '~') {
    return env.Get("HOME").value_or("") + path.substr(1);
  }
  return path;
}

struct Credentials {
  std::string access_key, secret_key, session_token, source;
};

// Credentials of `profile` from the ini text, if the section has both keys.
std::optional<Credentials> FromIni(
    const std::map<std::string, std::map<std::string, std::string>>& ini,
    const std::string& section, const std::string& source) {
  auto it = ini.find(section);
  if (it == ini.end()) return std::nullopt;
  auto get = [&](const char* k) -> std::string {
    auto f = it->second.find(k);
    return f == it->second.end() ? "" : f->second;
  };
  Credentials c{get("aws_access_key_id"), get("aws_secret_access_key"),
                get("aws_session_token"), source};
  if (c.access_key.empty() || c.secret_key.empty()) return std::nullopt;
  return c;
}

}  // namespace

const Environment& Environment::System() {
  static const auto* env = new SystemEnvironment();
  return *env;
}

std::optional<std::string> MapEnvironment::Get(absl::string_view name) const {
  auto it = vars.find(std::string(name));
  if (it == vars.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> MapEnvironment::ReadFile(
    const std::string& path) const {
  auto it = files.find(path);
  if (it == files.end()) return absl::NotFoundError(path);
  return it->second;
}

std::map<std::string, std::map<std::string, std::string>> ParseAwsIni(
    absl::string_view text) {
  std::map<std::string, std::map<std::string, std::string>> out;
  std::string section;
  bool in_section = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = std::string(
          absl::StripAsciiWhitespace(line.substr(1, line.size() - 2)));
      in_section = true;
      out[section];
      continue;
    }
    size_t eq = line.find('=');
    if (!in_section || eq == absl::string_view::npos) continue;
    std::string key =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)));
    out[section][key] =
        std::string(absl::StripAsciiWhitespace(line.substr(eq + 1)));
  }
  return out;
}

absl::StatusOr<S3Config> ParseS3Uri(absl::string_view rest,
                                    const Environment& env) {
  const std::string uri = absl::StrCat("s3://", rest);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad s3 URI '", uri, "': ", why));
  };
  S3Config config;
  absl::string_view path = rest, query;
  if (size_t q = rest.find('?'); q != absl::string_view::npos) {
    path = rest.substr(0, q);
    query = rest.substr(q + 1);
  }
  size_t slash = path.find('/');
  config.bucket = std::string(path.substr(0, slash));
  if (slash != absl::string_view::npos) {
    config.prefix = std::string(path.substr(slash + 1));
  }
  if (config.bucket.empty()) {
    return bad("no bucket (expected s3://BUCKET/PREFIX)");
  }
  if (!ValidBucketName(config.bucket)) {
    return bad(absl::StrCat(
        "'", config.bucket,
        "' is not a valid bucket name (3-63 characters: lowercase letters, "
        "digits, '-', '.'; starting and ending with a letter or digit)"));
  }
  if (!config.prefix.empty()) {
    if (config.prefix[0] == '/' ||
        config.prefix.find("//") != std::string::npos) {
      return bad(absl::StrCat("prefix '", config.prefix,
                              "' has an empty path segment"));
    }
    if (config.prefix.back() != '/') config.prefix.push_back('/');
  }

  // Query parameters.
  std::map<std::string, std::string> params;
  if (!query.empty()) {
    for (absl::string_view kv : absl::StrSplit(query, '&')) {
      if (kv.empty()) continue;
      size_t eq = kv.find('=');
      if (eq == absl::string_view::npos) {
        return bad(absl::StrCat("query parameter '", kv, "' has no value"));
      }
      std::string name(kv.substr(0, eq));
      if (KnownParams().count(name) == 0) {
        return bad(absl::StrCat("unknown query parameter '", name, "' (known: ",
                                absl::StrJoin(KnownParams(), ", "), ")"));
      }
      auto value = PercentDecode(kv.substr(eq + 1));
      if (!value.ok()) return bad(value.status().message());
      if (!params.emplace(name, *value).second) {
        return bad(absl::StrCat("query parameter '", name, "' given twice"));
      }
    }
    config.original_query = std::string(query);
  }
  auto param = [&](const std::string& n) -> std::optional<std::string> {
    auto it = params.find(n);
    if (it == params.end()) return std::nullopt;
    return it->second;
  };
  auto uint_param = [&](const std::string& n, uint64_t min, uint64_t max,
                        uint64_t* out) -> absl::Status {
    auto v = param(n);
    if (!v) return absl::OkStatus();
    uint64_t x;
    if (!absl::SimpleAtoi(*v, &x) || x < min || x > max) {
      return bad(absl::StrCat(n, "=", *v, " is not an integer in [", min, ", ",
                              max, "]"));
    }
    *out = x;
    return absl::OkStatus();
  };
  auto int_param = [&](const std::string& n, int* out) -> absl::Status {
    uint64_t x = static_cast<uint64_t>(*out);
    if (auto s = uint_param(n, 1, 1024, &x); !s.ok()) return s;
    *out = static_cast<int>(x);
    return absl::OkStatus();
  };
  {
    auto v = param("part_bytes");
    uint64_t x = 0;
    if (v && absl::SimpleAtoi(*v, &x) && x < kMinPartBytes) {
      return bad(absl::StrCat("part_bytes=", *v,
                              " is below S3's minimum part size of 5 MiB (",
                              kMinPartBytes, " bytes)"));
    }
  }
  for (auto s : {uint_param("part_bytes", kMinPartBytes, kMaxPartBytes,
                            &config.part_bytes),
                 uint_param("single_put_max_bytes", 0, kMaxPartBytes,
                            &config.single_put_max_bytes),
                 uint_param("coalesce_gap_bytes", 0, kMaxPartBytes,
                            &config.coalesce_gap_bytes),
                 int_param("upload_concurrency", &config.upload_concurrency),
                 int_param("read_concurrency", &config.read_concurrency),
                 int_param("max_attempts", &config.max_attempts)}) {
    if (!s.ok()) return s;
  }

  // Profile and the shared files.
  const bool explicit_profile = param("profile").has_value();
  const std::string profile =
      param("profile").value_or(env.Get("AWS_PROFILE").value_or("default"));
  const std::string credentials_file = ExpandHome(
      env.Get("AWS_SHARED_CREDENTIALS_FILE").value_or("~/.aws/credentials"),
      env);
  const std::string config_file =
      ExpandHome(env.Get("AWS_CONFIG_FILE").value_or("~/.aws/config"), env);
  auto load = [&](const std::string& file)
      -> absl::StatusOr<
          std::map<std::string, std::map<std::string, std::string>>> {
    auto text = env.ReadFile(file);
    if (absl::IsNotFound(text.status())) {
      return std::map<std::string, std::map<std::string, std::string>>{};
    }
    if (!text.ok()) return text.status();
    return ParseAwsIni(*text);
  };
  auto cred_ini = load(credentials_file);
  if (!cred_ini.ok()) return cred_ini.status();
  auto conf_ini = load(config_file);
  if (!conf_ini.ok()) return conf_ini.status();
  const std::string conf_section =
      profile == "default" ? "default" : "profile " + profile;
  if (explicit_profile && !cred_ini->count(profile) &&
      !conf_ini->count(conf_section)) {
    return bad(absl::StrCat("profile '", profile, "' is in neither ",
                            credentials_file, " nor ", config_file));
  }

  // Region.
  std::optional<std::string> profile_region;
  if (auto it = conf_ini->find(conf_section); it != conf_ini->end()) {
    if (auto r = it->second.find("region");
        r != it->second.end() && !r->second.empty()) {
      profile_region = r->second;
    }
  }
  config.region = param("region").value_or(
      env.Get("AWS_REGION")
          .value_or(env.Get("AWS_DEFAULT_REGION")
                        .value_or(profile_region.value_or("us-east-1"))));
  if (config.region.empty()) return bad("empty region");

  // Endpoint and addressing.
  std::optional<std::string> endpoint = param("endpoint");
  if (!endpoint) endpoint = env.Get("AWS_ENDPOINT_URL_S3");
  if (!endpoint) endpoint = env.Get("AWS_ENDPOINT_URL");
  const bool custom_endpoint = endpoint.has_value();
  config.endpoint = endpoint.value_or(
      absl::StrCat("https://s3.", config.region, ".amazonaws.com"));
  while (!config.endpoint.empty() && config.endpoint.back() == '/') {
    config.endpoint.pop_back();
  }
  {
    absl::string_view e = config.endpoint;
    if (!absl::ConsumePrefix(&e, "http://") &&
        !absl::ConsumePrefix(&e, "https://")) {
      return bad(absl::StrCat("endpoint '", config.endpoint,
                              "' must start with http:// or https://"));
    }
    if (e.empty() || e.find_first_of("/?#@ ") != absl::string_view::npos) {
      return bad(absl::StrCat("endpoint '", config.endpoint,
                              "' must be scheme://host[:port], no path"));
    }
  }
  if (auto a = param("addressing")) {
    if (*a == "path") {
      config.path_style = true;
    } else if (*a == "virtual") {
      config.path_style = false;
    } else {
      return bad(
          absl::StrCat("addressing=", *a, " (expected path or virtual)"));
    }
  } else {
    config.path_style = custom_endpoint;
  }
  config.ca_bundle =
      param("ca_bundle").value_or(env.Get("AWS_CA_BUNDLE").value_or(""));

  // Credentials.
  std::optional<Credentials> creds;
  auto from_env = [&]() -> std::optional<Credentials> {
    auto id = env.Get("AWS_ACCESS_KEY_ID");
    auto secret = env.Get("AWS_SECRET_ACCESS_KEY");
    if (!id || !secret) return std::nullopt;
    return Credentials{*id, *secret, env.Get("AWS_SESSION_TOKEN").value_or(""),
                       "env"};
  };
  auto from_files = [&]() -> std::optional<Credentials> {
    if (auto c = FromIni(
            *cred_ini, profile,
            absl::StrCat("profile ", profile, " (", credentials_file, ")"))) {
      return c;
    }
    return FromIni(*conf_ini, conf_section,
                   absl::StrCat("profile ", profile, " (", config_file, ")"));
  };
  if (explicit_profile) {
    creds = from_files();
  } else {
    creds = from_env();
    if (!creds) creds = from_files();
  }
  if (!creds) {
    return absl::UnauthenticatedError(absl::StrCat(
        "no S3 credentials for '", uri,
        "': set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or add "
        "aws_access_key_id/aws_secret_access_key to profile '",
        profile, "' in ", credentials_file, " or ", config_file));
  }
  config.access_key = creds->access_key;
  config.secret_key = creds->secret_key;
  config.session_token = creds->session_token;
  config.credentials_source = creds->source;
  return config;
}

}  // namespace cairn::storage::s3
