// Where an end-to-end test keeps its checkpoints, chosen by the environment
// so that one test binary runs against every storage backend:
//
//   CAIRN_TEST_STORAGE unset or "file": a file:// root under cairnd's data
//       directory (`<data_dir>/checkpoints`, cairnd's default, so cairnd gets
//       no --storage flag): exactly what the tests did before they were
//       storage-agnostic.
//   CAIRN_TEST_STORAGE=s3: a fresh bucket `cairn-test-<random>` on the S3
//       server the AWS_* environment names (AWS_ENDPOINT_URL,
//       AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION: what
//       `scripts/ceph/ceph.sh env` prints), created by Create() and deleted
//       with everything in it by Cleanup(). cairnd gets
//       `--storage s3://<bucket>/ckpt`; ranks, agents and the CLI inherit the
//       environment and so reach the same server. Without AWS_ENDPOINT_URL
//       Create() fails naming `scripts/ceph/ceph.sh start` (never a skip).
//
// Tests damage stored objects through this class (FlipBits, Truncate,
// Overwrite, Remove): in place through the filesystem for file:// (as a disk
// or an operator would), by re-PUTting the damaged bytes (or deleting the
// object) through the store for s3://.
//
// Example:
//   ASSERT_OK_AND_ASSIGN(storage_, TestStorage::Create(dir_ + "/cairnd"));
//   StartCairnd(storage_->CairndFlags());
//   ... Cli({"--storage", storage_->uri(), "ls"}) ...
//   EXPECT_TRUE(storage_->Cleanup().ok());
//
// Thread-compatible.
#ifndef CAIRN_TESTS_TESTING_TEST_STORAGE_H_
#define CAIRN_TESTS_TESTING_TEST_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/shard_store.h"

namespace cairn::testing {

class TestStorage {
 public:
  enum class Kind { kFile, kS3 };

  // The storage CAIRN_TEST_STORAGE selects, for a cairnd whose --data-dir is
  // `data_dir`. INVALID_ARGUMENT for an unknown CAIRN_TEST_STORAGE;
  // FAILED_PRECONDITION for s3 without a server (AWS_ENDPOINT_URL unset) or
  // in a binary built without the s3 driver; the server's error when the
  // bucket cannot be created.
  static absl::StatusOr<std::unique_ptr<TestStorage>> Create(
      const std::string& data_dir);
  // The same, `kind` whatever CAIRN_TEST_STORAGE says (tests of one
  // backend).
  static absl::StatusOr<std::unique_ptr<TestStorage>> Create(
      const std::string& data_dir, Kind kind);
  // The kind CAIRN_TEST_STORAGE selects (kFile when unset).
  static absl::StatusOr<Kind> KindFromEnvironment();

  // Cleanup(), its error printed to stderr.
  ~TestStorage();
  TestStorage(const TestStorage&) = delete;
  TestStorage& operator=(const TestStorage&) = delete;

  Kind kind() const { return kind_; }
  bool is_s3() const { return kind_ == Kind::kS3; }
  // The URI cairnd stores checkpoints under ("file:///...", "s3://b/ckpt").
  const std::string& uri() const { return uri_; }
  // s3: the bucket; "" for file.
  const std::string& bucket() const { return bucket_; }
  // Flags that point cairnd at uri(): none for file (cairnd's default under
  // --data-dir), {"--storage", uri()} for s3.
  std::vector<std::string> CairndFlags() const;

  // The store at uri(), opened on first use (posix creates its root).
  absl::StatusOr<storage::ShardStore*> Store();
  // Keys below `prefix` that are data objects (every key but MANIFESTs).
  absl::StatusOr<std::vector<std::string>> DataObjects(
      absl::string_view prefix);
  // The file a key is stored in (file:// only; "" for s3).
  std::string FilePath(absl::string_view key) const;

  // Damage. XORs the byte at `offset` of `key` with `mask`.
  absl::Status FlipBits(absl::string_view key, uint64_t offset, char mask);
  // Cuts `key` down to its first `size` bytes.
  absl::Status Truncate(absl::string_view key, uint64_t size);
  // Replaces the contents of `key` (created when missing).
  absl::Status Overwrite(absl::string_view key, absl::string_view contents);
  // Deletes `key`.
  absl::Status Remove(absl::string_view key);

  // s3: deletes every object, every unfinished multipart upload and the
  // bucket (idempotent). file: nothing (the test removes its temp dir).
  absl::Status Cleanup();

 private:
  TestStorage(Kind kind, std::string uri, std::string root, std::string bucket)
      : kind_(kind),
        uri_(std::move(uri)),
        root_(std::move(root)),
        bucket_(std::move(bucket)) {}

  const Kind kind_;
  const std::string uri_;
  const std::string root_;  // file: the directory of uri()
  const std::string bucket_;
  bool cleaned_ = false;
  std::unique_ptr<storage::ShardStore> store_;
};

namespace internal {
// The s3 half (tests/testing/test_storage_s3.cc), linked only where the s3
// driver is: creates `bucket` on the server the environment names / deletes
// everything in it and then the bucket.
absl::Status CreateS3TestBucket(const std::string& bucket);
absl::Status DeleteS3TestBucket(const std::string& bucket);
}  // namespace internal

}  // namespace cairn::testing

#endif  // CAIRN_TESTS_TESTING_TEST_STORAGE_H_
