// Load planning: a manifest's stored chunks + one rank's wanted chunks ->
// read items (which bytes of which stored chunk go where in which buffer).
//
// Algorithm: LoadPlanner::Create builds one OverlapIndex (a bounding-volume
// hierarchy, see overlap_index.h) per tensor over its stored chunks, once per
// manifest, and checks that the stored chunks lie inside the tensor and are
// pairwise disjoint. Plan() then answers each wanted chunk with an index query
// (O(log n + k) instead of PyTorch's O(wanted x stored) loop in
// create_read_items_for_chunk_list), and emits one ReadItem per overlapping
// stored chunk, whose CopySegments are coalesced (bytes read == bytes needed,
// fewest ranges). Because stored chunks are disjoint, the wanted chunk is
// fully covered exactly when the overlap volumes add up to its volume, so
// each wanted byte is covered by exactly one read segment.
//
// Errors of Plan():
//   NOT_FOUND            the fqn is not in the checkpoint;
//   INVALID_ARGUMENT     dtype or global shape differ ("saved float32
//                        [4, 4], requested bfloat16 [4, 4]"), or the wanted
//                        box is malformed / outside the global shape;
//   FAILED_PRECONDITION  the checkpoint does not hold every element of a
//                        wanted box (an incomplete checkpoint; retrying the
//                        same call cannot succeed, and no data is corrupt, so
//                        this is not DATA_LOSS). The message names the fqn,
//                        the wanted box and an uncovered sub-box;
//   RESOURCE_EXHAUSTED   the reads of one call would need more than
//                        kMaxCopySegmentsPerPlan copy segments (the stored
//                        chunks split the wanted boxes too finely: a column
//                        of a row-major chunk is one segment per row). Found
//                        by fuzz/plan_convert_fuzzer: one wanted chunk of a
//                        512 MiB checkpoint asked cairnd for 6 GiB.
#ifndef CAIRN_PLANNER_LOAD_PLAN_H_
#define CAIRN_PLANNER_LOAD_PLAN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "planner/overlap_index.h"
#include "planner/save_plan.h"

namespace cairn::planner {

struct StoredChunk {
  ChunkBox box;
  StorageLocation location;  // location.length == Volume(box) * dtype size
  uint32_t crc32c = 0;
};

// A stored chunk whose object is named by its index among the objects a
// LoadPlanner::Builder was made with (a manifest lists its objects once;
// naming them by key costs a string per chunk, 18 M at 16k ranks).
struct StoredChunkByIndex {
  ChunkBox box;
  uint32_t object = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // Volume(box) * dtype size
  uint32_t crc32c = 0;
};

// A stored tensor whose chunks name their objects by key (StoredChunk) or
// by index (StoredChunkByIndex).
template <typename Chunk>
struct StoredTensorOf {
  std::string fqn;
  DType dtype = DType::kUnspecified;
  Shape global_shape;
  std::vector<Chunk> chunks;  // disjoint boxes
};
using StoredTensor = StoredTensorOf<StoredChunk>;
using StoredTensorByIndex = StoredTensorOf<StoredChunkByIndex>;

struct WantedChunk {
  std::string fqn;
  DType dtype = DType::kUnspecified;
  Shape global_shape;
  ChunkBox box;
};

// A wanted chunk of a tensor the planner holds, named by its index
// (LoadPlanner::Find): its dtype and global shape are the stored tensor's.
// A request that names the checkpoint's own tensors (cairnd's short form)
// is planned this way, with no fqn copied, hashed or compared per chunk.
struct WantedBox {
  int tensor = 0;
  ChunkBox box;
};

// Wanted boxes of stored tensors as one run of values, as a short PlanLoad
// request sends them: wanted chunk i is a box of stored tensor order[i],
// its offsets then its sizes (one value per dim of the tensor) next in
// `values`. Planned as the same WantedBoxes would be, with no box held per
// wanted chunk (a request of a large model names thousands of them, and
// building each would be a visible share of cairnd's PlanLoad work).
struct WantedBoxRun {
  absl::Span<const int> order;
  absl::Span<const int64_t> values;

  size_t size() const { return order.size(); }  // wanted chunks
};

struct ReadItem {
  std::string fqn;
  int dest_index = 0;      // index into the wanted vector
  ChunkBox overlap;        // global coordinates
  int source_chunk = 0;    // index into StoredTensor::chunks
  StorageLocation source;  // the whole stored chunk
  uint32_t source_crc32c = 0;
  // src_offset RELATIVE TO the stored chunk start (add source.offset for the
  // object offset); dst_offset relative to the wanted chunk's row-major
  // buffer. Coalesced, sorted by src_offset.
  std::vector<CopySegment> segments;
};

// One stored chunk as a LoadPlanner keeps it (see chunk()). The key views
// the planner's one copy of it and lives as long as the planner.
struct StoredChunkView {
  ChunkBox box;
  absl::string_view object_key;
  uint64_t offset = 0;
  uint64_t length = 0;  // Volume(box) * dtype size
  uint32_t crc32c = 0;

  StorageLocation location() const {
    return StorageLocation{std::string(object_key), offset, length};
  }
};

// Copy segments one Plan() call may produce in all (24 bytes each in memory,
// up to ~30 on the wire): 8 Mi, 192 MiB, far beyond real loads (a wanted
// [131072, 8192] tensor stored as 8 column blocks needs 1 Mi) and within
// cairnd's largest answer.
inline constexpr uint64_t kMaxCopySegmentsPerPlan = uint64_t{1} << 23;

// Thread-safe: built once per manifest; every const method may be called
// concurrently without external locking.
//
// Memory: a checkpoint of a 70B model saved by 4096 ranks has ~5.7 M stored
// chunks, and cairnd keeps the planner of each checkpoint being loaded, so a
// chunk is kept in ~20 bytes: its object as an index into the planner's one
// copy of each object key; its offset and checksum; and its place in the
// (object, offset) lookup. Its box is in its tensor's overlap index (~50
// bytes a 2-D box), which every tensor stored in the same tiling shares: the
// layers of a model repeat a few dozen tilings. Its length is Volume(box) *
// dtype size.
class LoadPlanner {
 public:
  // INVALID_ARGUMENT (naming the fqn and chunk) for: duplicate or empty fqns,
  // unknown dtypes, invalid shapes, chunks outside the shape, overlapping
  // chunks, chunk location lengths != Volume * dtype size, more than 2^31
  // stored chunks in all.
  static absl::StatusOr<std::unique_ptr<LoadPlanner>> Create(
      std::vector<StoredTensor> tensors);

  // Builds a planner one tensor at a time, so a caller converting a manifest
  // holds one tensor in its spelled-out form at a time (Create is Add for
  // each, then Finish).
  class Builder {
   public:
    Builder();
    // A builder whose chunks may also name their objects by index into
    // `objects` (distinct keys, as a valid manifest's object list).
    explicit Builder(std::vector<std::string> objects);
    ~Builder();
    Builder(const Builder&) = delete;
    Builder& operator=(const Builder&) = delete;
    // Create's checks, for this tensor; after an error the builder is
    // unusable.
    absl::Status Add(StoredTensor tensor);
    // The same, for chunks naming their objects by index (INVALID_ARGUMENT
    // for an index past the objects the builder knows).
    absl::Status Add(StoredTensorByIndex tensor);
    std::unique_ptr<LoadPlanner> Finish() &&;

   private:
    static size_t TilingHash(const std::vector<ChunkBox>& boxes);
    // An index built earlier over exactly `boxes` (whose TilingHash is
    // `tiling`), or null.
    std::shared_ptr<const OverlapIndex> Shared(
        size_t tiling, const std::vector<ChunkBox>& boxes) const;

    std::unique_ptr<LoadPlanner> planner_;
    // The indexes built so far, by TilingHash of their boxes.
    absl::flat_hash_map<size_t,
                        std::vector<std::shared_ptr<const OverlapIndex>>>
        indexes_;
  };

  // Read items for `wanted`, grouped by wanted chunk (dest_index ascending),
  // then by stored chunk index. Empty wanted boxes need no reads. See the
  // file comment for errors.
  absl::StatusOr<std::vector<ReadItem>> Plan(
      const std::vector<WantedChunk>& wanted) const;
  // The same for wanted chunks named by tensor index: INVALID_ARGUMENT for an
  // index that is no stored tensor, every other error as above.
  absl::StatusOr<std::vector<ReadItem>> Plan(
      absl::Span<const WantedBox> wanted) const;
  // The same for a run of boxes: also INVALID_ARGUMENT when `values` holds
  // more or fewer than every wanted chunk's offsets and sizes.
  absl::StatusOr<std::vector<ReadItem>> Plan(const WantedBoxRun& wanted) const;

  // One read item as PlanEach hands it over: views into the planner and a
  // scratch buffer, valid only during the call.
  struct ReadView {
    int dest_index = 0;
    int tensor = 0;                           // index of the stored tensor
    absl::string_view fqn;                    // its fqn
    int source_chunk = 0;                     // index among its stored chunks
    const StoredChunkView* source = nullptr;  // that chunk
    const ChunkBox* overlap = nullptr;
    // Null when PlanEach was asked for no segments.
    const std::vector<CopySegment>* segments = nullptr;
    uint32_t chunk_id = 0;   // the source's id in the checkpoint (ChunkOfId)
    uint32_t object_id = 0;  // its object's index (object())
    uint64_t bytes = 0;      // the overlap's: what the segments add up to
    // The source's box among the boxes of the checkpoint's distinct tilings
    // (< num_box_ids()): chunks of tensors stored in one tiling share the
    // ids of their boxes, so a reader may send each box once.
    uint32_t box_id = 0;
  };
  // Plan() without building ReadItems: calls `sink` once per read item, in
  // Plan()'s order, so a caller can write each straight into its answer (no
  // fqn or object key copied per item). Without `segments` the copy segments
  // are not built (a reader that derives them; the plan-wide bound on their
  // number is still checked). On an error `sink` may have seen some items
  // already; the caller discards them.
  absl::Status PlanEach(const std::vector<WantedChunk>& wanted,
                        absl::FunctionRef<void(const ReadView&)> sink,
                        bool segments = true) const;
  absl::Status PlanEach(absl::Span<const WantedBox> wanted,
                        absl::FunctionRef<void(const ReadView&)> sink,
                        bool segments = true) const;
  absl::Status PlanEach(const WantedBoxRun& wanted,
                        absl::FunctionRef<void(const ReadView&)> sink,
                        bool segments = true) const;
  // `w` with its tensor named: the fqn, dtype and global shape of stored
  // tensor w.tensor (which must be one).
  WantedChunk Named(const WantedBox& w) const;

  // The stored tensors, in the order Create() was given them.
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  // The index of the stored tensor named `fqn`, or -1.
  int Find(absl::string_view fqn) const;
  const std::string& fqn(int t) const { return tensors_[t].fqn; }
  DType dtype(int t) const { return tensors_[t].dtype; }
  const Shape& global_shape(int t) const { return tensors_[t].global_shape; }
  int num_chunks(int t) const { return tensors_[t].num_chunks; }
  // Stored chunk `c` of tensor `t`.
  StoredChunkView chunk(int t, int c) const;
  // The same into `out`, reusing its box's storage (for loops over chunks).
  void Fill(int t, int c, StoredChunkView* out) const;
  // The stored chunk at `offset` of `object_key`: (tensor, chunk), or
  // std::nullopt when no chunk starts there.
  std::optional<std::pair<int, int>> ChunkAt(absl::string_view object_key,
                                             uint64_t offset) const;
  // Stored chunks have ids 0 .. num_chunk_ids() - 1 (ReadView.chunk_id),
  // tensor by tensor. The chunk with id `id`: (tensor, chunk), or
  // std::nullopt when there is no such id.
  uint32_t num_chunk_ids() const {
    return static_cast<uint32_t>(chunks_.size());
  }
  std::optional<std::pair<int, int>> ChunkOfId(uint32_t id) const;
  // Id of a tensor's chunk (tensor by tensor: what answers name it by).
  uint32_t Id(int t, int c) const {
    return tensors_[t].first_chunk + static_cast<uint32_t>(c);
  }
  // Distinct overlap indexes: the tilings of the stored tensors (stats).
  int num_indexes() const;
  // The boxes of those tilings (ReadView.box_id counts them).
  uint32_t num_box_ids() const { return num_box_ids_; }
  // Approximate bytes the planner holds: its chunks, tensors, object keys,
  // distinct overlap indexes and the (object, offset) lookup as if built
  // (what a cache of planners should charge it).
  size_t MemoryBytes() const;
  // The data objects (ReadView.object_id indexes them).
  const std::string& object(uint32_t o) const { return objects_[o]; }

 private:
  struct IndexedTensor {
    std::string fqn;
    DType dtype = DType::kUnspecified;
    Shape global_shape;
    uint32_t first_chunk = 0;  // its chunks' ids: first_chunk + index
    int num_chunks = 0;
    // Holds the chunks' boxes; shared by the tensors stored in the same
    // tiling.
    std::shared_ptr<const OverlapIndex> index;
    // Where its chunks' records are in chunks_: chunk c at record + c *
    // stride (see chunks_).
    uint32_t record = 0;
    uint32_t stride = 1;
    // Its chunks' boxes' ids (ReadView.box_id): box_base + chunk index,
    // shared with the other tensors of its tiling.
    uint32_t box_base = 0;
  };
  LoadPlanner() = default;
  // Where a tensor's chunk's record is in chunks_.
  uint32_t Record(int t, int c) const {
    return tensors_[t].record + static_cast<uint32_t>(c) * tensors_[t].stride;
  }
  // The (tensor, chunk) whose record is chunks_[record].
  std::pair<int, int> OfRecord(uint32_t record) const;
  // What PlanEach reuses from one wanted chunk to the next.
  struct PlanScratch;
  // The reads of wanted chunk `w`, a box of stored tensor `t` (dtype and
  // shape already matched), into `sink`.
  absl::Status PlanWanted(int w, int t, const ChunkBox& box,
                          PlanScratch& scratch,
                          absl::FunctionRef<void(const ReadView&)> sink,
                          bool with_segments) const;
  static void AddRead(const ReadView& r, std::vector<ReadItem>* reads);
  // Plan's body, for either form of the wanted chunks.
  template <typename Wanted>
  absl::StatusOr<std::vector<ReadItem>> PlanAll(const Wanted& wanted) const;

  // Constant after construction.
  std::vector<IndexedTensor> tensors_;
  absl::flat_hash_map<std::string, int> by_fqn_;
  std::vector<std::string> objects_;  // each object key once (one per rank)
  absl::flat_hash_map<std::string, uint32_t> object_ids_;  // key -> index
  // Where each stored chunk is: one record of 16 bytes, so an item of a
  // plan touches one cache line of these, not three arrays.
  struct ChunkRecord {
    uint64_t offset = 0;
    uint32_t object = 0;  // index into objects_
    uint32_t crc32c = 0;
  };
  // The records of the tensors stored in one tiling are kept chunk by chunk,
  // then tensor by tensor: chunk c of the tiling's j-th tensor (of m) at
  // base + c * m + j. A rank wants the same box of every tensor of a kind,
  // one after another, so the records its plan reads follow each other in
  // memory; laid out tensor by tensor (as ids are), each would be a cache
  // and TLB miss in hundreds of MB of records at 16k ranks.
  std::vector<ChunkRecord> chunks_;
  // The tilings' runs of records, by base: OfRecord's map back.
  struct RecordRun {
    uint32_t base = 0;     // its first record
    uint32_t tensors = 1;  // m: the tensors stored in its tiling
    uint32_t first = 0;    // they are run_tensors_[first, first + m)
  };
  std::vector<RecordRun> runs_;
  std::vector<int> run_tensors_;
  uint32_t num_box_ids_ = 0;  // the runs' tilings' chunks, summed
  // Records sorted by (object, offset), for ChunkAt: built by its first
  // call (only a VerifyLoad piece in the full form names a chunk by its
  // location; read columns name it by id), not by every build of a
  // loaded checkpoint (sorting millions of records is a large share of a
  // build).
  void SortByLocation() const;
  mutable absl::once_flag by_location_once_;
  mutable std::vector<uint32_t> by_location_;
};

}  // namespace cairn::planner

#endif  // CAIRN_PLANNER_LOAD_PLAN_H_
