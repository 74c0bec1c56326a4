#include "backends/onnx/batch_buckets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shoal::backends {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BatchBucketsTest, DefaultsArePowersOfTwoAndTheirMidpointsUpToTheMaximum) {
  EXPECT_THAT(DefaultBatchBuckets(1), ElementsAre(1));
  EXPECT_THAT(DefaultBatchBuckets(4), ElementsAre(1, 2, 4));
  EXPECT_THAT(DefaultBatchBuckets(10), ElementsAre(1, 2, 4, 8, 10));
  EXPECT_THAT(DefaultBatchBuckets(32), ElementsAre(1, 2, 4, 8, 12, 16, 24, 32));
  EXPECT_THAT(DefaultBatchBuckets(40), ElementsAre(1, 2, 4, 8, 12, 16, 24, 32, 40));
  EXPECT_THAT(DefaultBatchBuckets(256),
              ElementsAre(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256));
}

TEST(BatchBucketsTest, ABatchRunsOnTheSmallestBucketThatHoldsIt) {
  const std::vector<int64_t> buckets = DefaultBatchBuckets(32);
  const std::vector<int64_t> want = {0,  1,  2,  4,  4,  8,  8,  8,  8,  12, 12,
                                     12, 12, 16, 16, 16, 16, 24, 24, 24, 24, 24,
                                     24, 24, 24, 32, 32, 32, 32, 32, 32, 32, 32};
  for (int64_t rows = 1; rows <= 32; ++rows) {
    EXPECT_EQ(BucketFor(buckets, rows), want[static_cast<size_t>(rows)]) << rows;
    // Past 8 rows, at most half again as many computed as asked for.
    if (rows > 8) {
      EXPECT_LE(2 * BucketFor(buckets, rows), 3 * rows) << rows;
    }
  }
  EXPECT_EQ(BucketFor(buckets, 33), 33) << "above every bucket: as it is";
  EXPECT_EQ(BucketFor({}, 7), 7) << "no buckets: every size its own plan";
}

TEST(BatchBucketsTest, TheParameterTakesAutoExactOrAList) {
  EXPECT_THAT(*ParseBatchBuckets("auto", 32), ElementsAre(1, 2, 4, 8, 12, 16, 24, 32));
  EXPECT_TRUE(ParseBatchBuckets("exact", 32)->empty());
  EXPECT_THAT(*ParseBatchBuckets("1, 8,16", 32), ElementsAre(1, 8, 16, 32))
      << "the maximum is always a bucket";
  EXPECT_THAT(*ParseBatchBuckets("4,32", 32), ElementsAre(4, 32));
  for (const char* bad : {"", "8,4", "4,4", "0,8", "1,64", "1,,8", "one", "-1", "1.5", "auto,8"}) {
    auto parsed = ParseBatchBuckets(bad, 32);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("gpu_batch_buckets")) << bad;
  }
}

}  // namespace
}  // namespace shoal::backends
