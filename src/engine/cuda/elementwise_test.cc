#include "engine/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/quantize.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

std::vector<float> Random(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// NumPy broadcasting written out the plain way, one multi-index per output element: the
// reference the merged index tables and the kernel must agree with.
std::vector<float> BroadcastReference(const std::vector<float>& a, std::vector<int64_t> a_dims,
                                      const std::vector<float>& b, std::vector<int64_t> b_dims,
                                      const std::vector<int64_t>& out_dims,
                                      const std::function<float(float, float)>& op) {
  const size_t rank = out_dims.size();
  a_dims.insert(a_dims.begin(), rank - a_dims.size(), 1);
  b_dims.insert(b_dims.begin(), rank - b_dims.size(), 1);
  std::vector<float> y(Elements(out_dims));
  std::vector<int64_t> coord(rank, 0);
  for (size_t i = 0; i < y.size(); ++i) {
    int64_t ia = 0, ib = 0;
    for (size_t d = 0; d < rank; ++d) {
      ia = ia * a_dims[d] + (a_dims[d] == 1 ? 0 : coord[d]);
      ib = ib * b_dims[d] + (b_dims[d] == 1 ? 0 : coord[d]);
    }
    y[i] = op(a[ia], b[ib]);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++coord[d] < out_dims[d]) break;
      coord[d] = 0;
    }
  }
  return y;
}

// Host-only: the index tables PlanBroadcast gives the kernel.
TEST(PlanBroadcastTest, GivesTheOutputShapeAndMergesDimensions) {
  auto plan = PlanBroadcast(std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{3, 1});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(plan->elements, 24);
  // a is whole everywhere: [2,3,4] collapses to one dimension for a, but b is broadcast
  // along 2 (outer) and 4 (inner), so three dimensions remain.
  ASSERT_EQ(plan->index.rank, 3);
  EXPECT_EQ(plan->index.out_dims[0], 2);
  EXPECT_EQ(plan->index.out_dims[1], 3);
  EXPECT_EQ(plan->index.out_dims[2], 4);
  EXPECT_EQ(plan->index.a_strides[0], 12);
  EXPECT_EQ(plan->index.a_strides[1], 4);
  EXPECT_EQ(plan->index.a_strides[2], 1);
  EXPECT_EQ(plan->index.b_strides[0], 0);
  EXPECT_EQ(plan->index.b_strides[1], 1);
  EXPECT_EQ(plan->index.b_strides[2], 0);

  // Same shapes: one flat dimension.
  plan = PlanBroadcast(std::vector<int64_t>{5, 6, 7}, std::vector<int64_t>{5, 6, 7});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->index.rank, 1);
  EXPECT_EQ(plan->index.out_dims[0], 210);
  EXPECT_EQ(plan->index.a_strides[0], 1);
  EXPECT_EQ(plan->index.b_strides[0], 1);

  // A scalar against a matrix, and both ways round.
  plan = PlanBroadcast(std::vector<int64_t>{}, std::vector<int64_t>{4, 5});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{4, 5}));
  ASSERT_EQ(plan->index.rank, 1);
  EXPECT_EQ(plan->index.a_strides[0], 0);
  EXPECT_EQ(plan->index.b_strides[0], 1);

  // Both broadcast, in different dimensions: [4,1] against [1,5].
  plan = PlanBroadcast(std::vector<int64_t>{4, 1}, std::vector<int64_t>{1, 5});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{4, 5}));
  ASSERT_EQ(plan->index.rank, 2);
  EXPECT_EQ(plan->index.a_strides[0], 1);
  EXPECT_EQ(plan->index.a_strides[1], 0);
  EXPECT_EQ(plan->index.b_strides[0], 0);
  EXPECT_EQ(plan->index.b_strides[1], 1);
}

TEST(PlanBroadcastTest, RefusesShapesThatDoNotBroadcastAndNamesThem) {
  auto plan = PlanBroadcast(std::vector<int64_t>{2, 3}, std::vector<int64_t>{4});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("[2,3] and [4]"), std::string::npos)
      << plan.status().message();
  EXPECT_FALSE(PlanBroadcast(std::vector<int64_t>{-1}, std::vector<int64_t>{1}).ok());
}

TEST(PlanBroadcastTest, RefusesMoreDimensionsThanTheKernelTakesAfterMerging) {
  // Alternating broadcast dimensions cannot merge: 9 of them is one too many.
  std::vector<int64_t> a, b;
  for (int d = 0; d < 9; ++d) {
    a.push_back(d % 2 ? 2 : 1);
    b.push_back(d % 2 ? 1 : 2);
  }
  auto plan = PlanBroadcast(a, b);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("at most 8"), std::string::npos)
      << plan.status().message();
  // Twelve dimensions that merge into one are fine.
  std::vector<int64_t> many(12, 2);
  EXPECT_TRUE(PlanBroadcast(many, many).ok());
}

// The element of an operand of shape `dims` (aligned to the output's rank from the
// innermost) that output multi-index `coord` reads under NumPy broadcasting.
int64_t OperandIndex(std::vector<int64_t> dims, const std::vector<int64_t>& coord) {
  dims.insert(dims.begin(), coord.size() - dims.size(), 1);
  int64_t index = 0;
  for (size_t d = 0; d < coord.size(); ++d) index = index * dims[d] + (dims[d] == 1 ? 0 : coord[d]);
  return index;
}

// Where(cond, a, b) written out the plain way.
std::vector<float> WhereReference(const std::vector<uint8_t>& cond,
                                  const std::vector<int64_t>& cond_dims,
                                  const std::vector<float>& a, const std::vector<int64_t>& a_dims,
                                  const std::vector<float>& b, const std::vector<int64_t>& b_dims,
                                  const std::vector<int64_t>& out_dims) {
  std::vector<float> y(Elements(out_dims));
  std::vector<int64_t> coord(out_dims.size(), 0);
  for (size_t i = 0; i < y.size(); ++i) {
    y[i] = cond[OperandIndex(cond_dims, coord)] ? a[OperandIndex(a_dims, coord)]
                                                : b[OperandIndex(b_dims, coord)];
    for (int d = static_cast<int>(out_dims.size()) - 1; d >= 0; --d) {
      if (++coord[d] < out_dims[d]) break;
      coord[d] = 0;
    }
  }
  return y;
}

// Host-only: the three operands' strides, ones dropped, broadcast dimensions 0.
TEST(PlanWhereTest, BroadcastsAllThreeOperands) {
  auto plan =
      PlanWhere(std::vector<int64_t>{2, 1, 4}, std::vector<int64_t>{3, 1}, std::vector<int64_t>{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(plan->elements, 24);
  ASSERT_EQ(plan->index.rank, 3);
  const int64_t cond[3] = {4, 0, 1}, a[3] = {0, 1, 0}, b[3] = {0, 0, 0};
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(plan->index.cond_strides[d], cond[d]) << d;
    EXPECT_EQ(plan->index.a_strides[d], a[d]) << d;
    EXPECT_EQ(plan->index.b_strides[d], b[d]) << d;
  }
  // A dimension of 1 everywhere drops out.
  auto squeezed =
      PlanWhere(std::vector<int64_t>{1, 5}, std::vector<int64_t>{1, 5}, std::vector<int64_t>{1, 1});
  ASSERT_TRUE(squeezed.ok());
  EXPECT_EQ(squeezed->out_dims, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(squeezed->index.rank, 1);
}

TEST(PlanWhereTest, RefusesShapesThatDoNotBroadcastAndNamesThem) {
  auto plan =
      PlanWhere(std::vector<int64_t>{2, 3}, std::vector<int64_t>{3}, std::vector<int64_t>{2, 4});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("[2,3], [3] and [2,4]"), std::string::npos)
      << plan.status().message();
  std::vector<int64_t> nine(9, 2);
  EXPECT_FALSE(PlanWhere(nine, nine, nine).ok());
}

using ElementwiseGpuTest = GpuTest;

// fp32 and int64 operands, each comparison, broadcast; ties included (the operands share
// values), so Equal and the inclusive comparisons see both outcomes.
TEST_F(ElementwiseGpuTest, ComparisonsWriteBoolsForFloatAndInt64Operands) {
  const std::vector<int64_t> a_dims = {3, 1, 5}, b_dims = {4, 1};
  auto plan = PlanBroadcast(a_dims, b_dims);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<float> af(Elements(a_dims)), bf(Elements(b_dims));
  std::vector<int64_t> ai(af.size()), bi(bf.size());
  for (size_t i = 0; i < af.size(); ++i) ai[i] = static_cast<int64_t>(i % 4) - 1;
  for (size_t i = 0; i < bf.size(); ++i) bi[i] = static_cast<int64_t>(i) - 1;
  // Large int64 values that differ only in bits a float cannot hold.
  ai[0] = (int64_t{1} << 40) + 1;
  bi[0] = int64_t{1} << 40;
  for (size_t i = 0; i < af.size(); ++i) af[i] = 0.5f * static_cast<float>(i % 4);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = 0.5f * static_cast<float>(i);
  const std::vector<std::pair<CompareOp, std::function<bool(double, double)>>> ops = {
      {CompareOp::kEqual, [](double p, double q) { return p == q; }},
      {CompareOp::kLess, [](double p, double q) { return p < q; }},
      {CompareOp::kGreater, [](double p, double q) { return p > q; }},
      {CompareOp::kLessOrEqual, [](double p, double q) { return p <= q; }},
      {CompareOp::kGreaterOrEqual, [](double p, double q) { return p >= q; }},
  };
  DeviceBuffer daf = Upload(af), dbf = Upload(bf);
  DeviceBuffer dai = UploadBytes(ai.data(), ai.size() * 8),
               dbi = UploadBytes(bi.data(), bi.size() * 8);
  DeviceBuffer dy = UploadBytes(std::vector<uint8_t>(plan->elements, 7).data(), plan->elements);
  for (bool int64_operands : {false, true}) {
    for (const auto& [op, ref] : ops) {
      const void* a = int64_operands ? dai.data() : daf.data();
      const void* b = int64_operands ? dbi.data() : dbf.data();
      ASSERT_TRUE(Compare(op, int64_operands, a, b, dy.as<uint8_t>(), *plan, stream()).ok());
      std::vector<uint8_t> y(plan->elements);
      DownloadBytes(dy, y.data(), y.size());
      std::vector<int64_t> coord(3, 0);
      for (size_t i = 0; i < y.size(); ++i) {
        const int64_t ia = OperandIndex(a_dims, coord), ib = OperandIndex(b_dims, coord);
        // Compared as the kernel's type: int64 exactly (the 2^40 pair differs), fp32 as is.
        const int sign = (ai[ia] > bi[ib]) - (ai[ia] < bi[ib]);
        const bool want = int64_operands ? ref(sign, 0) : ref(af[ia], bf[ib]);
        ASSERT_EQ(y[i], want ? 1 : 0)
            << "op " << static_cast<int>(op) << ", int64 " << int64_operands << ", element " << i;
        for (int d = 2; d >= 0; --d) {
          if (++coord[d] < plan->out_dims[d]) break;
          coord[d] = 0;
        }
      }
    }
  }
}

// int64 remainders with the divisor's sign (fmod 0) and the dividend's (fmod 1), over
// every sign pair; fp32 fmod; a zero int64 divisor writes 0 and sets the flag to 2.
TEST_F(ElementwiseGpuTest, ModTakesTheSignOnnxAsksForAndFlagsADivisionByZero) {
  const std::vector<int64_t> a_dims = {2, 4}, b_dims = {4};
  auto plan = PlanBroadcast(a_dims, b_dims);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<int64_t> a = {7, -7, 7, -7, 9, -9, 0, 5}, b = {3, 3, -3, -3};
  DeviceBuffer da = UploadBytes(a.data(), a.size() * 8), db = UploadBytes(b.data(), b.size() * 8);
  DeviceBuffer dy = UploadBytes(std::vector<int64_t>(8, 99).data(), 64);
  DeviceBuffer flag = UploadBytes(std::vector<int32_t>{0}.data(), sizeof(int32_t));
  for (bool fmod : {false, true}) {
    ASSERT_TRUE(
        Mod(true, fmod, da.data(), db.data(), dy.data(), *plan, flag.as<int32_t>(), stream()).ok());
    std::vector<int64_t> y(8);
    DownloadBytes(dy, y.data(), 64);
    for (size_t i = 0; i < 8; ++i) {
      const int64_t x = a[i], m = b[i % 4];
      int64_t want = x % m;  // C's: the dividend's sign
      if (!fmod && want != 0 && ((want < 0) != (m < 0))) want += m;
      EXPECT_EQ(y[i], want) << "fmod " << fmod << ", " << x << " mod " << m;
    }
  }
  int32_t raised = -1;
  DownloadBytes(flag, &raised, sizeof(raised));
  EXPECT_EQ(raised, 0);
  const std::vector<int64_t> zero = {3, 0, 3, 3};
  DeviceBuffer dz = UploadBytes(zero.data(), zero.size() * 8);
  ASSERT_TRUE(
      Mod(true, false, da.data(), dz.data(), dy.data(), *plan, flag.as<int32_t>(), stream()).ok());
  std::vector<int64_t> y(8);
  DownloadBytes(dy, y.data(), 64);
  EXPECT_EQ(y[1], 0);
  DownloadBytes(flag, &raised, sizeof(raised));
  EXPECT_EQ(raised, 2);
  // fp32: C's fmod.
  const std::vector<float> fa = {5.5f, -5.5f, 7.25f, -1.f, 0.f, 3.f, -3.5f, 8.f};
  const std::vector<float> fb = {2.f, 2.f, -1.5f, 0.75f};
  DeviceBuffer dfa = Upload(fa), dfb = Upload(fb), dfy = Floats(8);
  ASSERT_TRUE(
      Mod(false, true, dfa.data(), dfb.data(), dfy.data(), *plan, flag.as<int32_t>(), stream())
          .ok());
  const std::vector<float> fy = Download(dfy, 8);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(fy[i], std::fmod(fa[i], fb[i % 4])) << i;
}

TEST_F(ElementwiseGpuTest, WhereChoosesPerElementWithEveryOperandBroadcast) {
  struct Shapes {
    std::vector<int64_t> cond, a, b;
  };
  const std::vector<Shapes> shapes = {
      {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},
      {{2, 1, 4}, {3, 1}, {}},
      {{1, 1, 6}, {5, 1, 1}, {5, 6, 1}},
  };
  unsigned seed = 40;
  for (const Shapes& s : shapes) {
    auto plan = PlanWhere(s.cond, s.a, s.b);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    std::vector<uint8_t> cond(Elements(s.cond));
    for (size_t i = 0; i < cond.size(); ++i) cond[i] = (i * 7 + seed) % 3 == 0 ? 0 : (i % 5) + 1;
    const std::vector<float> a = Random(Elements(s.a), -2.f, 2.f, ++seed);
    const std::vector<float> b = Random(Elements(s.b), -2.f, 2.f, ++seed);
    DeviceBuffer dc = UploadBytes(cond.data(), cond.size()), da = Upload(a), db = Upload(b),
                 dy = Floats(plan->elements);
    ASSERT_TRUE(
        Where(dc.as<uint8_t>(), da.as<float>(), db.as<float>(), dy.as<float>(), *plan, stream())
            .ok());
    EXPECT_EQ(Download(dy, plan->elements),
              WhereReference(cond, s.cond, a, s.a, b, s.b, plan->out_dims));
  }
}

TEST_F(ElementwiseGpuTest, UnaryOperatorsMatchTheHost) {
  const std::vector<float> x = Random(10007, -4.f, 4.f, 1);
  const std::vector<float> positive = Random(10007, 0.01f, 9.f, 2);
  struct Case {
    UnaryOp op;
    bool needs_positive;
    std::function<float(float)> ref;
    float alpha = 0.f, beta = 0.f;
  };
  const std::vector<Case> cases = {
      {UnaryOp::kRelu, false, [](float v) { return v > 0 ? v : 0.f; }},
      {UnaryOp::kSigmoid, false, [](float v) { return 1.f / (1.f + std::exp(-v)); }},
      {UnaryOp::kTanh, false, [](float v) { return std::tanh(v); }},
      {UnaryOp::kExp, false, [](float v) { return std::exp(v); }},
      {UnaryOp::kLog, true, [](float v) { return std::log(v); }},
      {UnaryOp::kNeg, false, [](float v) { return -v; }},
      {UnaryOp::kAbs, false, [](float v) { return std::fabs(v); }},
      {UnaryOp::kSqrt, true, [](float v) { return std::sqrt(v); }},
      {UnaryOp::kErf, false, [](float v) { return std::erf(v); }},
      {UnaryOp::kGelu, false,
       [](float v) { return 0.5f * v * (1.f + std::erf(v / std::sqrt(2.f))); }},
      {UnaryOp::kLeakyRelu, false, [](float v) { return v >= 0 ? v : 0.1f * v; }, 0.1f},
      {UnaryOp::kClip, false, [](float v) { return std::min(std::max(v, 0.f), 6.f); }, 0.f, 6.f},
      {UnaryOp::kHardSigmoid, false,
       [](float v) { return std::min(std::max(0.2f * v + 0.5f, 0.f), 1.f); }, 0.2f, 0.5f},
      {UnaryOp::kHardSwish, false,
       [](float v) { return v * std::min(std::max(v / 6.f + 0.5f, 0.f), 1.f); }},
      {UnaryOp::kFloor, false, [](float v) { return std::floor(v); }},
      {UnaryOp::kCeil, false, [](float v) { return std::ceil(v); }},
      {UnaryOp::kReciprocal, true, [](float v) { return 1.f / v; }},
      {UnaryOp::kSoftplus, false, [](float v) { return std::log1p(std::exp(v)); }},
      {UnaryOp::kElu, false, [](float v) { return v > 0 ? v : 0.7f * (std::exp(v) - 1.f); }, 0.7f},
  };
  for (const Case& c : cases) {
    const std::vector<float>& in = c.needs_positive ? positive : x;
    DeviceBuffer dx = Upload(in), dy = Floats(in.size());
    ASSERT_TRUE(
        Unary(c.op, dx.as<float>(), dy.as<float>(), in.size(), stream(), c.alpha, c.beta).ok());
    const std::vector<float> y = Download(dy, in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const float want = c.ref(in[i]);
      ASSERT_NEAR(y[i], want, 1e-5f + 1e-5f * std::fabs(want))
          << "op " << static_cast<int>(c.op) << " at " << in[i];
    }
  }
}

// A NaN passes through ReLU, as through the CPU engine's (oneDNN's): a model's NaN shows in
// its output on either engine.
TEST_F(ElementwiseGpuTest, ReluLetsANanThrough) {
  const std::vector<float> x = {std::nanf(""), -1.f, 2.f, -0.f, -INFINITY, INFINITY};
  DeviceBuffer dx = Upload(x), dy = Floats(x.size());
  ASSERT_TRUE(Unary(UnaryOp::kRelu, dx.as<float>(), dy.as<float>(), x.size(), stream()).ok());
  const std::vector<float> y = Download(dy, x.size());
  EXPECT_TRUE(std::isnan(y[0])) << y[0];
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 2.f);
  EXPECT_EQ(y[3], 0.f);
  EXPECT_EQ(y[4], 0.f);
  EXPECT_EQ(y[5], INFINITY);
}

// With a 16-bit output, an activation also writes its result rounded, bit for bit what the
// host's rounding of its fp32 result gives, beside that result or alone; in place too (x is
// y), as a product's activation runs.
TEST_F(ElementwiseGpuTest, AnActivationAlsoWritesItsResultRounded) {
  const std::vector<float> x = Random(10007, -4.f, 4.f, 3);
  DeviceBuffer dx = Upload(x), dy = Floats(x.size());
  ASSERT_TRUE(Unary(UnaryOp::kGelu, dx.as<float>(), dy.as<float>(), x.size(), stream()).ok());
  ExpectRoundsBesideAloneAndInPlace(
      x, Download(dy, x.size()), [&](const float* in, float* out, void* half, HalfType type) {
        return Unary(UnaryOp::kGelu, in, out, x.size(), stream(), 0.f, 0.f, half, type);
      });
}

// An int8 plan's activation writes its result's int8 copy for the product after it: bit for
// bit the host's quantisation of the fp32 result it writes, with either zero point, and the
// same bits alone (the fp32 read by nothing else).
TEST_F(ElementwiseGpuTest, AnActivationAlsoWritesItsResultsInt8Copy) {
  const std::vector<float> x = Random(10007, -4.f, 4.f, 5);
  DeviceBuffer dx = Upload(x), dy = Floats(x.size());
  auto dq = DeviceBuffer::Allocate(x.size()), alone = DeviceBuffer::Allocate(x.size());
  ASSERT_TRUE(dq.ok() && alone.ok());
  for (int zero_point : {0, -128}) {
    SCOPED_TRACE(zero_point);
    const RoundTo to = RoundTo::Int8(zero_point == 0 ? 127.f : 255.f, zero_point);
    ASSERT_TRUE(Unary(UnaryOp::kSigmoid, dx.as<float>(), dy.as<float>(), x.size(), stream(), 0.f,
                      0.f, dq->data(), to)
                    .ok());
    ASSERT_TRUE(Unary(UnaryOp::kSigmoid, dx.as<float>(), nullptr, x.size(), stream(), 0.f, 0.f,
                      alone->data(), to)
                    .ok());
    const std::vector<float> y = Download(dy, x.size());
    std::vector<int8_t> q(x.size()), q_alone(x.size());
    DownloadBytes(*dq, q.data(), q.size());
    DownloadBytes(*alone, q_alone.data(), q_alone.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(q[i], QuantizeValue(y[i], to.inv_scale, zero_point)) << "at " << i;
    EXPECT_EQ(q_alone, q);
  }
}

TEST(UnaryShapeTest, RefusesAnInt8CopyItCannotWriteBeforeTouchingTheDevice) {
  alignas(16) float buffer[64] = {};
  for (const RoundTo& to : {RoundTo::Int8(0.f, 0), RoundTo::Int8(NAN, 0), RoundTo::Int8(2.f, 7)}) {
    const Status s =
        Unary(UnaryOp::kRelu, buffer, buffer + 32, 8, nullptr, 0.f, 0.f, buffer + 48, to);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("int8 copy"), std::string::npos) << s.ToString();
  }
  // One byte an element: eight of them from 4 bytes before y reach into it.
  const Status over = Unary(UnaryOp::kRelu, buffer, buffer + 32, 8, nullptr, 0.f, 0.f,
                            reinterpret_cast<char*>(buffer + 32) - 4, RoundTo::Int8(2.f, 0));
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("int8 output overlaps x or y"), std::string::npos)
      << over.ToString();
}

TEST(UnaryShapeTest, RefusesNoOutputAndAnOverlappingRoundingBeforeTouchingTheDevice) {
  alignas(16) float buffer[64] = {};
  EXPECT_EQ(Unary(UnaryOp::kRelu, buffer, nullptr, 8, nullptr).code(),
            StatusCode::kInvalidArgument);
  // The rounding over x, or over y.
  EXPECT_EQ(Unary(UnaryOp::kRelu, buffer, buffer + 32, 8, nullptr, 0.f, 0.f, buffer + 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Unary(UnaryOp::kRelu, buffer, buffer + 32, 8, nullptr, 0.f, 0.f, buffer + 36).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Unary(UnaryOp::kRelu, buffer, nullptr, 8, nullptr, 0.f, 0.f, buffer + 4).code(),
            StatusCode::kInvalidArgument);  // alone, over x
}

// With a 16-bit output, a binary operator also writes its result rounded, bit for bit the
// host's rounding of its fp32 result: broadcast (a row added to every row, as a model adds
// its position embeddings), beside that result, alone, and in place (y is a).
TEST_F(ElementwiseGpuTest, ABinaryOperatorAlsoWritesItsResultRounded) {
  const std::vector<int64_t> a_dims = {37, 64}, b_dims = {64};
  const std::vector<float> a = Random(37 * 64, -300.f, 300.f, 5), b = Random(64, -1.f, 1.f, 6);
  auto plan = PlanBroadcast(a_dims, b_dims);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceBuffer da = Upload(a), db = Upload(b), dy = Floats(a.size());
  ASSERT_TRUE(
      Binary(BinaryOp::kAdd, da.as<float>(), db.as<float>(), dy.as<float>(), *plan, stream()).ok());
  ExpectRoundsBesideAloneAndInPlace(
      a, Download(dy, a.size()), [&](const float* in, float* out, void* half, HalfType type) {
        return Binary(BinaryOp::kAdd, in, db.as<float>(), out, *plan, stream(), half, type);
      });
}

// Rounded channels last: x [b, c, h·w] (NCHW) into [b, h·w, c] (NHWC), each value bit for
// bit the host's rounding, for the cuDNN convolutions that read the image this way.
TEST_F(ElementwiseGpuTest, ACastToHalfCanLayTheValuesOutChannelsLast) {
  const int64_t b = 3, c = 5, spatial = 7 * 4, n = b * c * spatial;
  const std::vector<float> x = Random(n, -70000.f, 70000.f, 9);  // past fp16's range too
  DeviceBuffer dx = Upload(x);
  for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
    SCOPED_TRACE(type == HalfType::kFp16 ? "fp16" : "bf16");
    DeviceBuffer half = StaleHalves(x.size());
    ASSERT_TRUE(CastFloatToHalf(type, dx.as<float>(), half.data(), n, stream(), c, spatial).ok());
    std::vector<uint16_t> bits(x.size());
    DownloadBytes(half, bits.data(), bits.size() * 2);
    const std::vector<uint16_t> back = ChannelsLast(bits, b, c, spatial, /*back=*/true);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(back[i], type == HalfType::kFp16 ? FloatToFp16(x[i]) : FloatToBf16(x[i]))
          << "at " << i;
  }
}

TEST(CastShapeTest, RefusesChannelsThatDoNotDivideTheValuesBeforeTouchingTheDevice) {
  EXPECT_EQ(CastFloatToHalf(HalfType::kFp16, nullptr, nullptr, 30, nullptr, 4, 3).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CastFloatToHalf(HalfType::kFp16, nullptr, nullptr, 30, nullptr, 5, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CastFloatToHalf(HalfType::kFp16, nullptr, nullptr, 30, nullptr, -1, 3).code(),
            StatusCode::kInvalidArgument);
}

TEST(BinaryShapeTest, RefusesNoOutputAndAnOverlappingRoundingBeforeTouchingTheDevice) {
  alignas(16) float buffer[256] = {};
  const std::vector<int64_t> a_dims = {4, 8}, b_dims = {8};
  auto plan = PlanBroadcast(a_dims, b_dims);
  ASSERT_TRUE(plan.ok());
  const float* a = buffer;       // 32 values
  const float* b = buffer + 64;  // 8 values, broadcast
  float* y = buffer + 128;       // 32 values
  EXPECT_EQ(Binary(BinaryOp::kAdd, a, b, nullptr, *plan, nullptr).code(),
            StatusCode::kInvalidArgument);
  // The rounding (32 values, 64 bytes) over a's last values, over b's first, over b's last
  // alone (its broadcast reaches all 8), over y.
  for (float* half : {buffer + 24, buffer + 60, buffer + 71, buffer + 150}) {
    EXPECT_EQ(Binary(BinaryOp::kAdd, a, b, y, *plan, nullptr, half).code(),
              StatusCode::kInvalidArgument)
        << half - buffer;
  }
  // Just past b, clear of y: accepted (without a device the launch then fails otherwise;
  // with one it is not tried, since these are host addresses).
  if (!ListDevices().ok()) {
    EXPECT_NE(Binary(BinaryOp::kAdd, a, b, y, *plan, nullptr, buffer + 72).code(),
              StatusCode::kInvalidArgument);
  }
  // Alone, over a.
  EXPECT_EQ(Binary(BinaryOp::kAdd, a, b, nullptr, *plan, nullptr, buffer + 8).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ElementwiseGpuTest, BinaryOperatorsBroadcastLikeNumPy) {
  struct Shapes {
    std::vector<int64_t> a, b;
  };
  const std::vector<Shapes> shapes = {
      {{2, 3, 4}, {3, 1}},
      {{4}, {2, 3, 4}},
      {{}, {5, 7}},
      {{4, 1}, {1, 5}},
      {{8, 1, 6, 1}, {7, 1, 5}},
      {{32, 64}, {32, 64}},
      {{2, 1, 3, 1, 2}, {1, 4, 1, 5, 1}},
  };
  const std::vector<std::pair<BinaryOp, std::function<float(float, float)>>> ops = {
      {BinaryOp::kAdd, std::plus<float>()},
      {BinaryOp::kSub, std::minus<float>()},
      {BinaryOp::kMul, std::multiplies<float>()},
      {BinaryOp::kDiv, std::divides<float>()},
      {BinaryOp::kMax, [](float p, float q) { return std::fmax(p, q); }},
      {BinaryOp::kMin, [](float p, float q) { return std::fmin(p, q); }},
      {BinaryOp::kPow, [](float p, float q) { return std::pow(p, q); }},
  };
  unsigned seed = 10;
  for (const Shapes& s : shapes) {
    // Positive operands keep Pow real and Div finite.
    const std::vector<float> a = Random(Elements(s.a), 0.5f, 2.f, ++seed);
    const std::vector<float> b = Random(Elements(s.b), 0.5f, 2.f, ++seed);
    auto plan = PlanBroadcast(s.a, s.b);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    DeviceBuffer da = Upload(a), db = Upload(b), dy = Floats(plan->elements);
    for (const auto& [op, ref] : ops) {
      ASSERT_TRUE(Binary(op, da.as<float>(), db.as<float>(), dy.as<float>(), *plan, stream()).ok());
      const std::vector<float> y = Download(dy, plan->elements);
      const std::vector<float> want = BroadcastReference(a, s.a, b, s.b, plan->out_dims, ref);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(y[i], want[i], 1e-5f * (1.f + std::fabs(want[i])))
            << "op " << static_cast<int>(op) << " element " << i;
      }
    }
  }
}

// PRelu: x of both signs, one slope per channel broadcast over [2, 3, 4, 5].
TEST_F(ElementwiseGpuTest, PReluScalesTheNegativeSideByItsBroadcastSlope) {
  const std::vector<int64_t> xs = {2, 3, 4, 5}, ss = {3, 1, 1};
  const std::vector<float> x = Random(Elements(xs), -2.f, 2.f, 41);
  const std::vector<float> slope = {0.1f, -0.5f, 2.f};
  auto plan = PlanBroadcast(xs, ss);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceBuffer dx = Upload(x), ds = Upload(slope), dy = Floats(plan->elements);
  ASSERT_TRUE(
      Binary(BinaryOp::kPRelu, dx.as<float>(), ds.as<float>(), dy.as<float>(), *plan, stream())
          .ok());
  const std::vector<float> y = Download(dy, plan->elements);
  for (size_t i = 0; i < x.size(); ++i) {
    const float a = slope[(i / 20) % 3];
    EXPECT_EQ(y[i], x[i] < 0 ? x[i] * a : x[i]) << i;
  }
}

// And, Or, Xor of bools broadcast [3, 4] against [4] (a nonzero byte other than 1 is true),
// and Not; every output 0 or 1.
TEST_F(ElementwiseGpuTest, LogicalOperatorsOnBools) {
  const std::vector<int64_t> as = {3, 4}, bs = {4};
  const std::vector<uint8_t> a = {0, 1, 2, 0, 1, 1, 0, 7, 0, 0, 1, 1}, b = {0, 1, 0, 5};
  auto plan = PlanBroadcast(as, bs);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceBuffer da = UploadBytes(a.data(), a.size()), db = UploadBytes(b.data(), b.size());
  auto dy = DeviceBuffer::Allocate(12);
  ASSERT_TRUE(dy.ok());
  const std::pair<LogicalOp, std::function<bool(bool, bool)>> ops[] = {
      {LogicalOp::kAnd, [](bool p, bool q) { return p && q; }},
      {LogicalOp::kOr, [](bool p, bool q) { return p || q; }},
      {LogicalOp::kXor, [](bool p, bool q) { return p != q; }},
  };
  std::vector<uint8_t> y(12);
  for (const auto& [op, ref] : ops) {
    ASSERT_TRUE(
        Logical(op, da.as<uint8_t>(), db.as<uint8_t>(), dy->as<uint8_t>(), *plan, stream()).ok());
    DownloadBytes(*dy, y.data(), 12);
    for (size_t i = 0; i < 12; ++i)
      EXPECT_EQ(y[i], ref(a[i] != 0, b[i % 4] != 0) ? 1 : 0) << static_cast<int>(op) << " " << i;
  }
  ASSERT_TRUE(
      Logical(LogicalOp::kNot, da.as<uint8_t>(), nullptr, dy->as<uint8_t>(), *plan, stream()).ok());
  DownloadBytes(*dy, y.data(), 12);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(y[i], a[i] == 0 ? 1 : 0) << i;
  // Not with a second operand, or And without one, is refused before the device is touched.
  EXPECT_EQ(Logical(LogicalOp::kNot, nullptr, db.as<uint8_t>(), nullptr, *plan, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Logical(LogicalOp::kAnd, nullptr, nullptr, nullptr, *plan, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// Attention's weights for the product after them: softmax and LogSoftmax rows (300 values,
// more than a block's threads) also written rounded, bit for bit the host's rounding of the
// fp32 result, beside it or alone.
TEST_F(ElementwiseGpuTest, SoftmaxAlsoWritesItsRowsRounded) {
  const std::vector<int64_t> dims = {4, 300};
  const std::vector<float> x = Random(1200, -5.f, 5.f, 44);
  DeviceBuffer dx = Upload(x), dy = Floats(x.size());
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "LogSoftmax" : "Softmax");
    ASSERT_TRUE(SoftmaxLastAxis(dx.as<float>(), dy.as<float>(), dims, stream(), log).ok());
    const std::vector<float> want = Download(dy, x.size());
    for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
      for (bool alone : {false, true}) {
        SCOPED_TRACE(alone ? "alone" : "beside");
        DeviceBuffer half = StaleHalves(x.size()), y = Floats(x.size());
        ASSERT_TRUE(SoftmaxLastAxis(dx.as<float>(), alone ? nullptr : y.as<float>(), dims, stream(),
                                    log, half.data(), type)
                        .ok());
        ExpectRounded(half, want, type);
        if (!alone) {
          EXPECT_EQ(Download(y, x.size()), want);
        }
      }
    }
  }
}

TEST(SoftmaxShapeTest, RefusesNoOutputAndAnOverlappingRoundingBeforeTouchingTheDevice) {
  alignas(16) float buffer[64] = {};
  const std::vector<int64_t> dims = {2, 8};
  EXPECT_EQ(SoftmaxLastAxis(buffer, nullptr, dims, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxLastAxis(buffer, nullptr, dims, nullptr, false, buffer + 10).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxLastAxis(buffer, buffer + 32, dims, nullptr, false, buffer + 40).code(),
            StatusCode::kInvalidArgument);
}

// LogSoftmax: x - max - log(sum(exp(x - max))), finite with a large value in the row.
TEST_F(ElementwiseGpuTest, LogSoftmaxRowsAreLogsOfTheSoftmax) {
  const std::vector<int64_t> dims = {4, 300};
  std::vector<float> x = Random(1200, -5.f, 5.f, 43);
  x[0] = 1000.f;
  DeviceBuffer dx = Upload(x), dy = Floats(1200);
  ASSERT_TRUE(SoftmaxLastAxis(dx.as<float>(), dy.as<float>(), dims, stream(), /*log=*/true).ok());
  const std::vector<float> y = Download(dy, 1200);
  for (int64_t r = 0; r < 4; ++r) {
    const float* row = x.data() + r * 300;
    const float m = *std::max_element(row, row + 300);
    double sum = 0;
    for (int64_t c = 0; c < 300; ++c) sum += std::exp(static_cast<double>(row[c] - m));
    for (int64_t c = 0; c < 300; ++c)
      ASSERT_NEAR(y[r * 300 + c], row[c] - m - std::log(sum), 1e-4) << r << " " << c;
  }
}

TEST_F(ElementwiseGpuTest, SoftmaxRowsSumToOneAndSurviveLargeValues) {
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{3, 10}, {2, 4, 1000}, {1, 1}, {5, 4097}}) {
    const int64_t cols = dims.back(), n = Elements(dims), rows = n / cols;
    std::vector<float> x = Random(n, -5.f, 5.f, 99);
    x[0] = 1000.f;  // exp(1000) overflows unless the row's maximum is subtracted first
    DeviceBuffer dx = Upload(x), dy = Floats(n);
    ASSERT_TRUE(SoftmaxLastAxis(dx.as<float>(), dy.as<float>(), dims, stream()).ok());
    const std::vector<float> y = Download(dy, n);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x.data() + r * cols;
      float m = row[0];
      for (int64_t c = 1; c < cols; ++c) m = std::max(m, row[c]);
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(row[c] - m));
      double total = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double want = std::exp(static_cast<double>(row[c] - m)) / sum;
        ASSERT_NEAR(y[r * cols + c], want, 1e-6 + 1e-5 * want) << "row " << r << " col " << c;
        total += y[r * cols + c];
      }
      EXPECT_NEAR(total, 1.0, 1e-4);
    }
  }
}

TEST(SoftmaxShapeTest, RefusesNoDimensionsBeforeTouchingTheDevice) {
  const Status s = SoftmaxLastAxis(nullptr, nullptr, std::vector<int64_t>{}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

// Cast to fp32 from each source type, values at the edges of what fp32 holds exactly.
TEST_F(ElementwiseGpuTest, CastToFloatFromIntegersAndBools) {
  const std::vector<int64_t> i64 = {0, -1, 7, int64_t{1} << 24, -(int64_t{1} << 40)};
  const std::vector<int32_t> i32 = {0, -3, 12345, 1 << 24, -(1 << 30)};
  const std::vector<uint8_t> bools = {0, 1, 0, 2, 255};
  DeviceBuffer y = Floats(5);
  DeviceBuffer a = UploadBytes(i64.data(), i64.size() * sizeof(int64_t));
  ASSERT_TRUE(CastToFloat(CastSource::kInt64, a.data(), y.as<float>(), 5, stream()).ok());
  std::vector<float> got = Download(y, 5);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], static_cast<float>(i64[i])) << i;
  DeviceBuffer b = UploadBytes(i32.data(), i32.size() * sizeof(int32_t));
  ASSERT_TRUE(CastToFloat(CastSource::kInt32, b.data(), y.as<float>(), 5, stream()).ok());
  got = Download(y, 5);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], static_cast<float>(i32[i])) << i;
  DeviceBuffer c = UploadBytes(bools.data(), bools.size());
  ASSERT_TRUE(CastToFloat(CastSource::kBool, c.data(), y.as<float>(), 5, stream()).ok());
  EXPECT_EQ(Download(y, 5), (std::vector<float>{0, 1, 0, 1, 1}));
}

// Cast to fp32 from fp16 and bf16 is exact: every value, subnormals, infinities and the
// largest finite ones included, comes back as the host's conversion says; and fp32 to fp16
// and back keeps the values fp16 holds.
TEST_F(ElementwiseGpuTest, CastToFloatFromHalvesIsExact) {
  const std::vector<uint16_t> fp16 = {0x0000, 0x8000, 0x3c00, 0xc000, 0x0001, 0x03ff,
                                      0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x3555, 0x1234};
  const std::vector<uint16_t> bf16 = {0x0000, 0x8000, 0x3f80, 0xc000, 0x0001, 0x007f,
                                      0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x3eab, 0x1234};
  const int64_t n = static_cast<int64_t>(fp16.size());
  DeviceBuffer y = Floats(n);
  DeviceBuffer a = UploadBytes(fp16.data(), fp16.size() * 2);
  ASSERT_TRUE(CastToFloat(CastSource::kFp16, a.data(), y.as<float>(), n, stream()).ok());
  std::vector<float> got = Download(y, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], Fp16ToFloat(fp16[i])) << i;
  DeviceBuffer b = UploadBytes(bf16.data(), bf16.size() * 2);
  ASSERT_TRUE(CastToFloat(CastSource::kBf16, b.data(), y.as<float>(), n, stream()).ok());
  got = Download(y, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], Bf16ToFloat(bf16[i])) << i;
  // fp16 -> fp32 -> fp16 round trip.
  DeviceBuffer back = UploadBytes(fp16.data(), fp16.size() * 2);
  ASSERT_TRUE(CastToFloat(CastSource::kFp16, a.data(), y.as<float>(), n, stream()).ok());
  ASSERT_TRUE(CastFloatToHalf(HalfType::kFp16, y.as<float>(), back.data(), n, stream()).ok());
  std::vector<uint16_t> bits(fp16.size());
  ASSERT_EQ(
      cudaMemcpyAsync(bits.data(), back.data(), bits.size() * 2, cudaMemcpyDeviceToHost, stream()),
      cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  EXPECT_EQ(bits, fp16);
}

// fp32 to int64 and int32 truncates toward zero and saturates, NaN to 0, as the CPU does.
TEST_F(ElementwiseGpuTest, CastFloatToIntTruncatesAndSaturates) {
  const std::vector<float> x = {0.f, 2.9f, -2.9f, 1e20f, -1e20f, NAN, 16777216.f, 3e9f};
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceBuffer in = Upload(x);
  DeviceBuffer y = Floats(2 * n);  // room for int64
  ASSERT_TRUE(CastFloatToInt(true, in.as<float>(), y.data(), n, stream()).ok());
  std::vector<int64_t> i64(x.size());
  ASSERT_EQ(cudaMemcpyAsync(i64.data(), y.data(), i64.size() * 8, cudaMemcpyDeviceToHost, stream()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  EXPECT_EQ(i64, (std::vector<int64_t>{0, 2, -2, INT64_MAX, INT64_MIN, 0, 16777216, 3000000000}));
  ASSERT_TRUE(CastFloatToInt(false, in.as<float>(), y.data(), n, stream()).ok());
  std::vector<int32_t> i32(x.size());
  ASSERT_EQ(cudaMemcpyAsync(i32.data(), y.data(), i32.size() * 4, cudaMemcpyDeviceToHost, stream()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
  EXPECT_EQ(i32, (std::vector<int32_t>{0, 2, -2, INT32_MAX, INT32_MIN, 0, 16777216, INT32_MAX}));
}

// Casts among int64, int32 and bool, and fp32 to bool, as the CPU engine casts: int64 to
// int32 keeps the low 32 bits, anything nonzero (a NaN too) is true, bools become 0 or 1.
TEST_F(ElementwiseGpuTest, IntegralCastsWrapAndTestForNonzero) {
  const std::vector<int64_t> wide = {0, 1, -1, (int64_t{1} << 32) + 5, INT64_MIN, 3000000000};
  DeviceBuffer d64 = UploadBytes(wide.data(), wide.size() * 8);
  auto d32 = DeviceBuffer::Allocate(wide.size() * 4), db = DeviceBuffer::Allocate(wide.size());
  auto dback = DeviceBuffer::Allocate(wide.size() * 8);
  ASSERT_TRUE(d32.ok() && db.ok() && dback.ok());
  ASSERT_TRUE(
      CastIntegral(DataType::kInt64, DataType::kInt32, d64.data(), d32->data(), 6, stream()).ok());
  ASSERT_TRUE(
      CastIntegral(DataType::kInt64, DataType::kBool, d64.data(), db->data(), 6, stream()).ok());
  std::vector<int32_t> narrow(6);
  std::vector<uint8_t> truth(6);
  DownloadBytes(*d32, narrow.data(), 24);
  DownloadBytes(*db, truth.data(), 6);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(narrow[i], static_cast<int32_t>(wide[i])) << i;
    EXPECT_EQ(truth[i], wide[i] != 0 ? 1 : 0) << i;
  }
  ASSERT_TRUE(
      CastIntegral(DataType::kBool, DataType::kInt64, db->data(), dback->data(), 6, stream()).ok());
  std::vector<int64_t> ones(6);
  DownloadBytes(*dback, ones.data(), 48);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(ones[i], wide[i] != 0 ? 1 : 0) << i;
  // A bool byte other than 0 and 1 (from outside the engine) is still true: 1.
  const std::vector<uint8_t> bytes = {0, 1, 2, 255};
  DeviceBuffer dbytes = UploadBytes(bytes.data(), bytes.size());
  ASSERT_TRUE(
      CastIntegral(DataType::kBool, DataType::kInt32, dbytes.data(), d32->data(), 4, stream())
          .ok());
  DownloadBytes(*d32, narrow.data(), 16);
  EXPECT_EQ(std::vector<int32_t>(narrow.begin(), narrow.begin() + 4),
            (std::vector<int32_t>{0, 1, 1, 1}));
  const std::vector<float> f = {0.f, -0.f, 0.5f, NAN, -INFINITY};
  DeviceBuffer df = Upload(f);
  ASSERT_TRUE(
      CastIntegral(DataType::kFp32, DataType::kBool, df.as<float>(), db->data(), 5, stream()).ok());
  DownloadBytes(*db, truth.data(), 5);
  EXPECT_EQ(std::vector<uint8_t>(truth.begin(), truth.begin() + 5),
            (std::vector<uint8_t>{0, 0, 1, 1, 1}));
}

TEST(CastShapeTest, IntegralCastsRefuseOtherTypesBeforeTouchingTheDevice) {
  EXPECT_EQ(CastIntegral(DataType::kFp32, DataType::kInt64, nullptr, nullptr, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CastIntegral(DataType::kInt64, DataType::kFp32, nullptr, nullptr, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CastIntegral(DataType::kFp16, DataType::kBool, nullptr, nullptr, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(CastShapeTest, RefusesANegativeCountBeforeTouchingTheDevice) {
  EXPECT_EQ(CastToFloat(CastSource::kInt64, nullptr, nullptr, -1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::engine::cuda
