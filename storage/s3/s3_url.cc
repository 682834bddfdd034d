// S3 request URLs in SigV4-canonical form.
#include "storage/s3/s3_url.h"

#include <curl/curl.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cairn::storage::s3 {

std::string UriEncode(absl::string_view s) {
  if (s.empty()) return "";
  // Since curl 7.82 the handle argument is unused and may be null.
  char* e = curl_easy_escape(nullptr, s.data(), static_cast<int>(s.size()));
  std::string out(e);
  curl_free(e);
  return out;
}

std::string EncodeKeyPath(absl::string_view key) {
  std::string out;
  bool first = true;
  for (absl::string_view seg : absl::StrSplit(key, '/')) {
    if (!first) out.push_back('/');
    first = false;
    out += UriEncode(seg);
  }
  return out;
}

std::string CanonicalQuery(QueryParams params) {
  for (auto& [name, value] : params) {
    name = UriEncode(name);
    value = UriEncode(value);
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out.push_back('&');
    absl::StrAppend(&out, name, "=", value);
  }
  return out;
}

std::string ObjectUrl(const S3Config& config, absl::string_view bucket,
                      absl::string_view key, const QueryParams& params) {
  std::string url;
  if (config.path_style) {
    url = absl::StrCat(config.endpoint, "/", bucket);
    if (!key.empty()) absl::StrAppend(&url, "/", EncodeKeyPath(key));
  } else {
    absl::string_view e = config.endpoint;
    size_t scheme_end = e.find("://");
    absl::string_view scheme = e.substr(0, scheme_end + 3);
    absl::string_view host = e.substr(scheme_end + 3);
    url = absl::StrCat(scheme, bucket, ".", host, "/", EncodeKeyPath(key));
  }
  if (!params.empty()) absl::StrAppend(&url, "?", CanonicalQuery(params));
  return url;
}

}  // namespace cairn::storage::s3
