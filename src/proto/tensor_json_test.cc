#include "proto/tensor_json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace shoal::proto {
namespace {

std::string Json(const Tensor& t) {
  std::string out;
  const Status s = AppendTensorJsonData(t, &out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

TEST(TensorJsonTest, IntegersAreExactAtTheirLimits) {
  EXPECT_EQ(Json(Tensor::FromVector<int64_t>(
                DataType::kInt64, {3},
                {std::numeric_limits<int64_t>::min(), -1, std::numeric_limits<int64_t>::max()})),
            "[-9223372036854775808,-1,9223372036854775807]");
  EXPECT_EQ(Json(Tensor::FromVector<uint64_t>(DataType::kUint64, {2},
                                              {0, std::numeric_limits<uint64_t>::max()})),
            "[0,18446744073709551615]");
  EXPECT_EQ(Json(Tensor::FromVector<int8_t>(DataType::kInt8, {2}, {-128, 127})), "[-128,127]");
  EXPECT_EQ(Json(Tensor::FromVector<uint16_t>(DataType::kUint16, {1}, {65535})), "[65535]");
}

TEST(TensorJsonTest, FloatsRoundTripAndSpellNonFiniteValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Json(Tensor::FromVector<float>(DataType::kFp32, {2, 3},
                                           {0.1f, -2.5f, 3.0f, std::nanf(""), inf, -inf})),
            "[0.1,-2.5,3,NaN,Infinity,-Infinity]");
  EXPECT_EQ(Json(Tensor::FromVector<double>(DataType::kFp64, {2}, {0.1, 1e300})), "[0.1,1e+300]");
}

TEST(TensorJsonTest, BoolIsAnyNonZeroByte) {
  EXPECT_EQ(Json(Tensor::FromVector<uint8_t>(DataType::kBool, {3}, {0, 1, 7})),
            "[false,true,true]");
}

TEST(TensorJsonTest, StringsAreEscaped) {
  EXPECT_EQ(Json(Tensor::FromStrings({3}, {"a\"b", "tab\there", "\xc3\xa9"})),
            "[\"a\\\"b\",\"tab\\there\",\"\xc3\xa9\"]");
}

TEST(TensorJsonTest, EmptyTensorIsAnEmptyArray) {
  EXPECT_EQ(Json(Tensor::FromVector<float>(DataType::kFp32, {0, 4}, {})), "[]");
}

TEST(TensorJsonTest, TypesWithoutAJsonFormAreRefused) {
  std::string out;
  Status s =
      AppendTensorJsonData(Tensor::FromVector<uint16_t>(DataType::kFp16, {1}, {0x3c00}), &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "is FP16, which has no JSON form");
  out.clear();
  s = AppendTensorJsonData(Tensor::FromStrings({1}, {"\xff\xfe"}), &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not valid UTF-8"), std::string::npos) << s.message();
}

TEST(TensorJsonTest, SizeThatDoesNotMatchTheShapeIsInternal) {
  auto buffer = Buffer::Allocate(12);
  const Tensor t(DataType::kFp32, {4}, buffer, 0, 12);  // 4 floats need 16 bytes
  std::string out;
  const Status s = AppendTensorJsonData(t, &out);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace shoal::proto
