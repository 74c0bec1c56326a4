// Unit tests of the oneDNN-backed operators against naive reference loops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using namespace shoal::engine::testing;

// Naive 2-D convolution (NCHW, OIHW), or transposed convolution.
Tensor NaiveConv2d(const Tensor& x, const Tensor& w, const Tensor* b, int64_t group,
                   std::array<int64_t, 2> stride, std::array<int64_t, 4> pads,
                   std::array<int64_t, 2> dil) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], m = ws[0], kh = ws[2], kw = ws[3];
  const int64_t oh = (h + pads[0] + pads[2] - ((kh - 1) * dil[0] + 1)) / stride[0] + 1;
  const int64_t ow = (wd + pads[1] + pads[3] - ((kw - 1) * dil[1] + 1)) / stride[1] + 1;
  Tensor y = Tensor::Allocate(DataType::kFp32, {n, m, oh, ow});
  auto X = x.values<float>(), W = w.values<float>();
  auto Y = y.mutable_values<float>();
  const int64_t cg = c / group, mg = m / group;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t om = 0; om < m; ++om)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = b ? b->values<float>()[om] : 0;
          const int64_t g = om / mg;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t bb = 0; bb < kw; ++bb) {
                const int64_t yi = i * stride[0] - pads[0] + a * dil[0],
                              xj = j * stride[1] - pads[1] + bb * dil[1];
                if (yi < 0 || yi >= h || xj < 0 || xj >= wd) continue;
                acc += X[((in * c + g * cg + ic) * h + yi) * wd + xj] *
                       W[((om * cg + ic) * kh + a) * kw + bb];
              }
          Y[((in * m + om) * oh + i) * ow + j] = static_cast<float>(acc);
        }
  return y;
}

TEST(ConvTest, MatchesNaiveAcrossGroupsStridesPadsDilations) {
  struct Case {
    int64_t c, m, group, k, stride, pad, dil;
    bool bias;
  };
  for (const Case& tc : {Case{3, 4, 1, 3, 1, 1, 1, true}, Case{4, 8, 2, 3, 2, 1, 1, false},
                         Case{6, 6, 6, 3, 1, 1, 1, true}, Case{2, 3, 1, 3, 1, 2, 2, true},
                         Case{3, 5, 1, 1, 2, 0, 1, false}}) {
    const Tensor x = Random({2, tc.c, 7, 6}, 1);
    const Tensor w = Random({tc.m, tc.c / tc.group, tc.k, tc.k}, 2);
    const Tensor b = Random({tc.m}, 3);
    std::vector<In> in = {{x}, Const(w)};
    if (tc.bias) in.push_back(Const(b));
    auto out = Run1("Conv", in,
                    {{"group", AInt(tc.group)},
                     {"strides", AInts({tc.stride, tc.stride})},
                     {"pads", AInts({tc.pad, tc.pad, tc.pad, tc.pad})},
                     {"dilations", AInts({tc.dil, tc.dil})}});
    const Tensor want = NaiveConv2d(x, w, tc.bias ? &b : nullptr, tc.group, {tc.stride, tc.stride},
                                    {tc.pad, tc.pad, tc.pad, tc.pad}, {tc.dil, tc.dil});
    EXPECT_LT(MaxAbsDiff(out[0], want), 1e-4) << "c=" << tc.c << " group=" << tc.group;
  }
}

// Winograd (PlanOptions::conv_algorithm) on 3x3 stride-1 shapes whose sizes are not
// multiples of its tiles, with and without bias, beside shapes it leaves to the direct
// kernels (stride 2, dilation 2, 1x1, few input channels): all match the naive loops.
TEST(ConvTest, WinogradMatchesNaive) {
  LoadOptions winograd;
  winograd.plan.conv_algorithm = ConvAlgorithm::kWinograd;
  struct Case {
    int64_t c, m, k, stride, pad, dil, h, w;
    bool bias;
  };
  for (const Case& tc :
       {Case{16, 32, 3, 1, 1, 1, 7, 6, true}, Case{32, 16, 3, 1, 0, 1, 9, 11, false},
        Case{48, 64, 3, 1, 1, 1, 5, 5, true}, Case{16, 16, 3, 2, 1, 1, 8, 8, true},
        Case{16, 16, 3, 1, 2, 2, 8, 8, true}, Case{16, 16, 1, 1, 0, 1, 6, 6, true},
        Case{3, 16, 3, 1, 1, 1, 8, 8, true}}) {
    SCOPED_TRACE("c=" + std::to_string(tc.c) + " m=" + std::to_string(tc.m) +
                 " k=" + std::to_string(tc.k) + " stride=" + std::to_string(tc.stride) +
                 " dil=" + std::to_string(tc.dil));
    const Tensor x = Random({2, tc.c, tc.h, tc.w}, 4);
    const Tensor w = Random({tc.m, tc.c, tc.k, tc.k}, 5);
    const Tensor b = Random({tc.m}, 6);
    std::vector<In> in = {{x}, Const(w)};
    if (tc.bias) in.push_back(Const(b));
    auto out = RunOp("Conv", in,
                     {{"strides", AInts({tc.stride, tc.stride})},
                      {"pads", AInts({tc.pad, tc.pad, tc.pad, tc.pad})},
                      {"dilations", AInts({tc.dil, tc.dil})}},
                     1, 17, winograd);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const Tensor want = NaiveConv2d(x, w, tc.bias ? &b : nullptr, 1, {tc.stride, tc.stride},
                                    {tc.pad, tc.pad, tc.pad, tc.pad}, {tc.dil, tc.dil});
    EXPECT_LT(MaxAbsDiff((*out)[0], want), 1e-4 * MaxAbs(want));
  }
}

TEST(ConvTest, AutoPadSameUpperAndNonConstantWeights) {
  const Tensor x = Random({1, 2, 5, 5}, 4), w = Random({3, 2, 2, 2}, 5);
  auto out = Run1("Conv", {{x}, {w}}, {{"auto_pad", AString("SAME_UPPER")}});
  EXPECT_EQ(out[0].shape(), (Shape{1, 3, 5, 5}));
  // SAME_UPPER with a 2x2 kernel pads 0 at the start and 1 at the end.
  EXPECT_LT(MaxAbsDiff(out[0], NaiveConv2d(x, w, nullptr, 1, {1, 1}, {0, 0, 1, 1}, {1, 1})), 1e-4);
}

TEST(ConvTest, Conv1d) {
  const Tensor x = Random({2, 3, 9}, 6), w = Random({4, 3, 3}, 7);
  auto out = Run1("Conv", {{x}, Const(w)}, {{"strides", AInts({2})}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 4, 4}));
}

TEST(ConvTest, BadChannelsFailWithShapes) {
  auto r = RunOp("Conv", {{Random({1, 3, 5, 5}, 1)}, Const(Random({4, 2, 3, 3}, 2))});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("channels do not match"));
}

Tensor NaiveConvTranspose2d(const Tensor& x, const Tensor& w, const Tensor* b, int64_t group,
                            int64_t s, int64_t p, int64_t op) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], mg = ws[1], m = mg * group, k = ws[2];
  const int64_t oh = s * (h - 1) + op + k - 2 * p, ow = s * (wd - 1) + op + k - 2 * p;
  std::vector<double> acc(static_cast<size_t>(n * m * oh * ow), 0.0);
  auto X = x.values<float>(), W = w.values<float>();
  const int64_t cg = c / group;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < wd; ++j)
          for (int64_t om = 0; om < mg; ++om)
            for (int64_t a = 0; a < k; ++a)
              for (int64_t bb = 0; bb < k; ++bb) {
                const int64_t yi = i * s - p + a, xj = j * s - p + bb;
                if (yi < 0 || yi >= oh || xj < 0 || xj >= ow) continue;
                const int64_t g = ic / cg;
                acc[((in * m + g * mg + om) * oh + yi) * ow + xj] +=
                    X[((in * c + ic) * h + i) * wd + j] * W[((ic * mg + om) * k + a) * k + bb];
              }
  Tensor y = Tensor::Allocate(DataType::kFp32, {n, m, oh, ow});
  auto Y = y.mutable_values<float>();
  for (size_t i = 0; i < acc.size(); ++i) {
    const int64_t ch = static_cast<int64_t>(i) / (oh * ow) % m;
    Y[i] = static_cast<float>(acc[i] + (b ? b->values<float>()[ch] : 0));
  }
  return y;
}

TEST(ConvTransposeTest, StridedWithOutputPaddingAndGroups) {
  struct Case {
    int64_t c, mg, group, k, s, p, op;
  };
  for (const Case& tc :
       {Case{3, 2, 1, 3, 2, 1, 1}, Case{4, 3, 2, 4, 2, 1, 0}, Case{2, 2, 1, 3, 1, 0, 0}}) {
    const Tensor x = Random({2, tc.c, 4, 5}, 8), w = Random({tc.c, tc.mg, tc.k, tc.k}, 9),
                 b = Random({tc.mg * tc.group}, 10);
    auto out = Run1("ConvTranspose", {{x}, Const(w), Const(b)},
                    {{"group", AInt(tc.group)},
                     {"strides", AInts({tc.s, tc.s})},
                     {"pads", AInts({tc.p, tc.p, tc.p, tc.p})},
                     {"output_padding", AInts({tc.op, tc.op})}});
    const Tensor want = NaiveConvTranspose2d(x, w, &b, tc.group, tc.s, tc.p, tc.op);
    EXPECT_EQ(out[0].shape(), want.shape());
    EXPECT_LT(MaxAbsDiff(out[0], want), 1e-4) << "group=" << tc.group << " op=" << tc.op;
  }
}

TEST(ConvTransposeTest, OutputShapeAttribute) {
  const Tensor x = Random({1, 2, 3, 3}, 1), w = Random({2, 1, 3, 3}, 2);
  auto out = Run1("ConvTranspose", {{x}, Const(w)},
                  {{"strides", AInts({2, 2})}, {"output_shape", AInts({6, 6})}});
  EXPECT_EQ(out[0].shape(), (Shape{1, 1, 6, 6}));
}

Tensor NaiveMatMul(const Tensor& a, const Tensor& b, int64_t batch, int64_t m, int64_t k, int64_t n,
                   bool b_shared) {
  Tensor y = Tensor::Allocate(DataType::kFp32, {batch * m * n});
  auto A = a.values<float>(), B = b.values<float>();
  auto Y = y.mutable_values<float>();
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < k; ++t)
          acc += A[(z * m + i) * k + t] * B[((b_shared ? 0 : z) * k + t) * n + j];
        Y[(z * m + i) * n + j] = static_cast<float>(acc);
      }
  return y;
}

TEST(MatMulTest, BatchedAndBroadcastForms) {
  const Tensor a = Random({2, 3, 4}, 1), w = Random({4, 5}, 2), b3 = Random({2, 4, 5}, 3);
  auto c = Run1("MatMul", {{a}, Const(w)});
  EXPECT_EQ(c[0].shape(), (Shape{2, 3, 5}));
  EXPECT_THAT(Values(c[0]),
              Pointwise(FloatNear(1e-5), Values(NaiveMatMul(a, w, 2, 3, 4, 5, true))));
  auto d = Run1("MatMul", {{a}, {b3}});
  EXPECT_THAT(Values(d[0]),
              Pointwise(FloatNear(1e-5), Values(NaiveMatMul(a, b3, 2, 3, 4, 5, false))));
  auto e = Run1("MatMul", {{Random({1, 3, 4}, 1)}, {Random({2, 1, 4, 5}, 3)}});
  EXPECT_EQ(e[0].shape(), (Shape{2, 1, 3, 5}));
  auto v = Run1("MatMul", {{F32({2}, {1, 2})}, {F32({2, 2}, {1, 2, 3, 4})}});
  EXPECT_EQ(v[0].shape(), (Shape{2}));
  EXPECT_THAT(Values(v[0]), ElementsAre(7, 10));
  auto mv = Run1("MatMul", {{F32({2, 2}, {1, 2, 3, 4})}, {F32({2}, {1, 1})}});
  EXPECT_EQ(mv[0].shape(), (Shape{2}));
  EXPECT_THAT(Values(mv[0]), ElementsAre(3, 7));
  EXPECT_FALSE(RunOp("MatMul", {{Random({2, 3}, 1)}, {Random({4, 5}, 1)}}).ok());
}

TEST(GemmTest, TransposesAlphaBetaAndBroadcastC) {
  const Tensor a = Random({4, 3}, 1), b = Random({5, 4}, 2),
               c = Random({5}, 3);  // A^T is 3x4, B^T is 4x5
  auto out = Run1(
      "Gemm", {{a}, Const(b), Const(c)},
      {{"transA", AInt(1)}, {"transB", AInt(1)}, {"alpha", AFloat(0.5f)}, {"beta", AFloat(2.f)}});
  ASSERT_EQ(out[0].shape(), (Shape{3, 5}));
  auto A = a.values<float>(), B = b.values<float>(), C = c.values<float>();
  std::vector<float> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) {
      float acc = 0;
      for (int t = 0; t < 4; ++t) acc += A[t * 3 + i] * B[j * 4 + t];
      want.push_back(0.5f * acc + 2.f * C[j]);
    }
  EXPECT_THAT(Values(out[0]), Pointwise(FloatNear(1e-5), want));
  auto plain = Run1("Gemm", {{F32({1, 2}, {1, 2})}, {F32({2, 1}, {3, 4})}, {F32({1, 1}, {1})}});
  EXPECT_THAT(Values(plain[0]), ElementsAre(12));
}

TEST(NormTest, BatchNormalization) {
  const Tensor x = Random({2, 3, 2, 2}, 1);
  const Tensor s = F32({3}, {1, 2, 3}), b = F32({3}, {0, 1, 2}),
               mean = F32({3}, {0.1f, 0.2f, 0.3f}), var = F32({3}, {1, 4, 0.25f});
  auto out = Run1("BatchNormalization", {{x}, Const(s), Const(b), Const(mean), Const(var)},
                  {{"epsilon", AFloat(1e-3f)}});
  auto X = x.values<float>();
  std::vector<float> want;
  for (size_t i = 0; i < X.size(); ++i) {
    const size_t ch = i / 4 % 3;
    want.push_back((X[i] - mean.values<float>()[ch]) / std::sqrt(var.values<float>()[ch] + 1e-3f) *
                       s.values<float>()[ch] +
                   b.values<float>()[ch]);
  }
  EXPECT_THAT(Values(out[0]), Pointwise(FloatNear(1e-5), want));
  EXPECT_THAT(LoadOp("BatchNormalization", {{x}, Const(s), Const(b), Const(mean), Const(var)},
                     {{"training_mode", AInt(1)}})
                  .message(),
              HasSubstr("training mode"));
}

TEST(NormTest, LayerNormalizationOverOneAndTwoAxes) {
  const Tensor x = Random({2, 3, 4}, 1);
  for (int64_t axis : {-1, 1}) {
    const int64_t inner = axis == -1 ? 4 : 12;
    const Tensor scale = Random(axis == -1 ? Shape{4} : Shape{3, 4}, 2),
                 bias = Random(scale.shape(), 3);
    auto out = Run1("LayerNormalization", {{x}, Const(scale), Const(bias)}, {{"axis", AInt(axis)}});
    auto X = x.values<float>();
    std::vector<float> want;
    for (int64_t row = 0; row < 24 / inner; ++row) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < inner; ++j) mean += X[row * inner + j];
      mean /= inner;
      for (int64_t j = 0; j < inner; ++j)
        var += (X[row * inner + j] - mean) * (X[row * inner + j] - mean);
      var /= inner;
      for (int64_t j = 0; j < inner; ++j) {
        want.push_back(static_cast<float>((X[row * inner + j] - mean) / std::sqrt(var + 1e-5)) *
                           scale.values<float>()[j] +
                       bias.values<float>()[j]);
      }
    }
    EXPECT_THAT(Values(out[0]), Pointwise(FloatNear(1e-5), want)) << "axis " << axis;
  }
}

TEST(NormTest, SoftmaxAxisSemanticsChangeAtOpset13) {
  const Tensor x = F32({2, 2}, {0, 1, 2, 3});
  auto v13 = Run1("Softmax", {{x}}, {{"axis", AInt(0)}});
  const float e = 1 / (1 + std::exp(2.f));
  EXPECT_THAT(Values(v13[0]), Pointwise(FloatNear(1e-6), std::vector<float>{e, e, 1 - e, 1 - e}));
  // Opset 11 coerces to 2-D at axis 0: a softmax over all four values.
  auto v11 = Run1("Softmax", {{x}}, {{"axis", AInt(0)}}, 1, 11);
  double sum = 0;
  for (float v : Values(v11[0])) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  auto log = Run1("LogSoftmax", {{F32({2}, {0, 0})}});
  EXPECT_THAT(Values(log[0]),
              Pointwise(FloatNear(1e-5), std::vector<float>{-std::log(2.f), -std::log(2.f)}));
}

TEST(PoolTest, MaxPoolCeilModeAndPads) {
  const Tensor x = F32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto c =
      Run1("MaxPool", {{x}},
           {{"kernel_shape", AInts({2, 2})}, {"strides", AInts({2, 2})}, {"ceil_mode", AInt(1)}});
  EXPECT_EQ(c[0].shape(), (Shape{1, 1, 2, 2}));
  EXPECT_THAT(Values(c[0]), ElementsAre(5, 6, 8, 9));
  auto f = Run1("MaxPool", {{x}}, {{"kernel_shape", AInts({2, 2})}, {"strides", AInts({2, 2})}});
  EXPECT_THAT(Values(f[0]), ElementsAre(5));
  auto p = Run1("MaxPool", {{F32({1, 1, 1, 3}, {-1, -2, -3})}},
                {{"kernel_shape", AInts({1, 2})}, {"pads", AInts({0, 1, 0, 1})}});
  EXPECT_THAT(Values(p[0]), ElementsAre(-1, -1, -2, -3));  // padding never wins a max
  EXPECT_THAT(LoadOp("MaxPool", {{x}}, {{"kernel_shape", AInts({2, 2})}}, 2).message(),
              HasSubstr("Indices"));
}

// A plain source with 16 channels: oneDNN has only its simple_nchw loop for it in NCHW,
// so the pool runs channels-last through a reordered copy. Same values as a direct loop,
// for max and average pooling.
TEST(PoolTest, PlainSourcePooledChannelsLastMatchesALoop) {
  const Tensor x = Random({2, 16, 6, 8}, 9);
  const std::vector<float> in = Values(x);
  for (const std::string op : {"MaxPool", "AveragePool"}) {
    SCOPED_TRACE(op);
    auto y = Run1(op, {{x}}, {{"kernel_shape", AInts({2, 2})}, {"strides", AInts({2, 2})}});
    ASSERT_EQ(y[0].shape(), (Shape{2, 16, 3, 4}));
    std::vector<float> want;
    for (int nc = 0; nc < 32; ++nc) {
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 4; ++j) {
          float m = -1e30f, s = 0.f;
          for (int di = 0; di < 2; ++di) {
            for (int dj = 0; dj < 2; ++dj) {
              const float v = in[static_cast<size_t>((nc * 6 + 2 * i + di) * 8 + 2 * j + dj)];
              m = std::max(m, v);
              s += v;
            }
          }
          want.push_back(op == "MaxPool" ? m : s / 4);
        }
      }
    }
    EXPECT_THAT(Values(y[0]), Pointwise(FloatNear(1e-6), want));
  }
}

TEST(PoolTest, AveragePoolPaddingCountAndGlobalPools) {
  const Tensor x = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  const std::map<std::string, Attribute> base = {{"kernel_shape", AInts({2, 2})},
                                                 {"pads", AInts({1, 1, 0, 0})}};
  auto ex = Run1("AveragePool", {{x}}, base);
  EXPECT_THAT(Values(ex[0]), ElementsAre(1, 1.5, 2, 2.5));
  auto inc_attrs = base;
  inc_attrs["count_include_pad"] = AInt(1);
  auto inc = Run1("AveragePool", {{x}}, inc_attrs);
  EXPECT_THAT(Values(inc[0]), ElementsAre(0.25, 0.75, 1, 2.5));
  auto ga = Run1("GlobalAveragePool", {{Random({2, 3, 4, 5}, 1)}});
  EXPECT_EQ(ga[0].shape(), (Shape{2, 3, 1, 1}));
  auto gm = Run1("GlobalMaxPool", {{x}});
  EXPECT_THAT(Values(gm[0]), ElementsAre(4));
}

}  // namespace
}  // namespace shoal::engine
