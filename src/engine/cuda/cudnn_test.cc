#include "engine/cuda/cudnn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

// A window over x [n, c, h, w] with the output its arithmetic gives (symmetric pads).
Window2d MakeWindow(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t stride,
                    int64_t dilation, int64_t pad, int64_t groups) {
  Window2d g;
  g.n = n;
  g.c = c;
  g.h = h;
  g.w = w;
  g.kh = g.kw = k;
  g.sh = g.sw = stride;
  g.dh = g.dw = dilation;
  g.ph = g.ph_end = g.pw = g.pw_end = pad;
  g.groups = groups;
  g.oh = (h + 2 * pad - ((k - 1) * dilation + 1)) / stride + 1;
  g.ow = (w + 2 * pad - ((k - 1) * dilation + 1)) / stride + 1;
  return g;
}

CudnnConvOptions Options(const Window2d& g, int64_t m, GemmMath math = GemmMath::kFp32) {
  CudnnConvOptions o;
  o.window = g;
  o.m = m;
  o.math = math;
  return o;
}

// Transposed windows: x [n, c, h, h] through a k x k kernel into m channels.
struct Up {
  int64_t n, c, h, k, stride, dilation, pad, out_pad, groups, m;
};
const std::vector<Up> kUps = {{2, 16, 7, 4, 2, 1, 1, 0, 1, 8},  // the decoder's
                              {1, 8, 5, 3, 2, 1, 1, 1, 1, 3},   // the VAE's, output_padding 1
                              {3, 6, 4, 3, 3, 2, 2, 2, 3, 9}};  // grouped and dilated

CudnnConvOptions Transposed(const Up& u) {
  Window2d g = MakeWindow(u.n, u.c, u.h, u.h, u.k, u.stride, u.dilation, u.pad, u.groups);
  g.oh = g.ow = u.stride * (u.h - 1) + u.out_pad + (u.k - 1) * u.dilation + 1 - 2 * u.pad;
  CudnnConvOptions o = Options(g, u.m);
  o.transposed = true;
  return o;
}

TEST(CudnnCheckTest, ChannelsLastOnlyIn16BitsUnfusedAndForward) {
  const Window2d g = MakeWindow(2, 8, 10, 10, 3, 1, 1, 1, 1);
  CudnnConvOptions o = Options(g, 8, GemmMath::kFp16);
  o.channels_last = true;
  EXPECT_TRUE(CheckCudnnConv(o).ok());
  o.math = GemmMath::kBf16;
  EXPECT_TRUE(CheckCudnnConv(o).ok());
  for (GemmMath math : {GemmMath::kFp32, GemmMath::kTf32}) {
    o.math = math;
    EXPECT_EQ(CheckCudnnConv(o).code(), StatusCode::kInvalidArgument);
  }
  CudnnConvOptions t = Transposed(kUps[0]);
  t.math = GemmMath::kFp16;
  EXPECT_TRUE(CheckCudnnConv(t).ok());
  t.channels_last = true;
  EXPECT_EQ(CheckCudnnConv(t).code(), StatusCode::kInvalidArgument);
}

TEST(CudnnCheckTest, RefusesWhatCudnnCannotRun) {
  const Window2d g = MakeWindow(2, 4, 9, 8, 3, 2, 1, 1, 2);
  EXPECT_TRUE(CheckCudnnConv(Options(g, 6)).ok());
  // Pads that differ at the two ends (SAME_UPPER with an even kernel, say).
  Window2d uneven = g;
  uneven.ph_end = 2;
  uneven.oh = (9 + 1 + 2 - 3) / 2 + 1;
  Status s = CheckCudnnConv(Options(uneven, 6));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pads differ"), std::string::npos) << s.ToString();
  // An output the window does not give (ceil_mode's, say).
  Window2d ceil = g;
  ceil.oh += 1;
  EXPECT_EQ(CheckCudnnConv(Options(ceil, 6)).code(), StatusCode::kInvalidArgument);
  // Output channels that the groups do not divide.
  EXPECT_EQ(CheckCudnnConv(Options(g, 5)).code(), StatusCode::kInvalidArgument);
  // Fusion in 16 bits, and a residual without it.
  CudnnConvOptions fused = Options(g, 6, GemmMath::kFp16);
  fused.fused_bias_relu = true;
  EXPECT_EQ(CheckCudnnConv(fused).code(), StatusCode::kInvalidArgument);
  fused.math = GemmMath::kTf32;
  EXPECT_TRUE(CheckCudnnConv(fused).ok());
  CudnnConvOptions residual = Options(g, 6);
  residual.residual = true;
  EXPECT_EQ(CheckCudnnConv(residual).code(), StatusCode::kInvalidArgument);
  // A transposed convolution: y's size must map back onto x's (an output_padding below the
  // stride does), its pads alike at both ends, and nothing fuses into it.
  Window2d up = MakeWindow(2, 4, 5, 5, 4, 2, 1, 1, 2);
  up.oh = up.ow = 10;  // 2 * (5 - 1) + 4 - 2
  CudnnConvOptions transposed = Options(up, 6);
  transposed.transposed = true;
  EXPECT_TRUE(CheckCudnnConv(transposed).ok()) << CheckCudnnConv(transposed).ToString();
  transposed.window.oh = 11;  // output_padding 1: still maps back onto 5
  EXPECT_TRUE(CheckCudnnConv(transposed).ok());
  transposed.window.oh = 12;  // output_padding 2, the stride
  s = CheckCudnnConv(transposed);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("an input of 5x5"), std::string::npos) << s.ToString();
  transposed.window.oh = 10;
  transposed.window.ph_end = 0;  // pads taken off y's ends unequally
  transposed.window.oh = 11;
  EXPECT_EQ(CheckCudnnConv(transposed).code(), StatusCode::kInvalidArgument);
  transposed.window = up;
  transposed.fused_bias_relu = true;
  EXPECT_EQ(CheckCudnnConv(transposed).code(), StatusCode::kInvalidArgument);
  // Sizes past cuDNN's 32-bit descriptors.
  Window2d huge = MakeWindow(int64_t{1} << 20, 64, 64, 64, 1, 1, 1, 0, 1);
  EXPECT_EQ(CheckCudnnConv(Options(huge, 64)).code(), StatusCode::kInvalidArgument);
}

// The pick among ranked candidates: the heuristic search keeps the first that runs, the
// measured one the fastest (the earlier on a tie); refusals are passed over and listed,
// another error stops the search, and none running is UNIMPLEMENTED.
TEST(CudnnPickTest, KeepsTheFirstOrTheFastestOfWhatRuns) {
  const std::vector<double> ms = {3.0, 2.0, 2.0, 5.0};
  std::vector<size_t> ran;
  auto times = [&](size_t i) -> StatusOr<double> {
    ran.push_back(i);
    if (i == 0) return Unimplemented("not supported");
    return ms[i];
  };
  std::vector<std::pair<size_t, std::string>> refused;
  auto first = PickCudnnCandidate(ms.size(), CudnnAlgorithmSearch::kHeuristic, times, &refused);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, 1u);
  EXPECT_EQ(ran, (std::vector<size_t>{0, 1}));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].first, 0u);
  EXPECT_EQ(refused[0].second, "not supported");

  ran.clear();
  refused.clear();
  auto fastest = PickCudnnCandidate(ms.size(), CudnnAlgorithmSearch::kMeasured, times, &refused);
  ASSERT_TRUE(fastest.ok()) << fastest.status().ToString();
  EXPECT_EQ(*fastest, 1u);  // 2.0 ms, ranked before the other 2.0 ms
  EXPECT_EQ(ran, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(refused.size(), 1u);

  // Scratch that did not fit is a refusal too; a later candidate is faster.
  refused.clear();
  auto later = PickCudnnCandidate(
      3, CudnnAlgorithmSearch::kMeasured,
      [](size_t i) -> StatusOr<double> {
        if (i == 1) return ResourceExhausted("out of memory");
        return i == 2 ? 0.5 : 1.0;
      },
      &refused);
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(*later, 2u);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].first, 1u);

  // Any other error is returned at once, whatever ran before it.
  for (auto search : {CudnnAlgorithmSearch::kHeuristic, CudnnAlgorithmSearch::kMeasured}) {
    ran.clear();
    refused.clear();
    auto broken = PickCudnnCandidate(
        3, search,
        [&](size_t i) -> StatusOr<double> {
          ran.push_back(i);
          if (i == 0) return Unimplemented("no");
          return Internal("broken");
        },
        &refused);
    EXPECT_EQ(broken.status().code(), StatusCode::kInternal);
    EXPECT_EQ(ran, (std::vector<size_t>{0, 1}));
  }

  // Nothing runs: UNIMPLEMENTED, every candidate listed; no candidates at all, the same.
  refused.clear();
  auto none = PickCudnnCandidate(
      2, CudnnAlgorithmSearch::kMeasured,
      [](size_t) -> StatusOr<double> { return Unimplemented("no"); }, &refused);
  EXPECT_EQ(none.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(refused.size(), 2u);
  refused.clear();
  auto empty = PickCudnnCandidate(
      0, CudnnAlgorithmSearch::kHeuristic, [](size_t) -> StatusOr<double> { return 1.0; },
      &refused);
  EXPECT_EQ(empty.status().code(), StatusCode::kUnimplemented);
}

// cuDNN itself, where its library loads (the build machines have the toolkit's); no device
// is needed to describe a convolution.
TEST(CudnnLibraryTest, ComputesTheOutputTheWindowDoes) {
  auto cudnn = Cudnn::Get();
  if (!cudnn.ok()) GTEST_SKIP() << cudnn.status().ToString();
  EXPECT_GE(std::stoi((*cudnn)->version()), 9) << (*cudnn)->version();
  struct Case {
    int64_t n, c, h, w, k, stride, dilation, pad, groups, m;
  };
  for (const Case& c : std::vector<Case>{{1, 3, 224, 224, 7, 2, 1, 3, 1, 64},
                                         {8, 64, 56, 56, 3, 1, 1, 1, 1, 64},
                                         {2, 32, 17, 13, 3, 2, 2, 2, 4, 8},
                                         {3, 6, 5, 9, 1, 3, 1, 0, 3, 12},
                                         {1, 16, 10, 10, 5, 1, 3, 6, 16, 16}}) {
    const Window2d g = MakeWindow(c.n, c.c, c.h, c.w, c.k, c.stride, c.dilation, c.pad, c.groups);
    auto dims = CudnnConvOutputDims(**cudnn, Options(g, c.m));
    ASSERT_TRUE(dims.ok()) << dims.status().ToString();
    EXPECT_EQ(*dims, (std::array<int64_t, 4>{c.n, c.m, g.oh, g.ow}))
        << c.n << "x" << c.c << "x" << c.h << "x" << c.w << " k" << c.k << " s" << c.stride << " d"
        << c.dilation << " p" << c.pad << " g" << c.groups;
  }
  // Transposed: the convolution from y's shape back to x's gives x's, for the decoders'
  // windows (kernel 4, stride 2, pads 1; kernel 3, stride 2, pads 1 and output_padding 1)
  // and a grouped, dilated one (the device test's three).
  for (const Up& u : kUps) {
    CudnnConvOptions o = Transposed(u);
    auto dims = CudnnConvOutputDims(**cudnn, o);
    ASSERT_TRUE(dims.ok()) << dims.status().ToString();
    EXPECT_EQ(*dims, (std::array<int64_t, 4>{u.n, u.c, u.h, u.h}))
        << "k" << u.k << " s" << u.stride << " op" << u.out_pad;
  }
  // What CheckCudnnConv refuses is refused before cuDNN is asked.
  Window2d uneven = MakeWindow(1, 2, 6, 6, 2, 1, 1, 0, 1);
  uneven.ph_end = 1;
  uneven.oh += 1;
  EXPECT_EQ(CudnnConvOutputDims(**cudnn, Options(uneven, 2)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CudnnLibraryTest, AHandleNeedsADevice) {
  if (!Cudnn::Get().ok()) GTEST_SKIP() << Cudnn::Get().status().ToString();
  if (ListDevices().ok()) GTEST_SKIP() << "a device is here: the GPU tests below cover it";
  auto handle = CudnnHandle::Create();
  ASSERT_FALSE(handle.ok());
  EXPECT_NE(handle.status().message().find("cudnnCreate"), std::string::npos)
      << handle.status().ToString();
}

std::vector<float> Wave(int64_t n, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

// y = conv(x, w) [+ bias, + z, relu], on the host in double.
std::vector<float> Reference(const std::vector<float>& x, const std::vector<float>& w,
                             const Window2d& g, int64_t m, const std::vector<float>* bias,
                             const std::vector<float>* z, bool relu) {
  const int64_t cg = g.c / g.groups, mg = m / g.groups;
  std::vector<float> y;
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t group = oc / mg;
          double sum = 0;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t iy = oy * g.sh - g.ph + ky * g.dh, ix = ox * g.sw - g.pw + kx * g.dw;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                const int64_t c = group * cg + ic;
                sum += static_cast<double>(x[((b * g.c + c) * g.h + iy) * g.w + ix]) *
                       w[((oc * cg + ic) * g.kh + ky) * g.kw + kx];
              }
          if (bias) sum += (*bias)[oc];
          if (z) sum += (*z)[y.size()];
          if (relu) sum = std::max(0.0, sum);
          y.push_back(static_cast<float>(sum));
        }
  return y;
}

// y = ConvTranspose(x, w) on the host: each input scattered through the kernel, w
// [c, m/groups, kh, kw], ph and pw taken off y's start.
std::vector<float> TransposedReference(const std::vector<float>& x, const std::vector<float>& w,
                                       const Window2d& g, int64_t m) {
  const int64_t cg = g.c / g.groups, mg = m / g.groups;
  std::vector<double> y(static_cast<size_t>(g.n * m * g.oh * g.ow), 0.0);
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t ic = 0; ic < g.c; ++ic)
      for (int64_t iy = 0; iy < g.h; ++iy)
        for (int64_t ix = 0; ix < g.w; ++ix)
          for (int64_t og = 0; og < mg; ++og)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t oy = iy * g.sh + ky * g.dh - g.ph, ox = ix * g.sw + kx * g.dw - g.pw;
                if (oy < 0 || oy >= g.oh || ox < 0 || ox >= g.ow) continue;
                const int64_t oc = ic / cg * mg + og;
                y[((b * m + oc) * g.oh + oy) * g.ow + ox] +=
                    static_cast<double>(x[((b * g.c + ic) * g.h + iy) * g.w + ix]) *
                    w[((ic * mg + og) * g.kh + ky) * g.kw + kx];
              }
  return std::vector<float>(y.begin(), y.end());
}

class CudnnGpuTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    auto handle = CudnnHandle::Create();
    // On a GPU machine cuDNN must be there: bench/gpu/run.sh finds it with cuBLASLt.
    ASSERT_TRUE(handle.ok()) << handle.status().ToString();
    handle_ = std::move(handle).value();
  }

  // Runs `o` on x and w (and bias and z when fused) and returns y as fp32. Its algorithm is
  // the first cuDNN ranks; fused, the first of those that runs it, as a plan's trial picks
  // it (cuDNN ranks algorithms for the plain convolution, and the fused call may refuse
  // one): each candidate is run on buffers of these shapes until one runs.
  std::vector<float> Run(const CudnnConvOptions& o, const std::vector<float>& x,
                         const std::vector<float>& w, const std::vector<float>& bias,
                         const std::vector<float>* z, size_t max_workspace = size_t{1} << 28) {
    Operands trial_operands = UploadOperands(o, x, w, bias, z);
    const CudnnTrial runs = [&](const CudnnConv& candidate) -> StatusOr<double> {
      ASSIGN_OR_RETURN(DeviceBuffer scratch,
                       DeviceBuffer::Allocate(std::max<size_t>(candidate.workspace_bytes(), 1)));
      Status ran = RunOn(candidate, trial_operands, z != nullptr, scratch.data());
      if (ran.ok()) ran = CudaStatus(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      if (!ran.ok() && ran.code() != StatusCode::kUnimplemented &&
          ran.code() != StatusCode::kResourceExhausted) {
        // Passed over as the plan passes it over, unless the device is broken for good.
        (void)cudaGetLastError();
        if (cudaStreamSynchronize(stream()) != cudaSuccess || cudaGetLastError() != cudaSuccess)
          return ran;
        return Unimplemented("failed when run: " + ran.message());
      }
      RETURN_IF_ERROR(ran);
      return 0.0;
    };
    // Tried only where a plan tries them: a fused convolution (the trial here never measures).
    CudnnConvOptions heuristic = o;
    heuristic.search = CudnnAlgorithmSearch::kHeuristic;
    auto conv = CudnnConv::Create(*handle_, heuristic, max_workspace,
                                  o.fused_bias_relu ? runs : CudnnTrial());
    EXPECT_TRUE(conv.ok()) << conv.status().ToString();
    if (!conv.ok()) return {};
    EXPECT_LE((*conv)->workspace_bytes(), max_workspace);
    return RunWith(**conv, x, w, bias, z);
  }

  // A convolution's operands on the device: 16-bit ones rounded on the host, as the plan's
  // kToHalf steps and blobs round them; channels last, x [n, h, w, c] and w [m, kh, kw,
  // c/groups]. y starts as z, or NaN: a fused call without a residual reads z = y with a
  // weight of 0, and must not let what y held through; the others overwrite it.
  struct Operands {
    DeviceBuffer x, w, bias, y;
  };
  Operands UploadOperands(const CudnnConvOptions& o, const std::vector<float>& x,
                          const std::vector<float>& w, const std::vector<float>& bias,
                          const std::vector<float>* z) {
    const Window2d& g = o.window;
    const int64_t ny = g.n * o.m * g.oh * g.ow;
    const bool half = o.math == GemmMath::kFp16 || o.math == GemmMath::kBf16;
    auto to_device = [&](const std::vector<float>& v, int64_t n, int64_t c, int64_t spatial) {
      if (!half) return Upload(v);
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        h[i] = o.math == GemmMath::kFp16 ? FloatToFp16(v[i]) : FloatToBf16(v[i]);
      if (o.channels_last) h = ChannelsLast(h, n, c, spatial);
      return UploadBytes(h.data(), h.size() * 2);
    };
    Operands d;
    d.x = to_device(x, g.n, g.c, g.h * g.w);
    d.w = to_device(w, o.m, g.c / g.groups, g.kh * g.kw);
    d.bias = Upload(bias);
    d.y = z ? Upload(*z)
            : (half ? UploadBytes(std::vector<uint16_t>(ny, 0x7e00).data(), ny * 2)
                    : Upload(std::vector<float>(ny, std::nanf(""))));
    return d;
  }

  // `conv` run on `d`, y in place of z when `residual`.
  Status RunOn(const CudnnConv& conv, Operands& d, bool residual, void* workspace) {
    return conv.Run(*handle_, d.x.data(), d.w.data(), d.bias.as<float>(),
                    residual ? d.y.data() : nullptr, d.y.data(), workspace, stream());
  }

  // The same with `conv` as it was made (its options, algorithm and workspace).
  std::vector<float> RunWith(const CudnnConv& conv, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& bias,
                             const std::vector<float>* z) {
    const CudnnConvOptions& o = conv.options();
    const Window2d& g = o.window;
    const int64_t ny = g.n * o.m * g.oh * g.ow;
    const bool half = o.math == GemmMath::kFp16 || o.math == GemmMath::kBf16;
    Operands d = UploadOperands(o, x, w, bias, z);
    auto workspace = DeviceBuffer::Allocate(std::max<size_t>(conv.workspace_bytes(), 1));
    EXPECT_TRUE(workspace.ok());
    const Status ran = RunOn(conv, d, z != nullptr, workspace->data());
    EXPECT_TRUE(ran.ok()) << ran.ToString();
    if (!half) return Download(d.y, static_cast<size_t>(ny));
    std::vector<uint16_t> h(static_cast<size_t>(ny));
    DownloadBytes(d.y, h.data(), h.size() * 2);
    if (o.channels_last) h = ChannelsLast(h, g.n, o.m, g.oh * g.ow, /*back=*/true);
    std::vector<float> y(h.size());
    for (size_t i = 0; i < h.size(); ++i)
      y[i] = o.math == GemmMath::kFp16 ? Fp16ToFloat(h[i]) : Bf16ToFloat(h[i]);
    return y;
  }

  std::unique_ptr<CudnnHandle> handle_;
};

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double relative,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 1e-6f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], relative * scale) << what << " at " << i;
}

// Strided, dilated and grouped, 1x1, and depthwise windows, each with its output channels.
struct ReferenceCase {
  Window2d g;
  int64_t m;
};
const std::vector<ReferenceCase>& ReferenceCases() {
  static const std::vector<ReferenceCase> cases = {{MakeWindow(2, 4, 9, 8, 3, 2, 1, 1, 1), 6},
                                                   {MakeWindow(1, 8, 12, 11, 3, 1, 2, 2, 4), 8},
                                                   {MakeWindow(3, 3, 7, 7, 1, 1, 1, 0, 1), 5},
                                                   {MakeWindow(1, 16, 6, 6, 3, 1, 1, 1, 16), 16}};
  return cases;
}

TEST_F(CudnnGpuTest, ConvolvesAsTheReferenceInFp32) {
  for (const ReferenceCase& c : ReferenceCases()) {
    const Window2d& g = c.g;
    const auto x = Wave(g.n * g.c * g.h * g.w, 0.1f);
    const auto w = Wave(c.m * (g.c / g.groups) * g.kh * g.kw, 0.7f);
    const std::vector<float> no_bias(static_cast<size_t>(c.m), 0.f);
    ExpectNear(Run(Options(g, c.m), x, w, no_bias, nullptr),
               Reference(x, w, g, c.m, nullptr, nullptr, false), 1e-5, "fp32");
  }
}

TEST_F(CudnnGpuTest, FusesBiasReluAndTheResidual) {
  const Window2d g = MakeWindow(2, 8, 10, 10, 3, 1, 1, 1, 1);
  const int64_t m = 8;
  const auto x = Wave(g.n * g.c * g.h * g.w, 0.2f);
  const auto w = Wave(m * g.c * 9, 1.1f);
  const auto bias = Wave(m, 2.f);
  const auto z = Wave(g.n * m * g.oh * g.ow, 0.5f);
  CudnnConvOptions o = Options(g, m);
  o.fused_bias_relu = true;
  ExpectNear(Run(o, x, w, bias, nullptr), Reference(x, w, g, m, &bias, nullptr, true), 1e-5,
             "bias and relu");
  o.residual = true;
  ExpectNear(Run(o, x, w, bias, &z), Reference(x, w, g, m, &bias, &z, true), 1e-5,
             "bias, residual and relu");
  // TF32 rounds the operands to 10-bit mantissas.
  o.math = GemmMath::kTf32;
  ExpectNear(Run(o, x, w, bias, &z), Reference(x, w, g, m, &bias, &z, true), 5e-3, "tf32");
}

TEST_F(CudnnGpuTest, SixteenBitTiersRoundTheirOperands) {
  const Window2d g = MakeWindow(4, 16, 14, 14, 3, 2, 1, 1, 1);
  const int64_t m = 32;
  const auto x = Wave(g.n * g.c * g.h * g.w, 0.3f);
  const auto w = Wave(m * g.c * 9, 0.9f);
  const std::vector<float> no_bias(static_cast<size_t>(m), 0.f);
  const auto want = Reference(x, w, g, m, nullptr, nullptr, false);
  ExpectNear(Run(Options(g, m, GemmMath::kFp16), x, w, no_bias, nullptr), want, 2e-2, "fp16");
  ExpectNear(Run(Options(g, m, GemmMath::kBf16), x, w, no_bias, nullptr), want, 8e-2, "bf16");
}

// Channels last (NHWC x and y, w [m, kh, kw, c/groups]), as a mixed-precision plan runs its
// convolutions between 16-bit values: the reference's windows, within the tiers' rounding.
TEST_F(CudnnGpuTest, SixteenBitConvolutionsRunChannelsLast) {
  for (const ReferenceCase& c : ReferenceCases()) {
    const Window2d& g = c.g;
    const auto x = Wave(g.n * g.c * g.h * g.w, 0.4f);
    const auto w = Wave(c.m * (g.c / g.groups) * g.kh * g.kw, 1.2f);
    const std::vector<float> no_bias(static_cast<size_t>(c.m), 0.f);
    const auto want = Reference(x, w, g, c.m, nullptr, nullptr, false);
    for (const auto& [math, tolerance] :
         {std::pair{GemmMath::kFp16, 2e-2}, std::pair{GemmMath::kBf16, 8e-2}}) {
      CudnnConvOptions o = Options(g, c.m, math);
      o.channels_last = true;
      ExpectNear(Run(o, x, w, no_bias, nullptr), want, tolerance,
                 math == GemmMath::kFp16 ? "fp16, channels last" : "bf16, channels last");
    }
  }
}

// ConvTranspose as cuDNN's backward data: the decoders' windows (kernel 4, stride 2, pads
// 1; kernel 3, stride 2, output_padding 1) and a grouped, dilated one, against the scatter.
TEST_F(CudnnGpuTest, TransposedConvolutionsScatterAsTheReference) {
  for (const Up& u : kUps) {
    CudnnConvOptions o = Transposed(u);
    const Window2d& g = o.window;
    const auto x = Wave(g.n * g.c * g.h * g.w, 0.6f);
    const auto w = Wave(g.c * (u.m / g.groups) * g.kh * g.kw, 1.3f);
    const std::vector<float> no_bias(static_cast<size_t>(u.m), 0.f);
    ExpectNear(Run(o, x, w, no_bias, nullptr), TransposedReference(x, w, g, u.m), 1e-5,
               "transposed");
    o.math = GemmMath::kTf32;
    ExpectNear(Run(o, x, w, no_bias, nullptr), TransposedReference(x, w, g, u.m), 5e-3,
               "transposed, tf32");
  }
}

// A trial (as GpuPlan::Create runs each fused convolution's candidates) that refuses an
// algorithm passes to the next; another error comes back as it is; refusing every one is
// UNIMPLEMENTED, saying so.
TEST_F(CudnnGpuTest, ATrialPassesOverTheAlgorithmsItRefuses) {
  const Window2d g = MakeWindow(2, 8, 10, 10, 3, 1, 1, 1, 1);
  CudnnConvOptions o = Options(g, 8);
  o.fused_bias_relu = true;
  std::vector<int> seen;
  auto refuse_first = [&](const CudnnConv& conv) -> StatusOr<double> {
    seen.push_back(conv.algorithm());
    if (seen.size() == 1) return Unimplemented("refused");
    return 1.0;
  };
  auto conv = CudnnConv::Create(*handle_, o, size_t{1} << 28, refuse_first);
  ASSERT_TRUE(conv.ok()) << conv.status().ToString();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_EQ((*conv)->algorithm(), seen[1]);
  auto failed =
      CudnnConv::Create(*handle_, o, size_t{1} << 28,
                        [](const CudnnConv&) -> StatusOr<double> { return Internal("broken"); });
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  auto none =
      CudnnConv::Create(*handle_, o, size_t{1} << 28,
                        [](const CudnnConv&) -> StatusOr<double> { return Unimplemented("no"); });
  EXPECT_EQ(none.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(none.status().message().find("refused when run"), std::string::npos)
      << none.status().ToString();
}

// A measured search runs every candidate through the trial and keeps the one whose time
// was least, with its own algorithm, math and workspace held again after the later ones ran;
// the heuristic search keeps the first that runs. The convolution kept convolves as the
// reference. (The times are the trial's word here; GpuPlan's trial measures them.)
TEST_F(CudnnGpuTest, AMeasuredSearchKeepsTheFastestCandidate) {
  const Window2d g = MakeWindow(4, 16, 14, 14, 3, 1, 1, 1, 1);
  CudnnConvOptions o = Options(g, 16);
  struct Tried {
    int algorithm;
    size_t bytes;
  };
  std::vector<Tried> seen;
  // The second candidate run is said to be the fastest.
  auto second_fastest = [&](const CudnnConv& conv) -> StatusOr<double> {
    seen.push_back({conv.algorithm(), conv.workspace_bytes()});
    return seen.size() == 2 ? 1.0 : 5.0;
  };
  o.search = CudnnAlgorithmSearch::kMeasured;
  auto measured = CudnnConv::Create(*handle_, o, size_t{1} << 28, second_fastest);
  ASSERT_TRUE(measured.ok()) << measured.status().ToString();
  ASSERT_GE(seen.size(), 3u) << "too few algorithms for this test to tell anything";
  EXPECT_EQ((*measured)->algorithm(), seen[1].algorithm);
  EXPECT_EQ((*measured)->workspace_bytes(), seen[1].bytes);
  EXPECT_EQ((*measured)->measured(), static_cast<int>(seen.size()));
  EXPECT_DOUBLE_EQ((*measured)->measured_ms(), 1.0);
  const int first_ranked = seen[0].algorithm;
  seen.clear();
  o.search = CudnnAlgorithmSearch::kHeuristic;
  auto first = CudnnConv::Create(*handle_, o, size_t{1} << 28, second_fastest);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ((*first)->algorithm(), first_ranked);
  EXPECT_EQ((*first)->measured(), 0);
  const auto x = Wave(g.n * g.c * g.h * g.w, 0.8f);
  const auto w = Wave(16 * 16 * 9, 0.3f);
  ExpectNear(RunWith(**measured, x, w, std::vector<float>(16, 0.f), nullptr),
             Reference(x, w, g, 16, nullptr, nullptr, false), 1e-4, "measured");
}

TEST_F(CudnnGpuTest, KeepsWithinTheWorkspaceItIsGiven) {
  // Implicit GEMM needs no scratch: a limit of 0 still finds an algorithm.
  const Window2d g = MakeWindow(2, 8, 16, 16, 3, 1, 1, 1, 1);
  auto conv = CudnnConv::Create(*handle_, Options(g, 8), 0);
  ASSERT_TRUE(conv.ok()) << conv.status().ToString();
  EXPECT_EQ((*conv)->workspace_bytes(), 0u);
  const auto x = Wave(g.n * g.c * g.h * g.w, 0.f);
  const auto w = Wave(8 * 8 * 9, 0.4f);
  ExpectNear(Run(Options(g, 8), x, w, std::vector<float>(8, 0.f), nullptr, 0),
             Reference(x, w, g, 8, nullptr, nullptr, false), 1e-5, "no workspace");
}

}  // namespace
}  // namespace shoal::engine::cuda
