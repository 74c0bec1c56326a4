// Lowering: the CPU engine's Plan for one set of input shapes (engine/plan.h), mapped onto
// the GPU path's kernels. Pure host work, tested on machines without a device;
// gpu_plan.h runs what it produces.
//
// The CPU plan does the work that does not depend on the device: it checks every node,
// infers every value's shape and dtype for these input shapes, and folds what the shapes
// decide (Shape -> Gather -> Concat -> Reshape chains) into constants. Lowering then walks
// its steps (docs/gpu.md has the whole table):
//   - a view (Reshape, Flatten, Squeeze, Unsqueeze, Identity) takes the bytes of the value
//     it views, as on the CPU;
//   - Gemm, MatMul and the optimiser's fused products become cuBLASLt GEMMs (gemm.h), batched
//     with Transpose steps for attention's transposed views; convolutions become im2col and
//     one GEMM per group, or cuDNN's convolution (GpuPlanOptions::conv);
//   - the other operators run shoal's own kernels (elementwise.h, layout.h, reduce.h,
//     normalization.h, conv.h);
//   - anything else is refused with UNIMPLEMENTED naming every such node and why, so a
//     model that cannot run on the GPU fails when it loads, not when it serves.
//
// Tensor parallelism (TensorParallelOptions): a product with a constant 2-D weight and
// enough output columns is split column-wise into one product per shard. Each shard holds
// its columns of the weight and the bias and runs on a stream of its own (on another
// device, or on the plan's); a kFork step starts the shard streams after what came before,
// a kJoin step waits for all of them, and each shard's columns are then placed into the
// output (kPlace), where any activation the epilogue lacks and the residual follow. A
// shard with memory of its own (another device) first copies the product's input to its
// device and its columns back (kCopy).
//
// Memory: the constants the steps read are blobs keyed by their content (GpuWeights in
// gpu_plan.h uploads each once). Graph inputs, intermediates, temporaries and graph
// outputs share one arena, their offsets from the engine's memory planner
// (memory_planner.h): values whose lifetimes do not overlap share bytes. Every offset is a
// multiple of kGemmAlignmentBytes, so any value may be a GEMM operand.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/conv.h"
#include "engine/cuda/cudnn.h"
#include "engine/cuda/elementwise.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/layout.h"
#include "engine/cuda/recurrent.h"
#include "engine/cuda/reduce.h"
#include "engine/graph.h"
#include "engine/model.h"
#include "engine/plan.h"

namespace shoal::engine::cuda {

// Splitting the large products across shards (docs/gpu.md, "Tensor parallelism").
struct TensorParallelOptions {
  // The shards a product is split into; 1: no product is split.
  int shards = 1;
  // Only products with at least this many output columns (N) are split.
  int64_t min_columns = 1024;
  // Per shard, true when its product runs in memory of its own: on another device, where
  // it reads a copy of the product's input and writes its columns into its own arena,
  // copied back to the plan's device after. Shards past the end share the plan's memory
  // (all of them, when empty). Shard 0 is usually the plan's own device.
  std::vector<bool> own_memory;
  bool OwnMemory(int shard) const {
    return shard >= 0 && static_cast<size_t>(shard) < own_memory.size() && own_memory[shard];
  }
};

// How a plan's 2-D convolutions run.
enum class ConvEngine {
  kIm2Col,  // im2col into a temporary and one cuBLASLt GEMM per group
  kCudnn,   // cuDNN's convolution (cudnn.h); the plan then needs cuDNN where it is created
};

struct GpuPlanOptions {
  // How the products (GEMMs, convolutions) are computed. Every value between them stays
  // fp32 in memory, and so do every other operator and the model's inputs and outputs:
  //   kFp32, kTf32  the products read fp32 (TF32 rounds their mantissas to 10 bits);
  //   kFp16, kBf16  mixed precision: the weights are stored 16-bit, each product's input
  //                 is rounded to 16 bits as it is made (a cast step, im2col writing
  //                 16-bit columns, or the step that wrote the value writing its rounding
  //                 beside it), and the tensor cores accumulate and write fp32, bias and
  //                 activation fused as in fp32; except that a value passed only from one
  //                 product or cuDNN convolution to the next is written in 16 bits alone
  //                 (a product then with a 16-bit bias). (The CPU's bf16 tier rounds the
  //                 same way, but only products with a constant weight.)
  GemmMath math = GemmMath::kFp32;
  // Run the copies and the steps as a CUDA graph: the plan's first run goes step by step,
  // its second captures the graph and later runs replay it, so a run costs one launch
  // instead of one per kernel and copy (a plan's pointers, its staging buffer's included,
  // never change). A failed capture falls back to step by step for good.
  bool cuda_graph = true;
  TensorParallelOptions tensor_parallel;
  // kCudnn: convolutions on cuDNN, with the bias and ReLU (a Conv's, or ResNet's residual
  // and ReLU) fused into it in fp32 and TF32; a convolution cuDNN cannot take (pads that
  // differ at the two ends, a tanh-GELU) keeps to im2col. The backend asks for kCudnn when
  // cuDNN loads (gpu_convolution in docs/gpu.md).
  ConvEngine conv = ConvEngine::kIm2Col;
  // How each cuDNN convolution's algorithm is chosen when the plan is created: kMeasured
  // runs every candidate cuDNN's heuristics rank on the plan's own buffers and keeps the
  // fastest; kHeuristic keeps the first ranked (config gpu_convolution_algorithm).
  CudnnAlgorithmSearch conv_search = CudnnAlgorithmSearch::kMeasured;
  // In fp16 and bf16 on cuDNN: the 16-bit values that only cuDNN convolutions (as x), 16-bit
  // max pools between them and convolution epilogues (their 16-bit input, or residual) read
  // are stored channels last (NHWC), the layout cuDNN's tensor-core kernels read and write
  // without transposing; the convolutions then run NHWC, their weights stored [m, kh, kw,
  // c/groups], and their 16-bit outputs are NHWC for the epilogues. Every fp32 value stays
  // NCHW. false: all NCHW (config gpu_convolution_layout nchw).
  bool channels_last = true;
  // int8 (config gpu_precision int8; quantize.h has the arithmetic), with `math` kFp32: the
  // ranges, by value name, that Calibrate measured on the fp32 model. A product with a
  // constant 2-D weight (MatMul, Gemm, their fused forms) or a convolution with one group
  // then runs as an int8 GEMM where its input has a range here, its k and n are multiples of
  // 8, it has int8_min_rows rows or more and its activation is not the tanh GELU: the input
  // quantised per tensor (a kQuantize step, shared by the products reading one value, or
  // im2col quantising as it gathers), the weight per output column, the int32 sums scaled
  // back to fp32 with the bias and any ReLU in one pass, the rest as in fp32. Such
  // convolutions leave cuDNN for im2col. Every other product, and every other operator,
  // stays fp32, the products each named with why in GpuLowering::fp32_products. Null: no
  // int8.
  std::shared_ptr<const Calibration> int8_calibration;
  // int8: products of fewer rows (m: a MatMul's batch rows, a convolution's n·oh·ow) stay
  // fp32. cuBLASLt's int8 kernels are known to lack some shapes of few rows (PyTorch's
  // _int_mm refuses 16 or fewer), and a product that small gains little from int8.
  int64_t int8_min_rows = 17;
};

// Where a value's bytes are on the device.
struct GpuValue {
  enum class Home { kNone, kArena, kWeights, kShard };
  Home home = Home::kNone;  // kNone: no step reads or writes it
  // kArena: its offset; kWeights: the index of its blob; kShard: its offset in the arena of
  // shard `shard` (a tensor-parallel shard with memory of its own).
  int64_t offset = 0;
  int64_t bytes = 0;  // its data, unpadded
  int shard = -1;     // kShard
};

// ScatterElements' and ScatterND's `reduction`, as the CPU engine's.
enum class ScatterReduction { kNone, kAdd, kMul, kMax, kMin };

// One kernel launch (or a GEMM with its follow-ups) of a lowered plan.
struct GpuStep {
  enum class Kind {
    kGemm,
    kUnary,
    kBinary,
    kSoftmax,
    kLayerNorm,
    kTranspose,
    kGather,
    kSlice,
    kReduce,
    kCast,
    kIm2Col,
    kPool,
    kPlace,
    kPad,
    kStridedSlice,
    kToHalf,
    kCompare,
    kWhere,
    kConvTranspose,
    kResize,
    kMod,
    kArgExtreme,
    kRoiAlign,
    kGridSample,
    kFloatToInt,  // Cast from fp32 to int64 or int32 (the output's dtype)
    kGatherElements,
    kScatterElements,
    kScatterNd,
    kCumSum,
    kTrilu,
    kFork,  // tensor parallelism: every shard stream waits for the plan's stream
    kJoin,  // the plan's stream waits for every shard stream
    kCopy,  // in[0]'s bytes copied to out (between a shard's device and the plan's)
    // Recurrent operators (recurrent.h), around kGemm steps for their products:
    kRnnStateIn,    // out [batch, hidden] = direction rnn.dir's initial state in[0], or zeros
    kRnnStateOut,   // direction rnn.dir's rows of out (Y_h, Y_c) = in[0]
    kGruReset,      // a GRU without linear-before-reset: z into in[0] (xw), out = r * h
    kRnnCell,       // one step: h, c updated in place, out (Y, or -1) written at its time
    kZero,          // out's bytes set to zero (Y before a run with sequence_lens)
    kLogical,       // And, Or, Xor of bools {a, b}, or Not {a}
    kGatherNd,      // GatherND {data, indices}
    kTopK,          // TopK {x}: out is its values (fp32) or its indices (int64)
    kIntCast,       // Cast among int64, int32 and bool, or fp32 to bool {x}
    kConv,          // cuDNN's convolution {x, residual or -1} as `conv` says
    kConvEpilogue,  // what a convolution's step left {c, residual or -1}, as `conv_epilogue` says
    kQuantize       // out (int8) = x quantised: inverse scale `alpha`, `zero_point` (quantize.h)
  };
  Kind kind = Kind::kUnary;
  int node = -1;  // the graph node it runs
  // kGather, kMod, kRoiAlign, kGatherElements, kGatherNd, kScatterElements, kScatterNd, kRnnCell:
  // its slot in the plan's error flags (GpuLowering::flag_nodes), which its kernel raises for bad
  // data; -1 for the others.
  int flag = -1;
  // The tensor-parallel shard whose stream (and device) runs it; -1: the plan's stream.
  // Steps of different shards between a kFork and its kJoin run concurrently.
  int shard = -1;
  // Values it reads, by kind: kGemm {x, w or -1, -1, residual or -1}; kUnary, kSoftmax,
  // kTranspose, kSlice, kReduce, kCast {x}; kBinary {a, b}; kLayerNorm {x, scale, bias or
  // -1}; kGather {data, indices}; kIm2Col, kPool, kToHalf {x}; kCompare {a, b}; kWhere
  // {cond, a, b}; kConvTranspose {x, w, bias or -1}; kResize {x}, its tap tables the weight
  // slots {idx, w}; kMod {a, b}; kArgExtreme {x}; kRoiAlign {x, rois, batch indices};
  // kGridSample {x, grid}; kGatherElements {data, indices}; kScatterElements, kScatterNd
  // {data, indices, updates}; kCumSum, kTrilu {x};
  // kFloatToInt {x}; kCopy {x}; kFork and kJoin nothing (out -1); kRnnStateIn {initial or -1};
  // kRnnStateOut {state}; kGruReset {xw, hr, h, sequence_lens or -1}; kRnnCell {xw, hr, hr_h or -1,
  // h, c or -1, sequence_lens or -1}, with a linear-before-reset GRU's R bias of the h gate and an
  // LSTM's peepholes as weight slots {rbh or -1, p or -1}, and hr's row length in `length`;
  // kZero nothing. A kLayerNorm whose scale is -1
  // reads it from weight slot 0 (ones, for Instance- and GroupNormalization, whose affine follows).
  // kToHalf rounds an fp32 value into its 16-bit output (the type of `out`, kFp16 or kBf16), and
  // kIm2Col writes 16-bit columns when its output is 16-bit: a mixed-precision plan's GEMM
  // operands, or int8 columns quantised (`alpha`, `zero_point`) when it is int8 (gathered
  // from int8 x, x's zero point in the padding, when x is int8: a writer's half_out). A
  // kGemm whose gemm.math is kInt8 reads int8 x (a kQuantize step's or kIm2Col's), sums into
  // its int32 `scratch`, then writes out = scales · sums + bias, ReLU'd with `int8_relu`,
  // its weight slots {w int8 [n, k], bias (less the zero point's share, quantize.h's
  // Int8Bias) or -1, scales (fp32, one per column: the input's scale times the column's)};
  // its `post` and residual follow as in fp32. An int8 convolution's kGemm instead writes
  // its int32 sums as out ([rows, n], no scratch; weight slots {w, -1, -1}), and a
  // kConvEpilogue reading them (ConvEpilogueOptions::int32_sums) does the rest, its weight
  // slots {bias' or -1, scales}. A kPool whose output is
  // 16-bit is a max pool of 16-bit x of the same type. A constant GEMM weight and the bias are
  // weight slots (`weight_slots`), not values, because they are stored transformed; so is a
  // kBinary's b when it is -1 (a grouped convolution's bias, shaped [m, 1, 1]). Values past the
  // graph's are the lowering's own temporaries (a transposed operand, a product before its output
  // transpose).
  std::vector<int> in;
  int out = -1;
  GemmOptions gemm;                          // kGemm
  std::optional<UnaryOp> post;               // kGemm: an activation the epilogue lacks
  BroadcastPlan residual;                    // kGemm with a residual: its broadcast onto out
  UnaryOp unary = UnaryOp::kRelu;            // kUnary
  BinaryOp binary = BinaryOp::kAdd;          // kBinary
  BroadcastPlan broadcast;                   // kBinary, kCompare
  CompareOp compare = CompareOp::kEqual;     // kCompare
  LogicalOp logical = LogicalOp::kAnd;       // kLogical
  internal::GatherNdIndex gather_nd;         // kGatherNd
  bool int64_operands = false;               // kCompare, kMod: a and b are int64, not fp32
  bool fmod = false;                         // kMod: the remainder takes the dividend's sign
  bool arg_max = true, select_last = false;  // kArgExtreme (ArgMin when !arg_max)
  WherePlan where;                           // kWhere
  RoiAlignGeometry roi;                      // kRoiAlign
  GridGeometry grid;                         // kGridSample
  // kScatterElements, kScatterNd: how an update combines with the element it names.
  ScatterReduction scatter = ScatterReduction::kNone;
  // kScatterElements, kScatterNd with ScatterReduction::kNone: an int32 temporary of one
  // slot per output element, where the first pass records the last update naming each
  // element (so that one writes, as on the CPU); a kGemm in int8: its int32 sums; -1 for the
  // others. Live for the step alone.
  int scratch = -1;
  bool int8_relu = false;  // kGemm in int8: the scaling pass applies ReLU
  int zero_point = 0;      // kQuantize, an int8 kIm2Col: 0 or -128 (quantize.h's Int8Input)
  // An int8 half_out (below): quantised with this inverse scale and zero point (quantize.h).
  float int8_inv_scale = 0;
  int int8_zero_point = 0;
  bool exclusive = false, reverse = false;  // kCumSum
  bool upper = true;                        // kTrilu (its k in `start`)
  ResizePlan resize;  // kResize (its tables moved into blobs); the extrapolation in alpha
  // kSoftmax, kLayerNorm: [rows, row length]; kSlice, kReduce, kArgExtreme: x's shape;
  // kPlace: out's; kGatherElements, kScatterElements: data's (the indices' shape is in[1]'s);
  // kScatterNd: data's (k is the indices' last dimension); kCumSum: [outer, axis, inner];
  // kTrilu: [matrices, rows, columns]. kSlice, kPlace and kStridedSlice move 4-byte words: an
  // 8-byte element (int64) is two, its dims (and kPlace's `words`) carry a trailing 2.
  int64_t words = 1;  // kPlace: 4-byte words per element, for x's dims at run time
  std::vector<int64_t> dims;
  float epsilon = 0;        // kLayerNorm
  TransposePlan transpose;  // kTranspose
  GatherPlan gather;        // kGather
  // kGemm: the blobs of w and bias, or -1; kBinary: b's when in[1] is -1.
  std::vector<int64_t> weight_slots;
  // kGatherElements, kScatterElements: the axis (non-negative); kTrilu: k in `start`.
  // kSlice: x[.., start : start + length, ..] along `axis`; kPlace: x written into out at
  // [start, start + x's length) along `axis` (one of Concat's inputs); kReduce: axes
  // [axis, axis + length).
  int64_t axis = 0, start = 0, length = 0;
  ReduceOp reduce = ReduceOp::kSum;      // kReduce
  CastSource cast = CastSource::kInt64;  // kCast
  // kUnary, and kGemm's `post`: the activation's parameters (elementwise.h); kPad: the
  // padding value in alpha; kQuantize and an int8 kIm2Col: the inverse scale in alpha.
  float alpha = 0.f, beta = 0.f;
  PadPlan pad;                 // kPad
  SlicePlan slice;             // kStridedSlice (ONNX Slice)
  Window2d window;             // kIm2Col, kPool, kConvTranspose (its output channels in length)
  PoolOp pool = PoolOp::kMax;  // kPool
  bool log_softmax = false;    // kSoftmax: LogSoftmax
  RnnGeometry rnn;             // kRnnStateIn, kRnnStateOut, kGruReset, kRnnCell
  // kConv: the window, output channels, math and fusion; its weight (16-bit in fp16 and
  // bf16, as x and y then are; stored [m, kh, kw, c/groups] when it runs channels last) and,
  // fused, its bias are weight slots {w, bias or -1}.
  CudnnConvOptions conv;
  // kConvEpilogue: out = post(act(c + bias) + residual) in one pass (conv.h), c the
  // convolution's output (out itself, or a 16-bit cuDNN output), the bias weight slot 0 (one
  // fp32 value per channel) or -1.
  ConvEpilogueOptions conv_epilogue;
  // kConvEpilogue, kLayerNorm, kUnary, kBinary, kSoftmax, kTranspose, kReduce, and kGemm with
  // a `post` and no residual, in mixed precision: a 16-bit value the step also writes, its
  // result rounded (the rounding a later product reads, which would otherwise be a kToHalf
  // step of its own; with the shape of a view of the result, when the product reads through
  // one), or -1. Then a kConvEpilogue whose c is a 16-bit cuDNN output, a kUnary, kBinary,
  // kSoftmax, kTranspose or kReduce, whose fp32 result nothing reads, has out -1.
  // In int8 (Lowerer::KeepValuesInt8), the same steps and a kGemm in int8 that scales its
  // sums with nothing after: an int8 value, the result quantised (int8_inv_scale,
  // int8_zero_point) for the int8 products that read it (a kGemm in int8, or an int8 kIm2Col
  // gathering from int8 x), instead of their own kQuantize; out is -1 where nothing else
  // reads the fp32 result and the step can write the int8 copy alone (a kConvEpilogue
  // reading int32 sums, a kGemm scaling its sums, and the kinds above that can).
  int half_out = -1;
  // kToHalf: its 16-bit output channels last (NHWC; x is NCHW, rank 4); kPool (16-bit): x and
  // out NHWC. (GpuLowering::channels_last.)
  bool channels_last = false;
};

struct GpuLowering {
  std::vector<GpuStep> steps;
  std::vector<GpuValue> values;  // per value: the graph's, then the lowering's temporaries
  // The constants the steps read, each with a key that names its content, so the plans of
  // one model for other input shapes find the same device copy (GpuWeights): a graph
  // constant by its value ("v12"), a value the CPU plan folded for these shapes by its
  // value, shape and a hash of its bytes ("v40@[8,2]#9f3c..."), then any transformation
  // ("v12*0.5", ":chw", "~fp16" for a weight stored in 16 bits); "zeros64" for a zero bias.
  // A tensor-parallel shard's columns of a weight or bias are keyed with the columns they
  // hold ("v12|cols 0:2048"), and live on that shard's device when it has memory of its own.
  struct Blob {
    std::string key;
    Tensor data;
    int shard = -1;  // >= 0: uploaded to that shard's device (TensorParallelOptions)
  };
  std::vector<Blob> blobs;
  int64_t weight_bytes = 0;  // the blobs' bytes
  int64_t arena_bytes = 0;
  int64_t workspace_bytes = 0;  // the GEMMs' shared scratch (and each shard's own)
  // Tensor parallelism: the shards the split products use (1: none split), and per shard
  // the arena it needs on its own device (0 for a shard that shares the plan's memory).
  int shards = 1;
  std::vector<int64_t> shard_arena_bytes;
  std::vector<bool> shard_own_memory;  // per shard: TensorParallelOptions::OwnMemory
  int split_products = 0;              // products split across the shards
  // int8 (GpuPlanOptions::int8_calibration): the products and convolutions that run in int8,
  // and those kept fp32, each described with why ("node 'fc' (Gemm): k = 8 and n = 10 must
  // be multiples of 8 for cuBLASLt's int8 kernels").
  int int8_products = 0;
  std::vector<std::string> fp32_products;
  // Per error flag slot (GpuStep::flag), the node whose kernel raises it, described as
  // errors name nodes ("node 'idx' (Gather)"): a run that finds a slot raised names it.
  std::vector<std::string> flag_nodes;
  bool cuda_graph = true;        // GpuPlanOptions::cuda_graph
  std::vector<int> inputs;       // graph.inputs
  std::vector<int> outputs;      // graph.outputs
  std::vector<DataType> dtypes;  // per value, as `values`
  std::vector<Shape> shapes;
  // Per value (empty: none): its bytes are channels last, NHWC for its NCHW shape. Only the
  // 16-bit values passed between cuDNN convolutions (GpuPlanOptions::channels_last).
  std::vector<bool> channels_last;
  bool ChannelsLast(int v) const {
    return v >= 0 && static_cast<size_t>(v) < channels_last.size() && channels_last[v];
  }
};

// int8 (GpuPlanOptions::int8_calibration): "3 of 4 products and convolutions in int8", the
// rest being l.fp32_products.
std::string Int8Summary(const GpuLowering& l);

// The options of a CPU plan made to be lowered: fp32, every value in its plain layout.
inline PlanOptions GpuLoweringPlanOptions() {
  PlanOptions options;
  options.plain_layouts = true;
  return options;
}

// Lowers `plan`, prepared from `graph` with GpuLoweringPlanOptions(), onto the GPU
// path. Pure host work. UNIMPLEMENTED naming every node the GPU path cannot run yet, one
// per line ("node 'attn/MatMul' (shoal.FusedMatMul): a product of two computed tensors
// ..."); INTERNAL when the memory planner fails. `refused`, when given, receives those
// nodes' indices in plan order (empty when every node lowered).
StatusOr<GpuLowering> LowerPlan(const Graph& graph, const Plan& plan,
                                const GpuPlanOptions& options = {},
                                std::vector<int>* refused = nullptr);

// A model the GPU path runs in part: the nodes before the first it cannot run (a GPU
// stage), and the rest on the CPU engine (a CPU tail). Cut where pipeline stages are cut
// (engine/pipeline_split.h): the tail's inputs are the GPU stage's values it reads and the
// model's inputs it reads; the model's outputs come from either stage.
struct GpuCpuSplit {
  int cut = 0;                                 // the tail's first node (Model::graph())
  std::unique_ptr<Model> gpu_stage, cpu_tail;  // both loaded, as SplitModel loads stages
  std::vector<std::string> cpu_nodes;          // the nodes the GPU path refused, described
};

// The split of `model` whose GPU stage lowers with `options` at `shapes` (the model's input
// shapes, symbolic dimensions chosen): cut at the first node LowerPlan refuses there.
// FAILED_PRECONDITION when every node lowers (no tail is needed); UNIMPLEMENTED when the
// first node is refused (nothing would run on the GPU) or the GPU stage still fails to lower
// (naming its nodes); SplitModel's errors when the cut cannot be made (a value computed from
// shapes that crosses it).
StatusOr<GpuCpuSplit> SplitForGpu(const Model& model, const std::vector<Shape>& shapes,
                                  const GpuPlanOptions& options = {});

}  // namespace shoal::engine::cuda
