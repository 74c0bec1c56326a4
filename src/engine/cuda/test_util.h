// For the GPU path's tests: a fixture that skips, saying why, where there is no CUDA
// device (the build machines), and runs where there is one (bench/gpu/run.sh).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/device.h"
#include "engine/cuda/elementwise.h"

namespace shoal::engine::cuda {

// `v`, [n, channels, spatial] (NCHW), laid out channels last, [n, spatial, channels] (NHWC);
// or, with `back`, the other way.
template <typename T>
std::vector<T> ChannelsLast(const std::vector<T>& v, int64_t n, int64_t channels, int64_t spatial,
                            bool back = false) {
  std::vector<T> out(v.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t s = 0; s < spatial; ++s) {
        const int64_t nchw = (b * channels + c) * spatial + s,
                      nhwc = (b * spatial + s) * channels + c;
        if (back) {
          out[nchw] = v[nhwc];
        } else {
          out[nhwc] = v[nchw];
        }
      }
  return out;
}

// The number of elements of a tensor of shape `dims`.
inline int64_t Elements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

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
    return UploadBytes(host.data(), host.size() * sizeof(float));
  }
  // A device copy of `bytes` bytes from `host`.
  DeviceBuffer UploadBytes(const void* host, size_t bytes) {
    auto buffer = DeviceBuffer::Allocate(bytes);
    EXPECT_TRUE(buffer.ok()) << buffer.status().ToString();
    if (!buffer.ok()) return DeviceBuffer();
    EXPECT_TRUE(CopyToDevice(buffer->data(), host, bytes, *stream_).ok());
    return std::move(buffer).value();
  }
  // `bytes` bytes from `device` into `host`, after everything queued has run.
  void DownloadBytes(const DeviceBuffer& device, void* host, size_t bytes) {
    EXPECT_TRUE(CopyToHost(host, device.data(), bytes, *stream_).ok());
    const Status done = stream_->Synchronize();
    EXPECT_TRUE(done.ok()) << done.ToString();
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
    DownloadBytes(device, host.data(), n * sizeof(float));
    return host;
  }
  // Device memory for n 16-bit values, each a NaN in both types (so a value never written
  // shows).
  DeviceBuffer StaleHalves(size_t n) {
    const std::vector<uint16_t> stale(n, 0x7e00);
    return UploadBytes(stale.data(), n * 2);
  }
  // Expects `half` to hold each of `want` rounded to `type` as the host rounds it (to
  // nearest even), bit for bit.
  void ExpectRounded(const DeviceBuffer& half, const std::vector<float>& want, HalfType type) {
    std::vector<uint16_t> bits(want.size());
    DownloadBytes(half, bits.data(), bits.size() * 2);
    for (size_t i = 0; i < want.size(); ++i) {
      const uint16_t expect = type == HalfType::kFp16 ? FloatToFp16(want[i]) : FloatToBf16(want[i]);
      ASSERT_EQ(bits[i], expect) << "at " << i << " (" << want[i] << ")";
    }
  }
  // An element-wise step that also writes its result rounded, run by `run(in, out, half,
  // type)` on x, in each 16-bit type: beside its fp32 result, alone (out null), and in place
  // (in is out, holding x). Expects the rounding bit for bit `want`'s (the step's fp32 result
  // on x), and the fp32 result `want` where it writes one.
  void ExpectRoundsBesideAloneAndInPlace(
      const std::vector<float>& x, const std::vector<float>& want,
      const std::function<Status(const float* in, float* out, void* half, HalfType type)>& run) {
    DeviceBuffer dx = Upload(x);
    for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
      SCOPED_TRACE(type == HalfType::kFp16 ? "fp16" : "bf16");
      for (const std::string how : {"beside", "alone", "in place"}) {
        SCOPED_TRACE(how);
        DeviceBuffer half = StaleHalves(x.size());
        DeviceBuffer y = how == "in place" ? Upload(x) : Floats(x.size());
        const float* in = how == "in place" ? y.as<float>() : dx.as<float>();
        float* out = how == "alone" ? nullptr : y.as<float>();
        const Status ran = run(in, out, half.data(), type);
        ASSERT_TRUE(ran.ok()) << ran.ToString();
        ExpectRounded(half, want, type);
        if (out != nullptr) {
          EXPECT_EQ(Download(y, x.size()), want);
        }
      }
    }
  }

 private:
  std::optional<Stream> stream_;
};

}  // namespace shoal::engine::cuda
