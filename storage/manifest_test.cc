#include "storage/manifest.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/little_endian.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checksum.h"
#include "storage/memory/memory_shard_store.h"
#include "storage/testing/test_checkpoint.h"

namespace cairn::storage {
namespace {

using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::Manifest TestManifest(int world_size = 2, int tensors = 3) {
  auto store = OpenMemoryShardStore().value();
  TestCheckpointSpec spec;
  spec.job = "llama";
  spec.step = 42;
  spec.world_size = world_size;
  spec.num_tensors = tensors;
  return WriteTestCheckpointData(*store, spec).value();
}

// Rewrites the header crc after editing header fields (to reach the checks
// behind it).
void FixHeaderCrc(std::string& bytes) {
  little_endian::Store32(&bytes[28], Crc32c(bytes.data(), 28));
}

// `body` framed as format version 1, header and crcs valid: what decoding
// sees once it is past the framing checks.
std::string Frame(absl::string_view body) {
  return absl::StrCat(ManifestFrameHeader(1, body.size(), Crc32c(body)), body);
}

// The bytes of a manifest, written out by hand from the format at the top of
// manifest.h (crc32c computed apart from Cairn): job "llama", step 42.
constexpr char kSmallManifestBytes[] =
    "CAIRNMF\n"
    "\x01\x00\x00\x00"                  // format_version 1
    "\x00\x00\x00\x00"                  // flags
    "\x0b\x00\x00\x00\x00\x00\x00\x00"  // body_length 11
    "\xd6\xbe\x86\x9a"                  // crc32c(body)
    "\xf2\xb6\x14\x87"                  // crc32c(bytes [0, 28))
    "\x08\x01"                          // body: format_version 1
    "\x12\x05llama"                     // job
    "\x18\x2a";                         // step 42

TEST(ManifestTest, BytesOnDiskAreFixed) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job("llama");
  m.set_step(42);
  const std::string want(kSmallManifestBytes, sizeof(kSmallManifestBytes) - 1);
  EXPECT_EQ(absl::BytesToHexString(EncodeManifest(m)),
            absl::BytesToHexString(want));
  absl::StatusOr<v1::Manifest> decoded = DecodeManifest(want);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->format_version(), 1u);
  EXPECT_EQ(decoded->job(), "llama");
  EXPECT_EQ(decoded->step(), 42);
}

TEST(ManifestTest, FrameHeaderFieldsAreLittleEndian) {
  const std::string want(
      "CAIRNMF\n"
      "\x01\x00\x00\x00"                  // format_version 1
      "\x00\x00\x00\x00"                  // flags
      "\x08\x07\x06\x05\x04\x03\x02\x01"  // body_length
      "\x0d\x0c\x0b\x0a"                  // crc32c(body)
      "\xfc\x1c\x43\xa6",                 // crc32c(bytes [0, 28))
      kManifestHeaderBytes);
  EXPECT_EQ(absl::BytesToHexString(
                ManifestFrameHeader(1, 0x0102030405060708ull, 0x0a0b0c0du)),
            absl::BytesToHexString(want));
}

TEST(ManifestTest, EncodeDecodeRoundTrip) {
  const v1::Manifest m = TestManifest();
  ASSERT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
  const std::string bytes = EncodeManifest(m);
  EXPECT_EQ(bytes.substr(0, 8), "CAIRNMF\n");
  auto decoded = DecodeManifest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->SerializeAsString(), m.SerializeAsString());
}

TEST(ManifestTest, EncodeFillsMissingFormatVersion) {
  v1::Manifest m = TestManifest();
  m.clear_format_version();
  auto decoded = DecodeManifest(EncodeManifest(m));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->format_version(), kManifestFormatVersion);
}

TEST(ManifestTest, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodeManifest(TestManifest());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto d = DecodeManifest(absl::string_view(bytes).substr(0, n));
    ASSERT_THAT(d,
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")))
        << "length " << n;
  }
}

TEST(ManifestTest, EverySingleBitFlipIsDataLoss) {
  const std::string good = EncodeManifest(TestManifest(1, 1));
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    auto d = DecodeManifest(bad);
    ASSERT_THAT(d, StatusIs(absl::StatusCode::kDataLoss)) << "bit " << bit;
  }
}

TEST(ManifestTest, TrailingBytesAreDataLoss) {
  EXPECT_THAT(DecodeManifest(EncodeManifest(TestManifest()) + "x").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("trailing")));
}

TEST(ManifestTest, NewerFormatIsFailedPrecondition) {
  std::string bytes = EncodeManifest(TestManifest());
  bytes[8] = static_cast<char>(kManifestFormatVersion + 1);
  FixHeaderCrc(bytes);
  EXPECT_THAT(
      DecodeManifest(bytes).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("newer")));
}

TEST(ManifestTest, OversizeIsRejectedBeforeAllocation) {
  std::string bytes = EncodeManifest(TestManifest());
  // Declare a 1 TiB body: must fail on the header, not try to use it.
  little_endian::Store64(&bytes[16], uint64_t{1} << 40);
  FixHeaderCrc(bytes);
  EXPECT_THAT(
      DecodeManifest(bytes).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("exceeds the limit")));
  // A real manifest larger than the caller's limit.
  const std::string real = EncodeManifest(TestManifest());
  EXPECT_THAT(DecodeManifest(real, 10).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("limit of 10")));
}

TEST(ManifestTest, GarbageBodyWithValidFramingIsDataLoss) {
  const std::string body = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
  EXPECT_THAT(
      DecodeManifest(Frame(body)).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
}

TEST(ManifestTest, BodyVersionMustMatchHeader) {
  // The body's version set to 0 (absent), framed under header version 1.
  v1::Manifest m = TestManifest();
  m.set_format_version(0);
  EXPECT_THAT(
      DecodeManifest(Frame(m.SerializeAsString())).status(),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("format_version 0")));
}

TEST(ManifestTest, RandomGarbageNeverDecodes) {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 3000; ++i) {
    std::string s(rng() % 200, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    if (i % 2 == 0 && s.size() >= 8) std::memcpy(s.data(), kManifestMagic, 8);
    auto d = DecodeManifest(s);
    ASSERT_FALSE(d.ok());
    ASSERT_THAT(d, StatusIs(absl::StatusCode::kDataLoss));
  }
}

// ---- DecodeManifestByTensor ----

// DecodeManifestByTensor's header with its tensors put back, in order,
// reading through a window of `window` bytes.
absl::StatusOr<v1::Manifest> DecodeByTensor(
    absl::string_view bytes, size_t window = kManifestReadWindow) {
  v1::Manifest header;
  std::vector<v1::ManifestTensor> tensors;
  absl::StatusOr<int> n = DecodeManifestByTensor(
      bytes, 1ull << 30, &header,
      [&](v1::ManifestTensor& t) {
        tensors.push_back(std::move(t));
        return absl::OkStatus();
      },
      window);
  if (!n.ok()) return n.status();
  EXPECT_EQ(*n, static_cast<int>(tensors.size()));
  EXPECT_EQ(header.tensors_size(), 0);
  for (v1::ManifestTensor& t : tensors) *header.add_tensors() = std::move(t);
  return header;
}

// Both decoders agree: the same status code, and the same manifest; by
// tensor through windows of every size from 1 byte (a field head or a
// tensor split across reads) to the default.
void ExpectSameDecode(absl::string_view bytes, const std::string& what) {
  absl::StatusOr<v1::Manifest> whole = DecodeManifest(bytes);
  for (size_t window :
       {size_t{1}, size_t{3}, size_t{17}, size_t{100}, kManifestReadWindow}) {
    absl::StatusOr<v1::Manifest> by_tensor = DecodeByTensor(bytes, window);
    ASSERT_EQ(whole.status().code(), by_tensor.status().code())
        << what << ", window " << window << ": " << whole.status() << " vs "
        << by_tensor.status();
    if (whole.ok()) {
      ASSERT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
          *whole, *by_tensor))
          << what << ", window " << window;
    }
  }
}

TEST(DecodeManifestByTensorTest, HandsOverEachTensorInOrder) {
  const v1::Manifest m = TestManifest(4, 6);
  std::vector<std::string> fqns;
  v1::Manifest header;
  absl::StatusOr<int> n = DecodeManifestByTensor(
      EncodeManifest(m), 1ull << 30, &header, [&](v1::ManifestTensor& t) {
        fqns.push_back(t.entry().fqn());
        return absl::OkStatus();
      });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 6);
  ASSERT_EQ(fqns.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(fqns[i], m.tensors(i).entry().fqn());
  v1::Manifest without = m;
  without.clear_tensors();
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(header, without));
  ExpectSameDecode(EncodeManifest(m), "encoded");
}

TEST(DecodeManifestByTensorTest, StopsAtTheCallersError) {
  int calls = 0;
  v1::Manifest header;
  absl::StatusOr<int> n = DecodeManifestByTensor(
      EncodeManifest(TestManifest(2, 5)), 1ull << 30, &header,
      [&](v1::ManifestTensor&) {
        return ++calls == 2 ? absl::ResourceExhaustedError("full")
                            : absl::OkStatus();
      });
  EXPECT_THAT(n.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                   HasSubstr("full")));
  EXPECT_EQ(calls, 2);
}

// Read from storage: a read's error comes back as it is; a file that is
// cut short or changes between the two reads is DATA_LOSS, and what was
// handed over before (the caller drops it) is the only harm.
TEST(DecodeManifestByTensorTest, ReadErrorsAndChangesWhileRead) {
  const std::string bytes = EncodeManifest(TestManifest(3, 6));
  auto decode = [&](auto&& read) {
    v1::Manifest header;
    return DecodeManifestByTensor(
               bytes.size(), read, 1ull << 30, &header,
               [](v1::ManifestTensor&) { return absl::OkStatus(); }, 64)
        .status();
  };
  int reads = 0;
  size_t largest = 0;
  auto from = [&](const std::string& src, uint64_t offset,
                  absl::Span<char> out) -> absl::StatusOr<size_t> {
    ++reads;
    largest = std::max(largest, out.size());
    if (offset >= src.size()) return 0;
    const size_t n = std::min<size_t>(out.size(), src.size() - offset);
    std::memcpy(out.data(), src.data() + offset, n);
    return n;
  };
  EXPECT_TRUE(decode([&](uint64_t o, absl::Span<char> out) {
                return from(bytes, o, out);
              }).ok());
  // In windows (or a tensor, when larger), never the whole.
  EXPECT_LT(largest, bytes.size() / 3);
  EXPECT_GT(reads, 2);
  // An error of the third read.
  reads = 0;
  EXPECT_THAT(
      decode([&](uint64_t o, absl::Span<char> out) -> absl::StatusOr<size_t> {
        if (++reads == 3) return absl::UnavailableError("disk gone");
        return from(bytes, o, out);
      }),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
  // Cut short after the first pass began.
  const std::string cut = bytes.substr(0, bytes.size() - 10);
  EXPECT_THAT(
      decode(
          [&](uint64_t o, absl::Span<char> out) { return from(cut, o, out); }),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated while read")));
  // Another body (one byte changed) in the second pass than in the first:
  // the first pass checked the crc of the bytes as they were then.
  std::string changed = bytes;
  changed[bytes.size() - 1] ^= 1;
  bool second_pass = false;
  EXPECT_THAT(
      decode([&](uint64_t o, absl::Span<char> out) {
        if (o + out.size() >= bytes.size()) {
          // The last window: the first pass ends here.
          absl::StatusOr<size_t> n =
              from(second_pass ? changed : bytes, o, out);
          second_pass = true;
          return n;
        }
        return from(second_pass ? changed : bytes, o, out);
      }),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("changed while read")));
}

// Any wire order a protobuf parser accepts: fields out of order, tensors
// interleaved with the header's fields, a scalar given twice (the last wins),
// repeated fields split, unknown fields, the tensors' field number with
// another wire type (an unknown field to protobuf).
TEST(DecodeManifestByTensorTest, MatchesProtobufOnAnyFieldOrder) {
  const v1::Manifest m = TestManifest(3, 4);
  auto part = [&](auto&& fill) {
    v1::Manifest p;
    fill(p);
    return p.SerializeAsString();
  };
  std::string body;
  body += part([&](v1::Manifest& p) { *p.add_tensors() = m.tensors(2); });
  body += part([&](v1::Manifest& p) {
    p.set_job("other");
    p.set_step(m.step());
    p.add_objects(m.objects(0));
  });
  body += part([&](v1::Manifest& p) { *p.add_tensors() = m.tensors(0); });
  body += part([&](v1::Manifest& p) {
    p.set_format_version(1);
    p.set_job(m.job());
    for (int i = 1; i < m.objects_size(); ++i) p.add_objects(m.objects(i));
  });
  body += std::string("\xb8\x06\x07", 3);  // field 103, varint 7
  body += std::string("\x30\x05", 2);      // field 6 as a varint
  body += part([&](v1::Manifest& p) {
    *p.add_tensors() = m.tensors(3);
    *p.add_tensors() = m.tensors(1);
    p.set_world_size(m.world_size());
    p.set_total_bytes(m.total_bytes());
  });
  ExpectSameDecode(Frame(body), "interleaved");
  absl::StatusOr<v1::Manifest> d = DecodeByTensor(Frame(body));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->job(), m.job());
  ASSERT_EQ(d->tensors_size(), 4);
  EXPECT_EQ(d->tensors(0).entry().fqn(), m.tensors(2).entry().fqn());
  EXPECT_EQ(d->objects_size(), m.objects_size());
}

// Past the framing (re-framed so the crcs hold), every damaged body is
// decoded alike by both: each single-bit flip, each truncation, random bytes.
TEST(DecodeManifestByTensorTest, MatchesProtobufOnDamagedBodies) {
  const std::string body = TestManifest(2, 2).SerializeAsString();
  for (size_t bit = 0; bit < body.size() * 8; ++bit) {
    std::string bad = body;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    ExpectSameDecode(Frame(bad), absl::StrCat("bit ", bit));
  }
  for (size_t n = 0; n < body.size(); ++n) {
    ExpectSameDecode(Frame(body.substr(0, n)), absl::StrCat("length ", n));
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? 0x32 : rng());
    ExpectSameDecode(Frame(s), absl::StrCat("random body ", i));
  }
  // What the fuzzer found: groups (unknown fields, skipped whole, nested or
  // not, or broken), and a length varint of more than 32 bits (2^32 read as
  // 0 if truncated).
  const std::string groups[] = {
      std::string("\x0b\x08\x01\x13\x14\x0c", 6),
      std::string("\x0b\x14", 2),
      std::string("\x0b\x08\x01", 3),
      std::string("\x0c", 1),
      std::string("\x32\x80\x80\x80\x80\x10", 6),
  };
  for (const std::string& g : groups) {
    ExpectSameDecode(Frame(body + g), "appended " + absl::CEscape(g));
    ExpectSameDecode(Frame(g + body), "prepended " + absl::CEscape(g));
  }
  // Framing errors are DecodeManifest's.
  ExpectSameDecode(EncodeManifest(TestManifest()) + "x", "trailing");
  ExpectSameDecode("CAIRNMF", "short");
}

// ---- ValidateManifest ----

// ManifestEncoder over the whole of `m`: Start, every tensor, Finish; the
// body framed from its length and crc32c.
absl::StatusOr<std::string> EncodeByTensor(const v1::Manifest& m) {
  std::string body;
  ManifestEncoder encoder(
      m,
      [&](absl::string_view piece) {
        body.append(piece.data(), piece.size());
        return absl::OkStatus();
      },
      /*validate=*/true);
  CAIRN_RETURN_IF_ERROR(encoder.Start());
  for (const v1::ManifestTensor& t : m.tensors()) {
    CAIRN_RETURN_IF_ERROR(encoder.AddTensor(t));
  }
  CAIRN_RETURN_IF_ERROR(encoder.Finish());
  if (encoder.body_bytes() != body.size()) {
    return absl::InternalError("body_bytes is not the bytes streamed");
  }
  return ManifestFrameHeader(m.format_version(), encoder.body_bytes(),
                             encoder.body_crc32c()) +
         body;
}

struct Corruption {
  const char* name;
  std::function<void(v1::Manifest&)> apply;
  const char* message;
};

// chunk_objects() is each chunk's object whether or not the objects come in
// the previous tensor's order (the validator tries that order first).
TEST(ValidateManifestTest, ChunkObjectsNameEachChunksObjectInAnyOrder) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    v1::Manifest m = TestManifest(/*world_size=*/4, /*tensors=*/6);
    for (v1::ManifestTensor& t : *m.mutable_tensors()) {
      std::vector<std::string> keys;
      for (const v1::StoredChunk& c : t.chunks()) {
        keys.push_back(c.location().object_key());
      }
      if (trial % 2 == 1) std::shuffle(keys.begin(), keys.end(), rng);
      for (int c = 0; c < t.chunks_size(); ++c) {
        t.mutable_chunks(c)->mutable_location()->set_object_key(keys[c]);
      }
    }
    ManifestValidator validator(m);
    ASSERT_TRUE(validator.Start().ok());
    for (const v1::ManifestTensor& t : m.tensors()) {
      ASSERT_TRUE(validator.AddTensor(t).ok());
      ASSERT_EQ(validator.chunk_objects().size(),
                static_cast<size_t>(t.chunks_size()));
      for (int c = 0; c < t.chunks_size(); ++c) {
        const uint32_t o = validator.chunk_objects()[c];
        ASSERT_LT(o, static_cast<uint32_t>(m.objects_size()));
        EXPECT_EQ(m.objects(o), t.chunks(c).location().object_key());
      }
    }
    // A key that is no object is refused, where the previous tensor's
    // chunk at the same place named a listed one.
    v1::ManifestTensor stray = m.tensors(m.tensors_size() - 1);
    stray.mutable_entry()->set_fqn("zz.after.every.tensor");
    stray.mutable_chunks(1)->mutable_location()->set_object_key(m.objects(0) +
                                                                "x");
    absl::Status s = validator.AddTensor(stray);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr("is not in the manifest's object list")));
  }
}

TEST(ValidateManifestTest, RejectsEachKindOfInconsistency) {
  const std::vector<Corruption> cases = {
      {"version", [](v1::Manifest& m) { m.set_format_version(2); },
       "format_version 2"},
      {"job", [](v1::Manifest& m) { m.set_job("bad/job"); }, "bad/job"},
      {"step", [](v1::Manifest& m) { m.set_step(-1); }, "step -1"},
      {"world", [](v1::Manifest& m) { m.set_world_size(0); }, "world_size 0"},
      {"unsorted",
       [](v1::Manifest& m) { m.mutable_tensors()->SwapElements(0, 1); },
       "not sorted"},
      {"duplicate",
       [](v1::Manifest& m) {
         m.mutable_tensors(1)->mutable_entry()->set_fqn(
             m.tensors(0).entry().fqn());
       },
       "not sorted"},
      {"bytes_dup",
       [](v1::Manifest& m) {
         m.mutable_bytes_entries(0)->set_fqn(m.tensors(0).entry().fqn());
       },
       "appears twice"},
      {"dtype",
       [](v1::Manifest& m) {
         m.mutable_tensors(0)->mutable_entry()->set_dtype(
             v1::DTYPE_UNSPECIFIED);
       },
       "dtype unspecified"},
      {"outside",
       [](v1::Manifest& m) {
         m.mutable_tensors(1)->mutable_chunks(1)->mutable_box()->set_offsets(1,
                                                                             1);
       },
       "tensor 'model.layers.1.weight' chunk [32:64, 1:33] exceeds shape "
       "[64, 32]"},
      {"rank",
       [](v1::Manifest& m) {
         m.mutable_tensors(0)->mutable_chunks(0)->mutable_box()->add_sizes(1);
       },
       "offsets and"},
      {"overlap",
       [](v1::Manifest& m) {
         // Chunk 1 starts at row 31 instead of 32 and is one row shorter:
         // same total volume, overlapping chunk 0.
         auto* box = m.mutable_tensors(2)->mutable_chunks(1)->mutable_box();
         box->set_offsets(0, 31);
         auto* box0 = m.mutable_tensors(2)->mutable_chunks(0)->mutable_box();
         box0->set_sizes(0, 33);
         box->set_sizes(0, 31);
         m.mutable_tensors(2)
             ->mutable_chunks(0)
             ->mutable_location()
             ->set_length(33 * 32 * 4);
         m.mutable_tensors(2)
             ->mutable_chunks(1)
             ->mutable_location()
             ->set_length(31 * 32 * 4);
       },
       "overlap"},
      {"gap",
       [](v1::Manifest& m) {
         auto* c = m.mutable_tensors(0)->mutable_chunks(1);
         c->mutable_box()->set_sizes(0, 31);
         c->mutable_location()->set_length(31 * 32 * 4);
       },
       "cover 2016 elements of 2048"},
      {"length",
       [](v1::Manifest& m) {
         m.mutable_tensors(0)
             ->mutable_chunks(0)
             ->mutable_location()
             ->set_length(7);
       },
       "has length 7 bytes, expected 1024 elements x 4 bytes"},
      {"object",
       [](v1::Manifest& m) {
         m.mutable_tensors(0)
             ->mutable_chunks(0)
             ->mutable_location()
             ->set_object_key("other.data");
       },
       "'other.data' is not in the manifest's object list"},
      {"offset",
       [](v1::Manifest& m) {
         // Beyond any file (off_t), though offset + length fits in 64 bits.
         m.mutable_tensors(0)
             ->mutable_chunks(0)
             ->mutable_location()
             ->set_offset(uint64_t{1} << 63);
       },
       "location offset 9223372036854775808 + length 4096 exceeds 2^63 - 1"},
      {"escape", [](v1::Manifest& m) { m.set_objects(0, "../../etc/passwd"); },
       "../../etc/passwd"},
      {"writer",
       [](v1::Manifest& m) {
         m.mutable_tensors(0)->mutable_chunks(0)->set_writer_rank(5);
       },
       "writer_rank 5"},
      {"total", [](v1::Manifest& m) { m.set_total_bytes(1); }, "total_bytes 1"},
      {"dims",
       [](v1::Manifest& m) {
         for (int i = 0; i < 8; ++i) {
           m.mutable_tensors(0)->mutable_entry()->add_global_shape(1);
         }
       },
       "10 dims"},
      {"fqn", [](v1::Manifest& m) { m.mutable_bytes_entries(0)->set_fqn(""); },
       "invalid bytes entry fqn"},
      {"layout", [](v1::Manifest& m) { m.add_layouts()->set_fqn("nope"); },
       "layout for unknown tensor 'nope'"},
  };
  for (const Corruption& c : cases) {
    SCOPED_TRACE(c.name);
    v1::Manifest m = TestManifest();
    c.apply(m);
    const absl::Status s = ValidateManifest(m);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                            AllOf(HasSubstr(c.message), HasSubstr("job '"))));
    // Encoding tensor by tensor stops at the same error.
    EXPECT_EQ(EncodeByTensor(m).status(), s);
  }
}

// A streaming encoder's pieces, framed from its length and crc32c, are
// EncodeManifest's bytes; pieces are ~kManifestPieceBytes but the last.
TEST(ManifestEncoderTest, StreamsEncodeManifestsBytesInPieces) {
  // 2 x 3 tensors fits one piece; 64 x 3000 (192k chunks) takes several.
  for (auto [world, tensors] : {std::pair{2, 3}, std::pair{64, 3000}}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks x ", tensors, " tensors"));
    const v1::Manifest m = TestManifest(world, tensors);
    std::vector<std::string> pieces;
    ManifestEncoder encoder(
        m,
        [&](absl::string_view piece) {
          pieces.emplace_back(piece);
          return absl::OkStatus();
        },
        /*validate=*/true);
    ASSERT_TRUE(encoder.Start().ok());
    for (const v1::ManifestTensor& t : m.tensors()) {
      ASSERT_TRUE(encoder.AddTensor(t).ok());
    }
    const absl::Status finished = encoder.Finish();
    ASSERT_TRUE(finished.ok()) << finished;
    const std::string body = absl::StrJoin(pieces, "");
    EXPECT_EQ(encoder.body_bytes(), body.size());
    EXPECT_EQ(ManifestFrameHeader(m.format_version(), encoder.body_bytes(),
                                  encoder.body_crc32c()) +
                  body,
              EncodeManifest(m));
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
      EXPECT_GE(pieces[i].size(), kManifestPieceBytes);
      EXPECT_LT(pieces[i].size(), kManifestPieceBytes + (1 << 20));
    }
    if (tensors > 1000) {
      EXPECT_GT(pieces.size(), 1u);
    }
  }
}

// The sink's error stops the encoding; without validation a bad manifest
// streams (the second encoding of one already checked).
TEST(ManifestEncoderTest, StreamingStopsAtTheSinksErrorAndMayNotCheck) {
  const v1::Manifest m = TestManifest(64, 3000);
  int calls = 0;
  ManifestEncoder failing(
      m,
      [&](absl::string_view) {
        ++calls;
        return absl::UnavailableError("disk gone");
      },
      /*validate=*/true);
  ASSERT_TRUE(failing.Start().ok());
  absl::Status s;
  for (const v1::ManifestTensor& t : m.tensors()) {
    s = failing.AddTensor(t);
    if (!s.ok()) break;
  }
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("disk gone")));
  EXPECT_EQ(calls, 1);

  v1::Manifest bad = TestManifest();
  bad.set_total_bytes(1);
  for (bool validate : {true, false}) {
    ManifestEncoder encoder(
        bad, [](absl::string_view) { return absl::OkStatus(); }, validate);
    absl::Status st = encoder.Start();
    for (const v1::ManifestTensor& t : bad.tensors()) {
      if (st.ok()) st = encoder.AddTensor(t);
    }
    if (st.ok()) st = encoder.Finish();
    EXPECT_EQ(st.ok(), !validate) << st;
  }
}

TEST(ManifestEncoderTest, GivesEncodeManifestsBytes) {
  for (int tensors : {0, 1, 4}) {
    v1::Manifest m = TestManifest(3, tensors);
    if (tensors == 0) {
      m.clear_layouts();
      m.clear_bytes_entries();
      m.set_total_bytes(0);
    }
    ASSERT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
    absl::StatusOr<std::string> bytes = EncodeByTensor(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, EncodeManifest(m)) << tensors << " tensors";
    ManifestEncoder encoder(
        m, [](absl::string_view) { return absl::OkStatus(); },
        /*validate=*/true);
    ASSERT_TRUE(encoder.Start().ok());
    for (const v1::ManifestTensor& t : m.tensors()) {
      ASSERT_TRUE(encoder.AddTensor(t).ok());
    }
    ASSERT_TRUE(encoder.Finish().ok());
    std::vector<uint64_t> ends;
    ASSERT_TRUE(ValidateManifest(m, &ends).ok());
    EXPECT_EQ(encoder.object_ends(), ends);
    EXPECT_EQ(encoder.num_tensors(), tensors);
  }
}

// Brute force: count how often each element is covered.
bool TilesExactly(
    const std::vector<int64_t>& shape,
    const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>&
        boxes) {
  int64_t volume = 1;
  for (int64_t s : shape) volume *= s;
  std::vector<int> count(volume, 0);
  for (const auto& [off, size] : boxes) {
    std::vector<int64_t> idx(shape.size(), 0);
    int64_t box_volume = 1;
    for (int64_t s : size) box_volume *= s;
    for (int64_t e = 0; e < box_volume; ++e) {
      int64_t rem = e;
      int64_t flat = 0;
      for (size_t d = 0; d < shape.size(); ++d) {
        int64_t stride = 1;
        for (size_t k = d + 1; k < shape.size(); ++k) stride *= size[k];
        const int64_t i = rem / stride;
        rem %= stride;
        flat = flat * shape[d] + off[d] + i;
      }
      ++count[flat];
    }
  }
  for (int c : count) {
    if (c != 1) return false;
  }
  return true;
}

// Random grids, perturbed or not, several tensors a manifest; a tensor often
// repeats an earlier one's tiling (as the layers of a model do, which the
// validator checks once), perturbed or not. Oracle: every tensor's boxes tile
// its shape exactly (TilesExactly, cell by cell).
TEST(ValidateManifestTest, TilingCheckMatchesBruteForceOracle) {
  using Boxes =
      std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>;
  std::mt19937_64 rng(2024);
  auto grid = [&rng](const std::vector<int64_t>& shape) {
    const int rank = static_cast<int>(shape.size());
    // Split each dim at random cut points.
    std::vector<std::vector<int64_t>> cuts(rank);
    for (int d = 0; d < rank; ++d) {
      cuts[d] = {0, shape[d]};
      for (int k = 0; k < 2; ++k) cuts[d].push_back(rng() % (shape[d] + 1));
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    Boxes boxes;
    std::vector<size_t> pos(rank, 0);
    while (true) {
      std::vector<int64_t> off(rank);
      std::vector<int64_t> size(rank);
      for (int d = 0; d < rank; ++d) {
        off[d] = cuts[d][pos[d]];
        size[d] = cuts[d][pos[d] + 1] - off[d];
      }
      boxes.emplace_back(off, size);
      int d = rank - 1;
      while (d >= 0 && ++pos[d] + 1 >= cuts[d].size()) pos[d--] = 0;
      if (d < 0) break;
    }
    return boxes;
  };
  // Move, grow, shrink, drop or duplicate a box (or nothing).
  auto perturb = [&rng](const std::vector<int64_t>& shape, Boxes* boxes) {
    const int rank = static_cast<int>(shape.size());
    const int action = static_cast<int>(rng() % 6);
    auto& victim = (*boxes)[rng() % boxes->size()];
    const int d = static_cast<int>(rng() % rank);
    if (action == 0 && victim.first[d] > 0) {
      --victim.first[d];
    } else if (action == 1 && victim.first[d] + victim.second[d] < shape[d]) {
      ++victim.second[d];
    } else if (action == 2 && victim.second[d] > 1) {
      --victim.second[d];
    } else if (action == 3 && boxes->size() > 1) {
      boxes->pop_back();
    } else if (action == 4) {
      boxes->push_back(boxes->front());
    }
  };
  int valid = 0;
  int invalid = 0;
  int repeats = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    v1::Manifest m;
    m.set_format_version(1);
    m.set_job("j");
    m.set_step(0);
    m.set_world_size(1);
    m.add_objects("o");
    // Unperturbed grids of this manifest's tensors so far.
    std::vector<std::pair<std::vector<int64_t>, Boxes>> grids;
    bool oracle = true;
    uint64_t offset = 0;
    const int num_tensors = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < num_tensors; ++k) {
      std::vector<int64_t> shape;
      Boxes boxes;
      if (k > 0 && rng() % 2 == 0) {
        std::tie(shape, boxes) = grids[rng() % grids.size()];
        ++repeats;
      } else {
        shape.resize(1 + rng() % 3);
        for (auto& s : shape) s = 1 + static_cast<int64_t>(rng() % 7);
        boxes = grid(shape);
      }
      grids.emplace_back(shape, boxes);
      if (rng() % 3 == 0) perturb(shape, &boxes);
      oracle = oracle && TilesExactly(shape, boxes);
      v1::ManifestTensor* t = m.add_tensors();
      t->mutable_entry()->set_fqn("t" + std::to_string(k));
      t->mutable_entry()->set_dtype(v1::DTYPE_INT8);
      for (int64_t s : shape) t->mutable_entry()->add_global_shape(s);
      for (const auto& [off, size] : boxes) {
        v1::StoredChunk* c = t->add_chunks();
        int64_t vol = 1;
        for (size_t d = 0; d < shape.size(); ++d) {
          c->mutable_box()->add_offsets(off[d]);
          c->mutable_box()->add_sizes(size[d]);
          vol *= size[d];
        }
        c->mutable_location()->set_object_key("o");
        c->mutable_location()->set_offset(offset);
        c->mutable_location()->set_length(vol);
        offset += vol;
      }
    }
    m.set_total_bytes(offset);
    const absl::Status s = ValidateManifest(m);
    ASSERT_EQ(s.ok(), oracle) << "iteration " << iter << ": " << s;
    (oracle ? valid : invalid)++;
  }
  // Both outcomes were exercised, and tilings met again.
  EXPECT_GT(valid, 200);
  EXPECT_GT(invalid, 200);
  EXPECT_GT(repeats, 500);
}

TEST(ManifestTest, JsonView) {
  const v1::Manifest m = TestManifest();
  const auto j = nlohmann::json::parse(ManifestToJson(m));
  EXPECT_EQ(j["job"], "llama");
  EXPECT_EQ(j["step"], 42);
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_EQ(j["total_bytes"], m.total_bytes());
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][0]["fqn"], "model.layers.0.weight");
  EXPECT_EQ(j["tensors"][0]["dtype"], "float32");
  EXPECT_EQ(j["tensors"][0]["global_shape"], nlohmann::json({64, 32}));
  const auto& chunk = j["tensors"][0]["chunks"][1];
  EXPECT_EQ(chunk["offsets"], nlohmann::json({32, 0}));
  EXPECT_EQ(chunk["location"]["object_key"], "rank-1.data");
  char crc[11];
  std::snprintf(crc, sizeof(crc), "0x%08x", m.tensors(0).chunks(1).crc32c());
  EXPECT_EQ(chunk["crc32c"], crc);
  EXPECT_EQ(j["bytes_entries"][0]["fqn"], "rng_state");
  const auto brief = nlohmann::json::parse(ManifestToJson(m, false));
  EXPECT_FALSE(brief["tensors"][0].contains("chunks"));
  EXPECT_EQ(brief["tensors"][0]["num_chunks"], 2);
}

TEST(ManifestTest, BoxToStringAndDTypes) {
  v1::ChunkBox box;
  box.add_offsets(0);
  box.add_sizes(4096);
  box.add_offsets(512);
  box.add_sizes(512);
  EXPECT_EQ(BoxToString(box), "[0:4096, 512:1024]");
  EXPECT_EQ(BoxToString(v1::ChunkBox()), "[]");
  EXPECT_EQ(DTypeSize(v1::DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT8_E4M3), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_INT64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeName(static_cast<v1::DType>(99)), "unknown(99)");
}

}  // namespace
}  // namespace cairn::storage
