// S3 error XML -> S3ErrorBody -> absl::Status.
#include "storage/s3/s3_error.h"

#include <tinyxml2.h>

#include "absl/strings/str_cat.h"
#include "storage/s3/retry_policy.h"

namespace cairn::storage::s3 {
namespace {

std::string ChildText(const tinyxml2::XMLElement* e, const char* name) {
  const tinyxml2::XMLElement* c = e->FirstChildElement(name);
  if (c == nullptr || c->GetText() == nullptr) return "";
  return c->GetText();
}

bool IsAuthCode(absl::string_view code) {
  return code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
         code == "ExpiredToken" || code == "InvalidToken" ||
         code == "TokenRefreshRequired" ||
         code == "AuthorizationHeaderMalformed" || code == "InvalidSecurity";
}

absl::StatusCode CodeFor(long http, absl::string_view s3) {
  if (IsAuthCode(s3)) return absl::StatusCode::kUnauthenticated;
  if (IsRetryable(AttemptOutcome{0, http, std::string(s3)})) {
    return absl::StatusCode::kUnavailable;
  }
  if (s3 == "NoSuchKey" || s3 == "NoSuchBucket" || s3 == "NoSuchUpload") {
    return absl::StatusCode::kNotFound;
  }
  if (s3 == "BucketAlreadyExists" || s3 == "BucketAlreadyOwnedByYou") {
    return absl::StatusCode::kAlreadyExists;
  }
  if (s3 == "InvalidRange") return absl::StatusCode::kOutOfRange;
  switch (http) {
    case 400:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 405:
    case 409:
    case 412:
      return absl::StatusCode::kFailedPrecondition;
    case 411:
    case 413:
    case 414:
      return absl::StatusCode::kInvalidArgument;
    case 416:
      return absl::StatusCode::kOutOfRange;
    case 501:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kUnknown;
  }
}

std::string AttemptsSuffix(int attempts) {
  return attempts > 1 ? absl::StrCat(" (after ", attempts, " attempts)") : "";
}

}  // namespace

std::optional<S3ErrorBody> ParseS3ErrorXml(absl::string_view body) {
  if (body.empty()) return std::nullopt;
  tinyxml2::XMLDocument doc;
  if (doc.Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS) {
    return std::nullopt;
  }
  const tinyxml2::XMLElement* root = doc.RootElement();
  if (root == nullptr || std::string(root->Name()) != "Error") {
    return std::nullopt;
  }
  S3ErrorBody e;
  e.code = ChildText(root, "Code");
  e.message = ChildText(root, "Message");
  e.request_id = ChildText(root, "RequestId");
  e.resource = ChildText(root, "Key");
  if (e.resource.empty()) e.resource = ChildText(root, "BucketName");
  if (e.resource.empty()) e.resource = ChildText(root, "Resource");
  if (e.code.empty()) return std::nullopt;
  return e;
}

std::string S3RequestName::Describe() const {
  std::string target = bucket;
  if (!key.empty()) absl::StrAppend(&target, "/", key);
  return absl::StrCat("s3 ", method, " ", target);
}

absl::Status S3ErrorToStatus(const S3RequestName& request, long http_status,
                             absl::string_view body, int attempts) {
  std::optional<S3ErrorBody> e = ParseS3ErrorXml(body);
  std::string text = absl::StrCat(request.Describe(), ": HTTP ", http_status);
  std::string code;
  if (e) {
    code = e->code;
    absl::StrAppend(&text, " ", e->code);
    if (!e->message.empty()) absl::StrAppend(&text, ": ", e->message);
    if (!e->request_id.empty()) {
      absl::StrAppend(&text, " (request id ", e->request_id, ")");
    }
  } else if (!body.empty()) {
    constexpr size_t kMaxShown = 200;
    absl::StrAppend(&text, " (non-S3 body: ",
                    body.substr(0, std::min(body.size(), kMaxShown)),
                    body.size() > kMaxShown ? "...)" : ")");
  } else if (request.method == "HEAD") {
    absl::StrAppend(&text, " (HEAD responses have no error body)");
  }
  absl::StrAppend(&text, AttemptsSuffix(attempts));
  return absl::Status(CodeFor(http_status, code), text);
}

absl::Status TransportErrorToStatus(const S3RequestName& request,
                                    absl::string_view curl_error,
                                    absl::string_view url, int attempts) {
  return absl::UnavailableError(absl::StrCat(request.Describe(), ": ",
                                             curl_error, " (", url, ")",
                                             AttemptsSuffix(attempts)));
}

}  // namespace cairn::storage::s3
