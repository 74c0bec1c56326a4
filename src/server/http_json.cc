#include "server/http_json.h"

#include <vector>

#include "server/http_infer_codec.h"

namespace shoal::server {

namespace od = simdjson::ondemand;

Status JsonError(simdjson::error_code e, const std::string& field, std::string_view expected) {
  switch (e) {
    case simdjson::INCORRECT_TYPE:
    case simdjson::NO_SUCH_FIELD:
      return InvalidArgument(field + ": expected " + std::string(expected));
    case simdjson::NUMBER_OUT_OF_RANGE:
      return InvalidArgument(field + ": number out of range (expected " + std::string(expected) +
                             ")");
    case simdjson::UTF8_ERROR:
      return InvalidArgument("request body is not valid UTF-8 JSON");
    default:
      return InvalidArgument("invalid JSON in the request body at " + field + ": " +
                             simdjson::error_message(e));
  }
}

namespace {

// On Demand parses lazily: a value it only skips (a field nobody reads, or one passed over
// while looking up another) is not checked, and a malformed one such as `"k": }` leaves the
// iterator in a state simdjson treats as unreachable (undefined behaviour, found by the
// fuzzer). So a document is first walked once in order, every key and value checked, and
// rewound before it is read. Numbers are only checked to start like a number; the reader
// parses the ones it uses.
// `where` collects, innermost first, the keys and indices leading to an error.
simdjson::error_code WalkJson(od::value v, int depth, std::vector<std::string>* where);

simdjson::error_code WalkObject(od::object obj, int depth, std::vector<std::string>* where) {
  for (auto member : obj) {
    od::field f;
    if (auto e = std::move(member).get(f)) return e;
    std::string_view key;
    if (auto e = f.unescaped_key().get(key)) return e;
    if (auto e = WalkJson(f.value(), depth + 1, where)) {
      where->push_back("." + std::string(key));
      return e;
    }
  }
  return simdjson::SUCCESS;
}

simdjson::error_code WalkJson(od::value v, int depth, std::vector<std::string>* where) {
  if (depth > kMaxJsonDepth) return simdjson::DEPTH_ERROR;
  od::json_type type;
  if (auto e = v.type().get(type)) return e;
  switch (type) {
    case od::json_type::object: {
      od::object obj;
      if (auto e = v.get_object().get(obj)) return e;
      return WalkObject(obj, depth, where);
    }
    case od::json_type::array: {
      od::array arr;
      if (auto e = v.get_array().get(arr)) return e;
      size_t i = 0;
      for (auto element : arr) {
        od::value x;
        auto e = std::move(element).get(x);
        if (!e) e = WalkJson(x, depth + 1, where);
        if (e) {
          where->push_back("[" + std::to_string(i) + "]");
          return e;
        }
        ++i;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::string: {
      std::string_view str;
      return v.get_string().get(str);
    }
    case od::json_type::boolean: {
      bool b;
      return v.get_bool().get(b);
    }
    case od::json_type::null: {
      bool is_null = false;
      if (auto e = v.is_null().get(is_null)) return e;
      return is_null ? simdjson::SUCCESS : simdjson::N_ATOM_ERROR;
    }
    case od::json_type::number:
      return simdjson::SUCCESS;  // type() saw a digit or '-'; skipping a scalar is safe
  }
  return simdjson::TAPE_ERROR;
}

// True when `json` holds one complete object or array followed by more than whitespace.
// simdjson reports a root followed by other bytes as a document that "ended early".
bool HasTrailingBytes(std::string_view json) {
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  size_t i = 0;
  while (i < json.size() && space(json[i])) ++i;
  if (i == json.size() || (json[i] != '{' && json[i] != '[')) return false;
  int depth = 0;
  bool in_string = false;
  for (; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      for (size_t j = i + 1; j < json.size(); ++j) {
        if (!space(json[j])) return true;
      }
      return false;
    }
  }
  return false;
}

}  // namespace

Status TrailingBytesError() {
  return InvalidArgument(
      "invalid JSON in the request body: trailing bytes after the JSON document");
}

Status ValidateDocument(od::document& doc, std::string_view json) {
  od::object root;
  if (auto e = doc.get_object().get(root)) {
    if (HasTrailingBytes(json)) return TrailingBytesError();
    return JsonError(e, "the top level", "a JSON object");
  }
  std::vector<std::string> where;
  if (auto e = WalkObject(root, 0, &where)) {
    if (e == simdjson::UTF8_ERROR) return JsonError(e, "the top level", "a JSON object");
    std::string path;
    for (auto it = where.rbegin(); it != where.rend(); ++it) path += *it;
    if (!path.empty() && path[0] == '.') path.erase(0, 1);
    return InvalidArgument("invalid JSON in the request body" +
                           (path.empty() ? std::string() : " at " + path) + ": " +
                           simdjson::error_message(e));
  }
  if (!AtEnd(doc)) return TrailingBytesError();
  doc.rewind();
  return Status::Ok();
}

StatusOr<bool> ParseRepositoryIndexBody(std::string_view body) {
  bool ready = false;
  RETURN_IF_ERROR(ForEachMember(body, [&](std::string_view key, od::value& v) -> Status {
    if (key == "ready") JSON_GET(v.get_bool(), ready, "ready", "true or false");
    return Status::Ok();
  }));
  return ready;
}

StatusOr<RepositoryParameters> ParseRepositoryParametersBody(std::string_view body) {
  RepositoryParameters out;
  RETURN_IF_ERROR(ForEachMember(body, [&](std::string_view key, od::value& v) -> Status {
    if (key != "parameters") return Status::Ok();
    od::object params;
    JSON_GET(v.get_object(), params, "parameters", "an object");
    return ForEachField(params, "parameters", "an object", [&](std::string_view k, od::value& pv) {
      out.names.emplace_back(k);
      if (k == "config") {
        std::string_view config;
        JSON_GET(pv.get_string(), config, "parameters.config",
                 "a string holding the model config as JSON");
        out.config.emplace(config);
      } else if (k == "unload_dependents") {
        bool unload_dependents = false;
        JSON_GET(pv.get_bool(), unload_dependents, "parameters.unload_dependents", "a boolean");
        out.unload_dependents = unload_dependents;
      }
      return Status::Ok();
    });
  }));
  return out;
}

}  // namespace shoal::server
