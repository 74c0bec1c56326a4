#include "engine/cuda/device.h"

#include <gtest/gtest.h>

#include <cstring>

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
  // A sticky error says the context is gone and what to do; an ordinary one does not.
  EXPECT_TRUE(ContextLost(cudaErrorIllegalAddress));
  EXPECT_TRUE(ContextLost(cudaErrorLaunchFailure));
  EXPECT_FALSE(ContextLost(cudaErrorInvalidValue));
  EXPECT_FALSE(ContextLost(cudaErrorMemoryAllocation));
  EXPECT_NE(CudaStatus(cudaErrorIllegalAddress, "kernel").message().find("restart the server"),
            std::string::npos);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").message().find("restart"), std::string::npos);
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

// Pinned memory to the device and back into other pinned memory, asynchronously on one
// stream: the path a GPU plan's staging buffer takes.
TEST_F(DeviceMemoryTest, PinnedBuffersRoundTripThroughTheDevice) {
  auto out = PinnedBuffer::Allocate(4096), back = PinnedBuffer::Allocate(4096);
  ASSERT_TRUE(out.ok() && back.ok()) << out.status().ToString() << back.status().ToString();
  for (size_t i = 0; i < 4096; ++i) out->data()[i] = static_cast<char>(i * 7);
  auto device = DeviceBuffer::Allocate(4096);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(CopyToDevice(device->data(), out->data(), 4096, *stream).ok());
  ASSERT_TRUE(CopyToHost(back->data(), device->data(), 4096, *stream).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(out->data(), back->data(), 4096), 0);
  PinnedBuffer moved = std::move(*back);
  EXPECT_EQ(moved.size_bytes(), 4096u);
  EXPECT_EQ(back->data(), nullptr);
}

TEST(DeviceTest, AnEmptyPinnedBufferNeedsNoDevice) {
  auto empty = PinnedBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size_bytes(), 0u);
}

}  // namespace
}  // namespace shoal::engine::cuda
