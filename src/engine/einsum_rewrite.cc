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

// The equation's two input terms and its output, each a string of distinct letters;
// nullopt for anything else (one or three operands, an ellipsis, a diagonal).
struct Equation {
  std::string a, b, out;
};
std::optional<Equation> ParseProduct(std::string_view eq) {
  std::string s;
  for (char c : eq)
    if (c != ' ') s += c;
  const size_t arrow = s.find("->");
  const std::string lhs = s.substr(0, arrow);
  const size_t comma = lhs.find(',');
  if (comma == std::string::npos || lhs.find(',', comma + 1) != std::string::npos) return {};
  Equation e{lhs.substr(0, comma), lhs.substr(comma + 1), {}};
  auto distinct_letters = [](const std::string& t) {
    for (size_t i = 0; i < t.size(); ++i) {
      if (!std::isalpha(static_cast<unsigned char>(t[i]))) return false;
      if (t.find(t[i], i + 1) != std::string::npos) return false;
    }
    return true;
  };
  if (!distinct_letters(e.a) || !distinct_letters(e.b)) return {};
  if (arrow == std::string::npos) {
    // Implicit output: the letters that occur once, in character order (ops/einsum.cc).
    std::map<char, int> count;
    for (char c : e.a + e.b) ++count[c];
    for (const auto& [c, n] : count)
      if (n == 1) e.out += c;
  } else {
    e.out = s.substr(arrow + 2);
    if (!distinct_letters(e.out)) return {};
  }
  return e;
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

// The dims of `term`'s labels in `labels`' order, from the value's shape when it has the
// term's rank; unknown dims otherwise.
SymbolicShape DimsOf(const Graph& g, int v, const std::string& term, const std::string& labels) {
  const auto& shape = g.values[v].shape;
  const bool known = shape && shape->size() == term.size();
  SymbolicShape out;
  for (char c : labels) out.push_back(known ? (*shape)[term.find(c)] : Dim{});
  return out;
}

// The extent of label `c` in value `v` of term `term`, or -1 when not known.
int64_t Extent(const Graph& g, int v, const std::string& term, char c) {
  const auto& shape = g.values[v].shape;
  if (!shape || shape->size() != term.size()) return -1;
  const Dim& d = (*shape)[term.find(c)];
  return d.known() ? d.value : -1;
}

// The rewrite of one Einsum node: the nodes that replace it, or none when it does not
// qualify (see the header).
std::vector<Node> Rewrite(Graph& g, const Node& node, const std::vector<DataType>& types) {
  if (!node.domain.empty() || node.op_type != "Einsum" || node.inputs.size() != 2 ||
      !node.has_input(0) || !node.has_input(1) || !node.has_output(0) || node.outputs.size() != 1)
    return {};
  const int va = node.inputs[0], vb = node.inputs[1];
  if (types[va] != DataType::kFp32 || types[vb] != DataType::kFp32) return {};
  const std::optional<Equation> e = ParseProduct(node.GetString("equation", ""));
  if (!e) return {};
  auto in = [](const std::string& t, char c) { return t.find(c) != std::string::npos; };
  for (char c : e->out)
    if (!in(e->a, c) && !in(e->b, c)) return {};
  const std::string batch = Pick(e->out, [&](char c) { return in(e->a, c) && in(e->b, c); });
  const std::string m = Pick(e->out, [&](char c) { return in(e->a, c) && !in(e->b, c); });
  const std::string n = Pick(e->out, [&](char c) { return !in(e->a, c) && in(e->b, c); });
  const std::string k = Pick(e->a, [&](char c) { return in(e->b, c) && !in(e->out, c); });
  // A label in one operand alone and not in the output is a sum of its own.
  for (char c : e->a + e->b)
    if (!in(e->out, c) && !(in(e->a, c) && in(e->b, c))) return {};
  if (k.size() != 1 || n.size() != 1) return {};
  if (!(m.size() == 1 || (batch.empty() && !m.empty()))) return {};
  const int64_t ka = Extent(g, va, e->a, k[0]), kb = Extent(g, vb, e->b, k[0]);
  if (ka >= 0 && kb >= 0 && ka != kb) return {};

  const std::string base = node.name.empty() ? g.values[node.outputs[0]].name : node.name;
  auto value = [&](const std::string& suffix, SymbolicShape shape) {
    const int v = g.AddValue(base + suffix, DataType::kFp32);
    g.values[v].shape = std::move(shape);
    return v;
  };
  auto transpose = [&](int src, const std::vector<int64_t>& perm, int dst,
                       const std::string& suffix) {
    Node t;
    t.name = base + suffix;
    t.op_type = "Transpose";
    t.inputs = {src};
    t.outputs = {dst};
    Attribute p;
    p.kind = Attribute::Kind::kInts;
    p.ints = perm;
    t.attributes["perm"] = p;
    return t;
  };
  std::vector<Node> nodes;
  // A as [batch..., M..., K], B as [batch..., K, N].
  const std::string a_order = batch + m + k, b_order = batch + k + n;
  int a = va, b = vb;
  if (const auto perm = PermOf(e->a, a_order); !Identity(perm)) {
    a = value("/einsum_a", DimsOf(g, va, e->a, a_order));
    nodes.push_back(transpose(va, perm, a, "/transpose_a"));
  }
  if (const auto perm = PermOf(e->b, b_order); !Identity(perm)) {
    b = value("/einsum_b", DimsOf(g, vb, e->b, b_order));
    nodes.push_back(transpose(vb, perm, b, "/transpose_b"));
  }
  // The product is [batch..., M..., N]; the output may want another order.
  const std::string c_order = batch + m + n;
  const std::vector<int64_t> c_perm = PermOf(c_order, e->out);
  Node mm;
  mm.op_type = "MatMul";
  mm.inputs = {a, b};
  if (Identity(c_perm)) {
    mm.name = node.name;
    mm.outputs = {node.outputs[0]};
    nodes.push_back(std::move(mm));
  } else {
    SymbolicShape c_dims = DimsOf(g, va, e->a, batch + m);
    for (const Dim& d : DimsOf(g, vb, e->b, n)) c_dims.push_back(d);
    const int c = value("/einsum_product", c_dims);
    mm.name = base + "/matmul";
    mm.outputs = {c};
    nodes.push_back(std::move(mm));
    Node out = transpose(c, c_perm, node.outputs[0], "");
    out.name = node.name;
    nodes.push_back(std::move(out));
  }
  return nodes;
}

}  // namespace

int RewriteEinsumsAsProducts(Graph* graph) {
  Graph& g = *graph;
  const std::vector<DataType> types = KnownTypes(g);
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  int rewritten = 0;
  for (Node& node : g.nodes) {
    std::vector<Node> replacement = Rewrite(g, node, types);
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
