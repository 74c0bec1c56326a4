#include "loadgen/input_data.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/data_type.h"
#include "core/dtype_visit.h"
#include "core/fp16.h"

namespace shoal::loadgen {
namespace {

int64_t SampleElements(const TensorInfo& t, bool batched) {
  int64_t n = 1;
  for (size_t i = batched ? 1 : 0; i < t.shape.size(); ++i) n *= t.shape[i];
  return n;
}

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Appends one element of `type` holding `v` (numeric types only).
Status AppendNumber(std::string* out, DataType type, double v) {
  const size_t at = out->size();
  if (HoldsPlainValues(type)) {
    out->resize(at + DataTypeSize(type));
    StoreElementFromDouble(type, out->data() + at, 0, v);
    return Status::Ok();
  }
  if (type == DataType::kBf16) {
    // BF16 is the top half of an FP32.
    float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    Append<uint16_t>(out, static_cast<uint16_t>(bits >> 16));
    return Status::Ok();
  }
  if (type == DataType::kFp16) {
    // Rounded to the nearest FP16; a finite value beyond FP16's range is refused rather
    // than sent as infinity.
    // Checked on the double: one beyond FP32's range would become infinity on narrowing.
    if (std::isfinite(v) && std::fabs(v) >= 65520.0) {
      return InvalidArgument(fmt::format("{} is beyond the range of FP16 (65504)", v));
    }
    const uint16_t h = FloatToFp16(static_cast<float>(v));
    Append<uint16_t>(out, h);
    return Status::Ok();
  }
  return InvalidArgument(fmt::format("cannot encode datatype {}", DataTypeName(type)));
}

void AppendString(std::string* out, std::string_view s) {
  Append<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

Status Flatten(simdjson::dom::element e, DataType type, const std::string& name, std::string* out,
               int64_t* count) {
  simdjson::dom::array items;
  if (e.get_array().get(items) == simdjson::SUCCESS) {
    for (simdjson::dom::element x : items) RETURN_IF_ERROR(Flatten(x, type, name, out, count));
    return Status::Ok();
  }
  ++*count;
  if (type == DataType::kBytes) {
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) {
      return InvalidArgument(fmt::format("input data for BYTES input '{}' must be strings", name));
    }
    AppendString(out, s);
    return Status::Ok();
  }
  double v = 0;
  bool b = false;
  if (e.get_double().get(v) != simdjson::SUCCESS) {
    if (e.get_bool().get(b) != simdjson::SUCCESS) {
      return InvalidArgument(fmt::format("input data for '{}' must be numbers", name));
    }
    v = b ? 1 : 0;
  }
  if (Status s = AppendNumber(out, type, v); !s.ok())
    return InvalidArgument(fmt::format("input data for '{}': {}", name, s.message()));
  return Status::Ok();
}

// A payload whose one-sample bytes are repeated batch times.
InputTensor Repeat(const TensorInfo& t, const std::string& sample, int64_t batch_size,
                   bool batched) {
  InputTensor in{t.name, t.datatype, t.shape, {}};
  const int64_t copies = batched ? batch_size : 1;
  in.data.reserve(sample.size() * static_cast<size_t>(copies));
  for (int64_t i = 0; i < copies; ++i) in.data += sample;
  return in;
}

}  // namespace

StatusOr<std::vector<Payload>> PayloadsFromJson(const std::vector<TensorInfo>& inputs,
                                                std::string_view json, bool batched,
                                                int64_t batch_size) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(json.data(), json.size()).get(root) != simdjson::SUCCESS) {
    return InvalidArgument("input data file is not valid JSON");
  }
  std::vector<simdjson::dom::element> entries;
  simdjson::dom::array data;
  if (root["data"].get_array().get(data) == simdjson::SUCCESS) {
    for (simdjson::dom::element e : data) entries.push_back(e);
  } else if (root.is_object()) {
    entries.push_back(root);
  }
  if (entries.empty()) {
    return InvalidArgument(
        "input data file must be {\"data\": [{\"INPUT\": [...]}, ...]} or {\"INPUT\": [...]}");
  }
  std::vector<Payload> payloads;
  for (size_t i = 0; i < entries.size(); ++i) {
    Payload p;
    for (const TensorInfo& t : inputs) {
      const DataType type = *DataTypeFromName(t.datatype);
      simdjson::dom::element values;
      if (entries[i][t.name].get(values) != simdjson::SUCCESS) {
        return InvalidArgument(
            fmt::format("input data entry {} has no values for input '{}'", i, t.name));
      }
      std::vector<int64_t> sample_dims(t.shape.begin() + (batched ? 1 : 0), t.shape.end());
      simdjson::dom::element content;
      if (values.is_object()) {
        if (values["content"].get(content) != simdjson::SUCCESS) {
          return InvalidArgument(
              fmt::format("input data for '{}': an object needs 'content'", t.name));
        }
        simdjson::dom::array shape;
        if (values["shape"].get_array().get(shape) == simdjson::SUCCESS) {
          std::vector<int64_t> dims;
          for (simdjson::dom::element d : shape) dims.push_back(d.get_int64().value_unsafe());
          if (dims != sample_dims) {
            return InvalidArgument(fmt::format(
                "input data for '{}' has shape {} but requests use {} (without the batch axis)",
                t.name, FormatShape(dims), FormatShape(sample_dims)));
          }
        }
        values = content;
      }
      std::string sample;
      int64_t count = 0;
      RETURN_IF_ERROR(Flatten(values, type, t.name, &sample, &count));
      const int64_t want = SampleElements(t, batched);
      if (count != want) {
        return InvalidArgument(fmt::format(
            "input data entry {} gives {} values for '{}', whose shape {} (without the batch "
            "axis) holds {}",
            i, count, t.name, FormatShape(sample_dims), want));
      }
      p.push_back(Repeat(t, sample, batch_size, batched));
    }
    payloads.push_back(std::move(p));
  }
  return payloads;
}

StatusOr<std::vector<Payload>> MakePayloads(const std::vector<TensorInfo>& inputs,
                                            const std::string& source, bool batched,
                                            int64_t batch_size, uint64_t seed) {
  if (source != "random" && source != "zero") {
    std::error_code ec;
    if (std::filesystem::is_directory(source, ec)) {
      return InvalidArgument(fmt::format(
          "--input-data must be random, zero or a JSON file; '{}' is a directory", source));
    }
    std::ifstream file(source, std::ios::binary);
    if (!file) {
      return InvalidArgument(fmt::format(
          "--input-data must be random, zero or a JSON file; cannot read '{}'", source));
    }
    std::stringstream text;
    text << file.rdbuf();
    auto payloads = PayloadsFromJson(inputs, text.str(), batched, batch_size);
    if (!payloads.ok()) return payloads.status().WithPrefix(source);
    return payloads;
  }
  const bool zero = source == "zero";
  std::mt19937_64 rng(seed);
  Payload p;
  for (const TensorInfo& t : inputs) {
    const DataType type = *DataTypeFromName(t.datatype);
    const int64_t n = SampleElements(t, batched);
    std::string sample;
    for (int64_t i = 0; i < n; ++i) {
      if (type == DataType::kBytes) {
        AppendString(&sample, zero ? std::string() : std::to_string(rng() % 1000000));
        continue;
      }
      double v = 0;
      if (!zero) {
        const bool is_float = type == DataType::kFp32 || type == DataType::kFp64 ||
                              type == DataType::kBf16 || type == DataType::kFp16;
        v = type == DataType::kBool ? static_cast<double>(rng() % 2)
            : is_float              ? std::uniform_real_distribution<double>(0, 1)(rng)
                                    : static_cast<double>(rng() % 100);
      }
      RETURN_IF_ERROR(AppendNumber(&sample, type, v));
    }
    p.push_back(Repeat(t, sample, batch_size, batched));
  }
  return std::vector<Payload>{std::move(p)};
}

}  // namespace shoal::loadgen
