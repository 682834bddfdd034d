#include "common/gpu/gpu_info.h"

#include <vector>

#include "gtest/gtest.h"

#ifdef CAIRN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/gpu/cuda_status.h"
#include "common/testing/status_matchers.h"
#endif

namespace cairn::gpu {
namespace {

using ::cairn::testing::StatusIs;

TEST(GpuInfoTest, DeviceCountAgreesWithListDevices) {
  absl::StatusOr<int> n = DeviceCount();
  ASSERT_TRUE(n.ok()) << n.status();
  absl::StatusOr<std::vector<DeviceInfo>> devices = ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ(static_cast<int>(devices->size()), *n);
  for (const DeviceInfo& d : *devices) {
    EXPECT_GT(d.total_memory_bytes, 0u);
    EXPECT_GE(d.compute_capability_major, 5);
  }
}

TEST(GpuInfoTest, NcclVersionIsKnownExactlyWhenBuiltWithCuda) {
  absl::StatusOr<int> v = NcclVersion();
  if (BuiltWithCuda()) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_GE(*v, 20000);  // NCCL 2.x codes are major*10000 + minor*100 + patch
  } else {
    EXPECT_THAT(v, StatusIs(absl::StatusCode::kUnimplemented));
  }
}

TEST(GpuInfoTest, FillWithoutDeviceIsFailedPrecondition) {
  absl::StatusOr<int> n = DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n > 0) GTEST_SKIP() << "a device is present";
  char host[4];
  EXPECT_THAT(FillDeviceBytes(host, sizeof(host), 7),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

#ifdef CAIRN_HAVE_CUDA
TEST(CudaStatusTest, MapsCodesByRetrySemantics) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  absl::Status s =
      CudaStatus(cudaErrorInsufficientDriver, "cudaGetDeviceCount");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("cudaGetDeviceCount"), absl::string_view::npos);
  EXPECT_NE(s.message().find("35"), absl::string_view::npos);
  EXPECT_THAT(CudaStatus(cudaErrorMemoryAllocation, "m"),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(CudaStatus(cudaErrorInvalidValue, "v"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(NcclStatus(ncclSystemError, "ncclSend"),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(NcclStatus(ncclInvalidArgument, "ncclSend"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(NcclStatus(ncclInternalError, "ncclSend"),
              StatusIs(absl::StatusCode::kInternal));
}

TEST(CudaStatusTest, FillKernelWritesDeviceMemory) {
  absl::StatusOr<int> n = DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n == 0) GTEST_SKIP() << "no CUDA device";
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 1 << 20), cudaSuccess);
  ASSERT_TRUE(FillDeviceBytes(dev, 1 << 20, 0xab).ok());
  std::vector<unsigned char> host(1 << 20);
  ASSERT_EQ(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(dev);
  for (unsigned char c : host) ASSERT_EQ(c, 0xab);
}
#endif

}  // namespace
}  // namespace cairn::gpu
