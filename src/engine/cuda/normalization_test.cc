#include "engine/cuda/normalization.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/quantize.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

TEST(LayerNormShapeTest, RefusesBadArgumentsBeforeTouchingTheDevice) {
  EXPECT_EQ(
      LayerNormLastAxis(nullptr, nullptr, nullptr, nullptr, std::vector<int64_t>{}, 1e-5f, nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerNormLastAxis(nullptr, nullptr, nullptr, nullptr, std::vector<int64_t>{2, 3}, 0.f,
                              nullptr)
                .code(),
            StatusCode::kInvalidArgument);
}

using LayerNormGpuTest = GpuTest;

TEST_F(LayerNormGpuTest, MatchesTheReferenceWithAndWithoutBiasAndAFarOffMean) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{2, 128, 768}, {3, 5}, {1, 1000}}) {
    const int64_t cols = dims.back();
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < dims.size(); ++d) rows *= dims[d];
    std::vector<float> x(rows * cols), scale(cols), bias(cols);
    // A mean of 1000 and a spread of 1: a one-pass sum of squares would lose the variance.
    for (float& v : x) v = 1000.f + dist(gen);
    for (float& v : scale) v = 1.f + 0.5f * dist(gen);
    for (float& v : bias) v = dist(gen);
    for (const bool with_bias : {true, false}) {
      DeviceBuffer dx = Upload(x), ds = Upload(scale), db = Upload(bias), dy = Floats(x.size());
      ASSERT_TRUE(LayerNormLastAxis(dx.as<float>(), ds.as<float>(),
                                    with_bias ? db.as<float>() : nullptr, dy.as<float>(), dims,
                                    1e-5f, stream())
                      .ok());
      const std::vector<float> y = Download(dy, x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
        mean /= cols;
        for (int64_t c = 0; c < cols; ++c)
          var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
        var /= cols;
        for (int64_t c = 0; c < cols; ++c) {
          const double want = (x[r * cols + c] - mean) / std::sqrt(var + 1e-5) * scale[c] +
                              (with_bias ? bias[c] : 0.0);
          // fp32 values near 1000 carry ~6e-5 of rounding each, over a spread of ~0.6.
          ASSERT_NEAR(y[r * cols + c], want, 2e-3) << "row " << r << " col " << c;
        }
      }
      // Again with a 16-bit output beside y, in each type: y's values rounded, bit for bit,
      // and y as before.
      for (const HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
        DeviceBuffer dh = Floats((x.size() + 1) / 2), dy2 = Floats(x.size());
        ASSERT_TRUE(LayerNormLastAxis(dx.as<float>(), ds.as<float>(),
                                      with_bias ? db.as<float>() : nullptr, dy2.as<float>(), dims,
                                      1e-5f, stream(), dh.data(), type)
                        .ok());
        EXPECT_EQ(Download(dy2, x.size()), y);
        std::vector<uint16_t> bits(x.size());
        DownloadBytes(dh, bits.data(), bits.size() * 2);
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(bits[i], type == HalfType::kFp16 ? FloatToFp16(y[i]) : FloatToBf16(y[i]))
              << "at " << i;
        }
      }
    }
  }
}

// An int8 plan's layer normalisation writes its result's int8 copy for the products after
// it (BERT's query, key and value read one): bit for bit the host's quantisation of the
// fp32 it writes.
TEST_F(LayerNormGpuTest, AlsoWritesItsResultsInt8Copy) {
  const int64_t rows = 128, cols = 768;
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(rows * cols), scale(cols), bias(cols);
  for (float& v : x) v = dist(gen) * 3.f;
  for (float& v : scale) v = 1.f + 0.5f * dist(gen);
  for (float& v : bias) v = dist(gen);
  DeviceBuffer dx = Upload(x), ds = Upload(scale), db = Upload(bias), dy = Floats(rows * cols);
  auto dq = DeviceBuffer::Allocate(rows * cols);
  ASSERT_TRUE(dq.ok());
  const RoundTo to = RoundTo::Int8(127.f / 4.f, 0);
  ASSERT_TRUE(LayerNormLastAxis(dx.as<float>(), ds.as<float>(), db.as<float>(), dy.as<float>(),
                                std::vector<int64_t>{rows, cols}, 1e-5f, stream(), dq->data(), to)
                  .ok());
  const std::vector<float> y = Download(dy, rows * cols);
  std::vector<int8_t> q(rows * cols);
  DownloadBytes(*dq, q.data(), q.size());
  for (int64_t i = 0; i < rows * cols; ++i)
    ASSERT_EQ(q[i], QuantizeValue(y[i], to.inv_scale, 0)) << "at " << i;
}

TEST(LayerNormShapeTest, RefusesA16BitOutputOverlappingXOrY) {
  alignas(16) static float buffer[64];
  const std::vector<int64_t> dims = {2, 8};  // 16 values
  for (void* half : {static_cast<void*>(buffer + 4), static_cast<void*>(buffer + 40)}) {
    const Status s = LayerNormLastAxis(buffer, buffer, nullptr, buffer + 32, dims, 1e-5f, nullptr,
                                       half, HalfType::kFp16);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("overlaps x or y"), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace shoal::engine::cuda
