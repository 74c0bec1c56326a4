#include "core/status.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("x must be even; was " + std::to_string(x));
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckPositive(int x) {
  if (x <= 0) return InvalidArgument("not positive");
  return Status::Ok();
}

Status Both(int a, int b) {
  RETURN_IF_ERROR(CheckPositive(a));
  RETURN_IF_ERROR(CheckPositive(b));
  return Status::Ok();
}

TEST(StatusTest, OkHasNoMessageAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = NotFound("model 'x' is not loaded");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: model 'x' is not loaded");
  EXPECT_EQ(s.WithPrefix("load").message(), "load: model 'x' is not loaded");
  EXPECT_TRUE(Status().WithPrefix("x").ok());
}

TEST(StatusTest, RetryableOnlyForOverloadCodes) {
  EXPECT_TRUE(ResourceExhausted("q").retryable());
  EXPECT_TRUE(Unavailable("q").retryable());
  EXPECT_FALSE(InvalidArgument("q").retryable());
  EXPECT_FALSE(Internal("q").retryable());
}

TEST(StatusTest, RetryHintSurvivesPrefixAndDefaultsToNone) {
  EXPECT_EQ(ResourceExhausted("q").retry_after_ms(), -1);
  const Status s = ResourceExhausted("q").WithRetryAfterMs(120).WithPrefix("model 'm'");
  EXPECT_EQ(s.retry_after_ms(), 120);
  EXPECT_EQ(s.message(), "model 'm': q");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ResourceExhausted("q").WithRetryAfterMs(-5).retry_after_ms(), 0);
  EXPECT_TRUE(Status::Ok().WithRetryAfterMs(3).ok());
}

TEST(StatusTest, MacrosPropagateFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  StatusOr<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "x must be even; was 3");
  EXPECT_TRUE(Both(1, 2).ok());
  EXPECT_EQ(Both(1, -2).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, StatusOrFromOkStatusIsAnError) {
  StatusOr<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

// Reading the value of an error used to be undefined behaviour (an empty optional
// dereferenced); it must stop the process and say which error was ignored.
TEST(StatusOrDeathTest, ValueOfAnErrorAbortsPrintingTheStatus) {
  StatusOr<std::string> r = InvalidArgument("shape [3] does not fit");
  EXPECT_DEATH((void)r.value(), "INVALID_ARGUMENT: shape \\[3\\] does not fit");
  EXPECT_DEATH((void)*r, "StatusOr.*INVALID_ARGUMENT");
  EXPECT_DEATH((void)r->size(), "StatusOr.*INVALID_ARGUMENT");
  EXPECT_DEATH((void)std::move(r).value(), "StatusOr.*INVALID_ARGUMENT");
}

}  // namespace
}  // namespace shoal
