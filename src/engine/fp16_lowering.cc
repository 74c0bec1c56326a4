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
    // Which values the file declares FLOAT16 at the graph's edges, before retyping.
    std::vector<char> io_fp16(g_.values.size(), 0);
    for (int v : g_.inputs) io_fp16[v] |= g_.values[v].dtype == DataType::kFp16;
    for (int v : g_.outputs) io_fp16[v] |= g_.values[v].dtype == DataType::kFp16;

    for (Value& v : g_.values) {
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
    std::vector<int> remap(g_.values.size());
    for (size_t v = 0; v < remap.size(); ++v) remap[v] = static_cast<int>(v);
    for (int v : g_.inputs) {
      if (g_.values[v].dtype != DataType::kFp16) continue;
      const int v32 = NewValue(g_.values[v].name + "/fp32", DataType::kFp32, g_.values[v].shape);
      nodes.push_back(MakeCast(g_.values[v].name + "/to_fp32", v, v32, kOnnxFloat));
      remap[v] = v32;
      ++report->cast_inputs;
    }
    // FP16 graph outputs that are not graph inputs: the computation produces an FP32
    // stand-in, and a final Cast writes the named output.
    std::vector<std::pair<int, int>> output_casts;  // (stand-in, output)
    for (int v : g_.outputs) {
      if (g_.values[v].dtype != DataType::kFp16 || IsGraphInput(v) || remap[v] != v) continue;
      const int v32 = NewValue(g_.values[v].name + "/fp32", DataType::kFp32, g_.values[v].shape);
      Value& out = g_.values[v];
      if (out.is_constant()) {
        g_.values[v32].constant = std::move(out.constant);
        out.constant = Tensor();
      }
      remap[v] = v32;
      output_casts.emplace_back(v32, v);
    }
    for (Node& n : g_.nodes) {
      for (int& in : n.inputs)
        if (in >= 0) in = remap[in];
      for (int& out : n.outputs)
        if (out >= 0) out = remap[out];
      if (n.domain.empty() && n.op_type == "Cast" && n.GetInt("to", 0) == kOnnxFloat16 &&
          n.has_output(0)) {
        const int y = n.outputs[0];
        const int y16 = NewValue(g_.values[y].name + "/fp16", DataType::kFp16, g_.values[y].shape);
        const std::string name = n.name;
        n.outputs[0] = y16;
        nodes.push_back(std::move(n));
        nodes.push_back(MakeCast(name + "/round_fp16", y16, y, kOnnxFloat));
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
    for (size_t v = 0; v < io_fp16.size(); ++v) {
      if (!io_fp16[v] && g_.values[v].dtype == DataType::kFp16)
        g_.values[v].dtype = DataType::kFp32;
    }
    g_.nodes = std::move(nodes);
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      for (int out : g_.nodes[n].outputs)
        if (out >= 0) g_.values[out].producer = static_cast<int>(n);
    }
  }

 private:
  bool IsGraphInput(int v) const {
    for (int in : g_.inputs)
      if (in == v) return true;
    return false;
  }

  // A value with a name no other value has: `base`, or `base_2`, `base_3`...
  int NewValue(const std::string& base, DataType dtype, const std::optional<SymbolicShape>& shape) {
    std::string name = base;
    for (int i = 2; names_.count(name); ++i) name = base + "_" + std::to_string(i);
    names_.insert(name);
    const int id = g_.AddValue(name, dtype);
    g_.values[id].shape = shape;
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
    for (const auto& [name, a] : n.attributes)
      if (a.kind == Attribute::Kind::kTensor && a.t.dtype() == DataType::kFp16) return true;
  }
  return false;
}

}  // namespace

Status LowerFp16(Graph* graph, Fp16LoweringReport* report) {
  Fp16LoweringReport scratch;
  if (!report) report = &scratch;
  *report = Fp16LoweringReport();
  if (!MentionsFp16(*graph)) return Status::Ok();
  Lowering(graph).Run(report);
  return graph->Validate();
}

}  // namespace shoal::engine
