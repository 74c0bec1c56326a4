// FP16 models: the lowering pass (fp16_lowering.h) on hand-built graphs, the Cast kernel's
// FP16 paths, and the committed PyTorch-derived FP16 models (models/generate_fp16.py)
// against their references.
#include "engine/fp16_lowering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype_visit.h"
#include "core/fp16.h"
#include "engine/pipeline_session.h"
#include "engine/pipeline_split.h"
#include "engine/plan.h"
#include "engine/test_util.h"
#include "engine/weight_cache.h"

namespace shoal::engine {
namespace {

using ::testing::HasSubstr;
using namespace shoal::engine::testing;

Tensor ToHalf(const Tensor& t) {
  Tensor out = Tensor::Allocate(DataType::kFp16, t.shape());
  auto src = t.values<float>();
  FloatToFp16(src.data(), out.mutable_values<uint16_t>().data(), src.size());
  return out;
}

Tensor ToFloat(const Tensor& t) {
  if (t.dtype() == DataType::kFp32) return t;
  Tensor out = Tensor::Allocate(DataType::kFp32, t.shape());
  auto src = t.values<uint16_t>();
  Fp16ToFloat(src.data(), out.mutable_values<float>().data(), src.size());
  return out;
}

// A small convolution block: Conv + Relu + Add of a scaled input, every tensor of `dtype`.
Graph ConvBlock(DataType dtype, const Tensor& w, const Tensor& bias, const Tensor& scale) {
  GraphBuilder b;
  auto as = [&](const Tensor& t) { return dtype == DataType::kFp16 ? ToHalf(t) : t; };
  const int x = b.Input("x", {2, 3, 6, 6}, dtype);
  const int conv = b.Op("Conv", "conv", {x, b.Constant("w", as(w)), b.Constant("b", as(bias))},
                        {{"pads", AInts({1, 1, 1, 1})}});
  const int relu = b.Op("Relu", "relu", {conv});
  const int scaled = b.Op("Mul", "scaled", {x, b.Constant("s", as(scale))});
  const int y = b.Op("Add", "y", {relu, scaled});
  Graph g = b.Finish(y);
  g.values[y].dtype = dtype;  // as an ONNX file declares its outputs
  return g;
}

TEST(Fp16LoweringTest, Fp16ModelKeepsFp16InputsAndOutputsAndComputesInFp32) {
  const Tensor w = Random({3, 3, 3, 3}, 1), bias = Random({3}, 2), scale = Random({1}, 3);
  const Tensor x = Random({2, 3, 6, 6}, 4, -2.f, 2.f);
  auto half = Model::FromGraph(ConvBlock(DataType::kFp16, w, bias, scale));
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  ASSERT_EQ((*half)->inputs().size(), 1u);
  EXPECT_EQ((*half)->inputs()[0].name, "x");
  EXPECT_EQ((*half)->inputs()[0].dtype, DataType::kFp16);
  ASSERT_EQ((*half)->outputs().size(), 1u);
  EXPECT_EQ((*half)->outputs()[0].name, "y");
  EXPECT_EQ((*half)->outputs()[0].dtype, DataType::kFp16);
  EXPECT_EQ(SymbolicShapeToString((*half)->outputs()[0].shape), "[2,3,6,6]");

  // The same block in FP32 on the FP16-rounded weights and input gives the same FP32
  // values, so the FP16 output is exactly their rounding.
  auto rounded = [](const Tensor& t) { return ToFloat(ToHalf(t)); };
  auto full =
      Model::FromGraph(ConvBlock(DataType::kFp32, rounded(w), rounded(bias), rounded(scale)));
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  auto hs = Session::Create(**half, Opts(1));
  auto fs = Session::Create(**full, Opts(1));
  ASSERT_TRUE(hs.ok() && fs.ok());
  std::vector<NamedTensor> ho, fo;
  Status s = (*hs)->Run({{"x", ToHalf(x)}}, &ho);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*fs)->Run({{"x", rounded(x)}}, &fo).ok());
  ASSERT_EQ(ho[0].name, "y");
  ASSERT_EQ(ho[0].tensor.dtype(), DataType::kFp16);
  ASSERT_EQ(ho[0].tensor.shape(), (Shape{2, 3, 6, 6}));
  const Tensor want = ToHalf(fo[0].tensor);
  auto got_bits = ho[0].tensor.values<uint16_t>();
  auto want_bits = want.values<uint16_t>();
  EXPECT_TRUE(std::equal(got_bits.begin(), got_bits.end(), want_bits.begin()));

  // FP32 data for the FP16 input is refused, naming both types.
  s = (*hs)->Run({{"x", x}}, &ho);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("FP16"));
}

TEST(Fp16LoweringTest, ReportsWhatItRewrote) {
  Graph g = ConvBlock(DataType::kFp16, Random({3, 3, 3, 3}, 1), Random({3}, 2), Random({1}, 3));
  const size_t nodes = g.nodes.size();
  Fp16LoweringReport report;
  ASSERT_TRUE(LowerFp16(&g, &report).ok());
  EXPECT_EQ(report.converted_constants, 3);
  EXPECT_EQ(report.cast_inputs, 1);
  EXPECT_EQ(report.cast_outputs, 1);
  EXPECT_EQ(report.rounding_casts, 0);
  EXPECT_EQ(g.nodes.size(), nodes + 2);
  EXPECT_EQ(g.nodes.front().op_type, "Cast");
  EXPECT_EQ(g.nodes.back().op_type, "Cast");
  EXPECT_EQ(g.values[g.outputs[0]].name, "y");
  for (const Value& v : g.values) {
    if (v.is_constant()) {
      EXPECT_EQ(v.constant.dtype(), DataType::kFp32) << v.name;
    }
  }

  // A graph without FLOAT16 is left alone.
  Graph plain = ConvBlock(DataType::kFp32, Random({3, 3, 3, 3}, 1), Random({3}, 2), Random({1}, 3));
  ASSERT_TRUE(LowerFp16(&plain, &report).ok());
  EXPECT_FALSE(report.changed());
  EXPECT_EQ(plain.nodes.size(), nodes);
}

// An FP16 constant that is itself a graph output stays an FP16 output: its value moves
// to an FP32 stand-in and the final Cast writes it.
TEST(Fp16LoweringTest, Fp16ConstantOutputStaysFp16) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3}, DataType::kFp16);
  const int y = b.Op("Relu", "y", {x});
  const int c = b.Constant("c", ToHalf(F32({3}, {0.5f, -2.f, 1000.f})));
  Graph g = b.Finish(std::vector<int>{y, c});
  g.values[y].dtype = DataType::kFp16;
  g.values[c].dtype = DataType::kFp16;
  auto model = Model::FromGraph(std::move(g));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ASSERT_EQ((*model)->outputs().size(), 2u);
  EXPECT_EQ((*model)->outputs()[1].name, "c");
  EXPECT_EQ((*model)->outputs()[1].dtype, DataType::kFp16);
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  Status s = (*session)->Run({{"x", ToHalf(Random({2, 3}, 5))}}, &out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[1].name, "c");
  ASSERT_EQ(out[1].tensor.dtype(), DataType::kFp16);
  EXPECT_EQ(Values(ToFloat(out[1].tensor)), (std::vector<float>{0.5f, -2.f, 1000.f}));
}

// The lowering retypes the outer graph only, so a model with If/Loop subgraphs and FP16
// anywhere is refused with a clear error instead of loading with mismatched types.
TEST(Fp16LoweringTest, Fp16ModelWithASubgraphIsRefused) {
  GraphBuilder body_builder;
  const int bx = body_builder.Input("bx", {2}, DataType::kFp16);
  const int by = body_builder.Op("Identity", "by", {bx});
  Graph body = body_builder.Finish(by);
  body.values[by].dtype = DataType::kFp16;

  GraphBuilder b;
  const int x = b.Input("x", {2}, DataType::kFp16);
  const int cond = b.Input("cond", {}, DataType::kBool);
  Attribute branch;
  branch.kind = Attribute::Kind::kGraph;
  branch.g = std::make_shared<const Graph>(body);
  const int y = b.Op("If", "choose", {cond}, {{"then_branch", branch}, {"else_branch", branch}});
  Graph g = b.Finish(y);
  (void)x;
  Fp16LoweringReport report;
  Status s = LowerFp16(&g, &report);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("'choose' (If)"));
  EXPECT_THAT(s.message(), HasSubstr("control-flow subgraphs"));
}

TEST(Fp16LoweringTest, LoweringALoweredGraphChangesNothing) {
  Graph g = ConvBlock(DataType::kFp16, Random({3, 3, 3, 3}, 1), Random({3}, 2), Random({1}, 3));
  // A rounding Cast inside too.
  const int y = g.outputs[0];
  const int r = g.AddValue("r");
  const int z = g.AddValue("z", DataType::kFp16);
  Node to16;
  to16.op_type = "Cast";
  to16.inputs = {y};
  to16.outputs = {r};
  to16.attributes.emplace("to", AInt(10));
  Node add;
  add.op_type = "Add";
  add.inputs = {r, r};
  add.outputs = {z};
  g.nodes.push_back(to16);
  g.nodes.push_back(add);
  g.outputs = {y, z};
  Fp16LoweringReport first, second;
  ASSERT_TRUE(LowerFp16(&g, &first).ok());
  EXPECT_EQ(first.rounding_casts, 1);
  EXPECT_EQ(first.cast_outputs, 2);
  const size_t nodes = g.nodes.size(), values = g.values.size();
  ASSERT_TRUE(LowerFp16(&g, &second).ok());
  EXPECT_FALSE(second.changed());
  EXPECT_EQ(g.nodes.size(), nodes);
  EXPECT_EQ(g.values.size(), values);
}

TEST(Fp16LoweringTest, AnOutputWrittenByACastToFp16KeepsThatOneCast) {
  // Mixed precision with FP16 out: FP32 in, Cast to FLOAT16 at the end.
  GraphBuilder b;
  const int x = b.Input("x", {3});
  const int m = b.Op("Mul", "m", {x, b.Constant("k", F32({1}, {3.f}))});
  const int y = b.Op("Cast", "y", {m}, {{"to", AInt(10)}});
  Graph g = b.Finish(y);
  g.values[y].dtype = DataType::kFp16;
  Fp16LoweringReport report;
  ASSERT_TRUE(LowerFp16(&g, &report).ok());
  EXPECT_FALSE(report.changed());
  EXPECT_EQ(g.nodes.size(), 2u);
  auto model = Model::FromGraph(std::move(g));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*session)->Run({{"x", F32({3}, {1.f / 9, 30000.f, -2.f})}}, &out).ok());
  ASSERT_EQ(out[0].tensor.dtype(), DataType::kFp16);
  const std::vector<float> got = Values(ToFloat(out[0].tensor));
  EXPECT_EQ(got[0], Fp16ToFloat(FloatToFp16(3.f / 9)));
  EXPECT_TRUE(std::isinf(got[1]));
  EXPECT_EQ(got[2], -6.f);
}

TEST(Fp16LoweringTest, ACastOutputThatOtherNodesReadIsLoweredLikeAnyOutput) {
  // y = Cast(3x to FLOAT16) is an output and feeds z = y + y, another FP16 output.
  GraphBuilder b;
  const int x = b.Input("x", {2});
  const int m = b.Op("Mul", "m", {x, b.Constant("k", F32({1}, {3.f}))});
  const int y = b.Op("Cast", "y", {m}, {{"to", AInt(10)}});
  const int z = b.Op("Add", "z", {y, y});
  Graph g = b.Finish({y, z});
  g.values[y].dtype = DataType::kFp16;
  g.values[z].dtype = DataType::kFp16;
  auto model = Model::FromGraph(std::move(g));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*session)->Run({{"x", F32({2}, {1.f / 9, 20000.f})}}, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  const float y0 = Fp16ToFloat(FloatToFp16(3.f / 9));
  EXPECT_EQ(out[0].tensor.dtype(), DataType::kFp16);
  EXPECT_EQ(out[1].tensor.dtype(), DataType::kFp16);
  EXPECT_EQ(Values(ToFloat(out[0].tensor)), (std::vector<float>{y0, 60000.f}));
  const std::vector<float> zs = Values(ToFloat(out[1].tensor));
  EXPECT_EQ(zs[0], Fp16ToFloat(FloatToFp16(2 * y0)));
  EXPECT_TRUE(std::isinf(zs[1]));  // 120000 is beyond FP16
}

TEST(Fp16LoweringTest, CastToFp16RoundsToFp16PrecisionAndRange) {
  // Mixed precision, as exporters write it: FP32 in, Cast to FLOAT16, FP16 weights,
  // Cast back to FLOAT, FP32 out.
  GraphBuilder b;
  const int x = b.Input("x", {4});
  const int h = b.Op("Cast", "h", {x}, {{"to", AInt(10)}});
  const int two = b.Constant("two", ToHalf(F32({1}, {2.f})));
  const int m = b.Op("Mul", "m", {h, two});
  const int y = b.Op("Cast", "y", {m}, {{"to", AInt(1)}});
  Graph g = b.Finish(y);
  g.values[y].dtype = DataType::kFp32;
  auto model = Model::FromGraph(std::move(g));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->inputs()[0].dtype, DataType::kFp32);
  EXPECT_EQ((*model)->outputs()[0].dtype, DataType::kFp32);
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  const float third = 1.f / 3.f;
  ASSERT_TRUE((*session)->Run({{"x", F32({4}, {third, 70000.f, -1e-8f, 1.f})}}, &out).ok());
  const std::vector<float> got = Values(out[0].tensor);
  EXPECT_EQ(got[0], 2.f * Fp16ToFloat(FloatToFp16(third)));  // 0.33325195 * 2
  EXPECT_NE(got[0], 2.f * third);
  EXPECT_TRUE(std::isinf(got[1]));  // beyond FP16's 65504
  EXPECT_EQ(got[2], 0.f);           // below FP16's smallest subnormal
  EXPECT_EQ(got[3], 2.f);
}

TEST(Fp16LoweringTest, Fp16ConstantOfShapeAndIntegerCasts) {
  // ConstantOfShape with an FP16 value, added to Cast(int64 -> FLOAT16) of a shape; the
  // FP16 output declared as such.
  GraphBuilder b;
  const int x = b.Input("x", {3, 2}, DataType::kFp16);
  const int shape = b.Op("Shape", "shape", {x});
  const int fill =
      b.Op("ConstantOfShape", "fill", {shape}, {{"value", ATensor(ToHalf(F32({1}, {0.5f})))}});
  const int dims = b.Op("Cast", "dims", {shape}, {{"to", AInt(10)}});  // [3, 2]
  const int sum = b.Op("Add", "sum", {fill, dims});                    // broadcast over rows
  const int y = b.Op("Add", "y", {sum, x});
  Graph g = b.Finish(y);
  g.values[y].dtype = DataType::kFp16;
  auto model = Model::FromGraph(std::move(g));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  Status s = (*session)->Run({{"x", ToHalf(F32({3, 2}, {1, 2, 3, 4, 5, 6}))}}, &out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(out[0].tensor.dtype(), DataType::kFp16);
  EXPECT_EQ(Values(ToFloat(out[0].tensor)),
            (std::vector<float>{4.5f, 4.5f, 6.5f, 6.5f, 8.5f, 8.5f}));
}

TEST(Fp16LoweringTest, CastKernelConvertsBetweenFp16AndOtherTypes) {
  // Each output declared FLOAT16, so the model ends in the Cast kernel's X -> FP16 path.
  for (DataType from : {DataType::kInt64, DataType::kInt32, DataType::kFp64, DataType::kBool}) {
    SCOPED_TRACE(DataTypeName(from));
    GraphBuilder b;
    const int x = b.Input("x", {4}, from);
    const int y = b.Op("Cast", "y", {x}, {{"to", AInt(10)}});
    Graph g = b.Finish(y);
    g.values[y].dtype = DataType::kFp16;
    auto model = Model::FromGraph(std::move(g));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto session = Session::Create(**model, Opts(1));
    ASSERT_TRUE(session.ok());
    Tensor in = Tensor::Allocate(from, {4});
    const double values[] = {0, 1, 3, 2049};  // 2049 is not an FP16 value: rounds to 2048
    for (int i = 0; i < 4; ++i) StoreElementFromDouble(from, in.mutable_data(), i, values[i]);
    std::vector<NamedTensor> out;
    ASSERT_TRUE((*session)->Run({{"x", in}}, &out).ok());
    ASSERT_EQ(out[0].tensor.dtype(), DataType::kFp16);
    const std::vector<float> want = from == DataType::kBool ? std::vector<float>{0, 1, 1, 1}
                                                            : std::vector<float>{0, 1, 3, 2048};
    EXPECT_EQ(Values(ToFloat(out[0].tensor)), want);
  }
  // A graph whose output a Cast to FLOAT16 writes gives FP16, declared or not.
  auto h = RunOp("Cast", {{F32({2}, {0.1f, -70000.f})}}, {{"to", AInt(10)}});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ((*h)[0].dtype(), DataType::kFp16);
  EXPECT_THAT((*h)[0].values<uint16_t>(), ::testing::ElementsAre(0x2E66, 0xFC00));
  // FP16 -> FP32 directly (the input's own Cast).
  auto y = RunOp("Cast", {{ToHalf(F32({3}, {-1.5f, 0.1f, 65504.f}))}}, {{"to", AInt(1)}});
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(Values((*y)[0]), (std::vector<float>{-1.5f, Fp16ToFloat(0x2E66), 65504.f}));
}

// A plan prepared from a graph that was never lowered (Plan::Prepare directly) runs the
// Cast kernel from FP16 to other types: truncation toward zero, saturation, booleans.
TEST(Fp16LoweringTest, CastKernelReadsFp16IntoOtherTypes) {
  GraphBuilder b;
  const int x = b.Input("x", {4}, DataType::kFp16);
  const int i = b.Op("Cast", "i", {x}, {{"to", AInt(6)}});   // INT32
  const int t = b.Op("Cast", "t", {x}, {{"to", AInt(9)}});   // BOOL
  const int d = b.Op("Cast", "d", {x}, {{"to", AInt(11)}});  // DOUBLE
  const Graph g = b.Finish({i, t, d});
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  WeightCache weights;
  auto plan = Plan::Prepare(g, {{4}}, engine, stream, &weights, PlanOptions(), PlanLimits());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // 1.5, -2.75, -0, +infinity
  const Tensor in =
      Tensor::FromVector<uint16_t>(DataType::kFp16, {4}, {0x3E00, 0xC180, 0x8000, 0x7C00});
  std::vector<Tensor> out;
  ASSERT_TRUE((*plan)->Run({&in}, stream, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_THAT(out[0].values<int32_t>(),
              ::testing::ElementsAre(1, -2, 0, std::numeric_limits<int32_t>::max()));
  EXPECT_THAT(out[1].values<uint8_t>(), ::testing::ElementsAre(1, 1, 0, 1));
  EXPECT_THAT(out[2].values<double>(),
              ::testing::ElementsAre(1.5, -2.75, 0.0, std::numeric_limits<double>::infinity()));
}

// The committed models (models/generate_fp16.py) against PyTorch at batch 1 and 4, at
// max |error| <= 2e-3 x max |reference| (the generator's docstring says why).
struct Fp16Family {
  std::string stem;
  DataType io;  // the dtype the model's input and output declare
};

class Fp16ModelTest : public ::testing::TestWithParam<Fp16Family> {};

TEST_P(Fp16ModelTest, MatchesPyTorchAtBatch1And4) {
  const Fp16Family& f = GetParam();
  auto model = Model::Load(ModelPath(f.stem + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->batch_dim_symbolic());
  ASSERT_EQ((*model)->inputs().size(), 1u);
  EXPECT_EQ((*model)->inputs()[0].dtype, f.io);
  ASSERT_EQ((*model)->outputs().size(), 1u);
  EXPECT_EQ((*model)->outputs()[0].dtype, f.io);
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (const char* batch : {".b1.sht", ".b4.sht"}) {
    SCOPED_TRACE(f.stem + batch);
    const Reference ref = LoadReference(f.stem + batch);
    ASSERT_EQ(ref.inputs.size(), 1u);
    ASSERT_EQ(ref.inputs[0].tensor.dtype(), f.io);
    std::vector<NamedTensor> outputs;
    Status s = (*session)->Run(ref.inputs, &outputs);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(outputs.size(), 1u);
    const Tensor& got = outputs[0].tensor;
    const Tensor& want = ref.outputs[0].tensor;
    EXPECT_EQ(got.dtype(), f.io);
    ASSERT_EQ(got.shape(), want.shape());
    const float scale = std::max(MaxAbs(want), 1e-6f);
    const float err = MaxAbsDiff(ToFloat(got), want);
    EXPECT_LE(err, 2e-3f * scale) << "max |ref| " << scale << ", max error " << err;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Fp16ModelTest,
                         ::testing::Values(Fp16Family{"fp16_cnn", DataType::kFp16},
                                           Fp16Family{"fp16_transformer", DataType::kFp16},
                                           Fp16Family{"fp16_mixed", DataType::kFp32}),
                         [](const auto& info) { return info.param.stem; });

// Cut into stages (each a graph of its own, lowered again by Model::FromGraph), an FP16
// model gives the whole model's FP16 output, bit for bit. (The transformer's Reshapes
// read shapes computed in an earlier stage, which SplitModel refuses for any model.)
TEST(Fp16ModelTest, PipelineStagesGiveTheWholeModelsOutput) {
  const std::string stem = "fp16_cnn";
  auto model = Model::Load(ModelPath(stem + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<double> ones((*model)->graph().nodes.size(), 1.0);
  auto starts = BalanceStages(ones, 3);
  ASSERT_TRUE(starts.ok());
  auto stages = SplitModel(**model, *starts);
  ASSERT_TRUE(stages.ok()) << stages.status().ToString();
  PipelineOptions o;
  o.threads_per_stage = 1;
  o.micro_batches = 2;
  auto pipeline = PipelineSession::Create(**model, *stages, o);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().ToString();
  auto whole = Session::Create(**model, Opts(1));
  ASSERT_TRUE(whole.ok());
  const Reference ref = LoadReference(stem + ".b4.sht");
  std::vector<NamedTensor> want, got;
  ASSERT_TRUE((*whole)->Run(ref.inputs, &want).ok());
  Status s = (*pipeline)->Run(ref.inputs, &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].tensor.dtype(), DataType::kFp16);
  ASSERT_EQ(got[0].tensor.shape(), want[0].tensor.shape());
  auto g = got[0].tensor.values<uint16_t>();
  auto w = want[0].tensor.values<uint16_t>();
  EXPECT_TRUE(std::equal(g.begin(), g.end(), w.begin()));
}

TEST(Fp16ModelTest, TransformerRunsAtAnotherSequenceLengthAndBatch) {
  auto model = Model::Load(ModelPath("fp16_transformer.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(SymbolicShapeToString((*model)->outputs()[0].shape), "[batch,sequence,32]");
  // The optimiser sees through the FP16 constants: GELU with sqrt(2) rounded to FP16,
  // products with their biases.
  const auto& fusions = (*model)->optimize_report().fusions;
  EXPECT_EQ(fusions.count("Gelu(erf pattern)"), 1u) << (*model)->optimize_report().Summary();
  EXPECT_EQ(fusions.count("MatMul+Add(bias)"), 1u) << (*model)->optimize_report().Summary();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> outputs;
  Status s = (*session)->Run({{"x", ToHalf(Random({3, 11, 32}, 9))}}, &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(outputs[0].tensor.dtype(), DataType::kFp16);
  EXPECT_EQ(outputs[0].tensor.shape(), (Shape{3, 11, 32}));
}

}  // namespace
}  // namespace shoal::engine
