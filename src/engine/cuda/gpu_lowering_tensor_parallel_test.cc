// Tensor parallelism in the GPU plan's lowering (gpu_lowering.h, TensorParallelOptions):
// host only, runs everywhere. Runs of split plans on a device are in gpu_plan_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/gpu_plan_test_util.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/test_util.h"

namespace shoal::engine::cuda {
namespace {

using engine::testing::GraphBuilder;
using engine::testing::Random;

// A wide computed input and a narrow product: [4, 512] -> Relu -> MatMul by [512, 96].
// Once the product's shards have read the Relu's output, its bytes are free for the
// arena's next values.
Graph WideIntoNarrowGraph() {
  GraphBuilder b;
  const int x = b.Input("x", {4, 512});
  const int r = b.Op("Relu", "r", {x});
  const int w = b.Constant("w", Random({512, 96}, 31));
  const int y = b.Op("MatMul", "y", {r, w});
  return b.Finish(b.Op("Sigmoid", "s", {y}));
}

// The columns [begin, end) of each row of a [rows, cols] fp32 tensor.
std::vector<float> ColumnsOf(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = begin; c < end; ++c) out.push_back(t.values<float>()[r * cols + c]);
  return out;
}

// Whether two arena values' bytes overlap.
bool Overlap(const GpuValue& a, const GpuValue& b) {
  return a.home == GpuValue::Home::kArena && b.home == GpuValue::Home::kArena &&
         a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// Tensor parallelism over two shards sharing the plan's memory: each product with at least
// min_columns output columns becomes a fork, one GEMM per shard holding its columns of the
// weight and the bias (the whole's, cut), a join and the columns placed into the output;
// the smaller products stay whole. Nothing a shard's step touches shares arena bytes with
// what another's does.
TEST(LowerPlanTest, TensorParallelismSplitsTheLargeProductsColumnWise) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(p.plan);
  auto whole = LowerPlan(p.model->graph(), *p.plan);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  GpuPlanOptions options;
  options.tensor_parallel.shards = 2;
  options.tensor_parallel.min_columns = 100;
  auto split = LowerPlan(p.model->graph(), *p.plan, options);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  using K = GpuStep::Kind;
  int expected_splits = 0;
  size_t at = 0;  // the split lowering's next step
  for (const GpuStep& w : whole->steps) {
    ASSERT_EQ(w.kind, K::kGemm);
    ASSERT_LT(at, split->steps.size());
    if (w.gemm.n < 100) {
      const GpuStep& same = split->steps[at++];
      EXPECT_EQ(same.kind, K::kGemm);
      EXPECT_EQ(same.shard, -1);
      EXPECT_EQ(same.gemm.n, w.gemm.n);
      continue;
    }
    SCOPED_TRACE("the product of " + std::to_string(w.gemm.n) + " columns");
    ++expected_splits;
    ASSERT_LE(at + 6, split->steps.size());
    EXPECT_EQ(split->steps[at].kind, K::kFork);
    const GpuStep& a = split->steps[at + 1];
    const GpuStep& b = split->steps[at + 2];
    EXPECT_EQ(split->steps[at + 3].kind, K::kJoin);
    ASSERT_EQ(a.kind, K::kGemm);
    ASSERT_EQ(b.kind, K::kGemm);
    EXPECT_EQ(a.shard, 0);
    EXPECT_EQ(b.shard, 1);
    EXPECT_EQ(a.in[0], w.in[0]);  // both read the whole input
    EXPECT_EQ(b.in[0], w.in[0]);
    EXPECT_EQ(a.gemm.n + b.gemm.n, w.gemm.n);
    EXPECT_EQ(a.gemm.n % 8, 0);
    EXPECT_EQ(a.gemm.epilogue, w.gemm.epilogue);
    // Each shard's weight and bias are the whole's columns.
    const Tensor& ww = whole->blobs[w.weight_slots[0]].data;
    const bool t = w.gemm.transpose_w;
    const Tensor& wa = split->blobs[a.weight_slots[0]].data;
    const Tensor& wb = split->blobs[b.weight_slots[0]].data;
    EXPECT_EQ(split->blobs[a.weight_slots[0]].shard, -1);
    if (!t) {
      EXPECT_EQ(ColumnsOf(wa, 0, a.gemm.n), ColumnsOf(ww, 0, a.gemm.n));
      EXPECT_EQ(ColumnsOf(wb, 0, b.gemm.n), ColumnsOf(ww, a.gemm.n, w.gemm.n));
    } else {
      ASSERT_EQ(wa.byte_size() + wb.byte_size(), ww.byte_size());
      EXPECT_EQ(std::memcmp(wa.data(), ww.data(), wa.byte_size()), 0);
      EXPECT_EQ(std::memcmp(wb.data(), static_cast<const char*>(ww.data()) + wa.byte_size(),
                            wb.byte_size()),
                0);
    }
    const Tensor& bias = whole->blobs[w.weight_slots[1]].data;
    const Tensor& ba = split->blobs[a.weight_slots[1]].data;
    const Tensor& bb = split->blobs[b.weight_slots[1]].data;
    ASSERT_EQ(ba.byte_size() + bb.byte_size(), bias.byte_size());
    EXPECT_EQ(std::memcmp(ba.data(), bias.data(), ba.byte_size()), 0);
    EXPECT_EQ(std::memcmp(bb.data(), static_cast<const char*>(bias.data()) + ba.byte_size(),
                          bb.byte_size()),
              0);
    EXPECT_THAT(split->blobs[b.weight_slots[0]].key, ::testing::HasSubstr("|cols "));
    // The columns placed into the output at their offsets.
    const GpuStep& pa = split->steps[at + 4];
    const GpuStep& pb = split->steps[at + 5];
    ASSERT_EQ(pa.kind, K::kPlace);
    ASSERT_EQ(pb.kind, K::kPlace);
    EXPECT_EQ(pa.in[0], a.out);
    EXPECT_EQ(pb.in[0], b.out);
    EXPECT_EQ(pa.out, w.out);
    EXPECT_EQ(pb.out, w.out);
    EXPECT_EQ(pa.start, 0);
    EXPECT_EQ(pb.start, a.gemm.n);
    EXPECT_EQ(pa.axis, 1);
    // Run concurrently: the two shards' columns and the input all apart.
    const std::vector<int> apart = {a.out, b.out, w.in[0]};
    for (size_t i = 0; i < apart.size(); ++i)
      for (size_t j = i + 1; j < apart.size(); ++j)
        EXPECT_FALSE(Overlap(split->values[apart[i]], split->values[apart[j]]))
            << "values " << apart[i] << " and " << apart[j];
    // The product's output apart from both shards' columns: placing one must not overwrite
    // the other before it is placed. (It may share the input's bytes: the input is dead
    // once the shards have joined.)
    for (int columns : {a.out, b.out})
      EXPECT_FALSE(Overlap(split->values[w.out], split->values[columns]))
          << "the output and values " << columns;
    at += 6;
    if (w.post) {  // the activation the epilogue lacks, on the whole output
      ASSERT_LT(at, split->steps.size());
      EXPECT_EQ(split->steps[at].kind, K::kUnary);
      EXPECT_EQ(split->steps[at].unary, *w.post);
      ++at;
    }
  }
  EXPECT_EQ(at, split->steps.size());
  EXPECT_GT(expected_splits, 0);
  EXPECT_LT(expected_splits, 4);  // the last product, of one column, stays whole
  EXPECT_EQ(split->split_products, expected_splits);
  EXPECT_EQ(split->shards, 2);
  EXPECT_EQ(split->shard_arena_bytes, (std::vector<int64_t>{0, 0}));
  ExpectAligned(*split);
}

// A shard with memory of its own (another device) copies the product's input into its
// arena, computes its columns there from weights kept on its device, and copies them back;
// in fp16, the input is rounded once, before the fork, and each shard's weight is stored
// 16-bit.
TEST(LowerPlanTest, AShardWithMemoryOfItsOwnCopiesItsInputInAndItsColumnsBack) {
  Prepared p = Prepare(Model::Load(Example("recommender")), {{8, 64}});
  ASSERT_TRUE(p.plan);
  for (GemmMath math : {GemmMath::kFp32, GemmMath::kFp16}) {
    SCOPED_TRACE(math == GemmMath::kFp32 ? "fp32" : "fp16");
    GpuPlanOptions options;
    options.math = math;
    options.tensor_parallel.shards = 3;
    options.tensor_parallel.min_columns = 100;
    options.tensor_parallel.own_memory = {false, true, true};
    auto l = LowerPlan(p.model->graph(), *p.plan, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    using K = GpuStep::Kind;
    const auto fork = std::find_if(l->steps.begin(), l->steps.end(),
                                   [](const GpuStep& s) { return s.kind == K::kFork; });
    ASSERT_NE(fork, l->steps.end());
    const size_t f = static_cast<size_t>(fork - l->steps.begin());
    if (math == GemmMath::kFp16) {
      ASSERT_GT(f, 0u);
      EXPECT_EQ(l->steps[f - 1].kind, K::kToHalf);  // rounded once for every shard
    }
    // Shard 0 shares the plan's memory: one GEMM. Shards 1 and 2: copy in, GEMM, copy out.
    ASSERT_LT(f + 9, l->steps.size());
    const GpuStep& g0 = l->steps[f + 1];
    EXPECT_EQ(g0.kind, K::kGemm);
    EXPECT_EQ(g0.shard, 0);
    int64_t columns = g0.gemm.n;
    for (int shard : {1, 2}) {
      SCOPED_TRACE("shard " + std::to_string(shard));
      const size_t i = f + 2 + 3 * static_cast<size_t>(shard - 1);
      const GpuStep& in = l->steps[i];
      const GpuStep& gemm = l->steps[i + 1];
      const GpuStep& out = l->steps[i + 2];
      ASSERT_EQ(in.kind, K::kCopy);
      ASSERT_EQ(gemm.kind, K::kGemm);
      ASSERT_EQ(out.kind, K::kCopy);
      EXPECT_EQ(in.shard, shard);
      EXPECT_EQ(gemm.shard, shard);
      EXPECT_EQ(out.shard, shard);
      EXPECT_EQ(in.in[0], g0.in[0]);
      EXPECT_EQ(gemm.in[0], in.out);
      EXPECT_EQ(out.in[0], gemm.out);
      const GpuValue& x = l->values[in.out];
      const GpuValue& y = l->values[gemm.out];
      EXPECT_EQ(x.home, GpuValue::Home::kShard);
      EXPECT_EQ(x.shard, shard);
      EXPECT_EQ(x.offset, 0);
      EXPECT_EQ(y.home, GpuValue::Home::kShard);
      EXPECT_EQ(y.shard, shard);
      EXPECT_GE(y.offset, x.bytes);
      EXPECT_LE(y.offset + y.bytes, l->shard_arena_bytes[static_cast<size_t>(shard)]);
      EXPECT_EQ(l->dtypes[in.out], l->dtypes[g0.in[0]]);
      EXPECT_EQ(l->values[out.out].home, GpuValue::Home::kArena);
      const GpuLowering::Blob& w = l->blobs[gemm.weight_slots[0]];
      EXPECT_EQ(w.shard, shard);
      EXPECT_EQ(l->blobs[gemm.weight_slots[1]].shard, shard);
      if (math == GemmMath::kFp16) {
        EXPECT_EQ(w.data.dtype(), DataType::kFp16);
        EXPECT_THAT(w.key, ::testing::EndsWith("~fp16"));
      }
      columns += gemm.gemm.n;
    }
    EXPECT_EQ(l->steps[f + 8].kind, K::kJoin);
    // The shards run concurrently: what any of them writes on the plan's device keeps clear
    // of the input shard 0 may still be reading, and of each other.
    std::vector<int> written;
    for (size_t i = f + 1; i < f + 8; ++i)
      if (l->values[l->steps[i].out].home == GpuValue::Home::kArena)
        written.push_back(l->steps[i].out);
    EXPECT_EQ(written.size(), 3u);  // shard 0's columns, and shards 1's and 2's copied back
    for (size_t i = 0; i < written.size(); ++i) {
      EXPECT_FALSE(Overlap(l->values[written[i]], l->values[g0.in[0]])) << "value " << written[i];
      for (size_t j = i + 1; j < written.size(); ++j)
        EXPECT_FALSE(Overlap(l->values[written[i]], l->values[written[j]]));
    }
    EXPECT_EQ(columns, l->steps[f + 9].dims[1]);  // the output's columns, all placed
    EXPECT_EQ(l->shard_arena_bytes[0], 0);
    EXPECT_GT(l->shard_arena_bytes[1], 0);
    EXPECT_GT(l->shard_arena_bytes[2], 0);
    ExpectAligned(*l);
  }
  // Where the input dies before the last shard's columns come back, they still do not take
  // its bytes: shard 0 may be reading them.
  Prepared wide = Prepare(Model::FromGraph(WideIntoNarrowGraph()), {{4, 512}});
  ASSERT_TRUE(wide.plan);
  GpuPlanOptions options;
  options.tensor_parallel.shards = 3;
  options.tensor_parallel.min_columns = 16;
  options.tensor_parallel.own_memory = {false, true, true};
  auto l = LowerPlan(wide.model->graph(), *wide.plan, options);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->split_products, 1);
  int x = -1, written = 0;
  for (const GpuStep& step : l->steps) {
    if (step.kind == GpuStep::Kind::kGemm && step.shard == 0) x = step.in[0];
    if (step.shard < 0 || step.out < 0 || l->values[step.out].home != GpuValue::Home::kArena)
      continue;
    ASSERT_GE(x, 0);
    EXPECT_FALSE(Overlap(l->values[step.out], l->values[x])) << "value " << step.out;
    ++written;
  }
  EXPECT_EQ(written, 3);
}

}  // namespace
}  // namespace shoal::engine::cuda
