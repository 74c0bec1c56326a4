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
  EXPECT_EQ(GrpcCodeFor(StatusCode::kResourceExhausted), 8);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kUnavailable), 14);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
  EXPECT_EQ(GrpcCodeFor(StatusCode::kInternal), 13);
  EXPECT_EQ(HttpStatusFor(StatusCode::kOk), 200);
}

}  // namespace
}  // namespace shoal::server
