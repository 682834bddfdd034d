#include "storage/posix/posix_shard_store.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/testing/shard_store_conformance.h"

namespace cairn::storage {
namespace {

namespace fs = std::filesystem;
using ::cairn::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A fresh directory, removed when the test program ends.
std::string NewTempDir() { return testing::MakeTempDirRemovedAtExit("posix"); }

absl::Span<const char> AsSpan(const std::string& s) {
  return absl::Span<const char>(s.data(), s.size());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

INSTANTIATE_TEST_SUITE_P(
    Posix, ShardStoreConformanceTest,
    ::testing::Values(
        ShardStoreConformanceParam{"posix",
                                   [] {
                                     return OpenShardStore(
                                         absl::StrCat("file://", NewTempDir()));
                                   },
                                   true},
        // Small pieces and 3 threads: exercises parallel reads and writes.
        ShardStoreConformanceParam{
            "posix_small_chunks",
            [] {
              StoreOptions o;
              o.io_threads = 3;
              o.io_chunk_bytes = 64 << 10;
              return OpenShardStore(absl::StrCat("file://", NewTempDir()), o);
            },
            true},
        ShardStoreConformanceParam{
            "posix_odirect",
            [] {
              StoreOptions o;
              o.use_odirect = true;
              o.io_chunk_bytes = 256 << 10;
              return OpenShardStore(absl::StrCat("file://", NewTempDir()), o);
            },
            true},
        ShardStoreConformanceParam{"posix_single_thread",
                                   [] {
                                     StoreOptions o;
                                     o.io_threads = 1;
                                     o.io_chunk_bytes = 4096;
                                     return OpenShardStore(NewTempDir(),
                                                           o);  // bare path
                                   },
                                   true}),
    ShardStoreConformanceParamName);

TEST(PosixShardStoreTest, ObjectsAreFilesUnderTheRoot) {
  const std::string root = NewTempDir();
  auto store = OpenShardStore("file://" + root);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->uri(), "file://" + root);
  ASSERT_TRUE(
      (*store)->Put("job/0001/data", AsSpan(std::string("bytes"))).ok());
  EXPECT_EQ(ReadFile(root + "/job/0001/data"), "bytes");
}

TEST(PosixShardStoreTest, NoKeyEverEscapesTheRoot) {
  const std::string parent = NewTempDir();
  const std::string root = parent + "/root";
  auto store = OpenShardStore("file://" + root);
  ASSERT_TRUE(store.ok());
  // A sibling file and directory the store must never reach.
  ASSERT_EQ(::mkdir((parent + "/outside").c_str(), 0755), 0);
  { std::ofstream(parent + "/secret") << "secret"; }
  { std::ofstream(parent + "/outside/file") << "outside"; }
  // Symlinks planted inside the root: to a directory and to a file outside.
  ASSERT_EQ(::symlink((parent + "/outside").c_str(), (root + "/link").c_str()),
            0);
  ASSERT_EQ(
      ::symlink((parent + "/secret").c_str(), (root + "/filelink").c_str()), 0);
  const std::string payload = "pwned";
  for (const std::string key :
       {"../secret", "../outside/file", "a/../../secret", "/etc/passwd",
        "link/file", "link/new", "link/../secret"}) {
    SCOPED_TRACE(key);
    const absl::Status put = (*store)->Put(key, AsSpan(payload));
    EXPECT_FALSE(put.ok());
    std::string buf(16, '\0');
    EXPECT_FALSE((*store)
                     ->Read(key, ByteRange{0, 1},
                            absl::Span<char>(buf.data(), buf.size()))
                     .ok());
    EXPECT_FALSE((*store)->Size(key).ok());
    EXPECT_FALSE((*store)->Delete(key).ok());
  }
  // Through a symlinked directory: refused, as NOT_FOUND / FAILED_PRECONDITION.
  std::string buf(7, '\0');
  EXPECT_THAT((*store)->Read("link/file", ByteRange{0, 7},
                             absl::Span<char>(buf.data(), 7)),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*store)->Put("link/new", AsSpan(payload)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A symlink to a file is not an object; publishing its name replaces the
  // link itself (inside the root) and never writes through it.
  EXPECT_THAT((*store)->Size("filelink"),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*store)->Read("filelink", ByteRange{0, 6},
                             absl::Span<char>(buf.data(), 6)),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*store)->Delete("filelink"),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_TRUE((*store)->Put("filelink", AsSpan(payload)).ok());
  EXPECT_FALSE(fs::is_symlink(root + "/filelink"));
  EXPECT_EQ(ReadFile(root + "/filelink"), payload);
  ASSERT_TRUE((*store)->Delete("filelink").ok());
  EXPECT_TRUE((*store)->DeletePrefix("link/").ok());
  EXPECT_TRUE((*store)->DeletePrefix("").ok());
  // Nothing outside changed; symlinks are not objects.
  EXPECT_EQ(ReadFile(parent + "/secret"), "secret");
  EXPECT_EQ(ReadFile(parent + "/outside/file"), "outside");
  EXPECT_FALSE(fs::exists(parent + "/outside/new"));
  EXPECT_THAT((*store)->List("").value(), IsEmpty());
  EXPECT_EQ(fs::directory_iterator(parent + "/outside")->path().filename(),
            "file");
}

TEST(PosixShardStoreTest, TempFilesOfCrashedWritersAreHiddenAndDeletable) {
  const std::string root = NewTempDir();
  auto store = OpenShardStore("file://" + root);
  ASSERT_TRUE(store.ok());
  auto writer = (*store)->NewWriter("job/0001/data");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(AsSpan(std::string(10000, 'x'))).ok());
  (*writer)->SimulateCrashForTest();
  // The temp file is there on disk, as after a real crash...
  int temps = 0;
  for (const auto& e : fs::directory_iterator(root + "/job/0001")) {
    EXPECT_TRUE(absl::StartsWith(e.path().filename().string(), ".cairn-tmp"));
    ++temps;
  }
  EXPECT_EQ(temps, 1);
  // ...but no object is visible, even after reopening.
  auto reopened = OpenShardStore("file://" + root);
  EXPECT_THAT((*reopened)->List("").value(), IsEmpty());
  EXPECT_THAT((*reopened)->ListChildren("").value(), IsEmpty());
  EXPECT_TRUE(fs::exists(root + "/job/0001"));  // on disk, not listed
  ASSERT_TRUE((*reopened)->DeletePrefix("job/0001/").ok());
  EXPECT_FALSE(fs::exists(root + "/job"));
}

TEST(PosixShardStoreTest, DeleteAbandonedWritesRemovesOnlyTempFilesBelow) {
  const std::string root = NewTempDir();
  auto store = OpenShardStore("file://" + root);
  ASSERT_TRUE(store.ok());
  // A committed object next to a crashed writer's temp file in one directory,
  // a directory holding only a crashed temp file, and a crashed writer of
  // another job.
  ASSERT_TRUE((*store)->Put("job/0001/a/obj", AsSpan("kept")).ok());
  for (const char* key : {"job/0001/a/dead", "job/0002/b/dead", "other/x"}) {
    auto w = (*store)->NewWriter(key);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(AsSpan(std::string(5000, 'x'))).ok());
    (*w)->SimulateCrashForTest();
  }
  auto temps_under = [&](const std::string& dir) {
    int n = 0;
    if (!fs::exists(dir)) return 0;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (absl::StartsWith(e.path().filename().string(), ".cairn-tmp")) ++n;
    }
    return n;
  };
  ASSERT_EQ(temps_under(root + "/job"), 2);
  EXPECT_THAT((*store)->DeleteAbandonedWrites("job/0001"),
              StatusIs(absl::StatusCode::kInvalidArgument));

  ASSERT_TRUE((*store)->DeleteAbandonedWrites("job/").ok());
  EXPECT_EQ(temps_under(root + "/job"), 0);
  EXPECT_EQ(temps_under(root + "/other"), 1);    // outside the prefix
  EXPECT_FALSE(fs::exists(root + "/job/0002"));  // left empty: removed
  EXPECT_THAT((*store)->List("").value(), ElementsAre("job/0001/a/obj"));
  EXPECT_EQ(ReadFile(root + "/job/0001/a/obj"), "kept");
  ASSERT_TRUE((*store)->DeleteAbandonedWrites("").ok());
  EXPECT_EQ(temps_under(root), 0);
}

TEST(PosixShardStoreTest, DeleteRemovesEmptyDirectoriesButNotTheRoot) {
  const std::string root = NewTempDir();
  auto store = OpenShardStore("file://" + root);
  ASSERT_TRUE((*store)->Put("a/b/c/obj", AsSpan(std::string("1"))).ok());
  ASSERT_TRUE((*store)->Put("a/keep", AsSpan(std::string("2"))).ok());
  ASSERT_TRUE((*store)->Delete("a/b/c/obj").ok());
  EXPECT_FALSE(fs::exists(root + "/a/b"));
  EXPECT_TRUE(fs::exists(root + "/a/keep"));
  ASSERT_TRUE((*store)->DeletePrefix("a/").ok());
  EXPECT_FALSE(fs::exists(root + "/a"));
  EXPECT_TRUE(fs::exists(root));
}

TEST(PosixShardStoreTest, ObjectWhereADirectoryIsNeededFails) {
  auto store = OpenShardStore(NewTempDir());
  ASSERT_TRUE((*store)->Put("a", AsSpan(std::string("file"))).ok());
  const absl::Status s = (*store)->Put("a/b", AsSpan(std::string("x")));
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("a/b")));
  EXPECT_EQ(ReadObject(**store, "a").value(), "file");
}

// A FIFO, socket or directory where an object should be is refused at once
// (DATA_LOSS naming the key). Opening a FIFO for reading used to block until
// a writer appeared: a load or `cairn verify` hung forever.
TEST(PosixShardStoreTest, NonRegularFilesAreRefusedWithoutBlocking) {
  const std::string root = NewTempDir();
  auto store = OpenShardStore("file://" + root);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put("job/1/obj", AsSpan(std::string("data"))).ok());
  ASSERT_EQ(::mkfifo((root + "/job/1/fifo").c_str(), 0644), 0);
  ASSERT_TRUE(fs::create_directory(root + "/job/1/dir"));
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Bound by a relative name from inside the directory: a test's temp dir
  // (Bazel's TEST_TMPDIR) can be longer than sun_path's 108 bytes.
  std::strncpy(addr.sun_path, "sock", sizeof(addr.sun_path) - 1);
  const int cwd = ::open(".", O_RDONLY | O_DIRECTORY);
  ASSERT_GE(cwd, 0);
  ASSERT_EQ(::chdir((root + "/job/1").c_str()), 0);
  const int bound =
      ::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ASSERT_EQ(::fchdir(cwd), 0);
  ::close(cwd);
  ASSERT_EQ(bound, 0);

  for (const std::string name : {"fifo", "sock", "dir"}) {
    SCOPED_TRACE(name);
    const std::string key = "job/1/" + name;
    auto read = std::async(std::launch::async, [&] {
      std::string out(4, '\0');
      absl::Status s =
          (*store)->Read(key, ByteRange{0, 4}, absl::MakeSpan(out)).status();
      std::vector<absl::Span<char>> outs = {absl::MakeSpan(out)};
      const ByteRange r{0, 4};
      absl::Status ranges = (*store)->ReadRanges(
          key, absl::MakeConstSpan(&r, 1), absl::MakeConstSpan(outs));
      return std::make_pair(s, ranges);
    });
    if (read.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      // Unblock the reader so the test fails instead of hanging.
      ::close(::open((root + "/job/1/fifo").c_str(), O_WRONLY | O_NONBLOCK));
      ADD_FAILURE() << "reading " << key << " blocked";
    }
    auto [s, ranges] = read.get();
    for (const absl::Status& st : {s, ranges}) {
      EXPECT_THAT(
          st, StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(key), HasSubstr("not a regular file"))));
    }
  }
  ::close(sock);
  // The regular object next to them still reads.
  EXPECT_EQ(ReadObject(**store, "job/1/obj").value(), "data");
}

TEST(PosixShardStoreTest, OdirectWritesExactBytesForAlignedAndUnalignedInput) {
  StoreOptions o;
  o.use_odirect = true;
  o.io_chunk_bytes = 64 << 10;
  o.io_threads = 3;
  const std::string root = NewTempDir();
  auto store = OpenShardStore("file://" + root, o);
  ASSERT_TRUE(store.ok());
  std::mt19937_64 rng(5);
  // An aligned buffer (written in place) then unaligned pieces (staged).
  const size_t aligned_len = 1 << 20;
  char* aligned = static_cast<char*>(std::aligned_alloc(4096, aligned_len));
  for (size_t i = 0; i < aligned_len; ++i)
    aligned[i] = static_cast<char>(rng());
  std::string expected(aligned, aligned_len);
  auto writer = (*store)->NewWriter("obj");
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(
      (*writer)->Append(absl::Span<const char>(aligned, aligned_len)).ok());
  for (int i = 0; i < 30; ++i) {
    std::string piece(rng() % 50000, '\0');
    for (char& c : piece) c = static_cast<char>(rng());
    ASSERT_TRUE((*writer)->Append(AsSpan(piece)).ok());
    expected += piece;
  }
  // Aligned again, but after unaligned bytes: must go through staging.
  ASSERT_TRUE(
      (*writer)->Append(absl::Span<const char>(aligned, aligned_len)).ok());
  expected.append(aligned, aligned_len);
  std::free(aligned);
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(fs::file_size(root + "/obj"), expected.size());
  EXPECT_EQ(ReadFile(root + "/obj"), expected);
  // The space reserved ahead of the writes was given back at Close().
  struct stat st;
  ASSERT_EQ(::stat((root + "/obj").c_str(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512,
            expected.size() + (64 << 10));
}

// --- Out of space, on a real small filesystem (a tmpfs we mount). ---

class SmallFilesystemTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = NewTempDir();
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=64m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << strerror(errno);
    }
    mounted_ = true;
    StoreOptions o;
    o.use_odirect = GetParam();
    auto s = OpenPosixShardStore(dir_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  uint64_t FreeBytes() const {
    struct statvfs v;
    EXPECT_EQ(::statvfs(dir_.c_str(), &v), 0);
    return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  }
  // Names of every file below the root (temp files included).
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      if (e.is_regular_file()) out.push_back(e.path().filename().string());
    }
    return out;
  }
  // Appends `n` bytes of 'x' in 1 MiB + 1 pieces (unaligned for O_DIRECT).
  static absl::Status Fill(ObjectWriter& w, uint64_t n) {
    static const std::string* piece = new std::string((1 << 20) + 1, 'x');
    while (n > 0) {
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(n, piece->size()));
      CAIRN_RETURN_IF_ERROR(w.Append(absl::MakeConstSpan(piece->data(), take)));
      n -= take;
    }
    return absl::OkStatus();
  }

  std::string dir_;
  bool mounted_ = false;
  std::unique_ptr<ShardStore> store_;
};

TEST_P(SmallFilesystemTest,
       ObjectThatFitsExactlyIsWrittenOneThatDoesNotIsRefused) {
  // The directories first: then everything free is for the object.
  ASSERT_TRUE(store_->Put("job/1/attempt-a/seed", "s").ok());
  const uint64_t free = FreeBytes();
  ASSERT_GT(free, uint64_t{60} << 20);
  WriterOptions too_big;
  too_big.expected_bytes = free + 1;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> refused =
      store_->NewWriter("job/1/attempt-a/data-0", too_big);
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("no space left on device writing "
                                       "'job/1/attempt-a/data-0' ("),
                             HasSubstr(absl::StrCat(free + 1, " bytes needed, ",
                                                    free, " free)")))));
  EXPECT_THAT(Files(), ElementsAre("seed"));  // nothing written, no temp file

  WriterOptions exact;
  exact.expected_bytes = free;
  absl::StatusOr<std::unique_ptr<ObjectWriter>> w =
      store_->NewWriter("job/1/attempt-a/data-0", exact);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(Fill(**w, free).ok());
  ASSERT_TRUE((*w)->Close().ok());
  absl::StatusOr<uint64_t> size = store_->Size("job/1/attempt-a/data-0");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, free);
  EXPECT_EQ(FreeBytes(), 0u);
}

TEST_P(SmallFilesystemTest, WritesBeyondTheSpaceNameTheObject) {
  // No expected size (a caller that does not know it): the write that runs
  // out fails naming the object, and nothing is left behind.
  absl::StatusOr<std::unique_ptr<ObjectWriter>> w =
      store_->NewWriter("job/2/attempt-b/data-1");
  ASSERT_TRUE(w.ok()) << w.status();
  absl::Status s = Fill(**w, uint64_t{65} << 20);
  if (s.ok()) s = (*w)->Close();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted,
                          AllOf(HasSubstr("no space left on device writing "
                                          "'job/2/attempt-b/data-1' ("),
                                HasSubstr("bytes needed"))));
  w->reset();
  EXPECT_THAT(Files(), IsEmpty());
}

TEST_P(SmallFilesystemTest, WritersReserveOnlyWhatTheyWrite) {
  // Four writers of 12 MiB each, open at once, on 64 MiB: they fit. (Each
  // O_DIRECT writer used to reserve 64 MiB ahead, so the second one failed
  // with 52 MiB still free.)
  std::vector<std::unique_ptr<ObjectWriter>> writers;
  for (int i = 0; i < 4; ++i) {
    auto w = store_->NewWriter(absl::StrCat("job/3/attempt-c/data-", i));
    ASSERT_TRUE(w.ok()) << w.status();
    writers.push_back(std::move(*w));
  }
  for (int round = 0; round < 12; ++round) {
    for (auto& w : writers) {
      absl::Status s = Fill(*w, uint64_t{1} << 20);
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  for (auto& w : writers) ASSERT_TRUE(w->Close().ok());
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<uint64_t> size =
        store_->Size(absl::StrCat("job/3/attempt-c/data-", i));
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(*size, uint64_t{12} << 20);
  }
}

INSTANTIATE_TEST_SUITE_P(BufferedAndOdirect, SmallFilesystemTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Odirect" : "Buffered";
                         });

TEST(PosixShardStoreTest, BadUrisAndOptions) {
  EXPECT_THAT(OpenShardStore("file://host/path"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(OpenShardStore("relative/path"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const auto unknown = OpenShardStore("s4://bucket");
  EXPECT_THAT(unknown,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("s4")));
  StoreOptions o;
  o.io_threads = 0;
  EXPECT_THAT(OpenShardStore(NewTempDir(), o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A root that is a file.
  const std::string dir = NewTempDir();
  { std::ofstream(dir + "/file") << "x"; }
  EXPECT_FALSE(OpenShardStore(dir + "/file").ok());
}

}  // namespace
}  // namespace cairn::storage
