#include "storage/posix/posix_shard_store.h"

namespace cairn::storage {

absl::StatusOr<std::unique_ptr<ShardStore>> OpenPosixShardStore(
    absl::string_view, const StoreOptions&) {
  return absl::UnimplementedError("posix");
}

}  // namespace cairn::storage
