// LowerPlan (gpu_lowering.h) for the products: MatMul, Gemm and their fused forms, split
// across tensor-parallel shards, Conv, ConvTranspose and pooling.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/data_type.h"
#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/internal/op_util.h"

namespace shoal::engine::cuda::internal {

using engine::internal::Product;

namespace {

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

// A fp32 copy of `t` with every value multiplied by `scale`.
Tensor Scaled(const Tensor& t, float scale) {
  Tensor copy = Tensor::Allocate(DataType::kFp32, t.shape());
  auto src = t.values<float>();
  auto dst = copy.mutable_values<float>();
  for (size_t i = 0; i < src.size(); ++i) dst[i] = src[i] * scale;
  return copy;
}

}  // namespace

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
  const bool split = tp.shards > 1 && g.n >= std::max<int64_t>(tp.min_columns, 2);
  if (options_.int8_calibration) {
    const Int8Input in = Int8ProductInput(n, a, g.m, g.k, g.n, false,
                                          split ? "it is split across tensor-parallel shards"
                                          : g.epilogue == GemmEpilogue::kBiasGelu
                                              ? "its tanh GELU is fused only into fp32 and "
                                                "16-bit GEMMs"
                                              : "");
    if (in.scale > 0) {
      step.in[0] = Int8Operand(n, a, in);
      // (A ReLU's zeros bias is left out: the scaling pass adds none.)
      AddInt8Gemm(std::move(step), w_data, g.transpose_w, w_key, bias ? &*b_data : nullptr, b_key,
                  in, node.outputs[0]);
      return Status::Ok();
    }
  }
  if (split) {
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
  KeptFp32(n, "int8 takes a constant 2-D weight, read without a transposed view");
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

// Conv and shoal.FusedConv (2-D, constant weights). On cuDNN (GpuPlanOptions::conv): one
// convolution, with the bias, ReLU and residual fused where cuDNN fuses them (fp32 and
// TF32), in mixed precision 16-bit in and out. Otherwise: im2col into a temporary, one GEMM
// per group (batched) into [groups, n, oh, ow, m/groups], a transpose into NCHW, the bias
// and activation in the GEMM's epilogue when there is one group. Then, either way, one
// epilogue step for what the convolution's own step left: the cast from 16 bits, the bias,
// the activation, the residual and the post-activation.
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
  // Each activation's kernel and parameters, for the epilogue step (GeluTanh only in a single
  // group's GEMM epilogue).
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
  const bool residual = node.has_input(3);
  if (residual && ShapeOf(node.inputs[3]) != ys)
    return Fail(n, "the residual must have the output's shape");
  // int8 (GpuPlanOptions::int8_calibration): im2col quantising, an int8 GEMM.
  Int8Input int8;  // how x is quantised; no scale: not int8
  if (options_.int8_calibration) {
    int8 = Int8ProductInput(n, x, rows, kg, mg, true,
                            groups != 1 ? std::to_string(groups) + " groups (int8 takes one)"
                            : act == "GeluTanh" ? "its tanh GELU is fused only into fp32 and "
                                                  "16-bit GEMMs"
                                                : "");
  }
  // What the convolution's step does itself; the steps after do the rest.
  bool bias_done = !bias, act_done = act.empty(), residual_done = !residual,
       post_done = post_act.empty();
  bool on_cudnn = false;
  int half_out = -1;  // a 16-bit cuDNN output, which the epilogue casts into y
  int sums = -1;      // an int8 GEMM's int32 sums, which the epilogue scales into y
  Int8Scaling scaling;
  if (options_.conv == ConvEngine::kCudnn && act != "GeluTanh" && int8.scale == 0) {
    CudnnConvOptions c;
    c.window = g;
    c.m = ws[0];
    c.math = options_.math;
    c.search = options_.conv_search;
    c.what = graph_.Describe(n);
    // cuDNN fuses relu(conv + z + bias): a Conv and its ReLU, or ResNet's residual and ReLU.
    const bool conv_relu = act == "Relu" && !residual && post_act.empty();
    const bool resnet = act.empty() && residual && post_act == "Relu";
    c.fused_bias_relu = !Mixed() && (conv_relu || resnet);
    c.residual = c.fused_bias_relu && residual;
    // A window cuDNN cannot take (pads that differ at the two ends) keeps to im2col.
    on_cudnn = CheckCudnnConv(c).ok();
    if (on_cudnn) {
      GpuStep conv = NewStep(GpuStep::Kind::kConv, n);
      conv.in = {GemmOperand(n, x), c.residual ? node.inputs[3] : -1};
      conv.weight_slots = {AddWeightBlob(KeyOf(node.inputs[1]), *w), -1};
      if (c.fused_bias_relu) {
        conv.weight_slots[1] =
            AddBlob(bias ? KeyOf(node.inputs[2]) : "zeros" + std::to_string(ws[0]),
                    bias ? *bias : Tensor::Allocate(DataType::kFp32, {ws[0]}));
        bias_done = act_done = residual_done = post_done = true;
      }
      conv.conv = c;
      // In mixed precision 16 bits out, as in; the epilogue below casts them into y.
      conv.out = Mixed() ? NewTemp(ys, OperandDtype()) : y;
      half_out = Mixed() ? conv.out : -1;
      out_.steps.push_back(std::move(conv));
    }
  }
  if (!on_cudnn) {
    // im2col.
    GpuStep cols = NewStep(GpuStep::Kind::kIm2Col, n);
    cols.in = {x};
    // In mixed precision the columns are the GEMM's 16-bit operand, rounded as they are made;
    // in int8, quantised.
    cols.out = NewTemp({groups, rows, kg}, int8.scale > 0 ? DataType::kInt8
                                           : Mixed()      ? OperandDtype()
                                                          : DataType::kFp32);
    cols.alpha = int8.inv_scale;
    cols.zero_point = int8.zero_point;
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
    gemm.weight_slots = {-1, -1};
    act_done = groups == 1 || act.empty();
    bias_done = groups == 1 || !bias;
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
    }
    const std::string b_key = bias ? KeyOf(node.inputs[2]) : "zeros" + std::to_string(ws[0]);
    const Tensor b_data = bias ? *bias : Tensor::Allocate(DataType::kFp32, {ws[0]});
    const bool with_bias = o.epilogue != GemmEpilogue::kNone;
    out_.workspace_bytes = std::max<int64_t>(out_.workspace_bytes, o.workspace_bytes);
    if (int8.scale > 0) {
      // int8 (one group): the GEMM writes its int32 sums, [n*oh*ow, m] (NHWC), and the
      // epilogue below scales them, adds the bias (its own, less the zero point's share),
      // applies the activations and the residual and writes y NCHW, in one pass.
      sums = NewTemp({rows, mg}, DataType::kInt32);
      gemm.post.reset();
      scaling = AddInt8Gemm(std::move(gemm), *w, true, KeyOf(node.inputs[1]),
                            bias ? &b_data : nullptr, b_key, int8, sums);
      act_done = act.empty();
      bias_done = true;  // in the scaling's bias
    } else {
      const int product = NewTemp({groups, xs[0], g.oh, g.ow, mg});
      gemm.weight_slots = {AddWeightBlob(KeyOf(node.inputs[1]), *w),
                           with_bias ? AddBlob(b_key, b_data) : -1};
      gemm.out = product;
      out_.steps.push_back(std::move(gemm));
      // Into NCHW: [groups, n, oh, ow, mg] -> [n, groups, mg, oh, ow].
      auto plan = PlanTranspose(ShapeOf(product), std::vector<int64_t>{1, 0, 4, 2, 3});
      if (!plan.ok()) return Fail(n, plan.status().message());
      GpuStep t = NewStep(GpuStep::Kind::kTranspose, n);
      t.in = {product};
      t.out = y;
      t.transpose = std::move(plan).value();
      out_.steps.push_back(std::move(t));
    }
  }
  // What the convolution's step left (a 16-bit output's cast among it, an int8 GEMM's
  // scaling), in one pass: each part a step of its own would read and write all of y again.
  if (half_out < 0 && sums < 0 && bias_done && act_done && residual_done && post_done)
    return Status::Ok();
  GpuStep e = NewStep(GpuStep::Kind::kConvEpilogue, n);
  ConvEpilogueOptions& o = e.conv_epilogue;
  o.n = ys[0];
  o.m = ys[1];
  o.spatial = ys[2] * ys[3];
  if (half_out >= 0)
    o.source = options_.math == GemmMath::kFp16 ? HalfType::kFp16 : HalfType::kBf16;
  if (!act_done) {
    o.act = act_op;
    o.act_alpha = act_alpha;
    o.act_beta = act_beta;
  }
  if (!post_done) {
    o.post = post_op;
    o.post_alpha = post_alpha;
    o.post_beta = post_beta;
  }
  o.int32_sums = o.source_channels_last = sums >= 0;
  if (Status sizes = CheckConvEpilogue(o); !sizes.ok()) return Fail(n, sizes.message());
  e.in = {half_out >= 0 ? half_out : sums >= 0 ? sums : y, residual_done ? -1 : node.inputs[3]};
  e.weight_slots = {bias_done ? -1 : AddBlob(KeyOf(node.inputs[2]), *bias)};
  if (sums >= 0) e.weight_slots = {scaling.bias, scaling.scales};
  e.out = y;
  out_.steps.push_back(std::move(e));
  return Status::Ok();
}

Status Lowerer::AddChannelBias(int n, int y, int bias) {
  const Tensor& b = *Known(bias);
  const Shape ys = ShapeOf(y);
  GpuStep add = NewStep(GpuStep::Kind::kBinary, n);
  add.binary = BinaryOp::kAdd;
  Tensor channels = Tensor::Allocate(DataType::kFp32, {b.element_count(), 1, 1});
  std::copy(b.values<float>().begin(), b.values<float>().end(),
            channels.mutable_values<float>().begin());
  const Shape bias_dims = channels.shape();
  add.weight_slots = {AddBlob(KeyOf(bias) + ":chw", std::move(channels))};
  auto broadcast = PlanBroadcast(ys, bias_dims);
  if (!broadcast.ok()) return Fail(n, broadcast.status().message());
  add.broadcast = std::move(broadcast).value();
  add.in = {y, -1};
  add.out = y;
  out_.steps.push_back(std::move(add));
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

// A 2-D ConvTranspose: on cuDNN where it can (GpuPlanOptions::conv; pads alike at both
// ends), else one kernel that gathers, for each output position, the inputs whose kernel
// footprint covers it. The pads at the output's start follow the CPU engine's rule
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
  if (options_.conv == ConvEngine::kCudnn) {
    // On cuDNN, with constant weights and bias: the backward data of the convolution from y
    // to x, then the bias. It reads fp32 in every tier; the 16-bit tiers run it on TF32
    // tensor cores.
    CudnnConvOptions c;
    c.window = g;
    c.m = m;
    c.transposed = true;
    c.math = options_.math == GemmMath::kFp32 ? GemmMath::kFp32 : GemmMath::kTf32;
    c.search = options_.conv_search;
    c.what = graph_.Describe(n);
    const Tensor* w = Known(node.inputs[1]);
    const bool bias_known = !node.has_input(2) || Known(node.inputs[2]) != nullptr;
    if (w && bias_known && CheckCudnnConv(c).ok()) {
      GpuStep conv = NewStep(GpuStep::Kind::kConv, n);
      conv.in = {node.inputs[0], -1};
      conv.weight_slots = {AddBlob(KeyOf(node.inputs[1]), *w), -1};
      conv.conv = c;
      conv.out = node.outputs[0];
      out_.steps.push_back(std::move(conv));
      if (node.has_input(2)) return AddChannelBias(n, node.outputs[0], node.inputs[2]);
      return Status::Ok();
    }
  }
  GpuStep step = NewStep(GpuStep::Kind::kConvTranspose, n);
  step.in = {node.inputs[0], node.inputs[1], node.has_input(2) ? node.inputs[2] : -1};
  step.window = g;
  step.length = m;
  step.out = node.outputs[0];
  out_.steps.push_back(std::move(step));
  return Status::Ok();
}

}  // namespace shoal::engine::cuda::internal
