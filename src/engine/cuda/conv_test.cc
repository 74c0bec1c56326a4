#include "engine/cuda/conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "core/fp16.h"
#include "engine/cuda/quantize.h"
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
  // A window of -inf values (a masked map, say) pools to -inf, as on the CPU, not to the
  // lowest finite value.
  const Window2d g = Strided();
  std::vector<float> x = Wave(g.n * g.c * g.h * g.w);
  for (int64_t i = 0; i < g.h * g.w; ++i) x[static_cast<size_t>(i)] = -INFINITY;  // plane 0
  DeviceBuffer dx = Upload(x), y = Floats(g.n * g.c * g.oh * g.ow);
  ASSERT_TRUE(Pool2d(PoolOp::kMax, dx.as<float>(), y.as<float>(), g, stream()).ok());
  const std::vector<float> want = PoolReference(PoolOp::kMax, x, g);
  const std::vector<float> got = Download(y, want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], 1e-5f) << "at " << i;
    }
  }
  EXPECT_TRUE(std::isinf(want[0])) << "the test's first window holds no -inf";
}

// A max pool of 16-bit values gives the rounding of the fp32 pool's result, bit for bit:
// the plan pools a convolution's 16-bit output this way for the next one. Values far
// beyond fp16's range and ties of rounding included, and a window with nothing inside.
TEST_F(ConvGpuTest, MaxPoolingOf16BitValuesIsTheRoundingOfTheFp32Pool) {
  Window2d past = Strided();
  past.h = past.w = 6;
  past.ph = past.pw = past.ph_end = past.pw_end = 0;
  past.oh = past.ow = 3;
  Window2d outside = Strided();  // padding as wide as the window: the first row pools none
  outside.ph = 3;
  outside.oh = (7 + 3 + 1 - 3) / 2 + 1;
  for (const Window2d& g : {Strided(), past, outside}) {
    std::vector<float> x = Wave(g.n * g.c * g.h * g.w);
    for (size_t i = 0; i < x.size(); i += 5) x[i] *= 40000.f;  // past fp16's largest
    // Each the largest of its window in Strided(): halfway between two fp16 values (rounded
    // to even), and the least value fp16 rounds to infinity, halfway past its largest.
    x[1] = 3.f + 1.f / 1024.f;
    x[3] = 65520.f;
    const int64_t count = g.n * g.c * g.oh * g.ow;
    DeviceBuffer dx = Upload(x), y = Floats(count);
    ASSERT_TRUE(Pool2d(PoolOp::kMax, dx.as<float>(), y.as<float>(), g, stream()).ok());
    const std::vector<float> want = Download(y, count);
    for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
      SCOPED_TRACE(type == HalfType::kFp16 ? "fp16" : "bf16");
      auto round = [&](float v) {
        return type == HalfType::kFp16 ? FloatToFp16(v) : FloatToBf16(v);
      };
      std::vector<uint16_t> half(x.size());
      for (size_t i = 0; i < x.size(); ++i) half[i] = round(x[i]);
      DeviceBuffer dh = UploadBytes(half.data(), half.size() * 2);
      const std::vector<uint16_t> stale(count, 0x7e00);  // NaN in both types
      DeviceBuffer out = UploadBytes(stale.data(), stale.size() * 2);
      ASSERT_TRUE(MaxPool2dHalf(type, dh.data(), out.data(), g, stream()).ok());
      std::vector<uint16_t> bits(count);
      DownloadBytes(out, bits.data(), bits.size() * 2);
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(bits[i], round(want[i])) << "at " << i;
      // Channels last (NHWC in and out), as a plan passes values between convolutions on
      // cuDNN: the same bits, laid out so.
      DeviceBuffer dh_last =
          UploadBytes(ChannelsLast(half, g.n, g.c, g.h * g.w).data(), half.size() * 2);
      DeviceBuffer out_last = UploadBytes(stale.data(), stale.size() * 2);
      ASSERT_TRUE(
          MaxPool2dHalf(type, dh_last.data(), out_last.data(), g, stream(), /*channels_last=*/true)
              .ok());
      DownloadBytes(out_last, bits.data(), bits.size() * 2);
      bits = ChannelsLast(bits, g.n, g.c, g.oh * g.ow, /*back=*/true);
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(bits[i], round(want[i])) << "channels last, at " << i;
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

// The epilogue's reference: post(act(c + bias) + z) per element of [n, m, spatial], the
// activations LeakyRelu (alpha 0.1) and Clip [-1, 2], as the plan asks for them.
std::vector<float> EpilogueReference(const std::vector<float>& c, const std::vector<float>* bias,
                                     const std::vector<float>* z, bool act, bool post, int64_t m,
                                     int64_t spatial) {
  std::vector<float> y(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    float v = c[i];
    if (bias) v += (*bias)[(static_cast<int64_t>(i) / spatial) % m];
    if (act) v = v >= 0.f ? v : 0.1f * v;
    if (z) v += (*z)[i];
    if (post) v = std::min(std::max(v, -1.f), 2.f);
    y[i] = v;
  }
  return y;
}

// One pass does what a convolution's step left: from fp32 in place and from fp16 and bf16
// (a mixed-precision cuDNN output, cast as it is read), with and without each of the bias,
// the activation, the residual and the post-activation.
TEST_F(ConvGpuTest, TheEpilogueMatchesTheReferenceFromEverySource) {
  const int64_t n = 2, m = 5, spatial = 7 * 3, count = n * m * spatial;
  std::vector<float> c = Wave(count);
  std::vector<float> bias(m), z(count);
  for (int64_t i = 0; i < m; ++i) bias[i] = 0.5f * static_cast<float>(i) - 1.f;
  for (int64_t i = 0; i < count; ++i) z[i] = std::cos(0.17f * static_cast<float>(i));
  DeviceBuffer db = Upload(bias), dz = Upload(z);
  for (int source = 0; source < 3; ++source) {
    // The 16-bit sources hold c rounded; the reference reads the same rounded values.
    std::vector<uint16_t> half(count);
    std::vector<float> rounded = c;
    for (int64_t i = 0; i < count && source > 0; ++i) {
      half[i] = source == 1 ? FloatToFp16(c[i]) : FloatToBf16(c[i]);
      rounded[i] = source == 1 ? Fp16ToFloat(half[i]) : Bf16ToFloat(half[i]);
    }
    for (int parts = 0; parts < 16; ++parts) {
      const bool with_bias = parts & 1, with_act = parts & 2, with_z = parts & 4,
                 with_post = parts & 8;
      SCOPED_TRACE("source " + std::to_string(source) + ", parts " + std::to_string(parts));
      ConvEpilogueOptions o;
      o.n = n;
      o.m = m;
      o.spatial = spatial;
      if (source > 0) o.source = source == 1 ? HalfType::kFp16 : HalfType::kBf16;
      if (with_act) {
        o.act = UnaryOp::kLeakyRelu;
        o.act_alpha = 0.1f;
      }
      if (with_post) {
        o.post = UnaryOp::kClip;
        o.post_alpha = -1.f;
        o.post_beta = 2.f;
      }
      const std::vector<float> want =
          EpilogueReference(rounded, with_bias ? &bias : nullptr, with_z ? &z : nullptr, with_act,
                            with_post, m, spatial);
      // fp32 runs in place (y is c); 16 bits into another buffer. From 16 bits the result is
      // rounded too, into the source's type (as for the next convolution), and once more
      // with no fp32 output at all.
      DeviceBuffer y = Upload(c);
      DeviceBuffer dc = source > 0 ? UploadBytes(half.data(), half.size() * 2) : DeviceBuffer();
      const void* in = source > 0 ? dc.data() : y.data();
      DeviceBuffer rounded = UploadBytes(half.data(), half.size() * 2);  // overwritten
      const HalfType type = source == 2 ? HalfType::kBf16 : HalfType::kFp16;
      void* h = rounded.data();  // from fp32 (in place) rounded to fp16, as from fp16
      ASSERT_TRUE(ConvEpilogue(o, in, with_bias ? db.as<float>() : nullptr,
                               with_z ? dz.as<float>() : nullptr, y.as<float>(), stream(), h, type)
                      .ok());
      const std::vector<float> got = Download(y, want.size());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << "at " << i;
      // From 16 bits, once more with no fp32 output (from fp32 the epilogue runs in place,
      // so always with y).
      const std::vector<uint16_t> stale(count, 0x7e00);  // NaN in both types
      DeviceBuffer alone = UploadBytes(stale.data(), stale.size() * 2);
      if (source > 0) {
        ASSERT_TRUE(ConvEpilogue(o, in, with_bias ? db.as<float>() : nullptr,
                                 with_z ? dz.as<float>() : nullptr, nullptr, stream(), alone.data(),
                                 type)
                        .ok());
      }
      for (const DeviceBuffer* out : {&rounded, &alone}) {
        if (source == 0 && out == &alone) continue;
        std::vector<uint16_t> bits(count);
        DownloadBytes(*out, bits.data(), bits.size() * 2);
        for (int64_t i = 0; i < count; ++i) {
          // The fp32 result rounded (to nearest even, as the host rounds): the same bits.
          const uint16_t expect = source == 2 ? FloatToBf16(got[i]) : FloatToFp16(got[i]);
          ASSERT_EQ(bits[i], expect) << "at " << i << (out == &alone ? ", 16 bits alone" : "");
        }
      }
      if (source == 0) {
        // From fp32 in place, the rounding laid out channels last (an im2col convolution
        // feeding a cuDNN one in a mixed-precision plan): the same bits, NHWC.
        ConvEpilogueOptions last = o;
        last.half_channels_last = true;
        DeviceBuffer y_again = Upload(c), rounded_last = StaleHalves(count);
        ASSERT_TRUE(ConvEpilogue(last, y_again.data(), with_bias ? db.as<float>() : nullptr,
                                 with_z ? dz.as<float>() : nullptr, y_again.as<float>(), stream(),
                                 rounded_last.data(), HalfType::kFp16)
                        .ok());
        EXPECT_EQ(Download(y_again, count), got);
        std::vector<uint16_t> bits(count);
        DownloadBytes(rounded_last, bits.data(), bits.size() * 2);
        bits = ChannelsLast(bits, n, m, spatial, /*back=*/true);
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(bits[i], FloatToFp16(got[i])) << "channels last, at " << i;
      }
    }
  }
}

// A ResNet block's last epilogue in fp16 and bf16: the residual read in 16 bits (the
// rounding the next convolutions read too), added after the cast and the bias, then the
// ReLU; its result rounded alone for the next block. The reference reads the same rounded
// values, so the result is exact to fp32 arithmetic. The 16-bit c (a cuDNN convolution's
// output), the residual and the rounding each NHWC (channels last) or NCHW, in all eight
// combinations, y always NCHW: the same values, in the layouts asked.
TEST_F(ConvGpuTest, TheEpilogueReadsA16BitResidualInEitherLayout) {
  const int64_t n = 2, m = 5, spatial = 7 * 3, count = n * m * spatial;
  const std::vector<float> c = Wave(count);
  std::vector<float> bias(m), z(count);
  for (int64_t i = 0; i < m; ++i) bias[i] = 0.25f * static_cast<float>(i) - 0.5f;
  for (int64_t i = 0; i < count; ++i) z[i] = 3.f * std::cos(0.23f * static_cast<float>(i));
  DeviceBuffer db = Upload(bias);
  for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
    SCOPED_TRACE(type == HalfType::kFp16 ? "fp16" : "bf16");
    auto round = [&](float v) { return type == HalfType::kFp16 ? FloatToFp16(v) : FloatToBf16(v); };
    auto widen = [&](uint16_t h) {
      return type == HalfType::kFp16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
    };
    std::vector<uint16_t> c16(count), z16(count);
    std::vector<float> c_rounded(count), z_rounded(count);
    for (int64_t i = 0; i < count; ++i) {
      c16[i] = round(c[i]);
      z16[i] = round(z[i]);
      c_rounded[i] = widen(c16[i]);
      z_rounded[i] = widen(z16[i]);
    }
    const std::vector<float> want =
        EpilogueReference(c_rounded, &bias, &z_rounded, false, true, m, spatial);
    for (int layouts = 0; layouts < 8; ++layouts) {
      const bool c_last = layouts & 1, z_last = layouts & 2, half_last = layouts & 4;
      SCOPED_TRACE("channels last: c " + std::to_string(c_last) + ", z " + std::to_string(z_last) +
                   ", rounding " + std::to_string(half_last));
      ConvEpilogueOptions o;
      o.n = n;
      o.m = m;
      o.spatial = spatial;
      o.source = type;
      o.residual = type;
      o.post = UnaryOp::kClip;  // the reference's post-activation
      o.post_alpha = -1.f;
      o.post_beta = 2.f;
      o.source_channels_last = c_last;
      o.residual_channels_last = z_last;
      o.half_channels_last = half_last;
      auto laid_out = [&](const std::vector<uint16_t>& v, bool last) {
        return last ? ChannelsLast(v, n, m, spatial) : v;
      };
      DeviceBuffer dc = UploadBytes(laid_out(c16, c_last).data(), c16.size() * 2);
      DeviceBuffer dz = UploadBytes(laid_out(z16, z_last).data(), z16.size() * 2);
      DeviceBuffer y = Floats(count), half = StaleHalves(count);
      ASSERT_TRUE(
          ConvEpilogue(o, dc.data(), db.as<float>(), dz.data(), y.as<float>(), stream()).ok());
      const std::vector<float> got = Download(y, count);
      for (int64_t i = 0; i < count; ++i) ASSERT_NEAR(got[i], want[i], 1e-6f) << "at " << i;
      ASSERT_TRUE(ConvEpilogue(o, dc.data(), db.as<float>(), dz.data(), nullptr, stream(),
                               half.data(), type)
                      .ok());
      std::vector<uint16_t> bits(count);
      DownloadBytes(half, bits.data(), bits.size() * 2);
      if (half_last) bits = ChannelsLast(bits, n, m, spatial, /*back=*/true);
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(bits[i], round(got[i])) << "at " << i;
    }
  }
}

// An int8 convolution's epilogue: int32 sums [n, spatial, m] scaled per channel, the bias,
// the ReLU, an fp32 residual and the ReLU after it, into y NCHW; and y quantised into q in the
// same pass, bit for bit the quantisation of the y it writes, with y or without it.
TEST_F(ConvGpuTest, TheEpilogueOfInt32SumsMatchesTheReferenceAndQuantisesItsResult) {
  const int64_t n = 2, m = 8, spatial = 15, total = n * m * spatial;
  std::vector<int32_t> sums(total);
  for (size_t i = 0; i < sums.size(); ++i) sums[i] = static_cast<int32_t>(i * 7919 % 40001) - 20000;
  // Scales of 1e-4 to 1e-3, biases and a residual of either sign.
  std::vector<float> scale = Wave(m), bias = Wave(m + 3), z = Wave(total + 5);
  for (float& v : scale) v = 1e-4f + 3e-4f * std::fabs(v);
  bias.erase(bias.begin(), bias.begin() + 3);
  z.erase(z.begin(), z.begin() + 5);
  DeviceBuffer dsums = UploadBytes(sums.data(), sums.size() * 4), dscale = Upload(scale),
               dbias = Upload(bias), dz = Upload(z), dy = Floats(total);
  auto dq = DeviceBuffer::Allocate(total);
  ASSERT_TRUE(dq.ok());
  ConvEpilogueOptions o;
  o.n = n;
  o.m = m;
  o.spatial = spatial;
  o.int32_sums = o.source_channels_last = true;
  o.act = o.post = UnaryOp::kRelu;
  for (int zero_point : {0, -128}) {
    SCOPED_TRACE(zero_point);
    const RoundTo to = RoundTo::Int8(127.f / 8.f, zero_point);
    ASSERT_TRUE(ConvEpilogue(o, dsums.data(), dbias.as<float>(), dz.data(), dy.as<float>(),
                             stream(), dq->data(), to, dscale.as<float>())
                    .ok());
    const std::vector<float> y = Download(dy, total);
    std::vector<int8_t> q(total);
    DownloadBytes(*dq, q.data(), q.size());
    for (int64_t b = 0; b < n; ++b)
      for (int64_t c = 0; c < m; ++c)
        for (int64_t s = 0; s < spatial; ++s) {
          const int64_t nchw = (b * m + c) * spatial + s, nhwc = (b * spatial + s) * m + c;
          const double product = double{static_cast<float>(sums[nhwc])} * scale[c];
          const double want = std::max(std::max(product + bias[c], 0.0) + z[nchw], 0.0);
          // The device may fuse the multiply and the add: within fp32's rounding of each.
          ASSERT_NEAR(y[nchw], want, 1e-6 * (std::fabs(product) + std::fabs(bias[c]) + 1))
              << "at " << nchw;
          ASSERT_EQ(q[nchw], QuantizeValue(y[nchw], to.inv_scale, zero_point)) << "at " << nchw;
        }
    // The int8 copy alone (the fp32 result read by nothing else), the same bits.
    auto alone = DeviceBuffer::Allocate(total);
    ASSERT_TRUE(alone.ok());
    ASSERT_TRUE(ConvEpilogue(o, dsums.data(), dbias.as<float>(), dz.data(), nullptr, stream(),
                             alone->data(), to, dscale.as<float>())
                    .ok());
    std::vector<int8_t> q_alone(total);
    DownloadBytes(*alone, q_alone.data(), q_alone.size());
    EXPECT_EQ(q_alone, q);
  }
}

TEST(ConvEpilogueTest, RefusesBadSizesAndInputsOverlappingItsOutput) {
  ConvEpilogueOptions o;
  o.n = 2;
  o.m = 3;
  o.spatial = 4;
  EXPECT_TRUE(CheckConvEpilogue(o).ok());
  o.spatial = -1;
  EXPECT_EQ(ConvEpilogue(o, nullptr, nullptr, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
  o.spatial = 4;
  o.m = 0;
  EXPECT_EQ(CheckConvEpilogue(o).code(), StatusCode::kInvalidArgument);
  o.m = 3;
  // Only 16-bit operands may be channels last.
  o.source_channels_last = true;
  EXPECT_EQ(CheckConvEpilogue(o).code(), StatusCode::kInvalidArgument);
  o.source = HalfType::kBf16;
  EXPECT_TRUE(CheckConvEpilogue(o).ok());
  o.residual_channels_last = true;
  EXPECT_EQ(CheckConvEpilogue(o).code(), StatusCode::kInvalidArgument);
  o.residual = HalfType::kBf16;
  EXPECT_TRUE(CheckConvEpilogue(o).ok());
  o = ConvEpilogueOptions{};
  o.n = 2;
  o.m = 3;
  o.spatial = 4;
  // 24 values: a 16-bit c starting within y's 96 bytes, or y within c's 48, overlaps; the
  // addresses are never dereferenced, since the refusal comes first.
  alignas(16) static float buffer[64];
  float* y = buffer + 16;
  o.source = HalfType::kFp16;
  for (const void* c : {static_cast<const void*>(y), static_cast<const void*>(y + 20),
                        static_cast<const void*>(buffer + 6)}) {  // 40 bytes before y
    const Status s = ConvEpilogue(o, c, nullptr, nullptr, y, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.ToString();
  }
  // fp32: y itself is allowed (checked on a device above); part of it, or a residual over
  // it, is not.
  o.source.reset();
  for (const float* c : {y + 1, buffer + 10}) {
    const Status s = ConvEpilogue(o, c, nullptr, nullptr, y, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("must be its output or not overlap it"), std::string::npos)
        << s.ToString();
  }
  const Status s = ConvEpilogue(o, y, nullptr, y + 23, y, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the residual must not overlap"), std::string::npos) << s.ToString();
  // No output at all; a 16-bit output over the fp32 one, over the input, or under the
  // residual. In `wide`: y [16, 40), an fp32 c [40, 64), the 16-bit output from 64 (12
  // floats' bytes), a residual from 70.
  EXPECT_EQ(ConvEpilogue(o, y, nullptr, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
  alignas(16) static float wide[128];
  float* wy = wide + 16;
  const float* wc = wide + 40;
  const struct {
    const float* z;
    void* half;
    const char* says;
  } bad[] = {{nullptr, wy + 4, "fp32 and 16-bit outputs must not overlap"},
             {nullptr, wide + 44, "must be its output or not overlap it"},
             {wide + 70, wide + 64, "the residual must not overlap"}};
  for (const auto& b : bad) {
    const Status s = ConvEpilogue(o, wc, nullptr, b.z, wy, nullptr, b.half);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << b.says;
    EXPECT_NE(s.message().find(b.says), std::string::npos) << s.ToString();
  }
  // A 16-bit residual is 2 bytes an element (48 here). Reaching into y, it is refused; ending
  // where y begins, it is clear (the refusal then is the outputs' overlap, checked after).
  o.residual = HalfType::kFp16;
  const Status over = ConvEpilogue(o, wc, nullptr, wy - 8, wy, nullptr);
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("the residual must not overlap"), std::string::npos)
      << over.ToString();
  const Status clear = ConvEpilogue(o, wc, nullptr, wy - 12, wy, nullptr, wy + 4);
  EXPECT_EQ(clear.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(clear.message().find("fp32 and 16-bit outputs must not overlap"), std::string::npos)
      << clear.ToString();
  o.residual.reset();
  // Sizes whose product overflows.
  o.n = o.m = o.spatial = int64_t{1} << 22;
  EXPECT_EQ(CheckConvEpilogue(o).code(), StatusCode::kInvalidArgument);
}

// An int8 convolution's epilogue: int32 sums are channels last and need their scales; an
// int8 output needs its buffer, a usable quantisation, and memory of its own.
TEST(ConvEpilogueTest, RefusesInt32SumsAndInt8OutputsItCannotTake) {
  ConvEpilogueOptions o;
  o.n = 2;
  o.m = 3;
  o.spatial = 4;
  o.int32_sums = true;
  EXPECT_EQ(CheckConvEpilogue(o).code(), StatusCode::kInvalidArgument) << "not channels last";
  o.source_channels_last = true;
  EXPECT_TRUE(CheckConvEpilogue(o).ok());
  o.source = HalfType::kFp16;
  EXPECT_EQ(CheckConvEpilogue(o).code(), StatusCode::kInvalidArgument) << "16-bit and int32";
  o.source.reset();
  // In `mem` (bytes): the sums [0, 96), y [128, 224), q [256, 280).
  alignas(16) static char mem[512];
  const auto* sums = reinterpret_cast<const int32_t*>(mem);
  auto* y = reinterpret_cast<float*>(mem + 128);
  auto* q = reinterpret_cast<int8_t*>(mem + 256);
  const auto* scale = reinterpret_cast<const float*>(mem + 384);
  const Status no_scale = ConvEpilogue(o, sums, nullptr, nullptr, y, nullptr);
  EXPECT_EQ(no_scale.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_scale.message().find("need their scales"), std::string::npos) << no_scale.ToString();
  // int32 sums are read in another layout: not even y itself may be them.
  const Status in_place =
      ConvEpilogue(o, y, nullptr, nullptr, y, nullptr, nullptr, HalfType::kFp16, scale);
  EXPECT_EQ(in_place.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in_place.message().find("must not overlap its output"), std::string::npos)
      << in_place.ToString();
  // An int8 copy with a bad quantisation, channels last, or over y or the sums.
  for (const auto& [inv_scale, zero_point] :
       {std::pair{0.f, 0}, std::pair{INFINITY, 0}, std::pair{10.f, 128}}) {
    const Status s = ConvEpilogue(o, sums, nullptr, nullptr, y, nullptr, q,
                                  RoundTo::Int8(inv_scale, zero_point), scale);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << inv_scale << " " << zero_point;
    EXPECT_NE(s.message().find("int8 copy"), std::string::npos) << s.ToString();
  }
  const RoundTo to = RoundTo::Int8(10.f, -128);
  ConvEpilogueOptions nhwc = o;
  nhwc.half_channels_last = true;
  const Status last = ConvEpilogue(nhwc, sums, nullptr, nullptr, y, nullptr, q, to, scale);
  EXPECT_EQ(last.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(last.message().find("int8 copy is NCHW"), std::string::npos) << last.ToString();
  for (int8_t* bad : {reinterpret_cast<int8_t*>(mem + 200), reinterpret_cast<int8_t*>(mem + 80)}) {
    const Status s = ConvEpilogue(o, sums, nullptr, nullptr, y, nullptr, bad, to, scale);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.ToString();
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
  EXPECT_EQ(MaxPool2dHalf(HalfType::kBf16, nullptr, nullptr, g, nullptr).code(),
            StatusCode::kInvalidArgument);
  // A pool's output overlapping its input: [2, 4, 7, 6] in, [2, 4, 4, 3] out.
  g = Strided();
  alignas(16) static float pool_buffer[2 * 4 * 7 * 6 + 96];
  EXPECT_EQ(Pool2d(PoolOp::kMax, pool_buffer, pool_buffer + 300, g, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxPool2dHalf(HalfType::kFp16, pool_buffer, pool_buffer + 100, g, nullptr).code(),
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
