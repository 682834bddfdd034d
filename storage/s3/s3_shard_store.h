// The S3 ShardStore: objects are S3 objects under one bucket and key prefix.
// Its own library (CMake cairn_storage_s3, Bazel //storage/s3), which
// registers the "s3" scheme when linked:
//   s3://BUCKET[/PREFIX][?endpoint=...&region=...&addressing=path&...]
// (every query parameter and the AWS environment it reads: s3_config.h).
//
// Opening a store lists the bucket once (S3Client::CheckAccess), so wrong
// credentials, a missing bucket or an unreachable server fail at open, with
// the reason, not at the first write.
//
// Writes: an object that stays at or below single_put_max_bytes is buffered
// and sent as one PUT at Close(); a larger one becomes a multipart upload,
// its parts (nominally part_bytes, doubling every 1,000 parts so no object
// needs more than S3's 10,000) uploaded at most upload_concurrency at a
// time. An Append of 1 MiB or more is sent straight from the caller's
// memory, no copy: it is cut into parts of between half a nominal part (at
// least S3's 5 MiB) and a whole one, so the last can end where the Append
// does, and Append returns once they are uploaded (the caller may reuse its
// buffer then). Shorter Appends, and a tail too short for a part, are copied
// into a buffer that goes as a part of its own, in the background, once
// full (so a writer holds at most (upload_concurrency + 1) parts of memory;
// Append blocks while the window is full). Close() completes the upload,
// which makes the object visible whole; a failure, or destroying the writer
// unclosed, aborts the upload, so nothing becomes visible. A writer whose
// process dies leaves an in-progress upload (S3's counterpart of posix's temp
// file): DeleteAbandonedWrites and DeletePrefix abort those. Put() is one PUT:
// atomic and visible whole on return (S3 is read-after- write consistent);
// PutIfAbsent is one PUT with `If-None-Match: *`.
// Reads: ranged GETs straight into the caller's buffers. ReadRanges sorts the
// ranges, merges neighbours closer than coalesce_gap_bytes into one GET (up
// to a span of a few parts; merged spans go through a scratch buffer), splits
// large ranges into part-sized GETs, and runs the GETs read_concurrency at a
// time. Counters of bytes requested vs. fetched are in stats().
// Listing: ListObjectsV2 (paginated); ListChildren uses '/' as delimiter.
// Deleting: DeleteObjects in batches of 1,000.
//
// Thread-safe, as every ShardStore.
#ifndef CAIRN_STORAGE_S3_S3_SHARD_STORE_H_
#define CAIRN_STORAGE_S3_S3_SHARD_STORE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_config.h"
#include "storage/shard_store.h"

namespace cairn::storage::s3 {

// Read counters of an S3 store since it was opened.
struct S3ReadStats {
  uint64_t bytes_requested = 0;  // the bytes callers asked for
  uint64_t bytes_fetched = 0;    // the bytes GETs asked S3 for (with gaps)
  uint64_t gets = 0;             // ranged GETs issued (not counting retries)
};

// An S3 store. Everything a ShardStore does, plus the client and counters.
class S3ShardStore : public ShardStore {
 public:
  virtual S3Client& client() = 0;
  virtual S3ReadStats read_stats() const = 0;
};

// Opens a store on `config` (checking access, see above). The error of
// S3Client::CheckAccess when the bucket cannot be listed.
absl::StatusOr<std::unique_ptr<S3ShardStore>> OpenS3ShardStore(S3Config config);

}  // namespace cairn::storage::s3

#endif  // CAIRN_STORAGE_S3_S3_SHARD_STORE_H_
