#include "server/http_extensions.h"

#include <simdjson.h>

#include "proto/json_writer.h"
#include "server/http_json.h"
#include "server/http_routes.h"

namespace shoal::server::internal {
namespace {

namespace od = simdjson::ondemand;

enum class Kind { kSystemShm, kCudaShm, kLogging, kTrace };

struct ExtensionRoute {
  Kind kind;
  std::string op;      // status, register, unregister, or "" (logging, trace)
  std::string region;  // shared memory: the named region, or ""
  std::string model;   // trace: the model, or ""
  bool post_only = false;
};

std::optional<ExtensionRoute> Match(const std::vector<std::string>& s) {
  if (s.size() < 2 || s[0] != "v2") return std::nullopt;
  if (s[1] == "systemsharedmemory" || s[1] == "cudasharedmemory") {
    const Kind kind = s[1] == "systemsharedmemory" ? Kind::kSystemShm : Kind::kCudaShm;
    ExtensionRoute r{kind, "", "", "", false};
    if (s.size() == 3) {
      r.op = s[2];
    } else if (s.size() == 5 && s[2] == "region") {
      r.region = s[3];
      r.op = s[4];
    } else {
      return std::nullopt;
    }
    if (r.op == "status") return r;
    if (r.op == "unregister" || (r.op == "register" && !r.region.empty())) {
      r.post_only = true;
      return r;
    }
    return std::nullopt;
  }
  if (s.size() == 2 && s[1] == "logging") return ExtensionRoute{Kind::kLogging, "", "", "", false};
  if (s.size() == 3 && s[1] == "trace" && s[2] == "setting")
    return ExtensionRoute{Kind::kTrace, "", "", "", false};
  if (s.size() == 5 && s[1] == "models" && s[3] == "trace" && s[4] == "setting")
    return ExtensionRoute{Kind::kTrace, "", "", s[2], false};
  return std::nullopt;
}

proto::HttpResponse Reply(const StatusOr<std::string>& json) {
  return json.ok() ? proto::HttpResponse::Json(200, *json) : ErrorResponse(json.status());
}

proto::HttpResponse ReplyEmpty(const Status& s) {
  return s.ok() ? proto::HttpResponse::Empty(200) : ErrorResponse(s);
}

std::string SystemShmStatusJson(const std::vector<SharedMemoryRegionStatus>& regions) {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginArray();
  for (const auto& r : regions) {
    w.BeginObject().Member("name", r.name).Member("key", r.key);
    w.MemberUint("offset", r.offset).MemberUint("byte_size", r.byte_size).EndObject();
  }
  w.EndArray();
  return out;
}

Status RegisterSystemShm(const std::string& region, std::string_view body,
                         SharedMemoryManager& manager) {
  std::optional<std::string> key;
  uint64_t offset = 0;
  std::optional<uint64_t> byte_size;
  RETURN_IF_ERROR(ForEachMember(body, [&](std::string_view k, od::value& v) -> Status {
    if (k == "key") {
      std::string_view s;
      JSON_GET(v.get_string(), s, "key", "a string");
      key.emplace(s);
    } else if (k == "offset") {
      JSON_GET(v.get_uint64(), offset, "offset", "a non-negative integer");
    } else if (k == "byte_size") {
      uint64_t n;
      JSON_GET(v.get_uint64(), n, "byte_size", "a non-negative integer");
      byte_size = n;
    } else {
      return InvalidArgument("unknown member '" + std::string(k.substr(0, 64)) +
                             "' in a shared memory register request (expected key, offset, "
                             "byte_size)");
    }
    return Status::Ok();
  }));
  if (!key) return InvalidArgument("key: missing (the shared memory object's name)");
  if (!byte_size) return InvalidArgument("byte_size: missing");
  return manager.Register(region, *key, offset, *byte_size);
}

proto::HttpResponse SystemShm(const ExtensionRoute& r, std::string_view body,
                              SharedMemoryManager& manager) {
  if (r.op == "status") {
    auto regions = manager.GetStatus(r.region);
    return Reply(regions.ok() ? StatusOr<std::string>(SystemShmStatusJson(*regions))
                              : StatusOr<std::string>(regions.status()));
  }
  if (r.op == "register") return ReplyEmpty(RegisterSystemShm(r.region, body, manager));
  return ReplyEmpty(manager.Unregister(r.region));
}

// Standard base64 (RFC 4648, padding optional); nullopt for any other character.
std::optional<std::string> Base64Decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  // Padding, when there is any, fills the last group of four; at most two '='.
  if (!in.empty() && in.back() == '=') {
    if (in.size() % 4 != 0) return std::nullopt;
    in.remove_suffix(1);
    if (!in.empty() && in.back() == '=') in.remove_suffix(1);
  }
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if (++count == 4) {
      out.push_back(static_cast<char>(bits >> 16));
      out.push_back(static_cast<char>(bits >> 8));
      out.push_back(static_cast<char>(bits));
      bits = 0;
      count = 0;
    }
  }
  if (count == 2) out.push_back(static_cast<char>(bits >> 4));
  if (count == 3) {
    out.push_back(static_cast<char>(bits >> 10));
    out.push_back(static_cast<char>(bits >> 2));
  }
  return out;
}

std::string CudaShmStatusJson(const std::vector<CudaSharedMemoryRegionStatus>& regions) {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginArray();
  for (const auto& r : regions) {
    w.BeginObject().Member("name", r.name);
    w.MemberUint("device_id", static_cast<uint64_t>(r.device_id));
    w.MemberUint("byte_size", r.byte_size).EndObject();
  }
  w.EndArray();
  return out;
}

// {"raw_handle": {"b64": base64 of a cudaIpcMemHandle_t}, "device_id": n, "byte_size": n}
Status RegisterCudaShm(const std::string& region, std::string_view body,
                       SharedMemoryManager& manager) {
  std::optional<std::string> handle;
  std::optional<int64_t> device_id;
  std::optional<uint64_t> byte_size;
  RETURN_IF_ERROR(ForEachMember(body, [&](std::string_view k, od::value& v) -> Status {
    if (k == "raw_handle") {
      od::object obj;
      JSON_GET(v.get_object(), obj, "raw_handle", "an object {\"b64\": ...}");
      return ForEachField(obj, "raw_handle", "an object {\"b64\": ...}",
                          [&](std::string_view key, od::value& value) -> Status {
                            if (key != "b64") {
                              return InvalidArgument("unknown member '" +
                                                     std::string(key.substr(0, 64)) +
                                                     "' in raw_handle (expected b64)");
                            }
                            std::string_view text;
                            JSON_GET(value.get_string(), text, "raw_handle.b64", "a string");
                            handle = Base64Decode(text);
                            if (!handle) return InvalidArgument("raw_handle.b64: not base64");
                            return Status::Ok();
                          });
    }
    if (k == "device_id") {
      int64_t d;
      JSON_GET(v.get_int64(), d, "device_id", "an integer");
      device_id = d;
    } else if (k == "byte_size") {
      uint64_t n;
      JSON_GET(v.get_uint64(), n, "byte_size", "a non-negative integer");
      byte_size = n;
    } else {
      return InvalidArgument("unknown member '" + std::string(k.substr(0, 64)) +
                             "' in a cuda shared memory register request (expected raw_handle, "
                             "device_id, byte_size)");
    }
    return Status::Ok();
  }));
  if (!handle) return InvalidArgument("raw_handle: missing (a cudaIpcMemHandle_t, {\"b64\": ...})");
  if (!device_id) return InvalidArgument("device_id: missing");
  if (!byte_size) return InvalidArgument("byte_size: missing");
  return manager.RegisterCuda(region, *handle, *device_id, *byte_size);
}

proto::HttpResponse CudaShm(const ExtensionRoute& r, std::string_view body,
                            SharedMemoryManager& manager) {
  if (r.op == "status") {
    auto regions = manager.GetCudaStatus(r.region);
    return Reply(regions.ok() ? StatusOr<std::string>(CudaShmStatusJson(*regions))
                              : StatusOr<std::string>(regions.status()));
  }
  if (r.op == "register") return ReplyEmpty(RegisterCudaShm(r.region, body, manager));
  return ReplyEmpty(manager.UnregisterCuda(r.region));
}

std::string LogSettingsJson() {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginObject();
  for (const auto& [key, value] : CurrentLogSettings()) {
    w.Key(key);
    if (const bool* b = std::get_if<bool>(&value)) {
      w.Bool(*b);
    } else if (const uint32_t* n = std::get_if<uint32_t>(&value)) {
      w.Uint(*n);
    } else {
      w.String(std::get<std::string>(value));
    }
  }
  w.EndObject();
  return out;
}

StatusOr<std::string> UpdateLogging(std::string_view body) {
  LogSettingsMap update;
  RETURN_IF_ERROR(ForEachMember(body, [&](std::string_view k, od::value& v) -> Status {
    const std::string key(k);
    od::json_type type;
    JSON_GET(v.type(), type, key, "a bool, integer or string");
    if (type == od::json_type::boolean) {
      bool b;
      JSON_GET(v.get_bool(), b, key, "a bool");
      update[key] = b;
    } else if (type == od::json_type::number) {
      uint64_t n;
      JSON_GET(v.get_uint64(), n, key, "a non-negative integer");
      if (n > UINT32_MAX) return InvalidArgument(key + ": " + std::to_string(n) + " is too large");
      update[key] = static_cast<uint32_t>(n);
    } else if (type == od::json_type::string) {
      std::string_view s;
      JSON_GET(v.get_string(), s, key, "a string");
      update[key] = std::string(s);
    } else {
      return InvalidArgument(key + ": expected a bool, integer or string");
    }
    return Status::Ok();
  }));
  RETURN_IF_ERROR(UpdateLogSettings(update));
  return LogSettingsJson();
}

std::string TraceSettingsJson(const TraceSettings::Values& values) {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginObject();
  for (const auto& [key, value] : values) {
    w.Key(key);
    if (key == "trace_level") {
      w.BeginArray();
      for (const auto& v : value) w.String(v);
      w.EndArray();
    } else {
      w.String(value.empty() ? std::string() : value[0]);
    }
  }
  w.EndObject();
  return out;
}

StatusOr<std::string> UpdateTrace(const std::string& model, std::string_view body,
                                  TraceSettings& trace) {
  TraceSettings::Update update;
  RETURN_IF_ERROR(ForEachMember(body, [&](std::string_view k, od::value& v) -> Status {
    const std::string key(k);
    od::json_type type;
    JSON_GET(v.type(), type, key, "a string, a number, an array of strings or null");
    std::vector<std::string> values;
    switch (type) {
      case od::json_type::null:
        update[key] = std::nullopt;
        return Status::Ok();
      case od::json_type::string: {
        std::string_view s;
        JSON_GET(v.get_string(), s, key, "a string");
        values.emplace_back(s);
        break;
      }
      case od::json_type::number: {
        int64_t n;
        JSON_GET(v.get_int64(), n, key, "an integer");
        values.push_back(std::to_string(n));
        break;
      }
      case od::json_type::array: {
        od::array arr;
        JSON_GET(v.get_array(), arr, key, "an array of strings");
        for (auto item : arr) {
          std::string_view s;
          JSON_GET(item.get_string(), s, key, "an array of strings");
          values.emplace_back(s);
        }
        break;
      }
      default:
        return InvalidArgument(key + ": expected a string, a number, an array of strings or null");
    }
    update[key] = std::move(values);
    return Status::Ok();
  }));
  ASSIGN_OR_RETURN(auto values, trace.Apply(model, update));
  return TraceSettingsJson(values);
}

}  // namespace

std::optional<proto::HttpResponse> HandleExtension(const std::vector<std::string>& segments,
                                                   std::string_view method, std::string_view body,
                                                   const runtime::Server& server,
                                                   ExtensionState& state) {
  auto route = Match(segments);
  if (!route) return std::nullopt;
  const bool get = method == "GET" || method == "HEAD";
  const bool post = method == "POST";
  const bool get_ok = !route->post_only && (route->kind == Kind::kLogging ||
                                            route->kind == Kind::kTrace || route->op == "status");
  const bool post_ok =
      route->post_only || route->kind == Kind::kLogging || route->kind == Kind::kTrace;
  if ((get && !get_ok) || (post && !post_ok) || (!get && !post)) {
    const std::string allow = get_ok && post_ok ? "GET, HEAD, POST" : get_ok ? "GET, HEAD" : "POST";
    proto::HttpResponse r = proto::HttpResponse::Error(
        405, "method " + std::string(method.substr(0, 16)) + " is not allowed here; use " + allow);
    r.headers.emplace_back("Allow", allow);
    return r;
  }
  switch (route->kind) {
    case Kind::kSystemShm:
      return SystemShm(*route, body, state.shared_memory);
    case Kind::kCudaShm:
      return CudaShm(*route, body, state.shared_memory);
    case Kind::kLogging:
      return Reply(post ? UpdateLogging(body) : StatusOr<std::string>(LogSettingsJson()));
    case Kind::kTrace:
      if (!route->model.empty()) {
        if (auto mv = server.GetModel(route->model); !mv.ok()) return ErrorResponse(mv.status());
      }
      return Reply(post ? UpdateTrace(route->model, body, state.trace)
                        : StatusOr<std::string>(TraceSettingsJson(state.trace.Get(route->model))));
  }
  return std::nullopt;
}

}  // namespace shoal::server::internal
