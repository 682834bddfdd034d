// S3Client: S3 operations as HTTP requests (HttpClient), with retries
// (RetryPolicy), XML bodies (tinyxml2) and error mapping (s3_error.h).
#include "storage/s3/s3_client.h"

#include <openssl/evp.h>
#include <tinyxml2.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "storage/s3/http_client.h"

namespace cairn::storage::s3 {
namespace {

// The API takes std::string_view (the contract); Debian's Abseil has its own
// absl::string_view, not an alias.
absl::string_view Av(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

constexpr int kMaxDeleteBatch = 1000;  // S3's DeleteObjects limit
constexpr int kMaxPartNumber = 10000;

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// base64(MD5(data)), the Content-MD5 header value.
std::string ContentMd5(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  EVP_Digest(data.data(), data.size(), md, &md_len, EVP_md5(), nullptr);
  unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  int n = EVP_EncodeBlock(b64, md, static_cast<int>(md_len));
  return std::string(reinterpret_cast<char*>(b64), n);
}

std::string Text(const tinyxml2::XMLElement* parent, const char* name) {
  const tinyxml2::XMLElement* e = parent->FirstChildElement(name);
  if (e == nullptr || e->GetText() == nullptr) return "";
  return e->GetText();
}

absl::Status WithSuffix(const absl::Status& s, absl::string_view suffix) {
  return absl::Status(s.code(), absl::StrCat(s.message(), suffix));
}

// Parses `body` whose root element must be `root`.
absl::StatusOr<const tinyxml2::XMLElement*> ParseRoot(
    tinyxml2::XMLDocument& doc, const std::string& body, const char* root,
    const S3RequestName& name) {
  if (doc.Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS ||
      doc.RootElement() == nullptr ||
      std::string(doc.RootElement()->Name()) != root) {
    return absl::InternalError(
        absl::StrCat(name.Describe(), ": expected an XML <", root,
                     "> response, got '", body.substr(0, 200), "'"));
  }
  return doc.RootElement();
}

// " [bytes a..b)", appended to a ranged GET's errors.
std::string RangeText(ByteRange range) {
  return absl::StrCat(" [bytes ", range.offset, "..",
                      range.offset + range.length, ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3Config config) {
  if (config.bucket.empty()) {
    return absl::InvalidArgumentError("S3Client: empty bucket");
  }
  if (config.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3Client: max_attempts must be >= 1, got ", config.max_attempts));
  }
  HttpOptions http;
  http.region = config.region;
  http.access_key = config.access_key;
  http.secret_key = config.secret_key;
  http.session_token = config.session_token;
  http.ca_bundle = config.ca_bundle;
  http.connect_timeout = config.connect_timeout;
  http.low_speed_timeout = config.low_speed_timeout;
  auto client = HttpClient::Create(std::move(http));
  if (!client.ok()) {
    return absl::Status(
        client.status().code(),
        absl::StrCat("s3 bucket ", config.bucket, ": ",
                     client.status().message(), " (credentials from ",
                     config.credentials_source.empty()
                         ? "nowhere"
                         : config.credentials_source,
                     ")"));
  }
  return std::unique_ptr<S3Client>(
      new S3Client(std::move(config), std::move(*client)));
}

S3Client::S3Client(S3Config config, std::unique_ptr<HttpClient> http)
    : config_(std::move(config)), http_(std::move(http)) {
  retry_.max_attempts = config_.max_attempts;
}

S3Client::~S3Client() = default;

S3Client::Stats S3Client::stats() const {
  return Stats{requests_.load(), retries_.load(), bytes_sent_.load(),
               bytes_received_.load()};
}

std::string S3Client::Url(std::string_view key,
                          const QueryParams& params) const {
  return ObjectUrl(config_, config_.bucket, Av(key), params);
}

absl::StatusOr<HttpResponse> S3Client::Execute(const S3RequestName& name,
                                               const HttpRequest& request,
                                               Idempotency idempotency,
                                               int* attempts_out) {
  absl::BitGen gen;
  for (int attempt = 1;; ++attempt) {
    HttpResponse response = http_->Perform(request);
    requests_.fetch_add(1, std::memory_order_relaxed);
    if (attempt > 1) retries_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(response.bytes_sent, std::memory_order_relaxed);
    bytes_received_.fetch_add(response.bytes_received,
                              std::memory_order_relaxed);
    if (attempts_out != nullptr) *attempts_out = attempt;
    if (response.ok()) return response;

    AttemptOutcome outcome{response.curl_code, response.status, ""};
    if (response.curl_code == 0) {
      if (auto e = ParseS3ErrorXml(response.body)) outcome.s3_code = e->code;
    }
    const bool retryable =
        IsRetryable(outcome) && (idempotency == Idempotency::kIdempotent ||
                                 RequestSurelyNotSent(outcome));
    if (!retryable || attempt >= retry_.max_attempts) {
      if (response.curl_code != 0) {
        absl::Status s = TransportErrorToStatus(name, response.curl_error,
                                                request.url, attempt);
        // Our own buffer overflowing is not the server being unavailable.
        if (response.sink_overflow) {
          return absl::InternalError(std::string(s.message()));
        }
        return s;
      }
      return S3ErrorToStatus(name, response.status, response.body, attempt);
    }
    // Retries are never silent: a stalled or throttled server shows in the
    // log while the request is still being retried, not only in the status
    // after the last attempt.
    const absl::Duration backoff = retry_.Backoff(attempt - 1, gen);
    CAIRN_LOG(
        warn, "{}: attempt {} of {} failed ({}); retrying in {}",
        name.Describe(), attempt, retry_.max_attempts,
        response.curl_code != 0
            ? response.curl_error
            : absl::StrCat("HTTP ", response.status,
                           outcome.s3_code.empty() ? "" : " ", outcome.s3_code),
        absl::FormatDuration(backoff));
    absl::SleepFor(backoff);
  }
}

absl::Status S3Client::CheckAccess() {
  HttpRequest req;
  req.url = Url("", {{"list-type", "2"}, {"max-keys", "1"}});
  absl::Status s = Execute({"GET (ListObjectsV2)", config_.bucket, ""}, req,
                           Idempotency::kIdempotent)
                       .status();
  if (!s.ok()) {
    return WithSuffix(
        s, absl::StrCat(" [endpoint ", config_.endpoint, ", credentials from ",
                        config_.credentials_source, "]"));
  }
  return s;
}

absl::Status S3Client::PutObject(std::string_view key,
                                 absl::Span<const char> data) {
  HttpRequest req;
  req.method = "PUT";
  req.url = Url(key);
  req.headers = {"Content-Type: application/octet-stream"};
  req.body = {data};
  return Execute({"PUT", config_.bucket, std::string(key)}, req,
                 Idempotency::kIdempotent)
      .status();
}

absl::Status S3Client::PutObjectIfAbsent(std::string_view key,
                                         absl::Span<const char> data) {
  HttpRequest req;
  req.method = "PUT";
  req.url = Url(key);
  req.headers = {"Content-Type: application/octet-stream", "If-None-Match: *"};
  req.body = {data};
  const S3RequestName name{"PUT (If-None-Match)", config_.bucket,
                           std::string(key)};
  absl::BitGen gen;
  for (int conflict = 0;; ++conflict) {
    // Retrying is safe: the object is created at most once, and a retry
    // whose first attempt created it gets 412 (the caller reads it back).
    absl::Status s = Execute(name, req, Idempotency::kIdempotent).status();
    if (s.ok() || !absl::IsFailedPrecondition(s)) return s;
    if (absl::StrContains(s.message(), ": HTTP 412")) {
      return absl::AlreadyExistsError(s.message());
    }
    if (!absl::StrContains(s.message(), ": HTTP 409") ||
        conflict + 1 >= retry_.max_attempts) {
      return s;
    }
    absl::SleepFor(retry_.Backoff(conflict, gen));
  }
}

absl::StatusOr<uint64_t> S3Client::HeadObject(std::string_view key) {
  HttpRequest req;
  req.method = "HEAD";
  req.url = Url(key);
  const S3RequestName name{"HEAD", config_.bucket, std::string(key)};
  auto resp = Execute(name, req, Idempotency::kIdempotent);
  if (!resp.ok()) return resp.status();
  if (!resp->content_length.has_value()) {
    return absl::InternalError(
        absl::StrCat(name.Describe(), ": response has no Content-Length"));
  }
  return *resp->content_length;
}

absl::StatusOr<size_t> S3Client::GetRange(std::string_view key, ByteRange range,
                                          absl::Span<char> out) {
  // The request's name and range text are built only for an error here; the
  // sink overload builds its own for the GET.
  auto describe = [&] {
    return absl::StrCat(
        S3RequestName{"GET", config_.bucket, std::string(key)}.Describe(),
        RangeText(range));
  };
  if (out.size() < range.length) {
    return absl::InvalidArgumentError(absl::StrCat(
        describe(), ": buffer of ", out.size(), " bytes is too small"));
  }
  if (range.length == 0) {
    auto size = HeadObject(key);
    if (!size.ok()) return size.status();
    if (range.offset > *size) {
      return absl::OutOfRangeError(
          absl::StrCat(describe(), ": object has ", *size, " bytes"));
    }
    return 0;
  }
  return GetRange(key, range, ResponseSink::Into(out.subspan(0, range.length)));
}

absl::StatusOr<size_t> S3Client::GetRange(std::string_view key, ByteRange range,
                                          const ResponseSink& sink) {
  const S3RequestName name{"GET", config_.bucket, std::string(key)};
  const std::string range_text = RangeText(range);
  uint64_t covered = 0;
  for (const ResponseSink::Piece& p : sink.pieces) {
    if (p.at < covered || p.at > sink.length ||
        p.out.size() > sink.length - p.at) {
      return absl::InvalidArgumentError(absl::StrCat(
          name.Describe(), range_text, ": sink piece at ", p.at, " of ",
          p.out.size(), " bytes overlaps another or passes its end"));
    }
    covered = p.at + p.out.size();
  }
  if (range.length == 0 || sink.length != range.length) {
    return absl::InvalidArgumentError(
        absl::StrCat(name.Describe(), range_text, ": a sink of ", sink.length,
                     " bytes for a range of ", range.length));
  }
  HttpRequest req;
  req.url = Url(key);
  req.headers = {absl::StrCat("Range: bytes=", range.offset, "-",
                              range.offset + range.length - 1)};
  req.sink = sink;
  auto resp = Execute(name, req, Idempotency::kIdempotent);
  if (!resp.ok()) return WithSuffix(resp.status(), range_text);
  if (resp->status != 206 && range.offset != 0) {
    return absl::InternalError(absl::StrCat(
        name.Describe(), range_text, ": server ignored the Range header (HTTP ",
        resp->status, ")"));
  }
  return resp->sink_bytes;
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(
    std::string_view key) {
  const S3RequestName name{"POST (CreateMultipartUpload)", config_.bucket,
                           std::string(key)};
  HttpRequest req;
  req.method = "POST";
  req.url = Url(key, {{"uploads", ""}});
  req.headers = {"Content-Type: application/octet-stream"};
  // Retried like the idempotent requests: if a lost answer hides an upload
  // the server did create, that upload is only an abandoned one, never
  // visible, and aborted with the others (ShardStore::DeleteAbandonedWrites
  // at commit, recovery and gc). Throttling here must not fail a save.
  auto resp = Execute(name, req, Idempotency::kIdempotent);
  if (!resp.ok()) return resp.status();
  tinyxml2::XMLDocument doc;
  auto root = ParseRoot(doc, resp->body, "InitiateMultipartUploadResult", name);
  if (!root.ok()) return root.status();
  std::string id = Text(*root, "UploadId");
  if (id.empty()) {
    return absl::InternalError(
        absl::StrCat(name.Describe(), ": response has no UploadId"));
  }
  return id;
}

absl::StatusOr<std::string> S3Client::UploadPart(std::string_view key,
                                                 std::string_view upload_id,
                                                 int part_number,
                                                 absl::Span<const char> data) {
  return UploadPartPieces(key, upload_id, part_number,
                          std::vector<absl::Span<const char>>{data});
}

absl::StatusOr<std::string> S3Client::UploadPartPieces(
    std::string_view key, std::string_view upload_id, int part_number,
    std::vector<absl::Span<const char>> pieces) {
  const S3RequestName name{absl::StrCat("PUT (UploadPart ", part_number, ")"),
                           config_.bucket, std::string(key)};
  if (part_number < 1 || part_number > kMaxPartNumber) {
    return absl::InvalidArgumentError(
        absl::StrCat(name.Describe(), ": part number must be in [1, 10000]"));
  }
  HttpRequest req;
  req.method = "PUT";
  req.url = Url(key, {{"partNumber", absl::StrCat(part_number)},
                      {"uploadId", std::string(upload_id)}});
  req.body = std::move(pieces);
  auto resp = Execute(name, req, Idempotency::kIdempotent);
  if (!resp.ok()) return resp.status();
  if (resp->etag.empty()) {
    return absl::InternalError(
        absl::StrCat(name.Describe(), ": response has no ETag"));
  }
  return resp->etag;
}

absl::Status S3Client::CompleteMultipartUpload(
    std::string_view key, std::string_view upload_id,
    absl::Span<const std::string> etags) {
  const S3RequestName name{"POST (CompleteMultipartUpload)", config_.bucket,
                           std::string(key)};
  if (etags.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name.Describe(), ": no parts"));
  }
  std::string body = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    absl::StrAppend(&body, "<Part><PartNumber>", i + 1, "</PartNumber><ETag>",
                    XmlEscape(etags[i]), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  HttpRequest req;
  req.method = "POST";
  req.url = Url(key, {{"uploadId", std::string(upload_id)}});
  req.headers = {"Content-Type: application/xml"};
  req.body = {body};
  absl::BitGen gen;
  int total_attempts = 0;
  for (int round = 1;; ++round) {
    int attempts = 0;
    auto resp = Execute(name, req, Idempotency::kIdempotent, &attempts);
    total_attempts += attempts;
    absl::Status status;
    if (resp.ok()) {
      // S3 may answer 200 and still fail: the error is in the body.
      auto e = ParseS3ErrorXml(resp->body);
      if (!e.has_value()) return absl::OkStatus();
      status = S3ErrorToStatus(name, resp->status, resp->body, total_attempts);
      if (IsRetryable(AttemptOutcome{0, 500, e->code}) &&
          round < retry_.max_attempts) {
        absl::SleepFor(retry_.Backoff(round - 1, gen));
        continue;
      }
    } else {
      status = resp.status();
    }
    // A retried Complete may find its upload already completed by an
    // earlier attempt whose response was lost: success if the object is
    // there.
    if (absl::IsNotFound(status) && total_attempts > 1 &&
        absl::StrContains(status.message(), "NoSuchUpload")) {
      if (HeadObject(key).ok()) return absl::OkStatus();
    }
    return status;
  }
}

absl::Status S3Client::AbortMultipartUpload(std::string_view key,
                                            std::string_view upload_id) {
  HttpRequest req;
  req.method = "DELETE";
  req.url = Url(key, {{"uploadId", std::string(upload_id)}});
  absl::Status s = Execute({"DELETE (AbortMultipartUpload)", config_.bucket,
                            std::string(key)},
                           req, Idempotency::kIdempotent)
                       .status();
  if (absl::IsNotFound(s) && absl::StrContains(s.message(), "NoSuchUpload")) {
    return absl::OkStatus();
  }
  return s;
}

absl::Status S3Client::ListAll(std::string_view prefix, bool delimited,
                               std::vector<ObjectInfo>* objects,
                               std::vector<std::string>* prefixes) {
  const S3RequestName name{"GET (ListObjectsV2)", config_.bucket,
                           absl::StrCat("?prefix=", Av(prefix))};
  std::string token;
  for (int page = 0;; ++page) {
    QueryParams params = {{"list-type", "2"},
                          {"prefix", std::string(prefix)},
                          {"max-keys", absl::StrCat(list_page_size_)}};
    if (delimited) params.emplace_back("delimiter", "/");
    if (!token.empty()) params.emplace_back("continuation-token", token);
    HttpRequest req;
    req.url = Url("", params);
    auto resp = Execute(name, req, Idempotency::kIdempotent);
    if (!resp.ok()) return resp.status();
    tinyxml2::XMLDocument doc;
    auto root = ParseRoot(doc, resp->body, "ListBucketResult", name);
    if (!root.ok()) return root.status();
    for (const tinyxml2::XMLElement* c = (*root)->FirstChildElement("Contents");
         c != nullptr; c = c->NextSiblingElement("Contents")) {
      ObjectInfo info;
      info.key = Text(c, "Key");
      if (!absl::SimpleAtoi(Text(c, "Size"), &info.size)) {
        return absl::InternalError(absl::StrCat(
            name.Describe(), ": bad <Size> for key '", info.key, "'"));
      }
      if (objects != nullptr) objects->push_back(std::move(info));
    }
    for (const tinyxml2::XMLElement* c =
             (*root)->FirstChildElement("CommonPrefixes");
         c != nullptr; c = c->NextSiblingElement("CommonPrefixes")) {
      if (prefixes != nullptr) prefixes->push_back(Text(c, "Prefix"));
    }
    if (Text(*root, "IsTruncated") != "true") return absl::OkStatus();
    token = Text(*root, "NextContinuationToken");
    if (token.empty()) {
      return absl::InternalError(
          absl::StrCat(name.Describe(), ": truncated page ", page,
                       " without NextContinuationToken"));
    }
  }
}

absl::StatusOr<std::vector<ObjectInfo>> S3Client::ListObjects(
    std::string_view prefix) {
  std::vector<ObjectInfo> objects;
  absl::Status s = ListAll(prefix, /*delimited=*/false, &objects, nullptr);
  if (!s.ok()) return s;
  return objects;
}

absl::StatusOr<std::vector<std::string>> S3Client::ListCommonPrefixes(
    std::string_view prefix, std::vector<ObjectInfo>* objects) {
  std::vector<std::string> prefixes;
  absl::Status s = ListAll(prefix, /*delimited=*/true, objects, &prefixes);
  if (!s.ok()) return s;
  return prefixes;
}

absl::Status S3Client::DeleteObject(std::string_view key) {
  HttpRequest req;
  req.method = "DELETE";
  req.url = Url(key);
  absl::Status s = Execute({"DELETE", config_.bucket, std::string(key)}, req,
                           Idempotency::kIdempotent)
                       .status();
  if (absl::IsNotFound(s) && absl::StrContains(s.message(), "NoSuchKey")) {
    return absl::OkStatus();
  }
  return s;
}

absl::Status S3Client::DeleteObjects(absl::Span<const std::string> keys) {
  std::vector<std::string> failures;
  size_t failed = 0;
  std::string first_failure_code;
  for (size_t start = 0; start < keys.size(); start += kMaxDeleteBatch) {
    absl::Span<const std::string> batch = keys.subspan(start, kMaxDeleteBatch);
    const S3RequestName name{
        "POST (DeleteObjects)", config_.bucket,
        absl::StrCat(batch.front(), " and ", batch.size() - 1, " more")};
    std::string body = "<Delete><Quiet>true</Quiet>";
    for (const std::string& k : batch) {
      absl::StrAppend(&body, "<Object><Key>", XmlEscape(k), "</Key></Object>");
    }
    body += "</Delete>";
    HttpRequest req;
    req.method = "POST";
    req.url = Url("", {{"delete", ""}});
    req.headers = {"Content-Type: application/xml",
                   "Content-MD5: " + ContentMd5(body)};
    req.body = {body};
    auto resp = Execute(name, req, Idempotency::kIdempotent);
    if (!resp.ok()) return resp.status();
    tinyxml2::XMLDocument doc;
    auto root = ParseRoot(doc, resp->body, "DeleteResult", name);
    if (!root.ok()) return root.status();
    for (const tinyxml2::XMLElement* e = (*root)->FirstChildElement("Error");
         e != nullptr; e = e->NextSiblingElement("Error")) {
      const std::string code = Text(e, "Code");
      if (code == "NoSuchKey") continue;
      if (failed++ == 0) first_failure_code = code;
      if (failures.size() < 5) {
        failures.push_back(absl::StrCat("'", Text(e, "Key"), "': ", code, " ",
                                        Text(e, "Message")));
      }
    }
  }
  if (failed > 0) {
    // Denied keys stay denied; anything else (InternalError, SlowDown) may
    // go on a retry.
    return absl::Status(
        first_failure_code == "AccessDenied"
            ? absl::StatusCode::kPermissionDenied
            : absl::StatusCode::kUnavailable,
        absl::StrCat("s3 POST (DeleteObjects) ", config_.bucket, ": ", failed,
                     " of ", keys.size(),
                     " keys not deleted: ", absl::StrJoin(failures, "; ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MultipartUpload>> S3Client::ListMultipartUploads(
    std::string_view prefix) {
  const S3RequestName name{"GET (ListMultipartUploads)", config_.bucket,
                           absl::StrCat("?prefix=", Av(prefix))};
  std::vector<MultipartUpload> uploads;
  std::string key_marker, id_marker;
  for (;;) {
    QueryParams params = {{"uploads", ""},
                          {"prefix", std::string(prefix)},
                          {"max-uploads", absl::StrCat(list_page_size_)}};
    if (!key_marker.empty()) params.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) params.emplace_back("upload-id-marker", id_marker);
    HttpRequest req;
    req.url = Url("", params);
    auto resp = Execute(name, req, Idempotency::kIdempotent);
    if (!resp.ok()) return resp.status();
    tinyxml2::XMLDocument doc;
    auto root = ParseRoot(doc, resp->body, "ListMultipartUploadsResult", name);
    if (!root.ok()) return root.status();
    for (const tinyxml2::XMLElement* u = (*root)->FirstChildElement("Upload");
         u != nullptr; u = u->NextSiblingElement("Upload")) {
      MultipartUpload m;
      m.key = Text(u, "Key");
      m.upload_id = Text(u, "UploadId");
      std::string err;
      if (!absl::ParseTime(absl::RFC3339_full, Text(u, "Initiated"),
                           &m.initiated, &err)) {
        m.initiated = absl::InfinitePast();
      }
      uploads.push_back(std::move(m));
    }
    if (Text(*root, "IsTruncated") != "true") return uploads;
    std::string next_key = Text(*root, "NextKeyMarker");
    std::string next_id = Text(*root, "NextUploadIdMarker");
    if (next_key == key_marker && next_id == id_marker) {
      return absl::InternalError(absl::StrCat(
          name.Describe(), ": truncated listing did not advance its markers"));
    }
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
}

absl::Status S3Client::CreateBucket(std::string_view bucket) {
  std::string body;
  if (config_.region != "us-east-1") {
    body = absl::StrCat("<CreateBucketConfiguration><LocationConstraint>",
                        config_.region,
                        "</LocationConstraint></CreateBucketConfiguration>");
  }
  HttpRequest req;
  req.method = "PUT";
  req.url = ObjectUrl(config_, Av(bucket), "");
  if (!body.empty()) req.headers = {"Content-Type: application/xml"};
  req.body = {body};
  absl::Status s = Execute({"PUT (CreateBucket)", std::string(bucket), ""}, req,
                           Idempotency::kIdempotent)
                       .status();
  if (absl::IsAlreadyExists(s) &&
      absl::StrContains(s.message(), "BucketAlreadyOwnedByYou")) {
    return absl::OkStatus();
  }
  return s;
}

absl::Status S3Client::DeleteBucket(std::string_view bucket) {
  HttpRequest req;
  req.method = "DELETE";
  req.url = ObjectUrl(config_, Av(bucket), "");
  return Execute({"DELETE (DeleteBucket)", std::string(bucket), ""}, req,
                 Idempotency::kIdempotent)
      .status();
}

}  // namespace cairn::storage::s3
