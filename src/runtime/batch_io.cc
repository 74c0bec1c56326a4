#include "runtime/batch_io.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <variant>

namespace shoal::runtime {
namespace {

const NamedTensor* FindInput(const InferRequest& r, const std::string& name) {
  for (const auto& t : r.inputs) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

StatusOr<ValidatedRequest> ValidateRequest(const ModelSignature& sig, const InferRequest& request,
                                           const RequestLimits& limits) {
  if (static_cast<int64_t>(request.inputs.size()) > limits.max_inputs) {
    return InvalidArgument("request has " + std::to_string(request.inputs.size()) +
                           " inputs; the limit is " + std::to_string(limits.max_inputs));
  }
  std::set<std::string> seen;
  for (const auto& in : request.inputs) {
    if (!seen.insert(in.name).second)
      return InvalidArgument("input '" + in.name + "' appears twice");
    bool known = false;
    for (const auto& spec : sig.inputs) known |= spec.name == in.name;
    if (!known)
      return InvalidArgument("unexpected input '" + in.name + "': the model has no such input");
  }
  std::set<std::string> wanted;
  for (const auto& name : request.requested_outputs) {
    if (!wanted.insert(name).second)
      return InvalidArgument("output '" + name + "' is requested twice");
    bool known = false;
    for (const auto& spec : sig.outputs) known |= spec.name == name;
    if (!known) return InvalidArgument("unknown output '" + name + "' requested");
  }

  ValidatedRequest out;
  bool have_batch = false;
  uint64_t key = 0;
  for (const auto& spec : sig.inputs) {
    const NamedTensor* in = FindInput(request, spec.name);
    if (in == nullptr) {
      if (spec.optional) {
        key = Mix(key, 0x5bd1e995);  // absent optional input: its own bucket
        continue;
      }
      return InvalidArgument("missing input '" + spec.name + "'");
    }
    const Tensor& t = in->tensor;
    if (t.dtype() != spec.dtype) {
      return InvalidArgument("input '" + spec.name + "' has datatype " +
                             std::string(DataTypeName(t.dtype())) + " but the model expects " +
                             std::string(DataTypeName(spec.dtype)));
    }
    const Shape& shape = t.shape();
    auto count = ElementCount(shape, limits.max_elements_per_tensor);
    if (!count.ok()) return count.status().WithPrefix("input '" + spec.name + "'");
    const int64_t elements = *count;
    const size_t batch_dims = sig.max_batch_size > 0 ? 1 : 0;
    if (shape.size() != spec.dims.size() + batch_dims) {
      return InvalidArgument(
          "input '" + spec.name + "' has shape " + ShapeToString(shape) +
          " but the model expects " +
          (batch_dims ? "[-1," + ShapeToString(spec.dims).substr(1) : ShapeToString(spec.dims)));
    }
    if (batch_dims) {
      const int64_t n = shape[0];
      if (n < 1 || n > sig.max_batch_size) {
        return InvalidArgument("input '" + spec.name + "' has batch size " + std::to_string(n) +
                               "; the model accepts 1.." + std::to_string(sig.max_batch_size));
      }
      if (have_batch && n != out.batch_size) {
        return InvalidArgument("input '" + spec.name + "' has batch size " + std::to_string(n) +
                               " but other inputs have " + std::to_string(out.batch_size));
      }
      out.batch_size = n;
      have_batch = true;
    }
    for (size_t i = 0; i < spec.dims.size(); ++i) {
      const int64_t want = spec.dims[i];
      const int64_t got = shape[i + batch_dims];
      if (want >= 0 && got != want) {
        return InvalidArgument("input '" + spec.name + "' has shape " + ShapeToString(shape) +
                               "; dimension " + std::to_string(i + batch_dims) + " must be " +
                               std::to_string(want));
      }
    }
    if (spec.dtype == DataType::kBytes) {
      RETURN_IF_ERROR(
          ScanBytesElements(t.bytes(), elements).status().WithPrefix("input '" + spec.name + "'"));
    } else {
      const uint64_t expected = static_cast<uint64_t>(elements) * DataTypeSize(spec.dtype);
      if (t.byte_size() != expected) {
        return InvalidArgument("input '" + spec.name + "' has " + std::to_string(t.byte_size()) +
                               " bytes of data but shape " + ShapeToString(shape) + " of " +
                               std::string(DataTypeName(spec.dtype)) + " needs " +
                               std::to_string(expected));
      }
    }
    key = Mix(key, std::hash<std::string>{}(spec.name));
    for (size_t i = batch_dims; i < shape.size(); ++i)
      key = Mix(key, static_cast<uint64_t>(shape[i]));
  }
  // The `precision` request parameter picks a model variant (backend.h); requests for
  // different variants never share a batch.
  if (auto it = request.parameters.find("precision"); it != request.parameters.end()) {
    const auto* tier = std::get_if<std::string>(&it->second);
    if (tier == nullptr || tier->empty())
      return InvalidArgument("parameter 'precision' must be a non-empty string");
    key = Mix(key, std::hash<std::string>{}("precision:" + *tier));
  }
  out.shape_key = key;
  return out;
}

bool SameBatchShape(const ModelSignature& sig, const InferRequest& a, const InferRequest& b) {
  const size_t batch_dims = sig.max_batch_size > 0 ? 1 : 0;
  for (const auto& spec : sig.inputs) {
    const NamedTensor* x = FindInput(a, spec.name);
    const NamedTensor* y = FindInput(b, spec.name);
    if ((x == nullptr) != (y == nullptr)) return false;
    if (x == nullptr) continue;
    const Shape& sx = x->tensor.shape();
    const Shape& sy = y->tensor.shape();
    if (sx.size() != sy.size() || sx.size() < batch_dims ||
        !std::equal(sx.begin() + batch_dims, sx.end(), sy.begin() + batch_dims)) {
      return false;
    }
  }
  auto variant = [](const InferRequest& r) -> std::string {
    auto it = r.parameters.find("precision");
    if (it == r.parameters.end()) return "";
    const auto* tier = std::get_if<std::string>(&it->second);
    return tier ? *tier : "";
  };
  return variant(a) == variant(b);
}

StatusOr<backends::ExecuteRequest> MergeInputs(const ModelSignature& sig,
                                               const std::vector<const InferRequest*>& requests,
                                               const std::vector<int64_t>& batch_sizes) {
  for (size_t i = 1; i < requests.size(); ++i) {
    if (!SameBatchShape(sig, *requests[0], *requests[i])) {
      return Internal("requests '" + requests[0]->id + "' and '" + requests[i]->id +
                      "' differ in shape or precision and cannot be merged into one batch");
    }
  }
  backends::ExecuteRequest exec;
  if (!requests.empty()) {
    auto it = requests[0]->parameters.find("precision");
    if (it != requests[0]->parameters.end()) {
      if (const auto* tier = std::get_if<std::string>(&it->second)) exec.variant = *tier;
    }
  }
  exec.batch_size = 0;
  for (int64_t n : batch_sizes) exec.batch_size += n;
  if (sig.max_batch_size == 0) exec.batch_size = 1;

  // Requested outputs: the union; empty if any request wants all.
  bool all = false;
  std::set<std::string> wanted;
  for (const auto* r : requests) {
    if (r->requested_outputs.empty()) all = true;
    wanted.insert(r->requested_outputs.begin(), r->requested_outputs.end());
  }
  if (!all) {
    for (const auto& spec : sig.outputs) {
      if (wanted.count(spec.name)) exec.requested_outputs.push_back(spec.name);
    }
  }

  for (const auto& spec : sig.inputs) {
    const NamedTensor* first = FindInput(*requests[0], spec.name);
    if (first == nullptr) continue;  // optional and absent (same bucket: absent everywhere)
    Tensor merged;
    if (requests.size() == 1) {
      merged = first->tensor;
    } else {
      size_t bytes = 0;
      for (const auto* r : requests) bytes += FindInput(*r, spec.name)->tensor.byte_size();
      Shape shape = first->tensor.shape();
      shape[0] = exec.batch_size;
      merged = Tensor::AllocateUninitialized(spec.dtype, shape, bytes);  // filled below
      char* dst = static_cast<char*>(merged.mutable_data());
      for (const auto* r : requests) {
        const Tensor& t = FindInput(*r, spec.name)->tensor;
        if (t.byte_size() > 0) std::memcpy(dst, t.data(), t.byte_size());
        dst += t.byte_size();
      }
    }
    auto reshape = sig.input_reshape.find(spec.name);
    if (reshape != sig.input_reshape.end()) {
      Shape shape = reshape->second;
      if (sig.max_batch_size > 0) shape.insert(shape.begin(), exec.batch_size);
      merged = Tensor(merged.dtype(), std::move(shape), merged.buffer(),
                      static_cast<size_t>(static_cast<const char*>(merged.data()) -
                                          static_cast<const char*>(merged.buffer()->data())),
                      merged.byte_size());
    }
    exec.inputs.push_back(NamedTensor{spec.name, std::move(merged)});
  }
  return exec;
}

StatusOr<std::vector<std::vector<NamedTensor>>> ScatterOutputs(
    const ModelSignature& sig, std::vector<NamedTensor> outputs,
    const std::vector<const InferRequest*>& requests, const std::vector<int64_t>& batch_sizes) {
  std::vector<std::vector<NamedTensor>> per_request(requests.size());
  int64_t total = 0;
  for (int64_t n : batch_sizes) total += n;
  for (const auto& spec : sig.outputs) {
    const NamedTensor* produced = nullptr;
    for (const auto& o : outputs) {
      if (o.name == spec.name) produced = &o;
    }
    bool anyone_wants = false;
    std::vector<bool> wants(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& ro = requests[i]->requested_outputs;
      wants[i] = ro.empty() || std::find(ro.begin(), ro.end(), spec.name) != ro.end();
      anyone_wants |= wants[i];
    }
    if (!anyone_wants) continue;
    if (produced == nullptr)
      return Internal("the backend did not produce output '" + spec.name + "'");
    const Tensor& t = produced->tensor;
    if (sig.max_batch_size == 0 || requests.size() == 1) {
      if (sig.max_batch_size > 0 && (t.shape().empty() || t.shape()[0] != total)) {
        return Internal("output '" + spec.name + "' has shape " + ShapeToString(t.shape()) +
                        "; its first dimension must be the batch size " + std::to_string(total));
      }
      for (size_t i = 0; i < requests.size(); ++i) {
        if (wants[i]) per_request[i].push_back(NamedTensor{spec.name, t});
      }
      continue;
    }
    if (t.shape().empty() || t.shape()[0] != total) {
      return Internal("output '" + spec.name + "' has shape " + ShapeToString(t.shape()) +
                      "; its first dimension must be the batch size " + std::to_string(total));
    }
    int64_t row = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (wants[i]) {
        ASSIGN_OR_RETURN(Tensor slice, t.SliceRows(row, row + batch_sizes[i]));
        per_request[i].push_back(NamedTensor{spec.name, std::move(slice)});
      }
      row += batch_sizes[i];
    }
  }
  return per_request;
}

}  // namespace shoal::runtime
