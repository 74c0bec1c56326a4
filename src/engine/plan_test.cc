// The memory planner inside real plans: no two values live at the same time share
// bytes, in-place happens only where legal, outputs still match the references, and the
// arena stays within 1.2x of the liveness lower bound on the committed models.
#include "engine/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "engine/precision.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;

StatusOr<std::unique_ptr<Plan>> PreparePlan(const Model& model, const std::vector<Shape>& shapes) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  return Plan::Prepare(model.graph(), shapes, engine, stream, model.weight_cache(),
                       model.options().plan, model.options().limits);
}

// Checks the layout's invariants; returns the values whose bytes were taken in place,
// as (taker, source) pairs.
std::vector<std::pair<int, int>> CheckLayout(const Plan& plan, const Graph& graph) {
  std::vector<std::pair<int, int>> inplace;
  const auto& layout = plan.DebugLayout();
  std::map<int, const PlanLayoutEntry*> by_value;
  for (const PlanLayoutEntry& e : layout) by_value[e.value] = &e;
  // True when `a` took `b`'s bytes, directly or along an in-place chain.
  auto took = [&](const PlanLayoutEntry& a, const PlanLayoutEntry& b) {
    for (int v = a.inplace_of; v >= 0; v = by_value.at(v)->inplace_of)
      if (v == b.value) return true;
    return false;
  };
  std::set<int> graph_io(graph.inputs.begin(), graph.inputs.end());
  graph_io.insert(graph.outputs.begin(), graph.outputs.end());
  for (const PlanLayoutEntry& e : layout) {
    SCOPED_TRACE(graph.values[e.value].name);
    EXPECT_EQ(e.offset % 64, 0);
    EXPECT_LE(e.offset + e.bytes, plan.planned_bytes());
    EXPECT_LE(e.first_step, e.last_step);
    EXPECT_EQ(graph_io.count(e.value), 0u) << "graph inputs and outputs are not in the arena";
    EXPECT_TRUE(graph.values[e.value].constant.empty());
    if (e.inplace_of < 0) continue;
    const PlanLayoutEntry& src = *by_value.at(e.inplace_of);
    // Legal: the source dies at the step that defines the taker, which reads it, and
    // both have the same size.
    EXPECT_EQ(src.last_step, e.first_step);
    EXPECT_EQ(src.offset, e.offset);
    EXPECT_EQ(src.bytes, e.bytes);
    const Node& producer = graph.nodes[graph.values[e.value].producer];
    EXPECT_THAT(producer.inputs, ::testing::Contains(src.value));
    inplace.push_back({e.value, src.value});
  }
  EXPECT_EQ(static_cast<int>(inplace.size()), plan.inplace_count());
  for (size_t i = 0; i < layout.size(); ++i) {
    for (size_t j = i + 1; j < layout.size(); ++j) {
      const PlanLayoutEntry& a = layout[i];
      const PlanLayoutEntry& b = layout[j];
      if (a.bytes == 0 || b.bytes == 0) continue;
      const bool live_together = a.first_step <= b.last_step && b.first_step <= a.last_step;
      const bool share_bytes = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      if (live_together && share_bytes && !took(a, b) && !took(b, a)) {
        ADD_FAILURE() << graph.values[a.value].name << " and " << graph.values[b.value].name
                      << " share bytes while both live";
      }
    }
  }
  EXPECT_GE(plan.planned_bytes(), plan.liveness_bound_bytes());
  EXPECT_LE(plan.planned_bytes(), plan.memory_stats().no_reuse_bytes);
  return inplace;
}

// The example image classifier's logits for `images` as `model` computes them (empty on
// failure, which is reported).
Tensor ClassifierLogits(const Model& model, const Tensor& images) {
  auto session = Session::Create(model, Opts(kTestThreads));
  EXPECT_TRUE(session.ok()) << session.status().ToString();
  if (!session.ok()) return Tensor();
  std::vector<NamedTensor> out;
  const Status run = (*session)->Run({{"image", images}}, &out);
  EXPECT_TRUE(run.ok()) << run.ToString();
  return run.ok() ? out[0].tensor : Tensor();
}

// Two variants of one classifier (an algorithm, a layout) give the same logits, up to
// fp32 rounding.
void ExpectSameLogits(const std::vector<Tensor>& logits) {
  ASSERT_EQ(logits.size(), 2u);
  ASSERT_FALSE(logits[0].empty());
  ASSERT_FALSE(logits[1].empty());
  EXPECT_GT(MaxAbs(logits[0]), 1.f);
  EXPECT_LE(MaxAbsDiff(logits[1], logits[0]), 1e-4f * MaxAbs(logits[0]));
}

// PlanOptions::conv_algorithm on the example repository's CNN (3 -> 32 -> 32 -> 64 -> 128
// channels, 3x3 stride-1 convolutions): Winograd takes the three with >= 16 input
// channels, the first layer's stays direct, and the logits match direct fp32's.
TEST(ConvAlgorithmTest, WinogradTakesEligibleConvolutionsAndMatchesDirect) {
  const std::string path = SourceDir() + "/examples/models/image_classifier/1/model.onnx";
  std::vector<Tensor> logits;
  const Tensor images = Random({4, 3, 32, 32}, 7, 0.f, 1.f);
  for (ConvAlgorithm a : {ConvAlgorithm::kDirect, ConvAlgorithm::kWinograd}) {
    SCOPED_TRACE(ConvAlgorithmName(a));
    LoadOptions options;
    options.plan.conv_algorithm = a;
    auto model = Model::Load(path, options);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto plan = PreparePlan(**model, {images.shape()});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    int conv = 0, winograd = 0;
    for (const auto& [op, impl] : (*plan)->Implementations()) {
      if (op.find("Conv") == std::string::npos) continue;
      ++conv;
      winograd += impl.find("wino") != std::string::npos;
    }
    EXPECT_EQ(conv, 4);
    EXPECT_EQ(winograd, a == ConvAlgorithm::kWinograd ? 3 : 0);
    CheckLayout(**plan, (*model)->graph());
    logits.push_back(ClassifierLogits(**model, images));
  }
  ExpectSameLogits(logits);
}

// An int8 plan keeps a value quantised (s8/u8 with its calibrated scale, one byte an
// element) between operators that all read it so: convolutions and max pooling. A
// convolution's output stays FP32 when a reader needs FP32 (average pooling, Add), when
// its activation does not commute with the scale (Sigmoid), or when a residual is added.
// x -> Conv -> act1 -> MaxPool -> Conv (no activation) -> Conv -> Relu -> average pool,
// with an Add reading `side_from` ("act1", "pool" or none) and conv2's weights a graph
// input ("w2") when `runtime_w2`.
Graph BuildQuantisedChain(const std::string& act1, const std::string& side_from, bool runtime_w2) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 8, 12, 12});
  auto conv = [&](const std::string& name, int in, int64_t cin, int64_t cout, int64_t k,
                  uint32_t seed) {
    const float r = 1.f / std::sqrt(static_cast<float>(cin * k * k));
    const int w = b.Constant(name + ".w", Random({cout, cin, k, k}, seed, -r, r));
    const int bias = b.Constant(name + ".b", Random({cout}, seed + 1, -0.1f, 0.1f));
    return b.Op("Conv", name, {in, w, bias}, {{"pads", AInts({k / 2, k / 2, k / 2, k / 2})}});
  };
  const int act = b.Op(act1, "act1", {conv("conv1", x, 8, 16, 3, 1)});
  const int pool =
      b.Op("MaxPool", "pool", {act}, {{"kernel_shape", AInts({2, 2})}, {"strides", AInts({2, 2})}});
  const int conv2 = runtime_w2 ? b.Op("Conv", "conv2", {pool, b.Input("w2", {16, 16, 3, 3})},
                                      {{"pads", AInts({1, 1, 1, 1})}})
                               : conv("conv2", pool, 16, 16, 3, 3);  // no activation: signed, s8
  const int relu3 = b.Op("Relu", "relu3", {conv("conv3", conv2, 16, 16, 1, 5)});
  int out = b.Op("GlobalAveragePool", "gap", {relu3});
  if (!side_from.empty()) {
    const int v = side_from == "act1" ? act : pool;
    const int side = b.Op("ReduceMean", "side", {b.Op("Add", "sum", {v, v})},
                          {{"axes", AInts({2, 3})}, {"keepdims", AInt(1)}});
    out = b.Op("Add", "out", {out, side});
  }
  return b.Finish(out);
}

TEST(Int8PlanTest, KeepsValuesQuantisedBetweenOperatorsThatReadThem) {
  struct Case {
    std::string act1, side_from;
    bool runtime_w2;
    std::set<std::string> quantised;  // value names
  };
  // relu3 is read by average pooling, which needs FP32; so is a value an Add reads; a
  // Sigmoid does not commute with the scale; a LeakyRelu does (s8). A max pool passes
  // its input's quantisation on, so its input stays FP32 when its output must. A
  // convolution with weights known only at run time runs in FP32 and dequantises its
  // source.
  for (const Case& tc : std::vector<Case>{{"Relu", "", false, {"act1", "pool", "conv2"}},
                                          {"Relu", "act1", false, {"conv2"}},
                                          {"Sigmoid", "", false, {"conv2"}},
                                          {"LeakyRelu", "", false, {"act1", "pool", "conv2"}},
                                          {"Relu", "pool", false, {"conv2"}},
                                          {"Relu", "", true, {"act1", "pool"}}}) {
    SCOPED_TRACE(tc.act1 + ", Add reads '" + tc.side_from + "'" +
                 (tc.runtime_w2 ? ", run-time conv2 weights" : ""));
    const Graph graph = BuildQuantisedChain(tc.act1, tc.side_from, tc.runtime_w2);
    auto fp32 = Model::FromGraph(graph);
    ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
    std::vector<std::vector<NamedTensor>> batches;
    for (uint32_t seed = 10; seed < 14; ++seed) {
      batches.push_back({{"x", Random({2, 8, 12, 12}, seed)}});
      if (tc.runtime_w2) batches.back().push_back({"w2", Random({16, 16, 3, 3}, 7, -0.08f, 0.08f)});
    }
    auto table = Calibrate(**fp32, batches);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    LoadOptions lo;
    lo.plan.precision = Precision::kInt8;
    lo.plan.calibration = std::make_shared<const Calibration>(*table);
    auto int8 = Model::FromGraph(graph, lo);
    ASSERT_TRUE(int8.ok()) << int8.status().ToString();

    std::vector<Shape> shapes = {{2, 8, 12, 12}};
    if (tc.runtime_w2) shapes.push_back({16, 16, 3, 3});
    auto plan = PreparePlan(**int8, shapes);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const Graph& g = (*int8)->graph();
    CheckLayout(**plan, g);
    // A quantised value takes one byte an element in the arena, the others four.
    std::set<std::string> one_byte;
    for (const PlanLayoutEntry& e : (*plan)->DebugLayout()) {
      int64_t elements = 1;
      for (const Dim& d : *g.values[e.value].shape) elements *= d.value;
      EXPECT_EQ(e.bytes % elements, 0);
      if (e.bytes == elements) one_byte.insert(g.values[e.value].name);
    }
    EXPECT_EQ(one_byte, tc.quantised);
    EXPECT_EQ((*plan)->quantized_values(), static_cast<int>(tc.quantised.size()));

    // The int8 model stays near fp32.
    auto cmp = CompareTiers(**fp32, **int8, batches);
    ASSERT_TRUE(cmp.ok()) << cmp.status().ToString();
    auto session = Session::Create(**fp32, Opts(kTestThreads));
    ASSERT_TRUE(session.ok());
    std::vector<NamedTensor> ref;
    ASSERT_TRUE((*session)->Run(batches[0], &ref).ok());
    EXPECT_GT(cmp->max_abs_diff, 0.0);
    // (0.2-0.6% of the output's magnitude here; a wrong scale moves it by its error.)
    EXPECT_LT(cmp->max_abs_diff, 0.02 * std::max(1e-3f, MaxAbs(ref[0].tensor))) << cmp->ToString();
  }
}

// Max pooling of a quantised value (the engine's own loop over channels-last bytes):
// every output byte is the maximum of its window's input bytes, with padding and
// ceil_mode windows clipped to the input.
TEST(Int8PlanTest, MaxPoolOfQuantisedValuesTakesEachWindowsMaximum) {
  struct Case {
    int64_t kernel, stride, pad, ceil;
    bool is_signed;  // no Relu before the pool: s8, else u8
    bool global;     // GlobalMaxPool (kernel 13, the whole image)
  };
  for (const Case& tc : std::vector<Case>{{2, 2, 0, 0, false, false},
                                          {3, 2, 1, 0, false, false},
                                          {3, 2, 0, 1, false, false},
                                          {2, 1, 1, 0, false, false},
                                          {3, 2, 1, 1, true, false},
                                          {13, 1, 0, 0, true, true}}) {
    SCOPED_TRACE((tc.global ? "GlobalMaxPool" : "MaxPool kernel " + std::to_string(tc.kernel)) +
                 " stride " + std::to_string(tc.stride) + " pad " + std::to_string(tc.pad) +
                 " ceil " + std::to_string(tc.ceil) + (tc.is_signed ? " s8" : " u8"));
    GraphBuilder b;
    const int x = b.Input("x", {2, 8, 13, 13});
    const int w1 = b.Constant("w1", Random({24, 8, 3, 3}, 1, -0.2f, 0.2f));
    const int conv1 = b.Op("Conv", "conv1", {x, w1}, {{"pads", AInts({1, 1, 1, 1})}});
    const int act = tc.is_signed ? conv1 : b.Op("Relu", "act1", {conv1});
    const std::string act_name = tc.is_signed ? "conv1" : "act1";
    const int pool = tc.global ? b.Op("GlobalMaxPool", "pool", {act})
                               : b.Op("MaxPool", "pool", {act},
                                      {{"kernel_shape", AInts({tc.kernel, tc.kernel})},
                                       {"strides", AInts({tc.stride, tc.stride})},
                                       {"pads", AInts({tc.pad, tc.pad, tc.pad, tc.pad})},
                                       {"ceil_mode", AInt(tc.ceil)}});
    const int w2 = b.Constant("w2", Random({8, 24, 1, 1}, 2, -0.2f, 0.2f));
    const Graph graph =
        b.Finish(b.Op("GlobalAveragePool", "gap", {b.Op("Conv", "conv2", {pool, w2})}));
    auto fp32 = Model::FromGraph(graph);
    ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
    const std::vector<NamedTensor> inputs = {{"x", Random({2, 8, 13, 13}, 3)}};
    auto table = Calibrate(**fp32, {inputs});
    ASSERT_TRUE(table.ok());
    LoadOptions lo;
    lo.plan.precision = Precision::kInt8;
    lo.plan.calibration = std::make_shared<const Calibration>(*table);
    auto int8 = Model::FromGraph(graph, lo);
    ASSERT_TRUE(int8.ok()) << int8.status().ToString();
    const Graph& g = (*int8)->graph();
    // The engine's own loop pools, not oneDNN (which would give the same bytes).
    auto plan = PreparePlan(**int8, {{2, 8, 13, 13}});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (const auto& [op, impl] : (*plan)->Implementations())
      EXPECT_EQ(op.find("MaxPool"), std::string::npos) << op << " ran on oneDNN's " << impl;
    auto session = Session::Create(**int8, Opts(kTestThreads));
    ASSERT_TRUE(session.ok());
    // The observer sees values in their plan layout: here s8/u8, channels-last.
    std::vector<uint8_t> in_bytes, out_bytes;
    Shape out_shape;
    std::vector<NamedTensor> outputs;
    ASSERT_TRUE((*session)
                    ->RunObserved(inputs, &outputs,
                                  [&](int v, const Tensor& t) {
                                    const auto* p = static_cast<const uint8_t*>(t.data());
                                    if (g.values[v].name == act_name)
                                      in_bytes.assign(p, p + t.byte_size());
                                    if (g.values[v].name == "pool") {
                                      out_bytes.assign(p, p + t.byte_size());
                                      out_shape = t.shape();
                                    }
                                  })
                    .ok());
    const int64_t n = 2, c = 24, h = 13;
    ASSERT_EQ(in_bytes.size(), static_cast<size_t>(n * c * h * h)) << act_name << " is not 8-bit";
    ASSERT_EQ(out_shape.size(), 4u);
    const int64_t oh = out_shape[2], ow = out_shape[3];
    ASSERT_EQ(out_bytes.size(), static_cast<size_t>(n * c * oh * ow)) << "pool is not 8-bit";
    auto value = [&](uint8_t byte) {
      return tc.is_signed ? static_cast<int>(static_cast<int8_t>(byte)) : static_cast<int>(byte);
    };
    int least = 255, most = -255;
    for (uint8_t byte : in_bytes) {
      least = std::min(least, value(byte));
      most = std::max(most, value(byte));
    }
    EXPECT_GT(most, tc.is_signed ? 100 : 200);  // the calibrated range is used
    if (tc.is_signed) {
      EXPECT_LT(least, -50);
    }
    int checked = 0;
    for (int64_t bi = 0; bi < n; ++bi)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j)
          for (int64_t ch = 0; ch < c; ++ch) {
            int best = -1000;
            for (int64_t r = i * tc.stride - tc.pad; r < i * tc.stride - tc.pad + tc.kernel; ++r)
              for (int64_t q = j * tc.stride - tc.pad; q < j * tc.stride - tc.pad + tc.kernel; ++q)
                if (r >= 0 && r < h && q >= 0 && q < h)
                  best = std::max(best, value(in_bytes[((bi * h + r) * h + q) * c + ch]));
            ASSERT_EQ(value(out_bytes[((bi * oh + i) * ow + j) * c + ch]), best)
                << "at " << bi << "," << ch << "," << i << "," << j;
            ++checked;
          }
    EXPECT_EQ(checked, n * c * oh * ow);
  }
}

TEST(ConvAlgorithmTest, NamesParse) {
  for (ConvAlgorithm a : {ConvAlgorithm::kDirect, ConvAlgorithm::kWinograd}) {
    auto parsed = ParseConvAlgorithm(ConvAlgorithmName(a));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_EQ(ParseConvAlgorithm("fft").status().code(), StatusCode::kInvalidArgument);
}

// True when oneDNN runs AVX-512 kernels here, whose blocked layout is nChw16c (AVX2's is
// nChw8c, which the engine does not ask for).
bool HasAvx512() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & need) == need;
}

// PlanOptions::conv_layout on the example repository's CNN (3 -> 32 -> 32 -> 64 -> 128
// channels): every convolution output the plan keeps out of the plain layout is in the
// layout asked for (nChw16c, or nhwc), at least two are, and the logits match.
TEST(ConvLayoutTest, ConvolutionsWriteTheLayoutAskedForAndMatch) {
  if (!HasAvx512()) GTEST_SKIP() << "nChw16c kernels need AVX-512";
  const std::string path = SourceDir() + "/examples/models/image_classifier/1/model.onnx";
  std::vector<Tensor> logits;
  const Tensor images = Random({4, 3, 32, 32}, 7, 0.f, 1.f);
  for (ConvLayout l : {ConvLayout::kBlocked, ConvLayout::kChannelsLast}) {
    SCOPED_TRACE(ConvLayoutName(l));
    LoadOptions options;
    options.plan.conv_layout = l;
    auto model = Model::Load(path, options);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto plan = PreparePlan(**model, {images.shape()});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    CheckLayout(**plan, (*model)->graph());
    const Graph& graph = (*model)->graph();
    int laid_out = 0;
    for (const Node& node : graph.nodes) {
      if (node.op_type.find("Conv") == std::string::npos) continue;
      const dnnl::memory::desc& d = (*plan)->ValueLayout(node.outputs[0]);
      if (d.data.ndims == 0) continue;  // plain: its reader needs ONNX's layout
      SCOPED_TRACE(graph.values[node.outputs[0]].name);
      ++laid_out;
      const auto& blocking = d.data.format_desc.blocking;
      if (l == ConvLayout::kBlocked) {
        ASSERT_EQ(blocking.inner_nblks, 1);
        EXPECT_EQ(blocking.inner_blks[0], 16);
        EXPECT_EQ(blocking.inner_idxs[0], 1);  // the channels
      } else {
        EXPECT_EQ(blocking.inner_nblks, 0);
        EXPECT_EQ(blocking.strides[1], 1);  // channels innermost
      }
    }
    EXPECT_GE(laid_out, 2);
    logits.push_back(ClassifierLogits(**model, images));
  }
  ExpectSameLogits(logits);
}

// plain_layouts: whatever conv_layout says, every value stays in ONNX's layout (a plan
// another device's executor lowers), and the logits are the same.
TEST(ConvLayoutTest, PlainLayoutsKeepEveryValuePlain) {
  const std::string path = SourceDir() + "/examples/models/image_classifier/1/model.onnx";
  const Tensor images = Random({2, 3, 32, 32}, 8, 0.f, 1.f);
  std::vector<Tensor> logits;
  for (bool plain : {false, true}) {
    SCOPED_TRACE(plain ? "plain" : "chosen");
    LoadOptions options;
    options.plan.conv_layout = ConvLayout::kChannelsLast;
    options.plan.plain_layouts = plain;
    auto model = Model::Load(path, options);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto plan = PreparePlan(**model, {images.shape()});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    if (plain) {
      EXPECT_EQ((*plan)->blocked_values(), 0);
      for (size_t v = 0; v < (*model)->graph().values.size(); ++v)
        EXPECT_EQ((*plan)->ValueLayout(static_cast<int>(v)).data.ndims, 0) << "value " << v;
    } else {
      EXPECT_GT((*plan)->blocked_values(), 0);
    }
    logits.push_back(ClassifierLogits(**model, images));
  }
  ExpectSameLogits(logits);
}

TEST(ConvLayoutTest, NamesParse) {
  for (ConvLayout l : {ConvLayout::kBlocked, ConvLayout::kChannelsLast}) {
    auto parsed = ParseConvLayout(ConvLayoutName(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_EQ(ParseConvLayout("nhwc").status().code(), StatusCode::kInvalidArgument);
}

class PlannedModelTest : public ::testing::TestWithParam<std::string> {};

// Every committed model, at batch 1 and 4, twice each (a kernel that relied on fresh,
// zeroed or private memory would fail the second time or in the shared arena).
TEST_P(PlannedModelTest, MatchesReferencesWithinTheBoundAndWithoutOverlap) {
  auto model = Model::Load(ModelPath(GetParam() + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  const Graph& graph = (*model)->graph();
  for (const char* batch : {".b1.sht", ".b4.sht"}) {
    SCOPED_TRACE(GetParam() + batch);
    const Reference ref = LoadReference(GetParam() + batch);
    std::vector<Shape> shapes(graph.inputs.size());
    for (size_t i = 0; i < graph.inputs.size(); ++i) {
      for (const NamedTensor& in : ref.inputs)
        if (in.name == graph.values[graph.inputs[i]].name) shapes[i] = in.tensor.shape();
    }
    for (int run = 0; run < 2; ++run) {
      std::vector<NamedTensor> outputs;
      Status s = (*session)->Run(ref.inputs, &outputs);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (const NamedTensor& want : ref.outputs) {
        auto it = std::find_if(outputs.begin(), outputs.end(),
                               [&](const NamedTensor& o) { return o.name == want.name; });
        ASSERT_NE(it, outputs.end()) << "missing output " << want.name;
        const float scale = std::max(MaxAbs(want.tensor), 1e-6f);
        EXPECT_LE(MaxAbsDiff(it->tensor, want.tensor), 1e-4f * scale) << want.name;
      }
    }
    auto plan = PreparePlan(**model, shapes);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    CheckLayout(**plan, graph);
    const PlanMemoryStats& m = (*plan)->memory_stats();
    auto stats = (*session)->PlanStats(shapes);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->planned_bytes, m.planned_bytes);
    EXPECT_LE(static_cast<double>(m.planned_bytes),
              1.2 * static_cast<double>(m.liveness_bound_bytes));
    std::printf("%s%s: planned %lld, bound %lld (ratio %.3f), no reuse %lld, %d in-place\n",
                GetParam().c_str(), batch, static_cast<long long>(m.planned_bytes),
                static_cast<long long>(m.liveness_bound_bytes),
                m.liveness_bound_bytes ? static_cast<double>(m.planned_bytes) /
                                             static_cast<double>(m.liveness_bound_bytes)
                                       : 1.0,
                static_cast<long long>(m.no_reuse_bytes), m.inplace_count);
  }
}

std::vector<std::string> AllModels() {
  std::vector<std::string> names;
  for (const char* family :
       {"resnet", "mobilenet_v2", "mobilenet_v3", "efficientnet", "squeezenet", "shufflenet",
        "densenet", "mlp", "bert_layernorm", "bert_decomposed", "vae"}) {
    names.push_back(std::string(family) + "_op17");
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Models, PlannedModelTest, ::testing::ValuesIn(AllModels()),
                         [](const auto& info) { return info.param; });

TEST(PlanInplaceTest, GrantedOnlyWhereLegal) {
  GraphBuilder gb;
  const int x = gb.Input("x", {2, 8});
  const int flat = gb.Constant("flat", I64({1}, {16}));
  const int square = gb.Constant("square", I64({2}, {2, 8}));
  const int a = gb.Op("Exp", "a", {x});              // refused: x is a graph input
  const int b = gb.Op("Relu", "b", {a});             // refused: a is read again by d
  const int c = gb.Op("Sigmoid", "c", {b});          // granted: b dies here
  const int r = gb.Op("Reshape", "r", {c, flat});    // a view of c
  const int d = gb.Op("Mul", "d", {c, a});           // refused: r, a view of c, is read later
  const int e = gb.Op("Neg", "e", {r});              // refused: r is a view
  const int f = gb.Op("Reshape", "f", {e, square});  // a view of e
  const int g = gb.Op("Add", "g", {d, f});           // granted: d dies here
  const int h = gb.Op("Abs", "h", {g});              // granted: g dies here
  const int s = gb.Op("Add", "s", {h, h});           // refused: the other input reads h too
  const int y = gb.Op("Tanh", "y", {s});             // refused: y is a graph output
  auto model = Model::FromGraph(gb.Finish(y));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const Graph& graph = (*model)->graph();

  auto plan = PreparePlan(**model, {{2, 8}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto inplace = CheckLayout(**plan, graph);
  std::sort(inplace.begin(), inplace.end());
  EXPECT_EQ(inplace, (std::vector<std::pair<int, int>>{{c, b}, {g, d}, {h, g}}));

  // And it still computes the right thing, twice.
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  const Tensor in = Random({2, 8}, 7);
  std::vector<float> want;
  for (float v : Values(in)) {
    const float a = std::exp(v);
    const float cv = 1.f / (1.f + std::exp(-std::max(a, 0.f)));
    want.push_back(std::tanh(2.f * std::fabs(cv * a - cv)));
  }
  for (int run = 0; run < 2; ++run) {
    std::vector<NamedTensor> out;
    ASSERT_TRUE((*session)->Run({{"x", in}}, &out).ok());
    EXPECT_LE(MaxAbsDiff(out[0].tensor, F32({2, 8}, want)), 1e-5f);
  }
  auto stats = (*session)->PlanStats({{2, 8}});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->inplace_count, 3);
  EXPECT_FALSE((*session)->PlanStats({{2, 9}}).ok());
  EXPECT_FALSE((*session)->PlanStats({}).ok());
}

TEST(PlanInplaceTest, BroadcastingInputIsNotOverwritten) {
  // Add(a [1,8], b [4,8]): the output has b's shape, so only b may be overwritten.
  GraphBuilder gb;
  const int x = gb.Input("x", {1, 8});
  const int z = gb.Input("z", {4, 8});
  const int a = gb.Op("Relu", "a", {x});
  const int b = gb.Op("Relu", "b", {z});
  const int s = gb.Op("Sub", "s", {a, b});  // Sub broadcasts src0: engine loop, in place on b
  const int y = gb.Op("Neg", "y", {s});
  auto model = Model::FromGraph(gb.Finish(y));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto plan = PreparePlan(**model, {{1, 8}, {4, 8}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto inplace = CheckLayout(**plan, (*model)->graph());
  EXPECT_EQ(inplace, (std::vector<std::pair<int, int>>{{s, b}}));
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  const Tensor tx = Random({1, 8}, 1), tz = Random({4, 8}, 2);
  std::vector<float> want;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 8; ++j) {
      const float av = std::max(Values(tx)[j], 0.f), bv = std::max(Values(tz)[i * 8 + j], 0.f);
      want.push_back(-(av - bv));
    }
  }
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*session)->Run({{"x", tx}, {"z", tz}}, &out).ok());
  EXPECT_LE(MaxAbsDiff(out[0].tensor, F32({4, 8}, want)), 1e-6f);
}

// Every kernel that offers an input in place computes the same in place as it does into
// separate memory (the single-node RunOp, where inputs and outputs are graph inputs and
// outputs and nothing is in place); kernels that must not be in place are not.
struct InplaceCase {
  std::string name;
  std::string op;
  std::vector<In> inputs;
  std::map<std::string, Attribute> attrs;
  int expect_from = -1;  // the input whose bytes the output takes; -1 for none
};

void PrintTo(const InplaceCase& c, std::ostream* os) { *os << c.name; }

Tensor Ints(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int64_t>(rng() % 21) - 10;
  return I64(std::move(shape), std::move(v));
}

// A run-time input (In without -Wmissing-field-initializers).
In Fed(Tensor t) { return In{std::move(t), false, false}; }

Tensor Positive(Shape shape, uint32_t seed) { return Random(std::move(shape), seed, 0.1f, 2.f); }

std::vector<InplaceCase> InplaceCases() {
  std::vector<InplaceCase> cases;
  const Shape s = {4, 8};
  for (const char* op :
       {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Reciprocal",
        "Erf", "HardSigmoid", "HardSwish", "Gelu", "Floor", "Ceil", "Softplus", "Elu"}) {
    cases.push_back({std::string(op), op, {Fed(Positive(s, 1))}, {}, 0});
  }
  for (const char* op : {"Abs", "Neg", "Relu"})
    cases.push_back({std::string(op) + "Int64", op, {Fed(Ints(s, 2))}, {}, 0});
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Min", "Max", "Pow"}) {
    cases.push_back({std::string(op), op, {Fed(Positive(s, 3)), Fed(Positive(s, 4))}, {}, 0});
    // Input 0 broadcasts: oneDNN takes the commutative ones with src0 = input 1; the
    // others run in the engine's loop, which may overwrite input 1 (Pow: never).
    cases.push_back({std::string(op) + "Broadcast0",
                     op,
                     {Fed(Positive({8}, 5)), Fed(Positive(s, 6))},
                     {},
                     std::string(op) == "Pow" ? -1 : 1});
    cases.push_back({std::string(op) + "Broadcast1",
                     op,
                     {Fed(Positive(s, 7)), Fed(Positive({1, 8}, 8))},
                     {},
                     0});
  }
  for (const char* op : {"Add", "Sub", "Mul", "Div"})
    cases.push_back({std::string(op) + "Int64", op, {Fed(Ints(s, 9)), Fed(Ints({8}, 10))}, {}, 0});
  cases.push_back({"PRelu", "PRelu", {Fed(Random(s, 11)), Fed(Positive({8}, 12))}, {}, 0});
  cases.push_back({"ClipFp32",
                   "Clip",
                   {Fed(Random(s, 13)), Const(F32({}, {-0.5f})), Const(F32({}, {0.5f}))},
                   {},
                   0});
  cases.push_back(
      {"ClipInt64", "Clip", {Fed(Ints(s, 14)), Const(I64({}, {-3})), Const(I64({}, {4}))}, {}, 0});
  std::vector<uint8_t> cond(32);
  for (size_t i = 0; i < cond.size(); ++i) cond[i] = (i * 7) % 3 == 0;
  cases.push_back(
      {"WhereX", "Where", {Fed(Bool(s, cond)), Fed(Random(s, 15)), Fed(Random({8}, 16))}, {}, 1});
  cases.push_back(
      {"WhereY", "Where", {Fed(Bool(s, cond)), Fed(Random({8}, 17)), Fed(Random(s, 18))}, {}, 2});
  // Never in place: comparisons (smaller output elements), Cast, variadic Min.
  cases.push_back({"Less", "Less", {Fed(Random(s, 19)), Fed(Random(s, 20))}, {}, -1});
  cases.push_back({"Cast", "Cast", {Fed(Random(s, 21))}, {{"to", AInt(7)}}, -1});
  cases.push_back(
      {"Min3", "Min", {Fed(Random(s, 22)), Fed(Random(s, 23)), Fed(Random(s, 24))}, {}, -1});
  return cases;
}

class InplaceKernelTest : public ::testing::TestWithParam<InplaceCase> {};

TEST_P(InplaceKernelTest, MatchesTheKernelOutOfPlace) {
  const InplaceCase& c = GetParam();
  auto want = RunOp(c.op, c.inputs, c.attrs);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  const DataType out_dtype = (*want)[0].dtype();
  // x_i -> Mul(x_i, 1) -> p_i (in the arena) -> op -> out (in the arena) -> post -> y.
  GraphBuilder gb;
  std::vector<int> args, pre(c.inputs.size(), -1);
  std::vector<NamedTensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i].tensor;
    const std::string n = std::to_string(i);
    if (c.inputs[i].constant) {
      args.push_back(gb.Constant("c" + n, t));
      continue;
    }
    const int x = gb.Input("x" + n, t.shape(), t.dtype());
    feeds.push_back({"x" + n, t});
    if (t.dtype() == DataType::kBool) {
      args.push_back(x);
      continue;
    }
    const int one =
        gb.Constant("one" + n, t.dtype() == DataType::kFp32 ? F32({}, {1.f}) : I64({}, {1}));
    pre[i] = gb.Op("Mul", "p" + n, {x, one});
    args.push_back(pre[i]);
  }
  const int out = gb.Op(c.op, "out", args, c.attrs);
  int y = -1;
  Tensor expected = (*want)[0];
  if (out_dtype == DataType::kBool) {
    y = gb.Op("Not", "y", {out});
    auto negated = RunOp("Not", {{expected}});
    ASSERT_TRUE(negated.ok());
    expected = (*negated)[0];
  } else if (out_dtype == DataType::kFp32) {
    y = gb.Op("Mul", "y", {out, gb.Constant("one_out", F32({}, {1.f}))});
  } else {
    y = gb.Op("Mul", "y", {out, gb.Constant("one_out", I64({}, {1}))});
  }
  auto model = Model::FromGraph(gb.Finish(y));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  std::vector<Shape> shapes;
  for (const NamedTensor& f : feeds) shapes.push_back(f.tensor.shape());
  auto plan = PreparePlan(**model, shapes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  int from = -1;
  for (const auto& [taker, source] : CheckLayout(**plan, (*model)->graph())) {
    if (taker == out) from = source;
  }
  EXPECT_EQ(from, c.expect_from >= 0 ? pre[c.expect_from] : -1);

  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  for (int run = 0; run < 2; ++run) {
    std::vector<NamedTensor> got;
    Status st = (*session)->Run(feeds, &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const Tensor& t = got[0].tensor;
    ASSERT_EQ(t.shape(), expected.shape());
    ASSERT_EQ(t.dtype(), expected.dtype());
    if (t.dtype() == DataType::kFp32) {
      EXPECT_LE(MaxAbsDiff(t, expected), 1e-6f * std::max(1.f, MaxAbs(expected)));
    } else {
      ASSERT_EQ(t.byte_size(), expected.byte_size());
      EXPECT_EQ(std::memcmp(t.data(), expected.data(), t.byte_size()), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, InplaceKernelTest, ::testing::ValuesIn(InplaceCases()),
                         [](const auto& info) { return info.param.name; });

// An FPN's top-down step: p = Conv(x1), up = Resize(p) (2x nearest), s = Conv(x2) + up,
// then a 3x3 convolution of s. Resize reads p in the convolution's layout: the nearest
// upsample runs on oneDNN's resampling primitive and leaves `up` in that layout, so the
// Add fuses into s's convolution as a sum post-op on a fast kernel, never a plain-layout
// one (gemm, or oneDNN's reference int8 kernel in an int8 plan). A linear Resize, the
// engine's own loop, reads the same layout through a plain copy (its plain output still
// makes the sum's convolution plain). Each matches the operators run one by one, the
// nearest form in both convolution layouts (PlanOptions::conv_layout).
TEST(LayoutTest, ResizeReadsAConvolutionsLayoutAndFeedsTheNextConvolutionsSum) {
  auto conv = [](GraphBuilder& b, const std::string& name, int in, int64_t cin, int64_t cout,
                 int64_t k, uint32_t seed, std::map<std::string, Tensor>* weights) {
    const float r = 1.f / std::sqrt(static_cast<float>(cin * k * k));
    Tensor w = Random({cout, cin, k, k}, seed, -r, r);
    (*weights)[name] = w;
    return b.Op("Conv", name, {in, b.Constant(name + ".w", w)},
                {{"pads", AInts({k / 2, k / 2, k / 2, k / 2})}});
  };
  const Tensor x1 = Random({2, 16, 6, 6}, 1), x2 = Random({2, 16, 12, 12}, 2);
  for (const auto& [mode, layout] : {std::pair{std::string("nearest"), ConvLayout::kBlocked},
                                     std::pair{std::string("nearest"), ConvLayout::kChannelsLast},
                                     std::pair{std::string("linear"), ConvLayout::kBlocked}}) {
    SCOPED_TRACE(mode + " " + std::string(ConvLayoutName(layout)));
    GraphBuilder b;
    std::map<std::string, Tensor> w;
    const int in1 = b.Input("x1", x1.shape()), in2 = b.Input("x2", x2.shape());
    const int p = conv(b, "p", in1, 16, 16, 1, 3, &w);
    const std::map<std::string, Attribute> resize_attrs = {{"mode", AString(mode)}};
    const Tensor scales = F32({4}, {1, 1, 2, 2});
    const int up = b.Op("Resize", "up", {p, -1, b.Constant("scales", scales)}, resize_attrs);
    const int s = b.Op("Add", "s", {conv(b, "l", in2, 16, 16, 1, 4, &w), up});
    const int out = conv(b, "out", s, 16, 16, 3, 5, &w);
    LoadOptions lo;
    lo.plan.conv_layout = layout;
    auto model = Model::FromGraph(b.Finish(out), lo);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto plan = PreparePlan(**model, {x1.shape(), x2.shape()});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    CheckLayout(**plan, (*model)->graph());
    bool resize_on_dnnl = false;
    for (const auto& [op, impl] : (*plan)->Implementations()) {
      if (op == "Resize") resize_on_dnnl = true;
      if (mode == "nearest" && op.find("Conv") != std::string::npos) {
        EXPECT_EQ(impl.find("gemm"), std::string::npos) << op << " runs " << impl;
        EXPECT_EQ(impl.find("ref"), std::string::npos) << op << " runs " << impl;
      }
    }
    EXPECT_EQ(resize_on_dnnl, mode == "nearest");
    auto session = Session::Create(**model, Opts(kTestThreads));
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    std::vector<NamedTensor> got;
    Status run = (*session)->Run({{"x1", x1}, {"x2", x2}}, &got);
    ASSERT_TRUE(run.ok()) << run.ToString();

    auto one = [&](const std::string& name, const Tensor& in, int64_t k) {
      return Run1("Conv", {{in}, Const(w[name])},
                  {{"pads", AInts({k / 2, k / 2, k / 2, k / 2})}})[0];
    };
    const Tensor up_ref =
        Run1("Resize", {{one("p", x1, 1)}, Omitted(), Const(scales)}, resize_attrs)[0];
    const Tensor s_ref = Run1("Add", {{one("l", x2, 1)}, {up_ref}})[0];
    const Tensor want = one("out", s_ref, 3);
    ASSERT_EQ(got[0].tensor.shape(), want.shape());
    EXPECT_LE(MaxAbsDiff(got[0].tensor, want), 1e-4f * MaxAbs(want));
  }
}

// A U-Net's decoder step: a convolution's output (the skip connection, also max pooled)
// and a ConvTranspose of the pooled path concatenate into the next convolution. Concat
// and ConvTranspose read and write any layout, so nothing goes back to plain NCHW: the
// convolutions write PlanOptions::conv_layout's layout, the ConvTranspose runs oneDNN's
// jit deconvolution channels-last (not x64:gemm on plain NCHW) and the Concat oneDNN's
// concat.
// In a bf16 plan (where the CPU has it) Concat reads bf16 inputs through plain fp32
// copies. All match the operators run one by one in fp32.
TEST(LayoutTest, UNetDecoderStaysInTheConvolutionsLayout) {
  const Tensor x = Random({2, 16, 8, 8}, 11);
  std::map<std::string, Tensor> w;
  GraphBuilder b;
  const int in = b.Input("x", x.shape());
  auto weight = [&](const std::string& name, Shape shape, uint32_t seed) {
    const float r = 1.f / std::sqrt(static_cast<float>(shape[1] * shape[2] * shape[3]));
    w[name] = Random(std::move(shape), seed, -r, r);
    return b.Constant(name + ".w", w[name]);
  };
  const std::map<std::string, Attribute> same = {{"pads", AInts({1, 1, 1, 1})}};
  const std::map<std::string, Attribute> pool = {{"kernel_shape", AInts({2, 2})},
                                                 {"strides", AInts({2, 2})}};
  const std::map<std::string, Attribute> up = {{"strides", AInts({2, 2})}};
  const int skip = b.Op("Conv", "skip", {in, weight("skip", {16, 16, 3, 3}, 1)}, same);
  const int down = b.Op("MaxPool", "down", {skip}, pool);
  const int deep = b.Op("Conv", "deep", {down, weight("deep", {32, 16, 3, 3}, 2)}, same);
  const int upv = b.Op("ConvTranspose", "up", {deep, weight("up", {32, 16, 2, 2}, 3)}, up);
  const int cat = b.Op("Concat", "cat", {upv, skip}, {{"axis", AInt(1)}});
  const int out = b.Op("Conv", "out", {cat, weight("out", {8, 32, 3, 3}, 4)}, same);
  const Graph graph = b.Finish(out);

  auto ref_conv = [&](const Tensor& v, const std::string& name) {
    return Run1("Conv", {{v}, Const(w[name])}, same)[0];
  };
  const Tensor skip_ref = ref_conv(x, "skip");
  const Tensor deep_ref = ref_conv(Run1("MaxPool", {{skip_ref}}, pool)[0], "deep");
  const Tensor up_ref = Run1("ConvTranspose", {{deep_ref}, Const(w["up"])}, up)[0];
  const Tensor want =
      ref_conv(Run1("Concat", {{up_ref}, {skip_ref}}, {{"axis", AInt(1)}})[0], "out");

  for (const auto& [p, layout] : {std::pair{Precision::kFp32, ConvLayout::kBlocked},
                                  std::pair{Precision::kFp32, ConvLayout::kChannelsLast},
                                  std::pair{Precision::kBf16, ConvLayout::kBlocked}}) {
    if (!CheckPrecision(p).ok()) continue;
    SCOPED_TRACE(std::string(PrecisionName(p)) + " " + std::string(ConvLayoutName(layout)));
    LoadOptions lo;
    lo.plan.precision = p;
    lo.plan.conv_layout = layout;
    auto model = Model::FromGraph(graph, lo);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto plan = PreparePlan(**model, {x.shape()});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    CheckLayout(**plan, (*model)->graph());
    if (p == Precision::kFp32) {
      // The skip convolution writes the layout asked for; the transposed one stays
      // channels-last (faster beside a blocked skip path: conv.cc).
      const dnnl::memory::desc& skip_d = (*plan)->ValueLayout(skip);
      ASSERT_NE(skip_d.data.ndims, 0);
      if (HasAvx512()) {
        EXPECT_EQ(skip_d.data.format_desc.blocking.inner_nblks,
                  layout == ConvLayout::kBlocked ? 1 : 0);
      }
      std::map<std::string, std::string> impl;
      for (const auto& [op, name] : (*plan)->Implementations()) impl[op] = name;
      EXPECT_EQ(impl["ConvTranspose"].find("gemm"), std::string::npos) << impl["ConvTranspose"];
      EXPECT_NE(impl["ConvTranspose"], "");
      EXPECT_NE(impl["Concat"], "");  // oneDNN's concat, not the byte loop
    }
    auto session = Session::Create(**model, Opts(kTestThreads));
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    std::vector<NamedTensor> got;
    Status run = (*session)->Run({{"x", x}}, &got);
    ASSERT_TRUE(run.ok()) << run.ToString();
    ASSERT_EQ(got[0].tensor.shape(), want.shape());
    const float tol = p == Precision::kFp32 ? 1e-4f : 3e-2f;
    EXPECT_LE(MaxAbsDiff(got[0].tensor, want), tol * MaxAbs(want));
  }
}

}  // namespace
}  // namespace shoal::engine
