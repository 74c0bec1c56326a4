#include "loadgen/model_info.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <charconv>

#include "core/data_type.h"

namespace shoal::loadgen {
namespace {

Status ParseTensors(simdjson::dom::element root, const char* key, std::vector<TensorInfo>* out) {
  simdjson::dom::array tensors;
  if (root[key].get_array().get(tensors) != simdjson::SUCCESS) return Status::Ok();
  for (simdjson::dom::element t : tensors) {
    TensorInfo info;
    std::string_view name, datatype;
    simdjson::dom::array shape;
    if (t["name"].get_string().get(name) != simdjson::SUCCESS ||
        t["datatype"].get_string().get(datatype) != simdjson::SUCCESS ||
        t["shape"].get_array().get(shape) != simdjson::SUCCESS) {
      return InvalidArgument(
          fmt::format("model metadata: an entry of '{}' lacks name, datatype or shape", key));
    }
    info.name = std::string(name);
    info.datatype = std::string(datatype);
    for (simdjson::dom::element d : shape) {
      int64_t dim = 0;
      if (d.get_int64().get(dim) != simdjson::SUCCESS) {
        return InvalidArgument(fmt::format("model metadata: {} has a non-integer dim", info.name));
      }
      info.shape.push_back(dim);
    }
    out->push_back(std::move(info));
  }
  return Status::Ok();
}

}  // namespace

std::string FormatShape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

StatusOr<ModelInfo> ParseHttpModelInfo(std::string_view metadata_json,
                                       std::string_view config_json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(metadata_json.data(), metadata_json.size()).get(root) != simdjson::SUCCESS) {
    return InvalidArgument("model metadata is not JSON");
  }
  ModelInfo info;
  std::string_view name;
  if (root["name"].get_string().get(name) == simdjson::SUCCESS) info.name = std::string(name);
  RETURN_IF_ERROR(ParseTensors(root, "inputs", &info.inputs));
  RETURN_IF_ERROR(ParseTensors(root, "outputs", &info.outputs));
  if (info.inputs.empty()) return InvalidArgument("model metadata lists no inputs");

  simdjson::dom::parser config_parser;
  simdjson::dom::element config;
  if (config_parser.parse(config_json.data(), config_json.size()).get(config) !=
      simdjson::SUCCESS) {
    return InvalidArgument("model config is not JSON");
  }
  simdjson::dom::element mbs;
  if (config["max_batch_size"].get(mbs) == simdjson::SUCCESS) {
    int64_t v = 0;
    std::string_view s;
    if (mbs.get_int64().get(v) == simdjson::SUCCESS) {
      info.max_batch_size = v;
    } else if (mbs.get_string().get(s) == simdjson::SUCCESS) {
      std::from_chars(s.data(), s.data() + s.size(), info.max_batch_size);
    }
  }
  return info;
}

StatusOr<std::vector<TensorInfo>> ResolveInputs(const ModelInfo& model,
                                                const std::vector<ShapeOverride>& shapes,
                                                int64_t batch_size) {
  const bool batching = model.max_batch_size > 0;
  if (!batching && batch_size > 1) {
    return InvalidArgument(
        fmt::format("model '{}' does not batch (max_batch_size 0), so -b must be 1; was {}",
                    model.name, batch_size));
  }
  if (batching && batch_size > model.max_batch_size) {
    return InvalidArgument(fmt::format("-b {} is above model '{}''s max_batch_size {}", batch_size,
                                       model.name, model.max_batch_size));
  }
  for (const ShapeOverride& s : shapes) {
    bool found = false;
    for (const TensorInfo& in : model.inputs) found |= in.name == s.name;
    if (!found) {
      std::string names;
      for (const TensorInfo& in : model.inputs) names += (names.empty() ? "" : ", ") + in.name;
      return InvalidArgument(fmt::format("--shape names '{}', which is not an input of '{}' ({})",
                                         s.name, model.name, names));
    }
  }
  std::vector<TensorInfo> out;
  for (const TensorInfo& in : model.inputs) {
    if (!DataTypeFromName(in.datatype)) {
      return InvalidArgument(
          fmt::format("input '{}' has unknown datatype '{}'", in.name, in.datatype));
    }
    std::vector<int64_t> dims = in.shape;
    if (batching) {
      if (dims.empty()) {
        return InvalidArgument(fmt::format(
            "input '{}' of a batching model has no batch axis in its metadata", in.name));
      }
      dims.erase(dims.begin());
    }
    const ShapeOverride* given = nullptr;
    for (const ShapeOverride& s : shapes) {
      if (s.name == in.name) given = &s;
    }
    if (given != nullptr) {
      bool compatible = given->dims.size() == dims.size();
      for (size_t i = 0; compatible && i < dims.size(); ++i) {
        compatible = dims[i] == -1 || dims[i] == given->dims[i];
      }
      if (!compatible) {
        return InvalidArgument(
            fmt::format("--shape {}:{} does not fit the input's dims {} (without the batch axis)",
                        in.name, FormatShape(given->dims), FormatShape(dims)));
      }
      dims = given->dims;
    }
    for (int64_t d : dims) {
      if (d < 0) {
        return InvalidArgument(fmt::format(
            "input '{}' has variable dims {}; give its shape with --shape {}:D1,D2,... (dims "
            "without the batch axis)",
            in.name, FormatShape(dims), in.name));
      }
    }
    TensorInfo resolved{in.name, in.datatype, {}};
    if (batching) resolved.shape.push_back(batch_size);
    resolved.shape.insert(resolved.shape.end(), dims.begin(), dims.end());
    out.push_back(std::move(resolved));
  }
  return out;
}

}  // namespace shoal::loadgen
