#include "server/http_routes.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <optional>
#include <set>
#include <unordered_set>

#include "core/mutex.h"
#include "proto/json_writer.h"
#include "repository/model_config.h"
#include "server/http_extensions.h"
#include "server/http_infer_codec.h"
#include "server/request_log.h"
#include "server/status_map.h"

#ifndef SHOAL_VERSION
#define SHOAL_VERSION "0.0.0"
#endif

namespace shoal::server::internal {
namespace {

StatusOr<int64_t> ParseVersion(const std::string& s) {
  const int64_t v = proto::ParseDecimal(s);
  if (v < 0)
    return InvalidArgument("model version must be a decimal number; was '" + s.substr(0, 64) + "'");
  return v;
}

// Model routes after /v2/models/{m}[/versions/{v}]: the suffix decides.
RouteMatch MatchModel(const std::vector<std::string>& s) {
  RouteMatch m;
  m.model = s[2];
  size_t i = 3;
  if (s.size() >= 5 && s[3] == "versions") {
    auto v = ParseVersion(s[4]);
    if (!v.ok()) {
      m.error = v.status();
      return m;
    }
    m.version = *v;
    i = 5;
  }
  if (s.size() == i) {
    m.route = Route::kModelMetadata;
  } else if (s.size() == i + 1) {
    const std::string& op = s[i];
    if (op == "ready") m.route = Route::kModelReady;
    if (op == "config") m.route = Route::kModelConfig;
    if (op == "infer") m.route = Route::kInfer;
    if (op == "stats") m.route = Route::kStats;
  }
  if (m.route == Route::kNotFound) m.model.clear();
  return m;
}

void WriteDuration(proto::JsonWriter& w, std::string_view key, const runtime::Duration& d) {
  w.Key(key).BeginObject().MemberUint("count", d.count).MemberUint("ns", d.ns).EndObject();
}

void WriteVersionStats(proto::JsonWriter& w, const runtime::ModelVersion& mv) {
  const runtime::ModelStatsSnapshot s = mv.stats();
  w.BeginObject();
  w.Member("name", mv.name());
  w.Member("version", std::to_string(mv.version()));
  w.MemberUint("last_inference", static_cast<uint64_t>(std::max<int64_t>(s.last_inference_ms, 0)));
  w.MemberUint("inference_count", s.inference_count);
  w.MemberUint("execution_count", s.execution_count);
  w.Key("inference_stats").BeginObject();
  WriteDuration(w, "success", s.success);
  WriteDuration(w, "fail", s.fail);
  WriteDuration(w, "queue", s.queue);
  WriteDuration(w, "compute_input", s.compute_input);
  WriteDuration(w, "compute_infer", s.compute_infer);
  WriteDuration(w, "compute_output", s.compute_output);
  WriteDuration(w, "cache_hit", s.cache_hit);
  WriteDuration(w, "cache_miss", s.cache_miss);
  w.EndObject();
  w.Key("response_stats").BeginObject().EndObject();
  w.Key("batch_stats").BeginArray();
  for (const auto& [size, b] : s.batch_stats) {
    w.BeginObject();
    w.MemberInt("batch_size", size);
    WriteDuration(w, "compute_input", b.compute_input);
    WriteDuration(w, "compute_infer", b.compute_infer);
    WriteDuration(w, "compute_output", b.compute_output);
    w.EndObject();
  }
  w.EndArray();
  w.Key("memory_usage").BeginArray().EndArray();
  w.EndObject();
}

void WriteTensorMetadata(proto::JsonWriter& w, const std::string& name, int data_type,
                         const google::protobuf::RepeatedField<int64_t>& dims, bool batched) {
  w.BeginObject();
  w.Member("name", name);
  w.Member("datatype", DataTypeName(static_cast<DataType>(data_type)));
  w.Key("shape").BeginArray();
  if (batched) w.Int(-1);
  for (int64_t d : dims) w.Int(d);
  w.EndArray();
  w.EndObject();
}

// Names of the 64-bit integer fields of ModelConfig and every message below it:
// protobuf JSON quotes them, Triton (and this server) writes them as numbers.
const std::unordered_set<std::string>& Int64FieldNames() {
  static const auto* names = [] {
    auto* out = new std::unordered_set<std::string>();
    std::set<const google::protobuf::Descriptor*> seen;
    std::vector<const google::protobuf::Descriptor*> todo = {inference::ModelConfig::descriptor()};
    std::unordered_set<std::string> other;
    while (!todo.empty()) {
      const auto* d = todo.back();
      todo.pop_back();
      if (!seen.insert(d).second) continue;
      for (int i = 0; i < d->field_count(); ++i) {
        const auto* f = d->field(i);
        using FD = google::protobuf::FieldDescriptor;
        switch (f->cpp_type()) {
          case FD::CPPTYPE_INT64:
          case FD::CPPTYPE_UINT64:
            if (!d->options().map_entry()) out->insert(f->name());
            break;
          case FD::CPPTYPE_MESSAGE:
            todo.push_back(f->message_type());
            other.insert(f->name());
            break;
          default:
            other.insert(f->name());
        }
      }
    }
    for (const auto& n : other) out->erase(n);  // a name that is not always 64-bit stays quoted
    return out;
  }();
  return *names;
}

bool IsIntegerText(std::string_view s) {
  if (!s.empty() && s.front() == '-') s.remove_prefix(1);
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Rewrites "dims": ["1","2"] as "dims": [1,2] for the fields of Int64FieldNames().
std::string UnquoteInt64(std::string_view json) {
  const auto& names = Int64FieldNames();
  std::string out;
  out.reserve(json.size());
  int mode = 0;  // 1: the value of a 64-bit key is next; 2: inside its array
  size_t i = 0;
  while (i < json.size()) {
    const char c = json[i];
    if (c != '"') {
      if (mode == 1 && c == '[') {
        mode = 2;
      } else if ((mode == 1 && c != ' ' && c != ':') || (mode == 2 && c == ']')) {
        mode = 0;
      }
      out.push_back(c);
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < json.size() && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
    j = std::min(j + 1, json.size());
    const std::string_view str = json.substr(i, j - i);
    const std::string_view inner =
        str.size() >= 2 ? str.substr(1, str.size() - 2) : std::string_view();
    size_t k = j;
    while (k < json.size() && json[k] == ' ') ++k;
    if (mode == 0 && k < json.size() && json[k] == ':') {
      out.append(str);
      if (names.count(std::string(inner)) != 0) mode = 1;
    } else if (mode != 0 && IsIntegerText(inner)) {
      out.append(inner);
      if (mode == 1) mode = 0;
    } else {
      out.append(str);
      if (mode == 1) mode = 0;
    }
    i = j;
  }
  return out;
}

}  // namespace

RouteMatch MatchRoute(const std::vector<std::string>& s) {
  RouteMatch m;
  if (s.empty() || s[0] != "v2") return m;
  if (s.size() == 1) {
    m.route = Route::kServerMetadata;
    return m;
  }
  if (s[1] == "health" && s.size() == 3) {
    if (s[2] == "live") m.route = Route::kLive;
    if (s[2] == "ready") m.route = Route::kReady;
    return m;
  }
  if (s[1] == "models") {
    if (s.size() == 3 && s[2] == "stats") {
      m.route = Route::kStats;
      return m;
    }
    if (s.size() >= 3) return MatchModel(s);
    return m;
  }
  if (s[1] == "repository") {
    // /v2/repository[/{repo}]/index and /v2/repository[/{repo}]/models/{m}/{load,unload};
    // this server has one repository, so {repo} is accepted and ignored.
    if (s.size() == 3 && s[2] == "index") m.route = Route::kRepositoryIndex;
    if (s.size() == 4 && s[3] == "index") m.route = Route::kRepositoryIndex;
    const size_t base = (s.size() == 5 && s[2] == "models")   ? 2
                        : (s.size() == 6 && s[3] == "models") ? 3
                                                              : 0;
    if (base != 0) {
      const std::string& op = s[base + 2];
      if (op == "load") m.route = Route::kRepositoryLoad;
      if (op == "unload") m.route = Route::kRepositoryUnload;
      if (m.route != Route::kNotFound) m.model = s[base + 1];
    }
  }
  return m;
}

std::string_view RouteMethod(Route route) {
  switch (route) {
    case Route::kInfer:
    case Route::kRepositoryIndex:
    case Route::kRepositoryLoad:
    case Route::kRepositoryUnload:
      return "POST";
    default:
      return "GET";
  }
}

std::string ServerMetadataJson(bool cuda_shared_memory) {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginObject().Member("name", "shoal").Member("version", SHOAL_VERSION);
  w.Key("extensions").BeginArray();
  // Not listed: "trace" (settings only; no traces are produced), and "cuda_shared_memory"
  // in a build without the CUDA path (its endpoints answer, but refuse every region).
  for (const char* e :
       {"model_repository", "schedule_policy", "model_configuration", "binary_tensor_data",
        "parameters", "statistics", "classification", "system_shared_memory", "logging"}) {
    w.String(e);
  }
  if (cuda_shared_memory) w.String("cuda_shared_memory");
  w.EndArray().EndObject();
  return out;
}

StatusOr<std::string> ModelMetadataJson(const runtime::Server& server, const std::string& model,
                                        int64_t version) {
  ASSIGN_OR_RETURN(auto mv, server.GetModel(model, version));
  ASSIGN_OR_RETURN(inference::ModelConfig config, server.GetModelConfig(model, version));
  std::vector<int64_t> versions;
  if (version >= 0) {
    versions.push_back(mv->version());
  } else {
    for (const auto& v : server.ReadyVersions()) {
      if (v->name() == model) versions.push_back(v->version());
    }
    std::sort(versions.begin(), versions.end());
  }
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginObject().Member("name", model);
  w.Key("versions").BeginArray();
  for (int64_t v : versions) w.String(std::to_string(v));
  w.EndArray();
  w.Member("platform", config.platform().empty() ? config.backend() : config.platform());
  const bool batched = config.max_batch_size() > 0;
  w.Key("inputs").BeginArray();
  for (const auto& in : config.input())
    WriteTensorMetadata(w, in.name(), in.data_type(), in.dims(), batched);
  w.EndArray();
  w.Key("outputs").BeginArray();
  for (const auto& o : config.output())
    WriteTensorMetadata(w, o.name(), o.data_type(), o.dims(), batched);
  w.EndArray();
  w.EndObject();
  return out;
}

StatusOr<std::string> ModelConfigJson(const inference::ModelConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(config, &json, options);
  if (!status.ok()) return Internal("cannot render the model config as JSON: " + status.ToString());
  return UnquoteInt64(json);
}

StatusOr<std::string> StatisticsJson(const runtime::Server& server, const std::string& model,
                                     int64_t version) {
  std::vector<std::shared_ptr<runtime::ModelVersion>> versions;
  if (model.empty()) {
    versions = server.ReadyVersions();
  } else if (version >= 0) {
    ASSIGN_OR_RETURN(auto mv, server.GetModel(model, version));
    versions.push_back(mv);
  } else {
    RETURN_IF_ERROR(server.GetModel(model, -1).status());
    for (auto& v : server.ReadyVersions()) {
      if (v->name() == model) versions.push_back(v);
    }
  }
  std::sort(versions.begin(), versions.end(), [](const auto& a, const auto& b) {
    return a->name() != b->name() ? a->name() < b->name() : a->version() < b->version();
  });
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginObject().Key("model_stats").BeginArray();
  for (const auto& v : versions) WriteVersionStats(w, *v);
  w.EndArray().EndObject();
  return out;
}

std::string RepositoryIndexJson(const std::vector<runtime::ModelStatus>& index, bool ready_only) {
  std::string out;
  proto::JsonWriter w(&out);
  w.BeginArray();
  for (const auto& m : index) {
    if (ready_only && m.state != runtime::ModelState::kReady) continue;
    w.BeginObject().Member("name", m.name);
    if (m.version > 0) w.Member("version", std::to_string(m.version));
    w.Member("state", runtime::ModelStateName(m.state));
    w.Member("reason", m.reason);
    w.EndObject();
  }
  w.EndArray();
  return out;
}

EndpointClass RouteEndpointClass(Route route) {
  switch (route) {
    case Route::kLive:
    case Route::kReady:
    case Route::kModelReady:
    case Route::kNotFound:
      return EndpointClass::kHealth;
    case Route::kServerMetadata:
    case Route::kModelMetadata:
    case Route::kModelConfig:
    case Route::kStats:
      return EndpointClass::kMetadata;
    case Route::kInfer:
      return EndpointClass::kInference;
    case Route::kRepositoryIndex:
    case Route::kRepositoryLoad:
    case Route::kRepositoryUnload:
      return EndpointClass::kControl;
  }
  return EndpointClass::kControl;  // a route added without a class stays closed
}

proto::HttpResponse ErrorResponse(const Status& status) {
  proto::HttpResponse r =
      proto::HttpResponse::Error(HttpStatusFor(status.code()), status.message());
  if (status.retryable()) {
    r.headers.emplace_back("Retry-After", std::to_string(RetryAfterSeconds(status)));
    // Retry-After counts whole seconds; the model's own estimate is often milliseconds.
    if (status.retry_after_ms() >= 0)
      r.headers.emplace_back("Shoal-Retry-After-Ms", std::to_string(status.retry_after_ms()));
  }
  return r;
}

HttpRoutes::HttpRoutes(runtime::Server* server, HttpOptions options)
    : server_(server),
      options_(std::move(options)),
      extensions_(options_.extension_state ? options_.extension_state
                                           : std::make_shared<ExtensionState>()),
      server_metadata_(ServerMetadataJson(extensions_->shared_memory.CudaSupported())),
      worker_(1, "http-repo"),
      codec_(options_.codec_threads > 0
                 ? std::make_shared<TaskPool>(options_.codec_threads, "http-codec")
                 : nullptr) {}

HttpRoutes::~HttpRoutes() { Shutdown(); }

void HttpRoutes::Shutdown() {
  worker_.Shutdown();
  if (codec_) codec_->Shutdown();
}

bool HttpRoutes::RunOnWorker(std::function<void()> work, std::function<void()> on_refused) {
  return worker_.Submit(std::move(work), std::move(on_refused));
}

size_t HttpRoutes::BodyAlignment(const proto::HttpRequestHead& head) {
  if (const std::string* v = head.Find("inference-header-content-length")) {
    const int64_t n = proto::ParseDecimal(*v);
    if (n > 0) return static_cast<size_t>(n);
  }
  return 0;
}

std::optional<EndpointClass> ExtensionEndpointClass(const std::vector<std::string>& segments) {
  if (segments.size() < 2 || segments[0] != "v2") return std::nullopt;
  const std::string& s = segments[1];
  if (s == "systemsharedmemory" || s == "cudasharedmemory") return EndpointClass::kInference;
  if (s == "logging" || s == "trace") return EndpointClass::kControl;
  if (s == "models" && segments.size() >= 4 && segments[segments.size() - 2] == "trace")
    return EndpointClass::kControl;
  return std::nullopt;
}

bool HttpRoutes::Authorized(const HttpRequest& request, EndpointClass endpoint,
                            const HttpResponder& responder) {
  if (options_.auth == nullptr) return true;
  const std::string* header = request.head.Find("authorization");
  const std::string_view value = header != nullptr ? std::string_view(*header) : "";
  const AuthResult auth = options_.auth->Authorize(endpoint, header != nullptr ? &value : nullptr);
  if (auth.ok) return true;
  proto::HttpResponse r = proto::HttpResponse::Error(401, auth.message);
  r.headers.emplace_back("WWW-Authenticate", Authenticator::Challenge(auth.credential_presented));
  responder.Send(std::move(r));
  return false;
}

std::function<void()> HttpRoutes::Handle(HttpRequest request, HttpResponder responder) {
  auto segments = proto::SplitPath(request.head.path);
  if (!segments.ok()) {
    responder.Send(ErrorResponse(segments.status()));
    return {};
  }
  if (auto endpoint = ExtensionEndpointClass(*segments);
      endpoint.has_value() && !Authorized(request, *endpoint, responder)) {
    return {};
  }
  // CUDA shared-memory registration opens an IPC handle in the driver, and unregistering
  // closes one: both may take milliseconds, so they run on the worker, not the loop.
  if (segments->size() >= 2 && (*segments)[0] == "v2" && (*segments)[1] == "cudasharedmemory" &&
      request.head.method == "POST") {
    auto segs = std::make_shared<std::vector<std::string>>(std::move(*segments));
    auto body = std::make_shared<std::string>(request.body_view());
    auto method = std::make_shared<std::string>(request.head.method);
    runtime::Server* server = server_;
    std::shared_ptr<ExtensionState> state = extensions_;
    auto refused = [responder] {
      responder.Send(ErrorResponse(Unavailable("server is shutting down")));
    };
    if (!RunOnWorker(
            [segs, body, method, server, state, responder] {
              auto answer = HandleExtension(*segs, *method, *body, *server, *state);
              responder.Send(answer ? std::move(*answer)
                                    : proto::HttpResponse::Error(404, "Not Found"));
            },
            refused)) {
      refused();
    }
    return {};
  }
  if (auto answer = HandleExtension(*segments, request.head.method, request.body_view(), *server_,
                                    *extensions_)) {
    responder.Send(std::move(*answer));
    return {};
  }
  const RouteMatch match = MatchRoute(*segments);
  if (match.route == Route::kNotFound) {
    responder.Send(match.error.ok() ? proto::HttpResponse::Error(404, "Not Found")
                                    : ErrorResponse(match.error));
    return {};
  }
  const std::string_view method = RouteMethod(match.route);
  const std::string& got = request.head.method;
  if (got != method && !(method == "GET" && got == "HEAD")) {
    proto::HttpResponse r = proto::HttpResponse::Error(
        405, "method " + got.substr(0, 16) + " is not allowed here; use " + std::string(method));
    r.headers.emplace_back("Allow", method == "GET" ? "GET, HEAD" : "POST");
    responder.Send(std::move(r));
    return {};
  }
  if (!match.error.ok()) {
    responder.Send(ErrorResponse(match.error));
    return {};
  }
  if (!Authorized(request, RouteEndpointClass(match.route), responder)) return {};
  auto reply = [&](const StatusOr<std::string>& json) {
    if (!json.ok()) LogInternalError("HTTP", match.model, json.status());
    responder.Send(json.ok() ? proto::HttpResponse::Json(200, *json)
                             : ErrorResponse(json.status()));
  };
  switch (match.route) {
    case Route::kServerMetadata:
      responder.Send(proto::HttpResponse::Json(200, server_metadata_));
      break;
    case Route::kLive:
      responder.Send(server_->live() ? proto::HttpResponse::Empty(200)
                                     : ErrorResponse(Unavailable("server is not live")));
      break;
    case Route::kReady:
      if (stopping_) {
        responder.Send(ErrorResponse(Unavailable("server is shutting down")));
      } else if (!server_->ready()) {
        responder.Send(ErrorResponse(Unavailable("server is not ready")));
      } else {
        responder.Send(proto::HttpResponse::Empty(200));
      }
      break;
    case Route::kModelReady: {
      const Status ready = server_->ModelReady(match.model, match.version);
      responder.Send(ready.ok() ? proto::HttpResponse::Empty(200) : ErrorResponse(ready));
      break;
    }
    case Route::kModelMetadata:
      reply(ModelMetadataJson(*server_, match.model, match.version));
      break;
    case Route::kModelConfig: {
      auto config = server_->GetModelConfig(match.model, match.version);
      reply(config.ok() ? ModelConfigJson(*config) : StatusOr<std::string>(config.status()));
      break;
    }
    case Route::kStats:
      reply(StatisticsJson(*server_, match.model, match.version));
      break;
    case Route::kInfer:
      return Infer(request, match, responder);
    case Route::kRepositoryIndex:
    case Route::kRepositoryLoad:
    case Route::kRepositoryUnload:
      Repository(request, match, responder);
      break;
    case Route::kNotFound:
      break;
  }
  return {};
}

// An infer request handed to the codec pool: the loop's cancel hook and the pool's
// submission meet here, in whichever order they come.
struct HttpRoutes::InferCall {
  int64_t start_ns = 0;  // RequestLogNowNs() when the request reached Infer
  proto::HttpRequestHead head;
  std::shared_ptr<proto::BodyBuffer> body;
  RouteMatch match;
  HttpResponder responder;

  Mutex mu;
  bool cancelled GUARDED_BY(mu) = false;
  std::shared_ptr<runtime::RequestHandle> handle GUARDED_BY(mu);

  void Cancel() {
    std::shared_ptr<runtime::RequestHandle> h;
    {
      MutexLock lock(&mu);
      cancelled = true;
      h = handle;
    }
    if (h) h->Cancel();
  }
};

namespace {

bool Compressed(const proto::HttpRequestHead& head) {
  const std::string* encoding = head.Find("content-encoding");
  return encoding != nullptr && !proto::EqualsIgnoreCase(*encoding, "identity");
}

// Tensor bytes of the outputs an answer writes as JSON text (binary ones are zero-copy).
size_t JsonOutputBytes(const runtime::InferResponse& response, const OutputEncoding& encoding) {
  size_t bytes = 0;
  for (const NamedTensor& output : response.outputs) {
    if (!encoding.Binary(output.name)) bytes += output.tensor.byte_size();
  }
  return bytes;
}

// Whether the answer copies an output into a CUDA shared-memory region.
bool WritesDeviceMemory(const OutputEncoding& encoding) {
  for (const auto& [name, view] : encoding.shared_memory_views)
    if (view.device != nullptr) return true;
  return false;
}

}  // namespace

std::function<void()> HttpRoutes::Infer(HttpRequest& request, const RouteMatch& match,
                                        const HttpResponder& responder) {
  auto call = std::make_shared<InferCall>();
  call->start_ns = RequestLogNowNs();
  call->head = std::move(request.head);
  call->body = std::move(request.body);
  call->match = match;
  call->responder = responder;
  // A request that may read a CUDA shared-memory region copies device memory while it is
  // decoded: off the loop too.
  const bool offload =
      codec_ != nullptr &&
      (call->body->size() > static_cast<size_t>(options_.offload_bytes) || Compressed(call->head) ||
       (extensions_->shared_memory.HasCudaRegions() &&
        call->body->view().find("shared_memory_region") != std::string_view::npos));
  if (!offload) {
    StartInfer(call);
    std::shared_ptr<runtime::RequestHandle> handle;
    {
      MutexLock lock(&call->mu);  // uncontended: nothing else holds the call yet
      handle = std::move(call->handle);
    }
    if (!handle) return {};
    return [handle] { handle->Cancel(); };
  }
  const bool queued = codec_->Submit(
      [this, call] {
        {
          MutexLock lock(&call->mu);
          if (call->cancelled) {  // the client left while this waited: nothing to run
            call->responder.Send(ErrorResponse(Cancelled("the client went away")));
            return;
          }
        }
        StartInfer(call);
      },
      [call] { call->responder.Send(ErrorResponse(Unavailable("server is shutting down"))); });
  if (!queued) {
    responder.Send(ErrorResponse(Unavailable("server is shutting down")));
    return {};
  }
  return [call] { call->Cancel(); };
}

void HttpRoutes::StartInfer(const std::shared_ptr<InferCall>& call) {
  const proto::HttpRequestHead& head = call->head;
  const HttpResponder& responder = call->responder;
  const int64_t start_ns = call->start_ns;
  const std::string model = call->match.model;
  // Answers an error found before the runtime saw the request, logging it.
  auto refuse = [&](proto::HttpResponse r, const Status& status) {
    LogRequest({"HTTP", model, 0, {}, status, 0, 0, RequestLogNowNs() - start_ns});
    responder.Send(std::move(r));
  };
  std::shared_ptr<proto::BodyBuffer> body = std::move(call->body);
  const std::string* header_length = head.Find("inference-header-content-length");
  std::optional<std::string_view> header_length_view;
  if (header_length != nullptr) header_length_view = *header_length;
  if (const std::string* encoding = head.Find("content-encoding")) {
    auto decoded =
        DecodeContentEncoding(*encoding, std::move(body), options_.max_body_bytes,
                              BodyAlignment(head));  // the compressed bytes go with `body`
    if (!decoded.ok()) {
      proto::HttpResponse r = ErrorResponse(decoded.status());
      if (decoded.status().code() == StatusCode::kResourceExhausted) r.status = 413;
      r.headers.clear();
      refuse(std::move(r), decoded.status());
      return;
    }
    body = std::move(decoded).value();
  }
  auto parsed = ParseInferRequest(body, header_length_view, options_.limits);
  if (!parsed.ok()) {
    refuse(ErrorResponse(parsed.status()), parsed.status());
    return;
  }
  if (Status shm = ResolveSharedMemory(extensions_->shared_memory, &*parsed); !shm.ok()) {
    responder.Send(ErrorResponse(shm));
    return;
  }
  runtime::InferRequest infer = std::move(parsed->request);
  if (const std::string* timeout = head.Find(kTimeoutHeader)) {
    uint64_t us = 0;
    const char* end = timeout->data() + timeout->size();
    auto [ptr, ec] = std::from_chars(timeout->data(), end, us);
    if (timeout->empty() || ec != std::errc() || ptr != end || us == 0) {
      const Status bad =
          InvalidArgument(std::string(kTimeoutHeader) +
                          " must be a positive integer (microseconds); was '" + *timeout + "'");
      refuse(ErrorResponse(bad), bad);
      return;
    }
    infer.client_deadline_us = us;
  }
  infer.model_name = call->match.model;
  infer.model_version = call->match.version;
  auto encoding = std::make_shared<const OutputEncoding>(std::move(parsed->encoding));
  std::shared_ptr<runtime::RequestHandle> handle =
      server_->Infer(std::move(infer), [responder, encoding, pool = std::weak_ptr<TaskPool>(codec_),
                                        offload = static_cast<size_t>(options_.offload_bytes),
                                        start_ns, model](runtime::InferResponse response) {
        auto shared = std::make_shared<runtime::InferResponse>(std::move(response));
        auto make = [shared, encoding, start_ns, model]() -> proto::HttpResponse {
          const runtime::InferResponse& r = *shared;
          auto log = [&](const Status& status) {
            LogRequest({"HTTP", model, r.model_version, r.id, status, r.queue_ns, r.compute_ns,
                        RequestLogNowNs() - start_ns});
          };
          if (!r.status.ok()) {
            log(r.status);
            return ErrorResponse(r.status);
          }
          auto http = SerializeInferResponse(r, *encoding);
          log(http.status());
          return http.ok() ? std::move(http).value() : ErrorResponse(http.status());
        };
        // A large JSON answer, or one that copies outputs to device memory, is written on
        // the codec pool; the rest on the loop.
        if (shared->status.ok() &&
            (JsonOutputBytes(*shared, *encoding) > offload || WritesDeviceMemory(*encoding))) {
          if (std::shared_ptr<TaskPool> p = pool.lock()) {
            if (p->Submit([responder, make] { responder.Send(make()); },
                          [responder, make] { responder.SendLater(make); })) {
              return;
            }
          }
        }
        responder.SendLater(std::move(make));
      });
  std::shared_ptr<runtime::RequestHandle> cancel_now;
  {
    MutexLock lock(&call->mu);
    call->handle = handle;
    if (call->cancelled) cancel_now = handle;
  }
  if (cancel_now) cancel_now->Cancel();
}

void HttpRoutes::Repository(HttpRequest& request, const RouteMatch& match,
                            const HttpResponder& responder) {
  const std::string body(request.body_view());
  if (Compressed(request.head)) {
    responder.Send(ErrorResponse(InvalidArgument("compressed bodies are only accepted on infer")));
    return;
  }
  auto refused = [responder] {
    responder.Send(ErrorResponse(Unavailable("server is shutting down")));
  };
  runtime::Server* server = server_;
  if (match.route == Route::kRepositoryIndex) {
    auto ready = ParseRepositoryIndexBody(body);
    if (!ready.ok()) {
      responder.Send(ErrorResponse(ready.status()));
      return;
    }
    const bool ready_only = *ready;
    if (!RunOnWorker(
            [server, responder, ready_only] {
              responder.Send(proto::HttpResponse::Json(
                  200, RepositoryIndexJson(server->RepositoryIndex(), ready_only)));
            },
            refused)) {
      refused();
    }
    return;
  }
  auto params = ParseRepositoryParametersBody(body);
  if (!params.ok()) {
    responder.Send(ErrorResponse(params.status()));
    return;
  }
  for (const auto& p : params->names) {
    if (p.rfind("file:", 0) == 0) {
      responder.Send(ErrorResponse(
          Unimplemented("load parameter '" + p + "' is not supported by this server")));
      return;
    }
  }
  if (server_->options().control_mode != runtime::ModelControlMode::kExplicit) {
    responder.Send(ErrorResponse(
        FailedPrecondition("explicit model load / unload needs --model-control-mode explicit")));
    return;
  }
  const bool load = match.route == Route::kRepositoryLoad;
  const std::string model = match.model;
  std::optional<inference::ModelConfig> config;
  if (load && params->config) {
    auto parsed = repository::ParseModelConfigJson(*params->config, "parameters.config");
    if (!parsed.ok()) {
      responder.Send(ErrorResponse(parsed.status()));
      return;
    }
    config = std::move(parsed).value();
  }
  const bool unload_dependents = params->unload_dependents;
  if (!RunOnWorker(
          [server, responder, load, model, config, unload_dependents] {
            const Status s = load ? server->LoadModel(model, config)
                                  : server->UnloadModel(model, unload_dependents);
            responder.Send(s.ok() ? proto::HttpResponse::Empty(200) : ErrorResponse(s));
          },
          refused)) {
    refused();
  }
}

}  // namespace shoal::server::internal
