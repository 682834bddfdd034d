#include "storage/memory/memory_shard_store.h"

namespace cairn::storage {

absl::StatusOr<std::unique_ptr<ShardStore>> OpenMemoryShardStore(
    absl::string_view) {
  return absl::UnimplementedError("memory");
}

}  // namespace cairn::storage
