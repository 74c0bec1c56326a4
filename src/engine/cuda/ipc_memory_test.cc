#include "engine/cuda/ipc_memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/cuda/device.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

using ::testing::HasSubstr;

// Checked before the driver is asked: runs everywhere.
TEST(IpcMemoryTest, AHandleOfTheWrongSizeIsRefused) {
  auto opened = IpcMemory::Open(std::string(10, 'x'), 0, 64);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(),
              HasSubstr("cudaIpcMemHandle_t of " + std::to_string(sizeof(cudaIpcMemHandle_t))));
  auto opener = IpcMemoryOpener();
  ASSERT_TRUE(opener);
  EXPECT_EQ(opener("", 0, 64).status().code(), StatusCode::kInvalidArgument);
}

class IpcMemoryGpuTest : public GpuTest {};

// Opening a real handle takes a second process: e2e_gpu_test's server opens the test's.
// Here: an exported handle has the driver's size, and a GPU the machine lacks and a handle
// that names no allocation are refused.
TEST_F(IpcMemoryGpuTest, ExportedHandlesHaveTheDriversSizeAndBadOnesAreRefused) {
  auto buffer = DeviceBuffer::Allocate(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  auto handle = ExportIpcHandle(buffer->data());
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_EQ(handle->size(), sizeof(cudaIpcMemHandle_t));
  auto no_gpu = IpcMemory::Open(*handle, 4096, 64);
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_EQ(no_gpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(no_gpu.status().message(), HasSubstr("device_id 4096"));
  auto garbage = IpcMemory::Open(std::string(sizeof(cudaIpcMemHandle_t), '\0'), 0, 64);
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.status().message(), HasSubstr("cudaIpcOpenMemHandle refused the handle"));
}

}  // namespace
}  // namespace shoal::engine::cuda
