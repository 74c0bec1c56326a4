// Importer and load-time checks: malformed and truncated files, opset range, Constant
// nodes, external data paths, unsupported operators, and the `inspect` report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/inspect.h"
#include "engine/onnx_importer.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::HasSubstr;
using namespace shoal::engine::testing;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// y = Relu(x + c), with c from a Constant node; x is [batch, 3].
onnx::ModelProto SmallModel(int64_t opset = 13) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);
  auto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  auto* c = g->add_node();
  c->set_op_type("Constant");
  c->add_output("c");
  auto* a = c->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  a->mutable_t()->add_dims(3);
  for (float v : {1.f, -2.f, 3.f}) a->mutable_t()->add_float_data(v);
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->set_name("add0");
  add->add_input("x");
  add->add_input("c");
  add->add_output("s");
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->add_input("s");
  relu->add_output("y");
  g->add_output()->set_name("y");
  return m;
}

StatusOr<std::unique_ptr<Model>> LoadProto(const onnx::ModelProto& m, const std::string& dir = "") {
  ASSIGN_OR_RETURN(Graph g, ImportOnnxBytes(m.SerializeAsString(), dir));
  return Model::FromGraph(std::move(g));
}

TEST(ImporterTest, ConstantNodesBecomeConstantsAndTheModelRuns) {
  auto graph = ImportOnnxBytes(SmallModel().SerializeAsString(), "");
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_EQ(graph->nodes.size(), 2u);  // Constant emitted no node
  const int c = graph->FindValue("c");
  ASSERT_GE(c, 0);
  EXPECT_TRUE(graph->values[c].is_constant());
  auto model = Model::FromGraph(*std::move(graph));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(SymbolicShapeToString((*model)->outputs()[0].shape), "[batch,3]");
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  ASSERT_TRUE((*session)->Run({{"x", F32({2, 3}, {0, 0, 0, 1, 1, 1})}}, &out).ok());
  EXPECT_THAT(Values(out[0].tensor), ::testing::ElementsAre(1, 0, 3, 2, 0, 4));
}

// The small model in FLOAT16: its Constant's values as bit patterns in int32_data (as
// onnx.proto stores FLOAT16 outside raw_data), its input and output FLOAT16.
TEST(ImporterTest, Float16ModelWithInt32DataLoadsAndKeepsFp16Edges) {
  onnx::ModelProto m = SmallModel();
  auto* g = m.mutable_graph();
  g->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::FLOAT16);
  auto* out_type = g->mutable_output(0)->mutable_type()->mutable_tensor_type();
  out_type->set_elem_type(onnx::TensorProto::FLOAT16);
  auto* t = g->mutable_node(0)->mutable_attribute(0)->mutable_t();
  t->set_data_type(onnx::TensorProto::FLOAT16);
  t->clear_float_data();
  for (int bits : {0x3C00, 0xC000, 0x4200}) t->add_int32_data(bits);  // 1, -2, 3
  auto model = LoadProto(m);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->inputs()[0].dtype, DataType::kFp16);
  EXPECT_EQ((*model)->outputs()[0].dtype, DataType::kFp16);
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  std::vector<NamedTensor> out;
  // x = [[0, 0, 0], [1, 1, 1]] in FP16.
  const Tensor x =
      Tensor::FromVector<uint16_t>(DataType::kFp16, {2, 3}, {0, 0, 0, 0x3C00, 0x3C00, 0x3C00});
  ASSERT_TRUE((*session)->Run({{"x", x}}, &out).ok());
  ASSERT_EQ(out[0].tensor.dtype(), DataType::kFp16);
  // Relu(x + c) = [[1, 0, 3], [2, 0, 4]].
  EXPECT_THAT(out[0].tensor.values<uint16_t>(),
              ::testing::ElementsAre(0x3C00, 0, 0x4200, 0x4000, 0, 0x4400));
}

TEST(ImporterTest, OpsetOutsideElevenToEighteenIsRejected) {
  EXPECT_TRUE(ImportOnnxBytes(SmallModel(18).SerializeAsString(), "").ok());
  for (int64_t opset : {10, 19}) {
    auto g = ImportOnnxBytes(SmallModel(opset).SerializeAsString(), "");
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(g.status().message(),
                HasSubstr("opset " + std::to_string(opset) + " is not supported"));
  }
}

TEST(ImporterTest, UnknownInputNameAndDuplicateOutputAreErrors) {
  auto m = SmallModel();
  m.mutable_graph()->mutable_node(1)->set_input(1, "nope");
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "").status().message(),
              HasSubstr("node 'add0' (Add): input 'nope' is not produced"));
  m = SmallModel();
  m.mutable_graph()->mutable_node(2)->set_output(0, "s");
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "").status().message(),
              HasSubstr("already defined"));
}

TEST(ImporterTest, UnsupportedOperatorFailsLoadNamingNodeAndOperator) {
  auto m = SmallModel();
  m.mutable_graph()->mutable_node(1)->set_op_type("LpNormalization");
  auto model = LoadProto(m);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(
      model.status().message(),
      HasSubstr("node 'add0' (LpNormalization): operator 'LpNormalization' is not supported"));
}

TEST(ImporterTest, UnsupportedDataTypeIsNamed) {
  auto m = SmallModel();
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::STRING);
  auto model = LoadProto(m);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("add0"));
}

TEST(ImporterTest, TensorDataSizeMismatchIsAnError) {
  auto m = SmallModel();
  auto* t = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_t();
  t->add_dims(2);
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "").status().message(),
              HasSubstr("holds 3 values"));
  t->add_dims(1000000000);  // a claimed size above the limit is refused before allocating
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "").status().message(),
              HasSubstr("has more than"));
}

TEST(ImporterTest, ExternalDataMustStayInTheModelFolder) {
  auto m = SmallModel();
  auto* t = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_t();
  t->clear_float_data();
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = t->add_external_data();
  kv->set_key("location");
  kv->set_value("../../etc/passwd");
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "/tmp").status().message(),
              HasSubstr("must not leave"));
  kv->set_value("/etc/passwd");
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "/tmp").status().message(),
              HasSubstr("must be relative"));
  kv->set_value("missing.bin");
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "/tmp").status().message(),
              HasSubstr("cannot read"));
  EXPECT_THAT(ImportOnnxBytes(m.SerializeAsString(), "").status().message(),
              HasSubstr("needs the model's folder"));
}

TEST(ImporterTest, MissingGarbageAndTruncatedFilesAreClearErrors) {
  auto missing = Model::Load("/nonexistent/model.onnx");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ImportOnnxBytes("this is not a protobuf", "").status().message(),
              HasSubstr("not a valid ONNX model"));
  EXPECT_THAT(ImportOnnxBytes("", "").status().message(), HasSubstr("the file is empty"));
  const std::string bytes = ReadAll(ModelPath("resnet_op13.onnx"));
  ASSERT_GT(bytes.size(), 1000u);
  for (size_t cut : {size_t{1}, size_t{17}, bytes.size() / 2, bytes.size() - 1}) {
    auto g = ImportOnnxBytes(std::string_view(bytes).substr(0, cut), "");
    EXPECT_FALSE(g.ok()) << "cut at " << cut;
  }
}

TEST(ImporterTest, RandomCorruptionNeverCrashes) {
  // A miniature of fuzz/importer_fuzzer.cc: flip bytes of a real model and load it all
  // the way (import, checks, shape inference). Any outcome but a crash is fine, but a
  // refusal must say why, and the seed must reach both outcomes: a run where every
  // mutation fails at the parser never exercises the checks after it.
  const std::string bytes = ReadAll(ModelPath("mlp_op13.onnx"));
  std::mt19937 rng(42);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 200; ++i) {
    std::string mutated = bytes;
    for (int k = 0; k < 4; ++k) mutated[rng() % mutated.size()] = static_cast<char>(rng());
    auto g = ImportOnnxBytes(mutated, "");
    Status s = g.status();
    if (g.ok()) s = Model::FromGraph(*std::move(g)).status();
    if (s.ok()) {
      ++loaded;
    } else {
      ++refused;
      EXPECT_FALSE(s.message().empty()) << "mutation " << i << " refused without a reason";
    }
  }
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
}

TEST(InspectTest, ReportsSignatureHistogramAndFlops) {
  InspectSummary summary;
  auto report = InspectModel(ModelPath("resnet_op13.onnx"), {}, &summary);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(summary.loads);
  EXPECT_EQ(summary.unsupported_operator_types, 0);
  EXPECT_THAT(*report, HasSubstr("input  FP32  [batch,3,32,32]"));
  EXPECT_THAT(*report, HasSubstr("logits  FP32  [batch,10]"));
  EXPECT_THAT(*report, HasSubstr("Conv  "));
  EXPECT_THAT(*report, HasSubstr("unsupported operators: none"));
  EXPECT_THAT(*report, HasSubstr("batching: yes"));
  EXPECT_THAT(*report, HasSubstr("estimated FLOPs per sample: "));
  EXPECT_THAT(*report, HasSubstr("activation memory (batch 1): planned "));
  EXPECT_THAT(*report, HasSubstr("in-place; no reuse "));
  EXPECT_THAT(*report, ::testing::Not(HasSubstr("unknown")));
  auto batch8 = InspectModel(ModelPath("resnet_op13.onnx"), InspectOptions{8});
  ASSERT_TRUE(batch8.ok()) << batch8.status().ToString();
  EXPECT_THAT(*batch8, HasSubstr("activation memory (batch 8): planned "));
  EXPECT_FALSE(InspectModel(ModelPath("resnet_op13.onnx"), InspectOptions{-1}).ok());
}

TEST(InspectTest, ListsUnsupportedOperators) {
  auto m = SmallModel();
  m.mutable_graph()->mutable_node(2)->set_op_type("Celu");
  const std::string path = std::filesystem::temp_directory_path() / "shoal_inspect_test.onnx";
  {
    std::ofstream out(path, std::ios::binary);
    out << m.SerializeAsString();
  }
  InspectSummary summary;
  auto report = InspectModel(path, {}, &summary);
  std::filesystem::remove(path);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(summary.loads) << "`shoal inspect` would exit 0 on a model it cannot serve";
  EXPECT_EQ(summary.unsupported_operator_types, 1);
  EXPECT_THAT(*report, HasSubstr("unsupported operators:\n  Celu  1"));
  EXPECT_THAT(*report, HasSubstr("nodes: 2"));
  EXPECT_THAT(*report, HasSubstr("FLOPs per sample: unknown"));
}

}  // namespace
}  // namespace shoal::engine
