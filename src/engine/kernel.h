// The operator interface between the executor (plan.h) and the operator implementations
// (ops/*.cc). Internal to the engine.
//
// For every node, when a plan is prepared for concrete input shapes, the executor calls
// the operator's `prepare` with the node, the input dtypes and shapes and, where known
// at plan time, the input data (constants, and values computed only from shapes, such
// as Shape -> Gather -> Concat -> Reshape chains). `prepare` checks what it needs,
// fills the output dtypes and shapes, and returns a Kernel holding everything that can
// be built once per plan (oneDNN primitives, reordered weights, index tables).
// `Kernel::Run` then runs once per inference on the plan's single thread of control.
// A kernel also tells the plan's memory planner whether its output is a view of an
// input (alias_input) and whether it may overwrite an input (inplace_input).
//
// Errors from `prepare` name the node through PrepareContext::Error. Kernels never
// throw: oneDNN errors are caught by the executor and returned as Status.
//
// Where part 2 fits: a fused operator is one more OpDef in the "shoal" domain; a
// precision variant is chosen inside `prepare` from PlanOptions.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/graph.h"

namespace shoal::engine {

class WeightCache;
struct PlanLimits;

// Precision tiers (precision.h): the arithmetic convolutions and matrix products use.
// Everything else stays FP32, and so do the model's inputs and outputs.
enum class Precision { kFp32, kBf16, kInt8 };

// The range a value took over calibration inputs (int8 quantisation scales).
struct ValueRange {
  float min = 0, max = 0;
};
using Calibration = std::map<std::string, ValueRange, std::less<>>;  // by value name

// How fp32 3x3 stride-1 convolutions with constant weights and at least 16 input
// channels are computed: directly, or by Winograd's minimal filtering (oneDNN's F(2x2,
// 3x3) and F(4x4, 3x3) kernels), which does fewer multiplications at the price of
// rounding error a little above direct fp32's (transforms of inputs and weights). Other
// convolutions, those a tier runs in bf16 or int8 (an int8 tier's fp32 fallbacks, values
// without a calibrated range, follow this option), and shapes oneDNN has no Winograd
// kernel for stay direct. oneDNN's Winograd weight layout can depend on the batch, so the
// WeightCache may hold one transformed copy of a convolution's weights per such layout.
enum class ConvAlgorithm { kDirect, kWinograd };

// The layout a direct fp32 2-D convolution writes (and so reads: each reads its producer's
// layout when it can). kBlocked: oneDNN's nChw16c (channels in blocks of 16), run by its
// jit:avx512_core kernels, as PyTorch's frozen TorchScript does (on CPUs without AVX-512,
// oneDNN's own choice). kChannelsLast: nhwc, run by its brgemm kernels, which the engine
// used alone before. Which is faster depends on the CPU and the shapes: on the AMD EPYC
// (AVX-512) VM of bench/results/engine.md, channels-last ran at 0.85-0.96x blocked at
// batch 8 on MobileNetV2, ResNet-50, the detector and the digits CNN (large activations,
// stride-2 and depthwise layers), and at 1.01-1.14x (across runs) on the small image
// classifier at batch 1. Convolutions with fewer than 16 output channels (padding them to
// 16 wastes work), grouped ones whose groups are not whole 16-channel blocks, those in
// bf16 or int8 (and the fp32 ones a bf16/int8 tier keeps), 1-D and 3-D ones, and
// transposed convolutions stay channels-last either way.
enum class ConvLayout { kBlocked, kChannelsLast };

struct PlanOptions {
  Precision precision = Precision::kFp32;
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kDirect;
  ConvLayout conv_layout = ConvLayout::kBlocked;
  // kInt8: ranges of the values that feed convolutions and products. A node whose input
  // has no range here runs in FP32.
  std::shared_ptr<const Calibration> calibration;
  // Nodes (indices into the optimised graph) that run in FP32 whatever `precision` says:
  // those a tier's load found no faster in bf16 or int8 than in FP32 (precision.h,
  // SelectTierNodes). Their outputs are never left quantised for them.
  std::shared_ptr<const std::vector<int>> fp32_nodes;
  // Every value in ONNX's plain row-major layout: no operator picks a layout of its own
  // for its output (blocked convolutions). For a plan that another executor lowers onto
  // its device (engine/cuda/gpu_lowering.h), which reads values as ONNX lays them out.
  bool plain_layouts = false;
  bool KeepsFp32(int node) const {
    return fp32_nodes && std::binary_search(fp32_nodes->begin(), fp32_nodes->end(), node);
  }
};

struct PrepareContext {
  const Graph* graph = nullptr;
  int node_index = 0;
  const PlanOptions* options = nullptr;
  // One entry per node input; an omitted optional input has dtype kInvalid.
  std::vector<DataType> in_dtypes;
  std::vector<Shape> in_shapes;
  std::vector<const Tensor*> in_data;  // data known at plan time, else null
  std::vector<int> in_values;          // value index per input (-1 when omitted)
  // Filled by `prepare`, one entry per node output (omitted outputs included).
  std::vector<DataType> out_dtypes;
  std::vector<Shape> out_shapes;
  // Optional: outputs `prepare` could compute already (Shape, Size). When every present
  // output is set here, the node never runs and `prepare` may return a null kernel.
  std::vector<Tensor> out_data;
  // Per output: its shape depends on the input data (NonZero, NonMaxSuppression), so
  // `prepare` leaves out_shapes[o] unset and the kernel's Run allocates the output itself
  // (`*ctx.outputs[o] = Tensor::Allocate(...)`). Such a value lives outside the plan's
  // arena, and every node that reads it (directly or through other such values) is
  // prepared again at every run, once its inputs exist (plan.h).
  std::vector<char> out_dynamic;
  const dnnl::engine* dnnl_engine = nullptr;
  WeightCache* weights = nullptr;
  // The plan's limits (plan.h), for operators that size things from data at run time or
  // plan subgraphs; null means the default PlanLimits.
  const PlanLimits* limits = nullptr;
  // Memory layouts. An input whose producer chose a oneDNN layout (blocked, such as
  // nChw16c) has its descriptor here; an empty descriptor (ndims 0) means the plain
  // row-major layout of its dtype. Only operators whose OpDef::any_layout_inputs allow it
  // ever see a non-plain input.
  std::vector<dnnl::memory::desc> in_descs;
  // Per output: may `prepare` choose any layout for it (every reader accepts any layout,
  // and it is no graph output)? When it does, it sets out_descs[o] to the layout.
  std::vector<char> out_any_layout;
  std::vector<dnnl::memory::desc> out_descs;
  // Int8 values between operators (PlanOptions::precision kInt8). An input whose producer
  // left it quantised has an s8 or u8 layout in in_descs and its scale here (the real
  // value of one step: real = scale * stored); 0 for an unquantised input. Only
  // operators whose OpDef::quantized_inputs allow it ever see one.
  std::vector<float> in_scales;
  // Per output: may `prepare` store it quantised (out_any_layout, every reader accepts a
  // quantised value at that input, and a reader that passes it on keeps its own output
  // quantised; see OpDef)? When it does, it sets out_descs[o] to an s8/u8 layout and
  // out_scales[o] to its scale.
  std::vector<char> out_quantizable;
  std::vector<float> out_scales;

  const Node& node() const { return graph->nodes[node_index]; }
  int64_t opset() const { return graph->opset; }
  size_t num_inputs() const { return in_dtypes.size(); }
  bool has_input(size_t i) const {
    return i < in_dtypes.size() && in_dtypes[i] != DataType::kInvalid;
  }
  // INVALID_ARGUMENT "node 'x' (Op): message".
  Status Error(std::string_view message) const {
    return InvalidArgument(graph->Describe(node_index) + ": " + std::string(message));
  }
  void SetOutputs(size_t n) {
    out_dtypes.assign(n, DataType::kInvalid);
    out_shapes.assign(n, Shape{});
    out_data.assign(n, Tensor());
    out_dynamic.assign(n, 0);
    out_descs.assign(n, dnnl::memory::desc());
    out_scales.assign(n, 0.f);
    if (out_any_layout.size() != n) out_any_layout.assign(n, 0);
    if (out_quantizable.size() != n) out_quantizable.assign(n, 0);
  }
  // The layout of input i: its producer's choice, or plain.
  dnnl::memory::desc InDesc(size_t i, const dnnl::memory::desc& plain) const {
    return i < in_descs.size() && in_descs[i].data.ndims != 0 ? in_descs[i] : plain;
  }
  // The scale of input i when it arrives quantised, else 0.
  float InScale(size_t i) const { return i < in_scales.size() ? in_scales[i] : 0.f; }
};

struct RunContext {
  std::vector<const Tensor*> inputs;  // null for omitted optional inputs
  // Allocated by the executor with the prepared shapes; an output prepare marked
  // out_dynamic arrives empty and the kernel assigns it.
  std::vector<Tensor*> outputs;
  dnnl::stream* stream = nullptr;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual Status Run(const RunContext& ctx) = 0;
  // When >= 0, output 0 is a view of that input's bytes with the output's shape
  // (Reshape, Flatten, Squeeze, Identity...): the executor binds it and never calls Run.
  virtual int alias_input() const { return -1; }
  // When >= 0, the kernel still computes output 0 correctly when it occupies the same
  // bytes as that input (same dtype and element count): it reads each input element
  // before writing the output element at the same index, and reads no neighbours
  // (element-wise operators without broadcasting of that input). The memory planner
  // (plan.h) then may place output 0 over the input, when the input is an arena value
  // whose last use is this step; the kernel must not assume it does.
  virtual int inplace_input() const { return -1; }
  // The library implementation the kernel runs (oneDNN's name for its primitive, such as
  // "brgconv:avx512_core"); empty for the engine's own kernels.
  virtual std::string implementation() const { return {}; }
  // False when running the kernel may take unbounded time at load (Loop, or an If whose
  // branches hold one): such a node whose inputs are all known at plan time is neither
  // folded by the optimiser nor run by Plan::Prepare; it runs as a step at every run.
  virtual bool runs_at_plan_time() const { return true; }
};

struct OpDef {
  std::string_view domain;  // "" for ONNX
  std::string_view op_type;
  // Attribute names the implementation understands; any other attribute on a node is
  // a load error ("attribute 'x' is not supported").
  std::vector<std::string_view> attributes;
  // Load-time checks of attribute values (modes, counts); may be null.
  Status (*check)(const Node& node, const Graph& graph) = nullptr;
  StatusOr<std::unique_ptr<Kernel>> (*prepare)(PrepareContext& ctx) = nullptr;
  // Bit i set: input i may arrive in any oneDNN layout (see PrepareContext::in_descs).
  uint32_t any_layout_inputs = 0;
  // Bit i set (and in any_layout_inputs): input i may arrive quantised, as s8/u8 with a
  // scale (PrepareContext::in_scales), in an int8 plan.
  uint32_t quantized_inputs = 0;
  // Output 0 keeps input 0's quantisation (max pooling): the plan quantises input 0
  // only when output 0 can stay quantised too.
  bool quantized_passthrough = false;
};

// The operator for (domain, op_type), or null.
const OpDef* FindOp(std::string_view domain, std::string_view op_type);
// All registered operators (for `inspect` and tests).
std::vector<const OpDef*> AllOps();
// Load-time check of one node: known operator, known attributes, OpDef::check.
Status CheckNode(const Graph& graph, int node_index);

}  // namespace shoal::engine
