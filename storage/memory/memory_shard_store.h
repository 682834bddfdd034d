// The memory ShardStore: a sorted map from key to immutable byte strings,
// for unit tests and as the reference behaviour of the conformance suite.
// Its own library (CMake cairn_storage_memory, Bazel //storage/memory), which
// registers the "mem" scheme when linked.
//
// "mem://" opens a fresh private store. "mem://name" opens a handle on the
// process-wide store called `name` (created on first use): every opener in
// the process sees the same objects, so a coordinator and clients in one
// test can share storage. Writers buffer in memory and publish on Close().
#ifndef CAIRN_STORAGE_MEMORY_MEMORY_SHARD_STORE_H_
#define CAIRN_STORAGE_MEMORY_MEMORY_SHARD_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/shard_store.h"

namespace cairn::storage {

// `name` empty: a new private store; otherwise the shared store `name`
// ([A-Za-z0-9._-]+, else INVALID_ARGUMENT).
absl::StatusOr<std::unique_ptr<ShardStore>> OpenMemoryShardStore(
    absl::string_view name = "");

}  // namespace cairn::storage

#endif  // CAIRN_STORAGE_MEMORY_MEMORY_SHARD_STORE_H_
