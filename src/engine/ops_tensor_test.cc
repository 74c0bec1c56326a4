// TopK, CumSum, Mod (ops/sort_scan.cc), DepthToSpace, SpaceToDepth, Trilu, GatherND,
// GatherElements, ScatterND, ScatterElements (ops/data_movement.cc), ArgMax and ArgMin
// (ops/reduce.cc), InstanceNormalization and GroupNormalization (ops/group_norm.cc)
// against results worked out by hand
// (the examples of ONNX's operator documentation where it has them).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using namespace shoal::engine::testing;

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

TEST(TopKTest, LargestAndSmallestAlongEitherAxisWithStableTies) {
  const Tensor x = F32({2, 4}, {1, 3, 2, 3, 5, 0, 7, -1});
  auto out = Run1("TopK", {{x}, Const(I64({1}, {2}))}, {}, 2);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 2}));
  EXPECT_THAT(Values(out[0]), ElementsAre(3, 3, 7, 5));
  EXPECT_THAT(IntValues(out[1]), ElementsAre(1, 3, 2, 0));  // tie: lower index first
  out = Run1("TopK", {{x}, Const(I64({1}, {2}))}, {{"largest", AInt(0)}}, 2);
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 2, -1, 0));
  EXPECT_THAT(IntValues(out[1]), ElementsAre(0, 2, 3, 1));
  out = Run1("TopK", {{F32({3, 2}, {1, 6, 4, 2, 3, 5})}, Const(I64({1}, {1}))}, {{"axis", AInt(0)}},
             2);
  EXPECT_EQ(out[0].shape(), (Shape{1, 2}));
  EXPECT_THAT(Values(out[0]), ElementsAre(4, 6));
  EXPECT_THAT(IntValues(out[1]), ElementsAre(1, 0));
}

// A NaN counts as larger than every number, as NumPy and PyTorch sort it: first among the
// largest, last among the smallest, ties between NaNs by index; every index once.
TEST(TopKTest, NanIsLargerThanEveryNumber) {
  const float nan = std::nanf("");
  const Tensor x = F32({6}, {nan, 3, 5, nan, 1, -INFINITY});
  auto out = Run1("TopK", {{x}, Const(I64({1}, {3}))}, {}, 2);
  EXPECT_TRUE(std::isnan(Values(out[0])[0]) && std::isnan(Values(out[0])[1]));
  EXPECT_EQ(Values(out[0])[2], 5);
  EXPECT_THAT(IntValues(out[1]), ElementsAre(0, 3, 2));
  out = Run1("TopK", {{x}, Const(I64({1}, {6}))}, {{"largest", AInt(0)}}, 2);
  const std::vector<float> smallest = Values(out[0]);
  EXPECT_EQ(smallest[0], -INFINITY);
  EXPECT_EQ(smallest[1], 1);
  EXPECT_EQ(smallest[2], 3);
  EXPECT_EQ(smallest[3], 5);
  EXPECT_TRUE(std::isnan(smallest[4]) && std::isnan(smallest[5]));
  EXPECT_THAT(IntValues(out[1]), ElementsAre(5, 4, 1, 2, 0, 3));
}

TEST(TopKTest, KAtPlanTimeOrRunTimeAndInRange) {
  // K fed with the run: the outputs' shape is learned then (a data-dependent shape).
  auto runtime_k = Run1("TopK", {{F32({2, 4}, {1, 4, 3, 2, 8, 5, 6, 7})}, {I64({1}, {3})}}, {}, 2);
  EXPECT_EQ(runtime_k[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(Values(runtime_k[0]), ElementsAre(4, 3, 2, 8, 7, 6));
  EXPECT_THAT(IntValues(runtime_k[1]), ElementsAre(1, 2, 3, 0, 3, 2));
  auto too_big = RunOp("TopK", {{F32({4}, {1, 2, 3, 4})}, Const(I64({1}, {5}))}, {}, 2);
  ASSERT_FALSE(too_big.ok());
  EXPECT_THAT(too_big.status().message(), HasSubstr("K is 5"));
  auto too_big_at_run = RunOp("TopK", {{F32({4}, {1, 2, 3, 4})}, {I64({1}, {5})}}, {}, 2);
  ASSERT_FALSE(too_big_at_run.ok());
  EXPECT_THAT(too_big_at_run.status().message(), HasSubstr("K is 5"));
}

TEST(CumSumTest, InclusiveExclusiveAndReverse) {
  const Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const In axis1 = Const(I64({}, {1}));
  EXPECT_THAT(Values(Run1("CumSum", {{x}, axis1})[0]), ElementsAre(1, 3, 6, 4, 9, 15));
  EXPECT_THAT(Values(Run1("CumSum", {{x}, axis1}, {{"exclusive", AInt(1)}})[0]),
              ElementsAre(0, 1, 3, 0, 4, 9));
  EXPECT_THAT(Values(Run1("CumSum", {{x}, axis1}, {{"reverse", AInt(1)}})[0]),
              ElementsAre(6, 5, 3, 15, 11, 6));
  EXPECT_THAT(
      Values(Run1("CumSum", {{x}, axis1}, {{"reverse", AInt(1)}, {"exclusive", AInt(1)}})[0]),
      ElementsAre(5, 3, 0, 11, 6, 0));
  EXPECT_THAT(Values(Run1("CumSum", {{x}, Const(I32({}, {-2}))})[0]),
              ElementsAre(1, 2, 3, 5, 7, 9));
  EXPECT_THAT(IntValues(Run1("CumSum", {{I64({4}, {1, -2, 3, 10})}, Const(I64({}, {0}))})[0]),
              ElementsAre(1, -1, 2, 12));
}

TEST(ModTest, IntegerModTakesTheDivisorsSignAndFmodTheDividends) {
  const Tensor a = I64({4}, {-7, 7, -7, 7});
  const Tensor b = I64({4}, {3, -3, -3, 3});
  EXPECT_THAT(IntValues(Run1("Mod", {{a}, {b}})[0]), ElementsAre(2, -2, -1, 1));
  EXPECT_THAT(IntValues(Run1("Mod", {{a}, {b}}, {{"fmod", AInt(1)}})[0]),
              ElementsAre(-1, 1, -1, 1));
  // Broadcast of a scalar divisor; floats need fmod = 1.
  EXPECT_THAT(Values(Run1("Mod", {{F32({2, 2}, {-7.5f, 7.5f, 4.f, 0.5f})}, {F32({}, {2.f})}},
                          {{"fmod", AInt(1)}})[0]),
              ElementsAre(-1.5f, 1.5f, 0.f, 0.5f));
  auto float_mod = RunOp("Mod", {{F32({1}, {1.f})}, {F32({1}, {2.f})}});
  ASSERT_FALSE(float_mod.ok());
  EXPECT_THAT(float_mod.status().message(), HasSubstr("need fmod = 1"));
  auto by_zero = RunOp("Mod", {{I64({2}, {1, 2})}, {I64({2}, {1, 0})}});
  ASSERT_FALSE(by_zero.ok());
  EXPECT_THAT(by_zero.status().message(), HasSubstr("modulo by zero"));
}

TEST(TriluTest, UpperAndLowerWithDiagonalOffsets) {
  const Tensor x = F32({1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_THAT(Values(Run1("Trilu", {{x}})[0]), ElementsAre(1, 2, 3, 0, 5, 6, 0, 0, 9));
  EXPECT_THAT(Values(Run1("Trilu", {{x}}, {{"upper", AInt(0)}})[0]),
              ElementsAre(1, 0, 0, 4, 5, 0, 7, 8, 9));
  EXPECT_THAT(Values(Run1("Trilu", {{x}, {I64({}, {1})}})[0]),
              ElementsAre(0, 2, 3, 0, 0, 6, 0, 0, 0));
  EXPECT_THAT(Values(Run1("Trilu", {{x}, Const(I64({}, {-1}))}, {{"upper", AInt(0)}})[0]),
              ElementsAre(0, 0, 0, 4, 0, 0, 7, 8, 0));
  EXPECT_THAT(IntValues(Run1("Trilu", {{I64({2, 3}, {1, 2, 3, 4, 5, 6})}})[0]),
              ElementsAre(1, 2, 3, 0, 5, 6));
}

TEST(DepthToSpaceTest, DcrAndCrdModesAndSpaceToDepthInvertsDcr) {
  const Tensor x = F32({1, 8, 1, 1}, Iota(8));
  auto dcr = Run1("DepthToSpace", {{x}}, {{"blocksize", AInt(2)}});
  EXPECT_EQ(dcr[0].shape(), (Shape{1, 2, 2, 2}));
  EXPECT_THAT(Values(dcr[0]), ElementsAre(0, 2, 4, 6, 1, 3, 5, 7));
  auto crd = Run1("DepthToSpace", {{x}}, {{"blocksize", AInt(2)}, {"mode", AString("CRD")}});
  EXPECT_THAT(Values(crd[0]), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  auto s2d = Run1("SpaceToDepth", {{F32({1, 2, 2, 2}, Iota(8))}}, {{"blocksize", AInt(2)}});
  EXPECT_EQ(s2d[0].shape(), (Shape{1, 8, 1, 1}));
  EXPECT_THAT(Values(s2d[0]), ElementsAre(0, 4, 1, 5, 2, 6, 3, 7));
  // Larger: SpaceToDepth undoes DepthToSpace (DCR) on a 2x18x3x2 tensor, blocksize 3.
  const Tensor big = Random({2, 18, 3, 2}, 4);
  auto up = Run1("DepthToSpace", {{big}}, {{"blocksize", AInt(3)}});
  ASSERT_EQ(up[0].shape(), (Shape{2, 2, 9, 6}));
  auto back = Run1("SpaceToDepth", {{up[0]}}, {{"blocksize", AInt(3)}});
  EXPECT_EQ(MaxAbsDiff(back[0], big), 0.f);
  EXPECT_THAT(
      LoadOp("DepthToSpace", {{x}}, {{"blocksize", AInt(2)}, {"mode", AString("XYZ")}}).message(),
      HasSubstr("mode must be DCR or CRD"));
}

TEST(GatherNDTest, ElementsSlicesAndBatchDims) {
  const Tensor data = I64({2, 2}, {0, 1, 2, 3});
  EXPECT_THAT(IntValues(Run1("GatherND", {{data}, {I64({2, 2}, {0, 0, 1, 1})}})[0]),
              ElementsAre(0, 3));
  auto slices = Run1("GatherND", {{data}, {I64({2, 1}, {1, 0})}});
  EXPECT_EQ(slices[0].shape(), (Shape{2, 2}));
  EXPECT_THAT(IntValues(slices[0]), ElementsAre(2, 3, 0, 1));
  auto batched =
      Run1("GatherND", {{I64({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})}, {I64({2, 1}, {1, 0})}},
           {{"batch_dims", AInt(1)}});
  EXPECT_EQ(batched[0].shape(), (Shape{2, 2}));
  EXPECT_THAT(IntValues(batched[0]), ElementsAre(2, 3, 4, 5));
  EXPECT_THAT(Values(Run1("GatherND", {{F32({3}, {5, 6, 7})}, {I64({1, 1}, {-1})}})[0]),
              ElementsAre(7));
  auto bad = RunOp("GatherND", {{data}, {I64({1, 2}, {0, 2})}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("index 2 is out of range"));
}

TEST(ScatterNDTest, ReplacesSlicesAndReduces) {
  auto out = Run1("ScatterND", {{F32({8}, {1, 2, 3, 4, 5, 6, 7, 8})},
                                {I64({4, 1}, {4, 3, 1, 7})},
                                {F32({4}, {9, 10, 11, 12})}});
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 11, 3, 10, 9, 6, 7, 12));
  out = Run1("ScatterND", {{F32({2, 2}, {0, 0, 0, 0})}, {I64({1, 1}, {1})}, {F32({1, 2}, {7, 8})}});
  EXPECT_THAT(Values(out[0]), ElementsAre(0, 0, 7, 8));
  out = Run1("ScatterND", {{F32({4}, {1, 2, 3, 4})}, {I64({2, 1}, {0, 0})}, {F32({2}, {5, 6})}},
             {{"reduction", AString("add")}});
  EXPECT_THAT(Values(out[0]), ElementsAre(12, 2, 3, 4));
  out = Run1("ScatterND", {{I64({3}, {4, 5, 6})}, {I64({2, 1}, {2, -3})}, {I64({2}, {2, 9})}},
             {{"reduction", AString("mul")}});
  EXPECT_THAT(IntValues(out[0]), ElementsAre(36, 5, 12));
  EXPECT_THAT(LoadOp("ScatterND", {{F32({1}, {1})}, {I64({1, 1}, {0})}, {F32({1}, {1})}},
                     {{"reduction", AString("avg")}})
                  .message(),
              HasSubstr("reduction must be none, add, mul, max or min"));
}

TEST(ScatterElementsTest, AlongEitherAxisWithReductions) {
  auto out =
      Run1("ScatterElements",
           {{F32({1, 5}, {1, 2, 3, 4, 5})}, {I64({1, 2}, {1, 3})}, {F32({1, 2}, {1.1f, 2.1f})}},
           {{"axis", AInt(1)}});
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 1.1f, 3, 2.1f, 5));
  out = Run1("ScatterElements", {{F32({3, 3}, std::vector<float>(9, 0.f))},
                                 {I64({2, 3}, {1, 0, 2, 0, 2, 1})},
                                 {F32({2, 3}, {1, 1.1f, 1.2f, 2, 2.1f, 2.2f})}});
  EXPECT_THAT(Values(out[0]), ElementsAre(2, 1.1f, 0, 1, 0, 2.2f, 0, 2.1f, 1.2f));
  out = Run1("ScatterElements",
             {{F32({1, 5}, {1, 2, 3, 4, 5})}, {I64({1, 2}, {1, -4})}, {F32({1, 2}, {1.1f, 2.1f})}},
             {{"axis", AInt(1)}, {"reduction", AString("add")}});
  EXPECT_THAT(Values(out[0]), ElementsAreArray({1.f, 2.f + 1.1f + 2.1f, 3.f, 4.f, 5.f}));
  out = Run1("ScatterElements",
             {{F32({1, 3}, {1, 5, 3})}, {I64({1, 2}, {1, 2})}, {F32({1, 2}, {4, 4})}},
             {{"axis", AInt(1)}, {"reduction", AString("max")}});
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 5, 4));
}

// torch.scatter_add into a tensor smaller than its indices along the axis (a histogram):
// many updates to one element; the other axes must still fit.
TEST(ScatterElementsTest, IndicesLongerThanDataAlongTheAxis) {
  auto out = Run1("ScatterElements",
                  {{F32({2, 2}, {0, 0, 0, 0})},
                   {I64({2, 4}, {0, 1, 1, 1, 1, 0, 0, 0})},
                   {F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})}},
                  {{"axis", AInt(1)}, {"reduction", AString("add")}});
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 9, 21, 5));
  EXPECT_THAT(LoadOp("ScatterElements",
                     {{F32({1, 2}, {0, 0})}, {I64({2, 1}, {0, 1})}, {F32({2, 1}, {1, 2})}},
                     {{"axis", AInt(1)}})
                  .message(),
              HasSubstr("must not be larger than data in any dimension but the axis"));
}

// torch.gather: out[i][j] = data[i][index[i][j]] along axis 1 (data[index[i][j]][j] along
// 0); the ONNX documentation's examples, and indices smaller than data.
TEST(GatherElementsTest, AlongEitherAxis) {
  auto out = Run1("GatherElements", {{F32({2, 2}, {1, 2, 3, 4})}, {I64({2, 2}, {0, 0, 1, 0})}},
                  {{"axis", AInt(1)}});
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 1, 4, 3));
  out = Run1("GatherElements",
             {{I64({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})}, {I64({2, 3}, {1, 2, 0, 2, 0, 0})}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(IntValues(out[0]), ElementsAre(4, 8, 3, 7, 2, 3));
  out = Run1("GatherElements", {{F32({2, 3}, {1, 2, 3, 4, 5, 6})}, {I64({1, 1}, {-1})}},
             {{"axis", AInt(1)}});
  EXPECT_THAT(Values(out[0]), ElementsAre(3));
  auto bad = RunOp("GatherElements", {{F32({2, 2}, {1, 2, 3, 4})}, {I64({1, 1}, {2})}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("index 2 is out of range"));
  EXPECT_THAT(LoadOp("GatherElements", {{F32({2, 2}, {1, 2, 3, 4})}, {I64({1, 3}, {0, 0, 0})}},
                     {{"axis", AInt(0)}})
                  .message(),
              HasSubstr("do not fit data"));
}

TEST(ArgMaxTest, FirstOrLastExtremeAlongAnAxis) {
  const Tensor x = F32({2, 3}, {1, 5, 5, 7, 0, 7});
  auto out = Run1("ArgMax", {{x}}, {{"axis", AInt(1)}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 1}));
  EXPECT_EQ(out[0].dtype(), DataType::kInt64);
  EXPECT_THAT(IntValues(out[0]), ElementsAre(1, 0));
  out = Run1("ArgMax", {{x}}, {{"axis", AInt(-1)}, {"select_last_index", AInt(1)}});
  EXPECT_THAT(IntValues(out[0]), ElementsAre(2, 2));
  out = Run1("ArgMax", {{x}}, {{"keepdims", AInt(0)}});
  EXPECT_EQ(out[0].shape(), (Shape{3}));
  EXPECT_THAT(IntValues(out[0]), ElementsAre(1, 0, 1));
  out = Run1("ArgMin", {{x}}, {{"axis", AInt(1)}, {"keepdims", AInt(0)}});
  EXPECT_THAT(IntValues(out[0]), ElementsAre(0, 1));
  out = Run1("ArgMin", {{I64({2, 2}, {3, 3, 2, 9})}}, {{"select_last_index", AInt(1)}});
  EXPECT_THAT(IntValues(out[0]), ElementsAre(1, 0));
  EXPECT_THAT(LoadOp("ArgMax", {{x}}, {{"axis", AInt(2)}}).message(),
              HasSubstr("axis is out of range"));
}

TEST(InstanceNormalizationTest, NormalisesEachChannelOfEachItem) {
  // Channel 0 {1, 3}: mean 2, variance 1; channel 1 {0, 4}: mean 2, variance 4.
  auto out =
      Run1("InstanceNormalization",
           {{F32({1, 2, 2}, {1, 3, 0, 4})}, Const(F32({2}, {2, 1})), Const(F32({2}, {0.5f, 0}))},
           {{"epsilon", AFloat(0.f)}});
  EXPECT_LE(MaxAbsDiff(out[0], F32({1, 2, 2}, {-1.5f, 2.5f, -1, 1})), 1e-6f);
  out = Run1("InstanceNormalization",
             {{F32({2, 1, 1, 2}, {5, 5, -1, 1})}, Const(F32({1}, {1})), Const(F32({1}, {0}))});
  EXPECT_LE(MaxAbsDiff(out[0], F32({2, 1, 1, 2},
                                   {0, 0, -1 / std::sqrt(1 + 1e-5f), 1 / std::sqrt(1 + 1e-5f)})),
            1e-6f);
}

TEST(GroupNormalizationTest, NormalisesEachGroupWithScalesPerGroupOrChannel) {
  // Groups {1, 3} and {0, 4} over channels {0, 1} and {2, 3}.
  const Tensor x = F32({1, 4, 1}, {1, 3, 0, 4});
  auto out = Run1("GroupNormalization", {{x}, Const(F32({2}, {1, 2})), Const(F32({2}, {0, 1}))},
                  {{"num_groups", AInt(2)}, {"epsilon", AFloat(0.f)}});
  EXPECT_LE(MaxAbsDiff(out[0], F32({1, 4, 1}, {-1, 1, -1, 3})), 1e-6f);
  out = Run1("GroupNormalization",
             {{x}, Const(F32({4}, {1, 1, 1, 2})), Const(F32({4}, {0, 0, 0, 1}))},
             {{"num_groups", AInt(2)}, {"epsilon", AFloat(0.f)}});
  EXPECT_LE(MaxAbsDiff(out[0], F32({1, 4, 1}, {-1, 1, -1, 3})), 1e-6f);
  auto bad =
      RunOp("GroupNormalization", {{x}, Const(F32({3}, {1, 1, 1})), Const(F32({3}, {0, 0, 0}))},
            {{"num_groups", AInt(3)}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("num_groups must divide the 4 channels"));
}

}  // namespace
}  // namespace shoal::engine
