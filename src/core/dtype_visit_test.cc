#include "core/dtype_visit.h"

#include <gtest/gtest.h>

#include <cstring>
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

}  // namespace
}  // namespace shoal
