#include "tests/testing/test_storage.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <system_error>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cairn::testing {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

absl::Status ErrnoStatus(const std::string& what, const std::error_code& ec) {
  return absl::InternalError(absl::StrCat(what, ": ", ec.message()));
}

}  // namespace

absl::StatusOr<TestStorage::Kind> TestStorage::KindFromEnvironment() {
  const std::string kind = Env("CAIRN_TEST_STORAGE");
  if (kind.empty() || kind == "file") return Kind::kFile;
  if (kind == "s3") return Kind::kS3;
  return absl::InvalidArgumentError(absl::StrCat(
      "CAIRN_TEST_STORAGE='", kind, "': expected 'file' (or unset) or 's3'"));
}

absl::StatusOr<std::unique_ptr<TestStorage>> TestStorage::Create(
    const std::string& data_dir) {
  absl::StatusOr<Kind> kind = KindFromEnvironment();
  if (!kind.ok()) return kind.status();
  return Create(data_dir, *kind);
}

absl::StatusOr<std::unique_ptr<TestStorage>> TestStorage::Create(
    const std::string& data_dir, Kind kind) {
  if (kind == Kind::kFile) {
    // cairnd's default: absolute(--data-dir)/checkpoints.
    const std::string root =
        (std::filesystem::absolute(data_dir) / "checkpoints").string();
    return std::unique_ptr<TestStorage>(
        new TestStorage(Kind::kFile, absl::StrCat("file://", root), root, ""));
  }
  if (Env("AWS_ENDPOINT_URL").empty()) {
    return absl::FailedPreconditionError(
        "S3 storage for the test needs an S3 server, and AWS_ENDPOINT_URL is "
        "unset: start one with `scripts/ceph/ceph.sh start` and export what "
        "`scripts/ceph/ceph.sh env` prints (ctest -L s3 does both)");
  }
  // Bucket names: 3-63 lowercase letters, digits and '-'.
  absl::BitGen gen;
  const std::string bucket =
      absl::StrFormat("cairn-test-%016x", absl::Uniform<uint64_t>(gen));
  if (absl::Status s = internal::CreateS3TestBucket(bucket); !s.ok()) {
    return s;
  }
  return std::unique_ptr<TestStorage>(new TestStorage(
      Kind::kS3, absl::StrCat("s3://", bucket, "/ckpt"), "", bucket));
}

TestStorage::~TestStorage() {
  if (absl::Status s = Cleanup(); !s.ok()) {
    std::cerr << "TestStorage: cleaning up " << uri_ << ": " << s << "\n";
  }
}

std::vector<std::string> TestStorage::CairndFlags() const {
  if (kind_ == Kind::kFile) return {};
  return {"--storage", uri_};
}

absl::StatusOr<storage::ShardStore*> TestStorage::Store() {
  if (store_ == nullptr) {
    absl::StatusOr<std::unique_ptr<storage::ShardStore>> s =
        storage::OpenShardStore(uri_);
    if (!s.ok()) return s.status();
    store_ = std::move(*s);
  }
  return store_.get();
}

absl::StatusOr<std::vector<std::string>> TestStorage::DataObjects(
    absl::string_view prefix) {
  absl::StatusOr<storage::ShardStore*> store = Store();
  if (!store.ok()) return store.status();
  absl::StatusOr<std::vector<std::string>> keys = (*store)->List(prefix);
  if (!keys.ok()) return keys.status();
  std::vector<std::string> data;
  for (std::string& k : *keys) {
    if (!absl::EndsWith(k, "/MANIFEST") && k != "MANIFEST") {
      data.push_back(std::move(k));
    }
  }
  return data;
}

std::string TestStorage::FilePath(absl::string_view key) const {
  if (kind_ != Kind::kFile) return "";
  return absl::StrCat(root_, "/", key);
}

absl::Status TestStorage::FlipBits(absl::string_view key, uint64_t offset,
                                   char mask) {
  if (kind_ == Kind::kFile) {
    // In place, as a failing disk would.
    const std::string path = FilePath(key);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    char c;
    if (!f.seekg(static_cast<std::streamoff>(offset)) || !f.get(c) ||
        !f.seekp(static_cast<std::streamoff>(offset)) ||
        !f.put(static_cast<char>(c ^ mask)) || !f.flush()) {
      return absl::InternalError(
          absl::StrCat("cannot flip byte ", offset, " of ", path));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<storage::ShardStore*> store = Store();
  if (!store.ok()) return store.status();
  absl::StatusOr<std::string> data = storage::ReadObject(**store, key);
  if (!data.ok()) return data.status();
  if (offset >= data->size()) {
    return absl::OutOfRangeError(absl::StrCat("byte ", offset, " of '", key,
                                              "' (", data->size(), " bytes)"));
  }
  (*data)[offset] = static_cast<char>((*data)[offset] ^ mask);
  return (*store)->Put(key, *data);
}

absl::Status TestStorage::Truncate(absl::string_view key, uint64_t size) {
  if (kind_ == Kind::kFile) {
    std::error_code ec;
    std::filesystem::resize_file(FilePath(key), size, ec);
    if (ec) return ErrnoStatus(absl::StrCat("truncating ", FilePath(key)), ec);
    return absl::OkStatus();
  }
  absl::StatusOr<storage::ShardStore*> store = Store();
  if (!store.ok()) return store.status();
  absl::StatusOr<std::string> data = storage::ReadObject(**store, key);
  if (!data.ok()) return data.status();
  if (size > data->size()) {
    return absl::OutOfRangeError(absl::StrCat(
        "truncating '", key, "' (", data->size(), " bytes) to ", size));
  }
  data->resize(size);
  return (*store)->Put(key, *data);
}

absl::Status TestStorage::Overwrite(absl::string_view key,
                                    absl::string_view contents) {
  if (kind_ == Kind::kFile) {
    std::ofstream out(FilePath(key), std::ios::trunc | std::ios::binary);
    if (!out.write(contents.data(),
                   static_cast<std::streamsize>(contents.size())) ||
        !out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ", FilePath(key)));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<storage::ShardStore*> store = Store();
  if (!store.ok()) return store.status();
  return (*store)->Put(key, contents);
}

absl::Status TestStorage::Remove(absl::string_view key) {
  if (kind_ == Kind::kFile) {
    std::error_code ec;
    if (!std::filesystem::remove(FilePath(key), ec)) {
      return ec ? ErrnoStatus(absl::StrCat("removing ", FilePath(key)), ec)
                : absl::NotFoundError(FilePath(key));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<storage::ShardStore*> store = Store();
  if (!store.ok()) return store.status();
  return (*store)->Delete(key);
}

absl::Status TestStorage::Cleanup() {
  if (cleaned_) return absl::OkStatus();
  cleaned_ = true;
  store_.reset();
  if (kind_ == Kind::kFile) return absl::OkStatus();
  return internal::DeleteS3TestBucket(bucket_);
}

#ifndef CAIRN_TEST_STORAGE_WITH_S3
// This binary does not link the s3 driver: s3 tests cannot run.
namespace internal {
absl::Status CreateS3TestBucket(const std::string& bucket) {
  return absl::FailedPreconditionError(absl::StrCat(
      "CAIRN_TEST_STORAGE=s3, but this test binary was built without the s3 "
      "driver (storage/s3): cannot create bucket ",
      bucket));
}
absl::Status DeleteS3TestBucket(const std::string&) { return absl::OkStatus(); }
}  // namespace internal
#endif

}  // namespace cairn::testing
