#include "engine/fp16_lowering.h"

#include <unordered_set>

#include "core/fp16.h"

namespace shoal::engine {
namespace {

constexpr int64_t kOnnxFloat = 1;
constexpr int64_t kOnnxFloat16 = 10;

Tensor ToFp32(const Tensor& t) {
  Tensor out = Tensor::Allocate(DataType::kFp32, t.shape());
  auto src = t.values<uint16_t>();
  Fp16ToFloat(src.data(), out.mutable_values<float>().data(), src.size());
  return out;
}

class Lowering {
 public:
  explicit Lowering(Graph* g) : g_(*g) {
    for (const Value& v : g_.values) names_.insert(v.name);
  }

  void Run(Fp16LoweringReport* report) {
    const size_t nv = g_.values.size();
    // Which values the file declares FLOAT16 at the graph's edges, before retyping.
    std::vector<char> is_input(nv, 0), is_output(nv, 0);
    for (int v : g_.inputs) is_input[v] = 1;
    for (int v : g_.outputs) is_output[v] = 1;
    auto fp16 = [&](int v) { return g_.values[v].dtype == DataType::kFp16; };
    // Readers of each value that are not Cast(to FLOAT), and which value each node makes.
    std::vector<int> readers(nv, 0), other_readers(nv, 0), producer(nv, -1);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const Node& node = g_.nodes[n];
      for (int in : node.inputs) {
        if (in < 0) continue;
        ++readers[in];
        other_readers[in] += !IsCast(node, kOnnxFloat);
      }
      for (int out : node.outputs)
        if (out >= 0) producer[out] = static_cast<int>(n);
    }
    // What an earlier lowering (or the file) already made stays: an FP16 value read
    // only by Casts to FLOAT, and a graph output a Cast to FLOAT16 writes that nothing
    // but Casts to FLOAT reads (an FP32 kernel could not read it).
    auto only_cast_to_float = [&](int v) {
      return readers[v] > 0 && other_readers[v] == 0 && !is_output[v];
    };
    std::vector<char> keep_fp16(nv, 0);
    for (size_t v = 0; v < nv; ++v) {
      const int p = producer[v];
      if (p >= 0 && IsCast(g_.nodes[p], kOnnxFloat16) && other_readers[v] == 0 &&
          (readers[v] > 0 || is_output[v]))
        keep_fp16[v] = 1;
    }

    // Constants inside the graph become FP32. One at the graph's edge keeps its FP16
    // type: an input's default is cast with the input below, and a constant output moves
    // to the FP32 stand-in its final Cast reads.
    for (size_t i = 0; i < nv; ++i) {
      Value& v = g_.values[i];
      if (is_input[i] || is_output[i]) continue;
      if (v.is_constant() && v.constant.dtype() == DataType::kFp16) {
        v.constant = ToFp32(v.constant);
        v.dtype = DataType::kFp32;
        ++report->converted_constants;
      }
    }
    for (Node& n : g_.nodes) {
      for (auto& [name, a] : n.attributes) {
        if (a.kind == Attribute::Kind::kTensor && a.t.dtype() == DataType::kFp16) {
          a.t = ToFp32(a.t);
          ++report->converted_constants;
        }
      }
    }

    std::vector<Node> nodes;
    std::vector<int> remap(nv);
    for (size_t v = 0; v < nv; ++v) remap[v] = static_cast<int>(v);
    for (int v : g_.inputs) {
      if (!fp16(v) || only_cast_to_float(v) || remap[v] != v) continue;
      const int v32 = NewValue(g_.values[v].name + "/fp32", DataType::kFp32, g_.values[v].shape);
      nodes.push_back(MakeCast(g_.values[v].name + "/to_fp32", v, v32, kOnnxFloat));
      remap[v] = v32;
      ++report->cast_inputs;
    }
    // FP16 graph outputs that are neither graph inputs nor a Cast's result: the
    // computation produces an FP32 stand-in, and a final Cast writes the named output.
    std::vector<std::pair<int, int>> output_casts;  // (stand-in, output)
    for (int v : g_.outputs) {
      if (!fp16(v) || is_input[v] || keep_fp16[v] || remap[v] != v) continue;
      const int v32 = NewValue(g_.values[v].name + "/fp32", DataType::kFp32, g_.values[v].shape);
      Value& out = g_.values[v];
      if (out.is_constant()) {
        g_.values[v32].constant = ToFp32(out.constant);
        out.constant = Tensor();
        ++report->converted_constants;
      }
      remap[v] = v32;
      output_casts.emplace_back(v32, v);
    }
    for (Node& n : g_.nodes) {
      const bool kept = n.has_output(0) && keep_fp16[n.outputs[0]];  // before remapping
      for (int& in : n.inputs)
        if (in >= 0) in = remap[in];
      for (int& out : n.outputs)
        if (out >= 0) out = remap[out];
      if (IsCast(n, kOnnxFloat16) && n.has_output(0) && !kept) {
        const int y = n.outputs[0];
        const int y16 = NewValue(g_.values[y].name + "/fp16", DataType::kFp16, g_.values[y].shape);
        const std::string name = n.name;
        n.outputs[0] = y16;
        nodes.push_back(std::move(n));
        nodes.push_back(MakeCast(name + "/round_fp16", y16, y, kOnnxFloat));
        g_.values[y].dtype = DataType::kFp32;
        ++report->rounding_casts;
        continue;
      }
      nodes.push_back(std::move(n));
    }
    for (auto [v32, v] : output_casts) {
      nodes.push_back(MakeCast(g_.values[v].name + "/to_fp16", v32, v, kOnnxFloat16));
      ++report->cast_outputs;
    }
    // Everything else the file calls FLOAT16 now holds FP32.
    for (size_t v = 0; v < nv; ++v) {
      if (!is_input[v] && !is_output[v] && !keep_fp16[v] && g_.values[v].dtype == DataType::kFp16)
        g_.values[v].dtype = DataType::kFp32;
    }
    g_.nodes = std::move(nodes);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      for (int out : g_.nodes[n].outputs)
        if (out >= 0) g_.values[out].producer = static_cast<int>(n);
    }
  }

 private:
  static bool IsCast(const Node& n, int64_t to) {
    return n.domain.empty() && n.op_type == "Cast" && n.GetInt("to", 0) == to;
  }

  // A value with a name no other value has: `base`, or `base_2`, `base_3`... `shape` is
  // taken by value: callers pass another value's, which AddValue may move.
  int NewValue(const std::string& base, DataType dtype, std::optional<SymbolicShape> shape) {
    std::string name = base;
    for (int i = 2; names_.count(name); ++i) name = base + "_" + std::to_string(i);
    names_.insert(name);
    const int id = g_.AddValue(name, dtype);
    g_.values[id].shape = std::move(shape);
    return id;
  }

  static Node MakeCast(std::string name, int in, int out, int64_t to) {
    Node n;
    n.name = std::move(name);
    n.op_type = "Cast";
    n.inputs = {in};
    n.outputs = {out};
    Attribute a;
    a.kind = Attribute::Kind::kInt;
    a.i = to;
    n.attributes.emplace("to", std::move(a));
    return n;
  }

  Graph& g_;
  std::unordered_set<std::string> names_;
};

bool MentionsFp16(const Graph& g) {
  for (const Value& v : g.values) {
    if (v.dtype == DataType::kFp16 || v.constant.dtype() == DataType::kFp16) return true;
  }
  for (const Node& n : g.nodes) {
    if (n.domain.empty() && n.op_type == "Cast" && n.GetInt("to", 0) == kOnnxFloat16) return true;
    for (const auto& [name, a] : n.attributes) {
      if (a.kind == Attribute::Kind::kTensor && a.t.dtype() == DataType::kFp16) return true;
      if (a.kind == Attribute::Kind::kGraph && a.g && MentionsFp16(*a.g)) return true;
    }
  }
  return false;
}

// The first node holding a subgraph (If, Loop), or null.
const Node* FirstWithSubgraph(const Graph& g) {
  for (const Node& n : g.nodes)
    for (const auto& [name, a] : n.attributes)
      if (a.kind == Attribute::Kind::kGraph) return &n;
  return nullptr;
}

}  // namespace

Status LowerFp16(Graph* graph, Fp16LoweringReport* report) {
  Fp16LoweringReport scratch;
  if (!report) report = &scratch;
  *report = Fp16LoweringReport();
  if (!MentionsFp16(*graph)) return Status::Ok();
  // The lowering retypes the outer graph only: a subgraph reading a retyped value, or
  // holding FP16 of its own, would disagree with it.
  if (const Node* n = FirstWithSubgraph(*graph))
    return Unimplemented("node '" + n->name + "' (" + n->op_type +
                         "): FP16 models with control-flow subgraphs are not supported");
  Lowering(graph).Run(report);
  return graph->Validate();
}

}  // namespace shoal::engine
