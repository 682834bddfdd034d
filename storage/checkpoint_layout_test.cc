#include "storage/checkpoint_layout.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/manifest.h"
#include "storage/testing/fault_injection_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::storage {
namespace {

namespace fs = std::filesystem;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

absl::Span<const char> AsSpan(absl::string_view s) {
  return absl::Span<const char>(s.data(), s.size());
}

// Every test runs on both real backends.
class CheckpointLayoutTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<ShardStore> NewStore() {
    if (GetParam() == "memory") return OpenShardStore("mem://").value();
    return OpenShardStore("file://" +
                          testing::MakeTempDirRemovedAtExit("layout"))
        .value();
  }
  // A fresh handle on the same data, as a restarted process would open.
  std::unique_ptr<ShardStore> Reopen(ShardStore& store) {
    return OpenShardStore(store.uri()).value();
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointLayoutTest,
                         ::testing::Values("memory", "posix"));

TEST(CheckpointNamesTest, ManifestsLargerThanReadersTakeAreNotCommitted) {
  EXPECT_TRUE(CheckManifestSize(0, "llama", 7).ok());
  EXPECT_TRUE(CheckManifestSize(kMaxManifestBodyBytes, "llama", 7).ok());
  // The 70B model saved by 16k FSDP x TP ranks, measured: 1.38 GB.
  EXPECT_TRUE(CheckManifestSize(1377529388, "llama", 7).ok());
  const absl::Status s =
      CheckManifestSize(kMaxManifestBodyBytes + 1, "llama", 7);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("cannot commit job 'llama' step 7"),
                                HasSubstr("2147483648 bytes"),
                                HasSubstr("at most 2147483647"))));
}

TEST(CheckpointNamesTest, JobNamesAndSteps) {
  for (const char* ok : {"a", "llama-70b", "run_3.v2", "A.B-C_d", "..."}) {
    EXPECT_TRUE(ValidateJobName(ok).ok()) << ok;
  }
  for (const std::string& bad :
       {std::string(""), std::string("."), std::string(".."),
        std::string("a/b"), std::string("a b"), std::string(129, 'x'),
        std::string("nul\0", 4), std::string("ü")}) {
    const absl::Status s = ValidateJobName(bad);
    EXPECT_THAT(
        s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")))
        << bad;
  }
  EXPECT_TRUE(ValidateJobName(std::string(128, 'x')).ok());
  EXPECT_TRUE(ValidateStep(0).ok());
  EXPECT_TRUE(ValidateStep(kMaxStep).ok());
  EXPECT_THAT(ValidateStep(-1), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("step -1")));
  EXPECT_THAT(ValidateStep(kMaxStep + 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1000000000000001")));
  EXPECT_EQ(StepPrefix("job", 123), "job/0000000000000123/");
  EXPECT_EQ(ManifestKey("job", 123), "job/0000000000000123/MANIFEST");
  EXPECT_EQ(ObjectKey("j", kMaxStep, "rank-0.data"),
            "j/1000000000000000/rank-0.data");
  EXPECT_EQ(ParseStepDir("0000000000000123/").value(), 123);
  EXPECT_FALSE(ParseStepDir("123").ok());
  EXPECT_FALSE(ParseStepDir("000000000000012x").ok());
  EXPECT_FALSE(ParseStepDir("9999999999999999").ok());
  // Zero padding: string order == numeric order.
  EXPECT_LT(StepPrefix("j", 9), StepPrefix("j", 10));
}

TEST_P(CheckpointLayoutTest, PublishReadListDelete) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  spec.job = "llama";
  std::vector<v1::Manifest> saved;
  for (int64_t step : {10, 2, 300}) {
    spec.step = step;
    auto m = WriteTestCheckpoint(*store, spec);
    ASSERT_TRUE(m.ok()) << m.status();
    saved.push_back(*m);
  }
  spec.job = "other";
  spec.step = 5;
  ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
  // An incomplete step (data, no MANIFEST).
  spec.job = "llama";
  spec.step = 400;
  ASSERT_TRUE(WriteTestCheckpointData(*store, spec).ok());

  EXPECT_THAT(ListJobs(*store).value(), ElementsAre("llama", "other"));
  EXPECT_THAT(ListCommittedSteps(*store, "llama").value(),
              ElementsAre(2, 10, 300));
  EXPECT_THAT(ListIncompleteSteps(*store, "llama").value(), ElementsAre(400));
  EXPECT_THAT(ListCommittedSteps(*store, "nobody").value(), IsEmpty());
  EXPECT_THAT(ListCommittedSteps(*store, "../x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("../x")));

  auto m = ReadManifest(*store, "llama", 10);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->SerializeAsString(), saved[0].SerializeAsString());
  EXPECT_THAT(
      ReadManifest(*store, "llama", 400).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("not committed")));
  EXPECT_THAT(
      ReadManifest(*store, "llama", 7).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("job 'llama' step 7")));

  ASSERT_TRUE(DeleteStep(*store, "llama", 10).ok());
  ASSERT_TRUE(DeleteStep(*store, "llama", 400).ok());
  ASSERT_TRUE(DeleteStep(*store, "llama", 999).ok());  // nothing there
  EXPECT_THAT(ListCommittedSteps(*store, "llama").value(), ElementsAre(2, 300));
  EXPECT_THAT(ListIncompleteSteps(*store, "llama").value(), IsEmpty());
  EXPECT_THAT(store->List("llama/0000000000000010/").value(), IsEmpty());
}

TEST_P(CheckpointLayoutTest, PublishRefusesMissingOrShortObjects) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  auto m = WriteTestCheckpointData(*store, spec);
  ASSERT_TRUE(m.ok());
  // Shorten rank 1's object.
  const std::string key = ObjectKey("job", 1, "rank-1.data");
  std::string bytes = ReadObject(*store, key).value();
  ASSERT_TRUE(store->Put(key, absl::Span<const char>(bytes.data(), 100)).ok());
  EXPECT_THAT(
      PublishManifest(*store, *m),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("job/0000000000000001/rank-1.data' has 100 bytes")));
  ASSERT_TRUE(store->Delete(key).ok());
  EXPECT_THAT(PublishManifest(*store, *m),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("rank-1.data' is missing")));
  EXPECT_THAT(ListCommittedSteps(*store, "job").value(), IsEmpty());
  // An invalid manifest never reaches storage.
  v1::Manifest bad = *m;
  bad.set_total_bytes(0);
  EXPECT_THAT(
      PublishManifest(*store, bad),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("total_bytes")));
  EXPECT_THAT(store->Size(ManifestKey("job", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("MANIFEST")));
}

// The source of `m`, run by PublishManifest once or twice; `runs` counts.
auto SourceOf(const v1::Manifest& m, int* runs) {
  return
      [&m, runs](v1::Manifest* header,
                 absl::FunctionRef<absl::Status(const v1::ManifestTensor&)> add)
          -> absl::Status {
        ++*runs;
        *header = m;
        header->clear_tensors();
        for (const v1::ManifestTensor& t : m.tensors()) {
          if (absl::Status s = add(t); !s.ok()) return s;
        }
        return absl::OkStatus();
      };
}

// A store whose writers cannot rewrite what they wrote, as S3's.
class AppendOnlyStore : public FaultInjectionStore {
 public:
  using FaultInjectionStore::FaultInjectionStore;
  bool CanRewritePrefix() const override { return false; }
};

// Publishes a large manifest streamed, streamed after holding a piece, and
// held in pieces: the same bytes as a manifest put whole.
void PublishesLargeManifestsWithTheSameBytes(ShardStore* store) {
  TestCheckpointSpec spec;
  spec.world_size = 32;
  spec.num_tensors = 7000;  // 224k chunks: a manifest of three pieces
  spec.cols = 4;
  auto m = WriteTestCheckpointData(*store, spec);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string whole = EncodeManifest(*m);
  ASSERT_GT(whole.size(), 2 * kManifestPieceBytes);
  // Streamed; streamed after holding a piece; held in pieces.
  for (uint64_t held :
       {uint64_t{0}, uint64_t{kManifestPieceBytes}, uint64_t{64} << 20}) {
    SCOPED_TRACE(held);
    int runs = 0;
    ManifestSummary published;
    ASSERT_TRUE(PublishManifest(*store, SourceOf(*m, &runs),
                                PublishOptions{.max_held_bytes = held},
                                &published)
                    .ok());
    EXPECT_EQ(runs, held < whole.size() && !store->CanRewritePrefix() ? 2 : 1);
    EXPECT_EQ(ReadObject(*store, ManifestKey("job", 1)).value(), whole);
    EXPECT_EQ(published.num_tensors, spec.num_tensors);
    EXPECT_EQ(published.header.total_bytes(), m->total_bytes());
    EXPECT_EQ(published.header.tensors_size(), 0);
    auto back = ReadManifest(*store, "job", 1);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->SerializeAsString(), m->SerializeAsString());
    ASSERT_TRUE(store->Delete(ManifestKey("job", 1)).ok());
  }
}

// Over max_held_bytes the body is written as the run that checks and
// measures it makes it, its frame header last (memory and posix can rewrite
// it); where the store cannot, a second run streams it. Either way: the same
// bytes on storage as a manifest put whole.
TEST_P(CheckpointLayoutTest, LargeManifestsAreStreamedWithTheSameBytes) {
  auto rewriting = NewStore();
  ASSERT_TRUE(rewriting->CanRewritePrefix());
  AppendOnlyStore append_only(rewriting.get());
  for (ShardStore* store : {static_cast<ShardStore*>(rewriting.get()),
                            static_cast<ShardStore*>(&append_only)}) {
    SCOPED_TRACE(store->CanRewritePrefix() ? "rewriting" : "append-only");
    PublishesLargeManifestsWithTheSameBytes(store);
  }
}

// A publish of a large manifest that fails leaves no MANIFEST: a source
// that changes between its runs, a write that fails, a crash before the
// rename, a frame header that cannot be rewritten; streamed or held, written
// in one run or two. The checks come before anything is visible.
TEST_P(CheckpointLayoutTest, LargeManifestPublishFailuresLeaveNothingVisible) {
  auto base = NewStore();
  TestCheckpointSpec spec;
  spec.world_size = 32;
  spec.num_tensors = 3500;  // 112k chunks, two pieces
  spec.cols = 4;
  auto m = WriteTestCheckpointData(*base, spec);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_GT(EncodeManifest(*m).size(), kManifestPieceBytes);
  const PublishOptions stream{.max_held_bytes = 0};
  const std::string key = ManifestKey("job", 1);
  AppendOnlyStore append_only(base.get());

  int runs = 0;
  auto changing =
      [&](v1::Manifest* header,
          absl::FunctionRef<absl::Status(const v1::ManifestTensor&)> add)
      -> absl::Status {
    v1::Manifest copy = *m;
    if (++runs == 2) {  // the same size, another checksum
      copy.mutable_tensors(3)->mutable_chunks(0)->set_crc32c(
          copy.tensors(3).chunks(0).crc32c() ^ 1);
    }
    int inner = 0;
    return SourceOf(copy, &inner)(header, add);
  };
  EXPECT_THAT(PublishManifest(append_only, changing, stream, nullptr),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("changed between its two encodings")));
  EXPECT_THAT(base->Size(key).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("MANIFEST")));

  FaultInjectionStore rewriting(base.get());
  for (FaultInjectionStore* store :
       {&rewriting, static_cast<FaultInjectionStore*>(&append_only)}) {
    for (const PublishOptions& options : {stream, PublishOptions()}) {
      for (FaultAction action : {FaultAction::kFail, FaultAction::kShortWrite,
                                 FaultAction::kCrashBeforeRename}) {
        SCOPED_TRACE(absl::StrCat(
            store->CanRewritePrefix() ? "rewriting" : "append-only", " held ",
            options.max_held_bytes, " action ", static_cast<int>(action)));
        store->Reset();
        store->AddRule({.ops = action == FaultAction::kCrashBeforeRename
                                   ? kFaultClose
                                   : kFaultAppend,
                        .key_contains = "MANIFEST",
                        .skip = action == FaultAction::kFail ? 1 : 0,
                        .action = action});
        runs = 0;
        const int64_t writes_before = store->write_count();
        EXPECT_THAT(
            PublishManifest(*store, SourceOf(*m, &runs), options, nullptr),
            StatusIs(absl::StatusCode::kUnavailable,
                     HasSubstr("publishing the manifest of job 'job' step 1")));
        if (action == FaultAction::kFail) {
          // The frame (or its placeholder), then the body's first piece,
          // which fails: nothing is written after it (later pieces are
          // encoded while it is written, and dropped).
          EXPECT_EQ(store->write_count() - writes_before, 2);
        }
        EXPECT_THAT(
            base->Size(key).status(),
            StatusIs(absl::StatusCode::kNotFound, HasSubstr("MANIFEST")));
        EXPECT_THAT(ListCommittedSteps(*base, "job").value(), IsEmpty());
      }
    }
  }

  // Written in one run, the frame header comes last: the writes are the
  // placeholder, the body's pieces, the rewrite, the close.
  rewriting.Reset();
  int64_t writes = rewriting.write_count();
  ASSERT_TRUE(
      PublishManifest(rewriting, SourceOf(*m, &runs), stream, nullptr).ok());
  writes = rewriting.write_count() - writes;
  ASSERT_GE(writes, 4);
  const std::string published = ReadObject(*base, key).value();
  EXPECT_EQ(published, EncodeManifest(*m));
  ASSERT_TRUE(base->Delete(key).ok());
  // A failed rewrite publishes nothing.
  rewriting.FailNthWrite(writes - 1);
  EXPECT_THAT(PublishManifest(rewriting, SourceOf(*m, &runs), stream, nullptr),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("injected write failure")));
  EXPECT_THAT(base->Size(key).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("MANIFEST")));
  // A rewrite that silently writes half the header is caught by the reader.
  rewriting.Reset();
  rewriting.AddRule({.ops = kFaultAppend,
                     .key_contains = "MANIFEST",
                     .skip = writes - 2,
                     .count = 1,
                     .action = FaultAction::kSilentShortWrite});
  ASSERT_TRUE(
      PublishManifest(rewriting, SourceOf(*m, &runs), stream, nullptr).ok());
  const std::string torn = ReadObject(*base, key).value();
  EXPECT_EQ(torn.size(), published.size());
  EXPECT_NE(torn, published);
  EXPECT_EQ(torn.substr(kManifestHeaderBytes),
            published.substr(kManifestHeaderBytes));
  EXPECT_THAT(ReadManifest(*base, "job", 1).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("MANIFEST")));
  ASSERT_TRUE(base->Delete(key).ok());
  // A MANIFEST writer that does not open: the store's error, named.
  rewriting.Reset();
  rewriting.AddRule({.ops = kFaultNewWriter, .key_contains = "MANIFEST"});
  EXPECT_THAT(
      PublishManifest(rewriting, SourceOf(*m, &runs), stream, nullptr),
      StatusIs(absl::StatusCode::kUnavailable,
               HasSubstr("publishing the manifest of job 'job' step 1")));
  EXPECT_THAT(base->Size(key).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("MANIFEST")));

  // An invalid manifest is refused by the first run, and nothing is visible;
  // where the body is not written as that run makes it, before any write.
  v1::Manifest bad = *m;
  bad.set_total_bytes(1);
  for (FaultInjectionStore* store :
       {&rewriting, static_cast<FaultInjectionStore*>(&append_only)}) {
    store->Reset();
    if (!store->CanRewritePrefix()) {
      store->AddRule(
          {.ops = kFaultAnyWrite, .key_contains = "MANIFEST", .count = -1});
    }
    runs = 0;
    const absl::Status refused =
        PublishManifest(*store, SourceOf(bad, &runs), stream, nullptr);
    EXPECT_THAT(refused,
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("total_bytes"),
                               HasSubstr("manifest of job 'job' step 1"))));
    EXPECT_EQ(runs, 1);
    EXPECT_THAT(base->Size(key).status(),
                StatusIs(absl::StatusCode::kNotFound, HasSubstr("MANIFEST")));
  }
  // Then a good one goes through.
  rewriting.Reset();
  ASSERT_TRUE(
      PublishManifest(rewriting, SourceOf(*m, &runs), stream, nullptr).ok());
  EXPECT_EQ(ReadObject(*base, key).value(), EncodeManifest(*m));
}

TEST_P(CheckpointLayoutTest, CorruptOrMisplacedManifestIsDataLoss) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
  const std::string key = ManifestKey("job", 1);
  std::string bytes = ReadObject(*store, key).value();
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(
      store->Put(key, absl::Span<const char>(bytes.data(), bytes.size())).ok());
  EXPECT_THAT(ReadManifest(*store, "job", 1).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("job/0000000000000001/MANIFEST")));
  // A valid manifest of step 1 copied under step 2.
  spec.step = 2;
  ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
  spec.step = 1;
  ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
  const std::string one = ReadObject(*store, ManifestKey("job", 1)).value();
  ASSERT_TRUE(store
                  ->Put(ManifestKey("job", 2),
                        absl::Span<const char>(one.data(), one.size()))
                  .ok());
  EXPECT_THAT(ReadManifest(*store, "job", 2).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("describes job 'job' step 1")));
}

// ReadManifestByTensor gives what ReadManifest does, or its error, for a
// good manifest and for each way a stored one can be wrong.
TEST_P(CheckpointLayoutTest, ReadByTensorMatchesReadManifest) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  spec.num_tensors = 5;
  ASSERT_TRUE(WriteTestCheckpoint(*store, spec).ok());
  auto same = [&](int64_t step, const std::string& what) {
    absl::StatusOr<v1::Manifest> whole = ReadManifest(*store, "job", step);
    std::vector<v1::ManifestTensor> tensors;
    absl::StatusOr<ManifestSummary> by_tensor = ReadManifestByTensor(
        *store, "job", step, [&](const TensorOfManifest& t) {
          // Each chunk's object, by index into the
          // header's complete object list.
          EXPECT_EQ(t.chunk_objects.size(), t.tensor.chunks_size());
          for (int c = 0; c < t.tensor.chunks_size() &&
                          c < static_cast<int>(t.chunk_objects.size());
               ++c) {
            const int o = static_cast<int>(t.chunk_objects[c]);
            EXPECT_LT(o, t.header.objects_size());
            if (o >= t.header.objects_size()) continue;
            EXPECT_EQ(t.header.objects(o),
                      t.tensor.chunks(c).location().object_key());
          }
          tensors.push_back(t.tensor);
          return absl::OkStatus();
        });
    absl::StatusOr<ManifestSummary> summary =
        ReadManifestSummary(*store, "job", step);
    ASSERT_EQ(whole.status(), by_tensor.status()) << what;
    ASSERT_EQ(whole.status(), summary.status()) << what;
    if (!whole.ok()) return;
    v1::Manifest header = *whole;
    header.clear_tensors();
    EXPECT_EQ(by_tensor->header.SerializeAsString(),
              header.SerializeAsString());
    EXPECT_EQ(summary->header.SerializeAsString(), header.SerializeAsString());
    EXPECT_EQ(by_tensor->num_tensors, whole->tensors_size());
    EXPECT_EQ(summary->num_tensors, whole->tensors_size());
    ASSERT_EQ(static_cast<int>(tensors.size()), whole->tensors_size());
    for (int i = 0; i < whole->tensors_size(); ++i) {
      EXPECT_EQ(tensors[i].SerializeAsString(),
                whole->tensors(i).SerializeAsString());
    }
  };
  same(1, "good");
  same(9, "absent");
  const std::string good = ReadObject(*store, ManifestKey("job", 1)).value();
  auto put = [&](int64_t step, const std::string& bytes) {
    ASSERT_TRUE(store
                    ->Put(ManifestKey("job", step),
                          absl::Span<const char>(bytes.data(), bytes.size()))
                    .ok());
  };
  put(2, good);  // step 1's manifest under step 2
  same(2, "misplaced");
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x10;
  put(3, flipped);
  same(3, "corrupt");
  // Decodable but invalid, in the header, a tensor or the whole.
  v1::Manifest m = DecodeManifest(good).value();
  m.set_step(4);
  m.set_world_size(0);
  put(4, EncodeManifest(m));
  same(4, "bad header");
  m = DecodeManifest(good).value();
  m.set_step(5);
  m.mutable_tensors(3)->mutable_chunks(0)->mutable_location()->set_length(1);
  put(5, EncodeManifest(m));
  same(5, "bad tensor");
  m = DecodeManifest(good).value();
  m.set_step(6);
  m.set_total_bytes(m.total_bytes() + 1);
  put(6, EncodeManifest(m));
  same(6, "bad total");
  m = DecodeManifest(good).value();
  m.set_step(7);
  m.clear_tensors();
  m.set_total_bytes(0);
  m.clear_bytes_entries();
  m.clear_layouts();
  put(7, EncodeManifest(m));
  same(7, "no tensors");
  EXPECT_THAT(ReadManifestSummary(*store, "job", 4).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("world_size 0")));
  // A caller's error stops the read and comes back as it was.
  int calls = 0;
  EXPECT_THAT(ReadManifestByTensor(*store, "job", 1,
                                   [&](const TensorOfManifest&) {
                                     return ++calls == 2
                                                ? absl::AbortedError("stop")
                                                : absl::OkStatus();
                                   })
                  .status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("stop")));
  EXPECT_EQ(calls, 2);
}

TEST_P(CheckpointLayoutTest, VerifyDetectsCorruptionAndReportsProgress) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  spec.rows = 1000;  // ~128 KiB per tensor
  auto m = WriteTestCheckpoint(*store, spec);
  ASSERT_TRUE(m.ok());
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  ASSERT_TRUE(VerifyCheckpoint(*store, *m, [&](uint64_t done, uint64_t total) {
                calls.emplace_back(done, total);
              }).ok());
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().first, m->total_bytes());
  EXPECT_EQ(calls.back().second, m->total_bytes());
  for (size_t i = 1; i < calls.size(); ++i) {
    EXPECT_GE(calls[i].first, calls[i - 1].first);
  }
  // Flip one byte inside tensor 1's chunk on rank 1.
  const v1::StoredChunk& c = m->tensors(1).chunks(1);
  const std::string key = ObjectKey("job", 1, c.location().object_key());
  std::string bytes = ReadObject(*store, key).value();
  bytes[c.location().offset() + 17] ^= 0x01;
  ASSERT_TRUE(
      store->Put(key, absl::Span<const char>(bytes.data(), bytes.size())).ok());
  const absl::Status s = VerifyCheckpoint(*store, *m);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss,
                          AllOf(HasSubstr("job 'job' step 1"),
                                HasSubstr("tensor 'model.layers.1.weight'"),
                                HasSubstr("chunk [500:1000, 0:32]"),
                                HasSubstr("job/0000000000000001/rank-1.data"),
                                HasSubstr("checksum mismatch"))));
  // ReadVerified catches it as well; the intact chunk reads fine.
  std::string out(c.location().length(), '\0');
  EXPECT_THAT(ReadVerified(*store, "job", 1, c.location(), c.crc32c(),
                           "tensor 'model.layers.1.weight' chunk",
                           absl::Span<char>(out.data(), out.size())),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("model.layers.1.weight")));
  const v1::StoredChunk& good = m->tensors(0).chunks(0);
  out.assign(good.location().length(), '\0');
  ASSERT_TRUE(ReadVerified(*store, "job", 1, good.location(), good.crc32c(),
                           "chunk", absl::Span<char>(out.data(), out.size()))
                  .ok());
  EXPECT_EQ(out, TestChunkBytes(spec, 0, 0, 500));
  // A missing object is data loss too.
  ASSERT_TRUE(store->Delete(key).ok());
  EXPECT_THAT(VerifyCheckpoint(*store, *m),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-1.data")));
}

TEST_P(CheckpointLayoutTest, ReadVerifiedPiecesStreamsAndChecksTheWhole) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  spec.rows = 1000;
  auto m = WriteTestCheckpoint(*store, spec);
  ASSERT_TRUE(m.ok());
  const v1::StoredChunk& c = m->tensors(1).chunks(1);
  // A buffer that does not divide the length: the last piece is short.
  std::string buffer(4000, '\0');
  std::string got;
  std::vector<uint64_t> offsets;
  auto collect = [&](uint64_t offset, absl::Span<const char> piece) {
    offsets.push_back(offset);
    EXPECT_EQ(offset, got.size());
    got.append(piece.data(), piece.size());
    return absl::OkStatus();
  };
  ASSERT_TRUE(ReadVerifiedPieces(
                  *store, "job", 1, c.location(), c.crc32c(), "chunk",
                  absl::Span<char>(buffer.data(), buffer.size()), collect)
                  .ok());
  EXPECT_EQ(got, TestChunkBytes(spec, 1, 500, 1000));
  EXPECT_EQ(offsets.size(), (c.location().length() + 3999) / 4000);
  // A wrong crc32c is DATA_LOSS naming what and where, after every piece.
  got.clear();
  EXPECT_THAT(
      ReadVerifiedPieces(*store, "job", 1, c.location(), c.crc32c() ^ 1,
                         "tensor 'model.layers.1.weight' chunk [500:1000]",
                         absl::Span<char>(buffer.data(), buffer.size()),
                         collect),
      StatusIs(absl::StatusCode::kDataLoss,
               HasSubstr("tensor 'model.layers.1.weight' chunk [500:1000]")));
  EXPECT_EQ(got.size(), c.location().length());
  // The caller's error stops the read as it is.
  int calls = 0;
  EXPECT_THAT(
      ReadVerifiedPieces(*store, "job", 1, c.location(), c.crc32c(), "chunk",
                         absl::Span<char>(buffer.data(), buffer.size()),
                         [&](uint64_t, absl::Span<const char>) {
                           return ++calls == 2 ? absl::CancelledError("stop")
                                               : absl::OkStatus();
                         }),
      StatusIs(absl::StatusCode::kCancelled, HasSubstr("stop")));
  EXPECT_EQ(calls, 2);
  // A missing object is data loss; an empty buffer a caller's mistake.
  ASSERT_TRUE(
      store->Delete(ObjectKey("job", 1, c.location().object_key())).ok());
  EXPECT_THAT(ReadVerifiedPieces(
                  *store, "job", 1, c.location(), c.crc32c(), "chunk",
                  absl::Span<char>(buffer.data(), buffer.size()), collect),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-1.data")));
  EXPECT_THAT(ReadVerifiedPieces(*store, "job", 1, c.location(), c.crc32c(),
                                 "chunk", absl::Span<char>(), collect),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty read buffer")));
}

// ---- Fault injection: the commit protocol under crashes and I/O errors ----

// The invariant after any fault: the previous checkpoint (step 1) is
// committed and verifies; step 2 is either not committed or committed and
// fully verifiable -- never half-visible.
void ExpectConsistent(ShardStore& store, const v1::Manifest& previous,
                      bool step2_may_be_committed) {
  auto m1 = ReadManifest(store, "job", 1);
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ(m1->SerializeAsString(), previous.SerializeAsString());
  EXPECT_TRUE(VerifyCheckpoint(store, *m1).ok());
  auto steps = ListCommittedSteps(store, "job");
  ASSERT_TRUE(steps.ok());
  if (steps->size() == 2) {
    EXPECT_TRUE(step2_may_be_committed);
    auto m2 = ReadManifest(store, "job", 2);
    ASSERT_TRUE(m2.ok()) << m2.status();
    EXPECT_TRUE(VerifyCheckpoint(store, *m2).ok());
  } else {
    EXPECT_THAT(*steps, ElementsAre(1));
    EXPECT_THAT(ReadManifest(store, "job", 2),
                StatusIs(absl::StatusCode::kNotFound));
  }
}

TEST_P(CheckpointLayoutTest, CrashAtEveryStepOfASaveKeepsPreviousLoadable) {
  TestCheckpointSpec spec;
  spec.world_size = 3;
  // Count the mutating calls of one save (data appends and closes, then
  // the manifest put).
  int64_t mutations = 0;
  {
    auto base = NewStore();
    FaultInjectionStore store(base.get());
    spec.step = 2;
    ASSERT_TRUE(WriteTestCheckpoint(store, spec).ok());
    mutations = store.mutation_count();
  }
  ASSERT_GT(mutations, 10);
  int committed_after_crash = 0;
  for (int64_t n = 1; n <= mutations; ++n) {
    SCOPED_TRACE(absl::StrCat("crash at mutation ", n, " of ", mutations));
    auto base = NewStore();
    spec.step = 1;
    auto previous = WriteTestCheckpoint(*base, spec);
    ASSERT_TRUE(previous.ok());
    FaultInjectionStore store(base.get());
    store.CrashAtMutation(n);
    spec.step = 2;
    const auto result = WriteTestCheckpoint(store, spec);
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable,
                                 HasSubstr("simulated crash")));
    EXPECT_TRUE(store.crashed());
    // Everything after the crash fails: the process is gone.
    EXPECT_THAT(store.Size(ManifestKey("job", 1)),
                StatusIs(absl::StatusCode::kUnavailable));
    // "Restart": a new handle on the same storage.
    auto restarted = Reopen(*base);
    ExpectConsistent(*restarted, *previous, /*step2_may_be_committed=*/false);
    if (ListCommittedSteps(*restarted, "job")->size() == 2) {
      ++committed_after_crash;
    }
    // Garbage collection of the incomplete step works and leaves step 1.
    const std::vector<int64_t> incomplete =
        ListIncompleteSteps(*restarted, "job").value();
    for (int64_t step : incomplete) {
      ASSERT_TRUE(DeleteStep(*restarted, "job", step).ok());
    }
    EXPECT_THAT(restarted->List("job/0000000000000002/").value(), IsEmpty());
    ExpectConsistent(*restarted, *previous, false);
  }
  EXPECT_EQ(committed_after_crash, 0);
}

TEST_P(CheckpointLayoutTest, CrashAtEveryStepOfADeleteNeverLeavesBrokenCommit) {
  TestCheckpointSpec spec;
  int64_t mutations = 0;
  {
    auto base = NewStore();
    ASSERT_TRUE(WriteTestCheckpoint(*base, spec).ok());
    spec.step = 2;
    ASSERT_TRUE(WriteTestCheckpoint(*base, spec).ok());
    FaultInjectionStore store(base.get());
    ASSERT_TRUE(DeleteStep(store, "job", 2).ok());
    mutations = store.mutation_count();
  }
  ASSERT_EQ(mutations, 2);  // MANIFEST, then the data prefix
  for (int64_t n = 1; n <= mutations; ++n) {
    SCOPED_TRACE(absl::StrCat("crash at mutation ", n));
    auto base = NewStore();
    spec.step = 1;
    auto previous = WriteTestCheckpoint(*base, spec);
    spec.step = 2;
    ASSERT_TRUE(WriteTestCheckpoint(*base, spec).ok());
    FaultInjectionStore store(base.get());
    store.CrashAtMutation(n);
    EXPECT_THAT(DeleteStep(store, "job", 2),
                StatusIs(absl::StatusCode::kUnavailable));
    auto restarted = Reopen(*base);
    ExpectConsistent(*restarted, *previous, /*step2_may_be_committed=*/n == 1);
  }
}

TEST_P(CheckpointLayoutTest, FailingAnyWriteFailsTheSaveWithNothingCommitted) {
  TestCheckpointSpec spec;
  int64_t writes = 0;
  {
    auto base = NewStore();
    FaultInjectionStore store(base.get());
    ASSERT_TRUE(WriteTestCheckpoint(store, spec).ok());
    writes = store.write_count();
  }
  for (int64_t n = 1; n <= writes; ++n) {
    SCOPED_TRACE(absl::StrCat("failing write ", n, " of ", writes));
    auto base = NewStore();
    spec.step = 1;
    auto previous = WriteTestCheckpoint(*base, spec);
    FaultInjectionStore store(base.get());
    store.FailNthWrite(n, absl::UnavailableError("disk went away"));
    spec.step = 2;
    const absl::Status s = WriteTestCheckpoint(store, spec).status();
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                            HasSubstr("disk went away")));
    ExpectConsistent(store, *previous, false);
  }
}

TEST_P(CheckpointLayoutTest, NoSpaceFailsCleanlyWithNothingCommitted) {
  auto base = NewStore();
  TestCheckpointSpec spec;
  spec.rows = 512;
  auto previous = WriteTestCheckpoint(*base, spec);
  ASSERT_TRUE(previous.ok());
  FaultInjectionStore store(base.get());
  store.SetSpaceLimit(previous->total_bytes() / 2);
  spec.step = 2;
  const absl::Status s = WriteTestCheckpoint(store, spec).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("No space left on device"),
                                HasSubstr("job/0000000000000002/rank-"))));
  ExpectConsistent(store, *previous, false);
  // The object being written when space ran out is not visible.
  const std::vector<std::string> left =
      store.List("job/0000000000000002/").value();
  EXPECT_LT(left.size(), 2u);
  // Space freed: the same save now succeeds.
  store.Reset();
  ASSERT_TRUE(DeleteStep(store, "job", 2).ok());
  ASSERT_TRUE(WriteTestCheckpoint(store, spec).ok());
  ExpectConsistent(store, *previous, true);
}

TEST_P(CheckpointLayoutTest, ShortWritesNeverCommit) {
  TestCheckpointSpec spec;
  {
    // A device that fails mid-write: the save fails, nothing visible.
    auto base = NewStore();
    auto previous = WriteTestCheckpoint(*base, spec);
    FaultInjectionStore store(base.get());
    FaultRule rule;
    rule.ops = kFaultAppend;
    rule.key_contains = "rank-1.data";
    rule.skip = 2;
    rule.action = FaultAction::kShortWrite;
    rule.status = absl::ResourceExhaustedError("short write");
    const int id = store.AddRule(rule);
    spec.step = 2;
    EXPECT_THAT(WriteTestCheckpoint(store, spec).status(),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("short write")));
    EXPECT_EQ(store.fired(id), 1);
    ExpectConsistent(store, *previous, false);
    EXPECT_THAT(store.List("job/0000000000000002/rank-1").value(), IsEmpty());
  }
  {
    // A device that silently drops bytes: the commit's size check refuses.
    auto base = NewStore();
    spec.step = 1;
    auto previous = WriteTestCheckpoint(*base, spec);
    FaultInjectionStore store(base.get());
    FaultRule rule;
    rule.ops = kFaultAppend;
    rule.key_contains = "rank-0.data";
    rule.skip = 1;
    rule.action = FaultAction::kSilentShortWrite;
    store.AddRule(rule);
    spec.step = 2;
    EXPECT_THAT(WriteTestCheckpoint(store, spec).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("rank-0.data' has")));
    ExpectConsistent(store, *previous, false);
  }
}

TEST_P(CheckpointLayoutTest, CrashBeforeManifestRenameLeavesStepIncomplete) {
  auto base = NewStore();
  TestCheckpointSpec spec;
  auto previous = WriteTestCheckpoint(*base, spec);
  FaultInjectionStore store(base.get());
  FaultRule rule;
  rule.ops = kFaultPut;
  rule.key_contains = "MANIFEST";
  rule.action = FaultAction::kCrashBeforeRename;
  store.AddRule(rule);
  spec.step = 2;
  EXPECT_THAT(WriteTestCheckpoint(store, spec),
              StatusIs(absl::StatusCode::kUnavailable));
  auto restarted = Reopen(*base);
  ExpectConsistent(*restarted, *previous, false);
  EXPECT_THAT(ListIncompleteSteps(*restarted, "job").value(), ElementsAre(2));
}

TEST_P(CheckpointLayoutTest, DeleteUnreferencedKeepsOnlyWhatTheManifestNames) {
  auto store = NewStore();
  TestCheckpointSpec spec;
  auto manifest = WriteTestCheckpoint(*store, spec);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string step = StepPrefix("job", 1);
  // Another attempt's object, a writer of the committed step that died
  // mid-write (posix leaves its temp file), and a neighbouring step's object.
  ASSERT_TRUE(store->Put(step + "attempt-old/data-0", AsSpan("old")).ok());
  auto dead = store->NewWriter(step + manifest->objects(0) + ".retry");
  ASSERT_TRUE(dead.ok());
  ASSERT_TRUE((*dead)->Append(AsSpan(std::string(4096, 'd'))).ok());
  (*dead)->SimulateCrashForTest();
  ASSERT_TRUE(store->Put(StepPrefix("job", 2) + "data-0", AsSpan("2")).ok());

  auto removed = DeleteUnreferenced(*store, *manifest);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  std::vector<std::string> want = {ManifestKey("job", 1)};
  for (const std::string& o : manifest->objects()) want.push_back(step + o);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(store->List(step).value(), want);
  EXPECT_THAT(store->List(StepPrefix("job", 2)).value(),
              ElementsAre(StepPrefix("job", 2) + "data-0"));
  EXPECT_TRUE(VerifyCheckpoint(*store, *manifest).ok());
  if (GetParam() == "posix") {
    const std::string root = store->uri().substr(strlen("file://"));
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      EXPECT_FALSE(absl::StartsWith(e.path().filename().string(), ".cairn-tmp"))
          << e.path();
    }
  }
}

TEST_P(CheckpointLayoutTest, CorruptedReadsAreDetected) {
  auto base = NewStore();
  TestCheckpointSpec spec;
  auto m = WriteTestCheckpoint(*base, spec);
  ASSERT_TRUE(m.ok());
  FaultInjectionStore store(base.get());
  FaultRule data_rule;
  data_rule.ops = kFaultRead;
  data_rule.key_contains = "rank-1.data";
  data_rule.action = FaultAction::kCorruptRead;
  const int id = store.AddRule(data_rule);
  EXPECT_THAT(VerifyCheckpoint(store, *m),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank-1.data")));
  EXPECT_EQ(store.fired(id), 1);
  store.Reset();
  FaultRule manifest_rule;
  manifest_rule.ops = kFaultRead;
  manifest_rule.key_contains = "MANIFEST";
  manifest_rule.action = FaultAction::kCorruptRead;
  store.AddRule(manifest_rule);
  EXPECT_THAT(ReadManifest(store, "job", 1).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("MANIFEST")));
  // The bytes on storage are intact: the fault was in the read path.
  store.Reset();
  EXPECT_TRUE(
      VerifyCheckpoint(store, ReadManifest(store, "job", 1).value()).ok());
}

}  // namespace
}  // namespace cairn::storage
