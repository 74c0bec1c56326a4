#include "engine/cuda/recurrent.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

RnnGeometry Lstm() {
  RnnGeometry g;
  g.cell = 2;
  g.seq = 3;
  g.batch = 3;
  g.hidden = 4;
  g.act[0] = {2, 0.f, 0.f};  // Sigmoid
  g.act[1] = {1, 0.f, 0.f};  // Tanh
  g.act[2] = {1, 0.f, 0.f};
  return g;
}

TEST(RnnGeometryTest, BadGeometriesAreRefusedBeforeTheDeviceIsTouched) {
  EXPECT_TRUE(CheckRnnGeometry(Lstm()).ok());
  RnnGeometry g = Lstm();
  g.cell = 3;
  EXPECT_EQ(CheckRnnGeometry(g).code(), StatusCode::kInvalidArgument);
  g = Lstm();
  g.hidden = -1;
  EXPECT_EQ(CheckRnnGeometry(g).code(), StatusCode::kInvalidArgument);
  g = Lstm();
  g.dir = 1;  // of one direction
  EXPECT_EQ(CheckRnnGeometry(g).code(), StatusCode::kInvalidArgument);
  g.dirs = 2;
  EXPECT_TRUE(CheckRnnGeometry(g).ok());
  g = Lstm();
  g.step = 3;  // of three
  EXPECT_EQ(CheckRnnGeometry(g).code(), StatusCode::kInvalidArgument);
  g = Lstm();
  g.act[2].kind = 11;
  EXPECT_EQ(CheckRnnGeometry(g).code(), StatusCode::kInvalidArgument);

  // The cell's own checks, with no device memory at all.
  int32_t* no_flag = nullptr;
  const RnnGeometry lstm = Lstm();
  EXPECT_EQ(RnnCell(lstm, nullptr, nullptr, 15, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, nullptr, no_flag, nullptr)
                .code(),
            StatusCode::kInvalidArgument);  // hr narrower than 4 gates x 4
  int32_t flag = 0;
  EXPECT_EQ(RnnCell(lstm, nullptr, nullptr, 16, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, nullptr, &flag, nullptr)
                .code(),
            StatusCode::kInvalidArgument);  // an LSTM without c
  RnnGeometry gru = Lstm();
  gru.cell = 1;
  EXPECT_EQ(RnnCell(gru, nullptr, nullptr, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, &flag, nullptr)
                .code(),
            StatusCode::kInvalidArgument);  // its h gate's products missing
  EXPECT_EQ(GruReset(lstm, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
  gru.linear_before_reset = true;
  EXPECT_EQ(GruReset(gru, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

std::vector<float> Wave(int64_t n, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

class RnnKernelTest : public GpuTest {};

// Bidirectional states in layout 1 ([batch, dirs, hidden]): each direction's rows in, and
// back out to where they came from.
TEST_F(RnnKernelTest, StatesRoundTripInEitherLayout) {
  for (bool batch_first : {false, true}) {
    RnnGeometry g = Lstm();
    g.dirs = 2;
    g.batch_first = batch_first;
    const std::vector<float> initial = Wave(2 * 3 * 4, 0.5f);
    DeviceBuffer in = Upload(initial);
    DeviceBuffer state = Floats(12), out = Floats(24);
    for (int64_t d = 0; d < 2; ++d) {
      g.dir = d;
      ASSERT_TRUE(RnnStateIn(in.as<float>(), state.as<float>(), g, stream()).ok());
      ASSERT_TRUE(RnnStateOut(state.as<float>(), out.as<float>(), g, stream()).ok());
    }
    std::vector<float> back(24);
    DownloadBytes(out, back.data(), 24 * sizeof(float));
    EXPECT_EQ(back, initial) << batch_first;
    // Without an initial state, zeros.
    ASSERT_TRUE(RnnStateIn(nullptr, state.as<float>(), g, stream()).ok());
    std::vector<float> zeros(12, 1.f);
    DownloadBytes(state, zeros.data(), 12 * sizeof(float));
    EXPECT_EQ(zeros, std::vector<float>(12, 0.f));
  }
}

// One LSTM step with peepholes and clip, on given products: row 0 takes step 1 at time 1,
// row 1's length (1) ends before it, row 2's (7) is out of range and raises the flag; y
// holds the new state at time 1 for row 0 alone.
TEST_F(RnnKernelTest, AnLstmStepMatchesTheCpuFormulas) {
  RnnGeometry g = Lstm();
  g.step = 1;
  g.clip = 0.9f;
  const int64_t H = 4, N = 3, T = 3, GH = 16;
  const std::vector<float> xw = Wave(T * N * GH, 0.1f), hr = Wave(N * GH, 1.3f);
  const std::vector<float> p = Wave(3 * H, 2.1f), h0 = Wave(N * H, 0.7f), c0 = Wave(N * H, 1.9f);
  const std::vector<int32_t> lens = {3, 1, 7};
  DeviceBuffer d_xw = Upload(xw), d_hr = Upload(hr), d_p = Upload(p), d_h = Upload(h0),
               d_c = Upload(c0), d_y = Upload(std::vector<float>(T * N * H, -5.f));
  DeviceBuffer d_lens = UploadBytes(lens.data(), lens.size() * sizeof(int32_t));
  DeviceBuffer d_flag = UploadBytes(std::vector<int32_t>{0}.data(), sizeof(int32_t));
  ASSERT_TRUE(RnnCell(g, d_xw.as<float>(), d_hr.as<float>(), GH, nullptr, nullptr, d_p.as<float>(),
                      d_lens.as<int32_t>(), d_h.as<float>(), d_c.as<float>(), d_y.as<float>(),
                      d_flag.as<int32_t>(), stream())
                  .ok());
  std::vector<float> h(N * H), c(N * H), y(T * N * H);
  int32_t flag = 0;
  DownloadBytes(d_h, h.data(), h.size() * sizeof(float));
  DownloadBytes(d_c, c.data(), c.size() * sizeof(float));
  DownloadBytes(d_y, y.data(), y.size() * sizeof(float));
  DownloadBytes(d_flag, &flag, sizeof(flag));
  EXPECT_EQ(flag, 8);
  auto clip = [&](float v) { return std::min(std::max(v, -g.clip), g.clip); };
  for (int64_t j = 0; j < H; ++j) {
    const float* x = xw.data() + (1 * N + 0) * GH;  // time 1, row 0
    const float* r = hr.data();
    const float cp = c0[j];
    const float ig = Sigmoid(clip(x[j] + r[j] + p[j] * cp));
    const float fg = Sigmoid(clip(x[2 * H + j] + r[2 * H + j] + p[2 * H + j] * cp));
    const float cc = std::tanh(clip(x[3 * H + j] + r[3 * H + j]));
    const float cn = fg * cp + ig * cc;
    const float og = Sigmoid(clip(x[H + j] + r[H + j] + p[H + j] * cn));
    EXPECT_NEAR(c[j], cn, 1e-6f);
    EXPECT_NEAR(h[j], og * std::tanh(cn), 1e-6f);
    EXPECT_EQ(y[(1 * N + 0) * H + j], h[j]);  // layout 0: [seq, dirs, batch, hidden]
  }
  for (int64_t b = 1; b < N; ++b)
    for (int64_t j = 0; j < H; ++j) {
      EXPECT_EQ(h[b * H + j], h0[b * H + j]) << b;
      EXPECT_EQ(c[b * H + j], c0[b * H + j]) << b;
      EXPECT_EQ(y[(1 * N + b) * H + j], -5.f) << b;
    }
}

// A GRU without linear-before-reset, backwards: the reset step keeps z in xw and writes
// r * h; the cell then reads z and its h gate's product.
TEST_F(RnnKernelTest, AGruWithoutLinearBeforeResetMatchesTheCpuFormulas) {
  RnnGeometry g;
  g.cell = 1;
  g.seq = 2;
  g.batch = 2;
  g.hidden = 3;
  g.backwards = true;
  g.act[0] = {2, 0.f, 0.f};
  g.act[1] = {1, 0.f, 0.f};
  const int64_t H = 3, N = 2, T = 2, GH = 9;
  std::vector<float> xw = Wave(T * N * GH, 0.3f);
  const std::vector<float> hr = Wave(N * 2 * H, 0.9f), hr_h = Wave(N * H, 1.7f),
                           h0 = Wave(N * H, 2.5f);
  DeviceBuffer d_xw = Upload(xw), d_hr = Upload(hr), d_hrh = Upload(hr_h), d_h = Upload(h0),
               d_rh = Floats(N * H);
  DeviceBuffer d_flag = UploadBytes(std::vector<int32_t>{0}.data(), sizeof(int32_t));
  ASSERT_TRUE(GruReset(g, d_xw.as<float>(), d_hr.as<float>(), d_h.as<float>(), nullptr,
                       d_rh.as<float>(), stream())
                  .ok());
  std::vector<float> rh(N * H);
  DownloadBytes(d_rh, rh.data(), rh.size() * sizeof(float));
  ASSERT_TRUE(RnnCell(g, d_xw.as<float>(), d_hr.as<float>(), 2 * H, d_hrh.as<float>(), nullptr,
                      nullptr, nullptr, d_h.as<float>(), nullptr, nullptr, d_flag.as<int32_t>(),
                      stream())
                  .ok());
  std::vector<float> h(N * H);
  DownloadBytes(d_h, h.data(), h.size() * sizeof(float));
  for (int64_t b = 0; b < N; ++b) {
    const float* x = xw.data() + (1 * N + b) * GH;  // step 0 backwards: time 1
    for (int64_t j = 0; j < H; ++j) {
      const float z = Sigmoid(x[j] + hr[b * 2 * H + j]);
      const float r = Sigmoid(x[H + j] + hr[b * 2 * H + H + j]);
      EXPECT_NEAR(rh[b * H + j], r * h0[b * H + j], 1e-6f);
      const float cand = std::tanh(x[2 * H + j] + hr_h[b * H + j]);
      EXPECT_NEAR(h[b * H + j], (1.f - z) * cand + z * h0[b * H + j], 1e-6f);
    }
  }
}

}  // namespace
}  // namespace shoal::engine::cuda
