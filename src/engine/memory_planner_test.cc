#include "engine/memory_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

namespace shoal::engine {
namespace {

// Checks the plan's contract against the input; returns the number of violations.
int CountViolations(const std::vector<TensorLifetime>& tensors, const MemoryPlan& plan) {
  int bad = 0;
  const int n = static_cast<int>(tensors.size());
  EXPECT_EQ(plan.offsets.size(), tensors.size());
  EXPECT_EQ(plan.arena_bytes % kArenaAlignment, 0);
  EXPECT_GE(plan.arena_bytes, plan.liveness_bound_bytes);
  EXPECT_LE(plan.arena_bytes, plan.no_reuse_bytes);
  for (int i = 0; i < n; ++i) {
    const int64_t off = plan.offsets[i];
    if (off < 0 || off % kArenaAlignment != 0 || off + tensors[i].bytes > plan.arena_bytes) {
      ADD_FAILURE() << "tensor " << i << " at " << off << " (" << tensors[i].bytes
                    << " bytes) in an arena of " << plan.arena_bytes;
      ++bad;
    }
  }
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      const TensorLifetime& x = tensors[a];
      const TensorLifetime& y = tensors[b];
      if (x.bytes == 0 || y.bytes == 0) continue;
      const bool live_together = x.first <= y.last && y.first <= x.last;
      const bool share_bytes = plan.offsets[a] < plan.offsets[b] + y.bytes &&
                               plan.offsets[b] < plan.offsets[a] + x.bytes;
      if (!live_together || !share_bytes) continue;
      // Allowed only along a granted in-place chain.
      auto chained = [&](int t, int s) {
        for (int k = plan.inplace_of[t]; k >= 0; k = plan.inplace_of[k])
          if (k == s) return true;
        return false;
      };
      if (chained(a, b) || chained(b, a)) continue;
      ADD_FAILURE() << "tensors " << a << " and " << b << " share bytes while both live";
      ++bad;
    }
  }
  return bad;
}

TEST(MemoryPlannerTest, RandomLifetimesNeverShareBytesWhileBothLive) {
  double worst = 1, total_ratio = 0;
  int cases = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const int n = 1 + static_cast<int>(rng() % 60);
    const int steps = 1 + static_cast<int>(rng() % 40);
    std::vector<TensorLifetime> tensors(n);
    for (auto& t : tensors) {
      t.first = static_cast<int>(rng() % steps);
      t.last = t.first + static_cast<int>(rng() % 8);
      // Mostly small, some large, some zero, sizes not multiples of 64.
      const uint32_t kind = rng() % 10;
      t.bytes = kind == 0 ? 0 : kind < 8 ? 1 + rng() % 5000 : 1 + rng() % 200000;
    }
    auto plan = PlanMemory(tensors);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    SCOPED_TRACE("seed " + std::to_string(seed));
    ASSERT_EQ(CountViolations(tensors, *plan), 0);
    if (plan->liveness_bound_bytes > 0) {
      const double ratio =
          static_cast<double>(plan->arena_bytes) / static_cast<double>(plan->liveness_bound_bytes);
      worst = std::max(worst, ratio);
      total_ratio += ratio;
      ++cases;
    }
  }
  std::printf("random lifetimes: %d cases, planned/bound mean %.3f, worst %.3f\n", cases,
              total_ratio / cases, worst);
}

TEST(MemoryPlannerTest, RandomInplaceRequestsAreHonouredOnlyWhenLegal) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    const int n = 2 + static_cast<int>(rng() % 40);
    std::vector<TensorLifetime> tensors(n);
    for (int i = 0; i < n; ++i) {
      tensors[i].first = i;  // one tensor defined per step, like a plan
      tensors[i].last = i + static_cast<int>(rng() % 4);
      tensors[i].bytes = 64 * (1 + rng() % 8) - static_cast<int>(rng() % 64);
    }
    std::vector<InplaceRequest> requests;
    for (int i = 1; i < n; ++i) {
      if (rng() % 2) requests.push_back({i, static_cast<int>(rng() % i)});
    }
    auto plan = PlanMemory(tensors, requests);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    SCOPED_TRACE("seed " + std::to_string(seed));
    ASSERT_EQ(CountViolations(tensors, *plan), 0);
    int granted = 0;
    for (int t = 0; t < n; ++t) {
      const int s = plan->inplace_of[t];
      if (s < 0) continue;
      ++granted;
      EXPECT_EQ(tensors[s].last, tensors[t].first);
      EXPECT_LE(ArenaAlignedBytes(tensors[t].bytes), ArenaAlignedBytes(tensors[s].bytes));
      EXPECT_EQ(plan->offsets[t], plan->offsets[s]);
    }
    EXPECT_EQ(granted, plan->inplace_count);
  }
}

TEST(MemoryPlannerTest, ChainReusesTwoBuffers) {
  // A -> B -> C -> D: each read only by the next step.
  std::vector<TensorLifetime> chain;
  for (int i = 0; i < 4; ++i) chain.push_back({1000, i, i + 1});
  auto plan = PlanMemory(chain);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->arena_bytes, 2 * 1024);
  EXPECT_EQ(plan->liveness_bound_bytes, 2 * 1024);
  EXPECT_EQ(plan->no_reuse_bytes, 4 * 1024);
  EXPECT_EQ(plan->offsets[0], plan->offsets[2]);
  EXPECT_EQ(plan->offsets[1], plan->offsets[3]);
  EXPECT_NE(plan->offsets[0], plan->offsets[1]);
}

TEST(MemoryPlannerTest, InplaceChainTakesOneBuffer) {
  std::vector<TensorLifetime> chain;
  for (int i = 0; i < 4; ++i) chain.push_back({1000, i, i + 1});
  auto plan = PlanMemory(chain, {{1, 0}, {2, 1}, {3, 2}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->inplace_count, 3);
  EXPECT_EQ(plan->arena_bytes, 1024);
  EXPECT_EQ(plan->liveness_bound_bytes, 1024);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(plan->inplace_of[i], i - 1);
    EXPECT_EQ(plan->offsets[i], plan->offsets[0]);
  }
}

TEST(MemoryPlannerTest, InplaceIsRefusedWhenIllegal) {
  std::vector<TensorLifetime> t = {
      {1000, 0, 2},  // 0: still read at step 2, after 1 is defined
      {1000, 1, 3},  // 1
      {4000, 2, 3},  // 2: larger than 1... and 0
      {1000, 3, 4},  // 3
      {1000, 3, 4},  // 4: defined with 3
  };
  auto plan = PlanMemory(t, {
                                {1, 0},  // 0 is read after step 1: refused
                                {2, 0},  // 2 is larger than 0: refused
                                {3, 1},  // legal: granted
                                {4, 1},  // 1 already given to 3: refused
                                {3, 3},  // itself: refused
                                {0, 4},  // source defined after the tensor: refused
                            });
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->inplace_count, 1);
  EXPECT_EQ(plan->inplace_of, (std::vector<int>{-1, -1, -1, 1, -1}));
  EXPECT_EQ(CountViolations(t, *plan), 0);
  // A smaller tensor may take a larger one's bytes.
  auto smaller = PlanMemory({{4000, 0, 1}, {100, 1, 2}}, {{1, 0}});
  ASSERT_TRUE(smaller.ok());
  EXPECT_EQ(smaller->inplace_count, 1);
  EXPECT_EQ(smaller->arena_bytes, 4032);
}

TEST(MemoryPlannerTest, OffsetsAndSizesAreAligned) {
  auto plan = PlanMemory({{1, 0, 0}, {65, 0, 1}, {0, 0, 3}, {129, 1, 2}});
  ASSERT_TRUE(plan.ok());
  for (int64_t off : plan->offsets) EXPECT_EQ(off % kArenaAlignment, 0);
  EXPECT_EQ(plan->liveness_bound_bytes, 128 + 0 + 192);  // step 1
  EXPECT_EQ(plan->no_reuse_bytes, 64 + 128 + 0 + 192);   // every tensor, aligned
  EXPECT_EQ(plan->arena_bytes, 128 + 192);               // 0 fits beside 1, under 3
}

TEST(MemoryPlannerTest, EmptyInputPlansNothing) {
  auto plan = PlanMemory({});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->arena_bytes, 0);
  EXPECT_EQ(plan->liveness_bound_bytes, 0);
  EXPECT_TRUE(plan->offsets.empty());
}

TEST(MemoryPlannerTest, RejectsMalformedInput) {
  EXPECT_FALSE(PlanMemory({{-1, 0, 0}}).ok());
  EXPECT_FALSE(PlanMemory({{10, 3, 2}}).ok());
  EXPECT_FALSE(PlanMemory({{10, -1, 2}}).ok());
  EXPECT_FALSE(PlanMemory({{10, 0, 2}}, {{0, 5}}).ok());
}

}  // namespace
}  // namespace shoal::engine
