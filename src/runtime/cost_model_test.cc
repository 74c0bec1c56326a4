#include "runtime/cost_model.h"

#include <gtest/gtest.h>

namespace shoal::runtime {
namespace {

TEST(CostModelTest, PredictsFromPriorBeforeObservations) {
  CostModel m(1000, 100);
  EXPECT_EQ(m.PredictNs(10), 2000);
}

TEST(CostModelTest, RecoversLinearCostFromSeveralSizes) {
  CostModel m(1, 1);
  for (int round = 0; round < 5; ++round) {
    for (int n : {1, 4, 8, 16, 32}) m.Observe(n, 2'000'000 + 100'000 * n);
  }
  EXPECT_NEAR(m.a_ns(), 2'000'000, 1000);
  EXPECT_NEAR(m.b_ns(), 100'000, 100);
  EXPECT_NEAR(m.PredictNs(20), 4'000'000, 2000);
}

TEST(CostModelTest, SingleSizeScalesThePrior) {
  CostModel m(1000, 100);
  m.Observe(10, 4000);  // prior says 2000 at n=10: twice as slow
  EXPECT_EQ(m.PredictNs(10), 4000);
  EXPECT_EQ(m.PredictNs(0), 2000);
}

TEST(CostModelTest, AdaptsWhenTheInstanceSlowsDown) {
  CostModel m(1, 1, 0.8);
  for (int i = 0; i < 50; ++i) m.Observe(1 + i % 4, 1000 * (1 + i % 4));
  const int64_t before = m.PredictNs(2);
  for (int i = 0; i < 50; ++i) m.Observe(1 + i % 4, 3000 * (1 + i % 4));
  EXPECT_NEAR(static_cast<double>(m.PredictNs(2)), 3.0 * before, 0.05 * 3 * before);
}

TEST(CostModelTest, AOneOffStallMovesThePredictionOnlyBoundedly) {
  CostModel m(100'000, 10'000);
  for (int i = 0; i < 20; ++i) m.Observe(4, 1'000'000);  // 1 ms for 4 items
  ASSERT_NEAR(m.PredictNs(4), 1'000'000, 1000);
  m.Observe(4, 500'000'000);  // one 500 ms stall
  EXPECT_LT(m.PredictNs(4), 2'000'000) << "counted as 8 ms at most, one sample among ~20";
  // A sustained slowdown to 100 ms still shows within a few dozen runs.
  for (int i = 0; i < 40; ++i) m.Observe(4, 100'000'000);
  EXPECT_GT(m.PredictNs(4), 50'000'000);
}

TEST(CostModelTest, NeverPredictsNegative) {
  CostModel m(1, 1);
  // Time falls with size: the slope is clamped at 0.
  m.Observe(1, 1000);
  m.Observe(10, 500);
  EXPECT_GE(m.b_ns(), 0);
  EXPECT_GE(m.a_ns(), 0);
  EXPECT_GT(m.PredictNs(5), 0);
}

}  // namespace
}  // namespace shoal::runtime
