#include "core/dtype_visit.h"

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

}  // namespace shoal
