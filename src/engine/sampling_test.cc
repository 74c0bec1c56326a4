// GridSample on volumes (5-D) against PyTorch, and Resize whose sizes or scales are
// known only at run time (ops/sampling.cc, ops/indexing.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "engine/model.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// models/gridsample_3d.sht: PyTorch's F.grid_sample on X [2, 3, 4, 5, 6] for every
// linear/nearest mode, padding mode and align_corners (models/generate_sampling.py).
TEST(GridSampleVolumeTest, MatchesPyTorchInEveryModePaddingAndAlignment) {
  const Reference ref = LoadReference("gridsample_3d.sht");
  ASSERT_EQ(ref.inputs.size(), 2u);
  ASSERT_EQ(ref.outputs.size(), 12u);
  for (const NamedTensor& want : ref.outputs) {
    // "<mode>_<padding>_<align>"
    const size_t a = want.name.find('_'), b = want.name.rfind('_');
    const std::string mode = want.name.substr(0, a);
    const std::string pad = want.name.substr(a + 1, b - a - 1);
    const int64_t align = std::stoi(want.name.substr(b + 1));
    auto out = Run1(
        "GridSample", {{ref.inputs[0].tensor}, {ref.inputs[1].tensor}},
        {{"mode", AString(mode)}, {"padding_mode", AString(pad)}, {"align_corners", AInt(align)}});
    ASSERT_EQ(out[0].shape(), want.tensor.shape()) << want.name;
    EXPECT_LE(MaxAbsDiff(out[0], want.tensor), 1e-5f * std::max(1.f, MaxAbs(want.tensor)))
        << want.name;
  }
}

TEST(GridSampleVolumeTest, BicubicOnAVolumeAndMismatchedGridsAreRefused) {
  const Tensor x = Random({1, 1, 2, 2, 2}, 1);
  auto out =
      RunOp("GridSample", {{x}, {Random({1, 1, 1, 1, 3}, 2)}}, {{"mode", AString("bicubic")}});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("needs 4-D X"));
  out = RunOp("GridSample", {{x}, {Random({1, 1, 1, 2}, 2)}});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("grid must be [N, D_out, H_out, W_out, 3]"));
  out = RunOp("GridSample", {{Random({1, 1, 2, 2, 2, 2}, 1)}, {Random({1, 1, 1, 1, 3}, 2)}});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("X must be 4-D"));
}

// NaN and infinite grid coordinates read as outside (0 with zeros padding), as PyTorch
// treats them, in every mode on 4-D and 5-D X; border padding clamps an infinity to the
// edge. (They used to reach int64_t casts of NaN and give NaN.)
// An adaptive sampling grid (sampling_ratio 0) takes ceil(bin) samples per axis: a box whose
// bins span more than twice the input, or that is not finite, is refused naming its roi
// instead of sampled for ever; a box over the whole input, and one twice its size, are
// sampled.
TEST(RoiAlignTest, ABoxTooLargeOrNotFiniteForAnAdaptiveGridIsRefused) {
  const Tensor x = F32({1, 1, 4, 4}, std::vector<float>(16, 1.f));
  const In batch{I64({1}, {0})};
  const std::map<std::string, Attribute> attrs = {
      {"output_height", AInt(1)}, {"output_width", AInt(1)}, {"sampling_ratio", AInt(0)}};
  for (float edge : {4.f, 9.f}) {
    auto out = RunOp("RoiAlign", {{x}, {F32({1, 4}, {0, 0, edge, edge})}, batch}, attrs);
    ASSERT_TRUE(out.ok()) << edge << ": " << out.status().ToString();
  }
  for (float edge : {1e9f, std::nanf(""), INFINITY}) {
    auto out = RunOp("RoiAlign", {{x}, {F32({1, 4}, {0, 0, edge, 2})}, batch}, attrs);
    ASSERT_FALSE(out.ok()) << edge;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(out.status().message(), HasSubstr("roi 0 is not finite, or its bins span"));
  }
  // A fixed grid samples any box (it reads zeros outside the input).
  std::map<std::string, Attribute> fixed = attrs;
  fixed["sampling_ratio"] = AInt(2);
  EXPECT_TRUE(RunOp("RoiAlign", {{x}, {F32({1, 4}, {0, 0, 1e9f, 2})}, batch}, fixed).ok());
}

TEST(GridSampleTest, NonFiniteGridIsOutside) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor grid = F32({1, 1, 4, 2}, {nan, 0, 0, nan, inf, 0, -inf, nan});
  for (const char* mode : {"bilinear", "nearest", "bicubic"}) {
    SCOPED_TRACE(mode);
    auto out = Run1("GridSample", {{x}, {grid}}, {{"mode", AString(mode)}});
    EXPECT_EQ(Values(out[0]), (std::vector<float>{0, 0, 0, 0}));
  }
  auto border = Run1("GridSample", {{x}, {F32({1, 1, 2, 2}, {nan, -1, inf, -1})}},
                     {{"padding_mode", AString("border")}, {"align_corners", AInt(1)}});
  EXPECT_EQ(Values(border[0]), (std::vector<float>{0, 2}));
  const Tensor v = F32({1, 1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor vgrid = F32({1, 1, 1, 2, 3}, {nan, 0, 0, 0, 0, inf});
  for (const char* mode : {"bilinear", "nearest"}) {
    SCOPED_TRACE(mode);
    auto out = Run1("GridSample", {{v}, {vgrid}}, {{"mode", AString(mode)}});
    EXPECT_EQ(Values(out[0]), (std::vector<float>{0, 0}));
  }
}

// A PyTorch export of F.interpolate(p5, size=c4.shape[-2:]) (FPN/U-Net style), nearest
// and bilinear, at two input sizes, the second not a whole multiple of the first.
class ResizeFromShapeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResizeFromShapeTest, MatchesPyTorch) {
  auto model = Model::Load(ModelPath(GetParam() + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (const char* size : {".a.sht", ".b.sht"}) {
    const Reference ref = LoadReference(GetParam() + size);
    std::vector<NamedTensor> outs;
    Status s = (*session)->Run(ref.inputs, &outs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(outs.size(), ref.outputs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      ASSERT_EQ(outs[i].tensor.shape(), ref.outputs[i].tensor.shape()) << size;
      EXPECT_LE(MaxAbsDiff(outs[i].tensor, ref.outputs[i].tensor),
                1e-4f * std::max(1.f, MaxAbs(ref.outputs[i].tensor)))
          << GetParam() << size << " " << outs[i].name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Exports, ResizeFromShapeTest,
                         ::testing::Values("resize_from_shape_op13", "resize_from_shape_op17"));

// Resize whose sizes (or scales) are a model input: the output's shape is learned at
// run time, and whatever reads it (here Relu) is prepared for it. Compared with the same
// Resize given the same sizes as a constant.
class RunTimeResizeTest : public ::testing::Test {
 protected:
  // Input "x" [1, 2, 3, 4] and "param" (sizes INT64 [4] or scales FP32 [4]).
  void Load(bool sizes, std::map<std::string, Attribute> attrs) {
    attrs_ = attrs;
    sizes_ = sizes;
    GraphBuilder b;
    const int x = b.Input("x", {1, 2, 3, 4});
    const int p = b.Input("param", {4}, sizes ? DataType::kInt64 : DataType::kFp32);
    const int none = -1;
    const int r =
        b.Op("Resize", "r",
             sizes ? std::vector<int>{x, none, none, p} : std::vector<int>{x, none, p}, attrs);
    const int y = b.Op("Relu", "y", {r});
    auto model = Model::FromGraph(b.Finish({y, r}));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
    auto session = Session::Create(*model_, Opts(1));
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    session_ = std::move(session).value();
  }

  // Runs with `param`; checks both outputs against the constant-parameter Resize.
  void RunAndCheck(const Tensor& x, const Tensor& param) {
    std::vector<NamedTensor> outs;
    Status s = session_->Run({{"x", x}, {"param", param}}, &outs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<In> in = sizes_ ? std::vector<In>{{x}, Omitted(), Omitted(), Const(param)}
                                      : std::vector<In>{{x}, Omitted(), Const(param)};
    const auto want = Run1("Resize", in, attrs_);
    ASSERT_EQ(outs[1].tensor.shape(), want[0].shape());
    EXPECT_THAT(Values(outs[1].tensor), ElementsAreArray(Values(want[0])));
    std::vector<float> relu = Values(want[0]);
    for (float& v : relu) v = std::max(v, 0.f);
    EXPECT_THAT(Values(outs[0].tensor), ElementsAreArray(relu));
  }

  bool sizes_ = true;
  std::map<std::string, Attribute> attrs_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Session> session_;
};

TEST_F(RunTimeResizeTest, SizesGivenAtRunTime) {
  Load(true, {{"mode", AString("nearest")}});
  const Tensor x = Random({1, 2, 3, 4}, 3);
  RunAndCheck(x, I64({4}, {1, 2, 6, 8}));
  RunAndCheck(x, I64({4}, {1, 2, 5, 3}));
  const int64_t prepares = session_->dynamic_stats().prepares;
  RunAndCheck(x, I64({4}, {1, 2, 5, 3}));  // Relu's preparation is reused
  EXPECT_EQ(session_->dynamic_stats().prepares, prepares);
  EXPECT_GE(session_->dynamic_stats().cache_hits, 1);
  RunAndCheck(Random({1, 2, 3, 4}, 4), I64({4}, {1, 2, 6, 8}));
}

TEST_F(RunTimeResizeTest, ScalesGivenAtRunTimeLinearAndCubic) {
  for (const char* mode : {"linear", "cubic"}) {
    Load(false, {{"mode", AString(mode)},
                 {"coordinate_transformation_mode", AString("pytorch_half_pixel")}});
    const Tensor x = Random({1, 2, 3, 4}, 5);
    RunAndCheck(x, F32({4}, {1, 1, 2, 2}));
    RunAndCheck(x, F32({4}, {1, 1, 0.5f, 1.5f}));
  }
}

TEST_F(RunTimeResizeTest, BadRunTimeSizesAreErrorsNotCrashes) {
  Load(true, {{"mode", AString("nearest")}});
  std::vector<NamedTensor> outs;
  Status s =
      session_->Run({{"x", Random({1, 2, 3, 4}, 3)}, {"param", I64({4}, {1, 2, -1, 4})}}, &outs);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("sizes must be >= 0"));
  s = session_->Run(
      {{"x", Random({1, 2, 3, 4}, 3)}, {"param", I64({4}, {1, 2, int64_t{1} << 40, 4})}}, &outs);
  EXPECT_FALSE(s.ok());
  // And the session still serves.
  RunAndCheck(Random({1, 2, 3, 4}, 3), I64({4}, {1, 2, 2, 2}));
}

// A run-time Resize is checked against the model's PlanLimits::max_tensor_bytes, not a
// fixed 4 GiB.
TEST(RunTimeResizeLimitsTest, OutputIsCheckedAgainstTheModelsLimit) {
  GraphBuilder b;
  const int x = b.Input("x", {1, 1, 2, 2});
  const int p = b.Input("param", {4}, DataType::kInt64);
  const int r = b.Op("Resize", "r", {x, -1, -1, p}, {{"mode", AString("nearest")}});
  LoadOptions load;
  load.limits.max_tensor_bytes = 256;  // 64 floats
  auto model = Model::FromGraph(b.Finish(r), load);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  std::vector<NamedTensor> outs;
  Status s =
      (*session)->Run({{"x", Random({1, 1, 2, 2}, 1)}, {"param", I64({4}, {1, 1, 8, 8})}}, &outs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(outs[0].tensor.shape(), (Shape{1, 1, 8, 8}));
  s = (*session)->Run({{"x", Random({1, 1, 2, 2}, 1)}, {"param", I64({4}, {1, 1, 8, 9})}}, &outs);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("node 'r' (Resize): output [1,1,8,9]"));
  EXPECT_THAT(s.message(), HasSubstr("more than 64 elements"));
}

}  // namespace
}  // namespace shoal::engine
