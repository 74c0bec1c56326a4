// Implementation details of LowerPlan (gpu_lowering.h), shared by the files that lower a
// plan: gpu_lowering.cc (the driver: value bookkeeping, arena planning, the dispatch over
// the plan's steps) and, by operator family, gpu_lowering_products.cc,
// gpu_lowering_elementwise.cc, gpu_lowering_layout.cc, gpu_lowering_recurrent.cc and
// gpu_lowering_int8.cc. Not part of the API.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/cuda/elementwise.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/gpu_lowering.h"
#include "engine/cuda/quantize.h"
#include "engine/cuda/reduce.h"
#include "engine/graph.h"
#include "engine/plan.h"

namespace shoal::engine::cuda::internal {

// `bytes` rounded up to a multiple of `alignment`.
int64_t PadTo(int64_t bytes, int64_t alignment);

constexpr int64_t kAlign = static_cast<int64_t>(kGemmAlignmentBytes);

// The element-wise operator of the ONNX operator named `op`; nullopt when it has none.
std::optional<UnaryOp> UnaryByName(std::string_view op);

// Steps that can write their result rounded (GpuStep::half_out: 16 bits, or an int8 copy) in their
// pass, and that rounding alone when nothing reads the fp32 result: an element-wise activation or
// arithmetic (a transformer's embeddings, summed before the first product), a softmax, a
// transpose (attention's heads, before their products), a reduction (a global average pool
// or a ReduceMean before a classifier's product).
inline bool RoundsAlone(GpuStep::Kind kind) {
  return kind == GpuStep::Kind::kUnary || kind == GpuStep::Kind::kBinary ||
         kind == GpuStep::Kind::kSoftmax || kind == GpuStep::Kind::kTranspose ||
         kind == GpuStep::Kind::kReduce;
}

// Lowers one step at a time; collects what it cannot lower instead of stopping at the
// first, so the load error lists every node.
class Lowerer {
 public:
  Lowerer(const Graph& graph, const Plan& plan, const GpuPlanOptions& options)
      : graph_(graph), plan_(plan), options_(options) {}

  StatusOr<GpuLowering> Run();
  // After Run: the nodes it could not lower (each step's node, in plan order), empty when
  // it lowered them all.
  const std::vector<int>& refused() const { return refused_; }

 private:
  // Each returns an error naming why the node cannot run on the GPU, or adds its step.
  Status LowerNode(int n);
  Status LowerProduct(int n);
  Status LowerUnary(int n, UnaryOp op, float alpha = 0.f, float beta = 0.f);
  Status LowerClip(int n);
  Status LowerBatchNorm(int n);
  Status LowerConcat(int n);
  Status LowerPad(int n);
  Status LowerSlice(int n);
  Status LowerBinary(int n, BinaryOp op);
  // A step of `kind` reading node n's inputs 0 and 1, broadcast onto its output 0.
  StatusOr<GpuStep> BroadcastStep(int n, GpuStep::Kind kind) const;
  Status LowerSoftmax(int n);
  Status LowerLayerNorm(int n);
  Status LowerTranspose(int n);
  Status LowerGather(int n);
  Status LowerSplit(int n);
  Status LowerReduce(int n, ReduceOp op);
  Status LowerCast(int n);
  Status LowerConv(int n);
  // y += bias per channel (NCHW), `bias` a known value of one fp32 value per channel: a
  // broadcast addition of a [m, 1, 1] blob, in place, for node n.
  Status AddChannelBias(int n, int y, int bias);
  Status LowerPool(int n);
  Status LowerCompare(int n, CompareOp op);
  // And, Or, Xor and Not of bools.
  Status LowerLogical(int n, LogicalOp op);
  // Tile of 4- or 8-byte elements: one strided copy (gpu_lowering_layout.cc).
  Status LowerTile(int n);
  // Node n's input 0 viewed as `in`, broadcast onto `out` (its output's bytes) by one strided
  // copy, as Expand; `what` ("a Tile") names it in the error.
  Status AddBroadcastCopy(int n, const Shape& in, const Shape& out, const char* what);
  Status LowerWhere(int n);
  Status LowerConvTranspose(int n);
  Status LowerResize(int n);
  Status LowerMod(int n);
  Status LowerArgExtreme(int n);
  Status LowerGroupNorm(int n);
  Status LowerDepthSpace(int n);
  Status LowerRoiAlign(int n);
  Status LowerExpand(int n);
  Status LowerGridSample(int n);
  Status LowerGatherElements(int n);
  Status LowerGatherNd(int n);
  // TopK of fp32 with K known: a step per output present (values, indices).
  Status LowerTopK(int n);
  // GatherElements' and GatherND's operands: data and int64 indices, 4- or 8-byte elements
  // (`what` names the operator in the error).
  Status CheckGather(int n, const char* what) const;
  // GatherElements' and ScatterElements' axis of node n, made non-negative, once indices of
  // shape `is` fit data of shape `xs` (one rank, no larger off the axis).
  StatusOr<int64_t> ElementsAxis(int n, const Shape& xs, const Shape& is) const;
  Status LowerScatter(int n);
  Status LowerCumSum(int n);
  Status LowerTrilu(int n);
  // RNN, GRU and LSTM (gpu_lowering_recurrent.cc).
  Status LowerRecurrent(int n);
  // The integers of known value `v` (int64 or int32); nullopt when it is computed.
  std::optional<std::vector<int64_t>> KnownInts(int v) const {
    const Tensor* t = Known(v);
    if (!t || (t->dtype() != DataType::kInt64 && t->dtype() != DataType::kInt32))
      return std::nullopt;
    std::vector<int64_t> ints;
    for (int64_t k = 0; k < t->element_count(); ++k)
      ints.push_back(t->dtype() == DataType::kInt64 ? t->values<int64_t>()[k]
                                                    : t->values<int32_t>()[k]);
    return ints;
  }
  // Node n's product `step` (its GEMM options, residual and post-activation set; `x` its
  // operand) split column-wise across the shards (TensorParallelOptions): `w` its fp32 weight
  // as the product reads it, keyed `w_key`, and its bias of N values (null for none), keyed
  // `b_key`.
  Status LowerSplitProduct(int n, GpuStep step, int x, const Tensor& w, const std::string& w_key,
                           const Tensor* bias, const std::string& b_key);
  // A new temporary of `shape` in the own arena of shard `shard`, at `offset`.
  int NewShardTemp(const Shape& shape, DataType dtype, int shard, int64_t offset) {
    const int v = NewTemp(shape, dtype);
    shard_values_[v] = {shard, offset};
    return v;
  }
  // A product whose B is computed, or that reads or writes through a transposed view:
  // cuBLASLt's strided batched GEMM, with Transpose steps for the views.
  Status LowerBatchedProduct(int n);
  // int8 (gpu_lowering_int8.cc): how node n's product (or convolution) of `rows` rows, inner
  // dimension k and `cols` output columns reads x in int8; or no scale when it stays fp32,
  // KeptFp32 then saying why: `refused` when not empty (what the caller found: a split, a
  // tanh GELU, groups), else k or cols not multiples of 8, too few rows
  // (GpuPlanOptions::int8_min_rows), a k whose sums could overflow int32, or x's range.
  Int8Input Int8ProductInput(int n, int x, int64_t rows, int64_t k, int64_t cols, bool convolution,
                             const std::string& refused);
  // int8 (GpuPlanOptions::int8_calibration): how value v is quantised (quantize.h's
  // Int8InputFor its calibrated range), or no scale with *why saying why it cannot be (no
  // range, a range of zeros).
  Int8Input Int8InputOf(int v, std::string* why) const;
  // Value v quantised to int8 as `in` says for node n's product: a kQuantize step's
  // temporary, made at v's first such read and shared by the later ones (v has one range).
  int Int8Operand(int n, int v, const Int8Input& in);
  // Node n's product, kept fp32 in an int8 plan, and why (GpuLowering::fp32_products).
  void KeptFp32(int n, const std::string& why) {
    if (options_.int8_calibration) out_.fp32_products.push_back(graph_.Describe(n) + ": " + why);
  }
  // Turns `step`, a node's kGemm (m, n, k and batch set, its epilogue kNone, kBias, kRelu or
  // kBiasRelu, x already int8 in in[0]), into an int8 product of `w` (fp32, stored [k, n],
  // or [n, k] with `transposed`; keyed `w_key`) with the bias `bias` (n values, keyed
  // `b_key`, or null) and its input quantised as `in` says, and adds it, writing `out`:
  // scaled into fp32, or, when `out` is int32 (a convolution's), its sums alone, the scaling
  // left to the step that reads them. Returns the blobs of the bias the scaling adds (less
  // the zero point's share; -1 for none) and of the scales.
  struct Int8Scaling {
    int64_t bias = -1, scales = -1;
  };
  Int8Scaling AddInt8Gemm(GpuStep step, const Tensor& w, bool transposed, const std::string& w_key,
                          const Tensor* bias, const std::string& b_key, const Int8Input& in,
                          int out);
  // int8, once every node is lowered: a step that quantises an fp32 value for an int8
  // product (a kQuantize, an int8 kIm2Col) whose writer can write it quantised in its own
  // pass (a kConvEpilogue, a layer norm, an element-wise step, a softmax, a transpose, a
  // reduction, a product's activation step, or a kGemm in int8 scaling into fp32 with
  // nothing after it) reads that writer's int8 copy (an int8 GpuStep::half_out) instead: a
  // kQuantize step goes, a kIm2Col gathers int8. The copy is what the step would have
  // quantised, bit for bit. A writer whose fp32 result nothing else reads (a graph output
  // counts as read) stops writing it where its kernel can, so values passed only between
  // int8 convolutions are written once, in int8, as the CPU's int8 tier keeps them.
  void KeepValuesInt8();

  Status Fail(int n, std::string_view why) const {
    return Unimplemented(graph_.Describe(n) + ": " + std::string(why));
  }
  // A reference into out_.shapes, which NewTemp may move: copy it before adding a temporary.
  const Shape& ShapeOf(int v) const { return out_.shapes[v]; }
  DataType DtypeOf(int v) const { return out_.dtypes[v]; }
  // The data of a value known when the plan was prepared; null for the others and for
  // the lowering's temporaries.
  const Tensor* Known(int v) const {
    return v < static_cast<int>(graph_.values.size()) ? plan_.KnownData(v) : nullptr;
  }
  // A step of `kind` for node n, for the caller to fill and add to out_.steps.
  static GpuStep NewStep(GpuStep::Kind kind, int n) {
    GpuStep step;
    step.kind = kind;
    step.node = n;
    return step;
  }
  // 4-byte words per element of value v for the copying kernels (Split, Concat, Slice): 1
  // for fp32 and int32, 2 for int64 (moved as pairs of words); 0 for the other types.
  int64_t WordsOf(int v) const {
    const size_t size = DataTypeSize(DtypeOf(v));
    return size == 4 || size == 8 ? static_cast<int64_t>(size / 4) : 0;
  }
  // `dims` with a trailing axis of `words` when an element is more than one word.
  static Shape InWords(Shape dims, int64_t words) {
    if (words > 1) dims.push_back(words);
    return dims;
  }
  // A new error flag slot for node n's step (GpuLowering::flag_nodes).
  int NewFlag(int n) {
    out_.flag_nodes.push_back(graph_.Describe(n));
    return static_cast<int>(out_.flag_nodes.size()) - 1;
  }
  // A new value of `shape` that only the lowering's steps read and write.
  int NewTemp(const Shape& shape, DataType dtype = DataType::kFp32) {
    out_.shapes.push_back(shape);
    out_.dtypes.push_back(dtype);
    alias_of_.push_back(-1);
    return static_cast<int>(out_.shapes.size()) - 1;
  }
  // A Transpose step of `x` by `perm` into a new temporary, for node n; the temporary.
  StatusOr<int> AddTranspose(int n, int x, const std::vector<int64_t>& perm);
  bool IsFp32(int v) const { return v >= 0 && DtypeOf(v) == DataType::kFp32; }
  // Every present input and output 0 in fp32, plain layout.
  Status CheckFp32(int n) const;
  // Every present input in its plain layout, and only output 0.
  Status CheckPlain(int n) const;
  // Every present input in its plain layout (nodes with several outputs check those).
  Status CheckPlainInputs(int n) const;
  int Owner(int v) const { return alias_of_[v] >= 0 ? alias_of_[v] : v; }
  // The blob named `key` holding `data` (a copy when transformed): the index of the one
  // added before under that key, or of a new one.
  // `shard` >= 0: the blob lives on that tensor-parallel shard's device (GpuLowering::Blob);
  // blobs are shared by key only on one device.
  int64_t AddBlob(const std::string& key, Tensor data, int shard = -1);
  // The blob of the known value `v`, one whoever reads it.
  // The key of known value `v`'s blob (GpuLowering::Blob).
  std::string KeyOf(int v) const;
  int64_t KnownSlot(int v);
  // Mixed precision (GpuPlanOptions::math kFp16 or kBf16): the products' operand type.
  bool Mixed() const {
    return options_.math == GemmMath::kFp16 || options_.math == GemmMath::kBf16;
  }
  DataType OperandDtype() const {
    return options_.math == GemmMath::kFp16 ? DataType::kFp16 : DataType::kBf16;
  }
  // The blob of a GEMM's constant weight `data` (fp32), keyed `key`: stored as it is, or,
  // in mixed precision, rounded to 16 bits under key + "~fp16" / "~bf16".
  int64_t AddWeightBlob(const std::string& key, const Tensor& data, int shard = -1);
  // Value `v` as a GEMM operand for node n: itself, or, in mixed precision, a 16-bit
  // temporary that a kToHalf step rounds it into, made at v's first such read and shared by
  // the later ones.
  int GemmOperand(int n, int v);
  // Mixed precision, once every node is lowered: a kToHalf step that rounds the output of a
  // convolution's epilogue, a layer normalisation, an element-wise activation, a product's
  // activation step (`post`, with no residual after it), a softmax or a transpose (or a view
  // of all of that output) becomes part of that step (GpuStep::half_out), one pass instead
  // of two; a product whose fp32 output only that rounding reads writes 16 bits itself, with
  // a 16-bit bias; and an epilogue from a 16-bit cuDNN output, an activation, a softmax or a
  // transpose, whose fp32 result nothing else reads (a graph output counts as read), stops
  // writing it.
  // A max pool between such convolutions pools their 16-bit values (PoolIn16Bits).
  void FuseRoundingsIntoEpilogues();
  // The last step before step `before` to write v's bytes (v's owner, or, for the steps that
  // update their inputs in place, an input), or -1.
  int LastWriter(int v, int before) const;
  // Whether v's bytes are a graph output, or a step other than steps a and b (-1: none) and
  // not marked in `drop` reads them (through v, a view of them, or as its scratch).
  bool ReadBesides(int v, int a, int b, const std::vector<bool>& drop) const;
  // Mixed precision: a max pool whose fp32 output only its rounding reads, of the output of
  // a convolution's epilogue, reads that epilogue's rounding of its input (made for it if no
  // product needed one) and writes the rounding of its output itself: the largest of 16-bit
  // values is the rounding of the largest fp32 one, so the next convolutions read the same
  // bits, with one pass over the pooled values fewer. `rounding_at` maps each 16-bit
  // temporary to its kToHalf step; the roundings the pools take over are marked in `drop`.
  void PoolIn16Bits(const std::map<int, int>& rounding_at, std::vector<bool>& drop);
  // Mixed precision: a 16-bit cuDNN convolution's epilogue that is the only fp32 reader of
  // its residual z (no graph output, no other step but z's rounding) reads z in 16 bits: the
  // rounding the next convolutions read too (made in z's writer's pass, or by a kToHalf step
  // that stays, before the epilogue), or, when nothing else reads z and a 16-bit
  // convolution's epilogue wrote it, a rounding that epilogue now makes. So a ResNet
  // block's output need not be written in fp32 at all. Unlike the fusions above this changes
  // results: z is rounded before it is added, as TensorRT's and PyTorch's fp16 residuals are.
  void ResidualsIn16Bits(const std::map<int, int>& rounding_at, const std::vector<bool>& drop);
  // Mixed precision on cuDNN (GpuPlanOptions::channels_last), after the roundings are fused:
  // the 16-bit values of rank 4 that a kToHalf step, a convolution's epilogue (as its
  // rounding), a 16-bit cuDNN convolution or a 16-bit max pool writes, and that only 16-bit
  // cuDNN convolutions (as x), 16-bit max pools and convolution epilogues (as c, or as a
  // 16-bit residual) read, with no view, that are no graph input or output, become channels
  // last (GpuLowering::channels_last), with a convolution's x and y, and a pool's x and out,
  // in one layout. Each step says so in its own options: a convolution reading x channels
  // last runs NHWC, its weight stored [m, kh, kw, c/groups] (key + "~nhwc"); an epilogue
  // reads and writes the layouts of its operands; a kToHalf step or a pool writes NHWC.
  void ChannelsLastBetweenConvolutions();
  // Removes the steps marked in `drop` (one flag per step), keeping the others' order.
  void DropSteps(const std::vector<bool>& drop);
  // Removes the blobs no step's weight slot and no known value names, renumbering the
  // slots and recounting weight_bytes.
  void DropUnusedBlobs();
  // GEMM options of node n's products: the plan's math, fp32 out in mixed precision.
  GemmOptions ProductOptions() const {
    GemmOptions g;
    g.math = options_.math;
    g.fp32_output = Mixed();
    return g;
  }

  const Graph& graph_;
  const Plan& plan_;
  const GpuPlanOptions& options_;
  GpuLowering out_;
  std::vector<int> alias_of_;  // per value: the value whose bytes it views, else -1
  std::map<int, int64_t> known_slots_;
  std::map<int, int> rounded_;    // GemmOperand: value -> its 16-bit temporary
  std::map<int, int> quantized_;  // Int8Operand: value -> its int8 temporary
  // Tensor parallelism: the values in a shard's own arena, each {shard, offset}.
  std::map<int, std::pair<int, int64_t>> shard_values_;
  std::vector<int> refused_;  // refused()
};

}  // namespace shoal::engine::cuda::internal
