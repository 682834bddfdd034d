// S3Config: everything an S3Client needs to reach one bucket, and
// ParseS3Uri, which builds it from an `s3://BUCKET/PREFIX?query` URI, the
// AWS environment variables and the AWS shared files (~/.aws/credentials,
// ~/.aws/config), the same sources and precedence the AWS CLI uses.
//
// URI syntax (the part after "s3://"):
//   BUCKET[/PREFIX][?endpoint=URL&region=R&addressing=path|virtual
//                   &ca_bundle=PATH&profile=P&part_bytes=N
//                   &upload_concurrency=N&read_concurrency=N
//                   &single_put_max_bytes=N&coalesce_gap_bytes=N
//                   &max_attempts=N]
// Query parameters override the environment. Precedence of the rest:
//   endpoint:    AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else
//                https://s3.REGION.amazonaws.com
//   region:      AWS_REGION, AWS_DEFAULT_REGION, the profile's `region` in
//                the config file, else us-east-1
//   addressing:  path when an endpoint was given, else virtual
//   profile:     AWS_PROFILE, else "default"
//   credentials: with an explicit ?profile=: that profile first; otherwise
//                AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+
//                AWS_SESSION_TOKEN) first, then the profile in
//                AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials), then
//                in AWS_CONFIG_FILE (default ~/.aws/config, section "[profile
//                P]").
//   ca_bundle:   AWS_CA_BUNDLE, else the system CAs
// Credentials never appear in a URI; S3Config::original_query is what a
// store's uri() puts back.
//
// Everything the parser reads from the process (env vars, files) goes
// through an Environment, so tests inject a MapEnvironment.
#ifndef CAIRN_STORAGE_S3_S3_CONFIG_H_
#define CAIRN_STORAGE_S3_S3_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cairn::storage::s3 {

// The process environment as ParseS3Uri sees it. Thread-safe.
class Environment {
 public:
  virtual ~Environment() = default;
  // The value of environment variable `name`; nullopt when unset. An empty
  // value counts as unset (as the AWS CLI treats it).
  virtual std::optional<std::string> Get(absl::string_view name) const = 0;
  // The contents of file `path`; NOT_FOUND when it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(
      const std::string& path) const = 0;
  // The real process environment (getenv, the file system).
  static const Environment& System();
};

// A fake environment for tests: variables and files from maps.
class MapEnvironment : public Environment {
 public:
  std::map<std::string, std::string> vars;
  std::map<std::string, std::string> files;  // path -> contents
  std::optional<std::string> Get(absl::string_view name) const override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) const override;
};

struct S3Config {
  std::string bucket;
  // "" or ending in '/'; every store key is prefix + key.
  std::string prefix;
  // scheme://host[:port], no trailing '/'.
  std::string endpoint;
  std::string region = "us-east-1";
  // true: http://host/BUCKET/KEY; false: http://BUCKET.host/KEY.
  bool path_style = true;
  // CA file for https; "" = the system CAs.
  std::string ca_bundle;
  std::string access_key, secret_key, session_token;
  // Where the credentials came from, for error messages: "env",
  // "profile default (/home/u/.aws/credentials)", ...
  std::string credentials_source;
  // Multipart part size. Default: 16 MiB; S3 requires >= 5 MiB.
  uint64_t part_bytes = 16 << 20;
  // Parallel part uploads per writer. Default: 8.
  int upload_concurrency = 8;
  // Parallel ranged GETs per ReadRanges. Default: 8.
  int read_concurrency = 8;
  // ReadRanges merges ranges closer than this. Default: 1 MiB.
  uint64_t coalesce_gap_bytes = 1 << 20;
  // Objects at or below this size are one PUT, no multipart. Default: 16 MiB.
  uint64_t single_put_max_bytes = 16 << 20;
  // Attempts (first try + retries) of an idempotent request. Default: 6.
  int max_attempts = 6;
  // TCP/TLS connect timeout per attempt. Default: 5 s.
  absl::Duration connect_timeout = absl::Seconds(5);
  // A transfer slower than 1 byte/s for this long is aborted (and retried).
  // Default: 30 s.
  absl::Duration low_speed_timeout = absl::Seconds(30);
  // The query string given in the URI (without '?'), for Store::uri().
  std::string original_query;
};

inline constexpr uint64_t kMinPartBytes = 5ull << 20;
inline constexpr uint64_t kMaxPartBytes = 5ull << 30;

// Parses `rest`, the part of an s3 URI after "s3://". INVALID_ARGUMENT
// (naming the URI) for a bad bucket name, an unknown or malformed query
// parameter, a part size below 5 MiB; UNAUTHENTICATED when no credentials
// were found (naming where it looked).
absl::StatusOr<S3Config> ParseS3Uri(absl::string_view rest,
                                    const Environment& env);

// Parses an AWS shared file (INI: "[section]" lines, "key = value" lines,
// '#' and ';' comments) into section -> key -> value. Exposed for tests.
std::map<std::string, std::map<std::string, std::string>> ParseAwsIni(
    absl::string_view text);

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_S3_CONFIG_H_
