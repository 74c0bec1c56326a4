#include "core/clock.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvancedAndNotifies) {
  FakeClock clock(100);
  EXPECT_EQ(clock.NowNs(), 100);
  int calls = 0;
  int64_t seen = 0;
  const int id = clock.Subscribe([&] {
    ++calls;
    seen = clock.NowNs();
  });
  clock.AdvanceUs(2);
  EXPECT_EQ(clock.NowNs(), 2100);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 2100);
  clock.Unsubscribe(id);
  clock.AdvanceMs(1);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(clock.NowNs(), 1'002'100);
}

TEST(RealClockTest, IsMonotonic) {
  auto clock = Clock::Real();
  const int64_t a = clock->NowNs();
  const int64_t b = clock->NowNs();
  EXPECT_LE(a, b);
  EXPECT_FALSE(clock->is_fake());
}

}  // namespace
}  // namespace shoal
