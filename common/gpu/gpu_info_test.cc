#include "common/gpu/gpu_info.h"

#include <vector>

#include "gtest/gtest.h"

#ifdef CAIRN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "common/gpu/cuda_status.h"
#endif

namespace cairn::gpu {
namespace {

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
    EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented);
  }
}

TEST(GpuInfoTest, FillWithoutDeviceIsFailedPrecondition) {
  absl::StatusOr<int> n = DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n > 0) GTEST_SKIP() << "a device is present";
  char host[4];
  EXPECT_EQ(FillDeviceBytes(host, sizeof(host), 7).code(),
            absl::StatusCode::kFailedPrecondition);
}

#ifdef CAIRN_HAVE_CUDA
TEST(CudaStatusTest, MapsCodesByRetrySemantics) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  absl::Status s =
      CudaStatus(cudaErrorInsufficientDriver, "cudaGetDeviceCount");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cudaGetDeviceCount"), absl::string_view::npos);
  EXPECT_NE(s.message().find("35"), absl::string_view::npos);
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "m").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatus(ncclSystemError, "ncclSend").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclInvalidArgument, "ncclSend").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatus(ncclInternalError, "ncclSend").code(),
            absl::StatusCode::kInternal);
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
