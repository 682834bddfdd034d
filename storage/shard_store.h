// ShardStore: the only I/O interface of Cairn. Every checkpoint byte goes
// through it: large data objects streamed from buffers (ObjectWriter), small
// metadata published atomically (Put), ranged reads straight into caller
// buffers (Read / ReadRanges), listing by prefix and deletion.
//
// Backends (drivers) are libraries of their own that register their URI
// scheme when linked (see ShardStoreRegistrar); OpenShardStore() opens a URI
// with whichever driver registered its scheme:
//   file:///data/ckpt   posix (storage/posix/): local disk, Lustre, GPFS
//   mem://              memory (storage/memory/): a fresh private store
//   mem://name          memory, shared by every opener in the process
//   s3://bucket/prefix  S3 (storage/s3/): AWS S3, Ceph radosgw, MinIO
// This library includes no driver: a binary gets a scheme by linking its
// driver (CMake cairn_storage_posix / cairn_storage_memory, linked whole;
// Bazel //storage/posix, //storage/memory, alwayslink).
//
// Keys are relative, '/'-separated paths (see ValidateKey). A key is an
// object, never a "directory": List("a/") lists every key starting with
// "a/". Every backend passes the shared conformance suite in
// storage/testing/shard_store_conformance.h.
//
// Visibility and durability: an object becomes visible to readers only once
// it is complete (ObjectWriter::Close or Put returned OK), and at that point
// it is durable (posix: data fsync, rename from a temp name, directory fsync).
// Replacing an existing key is atomic: readers see the old or the new bytes,
// never a mix.
#ifndef CAIRN_STORAGE_SHARD_STORE_H_
#define CAIRN_STORAGE_SHARD_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace cairn::storage {

// A byte range [offset, offset + length) of an object.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Sequential writer of one (large) object. The bytes become visible under
// its key only after Close() succeeds; destroying the writer without a
// successful Close() aborts it and leaves nothing visible (and no temp file,
// unless the process really crashed).
//
// Thread-compatible: one writer is used by one thread at a time (different
// writers may be used concurrently).
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;
  ObjectWriter() = default;
  ObjectWriter(const ObjectWriter&) = delete;
  ObjectWriter& operator=(const ObjectWriter&) = delete;

  // Appends `data`. The caller may reuse `data` as soon as this returns.
  // After an error the writer is failed: further calls return that error.
  virtual absl::Status Append(absl::Span<const char> data) = 0;
  // Makes the object durable and visible. FAILED_PRECONDITION if called
  // twice or after an error.
  virtual absl::Status Close() = 0;
  // Bytes accepted by Append so far.
  virtual uint64_t bytes_written() const = 0;
  // Overwrites the object's first data.size() bytes, already appended, before
  // Close (a MANIFEST's frame header, which holds its body's length and
  // crc32c, is written last this way). Only on a writer opened with
  // WriterOptions::rewrite_prefix from a store whose CanRewritePrefix() is
  // true; FAILED_PRECONDITION otherwise. Fails the writer like Append.
  virtual absl::Status RewritePrefix(absl::Span<const char> data);

  // Test hook (used by the fault-injection store): behaves like the process
  // dying now. Whatever a real crash would leave (posix: the temp file) is
  // left; nothing becomes visible; the writer is unusable afterwards.
  virtual void SimulateCrashForTest() {}
};

// Options of one ObjectWriter.
struct WriterOptions {
  // The object's final size when the caller knows it (a save plan does).
  // posix reserves exactly this much space when the writer is created (and
  // nothing beyond it), so an object that cannot fit fails at once with
  // RESOURCE_EXHAUSTED "no space left on device writing '<key>' (N bytes
  // needed, M free)" before a byte is written. Backends without space
  // accounting ignore it. Default: 0 (unknown: nothing is reserved).
  uint64_t expected_bytes = 0;
  // The caller will call RewritePrefix (only where the store's
  // CanRewritePrefix() is true). posix writes such an object buffered, not
  // with O_DIRECT.
  bool rewrite_prefix = false;
};

// Thread-safe: every method may be called concurrently without external
// locking.
class ShardStore {
 public:
  virtual ~ShardStore() = default;
  ShardStore() = default;
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // The URI that opens this store again (OpenShardStore(uri())).
  virtual std::string uri() const = 0;

  // Starts writing `key` (created or replaced on Close). RESOURCE_EXHAUSTED
  // when options.expected_bytes cannot be reserved (see WriterOptions).
  virtual absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key, const WriterOptions& options) = 0;
  // The same, size unknown. (Subclasses: `using ShardStore::NewWriter;`.)
  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewWriter(
      absl::string_view key) {
    return NewWriter(key, WriterOptions());
  }

  // Whether its writers can overwrite what they have already appended
  // (ObjectWriter::RewritePrefix): posix and memory can; S3, whose uploads
  // are append-only, cannot. Default: false.
  virtual bool CanRewritePrefix() const { return false; }

  // Creates or replaces `key` with `data`: durable and atomically visible on
  // return.
  virtual absl::Status Put(absl::string_view key,
                           absl::Span<const char> data) = 0;

  // Creates `key` with `data` only where no object has that key, else
  // ALREADY_EXISTS and nothing is written. Of concurrent creators, in any
  // processes on any hosts, at most one succeeds (posix: link(2) of a durable
  // temp file, atomic on local filesystems and NFS; memory: under its lock;
  // S3: a PUT with `If-None-Match: *`, which AWS S3, Ceph radosgw and MinIO
  // honour). Durable and visible on return, as Put. A request retried after a
  // lost answer may report ALREADY_EXISTS for an object it created itself:
  // callers that must know read it back (storage/lease.h writes a random
  // holder id). An S3 server that ignores the header replaces the object
  // instead, and so do wrappers that forward PutIfAbsent to Put: lease.h
  // checks for that. The default is UNIMPLEMENTED (backends that cannot).
  virtual absl::Status PutIfAbsent(absl::string_view key,
                                   absl::Span<const char> data);

  // Reads `range` of `key` into out[0, range.length). NOT_FOUND if `key` does
  // not exist; OUT_OF_RANGE if the range exceeds the object; INVALID_ARGUMENT
  // if out.size() < range.length. Returns the bytes read (== range.length).
  virtual absl::StatusOr<size_t> Read(absl::string_view key, ByteRange range,
                                      absl::Span<char> out) = 0;

  // Many ranges of one object in one call (posix: preadv of adjacent ranges,
  // parallel preads). outs.size() == ranges.size() and outs[i].size() ==
  // ranges[i].length, else INVALID_ARGUMENT. Errors as Read(); on error the
  // contents of `outs` are unspecified.
  virtual absl::Status ReadRanges(absl::string_view key,
                                  absl::Span<const ByteRange> ranges,
                                  absl::Span<const absl::Span<char>> outs) = 0;

  // Size of `key` in bytes; NOT_FOUND if missing.
  virtual absl::StatusOr<uint64_t> Size(absl::string_view key) = 0;

  // Every visible key starting with `prefix` (a plain string prefix, e.g.
  // "job/00" matches "job/0001/x"), sorted bytewise. "" lists everything.
  // INVALID_ARGUMENT for a prefix no valid key could have ("..", NUL, ...).
  virtual absl::StatusOr<std::vector<std::string>> List(
      absl::string_view prefix) = 0;

  // The distinct next path segments below `dir_prefix` ("" or ending in '/'):
  // "name" for an object dir_prefix + "name", "name/" when keys continue
  // below dir_prefix + "name/". Sorted. Lets callers walk the tree without
  // listing every object (S3: delimiter listing; posix: readdir).
  // The default implementation collapses List(dir_prefix).
  virtual absl::StatusOr<std::vector<std::string>> ListChildren(
      absl::string_view dir_prefix);

  // Removes `key`; NOT_FOUND if missing.
  virtual absl::Status Delete(absl::string_view key) = 0;

  // Removes every key starting with `prefix`; OK if there is none. Writers
  // still open under the prefix are not part of it (backend-defined: posix
  // fails their Close, memory publishes them).
  virtual absl::Status DeletePrefix(absl::string_view prefix) = 0;

  // Removes what unfinished writes left in the tree below `dir_prefix` ("" or
  // ending in '/'): the temp files of ObjectWriters never Closed because their
  // process died (posix: ".cairn-tmp.*", up to 64 MiB each, invisible to List
  // and kept by DeletePrefix of a prefix inside their directory), and the
  // directories that leaves empty. The caller must know that no writer below
  // `dir_prefix` is still live, in any process: a live writer's Close would
  // fail. OK if there is nothing to remove. The default does nothing (for
  // backends whose unfinished writes leave nothing behind, as memory).
  virtual absl::Status DeleteAbandonedWrites(absl::string_view dir_prefix);
};

// Options for OpenShardStore. Backends ignore what does not apply to them.
struct StoreOptions {
  // Threads a posix store uses to split large writes and reads into parallel
  // pwrite/pread calls. Default: 4. Must be >= 1.
  int io_threads = 4;
  // posix: write data objects with O_DIRECT from 4096-aligned buffers
  // (unaligned appends are staged through aligned buffers). Falls back to
  // buffered I/O, with a log line, where the filesystem refuses O_DIRECT.
  // Default: false (buffered writes + fdatasync before publish).
  bool use_odirect = false;
  // posix: granularity of the parallel pwrite/pread pieces and size of each
  // O_DIRECT staging buffer. Rounded up to a multiple of 4096. Default: 8 MiB.
  size_t io_chunk_bytes = 8 << 20;
  // posix: fsync data and directories before an object becomes visible.
  // Turning it off is for throwaway data only (it voids the crash guarantee).
  // Default: true.
  bool durable = true;
};

// Opens the store named by `uri` (see the table at the top) with the driver
// registered for its scheme. A bare absolute path is short for file://path.
// INVALID_ARGUMENT for a malformed URI, or for a scheme no linked driver
// registered (the message lists the registered schemes).
absl::StatusOr<std::unique_ptr<ShardStore>> OpenShardStore(
    absl::string_view uri, const StoreOptions& options = {});

// Backend factory for a URI scheme ("file", "mem", "s3", ...). `rest` is the
// URI after "scheme://".
using ShardStoreFactory =
    std::function<absl::StatusOr<std::unique_ptr<ShardStore>>(
        absl::string_view rest, const StoreOptions& options)>;

// Registers (or replaces) the factory for `scheme`.
// Thread-safe. Drivers call it through a ShardStoreRegistrar; tests may call
// it directly to add a scheme of their own (a fault-injecting wrapper, say).
void RegisterShardStoreScheme(absl::string_view scheme,
                              ShardStoreFactory factory);

// The schemes registered so far, sorted.
std::vector<std::string> RegisteredShardStoreSchemes();

// Registers a driver's scheme during static initialization. A driver defines
// one at namespace scope in its .cc:
//   const ShardStoreRegistrar kRegistrar("file", &OpenFromUri);
// The linker drops an object file of a static archive that nothing
// references, and the registrar with it: driver libraries are therefore
// linked whole (CMake WHOLE_ARCHIVE, Bazel alwayslink = True).
class ShardStoreRegistrar {
 public:
  ShardStoreRegistrar(absl::string_view scheme, ShardStoreFactory factory) {
    RegisterShardStoreScheme(scheme, std::move(factory));
  }
  ShardStoreRegistrar(const ShardStoreRegistrar&) = delete;
  ShardStoreRegistrar& operator=(const ShardStoreRegistrar&) = delete;
};

inline constexpr size_t kMaxKeyBytes = 1024;

// Keys are relative, '/'-separated, with no "." or ".." segment, no empty
// segment (so no leading, trailing or double '/'), no NUL, at most
// kMaxKeyBytes bytes, and no segment starting with ".cairn-tmp" (reserved
// for in-flight writes). Anything else is INVALID_ARGUMENT naming the key.
// This is what keeps every backend's files inside its root.
absl::Status ValidateKey(absl::string_view key);

// A prefix for List/DeletePrefix: "" or a string every segment of which,
// except a trailing partial one, obeys the ValidateKey rules.
absl::Status ValidatePrefix(absl::string_view prefix);

// Convenience: the whole object (Size then Read). Objects larger than
// `max_bytes` are RESOURCE_EXHAUSTED (no allocation is attempted).
absl::StatusOr<std::string> ReadObject(ShardStore& store, absl::string_view key,
                                       uint64_t max_bytes = 1ull << 34);

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_SHARD_STORE_H_
