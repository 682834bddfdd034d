// Checkpoint layout and commit protocol on a ShardStore; see
// checkpoint_layout.h. Verification streams each stored item through a
// bounded buffer (8 MiB), extending its crc32c piece by piece, with the items
// sorted by (object, offset) so reads are sequential within each object.
#include "storage/checkpoint_layout.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/bounded_queue.h"
#include "common/crash_point.h"
#include "common/large_array.h"
#include "common/status_macros.h"
#include "common/task_group.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::storage {
namespace {

constexpr size_t kVerifyBufferBytes = 8 << 20;

std::string Crc(uint32_t crc) { return absl::StrFormat("0x%08x", crc); }

std::string Where(absl::string_view job, int64_t step) {
  return absl::StrCat("job '", job, "' step ", step);
}

// Turns a read failure of committed data into DATA_LOSS with context; other
// failures (UNAVAILABLE, ...) keep their code.
absl::Status ReadFailure(const absl::Status& s, absl::string_view context) {
  if (absl::IsNotFound(s) || absl::IsOutOfRange(s) || absl::IsDataLoss(s)) {
    return absl::DataLossError(absl::StrCat(context, ": ", s.message()));
  }
  return Annotate(s, context);
}

// Streams [offset, offset + length) of `key` through `buffer`, returning its
// crc32c. `on_bytes` is called after each piece.
absl::StatusOr<uint32_t> StreamCrc(
    ShardStore& store, const std::string& key, uint64_t offset, uint64_t length,
    std::string& buffer, const std::function<void(uint64_t)>& on_bytes) {
  uint32_t crc = 0;
  while (length > 0) {
    const uint64_t n = std::min<uint64_t>(length, buffer.size());
    CAIRN_ASSIGN_OR_RETURN(size_t got,
                           store.Read(key, ByteRange{offset, n},
                                      absl::Span<char>(buffer.data(), n)));
    crc = Crc32cExtend(crc, buffer.data(), got);
    offset += n;
    length -= n;
    if (on_bytes) on_bytes(n);
  }
  return crc;
}

}  // namespace

absl::Status CheckManifestSize(uint64_t body_bytes, absl::string_view job,
                               int64_t step) {
  if (body_bytes <= kMaxManifestBodyBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot commit ", Where(job, step), ": its manifest would be ",
      body_bytes, " bytes, and at most ", kMaxManifestBodyBytes,
      " can be loaded; save fewer, larger chunks (fewer ranks sharding each "
      "tensor)"));
}

namespace {

// Runs `source` through `encoder`: Start once the header is filled, then
// every tensor, then Finish.
absl::Status Encode(ManifestSource source, v1::Manifest& header,
                    ManifestEncoder& encoder) {
  bool started = false;
  CAIRN_RETURN_IF_ERROR(
      source(&header, [&](const v1::ManifestTensor& t) -> absl::Status {
        if (!started) {  // the header is complete before the first tensor
          CAIRN_RETURN_IF_ERROR(encoder.Start());
          started = true;
        }
        return encoder.AddTensor(t);
      }));
  if (!started) CAIRN_RETURN_IF_ERROR(encoder.Start());  // no tensors
  return encoder.Finish();
}

// Every object `header` names must be durable and long enough (`ends`)
// before the commit point.
absl::Status CheckObjects(ShardStore& store, const v1::Manifest& header,
                          const std::vector<uint64_t>& ends) {
  const std::string& job = header.job();
  const int64_t step = header.step();
  for (int i = 0; i < header.objects_size(); ++i) {
    const std::string key = ObjectKey(job, step, header.objects(i));
    absl::StatusOr<uint64_t> size = store.Size(key);
    if (absl::IsNotFound(size.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot commit ", Where(job, step), ": object '", key,
                       "' is missing in ", store.uri()));
    }
    CAIRN_RETURN_IF_ERROR(size.status());
    if (*size < ends[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot commit ", Where(job, step), ": object '", key, "' has ",
          *size, " bytes but the manifest needs ", ends[i]));
    }
  }
  return absl::OkStatus();
}

// Makes the MANIFEST `writer` holds whole visible (its close renames or
// completes it); a kill just before leaves nothing visible.
absl::Status CloseManifest(ObjectWriter& writer) {
  CAIRN_CRASH_POINT("storage.publish_manifest.before_close");
  return writer.Close();
}

// MANIFEST through a writer that makes it visible only once it closes: the
// frame header, then the `body_bytes` that `write_body` appends.
absl::Status WriteFramed(
    ShardStore& store, const std::string& key, absl::string_view frame,
    uint64_t body_bytes,
    absl::FunctionRef<absl::Status(ObjectWriter&)> write_body) {
  CAIRN_ASSIGN_OR_RETURN(
      std::unique_ptr<ObjectWriter> writer,
      store.NewWriter(
          key, WriterOptions{.expected_bytes = frame.size() + body_bytes}));
  CAIRN_RETURN_IF_ERROR(writer->Append(absl::MakeConstSpan(frame)));
  CAIRN_RETURN_IF_ERROR(write_body(*writer));
  return CloseManifest(*writer);
}

// Appends pieces to a writer on a thread of its own, so that one piece is
// written while the next is encoded (writing is a large part of streaming a
// manifest's body, and the encoding need not wait for it); at most one piece
// waits, moved, never copied. The writer's first error stops
// it: nothing is written after it.
class PieceWriter {
 public:
  explicit PieceWriter(ObjectWriter& writer) : writing_(ThreadPerTask()) {
    writing_.Run([this, &writer]() -> absl::Status {
      while (std::optional<std::string> piece = pieces_.Pop()) {
        if (absl::Status s = writer.Append(absl::MakeConstSpan(*piece));
            !s.ok()) {
          pieces_.Stop();
          return s;
        }
      }
      return absl::OkStatus();
    });
  }
  ~PieceWriter() { Finish().IgnoreError(); }

  // Queues `piece`, taking its bytes; ABORTED once the writer failed (Finish
  // returns its error).
  absl::Status Push(std::string& piece) {
    if (!pieces_.Push(std::move(piece))) {
      return absl::AbortedError("the manifest's writer stopped");
    }
    return absl::OkStatus();
  }

  // Waits until every piece is written; the writer's first error.
  absl::Status Finish() {
    pieces_.Close();
    return writing_.Wait();
  }

 private:
  static TaskGroup::Options ThreadPerTask() {
    TaskGroup::Options options;
    options.thread_per_task = true;
    return options;
  }

  BoundedQueue<std::string> pieces_{1};
  TaskGroup writing_;
};

// The second run of a large manifest's source, its body appended to
// `writer`: it must be the body the first run measured.
absl::Status StreamBody(ManifestSource source, const ManifestEncoder& measured,
                        ObjectWriter& writer) {
  PieceWriter pieces(writer);
  v1::Manifest header;
  ManifestEncoder encoder(
      header, [&](std::string& piece) { return pieces.Push(piece); },
      /*validate=*/false);
  const absl::Status encoded = Encode(source, header, encoder);
  // The writer's error first: when it stopped, the encoder saw a refusal.
  CAIRN_RETURN_IF_ERROR(pieces.Finish());
  CAIRN_RETURN_IF_ERROR(encoded);
  if (encoder.body_bytes() != measured.body_bytes() ||
      encoder.body_crc32c() != measured.body_crc32c()) {
    return absl::InternalError(
        absl::StrCat("the manifest changed between its two encodings (",
                     measured.body_bytes(), " then ", encoder.body_bytes(),
                     " bytes, crc32c ", measured.body_crc32c(), " then ",
                     encoder.body_crc32c(), "); nothing was published"));
  }
  return absl::OkStatus();
}

// Where the first run of a manifest's source puts its body: in memory while
// it fits max_held_bytes; past that, where the store can rewrite what it
// wrote, in the MANIFEST's writer behind a placeholder for the frame header
// (written last, once the body's length and crc32c are known); otherwise
// nowhere, and a second run streams it (StreamBody).
class FirstRunBody {
 public:
  FirstRunBody(ShardStore& store, const v1::Manifest& header,
               uint64_t max_held_bytes)
      : store_(store), header_(header), max_held_bytes_(max_held_bytes) {}

  // The encoder's sink.
  absl::Status Take(std::string& piece) {
    bytes_ += piece.size();
    if (absl::Status s =
            CheckManifestSize(bytes_, header_.job(), header_.step());
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(s.message(),
                                       " (so far: the encoding stopped "
                                       "there)"));
    }
    if (pieces_ != nullptr) return Push(piece);
    if (dropped_) return absl::OkStatus();
    if (bytes_ <= max_held_bytes_) {
      held_.push_back(std::move(piece));
      return absl::OkStatus();
    }
    if (!store_.CanRewritePrefix()) {
      dropped_ = true;
      std::vector<std::string>().swap(held_);
      return absl::OkStatus();
    }
    absl::StatusOr<std::unique_ptr<ObjectWriter>> writer =
        store_.NewWriter(ManifestKey(header_.job(), header_.step()),
                         WriterOptions{.rewrite_prefix = true});
    if (!writer.ok()) {
      open_error_ = writer.status();
      refused_ = true;
      return absl::AbortedError("the manifest's writer did not open");
    }
    writer_ = *std::move(writer);
    pieces_ = std::make_unique<PieceWriter>(*writer_);
    std::string frame(kManifestHeaderBytes, '\0');
    CAIRN_RETURN_IF_ERROR(Push(frame));
    for (std::string& held : held_) CAIRN_RETURN_IF_ERROR(Push(held));
    std::vector<std::string>().swap(held_);
    return Push(piece);
  }

  // After the run: the writer's first error, if the body went to it.
  absl::Status FinishWriting() {
    if (!open_error_.ok()) return open_error_;
    return pieces_ != nullptr ? pieces_->Finish() : absl::OkStatus();
  }
  // The writer stopped the run: the encoder saw only a refusal.
  bool refused() const { return refused_; }

  const std::vector<std::string>& held() const { return held_; }
  bool dropped() const { return dropped_; }
  // The MANIFEST's writer holding the body behind a placeholder, or null.
  ObjectWriter* writer() const { return writer_.get(); }

 private:
  absl::Status Push(std::string& piece) {
    absl::Status s = pieces_->Push(piece);
    refused_ |= !s.ok();
    return s;
  }

  ShardStore& store_;
  const v1::Manifest& header_;
  const uint64_t max_held_bytes_;
  uint64_t bytes_ = 0;
  std::vector<std::string> held_;
  bool dropped_ = false;
  bool refused_ = false;  // the writer stopped the run
  absl::Status open_error_;
  std::unique_ptr<ObjectWriter> writer_;
  std::unique_ptr<PieceWriter> pieces_;  // joined before writer_ is dropped
};

}  // namespace

absl::Status PublishManifest(ShardStore& store, const v1::Manifest& manifest) {
  return PublishManifest(
      store,
      [&](v1::Manifest* header,
          absl::FunctionRef<absl::Status(const v1::ManifestTensor&)> add) {
        *header = manifest;
        header->clear_tensors();
        for (const v1::ManifestTensor& t : manifest.tensors()) {
          CAIRN_RETURN_IF_ERROR(add(t));
        }
        return absl::OkStatus();
      },
      PublishOptions(), nullptr);
}

absl::Status PublishManifest(ShardStore& store, ManifestSource source,
                             const PublishOptions& options,
                             ManifestSummary* published) {
  // The first run checks the manifest and measures its body, keeping or
  // writing its pieces as it goes (FirstRunBody).
  v1::Manifest header;
  FirstRunBody body(store, header, options.max_held_bytes);
  ManifestEncoder measure(
      header, [&](std::string& piece) { return body.Take(piece); },
      /*validate=*/true);
  const absl::Status encoded = Encode(source, header, measure);
  const std::string& job = header.job();
  const int64_t step = header.step();
  const auto failed = [&](const absl::Status& s) {
    return Annotate(
        s, absl::StrCat("publishing the manifest of ", Where(job, step)));
  };
  // The writer's error when it stopped the run; else the run's own (an
  // invalid manifest is reported as such even when a write failed too).
  const absl::Status written = body.FinishWriting();
  if (!written.ok() && (encoded.ok() || body.refused())) {
    return failed(written);
  }
  CAIRN_RETURN_IF_ERROR(encoded);  // its size was checked piece by piece
  if (options.check_objects) {
    CAIRN_RETURN_IF_ERROR(CheckObjects(store, header, measure.object_ends()));
  }
  const std::string key = ManifestKey(job, step);
  std::string frame = ManifestFrameHeader(
      header.format_version(), measure.body_bytes(), measure.body_crc32c());
  absl::Status s;
  if (ObjectWriter* writer = body.writer(); writer != nullptr) {
    s = writer->RewritePrefix(absl::MakeConstSpan(frame));
    if (s.ok()) s = CloseManifest(*writer);
  } else if (body.dropped()) {
    s = WriteFramed(store, key, frame, measure.body_bytes(),
                    [&](ObjectWriter& writer) {
                      return StreamBody(source, measure, writer);
                    });
  } else if (body.held().size() <= 1) {  // one piece: one Put
    if (!body.held().empty()) frame += body.held()[0];
    s = store.Put(key, absl::MakeConstSpan(frame));
  } else {
    s = WriteFramed(
        store, key, frame, measure.body_bytes(),
        [&](ObjectWriter& writer) -> absl::Status {
          for (const std::string& piece : body.held()) {
            CAIRN_RETURN_IF_ERROR(writer.Append(absl::MakeConstSpan(piece)));
          }
          return absl::OkStatus();
        });
  }
  if (!s.ok()) return failed(s);
  if (published != nullptr) {
    published->header = std::move(header);
    published->num_tensors = measure.num_tensors();
  }
  return absl::OkStatus();
}

namespace {

// A manifest's bytes as read: in a LargeArray, neither zeroed by us first
// (a manifest of a 16k-rank save is 1.4 GB; zeroing a std::string of that
// size costs about as much as the read) nor left on the heap after
// (unmapped when done), on huge pages; `size` is what the read found.
struct ManifestBytes {
  LargeArray<char> data;
  size_t size = 0;
  absl::string_view view() const { return {data.get(), size}; }
};

// The size of <job>/<step>/MANIFEST (NOT_FOUND if absent).
absl::StatusOr<uint64_t> ManifestSize(ShardStore& store, absl::string_view job,
                                      int64_t step, const std::string& key) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  CAIRN_RETURN_IF_ERROR(ValidateStep(step));
  absl::StatusOr<uint64_t> size = store.Size(key);
  if (absl::IsNotFound(size.status())) {
    return absl::NotFoundError(absl::StrCat(Where(job, step),
                                            " is not committed: no '", key,
                                            "' in ", store.uri()));
  }
  CAIRN_RETURN_IF_ERROR(size.status());
  if (*size > kMaxManifestBodyBytes + kManifestHeaderBytes) {
    return absl::DataLossError(absl::StrCat("manifest '", key, "' of ",
                                            Where(job, step), " is ", *size,
                                            " bytes: too large"));
  }
  return *size;
}

// Reads out.size() bytes at `offset` of the manifest `key`; returns how many
// were there.
absl::StatusOr<size_t> ReadManifestRange(ShardStore& store,
                                         absl::string_view job, int64_t step,
                                         const std::string& key,
                                         uint64_t offset,
                                         absl::Span<char> out) {
  absl::StatusOr<size_t> got =
      store.Read(key, ByteRange{offset, out.size()}, out);
  if (!got.ok()) {
    if (absl::IsNotFound(got.status())) {  // deleted since Size()
      return absl::NotFoundError(absl::StrCat(
          Where(job, step), " is not committed: ", got.status().message()));
    }
    return ReadFailure(got.status(),
                       absl::StrCat("reading manifest '", key, "'"));
  }
  return std::min(*got, out.size());
}

// The framed bytes of <job>/<step>/MANIFEST (NOT_FOUND if absent).
absl::StatusOr<ManifestBytes> ReadManifestBytes(ShardStore& store,
                                                absl::string_view job,
                                                int64_t step) {
  const std::string key = ManifestKey(job, step);
  CAIRN_ASSIGN_OR_RETURN(const uint64_t size,
                         ManifestSize(store, job, step, key));
  ManifestBytes bytes;
  CAIRN_ASSIGN_OR_RETURN(
      bytes.data,
      LargeArray<char>::Allocate(
          static_cast<size_t>(size),
          absl::StrCat("reading manifest '", key, "' of ", Where(job, step))));
  // A file cut short since Size(): only what was read (the decoder reports
  // the truncation), never the unread bytes.
  CAIRN_ASSIGN_OR_RETURN(
      bytes.size,
      ReadManifestRange(store, job, step, key, 0,
                        absl::Span<char>(bytes.data.get(), bytes.data.size())));
  return bytes;
}

absl::Status UndecodableManifest(const absl::Status& s, absl::string_view job,
                                 int64_t step) {
  return Annotate(s, absl::StrCat("manifest '", ManifestKey(job, step), "' of ",
                                  Where(job, step)));
}

absl::Status CheckManifestNames(const v1::Manifest& manifest,
                                absl::string_view job, int64_t step) {
  if (manifest.job() != job || manifest.step() != step) {
    return absl::DataLossError(
        absl::StrCat("manifest '", ManifestKey(job, step), "' describes job '",
                     manifest.job(), "' step ", manifest.step(), ", not ",
                     Where(job, step)));
  }
  return absl::OkStatus();
}

absl::Status InvalidManifest(const absl::Status& s, absl::string_view job,
                             int64_t step) {
  return absl::DataLossError(absl::StrCat("manifest '", ManifestKey(job, step),
                                          "' is invalid: ", s.message()));
}

}  // namespace

absl::StatusOr<v1::Manifest> ReadManifest(ShardStore& store,
                                          absl::string_view job, int64_t step) {
  CAIRN_ASSIGN_OR_RETURN(ManifestBytes bytes,
                         ReadManifestBytes(store, job, step));
  absl::StatusOr<v1::Manifest> manifest =
      DecodeManifest(bytes.view(), kMaxManifestBodyBytes);
  if (!manifest.ok()) {
    return UndecodableManifest(manifest.status(), job, step);
  }
  CAIRN_RETURN_IF_ERROR(CheckManifestNames(*manifest, job, step));
  if (absl::Status s = ValidateManifest(*manifest); !s.ok()) {
    return InvalidManifest(s, job, step);
  }
  return manifest;
}

absl::StatusOr<ManifestSummary> ReadManifestByTensor(
    ShardStore& store, absl::string_view job, int64_t step,
    absl::FunctionRef<absl::Status(const TensorOfManifest&)> on_tensor) {
  const std::string key = ManifestKey(job, step);
  CAIRN_ASSIGN_OR_RETURN(const uint64_t size,
                         ManifestSize(store, job, step, key));
  // Read in windows, never whole (1.4 GB at 16k ranks); a read's error is
  // returned as it is.
  absl::Status read_error;
  auto read = [&](uint64_t offset,
                  absl::Span<char> out) -> absl::StatusOr<size_t> {
    absl::StatusOr<size_t> got =
        ReadManifestRange(store, job, step, key, offset, out);
    if (!got.ok()) read_error = got.status();
    return got;
  };
  ManifestSummary summary;
  // Checked as ReadManifest does, before each tensor is handed over: the
  // names and the header when the first tensor comes (the header is
  // complete then), then each tensor.
  std::optional<ManifestValidator> validator;
  auto start = [&]() -> absl::Status {
    CAIRN_RETURN_IF_ERROR(CheckManifestNames(summary.header, job, step));
    validator.emplace(summary.header);
    if (absl::Status s = validator->Start(); !s.ok()) {
      return InvalidManifest(s, job, step);
    }
    return absl::OkStatus();
  };
  absl::Status from_callback;  // errors of the checks below or of on_tensor
  absl::StatusOr<int> tensors = DecodeManifestByTensor(
      size, read, kMaxManifestBodyBytes, &summary.header,
      [&](v1::ManifestTensor& t) -> absl::Status {
        from_callback = [&]() -> absl::Status {
          if (!validator.has_value()) CAIRN_RETURN_IF_ERROR(start());
          if (absl::Status s = validator->AddTensor(t); !s.ok()) {
            return InvalidManifest(s, job, step);
          }
          return on_tensor(
              TensorOfManifest{t, validator->chunk_objects(), summary.header});
        }();
        return from_callback;
      });
  if (!from_callback.ok()) return from_callback;
  if (!read_error.ok()) return read_error;
  if (!tensors.ok()) return UndecodableManifest(tensors.status(), job, step);
  if (!validator.has_value()) CAIRN_RETURN_IF_ERROR(start());  // no tensors
  if (absl::Status s = validator->Finish(); !s.ok()) {
    return InvalidManifest(s, job, step);
  }
  summary.num_tensors = *tensors;
  return summary;
}

absl::StatusOr<ManifestSummary> ReadManifestSummary(ShardStore& store,
                                                    absl::string_view job,
                                                    int64_t step) {
  return ReadManifestByTensor(store, job, step, [](const TensorOfManifest&) {
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> ListJobs(ShardStore& store) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> children,
                         store.ListChildren(""));
  std::vector<std::string> jobs;
  for (const std::string& child : children) {
    if (!absl::EndsWith(child, "/")) continue;  // an object at the root
    absl::string_view name(child);
    name.remove_suffix(1);
    if (ValidateJobName(name).ok()) jobs.emplace_back(name);
  }
  return jobs;
}

namespace {

// Steps under job/ and whether each has a MANIFEST.
absl::StatusOr<std::vector<std::pair<int64_t, bool>>> ScanSteps(
    ShardStore& store, absl::string_view job) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> children,
                         store.ListChildren(absl::StrCat(job, "/")));
  std::vector<std::pair<int64_t, bool>> steps;
  for (const std::string& child : children) {
    if (!absl::EndsWith(child, "/")) continue;
    absl::StatusOr<int64_t> step = ParseStepDir(child);
    if (!step.ok()) continue;
    absl::StatusOr<uint64_t> size = store.Size(ManifestKey(job, *step));
    if (!size.ok() && !absl::IsNotFound(size.status())) return size.status();
    steps.emplace_back(*step, size.ok());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ListCommittedSteps(ShardStore& store,
                                                        absl::string_view job) {
  CAIRN_ASSIGN_OR_RETURN(auto steps, ScanSteps(store, job));
  std::vector<int64_t> out;
  for (const auto& [step, committed] : steps) {
    if (committed) out.push_back(step);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ListIncompleteSteps(
    ShardStore& store, absl::string_view job) {
  CAIRN_ASSIGN_OR_RETURN(auto steps, ScanSteps(store, job));
  std::vector<int64_t> out;
  for (const auto& [step, committed] : steps) {
    if (!committed) out.push_back(step);
  }
  return out;
}

absl::Status DeleteStep(ShardStore& store, absl::string_view job,
                        int64_t step) {
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  CAIRN_RETURN_IF_ERROR(ValidateStep(step));
  CAIRN_CRASH_POINT("storage.delete_step.begin");
  absl::Status s = store.Delete(ManifestKey(job, step));
  if (!s.ok() && !absl::IsNotFound(s)) {
    return Annotate(
        s, absl::StrCat("deleting the manifest of ", Where(job, step)));
  }
  CAIRN_CRASH_POINT("storage.delete_step.after_manifest");
  s = store.DeletePrefix(StepPrefix(job, step));
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("deleting the data of ", Where(job, step)));
  }
  CAIRN_CRASH_POINT("storage.delete_step.end");
  return absl::OkStatus();
}

absl::StatusOr<int> DeleteUnreferenced(ShardStore& store,
                                       const v1::Manifest& manifest) {
  const std::string& job = manifest.job();
  const int64_t step = manifest.step();
  CAIRN_RETURN_IF_ERROR(ValidateJobName(job));
  CAIRN_RETURN_IF_ERROR(ValidateStep(step));
  const std::string prefix = StepPrefix(job, step);
  CAIRN_RETURN_IF_ERROR(store.DeleteAbandonedWrites(prefix));
  // Keys relative to the step, as views into the manifest. A valid
  // manifest lists every object a location names.
  const absl::flat_hash_set<absl::string_view> keep(manifest.objects().begin(),
                                                    manifest.objects().end());
  const std::string manifest_key = ManifestKey(job, step);
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> keys, store.List(prefix));
  int removed = 0;
  for (const std::string& key : keys) {
    absl::string_view relative = key;
    if (key == manifest_key ||
        (absl::ConsumePrefix(&relative, prefix) && keep.contains(relative))) {
      continue;
    }
    absl::Status s = store.Delete(key);
    if (!s.ok() && !absl::IsNotFound(s)) {
      return Annotate(s, absl::StrCat("removing '", key, "', not part of ",
                                      Where(job, step)));
    }
    ++removed;
  }
  return removed;
}

absl::Status ReadVerified(ShardStore& store, absl::string_view job,
                          int64_t step, const v1::StorageLocation& location,
                          uint32_t crc32c, absl::string_view what,
                          absl::Span<char> out) {
  const std::string key = ObjectKey(job, step, location.object_key());
  const std::string context =
      absl::StrCat(Where(job, step), " ", what, " in object '", key, "' [",
                   location.offset(), ", +", location.length(), ")");
  if (out.size() < location.length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        context, ": buffer of ", out.size(), " bytes is too small"));
  }
  absl::StatusOr<size_t> got =
      store.Read(key, ByteRange{location.offset(), location.length()}, out);
  if (!got.ok()) return ReadFailure(got.status(), context);
  const uint32_t actual = Crc32c(out.data(), location.length());
  if (actual != crc32c) {
    return absl::DataLossError(
        absl::StrCat(context, ": checksum mismatch, crc32c ", Crc(actual),
                     " but the manifest says ", Crc(crc32c)));
  }
  return absl::OkStatus();
}

absl::Status ReadVerifiedPieces(
    ShardStore& store, absl::string_view job, int64_t step,
    const v1::StorageLocation& location, uint32_t crc32c,
    absl::string_view what, absl::Span<char> buffer,
    absl::FunctionRef<absl::Status(uint64_t offset, absl::Span<const char>)>
        on_piece) {
  const std::string key = ObjectKey(job, step, location.object_key());
  const std::string context =
      absl::StrCat(Where(job, step), " ", what, " in object '", key, "' [",
                   location.offset(), ", +", location.length(), ")");
  if (buffer.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": empty read buffer"));
  }
  uint32_t crc = 0;
  uint64_t done = 0;
  while (done < location.length()) {
    const uint64_t n =
        std::min<uint64_t>(location.length() - done, buffer.size());
    absl::StatusOr<size_t> got =
        store.Read(key, ByteRange{location.offset() + done, n},
                   absl::Span<char>(buffer.data(), n));
    if (!got.ok()) return ReadFailure(got.status(), context);
    crc = Crc32cExtend(crc, buffer.data(), n);
    CAIRN_RETURN_IF_ERROR(
        on_piece(done, absl::Span<const char>(buffer.data(), n)));
    done += n;
  }
  if (crc != crc32c) {
    return absl::DataLossError(
        absl::StrCat(context, ": checksum mismatch, crc32c ", Crc(crc),
                     " but the manifest says ", Crc(crc32c)));
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpoint(
    ShardStore& store, const v1::Manifest& manifest,
    std::function<void(uint64_t, uint64_t)> progress) {
  struct Item {
    const v1::StorageLocation* location;
    uint32_t crc;
    std::string what;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  for (const v1::ManifestTensor& t : manifest.tensors()) {
    for (const v1::StoredChunk& c : t.chunks()) {
      items.push_back(Item{&c.location(), c.crc32c(),
                           absl::StrCat("tensor '", t.entry().fqn(), "' chunk ",
                                        BoxToString(c.box()))});
      total += c.location().length();
    }
  }
  for (const v1::ManifestBytes& b : manifest.bytes_entries()) {
    items.push_back(Item{&b.location(), b.crc32c(),
                         absl::StrCat("bytes entry '", b.fqn(), "'")});
    total += b.location().length();
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.location->object_key() != b.location->object_key()) {
      return a.location->object_key() < b.location->object_key();
    }
    return a.location->offset() < b.location->offset();
  });
  std::string buffer(
      std::min<uint64_t>(kVerifyBufferBytes, std::max<uint64_t>(total, 1)),
      '\0');
  uint64_t done = 0;
  std::function<void(uint64_t)> on_bytes;
  if (progress) {
    on_bytes = [&](uint64_t n) {
      done += n;
      progress(done, total);
    };
  }
  const std::string& job = manifest.job();
  const int64_t step = manifest.step();
  for (const Item& item : items) {
    const std::string key = ObjectKey(job, step, item.location->object_key());
    const std::string context = absl::StrCat(
        Where(job, step), " ", item.what, " in object '", key, "' [",
        item.location->offset(), ", +", item.location->length(), ")");
    absl::StatusOr<uint32_t> crc =
        StreamCrc(store, key, item.location->offset(), item.location->length(),
                  buffer, on_bytes);
    if (!crc.ok()) return ReadFailure(crc.status(), context);
    if (*crc != item.crc) {
      return absl::DataLossError(
          absl::StrCat(context, ": checksum mismatch, crc32c ", Crc(*crc),
                       " but the manifest says ", Crc(item.crc)));
    }
  }
  if (progress && total == 0) progress(0, 0);
  return absl::OkStatus();
}

}  // namespace cairn::storage
