// For the GPU path's tests: a fixture that skips, saying why, where there is no CUDA
// device (the build machines), and runs where there is one (bench/gpu/run.sh).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "engine/cuda/device.h"

namespace shoal::engine::cuda {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto devices = ListDevices();
    if (!devices.ok()) {
      GTEST_SKIP() << "no CUDA device here (" << devices.status().ToString()
                   << "); these tests run on a GPU machine: bench/gpu/run.sh";
    }
    auto stream = Stream::Create();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    stream_.emplace(std::move(stream).value());
  }

  cudaStream_t stream() const { return stream_->get(); }

  // A device copy of `host`.
  DeviceBuffer Upload(const std::vector<float>& host) {
    auto buffer = DeviceBuffer::Allocate(host.size() * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    if (!buffer.ok()) return DeviceBuffer();
    EXPECT_TRUE(
        CopyToDevice(buffer->data(), host.data(), host.size() * sizeof(float), *stream_).ok());
    return std::move(buffer).value();
  }
  // Device memory for n floats.
  DeviceBuffer Floats(size_t n) {
    auto buffer = DeviceBuffer::Allocate(n * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    return buffer.ok() ? std::move(buffer).value() : DeviceBuffer();
  }
  // n floats from `device`, after everything queued on the stream has run.
  std::vector<float> Download(const DeviceBuffer& device, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(CopyToHost(host.data(), device.data(), n * sizeof(float), *stream_).ok());
    const Status done = stream_->Synchronize();
    EXPECT_TRUE(done.ok()) << done.ToString();
    return host;
  }

 private:
  std::optional<Stream> stream_;
};

}  // namespace shoal::engine::cuda
