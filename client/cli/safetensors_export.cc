#include "client/cli/safetensors_export.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/little_endian.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "nlohmann/json.hpp"
#include "planner/box.h"
#include "proto/convert/plan_convert.h"
#include "storage/checkpoint_layout.h"
#include "storage/manifest.h"

namespace cairn::cli {
namespace {

namespace fs = std::filesystem;

// Bytes an unprivileged writer may still use on the filesystem of `path`.
uint64_t FreeBytes(const std::string& path) {
  struct statvfs v;
  if (::statvfs(path.c_str(), &v) != 0) return 0;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

// The error of `what` (e.g. "writing 4096 bytes of") on `name` (an output
// file's name in the export, or a directory's path) for the export `where`
// ("export of job 'llama' step 1200 to 'DIR'"); `on` is a path on the
// filesystem written to. A full disk (or quota) is RESOURCE_EXHAUSTED saying
// how much is free there.
absl::Status IoError(int error, absl::string_view where, absl::string_view what,
                     absl::string_view name, const std::string& on) {
  if (error == ENOSPC || error == EDQUOT) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": no space left on device ", what, " '", name,
                     "' (", FreeBytes(on), " bytes free",
                     error == EDQUOT ? ": disk quota exceeded" : "", ")"));
  }
  return absl::ErrnoToStatus(error,
                             absl::StrCat(where, ": ", what, " '", name, "'"));
}

// An output file, written at explicit offsets, removed with its directory
// on failure. Errors name the export and the file's name in it.
class OutFile {
 public:
  static absl::StatusOr<std::unique_ptr<OutFile>> Create(const std::string& dir,
                                                         std::string name,
                                                         std::string where) {
    std::string path = absl::StrCat(dir, "/", name);
    UniqueFd fd(
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    if (!fd.valid()) return IoError(errno, where, "creating", name, dir);
    return std::unique_ptr<OutFile>(new OutFile(
        std::move(fd), std::move(path), std::move(name), std::move(where)));
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  // Reserves the file's final size, so a full disk fails before any byte
  // is read (filesystems without fallocate just go on).
  absl::Status Reserve(uint64_t size) {
    if (size == 0) return absl::OkStatus();
    if (::fallocate(fd_.get(), 0, 0, static_cast<off_t>(size)) == 0) {
      return absl::OkStatus();
    }
    const int error = errno;
    if (error == EOPNOTSUPP || error == ENOSYS || error == EINVAL) {
      return absl::OkStatus();
    }
    return IoError(error, where_,
                   absl::StrCat("reserving ", size, " bytes for"), name_,
                   path_);
  }

  absl::Status Write(uint64_t offset, absl::Span<const char> data) {
    const char* p = data.data();
    size_t n = data.size();
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_.get(), p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return IoError(errno, where_, absl::StrCat("writing ", n, " bytes of"),
                       name_, path_);
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }

  // fsync, then close.
  absl::Status Close() {
    if (::fsync(fd_.get()) != 0) {
      return IoError(errno, where_, "syncing", name_, path_);
    }
    // Closed here rather than by UniqueFd, so that its error is reported.
    if (::close(fd_.Release()) != 0) {
      return IoError(errno, where_, "closing", name_, path_);
    }
    return absl::OkStatus();
  }

 private:
  OutFile(UniqueFd fd, std::string path, std::string name, std::string where)
      : fd_(std::move(fd)),
        path_(std::move(path)),
        name_(std::move(name)),
        where_(std::move(where)) {}

  UniqueFd fd_;
  const std::string path_;   // in the temporary directory
  const std::string name_;   // relative to the export's directory
  const std::string where_;  // "export of job 'llama' step 1200 to 'DIR'"
};

absl::Status SyncDirectory(const std::string& path, absl::string_view where) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    return IoError(errno, where, "opening directory", path, path);
  }
  if (::fsync(fd.get()) != 0) {
    return IoError(errno, where, "syncing directory", path, path);
  }
  return absl::OkStatus();
}

// Renames `from` to `to` unless `to` exists (then ALREADY_EXISTS).
absl::Status RenameNoReplace(const std::string& from, const std::string& to,
                             absl::string_view where) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(),
                  RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  int error = errno;
  if (error == EINVAL || error == ENOSYS) {
    // A filesystem without RENAME_NOREPLACE: check, then rename (which
    // would replace only an empty directory made in between).
    std::error_code ec;
    if (fs::exists(fs::symlink_status(to, ec))) {
      error = EEXIST;
    } else if (::rename(from.c_str(), to.c_str()) == 0) {
      return absl::OkStatus();
    } else {
      error = errno;
    }
  }
  if (error == EEXIST || error == ENOTEMPTY) {
    return absl::AlreadyExistsError(
        absl::StrCat(to,
                     " exists (created during the export); pass a new "
                     "directory"));
  }
  return IoError(error, where, absl::StrCat("renaming '", from, "' to"), to,
                 from);
}

// The export of one manifest; see ExportSafetensors.
class Exporter {
 public:
  Exporter(storage::ShardStore& store, const v1::Manifest& manifest,
           const ExportOptions& options)
      : store_(store),
        manifest_(manifest),
        options_(options),
        where_(absl::StrCat("job '", manifest.job(), "' step ",
                            manifest.step())) {}

  absl::StatusOr<ExportResult> Run();

 private:
  struct Shard {
    std::string name;
    std::vector<int> tensors;  // into manifest_.tensors(), in data order
    std::vector<uint64_t> data_offsets;  // of each, relative to the data
    uint64_t data_bytes = 0;
    std::string header;  // with its 8-byte length prefix, padded
  };

  // The tensors to export (indices, in fqn order) after the filters.
  absl::StatusOr<std::vector<int>> SelectTensors(ExportResult* result) const;
  absl::Status BuildHeader(Shard& shard) const;
  absl::Status WriteShard(const Shard& shard, const std::string& dir,
                          ExportedFile* written);
  // Writes tensor `t`'s bytes at `at` of `file`.
  absl::Status WriteTensor(const v1::ManifestTensor& t, OutFile& file,
                           uint64_t at);
  absl::Status CheckCancelled() const {
    if (options_.cancelled && options_.cancelled()) {
      return absl::CancelledError(
          absl::StrCat("export of ", where_, " interrupted"));
    }
    return absl::OkStatus();
  }
  void Report(uint64_t n) {
    progress_.file_done += n;
    progress_.done += n;
    if (options_.progress) options_.progress(progress_);
  }

  storage::ShardStore& store_;
  const v1::Manifest& manifest_;
  const ExportOptions& options_;
  const std::string where_;
  // "export of job 'llama' step 1200 to 'DIR'": what output errors name.
  std::string export_name_;
  std::string read_buffer_;
  ExportProgress progress_;
};

uint64_t TensorBytes(const v1::ManifestTensor& t) {
  uint64_t n = storage::DTypeSize(t.entry().dtype());
  for (int64_t d : t.entry().global_shape()) n *= static_cast<uint64_t>(d);
  return n;
}

absl::StatusOr<std::vector<int>> Exporter::SelectTensors(
    ExportResult* result) const {
  const auto& filters = options_.filters;
  auto selected = [&](const std::string& fqn) {
    if (filters.empty()) return true;
    for (const std::string& f : filters) {
      if (absl::StartsWith(fqn, f)) return true;
    }
    return false;
  };
  std::vector<int> out;
  std::vector<bool> matched(filters.size(), false);
  for (int i = 0; i < manifest_.tensors_size(); ++i) {
    const std::string& fqn = manifest_.tensors(i).entry().fqn();
    for (size_t f = 0; f < filters.size(); ++f) {
      if (absl::StartsWith(fqn, filters[f])) matched[f] = true;
    }
    if (selected(fqn)) out.push_back(i);
  }
  for (const v1::ManifestBytes& b : manifest_.bytes_entries()) {
    if (selected(b.fqn())) result->skipped_bytes_entries.push_back(b.fqn());
  }
  std::vector<std::string> unmatched;
  for (size_t f = 0; f < filters.size(); ++f) {
    if (!matched[f]) unmatched.push_back(absl::StrCat("'", filters[f], "'"));
  }
  if (!unmatched.empty()) {
    // A few fqns spread over the sorted list, so the user sees its names.
    std::vector<std::string> some;
    const int n = manifest_.tensors_size();
    const int shown = std::min(n, 5);
    for (int k = 0; k < shown; ++k) {
      const int i = shown == 1 ? 0 : k * (n - 1) / (shown - 1);
      some.push_back(
          absl::StrCat("'", manifest_.tensors(i).entry().fqn(), "'"));
    }
    return absl::NotFoundError(absl::StrCat(
        where_, ": --filter ", absl::StrJoin(unmatched, ", "),
        unmatched.size() == 1 ? " matches" : " match", " no tensor",
        n == 0 ? " (it has no tensors)"
               : absl::StrCat("; its ", n, " tensors include ",
                              absl::StrJoin(some, ", "))));
  }
  if (out.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where_, " has no tensors to export (",
                     manifest_.bytes_entries_size(), " non-tensor entries)"));
  }
  return out;
}

absl::Status Exporter::BuildHeader(Shard& shard) const {
  // Data order: element size (largest first), then name.
  std::sort(shard.tensors.begin(), shard.tensors.end(), [&](int a, int b) {
    const v1::TensorEntry& ea = manifest_.tensors(a).entry();
    const v1::TensorEntry& eb = manifest_.tensors(b).entry();
    const size_t sa = storage::DTypeSize(ea.dtype());
    const size_t sb = storage::DTypeSize(eb.dtype());
    return sa != sb ? sa > sb : ea.fqn() < eb.fqn();
  });
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"},
                            {"cairn_job", manifest_.job()},
                            {"cairn_step", absl::StrCat(manifest_.step())}};
  uint64_t offset = 0;
  for (int i : shard.tensors) {
    const v1::TensorEntry& e = manifest_.tensors(i).entry();
    const std::string dtype = SafetensorsDType(e.dtype());
    if (dtype.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, " tensor '", e.fqn(), "' has dtype ",
                       storage::DTypeName(e.dtype()),
                       ", which safetensors has no name for"));
    }
    if (e.fqn() == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(where_,
                       " has a tensor named '__metadata__', which "
                       "safetensors reserves"));
    }
    const uint64_t bytes = TensorBytes(manifest_.tensors(i));
    header[e.fqn()] = {{"dtype", dtype},
                       {"shape", std::vector<int64_t>(e.global_shape().begin(),
                                                      e.global_shape().end())},
                       {"data_offsets", {offset, offset + bytes}}};
    shard.data_offsets.push_back(offset);
    offset += bytes;
  }
  shard.data_bytes = offset;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // An fqn that is not UTF-8: JSON (and so safetensors) cannot hold it.
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": a tensor name of ", shard.name,
                     " cannot be written as JSON: ", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  shard.header.resize(8);
  little_endian::Store64(shard.header.data(), text.size());
  shard.header += text;
  return absl::OkStatus();
}

absl::Status Exporter::WriteTensor(const v1::ManifestTensor& t, OutFile& file,
                                   uint64_t at) {
  const v1::TensorEntry& e = t.entry();
  const size_t elem = storage::DTypeSize(e.dtype());
  CAIRN_ASSIGN_OR_RETURN(planner::Shape shape,
                         convert::ShapeFromProto(e.global_shape(), e.fqn()));
  const planner::ChunkBox full = planner::FullBox(shape);
  const uint64_t bytes = TensorBytes(t);
  const bool in_memory = bytes <= options_.assemble_in_memory_bytes;
  std::string assembled;
  if (in_memory) assembled.resize(bytes);
  uint64_t covered = 0;
  std::vector<planner::CopySegment> segments;
  for (const v1::StoredChunk& c : t.chunks()) {
    CAIRN_ASSIGN_OR_RETURN(planner::ChunkBox box,
                           convert::BoxFromProto(c.box(), e.fqn()));
    const std::string what = absl::StrCat("tensor '", e.fqn(), "' chunk ",
                                          storage::BoxToString(c.box()));
    const uint64_t volume = static_cast<uint64_t>(planner::Volume(box));
    if (!planner::Contains(full, box) ||
        volume * elem != c.location().length()) {
      return absl::DataLossError(absl::StrCat(
          where_, " ", what, ": the manifest's chunk does not fit shape ",
          planner::ShapeToString(shape), " with ", c.location().length(),
          " bytes"));
    }
    if (volume == 0) continue;
    covered += volume;
    segments.clear();
    planner::AppendCopySegments(box, full, box, elem, &segments);
    size_t next = 0;  // the first segment not yet wholly written
    CAIRN_RETURN_IF_ERROR(storage::ReadVerifiedPieces(
        store_, manifest_.job(), manifest_.step(), c.location(), c.crc32c(),
        what, absl::Span<char>(read_buffer_.data(), read_buffer_.size()),
        [&](uint64_t offset, absl::Span<const char> piece) -> absl::Status {
          CAIRN_RETURN_IF_ERROR(CheckCancelled());
          const uint64_t end = offset + piece.size();
          for (size_t s = next; s < segments.size(); ++s) {
            const planner::CopySegment& seg = segments[s];
            if (seg.src_offset >= end) break;
            const uint64_t lo = std::max(seg.src_offset, offset);
            const uint64_t hi = std::min(seg.src_offset + seg.length, end);
            if (hi <= lo) {
              next = s + 1;
              continue;
            }
            const uint64_t dst = seg.dst_offset + (lo - seg.src_offset);
            const char* src = piece.data() + (lo - offset);
            if (in_memory) {
              std::memcpy(assembled.data() + dst, src, hi - lo);
            } else {
              CAIRN_RETURN_IF_ERROR(
                  file.Write(at + dst, absl::Span<const char>(src, hi - lo)));
            }
            if (hi == seg.src_offset + seg.length) next = s + 1;
          }
          Report(piece.size());
          return absl::OkStatus();
        }));
  }
  if (covered != static_cast<uint64_t>(planner::NumElements(shape))) {
    return absl::DataLossError(absl::StrCat(
        where_, " tensor '", e.fqn(), "': its chunks hold ", covered, " of ",
        planner::NumElements(shape), " elements"));
  }
  if (in_memory) {
    CAIRN_RETURN_IF_ERROR(file.Write(at, assembled));
  }
  return absl::OkStatus();
}

absl::Status Exporter::WriteShard(const Shard& shard, const std::string& dir,
                                  ExportedFile* written) {
  CAIRN_ASSIGN_OR_RETURN(std::unique_ptr<OutFile> file,
                         OutFile::Create(dir, shard.name, export_name_));
  const uint64_t data_start = shard.header.size();
  CAIRN_RETURN_IF_ERROR(file->Reserve(data_start + shard.data_bytes));
  CAIRN_RETURN_IF_ERROR(file->Write(0, shard.header));
  progress_.file = shard.name;
  progress_.file_done = 0;
  progress_.file_total = shard.data_bytes;
  if (options_.progress) options_.progress(progress_);
  for (size_t k = 0; k < shard.tensors.size(); ++k) {
    CAIRN_RETURN_IF_ERROR(CheckCancelled());
    CAIRN_RETURN_IF_ERROR(WriteTensor(manifest_.tensors(shard.tensors[k]),
                                      *file,
                                      data_start + shard.data_offsets[k]));
  }
  CAIRN_RETURN_IF_ERROR(file->Close());
  written->name = shard.name;
  written->num_tensors = static_cast<int>(shard.tensors.size());
  written->bytes = data_start + shard.data_bytes;
  return absl::OkStatus();
}

absl::StatusOr<ExportResult> Exporter::Run() {
  if (options_.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("--max-shard-size must be > 0");
  }
  // "out/" is the directory "out": its temporary sibling is "out.tmp-*".
  fs::path out = fs::path(options_.out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  if (out.empty() || out == "." || out == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("--out '", options_.out_dir, "': name a new directory"));
  }
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec))) {
    return absl::AlreadyExistsError(
        absl::StrCat(out.string(), " exists; pass a new directory"));
  }
  export_name_ = absl::StrCat("export of ", where_, " to '", out.string(), "'");
  ExportResult result;
  CAIRN_ASSIGN_OR_RETURN(std::vector<int> tensors, SelectTensors(&result));

  // The files, each with its header: known before a byte of data is read.
  std::vector<uint64_t> sizes;
  for (int i : tensors) sizes.push_back(TensorBytes(manifest_.tensors(i)));
  const std::vector<std::vector<int>> plan =
      PlanShards(sizes, options_.max_shard_bytes);
  std::vector<Shard> shards(plan.size());
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < plan.size(); ++s) {
    shards[s].name =
        ShardFileName(static_cast<int>(s), static_cast<int>(plan.size()));
    for (int k : plan[s]) {
      shards[s].tensors.push_back(tensors[k]);
      weight_map[manifest_.tensors(tensors[k]).entry().fqn()] = shards[s].name;
    }
    CAIRN_RETURN_IF_ERROR(BuildHeader(shards[s]));
    result.tensor_bytes += shards[s].data_bytes;
  }
  result.num_tensors = static_cast<int>(tensors.size());

  // The parents this export creates go again if it fails (deepest first;
  // only while empty, so nothing another process put there is lost).
  bool committed = false;
  std::vector<fs::path> made_parents;
  fs::path existing = ".";  // the nearest parent that exists
  for (fs::path p = out.parent_path(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(fs::symlink_status(p, ec))) {
      existing = p;
      break;
    }
    made_parents.push_back(p);
  }
  absl::Cleanup remove_parents = [&] {
    if (committed) return;
    std::error_code ignored;
    for (const fs::path& p : made_parents) fs::remove(p, ignored);
  };
  if (out.has_parent_path()) {
    fs::create_directories(out.parent_path(), ec);
    if (ec) {
      return IoError(ec.value(), export_name_, "creating directory",
                     out.parent_path().string(), existing.string());
    }
  }
  std::string tmp = out.string() + ".tmp-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) {
    const std::string parent =
        out.has_parent_path() ? out.parent_path().string() : ".";
    return IoError(errno, export_name_, "creating a temporary directory like",
                   tmp, parent);
  }
  absl::Cleanup remove_tmp = [&] {
    if (!committed) fs::remove_all(tmp, ec);
  };

  read_buffer_.resize(std::max<size_t>(options_.read_buffer_bytes, 1));
  progress_.num_files = static_cast<int>(shards.size());
  progress_.total = result.tensor_bytes;
  for (size_t s = 0; s < shards.size(); ++s) {
    progress_.file_index = static_cast<int>(s);
    ExportedFile written;
    CAIRN_RETURN_IF_ERROR(WriteShard(shards[s], tmp, &written));
    result.files.push_back(std::move(written));
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", result.tensor_bytes}}},
                            {"weight_map", std::move(weight_map)}};
    const std::string text = index.dump(2) + "\n";
    CAIRN_ASSIGN_OR_RETURN(
        std::unique_ptr<OutFile> file,
        OutFile::Create(tmp, kSafetensorsIndexName, export_name_));
    CAIRN_RETURN_IF_ERROR(file->Write(0, text));
    CAIRN_RETURN_IF_ERROR(file->Close());
    result.wrote_index = true;
  }
  CAIRN_RETURN_IF_ERROR(CheckCancelled());

  // mkdtemp makes it 0700: give it what mkdir would.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::chmod(tmp.c_str(), 0777 & ~mask) != 0) {
    return IoError(errno, export_name_, "setting the mode of", tmp, tmp);
  }
  CAIRN_RETURN_IF_ERROR(SyncDirectory(tmp, export_name_));
  CAIRN_RETURN_IF_ERROR(RenameNoReplace(tmp, out.string(), export_name_));
  committed = true;
  const std::string parent =
      out.has_parent_path() ? out.parent_path().string() : ".";
  CAIRN_RETURN_IF_ERROR(SyncDirectory(parent, export_name_));
  return result;
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view s) {
  const std::string text = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s));
  struct Unit {
    const char* suffix;
    uint64_t factor;
  };
  // Longest suffixes first ("kib" before "b").
  static constexpr Unit kUnits[] = {{"kib", uint64_t{1} << 10},
                                    {"mib", uint64_t{1} << 20},
                                    {"gib", uint64_t{1} << 30},
                                    {"tib", uint64_t{1} << 40},
                                    {"kb", 1000},
                                    {"mb", 1000000},
                                    {"gb", 1000000000},
                                    {"tb", 1000000000000},
                                    {"b", 1}};
  absl::string_view digits = text;
  uint64_t factor = 1;
  for (const Unit& u : kUnits) {
    if (absl::EndsWith(text, u.suffix)) {
      digits.remove_suffix(strlen(u.suffix));
      factor = u.factor;
      break;
    }
  }
  uint64_t n = 0;
  const bool digits_only =
      !digits.empty() &&
      digits.find_first_not_of("0123456789") == absl::string_view::npos;
  if (!digits_only || !absl::SimpleAtoi(digits, &n) || n == 0 ||
      n > (uint64_t{1} << 63) / factor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad size '", s,
        "': expected a positive size like 5GB, 500MB, 2GiB or a number of "
        "bytes"));
  }
  return n * factor;
}

std::string SafetensorsDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "F32";
    case v1::DTYPE_FLOAT64:
      return "F64";
    case v1::DTYPE_FLOAT16:
      return "F16";
    case v1::DTYPE_BFLOAT16:
      return "BF16";
    case v1::DTYPE_INT8:
      return "I8";
    case v1::DTYPE_UINT8:
      return "U8";
    case v1::DTYPE_INT16:
      return "I16";
    case v1::DTYPE_INT32:
      return "I32";
    case v1::DTYPE_INT64:
      return "I64";
    case v1::DTYPE_BOOL:
      return "BOOL";
    case v1::DTYPE_FLOAT8_E4M3:
      return "F8_E4M3";
    case v1::DTYPE_FLOAT8_E5M2:
      return "F8_E5M2";
    default:
      return "";
  }
}

std::vector<std::vector<int>> PlanShards(absl::Span<const uint64_t> sizes,
                                         uint64_t max_shard_bytes) {
  std::vector<std::vector<int>> files;
  std::vector<int> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool alone = sizes[i] > max_shard_bytes;
    if (!current.empty() &&
        (alone || current_bytes + sizes[i] > max_shard_bytes)) {
      files.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(static_cast<int>(i));
    current_bytes += sizes[i];
    if (alone) {
      files.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
  }
  if (!current.empty()) files.push_back(std::move(current));
  return files;
}

std::string ShardFileName(int index, int num_files) {
  if (num_files <= 1) return "model.safetensors";
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1,
                         num_files);
}

absl::StatusOr<ExportResult> ExportSafetensors(storage::ShardStore& store,
                                               const v1::Manifest& manifest,
                                               const ExportOptions& options) {
  return Exporter(store, manifest, options).Run();
}

}  // namespace cairn::cli
