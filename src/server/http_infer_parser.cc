// JSON side of the HTTP infer codec (see http_infer_codec.h): an infer request's
// document, its inputs, outputs and parameters, and its binary tensors attached in place.
// Checking a document before it is read, and the small control bodies, are
// http_json.cc's.
#include <simdjson.h>

#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>

#include "core/dtype_visit.h"
#include "server/http_infer_codec.h"
#include "server/http_json.h"

namespace shoal::server {
namespace {

namespace od = simdjson::ondemand;

constexpr size_t kMaxRank = 64;
constexpr size_t kMaxRequestedOutputs = 1024;
// Documents larger than this are parsed with a parser of their own, so that one big
// request does not leave every I/O thread holding a big parser.
constexpr size_t kSharedParserMaxBytes = size_t{1} << 20;

// Writes the flattened elements of a JSON `data` value into a tensor buffer.
class DataReader {
 public:
  DataReader(DataType dtype, int64_t expected, char* out, std::string* bytes_out, std::string field)
      : dtype_(dtype),
        expected_(expected),
        out_(out),
        bytes_out_(bytes_out),
        field_(std::move(field)) {}

  Status Read(od::value& v, int depth) {
    od::json_type type;
    JSON_GET(v.type(), type, field_, "an array of values");
    if (type == od::json_type::array) {
      if (depth >= kMaxDataDepth) return InvalidArgument(field_ + ": nested too deeply");
      od::array arr;
      JSON_GET(v.get_array(), arr, field_, "an array");
      for (auto child_result : arr) {
        od::value child;
        JSON_GET(child_result, child, field_, "an array of values");
        RETURN_IF_ERROR(Read(child, depth + 1));
      }
      return Status::Ok();
    }
    if (depth == 0) return InvalidArgument(field_ + ": expected an array");
    if (count_ >= expected_) {
      return InvalidArgument(field_ + ": holds more than the " + std::to_string(expected_) +
                             " elements its shape declares");
    }
    RETURN_IF_ERROR(Element(v));
    ++count_;
    return Status::Ok();
  }

  int64_t count() const { return count_; }

 private:
  template <typename T>
  void Put(T value) {
    std::memcpy(out_ + count_ * static_cast<int64_t>(sizeof(T)), &value, sizeof(T));
  }

  Status Element(od::value& v) {
    const std::string where = field_ + "[" + std::to_string(count_) + "]";
    auto no_json = [&] {
      return InvalidArgument(where + ": " + std::string(DataTypeName(dtype_)) +
                             " data cannot be sent as JSON; use binary data");
    };
    if (dtype_ == DataType::kBytes) return PutString(v, where);
    return VisitDType(
        dtype_,
        [&](auto tag) -> Status {
          using Tag = decltype(tag);
          using T = typename Tag::type;
          if constexpr (Tag::kType == DataType::kBool) {
            bool b;
            JSON_GET(v.get_bool(), b, where, "true or false");
            Put<T>(b ? 1 : 0);
          } else if constexpr (!Tag::kPlainNumber) {
            return no_json();  // FP16, BF16
          } else if constexpr (std::is_floating_point_v<T>) {
            double d;
            JSON_GET(v.get_double(), d, where, "a number");
            // FP32 cannot hold every double: a finite number beyond its range would turn
            // into infinity. StoreElementChecked says so, with the value.
            T stored;
            if (Status s = StoreElementChecked(dtype_, &stored, 0, d); !s.ok())
              return InvalidArgument(where + ": " + s.message());
            Put<T>(stored);
          } else if constexpr (std::is_unsigned_v<T>) {
            uint64_t u;
            if (v.get_uint64().get(u) != simdjson::SUCCESS) return NotAnInteger(v, where);
            if (!std::in_range<T>(u)) return DoesNotFit(where, std::to_string(u));
            Put<T>(static_cast<T>(u));
          } else {
            int64_t i;
            if (v.get_int64().get(i) != simdjson::SUCCESS) return NotAnInteger(v, where);
            if (!std::in_range<T>(i)) return DoesNotFit(where, std::to_string(i));
            Put<T>(static_cast<T>(i));
          }
          return Status::Ok();
        },
        no_json);
  }

  // The error for an integer element that did not parse as one: a number with a fraction
  // or exponent (never truncated), one out of range, or not a number at all. A failed
  // get_int64 leaves `v` unread, so its text can still be quoted.
  Status NotAnInteger(od::value& v, const std::string& where) const {
    od::json_type type;
    if (v.type().get(type) != simdjson::SUCCESS || type != od::json_type::number) {
      const bool is_unsigned = dtype_ == DataType::kUint8 || dtype_ == DataType::kUint16 ||
                               dtype_ == DataType::kUint32 || dtype_ == DataType::kUint64;
      return InvalidArgument(where + ": expected " +
                             (is_unsigned ? "a non-negative integer" : "an integer"));
    }
    std::string_view text = v.raw_json_token();
    while (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\t' ||
                             text.back() == '\r'))
      text.remove_suffix(1);
    std::string shown(text.substr(0, 40));
    if (text.size() > 40) shown += "...";
    if (text.find_first_of(".eE") != std::string_view::npos) {
      return InvalidArgument(where + ": " + shown + " is not an integer, as " +
                             std::string(DataTypeName(dtype_)) + " needs");
    }
    return DoesNotFit(where, shown);
  }

  Status DoesNotFit(const std::string& where, const std::string& value) const {
    return InvalidArgument(where + ": " + value + " does not fit in " +
                           std::string(DataTypeName(dtype_)));
  }

  Status PutString(od::value& v, const std::string& where) {
    std::string_view s;
    JSON_GET(v.get_string(), s, where, "a string");
    if (s.size() > UINT32_MAX) return InvalidArgument(where + ": string too long");
    const uint32_t len = static_cast<uint32_t>(s.size());
    char prefix[4];
    std::memcpy(prefix, &len, 4);
    bytes_out_->append(prefix, 4);
    bytes_out_->append(s);
    return Status::Ok();
  }

  DataType dtype_;
  int64_t expected_;
  char* out_;
  std::string* bytes_out_;
  std::string field_;
  int64_t count_ = 0;
};

struct PendingBinary {
  size_t input_index;
  uint64_t size;
  int64_t elements;
};

// The shared_memory_* parameters of one input or output, as given.
struct SharedMemoryParams {
  std::optional<std::string> region;
  std::optional<uint64_t> byte_size;
  std::optional<uint64_t> offset;

  // Reads `key` if it is one of them; false when it is not.
  StatusOr<bool> Read(std::string_view key, od::value& value, const std::string& where) {
    if (key == "shared_memory_region") {
      std::string_view r;
      JSON_GET(value.get_string(), r, where, "a string");
      region.emplace(r);
    } else if (key == "shared_memory_byte_size") {
      uint64_t n;
      JSON_GET(value.get_uint64(), n, where, "a non-negative integer");
      byte_size = n;
    } else if (key == "shared_memory_offset") {
      uint64_t n;
      JSON_GET(value.get_uint64(), n, where, "a non-negative integer");
      offset = n;
    } else {
      return false;
    }
    return true;
  }

  // The reference, if any: a region needs its byte size; the others need a region.
  StatusOr<std::optional<SharedMemoryRef>> Ref(const std::string& field) const {
    if (!region) {
      if (byte_size || offset) {
        return InvalidArgument(field + ": shared_memory_byte_size and shared_memory_offset " +
                               "need shared_memory_region");
      }
      return std::optional<SharedMemoryRef>();
    }
    if (!byte_size) {
      return InvalidArgument(field + ": shared_memory_region needs shared_memory_byte_size");
    }
    return std::optional<SharedMemoryRef>(SharedMemoryRef{*region, offset.value_or(0), *byte_size});
  }
};

Status ParseInputParameters(od::value& v, const std::string& field,
                            std::optional<uint64_t>* binary_size,
                            std::optional<SharedMemoryRef>* shm) {
  od::object params;
  JSON_GET(v.get_object(), params, field, "an object");
  SharedMemoryParams shm_params;
  RETURN_IF_ERROR(
      ForEachField(params, field, "an object", [&](std::string_view key, od::value& value) {
        const std::string where = field + "." + std::string(key);
        ASSIGN_OR_RETURN(const bool is_shm, shm_params.Read(key, value, where));
        if (is_shm) return Status::Ok();
        if (key == "binary_data_size") {
          uint64_t n;
          JSON_GET(value.get_uint64(), n, where, "a non-negative integer");
          *binary_size = n;
        }
        // Other input parameters are accepted and ignored, as Triton does.
        return Status::Ok();
      }));
  ASSIGN_OR_RETURN(*shm, shm_params.Ref(field));
  return Status::Ok();
}

Status ParseShape(od::value& v, const std::string& field, Shape* shape) {
  od::array arr;
  JSON_GET(v.get_array(), arr, field, "an array of non-negative integers");
  for (auto dr : arr) {
    const std::string where = field + "[" + std::to_string(shape->size()) + "]";
    if (shape->size() >= kMaxRank)
      return InvalidArgument(field + ": more than " + std::to_string(kMaxRank) + " dimensions");
    int64_t d;
    JSON_GET(dr.get_int64(), d, where, "a non-negative integer");
    if (d < 0) return InvalidArgument(where + ": negative dimension " + std::to_string(d));
    shape->push_back(d);
  }
  return Status::Ok();
}

Status ParseInput(od::object& obj, size_t index, const std::string& field, std::string_view json,
                  const runtime::RequestLimits& limits, NamedTensor* out,
                  std::vector<PendingBinary>* binary,
                  std::vector<std::pair<size_t, SharedMemoryRef>>* shm_inputs) {
  std::string_view name;
  JSON_GET(obj.find_field_unordered("name").get_string(), name, field + ".name", "a string");
  out->name.assign(name);
  const std::string label = field + " ('" + out->name + "')";

  std::string_view dtype_name;
  JSON_GET(obj.find_field_unordered("datatype").get_string(), dtype_name, label + ".datatype",
           "a string");
  auto dtype = DataTypeFromName(dtype_name);
  if (!dtype || *dtype == DataType::kInvalid) {
    return InvalidArgument(label + ".datatype: unknown datatype '" + std::string(dtype_name) + "'");
  }

  Shape shape;
  {
    od::value v;
    JSON_GET(obj.find_field_unordered("shape"), v, label + ".shape",
             "an array of non-negative integers");
    RETURN_IF_ERROR(ParseShape(v, label + ".shape", &shape));
  }
  auto count = ElementCount(shape, limits.max_elements_per_tensor);
  if (!count.ok()) return InvalidArgument(label + ".shape: " + count.status().message());
  const int64_t elements = *count;

  std::optional<uint64_t> binary_size;
  std::optional<SharedMemoryRef> shm;
  {
    od::value v;
    auto e = obj.find_field_unordered("parameters").get(v);
    if (e == simdjson::SUCCESS) {
      RETURN_IF_ERROR(ParseInputParameters(v, label + ".parameters", &binary_size, &shm));
    } else if (e != simdjson::NO_SUCH_FIELD) {
      return JsonError(e, label + ".parameters", "an object");
    }
  }

  od::value data;
  auto e = obj.find_field_unordered("data").get(data);
  if (e != simdjson::SUCCESS && e != simdjson::NO_SUCH_FIELD)
    return JsonError(e, label + ".data", "an array");
  const bool has_data = e == simdjson::SUCCESS;
  if (shm) {
    if (has_data || binary_size) {
      return InvalidArgument(label +
                             ": an input in shared memory takes neither 'data' nor "
                             "'parameters.binary_data_size'");
    }
    shm_inputs->emplace_back(index, std::move(*shm));
    out->tensor = Tensor(*dtype, std::move(shape), nullptr, 0, 0);  // filled in later
    return Status::Ok();
  }
  if (has_data == binary_size.has_value()) {
    return InvalidArgument(
        label + ": exactly one of 'data' and 'parameters.binary_data_size' must be given");
  }
  if (binary_size) {
    binary->push_back({index, *binary_size, elements});
    out->tensor = Tensor(*dtype, std::move(shape), nullptr, 0, 0);  // filled in later
    return Status::Ok();
  }

  // Every element takes at least one byte of JSON text, so a shape that claims more
  // elements than the text has bytes is refused before its tensor is allocated.
  if (static_cast<uint64_t>(elements) > json.size()) {
    return InvalidArgument(label + ".data: shape " + ShapeToString(shape) + " declares " +
                           std::to_string(elements) + " elements, more than the request holds");
  }
  const DataType t = *dtype;
  if (t == DataType::kBytes) {
    auto bytes = std::make_shared<std::string>();
    DataReader reader(t, elements, nullptr, bytes.get(), label + ".data");
    RETURN_IF_ERROR(reader.Read(data, 0));
    if (reader.count() != elements) {
      return InvalidArgument(label + ".data: holds " + std::to_string(reader.count()) +
                             " elements but shape " + ShapeToString(shape) + " declares " +
                             std::to_string(elements));
    }
    auto buffer = Buffer::Wrap(bytes->data(), bytes->size(), bytes);
    const size_t n = bytes->size();
    out->tensor = Tensor(t, std::move(shape), std::move(buffer), 0, n);
    return Status::Ok();
  }
  const size_t elem = DataTypeSize(t);
  if (elem == 0 || t == DataType::kFp16 || t == DataType::kBf16) {
    return InvalidArgument(label + ".data: " + std::string(DataTypeName(t)) +
                           " data cannot be sent as JSON; use binary data");
  }
  Tensor tensor = Tensor::Allocate(t, shape, static_cast<size_t>(elements) * elem);
  DataReader reader(t, elements, static_cast<char*>(tensor.mutable_data()), nullptr,
                    label + ".data");
  RETURN_IF_ERROR(reader.Read(data, 0));
  if (reader.count() != elements) {
    return InvalidArgument(label + ".data: holds " + std::to_string(reader.count()) +
                           " elements but shape " + ShapeToString(shape) + " declares " +
                           std::to_string(elements));
  }
  out->tensor = std::move(tensor);
  return Status::Ok();
}

Status ParseInputs(od::value& v, std::string_view json, const runtime::RequestLimits& limits,
                   std::vector<NamedTensor>* inputs, std::vector<PendingBinary>* binary,
                   std::vector<std::pair<size_t, SharedMemoryRef>>* shm_inputs) {
  od::array arr;
  JSON_GET(v.get_array(), arr, "inputs", "an array of objects");
  for (auto ir : arr) {
    const std::string field = "inputs[" + std::to_string(inputs->size()) + "]";
    if (static_cast<int64_t>(inputs->size()) >= limits.max_inputs) {
      return InvalidArgument("inputs: more than " + std::to_string(limits.max_inputs) + " inputs");
    }
    od::object obj;
    JSON_GET(ir.get_object(), obj, field, "an object");
    NamedTensor t;
    RETURN_IF_ERROR(ParseInput(obj, inputs->size(), field, json, limits, &t, binary, shm_inputs));
    for (const auto& other : *inputs) {
      if (other.name == t.name)
        return InvalidArgument(field + ": input '" + t.name + "' is given twice");
    }
    inputs->push_back(std::move(t));
  }
  return Status::Ok();
}

Status ParseOutputs(od::value& v, OutputEncoding* encoding,
                    std::map<std::string, int64_t>* classification) {
  od::array arr;
  JSON_GET(v.get_array(), arr, "outputs", "an array of objects");
  for (auto orr : arr) {
    const std::string field = "outputs[" + std::to_string(encoding->requested.size()) + "]";
    if (encoding->requested.size() >= kMaxRequestedOutputs) {
      return InvalidArgument("outputs: more than " + std::to_string(kMaxRequestedOutputs) +
                             " outputs");
    }
    od::object obj;
    JSON_GET(orr.get_object(), obj, field, "an object");
    std::string_view name;
    JSON_GET(obj.find_field_unordered("name").get_string(), name, field + ".name", "a string");
    std::optional<bool> binary;
    std::optional<SharedMemoryRef> shm;
    std::optional<int64_t> class_count;
    od::value pv;
    auto e = obj.find_field_unordered("parameters").get(pv);
    if (e == simdjson::SUCCESS) {
      od::object params;
      JSON_GET(pv.get_object(), params, field + ".parameters", "an object");
      SharedMemoryParams shm_params;
      RETURN_IF_ERROR(ForEachField(
          params, field + ".parameters", "an object", [&](std::string_view key, od::value& value) {
            const std::string where = field + ".parameters." + std::string(key);
            ASSIGN_OR_RETURN(const bool is_shm, shm_params.Read(key, value, where));
            if (is_shm) return Status::Ok();
            if (key == "binary_data") {
              bool b;
              JSON_GET(value.get_bool(), b, where, "true or false");
              binary = b;
            } else if (key == "classification") {
              int64_t k;
              JSON_GET(value.get_int64(), k, where, "a positive integer");
              if (k < 1) {
                return InvalidArgument(where + ": must be a positive integer; was " +
                                       std::to_string(k));
              }
              class_count = k;
            }
            return Status::Ok();
          }));
      ASSIGN_OR_RETURN(shm, shm_params.Ref(field + ".parameters"));
    } else if (e != simdjson::NO_SUCH_FIELD) {
      return JsonError(e, field + ".parameters", "an object");
    }
    for (const auto& [other, unused] : encoding->requested) {
      if (other == name)
        return InvalidArgument(field + ": output '" + std::string(name) + "' is requested twice");
    }
    encoding->requested.emplace_back(std::string(name), binary);
    if (shm) encoding->shared_memory[std::string(name)] = std::move(*shm);
    if (class_count) (*classification)[std::string(name)] = *class_count;
  }
  return Status::Ok();
}

Status ParseRequestParameters(od::value& v, runtime::InferRequest* request,
                              OutputEncoding* encoding) {
  od::object params;
  JSON_GET(v.get_object(), params, "parameters", "an object");
  return ForEachField(
      params, "parameters", "an object", [&](std::string_view key, od::value& value) -> Status {
        const std::string where = "parameters." + std::string(key);
        if (key == "priority") {
          uint64_t p;
          JSON_GET(value.get_uint64(), p, where, "a non-negative integer");
          if (p > UINT32_MAX)
            return InvalidArgument(where + ": " + std::to_string(p) + " is too large");
          request->priority = static_cast<uint32_t>(p);
        } else if (key == "timeout") {
          uint64_t t;
          JSON_GET(value.get_uint64(), t, where, "a non-negative integer (microseconds)");
          request->timeout_us = t;
        } else if (key == "binary_data_output") {
          bool b;
          JSON_GET(value.get_bool(), b, where, "true or false");
          encoding->default_binary = b;
        } else if (key == "sequence_id") {
          od::json_type type;
          JSON_GET(value.type(), type, where, "an integer or a string");
          bool in_sequence = true;
          if (type == od::json_type::string) {
            std::string_view s;
            JSON_GET(value.get_string(), s, where, "a string");
            in_sequence = !s.empty();
          } else {
            uint64_t id;
            JSON_GET(value.get_uint64(), id, where, "a non-negative integer or a string");
            in_sequence = id != 0;
          }
          if (in_sequence)
            return InvalidArgument(where + ": sequences are not supported by this server");
        } else if (key == "sequence_start" || key == "sequence_end") {
          bool b;
          JSON_GET(value.get_bool(), b, where, "true or false");
          if (b) return InvalidArgument(where + ": sequences are not supported by this server");
        } else if (key == "headers") {
          // Reserved by Triton for forwarded HTTP headers; not passed to the model.
        } else if (key.rfind("triton_", 0) == 0) {
          return InvalidArgument(where + ": unknown reserved parameter");
        } else {
          od::json_type type;
          JSON_GET(value.type(), type, where, "a bool, number or string");
          runtime::ParameterValue pv;
          switch (type) {
            case od::json_type::boolean: {
              bool b;
              JSON_GET(value.get_bool(), b, where, "a bool");
              pv = b;
              break;
            }
            case od::json_type::string: {
              std::string_view s;
              JSON_GET(value.get_string(), s, where, "a string");
              pv = std::string(s);
              break;
            }
            case od::json_type::number: {
              od::number_type nt;
              JSON_GET(value.get_number_type(), nt, where, "a number");
              if (nt == od::number_type::floating_point_number) {
                double d;
                JSON_GET(value.get_double(), d, where, "a number");
                pv = d;
              } else {
                int64_t i;
                JSON_GET(value.get_int64(), i, where, "an integer that fits in int64");
                pv = i;
              }
              break;
            }
            default:
              return InvalidArgument(where + ": expected a bool, number or string");
          }
          request->parameters[std::string(key)] = std::move(pv);
        }
        return Status::Ok();
      });
}

// True when `p` is suitably aligned to be read as elements of `t` in place.
bool AlignedFor(const char* p, DataType t) {
  const size_t a = std::max<size_t>(DataTypeSize(t), 1);
  return reinterpret_cast<uintptr_t>(p) % std::min<size_t>(a, 8) == 0;
}

// Checks a BYTES serialization of `count` elements without allocating.
Status CheckBytes(std::string_view data, int64_t count, const std::string& field) {
  size_t pos = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (data.size() - pos < 4) {
      return InvalidArgument(field + ": BYTES data ends before element " + std::to_string(i) +
                             " of " + std::to_string(count));
    }
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    if (data.size() - pos - 4 < len) {
      return InvalidArgument(field + ": BYTES element " + std::to_string(i) + " claims " +
                             std::to_string(len) + " bytes but only " +
                             std::to_string(data.size() - pos - 4) + " remain");
    }
    pos += 4 + len;
  }
  if (pos != data.size()) {
    return InvalidArgument(field + ": binary_data_size " + std::to_string(data.size()) + " is " +
                           std::to_string(data.size() - pos) + " bytes more than its " +
                           std::to_string(count) + " BYTES elements");
  }
  return Status::Ok();
}

Status AttachBinary(const std::shared_ptr<proto::BodyBuffer>& body, std::string_view binary,
                    const std::vector<PendingBinary>& pending, std::vector<NamedTensor>* inputs) {
  std::vector<uint64_t> sizes;
  sizes.reserve(pending.size());
  for (const auto& p : pending) sizes.push_back(p.size);
  auto slices = SliceBinaryRegion(binary, sizes);
  if (!slices.ok()) return slices.status();
  for (size_t k = 0; k < pending.size(); ++k) {
    NamedTensor& in = (*inputs)[pending[k].input_index];
    const std::string field =
        "inputs[" + std::to_string(pending[k].input_index) + "] ('" + in.name + "')";
    const std::string_view bytes = (*slices)[k];
    const DataType t = in.tensor.dtype();
    if (t == DataType::kBytes) {
      RETURN_IF_ERROR(CheckBytes(bytes, pending[k].elements, field));
    } else {
      const uint64_t want = static_cast<uint64_t>(pending[k].elements) * DataTypeSize(t);
      if (bytes.size() != want) {
        return InvalidArgument(field + ": binary_data_size is " + std::to_string(bytes.size()) +
                               " bytes but shape " + ShapeToString(in.tensor.shape()) + " of " +
                               std::string(DataTypeName(t)) + " needs " + std::to_string(want));
      }
    }
    Shape shape = in.tensor.shape();
    if (AlignedFor(bytes.data(), t)) {
      auto buffer = Buffer::Wrap(const_cast<char*>(bytes.data()), bytes.size(), body);
      in.tensor = Tensor(t, std::move(shape), std::move(buffer), 0, bytes.size());
    } else {
      Tensor copy = Tensor::AllocateUninitialized(t, std::move(shape), bytes.size());
      if (!bytes.empty()) std::memcpy(copy.mutable_data(), bytes.data(), bytes.size());
      in.tensor = std::move(copy);
    }
  }
  return Status::Ok();
}

StatusOr<ParsedInfer> ParseDocument(od::document& doc, std::string_view json,
                                    std::string_view binary, bool has_binary_region,
                                    const std::shared_ptr<proto::BodyBuffer>& body,
                                    const runtime::RequestLimits& limits) {
  ParsedInfer parsed;
  od::object root;
  JSON_GET(doc.get_object(), root, "the top level", "a JSON object");
  std::vector<PendingBinary> pending;
  bool seen_id = false, seen_params = false, seen_inputs = false, seen_outputs = false;
  auto once = [](bool* seen, std::string_view key) -> Status {
    if (*seen) return InvalidArgument(std::string(key) + ": given twice");
    *seen = true;
    return Status::Ok();
  };
  for (auto fr : root) {
    od::field f;
    JSON_GET(fr, f, "the top level", "a JSON object");
    std::string_view key;
    JSON_GET(f.unescaped_key(), key, "the top level", "a JSON object");
    if (key == "id") {
      RETURN_IF_ERROR(once(&seen_id, key));
      std::string_view id;
      JSON_GET(f.value().get_string(), id, "id", "a string");
      parsed.request.id.assign(id);
    } else if (key == "parameters") {
      RETURN_IF_ERROR(once(&seen_params, key));
      RETURN_IF_ERROR(ParseRequestParameters(f.value(), &parsed.request, &parsed.encoding));
    } else if (key == "inputs") {
      RETURN_IF_ERROR(once(&seen_inputs, key));
      RETURN_IF_ERROR(ParseInputs(f.value(), json, limits, &parsed.request.inputs, &pending,
                                  &parsed.shared_memory_inputs));
    } else if (key == "outputs") {
      RETURN_IF_ERROR(once(&seen_outputs, key));
      RETURN_IF_ERROR(ParseOutputs(f.value(), &parsed.encoding, &parsed.request.classification));
    }
    // Unknown members are ignored.
  }
  if (!AtEnd(doc)) return TrailingBytesError();
  if (!seen_inputs) return InvalidArgument("inputs: missing");
  if (!has_binary_region) {
    for (const auto& p : pending) {
      if (p.size > 0) {
        return InvalidArgument("inputs[" + std::to_string(p.input_index) +
                               "].parameters.binary_data_size: binary data needs the "
                               "Inference-Header-Content-Length header");
      }
    }
  }
  RETURN_IF_ERROR(AttachBinary(body, binary, pending, &parsed.request.inputs));
  for (const auto& [name, binary_flag] : parsed.encoding.requested) {
    parsed.request.requested_outputs.push_back(name);
  }
  return parsed;
}

}  // namespace

StatusOr<ParsedInfer> ParseInferRequest(const std::shared_ptr<proto::BodyBuffer>& body,
                                        std::optional<std::string_view> header_length,
                                        const runtime::RequestLimits& limits) {
  ASSIGN_OR_RETURN(BinarySplit split, SplitBinaryBody(body->view(), header_length));
  if (split.json.empty()) return InvalidArgument("request body is empty; expected a JSON object");
  try {
    thread_local od::parser shared_parser;
    std::unique_ptr<od::parser> own_parser;
    od::parser* parser = &shared_parser;
    if (split.json.size() > kSharedParserMaxBytes) {
      own_parser = std::make_unique<od::parser>();
      parser = own_parser.get();
    }
    // The JSON header is followed by the binary region and the buffer's padding, so
    // kPadding bytes past it are always readable.
    const size_t capacity = split.json.size() + split.binary.size() + proto::BodyBuffer::kPadding;
    od::document doc;
    auto e =
        parser
            ->iterate(simdjson::padded_string_view(split.json.data(), split.json.size(), capacity))
            .get(doc);
    if (e != simdjson::SUCCESS) return JsonError(e, "the top level", "a JSON object");
    RETURN_IF_ERROR(ValidateDocument(doc, split.json));
    return ParseDocument(doc, split.json, split.binary, header_length.has_value(), body, limits);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while parsing the request");
  } catch (const std::exception& ex) {
    return InvalidArgument(std::string("invalid request body: ") + ex.what());
  }
}

}  // namespace shoal::server
