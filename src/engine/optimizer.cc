#include "engine/optimizer.h"

#include <cmath>
#include <cstring>
#include <new>

#include "core/fp16.h"
#include "engine/einsum_rewrite.h"
#include "engine/internal/op_util.h"
#include "engine/kernel.h"
#include "engine/weight_cache.h"

namespace shoal::engine {
namespace {

using internal::Product;

// Constants larger than this are not produced by folding (a Tile or Expand of a small
// constant could otherwise blow up the model's memory).
constexpr size_t kMaxFoldedBytes = size_t{64} << 20;

struct Activation {
  std::string name;  // "" for none
  float alpha = 0, beta = 0;
};

class Rewriter {
 public:
  Rewriter(Graph& g, OptimizeReport* report) : g_(g), report_(report) {
    dead_.assign(g.nodes.size(), 0);
    is_output_.assign(g.values.size(), 0);
    for (int v : g.outputs) is_output_[v] = 1;
    RebuildUses();
  }

  void RebuildUses() {
    uses_.assign(g_.values.size(), {});
    is_output_.resize(g_.values.size(), 0);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      if (dead_[n]) continue;
      for (int v : g_.nodes[n].inputs)
        if (v >= 0) uses_[v].push_back(static_cast<int>(n));
    }
  }

  Status FoldConstants();
  void RecogniseGelu();
  void RecogniseLayerNorm();
  void FoldBatchNorm();
  void FuseConv();
  void FuseMatMul();
  void AbsorbTransposes();
  void FuseGemm();
  Graph Compact();

 private:
  void Fired(const std::string& what) { ++report_->fusions[what]; }
  bool Live(int n) const { return n >= 0 && !dead_[n]; }
  bool Is(int n, std::string_view op) const {
    return Live(n) && g_.nodes[n].domain.empty() && g_.nodes[n].op_type == op;
  }
  int Producer(int v) const {
    if (v < 0) return -1;
    const int p = g_.values[v].producer;
    return Live(p) ? p : -1;
  }
  // The node reading `v`, when exactly one node reads it once and it is no graph output.
  int SoleUser(int v) const {
    if (v < 0 || is_output_[v] || uses_[v].size() != 1) return -1;
    return uses_[v][0];
  }
  const Tensor* Const(int v) const {
    return v >= 0 && g_.values[v].is_constant() ? &g_.values[v].constant : nullptr;
  }
  bool Scalar(int v, float* out) const {
    const Tensor* t = Const(v);
    if (!t || t->element_count() != 1 || t->dtype() != DataType::kFp32) return false;
    *out = t->values<float>()[0];
    return true;
  }
  static bool Near(float a, float b) { return std::fabs(a - b) <= 1e-4f * std::max(1.f, b); }
  // Near, or b rounded to FP16: an FP16 model's constants (fp16_lowering.h) hold sqrt(2)
  // as 1.4140625, 1.1e-4 away.
  static bool NearOrFp16(float a, float b) {
    return Near(a, b) || a == Fp16ToFloat(FloatToFp16(b));
  }
  // The other input of a binary node, given one of them.
  int Other(int n, int v) const {
    const Node& node = g_.nodes[n];
    if (node.inputs.size() != 2) return -1;
    if (node.inputs[0] == v) return node.inputs[1];
    if (node.inputs[1] == v) return node.inputs[0];
    return -1;
  }
  bool ShapesEqual(int a, int b) const {
    const auto& sa = g_.values[a].shape;
    const auto& sb = g_.values[b].shape;
    if (!sa || !sb || sa->size() != sb->size()) return false;
    for (size_t i = 0; i < sa->size(); ++i) {
      const Dim &x = (*sa)[i], &y = (*sb)[i];
      if (x.known() != y.known()) return false;
      if (x.known() ? x.value != y.value : (x.symbol.empty() || x.symbol != y.symbol)) return false;
    }
    return true;
  }
  bool ActivationOf(int n, Activation* a) const;
  // A fusion pattern as it grows from its first node: the nodes absorbed so far, the
  // value at its end, that value's sole reader (SoleUser, -1 when none) and the
  // pattern's name for the report ("Conv+Relu+Add").
  struct Chain {
    std::vector<int> absorbed;
    int out = -1;
    int user = -1;
    std::string what;
  };
  Chain StartChain(int n, int out, std::string what) const {
    return Chain{{n}, out, SoleUser(out), std::move(what)};
  }
  // Absorbs node `n` (the chain's reader), whose output becomes the chain's end.
  void Extend(Chain* c, int n, const std::string& label) const {
    c->absorbed.push_back(n);
    c->what += label;
    c->out = g_.nodes[n].outputs.empty() ? -1 : g_.nodes[n].outputs[0];
    c->user = SoleUser(c->out);
  }
  // Absorbs the chain's reader when it is an activation (described in `a`).
  bool ExtendByActivation(Chain* c, Activation* a) const {
    if (!ActivationOf(c->user, a)) return false;
    Extend(c, c->user, "+" + g_.nodes[c->user].op_type);
    return true;
  }
  // Absorbs the chain's reader when it is an Add of a residual: a computed value of the
  // chain end's shape. Returns the residual, else -1.
  int ExtendByResidualAdd(Chain* c) const {
    if (!Is(c->user, "Add")) return -1;
    const int other = Other(c->user, c->out);
    if (other < 0 || other == c->out || Const(other) || !ShapesEqual(other, c->out)) return -1;
    Extend(c, c->user, "+Add");
    return other;
  }
  // Absorbs the chain's reader when it is an Add of a computed value of the chain end's
  // rank whose every dimension is 1 or the chain end's (the output keeps its shape).
  // Returns that value, else -1.
  int ExtendByBroadcastAdd(Chain* c) const {
    if (!Is(c->user, "Add")) return -1;
    const int other = Other(c->user, c->out);
    if (other < 0 || other == c->out || Const(other)) return -1;
    const auto& so = g_.values[other].shape;
    const auto& sc = g_.values[c->out].shape;
    if (!so || !sc || so->size() != sc->size() || so->size() < 3) return -1;
    for (size_t i = 0; i < so->size(); ++i) {
      const Dim &x = (*so)[i], &y = (*sc)[i];
      if (x.known() && x.value == 1) continue;
      if (x.known() && y.known() && x.value == y.value) continue;
      if (!x.known() && !y.known() && !x.symbol.empty() && x.symbol == y.symbol) continue;
      return -1;
    }
    Extend(c, c->user, "+Add(broadcast)");
    return other;
  }
  int NewConstant(const std::string& name, Tensor t) {
    const int v = g_.AddValue(name, t.dtype());
    SymbolicShape s;
    for (int64_t d : t.shape()) s.push_back(Dim{d, ""});
    g_.values[v].shape = s;
    g_.values[v].constant = std::move(t);
    uses_.emplace_back();
    is_output_.push_back(0);
    return v;
  }
  // Replaces node `last` by `fused` (which takes over last's outputs) and kills `absorbed`.
  void Replace(int last, Node fused, const std::vector<int>& absorbed) {
    fused.outputs = g_.nodes[last].outputs;
    if (fused.name.empty()) fused.name = g_.nodes[last].name;
    g_.nodes[last] = std::move(fused);
    for (int n : absorbed)
      if (n != last) dead_[n] = 1;
    RebuildUses();
  }
  static void SetActivation(Node* node, const std::string& prefix, const Activation& a) {
    if (a.name.empty()) return;
    Attribute s;
    s.kind = Attribute::Kind::kString;
    s.s = a.name;
    node->attributes[prefix] = s;
    Attribute f;
    f.kind = Attribute::Kind::kFloat;
    f.f = a.alpha;
    node->attributes[prefix + "_alpha"] = f;
    f.f = a.beta;
    node->attributes[prefix + "_beta"] = f;
  }

  Graph& g_;
  OptimizeReport* report_;
  std::vector<std::vector<int>> uses_;
  std::vector<char> dead_;
  std::vector<char> is_output_;
};

bool Rewriter::ActivationOf(int n, Activation* a) const {
  if (!Live(n) || !g_.nodes[n].domain.empty()) return false;
  const Node& node = g_.nodes[n];
  const std::string& op = node.op_type;
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish") {
    *a = {op, 0, 0};
    return true;
  }
  if (op == "LeakyRelu") {
    *a = {op, node.GetFloat("alpha", 0.01f), 0};
    return true;
  }
  if (op == "Gelu") {
    *a = {node.GetString("approximate", "none") == "tanh" ? "GeluTanh" : "Gelu", 0, 0};
    return true;
  }
  if (op == "Clip") {
    float lo = -INFINITY, hi = INFINITY;
    if (node.attr("min") || node.attr("max")) {  // opset < 11
      lo = node.GetFloat("min", lo);
      hi = node.GetFloat("max", hi);
    } else {
      if (node.inputs.size() > 1 && node.inputs[1] >= 0 && !Scalar(node.inputs[1], &lo))
        return false;
      if (node.inputs.size() > 2 && node.inputs[2] >= 0 && !Scalar(node.inputs[2], &hi))
        return false;
    }
    *a = {op, lo, hi};
    return true;
  }
  return false;
}

// Evaluates node `n`, whose inputs are all constants, with its own kernel.
Status EvaluateNode(const Graph& g, int n, const dnnl::engine& eng, dnnl::stream& stream,
                    std::vector<Tensor>* outs) {
  const Node& node = g.nodes[n];
  const OpDef* def = FindOp(node.domain, node.op_type);
  if (!def) return Unimplemented("no operator");
  PrepareContext ctx;
  PlanOptions options;
  ctx.graph = &g;
  ctx.node_index = n;
  ctx.options = &options;
  ctx.dnnl_engine = &eng;
  for (int v : node.inputs) {
    ctx.in_values.push_back(v);
    const Tensor* t = v >= 0 ? &g.values[v].constant : nullptr;
    ctx.in_dtypes.push_back(t ? t->dtype() : DataType::kInvalid);
    ctx.in_shapes.push_back(t ? t->shape() : Shape{});
    ctx.in_data.push_back(t);
  }
  ctx.SetOutputs(node.outputs.size());
  std::unique_ptr<Kernel> kernel;
  try {
    ASSIGN_OR_RETURN(kernel, def->prepare(ctx));
  } catch (const dnnl::error& e) {
    return InvalidArgument(e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory");
  }
  // A Loop may run without end: it runs per request, under PlanLimits.
  if (kernel && !kernel->runs_at_plan_time()) return Unimplemented("not folded");
  outs->assign(node.outputs.size(), Tensor());
  bool computed = true;
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] < 0) continue;
    const size_t bytes =
        static_cast<size_t>(Product(ctx.out_shapes[o])) * DataTypeSize(ctx.out_dtypes[o]);
    if (bytes > kMaxFoldedBytes) return ResourceExhausted("too large to fold");
    if (ctx.out_data[o].empty()) computed = false;
  }
  if (computed) {
    *outs = ctx.out_data;
    return Status::Ok();
  }
  if (!kernel) return Internal("no kernel");
  if (kernel->alias_input() >= 0) {
    const Tensor& src = g.values[node.inputs[kernel->alias_input()]].constant;
    Tensor copy = Tensor::Allocate(ctx.out_dtypes[0], ctx.out_shapes[0], src.byte_size());
    if (src.byte_size()) std::memcpy(copy.mutable_data(), src.data(), src.byte_size());
    (*outs)[0] = std::move(copy);
    return Status::Ok();
  }
  RunContext rc;
  rc.stream = &stream;
  for (int v : node.inputs) rc.inputs.push_back(v >= 0 ? &g.values[v].constant : nullptr);
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] >= 0) (*outs)[o] = Tensor::Allocate(ctx.out_dtypes[o], ctx.out_shapes[o]);
    rc.outputs.push_back(node.outputs[o] >= 0 ? &(*outs)[o] : nullptr);
  }
  // As Plan::AddStep: nothing to compute only when every present output is empty and
  // none is data-dependent (a Loop whose first output is empty still has scan outputs).
  bool all_empty = true;
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] >= 0 && (ctx.out_dynamic[o] || Product(ctx.out_shapes[o]) != 0))
      all_empty = false;
  }
  try {
    if (!all_empty) RETURN_IF_ERROR(kernel->Run(rc));
    stream.wait();
  } catch (const dnnl::error& e) {
    return InvalidArgument(e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory");
  }
  return Status::Ok();
}

Status Rewriter::FoldConstants() {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (dead_[n]) continue;
    Node& node = g_.nodes[n];
    // Shape of a value whose dimensions are all known at load time.
    if (node.domain.empty() && node.op_type == "Shape" && node.has_input(0) && node.has_output(0) &&
        !node.inputs.empty()) {
      const auto& s = g_.values[node.inputs[0]].shape;
      if (s) {
        const int64_t rank = static_cast<int64_t>(s->size());
        int64_t start = node.GetInt("start", 0), end = node.GetInt("end", rank);
        if (start < 0) start += rank;
        if (end < 0) end += rank;
        start = std::clamp<int64_t>(start, 0, rank);
        end = std::clamp<int64_t>(end, start, rank);
        std::vector<int64_t> dims;
        bool known = true;
        for (int64_t i = start; i < end; ++i) {
          known &= (*s)[i].known();
          dims.push_back((*s)[i].value);
        }
        if (known) {
          g_.values[node.outputs[0]].constant =
              Tensor::FromVector(DataType::kInt64, {static_cast<int64_t>(dims.size())}, dims);
          dead_[n] = 1;
          ++report_->folded_nodes;
          continue;
        }
      }
    }
    bool all_const = !node.inputs.empty();
    for (int v : node.inputs)
      if (v >= 0 && !g_.values[v].is_constant()) all_const = false;
    if (!all_const) continue;
    bool any_output = false;
    for (int v : node.outputs) any_output |= v >= 0;
    if (!any_output) continue;
    std::vector<Tensor> outs;
    if (!EvaluateNode(g_, static_cast<int>(n), eng, stream, &outs).ok()) continue;
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o] >= 0) g_.values[node.outputs[o]].constant = std::move(outs[o]);
    }
    dead_[n] = 1;
    ++report_->folded_nodes;
  }
  RebuildUses();
  return Status::Ok();
}

// x * 0.5 * (1 + erf(x / sqrt(2))), as PyTorch exports nn.GELU, in either order of the
// two multiplications; sqrt(2) may be its FP16 rounding (an FP16 export's constant).
void Rewriter::RecogniseGelu() {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (!Is(n, "Erf")) continue;
    const int erf = static_cast<int>(n);
    const int d = Producer(g_.nodes[erf].inputs[0]);
    float c = 0;
    int x = -1;
    if (Is(d, "Div") && Scalar(g_.nodes[d].inputs[1], &c) && NearOrFp16(c, std::sqrt(2.f))) {
      x = g_.nodes[d].inputs[0];
    } else if (Is(d, "Mul")) {
      for (int i = 0; i < 2; ++i)
        if (Scalar(g_.nodes[d].inputs[i], &c) && NearOrFp16(c, std::sqrt(0.5f)))
          x = g_.nodes[d].inputs[1 - i];
    }
    if (x < 0 || SoleUser(g_.nodes[d].outputs[0]) != erf) continue;
    const int add = SoleUser(g_.nodes[erf].outputs[0]);
    if (!Is(add, "Add") || !Scalar(Other(add, g_.nodes[erf].outputs[0]), &c) || !Near(c, 1.f))
      continue;
    const int mul1 = SoleUser(g_.nodes[add].outputs[0]);
    if (!Is(mul1, "Mul")) continue;
    const int other = Other(mul1, g_.nodes[add].outputs[0]);
    int last = -1;
    std::vector<int> absorbed = {d, erf, add, mul1};
    if (other == x) {  // (x * (1 + erf)) * 0.5
      const int mul2 = SoleUser(g_.nodes[mul1].outputs[0]);
      if (!Is(mul2, "Mul") || !Scalar(Other(mul2, g_.nodes[mul1].outputs[0]), &c) || !Near(c, 0.5f))
        continue;
      last = mul2;
      absorbed.push_back(mul2);
    } else {  // (x * 0.5) * (1 + erf)
      const int half = Producer(other);
      if (!Is(half, "Mul") || Other(half, x) < 0 || !Scalar(Other(half, x), &c) || !Near(c, 0.5f) ||
          SoleUser(other) != mul1)
        continue;
      last = mul1;
      absorbed.push_back(half);
    }
    Node gelu;
    gelu.op_type = "Gelu";
    gelu.inputs = {x};
    Replace(last, std::move(gelu), absorbed);
    Fired("Gelu(erf pattern)");
  }
}

// ReduceMean -> Sub -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Div -> Mul gamma -> Add beta
// over the last axis.
void Rewriter::RecogniseLayerNorm() {
  auto last_axis = [&](int n, int x) {
    const Node& node = g_.nodes[n];
    auto axes = node.GetInts("axes", {});
    if (axes.size() != 1 || node.GetInt("keepdims", 1) != 1) return false;
    if (axes[0] == -1) return true;
    const auto& s = g_.values[x].shape;
    return s && axes[0] == static_cast<int64_t>(s->size()) - 1;
  };
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (!Is(n, "ReduceMean")) continue;
    const int r1 = static_cast<int>(n);
    const int x = g_.nodes[r1].inputs[0];
    if (!last_axis(r1, x)) continue;
    const int mean = g_.nodes[r1].outputs[0];
    const int sub = SoleUser(mean);
    if (!Is(sub, "Sub") || g_.nodes[sub].inputs[0] != x || g_.nodes[sub].inputs[1] != mean)
      continue;
    const int diff = g_.nodes[sub].outputs[0];
    if (is_output_[diff] || uses_[diff].size() != 2) continue;
    int pow = -1, div = -1;
    for (int u : uses_[diff]) {
      if (Is(u, "Pow") && g_.nodes[u].inputs[0] == diff) pow = u;
      if (Is(u, "Div") && g_.nodes[u].inputs[0] == diff) div = u;
    }
    float c = 0;
    if (pow < 0 || div < 0 || !Scalar(g_.nodes[pow].inputs[1], &c) || c != 2.f) continue;
    const int r2 = SoleUser(g_.nodes[pow].outputs[0]);
    if (!Is(r2, "ReduceMean") || !last_axis(r2, diff)) continue;
    const int add = SoleUser(g_.nodes[r2].outputs[0]);
    float eps = 0;
    if (!Is(add, "Add") || !Scalar(Other(add, g_.nodes[r2].outputs[0]), &eps)) continue;
    const int sqrt = SoleUser(g_.nodes[add].outputs[0]);
    if (!Is(sqrt, "Sqrt") || SoleUser(g_.nodes[sqrt].outputs[0]) != div ||
        g_.nodes[div].inputs[1] != g_.nodes[sqrt].outputs[0])
      continue;
    const int mul = SoleUser(g_.nodes[div].outputs[0]);
    if (!Is(mul, "Mul")) continue;
    const int gamma = Other(mul, g_.nodes[div].outputs[0]);
    const Tensor* gt = Const(gamma);
    if (!gt || gt->shape().size() != 1) continue;
    const int badd = SoleUser(g_.nodes[mul].outputs[0]);
    int beta = -1, last = mul;
    if (Is(badd, "Add")) {
      const int b = Other(badd, g_.nodes[mul].outputs[0]);
      const Tensor* bt = Const(b);
      if (bt && bt->shape() == gt->shape()) {
        beta = b;
        last = badd;
      }
    }
    Node ln;
    ln.op_type = "LayerNormalization";
    ln.inputs = {x, gamma};
    if (beta >= 0) ln.inputs.push_back(beta);
    Attribute a;
    a.kind = Attribute::Kind::kInt;
    a.i = -1;
    ln.attributes["axis"] = a;
    Attribute e;
    e.kind = Attribute::Kind::kFloat;
    e.f = eps;
    ln.attributes["epsilon"] = e;
    Replace(last, std::move(ln), {r1, sub, pow, r2, add, sqrt, div, mul, badd});
    Fired("LayerNormalization(pattern)");
  }
}

void Rewriter::FoldBatchNorm() {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (!Is(n, "Conv")) continue;
    const int conv = static_cast<int>(n);
    const Node& cn = g_.nodes[conv];
    if (cn.inputs.size() < 2 || !cn.has_output(0)) continue;
    const Tensor* w = Const(cn.inputs[1]);
    const Tensor* b = cn.has_input(2) ? Const(cn.inputs[2]) : nullptr;
    if (!w || w->dtype() != DataType::kFp32 || w->shape().empty() || (cn.has_input(2) && !b))
      continue;
    const int bn = SoleUser(cn.outputs[0]);
    if (!Is(bn, "BatchNormalization") || g_.nodes[bn].inputs.size() != 5 ||
        g_.nodes[bn].inputs[0] != cn.outputs[0] || g_.nodes[bn].has_output(1))
      continue;
    const Node& bnn = g_.nodes[bn];
    const int64_t m = w->shape()[0];
    const Tensor* p[4];
    bool ok = true;
    for (int i = 0; i < 4; ++i) {
      p[i] = Const(bnn.inputs[1 + i]);
      ok &= p[i] && p[i]->dtype() == DataType::kFp32 && p[i]->element_count() == m;
    }
    if (!ok || (b && b->element_count() != m)) continue;
    const float eps = bnn.GetFloat("epsilon", 1e-5f);
    auto scale = p[0]->values<float>(), shift = p[1]->values<float>();
    auto mean = p[2]->values<float>(), var = p[3]->values<float>();
    Tensor nw = Tensor::Allocate(DataType::kFp32, w->shape());
    Tensor nb = Tensor::Allocate(DataType::kFp32, {m});
    const int64_t per = w->element_count() / m;
    auto src = w->values<float>();
    auto dw = nw.mutable_values<float>();
    auto db = nb.mutable_values<float>();
    for (int64_t o = 0; o < m; ++o) {
      const float k = scale[o] / std::sqrt(var[o] + eps);
      for (int64_t i = 0; i < per; ++i) dw[o * per + i] = src[o * per + i] * k;
      db[o] = ((b ? b->values<float>()[o] : 0.f) - mean[o]) * k + shift[o];
    }
    Node fused = cn;
    const std::string base = g_.values[cn.inputs[1]].name;
    fused.inputs = {cn.inputs[0], NewConstant(base + ":bn_folded", std::move(nw)),
                    NewConstant(base + ":bn_bias", std::move(nb))};
    Replace(bn, std::move(fused), {conv});
    Fired("Conv+BatchNormalization");
  }
}

void Rewriter::FuseConv() {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (!Is(n, "Conv")) continue;
    const int conv = static_cast<int>(n);
    const int out = g_.nodes[conv].outputs.empty() ? -1 : g_.nodes[conv].outputs[0];
    if (out < 0) continue;
    Chain c = StartChain(conv, out, "Conv");
    Activation act, post;
    ExtendByActivation(&c, &act);
    const int residual = ExtendByResidualAdd(&c);
    if (residual >= 0) ExtendByActivation(&c, &post);
    if (c.absorbed.size() == 1) continue;
    Node fused = g_.nodes[conv];
    fused.domain = "shoal";
    fused.op_type = "FusedConv";
    fused.inputs.resize(3, -1);
    if (residual >= 0) fused.inputs.push_back(residual);
    SetActivation(&fused, "activation", act);
    SetActivation(&fused, "post_activation", post);
    Replace(c.absorbed.back(), std::move(fused), c.absorbed);
    Fired(c.what);
  }
}

void Rewriter::FuseMatMul() {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (!Is(n, "MatMul")) continue;
    const int mm = static_cast<int>(n);
    const Node& node = g_.nodes[mm];
    if (node.inputs.size() != 2 || node.outputs.empty() || node.outputs[0] < 0) continue;
    // B's shape bounds the bias; unknown (a computed B, as in attention) means no bias.
    const auto& bs = g_.values[node.inputs[1]].shape;
    if (bs && bs->size() < 2) continue;  // a vector: leave as is
    Chain ch = StartChain(mm, node.outputs[0], "MatMul");
    float alpha = 1.f, c = 0;
    int bias = -1;
    Activation act;
    const int u = ch.user;
    if ((Is(u, "Mul") && Scalar(Other(u, ch.out), &c)) ||
        (Is(u, "Div") && g_.nodes[u].inputs[0] == ch.out && Scalar(g_.nodes[u].inputs[1], &c))) {
      alpha = Is(u, "Mul") ? c : 1.f / c;
      Extend(&ch, u, "+Scale");
    }
    const int64_t ncols = bs ? bs->back().value : -1;
    if (Is(ch.user, "Add")) {
      const Tensor* t = Const(Other(ch.user, ch.out));
      if (t && t->dtype() == DataType::kFp32 && ncols > 0 && t->element_count() == ncols &&
          !t->shape().empty() && t->shape().back() == ncols) {
        bias = Other(ch.user, ch.out);
        Extend(&ch, ch.user, "+Add(bias)");
      }
    }
    ExtendByActivation(&ch, &act);
    int residual = ExtendByResidualAdd(&ch);
    // A computed addend that broadcasts onto the product (attention's mask, [batch, 1, 1,
    // keys] onto [batch, heads, queries, keys]) is a post-op too, when B is computed (a
    // batched product: oneDNN broadcasts the addend over the batch and row axes).
    if (residual < 0 && !Const(node.inputs[1])) residual = ExtendByBroadcastAdd(&ch);
    if (ch.absorbed.size() == 1) continue;
    if (alpha != 1.f && bias >= 0) {  // oneDNN scales the bias too: pass bias / alpha
      const Tensor* t = Const(bias);
      Tensor scaled = Tensor::Allocate(DataType::kFp32, t->shape());
      for (int64_t i = 0; i < t->element_count(); ++i)
        scaled.mutable_values<float>()[i] = t->values<float>()[i] / alpha;
      bias = NewConstant(g_.values[bias].name + ":scaled", std::move(scaled));
    }
    Node fused;
    fused.name = node.name;
    fused.domain = "shoal";
    fused.op_type = "FusedMatMul";
    fused.inputs = {node.inputs[0], node.inputs[1], bias};
    if (residual >= 0) fused.inputs.push_back(residual);
    Attribute a;
    a.kind = Attribute::Kind::kFloat;
    a.f = alpha;
    fused.attributes["alpha"] = a;
    SetActivation(&fused, "activation", act);
    // Q·Kᵀ scaled, then (a mask added, then) Softmax: the attention score pattern.
    const int after = Is(ch.user, "Add") ? SoleUser(g_.nodes[ch.user].outputs[0]) : ch.user;
    std::string what = ch.what;
    if (alpha != 1.f && Is(after, "Softmax")) what = "attention scores (" + what + ")";
    Replace(ch.absorbed.back(), std::move(fused), ch.absorbed);
    Fired(what);
  }
}

// A Transpose that only feeds a batched product's A or B, or is the only reader of its
// result, becomes part of the product (shoal.FusedMatMul's a_perm, b_perm, c_perm):
// oneDNN's matmul reads and writes the transposed views through strides, with no copy.
// BERT's attention splits Q, K and V into heads and merges the heads back this way.
void Rewriter::AbsorbTransposes() {
  auto rank = [&](int v) -> int {
    const auto& s = g_.values[v].shape;
    return s ? static_cast<int>(s->size()) : -1;
  };
  auto perm_of = [&](int t, int r) -> std::vector<int64_t> {
    std::vector<int64_t> perm = g_.nodes[t].GetInts("perm", {});
    if (perm.empty())
      for (int i = r - 1; i >= 0; --i) perm.push_back(i);
    std::vector<char> seen(r, 0);
    if (static_cast<int>(perm.size()) != r) return {};
    for (int64_t p : perm) {
      if (p < 0 || p >= r || seen[p]) return {};
      seen[p] = 1;
    }
    return perm;
  };
  auto set_ints = [](Node* node, const std::string& name, const std::vector<int64_t>& v) {
    Attribute a;
    a.kind = Attribute::Kind::kInts;
    a.ints = v;
    node->attributes[name] = a;
  };
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    const int mm = static_cast<int>(n);
    const bool plain = Is(mm, "MatMul");
    if (!plain &&
        !(Live(mm) && g_.nodes[mm].domain == "shoal" && g_.nodes[mm].op_type == "FusedMatMul"))
      continue;
    Node node = g_.nodes[mm];
    if (node.inputs.size() < 2 || node.inputs[0] < 0 || node.inputs[1] < 0 ||
        node.outputs.empty() || node.outputs[0] < 0 || node.attributes.count("a_perm") ||
        node.attributes.count("b_perm") || node.attributes.count("c_perm"))
      continue;
    // Batched products of computed values of one rank >= 3 (no broadcasting of a
    // matrix, no weights: those keep their own layouts).
    const int r = rank(node.inputs[0]);
    if (r < 3 || rank(node.inputs[1]) != r || Const(node.inputs[0]) || Const(node.inputs[1]))
      continue;
    // The strided product multiplies batch by batch, without broadcasting: the operands'
    // batch dimensions must be the same, as far as the graph can tell (a known size, or
    // one symbol), or MatMul's broadcast of a 1 would be lost.
    bool same_batch = true;
    for (int d = 0; d + 2 < r; ++d) {
      const Dim& x = (*g_.values[node.inputs[0]].shape)[d];
      const Dim& y = (*g_.values[node.inputs[1]].shape)[d];
      same_batch &= x.known() ? y.known() && x.value == y.value
                              : !y.known() && !x.symbol.empty() && x.symbol == y.symbol;
    }
    if (!same_batch) continue;
    std::vector<int> absorbed = {mm};
    std::string what = "Transpose into MatMul (";
    for (int i = 0; i < 2; ++i) {
      const int t = Producer(node.inputs[i]);
      if (!Is(t, "Transpose") || SoleUser(node.inputs[i]) != mm) continue;
      const std::vector<int64_t> perm = perm_of(t, r);
      // A's rows stay contiguous (K innermost): the layout oneDNN's kernels read fast.
      if (perm.empty() || (i == 0 && perm.back() != r - 1)) continue;
      // A transposed weight (one too large to fold) keeps its Transpose: the strided
      // product reads computed operands only.
      if (Const(g_.nodes[t].inputs[0])) continue;
      node.inputs[i] = g_.nodes[t].inputs[0];
      set_ints(&node, i == 0 ? "a_perm" : "b_perm", perm);
      absorbed.push_back(t);
      what += i == 0 ? "A" : (absorbed.size() > 2 ? ", B" : "B");
    }
    int last = mm;
    const int u = SoleUser(node.outputs[0]);
    const bool residual = node.inputs.size() > 3 && node.inputs[3] >= 0;
    if (Is(u, "Transpose") && !residual) {
      const std::vector<int64_t> perm = perm_of(u, r);
      if (!perm.empty()) {
        set_ints(&node, "c_perm", perm);
        absorbed.push_back(u);
        last = u;
        what += absorbed.size() > 2 ? ", output" : "output";
      }
    }
    if (absorbed.size() == 1) continue;
    node.domain = "shoal";
    node.op_type = "FusedMatMul";
    Replace(last, std::move(node), absorbed);
    Fired(what + ")");
  }
}

void Rewriter::FuseGemm() {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (!Is(n, "Gemm")) continue;
    const int gemm = static_cast<int>(n);
    if (g_.nodes[gemm].outputs.empty() || g_.nodes[gemm].outputs[0] < 0) continue;
    Activation act;
    const int u = SoleUser(g_.nodes[gemm].outputs[0]);
    if (!ActivationOf(u, &act)) continue;
    Node fused = g_.nodes[gemm];
    fused.domain = "shoal";
    fused.op_type = "FusedGemm";
    SetActivation(&fused, "activation", act);
    const std::string what = "Gemm+" + g_.nodes[u].op_type;
    Replace(u, std::move(fused), {gemm});
    Fired(what);
  }
}

Graph Rewriter::Compact() {
  // Dead-node removal: keep what the graph outputs need.
  std::vector<char> needed(g_.values.size(), 0);
  for (int v : g_.outputs) needed[v] = 1;
  for (size_t k = g_.nodes.size(); k-- > 0;) {
    if (dead_[k]) continue;
    bool used = false;
    for (int v : g_.nodes[k].outputs) used |= v >= 0 && needed[v];
    if (!used) {
      dead_[k] = 1;
      ++report_->removed_nodes;
      continue;
    }
    for (int v : g_.nodes[k].inputs)
      if (v >= 0) needed[v] = 1;
  }
  Graph out;
  out.name = g_.name;
  out.opset = g_.opset;
  out.values = std::move(g_.values);
  out.inputs = g_.inputs;
  out.outputs = g_.outputs;
  for (int v : out.inputs) needed[v] = 1;
  for (auto& v : out.values) v.producer = -1;
  for (size_t v = 0; v < out.values.size(); ++v) {
    if (!needed[v] && out.values[v].is_constant()) out.values[v].constant = Tensor();
  }
  for (size_t k = 0; k < g_.nodes.size(); ++k) {
    if (dead_[k]) continue;
    for (int v : g_.nodes[k].outputs) {
      if (v >= 0) out.values[v].producer = static_cast<int>(out.nodes.size());
    }
    out.nodes.push_back(std::move(g_.nodes[k]));
  }
  return out;
}

}  // namespace

std::string OptimizeReport::Summary() const {
  std::string s = std::to_string(nodes_before) + " -> " + std::to_string(nodes_after) + " nodes";
  if (folded_nodes) s += "; " + std::to_string(folded_nodes) + " folded to constants";
  if (removed_nodes) s += "; " + std::to_string(removed_nodes) + " dead removed";
  for (const auto& [what, count] : fusions) s += "; " + what + " x" + std::to_string(count);
  return s;
}

StatusOr<Graph> OptimizeGraph(Graph graph, const OptimizeOptions& options, OptimizeReport* report) {
  OptimizeReport local;
  if (!report) report = &local;
  *report = OptimizeReport();
  report->nodes_before = static_cast<int>(graph.nodes.size());
  if (!options.enabled) {
    report->nodes_after = report->nodes_before;
    return graph;
  }
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (int v : graph.nodes[n].outputs)
      if (v >= 0) graph.values[v].producer = static_cast<int>(n);
  }
  // Subgraphs (If branches, Loop bodies) are optimised as graphs of their own, with
  // their fusions counted in this report.
  for (Node& node : graph.nodes) {
    for (auto& [name, attr] : node.attributes) {
      if (attr.kind != Attribute::Kind::kGraph || !attr.g) continue;
      // Shapes a file declares inside a Loop body may hold for the first iteration only
      // (a loop-carried value can change shape), so the body's own folds and fusions
      // see none but those of constants.
      Graph copy = *attr.g;
      for (Value& v : copy.values)
        if (!v.is_constant()) v.shape.reset();
      OptimizeReport sub_report;
      ASSIGN_OR_RETURN(Graph sub, OptimizeGraph(std::move(copy), options, &sub_report));
      sub.captures = attr.g->captures;
      report->folded_nodes += sub_report.folded_nodes;
      report->removed_nodes += sub_report.removed_nodes;
      for (const auto& [what, count] : sub_report.fusions) report->fusions[what] += count;
      attr.g = std::make_shared<const Graph>(std::move(sub));
    }
  }
  if (options.fuse) {
    // First, so that folding and the product passes below see the products it makes.
    if (const int n = RewriteEinsumsAsProducts(&graph)) report->fusions["Einsum as MatMul"] += n;
  }
  Rewriter r(graph, report);
  if (options.fold_constants) RETURN_IF_ERROR(r.FoldConstants());
  if (options.fuse) {
    r.RecogniseGelu();
    r.RecogniseLayerNorm();
    r.FoldBatchNorm();
    r.FuseConv();
    r.FuseMatMul();
    r.AbsorbTransposes();
    r.FuseGemm();
  }
  Graph out = r.Compact();
  report->nodes_after = static_cast<int>(out.nodes.size());
  RETURN_IF_ERROR(out.Validate());
  return out;
}

}  // namespace shoal::engine
