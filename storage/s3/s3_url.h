// S3 request URLs: path-style (http://host/BUCKET/KEY) or virtual-hosted
// (http://BUCKET.host/KEY), keys and query parameters percent-encoded the
// way SigV4 canonicalizes them.
//
// curl (CURLOPT_AWS_SIGV4) signs the path and query exactly as they appear
// in the URL, so the URL must already be in canonical form: every byte
// outside A-Z a-z 0-9 - . _ ~ is %XX (uppercase hex; '/' kept between key
// segments), and query parameters are sorted by name, each written
// "name=value" (a flag such as `uploads` as "uploads=").
#ifndef CAIRN_STORAGE_S3_S3_URL_H_
#define CAIRN_STORAGE_S3_S3_URL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "storage/s3/s3_config.h"

namespace cairn::storage::s3 {

using QueryParams = std::vector<std::pair<std::string, std::string>>;

// Percent-encodes every byte except A-Z a-z 0-9 - . _ ~ (curl_easy_escape).
std::string UriEncode(absl::string_view s);

// `key` with each '/'-separated segment UriEncoded, '/' kept.
std::string EncodeKeyPath(absl::string_view key);

// Sorted, encoded "a=1&b=2" (empty string for no parameters).
std::string CanonicalQuery(QueryParams params);

// The URL of `key` in `bucket` ("" key: the bucket itself) at
// config.endpoint, path-style or virtual-hosted per config.path_style.
std::string ObjectUrl(const S3Config& config, absl::string_view bucket,
                      absl::string_view key, const QueryParams& params = {});

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_S3_URL_H_
