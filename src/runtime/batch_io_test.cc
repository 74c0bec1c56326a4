#include "runtime/batch_io.h"

#include <gtest/gtest.h>

namespace shoal::runtime {
namespace {

ModelSignature Sig() {
  ModelSignature sig;
  sig.max_batch_size = 4;
  sig.inputs = {{"A", DataType::kFp32, {2}, false}, {"S", DataType::kBytes, {1}, true}};
  sig.outputs = {{"X", DataType::kFp32, {2}, false}, {"Y", DataType::kFp32, {2}, false}};
  return sig;
}

InferRequest Req(int64_t n, float base) {
  InferRequest r;
  std::vector<float> v;
  for (int64_t i = 0; i < 2 * n; ++i) v.push_back(base + i);
  r.inputs.push_back({"A", Tensor::FromVector<float>(DataType::kFp32, {n, 2}, v)});
  return r;
}

TEST(ValidateRequestTest, AcceptsAndKeysByNonBatchShape) {
  auto a = ValidateRequest(Sig(), Req(2, 0));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->batch_size, 2);
  auto b = ValidateRequest(Sig(), Req(1, 5));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->shape_key, b->shape_key);
  InferRequest with_s = Req(1, 0);
  with_s.inputs.push_back({"S", Tensor::FromStrings({1, 1}, {"hi"})});
  auto c = ValidateRequest(Sig(), with_s);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(c->shape_key, a->shape_key);
}

TEST(ValidateRequestTest, APrecisionParameterGetsItsOwnBatchAndReachesTheBackend) {
  InferRequest plain = Req(1, 0), int8 = Req(1, 0), other = Req(2, 1), bad = Req(1, 0);
  int8.parameters["precision"] = std::string("int8");
  other.parameters["precision"] = std::string("int8");
  bad.parameters["precision"] = int64_t{8};
  auto a = ValidateRequest(Sig(), plain);
  auto b = ValidateRequest(Sig(), int8);
  auto c = ValidateRequest(Sig(), other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(a->shape_key, b->shape_key);
  EXPECT_EQ(b->shape_key, c->shape_key);
  auto rejected = ValidateRequest(Sig(), bad);
  ASSERT_FALSE(rejected.ok());
  EXPECT_NE(rejected.status().message().find("'precision' must be a non-empty string"),
            std::string::npos);
  auto merged = MergeInputs(Sig(), {&int8, &other}, {1, 2});
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->variant, "int8");
  auto unmarked = MergeInputs(Sig(), {&plain}, {1});
  ASSERT_TRUE(unmarked.ok());
  EXPECT_EQ(unmarked->variant, "");
}

TEST(ValidateRequestTest, RejectsEachKindOfBadInput) {
  struct Case {
    const char* what;
    InferRequest r;
    const char* message;
  };
  std::vector<Case> cases;
  {
    InferRequest r = Req(1, 0);
    r.inputs.push_back({"A", r.inputs[0].tensor});
    cases.push_back({"duplicate", r, "appears twice"});
  }
  {
    InferRequest r = Req(1, 0);
    r.inputs.push_back({"Z", r.inputs[0].tensor});
    cases.push_back({"unknown", r, "unexpected input 'Z'"});
  }
  cases.push_back({"batch too big", Req(5, 0), "batch size 5"});
  {
    InferRequest r;
    r.inputs.push_back({"A", Tensor::Allocate(DataType::kFp32, {1, 3})});
    cases.push_back({"wrong dim", r, "dimension 1 must be 2"});
  }
  {
    InferRequest r;
    r.inputs.push_back({"A", Tensor::Allocate(DataType::kFp32, {2})});
    cases.push_back({"wrong rank", r, "shape [2]"});
  }
  {
    InferRequest r;
    r.inputs.push_back({"A", Tensor(DataType::kFp32, {1, -2},
                                    Tensor::Allocate(DataType::kFp32, {2}).buffer(), 0, 8)});
    cases.push_back({"negative", r, "negative"});
  }
  {
    InferRequest r = Req(1, 0);
    r.inputs.push_back(
        {"S", Tensor(DataType::kBytes, {1, 1}, Tensor::FromStrings({1}, {"abc"}).buffer(), 0, 5)});
    cases.push_back({"truncated bytes", r, "input 'S'"});
  }
  {
    InferRequest r = Req(1, 0);
    r.requested_outputs = {"Q"};
    cases.push_back({"unknown output", r, "unknown output 'Q'"});
  }
  {
    // An ensemble counts the outputs it must deliver: a name twice would never complete.
    InferRequest r = Req(1, 0);
    r.requested_outputs = {"Y", "Y"};
    cases.push_back({"output twice", r, "output 'Y' is requested twice"});
  }
  for (auto& c : cases) {
    auto v = ValidateRequest(Sig(), c.r);
    ASSERT_FALSE(v.ok()) << c.what;
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(v.status().message().find(c.message), std::string::npos)
        << c.what << ": " << v.status().message();
  }
}

TEST(ValidateRequestTest, HugeDeclaredShapeIsRejectedBeforeAllocation) {
  InferRequest r;
  r.inputs.push_back({"A", Tensor(DataType::kFp32, {1, int64_t{1} << 40},
                                  Tensor::Allocate(DataType::kFp32, {2}).buffer(), 0, 8)});
  auto v = ValidateRequest(Sig(), r);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
}

TEST(MergeScatterTest, ConcatenatesAndSplitsBackWithoutCopyingOutputs) {
  ModelSignature sig = Sig();
  InferRequest r1 = Req(1, 0), r2 = Req(2, 10);
  r2.requested_outputs = {"Y"};
  std::vector<const InferRequest*> reqs = {&r1, &r2};
  auto merged = MergeInputs(sig, reqs, {1, 2});
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->batch_size, 3);
  ASSERT_EQ(merged->inputs.size(), 1u);
  EXPECT_EQ(merged->inputs[0].tensor.shape(), (Shape{3, 2}));
  auto vals = merged->inputs[0].tensor.values<float>();
  EXPECT_EQ(std::vector<float>(vals.begin(), vals.end()),
            (std::vector<float>{0, 1, 10, 11, 12, 13}));
  EXPECT_TRUE(merged->requested_outputs.empty()) << "r1 wants all outputs";

  std::vector<NamedTensor> outs = {{"X", merged->inputs[0].tensor},
                                   {"Y", merged->inputs[0].tensor}};
  auto per = ScatterOutputs(sig, outs, reqs, {1, 2});
  ASSERT_TRUE(per.ok());
  ASSERT_EQ((*per)[0].size(), 2u);
  ASSERT_EQ((*per)[1].size(), 1u);
  EXPECT_EQ((*per)[1][0].name, "Y");
  EXPECT_EQ((*per)[1][0].tensor.shape(), (Shape{2, 2}));
  EXPECT_EQ((*per)[1][0].tensor.values<float>()[0], 10);
  EXPECT_EQ((*per)[1][0].tensor.buffer(), merged->inputs[0].tensor.buffer());
}

// What a shape-key collision would hand MergeInputs: requests of different shapes. It must
// refuse them rather than concatenate rows of different widths into one tensor.
TEST(MergeScatterTest, RequestsOfDifferentShapesAreNeverMerged) {
  ModelSignature sig;
  sig.max_batch_size = 4;
  sig.inputs = {{"A", DataType::kFp32, {-1}, false}};
  sig.outputs = {{"X", DataType::kFp32, {-1}, false}};
  InferRequest two, three, two_b, int8;
  two.id = "two";
  three.id = "three";
  two.inputs.push_back({"A", Tensor::FromVector<float>(DataType::kFp32, {1, 2}, {1, 2})});
  three.inputs.push_back({"A", Tensor::FromVector<float>(DataType::kFp32, {1, 3}, {1, 2, 3})});
  two_b.inputs.push_back({"A", Tensor::FromVector<float>(DataType::kFp32, {2, 2}, {1, 2, 3, 4})});
  int8 = two;
  int8.parameters["precision"] = std::string("int8");
  EXPECT_TRUE(SameBatchShape(sig, two, two_b)) << "the batch dimension may differ";
  EXPECT_FALSE(SameBatchShape(sig, two, three));
  EXPECT_FALSE(SameBatchShape(sig, two, int8));
  auto merged = MergeInputs(sig, {&two, &three}, {1, 1});
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.status().code(), StatusCode::kInternal);
  EXPECT_NE(merged.status().message().find("'two' and 'three' differ in shape"), std::string::npos)
      << merged.status().ToString();
  EXPECT_TRUE(MergeInputs(sig, {&two, &two_b}, {1, 2}).ok());
}

TEST(MergeScatterTest, MergeBufferIsNotZeroedBeforeItIsOverwritten) {
  InferRequest a = Req(3, 0), b = Req(5, 100);
  const int64_t before = Buffer::zeroed_bytes_total();
  auto merged = MergeInputs(Sig(), {&a, &b}, {3, 5});
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_EQ(Buffer::zeroed_bytes_total(), before) << "the merge buffer was zeroed first";
  const auto values = merged->inputs[0].tensor.values<float>();
  ASSERT_EQ(values.size(), 16u);
  EXPECT_EQ(values[0], 0.0f);
  EXPECT_EQ(values[5], 5.0f);
  EXPECT_EQ(values[6], 100.0f);
  EXPECT_EQ(values[15], 109.0f);
}

TEST(MergeScatterTest, SingleRequestPassesTensorsThrough) {
  InferRequest r = Req(2, 0);
  auto merged = MergeInputs(Sig(), {&r}, {2});
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->inputs[0].tensor.buffer(), r.inputs[0].tensor.buffer());
}

TEST(MergeScatterTest, WrongOutputBatchDimensionIsInternal) {
  InferRequest r1 = Req(1, 0), r2 = Req(1, 0);
  std::vector<NamedTensor> outs = {{"X", Tensor::Allocate(DataType::kFp32, {3, 2})},
                                   {"Y", Tensor::Allocate(DataType::kFp32, {2, 2})}};
  auto per = ScatterOutputs(Sig(), outs, {&r1, &r2}, {1, 1});
  ASSERT_FALSE(per.ok());
  EXPECT_EQ(per.status().code(), StatusCode::kInternal);
  EXPECT_NE(per.status().message().find("'X'"), std::string::npos);
}

TEST(MergeScatterTest, BytesInputsConcatenate) {
  ModelSignature sig;
  sig.max_batch_size = 4;
  sig.inputs = {{"S", DataType::kBytes, {-1}, false}};
  InferRequest a, b;
  a.inputs.push_back({"S", Tensor::FromStrings({1, 2}, {"x", "yy"})});
  b.inputs.push_back({"S", Tensor::FromStrings({1, 2}, {"", "zzz"})});
  auto merged = MergeInputs(sig, {&a, &b}, {1, 1});
  ASSERT_TRUE(merged.ok());
  auto elems = merged->inputs[0].tensor.BytesElements();
  ASSERT_TRUE(elems.ok());
  ASSERT_EQ(elems->size(), 4u);
  EXPECT_EQ((*elems)[3], "zzz");
}

}  // namespace
}  // namespace shoal::runtime
