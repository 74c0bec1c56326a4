#include "worker/policy.h"

#include <gtest/gtest.h>

namespace shoal::worker {
namespace {

TEST(Decide, SuccessIsAnswered) {
  EXPECT_EQ(Decide(StatusCode::kOk, 1, 0, 5), Disposition::kAnswer);
  // Even on the last allowed delivery.
  EXPECT_EQ(Decide(StatusCode::kOk, 5, 0, 5), Disposition::kAnswer);
}

TEST(Decide, RequestsThatCanNeverSucceedAreDeadLettered) {
  for (StatusCode c :
       {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kFailedPrecondition,
        StatusCode::kUnimplemented, StatusCode::kAlreadyExists}) {
    EXPECT_EQ(Decide(c, 1, 0, 5), Disposition::kDeadLetter) << StatusCodeName(c);
  }
}

TEST(Decide, SloRefusalsRetryHereThenCountAsTransient) {
  EXPECT_EQ(Decide(StatusCode::kResourceExhausted, 1, 0, 5), Disposition::kRetryHere);
  EXPECT_EQ(Decide(StatusCode::kDeadlineExceeded, 5, kMaxLocalRetries - 1, 5),
            Disposition::kRetryHere);
  EXPECT_EQ(Decide(StatusCode::kResourceExhausted, 1, kMaxLocalRetries, 5),
            Disposition::kRetryLater);
  EXPECT_EQ(Decide(StatusCode::kResourceExhausted, 5, kMaxLocalRetries, 5),
            Disposition::kDeadLetter);
}

TEST(Decide, TransientFailuresAreRedeliveredUntilMaxDeliveries) {
  for (StatusCode c : {StatusCode::kUnavailable, StatusCode::kCancelled, StatusCode::kInternal}) {
    EXPECT_EQ(Decide(c, 1, 0, 3), Disposition::kRetryLater) << StatusCodeName(c);
    EXPECT_EQ(Decide(c, 2, 0, 3), Disposition::kRetryLater) << StatusCodeName(c);
    EXPECT_EQ(Decide(c, 3, 0, 3), Disposition::kDeadLetter) << StatusCodeName(c);
  }
}

TEST(DeliveriesExhausted, OnlyPastTheLimit) {
  EXPECT_FALSE(DeliveriesExhausted(1, 1));
  EXPECT_TRUE(DeliveriesExhausted(2, 1));
  EXPECT_FALSE(DeliveriesExhausted(5, 5));
  EXPECT_TRUE(DeliveriesExhausted(6, 5));
}

TEST(LocalRetryDelayMs, DoublesAndIsCapped) {
  EXPECT_EQ(LocalRetryDelayMs(1), 5);
  EXPECT_EQ(LocalRetryDelayMs(2), 10);
  EXPECT_EQ(LocalRetryDelayMs(8), 640);
  EXPECT_EQ(LocalRetryDelayMs(50), 640);
}

TEST(CapacityWindow, StartsFullHalvesOnOverloadAndRegrows) {
  CapacityWindow w(64);
  EXPECT_EQ(w.limit(), 64);
  w.OnAnswered();
  EXPECT_EQ(w.limit(), 64);  // never above max
  w.OnOverloaded();
  EXPECT_EQ(w.limit(), 32);
  w.OnOverloaded();
  EXPECT_EQ(w.limit(), 16);
  // One window's worth of answers widens it by one.
  for (int i = 0; i < 15; ++i) w.OnAnswered();
  EXPECT_EQ(w.limit(), 16);
  w.OnAnswered();
  EXPECT_EQ(w.limit(), 17);
  for (int i = 0; i < 10; ++i) w.OnOverloaded();
  EXPECT_EQ(w.limit(), 1);  // never below one
  w.OnAnswered();
  EXPECT_EQ(w.limit(), 2);
}

TEST(CapacityWindow, NonPositiveMaxIsOne) {
  CapacityWindow w(0);
  EXPECT_EQ(w.limit(), 1);
  EXPECT_EQ(w.max(), 1);
}

}  // namespace
}  // namespace shoal::worker
