// Checks and error messages shared by the ShardStore backends (internal).
#ifndef CAIRN_STORAGE_STORE_UTIL_H_
#define CAIRN_STORAGE_STORE_UTIL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "storage/shard_store.h"

namespace cairn::storage::internal {

inline absl::Status ObjectNotFound(absl::string_view uri,
                                   absl::string_view key) {
  return absl::NotFoundError(
      absl::StrCat("object '", key, "' not found in ", uri));
}

// OUT_OF_RANGE unless [offset, offset + length) lies inside [0, size).
inline absl::Status CheckRange(absl::string_view uri, absl::string_view key,
                               ByteRange range, uint64_t size) {
  if (range.offset > size || range.length > size - range.offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "range [", range.offset, ", +", range.length, ") of object '", key,
        "' in ", uri, " exceeds its size ", size));
  }
  return absl::OkStatus();
}

inline absl::Status CheckOutBuffer(absl::string_view key, ByteRange range,
                                   size_t out_size) {
  if (out_size < range.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("read of object '", key, "': buffer of ", out_size,
                     " bytes is smaller than the range length ", range.length));
  }
  return absl::OkStatus();
}

// outs.size() == ranges.size() and outs[i].size() == ranges[i].length.
inline absl::Status CheckRangeBuffers(absl::string_view key,
                                      absl::Span<const ByteRange> ranges,
                                      absl::Span<const absl::Span<char>> outs) {
  if (outs.size() != ranges.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadRanges of object '", key, "': ", ranges.size(),
                     " ranges but ", outs.size(), " buffers"));
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (outs[i].size() != ranges[i].length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReadRanges of object '", key, "': buffer ", i, " has ",
          outs[i].size(), " bytes for a range of ", ranges[i].length));
    }
  }
  return absl::OkStatus();
}

}  // namespace cairn::storage::internal

#endif  // CAIRN_STORAGE_STORE_UTIL_H_
