// S3 error bodies and their mapping to absl::Status.
//
// S3 answers a failed request with an HTTP status and (except for HEAD) an
// XML body:
//   <Error><Code>NoSuchKey</Code><Message>The specified key does not
//   exist.</Message><Key>a/b</Key><RequestId>..</RequestId></Error>
// ParseS3ErrorXml reads it (tinyxml2); S3ErrorToStatus turns the pair into
// an absl::Status whose code follows retry semantics and whose message
// names the request, e.g.
//   s3 PUT cairn-ckpt/job/0000000100/rank-3.data: HTTP 403
//   SignatureDoesNotMatch: The request signature we calculated does not
//   match ... (request id tx0001)
// Mapping: 404 -> NOT_FOUND; 403 -> PERMISSION_DENIED, except
// InvalidAccessKeyId/SignatureDoesNotMatch/ExpiredToken/... ->
// UNAUTHENTICATED; 416 -> OUT_OF_RANGE; 400 -> INVALID_ARGUMENT; 409 ->
// ALREADY_EXISTS (BucketAlreadyExists) or FAILED_PRECONDITION; 412 ->
// FAILED_PRECONDITION; 501 -> UNIMPLEMENTED; 5xx, 429, SlowDown and the
// other retryable codes -> UNAVAILABLE.
#ifndef CAIRN_STORAGE_S3_S3_ERROR_H_
#define CAIRN_STORAGE_S3_S3_ERROR_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cairn::storage::s3 {

struct S3ErrorBody {
  std::string code;        // "NoSuchKey"
  std::string message;     // "The specified key does not exist."
  std::string request_id;  // "tx000..."
  std::string resource;    // <Key>, <BucketName> or <Resource>, if any
};

// The error in `body` if it is an S3 <Error> document; nullopt otherwise
// (empty body, HTML from a proxy, truncated XML).
std::optional<S3ErrorBody> ParseS3ErrorXml(absl::string_view body);

// Names one request in messages: "s3 METHOD BUCKET/KEY".
struct S3RequestName {
  std::string method;  // "GET", "PUT", ... plus the operation when useful
  std::string bucket;
  std::string key;               // "" for bucket-level requests
  std::string Describe() const;  // "s3 PUT bucket/key"
};

// The status for a request that got HTTP `http_status` with `body` (the raw
// response; parsed with ParseS3ErrorXml; shown truncated if not XML).
// `attempts` > 1 is mentioned ("after 6 attempts").
absl::Status S3ErrorToStatus(const S3RequestName& request, long http_status,
                             absl::string_view body, int attempts);

// The status for a transport failure (curl error): UNAVAILABLE with curl's
// text, e.g. "s3 GET b/k: Couldn't connect to server (http://...) after 6
// attempts".
absl::Status TransportErrorToStatus(const S3RequestName& request,
                                    absl::string_view curl_error,
                                    absl::string_view url, int attempts);

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_S3_ERROR_H_
