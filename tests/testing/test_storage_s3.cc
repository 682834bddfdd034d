// The s3 half of TestStorage (test_storage.h): creates and deletes the
// per-test bucket through S3Client, on the server the AWS_* environment
// names. Linked only where the s3 driver is (CAIRN_TEST_STORAGE_WITH_S3).
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_config.h"
#include "tests/testing/test_storage.h"

namespace cairn::testing::internal {
namespace {

absl::StatusOr<std::unique_ptr<storage::s3::S3Client>> ClientFor(
    const std::string& bucket) {
  absl::StatusOr<storage::s3::S3Config> config =
      storage::s3::ParseS3Uri(bucket, storage::s3::Environment::System());
  if (!config.ok()) return config.status();
  return storage::s3::S3Client::Create(*std::move(config));
}

}  // namespace

absl::Status CreateS3TestBucket(const std::string& bucket) {
  absl::StatusOr<std::unique_ptr<storage::s3::S3Client>> client =
      ClientFor(bucket);
  if (!client.ok()) return client.status();
  return (*client)->CreateBucket(bucket);
}

absl::Status DeleteS3TestBucket(const std::string& bucket) {
  absl::StatusOr<std::unique_ptr<storage::s3::S3Client>> client =
      ClientFor(bucket);
  if (!client.ok()) return client.status();
  storage::s3::S3Client& s3 = **client;
  // Unfinished uploads first (a killed writer's), then every object.
  absl::StatusOr<std::vector<storage::s3::MultipartUpload>> uploads =
      s3.ListMultipartUploads("");
  if (!uploads.ok()) return uploads.status();
  for (const storage::s3::MultipartUpload& u : *uploads) {
    if (absl::Status s = s3.AbortMultipartUpload(u.key, u.upload_id); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::vector<storage::s3::ObjectInfo>> objects =
      s3.ListObjects("");
  if (!objects.ok()) return objects.status();
  std::vector<std::string> keys;
  for (const storage::s3::ObjectInfo& o : *objects) keys.push_back(o.key);
  if (!keys.empty()) {
    if (absl::Status s = s3.DeleteObjects(keys); !s.ok()) return s;
  }
  if (absl::Status s = s3.DeleteBucket(bucket); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("deleting test bucket ", bucket,
                                               ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace cairn::testing::internal
