// RNN, GRU and LSTM: PyTorch's exports of nn.LSTM / nn.GRU / nn.RNN and hand-built graphs
// (models/generate_recurrent.py) against their references, the engine's own loop against
// oneDNN's primitives on the same weights, and the load and run errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/plan.h"
#include "engine/precision.h"
#include "engine/test_util.h"

namespace shoal::engine {
namespace {

using ::testing::HasSubstr;
using namespace shoal::engine::testing;

// The kernels each recurrent node of `model`'s plan for `shapes` runs on oneDNN.
std::vector<std::string> RecurrentImplementations(const Model& model,
                                                  const std::vector<Shape>& shapes) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  auto plan = Plan::Prepare(model.graph(), shapes, engine, stream, model.weight_cache(),
                            PlanOptions(), PlanLimits());
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> out;
  if (!plan.ok()) return out;
  for (const auto& [op, impl] : (*plan)->Implementations())
    if (op == "LSTM" || op == "GRU" || op == "RNN") out.push_back(op + ":" + impl);
  return out;
}

class PyTorchExportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchExportTest, MatchesPyTorchAtBatch1And4) {
  auto model = Model::Load(ModelPath(GetParam() + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (const char* batch : {".b1.sht", ".b4.sht"}) {
    SCOPED_TRACE(GetParam() + batch);
    ExpectMatchesReference(**session, LoadReference(GetParam() + batch));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PyTorchExportTest,
                         ::testing::Values("rnn_lstm_bi2_op13", "rnn_lstm_state_op17",
                                           "rnn_gru_bi2_op17", "rnn_rnn_relu_op13",
                                           "rnn_rnn_tanh_bi_op17", "rnn_lstm_classifier_op17"),
                         [](const auto& info) { return info.param; });

// Every node PyTorch exports fits oneDNN's primitives: the plan runs them there.
TEST(RecurrentTest, PyTorchExportsRunOnOneDnnPrimitives) {
  auto lstm = Model::Load(ModelPath("rnn_lstm_bi2_op13.onnx"));
  ASSERT_TRUE(lstm.ok());
  EXPECT_EQ(RecurrentImplementations(**lstm, {{4, 5, 6}}).size(), 2u);  // two layers
  auto gru = Model::Load(ModelPath("rnn_gru_bi2_op17.onnx"));
  ASSERT_TRUE(gru.ok());
  EXPECT_EQ(RecurrentImplementations(**gru, {{4, 5, 6}, {4, 4, 8}}).size(), 2u);
  auto rnn = Model::Load(ModelPath("rnn_rnn_relu_op13.onnx"));
  ASSERT_TRUE(rnn.ok());
  EXPECT_EQ(RecurrentImplementations(**rnn, {{5, 4, 6}, {2, 4, 8}}).size(), 2u);
}

// Hand-built graphs: sequence_lens (ragged and full), GRU without linear_before_reset,
// peepholes, clip, input_forget, every activation, layout 1.
class HandBuiltGraphTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HandBuiltGraphTest, MatchesTheNumPyReference) {
  const std::string name = GetParam();
  const std::string stem = name.substr(0, name.find('.'));
  auto model = Model::Load(ModelPath(stem + ".onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(kTestThreads));
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  ExpectMatchesReference(**session, LoadReference(name + ".sht"));
}

INSTANTIATE_TEST_SUITE_P(Graphs, HandBuiltGraphTest,
                         ::testing::Values("rnn_graph_lstm.ragged", "rnn_graph_lstm.full",
                                           "rnn_graph_gru.ragged", "rnn_graph_gru.full",
                                           "rnn_graph_rnn", "rnn_graph_layout1.ragged",
                                           "rnn_graph_layout1.full"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

// One session answers ragged and full batches in turn: sequence_lens arrives with the
// request, and the kernel picks oneDNN or its loop per run.
TEST(RecurrentTest, RaggedAndFullRunsAlternateInOneSession) {
  auto model = Model::Load(ModelPath("rnn_graph_gru.onnx"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  const Reference ragged = LoadReference("rnn_graph_gru.ragged.sht");
  const Reference full = LoadReference("rnn_graph_gru.full.sht");
  for (int i = 0; i < 2; ++i) {
    ExpectMatchesReference(**session, ragged);
    ExpectMatchesReference(**session, full);
  }
  EXPECT_EQ((*session)->cached_plans(), 1);
}

Attribute AStrings(std::vector<std::string> v) {
  Attribute a;
  a.kind = Attribute::Kind::kStrings;
  a.strings = std::move(v);
  return a;
}

struct Case {
  std::string op;
  std::string direction;
  int64_t lbr = 0;
  std::string activation;  // RNN only
};

// The engine's loop (weights given at run time) and oneDNN's primitive (weights
// constant) on the same numbers.
class LoopAgreesWithOneDnnTest : public ::testing::TestWithParam<Case> {};

TEST_P(LoopAgreesWithOneDnnTest, SameOutputs) {
  const Case& c = GetParam();
  const int64_t T = 7, N = 3, I = 5, H = 16;
  const int64_t G = c.op == "LSTM" ? 4 : c.op == "GRU" ? 3 : 1;
  const int64_t D = c.direction == "bidirectional" ? 2 : 1;
  const Tensor x = Random({T, N, I}, 1);
  const Tensor w = Random({D, G * H, I}, 2, -0.4f, 0.4f);
  const Tensor r = Random({D, G * H, H}, 3, -0.4f, 0.4f);
  const Tensor b = Random({D, 2 * G * H}, 4, -0.4f, 0.4f);
  const Tensor h0 = Random({D, N, H}, 5);
  std::map<std::string, Attribute> attrs = {{"hidden_size", AInt(H)},
                                            {"direction", AString(c.direction)}};
  if (c.op == "GRU") attrs["linear_before_reset"] = AInt(c.lbr);
  if (!c.activation.empty()) attrs["activations"] = AStrings({c.activation});
  const int outs = c.op == "LSTM" ? 3 : 2;
  std::vector<In> on_dnnl = {{x}, Const(w), Const(r), Const(b), Omitted(), {h0}};
  std::vector<In> on_loop = {{x}, {w}, {r}, {b}, Omitted(), {h0}};
  if (c.op == "LSTM") {
    const Tensor c0 = Random({D, N, H}, 6);
    on_dnnl.push_back({c0});
    on_loop.push_back({c0});
  }
  auto a = RunOp(c.op, on_dnnl, attrs, outs);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto l = RunOp(c.op, on_loop, attrs, outs);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  for (int o = 0; o < outs; ++o) {
    EXPECT_LE(MaxAbsDiff((*a)[o], (*l)[o]), 1e-5f) << "output " << o;
    EXPECT_GT(MaxAbs((*a)[o]), 0.05f) << "output " << o;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cells, LoopAgreesWithOneDnnTest,
    ::testing::Values(Case{"LSTM", "forward", 0, ""}, Case{"LSTM", "bidirectional", 0, ""},
                      Case{"LSTM", "reverse", 0, ""}, Case{"GRU", "bidirectional", 0, ""},
                      Case{"GRU", "reverse", 1, ""}, Case{"GRU", "forward", 0, ""},
                      Case{"RNN", "bidirectional", 0, "Relu"},
                      Case{"RNN", "reverse", 0, "Sigmoid"}),
    [](const auto& info) {
      return info.param.op + "_" + info.param.direction + "_" + std::to_string(info.param.lbr) +
             info.param.activation;
    });

std::vector<In> RnnInputs(int64_t T = 2, int64_t N = 1, int64_t I = 2, int64_t H = 3) {
  return {{Random({T, N, I}, 1)}, Const(Random({1, H, I}, 2)), Const(Random({1, H, H}, 3))};
}

TEST(RecurrentTest, UnsupportedAttributesAreLoadErrorsThatNameThem) {
  Status s = LoadOp("RNN", RnnInputs(),
                    {{"hidden_size", AInt(3)}, {"activations", AStrings({"Swish"})}}, 2);
  EXPECT_THAT(s.message(), HasSubstr("activation 'Swish' is not supported"));
  EXPECT_THAT(s.message(), HasSubstr("HardSigmoid"));
  s = LoadOp("RNN", RnnInputs(), {{"direction", AString("sideways")}}, 2);
  EXPECT_THAT(s.message(), HasSubstr("direction must be forward, reverse or bidirectional"));
  s = LoadOp("LSTM", RnnInputs(), {{"activations", AStrings({"Sigmoid", "Tanh"})}}, 2);
  EXPECT_THAT(s.message(), HasSubstr("3 function(s) per direction"));
  s = LoadOp("GRU", RnnInputs(), {{"clip", AFloat(-1.f)}}, 2);
  EXPECT_THAT(s.message(), HasSubstr("clip must be positive"));
  s = LoadOp("RNN", RnnInputs(), {{"input_forget", AInt(1)}}, 2);
  EXPECT_THAT(s.message(), HasSubstr("attribute 'input_forget' is not supported"));
}

TEST(RecurrentTest, ShapeMismatchesAndBadLengthsAreErrors) {
  auto bad_w = RunOp(
      "RNN", {{Random({2, 1, 2}, 1)}, Const(Random({1, 3, 4}, 2)), Const(Random({1, 3, 3}, 3))},
      {{"hidden_size", AInt(3)}}, 2);
  ASSERT_FALSE(bad_w.ok());
  EXPECT_THAT(bad_w.status().message(), HasSubstr("W must have shape [1,3,2]"));
  std::vector<In> in = RnnInputs(2, 2);
  in.push_back(Omitted());
  in.push_back({I32({2}, {1, 3})});  // longer than the sequence
  auto bad_len = RunOp("RNN", in, {{"hidden_size", AInt(3)}}, 2);
  ASSERT_FALSE(bad_len.ok());
  EXPECT_THAT(bad_len.status().message(), HasSubstr("sequence_lens[1] is 3; must be in [0, 2]"));
}

// A sequence of length 0 reads nothing: Y is zero and Y_h is the initial state.
TEST(RecurrentTest, ZeroLengthSequenceKeepsTheInitialState) {
  std::vector<In> in = RnnInputs(2, 2);
  in.push_back(Omitted());
  in.push_back({I32({2}, {0, 2})});
  const Tensor h0 = Random({1, 2, 3}, 9);
  in.push_back({h0});
  auto out = RunOp("RNN", in, {{"hidden_size", AInt(3)}}, 2);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const auto y = Values((*out)[0]), yh = Values((*out)[1]), h = Values(h0);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(y[(t * 2 + 0) * 3 + j], 0.f);
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(yh[j], h[j]);
    EXPECT_NE(yh[3 + j], h[3 + j]);
  }
}

// Recurrent nodes stay fp32 in the bf16 tier: a model of recurrent nodes only gives the
// fp32 results exactly.
TEST(RecurrentTest, Bf16TierKeepsRecurrentNodesInFp32) {
  if (!CheckPrecision(Precision::kBf16).ok()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  LoadOptions bf16;
  bf16.plan.precision = Precision::kBf16;
  auto model = Model::Load(ModelPath("rnn_lstm_state_op17.onnx"), bf16);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = Session::Create(**model, Opts(1));
  ASSERT_TRUE(session.ok());
  ExpectMatchesReference(**session, LoadReference("rnn_lstm_state_op17.b4.sht"));
}

}  // namespace
}  // namespace shoal::engine
