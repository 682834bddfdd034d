// S3Client: the S3 operations Cairn's S3 ShardStore is built on, over one
// bucket, with SigV4 auth, retries and error mapping.
//
// Every request goes through HttpClient (libcurl with a shared connection
// pool). Requests (GET, HEAD, PUT object, UploadPart,
// CompleteMultipartUpload, DELETE, DeleteObjects, List, and
// CreateMultipartUpload, whose duplicate is only an abandoned upload that
// cleanup aborts) are retried per RetryPolicy (full-jitter exponential
// backoff, config.max_attempts in total). Every non-OK status names the method,
// bucket, key, HTTP status, S3 error code and message (see s3_error.h);
// failures that remain after the retries are UNAVAILABLE and say how many
// attempts were made.
//
// Thread-safe: every method may be called concurrently.
//
// Example:
//   CAIRN_ASSIGN_OR_RETURN(S3Config config,
//                          ParseS3Uri("bucket/ckpt/", Environment::System()));
//   CAIRN_ASSIGN_OR_RETURN(auto client, S3Client::Create(config));
//   CAIRN_RETURN_IF_ERROR(client->PutObject("ckpt/a", bytes));
#ifndef CAIRN_STORAGE_S3_S3_CLIENT_H_
#define CAIRN_STORAGE_S3_S3_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "storage/s3/retry_policy.h"
#include "storage/s3/s3_config.h"
#include "storage/s3/s3_error.h"
#include "storage/s3/s3_url.h"
#include "storage/shard_store.h"

namespace cairn::storage::s3 {

class HttpClient;
struct HttpRequest;
struct HttpResponse;
struct ResponseSink;

// One object of a listing; `key` is the full key in the bucket.
struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

// One in-progress multipart upload.
struct MultipartUpload {
  std::string key, upload_id;
  absl::Time initiated;
};

class S3Client {
 public:
  // Fails only on a config that cannot work (empty bucket, bad endpoint).
  // Makes no request.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Config& config() const { return config_; }

  // Every key below is the full object key in config().bucket (the caller
  // applies the prefix).

  // ListObjectsV2 max-keys=1 on the bucket: wrong credentials ->
  // UNAUTHENTICATED (bad key id or signature) or PERMISSION_DENIED, missing
  // bucket -> NOT_FOUND, no server -> UNAVAILABLE. Bounded in time by about
  // max_attempts * connect_timeout plus the backoffs.
  absl::Status CheckAccess();

  // Creates or replaces `key` with `data` (one PUT).
  absl::Status PutObject(std::string_view key, absl::Span<const char> data);

  // Creates `key` with `data` only if it does not exist: a PUT with
  // `If-None-Match: *`. ALREADY_EXISTS when it does (HTTP 412); a 409
  // ConditionalRequestConflict (a concurrent conditional write, AWS) is
  // retried. A server that ignores the header replaces the object.
  absl::Status PutObjectIfAbsent(std::string_view key,
                                 absl::Span<const char> data);

  // Reads [range.offset, range.offset + range.length) of `key` into `out`
  // (out.size() >= range.length), returning the bytes read: fewer than
  // range.length when the object ends first. NOT_FOUND if missing;
  // OUT_OF_RANGE when range.offset >= size (and length > 0).
  absl::StatusOr<size_t> GetRange(std::string_view key, ByteRange range,
                                  absl::Span<char> out);
  // As GetRange, but the range's bytes are scattered through `sink`
  // (http_client.h; sink.length == range.length, range.length > 0): only
  // the pieces asked for are written, with no buffer for the whole range.
  absl::StatusOr<size_t> GetRange(std::string_view key, ByteRange range,
                                  const ResponseSink& sink);

  // The size of `key`; NOT_FOUND if missing.
  absl::StatusOr<uint64_t> HeadObject(std::string_view key);

  // Multipart upload: Create returns the upload id; UploadPart returns the
  // part's ETag (part numbers 1..10000); Complete takes the ETags of parts
  // 1..N in order (part i+1 = etags[i]). UploadPartPieces sends the part
  // given in pieces (its bytes are the pieces one after the other), each
  // straight from where it is.
  absl::StatusOr<std::string> CreateMultipartUpload(std::string_view key);
  absl::StatusOr<std::string> UploadPart(std::string_view key,
                                         std::string_view upload_id,
                                         int part_number,
                                         absl::Span<const char> data);
  absl::StatusOr<std::string> UploadPartPieces(
      std::string_view key, std::string_view upload_id, int part_number,
      std::vector<absl::Span<const char>> pieces);
  absl::Status CompleteMultipartUpload(std::string_view key,
                                       std::string_view upload_id,
                                       absl::Span<const std::string> etags);
  // OK also when the upload is already gone (NoSuchUpload).
  absl::Status AbortMultipartUpload(std::string_view key,
                                    std::string_view upload_id);

  // Every object whose key starts with `prefix` (all pages), in key order.
  absl::StatusOr<std::vector<ObjectInfo>> ListObjects(std::string_view prefix);
  // With delimiter '/': the common prefixes directly below `prefix` (each
  // ending in '/'), and in `*objects` (if not null) the objects directly
  // below it.
  absl::StatusOr<std::vector<std::string>> ListCommonPrefixes(
      std::string_view prefix, std::vector<ObjectInfo>* objects);

  // OK also when `key` does not exist.
  absl::Status DeleteObject(std::string_view key);
  // Deletes `keys` in batches of <= 1000 (S3's DeleteObjects); a key that
  // could not be deleted makes the status non-OK, naming the first few keys
  // and their S3 error codes. Missing keys are not errors.
  absl::Status DeleteObjects(absl::Span<const std::string> keys);

  // In-progress multipart uploads of keys starting with `prefix` (all pages).
  absl::StatusOr<std::vector<MultipartUpload>> ListMultipartUploads(
      std::string_view prefix);

  // Creates `bucket` (any name, not only config().bucket) at the
  // configured endpoint and region; OK if it already exists and is ours.
  absl::Status CreateBucket(std::string_view bucket);
  // Deletes the empty `bucket`; FAILED_PRECONDITION if it is not empty.
  absl::Status DeleteBucket(std::string_view bucket);

  // Counters since Create, for benchmarks and tests.
  struct Stats {
    uint64_t requests = 0;        // HTTP attempts, retries included
    uint64_t retries = 0;         // attempts after the first of a request
    uint64_t bytes_sent = 0;      // request bodies
    uint64_t bytes_received = 0;  // response bodies
  };
  Stats stats() const;

  // Listing page size (max-keys / max-uploads; S3's default is 1000) so
  // tests can exercise pagination with few keys.
  void SetListPageSizeForTest(int n) { list_page_size_ = n; }
  // The retry policy (tests shorten the backoff).
  void SetRetryPolicyForTest(RetryPolicy p) { retry_ = p; }

 private:
  // How a request may be retried.
  enum class Idempotency { kIdempotent, kOnlyIfNotSent };

  S3Client(S3Config config, std::unique_ptr<HttpClient> http);

  // Sends `request` with retries. Returns the final response when it got a
  // 2xx status; otherwise the mapped error naming `name`. `attempts_out`
  // (if set) receives the number of attempts made.
  absl::StatusOr<HttpResponse> Execute(const S3RequestName& name,
                                       const HttpRequest& request,
                                       Idempotency idempotency,
                                       int* attempts_out = nullptr);

  std::string Url(std::string_view key, const QueryParams& params = {}) const;

  // Every page of ListObjectsV2 under `prefix` (with delimiter '/' when
  // `delimited`), appending to `objects` and `prefixes` (either may be null).
  absl::Status ListAll(std::string_view prefix, bool delimited,
                       std::vector<ObjectInfo>* objects,
                       std::vector<std::string>* prefixes);

  // Constant after construction (except the ForTest knobs, set before use).
  const S3Config config_;
  const std::unique_ptr<HttpClient> http_;
  RetryPolicy retry_;
  int list_page_size_ = 1000;

  std::atomic<uint64_t> requests_{0}, retries_{0}, bytes_sent_{0},
      bytes_received_{0};
};

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_S3_CLIENT_H_
