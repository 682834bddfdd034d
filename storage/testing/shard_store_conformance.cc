// The ShardStore conformance tests. Every expectation here is what callers
// of any backend may rely on; see shard_store_conformance.h.
#include "storage/testing/shard_store_conformance.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"

namespace cairn::storage {
namespace internal {
const int kShardStoreConformanceTestsLinked = 1;
}  // namespace internal

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ShardStoreConformanceTest);

void ShardStoreConformanceTest::SetUp() {
  auto store = GetParam().open();
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = std::move(store).value();
}

namespace {

using ::cairn::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

absl::Span<const char> AsSpan(const std::string& s) {
  return absl::Span<const char>(s.data(), s.size());
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rng());
  return s;
}

absl::StatusOr<std::string> ReadRange(ShardStore& store, absl::string_view key,
                                      uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  absl::StatusOr<size_t> n = store.Read(key, ByteRange{offset, length},
                                        absl::Span<char>(out.data(), length));
  if (!n.ok()) return n.status();
  if (*n != length) {
    return absl::InternalError(absl::StrCat("Read returned ", *n, " bytes"));
  }
  return out;
}

TEST_P(ShardStoreConformanceTest, PutThenReadWholeAndRanges) {
  std::mt19937_64 rng(1);
  const std::string data = RandomBytes(rng, 100000);
  ASSERT_TRUE(store().Put("a/b/obj", AsSpan(data)).ok());
  EXPECT_EQ(store().Size("a/b/obj").value(), data.size());
  EXPECT_EQ(ReadObject(store(), "a/b/obj").value(), data);
  EXPECT_EQ(ReadRange(store(), "a/b/obj", 123, 4567).value(),
            data.substr(123, 4567));
  EXPECT_EQ(ReadRange(store(), "a/b/obj", data.size() - 1, 1).value(),
            data.substr(data.size() - 1));
  EXPECT_EQ(ReadRange(store(), "a/b/obj", data.size(), 0).value(), "");
}

TEST_P(ShardStoreConformanceTest, ReadLargerBufferReturnsRangeLength) {
  ASSERT_TRUE(store().Put("k", AsSpan(std::string("0123456789"))).ok());
  std::string out(100, 'x');
  absl::StatusOr<size_t> n =
      store().Read("k", ByteRange{2, 3}, absl::Span<char>(out.data(), 100));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(out.substr(0, 4), "234x");
}

TEST_P(ShardStoreConformanceTest, EmptyObject) {
  ASSERT_TRUE(store().Put("empty", absl::Span<const char>()).ok());
  EXPECT_EQ(store().Size("empty").value(), 0u);
  EXPECT_EQ(ReadObject(store(), "empty").value(), "");
  EXPECT_THAT(store().List("").value(), ElementsAre("empty"));
  EXPECT_THAT(ReadRange(store(), "empty", 0, 1).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("empty")));
}

TEST_P(ShardStoreConformanceTest, PutReplacesExisting) {
  ASSERT_TRUE(store().Put("x/y", AsSpan(std::string(5000, 'a'))).ok());
  ASSERT_TRUE(store().Put("x/y", AsSpan(std::string("short"))).ok());
  EXPECT_EQ(ReadObject(store(), "x/y").value(), "short");
  EXPECT_THAT(store().List("x/").value(), ElementsAre("x/y"));
}

TEST_P(ShardStoreConformanceTest, MissingObjectIsNotFoundNamingKey) {
  char buf[4];
  EXPECT_THAT(
      store()
          .Read("no/such/key", ByteRange{0, 1}, absl::Span<char>(buf, 4))
          .status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/key")));
  EXPECT_THAT(store().Size("no/such/key").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/key")));
  EXPECT_THAT(store().Delete("no/such/key"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/key")));
  const ByteRange r{0, 1};
  const absl::Span<char> o(buf, 1);
  EXPECT_THAT(store().ReadRanges("missing", absl::MakeConstSpan(&r, 1),
                                 absl::MakeConstSpan(&o, 1)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  // A "directory" is not an object.
  ASSERT_TRUE(store().Put("dir/obj", AsSpan(std::string("x"))).ok());
  EXPECT_THAT(store().Size("dir").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("dir")));
  EXPECT_THAT(store().Delete("dir"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("dir")));
  EXPECT_EQ(store().Size("dir/obj").value(), 1u);
}

TEST_P(ShardStoreConformanceTest, OutOfRangeReads) {
  ASSERT_TRUE(store().Put("obj", AsSpan(std::string(100, 'z'))).ok());
  EXPECT_THAT(ReadRange(store(), "obj", 50, 51).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("obj")));
  EXPECT_THAT(ReadRange(store(), "obj", 101, 0).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("obj")));
  // offset + length overflows uint64.
  char buf[8];
  EXPECT_THAT(
      store()
          .Read("obj", ByteRange{UINT64_MAX - 2, 8}, absl::Span<char>(buf, 8))
          .status(),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("obj")));
  EXPECT_THAT(
      store().Read("obj", ByteRange{0, 10}, absl::Span<char>(buf, 8)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("obj")));
}

TEST_P(ShardStoreConformanceTest, ReadRangesMatchesOracle) {
  std::mt19937_64 rng(7);
  const std::string data = RandomBytes(rng, (3 << 20) + 12345);
  ASSERT_TRUE(store().Put("big", AsSpan(data)).ok());
  for (int round = 0; round < 40; ++round) {
    const int n = 1 + static_cast<int>(rng() % 20);
    std::vector<ByteRange> ranges;
    for (int i = 0; i < n; ++i) {
      uint64_t off = rng() % data.size();
      uint64_t len = rng() % std::min<uint64_t>(data.size() - off, 300000);
      if (i > 0 && rng() % 3 == 0) {  // adjacent to the previous range
        off = ranges.back().offset + ranges.back().length;
        if (off >= data.size()) off = 0;
        len = rng() % std::min<uint64_t>(data.size() - off, 300000);
      }
      ranges.push_back(ByteRange{off, len});
    }
    std::vector<std::string> bufs(n);
    std::vector<absl::Span<char>> outs;
    for (int i = 0; i < n; ++i) {
      bufs[i].assign(ranges[i].length, '\0');
      outs.emplace_back(bufs[i].data(), bufs[i].size());
    }
    ASSERT_TRUE(store().ReadRanges("big", ranges, outs).ok());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(bufs[i], data.substr(ranges[i].offset, ranges[i].length))
          << "round " << round << " range " << i;
    }
  }
  // Overlapping and unsorted ranges are fine too.
  const std::vector<ByteRange> ranges = {{1000, 10}, {5, 2000}, {5, 2000}};
  std::vector<std::string> bufs = {
      std::string(10, '\0'), std::string(2000, '\0'), std::string(2000, '\0')};
  std::vector<absl::Span<char>> outs;
  for (auto& b : bufs) outs.emplace_back(b.data(), b.size());
  ASSERT_TRUE(store().ReadRanges("big", ranges, outs).ok());
  EXPECT_EQ(bufs[0], data.substr(1000, 10));
  EXPECT_EQ(bufs[1], data.substr(5, 2000));
  EXPECT_EQ(bufs[2], data.substr(5, 2000));
  // No ranges: OK.
  EXPECT_TRUE(store().ReadRanges("big", {}, {}).ok());
}

TEST_P(ShardStoreConformanceTest, ReadRangesRejectsBadArguments) {
  ASSERT_TRUE(store().Put("obj", AsSpan(std::string(64, 'q'))).ok());
  std::string a(8, '\0');
  std::string b(8, '\0');
  std::vector<ByteRange> ranges = {{0, 8}, {60, 8}};
  std::vector<absl::Span<char>> outs = {absl::Span<char>(a.data(), 8),
                                        absl::Span<char>(b.data(), 8)};
  EXPECT_THAT(store().ReadRanges("obj", ranges, outs),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("obj")));
  std::vector<absl::Span<char>> one = {absl::Span<char>(a.data(), 8)};
  EXPECT_THAT(store().ReadRanges("obj", ranges, one),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("obj")));
  std::vector<absl::Span<char>> wrong = {absl::Span<char>(a.data(), 8),
                                         absl::Span<char>(b.data(), 4)};
  ranges[1] = {0, 8};
  EXPECT_THAT(store().ReadRanges("obj", ranges, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("obj")));
}

TEST_P(ShardStoreConformanceTest, WriterIsInvisibleUntilClose) {
  auto writer = store().NewWriter("job/1/data-0");
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::mt19937_64 rng(3);
  std::string expected;
  for (int i = 0; i < 50; ++i) {
    const std::string piece = RandomBytes(rng, rng() % 70000);
    ASSERT_TRUE((*writer)->Append(AsSpan(piece)).ok());
    expected += piece;
    EXPECT_EQ((*writer)->bytes_written(), expected.size());
  }
  EXPECT_THAT(store().Size("job/1/data-0").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("data-0")));
  EXPECT_THAT(store().List("").value(), IsEmpty());
  EXPECT_THAT(store().ListChildren("").value(), IsEmpty());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(ReadObject(store(), "job/1/data-0").value(), expected);
  EXPECT_THAT(store().List("").value(), ElementsAre("job/1/data-0"));
  // Closed: no more appends or closes.
  EXPECT_THAT(
      (*writer)->Append(AsSpan(std::string("x"))),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("data-0")));
  EXPECT_THAT(
      (*writer)->Close(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("data-0")));
  EXPECT_EQ(ReadObject(store(), "job/1/data-0").value(), expected);
}

// A writer opened with WriterOptions::rewrite_prefix, on a store that can
// (CanRewritePrefix), overwrites its first bytes before Close: the object is
// the new prefix, then the rest as appended, and nothing is visible before
// Close. A store that cannot refuses.
TEST_P(ShardStoreConformanceTest, RewritePrefixBeforeClose) {
  auto writer =
      store().NewWriter("r/obj", WriterOptions{.rewrite_prefix = true});
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::mt19937_64 rng(11);
  std::string rest;
  ASSERT_TRUE((*writer)->Append(AsSpan(std::string(32, '\0'))).ok());
  while (rest.size() < (size_t{3} << 20)) {  // past a posix sync chunk
    const std::string piece = RandomBytes(rng, 1 + rng() % 300000);
    ASSERT_TRUE((*writer)->Append(AsSpan(piece)).ok());
    rest += piece;
  }
  const std::string head = RandomBytes(rng, 32);
  const absl::Status rewritten = (*writer)->RewritePrefix(AsSpan(head));
  if (!store().CanRewritePrefix()) {
    EXPECT_THAT(rewritten, StatusIs(absl::StatusCode::kFailedPrecondition,
                                    HasSubstr("CanRewritePrefix")));
    return;
  }
  ASSERT_TRUE(rewritten.ok()) << rewritten;
  EXPECT_THAT(
      (*writer)->RewritePrefix(
          AsSpan(std::string((*writer)->bytes_written() + 1, 'x'))),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("r/obj")));
  EXPECT_THAT(store().Size("r/obj").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("r/obj")));
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(ReadObject(store(), "r/obj").value(), head + rest);
  EXPECT_THAT(
      (*writer)->RewritePrefix(AsSpan(head)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("r/obj")));
}

TEST_P(ShardStoreConformanceTest, DestroyedWriterLeavesNothing) {
  ASSERT_TRUE(store().Put("keep/old", AsSpan(std::string("old"))).ok());
  {
    auto writer = store().NewWriter("keep/old");
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(AsSpan(std::string(10000, 'n'))).ok());
    auto fresh = store().NewWriter("gone/new/obj");
    ASSERT_TRUE(fresh.ok());
    ASSERT_TRUE((*fresh)->Append(AsSpan(std::string(10, 'n'))).ok());
  }
  EXPECT_EQ(ReadObject(store(), "keep/old").value(), "old");
  EXPECT_THAT(store().List("").value(), ElementsAre("keep/old"));
  EXPECT_THAT(store().ListChildren("").value(), ElementsAre("keep/"));
}

TEST_P(ShardStoreConformanceTest, SimulatedCrashLeavesNothingVisible) {
  auto writer = store().NewWriter("c/obj");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(AsSpan(std::string(5000, 'c'))).ok());
  (*writer)->SimulateCrashForTest();
  EXPECT_FALSE((*writer)->Close().ok());
  EXPECT_THAT(store().Size("c/obj").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("c/obj")));
  EXPECT_THAT(store().List("").value(), IsEmpty());
  // The prefix can still be deleted and reused.
  EXPECT_TRUE(store().DeletePrefix("c/").ok());
  ASSERT_TRUE(store().Put("c/obj", AsSpan(std::string("v"))).ok());
  EXPECT_EQ(ReadObject(store(), "c/obj").value(), "v");
}

TEST_P(ShardStoreConformanceTest, ListIsSortedAndFiltersByStringPrefix) {
  for (const char* key :
       {"b/2", "a/1", "a/b/c", "ab", "a/bc", "a-b/x", "a/b/d", "c"}) {
    ASSERT_TRUE(store().Put(key, AsSpan(std::string(key))).ok()) << key;
  }
  EXPECT_THAT(
      store().List("").value(),
      ElementsAre("a-b/x", "a/1", "a/b/c", "a/b/d", "a/bc", "ab", "b/2", "c"));
  EXPECT_THAT(store().List("a/").value(),
              ElementsAre("a/1", "a/b/c", "a/b/d", "a/bc"));
  EXPECT_THAT(store().List("a/b").value(),
              ElementsAre("a/b/c", "a/b/d", "a/bc"));
  EXPECT_THAT(store().List("a/b/").value(), ElementsAre("a/b/c", "a/b/d"));
  EXPECT_THAT(store().List("a").value(),
              ElementsAre("a-b/x", "a/1", "a/b/c", "a/b/d", "a/bc", "ab"));
  EXPECT_THAT(store().List("zzz").value(), IsEmpty());
  EXPECT_THAT(store().List("q/r/").value(), IsEmpty());
  EXPECT_THAT(store().List("a/b/c").value(), ElementsAre("a/b/c"));
}

TEST_P(ShardStoreConformanceTest, ListChildrenGivesOneLevel) {
  for (const char* key :
       {"j/0001/a", "j/0001/b", "j/0002/MANIFEST", "j/top", "k/x"}) {
    ASSERT_TRUE(store().Put(key, AsSpan(std::string("v"))).ok());
  }
  EXPECT_THAT(store().ListChildren("").value(), ElementsAre("j/", "k/"));
  EXPECT_THAT(store().ListChildren("j/").value(),
              ElementsAre("0001/", "0002/", "top"));
  EXPECT_THAT(store().ListChildren("j/0001/").value(), ElementsAre("a", "b"));
  EXPECT_THAT(store().ListChildren("nope/").value(), IsEmpty());
  EXPECT_THAT(store().ListChildren("j").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("j")));
}

TEST_P(ShardStoreConformanceTest, DeleteAndDeletePrefix) {
  for (const char* key : {"s/1/a", "s/1/b", "s/10/a", "s/2/a", "t"}) {
    ASSERT_TRUE(store().Put(key, AsSpan(std::string("v"))).ok());
  }
  ASSERT_TRUE(store().Delete("s/1/a").ok());
  EXPECT_THAT(store().Size("s/1/a").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("s/1/a")));
  EXPECT_THAT(store().Delete("s/1/a"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("s/1/a")));
  ASSERT_TRUE(store().DeletePrefix("s/1/").ok());
  EXPECT_THAT(store().List("").value(), ElementsAre("s/10/a", "s/2/a", "t"));
  ASSERT_TRUE(store().DeletePrefix("s/1").ok());  // string prefix: s/10 too
  EXPECT_THAT(store().List("").value(), ElementsAre("s/2/a", "t"));
  EXPECT_TRUE(store().DeletePrefix("nothing/here/").ok());
  EXPECT_THAT(store().ListChildren("").value(), ElementsAre("s/", "t"));
  ASSERT_TRUE(store().DeletePrefix("").ok());
  EXPECT_THAT(store().List("").value(), IsEmpty());
  EXPECT_THAT(store().ListChildren("").value(), IsEmpty());
}

TEST_P(ShardStoreConformanceTest, BadKeysAreInvalidArgumentOnEveryMethod) {
  const std::vector<std::string> bad = {
      "",
      "/abs",
      "/etc/passwd",
      "..",
      "../escape",
      "a/../../escape",
      "a/./b",
      ".",
      "a//b",
      "trailing/",
      std::string("nul\0byte", 8),
      std::string(1025, 'k'),
      "a/.cairn-tmp.1234",
  };
  std::string buf(4, '\0');
  for (const std::string& key : bad) {
    SCOPED_TRACE(key);
    auto code = [](const absl::Status& s) { return s.code(); };
    EXPECT_EQ(code(store().Put(key, AsSpan(std::string("x")))),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(store().NewWriter(key).status()),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        code(store()
                 .Read(key, ByteRange{0, 1}, absl::Span<char>(buf.data(), 4))
                 .status()),
        absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(store().ReadRanges(key, {}, {})),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(store().Size(key).status()),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(code(store().Delete(key)), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(
      store().Put("../escape", AsSpan(std::string("x"))),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("../escape")));
  for (const char* prefix : {"/abs", "../", "a/../b", "a//", "./x"}) {
    SCOPED_TRACE(prefix);
    EXPECT_THAT(store().List(prefix),
                StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(store().DeletePrefix(prefix),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(store().List("").value(), IsEmpty());
}

TEST_P(ShardStoreConformanceTest, UnusualButValidKeys) {
  for (const std::string& key :
       {std::string("with space/and\ttab"), std::string("..a/b.."),
        std::string("ünïcödé/κλειδί"), std::string("a/.hidden"),
        // 1024 bytes: the maximum (segments of <= 255 bytes, the posix
        // NAME_MAX).
        absl::StrCat(std::string(200, 'm'), "/", std::string(200, 'm'), "/",
                     std::string(200, 'm'), "/", std::string(200, 'm'), "/",
                     std::string(200, 'm'), "/", std::string(19, 'm'))}) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(store().Put(key, AsSpan(key)).ok());
    EXPECT_EQ(ReadObject(store(), key).value(), key);
  }
  EXPECT_EQ(store().List("").value().size(), 5u);
}

TEST_P(ShardStoreConformanceTest, ReopenByUriSeesSameObjects) {
  if (!GetParam().reopen_shares_data) GTEST_SKIP();
  ASSERT_TRUE(store().Put("p/q", AsSpan(std::string("shared"))).ok());
  auto again = OpenShardStore(store().uri());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->uri(), store().uri());
  EXPECT_EQ(ReadObject(**again, "p/q").value(), "shared");
}

// Random operations against a std::map oracle (fixed seed).
TEST_P(ShardStoreConformanceTest, RandomOperationsMatchOracle) {
  std::mt19937_64 rng(42);
  std::map<std::string, std::string> oracle;
  const std::vector<std::string> names = {"a", "b", "ab", "a-1", "x.y"};
  auto random_key = [&] {
    const int depth = 1 + static_cast<int>(rng() % 3);
    std::string key;
    for (int i = 0; i < depth; ++i) {
      if (i > 0) key += "/";
      key += names[rng() % names.size()];
    }
    return key;
  };
  auto random_prefix = [&] {
    std::string key = random_key();
    return key.substr(0, rng() % (key.size() + 1));
  };
  auto is_dir_of_some_object = [&](const std::string& key) {
    auto it = oracle.lower_bound(key + "/");
    return it != oracle.end() && it->first.rfind(key + "/", 0) == 0;
  };
  auto has_object_ancestor = [&](const std::string& key) {
    for (size_t p = key.find('/'); p != std::string::npos;
         p = key.find('/', p + 1)) {
      if (oracle.count(key.substr(0, p))) return true;
    }
    return false;
  };
  for (int step = 0; step < 600; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const int op = static_cast<int>(rng() % 7);
    if (op <= 1) {  // Put / writer
      const std::string key = random_key();
      // Objects and "directories" sharing a name are backend-defined
      // (files vs. S3 keys): the oracle avoids them.
      if (is_dir_of_some_object(key) || has_object_ancestor(key)) continue;
      const std::string value = RandomBytes(rng, rng() % 5000);
      if (op == 0) {
        ASSERT_TRUE(store().Put(key, AsSpan(value)).ok());
      } else {
        auto w = store().NewWriter(key);
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_TRUE(
            (*w)->Append(AsSpan(value.substr(0, value.size() / 3))).ok());
        ASSERT_TRUE((*w)->Append(AsSpan(value.substr(value.size() / 3))).ok());
        ASSERT_TRUE((*w)->Close().ok());
      }
      oracle[key] = value;
    } else if (op == 2) {  // Delete
      const std::string key = random_key();
      const absl::Status s = store().Delete(key);
      if (oracle.erase(key)) {
        ASSERT_TRUE(s.ok()) << s;
      } else {
        ASSERT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
      }
    } else if (op == 3) {  // DeletePrefix (rarely)
      if (rng() % 4 != 0) continue;
      const std::string prefix = random_prefix();
      ASSERT_TRUE(store().DeletePrefix(prefix).ok());
      for (auto it = oracle.begin(); it != oracle.end();) {
        it = it->first.rfind(prefix, 0) == 0 ? oracle.erase(it) : std::next(it);
      }
    } else if (op == 4) {  // List
      const std::string prefix = random_prefix();
      std::vector<std::string> want;
      for (const auto& [k, v] : oracle) {
        if (k.rfind(prefix, 0) == 0) want.push_back(k);
      }
      ASSERT_EQ(store().List(prefix).value(), want) << "prefix " << prefix;
    } else {  // Read a random range / Size
      const std::string key = random_key();
      auto it = oracle.find(key);
      if (it == oracle.end()) {
        ASSERT_THAT(store().Size(key), StatusIs(absl::StatusCode::kNotFound));
        continue;
      }
      ASSERT_EQ(store().Size(key).value(), it->second.size());
      const uint64_t off = rng() % (it->second.size() + 1);
      const uint64_t len = rng() % (it->second.size() - off + 1);
      ASSERT_EQ(ReadRange(store(), key, off, len).value(),
                it->second.substr(off, len));
    }
  }
}

TEST_P(ShardStoreConformanceTest, ConcurrentWritersReadersAndListers) {
  constexpr int kThreads = 6;
  constexpr int kObjects = 12;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      for (int i = 0; i < kObjects; ++i) {
        const std::string key = absl::StrCat("t", t, "/obj", i);
        const std::string value = RandomBytes(rng, 1000 + rng() % 200000);
        if (i % 2 == 0) {
          if (!store().Put(key, AsSpan(value)).ok()) ++failures;
        } else {
          auto w = store().NewWriter(key);
          if (!w.ok() || !(*w)->Append(AsSpan(value)).ok() ||
              !(*w)->Close().ok()) {
            ++failures;
          }
        }
        auto back = ReadObject(store(), key);
        if (!back.ok() || *back != value) ++failures;
        if (!store().List(absl::StrCat("t", t, "/")).ok()) ++failures;
        if (i % 3 == 0 && !store().Delete(key).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // 12 objects per thread, every third deleted: 8 left each.
  EXPECT_EQ(store().List("").value().size(), static_cast<size_t>(kThreads * 8));
}

TEST_P(ShardStoreConformanceTest, ConcurrentReplaceIsAtomic) {
  // Writers replace one key with uniform objects ('A' x n, 'B' x m, ...);
  // a reader must never see a mix or a partial object.
  ASSERT_TRUE(store().Put("hot", AsSpan(std::string(1000, 'A'))).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    std::string buf(1000, '\0');
    while (!stop.load()) {
      // One Read call sees one version: every version starts with 1000
      // copies of its letter.
      auto n = store().Read("hot", ByteRange{0, 1000},
                            absl::Span<char>(buf.data(), buf.size()));
      if (!n.ok() || std::count(buf.begin(), buf.end(), buf[0]) != 1000 ||
          buf[0] < 'A' || buf[0] > 'E') {
        ++torn;
      }
      auto size = store().Size("hot");
      if (!size.ok() || *size % 1000 != 0) ++torn;
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        const int which = (t * 30 + i) % 5;
        const std::string v(1000 * (which + 1), static_cast<char>('A' + which));
        if (!store().Put("hot", AsSpan(v)).ok()) ++torn;
      }
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

TEST_P(ShardStoreConformanceTest, PutIfAbsentCreatesOnceAndNeverReplaces) {
  ASSERT_TRUE(store().PutIfAbsent("a/lease", AsSpan(std::string("one"))).ok());
  EXPECT_EQ(ReadObject(store(), "a/lease").value(), "one");
  EXPECT_THAT(store().PutIfAbsent("a/lease", AsSpan(std::string("two"))),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("a/lease")));
  EXPECT_EQ(ReadObject(store(), "a/lease").value(), "one");
  // At the root too, and beside an object Put made.
  ASSERT_TRUE(store().Put("b", AsSpan(std::string("put"))).ok());
  EXPECT_THAT(store().PutIfAbsent("b", AsSpan(std::string("x"))),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("b")));
  ASSERT_TRUE(store().PutIfAbsent("c", AsSpan(std::string("root"))).ok());
  EXPECT_THAT(store().List("").value(), ElementsAre("a/lease", "b", "c"));
  // Deleted, it can be created again.
  ASSERT_TRUE(store().Delete("a/lease").ok());
  ASSERT_TRUE(store().PutIfAbsent("a/lease", AsSpan(std::string("3"))).ok());
  EXPECT_EQ(ReadObject(store(), "a/lease").value(), "3");
  EXPECT_THAT(store().PutIfAbsent("../x", AsSpan(std::string("x"))),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(ShardStoreConformanceTest, ConcurrentPutIfAbsentHasOneWinner) {
  // Threads race to create each key: exactly one wins it, every other gets
  // ALREADY_EXISTS, and the object holds the winner's bytes.
  constexpr int kThreads = 6;
  constexpr int kKeys = 8;
  std::vector<std::vector<int>> winners(kKeys);
  std::atomic<int> other_errors{0};
  std::vector<std::thread> threads;
  absl::Mutex mu;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        const std::string value = absl::StrCat("thread-", t);
        absl::Status s =
            store().PutIfAbsent(absl::StrCat("race/", k), AsSpan(value));
        if (s.ok()) {
          absl::MutexLock lock(&mu);
          winners[k].push_back(t);
        } else if (!absl::IsAlreadyExists(s)) {
          ++other_errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(other_errors.load(), 0);
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_EQ(winners[k].size(), 1u) << "key " << k;
    EXPECT_EQ(ReadObject(store(), absl::StrCat("race/", k)).value(),
              absl::StrCat("thread-", winners[k][0]));
  }
}

}  // namespace
}  // namespace cairn::storage
