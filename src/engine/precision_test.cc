#include "engine/precision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/fp16.h"
#include "core/npy.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using namespace shoal::engine::testing;

// The trained digits classifier's 450 held-out images and labels.
struct Digits {
  Tensor images, labels;
};
Digits LoadDigits() {
  Digits d;
  auto tensors = ReadTensorFile(ModelPath("digits.test.sht"));
  EXPECT_TRUE(tensors.ok()) << tensors.status().ToString();
  if (!tensors.ok()) return d;
  for (auto& t : *tensors) {
    if (t.name == "in:image") d.images = t.tensor;
    if (t.name == "labels") d.labels = t.tensor;
  }
  return d;
}

// Rows [start, start + n) of a batch-first tensor.
Tensor Rows(const Tensor& t, int64_t start, int64_t n) {
  Shape s = t.shape();
  const size_t row = t.byte_size() / static_cast<size_t>(s[0]);
  s[0] = n;
  Tensor out = Tensor::Allocate(t.dtype(), s);
  std::memcpy(out.mutable_data(), static_cast<const char*>(t.data()) + start * row, n * row);
  return out;
}

std::vector<std::vector<NamedTensor>> Batches(const Tensor& images, int64_t start, int64_t count,
                                              int64_t batch) {
  std::vector<std::vector<NamedTensor>> out;
  for (int64_t i = start; i < start + count; i += batch)
    out.push_back({{"image", Rows(images, i, std::min(batch, start + count - i))}});
  return out;
}

double Accuracy(const Model& model, const Digits& d) {
  auto session = Session::Create(model, Opts(kTestThreads));
  EXPECT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  EXPECT_TRUE((*session)->Run({{"image", d.images}}, &out).ok());
  const int64_t n = d.images.shape()[0];
  int correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto row = out[0].tensor.values<float>().subspan(static_cast<size_t>(i * 10), 10);
    correct +=
        std::max_element(row.begin(), row.end()) - row.begin() == d.labels.values<int64_t>()[i];
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

StatusOr<std::unique_ptr<Model>> LoadTier(const std::string& file, Precision p,
                                          std::shared_ptr<const Calibration> calibration = {}) {
  LoadOptions o;
  o.plan.precision = p;
  o.plan.calibration = std::move(calibration);
  return Model::Load(ModelPath(file), o);
}

TEST(PrecisionTest, NamesParseAndBadNamesFail) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kInt8}) {
    auto parsed = ParsePrecision(PrecisionName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  auto bad = ParsePrecision("fp8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp32, bf16 or int8"), std::string::npos);
  EXPECT_TRUE(CheckPrecision(Precision::kFp32).ok());
  EXPECT_TRUE(CheckPrecision(Precision::kInt8).ok());
}

// Two runners of a three-class "model" that differ in one row's argmax and by at most 1.5;
// then a variant with a NaN, which no bound may let through.
TEST(PrecisionTest, CompareRunnersMeasuresTheLargestDifferenceAndTop1Agreement) {
  auto fixed = [](std::vector<float> values) {
    return [values](const std::vector<NamedTensor>&, std::vector<NamedTensor>* out) {
      out->push_back({"scores", F32({2, 3}, values)});
      return Status::Ok();
    };
  };
  const std::vector<std::vector<NamedTensor>> batches(2);  // two batches, inputs unused
  auto acc = CompareRunners(fixed({1, 2, 3, 3, 2, 1}), fixed({1, 2, 3.5f, 3, 3.5f, 1}), batches);
  ASSERT_TRUE(acc.ok()) << acc.status().ToString();
  EXPECT_DOUBLE_EQ(acc->max_abs_diff, 1.5);
  EXPECT_DOUBLE_EQ(acc->top1_agreement, 0.5);  // row 0 agrees, row 1 does not, twice
  EXPECT_EQ(acc->samples, 4);
  auto nan =
      CompareRunners(fixed({1, 2, 3, 3, 2, 1}), fixed({1, 2, 3, std::nanf(""), 2, 1}), batches);
  ASSERT_TRUE(nan.ok()) << nan.status().ToString();
  EXPECT_TRUE(std::isinf(nan->max_abs_diff));
  EXPECT_EQ(nan->non_finite, 2);  // one per batch
  EXPECT_DOUBLE_EQ(nan->top1_agreement, 0.5);
  EXPECT_NE(nan->ToString().find("2 outputs not finite"), std::string::npos) << nan->ToString();
  auto failing = [](const std::vector<NamedTensor>&, std::vector<NamedTensor>*) {
    return Unavailable("device lost");
  };
  auto failed = CompareRunners(fixed({1, 2, 3, 3, 2, 1}), failing, batches);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
}

TEST(PrecisionTest, CalibrationRecordsTheRangesOfInputsAndIntermediates) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  auto table = Calibrate(**fp32, Batches(d.images, 0, 64, 32));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  ASSERT_TRUE(table->count("image"));
  // The images hold grey levels in [0, 1].
  EXPECT_GE(table->at("image").min, 0.f);
  EXPECT_LE(table->at("image").max, 1.f);
  EXPECT_GT(table->at("image").max, 0.5f);
  // Every convolution's and product's input has a range.
  for (const Node& node : (*fp32)->graph().nodes) {
    if (node.op_type == "FusedConv" || node.op_type == "Conv" || node.op_type == "FusedGemm" ||
        node.op_type == "Gemm" || node.op_type == "FusedMatMul") {
      EXPECT_TRUE(table->count((*fp32)->graph().values[node.inputs[0]].name))
          << (*fp32)->graph().values[node.inputs[0]].name;
    }
  }
  EXPECT_FALSE(Calibrate(**fp32, {}).ok());
}

TEST(PrecisionTest, Int8KeepsTheTrainedClassifiersAccuracy) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  // Calibrate on the first 100 held-out images; judge on all 450.
  auto table = Calibrate(**fp32, Batches(d.images, 0, 100, 50));
  ASSERT_TRUE(table.ok());
  auto int8 = LoadTier("digits.onnx", Precision::kInt8,
                       std::make_shared<const Calibration>(*std::move(table)));
  ASSERT_TRUE(int8.ok()) << int8.status().ToString();
  const double fp32_acc = Accuracy(**fp32, d), int8_acc = Accuracy(**int8, d);
  EXPECT_GE(int8_acc, fp32_acc - 0.01) << "fp32 " << fp32_acc << ", int8 " << int8_acc;
  auto cmp = CompareTiers(**fp32, **int8, Batches(d.images, 0, 450, 64));
  ASSERT_TRUE(cmp.ok()) << cmp.status().ToString();
  EXPECT_EQ(cmp->samples, 450);
  EXPECT_GE(cmp->top1_agreement, 0.98) << cmp->ToString();
  EXPECT_GT(cmp->max_abs_diff, 0.0) << "int8 should not be bit-identical to fp32";
  EXPECT_LT(cmp->max_abs_diff, 1.0) << cmp->ToString();
}

TEST(PrecisionTest, Int8WithoutCalibrationRunsInFp32) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  auto int8 = LoadTier("digits.onnx", Precision::kInt8);
  ASSERT_TRUE(fp32.ok() && int8.ok());
  auto cmp = CompareTiers(**fp32, **int8, Batches(d.images, 0, 64, 64));
  ASSERT_TRUE(cmp.ok());
  EXPECT_EQ(cmp->max_abs_diff, 0.0);
}

TEST(PrecisionTest, Bf16IsCloseToFp32WhereTheCpuHasIt) {
  if (!CheckPrecision(Precision::kBf16).ok()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  auto bf16 = LoadTier("digits.onnx", Precision::kBf16);
  ASSERT_TRUE(fp32.ok() && bf16.ok()) << bf16.status().ToString();
  auto cmp = CompareTiers(**fp32, **bf16, Batches(d.images, 0, 450, 64));
  ASSERT_TRUE(cmp.ok());
  EXPECT_GE(cmp->top1_agreement, 0.98) << cmp->ToString();
  EXPECT_GT(cmp->max_abs_diff, 0.0);
  EXPECT_GE(Accuracy(**bf16, d), Accuracy(**fp32, d) - 0.01);
}

// Tiers on a residual CNN and a transformer with random weights: they load, run, and stay
// near fp32 relative to the outputs' scale.
TEST(PrecisionTest, TiersRunResidualAndTransformerModels) {
  for (const std::string name : {"resnet_op17", "bert_layernorm_op17", "mobilenet_v2_op17"}) {
    auto fp32 = Model::Load(ModelPath(name + ".onnx"));
    ASSERT_TRUE(fp32.ok()) << name;
    std::vector<std::vector<NamedTensor>> batches;
    for (uint32_t seed = 0; seed < 4; ++seed) {
      std::vector<NamedTensor> inputs;
      for (const TensorInfo& in : (*fp32)->inputs()) {
        Shape s;
        for (size_t i = 0; i < in.shape.size(); ++i)
          s.push_back(in.shape[i].known() ? in.shape[i].value : (i == 0 ? 2 : 8));
        if (in.dtype == DataType::kFp32) {
          inputs.push_back({in.name, Random(s, seed)});
        } else {
          Tensor t = Tensor::Allocate(in.dtype, s);
          for (auto& v : t.mutable_values<int64_t>()) v = 1;
          inputs.push_back({in.name, t});
        }
      }
      batches.push_back(std::move(inputs));
    }
    auto table = Calibrate(**fp32, batches);
    ASSERT_TRUE(table.ok()) << name;
    std::vector<std::pair<Precision, double>> tiers = {{Precision::kInt8, 0.25}};
    if (CheckPrecision(Precision::kBf16).ok()) tiers.push_back({Precision::kBf16, 0.05});
    for (auto [p, bound] : tiers) {
      auto variant = LoadTier(name + ".onnx", p, std::make_shared<const Calibration>(*table));
      ASSERT_TRUE(variant.ok()) << name << " " << PrecisionName(p) << ": "
                                << variant.status().ToString();
      auto cmp = CompareTiers(**fp32, **variant, batches);
      ASSERT_TRUE(cmp.ok()) << cmp.status().ToString();
      // Relative to the largest output magnitude.
      auto session = Session::Create(**fp32, Opts(1));
      std::vector<NamedTensor> out;
      ASSERT_TRUE((*session)->Run(batches[0], &out).ok());
      const double scale = std::max(1e-3f, MaxAbs(out[0].tensor));
      EXPECT_LT(cmp->max_abs_diff / scale, bound) << name << " " << PrecisionName(p) << ": "
                                                  << cmp->ToString() << ", output scale " << scale;
      // Every other convolution or product kept fp32, either half (what tier selection may ask
      // for): values cross between the tier's layouts and types and fp32's both ways.
      for (size_t parity : {0u, 1u}) {
        auto keep = std::make_shared<std::vector<int>>();
        const Graph& g = (*fp32)->graph();
        for (size_t n = 0, k = 0; n < g.nodes.size(); ++n)
          if (TierChangesNode(g.nodes[n]) && k++ % 2 == parity)
            keep->push_back(static_cast<int>(n));
        ASSERT_FALSE(keep->empty()) << name;
        LoadOptions o;
        o.plan.precision = p;
        o.plan.calibration = std::make_shared<const Calibration>(*table);
        o.plan.fp32_nodes = keep;
        auto mixed = Model::Load(ModelPath(name + ".onnx"), o);
        ASSERT_TRUE(mixed.ok()) << name << " mixed " << parity << " " << PrecisionName(p) << ": "
                                << mixed.status().ToString();
        auto mixed_cmp = CompareTiers(**fp32, **mixed, batches);
        ASSERT_TRUE(mixed_cmp.ok()) << mixed_cmp.status().ToString();
        EXPECT_LT(mixed_cmp->max_abs_diff / scale, bound)
            << name << " mixed " << parity << " " << PrecisionName(p) << ": "
            << mixed_cmp->ToString();
      }
    }
  }
}

// An FP16 model's tiers compute on its FP32 graph, and their accuracy is measured on its
// FP16 outputs (a comparison that skipped them would report a perfect tier).
TEST(PrecisionTest, TiersOfAnFp16ModelAreComparedOnItsFp16Outputs) {
  auto fp32 = Model::Load(ModelPath("fp16_cnn.onnx"));
  ASSERT_TRUE(fp32.ok()) << fp32.status().ToString();
  std::vector<std::vector<NamedTensor>> batches;
  for (uint32_t seed = 0; seed < 4; ++seed) {
    const Tensor x = Random({8, 3, 16, 16}, seed, -2.f, 2.f);
    Tensor h = Tensor::Allocate(DataType::kFp16, x.shape());
    FloatToFp16(x.values<float>().data(), h.mutable_values<uint16_t>().data(),
                static_cast<size_t>(x.element_count()));
    batches.push_back({{"x", h}});
  }
  auto table = Calibrate(**fp32, batches);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  std::vector<std::pair<Precision, double>> tiers = {{Precision::kInt8, 0.25}};
  if (CheckPrecision(Precision::kBf16).ok()) tiers.push_back({Precision::kBf16, 0.05});
  for (auto [p, bound] : tiers) {
    SCOPED_TRACE(PrecisionName(p));
    auto variant = LoadTier("fp16_cnn.onnx", p, std::make_shared<const Calibration>(*table));
    ASSERT_TRUE(variant.ok()) << variant.status().ToString();
    EXPECT_EQ((*variant)->outputs()[0].dtype, DataType::kFp16);
    auto cmp = CompareTiers(**fp32, **variant, batches);
    ASSERT_TRUE(cmp.ok()) << cmp.status().ToString();
    EXPECT_GT(cmp->max_abs_diff, 0) << cmp->ToString();
    EXPECT_LT(cmp->max_abs_diff, bound) << cmp->ToString();  // logits of magnitude ~0.3
    EXPECT_GE(cmp->top1_agreement, 0) << cmp->ToString();    // measured: a classifier
    EXPECT_EQ(cmp->samples, 32);
  }
}

TEST(PrecisionTest, MadeUpInputsHaveTheShapesAskedAndTheSameValuesEveryCall) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 3});
  const int ids = b.Input("ids", {2, 4}, DataType::kInt64);
  auto model = Model::FromGraph(
      b.Finish(std::vector<int>{b.Op("Relu", "y", {x}), b.Op("Identity", "i", {ids})}));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<Shape> shapes = {{5, 3}, {5, 4}};
  const std::vector<NamedTensor> a = MadeUpInputs(**model, shapes);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].name, "x");
  EXPECT_EQ(a[0].tensor.shape(), (Shape{5, 3}));
  EXPECT_EQ(a[1].tensor.shape(), (Shape{5, 4}));
  float lo = 1, hi = -1;
  for (float v : a[0].tensor.values<float>()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -1.f);
  EXPECT_LT(hi, 1.f);
  EXPECT_LT(lo, hi) << "not all one value";
  for (int64_t v : a[1].tensor.values<int64_t>()) EXPECT_EQ(v, 1);
  EXPECT_EQ(Values(MadeUpInputs(**model, shapes)[0].tensor), Values(a[0].tensor));
}

TEST(PrecisionTest, CalibrationInputsComeFromAnNpzFile) {
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  Digits d = LoadDigits();
  const std::string dir = ::testing::TempDir() + "/precision_npz";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/calibration.npz";
  ASSERT_TRUE(WriteNpz(path, {{"image", Rows(d.images, 0, 10)}}).ok());
  auto batches = ReadCalibrationInputs(**fp32, path, 4);
  ASSERT_TRUE(batches.ok()) << batches.status().ToString();
  ASSERT_EQ(batches->size(), 3u);  // 4 + 4 + 2
  EXPECT_EQ((*batches)[2][0].tensor.shape()[0], 2);
  EXPECT_EQ(MaxAbsDiff((*batches)[0][0].tensor, Rows(d.images, 0, 4)), 0.f);

  ASSERT_TRUE(WriteNpz(path, {{"pixels", Rows(d.images, 0, 10)}}).ok());
  auto wrong = ReadCalibrationInputs(**fp32, path, 4);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("no array named 'image'"), std::string::npos);
}

// Timings a test makes up: the variant's node `n` costs `variant[n]`, fp32's 1 ms each;
// whole runs as given.
TierTiming MadeUp(const Graph& g, int64_t batch, const std::map<int, double>& variant,
                  double fp32_ms, double variant_ms) {
  TierTiming t;
  t.batch = batch;
  t.fp32_ms = fp32_ms;
  t.variant_ms = variant_ms;
  t.fp32_node_ms.assign(g.nodes.size(), 1.0);
  t.variant_node_ms.assign(g.nodes.size(), 0.5);
  for (auto [n, ms] : variant) t.variant_node_ms[n] = ms;
  return t;
}

std::vector<int> Candidates(const Graph& g) {
  std::vector<int> out;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    if (TierChangesNode(g.nodes[n])) out.push_back(static_cast<int>(n));
  return out;
}

TEST(PrecisionTest, SlowerNodesAreTheProductsNotFasterAtSomeBatch) {
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  const Graph& g = (*fp32)->graph();
  const std::vector<int> cand = Candidates(g);
  ASSERT_GE(cand.size(), 2u);
  // Everything faster at both batches: nothing stays fp32, and the tier pays.
  std::vector<TierTiming> fast = {MadeUp(g, 1, {}, 2, 1), MadeUp(g, 32, {}, 20, 10)};
  EXPECT_TRUE(SlowerTierNodes(g, fast).empty());
  EXPECT_TRUE(TierPays(fast));
  // The first product as slow at batch 1 (equal counts as not faster), the second
  // slower at batch 32 only: both stay fp32; nodes that are not products never do.
  std::vector<TierTiming> mixed = {MadeUp(g, 1, {{cand[0], 1.0}}, 2, 1),
                                   MadeUp(g, 32, {{cand[1], 3.0}}, 20, 10)};
  EXPECT_EQ(SlowerTierNodes(g, mixed), (std::vector<int>{cand[0], cand[1]}));
  // A node slower in the variant that is not a product is not chosen.
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    if (TierChangesNode(g.nodes[n])) continue;
    std::vector<TierTiming> other = {MadeUp(g, 1, {{static_cast<int>(n), 9.0}}, 2, 1)};
    EXPECT_TRUE(SlowerTierNodes(g, other).empty()) << g.nodes[n].op_type;
    break;
  }
  // Whole runs: not faster at one batch is not paying.
  EXPECT_FALSE(TierPays({MadeUp(g, 1, {}, 2, 2), MadeUp(g, 32, {}, 20, 10)}));
}

// Loads digits in int8 with the nodes SelectTierNodes asks for kept fp32, and counts the
// loads.
struct Int8Digits {
  std::shared_ptr<const Calibration> calibration;
  std::vector<std::shared_ptr<const std::vector<int>>> asked;
  TierLoader Loader() {
    return [this](std::shared_ptr<const std::vector<int>> keep) {
      asked.push_back(keep);
      LoadOptions o;
      o.plan.precision = Precision::kInt8;
      o.plan.calibration = calibration;
      o.plan.fp32_nodes = std::move(keep);
      return Model::Load(ModelPath("digits.onnx"), o);
    };
  }
};

TEST(PrecisionTest, SelectionKeepsFp32WhereTheTierDoesNotPay) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  const Graph& g = (*fp32)->graph();
  const std::vector<int> cand = Candidates(g);
  auto table = Calibrate(**fp32, Batches(d.images, 0, 64, 32));
  ASSERT_TRUE(table.ok());
  const auto timed = Batches(d.images, 0, 1, 1);
  const auto check = Batches(d.images, 0, 64, 64);
  // How far the selected model's outputs are from fp32's (0: it computes in fp32).
  auto diff_from_fp32 = [&](const Model& selected) {
    auto cmp = CompareTiers(**fp32, selected, check);
    EXPECT_TRUE(cmp.ok()) << cmp.status().ToString();
    return cmp.ok() ? cmp->max_abs_diff : -1.0;
  };

  // The tier pays everywhere: loaded once, nothing kept.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          return MadeUp(g, 1, {}, 2, 1);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_TRUE(sel->fp32_nodes.empty());
    EXPECT_EQ(loader.asked.size(), 1u);
    EXPECT_EQ(sel->candidates, static_cast<int>(cand.size()));
    EXPECT_NE(sel->ToString(Precision::kInt8).find("in int8"), std::string::npos);
    EXPECT_GT(diff_from_fp32(*sel->model), 0.0);  // really int8
  }
  // One product slower, and the rest pays once it is fp32: only it stays fp32.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    int calls = 0;
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          return ++calls == 1 ? MadeUp(g, 1, {{cand[0], 1.5}}, 2, 2.5) : MadeUp(g, 1, {}, 2, 1);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_EQ(sel->fp32_nodes, std::vector<int>{cand[0]});
    ASSERT_EQ(loader.asked.size(), 2u);
    ASSERT_TRUE(loader.asked[1]);
    EXPECT_EQ(*loader.asked[1], std::vector<int>{cand[0]});
    const std::string report = sel->ToString(Precision::kInt8);
    EXPECT_NE(report.find("1 of " + std::to_string(cand.size())), std::string::npos) << report;
    EXPECT_NE(report.find("batch 1"), std::string::npos) << report;
    EXPECT_NE(report.find(g.nodes[cand[0]].name), std::string::npos) << report;
  }
  // Every product looks slower on its own at some batch, but the whole run of the tier is
  // twice as fast: the tier serves as it is (image_classifier's int8 tier was made fp32
  // this way, and its precision ladder gained nothing).
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          std::map<int, double> slow;
          for (int n : cand) slow[n] = 1.0;
          return MadeUp(g, 1, slow, 2, 1);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_TRUE(sel->fp32_nodes.empty());
    EXPECT_EQ(loader.asked.size(), 1u);
    EXPECT_GT(diff_from_fp32(*sel->model), 0.0);  // really int8
  }
  // Every product looks slower, and the whole run is only 3% faster (noise on a run of
  // microseconds): not clearly faster, so every product stays fp32.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          std::map<int, double> slow;
          for (int n : cand) slow[n] = 1.0;
          return MadeUp(g, 1, slow, 2, 1.94);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_EQ(sel->fp32_nodes, cand);
    EXPECT_EQ(diff_from_fp32(*sel->model), 0.0) << "kept fp32 but computed in int8";
  }
  // One product slower, but the plan that keeps it fp32 is slower than the whole tier
  // (which pays): the whole tier serves.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    int calls = 0;
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          return ++calls == 1 ? MadeUp(g, 1, {{cand[0], 1.5}}, 2, 1) : MadeUp(g, 1, {}, 2, 1.5);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_TRUE(sel->fp32_nodes.empty());
    EXPECT_EQ(loader.asked.size(), 2u);  // the mixed plan was tried
    EXPECT_GT(diff_from_fp32(*sel->model), 0.0);
  }
  // No product is slower and the whole tier is faster, but only by 5%: within noise on a
  // run of microseconds, so every product stays fp32.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          return MadeUp(g, 1, {}, 2, 1.9);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_EQ(sel->fp32_nodes, cand);
    EXPECT_NE(sel->why.find("not clearly faster than fp32"), std::string::npos) << sel->why;
    EXPECT_EQ(diff_from_fp32(*sel->model), 0.0) << "kept fp32 but computed in int8";
  }
  // One product slower; the plan that keeps it fp32 is faster than fp32, but only by 5%,
  // and the whole tier is not faster: not the mixed plan (it served slower than fp32 on
  // the recommender MLP), every product stays fp32.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    int calls = 0;
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          return ++calls == 1 ? MadeUp(g, 1, {{cand[0], 1.5}}, 2, 2.1) : MadeUp(g, 1, {}, 2, 1.9);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_EQ(loader.asked.size(), 3u);  // the whole tier, the mixed plan, all fp32
    EXPECT_EQ(sel->fp32_nodes, cand);
    EXPECT_EQ(diff_from_fp32(*sel->model), 0.0) << "kept fp32 but computed in int8";
  }
  // Nothing pays: every product stays fp32, and the variant computes exactly as fp32.
  {
    Int8Digits loader{std::make_shared<const Calibration>(*table), {}};
    auto sel = SelectTierNodes(
        **fp32, loader.Loader(), timed,
        [&](const Model&, const Model&, const std::vector<NamedTensor>&) -> StatusOr<TierTiming> {
          std::map<int, double> slow;
          for (int n : cand) slow[n] = 2.0;
          return MadeUp(g, 1, slow, 2, 3);
        });
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    EXPECT_EQ(sel->fp32_nodes, cand);
    EXPECT_NE(sel->why.find("not clearly faster than fp32"), std::string::npos) << sel->why;
    EXPECT_EQ(diff_from_fp32(*sel->model), 0.0) << "kept fp32 but computed in int8";
  }
}

// The backend's loader: some products kept fp32 gives the tier with those in fp32; every
// one of them gives the fp32 plan itself (a bf16 plan keeping them all still held values
// in other layouts than fp32, and ran slower).
TEST(PrecisionTest, ServedTierLoaderGivesTheFp32PlanWhenEveryProductStaysFp32) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  const std::vector<int> cand = Candidates((*fp32)->graph());
  ASSERT_GE(cand.size(), 2u);
  auto table = Calibrate(**fp32, Batches(d.images, 0, 64, 32));
  ASSERT_TRUE(table.ok());
  LoadOptions o;
  o.plan.precision = Precision::kInt8;
  o.plan.calibration = std::make_shared<const Calibration>(*table);
  TierLoader load = ServedTierLoader(**fp32, ModelPath("digits.onnx"), o);
  const auto check = Batches(d.images, 0, 64, 64);

  auto whole = load(nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ((*whole)->options().plan.precision, Precision::kInt8);
  auto cmp = CompareTiers(**fp32, **whole, check);
  ASSERT_TRUE(cmp.ok());
  EXPECT_GT(cmp->max_abs_diff, 0.0);

  auto some = load(std::make_shared<const std::vector<int>>(std::vector<int>{cand[0]}));
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ((*some)->options().plan.precision, Precision::kInt8);
  ASSERT_TRUE((*some)->options().plan.fp32_nodes);
  EXPECT_EQ(*(*some)->options().plan.fp32_nodes, std::vector<int>{cand[0]});

  auto all = load(std::make_shared<const std::vector<int>>(cand));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)->options().plan.precision, Precision::kFp32);
  EXPECT_FALSE((*all)->options().plan.fp32_nodes);
  EXPECT_FALSE((*all)->options().plan.calibration);
  cmp = CompareTiers(**fp32, **all, check);
  ASSERT_TRUE(cmp.ok());
  EXPECT_EQ(cmp->max_abs_diff, 0.0);
}

// The inputs a tier is timed at: the first row alone, and the first calibration batch.
TEST(PrecisionTest, ServedTierTimingInputsAreTheFirstRowAndTheFirstBatch) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  ASSERT_TRUE(fp32.ok());
  const auto batches = Batches(d.images, 0, 16, 8);
  auto timed = ServedTierTimingInputs(**fp32, batches);
  ASSERT_TRUE(timed.ok()) << timed.status().ToString();
  ASSERT_EQ(timed->size(), 2u);
  ASSERT_EQ((*timed)[0].size(), 1u);
  EXPECT_EQ((*timed)[0][0].tensor.shape()[0], 1);
  EXPECT_EQ((*timed)[1][0].tensor.shape()[0], 8);
  const Tensor& row = (*timed)[0][0].tensor;
  EXPECT_EQ(std::memcmp(row.data(), batches[0][0].tensor.data(), row.byte_size()), 0);
  // A calibration batch of one row: timed once.
  auto single = ServedTierTimingInputs(**fp32, Batches(d.images, 0, 1, 1));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->size(), 1u);
}

TEST(PrecisionTest, TimeTiersGivesMediansPerNodeAtTheInputsBatch) {
  Digits d = LoadDigits();
  auto fp32 = Model::Load(ModelPath("digits.onnx"));
  auto table = Calibrate(**fp32, Batches(d.images, 0, 32, 32));
  ASSERT_TRUE(fp32.ok() && table.ok());
  auto int8 = LoadTier("digits.onnx", Precision::kInt8,
                       std::make_shared<const Calibration>(*std::move(table)));
  ASSERT_TRUE(int8.ok());
  auto t = TimeTiers(**fp32, **int8, Batches(d.images, 0, 2, 2)[0], 3, 2);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->batch, 2);
  EXPECT_EQ(t->fp32_node_ms.size(), (*fp32)->graph().nodes.size());
  EXPECT_EQ(t->variant_node_ms.size(), (*fp32)->graph().nodes.size());
  EXPECT_GT(t->fp32_ms, 0);
  EXPECT_GT(t->variant_ms, 0);
  EXPECT_FALSE(TimeTiers(**fp32, **int8, Batches(d.images, 0, 2, 2)[0], 0, 1).ok());
}

}  // namespace
}  // namespace shoal::engine
