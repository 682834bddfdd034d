// HttpClient: libcurl easy handles (pooled) over one CURLSH share handle.
#include "storage/s3/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace cairn::storage::s3 {
namespace {

static_assert(CURL_LOCK_DATA_LAST <= 8, "HttpClient::kLockKinds too small");

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Per-Perform state the callbacks see.
struct Transfer {
  CURL* curl;
  const HttpRequest* request;
  HttpResponse* response;
  // The next body byte to send: request->body[piece][offset].
  size_t piece = 0, offset = 0;
  // The first sink piece not yet filled.
  size_t sink_piece = 0;
};

size_t ReadBody(char* buffer, size_t size, size_t nitems, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const std::vector<absl::Span<const char>>& body = t->request->body;
  const size_t room = size * nitems;
  size_t n = 0;
  while (n < room && t->piece < body.size()) {
    const absl::Span<const char> p = body[t->piece];
    const size_t k = std::min(room - n, p.size() - t->offset);
    std::memcpy(buffer + n, p.data() + t->offset, k);
    n += k;
    t->offset += k;
    if (t->offset == p.size()) {
      ++t->piece;
      t->offset = 0;
    }
  }
  t->response->bytes_sent += n;
  return n;
}

int SeekBody(void* userdata, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(userdata);
  if (origin != SEEK_SET || offset < 0 ||
      static_cast<uint64_t>(offset) > BodySize(*t->request)) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  uint64_t left = static_cast<uint64_t>(offset);
  const std::vector<absl::Span<const char>>& body = t->request->body;
  t->piece = 0;
  while (t->piece < body.size() && left >= body[t->piece].size()) {
    left -= body[t->piece].size();
    ++t->piece;
  }
  t->offset = static_cast<size_t>(left);
  return CURL_SEEKFUNC_OK;
}

size_t WriteBody(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  t->response->bytes_received += n;
  if (t->request->sink.has_value() && status >= 200 && status < 300) {
    const ResponseSink& sink = *t->request->sink;
    uint64_t& used = t->response->sink_bytes;
    if (n > sink.length - used) {
      t->response->sink_overflow = true;
      return 0;  // aborts the transfer with CURLE_WRITE_ERROR
    }
    const uint64_t end = used + n;
    // Pieces are sorted and disjoint: fill the ones [used, end) reaches,
    // leaving the cursor on the first that goes on past it.
    for (; t->sink_piece < sink.pieces.size(); ++t->sink_piece) {
      const ResponseSink::Piece& p = sink.pieces[t->sink_piece];
      const uint64_t piece_end = p.at + p.out.size();
      const uint64_t lo = std::max(p.at, used), hi = std::min(piece_end, end);
      if (lo < hi) {
        std::memcpy(p.out.data() + (lo - p.at), data + (lo - used), hi - lo);
      }
      if (piece_end > end) break;
    }
    used = end;
    return n;
  }
  t->response->body.append(data, n);
  return n;
}

size_t Header(char* data, size_t size, size_t nitems, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nitems;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {  // a new response (after 100 etc.)
    t->response->etag.clear();
    t->response->content_length.reset();
    return n;
  }
  size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return n;
  absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
  absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (absl::EqualsIgnoreCase(name, "etag")) {
    t->response->etag = std::string(value);
  } else if (absl::EqualsIgnoreCase(name, "content-length")) {
    uint64_t len;
    if (absl::SimpleAtoi(value, &len)) t->response->content_length = len;
  }
  return n;
}

}  // namespace

uint64_t BodySize(const HttpRequest& request) {
  uint64_t n = 0;
  for (absl::Span<const char> p : request.body) n += p.size();
  return n;
}

struct CurlShareCallbacks {
  static void Lock(CURL* /*handle*/, curl_lock_data data,
                   curl_lock_access /*access*/,
                   void* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    static_cast<HttpClient*>(self)->share_locks_[data].Lock();
  }
  static void Unlock(CURL* /*handle*/, curl_lock_data data,
                     void* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    static_cast<HttpClient*>(self)->share_locks_[data].Unlock();
  }
};

absl::StatusOr<std::unique_ptr<HttpClient>> HttpClient::Create(
    HttpOptions options) {
  GlobalInit();
  if (options.access_key.empty() || options.secret_key.empty()) {
    return absl::InvalidArgumentError("s3 http client: no credentials");
  }
  std::unique_ptr<HttpClient> client(new HttpClient(std::move(options)));
  if (client->share_ == nullptr) {
    return absl::InternalError("curl_share_init failed");
  }
  return client;
}

HttpClient::HttpClient(HttpOptions options)
    : options_(std::move(options)),
      sigv4_(absl::StrCat("aws:amz:", options_.region, ":s3")) {
  CURLSH* share = curl_share_init();
  if (share == nullptr) return;
  curl_share_setopt(share, CURLSHOPT_USERDATA, this);
  curl_lock_function lock = &CurlShareCallbacks::Lock;
  curl_unlock_function unlock = &CurlShareCallbacks::Unlock;
  curl_share_setopt(share, CURLSHOPT_LOCKFUNC, lock);
  curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, unlock);
  curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
  share_ = share;
}

HttpClient::~HttpClient() {
  {
    absl::MutexLock lock(&mu_);
    for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
    idle_.clear();
  }
  if (share_ != nullptr) curl_share_cleanup(static_cast<CURLSH*>(share_));
}

void* HttpClient::AcquireHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void HttpClient::ReleaseHandle(void* handle) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(handle);
}

HttpResponse HttpClient::Perform(const HttpRequest& request) {
  HttpResponse response;
  CURL* curl = static_cast<CURL*>(AcquireHandle());
  if (curl == nullptr) {
    response.curl_code = CURLE_FAILED_INIT;
    response.curl_error = "curl_easy_init failed";
    return response;
  }
  curl_easy_reset(curl);
  Transfer transfer{curl, &request, &response};
  char error[CURL_ERROR_SIZE] = {0};

  curl_easy_setopt(curl, CURLOPT_SHARE, static_cast<CURLSH*>(share_));
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);  // sign what we send
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(
      curl, CURLOPT_CONNECTTIMEOUT_MS,
      static_cast<long>(std::max<int64_t>(
          1, absl::ToInt64Milliseconds(options_.connect_timeout))));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max<int64_t>(
                       1, absl::ToInt64Seconds(options_.low_speed_timeout))));
  if (!options_.ca_bundle.empty()) {
    curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_bundle.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, options_.access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, options_.secret_key.c_str());

  struct curl_slist* headers = nullptr;
  auto add_header = [&headers](const std::string& h) {
    headers = curl_slist_append(headers, h.c_str());
  };
  add_header("x-amz-content-sha256: UNSIGNED-PAYLOAD");
  // No "Expect:" to suppress 100-continue: curl 7.88 signs a header it was
  // told to remove (as "expect:" with an empty value) and the server, which
  // never sees it, computes another signature.
  if (!options_.session_token.empty()) {
    add_header("x-amz-security-token: " + options_.session_token);
  }
  for (const std::string& h : request.headers) add_header(h);

  const bool sends_body = request.method == "PUT" || request.method == "POST";
  const uint64_t body_size = BodySize(request);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                     static_cast<curl_off_t>(body_size));
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(body_size));
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  if (sends_body) {
    // curl sends "Expect: 100-continue" with every PUT and then waits up to
    // 1 s for the server's "100 Continue" before the body. Worth it for a
    // large body (a 403 costs no upload); for a small one, send at once.
    constexpr size_t kExpectContinueMin = 1 << 20;
    if (body_size < kExpectContinueMin) {
      curl_easy_setopt(curl, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
    }
    // curl copies the body through this buffer, one send() per fill. Its
    // 64 KiB default costs a rank more CPU per byte (four times the sends);
    // 256 KiB still stays in the core's cache, where larger buffers do not.
    constexpr long kUploadBufferBytes = 256 << 10;
    curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, kUploadBufferBytes);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, &SeekBody);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &transfer);
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);

  CURLcode rc = curl_easy_perform(curl);
  response.curl_code = rc;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  if (rc != CURLE_OK) {
    response.curl_error =
        error[0] != '\0' ? std::string(error) : curl_easy_strerror(rc);
    while (!response.curl_error.empty() &&
           absl::ascii_isspace(response.curl_error.back())) {
      response.curl_error.pop_back();
    }
    if (response.sink_overflow) {
      response.curl_error =
          absl::StrCat("response longer than the ", request.sink->length,
                       " bytes asked for (", response.curl_error, ")");
    }
  }
  curl_slist_free_all(headers);
  // The pointers set above die with this call; a pooled handle keeps
  // only its connection state (in the share handle).
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  ReleaseHandle(curl);
  return response;
}

}  // namespace cairn::storage::s3
