#include "core/data_type.h"

#include <array>

namespace shoal {
namespace {

struct TypeInfo {
  DataType type;
  size_t size;
  std::string_view name;
  std::string_view config_name;
};

constexpr std::array<TypeInfo, 15> kTypes = {{
    {DataType::kInvalid, 0, "INVALID", "TYPE_INVALID"},
    {DataType::kBool, 1, "BOOL", "TYPE_BOOL"},
    {DataType::kUint8, 1, "UINT8", "TYPE_UINT8"},
    {DataType::kUint16, 2, "UINT16", "TYPE_UINT16"},
    {DataType::kUint32, 4, "UINT32", "TYPE_UINT32"},
    {DataType::kUint64, 8, "UINT64", "TYPE_UINT64"},
    {DataType::kInt8, 1, "INT8", "TYPE_INT8"},
    {DataType::kInt16, 2, "INT16", "TYPE_INT16"},
    {DataType::kInt32, 4, "INT32", "TYPE_INT32"},
    {DataType::kInt64, 8, "INT64", "TYPE_INT64"},
    {DataType::kFp16, 2, "FP16", "TYPE_FP16"},
    {DataType::kFp32, 4, "FP32", "TYPE_FP32"},
    {DataType::kFp64, 8, "FP64", "TYPE_FP64"},
    {DataType::kBytes, 0, "BYTES", "TYPE_STRING"},
    {DataType::kBf16, 2, "BF16", "TYPE_BF16"},
}};

const TypeInfo& Info(DataType type) {
  const auto index = static_cast<size_t>(type);
  return index < kTypes.size() ? kTypes[index] : kTypes[0];
}

}  // namespace

size_t DataTypeSize(DataType type) { return Info(type).size; }
std::string_view DataTypeName(DataType type) { return Info(type).name; }
std::string_view DataTypeConfigName(DataType type) { return Info(type).config_name; }

std::optional<DataType> DataTypeFromName(std::string_view name) {
  for (const TypeInfo& info : kTypes) {
    if (info.type != DataType::kInvalid && info.name == name) return info.type;
  }
  return std::nullopt;
}

}  // namespace shoal
