// The records storage implies (RecordFromManifest) and which of them
// retention deletes (RetentionVictims, against a brute-force oracle on random
// catalogs).
#include "storage/checkpoint_record.h"

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cairn::storage {
namespace {

using ::testing::ElementsAre;

v1::Manifest ManifestOfTwoTensors() {
  v1::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_job("job");
  m.set_step(7);
  m.set_world_size(4);
  m.set_created_unix_micros(1700000000000000);
  m.set_total_bytes(4096);
  m.add_tensors()->mutable_entry()->set_fqn("a");
  m.add_tensors()->mutable_entry()->set_fqn("b");
  m.add_bytes_entries()->set_fqn("c");
  return m;
}

TEST(RecordFromManifestTest, RecordsTheManifestAsCommittedOnItsStorage) {
  const v1::CheckpointRecord r =
      RecordFromManifest(ManifestOfTwoTensors(), "file:///ckpt");
  EXPECT_EQ(r.job(), "job");
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(r.state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(r.world_size(), 4);
  EXPECT_EQ(r.total_bytes(), 4096u);
  EXPECT_EQ(r.num_tensors(), 2);
  EXPECT_EQ(r.num_bytes_entries(), 1);
  EXPECT_EQ(r.created_unix_micros(), 1700000000000000);
  // No commit time in a manifest: its creation time is the bound.
  EXPECT_EQ(r.committed_unix_micros(), 1700000000000000);
  EXPECT_EQ(r.storage_uri(), "file:///ckpt");
}

TEST(RecordFromManifestTest, CountsTheTensorsOfASummaryFromItsCount) {
  ManifestSummary summary;
  summary.header = ManifestOfTwoTensors();
  summary.header.clear_tensors();
  summary.num_tensors = 2;
  const v1::CheckpointRecord r = RecordFromManifest(summary, "file:///ckpt");
  EXPECT_EQ(r.num_tensors(), 2);
  v1::CheckpointRecord whole =
      RecordFromManifest(ManifestOfTwoTensors(), "file:///ckpt");
  EXPECT_EQ(r.SerializeAsString(), whole.SerializeAsString());
}

v1::CheckpointRecord Rec(int64_t step, v1::CheckpointState state) {
  v1::CheckpointRecord r;
  r.set_job("job");
  r.set_step(step);
  r.set_state(state);
  r.set_total_bytes(static_cast<uint64_t>(step) * 10);
  return r;
}

std::vector<int64_t> Steps(const std::vector<v1::CheckpointRecord>& records) {
  std::vector<int64_t> steps;
  for (const auto& r : records) steps.push_back(r.step());
  return steps;
}

TEST(RetentionVictimsTest, KeepsTheNewestCommittedAndIgnoresOtherStates) {
  const std::vector<v1::CheckpointRecord> records = {
      Rec(1, v1::CHECKPOINT_STATE_COMMITTED),
      Rec(2, v1::CHECKPOINT_STATE_ABORTED),
      Rec(3, v1::CHECKPOINT_STATE_COMMITTED),
      Rec(5, v1::CHECKPOINT_STATE_COMMITTED),
      Rec(9, v1::CHECKPOINT_STATE_WRITING),
      Rec(0, v1::CHECKPOINT_STATE_DELETING)};
  EXPECT_THAT(Steps(RetentionVictims(records, 2)), ElementsAre(1));
  EXPECT_THAT(Steps(RetentionVictims(records, 1)), ElementsAre(3, 1));
  EXPECT_THAT(Steps(RetentionVictims(records, 0)), ElementsAre(5, 3, 1));
  EXPECT_THAT(Steps(RetentionVictims(records, 3)), ElementsAre());
  EXPECT_THAT(Steps(RetentionVictims(records, -1)), ElementsAre());
  EXPECT_THAT(Steps(RetentionVictims({}, 1)), ElementsAre());
}

// Oracle: a record is deleted iff it is COMMITTED and at least keep_last
// committed records have a higher step; the answer is newest first.
TEST(RetentionVictimsTest, MatchesABruteForceOracleOnRandomCatalogs) {
  std::mt19937_64 rng(12);
  const v1::CheckpointState kStates[] = {
      v1::CHECKPOINT_STATE_COMMITTED, v1::CHECKPOINT_STATE_COMMITTED,
      v1::CHECKPOINT_STATE_WRITING, v1::CHECKPOINT_STATE_ABORTED,
      v1::CHECKPOINT_STATE_DELETING};
  for (int trial = 0; trial < 5000; ++trial) {
    SCOPED_TRACE(trial);
    std::set<int64_t> used;
    std::vector<v1::CheckpointRecord> records;
    const int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const int64_t step = static_cast<int64_t>(rng() % 40);
      if (!used.insert(step).second) continue;
      records.push_back(Rec(step, kStates[rng() % 5]));
    }
    std::shuffle(records.begin(), records.end(), rng);
    const int keep_last = static_cast<int>(rng() % 14) - 1;

    std::vector<int64_t> want;
    for (const auto& r : records) {
      if (r.state() != v1::CHECKPOINT_STATE_COMMITTED || keep_last < 0) {
        continue;
      }
      int newer = 0;
      for (const auto& o : records) {
        newer +=
            o.state() == v1::CHECKPOINT_STATE_COMMITTED && o.step() > r.step();
      }
      if (newer >= keep_last) want.push_back(r.step());
    }
    std::sort(want.rbegin(), want.rend());
    const std::vector<v1::CheckpointRecord> got =
        RetentionVictims(records, keep_last);
    ASSERT_EQ(Steps(got), want) << "keep_last " << keep_last;
    for (const auto& r : got) {
      EXPECT_EQ(r.total_bytes(), static_cast<uint64_t>(r.step()) * 10);
    }
  }
}

}  // namespace
}  // namespace cairn::storage
