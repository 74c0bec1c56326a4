#include "engine/cuda/device.h"

#include <gtest/gtest.h>

#include "engine/cuda/cuda_status.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

TEST(CudaStatusTest, MapsCudaErrorsToCodesAndSaysWhatFailed) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "anything").ok());
  const Status oom = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc of 64 bytes");
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc of 64 bytes: cudaErrorMemoryAllocation"),
            std::string::npos)
      << oom.message();
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "x").code(), StatusCode::kInternal);
}

TEST(CudaStatusTest, MapsCublasStatusesToCodes) {
  EXPECT_TRUE(CublasStatus(CUBLAS_STATUS_SUCCESS, "x").ok());
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_ALLOC_FAILED, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_NOT_SUPPORTED, "x").code(), StatusCode::kUnimplemented);
  const Status invalid = CublasStatus(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul");
  EXPECT_EQ(invalid.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.message().find("cublasLtMatmul: CUBLAS_STATUS_INVALID_VALUE"),
            std::string::npos)
      << invalid.message();
}

// Runs on every machine: with a GPU it lists it, without one it says why.
TEST(DeviceTest, ListsTheDevicesOrSaysWhyThereAreNone) {
  auto devices = ListDevices();
  if (!devices.ok()) {
    EXPECT_EQ(devices.status().code(), StatusCode::kUnavailable) << devices.status().ToString();
    EXPECT_NE(devices.status().message().find("cudaGetDeviceCount"), std::string::npos);
    return;
  }
  ASSERT_FALSE(devices->empty());
  for (size_t i = 0; i < devices->size(); ++i) {
    const DeviceInfo& d = (*devices)[i];
    EXPECT_EQ(d.index, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_major, 5);
    EXPECT_GT(d.multiprocessors, 0);
    EXPECT_GT(d.memory_bytes, 0);
    EXPECT_NE(Describe(d).find(d.name), std::string::npos);
    std::printf("device %s\n", Describe(d).c_str());
  }
}

TEST(DeviceTest, AnEmptyBufferNeedsNoDevice) {
  auto buffer = DeviceBuffer::Allocate(0);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size_bytes(), 0u);
}

using DeviceMemoryTest = GpuTest;

TEST_F(DeviceMemoryTest, CopiesRoundTripAndBuffersMove) {
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 7.f;
  DeviceBuffer a = Upload(host);
  ASSERT_EQ(a.size_bytes(), host.size() * sizeof(float));
  void* const where = a.data();
  DeviceBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(Download(b, host.size()), host);
}

TEST_F(DeviceMemoryTest, AnImpossibleAllocationIsResourceExhausted) {
  auto buffer = DeviceBuffer::Allocate(size_t{1} << 50);  // a petabyte
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), StatusCode::kResourceExhausted) << buffer.status().ToString();
}

}  // namespace
}  // namespace shoal::engine::cuda
