#include "engine/cuda/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

// The reduction of x (dims) over axes [first, first + count), the plain way, in double.
std::vector<float> Reference(ReduceOp op, const std::vector<float>& x,
                             const std::vector<int64_t>& dims, int64_t first, int64_t count) {
  int64_t outer = 1, r = 1, inner = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(dims.size()); ++d)
    (d < first ? outer : d < first + count ? r : inner) *= dims[d];
  std::vector<float> y;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < inner; ++c) {
      double acc = op == ReduceOp::kMax    ? -INFINITY
                   : op == ReduceOp::kMin  ? INFINITY
                   : op == ReduceOp::kProd ? 1.0
                                           : 0.0;
      for (int64_t j = 0; j < r; ++j) {
        const double v = x[(o * r + j) * inner + c];
        switch (op) {
          case ReduceOp::kMax:
            acc = std::max(acc, v);
            break;
          case ReduceOp::kMin:
            acc = std::min(acc, v);
            break;
          case ReduceOp::kProd:
            acc *= v;
            break;
          case ReduceOp::kSumSquare:
          case ReduceOp::kL2:
            acc += v * v;
            break;
          default:
            acc += v;
        }
      }
      if (op == ReduceOp::kMean) acc /= static_cast<double>(r);
      if (op == ReduceOp::kL2) acc = std::sqrt(acc);
      y.push_back(static_cast<float>(acc));
    }
  }
  return y;
}

using ReduceGpuTest = GpuTest;

// Every op over the first, a middle, the last and two adjacent axes of a [3, 5, 4, 7]
// tensor of values with both signs (for the product, values near 1, so that 420 of them
// stay finite).
TEST_F(ReduceGpuTest, EveryOpOverLeadingMiddleTrailingAndAdjacentAxes) {
  const std::vector<int64_t> dims = {3, 5, 4, 7};
  std::vector<float> host(3 * 5 * 4 * 7);
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = std::sin(0.7f * static_cast<float>(i)) * static_cast<float>(i % 11);
  std::vector<float> near_one(host.size());
  for (size_t i = 0; i < host.size(); ++i)
    near_one[i] = 1.f + 0.05f * std::sin(0.7f * static_cast<float>(i));
  const std::pair<int64_t, int64_t> ranges[] = {{0, 1}, {1, 1}, {3, 1}, {1, 2}, {0, 4}};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin,
                      ReduceOp::kProd, ReduceOp::kSumSquare, ReduceOp::kL2}) {
    const std::vector<float>& values = op == ReduceOp::kProd ? near_one : host;
    DeviceBuffer x = Upload(values);
    for (auto [first, count] : ranges) {
      const std::vector<float> want = Reference(op, values, dims, first, count);
      DeviceBuffer y = Floats(want.size());
      ASSERT_TRUE(ReduceAxes(op, x.as<float>(), y.as<float>(), dims, first, count, stream()).ok());
      const std::vector<float> got = Download(y, want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-4f * std::max(1.f, std::fabs(want[i])))
            << "op " << static_cast<int>(op) << " axes " << first << "+" << count << " at " << i;
      }
    }
  }
}

// A global average pool, and a mean over a middle axis, also written rounded for the product
// after them, bit for bit the host's rounding of the fp32 result, beside it or alone.
TEST_F(ReduceGpuTest, AReductionAlsoWritesItsResultRounded) {
  const std::vector<int64_t> dims = {3, 5, 4, 7};
  std::vector<float> host(3 * 5 * 4 * 7);
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = std::sin(0.7f * static_cast<float>(i)) * static_cast<float>(i % 11) + 1.f / 3.f;
  DeviceBuffer x = Upload(host);
  for (auto [first, count] : {std::pair<int64_t, int64_t>{2, 2}, {1, 1}}) {
    const size_t n = host.size() / static_cast<size_t>(first == 2 ? 28 : 5);
    DeviceBuffer y = Floats(n);
    ASSERT_TRUE(
        ReduceAxes(ReduceOp::kMean, x.as<float>(), y.as<float>(), dims, first, count, stream())
            .ok());
    const std::vector<float> want = Download(y, n);
    for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
      for (bool alone : {false, true}) {
        SCOPED_TRACE(alone ? "alone" : "beside");
        DeviceBuffer half = StaleHalves(n), again = Floats(n);
        ASSERT_TRUE(ReduceAxes(ReduceOp::kMean, x.as<float>(), alone ? nullptr : again.as<float>(),
                               dims, first, count, stream(), half.data(), type)
                        .ok());
        ExpectRounded(half, want, type);
        if (!alone) {
          EXPECT_EQ(Download(again, n), want);
        }
      }
    }
  }
}

// ArgMax and ArgMin along each axis of a [3, 5, 4] tensor with ties (values from a small
// set), first and last index, against the plain loop.
TEST_F(ReduceGpuTest, ArgExtremesPickTheFirstOrLastExtremeAlongEachAxis) {
  const std::vector<int64_t> dims = {3, 5, 4};
  std::vector<float> host(3 * 5 * 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 7) % 5) - 2.f;
  DeviceBuffer x = Upload(host);
  for (int64_t axis = 0; axis < 3; ++axis) {
    int64_t outer = 1, r = dims[axis], inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
    for (int64_t d = axis + 1; d < 3; ++d) inner *= dims[d];
    for (bool is_max : {true, false}) {
      for (bool last : {false, true}) {
        DeviceBuffer y = UploadBytes(std::vector<int64_t>(outer * inner, -1).data(),
                                     outer * inner * sizeof(int64_t));
        ASSERT_TRUE(
            ArgExtreme(is_max, last, x.as<float>(), y.as<int64_t>(), dims, axis, stream()).ok());
        std::vector<int64_t> got(outer * inner);
        DownloadBytes(y, got.data(), got.size() * sizeof(int64_t));
        for (int64_t o = 0; o < outer; ++o) {
          for (int64_t c = 0; c < inner; ++c) {
            int64_t at = 0;
            for (int64_t j = 1; j < r; ++j) {
              const float v = host[(o * r + j) * inner + c], b = host[(o * r + at) * inner + c];
              if (is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b)) at = j;
            }
            EXPECT_EQ(got[o * inner + c], at)
                << "axis " << axis << (is_max ? " max" : " min") << (last ? " last" : " first");
          }
        }
      }
    }
  }
}

// TopK along each axis of [3, 6, 4] values with ties (small integers), largest and smallest,
// k 1 to the axis's length: values and positions as std::partial_sort orders them, equal
// values by the lower position.
TEST_F(ReduceGpuTest, TopKMatchesASortWithTiesByPosition) {
  const std::vector<int64_t> dims = {3, 6, 4};
  std::vector<float> host(72);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 7) % 5);
  DeviceBuffer x = Upload(host);
  for (int64_t axis = 0; axis < 3; ++axis) {
    int64_t outer = 1, r = dims[axis], inner = 1;
    for (int64_t d = 0; d < 3; ++d)
      (d < axis ? outer : d > axis ? inner : r) *= d == axis ? 1 : dims[d];
    for (bool largest : {true, false}) {
      for (int64_t k = 1; k <= r; ++k) {
        DeviceBuffer values = Floats(outer * k * inner);
        auto indices = DeviceBuffer::Allocate(outer * k * inner * sizeof(int64_t));
        ASSERT_TRUE(indices.ok());
        ASSERT_TRUE(TopK(x.as<float>(), values.as<float>(), indices->as<int64_t>(), dims, axis, k,
                         largest, stream())
                        .ok());
        const std::vector<float> got = Download(values, outer * k * inner);
        std::vector<int64_t> at(outer * k * inner);
        DownloadBytes(*indices, at.data(), at.size() * sizeof(int64_t));
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            const float* s = host.data() + o * r * inner + i;
            std::vector<int64_t> order(r);
            for (int64_t a = 0; a < r; ++a) order[a] = a;
            std::partial_sort(
                order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
                  if (s[a * inner] != s[b * inner])
                    return largest ? s[a * inner] > s[b * inner] : s[a * inner] < s[b * inner];
                  return a < b;
                });
            for (int64_t j = 0; j < k; ++j) {
              const int64_t p = (o * k + j) * inner + i;
              EXPECT_EQ(at[p], order[j]) << axis << " " << largest << " k " << k;
              EXPECT_EQ(got[p], s[order[j] * inner]);
            }
          }
      }
    }
  }
}

// A NaN counts as larger than every number, as the CPU engine orders it (ops/sort_scan.cc):
// the same positions, every one once.
TEST_F(ReduceGpuTest, TopKPutsNanAboveEveryNumber) {
  const std::vector<float> host = {std::nanf(""), 3, 5, std::nanf(""), 1, -INFINITY};
  const std::vector<int64_t> dims = {6};
  DeviceBuffer x = Upload(host);
  for (const auto& [largest, k, want] :
       {std::tuple{true, int64_t{3}, std::vector<int64_t>{0, 3, 2}},
        std::tuple{false, int64_t{6}, std::vector<int64_t>{5, 4, 1, 2, 0, 3}}}) {
    DeviceBuffer values = Floats(k);
    auto indices = DeviceBuffer::Allocate(k * sizeof(int64_t));
    ASSERT_TRUE(indices.ok());
    ASSERT_TRUE(TopK(x.as<float>(), values.as<float>(), indices->as<int64_t>(), dims, 0, k, largest,
                     stream())
                    .ok());
    std::vector<int64_t> at(k);
    DownloadBytes(*indices, at.data(), at.size() * sizeof(int64_t));
    EXPECT_EQ(at, want) << "largest " << largest;
  }
}

// TopK: k outside [1, 6] along axis 1, and an axis outside, refused before the device is
// touched.
TEST(ReduceShapeTest, TopKRefusesAKOrAxisOutOfRange) {
  const std::vector<int64_t> dims = {3, 6, 4};
  EXPECT_EQ(TopK(nullptr, nullptr, nullptr, dims, 1, 7, true, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TopK(nullptr, nullptr, nullptr, dims, 1, 0, true, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TopK(nullptr, nullptr, nullptr, dims, 3, 1, true, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(ReduceShapeTest, RefusesAxesOutsideTheShapeAndEmptyAxesBeforeTouchingTheDevice) {
  const std::vector<int64_t> dims = {3, 5, 4};
  EXPECT_EQ(ReduceAxes(ReduceOp::kSum, nullptr, nullptr, dims, 2, 2, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReduceAxes(ReduceOp::kSum, nullptr, nullptr, dims, 0, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
  const std::vector<int64_t> empty = {3, 0, 4};
  EXPECT_EQ(ReduceAxes(ReduceOp::kMax, nullptr, nullptr, empty, 1, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  // No output at all, or a rounding over x (60 floats) or y (12).
  alignas(16) static float buffer[128];
  EXPECT_EQ(ReduceAxes(ReduceOp::kSum, buffer, nullptr, dims, 1, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReduceAxes(ReduceOp::kSum, buffer, nullptr, dims, 1, 1, nullptr, buffer + 50).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ReduceAxes(ReduceOp::kSum, buffer, buffer + 64, dims, 1, 1, nullptr, buffer + 70).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ArgExtreme(true, false, nullptr, nullptr, std::vector<int64_t>{2, 3}, 2, nullptr).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ArgExtreme(true, false, nullptr, nullptr, std::vector<int64_t>{2, 0}, 1, nullptr).code(),
      StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::engine::cuda
