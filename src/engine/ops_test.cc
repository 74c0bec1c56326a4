// Unit tests of the element-wise, shape, indexing and reduction operators, one node at a
// time through the whole engine (load checks, plan preparation, kernels).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/internal/resize.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using namespace shoal::engine::testing;

TEST(ElementwiseTest, AddBroadcastsBothWays) {
  // [2,1] + [3] -> [2,3]: src0 broadcasts too, so this takes the engine's own loop.
  auto out = Run1("Add", {{F32({2, 1}, {1, 2})}, {F32({3}, {10, 20, 30})}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(Values(out[0]), ElementsAre(11, 21, 31, 12, 22, 32));
}

TEST(ElementwiseTest, SubAndDivWithBroadcastFirstOperand) {
  auto sub = Run1("Sub", {{F32({}, {10})}, {F32({3}, {1, 2, 3})}});
  EXPECT_EQ(sub[0].shape(), (Shape{3}));
  EXPECT_THAT(Values(sub[0]), ElementsAre(9, 8, 7));
  auto div = Run1("Div", {{F32({2, 3}, {2, 4, 6, 8, 10, 12})}, {F32({2, 1}, {2, 4})}});
  EXPECT_THAT(Values(div[0]), ElementsAre(1, 2, 3, 2, 2.5, 3));
}

TEST(ElementwiseTest, MulCommutesOntoOneDnnWhenSecondIsFull) {
  auto out = Run1("Mul", {{F32({1, 3}, {1, 2, 3})}, {F32({2, 3}, {1, 1, 1, 2, 2, 2})}});
  EXPECT_THAT(Values(out[0]), ElementsAre(1, 2, 3, 2, 4, 6));
}

TEST(ElementwiseTest, IntegerArithmeticIncludingDivisionByZero) {
  auto out = Run1("Div", {{I64({3}, {7, -7, 5})}, {I64({3}, {2, 2, 0})}});
  EXPECT_THAT(IntValues(out[0]), ElementsAre(3, -3, 0));
  auto add = Run1("Add", {{I64({2}, {1, 2})}, {Const(I64({}, {5}))}});
  EXPECT_THAT(IntValues(add[0]), ElementsAre(6, 7));
}

TEST(ElementwiseTest, MismatchedShapesFailNamingTheNode) {
  auto r = RunOp("Add", {{F32({2}, {1, 2})}, {F32({3}, {1, 2, 3})}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("test_Add"));
  EXPECT_THAT(r.status().message(), HasSubstr("do not broadcast"));
}

TEST(ElementwiseTest, EmptyTensors) {
  auto out = Run1("Add", {{F32({0, 3}, {})}, {F32({3}, {1, 2, 3})}});
  EXPECT_EQ(out[0].shape(), (Shape{0, 3}));
  auto relu = Run1("Relu", {{F32({0}, {})}});
  EXPECT_EQ(relu[0].shape(), (Shape{0}));
}

TEST(ElementwiseTest, UnaryMath) {
  const Tensor x = F32({4}, {-2, -0.5, 0.5, 2});
  auto check = [&](const std::string& op, std::function<float(float)> f,
                   std::map<std::string, Attribute> attrs = {}) {
    auto out = Run1(op, {{x}}, attrs);
    std::vector<float> want;
    for (float v : Values(x)) want.push_back(f(v));
    EXPECT_THAT(Values(out[0]), Pointwise(FloatNear(1e-5), want)) << op;
  };
  check("Relu", [](float v) { return std::max(v, 0.f); });
  check("LeakyRelu", [](float v) { return v < 0 ? 0.1f * v : v; }, {{"alpha", AFloat(0.1f)}});
  check("Sigmoid", [](float v) { return 1 / (1 + std::exp(-v)); });
  check("Tanh", [](float v) { return std::tanh(v); });
  check("Exp", [](float v) { return std::exp(v); });
  check("Abs", [](float v) { return std::fabs(v); });
  check("Neg", [](float v) { return -v; });
  check("Reciprocal", [](float v) { return 1 / v; });
  check("Erf", [](float v) { return std::erf(v); });
  check("HardSigmoid", [](float v) { return std::clamp(0.2f * v + 0.5f, 0.f, 1.f); });
  check("HardSigmoid", [](float v) { return std::clamp(v / 6 + 0.5f, 0.f, 1.f); },
        {{"alpha", AFloat(1.f / 6)}, {"beta", AFloat(0.5f)}});
  check("HardSwish", [](float v) { return v * std::clamp(v / 6 + 0.5f, 0.f, 1.f); });
  check("Gelu", [](float v) { return 0.5f * v * (1 + std::erf(v / std::sqrt(2.f))); });
  check("Gelu",
        [](float v) {
          return 0.5f * v * (1 + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
        },
        {{"approximate", AString("tanh")}});
  auto sq = Run1("Sqrt", {{F32({3}, {0, 4, 9})}});
  EXPECT_THAT(Values(sq[0]), ElementsAre(0, 2, 3));
  auto lg = Run1("Log", {{F32({2}, {1, std::exp(2.f)})}});
  EXPECT_THAT(Values(lg[0]), Pointwise(FloatNear(1e-5), std::vector<float>{0, 2}));
}

TEST(ElementwiseTest, IntegerAbsNegRelu) {
  EXPECT_THAT(IntValues(Run1("Abs", {{I64({2}, {-3, 4})}})[0]), ElementsAre(3, 4));
  EXPECT_THAT(IntValues(Run1("Neg", {{I64({2}, {-3, 4})}})[0]), ElementsAre(3, -4));
  EXPECT_FALSE(RunOp("Sigmoid", {{I64({1}, {1})}}).ok());
}

TEST(ElementwiseTest, PowWithScalarAndTensorExponents) {
  auto a = Run1("Pow", {{F32({3}, {1, 2, 3})}, {Const(F32({}, {2}))}});
  EXPECT_THAT(Values(a[0]), Pointwise(FloatNear(1e-5), std::vector<float>{1, 4, 9}));
  auto b = Run1("Pow", {{F32({2, 1}, {2, 3})}, {F32({2}, {0, 3})}});
  EXPECT_THAT(Values(b[0]), Pointwise(FloatNear(1e-4), std::vector<float>{1, 8, 1, 27}));
  auto c = Run1("Pow", {{F32({2}, {2, 3})}, {I64({}, {2})}});
  EXPECT_THAT(Values(c[0]), Pointwise(FloatNear(1e-5), std::vector<float>{4, 9}));
}

TEST(ElementwiseTest, PReluBroadcastsSlope) {
  auto out = Run1("PRelu", {{F32({1, 2, 2}, {-1, 1, -2, 2})}, {Const(F32({2, 1}, {0.5, 0.25}))}});
  EXPECT_THAT(Values(out[0]), ElementsAre(-0.5, 1, -0.5, 2));
}

TEST(ElementwiseTest, ClipWithOptionalBounds) {
  auto both =
      Run1("Clip", {{F32({4}, {-2, -0.5, 0.5, 2})}, {Const(F32({}, {-1}))}, {Const(F32({}, {1}))}});
  EXPECT_THAT(Values(both[0]), ElementsAre(-1, -0.5, 0.5, 1));
  auto max_only = Run1("Clip", {{F32({3}, {-2, 0, 8})}, Omitted(), {Const(F32({}, {6}))}});
  EXPECT_THAT(Values(max_only[0]), ElementsAre(-2, 0, 6));
  auto none = Run1("Clip", {{F32({2}, {-1e30f, 1e30f})}});
  EXPECT_THAT(Values(none[0]), ElementsAre(-1e30f, 1e30f));
  auto ints = Run1("Clip", {{I64({3}, {-5, 0, 5})}, {Const(I64({}, {-1}))}, {Const(I64({}, {1}))}});
  EXPECT_THAT(IntValues(ints[0]), ElementsAre(-1, 0, 1));
}

TEST(ElementwiseTest, ComparisonsWhereNot) {
  auto eq = Run1("Equal", {{I64({3}, {1, 2, 3})}, {I64({}, {2})}});
  EXPECT_EQ(eq[0].dtype(), DataType::kBool);
  EXPECT_THAT(eq[0].values<uint8_t>(), ElementsAre(0, 1, 0));
  auto lt = Run1("Less", {{F32({3}, {1, 2, 3})}, {F32({3}, {2, 2, 2})}});
  EXPECT_THAT(lt[0].values<uint8_t>(), ElementsAre(1, 0, 0));
  auto gt = Run1("Greater", {{F32({3}, {1, 2, 3})}, {F32({1}, {2})}});
  EXPECT_THAT(gt[0].values<uint8_t>(), ElementsAre(0, 0, 1));
  auto no = Run1("Not", {{Bool({2}, {1, 0})}});
  EXPECT_THAT(no[0].values<uint8_t>(), ElementsAre(0, 1));
  auto w = Run1("Where", {{Bool({2, 1}, {1, 0})}, {F32({2}, {1, 2})}, {F32({}, {-1})}});
  EXPECT_EQ(w[0].shape(), (Shape{2, 2}));
  EXPECT_THAT(Values(w[0]), ElementsAre(1, 2, -1, -1));
}

TEST(ElementwiseTest, VariadicMinMax) {
  auto mx = Run1("Max", {{F32({3}, {1, 5, 3})}, {F32({3}, {4, 2, 6})}, {F32({}, {3.5})}});
  EXPECT_THAT(Values(mx[0]), ElementsAre(4, 5, 6));
  auto mn = Run1("Min", {{F32({2, 1}, {1, 5})}, {F32({2}, {2, 3})}});
  EXPECT_THAT(Values(mn[0]), ElementsAre(1, 1, 2, 3));
  auto one = Run1("Max", {{I64({2}, {7, 8})}});
  EXPECT_THAT(IntValues(one[0]), ElementsAre(7, 8));
}

TEST(ElementwiseTest, CastSaturatesAndConvertsBool) {
  auto f2i = Run1("Cast", {{F32({4}, {1.7f, -1.7f, 1e20f, NAN})}}, {{"to", AInt(6)}});  // INT32
  EXPECT_EQ(f2i[0].dtype(), DataType::kInt32);
  EXPECT_THAT(f2i[0].values<int32_t>(), ElementsAre(1, -1, INT32_MAX, 0));
  auto i2b = Run1("Cast", {{I64({3}, {0, 2, -1})}}, {{"to", AInt(9)}});
  EXPECT_THAT(i2b[0].values<uint8_t>(), ElementsAre(0, 1, 1));
  auto b2f = Run1("Cast", {{Bool({2}, {1, 0})}}, {{"to", AInt(1)}});
  EXPECT_THAT(Values(b2f[0]), ElementsAre(1, 0));
  EXPECT_FALSE(LoadOp("Cast", {{F32({1}, {1})}}, {{"to", AInt(99)}}).ok());
}

TEST(ShapeOpsTest, ReshapeWithZeroAndMinusOne) {
  auto out = Run1("Reshape", {{Random({2, 3, 4}, 1)}, {Const(I64({3}, {0, -1, 2}))}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 6, 2}));
  auto az =
      RunOp("Reshape", {{F32({0, 3}, {})}, {Const(I64({2}, {3, 0}))}}, {{"allowzero", AInt(1)}});
  ASSERT_TRUE(az.ok()) << az.status().ToString();
  EXPECT_EQ((*az)[0].shape(), (Shape{3, 0}));
  EXPECT_FALSE(RunOp("Reshape", {{Random({2, 3}, 1)}, {Const(I64({1}, {4}))}}).ok());
  EXPECT_FALSE(RunOp("Reshape", {{Random({2, 3}, 1)}, {Const(I64({2}, {-1, -1}))}}).ok());
}

TEST(ShapeOpsTest, ReshapeNeedsShapeKnownAtPlanTime) {
  auto r = RunOp("Reshape", {{Random({2, 3}, 1)}, {I64({1}, {6})}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("constant or computed from shapes"));
}

TEST(ShapeOpsTest, FlattenSqueezeUnsqueezeNegativeAxes) {
  EXPECT_EQ(Run1("Flatten", {{Random({2, 3, 4}, 1)}}, {{"axis", AInt(-1)}})[0].shape(),
            (Shape{6, 4}));
  EXPECT_EQ(Run1("Flatten", {{Random({2, 3}, 1)}}, {{"axis", AInt(0)}})[0].shape(), (Shape{1, 6}));
  EXPECT_EQ(Run1("Squeeze", {{Random({1, 3, 1}, 1)}, {Const(I64({1}, {-1}))}})[0].shape(),
            (Shape{1, 3}));
  EXPECT_EQ(Run1("Squeeze", {{Random({1, 3, 1}, 1)}})[0].shape(), (Shape{3}));
  EXPECT_EQ(Run1("Squeeze", {{Random({1, 3}, 1)}}, {{"axes", AInts({0})}}, 1, 11)[0].shape(),
            (Shape{3}));
  EXPECT_FALSE(RunOp("Squeeze", {{Random({2, 3}, 1)}, {Const(I64({1}, {0}))}}).ok());
  EXPECT_EQ(Run1("Unsqueeze", {{Random({3}, 1)}, {Const(I64({2}, {0, -1}))}})[0].shape(),
            (Shape{1, 3, 1}));
  EXPECT_EQ(Run1("Unsqueeze", {{Random({3}, 1)}}, {{"axes", AInts({1})}}, 1, 12)[0].shape(),
            (Shape{3, 1}));
}

TEST(ShapeOpsTest, ViewsKeepValues) {
  const Tensor x = Random({2, 3}, 7);
  auto out = Run1("Reshape", {{x}, {Const(I64({1}, {6}))}});
  EXPECT_THAT(Values(out[0]), ElementsAreArray(Values(x)));
  EXPECT_THAT(Values(Run1("Identity", {{x}})[0]), ElementsAreArray(Values(x)));
  EXPECT_THAT(Values(Run1("Dropout", {{x}})[0]), ElementsAreArray(Values(x)));
}

TEST(ShapeOpsTest, TransposeDefaultAndPerm) {
  auto t = Run1("Transpose", {{F32({2, 3}, {1, 2, 3, 4, 5, 6})}});
  EXPECT_EQ(t[0].shape(), (Shape{3, 2}));
  EXPECT_THAT(Values(t[0]), ElementsAre(1, 4, 2, 5, 3, 6));
  auto p = Run1("Transpose", {{F32({1, 2, 3}, {1, 2, 3, 4, 5, 6})}}, {{"perm", AInts({2, 0, 1})}});
  EXPECT_EQ(p[0].shape(), (Shape{3, 1, 2}));
  EXPECT_THAT(Values(p[0]), ElementsAre(1, 4, 2, 5, 3, 6));
  EXPECT_FALSE(RunOp("Transpose", {{Random({2, 3}, 1)}}, {{"perm", AInts({0, 0})}}).ok());
}

// Transpose against index arithmetic, byte for byte: inner axis kept or moved, sizes
// that are not multiples of a block, merged and size-1 axes, one element, 8x8 blocks
// (where oneDNN has a register transpose of its own), and every element size, with bit
// patterns a conversion would change (signalling NaNs, subnormals, -0, large integers).
// Two-byte elements are INT16 and BF16: an FP16 graph computes in FP32 (fp16_lowering.h),
// so its Transpose never moves FP16 bits.
TEST(ShapeOpsTest, TransposeMatchesIndexArithmetic) {
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
    DataType dtype;
  };
  const Case cases[] = {
      {{8, 128, 12, 64}, {0, 2, 1, 3}, DataType::kFp32},  // BERT's head split
      {{8, 128, 12, 64}, {0, 2, 3, 1}, DataType::kFp32},  // K transposed
      {{8, 12, 128, 64}, {0, 2, 1, 3}, DataType::kFp32},  // heads merged back
      {{3, 37, 45}, {0, 2, 1}, DataType::kFp32},
      {{2, 3, 4}, {2, 0, 1}, DataType::kFp32},  // merges into a 4 x 6 transpose
      {{1, 5, 1, 7}, {3, 2, 1, 0}, DataType::kFp32},
      {{1, 1}, {1, 0}, DataType::kFp32},
      {{5, 6, 7, 8, 9}, {4, 2, 0, 3, 1}, DataType::kInt64},
      {{33, 65, 17}, {1, 2, 0}, DataType::kUint8},
      {{40, 70}, {1, 0}, DataType::kInt16},
      {{300, 500}, {1, 0}, DataType::kInt32},
      // 8x8 blocks, where oneDNN has a register-transpose kernel of its own.
      {{8, 8}, {1, 0}, DataType::kFp32},
      {{3, 8, 8}, {0, 2, 1}, DataType::kFp32},
      {{8, 8}, {1, 0}, DataType::kInt32},
      {{16, 16}, {1, 0}, DataType::kInt16},
      {{4, 8, 8}, {0, 2, 1}, DataType::kBf16},
      {{8, 8}, {1, 0}, DataType::kUint8},
      {{8, 8, 8, 8}, {1, 0, 3, 2}, DataType::kInt8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.shape) + " perm " + ::testing::PrintToString(c.perm));
    Tensor x = Tensor::Allocate(c.dtype, c.shape);
    const size_t size = DataTypeSize(c.dtype);
    auto* bytes = static_cast<uint8_t*>(x.mutable_data());
    uint64_t state = 88172645463325252ull;  // xorshift: every byte value, no pattern
    for (size_t i = 0; i < x.byte_size(); ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      bytes[i] = static_cast<uint8_t>(state);
    }
    if (size == 4 && x.element_count() >= 4) {
      const uint32_t special[] = {0x7F800001u, 0x00000001u, 0x80000000u, 0x7FFFFFFFu};
      std::memcpy(bytes, special, sizeof(special));
    } else if (size == 2 && x.element_count() >= 3) {
      const uint16_t special[] = {0x0001, 0x7C01, 0x7F81};  // subnormal, fp16/bf16 sNaN
      std::memcpy(bytes, special, sizeof(special));
    }
    auto out = RunOp("Transpose", {{x}}, {{"perm", AInts(c.perm)}});
    ASSERT_TRUE(out.ok()) << out.status().message();
    const Tensor& y = (*out)[0];
    const size_t r = c.shape.size();
    Shape want_shape(r);
    for (size_t i = 0; i < r; ++i) want_shape[i] = c.shape[c.perm[i]];
    ASSERT_EQ(y.shape(), want_shape);
    std::vector<int64_t> in_strides(r, 1);
    for (size_t i = r - 1; i-- > 0;) in_strides[i] = in_strides[i + 1] * c.shape[i + 1];
    const auto* got = static_cast<const uint8_t*>(y.data());
    int64_t mismatches = 0;
    for (int64_t o = 0; o < y.element_count(); ++o) {
      int64_t rest = o, in = 0;
      for (size_t i = r; i-- > 0;) {
        in += (rest % want_shape[i]) * in_strides[c.perm[i]];
        rest /= want_shape[i];
      }
      mismatches += std::memcmp(got + o * size, bytes + in * size, size) != 0;
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(ShapeOpsTest, ConcatIncludingEmptyInputs) {
  auto c = Run1("Concat", {{F32({2, 1}, {1, 2})}, {F32({2, 0}, {})}, {F32({2, 2}, {3, 4, 5, 6})}},
                {{"axis", AInt(-1)}});
  EXPECT_EQ(c[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(Values(c[0]), ElementsAre(1, 3, 4, 2, 5, 6));
  auto i = Run1("Concat", {{I64({1}, {1})}, {Const(I64({2}, {2, 3}))}}, {{"axis", AInt(0)}});
  EXPECT_THAT(IntValues(i[0]), ElementsAre(1, 2, 3));
  EXPECT_FALSE(
      RunOp("Concat", {{F32({2, 1}, {1, 2})}, {F32({3, 1}, {1, 2, 3})}}, {{"axis", AInt(1)}}).ok());
}

TEST(ShapeOpsTest, SplitEqualAndExplicit) {
  auto s = Run1("Split", {{F32({5}, {1, 2, 3, 4, 5})}, {Const(I64({2}, {2, 3}))}}, {}, 2);
  EXPECT_THAT(Values(s[0]), ElementsAre(1, 2));
  EXPECT_THAT(Values(s[1]), ElementsAre(3, 4, 5));
  auto e = Run1("Split", {{F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})}}, {{"axis", AInt(-1)}}, 2);
  EXPECT_THAT(Values(e[0]), ElementsAre(1, 2, 5, 6));
  EXPECT_THAT(Values(e[1]), ElementsAre(3, 4, 7, 8));
  auto old = Run1("Split", {{F32({3}, {1, 2, 3})}}, {{"split", AInts({1, 2})}}, 2, 11);
  EXPECT_THAT(Values(old[1]), ElementsAre(2, 3));
  EXPECT_FALSE(RunOp("Split", {{F32({3}, {1, 2, 3})}, {Const(I64({2}, {1, 1}))}}, {}, 2).ok());
}

// Opset 18's num_outputs: ceil(d / n) per output, the last one smaller.
TEST(ShapeOpsTest, SplitNumOutputsAtOpset18) {
  auto s = Run1("Split", {{F32({7}, {1, 2, 3, 4, 5, 6, 7})}}, {{"num_outputs", AInt(3)}}, 3, 18);
  EXPECT_THAT(Values(s[0]), ElementsAre(1, 2, 3));
  EXPECT_THAT(Values(s[1]), ElementsAre(4, 5, 6));
  EXPECT_THAT(Values(s[2]), ElementsAre(7));
  auto wrong = RunOp("Split", {{F32({4}, {1, 2, 3, 4})}}, {{"num_outputs", AInt(3)}}, 2, 18);
  EXPECT_THAT(wrong.status().message(), HasSubstr("num_outputs is 3 for 2 outputs"));
  auto both = RunOp("Split", {{F32({4}, {1, 2, 3, 4})}, {Const(I64({2}, {2, 2}))}},
                    {{"num_outputs", AInt(2)}}, 2, 18);
  EXPECT_THAT(both.status().message(), HasSubstr("both given"));
}

TEST(ShapeOpsTest, ShapeIsKnownAtPlanTimeAndFeedsReshape) {
  auto s = Run1("Shape", {{Random({2, 3, 4}, 1)}});
  EXPECT_THAT(IntValues(s[0]), ElementsAre(2, 3, 4));
  auto part = Run1("Shape", {{Random({2, 3, 4}, 1)}}, {{"start", AInt(-2)}});
  EXPECT_THAT(IntValues(part[0]), ElementsAre(3, 4));
}

TEST(ShapeOpsTest, ExpandTileConstantOfShapeRange) {
  auto e = Run1("Expand", {{F32({2, 1}, {1, 2})}, {Const(I64({3}, {2, 1, 3}))}});
  EXPECT_EQ(e[0].shape(), (Shape{2, 2, 3}));
  EXPECT_THAT(Values(e[0]), ElementsAre(1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2));
  auto t = Run1("Tile", {{F32({2}, {1, 2})}, {Const(I64({1}, {3}))}});
  EXPECT_THAT(Values(t[0]), ElementsAre(1, 2, 1, 2, 1, 2));
  auto t2 = Run1("Tile", {{F32({1, 2}, {1, 2})}, {Const(I64({2}, {2, 0}))}});
  EXPECT_EQ(t2[0].shape(), (Shape{2, 0}));
  auto c =
      Run1("ConstantOfShape", {{Const(I64({2}, {2, 2}))}}, {{"value", ATensor(I64({1}, {7}))}});
  EXPECT_EQ(c[0].dtype(), DataType::kInt64);
  EXPECT_THAT(IntValues(c[0]), ElementsAre(7, 7, 7, 7));
  auto z = Run1("ConstantOfShape", {{Const(I64({1}, {3}))}});
  EXPECT_THAT(Values(z[0]), ElementsAre(0, 0, 0));
  auto r = Run1("Range", {{Const(I64({}, {10}))}, {Const(I64({}, {4}))}, {Const(I64({}, {-3}))}});
  EXPECT_THAT(IntValues(r[0]), ElementsAre(10, 7));
  auto rf = Run1("Range", {{Const(F32({}, {0}))}, {Const(F32({}, {1}))}, {Const(F32({}, {0.25}))}});
  EXPECT_THAT(Values(rf[0]), ElementsAre(0, 0.25, 0.5, 0.75));
  EXPECT_FALSE(
      RunOp("Range", {{Const(I64({}, {0}))}, {Const(I64({}, {4}))}, {Const(I64({}, {0}))}}).ok());
}

TEST(IndexingTest, SliceStepsNegativeAndClamping) {
  const Tensor x = F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto a =
      Run1("Slice",
           {{x}, {Const(I64({1}, {1}))}, {Const(I64({1}, {INT64_MAX}))}, {Const(I64({1}, {-1}))}});
  EXPECT_EQ(a[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(Values(a[0]), ElementsAre(2, 3, 4, 6, 7, 8));
  auto b = Run1("Slice", {{x},
                          {Const(I64({1}, {-1}))},
                          {Const(I64({1}, {INT64_MIN}))},
                          {Const(I64({1}, {1}))},
                          {Const(I64({1}, {-2}))}});
  EXPECT_THAT(Values(b[0]), ElementsAre(4, 2, 8, 6));
  auto empty =
      Run1("Slice", {{x}, {Const(I64({1}, {3}))}, {Const(I64({1}, {1}))}, {Const(I64({1}, {1}))}});
  EXPECT_EQ(empty[0].shape(), (Shape{2, 0}));
  auto two = Run1("Slice", {{x}, {Const(I64({2}, {1, 0}))}, {Const(I64({2}, {2, 1}))}});
  EXPECT_THAT(Values(two[0]), ElementsAre(5));
  // Walking backwards over an empty axis gives an empty axis (its clamp once had no valid
  // range: [0, -1]).
  const Tensor none = F32({2, 0}, {});
  auto back = Run1("Slice", {{none},
                             {Const(I64({1}, {-1}))},
                             {Const(I64({1}, {INT64_MIN}))},
                             {Const(I64({1}, {1}))},
                             {Const(I64({1}, {-1}))}});
  EXPECT_EQ(back[0].shape(), (Shape{2, 0}));
}

TEST(IndexingTest, GatherAxesAndNegativeIndices) {
  const Tensor x = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  auto g0 = Run1("Gather", {{x}, {I64({2}, {2, -3})}});
  EXPECT_EQ(g0[0].shape(), (Shape{2, 2}));
  EXPECT_THAT(Values(g0[0]), ElementsAre(5, 6, 1, 2));
  auto g1 = Run1("Gather", {{x}, {Const(I64({}, {1}))}}, {{"axis", AInt(-1)}});
  EXPECT_EQ(g1[0].shape(), (Shape{3}));
  EXPECT_THAT(Values(g1[0]), ElementsAre(2, 4, 6));
  auto bad = RunOp("Gather", {{x}, {I64({1}, {3})}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("out of range"));
  auto emb = Run1("Gather", {{Const(F32({2, 2}, {1, 2, 3, 4}))}, {I32({1, 2}, {1, 0})}});
  EXPECT_EQ(emb[0].shape(), (Shape{1, 2, 2}));
  EXPECT_THAT(Values(emb[0]), ElementsAre(3, 4, 1, 2));
}

TEST(IndexingTest, PadModes) {
  const Tensor x = F32({1, 3}, {1, 2, 3});
  const In pads = Const(I64({4}, {0, 2, 0, 1}));
  auto c = Run1("Pad", {{x}, pads, {Const(F32({}, {9}))}});
  EXPECT_THAT(Values(c[0]), ElementsAre(9, 9, 1, 2, 3, 9));
  auto e = Run1("Pad", {{x}, pads}, {{"mode", AString("edge")}});
  EXPECT_THAT(Values(e[0]), ElementsAre(1, 1, 1, 2, 3, 3));
  auto r = Run1("Pad", {{x}, pads}, {{"mode", AString("reflect")}});
  EXPECT_THAT(Values(r[0]), ElementsAre(3, 2, 1, 2, 3, 2));
  auto crop = Run1("Pad", {{x}, {Const(I64({4}, {0, -1, 0, 0}))}});
  EXPECT_THAT(Values(crop[0]), ElementsAre(2, 3));
  auto bad = LoadOp("Pad", {{x}, pads}, {{"mode", AString("wrap")}});
  EXPECT_THAT(bad.message(), HasSubstr("mode 'wrap' is not supported"));
}

// Opset 18's axes input: pads speaks of the listed axes only (starts, then ends).
TEST(IndexingTest, PadAxesAtOpset18) {
  const Tensor x = F32({2, 2}, {1, 2, 3, 4});
  auto last =
      Run1("Pad", {{x}, {Const(I64({2}, {1, 0}))}, Omitted(), {Const(I64({1}, {-1}))}}, {}, 1, 18);
  EXPECT_EQ(last[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(Values(last[0]), ElementsAre(0, 1, 2, 0, 3, 4));
  auto first =
      Run1("Pad", {{x}, {Const(I64({2}, {0, 1}))}, {Const(F32({}, {7}))}, {Const(I64({1}, {0}))}},
           {}, 1, 18);
  EXPECT_EQ(first[0].shape(), (Shape{3, 2}));
  EXPECT_THAT(Values(first[0]), ElementsAre(1, 2, 3, 4, 7, 7));
  auto bad = RunOp("Pad", {{x}, {Const(I64({4}, {1, 0, 0, 0}))}, Omitted(), {Const(I64({1}, {1}))}},
                   {}, 1, 18);
  EXPECT_THAT(bad.status().message(), HasSubstr("2 * 1 entries"));
  auto repeat =
      RunOp("Pad", {{x}, {Const(I64({4}, {1, 1, 0, 0}))}, Omitted(), {Const(I64({2}, {1, -1}))}},
            {}, 1, 18);
  EXPECT_THAT(repeat.status().message(), HasSubstr("axes repeat"));
}

TEST(IndexingTest, ResizeNearestAndLinear) {
  const Tensor x = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  const In scales = Const(F32({4}, {1, 1, 2, 2}));
  auto n = Run1("Resize", {{x}, Omitted(), scales}, {{"mode", AString("nearest")}});
  EXPECT_EQ(n[0].shape(), (Shape{1, 1, 4, 4}));
  EXPECT_THAT(Values(n[0]), ElementsAre(1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4));
  auto l = Run1(
      "Resize", {{x}, Omitted(), Omitted(), {Const(I64({4}, {1, 1, 1, 4}))}},
      {{"mode", AString("linear")}, {"coordinate_transformation_mode", AString("align_corners")}});
  EXPECT_EQ(l[0].shape(), (Shape{1, 1, 1, 4}));
  EXPECT_THAT(Values(l[0]), Pointwise(FloatNear(1e-5), std::vector<float>{1, 4.f / 3, 5.f / 3, 2}));
  auto hp =
      Run1("Resize", {{F32({1, 1, 1, 2}, {0, 1})}, Omitted(), {Const(F32({4}, {1, 1, 1, 2}))}},
           {{"mode", AString("linear")}});
  EXPECT_THAT(Values(hp[0]), Pointwise(FloatNear(1e-6), std::vector<float>{0, 0.25, 0.75, 1}));
  EXPECT_THAT(LoadOp("Resize", {{x}, Omitted(), scales}, {{"mode", AString("lanczos")}}).message(),
              HasSubstr("mode 'lanczos' is not supported"));
}

// ComputeResizeGeometry (what the GPU path reads) against the CPU engine's own Resize:
// its taps, applied the plain way, give the CPU's output for every mode, coordinate
// transformation, exclude_outside, a crop with extrapolation, antialias, and sizes.
TEST(IndexingTest, ResizeGeometryReproducesTheCpuOutputInEveryMode) {
  std::vector<float> values;
  for (int i = 0; i < 2 * 5 * 7; ++i) values.push_back(std::sin(0.7f * static_cast<float>(i)));
  const Tensor x = F32({1, 2, 5, 7}, values);
  struct Case {
    std::string what;
    std::map<std::string, Attribute> attrs;
    Tensor roi, scales, sizes;  // empty: omitted
  };
  const Tensor up = F32({4}, {1, 1, 1.6f, 2});
  const Tensor down = F32({4}, {1, 1, 0.6f, 0.5f});
  const std::vector<Case> cases = {
      {"nearest asymmetric floor",
       {{"mode", AString("nearest")},
        {"coordinate_transformation_mode", AString("asymmetric")},
        {"nearest_mode", AString("floor")}},
       {},
       up,
       {}},
      {"nearest half_pixel round_prefer_ceil by sizes",
       {{"mode", AString("nearest")}, {"nearest_mode", AString("round_prefer_ceil")}},
       {},
       {},
       I64({4}, {1, 2, 3, 11})},
      {"linear half_pixel", {{"mode", AString("linear")}}, {}, up, {}},
      {"linear align_corners down",
       {{"mode", AString("linear")}, {"coordinate_transformation_mode", AString("align_corners")}},
       {},
       down,
       {}},
      {"linear pytorch_half_pixel",
       {{"mode", AString("linear")},
        {"coordinate_transformation_mode", AString("pytorch_half_pixel")}},
       {},
       up,
       {}},
      {"cubic", {{"mode", AString("cubic")}}, {}, up, {}},
      {"cubic exclude_outside a=-0.5",
       {{"mode", AString("cubic")}, {"exclude_outside", AInt(1)}, {"cubic_coeff_a", AFloat(-0.5f)}},
       {},
       up,
       {}},
      {"linear tf_crop_and_resize",
       {{"mode", AString("linear")},
        {"coordinate_transformation_mode", AString("tf_crop_and_resize")},
        {"extrapolation_value", AFloat(-3.f)}},
       F32({8}, {0, 0, -0.2f, 0.1f, 1, 1, 0.9f, 1.3f}),
       {},
       I64({4}, {1, 2, 4, 6})},
      {"linear antialias down",
       {{"mode", AString("linear")}, {"antialias", AInt(1)}},
       {},
       down,
       {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto in = [](const Tensor& t) { return t.empty() ? Omitted() : Const(t); };
    const std::vector<Tensor> cpu =
        Run1("Resize", {{x}, in(c.roi), in(c.scales), in(c.sizes)}, c.attrs, 1, 18);
    ASSERT_EQ(cpu.size(), 1u);
    GraphBuilder b;
    std::vector<int> inputs = {b.Input("x", x.shape())};
    inputs.push_back(c.roi.empty() ? -1 : b.Constant("roi", c.roi));
    inputs.push_back(c.scales.empty() ? -1 : b.Constant("scales", c.scales));
    inputs.push_back(c.sizes.empty() ? -1 : b.Constant("sizes", c.sizes));
    Graph graph = b.Finish(b.Op("Resize", "y", inputs, c.attrs));
    graph.opset = 18;
    PrepareContext ctx;
    ctx.graph = &graph;
    ctx.node_index = 0;
    for (int v : inputs) {
      ctx.in_values.push_back(v);
      ctx.in_dtypes.push_back(v < 0 ? DataType::kInvalid : graph.values[v].dtype);
      ctx.in_shapes.push_back(v < 0            ? Shape{}
                              : v == inputs[0] ? x.shape()
                                               : graph.values[v].constant.shape());
      ctx.in_data.push_back(v < 0 || v == inputs[0] ? nullptr : &graph.values[v].constant);
    }
    auto g = internal::ComputeResizeGeometry(ctx);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_EQ(g->out, cpu[0].shape());
    const Shape& out = g->out;
    const std::vector<float> got = Values(cpu[0]);
    std::vector<int64_t> coord(4, 0);
    for (size_t i = 0; i < got.size(); ++i) {
      bool outside = false;
      for (int d = 0; d < 4; ++d) outside = outside || g->taps[d][coord[d]].outside;
      double want = g->extrapolation;
      if (!outside) {
        want = 0;
        for (size_t a = 0; a < g->taps[0][coord[0]].idx.size(); ++a)
          for (size_t bb = 0; bb < g->taps[1][coord[1]].idx.size(); ++bb)
            for (size_t cc = 0; cc < g->taps[2][coord[2]].idx.size(); ++cc)
              for (size_t dd = 0; dd < g->taps[3][coord[3]].idx.size(); ++dd) {
                const auto& t0 = g->taps[0][coord[0]];
                const auto& t1 = g->taps[1][coord[1]];
                const auto& t2 = g->taps[2][coord[2]];
                const auto& t3 = g->taps[3][coord[3]];
                const int64_t at = ((t0.idx[a] * 2 + t1.idx[bb]) * 5 + t2.idx[cc]) * 7 + t3.idx[dd];
                want += static_cast<double>(t0.w[a]) * t1.w[bb] * t2.w[cc] * t3.w[dd] * values[at];
              }
      }
      ASSERT_NEAR(got[i], want, 1e-5) << "element " << i;
      for (int d = 3; d >= 0; --d) {
        if (++coord[d] < out[d]) break;
        coord[d] = 0;
      }
    }
  }
  // Sizes known only at run time: not a geometry that can be fixed now.
  GraphBuilder b;
  const int xv = b.Input("x", x.shape());
  const int sizes = b.Input("sizes", {4}, DataType::kInt64);
  Graph graph = b.Finish(b.Op("Resize", "y", {xv, -1, -1, sizes}, {}));
  PrepareContext ctx;
  ctx.graph = &graph;
  ctx.node_index = 0;
  ctx.in_values = {xv, -1, -1, sizes};
  ctx.in_dtypes = {DataType::kFp32, DataType::kInvalid, DataType::kInvalid, DataType::kInt64};
  ctx.in_shapes = {x.shape(), {}, {}, {4}};
  ctx.in_data = {nullptr, nullptr, nullptr, nullptr};
  EXPECT_EQ(internal::ComputeResizeGeometry(ctx).status().code(), StatusCode::kFailedPrecondition);
}

// The examples of ONNX's Resize documentation (first rows of the 8x8 cubic outputs).
TEST(IndexingTest, ResizeCubicAndTfCropAndResize) {
  std::vector<float> iota16;
  for (int i = 1; i <= 16; ++i) iota16.push_back(static_cast<float>(i));
  const Tensor x = F32({1, 1, 4, 4}, iota16);
  const In up2 = Const(F32({4}, {1, 1, 2, 2}));
  auto first_row = [](const Tensor& t) {
    auto v = Values(t);
    return std::vector<float>(v.begin(), v.begin() + std::min<size_t>(8, v.size()));
  };
  auto c = Run1("Resize", {{x}, Omitted(), up2}, {{"mode", AString("cubic")}});
  EXPECT_EQ(c[0].shape(), (Shape{1, 1, 8, 8}));
  EXPECT_THAT(first_row(c[0]),
              Pointwise(FloatNear(1e-5),
                        std::vector<float>{0.47265625f, 0.76953125f, 1.24609375f, 1.875f, 2.28125f,
                                           2.91015625f, 3.38671875f, 3.68359375f}));
  EXPECT_THAT(Values(c[0])[8], FloatNear(1.66015625f, 1e-5));
  auto ex = Run1(
      "Resize", {{x}, Omitted(), up2},
      {{"mode", AString("cubic")}, {"cubic_coeff_a", AFloat(-0.5f)}, {"exclude_outside", AInt(1)}});
  EXPECT_THAT(first_row(ex[0]),
              Pointwise(FloatNear(1e-5),
                        std::vector<float>{0.55882353f, 0.81494204f, 1.35698249f, 1.89705882f,
                                           2.39705882f, 2.93713516f, 3.47917561f, 3.73529412f}));
  auto as =
      Run1("Resize", {{x}, Omitted(), up2},
           {{"mode", AString("cubic")}, {"coordinate_transformation_mode", AString("asymmetric")}});
  EXPECT_THAT(first_row(as[0]),
              Pointwise(FloatNear(1e-5),
                        std::vector<float>{1, 1.40625f, 2, 2.5f, 3, 3.59375f, 4, 4.09375f}));
  const In sizes = Const(I64({4}, {1, 1, 3, 3}));
  const std::map<std::string, Attribute> crop = {
      {"mode", AString("linear")},
      {"coordinate_transformation_mode", AString("tf_crop_and_resize")}};
  auto cr =
      Run1("Resize", {{x}, Const(F32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 0.6f, 0.8f})), Omitted(), sizes},
           crop);
  EXPECT_EQ(cr[0].shape(), (Shape{1, 1, 3, 3}));
  EXPECT_THAT(Values(cr[0]),
              Pointwise(FloatNear(1e-4),
                        std::vector<float>{7.6f, 7.9f, 8.2f, 8.8f, 9.1f, 9.4f, 10, 10.3f, 10.6f}));
  auto extrap = crop;
  extrap["extrapolation_value"] = AFloat(10);
  auto ce =
      Run1("Resize", {{x}, Const(F32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 1.7f})), Omitted(), sizes},
           extrap);
  EXPECT_THAT(Values(ce[0]), Pointwise(FloatNear(1e-4), std::vector<float>{7.6f, 10, 10, 12.4f, 10,
                                                                           10, 10, 10, 10}));
}

// Antialiased downscaling by 2 (opset 18): linear stretches its tent to the weights
// (1, 3, 3, 1) / 8 over four neighbours (edge repeated), worked out by hand; cubic's
// values come from ONNX's reference formulas, computed once.
TEST(IndexingTest, ResizeAntialiasDownscales) {
  const In half = Const(F32({4}, {1, 1, 1, 0.5f}));
  const Tensor ramp = F32({1, 1, 1, 8}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Tensor squares = F32({1, 1, 1, 8}, {0, 1, 4, 9, 16, 25, 36, 49});
  const std::map<std::string, Attribute> lin = {{"mode", AString("linear")},
                                                {"antialias", AInt(1)}};
  auto l = Run1("Resize", {{ramp}, Omitted(), half}, lin, 1, 18);
  EXPECT_EQ(l[0].shape(), (Shape{1, 1, 1, 4}));
  EXPECT_THAT(Values(l[0]),
              Pointwise(FloatNear(1e-5), std::vector<float>{0.625f, 2.5f, 4.5f, 6.375f}));
  auto q = Run1("Resize", {{squares}, Omitted(), half}, lin, 1, 18);
  EXPECT_THAT(Values(q[0]), Pointwise(FloatNear(1e-4), std::vector<float>{0.875f, 7, 21, 41.125f}));
  auto c = Run1("Resize", {{squares}, Omitted(), half},
                {{"mode", AString("cubic")}, {"antialias", AInt(1)}}, 1, 18);
  EXPECT_THAT(Values(c[0]),
              Pointwise(FloatNear(1e-4), std::vector<float>{0.20703125f, 5.986328125f,
                                                            20.232421875f, 42.58984375f}));
  // Upscaling ignores antialias.
  auto up =
      Run1("Resize", {{F32({1, 1, 1, 2}, {0, 1})}, Omitted(), {Const(F32({4}, {1, 1, 1, 2}))}}, lin,
           1, 18);
  EXPECT_THAT(Values(up[0]), Pointwise(FloatNear(1e-6), std::vector<float>{0, 0.25, 0.75, 1}));
}

// Opset 18's axes (scales and sizes for some axes only) and keep_aspect_ratio_policy.
TEST(IndexingTest, ResizeAxesAndKeepAspectRatio) {
  auto hp = Run1("Resize", {{F32({1, 1, 1, 2}, {0, 1})}, Omitted(), {Const(F32({1}, {2}))}},
                 {{"mode", AString("linear")}, {"axes", AInts({3})}}, 1, 18);
  EXPECT_EQ(hp[0].shape(), (Shape{1, 1, 1, 4}));
  EXPECT_THAT(Values(hp[0]), Pointwise(FloatNear(1e-6), std::vector<float>{0, 0.25, 0.75, 1}));
  const Tensor x = F32({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto sized = [&](std::string policy) {
    return Run1("Resize", {{x}, Omitted(), Omitted(), {Const(I64({2}, {4, 4}))}},
                {{"axes", AInts({2, 3})}, {"keep_aspect_ratio_policy", AString(policy)}}, 1, 18)[0];
  };
  // Scales 2 (height) and 1 (width): not_larger keeps 1, not_smaller takes 2 for both.
  Tensor same = sized("not_larger");
  EXPECT_EQ(same.shape(), (Shape{1, 1, 2, 4}));
  EXPECT_THAT(Values(same), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  Tensor big = sized("not_smaller");
  EXPECT_EQ(big.shape(), (Shape{1, 1, 4, 8}));
  const std::vector<float> big_values = Values(big);
  EXPECT_THAT(std::vector<float>(big_values.begin(), big_values.begin() + 8),
              ElementsAre(1, 1, 2, 2, 3, 3, 4, 4));
  EXPECT_EQ(sized("stretch").shape(), (Shape{1, 1, 4, 4}));
  // ONNX's resize_upsample_sizes_nearest_not_larger: 2x2 to at most 7x8 keeps the ratio.
  auto n =
      Run1("Resize",
           {{F32({1, 1, 2, 2}, {1, 2, 3, 4})}, Omitted(), Omitted(), {Const(I64({2}, {7, 8}))}},
           {{"axes", AInts({2, 3})}, {"keep_aspect_ratio_policy", AString("not_larger")}}, 1, 18);
  EXPECT_EQ(n[0].shape(), (Shape{1, 1, 7, 7}));
}

TEST(ReduceTest, AxesKeepdimsAndOpsetForms) {
  const Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto mean = Run1("ReduceMean", {{x}}, {{"axes", AInts({-1})}});
  EXPECT_EQ(mean[0].shape(), (Shape{2, 1}));
  EXPECT_THAT(Values(mean[0]), ElementsAre(2, 5));
  auto sum = Run1("ReduceSum", {{x}, {Const(I64({1}, {0}))}}, {{"keepdims", AInt(0)}});
  EXPECT_EQ(sum[0].shape(), (Shape{3}));
  EXPECT_THAT(Values(sum[0]), ElementsAre(5, 7, 9));
  auto all = Run1("ReduceMax", {{x}}, {{"keepdims", AInt(0)}});
  EXPECT_EQ(all[0].shape(), (Shape{}));
  EXPECT_THAT(Values(all[0]), ElementsAre(6));
  auto noop = Run1("ReduceSum", {{x}}, {{"noop_with_empty_axes", AInt(1)}});
  EXPECT_EQ(noop[0].shape(), (Shape{2, 3}));
  auto old = Run1("ReduceSum", {{x}}, {{"axes", AInts({1})}}, 1, 11);
  EXPECT_THAT(Values(old[0]), ElementsAre(6, 15));
  auto ints = Run1("ReduceSum", {{I64({2, 2}, {1, 2, 3, 4})}, {Const(I64({1}, {1}))}});
  EXPECT_THAT(IntValues(ints[0]), ElementsAre(3, 7));
  auto ones = Run1("ReduceMean", {{F32({2, 1, 1}, {3, 4})}},
                   {{"axes", AInts({1, 2})}, {"keepdims", AInt(0)}});
  EXPECT_THAT(Values(ones[0]),
              ElementsAre(3, 4));  // nothing to reduce: oneDNN refuses, own loop runs
  auto empty = Run1("ReduceSum", {{F32({0, 2}, {})}, {Const(I64({1}, {0}))}});
  EXPECT_THAT(Values(empty[0]), ElementsAre(0, 0));
}

TEST(ReduceTest, ArgMaxArgMin) {
  const Tensor x = F32({2, 3}, {1, 5, 5, 7, 2, 2});
  auto rows = Run1("ArgMax", {{x}}, {{"axis", AInt(1)}, {"keepdims", AInt(0)}});
  EXPECT_EQ(rows[0].shape(), (Shape{2}));
  EXPECT_THAT(IntValues(rows[0]), ElementsAre(1, 0));  // ties: the first index
  auto last = Run1("ArgMax", {{x}}, {{"axis", AInt(-1)}, {"select_last_index", AInt(1)}});
  EXPECT_EQ(last[0].shape(), (Shape{2, 1}));
  EXPECT_THAT(IntValues(last[0]), ElementsAre(2, 0));
  auto cols = Run1("ArgMin", {{x}}, {});  // axis 0, keepdims
  EXPECT_EQ(cols[0].shape(), (Shape{1, 3}));
  EXPECT_THAT(IntValues(cols[0]), ElementsAre(0, 1, 1));
  auto min_last = Run1("ArgMin", {{I64({3}, {4, 1, 1})}}, {{"select_last_index", AInt(1)}});
  EXPECT_THAT(IntValues(min_last[0]), ElementsAre(2));
}

TEST(LoadChecksTest, UnsupportedOperatorAndAttributeNameTheNode) {
  Status op = LoadOp("TfIdfVectorizer", {{F32({1}, {1})}}, {});
  EXPECT_THAT(op.message(), HasSubstr("node 'test_TfIdfVectorizer' (TfIdfVectorizer): operator "
                                      "'TfIdfVectorizer' is not supported"));
  Status attr = LoadOp("Relu", {{F32({1}, {1})}}, {{"bogus", AInt(1)}});
  EXPECT_THAT(attr.message(), HasSubstr("(Relu): attribute 'bogus' is not supported"));
  Status dtype = LoadOp("Sigmoid", {{I64({1}, {1})}}, {});
  EXPECT_THAT(dtype.message(), HasSubstr("(Sigmoid): data type INT64 is not supported"));
}

}  // namespace
}  // namespace shoal::engine
