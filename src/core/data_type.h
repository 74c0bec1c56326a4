// Element types of tensors, with their names in the three vocabularies shoal speaks:
// the inference protocol ("FP32"), Triton's model config ("TYPE_FP32", where BYTES is
// called "TYPE_STRING") and the config proto's enum numbers (TYPE_FP32 = 11).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace shoal {

// Values equal the config proto's DataType numbers, so converting is a cast.
enum class DataType : int {
  kInvalid = 0,
  kBool = 1,
  kUint8 = 2,
  kUint16 = 3,
  kUint32 = 4,
  kUint64 = 5,
  kInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kFp16 = 10,
  kFp32 = 11,
  kFp64 = 12,
  kBytes = 13,  // variable length; stored as 4-byte little-endian length + bytes per element
  kBf16 = 14,
};

// Bytes per element; 0 for kBytes (variable) and kInvalid.
size_t DataTypeSize(DataType type);

// "FP32", "BYTES", ... ; "INVALID" for kInvalid.
std::string_view DataTypeName(DataType type);
// Inverse of DataTypeName; nullopt for anything else (case-sensitive, as the protocol).
std::optional<DataType> DataTypeFromName(std::string_view name);

// "TYPE_FP32", "TYPE_STRING", ...
std::string_view DataTypeConfigName(DataType type);

}  // namespace shoal
