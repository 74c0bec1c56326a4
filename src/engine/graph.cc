#include "engine/graph.h"

namespace shoal::engine {

SymbolicShape KnownShape(const Shape& shape) {
  SymbolicShape s;
  for (int64_t d : shape) s.push_back(Dim{d, ""});
  return s;
}

std::string SymbolicShapeToString(const SymbolicShape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    if (shape[i].known()) {
      out += std::to_string(shape[i].value);
    } else {
      out += shape[i].symbol.empty() ? "?" : shape[i].symbol;
    }
  }
  return out + "]";
}

const Attribute* Node::attr(std::string_view name) const {
  auto it = attributes.find(name);
  return it == attributes.end() ? nullptr : &it->second;
}

int64_t Node::GetInt(std::string_view name, int64_t fallback) const {
  const Attribute* a = attr(name);
  return a && a->kind == Attribute::Kind::kInt ? a->i : fallback;
}

float Node::GetFloat(std::string_view name, float fallback) const {
  const Attribute* a = attr(name);
  return a && a->kind == Attribute::Kind::kFloat ? a->f : fallback;
}

std::string Node::GetString(std::string_view name, std::string fallback) const {
  const Attribute* a = attr(name);
  return a && a->kind == Attribute::Kind::kString ? a->s : fallback;
}

std::vector<int64_t> Node::GetInts(std::string_view name, std::vector<int64_t> fallback) const {
  const Attribute* a = attr(name);
  return a && a->kind == Attribute::Kind::kInts ? a->ints : fallback;
}

std::vector<float> Node::GetFloats(std::string_view name, std::vector<float> fallback) const {
  const Attribute* a = attr(name);
  return a && a->kind == Attribute::Kind::kFloats ? a->floats : fallback;
}

int Graph::AddValue(std::string value_name, DataType dtype) {
  Value v;
  v.name = std::move(value_name);
  v.dtype = dtype;
  values.push_back(std::move(v));
  return static_cast<int>(values.size()) - 1;
}

int Graph::FindValue(std::string_view value_name) const {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].name == value_name) return static_cast<int>(i);
  }
  return -1;
}

std::string Graph::Describe(int node_index) const {
  if (node_index < 0 || node_index >= static_cast<int>(nodes.size())) {
    return "node #" + std::to_string(node_index);
  }
  const Node& n = nodes[node_index];
  std::string who =
      n.name.empty() ? "node #" + std::to_string(node_index) : "node '" + n.name + "'";
  return who + " (" + n.qualified_type() + ")";
}

Status Graph::Validate() const {
  const int nv = static_cast<int>(values.size());
  std::vector<char> available(values.size(), 0);
  for (int i = 0; i < nv; ++i) {
    if (values[i].is_constant()) available[i] = 1;
  }
  if (captures < 0 || static_cast<size_t>(captures) > inputs.size())
    return InvalidArgument("the graph captures more outer values than it has inputs");
  for (int id : inputs) {
    if (id < 0 || id >= nv) return InvalidArgument("graph input index out of range");
    available[id] = 1;
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    for (int id : node.inputs) {
      if (id < -1 || id >= nv) return InvalidArgument(Describe(n) + ": input index out of range");
      if (id >= 0 && !available[id]) {
        return InvalidArgument(Describe(n) + ": input '" + values[id].name +
                               "' is not produced by any earlier node, initialiser or graph input");
      }
    }
    for (int id : node.outputs) {
      if (id < -1 || id >= nv) return InvalidArgument(Describe(n) + ": output index out of range");
      if (id >= 0) {
        if (available[id]) {
          return InvalidArgument(Describe(n) + ": output '" + values[id].name +
                                 "' is already defined elsewhere");
        }
        available[id] = 1;
      }
    }
    for (const auto& [name, attr] : node.attributes) {
      if (attr.kind != Attribute::Kind::kGraph) continue;
      if (!attr.g) return InvalidArgument(Describe(n) + ": subgraph '" + name + "' is missing");
      Status s = attr.g->Validate();
      if (!s.ok()) return s.WithPrefix(Describe(n) + ": subgraph '" + name + "'");
    }
  }
  for (int id : outputs) {
    if (id < 0 || id >= nv) return InvalidArgument("graph output index out of range");
    if (!available[id]) {
      return InvalidArgument("graph output '" + values[id].name + "' is never produced");
    }
  }
  return Status::Ok();
}

}  // namespace shoal::engine
