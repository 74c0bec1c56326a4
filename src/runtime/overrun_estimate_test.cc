#include "runtime/overrun_estimate.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shoal::runtime {
namespace {

TEST(OverrunEstimateTest, ZeroUntilEnoughObservations) {
  OverrunEstimate e(/*quantile=*/0.99, /*half_life=*/1000, /*min_weight=*/50);
  for (int i = 0; i < 40; ++i) e.Observe(0.3);
  e.Refresh();
  EXPECT_EQ(e.share(), 0.0);
  for (int i = 0; i < 20; ++i) e.Observe(0.3);
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.3, 1.0 / OverrunEstimate::kBucketsPerUnit);
}

TEST(OverrunEstimateTest, AnswersTheQuantileOfTheShares) {
  OverrunEstimate e(/*quantile=*/0.99, /*half_life=*/1e9, /*min_weight=*/1);
  // 1000 shares: 0.000, 0.001, ..., 0.999. The 0.99-quantile is near 0.99.
  for (int i = 0; i < 1000; ++i) e.Observe(i / 1000.0);
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.99, 0.005);
  EXPECT_NEAR(e.Quantile(0.5), 0.5, 0.005);
  EXPECT_NEAR(e.Quantile(0.9), 0.9, 0.005);
}

TEST(OverrunEstimateTest, NegativeWhenPredictionsRunEarly) {
  OverrunEstimate e(0.9, 1000, 1);
  for (int i = 0; i < 100; ++i) e.Observe(-0.2);
  e.Refresh();
  EXPECT_NEAR(e.share(), -0.2, 0.005);
}

TEST(OverrunEstimateTest, ClampsSharesToTheBudget) {
  OverrunEstimate e(0.5, 1000, 1);
  for (int i = 0; i < 10; ++i) e.Observe(7.0);
  e.Refresh();
  EXPECT_EQ(e.share(), 1.0);
}

TEST(OverrunEstimateTest, ForgetsOldObservationsByTheHalfLife) {
  OverrunEstimate e(/*quantile=*/0.99, /*half_life=*/100, /*min_weight=*/1);
  for (int i = 0; i < 1000; ++i) e.Observe(0.5);  // a slow spell
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.5, 0.005);
  // Ten half-lives of accurate predictions: the spell keeps 2^-10 of its weight, under the
  // 1% the quantile looks past.
  for (int i = 0; i < 1000; ++i) e.Observe(0.0);
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.0, 0.005);
  // After only one half-life, half the weight is still the spell's: the tail says so.
  for (int i = 0; i < 1000; ++i) e.Observe(0.5);
  for (int i = 0; i < 100; ++i) e.Observe(0.0);
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.5, 0.005);
}

TEST(OverrunEstimateTest, KeepsItsEstimateAcrossTheWeightRescale) {
  // The weights grow by 2^(1/half_life) per observation and are rescaled past 1e100: with a
  // half-life of 10 that happens every ~3300 observations.
  OverrunEstimate e(0.5, 10, 1);
  for (int i = 0; i < 20000; ++i) e.Observe(0.25);
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.25, 0.005);
  EXPECT_NEAR(e.weight(), 1.0 / (1.0 - std::exp2(-0.1)), 0.5);
}

TEST(OverrunEstimateTest, IgnoresNaN) {
  OverrunEstimate e(0.5, 1000, 1);
  e.Observe(0.1);
  e.Observe(std::nan(""));
  e.Refresh();
  EXPECT_NEAR(e.share(), 0.1, 0.005);
  EXPECT_NEAR(e.weight(), 1.0, 1e-9);
}

}  // namespace
}  // namespace shoal::runtime
