// S3Client and HttpClient without an S3 server: against a scripted HTTP
// server on loopback (port 0) that records each request and answers from a
// queue, and against a port where nothing listens. Covers retries (which
// requests, how many, counted in Stats), the headers every request carries
// (SigV4 Authorization, x-amz-content-sha256, Content-MD5 of DeleteObjects),
// key encoding on the wire, SigV4 signatures checked by an independent
// implementation of the algorithm (OpenSSL HMAC/SHA-256), responses larger than
// the caller's buffer, and a dead server failing fast with UNAVAILABLE.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "storage/s3/http_client.h"
#include "storage/s3/s3_client.h"

namespace cairn::storage::s3 {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Recorded {
  std::string method, target, headers, body;
  std::string Header(absl::string_view name) const {
    for (absl::string_view line : absl::StrSplit(headers, "\r\n")) {
      size_t colon = line.find(':');
      if (colon != absl::string_view::npos &&
          absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
    return "";
  }
};

std::string Response(int status, absl::string_view body,
                     absl::string_view extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status,
                      " X\r\nContent-Length: ", body.size(), "\r\n",
                      extra_headers, "\r\n", body);
}

// A minimal HTTP/1.1 server: keep-alive connections, one thread each.
class ScriptedServer {
 public:
  ScriptedServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    listen(listen_fd_, 16);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~ScriptedServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    acceptor_.join();
    {
      absl::MutexLock lock(&mu_);
      for (int fd : conns_) shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : workers_) t.join();
  }
  int port() const { return port_; }
  void Push(std::string response) {
    absl::MutexLock lock(&mu_);
    script_.push_back(std::move(response));
  }
  std::vector<Recorded> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  void AcceptLoop() {
    for (;;) {
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      absl::MutexLock lock(&mu_);
      conns_.push_back(fd);
      workers_.emplace_back([this, fd] { Serve(fd); });
    }
  }
  void Serve(int fd) {
    std::string buf;
    char chunk[65536];
    for (;;) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n <= 0) return close(fd), void();
        buf.append(chunk, n);
      }
      Recorded r;
      r.headers = buf.substr(0, end);
      std::vector<std::string> first =
          absl::StrSplit(r.headers.substr(0, r.headers.find("\r\n")), ' ');
      r.method = first[0];
      r.target = first.size() > 1 ? first[1] : "";
      size_t body_len = 0;
      (void)absl::SimpleAtoi(r.Header("Content-Length"), &body_len);
      buf.erase(0, end + 4);
      while (buf.size() < body_len) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n <= 0) return close(fd), void();
        buf.append(chunk, n);
      }
      r.body = buf.substr(0, body_len);
      buf.erase(0, body_len);
      std::string response = Response(200, "");
      {
        absl::MutexLock lock(&mu_);
        requests_.push_back(r);
        if (!script_.empty()) {
          response = std::move(script_.front());
          script_.pop_front();
        }
      }
      if (response == "close") return close(fd), void();
      if (response == "hang") continue;  // never answer this request
      if (write(fd, response.data(), response.size()) < 0) return;
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  absl::Mutex mu_;
  std::deque<std::string> script_ ABSL_GUARDED_BY(mu_);
  std::vector<Recorded> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<int> conns_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
};

S3Config ConfigFor(int port) {
  S3Config c;
  c.bucket = "bkt";
  c.endpoint = absl::StrCat("http://127.0.0.1:", port);
  c.access_key = "AKID";
  c.secret_key = "SECRET";
  c.credentials_source = "test";
  return c;
}

std::unique_ptr<S3Client> Client(const S3Config& config) {
  auto c = S3Client::Create(config);
  EXPECT_TRUE(c.ok()) << c.status();
  (*c)->SetRetryPolicyForTest(RetryPolicy{
      config.max_attempts, absl::Milliseconds(1), absl::Milliseconds(4)});
  return std::move(*c);
}

// SigV4 written from the AWS specification, independently of curl and of
// s3_url.cc: the canonical request is built from the key and query
// parameters the test meant to send, not from what arrived.
std::string RefEncode(absl::string_view s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' ||
        c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

std::string Hmac(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<char*>(md), len));
}

// The signature `r` should carry for `path` (decoded: "/bucket/key") and
// `query` (decoded name/value pairs) with access key AKID, secret SECRET.
std::string ExpectedSignature(
    const Recorded& r, absl::string_view path,
    std::vector<std::pair<std::string, std::string>> query) {
  const std::string auth = r.Header("Authorization");
  size_t sh = auth.find("SignedHeaders=");
  std::string signed_headers =
      auth.substr(sh + 14, auth.find(',', sh) - (sh + 14));
  std::string canonical_headers;
  for (absl::string_view h : absl::StrSplit(signed_headers, ';')) {
    absl::StrAppend(&canonical_headers, h, ":", r.Header(h), "\n");
  }
  std::vector<std::string> q;
  for (auto& [k, v] : query) {
    q.push_back(absl::StrCat(RefEncode(k, false), "=", RefEncode(v, false)));
  }
  std::sort(q.begin(), q.end());
  const std::string canonical = absl::StrCat(
      r.method, "\n", RefEncode(path, true), "\n", absl::StrJoin(q, "&"), "\n",
      canonical_headers, "\n", signed_headers, "\nUNSIGNED-PAYLOAD");
  const std::string amz_date = r.Header("x-amz-date");
  const std::string date = amz_date.substr(0, 8);
  const std::string scope = absl::StrCat(date, "/us-east-1/s3/aws4_request");
  const std::string to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", amz_date, "\n",
                                           scope, "\n", Sha256Hex(canonical));
  std::string key = Hmac("AWS4SECRET", date);
  key = Hmac(key, "us-east-1");
  key = Hmac(key, "s3");
  key = Hmac(key, "aws4_request");
  return absl::BytesToHexString(Hmac(key, to_sign));
}

std::string SignatureOf(const Recorded& r) {
  const std::string auth = r.Header("Authorization");
  size_t p = auth.find("Signature=");
  return p == std::string::npos ? "" : auth.substr(p + 10);
}

constexpr char kSlowDown[] =
    "<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>";

TEST(S3ClientLocalTest, EveryRequestIsSignedAndUnsignedPayload) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  ASSERT_TRUE(
      client->PutObject("dir/a b+c=ü", absl::MakeConstSpan("hello", 5)).ok());
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "PUT");
  EXPECT_EQ(reqs[0].target, "/bkt/dir/a%20b%2Bc%3D%C3%BC");
  EXPECT_EQ(reqs[0].body, "hello");
  EXPECT_EQ(reqs[0].Header("x-amz-content-sha256"), "UNSIGNED-PAYLOAD");
  EXPECT_THAT(reqs[0].Header("Authorization"),
              HasSubstr("AWS4-HMAC-SHA256 Credential=AKID/"));
  EXPECT_THAT(reqs[0].Header("Authorization"),
              HasSubstr("/us-east-1/s3/aws4_request"));
  EXPECT_THAT(reqs[0].Header("Authorization"),
              HasSubstr("x-amz-content-sha256"));
  EXPECT_NE(reqs[0].Header("x-amz-date"), "");
  EXPECT_EQ(client->stats().requests, 1u);
  EXPECT_EQ(client->stats().bytes_sent, 5u);
}

TEST(S3ClientLocalTest, SignaturesMatchAnIndependentSigV4) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  const std::vector<std::string> keys = {
      "plain/key.data", "sp ace/a b",  "plus+sign=eq", "ünï/ключ/日本",
      "pct%20lit",      "q?m#h&a;b,c", "star*(p)'!$@", "a/./b//c"};
  for (const std::string& k : keys) {
    ASSERT_TRUE(client->PutObject(k, absl::MakeConstSpan("x", 1)).ok());
    char out[1];
    server.Push(Response(206, "x"));
    ASSERT_TRUE(client->GetRange(k, {0, 1}, absl::MakeSpan(out, 1)).ok());
  }
  server.Push(Response(200, "<ListBucketResult/>"));
  ASSERT_TRUE(client->ListCommonPrefixes("sp ace/+=ü", nullptr).ok());
  server.Push(Response(200,
                       "<InitiateMultipartUploadResult><UploadId>U+1/="
                       "</UploadId></InitiateMultipartUploadResult>"));
  ASSERT_TRUE(client->CreateMultipartUpload("mp key").ok());
  server.Push(Response(200, "", "ETag: \"e\"\r\n"));
  ASSERT_TRUE(
      client->UploadPart("mp key", "U+1/=", 7, absl::MakeConstSpan("p", 1))
          .ok());
  server.Push(Response(200, "<DeleteResult/>"));
  std::vector<std::string> del = {"a"};
  ASSERT_TRUE(client->DeleteObjects(del).ok());

  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2 * keys.size() + 4);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const Recorded& r : {reqs[2 * i], reqs[2 * i + 1]}) {
      EXPECT_EQ(r.target, RefEncode("/bkt/" + keys[i], true));
      EXPECT_EQ(SignatureOf(r), ExpectedSignature(r, "/bkt/" + keys[i], {}))
          << r.method << " " << keys[i];
    }
  }
  const Recorded& list = reqs[2 * keys.size()];
  EXPECT_EQ(SignatureOf(list), ExpectedSignature(list, "/bkt",
                                                 {{"list-type", "2"},
                                                  {"prefix", "sp ace/+=ü"},
                                                  {"delimiter", "/"},
                                                  {"max-keys", "1000"}}));
  const Recorded& create = reqs[2 * keys.size() + 1];
  EXPECT_EQ(SignatureOf(create),
            ExpectedSignature(create, "/bkt/mp key", {{"uploads", ""}}));
  const Recorded& part = reqs[2 * keys.size() + 2];
  EXPECT_EQ(SignatureOf(part),
            ExpectedSignature(part, "/bkt/mp key",
                              {{"uploadId", "U+1/="}, {"partNumber", "7"}}));
  const Recorded& batch = reqs[2 * keys.size() + 3];
  EXPECT_THAT(batch.Header("Authorization"), HasSubstr("content-md5"));
  EXPECT_EQ(SignatureOf(batch),
            ExpectedSignature(batch, "/bkt", {{"delete", ""}}));
  // A wrong secret would give another signature (the check can fail).
  EXPECT_NE(SignatureOf(reqs[0]), "");
}

TEST(S3ClientLocalTest, SessionTokenHeader) {
  ScriptedServer server;
  S3Config config = ConfigFor(server.port());
  config.session_token = "TOKEN123";
  ASSERT_TRUE(Client(config)->DeleteObject("k").ok());
  ASSERT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(server.requests()[0].Header("x-amz-security-token"), "TOKEN123");
}

TEST(S3ClientLocalTest, RetriesIdempotentRequestsAndCountsThem) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  // The connection dropped without a response (on a fresh connection: curl
  // itself silently resends a request whose reused connection died).
  server.Push("close");
  server.Push(Response(503, kSlowDown));
  server.Push(Response(500, ""));
  server.Push(Response(206, "abc", "Content-Range: bytes 0-2/10\r\n"));
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  Logger().sinks().push_back(log);
  char out[3];
  auto n = client->GetRange("k", {0, 3}, absl::MakeSpan(out, 3));
  Logger().sinks().pop_back();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3u);
  // Each retry is logged while it happens, naming the request and why.
  std::vector<std::string> lines;
  for (const auto& m : log->last_raw()) {
    lines.emplace_back(m.payload.data(), m.payload.size());
  }
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  EXPECT_THAT(lines[0], HasSubstr("s3 GET"));
  EXPECT_THAT(lines[0], HasSubstr("/k: attempt 1 of 6 failed ("));
  EXPECT_THAT(lines[1], HasSubstr("attempt 2 of 6 failed (HTTP 503 SlowDown)"));
  EXPECT_THAT(lines[2], HasSubstr("attempt 3 of 6 failed (HTTP 500)"));
  EXPECT_THAT(lines[2], HasSubstr("; retrying in "));
  EXPECT_EQ(std::string(out, 3), "abc");
  EXPECT_EQ(server.requests().size(), 4u);
  EXPECT_EQ(server.requests()[0].Header("Range"), "bytes=0-2");
  EXPECT_EQ(client->stats().requests, 4u);
  EXPECT_EQ(client->stats().retries, 3u);
}

TEST(S3ClientLocalTest, PartInPiecesIsSentWholeAndResentWholeOnRetry) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  // Pieces of every kind: empty, one byte, and ones longer than curl's
  // upload buffer, so a buffer fill spans pieces.
  std::string a(300 << 10, 'a'), b = "b", c(700 << 10, 'c');
  for (size_t i = 0; i < c.size(); i += 4093) c[i] = static_cast<char>(i);
  const std::string whole = a + b + c;
  server.Push(Response(503, kSlowDown));
  server.Push(Response(200, "", "ETag: \"e2\"\r\n"));
  auto etag = client->UploadPartPieces(
      "k", "U", 2,
      {absl::MakeConstSpan(a), absl::Span<const char>(), absl::MakeConstSpan(b),
       absl::MakeConstSpan(c)});
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_EQ(*etag, "\"e2\"");
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  for (const Recorded& r : reqs) {
    EXPECT_EQ(r.method, "PUT");
    EXPECT_EQ(r.Header("Content-Length"), absl::StrCat(whole.size()));
    EXPECT_TRUE(r.body == whole) << "a body of " << r.body.size() << " bytes";
  }
  EXPECT_EQ(client->stats().bytes_sent, 2 * whole.size());
}

TEST(S3ClientLocalTest, GivesUpAfterMaxAttemptsWithUnavailable) {
  ScriptedServer server;
  S3Config config = ConfigFor(server.port());
  config.max_attempts = 3;
  auto client = Client(config);
  for (int i = 0; i < 3; ++i) server.Push(Response(503, kSlowDown));
  absl::Status s = client->PutObject("job/x", absl::MakeConstSpan("a", 1));
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kUnavailable,
                  HasSubstr("s3 PUT bkt/job/x: HTTP 503 SlowDown: Reduce your "
                            "rate (after 3 attempts)")));
  EXPECT_EQ(server.requests().size(), 3u);
  // The body was resent in full each time.
  for (const auto& r : server.requests()) EXPECT_EQ(r.body, "a");
}

TEST(S3ClientLocalTest, NonRetryableErrorsAreNotRetried) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  server.Push(Response(403,
                       "<Error><Code>AccessDenied</Code><Message>no</Message>"
                       "</Error>"));
  absl::Status s = client->DeleteObject("k");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(client->stats().retries, 0u);
}

TEST(S3ClientLocalTest, CreateMultipartUploadIsRetriedWhenThrottled) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  server.Push(Response(503, kSlowDown));
  server.Push(Response(200,
                       "<InitiateMultipartUploadResult><UploadId>U1/x"
                       "</UploadId></InitiateMultipartUploadResult>"));
  auto id = client->CreateMultipartUpload("big");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(server.requests().size(), 2u);
  EXPECT_EQ(server.requests()[0].target, "/bkt/big?uploads=");
  EXPECT_EQ(server.requests()[1].target, "/bkt/big?uploads=");
  EXPECT_EQ(client->stats().retries, 1u);
  EXPECT_EQ(*id, "U1/x");
  // The upload id is encoded in later requests.
  server.Push(Response(200, "", "ETag: \"e1\"\r\n"));
  auto etag = client->UploadPart("big", *id, 1, absl::MakeConstSpan("p", 1));
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_EQ(*etag, "\"e1\"");
  EXPECT_EQ(server.requests().back().target,
            "/bkt/big?partNumber=1&uploadId=U1%2Fx");
}

TEST(S3ClientLocalTest, CompleteWithErrorInA200BodyIsRetried) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  server.Push(Response(
      200, "<Error><Code>InternalError</Code><Message>m</Message></Error>"));
  server.Push(Response(200,
                       "<CompleteMultipartUploadResult><ETag>\"x\"</ETag>"
                       "</CompleteMultipartUploadResult>"));
  std::vector<std::string> etags = {"\"a\"", "\"b&c\""};
  ASSERT_TRUE(client->CompleteMultipartUpload("k", "U", etags).ok());
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(
      reqs[1].body,
      "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"
      "&quot;a&quot;</ETag></Part><Part><PartNumber>2</PartNumber>"
      "<ETag>&quot;b&amp;c&quot;</ETag></Part></CompleteMultipartUpload>");
}

TEST(S3ClientLocalTest, RetriedCompleteThatFindsNoUploadChecksTheObject) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  server.Push("close");  // the first Complete's response is lost
  server.Push(Response(404, "<Error><Code>NoSuchUpload</Code></Error>"));
  server.Push(Response(200, "", "Content-Length: 9\r\n"));  // HEAD: exists
  std::vector<std::string> etags = {"\"a\""};
  ASSERT_TRUE(client->CompleteMultipartUpload("k", "U", etags).ok());
  ASSERT_EQ(server.requests().size(), 3u);
  EXPECT_EQ(server.requests()[2].method, "HEAD");
  // Without a retry, NoSuchUpload is an error.
  server.Push(Response(404, "<Error><Code>NoSuchUpload</Code></Error>"));
  absl::Status s = client->CompleteMultipartUpload("k", "U", etags);
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("NoSuchUpload")));
}

TEST(S3ClientLocalTest, DeleteObjectsSendsContentMd5AndReportsFailures) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  std::vector<std::string> keys;
  for (int i = 0; i < 2500; ++i) keys.push_back(absl::StrCat("k<", i, ">"));
  server.Push(Response(200, "<DeleteResult></DeleteResult>"));
  server.Push(Response(200,
                       "<DeleteResult><Error><Key>k&lt;1500&gt;</Key><Code>"
                       "AccessDenied</Code><Message>no</Message></Error>"
                       "<Error><Key>k&lt;1501&gt;</Key><Code>NoSuchKey</Code>"
                       "</Error></DeleteResult>"));
  server.Push(Response(200, "<DeleteResult></DeleteResult>"));
  absl::Status s = client->DeleteObjects(keys);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          AllOf(HasSubstr("1 of 2500 keys not deleted"),
                                HasSubstr("'k<1500>': AccessDenied no"))));
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].target, "/bkt?delete=");
  EXPECT_THAT(reqs[0].body, HasSubstr("<Key>k&lt;0&gt;</Key>"));
  EXPECT_THAT(reqs[0].body, HasSubstr("<Key>k&lt;999&gt;</Key>"));
  EXPECT_THAT(reqs[0].body, ::testing::Not(HasSubstr("k&lt;1000&gt;")));
  EXPECT_THAT(reqs[2].body, HasSubstr("<Key>k&lt;2499&gt;</Key>"));
  for (const auto& r : reqs) EXPECT_NE(r.Header("Content-MD5"), "");
}

TEST(S3ClientLocalTest, ContentMd5OfAKnownBody) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  server.Push(Response(200, "<DeleteResult/>"));
  std::vector<std::string> keys = {"a"};
  ASSERT_TRUE(client->DeleteObjects(keys).ok());
  const std::string body =
      "<Delete><Quiet>true</Quiet><Object><Key>a</Key></Object></Delete>";
  ASSERT_EQ(server.requests()[0].body, body);
  // md5sum of that body, base64 (openssl dgst -md5 -binary | base64).
  EXPECT_EQ(server.requests()[0].Header("Content-MD5"),
            "kr09joMOwMlnmHIATQxZjg==");
}

TEST(S3ClientLocalTest, ResponseLargerThanTheBufferIsAnError) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  server.Push(Response(206, "abcdef"));  // asked for 3, got 6
  char out[3];
  auto n = client->GetRange("k", {0, 3}, absl::MakeSpan(out, 3));
  EXPECT_THAT(n, StatusIs(absl::StatusCode::kInternal,
                          HasSubstr("longer than the 3 bytes asked for")));
  EXPECT_EQ(server.requests().size(), 1u);
}

// A body arriving in many writes is scattered into disjoint pieces with
// gaps: each piece gets its bytes, the gaps and the guard bytes around every
// piece are never written.
TEST(S3ClientLocalTest, ScatteredGetWritesOnlyItsPieces) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  std::mt19937_64 rng(17);
  for (int round = 0; round < 8; ++round) {
    std::string body(1 + rng() % (1 << 20), '\0');
    for (char& c : body) c = static_cast<char>(rng());
    // Random disjoint pieces: cut points, every other interval kept.
    std::vector<uint64_t> cuts = {0, body.size()};
    for (int i = 0, n = static_cast<int>(rng() % 64); i < n; ++i) {
      cuts.push_back(rng() % body.size());
    }
    std::sort(cuts.begin(), cuts.end());
    constexpr size_t kGuard = 8;
    std::vector<std::string> bufs;
    std::vector<std::pair<uint64_t, uint64_t>> kept;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      if ((i + round) % 2 == 0 && cuts[i + 1] > cuts[i]) {
        kept.push_back({cuts[i], cuts[i + 1] - cuts[i]});
        bufs.emplace_back(kGuard + kept.back().second + kGuard, '#');
      }
    }
    ResponseSink sink{body.size(), {}};
    for (size_t i = 0; i < kept.size(); ++i) {
      sink.pieces.push_back(
          {kept[i].first, absl::MakeSpan(&bufs[i][kGuard], kept[i].second)});
    }
    server.Push(Response(206, body));
    auto n = client->GetRange("k", {0, body.size()}, sink);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, body.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      const std::string guard(kGuard, '#');
      EXPECT_EQ(bufs[i].substr(0, kGuard), guard) << round << " " << i;
      EXPECT_EQ(bufs[i].substr(kGuard, kept[i].second),
                body.substr(kept[i].first, kept[i].second))
          << round << " " << i;
      EXPECT_EQ(bufs[i].substr(kGuard + kept[i].second), guard)
          << round << " " << i;
    }
  }
}

TEST(S3ClientLocalTest, ScatteredGetRefusesBadSinks) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  char a[8], b[8];
  const ResponseSink overlapping{
      16, {{0, absl::MakeSpan(a, 8)}, {4, absl::MakeSpan(b, 8)}}};
  const ResponseSink past_end{
      16, {{0, absl::MakeSpan(a, 8)}, {12, absl::MakeSpan(b, 8)}}};
  const ResponseSink far_past_end{16, {{40, absl::MakeSpan(a, 8)}}};
  const ResponseSink unsorted{
      16, {{8, absl::MakeSpan(a, 8)}, {0, absl::MakeSpan(b, 8)}}};
  for (const ResponseSink* sink :
       {&overlapping, &past_end, &far_past_end, &unsorted}) {
    auto n = client->GetRange("k", {0, 16}, *sink);
    EXPECT_THAT(n, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("overlaps another or passes")));
  }
  auto n =
      client->GetRange("k", {0, 20}, ResponseSink::Into(absl::MakeSpan(a)));
  EXPECT_THAT(n, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("a sink of 8 bytes for a range of 20")));
  EXPECT_TRUE(server.requests().empty());
}

TEST(S3ClientLocalTest, ListFollowsContinuationTokens) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  client->SetListPageSizeForTest(2);
  server.Push(Response(
      200,
      "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>p/a"
      "</Key><Size>1</Size></Contents><Contents><Key>p/b &amp; c</Key><Size>2"
      "</Size></Contents><NextContinuationToken>t/1=</NextContinuationToken>"
      "</ListBucketResult>"));
  server.Push(Response(
      200,
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/c"
      "</Key><Size>3</Size></Contents></ListBucketResult>"));
  auto list = client->ListObjects("p/");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[1].key, "p/b & c");
  EXPECT_EQ((*list)[2].size, 3u);
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].target, "/bkt?list-type=2&max-keys=2&prefix=p%2F");
  EXPECT_EQ(reqs[1].target,
            "/bkt?continuation-token=t%2F1%3D&list-type=2&max-keys=2&"
            "prefix=p%2F");
}

TEST(S3ClientLocalTest, VirtualHostedAddressingSendsTheBucketInHost) {
  ScriptedServer server;
  S3Config config = ConfigFor(server.port());
  config.path_style = false;
  // bkt.localhost resolves to loopback (RFC 6761; glibc/curl do so).
  config.endpoint = absl::StrCat("http://localhost:", server.port());
  auto client = Client(config);
  ASSERT_TRUE(client->DeleteObject("x/y").ok());
  ASSERT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(server.requests()[0].target, "/x/y");
  EXPECT_EQ(server.requests()[0].Header("Host"),
            absl::StrCat("bkt.localhost:", server.port()));
}

TEST(S3ClientLocalTest, ServerDownIsUnavailableAfterAFewFastAttempts) {
  // A bound socket that never listens: connections are refused.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  S3Config config = ConfigFor(ntohs(addr.sin_port));
  auto client = Client(config);
  absl::Status s = client->CheckAccess();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          AllOf(HasSubstr("s3 GET (ListObjectsV2) bkt: "),
                                HasSubstr("after 6 attempts"),
                                HasSubstr(config.endpoint))));
  EXPECT_EQ(client->stats().requests, 6u);
  EXPECT_EQ(client->stats().retries, 5u);
  // Even a non-idempotent request is retried: it was never sent.
  auto id = client->CreateMultipartUpload("k");
  EXPECT_THAT(id, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(client->stats().requests, 12u);
  close(fd);
}

TEST(S3ClientLocalTest, BadCaBundleIsNotRetried) {
  ScriptedServer server;
  S3Config config = ConfigFor(server.port());
  config.endpoint = absl::StrCat("https://127.0.0.1:", server.port());
  config.ca_bundle = "/nonexistent/ca.pem";
  auto client = Client(config);
  absl::Status s = client->HeadObject("k").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ca.pem")));
  EXPECT_EQ(client->stats().requests, 1u) << s;
}

}  // namespace
}  // namespace cairn::storage::s3

namespace cairn::storage::s3 {
namespace {

TEST(S3ClientLocalTest, ConcurrentRequestsThroughTheSharedConnectionPool) {
  ScriptedServer server;
  auto client = Client(ConfigFor(server.port()));
  constexpr int kThreads = 8, kEach = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string body = absl::StrCat(t, "/", i);
        if (!client->PutObject(body, absl::MakeConstSpan(body)).ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), static_cast<size_t>(kThreads * kEach));
  for (const Recorded& r : reqs) EXPECT_EQ(r.target, "/bkt/" + r.body);
  EXPECT_EQ(client->stats().requests, static_cast<uint64_t>(kThreads * kEach));
  EXPECT_EQ(client->stats().retries, 0u);
}

}  // namespace
}  // namespace cairn::storage::s3

namespace cairn::storage::s3 {
namespace {

TEST(S3ClientLocalTest, ASilentServerTimesOutInsteadOfHanging) {
  ScriptedServer server;
  S3Config config = ConfigFor(server.port());
  config.max_attempts = 2;
  config.low_speed_timeout = absl::Seconds(1);
  auto client = Client(config);
  server.Push("hang");
  server.Push("hang");
  auto size = client->HeadObject("k");
  EXPECT_THAT(size, StatusIs(absl::StatusCode::kUnavailable,
                             AllOf(HasSubstr("s3 HEAD bkt/k: "),
                                   HasSubstr("after 2 attempts"))));
  EXPECT_EQ(client->stats().retries, 1u);
}

}  // namespace
}  // namespace cairn::storage::s3
