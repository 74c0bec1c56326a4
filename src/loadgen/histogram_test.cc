#include "loadgen/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace shoal::loadgen {
namespace {

// The exact nearest-rank percentile of sorted data.
int64_t ExactPercentile(const std::vector<int64_t>& sorted, double p) {
  int64_t rank = static_cast<int64_t>(std::ceil(p / 100.0 * sorted.size() - 1e-9));
  rank = std::clamp<int64_t>(rank, 1, static_cast<int64_t>(sorted.size()));
  return sorted[static_cast<size_t>(rank - 1)];
}

void ExpectWithinPrecision(const Histogram& h, std::vector<int64_t> data) {
  std::sort(data.begin(), data.end());
  for (double p : {0.0, 1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0}) {
    const int64_t exact = ExactPercentile(data, p);
    const int64_t got = h.ValueAtPercentile(p);
    EXPECT_GE(got, exact) << "p" << p;
    EXPECT_LE(static_cast<double>(got - exact), 0.001 * static_cast<double>(exact))
        << "p" << p << " exact " << exact << " got " << got;
  }
  EXPECT_EQ(h.count(), static_cast<int64_t>(data.size()));
  EXPECT_EQ(h.min(), data.front());
  EXPECT_EQ(h.max(), data.back());
}

TEST(HistogramTest, EmptyReportsZero) {
  Histogram h;
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.ValueAtPercentile(50), 0);
  EXPECT_EQ(h.max(), 0);
  EXPECT_EQ(h.mean(), 0.0);
}

TEST(HistogramTest, SmallValuesAreExact) {
  Histogram h;
  for (int64_t v = 0; v < 2048; ++v) h.Record(v);
  EXPECT_EQ(h.ValueAtPercentile(50), 1023);
  EXPECT_EQ(h.ValueAtPercentile(100), 2047);
  EXPECT_EQ(h.LowestEquivalent(1500), 1500);
  EXPECT_EQ(h.HighestEquivalent(1500), 1500);
}

TEST(HistogramTest, BucketsHoldThreeSignificantDigits) {
  Histogram h;
  for (int64_t v :
       {int64_t{3000}, int64_t{123'456}, int64_t{987'654'321}, int64_t{3'000'000'000'000}}) {
    const int64_t lo = h.LowestEquivalent(v), hi = h.HighestEquivalent(v);
    EXPECT_LE(lo, v);
    EXPECT_GE(hi, v);
    EXPECT_LE(static_cast<double>(hi - lo + 1), 0.001 * static_cast<double>(lo)) << v;
  }
}

TEST(HistogramTest, UniformDataPercentilesWithinPrecision) {
  Histogram h;
  std::vector<int64_t> data;
  for (int64_t v = 1; v <= 100'000; ++v) {
    data.push_back(v * 37);
    h.Record(v * 37);
  }
  ExpectWithinPrecision(h, data);
  EXPECT_NEAR(h.mean(), 37 * 50'000.5, 1e-6);
}

TEST(HistogramTest, LogNormalLatenciesWithinPrecision) {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> dist(std::log(200'000.0), 1.0);  // ~200 us median, in ns
  Histogram h;
  std::vector<int64_t> data;
  for (int i = 0; i < 200'000; ++i) {
    const int64_t v = static_cast<int64_t>(dist(rng));
    data.push_back(v);
    h.Record(v);
  }
  ExpectWithinPrecision(h, data);
}

TEST(HistogramTest, MergeEqualsRecordingEverything) {
  std::mt19937_64 rng(7);
  std::exponential_distribution<double> dist(1.0 / 1e6);
  Histogram a, b, all;
  std::vector<int64_t> data;
  for (int i = 0; i < 50'000; ++i) {
    const int64_t v = static_cast<int64_t>(dist(rng));
    data.push_back(v);
    (i % 3 == 0 ? a : b).Record(v);
    all.Record(v);
  }
  a.Merge(b);
  ExpectWithinPrecision(a, data);
  for (double p : {50.0, 99.0, 99.9}) EXPECT_EQ(a.ValueAtPercentile(p), all.ValueAtPercentile(p));
  EXPECT_DOUBLE_EQ(a.mean(), all.mean());
}

TEST(HistogramTest, CountAtOrBelow) {
  Histogram h;
  for (int64_t v = 1; v <= 1000; ++v) h.Record(v * 1000);  // 1 us .. 1 ms in ns
  EXPECT_EQ(h.CountAtOrBelow(0), 0);
  EXPECT_EQ(h.CountAtOrBelow(500'000), 500);
  EXPECT_EQ(h.CountAtOrBelow(1'000'000), 1000);
  EXPECT_EQ(h.CountAtOrBelow(h.highest_trackable_value()), 1000);
}

TEST(HistogramTest, RecordWithCountAndClampAndReset) {
  Histogram h(1'000'000);
  h.Record(10, 99);
  h.Record(5'000'000);  // above the range: clamped
  EXPECT_EQ(h.count(), 100);
  EXPECT_EQ(h.clamped_count(), 1);
  EXPECT_EQ(h.ValueAtPercentile(99), 10);
  EXPECT_EQ(h.ValueAtPercentile(100), h.highest_trackable_value());
  h.Record(-5);
  EXPECT_EQ(h.min(), 0);
  h.Reset();
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.clamped_count(), 0);
  EXPECT_EQ(h.ValueAtPercentile(50), 0);
}

}  // namespace
}  // namespace shoal::loadgen
