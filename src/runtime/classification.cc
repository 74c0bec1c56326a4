#include "runtime/classification.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/dtype_visit.h"
#include "core/fp16.h"

namespace shoal::runtime {
namespace {

constexpr std::streamoff kMaxLabelFileBytes = std::streamoff{64} << 20;

bool IsIntegerType(DataType t) {
  switch (t) {
    case DataType::kBool:
    case DataType::kUint8:
    case DataType::kUint16:
    case DataType::kUint32:
    case DataType::kUint64:
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
    case DataType::kInt64:
      return true;
    default:
      return false;
  }
}

}  // namespace

StatusOr<OutputLabels> ReadLabelFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return InvalidArgument("label file " + path + " cannot be read");
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxLabelFileBytes) {
    return InvalidArgument("label file " + path + " must be at most 64 MiB");
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  if (size > 0 && !in.read(text.data(), size)) {
    return InvalidArgument("label file " + path + " cannot be read");
  }
  auto labels = std::make_shared<std::vector<std::string>>();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels->push_back(std::move(line));
    pos = end + 1;
  }
  return OutputLabels(std::move(labels));
}

namespace {

// An FP16 or BF16 element (its bit pattern) as a double.
double HalfAsDouble(DataType type, uint16_t bits) {
  if (type == DataType::kFp16) return Fp16ToFloat(bits);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

}  // namespace

std::string ClassificationEntry(double score, DataType type, int64_t index,
                                const std::vector<std::string>* labels) {
  std::string out;
  if (IsIntegerType(type)) {
    out = type == DataType::kUint64 ? std::to_string(static_cast<uint64_t>(score))
                                    : std::to_string(static_cast<int64_t>(score));
  } else {
    out = std::to_string(score);
  }
  out += ':';
  out += std::to_string(index);
  if (labels != nullptr && index >= 0 && static_cast<size_t>(index) < labels->size()) {
    out += ':';
    out += (*labels)[static_cast<size_t>(index)];
  }
  return out;
}

StatusOr<Tensor> Classify(const Tensor& scores, int64_t k, bool batched,
                          const std::vector<std::string>* labels) {
  if (k < 1) return InvalidArgument("classification count must be >= 1; was " + std::to_string(k));
  const DataType type = scores.dtype();
  const bool half = type == DataType::kFp16 || type == DataType::kBf16;
  if (!HoldsPlainValues(type) && !half) {
    return InvalidArgument("classification needs a numeric output; this one is " +
                           std::string(DataTypeName(type)));
  }
  const Shape& shape = scores.shape();
  if (batched && shape.empty()) {
    return InvalidArgument("classification of a batched output needs a batch dimension");
  }
  const int64_t total = scores.element_count();
  const int64_t rows = batched ? shape[0] : 1;
  const int64_t classes = rows == 0 ? 0 : total / rows;
  if (rows > 0 && classes == 0) {
    return InvalidArgument("classification needs at least one class per row; shape is " +
                           ShapeToString(shape));
  }
  const int64_t top = std::min(k, classes);

  std::vector<std::string> entries;
  entries.reserve(static_cast<size_t>(rows * top));
  std::vector<double> values(static_cast<size_t>(classes));
  std::vector<int64_t> order(static_cast<size_t>(classes));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t i = r * classes + c;
      values[static_cast<size_t>(c)] =
          half ? HalfAsDouble(type, scores.values<uint16_t>()[static_cast<size_t>(i)])
               : LoadElementAsDouble(type, scores.data(), i);
    }
    std::iota(order.begin(), order.end(), int64_t{0});
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t b) {
      const double va = values[static_cast<size_t>(a)], vb = values[static_cast<size_t>(b)];
      return va != vb ? va > vb : a < b;
    });
    for (int64_t i = 0; i < top; ++i) {
      const int64_t index = order[static_cast<size_t>(i)];
      entries.push_back(
          ClassificationEntry(values[static_cast<size_t>(index)], type, index, labels));
    }
  }
  Shape out_shape = batched ? Shape{rows, top} : Shape{top};
  return Tensor::FromStrings(std::move(out_shape), entries);
}

}  // namespace shoal::runtime
