#include "proto/tensor_json.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "core/dtype_visit.h"
#include "proto/json_writer.h"

namespace shoal::proto {
namespace {

template <typename T>
void AppendNumber(T v, std::string* out) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v) || std::isinf(v)) {
      out->append(std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity"));
      return;
    }
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, r.ptr);
}

Status AppendStrings(const Tensor& t, std::string* out) {
  auto elements = t.BytesElements();
  if (!elements.ok())
    return Internal("has malformed BYTES elements: " + elements.status().message());
  bool first = true;
  for (std::string_view e : *elements) {
    if (!ValidUtf8(e)) {
      return InvalidArgument("holds bytes that are not valid UTF-8, which JSON cannot carry");
    }
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(out, e);
  }
  return Status::Ok();
}

}  // namespace

Status AppendTensorJsonData(const Tensor& t, std::string* out) {
  out->push_back('[');
  const Status s = VisitDType(
      t.dtype(),
      [&](auto tag) -> Status {
        using Tag = decltype(tag);
        using T = typename Tag::type;
        if constexpr (Tag::kType == DataType::kFp16 || Tag::kType == DataType::kBf16) {
          return InvalidArgument("is " + std::string(DataTypeName(Tag::kType)) +
                                 ", which has no JSON form");
        } else {
          const int64_t n = t.element_count();
          if (t.byte_size() != static_cast<size_t>(n) * sizeof(T)) {
            return Internal("has " + std::to_string(t.byte_size()) +
                            " bytes, which does not match its shape " + ShapeToString(t.shape()));
          }
          const char* p = static_cast<const char*>(t.data());
          out->reserve(out->size() + static_cast<size_t>(n) * 4);
          for (int64_t i = 0; i < n; ++i) {
            if (i) out->push_back(',');
            T v;
            std::memcpy(&v, p + i * sizeof(T), sizeof(T));
            if constexpr (Tag::kType == DataType::kBool) {
              out->append(v != 0 ? "true" : "false");
            } else {
              AppendNumber(v, out);
            }
          }
          return Status::Ok();
        }
      },
      [&]() -> Status {
        if (t.dtype() == DataType::kBytes) return AppendStrings(t, out);
        return InvalidArgument("is " + std::string(DataTypeName(t.dtype())) +
                               ", which has no JSON form");
      });
  RETURN_IF_ERROR(s);
  out->push_back(']');
  return Status::Ok();
}

}  // namespace shoal::proto
