// simdjson On-Demand helpers shared by the HTTP front end's body parsers (the infer
// request in http_infer_parser.cc, the repository control bodies in http_json.cc):
// errors named by the field they were found in, and ValidateDocument, which walks a
// document once before it is read (On Demand does not check what it skips).
// Files that include this compile simdjson for SSE4.2 (http.cmake).
#pragma once

#include <simdjson.h>

#include <string>
#include <string_view>

#include "core/status.h"

namespace shoal::server {

// Nesting limit of an infer request's `data` arrays.
inline constexpr int kMaxDataDepth = 64;
// Whole-document nesting limit of ValidateDocument: data nesting plus the request's own.
inline constexpr int kMaxJsonDepth = kMaxDataDepth + 16;

// INVALID_ARGUMENT for a simdjson error met at `field`, saying what was `expected`.
Status JsonError(simdjson::error_code e, const std::string& field, std::string_view expected);

// True when the document has nothing after its root value.
inline bool AtEnd(simdjson::ondemand::document& doc) {
  return doc.current_location().error() == simdjson::OUT_OF_BOUNDS;
}

// `out = expr` or return JsonError(field, expected).
#define JSON_GET(expr, out, field, expected)                                                   \
  do {                                                                                         \
    if (auto shoal_json_err_ = std::move(expr).get(out); shoal_json_err_ != simdjson::SUCCESS) \
      return ::shoal::server::JsonError(shoal_json_err_, field, expected);                     \
  } while (0)

// Calls fn(key, value) -> Status for each member of `obj`, in order, stopping at the
// first error; a malformed member is JsonError(field, expected).
template <typename Fn>
Status ForEachField(simdjson::ondemand::object& obj, const std::string& field,
                    std::string_view expected, Fn&& fn) {
  for (auto member : obj) {
    simdjson::ondemand::field f;
    JSON_GET(member, f, field, expected);
    std::string_view key;
    JSON_GET(f.unescaped_key(), key, field, expected);
    RETURN_IF_ERROR(fn(key, f.value()));
  }
  return Status::Ok();
}

// Walks a document whose root must be an object, checking every key and value (numbers
// only for their first character) and the nesting limit, then rewinds it. An error names
// the path to the bad value ("inputs[0].shape"). `json` is the document's text: a
// complete object followed by more than whitespace gets TrailingBytesError(), not the
// parser's "document ended early".
Status ValidateDocument(simdjson::ondemand::document& doc, std::string_view json);

// INVALID_ARGUMENT "invalid JSON in the request body: trailing bytes after the JSON
// document".
Status TrailingBytesError();

// Parses a small JSON body (copied into a padded string) whose root is an object, and
// calls fn(key, value) -> Status per top-level member. An empty body has no members.
template <typename Fn>
Status ForEachMember(std::string_view body, Fn fn) {
  size_t start = 0;
  while (start < body.size() && (body[start] == ' ' || body[start] == '\n' || body[start] == '\r' ||
                                 body[start] == '\t')) {
    ++start;
  }
  if (start == body.size()) return Status::Ok();  // empty body
  try {
    simdjson::padded_string padded(body);
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    auto e = parser.iterate(padded).get(doc);
    if (e != simdjson::SUCCESS) return JsonError(e, "the top level", "a JSON object");
    RETURN_IF_ERROR(ValidateDocument(doc, body));
    simdjson::ondemand::object root;
    JSON_GET(doc.get_object(), root, "the top level", "a JSON object");
    RETURN_IF_ERROR(ForEachField(root, "the top level", "a JSON object", fn));
    if (!AtEnd(doc)) return TrailingBytesError();
    return Status::Ok();
  } catch (const std::exception& ex) {
    return InvalidArgument(std::string("invalid request body: ") + ex.what());
  }
}

}  // namespace shoal::server
