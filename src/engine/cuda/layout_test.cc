#include "engine/cuda/layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "engine/cuda/test_util.h"

namespace shoal::engine::cuda {
namespace {

std::vector<float> Iota(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

// Transpose the plain way: for each output multi-index, the input element it names.
std::vector<float> TransposeReference(const std::vector<float>& x, const std::vector<int64_t>& dims,
                                      const std::vector<int64_t>& perm) {
  const size_t rank = dims.size();
  std::vector<int64_t> out_dims(rank), in_strides(rank, 1);
  for (size_t i = 0; i < rank; ++i) out_dims[i] = dims[perm[i]];
  for (int d = static_cast<int>(rank) - 2; d >= 0; --d)
    in_strides[d] = in_strides[d + 1] * dims[d + 1];
  std::vector<float> y(x.size());
  std::vector<int64_t> coord(rank, 0);
  for (size_t i = 0; i < y.size(); ++i) {
    int64_t from = 0;
    for (size_t d = 0; d < rank; ++d) from += coord[d] * in_strides[perm[d]];
    y[i] = x[from];
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++coord[d] < out_dims[d]) break;
      coord[d] = 0;
    }
  }
  return y;
}

TEST(PlanTransposeTest, MergesAxesThatStayTogether) {
  // [2,3,4,5] by [0,2,3,1]: axes 2 and 3 stay together; axis 0 stays alone.
  auto plan = PlanTranspose(std::vector<int64_t>{2, 3, 4, 5}, std::vector<int64_t>{0, 2, 3, 1});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{2, 4, 5, 3}));
  EXPECT_EQ(plan->elements, 120);
  ASSERT_EQ(plan->index.rank, 3);
  EXPECT_EQ(plan->index.out_dims[0], 2);
  EXPECT_EQ(plan->index.out_dims[1], 20);
  EXPECT_EQ(plan->index.out_dims[2], 3);
  EXPECT_EQ(plan->index.in_strides[0], 60);
  EXPECT_EQ(plan->index.in_strides[1], 1);
  EXPECT_EQ(plan->index.in_strides[2], 20);
  // The identity is one flat copy; an empty perm reverses.
  plan = PlanTranspose(std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{0, 1, 2});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->index.rank, 1);
  plan = PlanTranspose(std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{4, 3, 2}));
}

TEST(PlanTransposeTest, RefusesWhatIsNotAPermutation) {
  for (const std::vector<int64_t>& perm :
       std::vector<std::vector<int64_t>>{{0, 0, 1}, {0, 1}, {0, 1, 3}, {-1, 0, 1}}) {
    auto plan = PlanTranspose(std::vector<int64_t>{2, 3, 4}, perm);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("not a permutation"), std::string::npos);
  }
}

TEST(PlanGatherTest, GivesOnnxsOutputShape) {
  auto plan = PlanGather(std::vector<int64_t>{5, 6, 7}, std::vector<int64_t>{2, 3}, 1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{5, 2, 3, 7}));
  EXPECT_EQ(plan->outer, 5);
  EXPECT_EQ(plan->axis_dim, 6);
  EXPECT_EQ(plan->inner, 7);
  EXPECT_EQ(plan->num_indices, 6);
  plan = PlanGather(std::vector<int64_t>{5, 6, 7}, std::vector<int64_t>{}, -1);  // a scalar index
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{5, 6}));
  EXPECT_FALSE(PlanGather(std::vector<int64_t>{5, 6}, std::vector<int64_t>{1}, 2).ok());
  EXPECT_FALSE(PlanGather(std::vector<int64_t>{}, std::vector<int64_t>{1}, 0).ok());
}

using LayoutGpuTest = GpuTest;

TEST_F(LayoutGpuTest, TransposeMatchesTheReferenceForEveryPermutationOfFourAxes) {
  const std::vector<int64_t> dims = {2, 3, 4, 5};
  const std::vector<float> x = Iota(Elements(dims));
  DeviceBuffer dx = Upload(x), dy = Floats(x.size());
  std::vector<int64_t> perm = {0, 1, 2, 3};
  int checked = 0;
  do {
    auto plan = PlanTranspose(dims, perm);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_TRUE(Transpose(dx.as<float>(), dy.as<float>(), *plan, stream()).ok());
    EXPECT_EQ(Download(dy, x.size()), TransposeReference(x, dims, perm))
        << "perm " << perm[0] << perm[1] << perm[2] << perm[3];
    ++checked;
  } while (std::next_permutation(perm.begin(), perm.end()));
  EXPECT_EQ(checked, 24);
  // With axes of size 1, and BERT's head split [batch, seq, heads, dim] -> [batch, heads, seq,
  // dim].
  for (const auto& [d, p] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{1, 3, 1, 5}, {3, 1, 2, 0}}, {{2, 128, 12, 64}, {0, 2, 1, 3}}}) {
    const std::vector<float> v = Iota(Elements(d));
    DeviceBuffer dv = Upload(v), dw = Floats(v.size());
    auto plan = PlanTranspose(d, p);
    ASSERT_TRUE(plan.ok());
    ASSERT_TRUE(Transpose(dv.as<float>(), dw.as<float>(), *plan, stream()).ok());
    EXPECT_EQ(Download(dw, v.size()), TransposeReference(v, d, p));
  }
}

// BERT's head split, also written rounded for the product after it (values that fp16 and
// bf16 cannot hold exactly among them), beside the fp32 result or alone.
TEST_F(LayoutGpuTest, TransposeAlsoWritesItsResultRounded) {
  const std::vector<int64_t> dims = {2, 16, 4, 8}, perm = {0, 2, 1, 3};
  std::vector<float> x = Iota(Elements(dims));
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * 1.0001f + 1.f / 3.f;
  const std::vector<float> want = TransposeReference(x, dims, perm);
  auto plan = PlanTranspose(dims, perm);
  ASSERT_TRUE(plan.ok());
  DeviceBuffer dx = Upload(x);
  for (HalfType type : {HalfType::kFp16, HalfType::kBf16}) {
    for (bool alone : {false, true}) {
      SCOPED_TRACE(alone ? "alone" : "beside");
      DeviceBuffer half = StaleHalves(x.size()), y = Floats(x.size());
      ASSERT_TRUE(Transpose(dx.as<float>(), alone ? nullptr : y.as<float>(), *plan, stream(),
                            half.data(), type)
                      .ok());
      ExpectRounded(half, want, type);
      if (!alone) {
        EXPECT_EQ(Download(y, x.size()), want);
      }
    }
  }
}

TEST(TransposeShapeTest, RefusesNoOutputAndOverlapsBeforeTouchingTheDevice) {
  alignas(16) float buffer[64] = {};
  auto plan = PlanTranspose(std::vector<int64_t>{2, 8}, std::vector<int64_t>{1, 0});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(Transpose(buffer, nullptr, *plan, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Transpose(buffer, buffer + 8, *plan, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Transpose(buffer, buffer + 32, *plan, nullptr, buffer + 8).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Transpose(buffer, buffer + 32, *plan, nullptr, buffer + 40).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(LayoutGpuTest, GatherTakesRowsAndFlagsIndicesOutOfRange) {
  // An embedding table [10, 4] and token ids, negative ones counting from the end.
  const std::vector<float> table = Iota(40);
  const std::vector<int64_t> ids = {3, 0, 9, -1, 5, -10};
  auto plan = PlanGather(std::vector<int64_t>{10, 4}, std::vector<int64_t>{2, 3}, 0);
  ASSERT_TRUE(plan.ok());
  DeviceBuffer dt = Upload(table), di = UploadBytes(ids.data(), ids.size() * sizeof(int64_t)),
               dy = Floats(24);
  const int32_t zero = 0;
  DeviceBuffer flag = UploadBytes(&zero, sizeof(zero));
  ASSERT_TRUE(
      Gather(dt.as<float>(), di.as<int64_t>(), dy.as<float>(), *plan, flag.as<int32_t>(), stream())
          .ok());
  const std::vector<float> y = Download(dy, 24);
  for (size_t j = 0; j < ids.size(); ++j) {
    const int64_t row = ids[j] < 0 ? ids[j] + 10 : ids[j];
    for (int c = 0; c < 4; ++c) EXPECT_EQ(y[j * 4 + c], table[row * 4 + c]) << j << "," << c;
  }
  int32_t flagged = -1;
  DownloadBytes(flag, &flagged, sizeof(flagged));
  EXPECT_EQ(flagged, 0);

  // Along the inner axis, with one index out of range: zeros there, and the flag set.
  const std::vector<int64_t> cols = {1, 4, -1};
  auto inner = PlanGather(std::vector<int64_t>{10, 4}, std::vector<int64_t>{3}, 1);
  ASSERT_TRUE(inner.ok());
  DeviceBuffer dc = UploadBytes(cols.data(), cols.size() * sizeof(int64_t)), dz = Floats(30);
  ASSERT_TRUE(
      Gather(dt.as<float>(), dc.as<int64_t>(), dz.as<float>(), *inner, flag.as<int32_t>(), stream())
          .ok());
  const std::vector<float> z = Download(dz, 30);
  for (int r = 0; r < 10; ++r) {
    EXPECT_EQ(z[r * 3 + 0], table[r * 4 + 1]);
    EXPECT_EQ(z[r * 3 + 1], 0.f);  // index 4 of an axis of 4
    EXPECT_EQ(z[r * 3 + 2], table[r * 4 + 3]);
  }
  DownloadBytes(flag, &flagged, sizeof(flagged));
  EXPECT_EQ(flagged, 1);
  EXPECT_EQ(
      Gather(dt.as<float>(), dc.as<int64_t>(), dz.as<float>(), *inner, nullptr, stream()).code(),
      StatusCode::kInvalidArgument);
}

// Split's outputs: three slices of the middle axis of a [2, 6, 3] tensor, each against the
// plain loop.
TEST_F(LayoutGpuTest, SliceAxisCopiesOneRangeOfTheAxis) {
  const std::vector<int64_t> dims = {2, 6, 3};
  const std::vector<float> host = Iota(36);
  DeviceBuffer x = Upload(host);
  int64_t start = 0;
  for (int64_t length : {3, 1, 2}) {
    DeviceBuffer y = Floats(static_cast<size_t>(2 * length * 3));
    ASSERT_TRUE(SliceAxis(x.as<float>(), y.as<float>(), dims, 1, start, length, stream()).ok());
    const std::vector<float> got = Download(y, static_cast<size_t>(2 * length * 3));
    std::vector<float> want;
    for (int64_t o = 0; o < 2; ++o)
      for (int64_t a = start; a < start + length; ++a)
        for (int64_t c = 0; c < 3; ++c) want.push_back(host[(o * 6 + a) * 3 + c]);
    EXPECT_EQ(got, want) << "slice from " << start;
    start += length;
  }
  // The last axis, negative.
  DeviceBuffer last = Floats(2 * 6 * 2);
  ASSERT_TRUE(SliceAxis(x.as<float>(), last.as<float>(), dims, -1, 1, 2, stream()).ok());
  const std::vector<float> got = Download(last, 24);
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(got[i * 2], host[i * 3 + 1]);
    EXPECT_EQ(got[i * 2 + 1], host[i * 3 + 2]);
  }
}

// Concat's inputs: three pieces of a [2, 6, 3] tensor placed back along the middle axis
// give the tensor again.
TEST_F(LayoutGpuTest, PlaceAxisPutsEachPieceAtItsOffset) {
  const std::vector<int64_t> dims = {2, 6, 3};
  const std::vector<float> host = Iota(36);
  DeviceBuffer y = Floats(36);
  int64_t start = 0;
  for (int64_t length : {3, 1, 2}) {
    std::vector<float> piece;
    for (int64_t o = 0; o < 2; ++o)
      for (int64_t a = start; a < start + length; ++a)
        for (int64_t c = 0; c < 3; ++c) piece.push_back(host[(o * 6 + a) * 3 + c]);
    DeviceBuffer x = Upload(piece);
    const std::vector<int64_t> x_dims = {2, length, 3};
    ASSERT_TRUE(PlaceAxis(x.as<float>(), y.as<float>(), x_dims, dims, 1, start, stream()).ok());
    start += length;
  }
  EXPECT_EQ(Download(y, 36), host);
}

// Constant padding of a [2, 3, 4] tensor by (0, 1, 2) before and (1, 0, 1) after.
TEST_F(LayoutGpuTest, PadSurroundsTheTensorWithTheValue) {
  const std::vector<int64_t> dims = {2, 3, 4}, begin = {0, 1, 2}, end = {1, 0, 1};
  auto plan = PlanPad(dims, begin, end);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{3, 4, 7}));
  const std::vector<float> host = Iota(24);
  DeviceBuffer x = Upload(host), y = Floats(plan->elements);
  ASSERT_TRUE(Pad(x.as<float>(), y.as<float>(), *plan, -1.5f, stream()).ok());
  const std::vector<float> got = Download(y, plan->elements);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 7; ++k) {
        const int64_t si = i, sj = j - 1, sk = k - 2;
        const bool inside = si < 2 && sj >= 0 && sk >= 0 && sk < 4;
        EXPECT_EQ(got[(i * 4 + j) * 7 + k], inside ? host[(si * 3 + sj) * 4 + sk] : -1.5f)
            << i << "," << j << "," << k;
      }
}

// Edge and reflect padding of a [3, 4] tensor by (2, 1) before and (1, 3) after: each
// element as NumPy's np.pad computes it ("edge", "reflect"), the CPU engine's rule.
TEST_F(LayoutGpuTest, EdgeAndReflectPaddingMirrorOrRepeatTheEdge) {
  const std::vector<int64_t> dims = {3, 4}, begin = {2, 1}, end = {1, 3};
  const std::vector<float> host = Iota(12);
  DeviceBuffer x = Upload(host);
  for (const char* mode : {"edge", "reflect"}) {
    auto plan = PlanPad(dims, begin, end, mode);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{6, 8}));
    DeviceBuffer y = Floats(plan->elements);
    ASSERT_TRUE(Pad(x.as<float>(), y.as<float>(), *plan, -1.5f, stream()).ok());
    const std::vector<float> got = Download(y, plan->elements);
    auto source = [&](int64_t c, int64_t n) {
      if (c >= 0 && c < n) return c;
      if (std::string_view(mode) == "edge") return c < 0 ? int64_t{0} : n - 1;
      return c < 0 ? -c : 2 * (n - 1) - c;
    };
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t j = 0; j < 8; ++j)
        EXPECT_EQ(got[i * 8 + j], host[source(i - 2, 3) * 4 + source(j - 1, 4)])
            << mode << " " << i << "," << j;
  }
}

// Slice with steps, one of them negative: x[1:3, ::-2, 1:] of a [3, 5, 4] tensor.
TEST_F(LayoutGpuTest, SliceReadsAStridedViewWithNegativeSteps) {
  const std::vector<int64_t> dims = {3, 5, 4}, begin = {1, 4, 1}, step = {1, -2, 1},
                             out = {2, 3, 3};
  auto plan = PlanSlice(dims, begin, step, out);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<float> host = Iota(60);
  DeviceBuffer x = Upload(host), y = Floats(18);
  ASSERT_TRUE(Slice(x.as<float>(), y.as<float>(), *plan, stream()).ok());
  const std::vector<float> got = Download(y, 18);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 3; ++k)
        EXPECT_EQ(got[(i * 3 + j) * 3 + k], host[((1 + i) * 5 + (4 - 2 * j)) * 4 + 1 + k]);
}

// The plan on the host: where y[0] reads, and reads outside the tensor refused.
// Axis 0: 2 -> 3 nearest; axis 1: 3 -> 4 linear, two taps (the last reads the edge twice);
// axis 2: 2 -> 2 with its second coordinate outside the crop.
std::vector<ResizeAxis> ResizeAxes() {
  ResizeAxis nearest{2, 3, 1, {0, 0, 1}, {1.f, 1.f, 1.f}};
  ResizeAxis linear{
      3, 4, 2, {0, 1, 0, 1, 1, 2, 2, 2}, {1.f, 0.f, 0.25f, 0.75f, 0.5f, 0.5f, 1.f, 0.f}};
  ResizeAxis crop{2, 2, 1, {1, -1}, {1.f, 0.f}};
  return {nearest, linear, crop};
}

// Resize the plain way: per output element, every combination of its axes' taps.
std::vector<float> ResizeReference(const std::vector<float>& x, const std::vector<ResizeAxis>& axes,
                                   float extrapolation) {
  const size_t rank = axes.size();
  std::vector<int64_t> in_strides(rank, 1), out(rank);
  for (size_t d = 0; d < rank; ++d) out[d] = axes[d].out;
  for (int d = static_cast<int>(rank) - 2; d >= 0; --d)
    in_strides[d] = in_strides[d + 1] * axes[d + 1].in;
  std::vector<float> y(Elements(out));
  std::vector<int64_t> coord(rank, 0);
  for (size_t i = 0; i < y.size(); ++i) {
    bool outside = false;
    for (size_t d = 0; d < rank; ++d) outside = outside || axes[d].idx[coord[d] * axes[d].taps] < 0;
    double acc = 0;
    std::vector<int64_t> t(rank, 0);
    while (!outside) {
      double w = 1;
      int64_t from = 0;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t e = coord[d] * axes[d].taps + t[d];
        w *= axes[d].w[e];
        from += axes[d].idx[e] * in_strides[d];
      }
      acc += w * x[from];
      size_t d = rank;
      while (d-- > 0 && ++t[d] == axes[d].taps) t[d] = 0;
      if (d == SIZE_MAX) break;
    }
    y[i] = outside ? extrapolation : static_cast<float>(acc);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++coord[d] < out[d]) break;
      coord[d] = 0;
    }
  }
  return y;
}

TEST(PlanResizeTest, LaysTheAxesTablesOutOneAfterTheOther) {
  auto plan = PlanResize(ResizeAxes());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->out_dims, (std::vector<int64_t>{3, 4, 2}));
  EXPECT_EQ(plan->elements, 24);
  ASSERT_EQ(plan->index.rank, 3);
  EXPECT_EQ(plan->index.table_offset[0], 0);
  EXPECT_EQ(plan->index.table_offset[1], 3);
  EXPECT_EQ(plan->index.table_offset[2], 11);
  EXPECT_EQ(plan->index.taps[1], 2);
  EXPECT_EQ(plan->index.in_strides[0], 6);
  EXPECT_EQ(plan->index.in_strides[1], 2);
  EXPECT_EQ(plan->index.in_strides[2], 1);
  EXPECT_EQ(plan->idx.size(), 13u);
  EXPECT_EQ(plan->w.size(), 13u);
}

TEST(PlanResizeTest, RefusesBadTablesBeforeTouchingTheDevice) {
  std::vector<ResizeAxis> axes = ResizeAxes();
  axes[1].idx[3] = 3;  // past the axis's 3 elements
  EXPECT_EQ(PlanResize(axes).status().code(), StatusCode::kInvalidArgument);
  axes = ResizeAxes();
  axes[1].idx[1] = -1;  // an outside mark only counts in a coordinate's first entry
  EXPECT_FALSE(PlanResize(axes).ok());
  axes = ResizeAxes();
  axes[0].w.pop_back();
  EXPECT_FALSE(PlanResize(axes).ok());
  // 8 axes of 3 taps each: 6561 combinations per element.
  std::vector<ResizeAxis> many(8, ResizeAxis{1, 1, 3, {0, 0, 0}, {1.f, 0.f, 0.f}});
  auto refused = PlanResize(many);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("4096"), std::string::npos);
  many.resize(7);
  EXPECT_TRUE(PlanResize(many).ok());  // 2187
}

TEST_F(LayoutGpuTest, ResizeSumsEachElementsTapsAndExtrapolatesOutsideTheCrop) {
  const std::vector<ResizeAxis> axes = ResizeAxes();
  auto plan = PlanResize(axes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const std::vector<float> x = Iota(2 * 3 * 2);
  DeviceBuffer dx = Upload(x), dw = Upload(plan->w), dy = Floats(plan->elements);
  DeviceBuffer didx = UploadBytes(plan->idx.data(), plan->idx.size() * sizeof(int64_t));
  ASSERT_TRUE(Resize(dx.as<float>(), dy.as<float>(), didx.as<int64_t>(), dw.as<float>(), *plan,
                     -7.f, stream())
                  .ok());
  const std::vector<float> want = ResizeReference(x, axes, -7.f);
  const std::vector<float> got = Download(dy, plan->elements);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
  EXPECT_EQ(got[1], -7.f);  // the crop's outside coordinate
}

TEST(SliceShapeTest, GivesTheFirstElementAndRefusesReadsOutsideTheTensor) {
  const std::vector<int64_t> dims3 = {3, 5, 4};
  auto plan = PlanSlice(dims3, std::vector<int64_t>{1, 4, 1}, std::vector<int64_t>{1, -2, 1},
                        std::vector<int64_t>{2, 3, 3});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->base, (1 * 5 + 4) * 4 + 1);
  EXPECT_EQ(plan->elements, 18);
  const std::vector<int64_t> dims = {3, 5};
  const std::vector<int64_t> one = {1, 1}, out = {2, 3};
  EXPECT_TRUE(PlanSlice(dims, std::vector<int64_t>{1, 2}, one, out).ok());
  EXPECT_EQ(PlanSlice(dims, std::vector<int64_t>{2, 2}, one, out).status().code(),
            StatusCode::kInvalidArgument);  // rows 2 and 3 of 3
  EXPECT_EQ(
      PlanSlice(dims, std::vector<int64_t>{0, 1}, std::vector<int64_t>{1, -1}, out).status().code(),
      StatusCode::kInvalidArgument);  // columns 1, 0, -1
  EXPECT_EQ(
      PlanSlice(dims, std::vector<int64_t>{0, 0}, std::vector<int64_t>{0, 1}, out).status().code(),
      StatusCode::kInvalidArgument);  // a zero step
}

// Expand's plan, walked on the host as the kernel walks it: every element of [2, 3, 4] from
// x [3, 1] reads x[j] (axes aligned at the right; the 1 and the missing axis read with
// stride 0); shapes that do not broadcast exactly are refused.
TEST(ExpandShapeTest, ReadsBroadcastAxesWithStrideZero) {
  const std::vector<int64_t> dims = {3, 1}, out = {2, 3, 4};
  auto plan = PlanExpand(dims, out);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->elements, 24);
  EXPECT_EQ(plan->base, 0);
  EXPECT_EQ(plan->out_dims, out);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t read = i * plan->index.in_strides[0] + j * plan->index.in_strides[1] +
                             k * plan->index.in_strides[2];
        EXPECT_EQ(read, j) << i << "," << j << "," << k;
      }
  EXPECT_TRUE(PlanExpand(std::vector<int64_t>{}, std::vector<int64_t>{5}).ok());  // a scalar
  EXPECT_EQ(PlanExpand(std::vector<int64_t>{3}, std::vector<int64_t>{2, 4}).status().code(),
            StatusCode::kInvalidArgument);  // 3 into 4
  EXPECT_EQ(PlanExpand(std::vector<int64_t>{2, 3}, std::vector<int64_t>{3}).status().code(),
            StatusCode::kInvalidArgument);  // fewer axes than the input
}

// Expand run on a device: x [3, 1] to [2, 3, 4].
TEST_F(LayoutGpuTest, ExpandBroadcastsOnTheDevice) {
  auto plan = PlanExpand(std::vector<int64_t>{3, 1}, std::vector<int64_t>{2, 3, 4});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceBuffer x = Upload({10.f, 20.f, 30.f}), y = Floats(24);
  ASSERT_TRUE(Slice(x.as<float>(), y.as<float>(), *plan, stream()).ok());
  const std::vector<float> got = Download(y, 24);
  for (int64_t i = 0; i < 24; ++i)
    EXPECT_EQ(got[i], 10.f * static_cast<float>(1 + (i / 4) % 3)) << i;
}

TEST(PadShapeTest, RefusesNegativePadsAndMissingOnes) {
  const std::vector<int64_t> dims = {2, 3};
  EXPECT_EQ(PlanPad(dims, std::vector<int64_t>{0, -1}, std::vector<int64_t>{0, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanPad(dims, std::vector<int64_t>{0}, std::vector<int64_t>{0, 0}).status().code(),
            StatusCode::kInvalidArgument);
  // Reflect pads must be smaller than the axis; edge needs elements; no other modes.
  EXPECT_EQ(PlanPad(dims, std::vector<int64_t>{0, 3}, std::vector<int64_t>{0, 0}, "reflect")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      PlanPad(dims, std::vector<int64_t>{0, 2}, std::vector<int64_t>{1, 0}, "reflect").ok());
  const std::vector<int64_t> empty = {0, 3};
  EXPECT_EQ(PlanPad(empty, std::vector<int64_t>{1, 0}, std::vector<int64_t>{0, 0}, "edge")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(PlanPad(empty, std::vector<int64_t>{1, 0}, std::vector<int64_t>{0, 0}).ok());
  EXPECT_EQ(
      PlanPad(dims, std::vector<int64_t>{0, 0}, std::vector<int64_t>{0, 0}, "wrap").status().code(),
      StatusCode::kInvalidArgument);
  const std::vector<int64_t> x = {2, 3, 3}, y = {2, 5, 3};
  EXPECT_EQ(PlaceAxis(nullptr, nullptr, x, y, 1, 3, nullptr).code(), StatusCode::kInvalidArgument);
  const std::vector<int64_t> other = {2, 3, 4};
  EXPECT_EQ(PlaceAxis(nullptr, nullptr, other, y, 1, 0, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(SliceAxisShapeTest, RefusesRangesOutsideTheAxisBeforeTouchingTheDevice) {
  const std::vector<int64_t> dims = {2, 6, 3};
  EXPECT_EQ(SliceAxis(nullptr, nullptr, dims, 1, 4, 3, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceAxis(nullptr, nullptr, dims, 3, 0, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SliceAxis(nullptr, nullptr, dims, 0, -1, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::engine::cuda
