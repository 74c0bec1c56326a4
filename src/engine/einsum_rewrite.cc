#include "engine/einsum_rewrite.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/internal/onnx_dtype.h"

namespace shoal::engine {
namespace {

// Each value's type where the graph tells it: the value's own, a constant's, or, through
// nodes whose first output has their first input's type (Where: its second input's), the
// type of what they read. kInvalid where nothing says.
std::vector<DataType> KnownTypes(const Graph& g) {
  static const std::set<std::string_view> kKeepsType = {
      "Identity",  "Reshape",    "Transpose", "Squeeze",    "Unsqueeze",
      "Flatten",   "Add",        "Sub",       "Mul",        "Div",
      "Pow",       "Neg",        "Abs",       "Exp",        "Log",
      "Sqrt",      "Relu",       "LeakyRelu", "Sigmoid",    "Tanh",
      "Erf",       "Gelu",       "Softmax",   "LogSoftmax", "MatMul",
      "Gemm",      "Concat",     "Slice",     "Gather",     "GatherElements",
      "Split",     "Expand",     "Tile",      "Pad",        "LayerNormalization",
      "ReduceSum", "ReduceMean", "ReduceMax", "Dropout",    "Einsum",
      "Clip",      "Min",        "Max",       "Conv",       "BatchNormalization"};
  std::vector<DataType> type(g.values.size(), DataType::kInvalid);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    type[v] = val.dtype != DataType::kInvalid ? val.dtype
              : val.is_constant()             ? val.constant.dtype()
                                              : DataType::kInvalid;
  }
  for (const Node& n : g.nodes) {
    if (!n.domain.empty() || n.outputs.empty()) continue;
    DataType t = DataType::kInvalid;
    if (n.op_type == "Cast") {
      if (auto to = internal::DataTypeFromOnnx(n.GetInt("to", 0))) t = *to;
    } else if (n.op_type == "Where") {
      if (n.has_input(1)) t = type[n.inputs[1]];
    } else if (kKeepsType.count(n.op_type) && n.has_input(0)) {
      t = type[n.inputs[0]];
    }
    // Split's outputs all have its input's type; other nodes' later outputs may not.
    const size_t outs = n.op_type == "Split" ? n.outputs.size() : 1;
    for (size_t o = 0; o < outs; ++o) {
      const int v = n.outputs[o];
      if (v >= 0 && type[v] == DataType::kInvalid) type[v] = t;
    }
  }
  return type;
}

// The equation's one or two input terms (b empty for one) and its output, each a string
// of distinct letters with '*' where an ellipsis stands (at most one per term); nullopt for
// anything else (three operands, a diagonal). Expand() replaces the '*'s once the operands'
// ranks are known.
struct Equation {
  std::string a, b, out;
};
std::optional<Equation> ParseProduct(std::string_view eq) {
  std::string s;
  for (char c : eq)
    if (c != ' ') s += c;
  const size_t arrow = s.find("->");
  if (s.find('*') != std::string::npos) return {};  // not a label (the kernel refuses it)
  std::string lhs = s.substr(0, arrow);
  std::string rhs = arrow == std::string::npos ? "" : s.substr(arrow + 2);
  for (std::string* t : {&lhs, &rhs}) {
    for (size_t at; (at = t->find("...")) != std::string::npos;) t->replace(at, 3, "*");
  }
  const size_t comma = lhs.find(',');
  if (comma != std::string::npos && lhs.find(',', comma + 1) != std::string::npos) return {};
  Equation e{lhs.substr(0, comma), comma == std::string::npos ? "" : lhs.substr(comma + 1), {}};
  auto distinct_labels = [](const std::string& t) {
    for (size_t i = 0; i < t.size(); ++i) {
      if (!std::isalpha(static_cast<unsigned char>(t[i])) && t[i] != '*') return false;
      if (t.find(t[i], i + 1) != std::string::npos) return false;
    }
    return true;
  };
  if (!distinct_labels(e.a) || !distinct_labels(e.b)) return {};
  if (arrow == std::string::npos) {
    // Implicit output: the ellipsis, then the letters that occur once, in character order
    // (ops/einsum.cc).
    std::map<char, int> count;
    for (char c : e.a + e.b) ++count[c];
    if (count.count('*')) e.out = "*";
    for (const auto& [c, n] : count)
      if (n == 1 && c != '*') e.out += c;
  } else {
    e.out = rhs;
    if (!distinct_labels(e.out)) return {};
  }
  return e;
}

// Replaces each term's '*' by labels of its own ('0', '1'... for the broadcast ellipsis
// dimensions, aligned at the right as NumPy aligns them) once the operands' ranks are
// known; false when a term does not fit its operand's rank, or the output has an ellipsis
// no operand has.
bool Expand(Equation* e, size_t rank_a, size_t rank_b) {
  auto count = [](const std::string& t, size_t rank, size_t* k) {
    const bool has = t.find('*') != std::string::npos;
    const size_t letters = t.size() - (has ? 1 : 0);
    if (has ? rank < letters : rank != letters) return false;
    *k = has ? rank - letters : 0;
    return true;
  };
  size_t ka = 0, kb = 0;
  if (!count(e->a, rank_a, &ka) || (!e->b.empty() && !count(e->b, rank_b, &kb))) return false;
  const size_t k = std::max(ka, kb);
  if (k > 10) return false;
  auto expand = [&](std::string* t, size_t n) {
    const size_t at = t->find('*');
    if (at == std::string::npos) return;
    std::string labels;
    for (size_t j = k - n; j < k; ++j) labels += static_cast<char>('0' + j);
    t->replace(at, 1, labels);
  };
  const bool out_has = e->out.find('*') != std::string::npos;
  if (out_has && e->a.find('*') == std::string::npos && e->b.find('*') == std::string::npos)
    return false;
  expand(&e->a, ka);
  expand(&e->b, kb);
  expand(&e->out, k);
  return true;
}

// The labels in `order` that `pred` keeps, in that order.
template <typename Pred>
std::string Pick(const std::string& order, Pred pred) {
  std::string r;
  for (char c : order)
    if (pred(c)) r += c;
  return r;
}

// Where each label of `target` sits in `from`.
std::vector<int64_t> PermOf(const std::string& from, const std::string& target) {
  std::vector<int64_t> perm;
  for (char c : target) perm.push_back(static_cast<int64_t>(from.find(c)));
  return perm;
}

bool Identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// An operand on its way to the product: its value, a label per axis ('#' for contraction
// labels merged into one axis, '<' and '>' for unit axes standing in for an absent M or
// N), and its dims where known.
struct Operand {
  int v = -1;
  std::string labels;
  SymbolicShape dims;
};

// The product of `dims`, known when each is.
Dim Merged(const SymbolicShape& dims) {
  int64_t p = 1;
  for (const Dim& d : dims) {
    if (!d.known()) return Dim{};
    p *= d.value;
  }
  return Dim{p, ""};
}

// The first `n` dims.
SymbolicShape Head(const SymbolicShape& dims, size_t n) {
  return SymbolicShape(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(n));
}

// Whether two dims are the same as far as the graph can tell: one known size, or one
// (non-empty) symbol.
bool SameDim(const Dim& a, const Dim& b) {
  return a.known() ? b.known() && a.value == b.value
                   : !b.known() && !a.symbol.empty() && a.symbol == b.symbol;
}

// Emits the nodes of one rewrite, each writing a new fp32 value named after the Einsum,
// under a name no other value has (the int8 tier keys its calibration by value name).
class Emitter {
 public:
  Emitter(Graph& g, std::string base, std::set<std::string>& names)
      : g_(g), base_(std::move(base)), names_(names) {}

  // ReduceSum over `labels` (keepdims 0), its axes as the graph's opset takes them.
  Operand Sum(const Operand& x, const std::string& labels, const std::string& suffix) {
    std::vector<int64_t> axes;
    Operand out;
    for (size_t i = 0; i < x.labels.size(); ++i) {
      if (labels.find(x.labels[i]) != std::string::npos) {
        axes.push_back(static_cast<int64_t>(i));
      } else {
        out.labels += x.labels[i];
        out.dims.push_back(x.dims[i]);
      }
    }
    Node n = NewNode("ReduceSum", suffix, {x.v});
    n.attributes["keepdims"] = IntAttr(0);
    if (g_.opset >= 13) {
      n.inputs.push_back(IntsConstant(suffix + ":axes", axes));
    } else {
      n.attributes["axes"] = IntsAttr(axes);
    }
    return Finish(std::move(n), std::move(out));
  }

  // Transpose into `order` (a permutation of x's labels); x itself when already so.
  Operand Permute(const Operand& x, const std::string& order, const std::string& suffix) {
    const std::vector<int64_t> perm = PermOf(x.labels, order);
    if (Identity(perm)) return x;
    Operand out{-1, order, {}};
    for (int64_t p : perm) out.dims.push_back(x.dims[static_cast<size_t>(p)]);
    Node n = NewNode("Transpose", suffix, {x.v});
    n.attributes["perm"] = IntsAttr(perm);
    return Finish(std::move(n), std::move(out));
  }

  // Reshape to `shape` (0 keeps the input's dim there, -1 takes the rest).
  Operand Reshape(const Operand& x, const std::vector<int64_t>& shape, Operand out,
                  const std::string& suffix) {
    Node n = NewNode("Reshape", suffix, {x.v, IntsConstant(suffix + ":shape", shape)});
    return Finish(std::move(n), std::move(out));
  }

  // Keeps x's first `keep` axes, then a unit axis labelled `unit` when `add_unit`, and
  // merges the rest into one axis, labelled '#' (a Reshape).
  Operand MergeTail(const Operand& x, size_t keep, bool add_unit, char unit,
                    const std::string& suffix) {
    std::vector<int64_t> shape(keep, 0);
    Operand out{-1, x.labels.substr(0, keep), Head(x.dims, keep)};
    if (add_unit) {
      shape.push_back(1);
      out.labels += unit;
      out.dims.push_back(Dim{1, ""});
    }
    const Dim merged =
        Merged(SymbolicShape(x.dims.begin() + static_cast<std::ptrdiff_t>(keep), x.dims.end()));
    // Its size where known: -1 cannot be inferred when a dim kept before it is 0.
    shape.push_back(merged.known() ? merged.value : -1);
    out.labels += '#';
    out.dims.push_back(merged);
    return Reshape(x, shape, std::move(out), suffix);
  }

  Operand MatMul(const Operand& a, const Operand& b, Operand out, const std::string& suffix) {
    return Finish(NewNode("MatMul", suffix, {a.v, b.v}), std::move(out));
  }

  // The nodes emitted, the last one writing `dst` under the name `name`.
  std::vector<Node> Take(int dst, const std::string& name) {
    Node& last = nodes_.back();
    const int orphan = last.outputs[0];
    last.outputs[0] = dst;
    last.name = name;
    if (orphan == static_cast<int>(g_.values.size()) - 1) g_.values.pop_back();
    return std::move(nodes_);
  }

 private:
  static Attribute IntAttr(int64_t v) {
    Attribute a;
    a.kind = Attribute::Kind::kInt;
    a.i = v;
    return a;
  }
  static Attribute IntsAttr(std::vector<int64_t> v) {
    Attribute a;
    a.kind = Attribute::Kind::kInts;
    a.ints = std::move(v);
    return a;
  }
  int IntsConstant(const std::string& suffix, const std::vector<int64_t>& v) {
    Tensor t = Tensor::Allocate(DataType::kInt64, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.mutable_values<int64_t>().begin());
    const int id = g_.AddValue(Unique(base_ + suffix), DataType::kInt64);
    g_.values[id].shape = KnownShape(t.shape());
    g_.values[id].constant = std::move(t);
    return id;
  }
  Node NewNode(const std::string& op, const std::string& suffix, std::vector<int> inputs) const {
    Node n;
    n.name = base_ + suffix;
    n.op_type = op;
    n.inputs = std::move(inputs);
    return n;
  }
  Operand Finish(Node n, Operand out) {
    out.v = g_.AddValue(Unique(n.name + ":out"), DataType::kFp32);
    g_.values[out.v].shape = out.dims;
    n.outputs = {out.v};
    nodes_.push_back(std::move(n));
    return out;
  }

  // `name`, or with a number after it when another value has it.
  std::string Unique(const std::string& name) {
    std::string candidate = name;
    for (int k = 2; names_.count(candidate); ++k) candidate = name + "#" + std::to_string(k);
    names_.insert(candidate);
    return candidate;
  }

  Graph& g_;
  std::string base_;
  std::set<std::string>& names_;
  std::vector<Node> nodes_;
};

// The operand as the graph has it (its shape has the term's rank).
Operand Initial(const Graph& g, int v, const std::string& term) {
  return Operand{v, term, *g.values[v].shape};
}

// The rewrite of one Einsum node: the nodes that replace it, or none when it does not
// qualify (see the header).
std::vector<Node> Rewrite(Graph& g, const Node& node, const std::vector<DataType>& types,
                          std::set<std::string>& names) {
  if (!node.domain.empty() || node.op_type != "Einsum" || node.inputs.empty() ||
      node.inputs.size() > 2 || !node.has_output(0) || node.outputs.size() != 1)
    return {};
  for (int v : node.inputs)
    if (v < 0 || types[v] != DataType::kFp32) return {};
  std::optional<Equation> e = ParseProduct(node.GetString("equation", ""));
  if (!e || e->b.empty() != (node.inputs.size() == 1)) return {};
  auto in = [](const std::string& t, char c) { return t.find(c) != std::string::npos; };
  for (char c : e->out)
    if (!in(e->a, c) && !in(e->b, c)) return {};
  // Each operand's rank is known and fits its term: a model whose term does not match its
  // operand keeps the kernel, which says so. The ellipses become labels of their own.
  for (int v : node.inputs)
    if (!g.values[v].shape) return {};
  Equation eq = *e;
  if (!Expand(&eq, g.values[node.inputs[0]].shape->size(),
              node.inputs.size() > 1 ? g.values[node.inputs[1]].shape->size() : 0))
    return {};
  e = eq;
  const int va = node.inputs[0];
  const std::string base = node.name.empty() ? g.values[node.outputs[0]].name : node.name;
  if (node.inputs.size() == 1) {
    // One operand: a sum over the labels the output drops, then a transpose.
    const std::string sum = Pick(e->a, [&](char c) { return !in(e->out, c); });
    if (sum.empty() && e->a == e->out) return {};  // a copy: nothing to gain
    Emitter em(g, base, names);
    Operand a = Initial(g, va, e->a);
    if (!sum.empty()) a = em.Sum(a, sum, "/sum");
    em.Permute(a, e->out, "/transpose");
    return em.Take(node.outputs[0], node.name);
  }
  const int vb = node.inputs[1];
  const std::string batch = Pick(e->out, [&](char c) { return in(e->a, c) && in(e->b, c); });
  const std::string m = Pick(e->out, [&](char c) { return in(e->a, c) && !in(e->b, c); });
  const std::string n = Pick(e->out, [&](char c) { return !in(e->a, c) && in(e->b, c); });
  const std::string k = Pick(e->a, [&](char c) { return in(e->b, c) && !in(e->out, c); });
  const std::string sum_a = Pick(e->a, [&](char c) { return !in(e->b, c) && !in(e->out, c); });
  const std::string sum_b = Pick(e->b, [&](char c) { return !in(e->a, c) && !in(e->out, c); });
  if (n.size() > 1 || (m.size() > 1 && !batch.empty())) return {};
  Operand a = Initial(g, va, e->a), b = Initial(g, vb, e->b);
  // A contraction label must have one extent in both operands, as far as the graph can
  // tell: the kernel broadcasts an extent of 1 there, which MatMul does not.
  for (char c : k)
    if (!SameDim(a.dims[e->a.find(c)], b.dims[e->b.find(c)])) return {};

  Emitter em(g, base, names);
  if (!sum_a.empty()) a = em.Sum(a, sum_a, "/sum_a");
  if (!sum_b.empty()) b = em.Sum(b, sum_b, "/sum_b");
  const size_t nb = batch.size();
  const std::string m_axes = m.empty() ? "<" : m, n_axes = n.empty() ? ">" : n;
  // A as [batch..., M..., K]: the contraction labels merged into one axis, and a unit axis
  // where A has no label of its own.
  a = em.Permute(a, batch + m + k, "/transpose_a");
  if (k.size() != 1 || m.empty()) a = em.MergeTail(a, nb + m.size(), m.empty(), '<', "/reshape_a");
  // B as [batch..., K, N].
  if (k.size() == 1 && !m.empty() && n.size() == 1) {
    b = em.Permute(b, batch + k + n, "/transpose_b");
  } else {
    // Merge K last ([batch..., N, K]), then swap the last two axes.
    b = em.Permute(b, batch + n + k, "/transpose_b");
    b = em.MergeTail(b, nb + n.size(), n.empty(), '>', "/reshape_b");
    b = em.Permute(b, batch + "#" + n_axes, "/transpose_b2");
  }
  // The product, [batch..., M..., N], with the unit axes standing in for an absent M or N.
  // Batch dims the operands do not provably share (MatMul broadcasts a 1) are left unknown.
  Operand c{-1, batch + m_axes + n_axes, Head(a.dims, a.dims.size() - 1)};
  for (size_t i = 0; i < nb; ++i)
    if (!SameDim(a.dims[i], b.dims[i])) c.dims[i] = Dim{};
  c.dims.push_back(b.dims.back());
  c = em.MatMul(a, b, std::move(c), "/matmul");
  if (m.empty() || n.empty()) {
    std::vector<int64_t> shape(nb + m.size(), 0);
    if (m.empty() && !n.empty()) shape.push_back(c.dims.back().known() ? c.dims.back().value : -1);
    Operand out{-1, batch + m + n, Head(c.dims, nb + m.size())};
    if (m.empty() && !n.empty()) out.dims.push_back(c.dims.back());
    c = em.Reshape(c, shape, std::move(out), "/reshape_product");
  }
  em.Permute(c, e->out, "/transpose_product");
  return em.Take(node.outputs[0], node.name);
}

}  // namespace

int RewriteEinsumsAsProducts(Graph* graph) {
  Graph& g = *graph;
  const std::vector<DataType> types = KnownTypes(g);
  std::set<std::string> names;
  for (const Value& v : g.values) names.insert(v.name);
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  int rewritten = 0;
  for (Node& node : g.nodes) {
    std::vector<Node> replacement = Rewrite(g, node, types, names);
    if (replacement.empty()) {
      nodes.push_back(std::move(node));
      continue;
    }
    ++rewritten;
    for (Node& r : replacement) nodes.push_back(std::move(r));
  }
  g.nodes = std::move(nodes);
  if (rewritten == 0) return 0;
  for (Value& v : g.values) v.producer = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (int v : g.nodes[i].outputs)
      if (v >= 0) g.values[v].producer = static_cast<int>(i);
  }
  return rewritten;
}

}  // namespace shoal::engine
