#include "engine/cuda/gpu_lowering.h"

#include <xxhash.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>
#include <utility>

#include "core/bf16.h"
#include "core/data_type.h"
#include "core/fp16.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/normalization.h"
#include "engine/internal/op_util.h"
#include "engine/internal/resize.h"
#include "engine/memory_planner.h"

namespace shoal::engine::cuda {
namespace {

using engine::internal::Product;

int64_t PadTo(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

constexpr int64_t kAlign = static_cast<int64_t>(kGemmAlignmentBytes);

std::optional<UnaryOp> UnaryByName(std::string_view op) {
  static const std::pair<std::string_view, UnaryOp> kOps[] = {
      {"Relu", UnaryOp::kRelu}, {"Sigmoid", UnaryOp::kSigmoid}, {"Tanh", UnaryOp::kTanh},
      {"Exp", UnaryOp::kExp},   {"Log", UnaryOp::kLog},         {"Neg", UnaryOp::kNeg},
      {"Abs", UnaryOp::kAbs},   {"Sqrt", UnaryOp::kSqrt},       {"Erf", UnaryOp::kErf},
      {"Gelu", UnaryOp::kGelu}, {"Floor", UnaryOp::kFloor},     {"Ceil", UnaryOp::kCeil}};
  for (const auto& [name, u] : kOps)
    if (name == op) return u;
  return std::nullopt;
}

std::optional<BinaryOp> BinaryByName(std::string_view op) {
  static const std::pair<std::string_view, BinaryOp> kOps[] = {
      {"Add", BinaryOp::kAdd}, {"Sub", BinaryOp::kSub}, {"Mul", BinaryOp::kMul},
      {"Div", BinaryOp::kDiv}, {"Max", BinaryOp::kMax}, {"Min", BinaryOp::kMin},
      {"Pow", BinaryOp::kPow}};
  for (const auto& [name, b] : kOps)
    if (name == op) return b;
  return std::nullopt;
}

// A fused activation (`prefix`: "activation" or "post_activation") as an element-wise
// step: its operator and parameters, or false when the GPU path has none for it (GeluTanh
// has one only in a GEMM's epilogue).
bool ActivationStep(const Node& node, const std::string& prefix, UnaryOp* op, float* alpha,
                    float* beta) {
  const std::string name = node.GetString(prefix, "");
  *alpha = node.GetFloat(prefix + "_alpha", 0.f);
  *beta = node.GetFloat(prefix + "_beta", 0.f);
  if (name == "LeakyRelu") {
    *op = UnaryOp::kLeakyRelu;
  } else if (name == "Clip") {
    *op = UnaryOp::kClip;
  } else if (name == "HardSwish") {
    *op = UnaryOp::kHardSwish;
  } else if (name == "Relu" || name == "Sigmoid" || name == "Tanh" || name == "Gelu") {
    *op = *UnaryByName(name);
  } else {
    return false;
  }
  return true;
}

// Lowers one step at a time; collects what it cannot lower instead of stopping at the
// first, so the load error lists every node.
class Lowerer {
 public:
  Lowerer(const Graph& graph, const Plan& plan, const GpuPlanOptions& options)
      : graph_(graph), plan_(plan), options_(options) {}

  StatusOr<GpuLowering> Run();

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
  Status LowerPool(int n);
  Status LowerCompare(int n, CompareOp op);
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
  // GatherElements' and ScatterElements' axis of node n, made non-negative, once indices of
  // shape `is` fit data of shape `xs` (one rank, no larger off the axis).
  StatusOr<int64_t> ElementsAxis(int n, const Shape& xs, const Shape& is) const;
  Status LowerScatter(int n);
  Status LowerCumSum(int n);
  Status LowerTrilu(int n);
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
  // Value `v` as a GEMM operand for node n: itself, or, in mixed precision, a new 16-bit
  // temporary that a kToHalf step rounds it into.
  int GemmOperand(int n, int v);
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
  // Tensor parallelism: the values in a shard's own arena, each {shard, offset}.
  std::map<int, std::pair<int, int64_t>> shard_values_;
};

Status Lowerer::CheckFp32(int n) const {
  const Node& node = graph_.nodes[n];
  for (int v : node.inputs) {
    if (v >= 0 && !IsFp32(v))
      return Fail(n, "input '" + graph_.values[v].name + "' is " +
                         std::string(DataTypeName(DtypeOf(v))) + "; this kernel takes fp32");
  }
  if (!node.has_output(0) || !IsFp32(node.outputs[0])) return Fail(n, "output 0 is not fp32");
  return CheckPlain(n);
}

Status Lowerer::CheckPlain(int n) const {
  const Node& node = graph_.nodes[n];
  if (!node.has_output(0)) return Fail(n, "has no output 0");
  for (size_t o = 1; o < node.outputs.size(); ++o)
    if (node.outputs[o] >= 0) return Fail(n, "only its first output is supported");
  for (int v : node.inputs)
    if (v >= 0 && plan_.ValueLayout(v).data.ndims != 0)
      return Fail(n,
                  "reads a value in a blocked CPU layout (prepare the plan with "
                  "GpuLoweringPlanOptions())");
  return Status::Ok();
}

int64_t Lowerer::AddBlob(const std::string& key, Tensor data, int shard) {
  for (size_t i = 0; i < out_.blobs.size(); ++i)
    if (out_.blobs[i].key == key && out_.blobs[i].shard == shard) return static_cast<int64_t>(i);
  out_.weight_bytes += static_cast<int64_t>(data.byte_size());
  out_.blobs.push_back({key, std::move(data), shard});
  return static_cast<int64_t>(out_.blobs.size()) - 1;
}

// The key of a blob (GpuLowering::Blob) holding value `v`'s data, named `base` (KeyOf),
// times `scale` when it is not 1.
std::string ScaledKey(std::string key, float scale) {
  if (scale != 1.f) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "*%.9g", scale);
    key += buf;
  }
  return key;
}

std::string Lowerer::KeyOf(int v) const {
  std::string key = "v" + std::to_string(v);
  if (graph_.values[v].is_constant()) return key;
  // Folded for this plan's shapes: the same value may hold other data at other shapes.
  const Tensor& t = *Known(v);
  char hash[24];
  std::snprintf(hash, sizeof(hash), "#%016llx",
                static_cast<unsigned long long>(XXH3_64bits(t.data(), t.byte_size())));
  return key + "@" + ShapeToString(t.shape()) + hash;
}

int64_t Lowerer::KnownSlot(int v) {
  auto it = known_slots_.find(v);
  if (it != known_slots_.end()) return it->second;
  const int64_t offset = AddBlob(KeyOf(v), *Known(v));
  known_slots_[v] = offset;
  return offset;
}

int64_t Lowerer::AddWeightBlob(const std::string& key, const Tensor& data, int shard) {
  if (!Mixed()) return AddBlob(key, data, shard);
  const DataType dtype = OperandDtype();
  const std::string half_key = key + (dtype == DataType::kFp16 ? "~fp16" : "~bf16");
  for (size_t i = 0; i < out_.blobs.size(); ++i)
    if (out_.blobs[i].key == half_key && out_.blobs[i].shard == shard)
      return static_cast<int64_t>(i);
  Tensor half = Tensor::Allocate(dtype, data.shape());
  auto src = data.values<float>();
  auto* dst = static_cast<uint16_t*>(half.mutable_data());
  if (dtype == DataType::kFp16) {
    FloatToFp16(src.data(), dst, src.size());
  } else {
    for (size_t i = 0; i < src.size(); ++i) dst[i] = FloatToBf16(src[i]);
  }
  return AddBlob(half_key, std::move(half), shard);
}

int Lowerer::GemmOperand(int n, int v) {
  if (!Mixed()) return v;
  const Shape shape = ShapeOf(v);  // a copy: NewTemp may move the shapes
  GpuStep step = NewStep(GpuStep::Kind::kToHalf, n);
  step.in = {v};
  step.out = NewTemp(shape, OperandDtype());
  out_.steps.push_back(step);
  return step.out;
}

// A fp32 copy of `t` with every value multiplied by `scale`.
Tensor Scaled(const Tensor& t, float scale) {
  Tensor copy = Tensor::Allocate(DataType::kFp32, t.shape());
  auto src = t.values<float>();
  auto dst = copy.mutable_values<float>();
  for (size_t i = 0; i < src.size(); ++i) dst[i] = src[i] * scale;
  return copy;
}

Status Lowerer::LowerProduct(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const bool is_gemm = node.op_type == "Gemm" || node.op_type == "FusedGemm";
  const int a = node.inputs[0], b = node.inputs[1];
  const Tensor* w = Known(b);
  bool views = false;
  for (const char* perm : {"a_perm", "b_perm", "c_perm"}) views |= !node.GetInts(perm).empty();
  if (!w || views || ShapeOf(b).size() != 2) return LowerBatchedProduct(n);
  const Shape as = ShapeOf(a);
  const Shape ws = ShapeOf(b);
  const Shape ys = ShapeOf(node.outputs[0]);
  if (as.size() < 2) return Fail(n, "A must have at least two dimensions");
  GpuStep step = NewStep(GpuStep::Kind::kGemm, n);
  GemmOptions& g = step.gemm;
  g = ProductOptions();
  float alpha = node.GetFloat("alpha", 1.f);
  float beta = 1.f;
  if (is_gemm) {
    if (node.GetInt("transA", 0) != 0) return Fail(n, "transA is not on the GPU path yet");
    g.transpose_w = node.GetInt("transB", 0) != 0;
    beta = node.GetFloat("beta", 1.f);
  }
  g.k = as.back();
  g.m = Product(as, 0, as.size() - 1);
  g.n = ys.back();
  if ((g.transpose_w ? ws[1] : ws[0]) != g.k || (g.transpose_w ? ws[0] : ws[1]) != g.n)
    return Fail(n, "the weight's shape does not match the product");
  if (Product(ys) != g.m * g.n) return Fail(n, "the output's shape does not match the product");
  if (g.m == 0 || g.n == 0 || g.k == 0) return Fail(n, "an empty product");
  step.in = {a, -1, -1, -1};
  const std::string w_key = ScaledKey(KeyOf(b), alpha);
  const Tensor w_data = alpha == 1.f ? *w : Scaled(*w, alpha);
  step.weight_slots = {-1, -1};
  // The bias: Gemm's C (times beta) when it is a constant row; FusedMatMul's bias,
  // which the optimiser divided by alpha (optimizer.h), times alpha.
  const Tensor* bias = nullptr;
  float bias_scale = 1.f;
  if (node.has_input(2) && (!is_gemm || beta != 0.f)) {
    bias = Known(node.inputs[2]);
    const Shape bs = ShapeOf(node.inputs[2]);
    const bool row = Product(bs) == g.n && (bs.empty() ? g.n == 1 : bs.back() == g.n);
    if (!bias || !row)
      return Fail(n, "only a constant bias of N values is on the GPU path so far, not " +
                         ShapeToString(bs) + (bias ? "" : " computed"));
    bias_scale = is_gemm ? beta : alpha;
  }
  const std::string act = node.GetString("activation", "");
  std::optional<GemmEpilogue> fused;
  if (act.empty()) {
    fused = bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  } else if (act == "Relu") {
    fused = GemmEpilogue::kBiasRelu;
  } else if (act == "GeluTanh") {
    fused = GemmEpilogue::kBiasGelu;
  } else if (UnaryOp op; ActivationStep(node, "activation", &op, &step.alpha, &step.beta)) {
    step.post = op;
    fused = bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  } else {
    return Fail(n, "the fused activation " + act + " is not on the GPU path yet");
  }
  g.epilogue = *fused;
  std::optional<Tensor> b_data;
  std::string b_key;
  if (g.epilogue != GemmEpilogue::kNone) {
    // The epilogues that apply an activation take a bias: zeros when the node has none.
    b_data = bias ? (bias_scale == 1.f ? *bias : Scaled(*bias, bias_scale))
                  : Tensor::Allocate(DataType::kFp32, {g.n});
    b_key = bias ? ScaledKey(KeyOf(node.inputs[2]), bias_scale) : "zeros" + std::to_string(g.n);
  }
  if (node.has_input(3)) {
    const int r = node.inputs[3];
    auto plan = PlanBroadcast(ys, ShapeOf(r));
    if (!plan.ok() || plan->out_dims != ys)
      return Fail(n, "the residual " + ShapeToString(ShapeOf(r)) + " does not broadcast onto " +
                         ShapeToString(ys));
    step.in[3] = r;
    step.residual = std::move(plan).value();
  }
  out_.workspace_bytes = std::max<int64_t>(out_.workspace_bytes, g.workspace_bytes);
  const TensorParallelOptions& tp = options_.tensor_parallel;
  if (tp.shards > 1 && g.n >= std::max<int64_t>(tp.min_columns, 2)) {
    return LowerSplitProduct(n, std::move(step), GemmOperand(n, a), w_data, w_key,
                             b_data ? &*b_data : nullptr, b_key);
  }
  step.weight_slots = {AddWeightBlob(w_key, w_data), b_data ? AddBlob(b_key, *b_data) : -1};
  step.in[0] = GemmOperand(n, a);
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// The column ranges [begin, end) of `n` columns split into at most `shards`: equal, each
// a multiple of 8 columns when that leaves every shard some, the last taking the rest.
std::vector<std::pair<int64_t, int64_t>> ColumnShards(int64_t n, int shards) {
  int64_t chunk = (n + shards - 1) / shards;
  if (const int64_t rounded = (chunk + 7) / 8 * 8; rounded * (shards - 1) < n) chunk = rounded;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t begin = 0; begin < n; begin += chunk)
    ranges.emplace_back(begin, std::min(n, begin + chunk));
  return ranges;
}

// Columns [begin, end) of a weight stored [k, n], or (transposed) rows [begin, end) of one
// stored [n, k]: the weight of the product that computes those output columns.
Tensor WeightColumns(const Tensor& w, bool transposed, int64_t begin, int64_t end) {
  const Shape& ws = w.shape();
  const auto src = w.values<float>();
  const int64_t cols = end - begin;
  if (transposed) {
    const int64_t k = ws[1];
    Tensor out = Tensor::Allocate(DataType::kFp32, {cols, k});
    std::memcpy(out.mutable_data(), src.data() + begin * k,
                static_cast<size_t>(cols * k) * sizeof(float));
    return out;
  }
  const int64_t k = ws[0], n = ws[1];
  Tensor out = Tensor::Allocate(DataType::kFp32, {k, cols});
  auto dst = out.mutable_values<float>();
  for (int64_t r = 0; r < k; ++r)
    std::memcpy(dst.data() + r * cols, src.data() + r * n + begin,
                static_cast<size_t>(cols) * sizeof(float));
  return out;
}

// Values [begin, end) of a bias of n values.
Tensor BiasColumns(const Tensor& bias, int64_t begin, int64_t end) {
  Tensor out = Tensor::Allocate(DataType::kFp32, {end - begin});
  std::memcpy(out.mutable_data(), bias.values<float>().data() + begin,
              static_cast<size_t>(end - begin) * sizeof(float));
  return out;
}

Status Lowerer::LowerSplitProduct(int n, GpuStep step, int x, const Tensor& w,
                                  const std::string& w_key, const Tensor* bias,
                                  const std::string& b_key) {
  const TensorParallelOptions& tp = options_.tensor_parallel;
  const int y = graph_.nodes[n].outputs[0];
  const GemmOptions whole = step.gemm;
  const auto ranges = ColumnShards(whole.n, tp.shards);
  const Shape xs = ShapeOf(x);
  const int64_t x_bytes =
      PadTo(Product(xs) * static_cast<int64_t>(DataTypeSize(DtypeOf(x))), kAlign);
  out_.shards = std::max(out_.shards, static_cast<int>(ranges.size()));
  out_.shard_arena_bytes.resize(static_cast<size_t>(out_.shards), 0);
  out_.shard_own_memory.resize(static_cast<size_t>(out_.shards));
  for (int s = 0; s < out_.shards; ++s) out_.shard_own_memory[s] = tp.OwnMemory(s);
  ++out_.split_products;

  GpuStep fork = NewStep(GpuStep::Kind::kFork, n);
  out_.steps.push_back(fork);
  std::vector<int> columns;  // per shard, its product's columns on the plan's device
  for (size_t s = 0; s < ranges.size(); ++s) {
    const auto [begin, end] = ranges[s];
    const int shard = static_cast<int>(s);
    const bool own = tp.OwnMemory(shard);
    const std::string cols = "|cols " + std::to_string(begin) + ":" + std::to_string(end);
    GpuStep gemm = step;
    gemm.shard = shard;
    gemm.gemm.n = end - begin;
    gemm.post.reset();  // on the whole output, after the join
    gemm.in = {x, -1, -1, -1};
    gemm.weight_slots = {
        AddWeightBlob(w_key + cols, WeightColumns(w, whole.transpose_w, begin, end),
                      own ? shard : -1),
        bias ? AddBlob(b_key + cols, BiasColumns(*bias, begin, end), own ? shard : -1) : -1};
    const Shape part = {whole.m, end - begin};
    if (own) {
      // Its own arena holds a copy of the input, then its columns.
      GpuStep copy_in = NewStep(GpuStep::Kind::kCopy, n);
      copy_in.shard = shard;
      copy_in.in = {x};
      copy_in.out = NewShardTemp(xs, DtypeOf(x), shard, 0);
      gemm.in[0] = copy_in.out;
      out_.steps.push_back(copy_in);
      gemm.out = NewShardTemp(part, DataType::kFp32, shard, x_bytes);
      int64_t& arena = out_.shard_arena_bytes[s];
      arena = std::max(arena, x_bytes + PadTo(Product(part) * 4, kAlign));
      out_.steps.push_back(gemm);
      GpuStep copy_out = NewStep(GpuStep::Kind::kCopy, n);
      copy_out.shard = shard;
      copy_out.in = {gemm.out};
      copy_out.out = NewTemp(part);
      columns.push_back(copy_out.out);
      out_.steps.push_back(copy_out);
    } else {
      gemm.out = NewTemp(part);
      columns.push_back(gemm.out);
      out_.steps.push_back(gemm);
    }
  }
  GpuStep join = NewStep(GpuStep::Kind::kJoin, n);
  out_.steps.push_back(join);
  for (size_t s = 0; s < ranges.size(); ++s) {
    GpuStep place = NewStep(GpuStep::Kind::kPlace, n);
    place.in = {columns[s]};
    place.out = y;
    place.dims = {whole.m, whole.n};
    place.axis = 1;
    place.start = ranges[s].first;
    out_.steps.push_back(std::move(place));
  }
  if (step.post) {
    GpuStep act = NewStep(GpuStep::Kind::kUnary, n);
    act.unary = *step.post;
    act.alpha = step.alpha;
    act.beta = step.beta;
    act.in = {y};
    act.out = y;
    out_.steps.push_back(std::move(act));
  }
  if (step.in[3] >= 0) {
    GpuStep add = NewStep(GpuStep::Kind::kBinary, n);
    add.binary = BinaryOp::kAdd;
    add.in = {y, step.in[3]};
    add.broadcast = step.residual;
    add.out = y;
    out_.steps.push_back(std::move(add));
  }
  return Status::Ok();
}

StatusOr<int> Lowerer::AddTranspose(int n, int x, const std::vector<int64_t>& perm) {
  auto plan = PlanTranspose(ShapeOf(x), perm);
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep step = NewStep(GpuStep::Kind::kTranspose, n);
  step.in = {x};
  step.out = NewTemp(plan->out_dims);
  step.transpose = std::move(plan).value();
  out_.steps.push_back(std::move(step));
  return out_.steps.back().out;
}

// Strips leading 1s: [1, 1, 4, 3] and [4, 3] are the same batch.
Shape Squeezed(Shape s) {
  while (!s.empty() && s.front() == 1) s.erase(s.begin());
  return s;
}

Status Lowerer::LowerBatchedProduct(int n) {
  const Node& node = graph_.nodes[n];
  const bool is_gemm = node.op_type == "Gemm" || node.op_type == "FusedGemm";
  int a = node.inputs[0], b = node.inputs[1];
  const int y = node.outputs[0];
  GpuStep step = NewStep(GpuStep::Kind::kGemm, n);
  GemmOptions& g = step.gemm;
  g = ProductOptions();
  g.alpha = node.GetFloat("alpha", 1.f);
  if (is_gemm) {
    if (node.GetInt("transA", 0) != 0) return Fail(n, "transA is not on the GPU path yet");
    g.transpose_w = node.GetInt("transB", 0) != 0;
    if (node.has_input(2) && node.GetFloat("beta", 1.f) != 0.f)
      return Fail(n, "a Gemm of two computed matrices with a C term is not on the GPU path yet");
  }
  const std::vector<int64_t> a_perm = node.GetInts("a_perm"), b_perm = node.GetInts("b_perm"),
                             c_perm = node.GetInts("c_perm");
  // The transposed views, made dense first.
  if (!a_perm.empty()) {
    ASSIGN_OR_RETURN(a, AddTranspose(n, a, a_perm));
  }
  if (!b_perm.empty()) {
    ASSIGN_OR_RETURN(b, AddTranspose(n, b, b_perm));
  }
  const Shape as = ShapeOf(a), bs = ShapeOf(b);
  if (as.size() < 2 || bs.size() < 2)
    return Fail(n, "a product of vectors is not on the GPU path yet");
  g.m = as[as.size() - 2];
  g.k = as.back();
  const int64_t bk = g.transpose_w ? bs.back() : bs[bs.size() - 2];
  g.n = g.transpose_w ? bs[bs.size() - 2] : bs.back();
  if (bk != g.k) return Fail(n, "the inner dimensions differ");
  // The product's shape: the output's, or (c_perm) the shape whose transpose is the output.
  Shape cs = ShapeOf(y);
  if (!c_perm.empty()) {
    if (c_perm.size() != cs.size()) return Fail(n, "c_perm does not match the output's rank");
    Shape product(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) product[c_perm[i]] = cs[i];
    cs = product;
  }
  if (cs.size() < 2 || cs[cs.size() - 2] != g.m || cs.back() != g.n)
    return Fail(n, "the output's shape does not match the product");
  if (g.m == 0 || g.n == 0 || g.k == 0) return Fail(n, "an empty product");
  const Shape batch(cs.begin(), cs.end() - 2);
  g.batch = Product(batch);
  // Each operand's batch is the product's (a stride of one matrix) or a single matrix
  // (stride 0); other broadcasts of the batch dimensions are refused.
  auto stride = [&](const Shape& s, int64_t matrix, int64_t* out) {
    const Shape own = Squeezed(Shape(s.begin(), s.end() - 2));
    if (own.empty()) {
      *out = 0;
      return true;
    }
    *out = matrix;
    return own == Squeezed(batch);
  };
  if (!stride(as, g.m * g.k, &g.x_batch_stride) || !stride(bs, g.k * g.n, &g.w_batch_stride))
    return Fail(n,
                "a product whose batch dimensions broadcast other than from a single "
                "matrix is not on the GPU path yet");
  g.y_batch_stride = g.m * g.n;
  if (g.batch == 1) g.x_batch_stride = g.w_batch_stride = g.y_batch_stride = 0;
  step.in = {a, b, -1, -1};
  step.weight_slots = {-1, -1};
  // The bias (FusedMatMul's, divided by alpha by the optimiser) and the activation.
  const Tensor* bias = nullptr;
  if (!is_gemm && node.has_input(2)) {
    bias = Known(node.inputs[2]);
    if (!bias || Product(ShapeOf(node.inputs[2])) != g.n)
      return Fail(n, "only a constant bias of N values is on the GPU path so far");
  }
  const std::string act = node.GetString("activation", "");
  if (act.empty()) {
    g.epilogue = bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  } else if (act == "Relu") {
    g.epilogue = GemmEpilogue::kBiasRelu;
  } else if (act == "GeluTanh") {
    g.epilogue = GemmEpilogue::kBiasGelu;
  } else if (UnaryOp op; ActivationStep(node, "activation", &op, &step.alpha, &step.beta)) {
    step.post = op;
    g.epilogue = bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  } else {
    return Fail(n, "the fused activation " + act + " is not on the GPU path yet");
  }
  if (g.epilogue != GemmEpilogue::kNone) {
    step.weight_slots[1] =
        AddBlob(bias ? ScaledKey(KeyOf(node.inputs[2]), g.alpha) : "zeros" + std::to_string(g.n),
                bias ? (g.alpha == 1.f ? *bias : Scaled(*bias, g.alpha))
                     : Tensor::Allocate(DataType::kFp32, {g.n}));
  }
  if (node.has_input(3)) {
    if (!c_perm.empty()) return Fail(n, "a residual with c_perm is not supported");
    const int r = node.inputs[3];
    auto plan = PlanBroadcast(cs, ShapeOf(r));
    if (!plan.ok() || plan->out_dims != cs)
      return Fail(n, "the residual " + ShapeToString(ShapeOf(r)) + " does not broadcast onto " +
                         ShapeToString(cs));
    step.in[3] = r;
    step.residual = std::move(plan).value();
  }
  out_.workspace_bytes = std::max<int64_t>(out_.workspace_bytes, g.workspace_bytes);
  step.in[0] = GemmOperand(n, a);
  step.in[1] = GemmOperand(n, b);
  if (c_perm.empty()) {
    step.out = y;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  // The product into a temporary, then transposed into the output.
  const int product = NewTemp(cs);
  step.out = product;
  out_.steps.push_back(std::move(step));
  auto plan = PlanTranspose(cs, c_perm);
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(y)) return Fail(n, "c_perm does not give the output's shape");
  GpuStep t = NewStep(GpuStep::Kind::kTranspose, n);
  t.in = {product};
  t.out = y;
  t.transpose = std::move(plan).value();
  out_.steps.push_back(std::move(t));
  return Status::Ok();
}

// Split into outputs of the planned shapes, one slice step each.
Status Lowerer::LowerSplit(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0];
  const int64_t words = WordsOf(x);
  if (words == 0) return Fail(n, "only a Split of 4- or 8-byte elements is on the GPU path so far");
  const Shape xs = ShapeOf(x);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  int64_t start = 0;
  for (int o : node.outputs) {
    // An omitted output's length is in the split sizes, not in a planned shape.
    if (o < 0) return Fail(n, "a Split with an omitted output is not on the GPU path yet");
    const Shape os = ShapeOf(o);
    if (os.size() != xs.size()) return Fail(n, "an output of another rank");
    GpuStep step = NewStep(GpuStep::Kind::kSlice, n);
    step.in = {x};
    step.out = o;
    step.dims = InWords(xs, words);
    step.axis = axis;
    step.start = start;
    step.length = os[axis];
    start += os[axis];
    out_.steps.push_back(std::move(step));
  }
  if (start > xs[axis]) return Fail(n, "the outputs are longer than the axis");
  return Status::Ok();
}

// ReduceSum, ReduceMean, ReduceMax over axes that sit next to each other.
Status Lowerer::LowerReduce(int n, ReduceOp op) {
  const Node& node = graph_.nodes[n];
  // The data and the result in fp32 (the axes, when an input, are int64).
  if (!IsFp32(node.inputs[0]) || !node.has_output(0) || !IsFp32(node.outputs[0]))
    return Fail(n, "only a reduction of fp32 data is on the GPU path so far");
  const Shape xs = ShapeOf(node.inputs[0]);
  const auto rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> axes = node.GetInts("axes");
  if (node.has_input(1)) {
    const Tensor* known = Known(node.inputs[1]);
    if (!known || known->dtype() != DataType::kInt64)
      return Fail(n, "axes computed at run time are not on the GPU path");
    auto v = known->values<int64_t>();
    axes.assign(v.begin(), v.end());
  }
  if (axes.empty()) {
    if (node.GetInt("noop_with_empty_axes", 0) != 0)
      return Fail(n, "a reduction over no axes is not on the GPU path");
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  for (int64_t& a : axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return Fail(n, "an axis out of range");
  }
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (axes.back() - axes.front() + 1 != static_cast<int64_t>(axes.size()))
    return Fail(n,
                "a reduction over axes that are not next to each other is not on the GPU "
                "path yet");
  if (Product(xs, axes.front(), axes.back() + 1) == 0)
    return Fail(n, "a reduction over an empty axis");
  GpuStep step = NewStep(GpuStep::Kind::kReduce, n);
  step.reduce = op;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.dims = xs;
  step.axis = axes.front();
  step.length = static_cast<int64_t>(axes.size());
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Cast to fp32 from int64, int32 or bool.
Status Lowerer::LowerCast(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0], y = node.outputs[0];
  const bool to_half = DtypeOf(y) == DataType::kFp16 || DtypeOf(y) == DataType::kBf16;
  if (to_half && DtypeOf(x) == DataType::kFp32) {
    // The kernel that rounds a mixed-precision product's input (an fp16 model's output).
    GpuStep step = NewStep(GpuStep::Kind::kToHalf, n);
    step.in = {x};
    step.out = y;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  const bool to_int = DtypeOf(y) == DataType::kInt64 || DtypeOf(y) == DataType::kInt32;
  if (to_int && DtypeOf(x) == DataType::kFp32) {
    GpuStep step = NewStep(GpuStep::Kind::kFloatToInt, n);
    step.in = {x};
    step.out = y;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  if (DtypeOf(y) != DataType::kFp32) {
    return Fail(n,
                "only a Cast to fp32, or from fp32 to fp16, bf16, int64 or int32, is on the "
                "GPU path so far, not " +
                    std::string(DataTypeName(DtypeOf(x))) + " to " +
                    std::string(DataTypeName(DtypeOf(y))));
  }
  GpuStep step;
  step.kind = GpuStep::Kind::kCast;
  switch (DtypeOf(x)) {
    case DataType::kInt64:
      step.cast = CastSource::kInt64;
      break;
    case DataType::kInt32:
      step.cast = CastSource::kInt32;
      break;
    case DataType::kBool:
      step.cast = CastSource::kBool;
      break;
    case DataType::kFp16:
      step.cast = CastSource::kFp16;
      break;
    case DataType::kBf16:
      step.cast = CastSource::kBf16;
      break;
    default:
      return Fail(n, "a Cast from " + std::string(DataTypeName(DtypeOf(x))) +
                         " is not on the GPU path yet");
  }
  step.node = n;
  step.in = {x};
  step.out = y;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// The 2-D window of a Conv or pooling node over x [n, c, h, w] with a kh x kw kernel, as
// the CPU engine computes it (ops/conv.cc: strides, dilations, pads or auto_pad, and
// ceil_mode's rule that the last window starts inside the input or its left padding).
StatusOr<Window2d> NodeWindow(const Node& node, const Shape& xs, int64_t kh, int64_t kw,
                              bool ceil_mode) {
  const auto strides = node.GetInts("strides", {1, 1});
  const auto dilations = node.GetInts("dilations", {1, 1});
  const auto pads = node.GetInts("pads", {0, 0, 0, 0});
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
    return InvalidArgument("strides, dilations and pads of a 2-D window");
  Window2d g;
  g.n = xs[0];
  g.c = xs[1];
  g.h = xs[2];
  g.w = xs[3];
  g.kh = kh;
  g.kw = kw;
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  int64_t in[2] = {g.h, g.w}, k[2] = {kh, kw}, s[2] = {g.sh, g.sw}, d[2] = {g.dh, g.dw};
  int64_t begin[2], end[2], out[2];
  for (int i = 0; i < 2; ++i) {
    if (k[i] < 1 || s[i] < 1 || d[i] < 1) return InvalidArgument("a window below 1");
    const int64_t extent = (k[i] - 1) * d[i] + 1;
    if (auto_pad == "VALID") {
      begin[i] = end[i] = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t o = (in[i] + s[i] - 1) / s[i];
      const int64_t total = std::max<int64_t>(0, (o - 1) * s[i] + extent - in[i]);
      begin[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end[i] = total - begin[i];
    } else {
      begin[i] = pads[i];
      end[i] = pads[i + 2];
    }
    const int64_t span = in[i] + begin[i] + end[i] - extent;
    if (span < 0 || begin[i] < 0 || end[i] < 0) return InvalidArgument("a window off the input");
    out[i] = (ceil_mode ? (span + s[i] - 1) / s[i] : span / s[i]) + 1;
    if (ceil_mode && (out[i] - 1) * s[i] >= in[i] + begin[i]) --out[i];
  }
  g.ph = begin[0];
  g.pw = begin[1];
  g.ph_end = end[0];
  g.pw_end = end[1];
  g.oh = out[0];
  g.ow = out[1];
  return g;
}

// Conv and shoal.FusedConv (2-D, constant weights): im2col into a temporary, one GEMM per
// group (batched) into [groups, n, oh, ow, m/groups], a transpose into NCHW, then the
// bias and activation (in the GEMM's epilogue when there is one group), the residual and
// the post-activation.
Status Lowerer::LowerConv(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0], y = node.outputs[0];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(x);
  const Tensor* w = Known(node.inputs[1]);
  if (xs.size() != 4) return Fail(n, "only 2-D convolutions are on the GPU path so far");
  if (!w || w->shape().size() != 4)
    return Fail(n, "only convolutions with constant 4-D weights are on the GPU path");
  const Shape& ws = w->shape();
  const int64_t groups = node.GetInt("group", 1);
  if (groups < 1 || xs[1] % groups != 0 || ws[0] % groups != 0 || ws[1] * groups != xs[1])
    return Fail(n, "the groups do not divide the channels");
  auto window = NodeWindow(node, xs, ws[2], ws[3], false);
  if (!window.ok()) return Fail(n, window.status().message());
  Window2d g = *window;
  g.groups = groups;
  const Shape ys = ShapeOf(y);
  if (ys != Shape{xs[0], ws[0], g.oh, g.ow})
    return Fail(n, "the output's shape is not the window's");
  const int64_t rows = xs[0] * g.oh * g.ow, kg = ws[1] * ws[2] * ws[3], mg = ws[0] / groups;
  if (rows == 0 || kg == 0 || mg == 0) return Fail(n, "an empty convolution");
  const std::string act = node.GetString("activation", "");
  const std::string post_act = node.GetString("post_activation", "");
  // Each activation as an element-wise step (GeluTanh only in a single group's epilogue).
  UnaryOp act_op = UnaryOp::kRelu, post_op = UnaryOp::kRelu;
  float act_alpha = 0, act_beta = 0, post_alpha = 0, post_beta = 0;
  if (!act.empty() && !ActivationStep(node, "activation", &act_op, &act_alpha, &act_beta) &&
      !(act == "GeluTanh" && groups == 1))
    return Fail(n, "the fused activation " + act + " is not on the GPU path yet");
  if (!post_act.empty() &&
      !ActivationStep(node, "post_activation", &post_op, &post_alpha, &post_beta))
    return Fail(n, "the fused activation " + post_act + " is not on the GPU path yet");
  const Tensor* bias = nullptr;
  if (node.has_input(2)) {
    bias = Known(node.inputs[2]);
    if (!bias || Product(ShapeOf(node.inputs[2])) != ws[0])
      return Fail(n, "only a constant bias of one value per output channel is on the GPU path");
  }
  // im2col.
  GpuStep cols = NewStep(GpuStep::Kind::kIm2Col, n);
  cols.in = {x};
  // In mixed precision the columns are the GEMM's 16-bit operand, rounded as they are made.
  cols.out = NewTemp({groups, rows, kg}, Mixed() ? OperandDtype() : DataType::kFp32);
  cols.window = g;
  out_.steps.push_back(cols);
  // The GEMMs: [rows, kg] x [mg, kg]^T per group.
  GpuStep gemm = NewStep(GpuStep::Kind::kGemm, n);
  gemm.in = {cols.out, -1, -1, -1};
  GemmOptions& o = gemm.gemm;
  o = ProductOptions();
  o.m = rows;
  o.n = mg;
  o.k = kg;
  o.transpose_w = true;
  o.batch = groups;
  if (groups > 1) {
    o.x_batch_stride = rows * kg;
    o.w_batch_stride = mg * kg;
    o.y_batch_stride = rows * mg;
  }
  gemm.weight_slots = {AddWeightBlob(KeyOf(node.inputs[1]), *w), -1};
  bool act_done = groups == 1 || act.empty();
  if (groups == 1) {
    if (act == "Relu") {
      o.epilogue = GemmEpilogue::kBiasRelu;
    } else if (act == "GeluTanh") {
      o.epilogue = GemmEpilogue::kBiasGelu;
    } else {
      o.epilogue = bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
      if (!act.empty()) {
        gemm.post = act_op;
        gemm.alpha = act_alpha;
        gemm.beta = act_beta;
      }
    }
    if (o.epilogue != GemmEpilogue::kNone) {
      gemm.weight_slots[1] = AddBlob(bias ? KeyOf(node.inputs[2]) : "zeros" + std::to_string(ws[0]),
                                     bias ? *bias : Tensor::Allocate(DataType::kFp32, {ws[0]}));
    }
  }
  gemm.out = NewTemp({groups, xs[0], g.oh, g.ow, mg});
  out_.workspace_bytes = std::max<int64_t>(out_.workspace_bytes, o.workspace_bytes);
  const int product = gemm.out;
  out_.steps.push_back(std::move(gemm));
  // Into NCHW: [groups, n, oh, ow, mg] -> [n, groups, mg, oh, ow].
  auto plan = PlanTranspose(ShapeOf(product), std::vector<int64_t>{1, 0, 4, 2, 3});
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep t = NewStep(GpuStep::Kind::kTranspose, n);
  t.in = {product};
  t.out = y;
  t.transpose = std::move(plan).value();
  out_.steps.push_back(std::move(t));
  // What the epilogue could not do, in place on the output.
  auto in_place_unary = [&](UnaryOp op, float alpha, float beta) {
    GpuStep u = NewStep(GpuStep::Kind::kUnary, n);
    u.unary = op;
    u.alpha = alpha;
    u.beta = beta;
    u.in = {y};
    u.out = y;
    out_.steps.push_back(std::move(u));
  };
  if (groups > 1 && bias) {
    GpuStep add = NewStep(GpuStep::Kind::kBinary, n);
    add.binary = BinaryOp::kAdd;
    Tensor channels = Tensor::Allocate(DataType::kFp32, {ws[0], 1, 1});
    std::copy(bias->values<float>().begin(), bias->values<float>().end(),
              channels.mutable_values<float>().begin());
    const Shape bias_dims = channels.shape();
    add.weight_slots = {AddBlob(KeyOf(node.inputs[2]) + ":chw", std::move(channels))};
    auto broadcast = PlanBroadcast(ys, bias_dims);
    if (!broadcast.ok()) return Fail(n, broadcast.status().message());
    add.broadcast = std::move(broadcast).value();
    add.in = {y, -1};
    add.out = y;
    out_.steps.push_back(std::move(add));
  }
  if (!act_done) in_place_unary(act_op, act_alpha, act_beta);
  if (node.has_input(3)) {
    const int r = node.inputs[3];
    if (ShapeOf(r) != ys) return Fail(n, "the residual must have the output's shape");
    GpuStep add = NewStep(GpuStep::Kind::kBinary, n);
    add.binary = BinaryOp::kAdd;
    auto broadcast = PlanBroadcast(ys, ys);
    if (!broadcast.ok()) return Fail(n, broadcast.status().message());
    add.broadcast = std::move(broadcast).value();
    add.in = {y, r};
    add.out = y;
    out_.steps.push_back(std::move(add));
  }
  if (!post_act.empty()) in_place_unary(post_op, post_alpha, post_beta);
  return Status::Ok();
}

// MaxPool and AveragePool (2-D, first output only); GlobalAveragePool and GlobalMaxPool as
// reductions over the spatial axes.
Status Lowerer::LowerPool(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const std::string& op = node.op_type;
  const Shape xs = ShapeOf(node.inputs[0]);
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    if (xs.size() < 3) return Fail(n, "a global pool needs spatial axes");
    if (Product(xs, 2) == 0) return Fail(n, "a global pool over nothing");
    GpuStep step = NewStep(GpuStep::Kind::kReduce, n);
    step.reduce = op == "GlobalMaxPool" ? ReduceOp::kMax : ReduceOp::kMean;
    step.in = {node.inputs[0]};
    step.out = node.outputs[0];
    step.dims = xs;
    step.axis = 2;
    step.length = static_cast<int64_t>(xs.size()) - 2;
    out_.steps.push_back(std::move(step));
    return Status::Ok();
  }
  if (xs.size() != 4) return Fail(n, "only 2-D pooling is on the GPU path so far");
  const auto kernel = node.GetInts("kernel_shape");
  if (kernel.size() != 2) return Fail(n, "kernel_shape must have two entries");
  auto window = NodeWindow(node, xs, kernel[0], kernel[1], node.GetInt("ceil_mode", 0) != 0);
  if (!window.ok()) return Fail(n, window.status().message());
  if (ShapeOf(node.outputs[0]) != Shape{xs[0], xs[1], window->oh, window->ow})
    return Fail(n, "the output's shape is not the window's");
  GpuStep step = NewStep(GpuStep::Kind::kPool, n);
  step.pool = op == "MaxPool"                            ? PoolOp::kMax
              : node.GetInt("count_include_pad", 0) != 0 ? PoolOp::kAverageIncludePad
                                                         : PoolOp::kAverage;
  step.window = *window;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Clip: bounds from the min/max inputs (opset 11 on) or attributes, each known at load.
Status Lowerer::LowerClip(int n) {
  const Node& node = graph_.nodes[n];
  float lo = -FLT_MAX, hi = FLT_MAX;
  if (graph_.opset < 11) {
    lo = node.GetFloat("min", lo);
    hi = node.GetFloat("max", hi);
  } else {
    for (size_t i = 1; i <= 2; ++i) {
      if (!node.has_input(i)) continue;
      const Tensor* bound = Known(node.inputs[i]);
      if (!bound || bound->dtype() != DataType::kFp32 || bound->element_count() != 1)
        return Fail(n, "Clip bounds computed at run time are not on the GPU path");
      (i == 1 ? lo : hi) = bound->values<float>()[0];
    }
  }
  return LowerUnary(n, UnaryOp::kClip, lo, hi);
}

// BatchNormalization in inference (one output): x·a + b per channel, a = scale /
// sqrt(var + epsilon) and b = B - mean·a computed at lowering, as two broadcasting steps.
Status Lowerer::LowerBatchNorm(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  if (xs.size() < 2) return Fail(n, "the input needs a channel axis");
  const int64_t c = xs[1];
  const Tensor* t[4] = {};
  for (size_t i = 0; i < 4; ++i) {
    t[i] = node.has_input(i + 1) ? Known(node.inputs[i + 1]) : nullptr;
    if (!t[i] || t[i]->element_count() != c)
      return Fail(n,
                  "only constant scale, bias, mean and variance of one value per channel "
                  "are on the GPU path");
  }
  const float epsilon = node.GetFloat("epsilon", 1e-5f);
  Shape per_channel(xs.size() - 1, 1);
  per_channel[0] = c;
  Tensor a = Tensor::Allocate(DataType::kFp32, per_channel);
  Tensor b = Tensor::Allocate(DataType::kFp32, per_channel);
  for (int64_t k = 0; k < c; ++k) {
    const float scale = t[0]->values<float>()[k], bias = t[1]->values<float>()[k];
    const float mean = t[2]->values<float>()[k], var = t[3]->values<float>()[k];
    const float ak = scale / std::sqrt(var + epsilon);
    a.mutable_values<float>()[k] = ak;
    b.mutable_values<float>()[k] = bias - mean * ak;
  }
  std::string key = "bn";
  for (size_t i = 1; i <= 4; ++i) key += ":" + KeyOf(node.inputs[i]);
  key += "@" + std::to_string(epsilon);
  auto plan = PlanBroadcast(xs, per_channel);
  if (!plan.ok() || plan->out_dims != xs) return Fail(n, "the channels do not broadcast");
  for (int k = 0; k < 2; ++k) {
    GpuStep step = NewStep(GpuStep::Kind::kBinary, n);
    step.binary = k == 0 ? BinaryOp::kMul : BinaryOp::kAdd;
    step.in = {k == 0 ? node.inputs[0] : node.outputs[0], -1};
    step.weight_slots = {AddBlob(key + (k == 0 ? "*a" : "+b"), k == 0 ? a : b)};
    step.broadcast = *plan;
    step.out = node.outputs[0];
    out_.steps.push_back(std::move(step));
  }
  return Status::Ok();
}

// Concat: each input written into the output at its offset along the axis.
Status Lowerer::LowerConcat(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckPlain(n));
  const int y = node.outputs[0];
  const int64_t words = WordsOf(y);
  if (words == 0)
    return Fail(n, "only a Concat of 4- or 8-byte elements is on the GPU path so far");
  for (int x : node.inputs)
    if (x >= 0 && DtypeOf(x) != DtypeOf(y)) return Fail(n, "an input of another type");
  const Shape ys = ShapeOf(y);
  const auto rank = static_cast<int64_t>(ys.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  int64_t start = 0;
  for (int x : node.inputs) {
    if (x < 0) continue;
    const Shape xs = ShapeOf(x);
    if (static_cast<int64_t>(xs.size()) != rank) return Fail(n, "an input of another rank");
    if (Product(xs) > 0) {
      GpuStep step = NewStep(GpuStep::Kind::kPlace, n);
      step.in = {x};
      step.out = y;
      step.dims = InWords(ys, words);
      step.words = words;
      step.axis = axis;
      step.start = start;
      out_.steps.push_back(std::move(step));
    }
    start += xs[axis];
  }
  if (start != ys[axis]) return Fail(n, "the inputs do not fill the output");
  return Status::Ok();
}

// Slice with starts, ends, axes and steps known at load (inputs from opset 10, attributes
// before), clamped as ONNX (and the CPU engine, ops/indexing.cc) clamps them.
Status Lowerer::LowerSlice(int n) {
  const Node& node = graph_.nodes[n];
  const int x = node.inputs[0], y = node.outputs[0];
  const int64_t words = WordsOf(x);
  if (words == 0 || DtypeOf(y) != DtypeOf(x))
    return Fail(n, "only a Slice of 4- or 8-byte elements is on the GPU path so far");
  const Shape xs = ShapeOf(x);
  const auto rank = static_cast<int64_t>(xs.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (graph_.opset < 10) {
    starts = node.GetInts("starts");
    ends = node.GetInts("ends");
    axes = node.GetInts("axes");
  } else {
    std::vector<int64_t>* lists[] = {&starts, &ends, &axes, &steps};
    for (size_t i = 1; i <= 4; ++i) {
      if (!node.has_input(i)) continue;
      const Tensor* t = Known(node.inputs[i]);
      if (!t || (t->dtype() != DataType::kInt64 && t->dtype() != DataType::kInt32))
        return Fail(n, "starts, ends, axes and steps computed at run time are not on the GPU path");
      for (int64_t k = 0; k < t->element_count(); ++k)
        lists[i - 1]->push_back(t->dtype() == DataType::kInt64 ? t->values<int64_t>()[k]
                                                               : t->values<int32_t>()[k]);
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return Fail(n, "starts, ends, axes and steps differ in length");
  std::vector<int64_t> begin(xs.size(), 0), step(xs.size(), 1);
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t ax = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (ax < 0 || ax >= rank || steps[i] == 0)
      return Fail(n, "an axis out of range or a zero step");
    const int64_t d = xs[ax];
    int64_t b = starts[i] < 0 ? starts[i] + d : starts[i];
    // An empty axis gives an empty output whatever the start (and clamp needs low <= high).
    b = d == 0 ? 0 : steps[i] > 0 ? std::clamp<int64_t>(b, 0, d) : std::clamp<int64_t>(b, 0, d - 1);
    begin[ax] = b;
    step[ax] = steps[i];
  }
  if (words > 1) {  // each element's words, in order
    begin.push_back(0);
    step.push_back(1);
  }
  auto plan = PlanSlice(InWords(xs, words), begin, step, InWords(ShapeOf(y), words));
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep s = NewStep(GpuStep::Kind::kStridedSlice, n);
  s.in = {x};
  s.out = y;
  s.slice = std::move(plan).value();
  out_.steps.push_back(std::move(s));
  return Status::Ok();
}

// Pad, mode "constant", with pads (and the value) known at load.
Status Lowerer::LowerPad(int n) {
  const Node& node = graph_.nodes[n];
  if (!IsFp32(node.inputs[0]) || !IsFp32(node.outputs[0]))
    return Fail(n, "only a Pad of fp32 data is on the GPU path so far");
  if (node.GetString("mode", "constant") != "constant")
    return Fail(n, "only constant padding is on the GPU path yet");
  const Shape xs = ShapeOf(node.inputs[0]);
  std::vector<int64_t> pads = node.GetInts("pads");
  float value = node.GetFloat("value", 0.f);
  if (graph_.opset >= 11) {
    const Tensor* p = node.has_input(1) ? Known(node.inputs[1]) : nullptr;
    if (!p || p->dtype() != DataType::kInt64)
      return Fail(n, "pads computed at run time are not on the GPU path");
    auto v = p->values<int64_t>();
    pads.assign(v.begin(), v.end());
    if (node.has_input(2)) {
      const Tensor* c = Known(node.inputs[2]);
      if (!c || c->dtype() != DataType::kFp32 || c->element_count() != 1)
        return Fail(n, "a padding value computed at run time is not on the GPU path");
      value = c->values<float>()[0];
    }
    if (node.has_input(3)) return Fail(n, "Pad's axes input is not on the GPU path yet");
  }
  if (pads.size() != 2 * xs.size()) return Fail(n, "pads need a begin and an end per axis");
  const std::vector<int64_t> begin(pads.begin(), pads.begin() + xs.size());
  const std::vector<int64_t> end(pads.begin() + xs.size(), pads.end());
  auto plan = PlanPad(xs, begin, end);
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(node.outputs[0]))
    return Fail(n, "the padded shape differs from the planned output");
  GpuStep step = NewStep(GpuStep::Kind::kPad, n);
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.pad = std::move(plan).value();
  step.alpha = value;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerUnary(int n, UnaryOp op, float alpha, float beta) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  if (node.op_type == "Gelu" && node.GetString("approximate", "none") != "none")
    return Fail(n, "Gelu's tanh approximation outside a product is not on the GPU path yet");
  if (node.inputs.size() != 1 && op != UnaryOp::kClip) return Fail(n, "takes one input");
  GpuStep step = NewStep(GpuStep::Kind::kUnary, n);
  step.unary = op;
  step.alpha = alpha;
  step.beta = beta;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

StatusOr<GpuStep> Lowerer::BroadcastStep(int n, GpuStep::Kind kind) const {
  const Node& node = graph_.nodes[n];
  auto plan = PlanBroadcast(ShapeOf(node.inputs[0]), ShapeOf(node.inputs[1]));
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(node.outputs[0]))
    return Fail(n, "the broadcast shape differs from the planned output");
  GpuStep step = NewStep(kind, n);
  step.in = {node.inputs[0], node.inputs[1]};
  step.broadcast = std::move(plan).value();
  step.out = node.outputs[0];
  return step;
}

Status Lowerer::LowerBinary(int n, BinaryOp op) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "only two inputs are on the GPU path");
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kBinary));
  step.binary = op;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Softmax over the last axis, or (opset < 13) over the dimensions from `axis` on, which
// is the same row softmax over the flattened trailing dimensions.
Status Lowerer::LowerSoftmax(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  const int64_t rank = static_cast<int64_t>(xs.size());
  if (rank == 0) return Fail(n, "a scalar softmax");
  int64_t axis = node.GetInt("axis", graph_.opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  if (graph_.opset >= 13 && axis != rank - 1)
    return Fail(n, "softmax over an axis other than the last is not on the GPU path yet");
  GpuStep step = NewStep(GpuStep::Kind::kSoftmax, n);
  step.in = {node.inputs[0]};
  step.dims = {Product(xs, 0, axis), Product(xs, axis)};
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// LayerNormalization normalises over the dimensions from `axis` on: one row each.
Status Lowerer::LowerLayerNorm(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  const int64_t rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "axis out of range");
  const int64_t row = Product(xs, axis);
  if (!node.has_input(1) || Product(ShapeOf(node.inputs[1])) != row)
    return Fail(n, "the scale must have one value per normalised element");
  if (node.has_input(2) && Product(ShapeOf(node.inputs[2])) != row)
    return Fail(n, "the bias must have one value per normalised element");
  GpuStep step = NewStep(GpuStep::Kind::kLayerNorm, n);
  step.in = {node.inputs[0], node.inputs[1], node.has_input(2) ? node.inputs[2] : -1};
  step.dims = {Product(xs, 0, axis), row};
  step.epsilon = node.GetFloat("epsilon", 1e-5f);
  if (!(step.epsilon > 0)) return Fail(n, "an epsilon <= 0 is not on the GPU path");
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerTranspose(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  std::vector<int64_t> perm = node.GetInts("perm");
  if (perm.empty())
    for (size_t i = xs.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  auto plan = PlanTranspose(xs, perm);
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep step = NewStep(GpuStep::Kind::kTranspose, n);
  step.in = {node.inputs[0]};
  step.transpose = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerGather(int n) {
  const Node& node = graph_.nodes[n];
  // The kernel moves 4-byte words: data of 8-byte elements is gathered as pairs of them.
  const DataType dtype = node.inputs.size() == 2 ? DtypeOf(node.inputs[0]) : DataType::kInvalid;
  const size_t element = DataTypeSize(dtype);
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1) ||
      (element != 4 && element != 8) || !node.has_output(0) || DtypeOf(node.outputs[0]) != dtype)
    return Fail(n,
                "only a Gather of 4- or 8-byte elements (fp32, int32, int64) is on the GPU path");
  RETURN_IF_ERROR(CheckPlain(n));
  if (DtypeOf(node.inputs[1]) != DataType::kInt64)
    return Fail(n, "only int64 indices are on the GPU path so far");
  auto plan = PlanGather(ShapeOf(node.inputs[0]), ShapeOf(node.inputs[1]), node.GetInt("axis", 0));
  if (!plan.ok()) return Fail(n, plan.status().message());
  plan->inner *= static_cast<int64_t>(element / 4);
  GpuStep step = NewStep(GpuStep::Kind::kGather, n);
  step.flag = NewFlag(n);
  step.in = {node.inputs[0], node.inputs[1]};
  step.gather = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Equal, Less, Greater, LessOrEqual, GreaterOrEqual of fp32 or int64 operands: ONNX bools.
Status Lowerer::LowerCompare(int n, CompareOp op) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes two inputs");
  RETURN_IF_ERROR(CheckPlain(n));
  const DataType dtype = DtypeOf(node.inputs[0]);
  if ((dtype != DataType::kFp32 && dtype != DataType::kInt64) || DtypeOf(node.inputs[1]) != dtype)
    return Fail(n, "only comparisons of fp32 or int64 operands are on the GPU path so far");
  if (DtypeOf(node.outputs[0]) != DataType::kBool) return Fail(n, "the output is not bool");
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kCompare));
  step.compare = op;
  step.int64_operands = dtype == DataType::kInt64;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Where(cond, a, b) over fp32 a and b.
Status Lowerer::LowerWhere(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 3 || !node.has_input(0) || !node.has_input(1) || !node.has_input(2))
    return Fail(n, "takes three inputs");
  RETURN_IF_ERROR(CheckPlain(n));
  if (DtypeOf(node.inputs[0]) != DataType::kBool) return Fail(n, "the condition is not bool");
  if (!IsFp32(node.inputs[1]) || !IsFp32(node.inputs[2]) || !IsFp32(node.outputs[0]))
    return Fail(n, "only a Where choosing between fp32 values is on the GPU path so far");
  auto plan = PlanWhere(ShapeOf(node.inputs[0]), ShapeOf(node.inputs[1]), ShapeOf(node.inputs[2]));
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (plan->out_dims != ShapeOf(node.outputs[0]))
    return Fail(n, "the broadcast shape differs from the planned output");
  GpuStep step = NewStep(GpuStep::Kind::kWhere, n);
  step.in = {node.inputs[0], node.inputs[1], node.inputs[2]};
  step.where = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// A 2-D ConvTranspose: one kernel that gathers, for each output position, the inputs whose
// kernel footprint covers it. The pads at the output's start follow the CPU engine's rule
// (ops/conv.cc: explicit pads, or output_shape and auto_pad's split of the total); the
// output's size is the plan's, checked against that rule.
Status Lowerer::LowerConvTranspose(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  if (xs.size() != 4 || !node.has_input(1) || ShapeOf(node.inputs[1]).size() != 4)
    return Fail(n, "only 2-D transposed convolutions are on the GPU path so far");
  const Shape ws = ShapeOf(node.inputs[1]);
  const Shape ys = ShapeOf(node.outputs[0]);
  const int64_t groups = node.GetInt("group", 1);
  if (groups < 1 || ws[0] != xs[1] || xs[1] % groups != 0)
    return Fail(n, "W's first dimension must equal X's channels, in whole groups");
  const int64_t m = ws[1] * groups;
  if (node.has_input(2) && Product(ShapeOf(node.inputs[2])) != m)
    return Fail(n, "the bias must have one value per output channel");
  const auto strides = node.GetInts("strides", {1, 1});
  const auto dilations = node.GetInts("dilations", {1, 1});
  const auto pads = node.GetInts("pads", {0, 0, 0, 0});
  const auto out_pad = node.GetInts("output_padding", {0, 0});
  const auto out_shape = node.GetInts("output_shape", {});
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4 || out_pad.size() != 2 ||
      (!out_shape.empty() && out_shape.size() != 2))
    return Fail(n, "strides, dilations, pads, output_padding and output_shape of a 2-D window");
  if (ys.size() != 4 || ys[0] != xs[0] || ys[1] != m)
    return Fail(n, "the output's shape is not [batch, output channels, h, w]");
  Window2d g;
  g.n = xs[0];
  g.c = xs[1];
  g.h = xs[2];
  g.w = xs[3];
  g.kh = ws[2];
  g.kw = ws[3];
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  g.groups = groups;
  g.oh = ys[2];
  g.ow = ys[3];
  int64_t begin[2], end[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t full =
        strides[i] * (xs[2 + i] - 1) + out_pad[i] + (ws[2 + i] - 1) * dilations[i] + 1;
    if (!out_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t total = std::max<int64_t>(0, full - ys[2 + i]);
      begin[i] = auto_pad != "SAME_LOWER" ? total / 2 : total - total / 2;
      end[i] = total - begin[i];
    } else if (auto_pad == "VALID") {
      begin[i] = end[i] = 0;
    } else {
      begin[i] = pads[i];
      end[i] = pads[i + 2];
    }
    if (full - begin[i] - end[i] != ys[2 + i])
      return Fail(n, "the planned output's size is not the window's");
  }
  g.ph = begin[0];
  g.pw = begin[1];
  g.ph_end = end[0];
  g.pw_end = end[1];
  if (!CheckWindow(g).ok()) return Fail(n, CheckWindow(g).message());
  GpuStep step = NewStep(GpuStep::Kind::kConvTranspose, n);
  step.in = {node.inputs[0], node.inputs[1], node.has_input(2) ? node.inputs[2] : -1};
  step.window = g;
  step.length = m;
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Resize in any mode the CPU engine runs, over fp32 values: the CPU engine's own taps
// (engine/internal/resize.h) as two constant tables, and one kernel that sums each output
// element's weighted taps.
Status Lowerer::LowerResize(int n) {
  const Node& node = graph_.nodes[n];
  if (!node.has_input(0) || !IsFp32(node.inputs[0]) || !node.has_output(0) ||
      !IsFp32(node.outputs[0]))
    return Fail(n, "only a Resize of fp32 values is on the GPU path so far");
  RETURN_IF_ERROR(CheckPlain(n));
  PrepareContext ctx;
  ctx.graph = &graph_;
  ctx.node_index = n;
  for (int v : node.inputs) {
    ctx.in_values.push_back(v);
    ctx.in_dtypes.push_back(v >= 0 ? DtypeOf(v) : DataType::kInvalid);
    ctx.in_shapes.push_back(v >= 0 ? ShapeOf(v) : Shape{});
    ctx.in_data.push_back(v >= 0 ? Known(v) : nullptr);
  }
  // The CPU's linear loop interpolates only the resized axes; this coordinate mode would
  // give the others half-pixel taps in the general form the GPU reads.
  if (node.GetString("mode", "nearest") != "nearest" &&
      node.GetString("coordinate_transformation_mode", "half_pixel") == "tf_half_pixel_for_nearest")
    return Fail(n, "tf_half_pixel_for_nearest outside nearest mode is not on the GPU path");
  auto geometry = engine::internal::ComputeResizeGeometry(ctx);
  if (!geometry.ok()) return Fail(n, geometry.status().message());
  const Shape xs = ShapeOf(node.inputs[0]);
  if (geometry->out != ShapeOf(node.outputs[0]))
    return Fail(n, "the resized shape differs from the planned output");
  std::vector<ResizeAxis> axes;
  for (size_t d = 0; d < xs.size(); ++d) {
    ResizeAxis a;
    a.in = xs[d];
    a.out = geometry->out[d];
    // Taps of weight 0 add nothing: dropped, an axis that is not resized (linear's second
    // tap, weight 0) takes one per coordinate, and each element fewer combinations.
    for (auto& s : geometry->taps[d]) {
      size_t kept = 0;
      for (size_t t = 0; t < s.idx.size(); ++t) {
        if (s.w[t] == 0.f && !(kept == 0 && t + 1 == s.idx.size())) continue;
        s.idx[kept] = s.idx[t];
        s.w[kept++] = s.w[t];
      }
      s.idx.resize(kept);
      s.w.resize(kept);
      a.taps = std::max<int64_t>(a.taps, static_cast<int64_t>(kept));
    }
    for (const auto& s : geometry->taps[d]) {
      for (int64_t t = 0; t < a.taps; ++t) {
        const bool used = !s.outside && t < static_cast<int64_t>(s.idx.size());
        a.idx.push_back(s.outside && t == 0 ? -1 : used ? s.idx[t] : 0);
        a.w.push_back(used ? s.w[t] : 0.f);
      }
    }
    axes.push_back(std::move(a));
  }
  auto plan = PlanResize(axes);
  if (!plan.ok()) return Fail(n, plan.status().message());
  // The tables as constants, keyed by their content: another shape's plan with the same
  // taps shares them.
  auto table = [this](const void* data, size_t bytes, DataType dtype, const char* what) {
    const int64_t count = static_cast<int64_t>(bytes / DataTypeSize(dtype));
    Tensor t = Tensor::Allocate(dtype, {count});
    if (bytes > 0) std::memcpy(t.mutable_data(), data, bytes);
    char hash[24];
    std::snprintf(hash, sizeof(hash), "#%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(data, bytes)));
    return AddBlob(std::string("resize-") + what + hash, std::move(t));
  };
  GpuStep step = NewStep(GpuStep::Kind::kResize, n);
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.weight_slots = {
      table(plan->idx.data(), plan->idx.size() * sizeof(int64_t), DataType::kInt64, "idx"),
      table(plan->w.data(), plan->w.size() * sizeof(float), DataType::kFp32, "w")};
  step.alpha = geometry->extrapolation;
  plan->idx.clear();
  plan->w.clear();
  step.resize = std::move(plan).value();
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Mod of two fp32 (fmod = 1, as ONNX asks) or two int64 operands, broadcast.
Status Lowerer::LowerMod(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes two inputs");
  RETURN_IF_ERROR(CheckPlain(n));
  const DataType dtype = DtypeOf(node.inputs[0]);
  if ((dtype != DataType::kFp32 && dtype != DataType::kInt64) || DtypeOf(node.inputs[1]) != dtype ||
      DtypeOf(node.outputs[0]) != dtype)
    return Fail(n, "only a Mod of fp32 or int64 values is on the GPU path so far");
  const bool fmod = node.GetInt("fmod", 0) != 0;
  if (dtype == DataType::kFp32 && !fmod) return Fail(n, "floating-point inputs need fmod = 1");
  ASSIGN_OR_RETURN(GpuStep step, BroadcastStep(n, GpuStep::Kind::kMod));
  step.flag = NewFlag(n);
  step.int64_operands = dtype == DataType::kInt64;
  step.fmod = fmod;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// ArgMax and ArgMin of fp32 data along one axis; keepdims changes only the shape.
Status Lowerer::LowerArgExtreme(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 1 || !IsFp32(node.inputs[0]))
    return Fail(n, "only an arg extreme of fp32 data is on the GPU path so far");
  RETURN_IF_ERROR(CheckPlain(n));
  if (DtypeOf(node.outputs[0]) != DataType::kInt64) return Fail(n, "the output is not int64");
  const Shape xs = ShapeOf(node.inputs[0]);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || xs[axis] == 0) return Fail(n, "an axis out of range or empty");
  GpuStep step = NewStep(GpuStep::Kind::kArgExtreme, n);
  step.arg_max = node.op_type == "ArgMax";
  step.select_last = node.GetInt("select_last_index", 0) != 0;
  step.in = {node.inputs[0]};
  step.out = node.outputs[0];
  step.dims = xs;
  step.axis = axis;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// InstanceNormalization and GroupNormalization: the row layer norm over each (item, group)
// with a scale of ones, then the constant scale and bias per channel or per group as two
// broadcasting steps, in place.
Status Lowerer::LowerGroupNorm(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const bool instance = node.op_type == "InstanceNormalization";
  const Shape xs = ShapeOf(node.inputs[0]);
  if (xs.size() < 2 || node.inputs.size() != 3)
    return Fail(n, "needs X (N, C, ...), scale and bias");
  const int64_t batch = xs[0], c = xs[1], spatial = Product(xs, 2);
  const int64_t groups = instance ? c : node.GetInt("num_groups", 0);
  if (groups <= 0 || c % groups != 0) return Fail(n, "num_groups must divide the channels");
  const Tensor* scale = Known(node.inputs[1]);
  const Tensor* bias = Known(node.inputs[2]);
  if (!scale || !bias || scale->element_count() != bias->element_count() ||
      (scale->element_count() != c && scale->element_count() != groups))
    return Fail(n,
                "only a constant scale and bias of one value per channel or per group are on "
                "the GPU path");
  const int64_t row = c / groups * spatial;
  if (batch * groups == 0 || row == 0) return Fail(n, "an empty normalisation");
  GpuStep norm = NewStep(GpuStep::Kind::kLayerNorm, n);
  norm.in = {node.inputs[0], -1, -1};
  Tensor ones = Tensor::Allocate(DataType::kFp32, {row});
  for (float& v : ones.mutable_values<float>()) v = 1.f;
  norm.weight_slots = {AddBlob("ones" + std::to_string(row), std::move(ones))};
  norm.dims = {batch * groups, row};
  norm.epsilon = node.GetFloat("epsilon", 1e-5f);
  if (!(norm.epsilon > 0)) return Fail(n, "an epsilon <= 0 is not on the GPU path");
  norm.out = node.outputs[0];
  out_.steps.push_back(std::move(norm));
  // The affine over [N, K, rest] with K the scale's length, one value per row of K.
  const int64_t k = scale->element_count();
  const Shape view = {batch, k, c * spatial / k};
  auto plan = PlanBroadcast(view, Shape{k, 1});
  if (!plan.ok()) return Fail(n, plan.status().message());
  for (int i = 0; i < 2; ++i) {
    GpuStep step = NewStep(GpuStep::Kind::kBinary, n);
    step.binary = i == 0 ? BinaryOp::kMul : BinaryOp::kAdd;
    step.in = {node.outputs[0], i == 0 ? node.inputs[1] : node.inputs[2]};
    step.broadcast = *plan;
    step.out = node.outputs[0];
    out_.steps.push_back(std::move(step));
  }
  return Status::Ok();
}

// DepthToSpace (DCR, CRD) and SpaceToDepth: one transpose of a 6-D view of the input.
Status Lowerer::LowerDepthSpace(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]);
  const int64_t b = node.GetInt("blocksize", 0);
  if (xs.size() != 4 || b <= 0) return Fail(n, "needs a 4-D input and a positive blocksize");
  const int64_t batch = xs[0], c = xs[1], h = xs[2], w = xs[3];
  std::vector<int64_t> view, perm;
  if (node.op_type == "DepthToSpace") {
    if (c % (b * b) != 0) return Fail(n, "the channels are not a multiple of blocksize^2");
    if (node.GetString("mode", "DCR") == "CRD") {
      view = {batch, c / (b * b), b, b, h, w};
      perm = {0, 1, 4, 2, 5, 3};
    } else {
      view = {batch, b, b, c / (b * b), h, w};
      perm = {0, 3, 4, 1, 5, 2};
    }
  } else {
    if (h % b != 0 || w % b != 0) return Fail(n, "height and width are not multiples of blocksize");
    view = {batch, c, h / b, b, w / b, b};
    perm = {0, 3, 5, 1, 2, 4};
  }
  auto plan = PlanTranspose(view, perm);
  if (!plan.ok()) return Fail(n, plan.status().message());
  if (Product(plan->out_dims) != Product(ShapeOf(node.outputs[0])))
    return Fail(n, "the planned output has another size");
  GpuStep step = NewStep(GpuStep::Kind::kTranspose, n);
  step.in = {node.inputs[0]};
  step.transpose = std::move(plan).value();
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// RoiAlign as the CPU engine reads it (ops/sampling.cc): opset 16's
// coordinate_transformation_mode, output_half_pixel before it.
Status Lowerer::LowerRoiAlign(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 3 || !node.has_input(0) || !node.has_input(1) || !node.has_input(2))
    return Fail(n, "needs X, rois and batch_indices");
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], rois = node.inputs[1], batch = node.inputs[2];
  if (!IsFp32(x) || !IsFp32(rois) || !IsFp32(node.outputs[0]))
    return Fail(n, "X, rois and the output must be fp32");
  if (DtypeOf(batch) != DataType::kInt64)
    return Fail(n, "batch_indices must be int64 on the GPU path");
  const Shape xs = ShapeOf(x), rs = ShapeOf(rois);
  if (xs.size() != 4 || rs.size() != 2 || rs[1] != 4) return Fail(n, "X must be 4-D, rois [R, 4]");
  RoiAlignGeometry g;
  g.n = xs[0];
  g.c = xs[1];
  g.h = xs[2];
  g.w = xs[3];
  g.rois = rs[0];
  g.max = node.GetString("mode", "avg") == "max";
  const std::string coord = node.GetString("coordinate_transformation_mode",
                                           graph_.opset >= 16 ? "half_pixel" : "output_half_pixel");
  if (coord != "half_pixel" && coord != "output_half_pixel")
    return Fail(n, "coordinate_transformation_mode '" + coord + "' is not supported");
  g.half_pixel = coord == "half_pixel";
  g.out_h = node.GetInt("output_height", 1);
  g.out_w = node.GetInt("output_width", 1);
  g.sampling_ratio = node.GetInt("sampling_ratio", 0);
  g.spatial_scale = node.GetFloat("spatial_scale", 1.f);
  if (g.out_h < 1 || g.out_w < 1 || g.sampling_ratio < 0)
    return Fail(n, "output sizes must be at least 1 and sampling_ratio at least 0");
  if (ShapeOf(node.outputs[0]) != Shape{g.rois, g.c, g.out_h, g.out_w})
    return Fail(n, "the output's shape differs from the planned one");
  GpuStep step = NewStep(GpuStep::Kind::kRoiAlign, n);
  step.flag = NewFlag(n);
  step.in = {x, rois, batch};
  step.out = node.outputs[0];
  step.roi = g;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// GridSample as the CPU engine reads it (ops/sampling.cc): 4-D in every mode, 5-D (volumes)
// linear and nearest.
Status Lowerer::LowerGridSample(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "needs X and grid");
  RETURN_IF_ERROR(CheckFp32(n));
  const Shape xs = ShapeOf(node.inputs[0]), gs = ShapeOf(node.inputs[1]);
  GridGeometry g;
  const std::string mode = node.GetString("mode", graph_.opset >= 20 ? "linear" : "bilinear");
  if (mode == "bilinear" || mode == "linear") {
    g.mode = 0;
  } else if (mode == "nearest") {
    g.mode = 1;
  } else if (mode == "bicubic" || mode == "cubic") {
    g.mode = 2;
  } else {
    return Fail(n, "mode '" + mode + "' is not supported");
  }
  const std::string pad = node.GetString("padding_mode", "zeros");
  g.padding = pad == "zeros" ? 0 : pad == "border" ? 1 : pad == "reflection" ? 2 : -1;
  if (g.padding < 0) return Fail(n, "padding_mode '" + pad + "' is not supported");
  g.align_corners = node.GetInt("align_corners", 0) != 0;
  g.volume = xs.size() == 5;
  if (g.volume) {
    if (g.mode == 2) return Fail(n, "cubic sampling of a volume is not defined");
    if (gs.size() != 5 || gs[0] != xs[0] || gs[4] != 3) return Fail(n, "the grid does not fit X");
    g.d = xs[2];
    g.h = xs[3];
    g.w = xs[4];
    g.out_d = gs[1];
    g.out_h = gs[2];
    g.out_w = gs[3];
  } else {
    if (xs.size() != 4 || gs.size() != 4 || gs[0] != xs[0] || gs[3] != 2)
      return Fail(n, "X must be 4-D with a grid [N, H_out, W_out, 2], or 5-D");
    g.h = xs[2];
    g.w = xs[3];
    g.out_h = gs[1];
    g.out_w = gs[2];
  }
  g.n = xs[0];
  g.c = xs[1];
  GpuStep step = NewStep(GpuStep::Kind::kGridSample, n);
  step.in = {node.inputs[0], node.inputs[1]};
  step.out = node.outputs[0];
  step.grid = g;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Expand: the planned output shape (the CPU plan read the shape input) filled by a strided
// copy that reads each broadcast axis with stride 0.
Status Lowerer::LowerExpand(int n) {
  const Node& node = graph_.nodes[n];
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], y = node.outputs[0];
  const int64_t words = WordsOf(x);
  if (words == 0 || DtypeOf(y) != DtypeOf(x))
    return Fail(n, "only an Expand of 4- or 8-byte elements is on the GPU path so far");
  auto plan = PlanExpand(InWords(ShapeOf(x), words), InWords(ShapeOf(y), words));
  if (!plan.ok()) return Fail(n, plan.status().message());
  GpuStep s = NewStep(GpuStep::Kind::kStridedSlice, n);
  s.in = {x};
  s.out = y;
  s.slice = std::move(plan).value();
  out_.steps.push_back(std::move(s));
  return Status::Ok();
}

StatusOr<int64_t> Lowerer::ElementsAxis(int n, const Shape& xs, const Shape& is) const {
  const auto rank = static_cast<int64_t>(xs.size());
  if (rank == 0 || rank > internal::kMaxRank || static_cast<int64_t>(is.size()) != rank)
    return Fail(n, "data and indices must have one rank, from 1 to 8");
  int64_t axis = graph_.nodes[n].GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "the axis is out of range");
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && is[d] > xs[d]) return Fail(n, "the indices do not fit the data");
  return axis;
}

// GatherElements of fp32 or int64 data (any 4- or 8-byte elements, moved as bits) by int64
// indices: one thread per output element.
Status Lowerer::LowerGatherElements(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes data and indices");
  RETURN_IF_ERROR(CheckPlain(n));
  const int data = node.inputs[0], idx = node.inputs[1], y = node.outputs[0];
  if (WordsOf(data) == 0 || DtypeOf(y) != DtypeOf(data))
    return Fail(n, "only a GatherElements of 4- or 8-byte elements is on the GPU path so far");
  if (DtypeOf(idx) != DataType::kInt64) return Fail(n, "only int64 indices are on the GPU path");
  const Shape xs = ShapeOf(data), is = ShapeOf(idx);
  ASSIGN_OR_RETURN(const int64_t axis, ElementsAxis(n, xs, is));
  if (ShapeOf(y) != is) return Fail(n, "the output's shape is not the indices'");
  GpuStep step = NewStep(GpuStep::Kind::kGatherElements, n);
  step.flag = NewFlag(n);
  step.in = {data, idx};
  step.out = y;
  step.dims = xs;
  step.axis = axis;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// ScatterElements and ScatterND of fp32 data by int64 indices, every reduction the CPU
// engine has. The output is the data copied, then the updates; with no reduction an int32
// scratch temporary records the last update naming each element.
Status Lowerer::LowerScatter(int n) {
  const Node& node = graph_.nodes[n];
  const bool nd = node.op_type == "ScatterND";
  if (node.inputs.size() != 3 || !node.has_input(0) || !node.has_input(1) || !node.has_input(2))
    return Fail(n, "takes data, indices and updates");
  RETURN_IF_ERROR(CheckPlain(n));
  const int data = node.inputs[0], idx = node.inputs[1], upd = node.inputs[2], y = node.outputs[0];
  if (!IsFp32(data) || !IsFp32(upd) || !IsFp32(y))
    return Fail(n, "only a scatter of fp32 data is on the GPU path so far");
  if (DtypeOf(idx) != DataType::kInt64) return Fail(n, "only int64 indices are on the GPU path");
  static constexpr std::pair<std::string_view, ScatterReduction> kReductions[] = {
      {"none", ScatterReduction::kNone},
      {"add", ScatterReduction::kAdd},
      {"mul", ScatterReduction::kMul},
      {"max", ScatterReduction::kMax},
      {"min", ScatterReduction::kMin}};
  const std::string r = node.GetString("reduction", "none");
  std::optional<ScatterReduction> reduction;
  for (const auto& [name, value] : kReductions)
    if (r == name) reduction = value;
  if (!reduction) return Fail(n, "reduction '" + r + "' is not on the GPU path");
  const Shape xs = ShapeOf(data), is = ShapeOf(idx), us = ShapeOf(upd);
  const auto rank = static_cast<int64_t>(xs.size());
  if (rank == 0 || rank > internal::kMaxRank) return Fail(n, "data must have rank 1 to 8");
  // Update positions are int32 in the kernels (the scratch's atomicMax).
  if (Product(us) > INT32_MAX) return Fail(n, "more than 2^31 - 1 updates");
  GpuStep step = NewStep(nd ? GpuStep::Kind::kScatterNd : GpuStep::Kind::kScatterElements, n);
  if (nd) {
    if (is.empty() || is.back() < 1 || is.back() > rank)
      return Fail(n, "the indices' last dimension must be in [1, rank of data]");
    Shape want(is.begin(), is.end() - 1);
    want.insert(want.end(), xs.begin() + is.back(), xs.end());
    if (us != want) return Fail(n, "the updates' shape does not fit data and indices");
  } else {
    if (us != is) return Fail(n, "the updates' shape is not the indices'");
    ASSIGN_OR_RETURN(step.axis, ElementsAxis(n, xs, is));
  }
  if (ShapeOf(y) != xs) return Fail(n, "the output's shape is not the data's");
  step.flag = NewFlag(n);
  step.in = {data, idx, upd};
  step.out = y;
  step.dims = xs;
  step.scatter = *reduction;
  if (*reduction == ScatterReduction::kNone) step.scratch = NewTemp(xs, DataType::kInt32);
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// CumSum of fp32 or int64 data along a constant axis: one thread per line along it.
Status Lowerer::LowerCumSum(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.size() != 2 || !node.has_input(0) || !node.has_input(1))
    return Fail(n, "takes x and axis");
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], y = node.outputs[0];
  const DataType dtype = DtypeOf(x);
  if ((dtype != DataType::kFp32 && dtype != DataType::kInt64) || DtypeOf(y) != dtype)
    return Fail(n, "only a CumSum of fp32 or int64 values is on the GPU path so far");
  const auto axes = KnownInts(node.inputs[1]);
  if (!axes || axes->size() != 1)
    return Fail(n, "an axis computed at run time is not on the GPU path");
  const Shape xs = ShapeOf(x);
  const auto rank = static_cast<int64_t>(xs.size());
  int64_t axis = (*axes)[0];
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return Fail(n, "the axis is out of range");
  GpuStep step = NewStep(GpuStep::Kind::kCumSum, n);
  step.in = {x};
  step.out = y;
  const auto at = static_cast<size_t>(axis);
  step.dims = {Product(xs, 0, at), xs[at], Product(xs, at + 1)};
  step.exclusive = node.GetInt("exclusive", 0) != 0;
  step.reverse = node.GetInt("reverse", 0) != 0;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

// Trilu of 4- or 8-byte elements (fp32, int64) with a constant k (0 when absent).
Status Lowerer::LowerTrilu(int n) {
  const Node& node = graph_.nodes[n];
  if (node.inputs.empty() || !node.has_input(0)) return Fail(n, "takes an input");
  RETURN_IF_ERROR(CheckPlain(n));
  const int x = node.inputs[0], y = node.outputs[0];
  if (WordsOf(x) == 0 || DtypeOf(y) != DtypeOf(x))
    return Fail(n, "only a Trilu of 4- or 8-byte elements is on the GPU path so far");
  int64_t k = 0;
  if (node.has_input(1)) {
    const auto ks = KnownInts(node.inputs[1]);
    if (!ks || ks->size() != 1) return Fail(n, "a k computed at run time is not on the GPU path");
    k = (*ks)[0];
  }
  const Shape xs = ShapeOf(x);
  if (xs.size() < 2) return Fail(n, "the input must have rank 2 or more");
  GpuStep step = NewStep(GpuStep::Kind::kTrilu, n);
  step.in = {x};
  step.out = y;
  step.dims = {Product(xs, 0, xs.size() - 2), xs[xs.size() - 2], xs.back()};
  step.upper = node.GetInt("upper", 1) != 0;
  step.start = k;
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

Status Lowerer::LowerNode(int n) {
  const Node& node = graph_.nodes[n];
  const std::string& op = node.op_type;
  if (node.domain.empty()) {
    if (op == "MatMul" || op == "Gemm") return LowerProduct(n);
    if (auto u = UnaryByName(op)) return LowerUnary(n, *u);
    if (auto b = BinaryByName(op)) return LowerBinary(n, *b);
    if (op == "Softmax") return LowerSoftmax(n);
    if (op == "LayerNormalization") return LowerLayerNorm(n);
    if (op == "Transpose") return LowerTranspose(n);
    if (op == "Gather") return LowerGather(n);
    if (op == "Split") return LowerSplit(n);
    if (op == "ReduceSum") return LowerReduce(n, ReduceOp::kSum);
    if (op == "ReduceMean") return LowerReduce(n, ReduceOp::kMean);
    if (op == "ReduceMax") return LowerReduce(n, ReduceOp::kMax);
    if (op == "Cast") return LowerCast(n);
    if (op == "Conv") return LowerConv(n);
    if (op == "LeakyRelu") return LowerUnary(n, UnaryOp::kLeakyRelu, node.GetFloat("alpha", 0.01f));
    if (op == "HardSigmoid")
      return LowerUnary(n, UnaryOp::kHardSigmoid, node.GetFloat("alpha", 0.2f),
                        node.GetFloat("beta", 0.5f));
    if (op == "HardSwish") return LowerUnary(n, UnaryOp::kHardSwish);
    if (op == "Clip") return LowerClip(n);
    if (op == "BatchNormalization") return LowerBatchNorm(n);
    if (op == "Concat") return LowerConcat(n);
    if (op == "Pad") return LowerPad(n);
    if (op == "Slice") return LowerSlice(n);
    if (op == "Equal") return LowerCompare(n, CompareOp::kEqual);
    if (op == "Less") return LowerCompare(n, CompareOp::kLess);
    if (op == "Greater") return LowerCompare(n, CompareOp::kGreater);
    if (op == "LessOrEqual") return LowerCompare(n, CompareOp::kLessOrEqual);
    if (op == "GreaterOrEqual") return LowerCompare(n, CompareOp::kGreaterOrEqual);
    if (op == "Where") return LowerWhere(n);
    if (op == "ConvTranspose") return LowerConvTranspose(n);
    if (op == "Resize") return LowerResize(n);
    if (op == "Mod") return LowerMod(n);
    if (op == "ArgMax" || op == "ArgMin") return LowerArgExtreme(n);
    if (op == "InstanceNormalization" || op == "GroupNormalization") return LowerGroupNorm(n);
    if (op == "DepthToSpace" || op == "SpaceToDepth") return LowerDepthSpace(n);
    if (op == "RoiAlign") return LowerRoiAlign(n);
    if (op == "Expand") return LowerExpand(n);
    if (op == "GridSample") return LowerGridSample(n);
    if (op == "GatherElements") return LowerGatherElements(n);
    if (op == "ScatterElements" || op == "ScatterND") return LowerScatter(n);
    if (op == "CumSum") return LowerCumSum(n);
    if (op == "Trilu") return LowerTrilu(n);
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
        op == "GlobalMaxPool")
      return LowerPool(n);
  } else if (node.domain == "shoal" && (op == "FusedMatMul" || op == "FusedGemm")) {
    return LowerProduct(n);
  } else if (node.domain == "shoal" && op == "FusedConv") {
    return LowerConv(n);
  }
  return Fail(n, "the GPU path has no kernel for this operator yet");
}

StatusOr<GpuLowering> Lowerer::Run() {
  const size_t nv = graph_.values.size();
  out_.values.assign(nv, GpuValue{});
  out_.inputs = graph_.inputs;
  out_.outputs = graph_.outputs;
  out_.dtypes = plan_.dtypes();
  out_.shapes = plan_.shapes();
  alias_of_.assign(nv, -1);
  const std::vector<Plan::StepInfo> steps = plan_.Steps();
  std::string failures;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Plan::StepInfo& s = steps[i];
    if (s.dynamic) {
      failures +=
          graph_.Describe(s.node) + ": a shape known only at run time is not on the GPU path yet\n";
      continue;
    }
    if (s.skip) continue;
    if (s.alias_input >= 0) {
      const int src = s.inputs[s.alias_input];
      alias_of_[s.outputs[0]] = Owner(src);
      continue;
    }
    const Status lowered = LowerNode(s.node);
    if (!lowered.ok()) failures += lowered.message() + "\n";
  }
  if (!failures.empty()) {
    failures.pop_back();
    return Unimplemented("the GPU path cannot run this model yet:\n" + failures);
  }
  const size_t total = out_.shapes.size();  // the graph's values and the temporaries
  out_.values.assign(total, GpuValue{});

  // Homes. Known values a step reads are weights; every other value a step reads or
  // writes, and every graph input and output, is an arena value (views take their
  // owner's home).
  std::vector<int> tensor_of(total, -1);
  std::vector<TensorLifetime> tensors;
  std::vector<int> value_of;
  const int num_steps = static_cast<int>(out_.steps.size());
  auto bytes_of = [&](int v) {
    return Product(out_.shapes[v]) * static_cast<int64_t>(DataTypeSize(out_.dtypes[v]));
  };
  // Defines value `v` (an owner) as an arena value at GPU step `first`, unless it is known.
  auto define = [&](int v, int first) {
    if (Known(v)) return;
    if (tensor_of[v] >= 0) {
      // Written again (Concat's pieces, an in-place bias or activation): live until then.
      tensors[tensor_of[v]].last = std::max(tensors[tensor_of[v]].last, first);
      return;
    }
    tensor_of[v] = static_cast<int>(tensors.size());
    value_of.push_back(v);
    tensors.push_back({PadTo(bytes_of(v), kAlign), first, first});
  };
  auto use = [&](int v, int at) {
    if (shard_values_.count(v)) return;  // in a shard's own arena
    const int o = Owner(v);
    if (Known(o) || Known(v)) {
      KnownSlot(Known(o) ? o : v);
      return;
    }
    define(o, 0);  // a graph input: live from the start
    tensors[tensor_of[o]].last = std::max(tensors[tensor_of[o]].last, at);
  };
  for (int v : graph_.inputs) define(v, 0);
  // The steps between a kFork and its kJoin run concurrently on the shards' streams: each
  // counts as running from the fork to the join, so nothing they touch shares bytes with
  // anything another of them touches.
  std::vector<int> from(num_steps), to(num_steps);
  for (int i = 0, fork = -1; i < num_steps; ++i) {
    const GpuStep::Kind kind = out_.steps[i].kind;
    if (kind == GpuStep::Kind::kFork) fork = i;
    from[i] = to[i] = i;
    if (fork >= 0) from[i] = fork;
    if (kind == GpuStep::Kind::kJoin && fork >= 0) {
      for (int j = fork; j <= i; ++j) to[j] = i;
      fork = -1;
    }
  }
  for (int i = 0; i < num_steps; ++i) {
    const GpuStep& step = out_.steps[i];
    if (step.scratch >= 0) {  // the step's own: written and read by it alone
      define(step.scratch, from[i]);
      use(step.scratch, to[i]);
    }
    for (int v : step.in)
      if (v >= 0) use(v, to[i]);
    if (step.out >= 0 && !shard_values_.count(step.out)) define(Owner(step.out), from[i]);
  }
  for (int v : graph_.outputs) use(v, num_steps);
  // Every size is a multiple of the alignment, so the planner's offsets are too.
  ASSIGN_OR_RETURN(MemoryPlan memory, PlanMemory(tensors));
  out_.arena_bytes = memory.arena_bytes;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (memory.offsets[t] % kAlign != 0)
      return Internal("memory planner: an offset not aligned to " + std::to_string(kAlign));
    out_.values[value_of[t]] = {GpuValue::Home::kArena, memory.offsets[t], bytes_of(value_of[t])};
  }
  for (const auto& [v, blob] : known_slots_)
    out_.values[v] = {GpuValue::Home::kWeights, blob, bytes_of(v)};
  for (const auto& [v, place] : shard_values_)
    out_.values[v] = {GpuValue::Home::kShard, place.second, bytes_of(v), place.first};
  for (size_t v = 0; v < total; ++v) {
    const int o = Owner(static_cast<int>(v));
    if (o != static_cast<int>(v) && out_.values[v].home == GpuValue::Home::kNone) {
      out_.values[v] = out_.values[o];
      out_.values[v].bytes = bytes_of(static_cast<int>(v));
    }
  }
  return std::move(out_);
}

}  // namespace

StatusOr<GpuLowering> LowerPlan(const Graph& graph, const Plan& plan,
                                const GpuPlanOptions& options) {
  if (plan.blocked_values() != 0) {
    return InvalidArgument(
        "the plan keeps values in oneDNN's blocked layouts; prepare it with "
        "GpuLoweringPlanOptions() to lower it");
  }
  ASSIGN_OR_RETURN(GpuLowering lowered, Lowerer(graph, plan, options).Run());
  lowered.cuda_graph = options.cuda_graph;
  return lowered;
}

}  // namespace shoal::engine::cuda
