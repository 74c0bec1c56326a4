#include "engine/cuda/conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

std::vector<float> Wave(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.31f * static_cast<float>(i)) * 3.f;
  return v;
}

// x[b, c, y, x] or 0 outside the input.
float At(const std::vector<float>& x, const Window2d& g, int64_t b, int64_t c, int64_t iy,
         int64_t ix) {
  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return 0.f;
  return x[((b * g.c + c) * g.h + iy) * g.w + ix];
}

std::vector<float> Im2ColReference(const std::vector<float>& x, const Window2d& g) {
  const int64_t cg = g.c / g.groups;
  std::vector<float> cols;
  for (int64_t group = 0; group < g.groups; ++group)
    for (int64_t b = 0; b < g.n; ++b)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox)
          for (int64_t c = group * cg; c < (group + 1) * cg; ++c)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx)
                cols.push_back(
                    At(x, g, b, c, oy * g.sh - g.ph + ky * g.dh, ox * g.sw - g.pw + kx * g.dw));
  return cols;
}

std::vector<float> PoolReference(PoolOp op, const std::vector<float>& x, const Window2d& g) {
  std::vector<float> y;
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          float best = -INFINITY, sum = 0;
          int inside = 0;
          const int whole = static_cast<int>(g.kh * g.kw);
          for (int64_t ky = 0; ky < g.kh; ++ky)
            for (int64_t kx = 0; kx < g.kw; ++kx) {
              const int64_t iy = oy * g.sh - g.ph + ky * g.dh, ix = ox * g.sw - g.pw + kx * g.dw;
              if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
              best = std::max(best, At(x, g, b, c, iy, ix));
              sum += At(x, g, b, c, iy, ix);
              ++inside;
            }
          y.push_back(inside == 0              ? 0.f
                      : op == PoolOp::kMax     ? best
                      : op == PoolOp::kAverage ? sum / static_cast<float>(inside)
                                               : sum / static_cast<float>(whole));
        }
  return y;
}

// A 3x3 window, stride 2, dilation 1, asymmetric padding, on a [2, 4, 7, 6] input.
Window2d Strided() {
  Window2d g;
  g.n = 2;
  g.c = 4;
  g.h = 7;
  g.w = 6;
  g.kh = g.kw = 3;
  g.sh = g.sw = 2;
  g.ph = 1;
  g.pw = 0;
  g.ph_end = 1;
  g.pw_end = 1;
  g.oh = (7 + 2 - 3) / 2 + 1;
  g.ow = (6 + 1 - 3) / 2 + 1;
  return g;
}

using ConvGpuTest = GpuTest;

TEST_F(ConvGpuTest, Im2ColMatchesTheReferenceWithPaddingStridesDilationsAndGroups) {
  Window2d dilated = Strided();
  dilated.sh = dilated.sw = 1;
  dilated.dh = dilated.dw = 2;
  dilated.oh = 7 + 2 - 5 + 1;
  dilated.ow = 6 + 1 - 5 + 1;
  Window2d grouped = Strided();
  grouped.groups = 2;
  for (const Window2d& g : {Strided(), dilated, grouped}) {
    const std::vector<float> x = Wave(g.n * g.c * g.h * g.w);
    const std::vector<float> want = Im2ColReference(x, g);
    DeviceBuffer dx = Upload(x), cols = Floats(want.size());
    ASSERT_TRUE(Im2Col(dx.as<float>(), cols.as<float>(), g, stream()).ok());
    EXPECT_EQ(Download(cols, want.size()), want) << "dilation " << g.dh << ", groups " << g.groups;
  }
}

TEST_F(ConvGpuTest, PoolingMatchesTheReferenceForEveryKind) {
  // And a ceil_mode window that runs past the padding: h = w = 6, kernel 3, stride 2, no
  // padding, three outputs per axis (the last window covers rows 4, 5 and one past). The
  // average that counts padding divides by the whole window there too, as the CPU does.
  Window2d overrun = Strided();
  overrun.h = overrun.w = 6;
  overrun.ph = overrun.pw = overrun.ph_end = overrun.pw_end = 0;
  overrun.oh = overrun.ow = 3;
  for (const Window2d& g : {Strided(), overrun}) {
    const std::vector<float> x = Wave(g.n * g.c * g.h * g.w);
    DeviceBuffer dx = Upload(x), y = Floats(g.n * g.c * g.oh * g.ow);
    for (PoolOp op : {PoolOp::kMax, PoolOp::kAverage, PoolOp::kAverageIncludePad}) {
      const std::vector<float> want = PoolReference(op, x, g);
      ASSERT_TRUE(Pool2d(op, dx.as<float>(), y.as<float>(), g, stream()).ok());
      const std::vector<float> got = Download(y, want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-5f) << "op " << static_cast<int>(op) << " at " << i;
    }
  }
}

// A transposed convolution the way its definition reads: every input scatters into the
// outputs its kernel footprint reaches (the kernel gathers instead).
std::vector<float> ConvTransposeReference(const std::vector<float>& x, const std::vector<float>& w,
                                          const std::vector<float>& bias, const Window2d& g,
                                          int64_t m) {
  const int64_t cg = g.c / g.groups, mg = m / g.groups;
  std::vector<float> y(g.n * m * g.oh * g.ow);
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t i = 0; i < g.oh * g.ow; ++i) y[(b * m + oc) * g.oh * g.ow + i] = bias[oc];
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t iy = 0; iy < g.h; ++iy)
        for (int64_t ix = 0; ix < g.w; ++ix)
          for (int64_t om = 0; om < mg; ++om)
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t oy = iy * g.sh - g.ph + ky * g.dh, ox = ix * g.sw - g.pw + kx * g.dw;
                if (oy < 0 || oy >= g.oh || ox < 0 || ox >= g.ow) continue;
                const int64_t oc = (c / cg) * mg + om;
                y[((b * m + oc) * g.oh + oy) * g.ow + ox] +=
                    x[((b * g.c + c) * g.h + iy) * g.w + ix] *
                    w[((c * mg + om) * g.kh + ky) * g.kw + kx];
              }
  return y;
}

// Stride 2 with output padding (the VAE's decoder), stride 3 with dilation 2 and uneven
// padding, and two groups.
TEST_F(ConvGpuTest, ConvTransposeMatchesTheScatteringReference) {
  Window2d up;
  up.n = 2;
  up.c = 4;
  up.h = 5;
  up.w = 3;
  up.kh = up.kw = 3;
  up.sh = up.sw = 2;
  up.ph = up.pw = up.ph_end = up.pw_end = 1;
  up.oh = 2 * (5 - 1) + 3 - 2 + 1;  // output_padding 1
  up.ow = 2 * (3 - 1) + 3 - 2 + 1;
  Window2d dilated = up;
  dilated.sh = 3;
  dilated.sw = 1;
  dilated.dh = dilated.dw = 2;
  dilated.ph = 2;
  dilated.ph_end = 0;
  dilated.oh = 3 * (5 - 1) + 2 * 2 + 1 - 2;
  dilated.ow = 1 * (3 - 1) + 2 * 2 + 1 - 2;
  Window2d grouped = up;
  grouped.groups = 2;
  for (const Window2d& g : {up, dilated, grouped}) {
    const int64_t m = 6;
    const std::vector<float> x = Wave(g.n * g.c * g.h * g.w);
    const std::vector<float> w = Wave(g.c * (m / g.groups) * g.kh * g.kw);
    std::vector<float> bias(m);
    for (int64_t i = 0; i < m; ++i) bias[i] = 0.25f * static_cast<float>(i) - 0.5f;
    const std::vector<float> want = ConvTransposeReference(x, w, bias, g, m);
    DeviceBuffer dx = Upload(x), dw = Upload(w), db = Upload(bias), y = Floats(want.size());
    ASSERT_TRUE(ConvTranspose2d(dx.as<float>(), dw.as<float>(), db.as<float>(), y.as<float>(), g, m,
                                stream())
                    .ok());
    const std::vector<float> got = Download(y, want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4f)
          << "stride " << g.sh << ", groups " << g.groups << " at " << i;
  }
}

TEST(ConvWindowTest, RefusesBadWindowsBeforeTouchingTheDevice) {
  Window2d g = Strided();
  g.groups = 3;  // does not divide 4 channels
  EXPECT_EQ(Im2Col(nullptr, nullptr, g, nullptr).code(), StatusCode::kInvalidArgument);
  g = Strided();
  g.sh = 0;
  EXPECT_EQ(Pool2d(PoolOp::kMax, nullptr, nullptr, g, nullptr).code(),
            StatusCode::kInvalidArgument);
  g = Strided();
  g.pw = -1;
  EXPECT_EQ(CheckWindow(g).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckWindow(Strided()).ok());
  // Six output channels cannot be split in four groups.
  g = Strided();
  g.groups = 4;
  EXPECT_EQ(ConvTranspose2d(nullptr, nullptr, nullptr, nullptr, g, 6, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::engine::cuda
