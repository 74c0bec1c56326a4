// NonZero and NonMaxSuppression (ops/detection.cc), whose output shapes depend on their
// input data, against the examples of ONNX's operator documentation; plans in which
// such a value feeds further operators (plan.h, "Data-dependent shapes"); and Einsum
// (ops/einsum.cc) against results worked out by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using namespace shoal::engine::testing;

TEST(NonZeroTest, IndicesOfNonZeroElementsInRowMajorOrder) {
  // Run-time input: the shape is learned when the kernel runs.
  auto out = Run1("NonZero", {{F32({2, 2}, {1, 0, 1, 1})}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 3}));
  EXPECT_THAT(IntValues(out[0]), ElementsAre(0, 1, 1, 0, 0, 1));
  out = Run1("NonZero", {{Bool({3}, {0, 1, 1})}});
  EXPECT_EQ(out[0].shape(), (Shape{1, 2}));
  EXPECT_THAT(IntValues(out[0]), ElementsAre(1, 2));
  out = Run1("NonZero", {{I64({2, 3}, {0, 0, 0, 0, 0, 0})}});
  EXPECT_EQ(out[0].shape(), (Shape{2, 0}));
  // A constant input: computed when the plan is prepared.
  out = Run1("NonZero", {Const(I32({2, 2, 2}, {0, 3, 0, 0, 0, 0, -1, 0}))});
  EXPECT_EQ(out[0].shape(), (Shape{3, 2}));
  EXPECT_THAT(IntValues(out[0]), ElementsAre(0, 1, 0, 1, 1, 0));
}

// The boxes of ONNX's NonMaxSuppression examples: three near [0, 0, 1, 1], two near
// [0, 10, 1, 11], one at [0, 100, 1, 101].
Tensor ExampleBoxes() {
  return F32({1, 6, 4}, {0, 0,  1, 1,  0, 0.1f,  1, 1.1f,  0, -0.1f, 1, 0.9f,
                         0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100,   1, 101});
}
Tensor ExampleScores() { return F32({1, 1, 6}, {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f}); }

std::vector<int64_t> Nms(const std::vector<In>& in, int64_t center = 0) {
  auto out = Run1("NonMaxSuppression", in, {{"center_point_box", AInt(center)}});
  if (out[0].empty()) return {};
  EXPECT_EQ(out[0].shape().size(), 2u);
  EXPECT_EQ(out[0].shape()[1], 3);
  return IntValues(out[0]);
}

TEST(NonMaxSuppressionTest, OnnxExamples) {
  const In max3 = Const(I64({1}, {3})), iou = Const(F32({1}, {0.5f})),
           score0 = Const(F32({1}, {0.f}));
  // suppress_by_IOU
  EXPECT_THAT(Nms({{ExampleBoxes()}, {ExampleScores()}, max3, iou, score0}),
              ElementsAre(0, 0, 3, 0, 0, 0, 0, 0, 5));
  // suppress_by_IOU_and_scores
  EXPECT_THAT(Nms({{ExampleBoxes()}, {ExampleScores()}, max3, iou, Const(F32({1}, {0.4f}))}),
              ElementsAre(0, 0, 3, 0, 0, 0));
  // limit_output_size
  EXPECT_THAT(Nms({{ExampleBoxes()}, {ExampleScores()}, Const(I64({1}, {2})), iou, score0}),
              ElementsAre(0, 0, 3, 0, 0, 0));
  // flipped_coordinates
  EXPECT_THAT(Nms({{F32({1, 6, 4}, {1, 1,  0, 0,  0, 0.1f,  1, 1.1f,  0, 0.9f, 1, -0.1f,
                                    0, 10, 1, 11, 1, 10.1f, 0, 11.1f, 1, 101,  0, 100})},
                   {ExampleScores()},
                   max3,
                   iou,
                   score0}),
              ElementsAre(0, 0, 3, 0, 0, 0, 0, 0, 5));
  // center_point_box
  EXPECT_THAT(Nms({{F32({1, 6, 4}, {0.5f, 0.5f,  1, 1, 0.5f, 0.6f,  1, 1, 0.5f, 0.4f,   1, 1,
                                    0.5f, 10.5f, 1, 1, 0.5f, 10.6f, 1, 1, 0.5f, 100.5f, 1, 1})},
                   {ExampleScores()},
                   max3,
                   iou,
                   score0},
                  1),
              ElementsAre(0, 0, 3, 0, 0, 0, 0, 0, 5));
  // identical_boxes
  std::vector<float> same;
  for (int i = 0; i < 10; ++i) same.insert(same.end(), {0, 0, 1, 1});
  EXPECT_THAT(Nms({{F32({1, 10, 4}, same)},
                   {F32({1, 1, 10}, std::vector<float>(10, 0.9f))},
                   max3,
                   iou,
                   score0}),
              ElementsAre(0, 0, 0));
  // two_batches
  std::vector<float> two = Values(ExampleBoxes());
  two.insert(two.end(), two.begin(), two.end());
  std::vector<float> s2 = Values(ExampleScores());
  s2.insert(s2.end(), s2.begin(), s2.end());
  EXPECT_THAT(Nms({{F32({2, 6, 4}, two)}, {F32({2, 1, 6}, s2)}, Const(I64({1}, {2})), iou, score0}),
              ElementsAre(0, 0, 3, 0, 0, 0, 1, 0, 3, 1, 0, 0));
  // two_classes
  EXPECT_THAT(Nms({{ExampleBoxes()}, {F32({1, 2, 6}, s2)}, Const(I64({1}, {2})), iou, score0}),
              ElementsAre(0, 0, 3, 0, 0, 0, 0, 1, 3, 0, 1, 0));
  // Without max_output_boxes_per_class nothing is selected.
  EXPECT_THAT(Nms({{ExampleBoxes()}, {ExampleScores()}}), ElementsAre());
  // Everything known at plan time: computed then.
  EXPECT_THAT(Nms({Const(ExampleBoxes()), Const(ExampleScores()), max3, iou, score0}),
              ElementsAre(0, 0, 3, 0, 0, 0, 0, 0, 5));
}

TEST(NonMaxSuppressionTest, RejectsMismatchedShapes) {
  auto out = RunOp("NonMaxSuppression",
                   {{ExampleBoxes()}, {F32({1, 1, 5}, {1, 2, 3, 4, 5})}, Const(I64({1}, {3}))});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("scores must be"));
}

// NMS -> Gather(box index) -> Gather(boxes) -> Mul, plus a static branch and a Shape of a
// dynamic value: the selected boxes' count changes from run to run in one plan.
TEST(DynamicShapePlanTest, ValuesAfterADataDependentShapeArePreparedPerRun) {
  GraphBuilder b;
  const int boxes = b.Input("boxes", {1, 6, 4});
  const int scores = b.Input("scores", {1, 1, 6});
  const int sel = b.Op("NonMaxSuppression", "sel",
                       {boxes, scores, b.Constant("max", I64({1}, {3})),
                        b.Constant("iou", F32({1}, {0.5f})), b.Constant("smin", F32({1}, {0.f}))});
  const int idx =
      b.Op("Gather", "idx", {sel, b.Constant("two", I64({}, {2}))}, {{"axis", AInt(1)}});
  const int flat = b.Op("Reshape", "flat", {boxes, b.Constant("shape", I64({2}, {6, 4}))});
  const int relu = b.Op("Relu", "relu", {flat});  // static: stays in the arena
  const int picked = b.Op("Gather", "picked", {relu, idx}, {{"axis", AInt(0)}});
  const int scaled = b.Op("Mul", "scaled", {picked, b.Constant("k", F32({}, {2.f}))});
  const int count = b.Op("Shape", "count", {scaled});
  const int side = b.Op("Neg", "side", {relu});
  auto model = Model::FromGraph(b.Finish({scaled, count, side, picked}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  const std::vector<float> bx = Values(ExampleBoxes());
  for (float cut : {0.f, 1.f, 0.f}) {
    SCOPED_TRACE(cut);
    // Boxes 3, 0 and 5 survive; a negative score for box 5 drops it below the score
    // threshold (0), leaving two.
    std::vector<float> sc = Values(ExampleScores());
    if (cut > 0) sc[5] = -1.f;
    std::vector<NamedTensor> outs;
    Status s =
        (*session)->Run({{"boxes", F32({1, 6, 4}, bx)}, {"scores", F32({1, 1, 6}, sc)}}, &outs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(outs.size(), 4u);
    const std::vector<int64_t> want_idx =
        cut > 0 ? std::vector<int64_t>{3, 0} : std::vector<int64_t>{3, 0, 5};
    const int64_t m = static_cast<int64_t>(want_idx.size());
    std::vector<float> want;
    for (int64_t i : want_idx)
      for (int j = 0; j < 4; ++j) want.push_back(2.f * std::max(0.f, bx[i * 4 + j]));
    EXPECT_EQ(outs[0].tensor.shape(), (Shape{m, 4}));
    EXPECT_THAT(Values(outs[0].tensor), ElementsAreArray(want));
    EXPECT_THAT(IntValues(outs[1].tensor), ElementsAre(m, 4));
    std::vector<float> neg;
    for (float v : bx) neg.push_back(-std::max(0.f, v));
    EXPECT_THAT(Values(outs[2].tensor), ElementsAreArray(neg));
    EXPECT_EQ(outs[3].tensor.shape(), (Shape{m, 4}));
  }
}

// A dynamic Reshape of an arena value, whose bytes the planner gives to a later step:
// the reshaped output must keep the values it had.
TEST(DynamicShapePlanTest, AViewOfAnArenaValueOutlivesItsBytes) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3});
  const int twice = b.Op("Add", "twice", {x, x});  // arena; last read by `flat`
  const int nz = b.Op("NonZero", "nz", {x});
  const int len =
      b.Op("Gather", "len", {b.Op("Shape", "nz_shape", {nz}), b.Constant("one", I64({1}, {1}))});
  const int flat = b.Op("Reshape", "flat", {twice, len});  // dynamic: shape from NonZero
  const int neg = b.Op("Neg", "neg", {b.Op("Exp", "e", {x})});
  auto model = Model::FromGraph(b.Finish({flat, neg}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<NamedTensor> outs;
  Status s = (*session)->Run({{"x", F32({2, 3}, {1, 2, 3, 4, 5, 6})}}, &outs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_THAT(Values(outs[0].tensor), ElementsAre(2, 4, 6, 8, 10, 12));
  EXPECT_FLOAT_EQ(Values(outs[1].tensor)[0], -std::exp(1.f));
}

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

// Runs `eq` on the Einsum kernel (the optimiser off) and as loaded (where the optimiser
// rewrites products, einsum_rewrite.h), expects both to give `want`'s shape and the same
// values within 1e-5 of their scale, and returns the kernel's values.
std::vector<float> Einsum(const std::string& eq, const std::vector<In>& in, Shape want) {
  LoadOptions kernel_only;
  kernel_only.optimize.enabled = false;
  auto kernel = RunOp("Einsum", in, {{"equation", AString(eq)}}, 1, 17, kernel_only);
  auto loaded = RunOp("Einsum", in, {{"equation", AString(eq)}}, 1, 17, LoadOptions());
  EXPECT_TRUE(kernel.ok()) << eq << ": " << kernel.status().ToString();
  EXPECT_TRUE(loaded.ok()) << eq << ": " << loaded.status().ToString();
  if (!kernel.ok() || !loaded.ok()) return {};
  const Tensor& k = (*kernel)[0];
  EXPECT_EQ(k.shape(), want) << eq;
  EXPECT_EQ((*loaded)[0].shape(), want) << eq;
  if (k.dtype() == DataType::kFp32) {
    float scale = 1;
    for (float v : Values(k)) scale = std::max(scale, std::fabs(v));
    EXPECT_LE(MaxAbsDiff(k, (*loaded)[0]), 1e-5f * scale) << eq;
  }
  return Values(k);
}

// Einsum (ops/einsum.cc) against results worked out by hand.
TEST(EinsumTest, ProductsTransposesReductionsTracesAndEllipses) {
  const Tensor a = F32({2, 3}, Iota(6));  // [[0 1 2] [3 4 5]]
  const Tensor b = F32({3, 2}, Iota(6));  // [[0 1] [2 3] [4 5]]
  EXPECT_THAT(Einsum("ij,jk->ik", {{a}, {b}}, {2, 2}), ElementsAre(10, 13, 28, 40));
  EXPECT_THAT(Einsum("ij,jk", {{a}, {b}}, {2, 2}), ElementsAre(10, 13, 28, 40));
  EXPECT_THAT(Einsum("ij->ji", {{a}}, {3, 2}), ElementsAre(0, 3, 1, 4, 2, 5));
  EXPECT_THAT(Einsum("ba", {{a}}, {3, 2}), ElementsAre(0, 3, 1, 4, 2, 5));
  EXPECT_THAT(Einsum("ij->i", {{a}}, {2}), ElementsAre(3, 12));
  EXPECT_THAT(Einsum("ij->j", {{a}}, {3}), ElementsAre(3, 5, 7));
  EXPECT_THAT(Einsum("ij->", {{a}}, {}), ElementsAre(15));
  const Tensor sq = F32({2, 2}, {1, 2, 3, 4});
  EXPECT_THAT(Einsum("ii->", {{sq}}, {}), ElementsAre(5));
  EXPECT_THAT(Einsum("ii->i", {{sq}}, {2}), ElementsAre(1, 4));
  EXPECT_THAT(Einsum("i,j->ij", {{F32({2}, {1, 2})}, {F32({3}, {3, 4, 5})}}, {2, 3}),
              ElementsAre(3, 4, 5, 6, 8, 10));
  EXPECT_THAT(Einsum("i,i->", {{F32({3}, {1, 2, 3})}, {F32({3}, {4, 5, 6})}}, {}), ElementsAre(32));
  // Batched product, with the batch as a letter and as an ellipsis.
  const Tensor a3 = F32({2, 2, 3}, Iota(12));
  const std::vector<float> want = {10, 13, 28, 40, 46, 67, 64, 94};
  const Tensor b3 = F32({2, 3, 2}, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  EXPECT_THAT(Einsum("bij,bjk->bik", {{a3}, {b3}}, {2, 2, 2}), ElementsAreArray(want));
  EXPECT_THAT(Einsum("...ij,jk->...ik", {{a3}, {b}}, {2, 2, 2}), ElementsAreArray(want));
  EXPECT_THAT(Einsum("...ij,...jk", {{a3}, {F32({1, 3, 2}, Iota(6))}}, {2, 2, 2}),
              ElementsAreArray(want));
  // Attention-style: batch and head kept, transposed operand.
  EXPECT_THAT(Einsum("bhid,bhjd->bhij",
                     {{F32({1, 1, 2, 3}, Iota(6))}, {F32({1, 1, 2, 3}, Iota(6))}}, {1, 1, 2, 2}),
              ElementsAre(5, 14, 14, 50));
  const Tensor i64 = I64({2, 2}, {1, 2, 3, 4});
  auto out = Run1("Einsum", {{i64}, {i64}}, {{"equation", AString("ij,jk->ik")}});
  EXPECT_THAT(IntValues(out[0]), ElementsAre(7, 10, 15, 22));
}

TEST(EinsumTest, RejectsMismatchedExtentsAndTerms) {
  auto out = RunOp("Einsum", {{F32({2, 3}, Iota(6))}, {F32({2, 2}, Iota(4))}},
                   {{"equation", AString("ij,jk->ik")}});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("label extents disagree"));
  out = RunOp("Einsum", {{F32({2, 3}, Iota(6))}}, {{"equation", AString("ijk->i")}});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("does not match input rank"));
}

// RoiAlign and GridSample (ops/sampling.cc). On X = 4y + x (or 2y + x), a linear
// function, bilinear sampling is exact and an average over a bin's symmetric samples is
// the value at the bin's centre: the expected values are worked out from that.
TEST(RoiAlignTest, AverageAndMaxInBothCoordinateModes) {
  std::vector<float> img = Iota(16);  // 4y + x on 4x4
  std::vector<float> two = img;
  for (float v : img) two.push_back(v + 100);  // a second image
  const Tensor x = F32({2, 1, 4, 4}, two);
  auto roi = [&](std::vector<float> box, int64_t batch, std::map<std::string, Attribute> attrs) {
    auto out = Run1("RoiAlign", {{x}, {F32({1, 4}, box)}, {I64({1}, {batch})}}, attrs);
    return out[0].empty() ? std::vector<float>{} : Values(out[0]);
  };
  const auto o2 = [](std::string coord) {
    return std::map<std::string, Attribute>{{"output_height", AInt(2)},
                                            {"output_width", AInt(2)},
                                            {"coordinate_transformation_mode", AString(coord)}};
  };
  // half_pixel: the box [0.5, 2.5] starts at 0; bins of 1, one sample at each centre.
  EXPECT_THAT(roi({0.5f, 0.5f, 2.5f, 2.5f}, 0, o2("half_pixel")),
              ElementsAre(2.5f, 3.5f, 6.5f, 7.5f));
  // output_half_pixel: the same box starts at 0.5: centres 1 and 2.
  EXPECT_THAT(roi({0.5f, 0.5f, 2.5f, 2.5f}, 0, o2("output_half_pixel")), ElementsAre(5, 6, 9, 10));
  // spatial_scale halves the box; the second image adds 100.
  auto scaled = o2("output_half_pixel");
  scaled["spatial_scale"] = AFloat(0.5f);
  EXPECT_THAT(roi({1, 1, 5, 5}, 1, scaled), ElementsAre(105, 106, 109, 110));
  // Two by two samples at 1 and 3 of the whole image: values 5, 7, 13, 15.
  std::map<std::string, Attribute> whole = {
      {"sampling_ratio", AInt(2)},
      {"coordinate_transformation_mode", AString("output_half_pixel")}};
  EXPECT_THAT(roi({0, 0, 4, 4}, 0, whole), ElementsAre(10));
  whole["mode"] = AString("max");
  EXPECT_THAT(roi({0, 0, 4, 4}, 0, whole), ElementsAre(15));
  // Max takes the largest weighted corner: at (0.5, 0.5) of [[0 1] [4 5]] each corner
  // weighs 1/4, so 5/4; the average is 2.5.
  std::map<std::string, Attribute> mid = {
      {"sampling_ratio", AInt(1)},
      {"coordinate_transformation_mode", AString("output_half_pixel")}};
  EXPECT_THAT(roi({0, 0, 1, 1}, 0, mid), ElementsAre(2.5f));
  mid["mode"] = AString("max");
  EXPECT_THAT(roi({0, 0, 1, 1}, 0, mid), ElementsAre(1.25f));
  auto bad = RunOp("RoiAlign", {{x}, {F32({1, 4}, {0, 0, 1, 1})}, {I64({1}, {2})}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("batch index 2 is out of range"));
  // An image of no rows, or no columns, has nothing to sample: every bin is 0 (a sample
  // near the edge once read before the plane).
  for (const Shape& empty : {Shape{1, 1, 0, 4}, Shape{1, 1, 4, 0}}) {
    const Tensor none = F32(empty, {});
    for (const char* mode : {"avg", "max"}) {
      auto out =
          Run1("RoiAlign", {{none}, {F32({1, 4}, {-0.5f, -0.5f, 0.5f, 0.5f})}, {I64({1}, {0})}},
               {{"output_height", AInt(2)}, {"output_width", AInt(2)}, {"mode", AString(mode)}});
      ASSERT_FALSE(out[0].empty()) << ShapeToString(empty);
      EXPECT_THAT(Values(out[0]), ElementsAre(0, 0, 0, 0)) << ShapeToString(empty) << " " << mode;
    }
  }
}

TEST(GridSampleTest, BilinearAndNearestWithEachPaddingMode) {
  const Tensor x = F32({1, 1, 2, 2}, {0, 1, 2, 3});  // 2y + x
  auto sample = [&](std::vector<float> grid, std::string mode, std::string pad, int64_t align) {
    const int64_t n = static_cast<int64_t>(grid.size() / 2);
    auto out = Run1(
        "GridSample", {{x}, {F32({1, 1, n, 2}, grid)}},
        {{"mode", AString(mode)}, {"padding_mode", AString(pad)}, {"align_corners", AInt(align)}});
    return out[0].empty() ? std::vector<float>{} : Values(out[0]);
  };
  // align_corners: -1 and 1 are the corner pixels' centres.
  EXPECT_THAT(sample({-1, -1, 1, 1, 0, 0, 0.5f, -1}, "bilinear", "zeros", 1),
              ElementsAre(0, 3, 1.5f, 0.75f));
  // Without: -1 and 1 are the image's edges; (1, 1) is pixel (1.5, 1.5), a quarter of
  // which is pixel (1, 1) under zeros padding.
  EXPECT_THAT(sample({0, 0, 1, 1}, "bilinear", "zeros", 0), ElementsAre(1.5f, 0.75f));
  EXPECT_THAT(sample({0, 0, 1, 1}, "bilinear", "border", 0), ElementsAre(1.5f, 3));
  // (1.5, 0) is pixel (2, 0.5): outside under zeros, x clamped to 1 under border,
  // reflected about 1.5 to 1 under reflection.
  EXPECT_THAT(sample({1.5f, 0}, "bilinear", "zeros", 0), ElementsAre(0));
  EXPECT_THAT(sample({1.5f, 0}, "bilinear", "border", 0), ElementsAre(2));
  EXPECT_THAT(sample({1.5f, 0}, "bilinear", "reflection", 0), ElementsAre(2));
  // align_corners reflection about 0 and 1: x = -0.25 -> 0.25 (g = -1.5), y = 1.5 -> 0.5.
  EXPECT_THAT(sample({-1.5f, 2}, "bilinear", "reflection", 1), ElementsAre(1.25f));
  // Nearest: (0.1, -0.6) is pixel (0.6, -0.1): x rounds to 1, y to 0.
  EXPECT_THAT(sample({0.1f, -0.6f, 1.5f, 0}, "nearest", "zeros", 0), ElementsAre(1, 0));
  // Border clamps x = 2 to 1; y = 0.5 rounds half to even, to 0.
  EXPECT_THAT(sample({1.5f, 0}, "nearest", "border", 0), ElementsAre(1));
  EXPECT_THAT(sample({1.5f, 0.5f}, "nearest", "border", 0), ElementsAre(3));
}

// Bicubic (Keys, a = -0.75) on X = 4y + x (4x4), align_corners: at whole pixels the
// weights are (0, 1, 0, 0); halfway they are symmetric, (-3/32, 19/32, 19/32, -3/32), so
// the middle of the image reads 7.5, and at x = 0.5 on row 1 the tap at x = -1 reads 0
// (zeros: 19/32 * (4 + 5) - 3/32 * 6 = 4.78125), pixel 0 (border: 4.40625) or pixel 1
// (reflection: 4.3125).
TEST(GridSampleTest, BicubicWithEachPaddingMode) {
  const Tensor x = F32({1, 1, 4, 4}, Iota(16));
  auto sample = [&](std::vector<float> grid, std::string pad) {
    const int64_t n = static_cast<int64_t>(grid.size() / 2);
    auto out = Run1(
        "GridSample", {{x}, {F32({1, 1, n, 2}, grid)}},
        {{"mode", AString("bicubic")}, {"padding_mode", AString(pad)}, {"align_corners", AInt(1)}});
    return out[0].empty() ? std::vector<float>{} : Values(out[0]);
  };
  const float third = 1.f / 3;
  EXPECT_THAT(sample({0, 0, -1, -1, third, -third}, "zeros"),
              Pointwise(FloatNear(1e-5), std::vector<float>{7.5f, 0, 6}));
  EXPECT_THAT(sample({-2 * third, -third}, "zeros"),
              Pointwise(FloatNear(1e-5), std::vector<float>{4.78125f}));
  EXPECT_THAT(sample({-2 * third, -third}, "border"),
              Pointwise(FloatNear(1e-5), std::vector<float>{4.40625f}));
  EXPECT_THAT(sample({-2 * third, -third}, "reflection"),
              Pointwise(FloatNear(1e-5), std::vector<float>{4.3125f}));
  // x = -1 exactly: the pixel left of the image: 0 (zeros), pixel 0 (border), pixel 1
  // (reflection) of row 1.
  EXPECT_THAT(sample({-1 - 2 * third, -third}, "zeros"),
              Pointwise(FloatNear(1e-5), std::vector<float>{0.f}));
  EXPECT_THAT(sample({-1 - 2 * third, -third}, "border"),
              Pointwise(FloatNear(1e-5), std::vector<float>{4.f}));
  EXPECT_THAT(sample({-1 - 2 * third, -third}, "reflection"),
              Pointwise(FloatNear(1e-5), std::vector<float>{5.f}));
}

}  // namespace
}  // namespace shoal::engine
