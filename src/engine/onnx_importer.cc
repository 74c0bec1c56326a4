#include "engine/onnx_importer.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>

#include "core/dtype_visit.h"
#include "engine/internal/onnx_dtype.h"

namespace shoal::engine {
namespace {

namespace fs = std::filesystem;
using internal::DataTypeFromOnnx;

constexpr int64_t kMinOpset = 11;
constexpr int64_t kMaxOpset = 18;
constexpr int kMaxRank = 12;  // oneDNN's limit; no model we accept needs more

StatusOr<std::string> ReadFileLimited(const fs::path& path, int64_t max_bytes, int64_t offset = 0,
                                      int64_t length = -1) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return InvalidArgument("cannot read '" + path.string() + "': " + ec.message());
  const int64_t file_size = static_cast<int64_t>(size);
  if (offset < 0 || offset > file_size) {
    return InvalidArgument("offset " + std::to_string(offset) + " is outside '" + path.string() +
                           "' (" + std::to_string(file_size) + " bytes)");
  }
  if (length < 0) length = file_size - offset;
  if (length > file_size - offset) {
    return InvalidArgument("'" + path.string() + "' is too short: " + std::to_string(length) +
                           " bytes wanted at offset " + std::to_string(offset) + ", file has " +
                           std::to_string(file_size));
  }
  if (length > max_bytes) {
    return InvalidArgument("'" + path.string() + "': " + std::to_string(length) +
                           " bytes exceed the limit of " + std::to_string(max_bytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("cannot open '" + path.string() + "'");
  std::string data(static_cast<size_t>(length), '\0');
  in.seekg(offset);
  in.read(data.data(), length);
  if (in.gcount() != length) return InvalidArgument("short read from '" + path.string() + "'");
  return data;
}

// Copies `count` elements of a repeated proto field into `out`, converting each.
template <typename Dst, typename Field>
void CopyRepeated(const Field& field, Tensor* out) {
  auto dst = out->mutable_values<Dst>();
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<Dst>(field.Get(static_cast<int>(i)));
}

// The repeated field of a TensorProto that holds values of type D when they are not in
// raw_data (onnx.proto's TensorProto comments): the types narrower than 32 bits, FP16
// and BF16 (as bit patterns) and BOOL travel in int32_data.
template <DataType D>
const auto& TypedData(const onnx::TensorProto& tp) {
  if constexpr (D == DataType::kFp32) {
    return tp.float_data();
  } else if constexpr (D == DataType::kFp64) {
    return tp.double_data();
  } else if constexpr (D == DataType::kInt64) {
    return tp.int64_data();
  } else if constexpr (D == DataType::kUint32 || D == DataType::kUint64) {
    return tp.uint64_data();
  } else {
    return tp.int32_data();
  }
}

class Importer {
 public:
  // `parent`: the importer of the enclosing graph when this one reads a subgraph (an
  // If branch, a Loop body), whose names it may read (Lookup).
  Importer(std::string base_dir, const ImportOptions& options, Importer* parent = nullptr)
      : base_dir_(std::move(base_dir)), options_(options), parent_(parent) {}

  StatusOr<Graph> Import(const onnx::ModelProto& model) {
    RETURN_IF_ERROR(ReadOpset(model));
    if (!model.has_graph()) return InvalidArgument("the model has no graph");
    RETURN_IF_ERROR(ImportGraph(model.graph()));
    RETURN_IF_ERROR(graph_.Validate());
    return std::move(graph_);
  }

 private:
  Status ImportGraph(const onnx::GraphProto& g) {
    graph_.name = g.name();
    for (const auto& init : g.initializer()) {
      if (init.name().empty()) return InvalidArgument("an initialiser has no name");
      ASSIGN_OR_RETURN(Tensor t, ConvertTensor(init, "initialiser '" + init.name() + "'"));
      const int id = graph_.AddValue(init.name(), t.dtype());
      graph_.values[id].shape = KnownShape(t.shape());
      graph_.values[id].constant = std::move(t);
      if (!by_name_.emplace(init.name(), id).second) {
        return InvalidArgument("initialiser '" + init.name() + "' is defined twice");
      }
    }
    for (const auto& in : g.input()) {
      if (by_name_.count(in.name())) continue;  // an initialiser listed as input (IR < 4)
      if (in.name().empty()) return InvalidArgument("a graph input has no name");
      const int id = graph_.AddValue(in.name());
      RETURN_IF_ERROR(ReadType(in, &graph_.values[id], "graph input '" + in.name() + "'"));
      // A subgraph's inputs take the types its node passes at run time; the file need
      // not declare them.
      if (graph_.values[id].dtype == DataType::kInvalid && !parent_) {
        return InvalidArgument("graph input '" + in.name() + "' has no tensor element type");
      }
      by_name_.emplace(in.name(), id);
      graph_.inputs.push_back(id);
    }
    for (int i = 0; i < g.node_size(); ++i) RETURN_IF_ERROR(ImportNode(g.node(i), i));
    for (const auto& vi : g.value_info()) {
      auto it = by_name_.find(vi.name());
      if (it == by_name_.end() || graph_.values[it->second].is_constant()) continue;
      RETURN_IF_ERROR(ReadType(vi, &graph_.values[it->second], "value_info '" + vi.name() + "'"));
    }
    for (const auto& out : g.output()) {
      const int id = Lookup(out.name());
      if (id < 0) {
        return InvalidArgument("graph output '" + out.name() + "' is not produced by the graph");
      }
      if (!graph_.values[id].is_constant()) {
        RETURN_IF_ERROR(ReadType(out, &graph_.values[id], "graph output '" + out.name() + "'"));
      }
      graph_.outputs.push_back(id);
    }
    if (graph_.outputs.empty()) return InvalidArgument("the graph has no outputs");
    return Status::Ok();
  }

  // The value called `name` in this graph or, for a subgraph, in an enclosing one: an
  // outer constant is copied in as a constant, any other outer value becomes a captured
  // input (Graph::captures); -1 when no scope defines it.
  int Lookup(const std::string& name) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    if (!parent_) return -1;
    const int outer = parent_->Lookup(name);
    if (outer < 0) return -1;
    const Value& ov = parent_->graph_.values[outer];
    const int id = graph_.AddValue(name, ov.dtype);
    graph_.values[id].shape = ov.shape;
    if (ov.is_constant()) {
      graph_.values[id].constant = ov.constant;
    } else {
      graph_.inputs.push_back(id);
      ++graph_.captures;
      captured_.push_back(outer);
    }
    by_name_.emplace(name, id);
    return id;
  }

  // Imports a GRAPH attribute of the node described by `what`. The subgraph's captured
  // outer values (ids in this graph) are added to `captured`, and its own capture
  // inputs are listed per outer id in `inputs_by_outer`.
  StatusOr<std::shared_ptr<Graph>> ImportSubgraph(const onnx::GraphProto& gp,
                                                  const std::string& what,
                                                  std::vector<int>* captured,
                                                  std::map<int, int>* inputs_by_outer) {
    Importer child(base_dir_, options_, this);
    child.graph_.opset = graph_.opset;
    Status s = child.ImportGraph(gp);
    if (!s.ok()) return s.WithPrefix(what);
    for (size_t c = 0; c < child.captured_.size(); ++c) {
      const int outer = child.captured_[c];
      const int local =
          child.graph_.inputs[child.graph_.inputs.size() - child.captured_.size() + c];
      (*inputs_by_outer)[outer] = local;
      if (std::find(captured->begin(), captured->end(), outer) == captured->end())
        captured->push_back(outer);
    }
    return std::make_shared<Graph>(std::move(child.graph_));
  }

  Status ReadOpset(const onnx::ModelProto& model) {
    for (const auto& op : model.opset_import()) {
      if (op.domain().empty() || op.domain() == "ai.onnx") graph_.opset = op.version();
    }
    if (graph_.opset == 0) return InvalidArgument("the model imports no default-domain opset");
    if (graph_.opset < kMinOpset || graph_.opset > kMaxOpset) {
      return InvalidArgument("opset " + std::to_string(graph_.opset) +
                             " is not supported (supported: " + std::to_string(kMinOpset) + " to " +
                             std::to_string(kMaxOpset) + ")");
    }
    return Status::Ok();
  }

  Status ReadType(const onnx::ValueInfoProto& vi, Value* value, const std::string& what) {
    if (!vi.has_type()) return Status::Ok();
    if (!vi.type().has_tensor_type()) {
      return InvalidArgument(what +
                             " is not a tensor (sequences, maps and optionals are not supported)");
    }
    const auto& tt = vi.type().tensor_type();
    if (tt.elem_type() != 0) {
      auto dtype = DataTypeFromOnnx(tt.elem_type());
      if (!dtype)
        return InvalidArgument(what + " has unsupported element type " +
                               std::to_string(tt.elem_type()));
      value->dtype = *dtype;
    }
    if (tt.has_shape()) {
      if (tt.shape().dim_size() > kMaxRank)
        return InvalidArgument(what + " has rank above " + std::to_string(kMaxRank));
      SymbolicShape shape;
      for (const auto& d : tt.shape().dim()) {
        if (d.has_dim_value()) {
          if (d.dim_value() < 0) return InvalidArgument(what + " has a negative dimension");
          shape.push_back(Dim{d.dim_value(), ""});
        } else {
          shape.push_back(Dim{-1, d.dim_param()});
        }
      }
      value->shape = std::move(shape);
    }
    return Status::Ok();
  }

  StatusOr<Tensor> ConvertTensor(const onnx::TensorProto& tp, const std::string& what) {
    auto dtype = DataTypeFromOnnx(tp.data_type());
    if (!dtype)
      return InvalidArgument(what + " has unsupported element type " +
                             std::to_string(tp.data_type()));
    if (*dtype == DataType::kBytes)
      return InvalidArgument(what + ": string tensors are not supported");
    if (tp.dims_size() > kMaxRank)
      return InvalidArgument(what + " has rank above " + std::to_string(kMaxRank));
    if (tp.has_segment()) return InvalidArgument(what + ": segmented tensors are not supported");
    Shape shape(tp.dims().begin(), tp.dims().end());
    const int64_t elem = static_cast<int64_t>(DataTypeSize(*dtype));
    auto count = ElementCount(shape, options_.max_tensor_bytes / elem);
    if (!count.ok()) return InvalidArgument(what + ": " + count.status().message());
    const int64_t bytes = *count * elem;

    if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
      return ReadExternal(tp, *dtype, std::move(shape), bytes, what);
    }
    Tensor t = Tensor::Allocate(*dtype, shape, static_cast<size_t>(bytes));
    if (tp.has_raw_data()) {
      if (static_cast<int64_t>(tp.raw_data().size()) != bytes) {
        return InvalidArgument(what + ": raw_data has " + std::to_string(tp.raw_data().size()) +
                               " bytes, shape " + ShapeToString(shape) + " needs " +
                               std::to_string(bytes));
      }
      if (bytes) std::memcpy(t.mutable_data(), tp.raw_data().data(), static_cast<size_t>(bytes));
      return t;
    }
    return VisitDType(
        *dtype,
        [&](auto tag) -> StatusOr<Tensor> {
          const auto& field = TypedData<decltype(tag)::kType>(tp);
          if (field.size() != *count) {
            return InvalidArgument(what + ": holds " + std::to_string(field.size()) +
                                   " values, shape " + ShapeToString(shape) + " needs " +
                                   std::to_string(*count));
          }
          CopyRepeated<typename decltype(tag)::type>(field, &t);
          return t;
        },
        [&]() -> StatusOr<Tensor> { return InvalidArgument(what + ": unsupported element type"); });
  }

  StatusOr<Tensor> ReadExternal(const onnx::TensorProto& tp, DataType dtype, Shape shape,
                                int64_t bytes, const std::string& what) {
    if (base_dir_.empty())
      return InvalidArgument(what + " uses external data, which needs the model's folder");
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : tp.external_data()) {
      try {
        if (kv.key() == "location") location = kv.value();
        if (kv.key() == "offset") offset = std::stoll(kv.value());
        if (kv.key() == "length") length = std::stoll(kv.value());
      } catch (const std::exception&) {
        return InvalidArgument(what + ": external data field '" + kv.key() + "' is not a number");
      }
    }
    if (location.empty()) return InvalidArgument(what + ": external data has no location");
    const fs::path rel(location);
    if (rel.is_absolute())
      return InvalidArgument(what + ": external data location must be relative");
    for (const auto& part : rel) {
      if (part == "..")
        return InvalidArgument(what + ": external data location must not leave the model's folder");
    }
    if (length >= 0 && length != bytes) {
      return InvalidArgument(what + ": external data length " + std::to_string(length) +
                             " does not match shape " + ShapeToString(shape) + " (" +
                             std::to_string(bytes) + " bytes)");
    }
    ASSIGN_OR_RETURN(std::string data, ReadFileLimited(fs::path(base_dir_) / rel,
                                                       options_.max_tensor_bytes, offset, bytes));
    Tensor t = Tensor::Allocate(dtype, std::move(shape), static_cast<size_t>(bytes));
    if (bytes) std::memcpy(t.mutable_data(), data.data(), static_cast<size_t>(bytes));
    return t;
  }

  StatusOr<Attribute> ConvertAttribute(const onnx::AttributeProto& a, const std::string& what) {
    Attribute out;
    using A = onnx::AttributeProto;
    switch (a.type()) {
      case A::INT:
        out.kind = Attribute::Kind::kInt;
        out.i = a.i();
        break;
      case A::FLOAT:
        out.kind = Attribute::Kind::kFloat;
        out.f = a.f();
        break;
      case A::STRING:
        out.kind = Attribute::Kind::kString;
        out.s = a.s();
        break;
      case A::INTS:
        out.kind = Attribute::Kind::kInts;
        out.ints.assign(a.ints().begin(), a.ints().end());
        break;
      case A::FLOATS:
        out.kind = Attribute::Kind::kFloats;
        out.floats.assign(a.floats().begin(), a.floats().end());
        break;
      case A::STRINGS:
        out.kind = Attribute::Kind::kStrings;
        out.strings.assign(a.strings().begin(), a.strings().end());
        break;
      case A::TENSOR: {
        out.kind = Attribute::Kind::kTensor;
        ASSIGN_OR_RETURN(out.t, ConvertTensor(a.t(), what + " attribute '" + a.name() + "'"));
        break;
      }
      default:
        out.kind = Attribute::Kind::kOther;
        break;  // sparse tensors, type protos (graphs: ImportNode)
    }
    return out;
  }

  Status ImportNode(const onnx::NodeProto& np, int index) {
    Node node;
    node.name = np.name();
    node.op_type = np.op_type();
    node.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    const std::string what =
        (np.name().empty() ? "node #" + std::to_string(index) : "node '" + np.name() + "'") + " (" +
        np.op_type() + ")";
    // Subgraphs, with the outer values they read (in order of first use) and, per
    // subgraph, its capture input for each of those values.
    std::vector<int> captured;
    std::vector<std::pair<std::shared_ptr<Graph>, std::map<int, int>>> subgraphs;
    for (const auto& a : np.attribute()) {
      Attribute attr;
      if (a.type() == onnx::AttributeProto::GRAPH) {
        attr.kind = Attribute::Kind::kGraph;
        std::map<int, int> by_outer;
        ASSIGN_OR_RETURN(auto sub, ImportSubgraph(a.g(), what + ": subgraph '" + a.name() + "'",
                                                  &captured, &by_outer));
        attr.g = sub;
        subgraphs.emplace_back(std::move(sub), std::move(by_outer));
      } else {
        ASSIGN_OR_RETURN(attr, ConvertAttribute(a, what));
      }
      if (!node.attributes.emplace(a.name(), std::move(attr)).second) {
        return InvalidArgument(what + ": attribute '" + a.name() + "' appears twice");
      }
    }
    for (const auto& name : np.input()) {
      if (name.empty()) {
        node.inputs.push_back(-1);
        continue;
      }
      const int id = Lookup(name);
      if (id < 0) {
        return InvalidArgument(what + ": input '" + name +
                               "' is not produced by any earlier node, initialiser or graph input");
      }
      node.inputs.push_back(id);
    }
    // The outer values the subgraphs read become the node's trailing inputs, and every
    // subgraph lists all of them, in the same order, after its own inputs.
    for (auto& [sub, by_outer] : subgraphs) {
      const size_t formal = sub->inputs.size() - static_cast<size_t>(sub->captures);
      std::vector<int> inputs(sub->inputs.begin(), sub->inputs.begin() + formal);
      for (int outer : captured) {
        auto it = by_outer.find(outer);
        if (it != by_outer.end()) {
          inputs.push_back(it->second);
        } else {  // read by another subgraph of the node only
          const int id = sub->AddValue(graph_.values[outer].name, graph_.values[outer].dtype);
          inputs.push_back(id);
        }
      }
      sub->inputs = std::move(inputs);
      sub->captures = static_cast<int>(captured.size());
    }
    for (int outer : captured) node.inputs.push_back(outer);
    if (node.domain.empty() && node.op_type == "Constant") return ImportConstant(np, node, what);
    for (const auto& name : np.output()) {
      if (name.empty()) {
        node.outputs.push_back(-1);
        continue;
      }
      if (by_name_.count(name))
        return InvalidArgument(what + ": output '" + name + "' is already defined");
      const int id = graph_.AddValue(name);
      graph_.values[id].producer = static_cast<int>(graph_.nodes.size());
      by_name_.emplace(name, id);
      node.outputs.push_back(id);
    }
    graph_.nodes.push_back(std::move(node));
    return Status::Ok();
  }

  Status ImportConstant(const onnx::NodeProto& np, Node& node, const std::string& what) {
    if (np.output_size() != 1 || np.output(0).empty())
      return InvalidArgument(what + ": needs exactly one output");
    if (!node.inputs.empty()) return InvalidArgument(what + ": takes no inputs");
    if (node.attributes.size() != 1)
      return InvalidArgument(what + ": needs exactly one value attribute");
    const auto& [key, a] = *node.attributes.begin();
    Tensor t;
    if (key == "value" && a.kind == Attribute::Kind::kTensor) {
      t = a.t;
    } else if (key == "value_float" && a.kind == Attribute::Kind::kFloat) {
      t = Tensor::FromVector<float>(DataType::kFp32, {}, {a.f});
    } else if (key == "value_floats" && a.kind == Attribute::Kind::kFloats) {
      t = Tensor::FromVector<float>(DataType::kFp32, {static_cast<int64_t>(a.floats.size())},
                                    a.floats);
    } else if (key == "value_int" && a.kind == Attribute::Kind::kInt) {
      t = Tensor::FromVector<int64_t>(DataType::kInt64, {}, {a.i});
    } else if (key == "value_ints" && a.kind == Attribute::Kind::kInts) {
      t = Tensor::FromVector<int64_t>(DataType::kInt64, {static_cast<int64_t>(a.ints.size())},
                                      a.ints);
    } else {
      return InvalidArgument(what + ": attribute '" + key +
                             "' is not supported (supported: value, value_float, "
                             "value_floats, value_int, value_ints)");
    }
    const std::string& name = np.output(0);
    if (by_name_.count(name))
      return InvalidArgument(what + ": output '" + name + "' is already defined");
    const int id = graph_.AddValue(name, t.dtype());
    graph_.values[id].shape = KnownShape(t.shape());
    graph_.values[id].constant = std::move(t);
    by_name_.emplace(name, id);
    return Status::Ok();
  }

  std::string base_dir_;
  ImportOptions options_;
  Importer* parent_ = nullptr;
  Graph graph_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<int> captured_;  // outer value per captured input, in input order
};

}  // namespace

StatusOr<Graph> ImportOnnxBytes(std::string_view bytes, const std::string& base_dir,
                                const ImportOptions& options) {
  if (static_cast<int64_t>(bytes.size()) > options.max_model_bytes) {
    return InvalidArgument("the model has " + std::to_string(bytes.size()) +
                           " bytes, above the limit of " + std::to_string(options.max_model_bytes));
  }
  if (bytes.size() > static_cast<size_t>(INT32_MAX))
    return InvalidArgument("the model is larger than 2 GiB");
  // An empty buffer parses as an empty message, which would only fail later, as "imports
  // no opset": say what it is.
  if (bytes.empty()) return InvalidArgument("not a valid ONNX model: the file is empty");
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return InvalidArgument(
        "not a valid ONNX model: the protobuf message could not be parsed "
        "(truncated or not an .onnx file)");
  }
  if (options.infer_shapes) {
    try {
      onnx::shape_inference::InferShapes(model);
    } catch (const std::exception&) {  // inference is a bonus: import what the file says
    }
  }
  try {
    Importer importer(base_dir, options);
    return importer.Import(model);
  } catch (const std::exception& e) {  // bad_alloc, filesystem errors
    return InvalidArgument(std::string("could not import the model: ") + e.what());
  }
}

StatusOr<Graph> ImportOnnxFile(const std::string& path, const ImportOptions& options) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return NotFound("model file '" + path + "' does not exist");
  ASSIGN_OR_RETURN(std::string bytes, ReadFileLimited(path, options.max_model_bytes));
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  auto graph = ImportOnnxBytes(bytes, dir, options);
  if (!graph.ok()) return graph.status().WithPrefix("'" + path + "'");
  return graph;
}

}  // namespace shoal::engine
