// The engine's graph: an immutable, format-neutral description of a model, produced by
// the ONNX importer (onnx_importer.h) or built by hand in tests.
//
// A Graph is a list of Values (tensors: graph inputs, constants, intermediates) and a
// list of Nodes in topological order. Each node names an operator by (domain, op_type)
// and refers to values by index. Operators are looked up in the op registry
// (op_registry.h) when a plan is prepared.
//
// Where part 2 fits: optimisation passes (constant folding, operator fusion) rewrite a
// Graph into another Graph; fused operators are ordinary nodes in the "shoal" domain
// with their own registry entries, and precision variants are chosen per node when a
// plan is prepared (PlanOptions), so neither the importer nor the executor changes.
//
// Thread safety: a Graph is a value; after construction it is only read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace shoal::engine {

// One dimension of a shape known at load time: a size (>= 0) or a symbol (value < 0),
// such as the batch dimension of a model exported with a dynamic batch axis.
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string symbol;  // ONNX dim_param; may be empty for an anonymous symbolic dim
  bool known() const { return value >= 0; }
  friend bool operator==(const Dim&, const Dim&) = default;
};
using SymbolicShape = std::vector<Dim>;
// "[batch,3,224,224]"; "?" for an anonymous symbolic dim.
std::string SymbolicShapeToString(const SymbolicShape& shape);
// A concrete shape as a symbolic one (every dim known).
SymbolicShape KnownShape(const Shape& shape);

struct Graph;

struct Attribute {
  enum class Kind { kInt, kFloat, kString, kInts, kFloats, kStrings, kTensor, kGraph, kOther };
  Kind kind = Kind::kOther;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
  Tensor t;
  // kGraph: a subgraph (If's then_branch/else_branch, Loop's body); see Graph::captures.
  std::shared_ptr<const Graph> g;
};

struct Value {
  std::string name;
  DataType dtype = DataType::kInvalid;  // kInvalid when the file does not say
  std::optional<SymbolicShape> shape;   // nullopt: not known at load
  Tensor constant;                      // non-empty for initialisers and Constant outputs
  int producer = -1;                    // index of the producing node; -1 for none
  bool is_constant() const { return !constant.empty(); }
};

struct Node {
  std::string name;          // may be empty in the file; Graph::Describe then uses the index
  std::string op_type;       // "Conv"
  std::string domain;        // "" for the default ONNX domain
  std::vector<int> inputs;   // value indices; -1 for an omitted optional input
  std::vector<int> outputs;  // value indices; -1 for an omitted optional output
  std::map<std::string, Attribute, std::less<>> attributes;

  const Attribute* attr(std::string_view name) const;
  int64_t GetInt(std::string_view name, int64_t fallback) const;
  float GetFloat(std::string_view name, float fallback) const;
  std::string GetString(std::string_view name, std::string fallback) const;
  std::vector<int64_t> GetInts(std::string_view name, std::vector<int64_t> fallback = {}) const;
  std::vector<float> GetFloats(std::string_view name, std::vector<float> fallback = {}) const;
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] >= 0; }
  bool has_output(size_t i) const { return i < outputs.size() && outputs[i] >= 0; }
  // "Conv", or "shoal.FusedConv" outside the default domain.
  std::string qualified_type() const { return (domain.empty() ? "" : domain + ".") + op_type; }
};

struct Graph {
  std::string name;
  int64_t opset = 0;  // default-domain opset the model was exported with
  std::vector<Value> values;
  std::vector<Node> nodes;  // topological order
  std::vector<int> inputs;  // graph inputs fed at run time (initialisers excluded)
  std::vector<int> outputs;
  // Subgraphs only (an If branch, a Loop body): how many of `inputs`, at their end, are
  // values of the enclosing scopes that the subgraph reads by name (ONNX's implicit
  // inputs). The importer makes such a reference explicit: the If/Loop node takes the
  // outer values as extra inputs after its own, in the same order, and every subgraph
  // of the node lists all of them (the union, a branch ignoring those it does not read).
  // Outer constants are copied in as constants instead.
  int captures = 0;

  int AddValue(std::string name, DataType dtype = DataType::kInvalid);
  // Index of the value called `name`, or -1.
  int FindValue(std::string_view name) const;
  // "node 'Conv_3' (Conv)" or "node #3 (Conv)" when the node has no name.
  std::string Describe(int node_index) const;
  // Checks structural invariants: indices in range, every value produced at most once
  // and before use, outputs produced; in subgraphs too. Run by the importer; cheap.
  Status Validate() const;
};

}  // namespace shoal::engine
