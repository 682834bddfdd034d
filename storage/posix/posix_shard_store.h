// The posix ShardStore: objects are files under a root directory. Its own
// library (CMake cairn_storage_posix, Bazel //storage/posix), which registers
// the "file" scheme (file:///path, and bare absolute paths) when linked.
//
// Writes: an ObjectWriter writes a temp file ".cairn-tmp.<name>.<random>" in
// the object's directory. Appends are split into io_chunk_bytes pieces and
// written with parallel pwrite() calls on the store's I/O threads (the call
// returns when every piece is written, so the caller may reuse its buffer).
// With use_odirect the file is opened O_DIRECT: buffers, offsets and lengths
// that are 4096-aligned go straight to the disk; anything else is copied into
// aligned staging buffers which are written asynchronously while the caller
// fills the next one; the tail is padded to 4096 and the file truncated to
// its real size. Close(): fdatasync, rename to the final name, fsync of the
// directory (and of the parents of directories it had to create).
// Space: a writer created with WriterOptions::expected_bytes reserves exactly
// that (fallocate, FALLOC_FL_KEEP_SIZE) before it writes, and O_DIRECT
// writes reserve exactly what they reach beyond it, never ahead. Out of
// space anywhere on the write path is RESOURCE_EXHAUSTED "no space left on
// device writing '<key>' (N bytes needed, M free)".
// Reads: pread() into the caller's buffers. Ranges that tile one contiguous
// span are streamed front to back in 1 MiB preads (POSIX_FADV_SEQUENTIAL;
// the kernel's readahead keeps the disk busy); scattered ranges are merged
// where adjacent (one preadv) and read in parallel on the I/O threads.
// Keys are validated (ValidateKey) and resolved one segment at a time from
// a directory fd on the root with O_NOFOLLOW (openat/renameat/unlinkat), so
// neither a bad key nor a symlink planted inside the root can reach a file
// outside it: a symlink on the way reads as NOT_FOUND.
// List() walks the directory tree below the prefix's directory, skipping
// temp files; ListChildren() reports a directory only when it holds a
// visible object somewhere below. Deleting the last object of a directory
// removes the directory (up to, not including, the root). DeletePrefix()
// also removes the temp files a crashed writer left in directories wholly
// under the prefix (DeleteStep of an incomplete step cleans it up); a writer
// still in flight there fails at Close().
#ifndef CAIRN_STORAGE_POSIX_POSIX_SHARD_STORE_H_
#define CAIRN_STORAGE_POSIX_POSIX_SHARD_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/shard_store.h"

namespace cairn::storage {

// Opens (creating the directory and its parents if needed) a posix store
// rooted at the absolute path `root`. INVALID_ARGUMENT for a relative path or
// bad options; the errno-mapped status if the directory cannot be created.
absl::StatusOr<std::unique_ptr<ShardStore>> OpenPosixShardStore(
    absl::string_view root, const StoreOptions& options = {});

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_POSIX_POSIX_SHARD_STORE_H_
