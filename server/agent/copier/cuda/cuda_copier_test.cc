#include "server/agent/copier/cuda/cuda_copier.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "common/gpu/gpu_info.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "server/agent/transport/nccl/nccl_device_link.h"

namespace cairn::agent {
namespace {

using ::cairn::testing::StatusIs;

TEST(CudaCopierTest, CreateWithoutDeviceIsFailedPrecondition) {
  absl::StatusOr<int> n = gpu::DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n > 0) GTEST_SKIP() << "host has a CUDA device";
  EXPECT_THAT(CudaCopier::Create(0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(CudaCopierTest, CopiesDeviceMemoryThroughIpcHandle) {
  absl::StatusOr<int> n = gpu::DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n == 0) GTEST_SKIP() << "no CUDA device";
  auto copier = CudaCopier::Create(0);
  ASSERT_TRUE(copier.ok()) << copier.status();
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1 << 20), cudaSuccess);
  ASSERT_TRUE(gpu::FillDeviceBytes(dev, 1 << 20, 0x5a).ok());
  cudaIpcMemHandle_t h;
  ASSERT_EQ(cudaIpcGetMemHandle(&h, dev), cudaSuccess);
  copier::CopySource src;
  src.kind = copier::CopySource::Kind::kCudaIpc;
  src.cuda_ipc_handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  src.offset = 4096;
  std::string dst(8192, '\0');
  // Opening one's own IPC handle fails in-process on most drivers; the
  // agent opens handles of other processes. Either outcome must be a Status.
  absl::Status s = (*copier)->Copy(src, absl::MakeSpan(dst));
  if (s.ok()) {
    ASSERT_TRUE((*copier)->Flush().ok());
    EXPECT_EQ(dst, std::string(8192, '\x5a'));
  }
  cudaFree(dev);
}

TEST(NcclDeviceLinkTest, CreateWithoutDeviceNamesTheReason) {
  absl::StatusOr<int> n = gpu::DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n > 0) GTEST_SKIP() << "host has a CUDA device";
  absl::Status s = NcclDeviceLink::Create(0).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("no CUDA device"), absl::string_view::npos) << s;
}

TEST(NcclDeviceLinkTest, MissingDeviceIndexIsNamed) {
  absl::StatusOr<int> n = gpu::DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n == 0) GTEST_SKIP() << "no CUDA device";
  absl::Status s = NcclDeviceLink::Create(*n).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("does not exist"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace cairn::agent
