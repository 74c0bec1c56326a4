// Lowering of the recurrent operators (gpu_lowering_recurrent.cc), on the host: which steps
// each RNN, GRU and LSTM of the recurrent test models becomes, with what geometry, weights
// and precision. Their results against the CPU engine are engine_cuda_gpu_plan_test's (on a
// device).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/model.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::AInt;
using engine::testing::GraphBuilder;
using engine::testing::Random;

// Steps of node `name` in `l`, by kind.
std::map<GpuStep::Kind, int> StepKinds(const Graph& g, const GpuLowering& l,
                                       const std::string& name) {
  std::map<GpuStep::Kind, int> kinds;
  for (const GpuStep& s : l.steps)
    if (g.nodes[s.node].name == name) ++kinds[s.kind];
  return kinds;
}

// Every recurrent test model lowers (RNN, GRU and LSTM; one and two directions, stacked,
// batch-first, with and without sequence_lens and initial states), its products fp32 GEMMs.
TEST(LowerPlanTest, TheRecurrentModelsLower) {
  const std::pair<const char*, const char*> models[] = {
      {"rnn_graph_gru", ".full.sht"},          {"rnn_graph_lstm", ".ragged.sht"},
      {"rnn_graph_layout1", ".full.sht"},      {"rnn_graph_rnn", ".sht"},
      {"rnn_gru_bi2_op17", ".b4.sht"},         {"rnn_lstm_bi2_op13", ".b4.sht"},
      {"rnn_lstm_classifier_op17", ".b4.sht"}, {"rnn_lstm_state_op17", ".b4.sht"},
      {"rnn_rnn_relu_op13", ".b4.sht"},        {"rnn_rnn_tanh_bi_op17", ".b4.sht"}};
  for (const auto& [name, ref] : models) {
    SCOPED_TRACE(name);
    WithReference r = PrepareWithReference(name, ref);
    ASSERT_TRUE(r.prepared.plan);
    auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    int cells = 0;
    for (const GpuStep& s : l->steps) {
      cells += s.kind == GpuStep::Kind::kRnnCell;
      if (s.kind == GpuStep::Kind::kGemm) {
        EXPECT_EQ(s.gemm.math, GemmMath::kFp32);
      }
    }
    EXPECT_GT(cells, 0);
    ExpectAligned(*l);
  }
}

// The GRU model (5 steps, batch 3, hidden 6). Without linear-before-reset (bidirectional),
// per step a product of the z and r gates, the reset kernel, a product of r * h and the
// cell; with it, one product and the cell, backwards for the reverse one, with the R bias of
// the h gate for the cell, and its own activations and clip for the last. Each direction's
// input product is one GEMM over every step, with the biases.
TEST(LowerPlanTest, AGruBecomesProductsAndCellsPerStep) {
  WithReference r = PrepareWithReference("rnn_graph_gru", ".ragged.sht");
  ASSERT_TRUE(r.prepared.plan);
  const Graph& g = r.prepared.model->graph();
  auto l = LowerPlan(g, *r.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  using K = GpuStep::Kind;
  auto lbr0 = StepKinds(g, *l, "gru_lbr0");
  EXPECT_EQ(lbr0[K::kGemm], 2 * (1 + 2 * 5));
  EXPECT_EQ(lbr0[K::kGruReset], 2 * 5);
  EXPECT_EQ(lbr0[K::kRnnCell], 2 * 5);
  EXPECT_EQ(lbr0[K::kRnnStateIn], 2);   // its initial_h, per direction
  EXPECT_EQ(lbr0[K::kRnnStateOut], 2);  // y_h
  EXPECT_EQ(lbr0[K::kZero], 1);         // y, with sequence_lens
  auto lbr1 = StepKinds(g, *l, "gru_lbr1_reverse");
  EXPECT_EQ(lbr1[K::kGemm], 1 + 5);
  EXPECT_EQ(lbr1[K::kGruReset], 0);
  EXPECT_EQ(lbr1[K::kRnnCell], 5);
  auto acts = StepKinds(g, *l, "gru_lbr1_acts");
  EXPECT_EQ(acts[K::kZero], 0);  // no y
  int64_t step = 0;
  for (const GpuStep& s : l->steps) {
    const std::string& node = g.nodes[s.node].name;
    if (s.kind == K::kGemm && s.in[0] == g.FindValue("x")) {
      EXPECT_EQ(s.gemm.m, 5 * 3);
      EXPECT_EQ(s.gemm.n, 3 * 6);
      EXPECT_EQ(s.gemm.k, 4);
      EXPECT_TRUE(s.gemm.transpose_w);
      EXPECT_EQ(s.gemm.epilogue, GemmEpilogue::kBias);
    }
    if (s.kind != K::kRnnCell) continue;
    EXPECT_EQ(s.rnn.cell, 1);
    EXPECT_EQ(s.rnn.seq, 5);
    EXPECT_EQ(s.rnn.batch, 3);
    EXPECT_EQ(s.rnn.hidden, 6);
    EXPECT_GE(s.flag, 0);
    EXPECT_GE(s.in[5], 0) << "sequence_lens";
    if (node == "gru_lbr0") {
      EXPECT_FALSE(s.rnn.linear_before_reset);
      EXPECT_EQ(s.rnn.dirs, 2);
      EXPECT_EQ(s.rnn.backwards, s.rnn.dir == 1);
      EXPECT_EQ(s.rnn.step, step++ % 5);
      EXPECT_EQ(s.length, 2 * 6);
      EXPECT_GE(s.in[2], 0) << "its h gate's product";
      EXPECT_EQ(s.weight_slots[0], -1);
    } else {
      EXPECT_TRUE(s.rnn.linear_before_reset);
      EXPECT_EQ(s.length, 3 * 6);
      EXPECT_EQ(s.in[2], -1);
      EXPECT_GE(s.weight_slots[0], 0) << "the R bias of the h gate";
    }
    if (node == "gru_lbr1_reverse") {
      EXPECT_TRUE(s.rnn.backwards);
    }
    if (node == "gru_lbr1_acts") {
      EXPECT_FALSE(s.rnn.backwards);
      EXPECT_EQ(s.rnn.act[0].kind, 7);  // HardSigmoid
      EXPECT_FLOAT_EQ(s.rnn.act[0].alpha, 0.25f);
      EXPECT_EQ(s.rnn.act[1].kind, 6);  // ScaledTanh
      EXPECT_FLOAT_EQ(s.rnn.act[1].beta, 0.9f);
      EXPECT_FLOAT_EQ(s.rnn.clip, 2.f);
      EXPECT_EQ(s.out, -1);
    }
  }
}

// The LSTM model: a bidirectional LSTM with sequence_lens and initial states (each
// direction's states in and out, the second direction backwards), and a reverse LSTM with
// peepholes, clip and input_forget.
TEST(LowerPlanTest, AnLstmKeepsItsStatesPeepholesAndClip) {
  WithReference r = PrepareWithReference("rnn_graph_lstm", ".ragged.sht");
  ASSERT_TRUE(r.prepared.plan);
  const Graph& g = r.prepared.model->graph();
  auto l = LowerPlan(g, *r.prepared.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  using K = GpuStep::Kind;
  auto bi = StepKinds(g, *l, "lstm_bi");
  EXPECT_EQ(bi[K::kRnnStateIn], 4);   // h and c, two directions
  EXPECT_EQ(bi[K::kRnnStateOut], 4);  // y_h and y_c
  EXPECT_EQ(bi[K::kRnnCell], 2 * 6);
  EXPECT_EQ(bi[K::kGemm], 2 * (1 + 6));
  for (const GpuStep& s : l->steps) {
    if (s.kind != K::kRnnCell) continue;
    EXPECT_EQ(s.rnn.cell, 2);
    EXPECT_GE(s.in[4], 0) << "c";
    if (g.nodes[s.node].name == "lstm_bi") {
      EXPECT_EQ(s.rnn.dirs, 2);
      EXPECT_EQ(s.rnn.backwards, s.rnn.dir == 1);
      EXPECT_EQ(s.weight_slots[1], -1);
    } else {
      EXPECT_TRUE(s.rnn.backwards);
      EXPECT_FLOAT_EQ(s.rnn.clip, 1.5f);
      EXPECT_TRUE(s.rnn.input_forget);
      ASSERT_GE(s.weight_slots[1], 0) << "peepholes";
      EXPECT_EQ(l->blobs[s.weight_slots[1]].data.element_count(), 3 * 4);
    }
  }
}

// In a 16-bit or TF32 plan the recurrent products stay fp32: nothing is rounded before them.
TEST(LowerPlanTest, RecurrentProductsStayFp32InEveryTier) {
  WithReference r = PrepareWithReference("rnn_graph_rnn", ".sht");
  ASSERT_TRUE(r.prepared.plan);
  for (GemmMath math : {GemmMath::kFp16, GemmMath::kBf16, GemmMath::kTf32}) {
    GpuPlanOptions options;
    options.math = math;
    auto l = LowerPlan(r.prepared.model->graph(), *r.prepared.plan, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    for (const GpuStep& s : l->steps) {
      EXPECT_NE(s.kind, GpuStep::Kind::kToHalf);
      if (s.kind == GpuStep::Kind::kGemm) {
        EXPECT_EQ(s.gemm.math, GemmMath::kFp32);
        EXPECT_FALSE(s.gemm.fp32_output);
      }
    }
  }
}

// Two GRUs reading the same W, R and B, one with linear_before_reset and one without, each
// get their own blobs: the state's product reads 2 gates of R without it, 3 with it.
TEST(LowerPlanTest, RecurrentNodesSharingWeightsKeepBlobsOfTheirOwn) {
  GraphBuilder b;
  const int64_t T = 3, N = 2, I = 4, H = 5;
  const int x = b.Input("x", {T, N, I});
  const int w = b.Constant("W", Random({1, 3 * H, I}, 81));
  const int r = b.Constant("R", Random({1, 3 * H, H}, 82));
  const int bias = b.Constant("B", Random({1, 6 * H}, 83));
  const int y0 = b.Op("GRU", "gru_a", {x, w, r, bias}, {{"hidden_size", AInt(H)}});
  const int y1 = b.Op("GRU", "gru_b", {x, w, r, bias},
                      {{"hidden_size", AInt(H)}, {"linear_before_reset", AInt(1)}});
  Prepared p = Prepare(Model::FromGraph(b.Finish({y0, y1})), {{T, N, I}});
  ASSERT_TRUE(p.plan);
  const Graph& g = p.model->graph();
  auto l = LowerPlan(g, *p.plan);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::map<std::string, std::set<int64_t>> state_weights;  // per node: R's elements per GEMM
  for (const GpuStep& s : l->steps) {
    if (s.kind != GpuStep::Kind::kGemm || s.gemm.k != H) continue;
    state_weights[g.nodes[s.node].name].insert(l->blobs[s.weight_slots[0]].data.element_count());
  }
  EXPECT_EQ(state_weights["gru_a"], (std::set<int64_t>{2 * H * H, H * H}));
  EXPECT_EQ(state_weights["gru_b"], (std::set<int64_t>{3 * H * H}));
}

}  // namespace
}  // namespace shoal::engine::cuda
