#include "server/agent/copier/cuda/cuda_copier.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "common/gpu/gpu_info.h"
#include "gtest/gtest.h"
#include "server/agent/transport/nccl/nccl_transport.h"

namespace cairn::agent {
namespace {

TEST(CudaCopierTest, CreateWithoutDeviceIsFailedPrecondition) {
  absl::StatusOr<int> n = gpu::DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n > 0) GTEST_SKIP() << "host has a CUDA device";
  EXPECT_EQ(CudaCopier::Create(0).status().code(),
            absl::StatusCode::kFailedPrecondition);
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

TEST(NcclTransportTest, CreateWithoutDeviceIsFailedPrecondition) {
  absl::StatusOr<int> n = gpu::DeviceCount();
  ASSERT_TRUE(n.ok());
  if (*n > 0) GTEST_SKIP() << "host has a CUDA device";
  TcpTransportOptions o;
  o.node_id = 0;
  o.num_nodes = 1;
  o.resolve_peer = [](int) -> absl::StatusOr<std::string> {
    return absl::NotFoundError("none");
  };
  auto control = TcpTransport::Start(o);
  ASSERT_TRUE(control.ok());
  EXPECT_EQ(NcclTransport::Create(control->get(), 1, 0, absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cairn::agent
