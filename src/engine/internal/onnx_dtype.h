// ONNX TensorProto element type numbers and their shoal DataType. Kept free of the
// protobuf headers so operator code (Cast's `to`) can use it.
#pragma once

#include <optional>
#include <utility>

#include "core/data_type.h"

namespace shoal::engine::internal {

// onnx.proto's TensorProto.DataType numbers of the types shoal has.
inline constexpr std::pair<int, DataType> kOnnxDataTypes[] = {
    {1, DataType::kFp32},    {2, DataType::kUint8}, {3, DataType::kInt8},  {4, DataType::kUint16},
    {5, DataType::kInt16},   {6, DataType::kInt32}, {7, DataType::kInt64}, {8, DataType::kBytes},
    {9, DataType::kBool},    {10, DataType::kFp16}, {11, DataType::kFp64}, {12, DataType::kUint32},
    {13, DataType::kUint64}, {16, DataType::kBf16},
};

inline std::optional<DataType> DataTypeFromOnnx(int64_t onnx_type) {
  for (const auto& [number, type] : kOnnxDataTypes) {
    if (number == onnx_type) return type;
  }
  return std::nullopt;
}

// 0 (UNDEFINED) for a type ONNX does not have.
inline int OnnxFromDataType(DataType type) {
  for (const auto& [number, t] : kOnnxDataTypes) {
    if (t == type) return number;
  }
  return 0;
}

}  // namespace shoal::engine::internal
