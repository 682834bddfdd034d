#include "storage/s3/s3_shard_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "storage/s3/http_client.h"

namespace cairn::storage::s3 {
namespace {

// S3 allows at most 10,000 parts per upload and 5 GiB per part.
constexpr int kMaxParts = 10000;
// Part n (1-based) is part_bytes << ((n - 1) / kPartsPerDoubling), capped at
// kMaxPartBytes: 1,000 parts of 16 MiB, then of 32 MiB, ... so an object of
// any size S3 accepts (5 TiB) fits in 10,000 parts.
constexpr int kPartsPerDoubling = 1000;

std::string Quoted(absl::string_view s) { return absl::StrCat("'", s, "'"); }

uint64_t PartSize(uint64_t part_bytes, int part_number) {
  const int doublings = std::min((part_number - 1) / kPartsPerDoubling, 20);
  uint64_t size = part_bytes;
  for (int i = 0; i < doublings && size < kMaxPartBytes; ++i) size *= 2;
  return std::min(size, kMaxPartBytes);
}

// An Append at least this long is sent from the caller's memory (see
// S3Writer::Append); a shorter one is copied.
constexpr uint64_t kMinBorrowBytes = 1 << 20;

// The size of the next part when `total` bytes are ready to go as parts of
// [lo, n] bytes: `total` itself when it fits one part, else an even share of
// the fewest parts of at most n bytes, unless such shares would fall below
// lo (possible when lo > n / 2): then a full part.
uint64_t NextCut(uint64_t total, uint64_t n, uint64_t lo) {
  if (total <= n) return total;
  const uint64_t parts = (total + n - 1) / n;
  if (total / parts < lo) return n;
  return (total + parts - 1) / parts;
}

class S3Store;

// One object being written; see the header for the protocol.
class S3Writer : public ObjectWriter {
 public:
  S3Writer(S3Client& client, std::string key, std::string full_key,
           const WriterOptions& options)
      : client_(client),
        key_(std::move(key)),
        full_key_(std::move(full_key)),
        expected_bytes_(options.expected_bytes) {}

  ~S3Writer() override {
    WaitForParts();
    if (!closed_ && !crashed_ && !upload_id_.empty()) AbortUpload();
  }

  // A long Append is cut into parts sent straight from `data` (no copy),
  // each of [max(n / 2, 5 MiB), n] bytes for the nominal part size n (the
  // last may end early at the end of `data`, so no tail of it has to be
  // copied), the first one led by the bytes still pending from earlier
  // Appends; Append returns once those parts are uploaded (the caller may
  // reuse `data` then). What is left, and short Appends, is copied into the
  // pending buffer, which goes as a part of its own (in the background) once
  // it holds n bytes.
  absl::Status Append(absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(CheckUsable());
    const S3Config& config = client_.config();
    // An object that can still be a single PUT is buffered whole.
    if (upload_id_.empty() && expected_bytes_ <= config.single_put_max_bytes &&
        pending_.size() + data.size() <= config.single_put_max_bytes) {
      pending_.insert(pending_.end(), data.data(), data.data() + data.size());
      bytes_written_ += data.size();
      return absl::OkStatus();
    }
    bool borrowed = false;
    if (data.size() >= kMinBorrowBytes) {
      for (;;) {
        const uint64_t n = NextPartSize();
        if (pending_.size() >= n) {
          CAIRN_RETURN_IF_ERROR(Fail(ShipPart(n, {})));
          continue;
        }
        const uint64_t total = pending_.size() + data.size();
        const uint64_t lo = std::min(n, std::max(n / 2, kMinPartBytes));
        if (data.empty() || total < lo) break;
        const uint64_t cut =
            std::max<uint64_t>(NextCut(total, n, lo), pending_.size());
        const size_t take = static_cast<size_t>(cut - pending_.size());
        CAIRN_RETURN_IF_ERROR(
            Fail(ShipPart(pending_.size(), data.subspan(0, take))));
        borrowed = borrowed || take > 0;
        data.remove_prefix(take);
        bytes_written_ += take;
      }
    }
    while (!data.empty()) {
      const uint64_t n = NextPartSize();
      const size_t k = static_cast<size_t>(std::min<uint64_t>(
          n - std::min<uint64_t>(n, pending_.size()), data.size()));
      if (pending_.capacity() < pending_.size() + k) {
        // A part's buffer grows once to the part's size, not by doubling.
        pending_.reserve(static_cast<size_t>(n));
      }
      pending_.insert(pending_.end(), data.data(), data.data() + k);
      data.remove_prefix(k);
      bytes_written_ += k;
      if (pending_.size() >= n) CAIRN_RETURN_IF_ERROR(Fail(ShipPart(n, {})));
    }
    // The caller may reuse `data` once this returns: the parts sent from it
    // (the newest ones) must be done.
    if (borrowed) CAIRN_RETURN_IF_ERROR(Fail(CollectParts(/*keep=*/0)));
    return absl::OkStatus();
  }

  absl::Status Close() override {
    CAIRN_RETURN_IF_ERROR(CheckUsable());
    closing_ = true;
    if (upload_id_.empty() &&
        pending_.size() <= client_.config().single_put_max_bytes) {
      absl::Status s = client_.PutObject(
          full_key_, absl::MakeConstSpan(pending_.data(), pending_.size()));
      if (!s.ok()) return Fail(Named(s));
      closed_ = true;
      pending_ = {};
      return absl::OkStatus();
    }
    if (!pending_.empty()) {
      CAIRN_RETURN_IF_ERROR(Fail(ShipPart(pending_.size(), {})));
    }
    absl::Status s = CollectParts(/*keep=*/0);
    spare_ = {};
    pending_ = {};
    if (!s.ok()) return Fail(s);
    s = client_.CompleteMultipartUpload(full_key_, upload_id_, etags_);
    if (absl::IsNotFound(s)) {
      // A retried Complete whose first attempt succeeded (the answer was
      // lost) finds the upload gone: the object is there if it has our size.
      absl::StatusOr<uint64_t> size = client_.HeadObject(full_key_);
      if (size.ok() && *size == bytes_written_) s = absl::OkStatus();
    }
    if (!s.ok()) return Fail(Named(s));
    closed_ = true;
    return absl::OkStatus();
  }

  uint64_t bytes_written() const override { return bytes_written_; }

  void SimulateCrashForTest() override {
    // What a dead process leaves: the parts already sent, the upload in
    // progress, nothing visible.
    WaitForParts();
    crashed_ = true;
    pending_ = {};
  }

 private:
  absl::Status CheckUsable() const {
    if (crashed_) {
      return absl::FailedPreconditionError(
          absl::StrCat("writer of ", Quoted(key_), " crashed (test)"));
    }
    if (!error_.ok()) return error_;
    if (closed_ || closing_) {
      return absl::FailedPreconditionError(
          absl::StrCat("writer of ", Quoted(key_), " is already closed"));
    }
    return absl::OkStatus();
  }

  // Records the writer's first error (aborting the upload) and returns it.
  absl::Status Fail(absl::Status s) {
    if (s.ok()) return s;
    if (error_.ok()) {
      error_ = s;
      WaitForParts();
      if (!upload_id_.empty()) AbortUpload();
      pending_ = {};
    }
    return error_;
  }

  absl::Status Named(const absl::Status& s) const {
    return absl::Status(
        s.code(), absl::StrCat("writing ", Quoted(key_), " (", bytes_written_,
                               " bytes): ", s.message()));
  }

  uint64_t NextPartSize() const {
    return PartSize(client_.config().part_bytes,
                    static_cast<int>(etags_.size() + in_flight_.size()) + 1);
  }

  absl::Status StartUpload() {
    absl::StatusOr<std::string> id = client_.CreateMultipartUpload(full_key_);
    if (!id.ok()) return Named(id.status());
    upload_id_ = *std::move(id);
    return absl::OkStatus();
  }

  // Sends the next part in the background, after waiting for a slot (and
  // starting the upload if this is its first part): the first `own` pending
  // bytes, then `borrowed` (which the caller keeps alive until the part is
  // collected).
  absl::Status ShipPart(uint64_t own, absl::Span<const char> borrowed) {
    if (upload_id_.empty()) CAIRN_RETURN_IF_ERROR(StartUpload());
    const int number = static_cast<int>(etags_.size() + in_flight_.size()) + 1;
    if (number > kMaxParts) {
      return Named(absl::ResourceExhaustedError(absl::StrCat(
          "more than ", kMaxParts, " parts; raise part_bytes in the URI")));
    }
    const int window = std::max(client_.config().upload_concurrency, 1);
    CAIRN_RETURN_IF_ERROR(CollectParts(/*keep=*/window - 1));
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(own, pending_.size()));
    // The pending buffer normally goes whole (no copy) and the next part
    // fills the buffer of one already uploaded, if any.
    auto part = std::make_unique<std::vector<char>>();
    if (n == pending_.size()) {
      part->swap(pending_);
      if (!spare_.empty()) {
        pending_.swap(spare_.back());
        spare_.pop_back();
      }
    } else {
      part->assign(pending_.begin(), pending_.begin() + n);
      pending_.erase(pending_.begin(), pending_.begin() + n);
    }
    std::vector<absl::Span<const char>> pieces;
    if (!part->empty()) pieces.push_back(absl::MakeConstSpan(*part));
    if (!borrowed.empty()) pieces.push_back(borrowed);
    InFlightPart f;
    f.data = std::move(part);
    f.etag = std::async(
        std::launch::async,
        [this, number,
         pieces = std::move(pieces)]() mutable -> absl::StatusOr<std::string> {
          return client_.UploadPartPieces(full_key_, upload_id_, number,
                                          std::move(pieces));
        });
    in_flight_.push_back(std::move(f));
    return absl::OkStatus();
  }

  // Waits for the oldest parts in flight until at most `keep` remain,
  // recording their ETags in order; the first failure is returned.
  absl::Status CollectParts(size_t keep) {
    absl::Status first;
    while (in_flight_.size() > keep) {
      absl::StatusOr<std::string> etag = in_flight_.front().etag.get();
      // Its buffer is kept for a later part: memory the process already has
      // is filled far cheaper than fresh pages (one fault per 4 KiB).
      if (etag.ok() && spare_.empty() &&
          in_flight_.front().data->capacity() > 0) {
        spare_.push_back(std::move(*in_flight_.front().data));
        spare_.back().clear();
      }
      in_flight_.pop_front();
      if (!etag.ok()) {
        if (first.ok()) first = Named(etag.status());
        keep = 0;  // a failed upload is over: wait for the rest too
        continue;
      }
      if (first.ok()) etags_.push_back(*std::move(etag));
    }
    return first;
  }

  void WaitForParts() {
    for (auto& f : in_flight_) f.etag.wait();
    in_flight_.clear();
  }

  void AbortUpload() {
    absl::Status s = client_.AbortMultipartUpload(full_key_, upload_id_);
    if (!s.ok()) {
      CAIRN_LOG(warn,
                "could not abort the multipart upload of {} ({}); "
                "recovery or gc will: {}",
                Quoted(key_), upload_id_, s.ToString());
    }
  }

  S3Client& client_;
  const std::string key_, full_key_;
  const uint64_t expected_bytes_;
  std::vector<char> pending_;
  uint64_t bytes_written_ = 0;
  std::string upload_id_;
  std::vector<std::string> etags_;
  // A part being uploaded: the pending bytes it took (owned here, read by
  // the upload; empty when it is all borrowed) and the upload's ETag. The
  // future is destroyed first (it waits for the upload), then the bytes.
  struct InFlightPart {
    std::unique_ptr<std::vector<char>> data;
    std::future<absl::StatusOr<std::string>> etag;
  };
  std::deque<InFlightPart> in_flight_;
  // At most one uploaded part's buffer, cleared, for the next part to fill.
  std::vector<std::vector<char>> spare_;
  absl::Status error_;
  bool closing_ = false, closed_ = false, crashed_ = false;
};

// One GET of a ReadRanges call: [offset, offset + length) of the object,
// its `pieces` (sorted by offset) written straight into the caller's
// buffers.
struct Fetch {
  uint64_t offset = 0, length = 0;
  struct Piece {
    uint64_t offset;  // in the object
    absl::Span<char> out;
  };
  std::vector<Piece> pieces;
};

class S3Store : public S3ShardStore {
 public:
  S3Store(std::unique_ptr<S3Client> client, std::string uri)
      : client_(std::move(client)), uri_(std::move(uri)) {}

  std::string uri() const override { return uri_; }
  S3Client& client() override { return *client_; }
  S3ReadStats read_stats() const override {
    return {bytes_requested_.load(), bytes_fetched_.load(), gets_.load()};
  }

  using ShardStore::NewWriter;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key, const WriterOptions& options) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    return std::unique_ptr<ObjectWriter>(std::make_unique<S3Writer>(
        *client_, std::string(key), Full(key), options));
  }

  absl::Status Put(absl::string_view key,
                   absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    return client_->PutObject(Full(key), data);
  }

  absl::Status PutIfAbsent(absl::string_view key,
                           absl::Span<const char> data) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    return client_->PutObjectIfAbsent(Full(key), data);
  }

  absl::StatusOr<size_t> Read(absl::string_view key, ByteRange range,
                              absl::Span<char> out) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    if (out.size() < range.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("reading ", Quoted(key), ": buffer of ", out.size(),
                       " bytes for a range of ", range.length));
    }
    const ByteRange r = range;
    const absl::Span<char> o = out.subspan(0, range.length);
    CAIRN_RETURN_IF_ERROR(ReadRanges(key, absl::MakeConstSpan(&r, 1),
                                     absl::MakeConstSpan(&o, 1)));
    return static_cast<size_t>(range.length);
  }

  absl::Status ReadRanges(absl::string_view key,
                          absl::Span<const ByteRange> ranges,
                          absl::Span<const absl::Span<char>> outs) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    if (ranges.size() != outs.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reading ", Quoted(key), ": ", ranges.size(),
                       " ranges but ", outs.size(), " buffers"));
    }
    std::vector<size_t> order;
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (outs[i].size() != ranges[i].length) {
        return absl::InvalidArgumentError(absl::StrCat(
            "reading ", Quoted(key), ": buffer ", i, " holds ", outs[i].size(),
            " bytes for a range of ", ranges[i].length));
      }
      if (ranges[i].offset + ranges[i].length < ranges[i].offset) {
        return absl::OutOfRangeError(absl::StrCat(
            "reading ", Quoted(key), ": range at ", ranges[i].offset, " of ",
            ranges[i].length, " bytes passes 2^64"));
      }
      if (ranges[i].length > 0) order.push_back(i);
    }
    if (order.size() < ranges.size()) {
      // Empty ranges still need the object to exist and reach their offset.
      CAIRN_ASSIGN_OR_RETURN(uint64_t size, Size(key));
      for (const ByteRange& r : ranges) {
        if (r.length == 0 && r.offset > size) {
          return absl::OutOfRangeError(
              absl::StrCat("reading ", Quoted(key), ": offset ", r.offset,
                           " is past its end (", size, " bytes)"));
        }
      }
    }
    if (order.empty()) return absl::OkStatus();
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ranges[a].offset < ranges[b].offset;
    });
    std::vector<Fetch> fetches = PlanFetches(ranges, outs, order);
    uint64_t requested = 0, fetched = 0;
    for (size_t i : order) requested += ranges[i].length;
    for (const Fetch& f : fetches) fetched += f.length;
    bytes_requested_ += requested;
    bytes_fetched_ += fetched;
    gets_ += fetches.size();
    return RunFetches(key, fetches);
  }

  absl::StatusOr<uint64_t> Size(absl::string_view key) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    return client_->HeadObject(Full(key));
  }

  absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) override {
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(prefix));
    CAIRN_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects,
                           client_->ListObjects(Full(prefix)));
    std::vector<std::string> keys;
    keys.reserve(objects.size());
    for (const ObjectInfo& o : objects) {
      std::string key = Relative(o.key);
      // Only what this store could have written (S3 allows keys ours never
      // are, e.g. "a//b"): listing them would hand callers invalid keys.
      if (ValidateKey(key).ok()) keys.push_back(std::move(key));
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  absl::StatusOr<std::vector<std::string>> ListChildren(
      absl::string_view dir_prefix) override {
    if (!dir_prefix.empty() && !absl::EndsWith(dir_prefix, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("ListChildren: prefix ", Quoted(dir_prefix),
                       " must be empty or end in '/'"));
    }
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(dir_prefix));
    std::vector<ObjectInfo> objects;
    CAIRN_ASSIGN_OR_RETURN(
        std::vector<std::string> prefixes,
        client_->ListCommonPrefixes(Full(dir_prefix), &objects));
    const size_t skip = config().prefix.size() + dir_prefix.size();
    std::vector<std::string> children;
    for (const std::string& p : prefixes) {
      std::string child = p.substr(skip);
      if (child.size() > 1 &&
          ValidateKey(child.substr(0, child.size() - 1)).ok()) {
        children.push_back(std::move(child));
      }
    }
    for (const ObjectInfo& o : objects) {
      std::string child = o.key.substr(skip);
      if (ValidateKey(child).ok()) children.push_back(std::move(child));
    }
    std::sort(children.begin(), children.end());
    return children;
  }

  absl::Status Delete(absl::string_view key) override {
    CAIRN_RETURN_IF_ERROR(CheckKey(key));
    // S3's DELETE succeeds on a missing key; the interface says NOT_FOUND.
    CAIRN_RETURN_IF_ERROR(client_->HeadObject(Full(key)).status());
    return client_->DeleteObject(Full(key));
  }

  absl::Status DeletePrefix(absl::string_view prefix) override {
    CAIRN_RETURN_IF_ERROR(ValidatePrefix(prefix));
    // Uploads in progress under the prefix go too, as posix removes the temp
    // files there: deleting an incomplete step leaves nothing behind. A
    // writer still live there fails at Close.
    CAIRN_RETURN_IF_ERROR(AbortUploads(prefix));
    CAIRN_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects,
                           client_->ListObjects(Full(prefix)));
    std::vector<std::string> keys;
    keys.reserve(objects.size());
    for (ObjectInfo& o : objects) keys.push_back(std::move(o.key));
    return client_->DeleteObjects(keys);
  }

  absl::Status DeleteAbandonedWrites(absl::string_view dir_prefix) override {
    CAIRN_RETURN_IF_ERROR(ShardStore::DeleteAbandonedWrites(dir_prefix));
    return AbortUploads(dir_prefix);
  }

 private:
  const S3Config& config() const { return client_->config(); }
  // ValidateKey, and the S3 limit of 1,024 bytes for prefix + key.
  absl::Status CheckKey(absl::string_view key) const {
    CAIRN_RETURN_IF_ERROR(ValidateKey(key));
    if (config().prefix.size() + key.size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid key ", Quoted(key), ": S3 keys are at most ", kMaxKeyBytes,
          " bytes, and with the store's prefix '", config().prefix,
          "' this one has ", config().prefix.size() + key.size()));
    }
    return absl::OkStatus();
  }
  std::string Full(absl::string_view key) const {
    return absl::StrCat(config().prefix, key);
  }
  std::string Relative(const std::string& full) const {
    return full.substr(config().prefix.size());
  }

  absl::Status AbortUploads(absl::string_view prefix) {
    CAIRN_ASSIGN_OR_RETURN(std::vector<MultipartUpload> uploads,
                           client_->ListMultipartUploads(Full(prefix)));
    for (const MultipartUpload& u : uploads) {
      CAIRN_RETURN_IF_ERROR(client_->AbortMultipartUpload(u.key, u.upload_id));
    }
    if (!uploads.empty()) {
      CAIRN_LOG(info, "aborted {} abandoned multipart upload(s) under {}{}",
                uploads.size(), uri_, std::string(prefix));
    }
    return absl::OkStatus();
  }

  // Groups the (non-empty, sorted by offset) ranges into GETs: neighbours
  // closer than coalesce_gap_bytes share one GET as long as its span stays
  // within max_span; a range longer than a part is split into part-sized
  // GETs into its own buffer, so one big range reads in parallel.
  std::vector<Fetch> PlanFetches(absl::Span<const ByteRange> ranges,
                                 absl::Span<const absl::Span<char>> outs,
                                 const std::vector<size_t>& order) const {
    const uint64_t gap = config().coalesce_gap_bytes;
    const uint64_t piece = std::max<uint64_t>(config().part_bytes, 1 << 20);
    const uint64_t max_span = piece;
    std::vector<Fetch> fetches;
    for (size_t i : order) {
      const ByteRange& r = ranges[i];
      const uint64_t end = r.offset + r.length;
      if (!fetches.empty()) {
        Fetch& last = fetches.back();
        const uint64_t last_end = last.offset + last.length;
        const uint64_t new_end = std::max(last_end, end);
        if (r.offset >= last.offset && r.offset <= last_end + gap &&
            new_end - last.offset <= max_span) {
          last.length = new_end - last.offset;
          last.pieces.push_back({r.offset, outs[i]});
          continue;
        }
      }
      if (r.length > max_span) {
        for (uint64_t at = 0; at < r.length; at += piece) {
          const uint64_t n = std::min(piece, r.length - at);
          fetches.push_back(
              {r.offset + at, n, {{r.offset + at, outs[i].subspan(at, n)}}});
        }
        continue;
      }
      fetches.push_back({r.offset, r.length, {{r.offset, outs[i]}}});
    }
    return fetches;
  }

  absl::Status RunOne(absl::string_view key, const Fetch& f) {
    const std::string full = Full(key);
    // The GET scatters its bytes straight into the pieces, dropping the
    // gaps between them, unless pieces overlap (ranges asking for the same
    // bytes twice): those land in a buffer first, then are copied.
    ResponseSink sink{f.length, {}};
    sink.pieces.reserve(f.pieces.size());
    bool disjoint = true;
    uint64_t covered = 0;
    for (const Fetch::Piece& p : f.pieces) {
      const uint64_t at = p.offset - f.offset;
      disjoint = disjoint && at >= covered;
      covered = std::max(covered, at + p.out.size());
      sink.pieces.push_back({at, p.out});
    }
    std::unique_ptr<char[]> scratch;
    if (!disjoint) {
      // Not a zero-filled vector: the GET overwrites every byte (or fails).
      scratch.reset(new char[f.length]);
      sink = ResponseSink::Into(absl::MakeSpan(scratch.get(), f.length));
    }
    CAIRN_ASSIGN_OR_RETURN(size_t n,
                           client_->GetRange(full, {f.offset, f.length}, sink));
    if (n < f.length) {
      return absl::OutOfRangeError(
          absl::StrCat("reading ", Quoted(key), ": range ", f.offset, "+",
                       f.length, " passes its end (", f.offset + n, " bytes)"));
    }
    if (scratch != nullptr) {
      for (const Fetch::Piece& p : f.pieces) {
        std::memcpy(p.out.data(), scratch.get() + (p.offset - f.offset),
                    p.out.size());
      }
    }
    return absl::OkStatus();
  }

  absl::Status RunFetches(absl::string_view key,
                          const std::vector<Fetch>& fetches) {
    if (fetches.size() == 1) return RunOne(key, fetches[0]);
    const int workers = static_cast<int>(std::min<size_t>(
        std::max(config().read_concurrency, 1), fetches.size()));
    std::atomic<size_t> next{0};
    TaskGroup::Options options;
    options.thread_per_task = true;
    options.cancel_on_error = true;
    TaskGroup group(options);
    for (int w = 0; w < workers; ++w) {
      group.Run([&]() -> absl::Status {
        for (size_t i = next++; i < fetches.size() && !group.cancelled();
             i = next++) {
          CAIRN_RETURN_IF_ERROR(RunOne(key, fetches[i]));
        }
        return absl::OkStatus();
      });
    }
    return group.Wait();
  }

  const std::unique_ptr<S3Client> client_;
  const std::string uri_;
  std::atomic<uint64_t> bytes_requested_{0}, bytes_fetched_{0}, gets_{0};
};

std::string UriOf(const S3Config& config) {
  std::string uri = absl::StrCat("s3://", config.bucket);
  if (!config.prefix.empty()) {
    absl::StrAppend(
        &uri, "/",
        absl::string_view(config.prefix).substr(0, config.prefix.size() - 1));
  }
  if (!config.original_query.empty()) {
    absl::StrAppend(&uri, "?", config.original_query);
  }
  return uri;
}

absl::StatusOr<std::unique_ptr<ShardStore>> OpenS3Uri(
    absl::string_view rest, const StoreOptions& /*options*/) {
  CAIRN_ASSIGN_OR_RETURN(S3Config config,
                         ParseS3Uri(rest, Environment::System()));
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<S3ShardStore> store,
                         OpenS3ShardStore(std::move(config)));
  return std::unique_ptr<ShardStore>(std::move(store));
}

const ShardStoreRegistrar kS3Scheme("s3", &OpenS3Uri);

}  // namespace

absl::StatusOr<std::unique_ptr<S3ShardStore>> OpenS3ShardStore(
    S3Config config) {
  std::string uri = UriOf(config);
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client,
                         S3Client::Create(std::move(config)));
  absl::Status access = client->CheckAccess();
  if (!access.ok()) {
    return absl::Status(access.code(),
                        absl::StrCat("opening ", uri, ": ", access.message()));
  }
  return std::unique_ptr<S3ShardStore>(
      std::make_unique<S3Store>(std::move(client), std::move(uri)));
}

}  // namespace cairn::storage::s3
