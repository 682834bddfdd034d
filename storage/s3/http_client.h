// HttpClient: the libcurl layer under S3Client. One HTTP request per
// Perform() call, signed with AWS SigV4 by curl (CURLOPT_AWS_SIGV4), no
// retries (S3Client decides those).
//
// Connections, DNS lookups and TLS sessions are shared by every request of
// one HttpClient through a CURLSH share handle (with its lock callbacks), and
// easy handles are pooled, so a stream of requests reuses warm connections.
// Request bodies are streamed from the caller's spans (CURLOPT_READFUNCTION,
// no copy of their own); a response can be scattered straight into a
// caller's spans (ranged GETs). Payloads are not hashed: `x-amz-content-sha256:
// UNSIGNED-PAYLOAD`. No request can hang forever: connect timeout, and a
// transfer slower than 1 byte/s for low_speed_timeout is aborted
// (CURLE_OPERATION_TIMEDOUT).
//
// Thread-safe: Perform may be called concurrently.
#ifndef CAIRN_STORAGE_S3_HTTP_CLIENT_H_
#define CAIRN_STORAGE_S3_HTTP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cairn::storage::s3 {

struct HttpOptions {
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;
  std::string ca_bundle;  // "" = system CAs
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration low_speed_timeout = absl::Seconds(30);
};

// Where a 2xx response body goes, scattered as it arrives: body byte i
// (i < length) lands in the piece covering it and is dropped when none does
// (a coalesced ranged GET keeps only the ranges asked for, with no buffer
// for the whole response). A body longer than `length` fails the request
// with sink_overflow. Pieces are sorted by `at`, disjoint, and end by
// `length`.
struct ResponseSink {
  struct Piece {
    uint64_t at;  // the body offset of out[0]
    absl::Span<char> out;
  };
  uint64_t length = 0;
  std::vector<Piece> pieces;

  // The whole body into `out`.
  static ResponseSink Into(absl::Span<char> out) {
    return {out.size(), {{0, out}}};
  }
};

struct HttpRequest {
  std::string method = "GET";        // GET, HEAD, PUT, POST, DELETE
  std::string url;                   // already SigV4-canonical (see s3_url.h)
  std::vector<std::string> headers;  // "Name: value"
  // PUT and POST send exactly these bytes, the spans one after the other
  // (streamed from them, not copied first).
  std::vector<absl::Span<const char>> body;
  // When set, a 2xx response body is written through it (see
  // ResponseSink); other bodies go to HttpResponse::body.
  std::optional<ResponseSink> sink;
};

struct HttpResponse {
  int curl_code = 0;        // CURLcode; 0 = a response arrived
  std::string curl_error;   // curl's text when curl_code != 0
  long status = 0;          // HTTP status
  std::string body;         // the response body unless it went to the sink
  uint64_t sink_bytes = 0;  // body bytes that went through the sink
  bool sink_overflow = false;
  std::string etag;  // the ETag header, quotes kept
  std::optional<uint64_t> content_length;
  uint64_t bytes_sent = 0;      // request body bytes sent
  uint64_t bytes_received = 0;  // response body bytes received
  bool ok() const { return curl_code == 0 && status >= 200 && status < 300; }
};

// The bytes of a request body: the sum of its spans.
uint64_t BodySize(const HttpRequest& request);

class HttpClient {
 public:
  static absl::StatusOr<std::unique_ptr<HttpClient>> Create(
      HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpResponse Perform(const HttpRequest& request);

 private:
  explicit HttpClient(HttpOptions options);
  void* AcquireHandle();
  void ReleaseHandle(void* handle);
  // The share handle's lock callbacks (http_client.cc), exactly typed.
  friend struct CurlShareCallbacks;

  // Constant after construction.
  const HttpOptions options_;
  const std::string sigv4_;  // "aws:amz:REGION:s3"
  void* share_ = nullptr;    // CURLSH*

  // One mutex per curl_lock_data kind, for the share handle.
  static constexpr int kLockKinds = 8;
  absl::Mutex share_locks_[kLockKinds];

  absl::Mutex mu_;
  std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);  // CURL* easy handles
};

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_HTTP_CLIENT_H_
