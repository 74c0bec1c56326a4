#include "runtime/classification.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace shoal::runtime {
namespace {

std::vector<std::string> Strings(const Tensor& t) {
  auto elements = t.BytesElements();
  EXPECT_TRUE(elements.ok()) << elements.status().message();
  return std::vector<std::string>(elements->begin(), elements->end());
}

TEST(ClassificationTest, TopKPerBatchRowWithLabels) {
  const Tensor scores =
      Tensor::FromVector<float>(DataType::kFp32, {2, 4}, {1, 5, 10, 4, 0.5f, 0.25f, 0.75f, 0});
  const std::vector<std::string> labels = {"cat", "dog", "fish", "bird"};
  auto out = Classify(scores, 2, /*batched=*/true, &labels);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->dtype(), DataType::kBytes);
  EXPECT_EQ(out->shape(), (Shape{2, 2}));
  EXPECT_EQ(Strings(*out), (std::vector<std::string>{"10.000000:2:fish", "5.000000:1:dog",
                                                     "0.750000:2:fish", "0.500000:0:cat"}));
}

TEST(ClassificationTest, UnbatchedWithoutLabelsAndCountClamped) {
  const Tensor scores = Tensor::FromVector<int32_t>(DataType::kInt32, {3}, {7, -1, 7});
  auto out = Classify(scores, 10, /*batched=*/false, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->shape(), (Shape{3}));
  // Ties keep the lower index first; integers print as integers.
  EXPECT_EQ(Strings(*out), (std::vector<std::string>{"7:0", "7:2", "-1:1"}));
}

TEST(ClassificationTest, IndexPastTheLabelsHasNoLabel) {
  const Tensor scores = Tensor::FromVector<double>(DataType::kFp64, {1, 3}, {0.1, 0.2, 0.3});
  const std::vector<std::string> labels = {"a"};
  auto out = Classify(scores, 3, true, &labels);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(Strings(*out), (std::vector<std::string>{"0.300000:2", "0.200000:1", "0.100000:0:a"}));
}

// An FP16 model's (or a BF16 one's) scores are the floats their bits encode.
TEST(ClassificationTest, Fp16AndBf16ScoresAreReadAsFloats) {
  // FP16: 0.5, 2.0, -1.0, 0.25; BF16: the same values' top float halves.
  const Tensor h =
      Tensor::FromVector<uint16_t>(DataType::kFp16, {1, 4}, {0x3800, 0x4000, 0xBC00, 0x3400});
  const Tensor b =
      Tensor::FromVector<uint16_t>(DataType::kBf16, {1, 4}, {0x3F00, 0x4000, 0xBF80, 0x3E80});
  for (const Tensor* scores : {&h, &b}) {
    SCOPED_TRACE(DataTypeName(scores->dtype()));
    auto out = Classify(*scores, 3, true, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(Strings(*out), (std::vector<std::string>{"2.000000:1", "0.500000:0", "0.250000:3"}));
  }
}

TEST(ClassificationTest, RejectsBadRequests) {
  const Tensor scores = Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {1, 2});
  EXPECT_EQ(Classify(scores, 0, true, nullptr).status().code(), StatusCode::kInvalidArgument);
  const Tensor strings = Tensor::FromStrings({1}, {"x"});
  auto s = Classify(strings, 1, false, nullptr);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("BYTES"), std::string::npos) << s.status().message();
}

TEST(ClassificationTest, ReadsLabelFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("shoal_labels_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream f(path, std::ios::binary);
    f << "zero\r\none\ntwo";
  }
  auto labels = ReadLabelFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(labels.ok()) << labels.status().message();
  EXPECT_EQ(**labels, (std::vector<std::string>{"zero", "one", "two"}));
  auto missing = ReadLabelFile(path.string());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find(path.string()), std::string::npos);
}

}  // namespace
}  // namespace shoal::runtime
