#include "engine/cuda/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/conv.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

std::vector<float> Random(size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(QuantizeTest, TheScaleCoversTheLargerEndOfTheRange) {
  EXPECT_FLOAT_EQ(SymmetricScale(-2.f, 1.f), 2.f / 127.f);
  EXPECT_FLOAT_EQ(SymmetricScale(0.f, 6.35f), 6.35f / 127.f);
  // Nothing to quantise with.
  EXPECT_EQ(SymmetricScale(0.f, 0.f), 0.f);
  EXPECT_EQ(SymmetricScale(-INFINITY, 1.f), 0.f);
  EXPECT_EQ(SymmetricScale(std::nanf(""), 1.f), 0.f);
  // So small its inverse is not finite.
  EXPECT_EQ(SymmetricScale(0.f, std::numeric_limits<float>::denorm_min()), 0.f);
}

TEST(QuantizeTest, ValuesRoundHalfToEvenAndClampSymmetrically) {
  EXPECT_EQ(QuantizeValue(0.5f, 1.f), 0);
  EXPECT_EQ(QuantizeValue(1.5f, 1.f), 2);
  EXPECT_EQ(QuantizeValue(-2.5f, 1.f), -2);
  EXPECT_EQ(QuantizeValue(0.26f, 10.f), 3);
  EXPECT_EQ(QuantizeValue(1000.f, 1.f), 127);
  EXPECT_EQ(QuantizeValue(-1000.f, 1.f), -127);  // never -128: the range is symmetric
  EXPECT_EQ(QuantizeValue(std::nanf(""), 1.f), -127);
  EXPECT_EQ(QuantizeValue(INFINITY, 1.f), 127);
  // With zero point -128 (a range that never went negative): [0, 255] shifted into s8.
  EXPECT_EQ(QuantizeValue(0.f, 1.f, -128), -128);
  EXPECT_EQ(QuantizeValue(127.5f, 1.f, -128), 0);  // 128 (to even), less 128
  EXPECT_EQ(QuantizeValue(255.f, 1.f, -128), 127);
  EXPECT_EQ(QuantizeValue(1000.f, 1.f, -128), 127);
  EXPECT_EQ(QuantizeValue(-3.f, 1.f, -128), -128);  // below the range: its 0
  EXPECT_EQ(QuantizeValue(std::nanf(""), 1.f, -128), -128);
}

TEST(QuantizeTest, AnInputThatNeverWentNegativeGetsAllEightBits) {
  const Int8Input relu = Int8InputFor(0.f, 5.1f);
  EXPECT_EQ(relu.zero_point, -128);
  EXPECT_FLOAT_EQ(relu.scale, 5.1f / 255.f);
  EXPECT_FLOAT_EQ(relu.inv_scale, 255.f / 5.1f);
  const Int8Input both = Int8InputFor(-0.1f, 5.1f);
  EXPECT_EQ(both.zero_point, 0);
  EXPECT_FLOAT_EQ(both.scale, 5.1f / 127.f);
  // Nothing to quantise with.
  EXPECT_EQ(Int8InputFor(0.f, 0.f).scale, 0.f);
  EXPECT_EQ(Int8InputFor(0.f, INFINITY).scale, 0.f);
  EXPECT_EQ(Int8InputFor(-1.f, std::nanf("")).scale, 0.f);
}

TEST(QuantizeTest, TheBiasTakesOutTheZeroPointsShareOfTheSums) {
  // Two columns of k = 3: sums 6 and -2.
  QuantizedWeight w;
  w.values = Tensor::FromVector(DataType::kInt8, {2, 3}, std::vector<int8_t>{1, 2, 3, -4, 0, 2});
  const std::vector<float> scale = {0.5f, 0.25f}, bias = {1.f, -1.f};
  EXPECT_TRUE(Int8Bias(w, scale, 0, nullptr).empty());
  EXPECT_EQ(Int8Bias(w, scale, 0, bias.data()), bias);
  // bias - scale * (-128) * sum.
  EXPECT_EQ(Int8Bias(w, scale, -128, bias.data()),
            (std::vector<float>{1.f + 0.5f * 128 * 6, -1.f + 0.25f * 128 * -2}));
  EXPECT_EQ(Int8Bias(w, scale, -128, nullptr),
            (std::vector<float>{0.5f * 128 * 6, 0.25f * 128 * -2}));
}

TEST(QuantizeTest, WeightsQuantisePerOutputColumnInEitherLayout) {
  // W [k = 3, n = 4]: column 1 all zeros, column 3 with its largest magnitude negative.
  const std::vector<float> kn = {0.5f,   0.f, -1.f,  2.f,   //
                                 -0.25f, 0.f, 0.5f,  -4.f,  //
                                 1.f,    0.f, 0.25f, 1.f};
  std::vector<float> nk(12);
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 4; ++j) nk[j * 3 + k] = kn[k * 4 + j];
  const QuantizedWeight a =
      QuantizeWeightColumns(Tensor::FromVector(DataType::kFp32, {3, 4}, kn), false);
  const QuantizedWeight b =
      QuantizeWeightColumns(Tensor::FromVector(DataType::kFp32, {4, 3}, nk), true);
  ASSERT_EQ(a.values.shape(), (Shape{4, 3}));
  ASSERT_EQ(b.values.shape(), (Shape{4, 3}));
  const auto av = a.values.values<int8_t>(), bv = b.values.values<int8_t>();
  EXPECT_EQ(std::vector<int8_t>(av.begin(), av.end()), std::vector<int8_t>(bv.begin(), bv.end()));
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_FLOAT_EQ(a.scales[0], 1.f / 127.f);
  EXPECT_EQ(a.scales[1], 1.f);  // a column of zeros
  EXPECT_FLOAT_EQ(a.scales[3], 4.f / 127.f);
  // Column 0: 0.5, -0.25, 1 over 1/127; column 3: 2, -4, 1 over 4/127.
  EXPECT_EQ(av[0], 64);  // 63.5 to even
  EXPECT_EQ(av[1], -32);
  EXPECT_EQ(av[2], 127);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(av[i], 0);
  EXPECT_EQ(av[9], 64);  // 63.5
  EXPECT_EQ(av[10], -127);
  EXPECT_EQ(av[11], 32);  // 31.75
}

TEST(QuantizeTest, AConvolutionsWeightIsItsOutputChannelsByTheRest) {
  // [m = 2, c = 2, kh = 1, kw = 2]: each output channel's four values one row.
  const std::vector<float> w = {1, 2, 3, 4, -8, 0, 0, 2};
  const QuantizedWeight q =
      QuantizeWeightColumns(Tensor::FromVector(DataType::kFp32, {2, 2, 1, 2}, w), true);
  ASSERT_EQ(q.values.shape(), (Shape{2, 4}));
  const auto v = q.values.values<int8_t>();
  EXPECT_EQ(std::vector<int8_t>(v.begin(), v.end()),
            (std::vector<int8_t>{32, 64, 95, 127, -127, 0, 0, 32}));
}

// The int8 product stays within the error its roundings allow of the fp32 product: each
// term x·w is off by at most |x|·(sw/2) + |w|·(sx/2) + (sx/2)·(sw/2). On an input that went
// negative (symmetric), and on one that never did (zero point -128), whose sx is half: x
// uniform in [lo, hi), quantised for a calibrated range [range_lo, hi]. Returns the largest
// error of the product without bias or ReLU.
double ExpectProductWithinRounding(float lo, float hi, float range_lo) {
  SCOPED_TRACE(testing::Message() << "x in [" << lo << ", " << hi << "), range from " << range_lo);
  const int64_t m = 5, n = 8, k = 64;
  const std::vector<float> x = Random(m * k, 1, lo, hi), w = Random(k * n, 2), bias = Random(n, 3);
  const Int8Input in = Int8InputFor(range_lo, hi);
  const float sx = in.scale;
  const QuantizedWeight q =
      QuantizeWeightColumns(Tensor::FromVector(DataType::kFp32, {k, n}, w), false);
  std::vector<float> scale(n);
  for (int64_t j = 0; j < n; ++j) scale[j] = sx * q.scales[j];
  const std::vector<float> shifted = Int8Bias(q, scale, in.zero_point, bias.data());
  for (bool relu : {false, true}) {
    const std::vector<float> y = Int8ProductReference(x, m, k, in, q, scale, shifted.data(), relu);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = bias[j], bound = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double xv = x[i * k + p], wv = w[p * n + j];
          exact += xv * wv;
          bound += std::fabs(xv) * q.scales[j] / 2 + std::fabs(wv) * sx / 2 + sx * q.scales[j] / 4;
        }
        if (relu) exact = std::max(exact, 0.0);
        EXPECT_NEAR(y[i * n + j], exact, bound * 1.001 + 1e-5) << i << "," << j;
      }
    }
  }
  // Rounding shows: some element differs from fp32's by more than fp32's own error.
  const std::vector<float> unbiased = Int8Bias(q, scale, in.zero_point, nullptr);
  const std::vector<float> y = Int8ProductReference(
      x, m, k, in, q, scale, unbiased.empty() ? nullptr : unbiased.data(), false);
  double largest = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0;
      for (int64_t p = 0; p < k; ++p) exact += double{x[i * k + p]} * w[p * n + j];
      largest = std::max(largest, std::fabs(y[i * n + j] - exact));
    }
  EXPECT_GT(largest, 1e-4);
  return largest;
}

TEST(QuantizeTest, TheProductStaysWithinItsRoundingOfFp32) {
  ExpectProductWithinRounding(-3.f, 3.f, -3.f);
  // A ReLU's output: the zero point's 256 levels halve the input's rounding. The same values
  // with a range reaching -3 are quantised symmetrically, for comparison.
  const double unsigned_error = ExpectProductWithinRounding(0.f, 3.f, 0.f);
  EXPECT_LT(unsigned_error, ExpectProductWithinRounding(0.f, 3.f, -3.f));
}

TEST(QuantizeTest, LaunchersRefuseBadScalesAndSizesBeforeTouchingTheDevice) {
  EXPECT_EQ(QuantizeInt8(nullptr, nullptr, 4, 0.f, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeInt8(nullptr, nullptr, 4, INFINITY, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeInt8(nullptr, nullptr, -1, 1.f, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeInt8(nullptr, nullptr, 4, 1.f, -127, nullptr).code(),
            StatusCode::kInvalidArgument);
  Window2d g;
  g.n = 1;
  g.c = 3;
  g.h = g.w = 4;
  g.oh = g.ow = 4;
  EXPECT_EQ(Im2ColInt8(nullptr, nullptr, g, std::nanf(""), 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Im2ColInt8(nullptr, nullptr, g, 1.f, 128, nullptr).code(),
            StatusCode::kInvalidArgument);
  g.groups = 2;  // does not divide 3 channels
  EXPECT_EQ(Im2ColInt8(nullptr, nullptr, g, 1.f, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeInt8(nullptr, nullptr, nullptr, nullptr, 2, 3, false, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeInt8(nullptr, nullptr, nullptr, nullptr, -1, 3, false, nullptr).code(),
            StatusCode::kInvalidArgument);
  // With scales: no output at all, an int8 output's bad quantisation, outputs over the sums
  // or each other (in `mem`, bytes: sums [0, 24), y [64, 88), q [128, 134)).
  alignas(16) static char mem[256];
  const auto* acc = reinterpret_cast<const int32_t*>(mem);
  const auto* scale = reinterpret_cast<const float*>(mem + 192);
  auto* y = reinterpret_cast<float*>(mem + 64);
  EXPECT_EQ(DequantizeInt8(acc, scale, nullptr, nullptr, 2, 3, false, nullptr).code(),
            StatusCode::kInvalidArgument);
  Int8Output q{reinterpret_cast<int8_t*>(mem + 128), 0.f, 0};
  EXPECT_EQ(DequantizeInt8(acc, scale, nullptr, y, 2, 3, false, nullptr, q).code(),
            StatusCode::kInvalidArgument);
  q.inv_scale = 2.f;
  q.zero_point = 5;
  EXPECT_EQ(DequantizeInt8(acc, scale, nullptr, y, 2, 3, false, nullptr, q).code(),
            StatusCode::kInvalidArgument);
  q.zero_point = -128;
  for (char* at : {mem + 8, mem + 80}) {
    Int8Output over = q;
    over.values = reinterpret_cast<int8_t*>(at);
    const Status s = DequantizeInt8(acc, scale, nullptr, y, 2, 3, false, nullptr, over);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.ToString();
  }
  g.groups = 1;
  EXPECT_EQ(Im2ColFromInt8(nullptr, nullptr, g, 1, nullptr).code(), StatusCode::kInvalidArgument);
  g.groups = 2;
  EXPECT_EQ(Im2ColFromInt8(nullptr, nullptr, g, 0, nullptr).code(), StatusCode::kInvalidArgument);
}

class QuantizeGpuTest : public GpuTest {};

TEST_F(QuantizeGpuTest, QuantisingMatchesTheHostBitForBit) {
  std::vector<float> x = Random(10000, 4, -2.f, 2.f);
  // Halves (real ties: over 64, a power of two, v / 64 * 64 is v again), the clamps, NaN
  // and infinities among them; the inverse scale below is 64.
  for (float v : {0.5f, 1.5f, -2.5f, 126.5f, -127.5f, 1e9f, -1e9f, std::nanf(""), INFINITY})
    x.push_back(v / 64.f);
  for (float v : {254.5f, 255.5f, 0.5f}) x.push_back(v / 64.f);  // zero point -128's ends
  DeviceBuffer dx = Upload(x);
  auto dq = DeviceBuffer::Allocate(x.size());
  ASSERT_TRUE(dq.ok());
  for (int zero_point : {0, -128}) {
    SCOPED_TRACE(zero_point);
    ASSERT_TRUE(QuantizeInt8(dx.as<float>(), dq->as<int8_t>(), static_cast<int64_t>(x.size()), 64.f,
                             zero_point, stream())
                    .ok());
    std::vector<int8_t> q(x.size());
    DownloadBytes(*dq, q.data(), q.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(q[i], QuantizeValue(x[i], 64.f, zero_point)) << "at " << i;
  }
}

TEST_F(QuantizeGpuTest, Im2ColQuantisesTheColumnsItGathers) {
  Window2d g;
  g.n = 2;
  g.c = 4;
  g.h = 5;
  g.w = 6;
  g.kh = g.kw = 3;
  g.sh = 2;
  g.ph = g.pw = g.ph_end = g.pw_end = 1;
  g.oh = (g.h + 2 - 3) / 2 + 1;
  g.ow = g.w;
  const std::vector<float> x = Random(g.n * g.c * g.h * g.w, 5, -4.f, 4.f);
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  DeviceBuffer dx = Upload(x), fp32 = Floats(total);
  auto dq = DeviceBuffer::Allocate(total);
  ASSERT_TRUE(dq.ok());
  // The fp32 columns (conv_test checks them against the reference), each quantised.
  ASSERT_TRUE(Im2Col(dx.as<float>(), fp32.as<float>(), g, stream()).ok());
  const std::vector<float> cols = Download(fp32, total);
  // Symmetric, and with zero point -128, whose padding is -128 (its 0).
  for (int zero_point : {0, -128}) {
    SCOPED_TRACE(zero_point);
    ASSERT_TRUE(
        Im2ColInt8(dx.as<float>(), dq->as<int8_t>(), g, 127.f / 4.f, zero_point, stream()).ok());
    std::vector<int8_t> q(total);
    DownloadBytes(*dq, q.data(), q.size());
    for (int64_t i = 0; i < total; ++i)
      ASSERT_EQ(q[i], QuantizeValue(cols[i], 127.f / 4.f, zero_point)) << "at " << i;
  }
}

// An int8 convolution reading another's int8 output gathers it: the same columns, bit for
// bit, as quantising while gathering from the fp32 values, the padding's zero point
// included.
TEST_F(QuantizeGpuTest, Im2ColFromInt8GathersWhatQuantisingWhileGatheringWouldMake) {
  Window2d g;
  g.n = 2;
  g.c = 4;
  g.h = 5;
  g.w = 6;
  g.kh = g.kw = 3;
  g.sw = 2;
  g.dh = 2;
  g.ph = g.pw = g.ph_end = g.pw_end = 2;
  g.oh = (g.h + 4 - 5) / 1 + 1;
  g.ow = (g.w + 4 - 3) / 2 + 1;
  const std::vector<float> x = Random(g.n * g.c * g.h * g.w, 8, 0.f, 4.f);
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  DeviceBuffer dx = Upload(x);
  auto xq = DeviceBuffer::Allocate(x.size());
  auto gathered = DeviceBuffer::Allocate(total);
  auto quantised = DeviceBuffer::Allocate(total);
  ASSERT_TRUE(xq.ok() && gathered.ok() && quantised.ok());
  for (int zero_point : {0, -128}) {
    SCOPED_TRACE(zero_point);
    const float inv_scale = zero_point == 0 ? 127.f / 4.f : 255.f / 4.f;
    ASSERT_TRUE(QuantizeInt8(dx.as<float>(), xq->as<int8_t>(), static_cast<int64_t>(x.size()),
                             inv_scale, zero_point, stream())
                    .ok());
    ASSERT_TRUE(
        Im2ColFromInt8(xq->as<int8_t>(), gathered->as<int8_t>(), g, zero_point, stream()).ok());
    ASSERT_TRUE(
        Im2ColInt8(dx.as<float>(), quantised->as<int8_t>(), g, inv_scale, zero_point, stream())
            .ok());
    std::vector<int8_t> a(total), b(total);
    DownloadBytes(*gathered, a.data(), a.size());
    DownloadBytes(*quantised, b.data(), b.size());
    EXPECT_EQ(a, b);
    EXPECT_NE(std::count(a.begin(), a.end(), static_cast<int8_t>(zero_point)), 0)
        << "the padding is in the columns";
  }
}

// Scaling into fp32 and writing the int8 copy the next product reads, in one pass: the copy
// is the quantisation of the fp32 values written, with them or alone.
TEST_F(QuantizeGpuTest, DequantisingWritesItsInt8CopyWithOrWithoutFp32) {
  const int64_t rows = 33, n = 12;
  std::vector<int32_t> acc(rows * n);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<int32_t>(i * 7919 % 20001) - 10000;
  const std::vector<float> scale = Random(n, 6, 0.001f, 0.01f), bias = Random(n, 7);
  DeviceBuffer da = UploadBytes(acc.data(), acc.size() * 4), ds = Upload(scale), db = Upload(bias),
               dy = Floats(rows * n);
  auto dq = DeviceBuffer::Allocate(rows * n), alone = DeviceBuffer::Allocate(rows * n);
  ASSERT_TRUE(dq.ok() && alone.ok());
  const Int8Output q{dq->as<int8_t>(), 127.f / 100.f, -128};
  ASSERT_TRUE(DequantizeInt8(da.as<int32_t>(), ds.as<float>(), db.as<float>(), dy.as<float>(), rows,
                             n, true, stream(), q)
                  .ok());
  Int8Output only = q;
  only.values = alone->as<int8_t>();
  ASSERT_TRUE(DequantizeInt8(da.as<int32_t>(), ds.as<float>(), db.as<float>(), nullptr, rows, n,
                             true, stream(), only)
                  .ok());
  const std::vector<float> y = Download(dy, rows * n);
  std::vector<int8_t> with(rows * n), without(rows * n);
  DownloadBytes(*dq, with.data(), with.size());
  DownloadBytes(*alone, without.data(), without.size());
  for (int64_t i = 0; i < rows * n; ++i)
    ASSERT_EQ(with[i], QuantizeValue(y[i], q.inv_scale, q.zero_point)) << "at " << i;
  EXPECT_EQ(without, with);
}

TEST_F(QuantizeGpuTest, DequantisingScalesEachColumnAddsItsBiasAndAppliesReLU) {
  const int64_t rows = 33, n = 12;
  std::vector<int32_t> acc(rows * n);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<int32_t>(i * 7919 % 20001) - 10000;
  const std::vector<float> scale = Random(n, 6, 0.001f, 0.01f), bias = Random(n, 7);
  DeviceBuffer da = UploadBytes(acc.data(), acc.size() * 4), ds = Upload(scale), db = Upload(bias),
               dy = Floats(rows * n);
  for (bool with_bias : {false, true}) {
    for (bool relu : {false, true}) {
      SCOPED_TRACE(testing::Message() << "bias " << with_bias << " relu " << relu);
      ASSERT_TRUE(DequantizeInt8(da.as<int32_t>(), ds.as<float>(),
                                 with_bias ? db.as<float>() : nullptr, dy.as<float>(), rows, n,
                                 relu, stream())
                      .ok());
      const std::vector<float> y = Download(dy, rows * n);
      for (int64_t i = 0; i < rows * n; ++i) {
        const double product = double{static_cast<float>(acc[i])} * scale[i % n];
        double want = product + (with_bias ? bias[i % n] : 0.f);
        if (relu && want < 0) want = 0;
        // The device may fuse the multiply and the add: within fp32's rounding of each.
        ASSERT_NEAR(y[i], want, 1e-6 * (std::fabs(product) + std::fabs(bias[i % n])) + 1e-12)
            << "at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace shoal::engine::cuda
