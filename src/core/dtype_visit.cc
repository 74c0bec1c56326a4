#include "core/dtype_visit.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace shoal {

bool HoldsPlainValues(DataType type) {
  return VisitDType(
      type,
      [](auto tag) {
        return decltype(tag)::kPlainNumber || decltype(tag)::kType == DataType::kBool;
      },
      [] { return false; });
}

double LoadElementAsDouble(DataType type, const void* data, int64_t i) {
  return VisitDType(
      type,
      [&](auto tag) -> double {
        using Tag = decltype(tag);
        using T = typename Tag::type;
        const T v = static_cast<const T*>(data)[i];
        if constexpr (Tag::kType == DataType::kBool) {
          return v != 0 ? 1.0 : 0.0;
        } else if constexpr (Tag::kPlainNumber) {
          return static_cast<double>(v);
        } else {
          return 0.0;
        }
      },
      [] { return 0.0; });
}

void StoreElementFromDouble(DataType type, void* data, int64_t i, double v) {
  VisitDType(
      type,
      [&](auto tag) {
        using Tag = decltype(tag);
        using T = typename Tag::type;
        if constexpr (Tag::kType == DataType::kBool) {
          static_cast<T*>(data)[i] = v != 0 ? 1 : 0;
        } else if constexpr (Tag::kPlainNumber) {
          static_cast<T*>(data)[i] = static_cast<T>(v);
        }
      },
      [] {});
}

namespace {

// The shortest text that reads back as `v` ("1.5", "1e+39").
std::string FormatDouble(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

template <typename T>
constexpr bool kIsInteger = std::is_integral_v<T>;

// Whether the visited type is an integer type (not BOOL, whose storage is uint8_t too).
template <typename Tag>
constexpr bool IsIntegerTag() {
  return Tag::kPlainNumber && kIsInteger<typename Tag::type>;
}

}  // namespace

Status StoreElementChecked(DataType type, void* data, int64_t i, double v) {
  return VisitDType(
      type,
      [&](auto tag) -> Status {
        using Tag = decltype(tag);
        using T = typename Tag::type;
        if constexpr (Tag::kType == DataType::kBool) {
          static_cast<T*>(data)[i] = v != 0 ? 1 : 0;
        } else if constexpr (!Tag::kPlainNumber) {
          return InvalidArgument(std::string(DataTypeName(type)) + " holds no plain numbers");
        } else if constexpr (std::is_floating_point_v<T>) {
          if constexpr (std::is_same_v<T, float>) {
            // Halfway between FLT_MAX and 2^128 and beyond rounds to infinity; below it,
            // to FLT_MAX (so the shortest text of FLT_MAX, 3.4028235e38, is kept).
            if (std::isfinite(v) && std::fabs(v) >= 0x1.ffffffp127) {
              return InvalidArgument(FormatDouble(v) + " is beyond the range of " +
                                     std::string(DataTypeName(type)));
            }
          }
          static_cast<T*>(data)[i] = static_cast<T>(v);
        } else {
          if (!std::isfinite(v) || std::trunc(v) != v) {
            return InvalidArgument(FormatDouble(v) + " is not a whole number, as " +
                                   std::string(DataTypeName(type)) + " needs");
          }
          // [min, max + 1) in doubles: both bounds are powers of two, so exact.
          constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
          constexpr double hi_excl =
              2.0 * static_cast<double>(std::numeric_limits<T>::max() / 2 + 1);
          if (v < lo || v >= hi_excl) {
            return InvalidArgument(FormatDouble(v) + " does not fit in " +
                                   std::string(DataTypeName(type)));
          }
          static_cast<T*>(data)[i] = static_cast<T>(v);
        }
        return Status::Ok();
      },
      [&] { return InvalidArgument(std::string(DataTypeName(type)) + " holds no plain numbers"); });
}

Status ConvertElementChecked(DataType from, const void* src, DataType to, void* dst, int64_t i) {
  return VisitDType(
      from,
      [&](auto from_tag) -> Status {
        using From = typename decltype(from_tag)::type;
        if constexpr (IsIntegerTag<decltype(from_tag)>()) {
          const From v = static_cast<const From*>(src)[i];
          return VisitDType(
              to,
              [&](auto to_tag) -> Status {
                using To = typename decltype(to_tag)::type;
                if constexpr (IsIntegerTag<decltype(to_tag)>()) {
                  if (!std::in_range<To>(v)) {
                    return InvalidArgument(std::to_string(v) + " does not fit in " +
                                           std::string(DataTypeName(to)));
                  }
                  static_cast<To*>(dst)[i] = static_cast<To>(v);
                  return Status::Ok();
                } else {
                  return StoreElementChecked(to, dst, i, static_cast<double>(v));
                }
              },
              [&] { return StoreElementChecked(to, dst, i, 0); });
        } else {
          return StoreElementChecked(to, dst, i, LoadElementAsDouble(from, src, i));
        }
      },
      [&] { return StoreElementChecked(to, dst, i, 0); });
}

}  // namespace shoal
