// ONNX TensorProto element type numbers and their shoal DataType. Kept free of the
// protobuf headers so operator code (Cast's `to`) can use it.
#pragma once

#include <optional>

#include "core/data_type.h"

namespace shoal::engine::internal {

inline std::optional<DataType> DataTypeFromOnnx(int64_t onnx_type) {
  switch (onnx_type) {
    case 1:
      return DataType::kFp32;
    case 2:
      return DataType::kUint8;
    case 3:
      return DataType::kInt8;
    case 4:
      return DataType::kUint16;
    case 5:
      return DataType::kInt16;
    case 6:
      return DataType::kInt32;
    case 7:
      return DataType::kInt64;
    case 8:
      return DataType::kBytes;
    case 9:
      return DataType::kBool;
    case 10:
      return DataType::kFp16;
    case 11:
      return DataType::kFp64;
    case 12:
      return DataType::kUint32;
    case 13:
      return DataType::kUint64;
    case 16:
      return DataType::kBf16;
    default:
      return std::nullopt;
  }
}

inline int OnnxFromDataType(DataType type) {
  switch (type) {
    case DataType::kFp32:
      return 1;
    case DataType::kUint8:
      return 2;
    case DataType::kInt8:
      return 3;
    case DataType::kUint16:
      return 4;
    case DataType::kInt16:
      return 5;
    case DataType::kInt32:
      return 6;
    case DataType::kInt64:
      return 7;
    case DataType::kBytes:
      return 8;
    case DataType::kBool:
      return 9;
    case DataType::kFp16:
      return 10;
    case DataType::kFp64:
      return 11;
    case DataType::kUint32:
      return 12;
    case DataType::kUint64:
      return 13;
    case DataType::kBf16:
      return 16;
    default:
      return 0;
  }
}

}  // namespace shoal::engine::internal
