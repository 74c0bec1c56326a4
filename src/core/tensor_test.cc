#include "core/tensor.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

TEST(ElementCountTest, RejectsNegativeAndOverflow) {
  EXPECT_EQ(*ElementCount(std::vector<int64_t>{2, 3, 4}), 24);
  EXPECT_EQ(*ElementCount(std::vector<int64_t>{}), 1);
  EXPECT_EQ(*ElementCount(std::vector<int64_t>{5, 0}), 0);
  auto neg = ElementCount(std::vector<int64_t>{2, -1});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("dimension 1 is negative"), std::string::npos);
  EXPECT_FALSE(ElementCount(std::vector<int64_t>{INT64_MAX / 2, 3}).ok());
  EXPECT_FALSE(ElementCount(std::vector<int64_t>{1000, 1000}, /*max_elements=*/999'999).ok());
}

TEST(TensorTest, AllocateIsAlignedAndZeroed) {
  Tensor t = Tensor::Allocate(DataType::kFp32, {3, 5});
  EXPECT_EQ(t.byte_size(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % Buffer::kAlignment, 0u);
  for (float v : t.values<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(TensorTest, AllocateUninitializedSkipsZeroingButKeepsAlignment) {
  const int64_t before = Buffer::zeroed_bytes_total();
  Tensor t = Tensor::AllocateUninitialized(DataType::kFp32, {1000, 100}, 400'000);
  EXPECT_EQ(t.byte_size(), 400'000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % Buffer::kAlignment, 0u);
  EXPECT_TRUE(t.buffer()->owns_data());
  EXPECT_EQ(Buffer::zeroed_bytes_total(), before) << "an uninitialised allocation was zeroed";
  Tensor z = Tensor::Allocate(DataType::kFp32, {3, 5});
  EXPECT_EQ(Buffer::zeroed_bytes_total(), before + 60);
}

TEST(TensorTest, SliceRowsSharesTheBuffer) {
  Tensor t = Tensor::FromVector<float>(DataType::kFp32, {3, 2}, {1, 2, 3, 4, 5, 6});
  auto rows = t.SliceRows(1, 3);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->shape(), (Shape{2, 2}));
  EXPECT_EQ(rows->buffer(), t.buffer());
  EXPECT_EQ(std::vector<float>(rows->values<float>().begin(), rows->values<float>().end()),
            (std::vector<float>{3, 4, 5, 6}));
  EXPECT_FALSE(t.SliceRows(2, 4).ok());
  EXPECT_FALSE(t.SliceRows(-1, 1).ok());
}

TEST(TensorTest, BytesRoundTripAndSlice) {
  Tensor t = Tensor::FromStrings({3}, {"a", "", "hello"});
  auto elems = t.BytesElements();
  ASSERT_TRUE(elems.ok());
  ASSERT_EQ(elems->size(), 3u);
  EXPECT_EQ((*elems)[0], "a");
  EXPECT_EQ((*elems)[1], "");
  EXPECT_EQ((*elems)[2], "hello");
  auto tail = t.SliceRows(1, 3);
  ASSERT_TRUE(tail.ok());
  auto tail_elems = tail->BytesElements();
  ASSERT_TRUE(tail_elems.ok());
  EXPECT_EQ((*tail_elems)[1], "hello");
}

TEST(TensorTest, MalformedBytesAreRejected) {
  // Claims 100 bytes but has 2.
  std::string bad("\x64\x00\x00\x00hi", 6);
  EXPECT_FALSE(ScanBytesElements(bad, 1).ok());
  // Trailing garbage after the declared count.
  std::string extra("\x01\x00\x00\x00xZZ", 7);
  EXPECT_FALSE(ScanBytesElements(extra, 1).ok());
  // Too few bytes for the length prefix.
  EXPECT_FALSE(ScanBytesElements(std::string_view("\x01\x00", 2), 1).ok());
}

TEST(DataTypeTest, NamesRoundTrip) {
  EXPECT_EQ(DataTypeName(DataType::kFp32), "FP32");
  EXPECT_EQ(DataTypeConfigName(DataType::kBytes), "TYPE_STRING");
  EXPECT_EQ(*DataTypeFromName("BF16"), DataType::kBf16);
  EXPECT_FALSE(DataTypeFromName("fp32").has_value());
  EXPECT_FALSE(DataTypeFromName("INVALID").has_value());
  EXPECT_EQ(DataTypeSize(DataType::kInt64), 8u);
  EXPECT_EQ(DataTypeSize(DataType::kBytes), 0u);
}

}  // namespace
}  // namespace shoal
