// Shared by the GPU plan's tests (gpu_lowering_test.cc, host only, and gpu_plan_test.cc, on
// a device): models prepared by the CPU engine as lowering takes them, and the small graphs
// both lower and run. A test helper, not part of any library.
#pragma once

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/gpu_lowering.h"
#include "engine/graph.h"
#include "engine/model.h"
#include "engine/plan.h"

namespace shoal::engine::cuda {

// A model with the CPU engine's plan for one set of input shapes, as lowering takes it.
struct Prepared {
  std::unique_ptr<Model> model;
  std::unique_ptr<Plan> plan;
};

dnnl::engine& CpuEngine();

Prepared Prepare(StatusOr<std::unique_ptr<Model>> model, const std::vector<Shape>& shapes);

std::string Example(const std::string& model);

// The 16-bit dtype a mixed-precision plan in `math` (kFp16, else kBf16) rounds to.
inline DataType HalfDtypeOf(GemmMath math) {
  return math == GemmMath::kFp16 ? DataType::kFp16 : DataType::kBf16;
}

// Expects every arena value of `l` at an offset GEMMs may read (kGemmAlignmentBytes).
void ExpectAligned(const GpuLowering& l);

// Embedding lookup, layer norm, a product with bias and ReLU (fused by the optimiser),
// a transpose, a softmax over the last axis, a reshape (a view of the softmax's bytes)
// and a scaling by a constant: one of every kind of GPU step.
Graph EveryKindGraph();

// Products whose alpha and beta are not 1: MatMul·0.5 + bias, ReLU (the optimiser fuses
// them into one shoal.FusedMatMul with alpha 0.5 and the bias divided by it), then
// Gemm(alpha 2, beta 0.5, transB) with a C row.
Graph ScaledProductsGraph();

// A grouped convolution (2 groups, stride 2, padding 1) with a bias, then ReLU (fused by
// the optimiser), and a 3x3 average pool that counts the padding, with ceil_mode.
Graph GroupedConvGraph();

// A stem convolution with its ReLU, then ResNet's identity block on its output y: two 3x3
// convolutions, the second's output plus y, then ReLU (the optimiser makes the second a
// shoal.FusedConv reading y as its residual). y is read twice: by the block's first
// convolution and as the residual (in 16 bits in a mixed-precision plan on cuDNN); with
// `y_also_read`, a Sigmoid reads y too, its output the graph's second. `channels`: the
// block's width (8 gives int8 convolutions: GpuPlanOptions::int8_calibration).
Graph IdentityBlockGraph(bool y_also_read = false, int64_t channels = 4);

// int8 values kept between convolutions: x [2, 8, 8, 8], its ReLU r, then a block of two
// 3x3 convolutions of 8 channels (int8 with GpuPlanOptions::int8_calibration): a ReLU after
// the first, r added to the second and a ReLU after the sum. r is read twice (by the first
// convolution and as the residual); the first's output only by the second.
Graph Int8ConvChainGraph();

// A convolution and its ReLU (y [2, 4, 8, 8]), a 3x3 max pool of stride 2 and padding 1,
// and a second convolution of the pooled values, its output the graph's. `variant`:
// "plain"; "pooled_output" and "y_output" also return the pooled values or y; "average"
// pools by AveragePool instead; "product" also returns x (the input) times a constant [8, 5]
// (a MatMul over its last axis), so that a product reads x's rounding too.
Graph PoolBetweenConvsGraph(const std::string& variant);

// x [1, 4, 8, 8], a convolution to 16 channels and its ReLU, y [1, 16, 8, 8] read through a
// Reshape as [1, 4, 16, 16] by a second convolution (4 channels out), whose output is the
// graph's: the second convolution reads a rounding of a view with another 4-D shape.
Graph ReshapeBetweenConvsGraph();

// x [4, 8] through `op` (Tanh; or Add, of a constant [8] broadcast over x's rows), then a
// MatMul by a constant [8, 4]: the product's output the graph's. `variant`: "alone";
// "output", op's output the graph's too; "view", the product reads op's output through a
// Reshape to [2, 16] (and its weight is [16, 4]).
Graph ActivationThenProductGraph(const std::string& variant, const std::string& op = "Tanh");

// Attention written with Einsums, as einops-style code exports it: x [2, 3, 5, 8] is Q,
// x * k_scale K and x + v_shift V; scores "bhqd,bhkd->bhqk", a Softmax, then the
// weighted sum "bhqk,bhkd->bhqd". The optimiser turns both Einsums into products.
Graph EinsumAttentionGraph();

// x [2, 3, 4, 5] through Softplus, Reciprocal, Elu (alpha 0.5) and PRelu (a slope per
// channel), added, then LogSoftmax over the last axis and ReduceL2, ReduceSumSquare,
// ReduceMin and ReduceProd over one or two adjacent axes: outputs logp [2, 3, 4, 5], l2 [2,
// 3, 4], sq [2, 1, 1, 5], lo [3, 4, 5] and prod [2, 3, 4]; x tiled [1, 2, 1, 3] (tiled, fp32)
// and, cast to int64, [2, 1, 1, 1] (ids); and x > 0, x < 0.5 (per last axis) combined by
// And, Or and Xor, and Not of the first (bools both, either, one, not); GatherND of x by
// the tuples (0, 2), (1, -1) (picked [2, 4, 5]) and, with batch_dims 1, of x by one index
// per batch row (rowpick [2, 4, 5]); x padded in edge mode (edge [2, 4, 7, 8]) and reflect
// mode, with opset 18's axes (mirror [2, 5, 7, 10]); ids cast to int32 and back (back), the
// positive mask to int64 (flag), x and ids to bool (nz, nb); the Max of x, inv and a row of
// five (top3); the two smallest along axis 1 by TopK,
// values low2 and indices low2_at [2, 2, 4, 5].
Graph MoreOperatorsGraph();

// Six element-wise steps in a row on one [64, 64] input.
Graph ChainGraph();

// A model's reference inputs (models/<name>.b4.sht) and shapes, prepared for lowering.
struct WithReference {
  Prepared prepared;
  std::vector<Tensor> inputs;
};

WithReference PrepareWithReference(const std::string& name, const std::string& suffix = ".b4.sht");

// int64 ids [2, 6]: a strided Slice (every other column from 1), concatenated after the ids
// along the columns, then a Split along the rows (one output: a copy). The copies move
// int64 elements as pairs of 4-byte words.
Graph Int64CopiesGraph(DataType dtype = DataType::kInt64);

// Expand of fp32 [3, 1] and of int64 [1, 4] (by a shape input) to [2, 3, 4]: one strided
// copy each, int64 in words.
Graph ExpandGraph();

// GatherElements of fp32 data [3, 4] along axis 0 by indices [2, 4], and of int64 data
// [3, 4] along axis -1 by indices [3, 2].
Graph GatherElementsGraph();
extern const std::vector<Shape> kGatherElementsShapes;

// ScatterElements of fp32 data [4, 3] along axis 0 by indices [2, 3], and ScatterND of it
// by index tuples [3, 1] (whole rows), both under `reduction`.
Graph ScatterGraph(const std::string& reduction);

extern const std::vector<Shape> kScatterShapes;

// CumSum of fp32 [2, 3, 4] along axis 1 (constant), along -1 exclusive and reversed, and of
// int64 [2, 5] along axis 1 reversed.
Graph CumSumGraph();
extern const std::vector<Shape> kCumSumShapes;

// Trilu of fp32 [2, 3, 4] (upper, no k; lower with k = 1) and of int64 [3, 3] (upper, k = -1).
Graph TriluGraph();
extern const std::vector<Shape> kTriluShapes;

// x [32, 8] read by two products: relu(x·w1 + b1) [32, 24] (w1 [8, 24], Random seed 71, b1
// seed 72) and x·w2ᵀ [32, 16] (Gemm with transB, w2 [16, 8], seed 73): both int8 products
// reading one quantisation of x (32 rows: more than GpuPlanOptions::int8_min_rows).
Graph TwoProductsOfOneInputGraph();

// The ranges (int8 calibration) of every value of `model` over four batches of its one
// input, `name` of `shape`, uniform in [lo, hi] (seeds 901 to 904).
std::shared_ptr<const Calibration> RandomInputRanges(const Model& model, const std::string& name,
                                                     const Shape& shape, float lo, float hi);

}  // namespace shoal::engine::cuda
