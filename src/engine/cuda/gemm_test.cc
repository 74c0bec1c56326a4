#include "engine/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Y = epilogue(X·W + bias) in double, row-major, W [k, n] or [n, k] when transposed.
std::vector<float> Reference(const GemmOptions& o, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& bias) {
  std::vector<float> y(o.m * o.n);
  for (int64_t i = 0; i < o.m; ++i) {
    for (int64_t j = 0; j < o.n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < o.k; ++p) {
        acc += double{x[i * o.k + p]} * (o.transpose_w ? w[j * o.k + p] : w[p * o.n + j]);
      }
      const bool with_bias = o.epilogue == GemmEpilogue::kBias ||
                             o.epilogue == GemmEpilogue::kBiasRelu ||
                             o.epilogue == GemmEpilogue::kBiasGelu;
      if (with_bias) acc += bias[j];
      if (o.epilogue == GemmEpilogue::kRelu || o.epilogue == GemmEpilogue::kBiasRelu) {
        acc = std::max(acc, 0.0);
      }
      if (o.epilogue == GemmEpilogue::kBiasGelu) {
        // cuBLASLt's GELU epilogue is the tanh approximation.
        acc = 0.5 * acc * (1 + std::tanh(0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)));
      }
      y[i * o.n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

TEST(GemmBytesTest, HalfOperandsWithAnFp32OutputAreTwoBytesInAndFourOut) {
  GemmOptions o;
  EXPECT_EQ(GemmOutputBytes(o), 4u);
  o.math = GemmMath::kBf16;
  EXPECT_EQ(GemmElementBytes(o.math), 2u);
  EXPECT_EQ(GemmOutputBytes(o), 2u);
  o.fp32_output = true;
  EXPECT_EQ(GemmOutputBytes(o), 4u);
}

TEST(GemmBytesTest, Int8OperandsAreOneByteInAndTheirSumsFourOut) {
  GemmOptions o;
  o.math = GemmMath::kInt8;
  EXPECT_EQ(GemmElementBytes(o.math), 1u);
  EXPECT_EQ(GemmOutputBytes(o), 4u);
}

class GemmGpuTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto handle = LtHandle::Create();
    ASSERT_TRUE(handle.ok()) << handle.status().ToString();
    handle_ = std::move(handle).value();
  }

  // Plans an m x n x k int8 GEMM (W stored [n, k]) and expects its int32 sums equal to the
  // host's, on random int8 operands whose last rows are all 127 (a sum of 127^2 * k). With
  // `may_refuse`, planning may fail as UNIMPLEMENTED (no algorithm): then false.
  bool ExpectExactInt8(int64_t m, int64_t n, int64_t k, bool may_refuse = false) {
    SCOPED_TRACE(testing::Message() << "int8 m=" << m << " n=" << n << " k=" << k);
    GemmOptions o;
    o.m = m;
    o.n = n;
    o.k = k;
    o.math = GemmMath::kInt8;
    o.transpose_w = true;
    auto gemm = LtGemm::Create(*handle_, o);
    if (may_refuse && gemm.status().code() == StatusCode::kUnimplemented) return false;
    EXPECT_TRUE(gemm.ok()) << gemm.status().ToString();
    if (!gemm.ok()) return false;
    std::mt19937 gen(static_cast<unsigned>(m * 131 + k));
    std::uniform_int_distribution<int> dist(-127, 127);
    std::vector<int8_t> x(m * k), w(n * k);
    for (int8_t& v : x) v = static_cast<int8_t>(dist(gen));
    for (int8_t& v : w) v = static_cast<int8_t>(dist(gen));
    for (int64_t i = 0; i < k; ++i) x[(m - 1) * k + i] = w[(n - 1) * k + i] = 127;
    DeviceBuffer dx = UploadBytes(x.data(), x.size()), dw = UploadBytes(w.data(), w.size()),
                 dy = Floats(m * n), workspace = Floats(o.workspace_bytes / sizeof(float));
    const Status run =
        (*gemm)->Run(dx.data(), dw.data(), nullptr, dy.data(), workspace.data(), stream());
    EXPECT_TRUE(run.ok()) << run.ToString();
    if (!run.ok()) return false;
    std::vector<int32_t> y(m * n);
    DownloadBytes(dy, y.data(), y.size() * sizeof(int32_t));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        int32_t want = 0;
        for (int64_t p = 0; p < k; ++p) want += int32_t{x[i * k + p]} * int32_t{w[j * k + p]};
        EXPECT_EQ(y[i * n + j], want) << "at " << i << "," << j;
        if (y[i * n + j] != want) return true;  // one is enough
      }
    }
    return true;
  }

  // Runs one GEMM against the reference; `tolerance` times the square root of k bounds
  // the absolute error (products of values in [-1, 1] accumulate error that way at most).
  // For fp16 and bf16 the inputs are rounded to the type first, so the reference sees the
  // same operands and only the accumulation and the output's rounding differ.
  void Check(const GemmOptions& o, float tolerance) {
    SCOPED_TRACE(testing::Message()
                 << "m=" << o.m << " n=" << o.n << " k=" << o.k << " transpose_w=" << o.transpose_w
                 << " epilogue=" << static_cast<int>(o.epilogue)
                 << " math=" << static_cast<int>(o.math));
    auto gemm = LtGemm::Create(*handle_, o);
    ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
    std::vector<float> x = Random(o.m * o.k, 1), w = Random(o.k * o.n, 2), bias = Random(o.n, 3);
    for (std::vector<float>* v : {&x, &w, &bias}) {
      for (float& f : *v) f = Decode(o.math, Encode(o.math, f));
    }
    // With fp32_output, Y and the bias are fp32 whatever the operands are.
    const GemmMath out_math = o.fp32_output ? GemmMath::kFp32 : o.math;
    DeviceBuffer dx = UploadAs(o.math, x), dw = UploadAs(o.math, w), db = UploadAs(out_math, bias),
                 dy = Floats(o.m * o.n), workspace = Floats(o.workspace_bytes / sizeof(float));
    const Status run =
        (*gemm)->Run(dx.data(), dw.data(), db.data(), dy.data(), workspace.data(), stream());
    ASSERT_TRUE(run.ok()) << run.ToString();
    const std::vector<float> y = DownloadAs(out_math, dy, o.m * o.n);
    const std::vector<float> want = Reference(o, x, w, bias);
    const float bound = tolerance * std::sqrt(static_cast<float>(o.k));
    // cuBLASLt does not say how exact its GELU's tanh is. The hardware's approximate tanh
    // is good to ~2^-11 relative, which moves 0.5·x·(1 + tanh(...)) by up to ~2.5e-4·|x|,
    // x the value before the activation; that much is allowed. (So this checks that the
    // epilogue applies a GELU, not which of its two forms: they differ by under 4.7e-4.)
    std::vector<float> before(want.size(), 0.f);
    if (o.epilogue == GemmEpilogue::kBiasGelu) {
      GemmOptions linear = o;
      linear.epilogue = GemmEpilogue::kBias;
      before = Reference(linear, x, w, bias);
    }
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(y[i], want[i], bound + 5e-4f * std::fabs(before[i])) << "element " << i;
    }
  }

  // The 16-bit pattern of f in fp16 or bf16 (round to nearest even); f's own bits for fp32.
  static uint32_t Encode(GemmMath math, float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (math == GemmMath::kFp16) return FloatToFp16(f);
    if (math == GemmMath::kBf16) return FloatToBf16(f);
    return u;
  }
  static float Decode(GemmMath math, uint32_t bits) {
    if (math == GemmMath::kFp16) return Fp16ToFloat(static_cast<uint16_t>(bits));
    if (math == GemmMath::kBf16) return Bf16ToFloat(static_cast<uint16_t>(bits));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  DeviceBuffer UploadAs(GemmMath math, const std::vector<float>& values) {
    if (GemmElementBytes(math) == 4) return Upload(values);
    std::vector<uint16_t> half(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      half[i] = static_cast<uint16_t>(Encode(math, values[i]));
    return UploadBytes(half.data(), half.size() * 2);
  }
  std::vector<float> DownloadAs(GemmMath math, const DeviceBuffer& device, size_t n) {
    if (GemmElementBytes(math) == 4) return Download(device, n);
    std::vector<uint16_t> half(n);
    DownloadBytes(device, half.data(), n * 2);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = Decode(math, half[i]);
    return out;
  }

  std::unique_ptr<LtHandle> handle_;
};

TEST_F(GemmGpuTest, Fp32MatchesTheReferenceForEveryEpilogueAndLayout) {
  for (const GemmEpilogue e : {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kRelu,
                               GemmEpilogue::kBiasRelu, GemmEpilogue::kBiasGelu}) {
    for (const bool transpose : {false, true}) {
      GemmOptions o;
      o.m = 33;  // not a multiple of any tile
      o.n = 70;
      o.k = 129;
      o.transpose_w = transpose;
      o.epilogue = e;
      Check(o, 1e-5f);
    }
  }
}

TEST_F(GemmGpuTest, ShapesFromBatchOneToLargeBatches) {
  for (const int64_t m : {1, 8, 64, 257}) {
    GemmOptions o;
    o.m = m;
    o.n = 1000;  // a classifier's head
    o.k = 512;
    o.transpose_w = true;
    o.epilogue = GemmEpilogue::kBias;
    Check(o, 1e-5f);
  }
}

TEST_F(GemmGpuTest, Tf32StaysWithinItsPrecision) {
  GemmOptions o;
  o.m = 128;
  o.n = 256;
  o.k = 768;
  o.math = GemmMath::kTf32;
  o.epilogue = GemmEpilogue::kBiasRelu;
  // 10-bit mantissas: each product is off by up to ~2^-11 relative.
  Check(o, 2e-3f);
}

// 16 bits in and out, with a 16-bit bias: a mixed-precision plan's product whose output only
// the next product reads (gpu_lowering.h), under each epilogue it may carry.
TEST_F(GemmGpuTest, HalfPrecisionsRunOnTensorCoresWithinTheirPrecision) {
  for (const auto& [math, tolerance] :
       {std::pair{GemmMath::kFp16, 2e-3f}, std::pair{GemmMath::kBf16, 1e-2f}}) {
    for (const GemmEpilogue e : {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kBiasRelu,
                                 GemmEpilogue::kBiasGelu}) {
      GemmOptions o;
      o.m = 64;
      o.n = 256;
      o.k = 768;  // BERT-base's hidden size
      o.transpose_w = true;
      o.epilogue = e;
      o.math = math;
      Check(o, tolerance);
    }
  }
}

// A mixed-precision plan's products: 16-bit operands, fp32 bias and output. The bound is
// tighter than the 16-bit outputs' above: an fp16 output of this size (|y| up to ~9) would
// round by up to ~4e-3, past 1e-4 * sqrt(768).
TEST_F(GemmGpuTest, HalfOperandsCanWriteFp32WithAnFp32Bias) {
  for (const GemmMath math : {GemmMath::kFp16, GemmMath::kBf16}) {
    for (const GemmEpilogue e : {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kBiasRelu,
                                 GemmEpilogue::kBiasGelu}) {
      GemmOptions o;
      o.m = 64;
      o.n = 256;
      o.k = 768;
      o.transpose_w = true;
      o.epilogue = e;
      o.math = math;
      o.fp32_output = true;
      EXPECT_EQ(GemmOutputBytes(o), 4u);
      Check(o, 1e-4f);
    }
  }
  GemmOptions fp32;
  fp32.m = fp32.n = fp32.k = 8;
  fp32.fp32_output = true;
  auto refused = LtGemm::Create(*handle_, fp32);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(GemmGpuTest, RefusesBadShapesAndAMissingBiasOrWorkspace) {
  GemmOptions o;
  o.m = 4;
  o.n = 0;
  o.k = 8;
  auto bad = LtGemm::Create(*handle_, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("n=0"), std::string::npos) << bad.status().message();

  o.n = 8;
  o.epilogue = GemmEpilogue::kBias;
  auto gemm = LtGemm::Create(*handle_, o);
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  DeviceBuffer buf = Floats(64), workspace = Floats(o.workspace_bytes / sizeof(float));
  EXPECT_EQ((*gemm)
                ->Run(buf.as<float>(), buf.as<float>(), nullptr, buf.as<float>(), workspace.data(),
                      stream())
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*gemm)
                ->Run(buf.as<float>(), buf.as<float>(), buf.as<float>(), buf.as<float>(), nullptr,
                      stream())
                .code(),
            StatusCode::kInvalidArgument);
  // An operand off the 256-byte alignment the algorithm was chosen for.
  EXPECT_EQ(
      (*gemm)
          ->Run(buf.as<char>() + 4, buf.data(), buf.data(), buf.data(), workspace.data(), stream())
          .code(),
      StatusCode::kInvalidArgument);
}

// Batched products as attention runs them: X and Y strided per product, W per product or
// one W for all (stride 0), alpha scaling, on shapes whose strides leave later matrices
// only 4-byte aligned (3x5 by 5x7).
// In fp32, and as a mixed-precision plan's attention runs them: fp16 operands (on strides
// of 30 and 70 bytes, so only 2-byte aligned) writing fp32.
TEST_F(GemmGpuTest, BatchedProductsWithAlphaAndABroadcastWeight) {
  for (const GemmMath math : {GemmMath::kFp32, GemmMath::kFp16})
    for (bool shared_w : {false, true}) {
      SCOPED_TRACE(shared_w ? "one W for every product" : "a W per product");
      SCOPED_TRACE(math == GemmMath::kFp32 ? "fp32" : "fp16 in, fp32 out");
      GemmOptions o;
      o.math = math;
      o.fp32_output = math == GemmMath::kFp16;
      o.m = 3;
      o.n = 7;
      o.k = 5;
      o.alpha = 0.125f;
      o.batch = 6;
      o.x_batch_stride = o.m * o.k;
      o.w_batch_stride = shared_w ? 0 : o.k * o.n;
      o.y_batch_stride = o.m * o.n;
      auto gemm = LtGemm::Create(*handle_, o);
      ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
      std::vector<float> x = Random(o.batch * o.m * o.k, 4);
      std::vector<float> w = Random((shared_w ? 1 : o.batch) * o.k * o.n, 5);
      for (std::vector<float>* v : {&x, &w})
        for (float& f : *v) f = Decode(math, Encode(math, f));
      DeviceBuffer dx = UploadAs(math, x), dw = UploadAs(math, w), dy = Floats(o.batch * o.m * o.n),
                   workspace = Floats(o.workspace_bytes / sizeof(float));
      const Status run =
          (*gemm)->Run(dx.data(), dw.data(), nullptr, dy.data(), workspace.data(), stream());
      ASSERT_TRUE(run.ok()) << run.ToString();
      const std::vector<float> y = Download(dy, o.batch * o.m * o.n);
      GemmOptions one = o;
      one.batch = 1;
      for (int64_t b = 0; b < o.batch; ++b) {
        const std::vector<float> xb(x.begin() + b * o.m * o.k, x.begin() + (b + 1) * o.m * o.k);
        const auto w0 = w.begin() + (shared_w ? 0 : b * o.k * o.n);
        const std::vector<float> wb(w0, w0 + o.k * o.n);
        const std::vector<float> want = Reference(one, xb, wb, {});
        for (int64_t i = 0; i < o.m * o.n; ++i)
          EXPECT_NEAR(y[b * o.m * o.n + i], 0.125f * want[i], 1e-5f)
              << "product " << b << " at " << i;
      }
    }
  // Outputs that would overlap are refused.
  GemmOptions overlap;
  overlap.m = 4;
  overlap.n = 4;
  overlap.k = 4;
  overlap.batch = 2;
  overlap.y_batch_stride = 8;
  auto refused = LtGemm::Create(*handle_, overlap);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

// int8 operands (W stored [n, k]) sum exactly into int32: on the shapes the lowering gives
// int8 (17 rows or more, GpuPlanOptions::int8_min_rows; k and n multiples of 8) up to
// 64x256x1024, and sums past 2^24 that fp32 could not hold exactly.
TEST_F(GemmGpuTest, Int8SumsAreExactInt32) {
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{17, 8, 16},
                                {33, 24, 40},
                                {64, 256, 1024},
                                {17, 8, 4096}}) {
    EXPECT_TRUE(ExpectExactInt8(m, n, k)) << "m=" << m << " n=" << n << " k=" << k;
  }
}

// Shapes the lowering keeps fp32 because cuBLASLt is known to lack int8 kernels for some of
// them (fewer rows; k or n a multiple of 4 but not of 8): either refused as UNIMPLEMENTED
// when planned, or exact. (What this device does is in the test's log.)
TEST_F(GemmGpuTest, Int8OfFewRowsOrNarrowIsExactOrRefused) {
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 16},
                                {7, 12, 20},
                                {3, 4, 4096},
                                {33, 12, 20},
                                {17, 4, 36}}) {
    const bool ran = ExpectExactInt8(m, n, k, /*may_refuse=*/true);
    std::printf("int8 GEMM m=%lld n=%lld k=%lld: %s\n", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k),
                ran ? "exact" : "no algorithm (UNIMPLEMENTED)");
  }
}

TEST_F(GemmGpuTest, Int8RefusesWhatItsKernelsCannotTake) {
  GemmOptions o;
  o.m = 4;
  o.n = 8;
  o.k = 16;
  o.math = GemmMath::kInt8;
  o.transpose_w = false;  // W [k, n]: not the "TN" layout
  EXPECT_EQ(LtGemm::Create(*handle_, o).status().code(), StatusCode::kInvalidArgument);
  o.transpose_w = true;
  o.k = 18;  // not a multiple of 4
  EXPECT_EQ(LtGemm::Create(*handle_, o).status().code(), StatusCode::kInvalidArgument);
  o.k = 16;
  o.epilogue = GemmEpilogue::kBiasRelu;  // the scaling pass applies these
  auto refused = LtGemm::Create(*handle_, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has an epilogue"), std::string::npos)
      << refused.status().message();
  o.epilogue = GemmEpilogue::kNone;
  o.m = 32;  // a shape the lowering gives int8
  EXPECT_TRUE(LtGemm::Create(*handle_, o).ok());
}

}  // namespace
}  // namespace shoal::engine::cuda
