#include "server/status_map.h"

#include <gtest/gtest.h>

namespace shoal::server {
namespace {

TEST(StatusMapTest, ProtocolCodesForEachStatus) {
  EXPECT_EQ(HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kInvalidArgument), 3);
  EXPECT_EQ(HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kNotFound), 5);
  EXPECT_EQ(HttpStatusFor(StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kResourceExhausted), 14) << "gRPC clients retry UNAVAILABLE";
  EXPECT_EQ(HttpStatusFor(StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kDeadlineExceeded), 4);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kUnavailable), 14);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kInternal), 13);
  EXPECT_EQ(HttpStatusFor(StatusCode::kOk), 200);
}

TEST(StatusMapTest, RetryAfterRoundsTheHintUpToWholeSeconds) {
  EXPECT_EQ(RetryAfterSeconds(ResourceExhausted("q")), kRetryAfterSeconds);
  EXPECT_EQ(RetryAfterSeconds(ResourceExhausted("q").WithRetryAfterMs(0)), 1);
  EXPECT_EQ(RetryAfterSeconds(ResourceExhausted("q").WithRetryAfterMs(1000)), 1);
  EXPECT_EQ(RetryAfterSeconds(ResourceExhausted("q").WithRetryAfterMs(1001)), 2);
  EXPECT_EQ(RetryAfterSeconds(ResourceExhausted("q").WithRetryAfterMs(7500)), 8);
}

}  // namespace
}  // namespace shoal::server
