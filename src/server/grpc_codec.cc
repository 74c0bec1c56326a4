#include "server/grpc_codec.h"

#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "core/dtype_visit.h"
#include "server/status_map.h"

namespace shoal::server {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// ------------------------------------------------------------------ parameters

std::string_view ParameterTypeName(const InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return "bool_param";
    case InferParameter::kInt64Param:
      return "int64_param";
    case InferParameter::kStringParam:
      return "string_param";
    case InferParameter::kDoubleParam:
      return "double_param";
    case InferParameter::kUint64Param:
      return "uint64_param";
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return "no value";
}

Status BadParameter(const std::string& key, const InferParameter& p, std::string_view want) {
  return InvalidArgument("parameter '" + key + "' must be " + std::string(want) + "; got " +
                         std::string(ParameterTypeName(p)));
}

// A non-negative integer from uint64_param or int64_param.
StatusOr<uint64_t> UnsignedParameter(const std::string& key, const InferParameter& p) {
  if (p.parameter_choice_case() == InferParameter::kUint64Param) return p.uint64_param();
  if (p.parameter_choice_case() == InferParameter::kInt64Param) {
    if (p.int64_param() < 0) {
      return InvalidArgument("parameter '" + key + "' must not be negative; was " +
                             std::to_string(p.int64_param()));
    }
    return static_cast<uint64_t>(p.int64_param());
  }
  return BadParameter(key, p, "an unsigned integer (uint64_param or int64_param)");
}

Status ApplyParameter(const std::string& key, const InferParameter& p,
                      runtime::InferRequest* request) {
  if (key == "priority") {
    ASSIGN_OR_RETURN(uint64_t priority, UnsignedParameter(key, p));
    if (priority > std::numeric_limits<uint32_t>::max()) {
      return InvalidArgument("parameter 'priority' is too large; was " + std::to_string(priority));
    }
    request->priority = static_cast<uint32_t>(priority);
    return Status::Ok();
  }
  if (key == "timeout") {
    ASSIGN_OR_RETURN(request->timeout_us, UnsignedParameter(key, p));
    return Status::Ok();
  }
  if (key == "sequence_id") {
    // No sequence batching: a request that is part of a sequence (a non-zero or non-empty
    // id) is refused, as over HTTP, rather than served as if it were stateless.
    bool in_sequence = false;
    switch (p.parameter_choice_case()) {
      case InferParameter::kInt64Param:
        in_sequence = p.int64_param() != 0;
        break;
      case InferParameter::kUint64Param:
        in_sequence = p.uint64_param() != 0;
        break;
      case InferParameter::kStringParam:
        in_sequence = !p.string_param().empty();
        break;
      default:
        return BadParameter(key, p, "int64_param, uint64_param or string_param");
    }
    if (in_sequence) {
      return InvalidArgument("parameter 'sequence_id': sequences are not supported by this server");
    }
    return Status::Ok();
  }
  if (key == "sequence_start" || key == "sequence_end" ||
      key == "triton_enable_empty_final_response") {
    if (p.parameter_choice_case() != InferParameter::kBoolParam) {
      return BadParameter(key, p, "bool_param");
    }
    if (key != "triton_enable_empty_final_response" && p.bool_param()) {
      return InvalidArgument("parameter '" + key + "': sequences are not supported by this server");
    }
    return Status::Ok();
  }
  if (key == "headers" || key == "binary_data_output") return Status::Ok();
  if (key.rfind("triton_", 0) == 0) {
    return InvalidArgument("parameter '" + key + "' is not supported: keys starting with " +
                           "'triton_' are reserved");
  }
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      request->parameters[key] = p.bool_param();
      break;
    case InferParameter::kInt64Param:
      request->parameters[key] = p.int64_param();
      break;
    case InferParameter::kStringParam:
      request->parameters[key] = p.string_param();
      break;
    case InferParameter::kDoubleParam:
      request->parameters[key] = p.double_param();
      break;
    case InferParameter::kUint64Param:
      if (p.uint64_param() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgument("parameter '" + key + "' is too large; was " +
                               std::to_string(p.uint64_param()));
      }
      request->parameters[key] = static_cast<int64_t>(p.uint64_param());
      break;
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      return InvalidArgument("parameter '" + key + "' has no value");
  }
  return Status::Ok();
}

// An unsigned integer tensor parameter (int64_param >= 0 or uint64_param).
StatusOr<uint64_t> UnsignedParameter(const InferParameter& p, const std::string& where) {
  if (p.parameter_choice_case() == InferParameter::kInt64Param && p.int64_param() >= 0) {
    return static_cast<uint64_t>(p.int64_param());
  }
  if (p.parameter_choice_case() == InferParameter::kUint64Param) return p.uint64_param();
  return InvalidArgument(where + " must be a non-negative int64_param or a uint64_param");
}

// Tensor-level parameters: the shared-memory ones (returned when given) and, on outputs,
// classification (stored in *class_count); the rest are ignored, as Triton does.
StatusOr<std::optional<SharedMemoryRef>> ReadTensorParameters(
    const google::protobuf::Map<std::string, InferParameter>& parameters, const std::string& what,
    std::optional<int64_t>* class_count) {
  std::optional<std::string> region;
  std::optional<uint64_t> byte_size, offset;
  for (const auto& [key, value] : parameters) {
    const std::string where = what + ": parameter '" + key + "'";
    if (key == "shared_memory_region") {
      if (value.parameter_choice_case() != InferParameter::kStringParam) {
        return InvalidArgument(where + " must be a string_param");
      }
      region = value.string_param();
    } else if (key == "shared_memory_byte_size") {
      ASSIGN_OR_RETURN(byte_size, UnsignedParameter(value, where));
    } else if (key == "shared_memory_offset") {
      ASSIGN_OR_RETURN(offset, UnsignedParameter(value, where));
    } else if (key == "classification") {
      if (class_count == nullptr) return InvalidArgument(where + ": only outputs take it");
      ASSIGN_OR_RETURN(const uint64_t k, UnsignedParameter(value, where));
      if (k < 1 || k > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgument(where + " must be a positive integer; was " + std::to_string(k));
      }
      *class_count = static_cast<int64_t>(k);
    }
  }
  if (!region) {
    if (byte_size || offset) {
      return InvalidArgument(what + ": shared_memory_byte_size and shared_memory_offset need " +
                             "shared_memory_region");
    }
    return std::optional<SharedMemoryRef>();
  }
  if (!byte_size)
    return InvalidArgument(what + ": shared_memory_region needs shared_memory_byte_size");
  return std::optional<SharedMemoryRef>(SharedMemoryRef{*region, offset.value_or(0), *byte_size});
}

// ------------------------------------------------------------------ typed contents

// Elements across every field of `c`.
int64_t TotalTypedElements(const InferTensorContents& c) {
  return int64_t{c.bool_contents_size()} + c.int_contents_size() + c.int64_contents_size() +
         c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

// Copies `src` into a new tensor of element type `To`, range-checking narrowing.
template <typename To, typename Field>
StatusOr<Tensor> CopyTyped(const Field& src, DataType dtype, const Shape& shape,
                           const std::string& name) {
  Tensor t = Tensor::Allocate(dtype, shape, static_cast<size_t>(src.size()) * sizeof(To));
  To* out = t.mutable_values<To>().data();
  int i = 0;
  for (const auto v : src) {
    using From = std::remove_cv_t<decltype(v)>;
    if constexpr (std::is_integral_v<To> && !std::is_same_v<From, bool>) {
      if (!std::in_range<To>(v)) {
        return InvalidArgument("input '" + name + "': element " + std::to_string(i) + " (" +
                               std::to_string(v) + ") is out of range for " +
                               std::string(DataTypeName(dtype)));
      }
    }
    out[i++] = static_cast<To>(v);
  }
  return t;
}

// The typed field of InferTensorContents that carries type D, and its name
// (docs/open-inference-protocol.md section 3.2). FP16 and BF16 have none.
template <DataType D>
auto ContentsField(const InferTensorContents& c) {
  if constexpr (D == DataType::kBool) {
    return std::pair{&c.bool_contents(), std::string_view("bool_contents")};
  } else if constexpr (D == DataType::kUint8 || D == DataType::kUint16 || D == DataType::kUint32) {
    return std::pair{&c.uint_contents(), std::string_view("uint_contents")};
  } else if constexpr (D == DataType::kUint64) {
    return std::pair{&c.uint64_contents(), std::string_view("uint64_contents")};
  } else if constexpr (D == DataType::kInt8 || D == DataType::kInt16 || D == DataType::kInt32) {
    return std::pair{&c.int_contents(), std::string_view("int_contents")};
  } else if constexpr (D == DataType::kInt64) {
    return std::pair{&c.int64_contents(), std::string_view("int64_contents")};
  } else if constexpr (D == DataType::kFp32) {
    return std::pair{&c.fp32_contents(), std::string_view("fp32_contents")};
  } else {
    static_assert(D == DataType::kFp64, "FP16 and BF16 travel only in raw_input_contents");
    return std::pair{&c.fp64_contents(), std::string_view("fp64_contents")};
  }
}

// The typed field holds exactly the tensor's elements and no other typed field holds any.
Status CheckContentsCount(const InferTensorContents& c, int64_t have, std::string_view field,
                          DataType dtype, const Shape& shape, int64_t count,
                          const std::string& name) {
  if (TotalTypedElements(c) != have) {
    return InvalidArgument("input '" + name + "': " + std::string(DataTypeName(dtype)) +
                           " contents belong in " + std::string(field) +
                           ", but other typed fields hold data");
  }
  if (have != count) {
    return InvalidArgument("input '" + name + "' has " + std::to_string(have) + " elements in " +
                           std::string(field) + " but shape " + ShapeToString(shape) + " needs " +
                           std::to_string(count));
  }
  return Status::Ok();
}

Tensor BytesFromContents(const InferTensorContents& c, const Shape& shape) {
  size_t bytes = 0;
  for (const auto& s : c.bytes_contents()) bytes += 4 + s.size();
  Tensor t = Tensor::Allocate(DataType::kBytes, shape, bytes);
  char* out = static_cast<char*>(t.mutable_data());
  for (const auto& s : c.bytes_contents()) {
    const auto len = static_cast<uint32_t>(s.size());  // < 2 GiB: it fit in a message
    std::memcpy(out, &len, 4);                         // little-endian host
    if (!s.empty()) std::memcpy(out + 4, s.data(), s.size());
    out += 4 + s.size();
  }
  return t;
}

StatusOr<Tensor> TensorFromContents(const InferTensorContents& c, DataType dtype,
                                    const Shape& shape, int64_t count, const std::string& name) {
  auto raw_only = [&]() -> StatusOr<Tensor> {
    return InvalidArgument("input '" + name + "': " + std::string(DataTypeName(dtype)) +
                           " data can only be sent in raw_input_contents");
  };
  if (dtype == DataType::kBytes) {
    RETURN_IF_ERROR(CheckContentsCount(c, c.bytes_contents_size(), "bytes_contents", dtype, shape,
                                       count, name));
    return BytesFromContents(c, shape);
  }
  return VisitDType(
      dtype,
      [&](auto tag) -> StatusOr<Tensor> {
        using Tag = decltype(tag);
        if constexpr (Tag::kType == DataType::kFp16 || Tag::kType == DataType::kBf16) {
          return raw_only();
        } else {
          const auto [field, field_name] = ContentsField<Tag::kType>(c);
          RETURN_IF_ERROR(
              CheckContentsCount(c, field->size(), field_name, dtype, shape, count, name));
          return CopyTyped<typename Tag::type>(*field, dtype, shape, name);
        }
      },
      raw_only);
}

// ------------------------------------------------------------------ raw contents

StatusOr<Tensor> TensorFromRaw(std::string* raw, const std::shared_ptr<const void>& owner,
                               DataType dtype, const Shape& shape, int64_t count,
                               const std::string& name) {
  if (dtype == DataType::kBytes) {
    RETURN_IF_ERROR(ScanBytesElements(*raw, count).status().WithPrefix("input '" + name + "'"));
  } else {
    const uint64_t expected = static_cast<uint64_t>(count) * DataTypeSize(dtype);
    if (raw->size() != expected) {
      return InvalidArgument("input '" + name + "' has " + std::to_string(raw->size()) +
                             " bytes in raw_input_contents but shape " + ShapeToString(shape) +
                             " of " + std::string(DataTypeName(dtype)) + " needs " +
                             std::to_string(expected));
    }
    const size_t align = DataTypeSize(dtype);
    if (reinterpret_cast<uintptr_t>(raw->data()) % align != 0) {
      Tensor copy = Tensor::AllocateUninitialized(dtype, shape, raw->size());
      if (!raw->empty()) std::memcpy(copy.mutable_data(), raw->data(), raw->size());
      return copy;
    }
  }
  return Tensor(dtype, shape, Buffer::Wrap(raw->data(), raw->size(), owner), 0, raw->size());
}

}  // namespace

StatusOr<int64_t> ParseModelVersion(std::string_view version) {
  if (version.empty()) return int64_t{-1};
  if (version.size() > 18) {
    return InvalidArgument("model version '" + std::string(version) + "' is too long");
  }
  int64_t v = 0;
  for (char c : version) {
    if (c < '0' || c > '9') {
      return InvalidArgument("model version must be decimal digits; was '" + std::string(version) +
                             "'");
    }
    v = v * 10 + (c - '0');
  }
  return v;
}

StatusOr<runtime::InferRequest> InferRequestFromProto(
    std::shared_ptr<inference::ModelInferRequest> message, const runtime::RequestLimits& limits) {
  return InferRequestFromProto(std::move(message), limits, nullptr, nullptr);
}

StatusOr<runtime::InferRequest> InferRequestFromProto(
    std::shared_ptr<inference::ModelInferRequest> message, const runtime::RequestLimits& limits,
    const SharedMemoryManager* shared_memory, SharedMemoryOutputs* shared_memory_outputs) {
  inference::ModelInferRequest& m = *message;
  runtime::InferRequest request;
  request.model_name = m.model_name();
  request.id = m.id();
  ASSIGN_OR_RETURN(request.model_version, ParseModelVersion(m.model_version()));
  if (m.model_name().empty()) return InvalidArgument("model_name is empty");

  for (const auto& [key, value] : m.parameters()) {
    RETURN_IF_ERROR(ApplyParameter(key, value, &request));
  }

  if (m.inputs_size() > limits.max_inputs) {
    return InvalidArgument("request has " + std::to_string(m.inputs_size()) +
                           " inputs; the limit is " + std::to_string(limits.max_inputs));
  }
  bool any_typed = false;
  for (const auto& in : m.inputs()) any_typed |= in.has_contents();
  auto no_shared_memory = [](const std::string& what) {
    return InvalidArgument(what + ": shared memory is not available here");
  };
  if (any_typed && m.raw_input_contents_size() > 0) {
    return InvalidArgument(
        "contents and raw_input_contents cannot be mixed in one request: send every input's "
        "data in raw_input_contents, or every input's in contents");
  }

  // The owner handle every raw view holds: the message itself.
  const std::shared_ptr<const void> owner = message;
  int next_raw = 0;
  std::set<std::string> seen;
  request.inputs.reserve(m.inputs_size());
  for (auto& in : *m.mutable_inputs()) {
    const std::string& name = in.name();
    if (!seen.insert(name).second) return InvalidArgument("input '" + name + "' appears twice");
    const auto dtype = DataTypeFromName(in.datatype());
    if (!dtype) {
      return InvalidArgument("input '" + name + "' has unknown datatype '" + in.datatype() + "'");
    }
    Shape shape(in.shape().begin(), in.shape().end());
    auto count = ElementCount(shape, limits.max_elements_per_tensor);
    if (!count.ok()) return count.status().WithPrefix("input '" + name + "'");
    ASSIGN_OR_RETURN(std::optional<SharedMemoryRef> shm,
                     ReadTensorParameters(in.parameters(), "input " + Quote(name), nullptr));
    if (shm) {
      if (shared_memory == nullptr) return no_shared_memory("input " + Quote(name));
      if (in.has_contents()) {
        return InvalidArgument("input " + Quote(name) +
                               ": an input in shared memory takes no contents");
      }
      ASSIGN_OR_RETURN(Tensor tensor,
                       shared_memory->InputTensor(*shm, *dtype, shape, "input " + Quote(name)));
      request.inputs.push_back({name, std::move(tensor)});
      continue;
    }

    if (!in.has_contents() && next_raw >= m.raw_input_contents_size()) {
      return InvalidArgument("unable to find data for input tensor '" + name +
                             "': it has no contents and raw_input_contents has no entry "
                             "left for it");
    }
    ASSIGN_OR_RETURN(Tensor tensor,
                     in.has_contents()
                         ? TensorFromContents(in.contents(), *dtype, shape, *count, name)
                         : TensorFromRaw(m.mutable_raw_input_contents(next_raw++), owner, *dtype,
                                         shape, *count, name));
    request.inputs.push_back({name, std::move(tensor)});
  }
  if (next_raw != m.raw_input_contents_size()) {
    return InvalidArgument("raw_input_contents has " + std::to_string(m.raw_input_contents_size()) +
                           " entries but " + std::to_string(next_raw) +
                           " input(s) take their data from it");
  }

  std::set<std::string> wanted;
  for (const auto& out : m.outputs()) {
    if (!wanted.insert(out.name()).second) {
      return InvalidArgument("output '" + out.name() + "' is requested twice");
    }
    std::optional<int64_t> class_count;
    ASSIGN_OR_RETURN(
        std::optional<SharedMemoryRef> shm,
        ReadTensorParameters(out.parameters(), "output " + Quote(out.name()), &class_count));
    if (class_count) request.classification[out.name()] = *class_count;
    if (shm) {
      if (shared_memory == nullptr || shared_memory_outputs == nullptr) {
        return no_shared_memory("output " + Quote(out.name()));
      }
      ASSIGN_OR_RETURN(SharedMemoryView view,
                       shared_memory->View(*shm, "output " + Quote(out.name())));
      (*shared_memory_outputs)[out.name()] = {*shm, std::move(view)};
    }
    request.requested_outputs.push_back(out.name());
  }
  return request;
}

void InferResponseToProto(const runtime::InferResponse& response,
                          inference::ModelInferResponse* out) {
  const Status s = InferResponseToProto(response, {}, out);
  (void)s;  // nothing can fail without shared memory
}

Status InferResponseToProto(const runtime::InferResponse& response,
                            const SharedMemoryOutputs& shared_memory,
                            inference::ModelInferResponse* out) {
  out->set_model_name(response.model_name);
  out->set_model_version(std::to_string(response.model_version));
  out->set_id(response.id);
  for (const auto& [key, value] : response.parameters) {
    InferParameter& p = (*out->mutable_parameters())[key];
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            p.set_string_param(v);
          } else if constexpr (std::is_same_v<V, bool>) {
            p.set_bool_param(v);
          } else if constexpr (std::is_same_v<V, double>) {
            p.set_double_param(v);
          } else {
            p.set_int64_param(v);
          }
        },
        value);
  }
  for (const auto& named : response.outputs) {
    auto* o = out->add_outputs();
    o->set_name(named.name);
    o->set_datatype(std::string(DataTypeName(named.tensor.dtype())));
    for (int64_t d : named.tensor.shape()) o->add_shape(d);
    if (auto shm = shared_memory.find(named.name); shm != shared_memory.end()) {
      const auto& [ref, view] = shm->second;
      RETURN_IF_ERROR(WriteToSharedMemory(view, named.tensor, named.name));
      auto& params = *o->mutable_parameters();
      params["shared_memory_region"].set_string_param(ref.region);
      params["shared_memory_byte_size"].set_int64_param(
          static_cast<int64_t>(named.tensor.byte_size()));
      if (ref.offset != 0)
        params["shared_memory_offset"].set_int64_param(static_cast<int64_t>(ref.offset));
      out->add_raw_output_contents();  // empty: keeps one entry per output
      continue;
    }
    std::string_view bytes = named.tensor.empty() ? std::string_view() : named.tensor.bytes();
    out->add_raw_output_contents()->assign(bytes.data(), bytes.size());
  }
  return Status::Ok();
}

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(GrpcCodeFor(status.code())), status.message());
}

void ModelMetadataToProto(const std::string& name, const std::vector<int64_t>& versions,
                          const std::string& platform, const runtime::ModelSignature& signature,
                          inference::ModelMetadataResponse* out) {
  out->set_name(name);
  for (int64_t v : versions) out->add_versions(std::to_string(v));
  out->set_platform(platform);
  auto add = [&](const backends::TensorSpec& spec, auto* meta) {
    meta->set_name(spec.name);
    meta->set_datatype(std::string(DataTypeName(spec.dtype)));
    if (signature.max_batch_size > 0) meta->add_shape(-1);
    for (int64_t d : spec.dims) meta->add_shape(d);
  };
  for (const auto& spec : signature.inputs) add(spec, out->add_inputs());
  for (const auto& spec : signature.outputs) add(spec, out->add_outputs());
}

namespace {
void SetDuration(const runtime::Duration& d, inference::StatisticDuration* out) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}
}  // namespace

void ModelStatisticsToProto(const std::string& name, int64_t version,
                            const runtime::ModelStatsSnapshot& s, inference::ModelStatistics* out) {
  out->set_name(name);
  out->set_version(std::to_string(version));
  out->set_last_inference(static_cast<uint64_t>(std::max<int64_t>(s.last_inference_ms, 0)));
  out->set_inference_count(s.inference_count);
  out->set_execution_count(s.execution_count);
  auto* is = out->mutable_inference_stats();
  SetDuration(s.success, is->mutable_success());
  SetDuration(s.fail, is->mutable_fail());
  SetDuration(s.queue, is->mutable_queue());
  SetDuration(s.compute_input, is->mutable_compute_input());
  SetDuration(s.compute_infer, is->mutable_compute_infer());
  SetDuration(s.compute_output, is->mutable_compute_output());
  SetDuration(s.cache_hit, is->mutable_cache_hit());
  SetDuration(s.cache_miss, is->mutable_cache_miss());
  for (const auto& [batch_size, b] : s.batch_stats) {
    auto* bs = out->add_batch_stats();
    bs->set_batch_size(static_cast<uint64_t>(batch_size));
    SetDuration(b.compute_input, bs->mutable_compute_input());
    SetDuration(b.compute_infer, bs->mutable_compute_infer());
    SetDuration(b.compute_output, bs->mutable_compute_output());
  }
}

}  // namespace shoal::server
