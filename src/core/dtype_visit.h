// VisitDType: the one place that turns a runtime DataType into a C++ element type.
//
// Code that handles tensor elements per type (codecs, .npy files, offline jobs, the load
// generator, engine kernels) calls
//
//   VisitDType(dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... },
//              [&] { /* BYTES or INVALID */ });
//
// instead of writing its own `switch` over DataType. `tag` is a DTypeTag<D>, an empty
// value whose `type` is the element's storage type and whose `kType` is D, so a visitor
// can single out a type with `if constexpr (decltype(tag)::kType == DataType::kBool)`.
// Storage types: BOOL is uint8_t (any non-zero byte is true: bytes from the network
// must never be read as C++ bool), FP16 and BF16 are their uint16_t bit patterns; the
// others are the obvious fixed-width types. BYTES (variable length) and INVALID have no
// element type and call `otherwise`. Both callables must return the same type.
//
// Also here, built on the visitor: element <-> double conversions for code that moves
// values between text formats (JSON lines, command-line data) and tensors.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/data_type.h"
#include "core/status.h"

namespace shoal {

template <DataType D>
struct DTypeStorage;
template <>
struct DTypeStorage<DataType::kBool> {
  using type = uint8_t;
};
template <>
struct DTypeStorage<DataType::kUint8> {
  using type = uint8_t;
};
template <>
struct DTypeStorage<DataType::kUint16> {
  using type = uint16_t;
};
template <>
struct DTypeStorage<DataType::kUint32> {
  using type = uint32_t;
};
template <>
struct DTypeStorage<DataType::kUint64> {
  using type = uint64_t;
};
template <>
struct DTypeStorage<DataType::kInt8> {
  using type = int8_t;
};
template <>
struct DTypeStorage<DataType::kInt16> {
  using type = int16_t;
};
template <>
struct DTypeStorage<DataType::kInt32> {
  using type = int32_t;
};
template <>
struct DTypeStorage<DataType::kInt64> {
  using type = int64_t;
};
template <>
struct DTypeStorage<DataType::kFp16> {
  using type = uint16_t;
};
template <>
struct DTypeStorage<DataType::kFp32> {
  using type = float;
};
template <>
struct DTypeStorage<DataType::kFp64> {
  using type = double;
};
template <>
struct DTypeStorage<DataType::kBf16> {
  using type = uint16_t;
};

template <DataType D>
struct DTypeTag {
  static constexpr DataType kType = D;
  using type = typename DTypeStorage<D>::type;
  // True for the types whose storage holds the value itself as an arithmetic C++ type:
  // every fixed-size type except FP16 and BF16 (bit patterns) and BOOL (a byte flag).
  static constexpr bool kPlainNumber =
      D != DataType::kFp16 && D != DataType::kBf16 && D != DataType::kBool;
};

template <typename Fn, typename Otherwise>
decltype(auto) VisitDType(DataType type, Fn&& fn, Otherwise&& otherwise) {
  switch (type) {
    case DataType::kBool:
      return fn(DTypeTag<DataType::kBool>{});
    case DataType::kUint8:
      return fn(DTypeTag<DataType::kUint8>{});
    case DataType::kUint16:
      return fn(DTypeTag<DataType::kUint16>{});
    case DataType::kUint32:
      return fn(DTypeTag<DataType::kUint32>{});
    case DataType::kUint64:
      return fn(DTypeTag<DataType::kUint64>{});
    case DataType::kInt8:
      return fn(DTypeTag<DataType::kInt8>{});
    case DataType::kInt16:
      return fn(DTypeTag<DataType::kInt16>{});
    case DataType::kInt32:
      return fn(DTypeTag<DataType::kInt32>{});
    case DataType::kInt64:
      return fn(DTypeTag<DataType::kInt64>{});
    case DataType::kFp16:
      return fn(DTypeTag<DataType::kFp16>{});
    case DataType::kFp32:
      return fn(DTypeTag<DataType::kFp32>{});
    case DataType::kFp64:
      return fn(DTypeTag<DataType::kFp64>{});
    case DataType::kBf16:
      return fn(DTypeTag<DataType::kBf16>{});
    case DataType::kBytes:
    case DataType::kInvalid:
      break;
  }
  return otherwise();
}

// True for BOOL and the integer and FP32/FP64 types: those whose values convert to and
// from double below. FP16, BF16, BYTES and INVALID are not.
bool HoldsPlainValues(DataType type);

// Element i of `data` (of `type`) as a double: BOOL as 0 or 1, integers and floats
// converted (64-bit integers above 2^53 round). 0 for types HoldsPlainValues rejects.
double LoadElementAsDouble(DataType type, const void* data, int64_t i);

// Stores `v` as element i of `data` (of `type`): BOOL as v != 0, others by static_cast
// (the caller checks the range). Does nothing for types HoldsPlainValues rejects.
void StoreElementFromDouble(DataType type, void* data, int64_t i, double v);

// Stores `v` as element i of `data` (of `type`) only if it keeps its value there: an
// integer type takes whole numbers in its range, FP32 anything but a finite number beyond
// its largest (which would become infinity), FP64 anything, BOOL any number (v != 0).
// Otherwise INVALID_ARGUMENT saying why, with the value ("1.5 is not a whole number, as
// INT64 needs", "300 does not fit in INT8", "1e+39 is beyond the range of FP32"), and
// nothing is stored. INVALID_ARGUMENT for types HoldsPlainValues rejects.
Status StoreElementChecked(DataType type, void* data, int64_t i, double v);

// Element i of `src` (of `from`) stored as element i of `dst` (of `to`), under the rules of
// StoreElementChecked; integers convert exactly (not through a double), so 2^53 + 1 stays.
Status ConvertElementChecked(DataType from, const void* src, DataType to, void* dst, int64_t i);

}  // namespace shoal
