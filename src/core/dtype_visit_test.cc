#include "core/dtype_visit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace shoal {
namespace {

// Every fixed-size type is visited with a storage type of its DataTypeSize, and BYTES and
// INVALID go to `otherwise`.
TEST(VisitDTypeTest, StorageSizeMatchesDataTypeSizeForEveryType) {
  for (int i = 0; i <= 14; ++i) {
    const auto type = static_cast<DataType>(i);
    const size_t visited = VisitDType(
        type, [](auto tag) { return sizeof(typename decltype(tag)::type); },
        [] { return size_t{0}; });
    EXPECT_EQ(visited, DataTypeSize(type)) << DataTypeName(type);
    const DataType seen = VisitDType(
        type, [](auto tag) { return decltype(tag)::kType; }, [] { return DataType::kInvalid; });
    if (DataTypeSize(type) != 0) {
      EXPECT_EQ(seen, type) << DataTypeName(type);
    }
  }
}

TEST(VisitDTypeTest, OtherwiseForBytesAndInvalid) {
  int calls = 0;
  auto never = [&](auto) { return std::string("visited"); };
  auto other = [&] {
    ++calls;
    return std::string("other");
  };
  EXPECT_EQ(VisitDType(DataType::kBytes, never, other), "other");
  EXPECT_EQ(VisitDType(DataType::kInvalid, never, other), "other");
  EXPECT_EQ(VisitDType(static_cast<DataType>(99), never, other), "other");
  EXPECT_EQ(calls, 3);
}

TEST(VisitDTypeTest, PlainValues) {
  EXPECT_TRUE(HoldsPlainValues(DataType::kBool));
  EXPECT_TRUE(HoldsPlainValues(DataType::kUint64));
  EXPECT_TRUE(HoldsPlainValues(DataType::kFp32));
  EXPECT_FALSE(HoldsPlainValues(DataType::kFp16));
  EXPECT_FALSE(HoldsPlainValues(DataType::kBf16));
  EXPECT_FALSE(HoldsPlainValues(DataType::kBytes));
  EXPECT_FALSE(HoldsPlainValues(DataType::kInvalid));
}

TEST(VisitDTypeTest, ElementsRoundTripThroughDouble) {
  std::vector<int16_t> i16 = {0, -7, 300};
  EXPECT_EQ(LoadElementAsDouble(DataType::kInt16, i16.data(), 1), -7.0);
  StoreElementFromDouble(DataType::kInt16, i16.data(), 2, -32768);
  EXPECT_EQ(i16[2], -32768);

  std::vector<uint64_t> u64 = {0, 0};
  StoreElementFromDouble(DataType::kUint64, u64.data(), 1, 9007199254740992.0);
  EXPECT_EQ(u64[1], 9007199254740992ull);
  EXPECT_EQ(LoadElementAsDouble(DataType::kUint64, u64.data(), 1), 9007199254740992.0);

  std::vector<float> f = {1.5f, 0};
  StoreElementFromDouble(DataType::kFp32, f.data(), 1, 0.25);
  EXPECT_EQ(f[1], 0.25f);
  EXPECT_EQ(LoadElementAsDouble(DataType::kFp32, f.data(), 0), 1.5);
}

TEST(VisitDTypeTest, BoolIsAnyNonZeroByte) {
  // A BOOL byte of 2 (possible in data from a client) reads as true, not as UB.
  std::vector<uint8_t> b = {0, 2, 1};
  EXPECT_EQ(LoadElementAsDouble(DataType::kBool, b.data(), 0), 0.0);
  EXPECT_EQ(LoadElementAsDouble(DataType::kBool, b.data(), 1), 1.0);
  StoreElementFromDouble(DataType::kBool, b.data(), 0, -3.0);
  EXPECT_EQ(b[0], 1);
  StoreElementFromDouble(DataType::kBool, b.data(), 1, 0.0);
  EXPECT_EQ(b[1], 0);
}

TEST(VisitDTypeTest, HalfTypesAreLeftAlone) {
  uint16_t h = 0x3c00;  // 1.0 in fp16
  StoreElementFromDouble(DataType::kFp16, &h, 0, 2.0);
  EXPECT_EQ(h, 0x3c00);
  EXPECT_EQ(LoadElementAsDouble(DataType::kBf16, &h, 0), 0.0);
}

// Conversions for text and other types' values refuse what would change the value instead
// of truncating (1.5 into INT64 used to become 1) or overflowing (1e39 into FP32 used to
// become infinity).
TEST(VisitDTypeTest, CheckedStoresRefuseValuesTheTypeCannotHold) {
  std::vector<int64_t> i64(1);
  EXPECT_TRUE(StoreElementChecked(DataType::kInt64, i64.data(), 0, -42.0).ok());
  EXPECT_EQ(i64[0], -42);
  Status s = StoreElementChecked(DataType::kInt64, i64.data(), 0, 1.5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "1.5 is not a whole number, as INT64 needs");
  EXPECT_EQ(i64[0], -42) << "nothing stored on an error";
  EXPECT_FALSE(StoreElementChecked(DataType::kInt64, i64.data(), 0, std::nan("")).ok());
  EXPECT_FALSE(StoreElementChecked(DataType::kInt64, i64.data(), 0, 0x1p63).ok());
  EXPECT_TRUE(StoreElementChecked(DataType::kInt64, i64.data(), 0, -0x1p63).ok());
  std::vector<int8_t> i8(1);
  EXPECT_EQ(StoreElementChecked(DataType::kInt8, i8.data(), 0, 300).message(),
            "300 does not fit in INT8");
  EXPECT_TRUE(StoreElementChecked(DataType::kInt8, i8.data(), 0, -128).ok());
  std::vector<uint8_t> u8(1);
  EXPECT_FALSE(StoreElementChecked(DataType::kUint8, u8.data(), 0, -1).ok());

  std::vector<float> f(1);
  EXPECT_EQ(StoreElementChecked(DataType::kFp32, f.data(), 0, 1e39).message(),
            "1e+39 is beyond the range of FP32");
  EXPECT_FALSE(StoreElementChecked(DataType::kFp32, f.data(), 0, -1e39).ok());
  // FLT_MAX written out in its shortest form is a little above it and reads back as it.
  ASSERT_TRUE(StoreElementChecked(DataType::kFp32, f.data(), 0, 3.4028235e38).ok());
  EXPECT_EQ(f[0], std::numeric_limits<float>::max());
  // Infinities and NaN are values FP32 holds.
  ASSERT_TRUE(StoreElementChecked(DataType::kFp32, f.data(), 0, -INFINITY).ok());
  EXPECT_EQ(f[0], -std::numeric_limits<float>::infinity());
  std::vector<double> d(1);
  EXPECT_TRUE(StoreElementChecked(DataType::kFp64, d.data(), 0, 1e300).ok());
  uint16_t h = 0;
  EXPECT_FALSE(StoreElementChecked(DataType::kFp16, &h, 0, 1).ok());
}

TEST(VisitDTypeTest, CheckedConversionsKeepIntegersExact) {
  const std::vector<uint64_t> big = {(uint64_t{1} << 53) + 1, uint64_t{1} << 63};
  std::vector<int64_t> out(2);
  ASSERT_TRUE(
      ConvertElementChecked(DataType::kUint64, big.data(), DataType::kInt64, out.data(), 0).ok());
  EXPECT_EQ(out[0], (int64_t{1} << 53) + 1);
  EXPECT_EQ(ConvertElementChecked(DataType::kUint64, big.data(), DataType::kInt64, out.data(), 1)
                .message(),
            "9223372036854775808 does not fit in INT64");
  const std::vector<double> f64 = {3.0, 2.5};
  ASSERT_TRUE(
      ConvertElementChecked(DataType::kFp64, f64.data(), DataType::kInt64, out.data(), 0).ok());
  EXPECT_EQ(out[0], 3);
  EXPECT_FALSE(
      ConvertElementChecked(DataType::kFp64, f64.data(), DataType::kInt64, out.data(), 1).ok());
  std::vector<float> f32(1);
  const std::vector<int32_t> i32 = {7};
  ASSERT_TRUE(
      ConvertElementChecked(DataType::kInt32, i32.data(), DataType::kFp32, f32.data(), 0).ok());
  EXPECT_EQ(f32[0], 7.0f);
}

}  // namespace
}  // namespace shoal
