#include "storage/testing/test_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/checkpoint_layout.h"
#include "storage/checksum.h"
#include "storage/manifest.h"

namespace cairn::storage {
namespace {

constexpr uint64_t kAlign = 4096;

struct Item {
  int rank;
  std::string bytes;
  v1::StoredChunk* chunk = nullptr;   // tensor item
  v1::ManifestBytes* blob = nullptr;  // bytes item
};

}  // namespace

std::string TestChunkBytes(const TestCheckpointSpec& spec, int t,
                           int64_t row_begin, int64_t row_end) {
  std::string out;
  out.reserve(static_cast<size_t>((row_end - row_begin) * spec.cols * 4));
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t c = 0; c < spec.cols; ++c) {
      const uint64_t i = static_cast<uint64_t>(r * spec.cols + c);
      const uint32_t v = static_cast<uint32_t>(
          (i * 2654435761u + static_cast<uint64_t>(t) * 40503u +
           spec.seed * 977u) &
          0xffffffu);
      const float f = static_cast<float>(v);
      char b[4];
      std::memcpy(b, &f, 4);
      out.append(b, 4);
    }
  }
  return out;
}

absl::StatusOr<v1::Manifest> WriteTestCheckpointData(
    ShardStore& store, const TestCheckpointSpec& spec) {
  v1::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_job(spec.job);
  m.set_step(spec.step);
  m.set_world_size(spec.world_size);
  m.set_created_unix_micros(1700000000000000 + spec.step);
  std::vector<Item> items;
  const int64_t per_rank = (spec.rows + spec.world_size - 1) / spec.world_size;
  for (int t = 0; t < spec.num_tensors; ++t) {
    v1::ManifestTensor* mt = m.add_tensors();
    mt->mutable_entry()->set_fqn(absl::StrCat("model.layers.", t, ".weight"));
    mt->mutable_entry()->set_dtype(v1::DTYPE_FLOAT32);
    mt->mutable_entry()->add_global_shape(spec.rows);
    mt->mutable_entry()->add_global_shape(spec.cols);
    for (int r = 0; r < spec.world_size; ++r) {
      const int64_t begin = std::min(spec.rows, r * per_rank);
      const int64_t end = std::min(spec.rows, begin + per_rank);
      v1::StoredChunk* c = mt->add_chunks();
      c->mutable_box()->add_offsets(begin);
      c->mutable_box()->add_offsets(0);
      c->mutable_box()->add_sizes(end - begin);
      c->mutable_box()->add_sizes(spec.cols);
      c->set_writer_rank(r);
    }
  }
  // Pointers into m are stable from here on (no more adds to tensors).
  for (int t = 0; t < spec.num_tensors; ++t) {
    for (int r = 0; r < spec.world_size; ++r) {
      v1::StoredChunk* c = m.mutable_tensors(t)->mutable_chunks(r);
      const int64_t begin = c->box().offsets(0);
      items.push_back(
          Item{r, TestChunkBytes(spec, t, begin, begin + c->box().sizes(0)), c,
               nullptr});
    }
  }
  v1::ManifestBytes* blob = m.add_bytes_entries();
  blob->set_fqn("rng_state");
  blob->set_writer_rank(0);
  items.push_back(Item{0, absl::StrCat("rng-state-", spec.seed, "-", spec.step),
                       nullptr, blob});

  uint64_t total = 0;
  for (int r = 0; r < spec.world_size; ++r) {
    const std::string object = absl::StrCat("rank-", r, ".data");
    m.add_objects(object);
    CAIRN_ASSIGN_OR_RETURN(
        std::unique_ptr<ObjectWriter> writer,
        store.NewWriter(ObjectKey(spec.job, spec.step, object)));
    uint64_t offset = 0;
    for (Item& item : items) {
      if (item.rank != r) continue;
      const uint64_t pad = (kAlign - offset % kAlign) % kAlign;
      if (pad > 0) {
        const std::string zeros(pad, '\0');
        CAIRN_RETURN_IF_ERROR(
            writer->Append(absl::Span<const char>(zeros.data(), pad)));
        offset += pad;
      }
      v1::StorageLocation loc;
      loc.set_object_key(object);
      loc.set_offset(offset);
      loc.set_length(item.bytes.size());
      const uint32_t crc = Crc32c(item.bytes.data(), item.bytes.size());
      CAIRN_RETURN_IF_ERROR(writer->Append(
          absl::Span<const char>(item.bytes.data(), item.bytes.size())));
      offset += item.bytes.size();
      total += item.bytes.size();
      if (item.chunk != nullptr) {
        *item.chunk->mutable_location() = loc;
        item.chunk->set_crc32c(crc);
      } else {
        *item.blob->mutable_location() = loc;
        item.blob->set_crc32c(crc);
      }
    }
    CAIRN_RETURN_IF_ERROR(writer->Close());
  }
  m.set_total_bytes(total);
  // A manifest lists its tensors by fqn ("model.layers.10." before ".2.").
  std::sort(m.mutable_tensors()->pointer_begin(),
            m.mutable_tensors()->pointer_end(),
            [](const v1::ManifestTensor* a, const v1::ManifestTensor* b) {
              return a->entry().fqn() < b->entry().fqn();
            });
  return m;
}

absl::StatusOr<v1::Manifest> WriteTestCheckpoint(
    ShardStore& store, const TestCheckpointSpec& spec) {
  CAIRN_ASSIGN_OR_RETURN(v1::Manifest m, WriteTestCheckpointData(store, spec));
  CAIRN_RETURN_IF_ERROR(PublishManifest(store, m));
  return m;
}

}  // namespace cairn::storage
