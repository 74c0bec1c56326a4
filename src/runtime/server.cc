#include "runtime/server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/log_text.h"
#include "repository/repository.h"
#include "runtime/config_adapter.h"
#include "runtime/ensemble.h"

namespace shoal::runtime {

namespace {

// What a request to a version whose GPU has lost its context is answered.
Status DeviceLostStatus(const ModelVersion& mv) {
  return Unavailable("model '" + mv.name() + "' version " + std::to_string(mv.version()) +
                     " is not available: its GPU's context is lost (a sticky CUDA error); "
                     "restart the server");
}

}  // namespace

namespace {
// Ensembles of ensembles nest at most this deep (a deeper chain is most likely a cycle
// across configs, which no one config's validation can see).
constexpr int kMaxEnsembleDepth = 8;
bool IsEnsemble(const inference::ModelConfig& config) {
  return config.platform() == repository::kEnsemblePlatform;
}
}  // namespace

std::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kReady:
      return "READY";
    case ModelState::kUnavailable:
      return "UNAVAILABLE";
    case ModelState::kUnloading:
      return "UNLOADING";
  }
  return "UNAVAILABLE";
}

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      registry_(options_.registry ? options_.registry
                                  : std::make_shared<backends::BackendRegistry>()) {
  for (const auto& dir : options_.backend_directories) registry_->AddPluginDirectory(dir);
  if (options_.cache_size_bytes > 0)
    cache_ = std::make_shared<ResponseCache>(options_.cache_size_bytes);
}

StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Open(std::move(options)));
  server->LoadStartupModels();
  return server;
}

StatusOr<std::unique_ptr<Server>> Server::Open(ServerOptions options) {
  std::unique_ptr<Server> server(new Server(std::move(options)));
  ASSIGN_OR_RETURN(auto entries, repository::ScanRepository(server->options_.model_repository));
  std::vector<std::string> to_load;
  if (server->options_.control_mode == ModelControlMode::kExplicit) {
    const auto& wanted = server->options_.startup_models;
    const bool all = std::find(wanted.begin(), wanted.end(), "*") != wanted.end();
    for (const auto& e : entries) {
      if (all || std::find(wanted.begin(), wanted.end(), e.name) != wanted.end())
        to_load.push_back(e.name);
    }
    for (const auto& w : wanted) {
      if (w != "*" && std::none_of(entries.begin(), entries.end(),
                                   [&](const auto& e) { return e.name == w; })) {
        return NotFound("no model '" + w + "' in the repository '" +
                        server->options_.model_repository + "'");
      }
    }
  } else {
    for (const auto& e : entries) to_load.push_back(e.name);
  }
  {
    // LOADING from now: readiness counts them, and inference on them says so.
    MutexLock lock(&server->mu_);
    for (const auto& name : to_load) server->models_[name].state = ModelState::kLoading;
  }
  server->startup_models_ = std::move(to_load);
  return server;
}

void Server::LoadStartupModels() {
  for (const auto& name : startup_models_) {
    MutexLock load_lock(&load_mu_);
    bool shutting_down = false;
    {
      MutexLock lock(&mu_);
      shutting_down = shutting_down_;
    }
    if (shutting_down) break;  // Shutdown took every record
    if (startup_cancelled_.load(std::memory_order_acquire)) {
      MutexLock lock(&mu_);
      auto it = models_.find(name);
      if (it != models_.end() && it->second.state == ModelState::kLoading &&
          it->second.versions.empty()) {
        it->second.state = ModelState::kUnavailable;
        it->second.reason = "start-up loading was cancelled";
      }
      continue;
    }
    {
      // Loaded already as the step of an ensemble loaded before it.
      MutexLock lock(&mu_);
      auto it = models_.find(name);
      if (it != models_.end() && !it->second.versions.empty()) continue;
    }
    // A failed model is recorded UNAVAILABLE and logged; the others still load.
    (void)LoadModelLocked(name);
  }
  startup_finished_.store(true, std::memory_order_release);
}

void Server::CancelStartupLoading() { startup_cancelled_.store(true, std::memory_order_release); }

Server::~Server() { Shutdown(); }

Status Server::LoadModel(const std::string& name,
                         const std::optional<inference::ModelConfig>& config) {
  MutexLock load_lock(&load_mu_);
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return Unavailable("the server is shutting down");
  }
  return LoadModelLocked(name, config ? &*config : nullptr);
}

Status Server::LoadModelLocked(const std::string& name,
                               const inference::ModelConfig* config_override, int depth) {
  auto scanned = repository::ScanModel(options_.model_repository, name, config_override);
  if (!scanned.ok()) {
    spdlog::error("model '{}' failed to load: {}", LogSafe(name),
                  LogSafe(scanned.status().message()));
    MutexLock lock(&mu_);
    if (auto it = models_.find(name);
        it != models_.end() && it->second.state == ModelState::kLoading) {
      it->second.state = ModelState::kUnavailable;  // recorded LOADING by Open
      it->second.reason = scanned.status().message();
    }
    return scanned.status();
  }
  repository::ModelEntry entry = std::move(scanned).value();
  {
    MutexLock lock(&mu_);
    Record& r = models_[name];
    r.fingerprint = entry.fingerprint;
    if (r.versions.empty()) r.state = ModelState::kLoading;
  }
  auto fail = [&](const Status& s) {
    spdlog::error("model '{}' failed to load: {}", LogSafe(name), LogSafe(s.message()));
    MutexLock lock(&mu_);
    Record& r = models_[name];
    // A model that was serving keeps serving its old versions.
    r.state = r.versions.empty() ? ModelState::kUnavailable : ModelState::kReady;
    r.reason = s.message();
    return s;
  };
  if (!entry.status.ok()) return fail(entry.status);

  inference::ModelConfig config = entry.config;
  const bool ensemble = IsEnsemble(config);
  std::string backend_name = "ensemble";
  std::shared_ptr<backends::Backend> backend;
  if (ensemble) {
    if (Status s = LoadEnsembleStepsLocked(config, depth); !s.ok())
      return fail(s.WithPrefix("ensemble '" + name + "'"));
  } else {
    auto backend_name_or = BackendNameForConfig(config);
    if (!backend_name_or.ok()) return fail(backend_name_or.status());
    backend_name = *backend_name_or;
    auto found = registry_->Find(backend_name, entry.dir.string());
    if (!found.ok()) return fail(found.status().WithPrefix("model '" + name + "'"));
    backend = *found;
  }

  std::map<int64_t, std::shared_ptr<ModelVersion>> loaded;
  for (int64_t version : entry.versions) {
    const int64_t start_ns = clock_->NowNs();
    if (ensemble) {
      auto mv = CreateEnsembleVersion(config, entry.dir.string(), version);
      if (!mv.ok()) return fail(mv.status());
      loaded[version] = std::move(mv).value();
      spdlog::info("loaded ensemble '{}' version {} ({} steps)", LogSafe(name), version,
                   config.ensemble_scheduling().step_size());
      continue;
    }
    auto info = ModelInfoFromConfig(config, entry.dir.string(), version);
    auto model = backend->LoadModel(info);
    if (!model.ok()) {
      return fail(
          model.status().WithPrefix("model '" + name + "' version " + std::to_string(version)));
    }
    inference::ModelConfig completed = config;
    CompleteConfig((*model)->info(), &completed);
    auto options = VersionOptionsFromConfig(completed, entry.dir.string(), version, cache_, clock_,
                                            options_.limits);
    if (!options.ok()) return fail(options.status());
    options->on_device_lost = [lost = device_lost_] { lost->store(true); };
    auto mv = ModelVersion::Create(std::move(options).value(), std::move(model).value());
    if (!mv.ok())
      return fail(
          mv.status().WithPrefix("model '" + name + "' version " + std::to_string(version)));
    config = completed;
    loaded[version] = std::move(mv).value();
    spdlog::info("loaded model '{}' version {} (backend {}, {} instance(s), {:.1f} ms)",
                 LogSafe(name), version, LogSafe(backend_name),
                 loaded[version]->options().instances.size(),
                 static_cast<double>(clock_->NowNs() - start_ns) / 1e6);
  }

  std::map<int64_t, std::shared_ptr<ModelVersion>> replaced;
  {
    MutexLock lock(&mu_);
    Record& r = models_[name];
    r.unloaded_on_request = false;
    replaced = std::move(r.versions);
    r.versions = std::move(loaded);
    r.config = config;
    r.state = ModelState::kReady;
    r.reason.clear();
  }
  for (auto& [version, mv] : replaced) {
    mv->Shutdown();
    if (cache_) cache_->Purge(mv->cache_owner_id());
    spdlog::info("unloaded model '{}' version {} (replaced by a reload)", LogSafe(name), version);
  }
  return Status::Ok();
}

Status Server::LoadEnsembleStepsLocked(const inference::ModelConfig& config, int depth) {
  if (depth >= kMaxEnsembleDepth) {
    return InvalidArgument("ensembles nest more than " + std::to_string(kMaxEnsembleDepth) +
                           " deep (do two ensembles run each other?)");
  }
  for (const auto& step : config.ensemble_scheduling().step()) {
    {
      MutexLock lock(&mu_);
      auto it = models_.find(step.model_name());
      if (it != models_.end() && !it->second.versions.empty()) continue;
    }
    if (Status s = LoadModelLocked(step.model_name(), nullptr, depth + 1); !s.ok())
      return s.WithPrefix("step model '" + step.model_name() + "' failed to load");
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<ModelVersion>> Server::CreateEnsembleVersion(
    const inference::ModelConfig& config, const std::string& dir, int64_t version) {
  const std::string where = "ensemble '" + config.name() + "' version " + std::to_string(version);
  EnsembleOptions eo = EnsembleOptionsFromConfig(config);
  eo.clock = clock_;
  // The server outlives its ensembles: Shutdown drains them before anything else.
  eo.step_infer = [this](InferRequest r, InferCallback cb) {
    return InferStep(std::move(r), std::move(cb));
  };
  auto ensemble = Ensemble::Create(std::move(eo));
  if (!ensemble.ok()) return ensemble.status().WithPrefix(where);
  auto options = VersionOptionsFromConfig(config, dir, version, cache_, clock_, options_.limits);
  if (!options.ok()) return options.status().WithPrefix(where);
  auto mv = ModelVersion::CreateEnsemble(std::move(options).value(), std::move(ensemble).value());
  if (!mv.ok()) return mv.status().WithPrefix(where);
  return mv;
}

std::shared_ptr<RequestHandle> Server::InferStep(InferRequest request, InferCallback callback) {
  StatusOr<std::shared_ptr<ModelVersion>> mv = Unavailable("");
  {
    MutexLock lock(&mu_);
    mv = GetModelLocked(request.model_name, request.model_version, /*draining=*/true);
  }
  if (mv.ok() && (*mv)->device_lost()) mv = DeviceLostStatus(**mv);
  if (!mv.ok()) {
    InferResponse response;
    response.model_name = request.model_name;
    response.status = mv.status();
    callback(std::move(response));
    return nullptr;
  }
  return (*mv)->Infer(std::move(request), std::move(callback));
}

Status Server::EnsembleStepsReadyLocked(const inference::ModelConfig& config, int depth) const {
  if (depth >= kMaxEnsembleDepth) {
    return Unavailable("ensemble '" + config.name() + "' nests more than " +
                       std::to_string(kMaxEnsembleDepth) + " ensembles deep");
  }
  for (const auto& step : config.ensemble_scheduling().step()) {
    auto it = models_.find(step.model_name());
    const bool ready =
        it != models_.end() && !it->second.versions.empty() &&
        (step.model_version() <= 0 || it->second.versions.count(step.model_version()) > 0);
    if (!ready) {
      return Unavailable("ensemble '" + config.name() + "' is not ready: its step model '" +
                         step.model_name() + "' is not loaded");
    }
    for (const auto& [version, mv] : it->second.versions) {
      if (mv->device_lost()) {
        return Unavailable("ensemble '" + config.name() + "' is not ready: its step model '" +
                           step.model_name() + "' lost its GPU's context");
      }
    }
    if (IsEnsemble(it->second.config))
      RETURN_IF_ERROR(EnsembleStepsReadyLocked(it->second.config, depth + 1));
  }
  return Status::Ok();
}

Status Server::UnloadModel(const std::string& name, bool unload_dependents) {
  MutexLock load_lock(&load_mu_);
  std::vector<std::string> steps;
  if (unload_dependents) {
    MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it != models_.end() && IsEnsemble(it->second.config)) {
      for (const auto& step : it->second.config.ensemble_scheduling().step())
        steps.push_back(step.model_name());
    }
  }
  RETURN_IF_ERROR(UnloadModelLocked(name));
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (const auto& step : steps) {
    bool used = false;
    {
      MutexLock lock(&mu_);
      for (const auto& [other, r] : models_) {
        if (r.versions.empty() || !IsEnsemble(r.config)) continue;
        for (const auto& s : r.config.ensemble_scheduling().step())
          used = used || s.model_name() == step;
      }
    }
    if (!used) RETURN_IF_ERROR(UnloadModelLocked(step));
  }
  return Status::Ok();
}

Status Server::UnloadModelLocked(const std::string& name) {
  std::map<int64_t, std::shared_ptr<ModelVersion>> versions;
  {
    MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it == models_.end() || it->second.versions.empty()) {
      // As Triton: unloading what is not loaded succeeds (defensive cleanup code relies
      // on it), and a model that had failed to load no longer counts against readiness.
      if (it != models_.end()) models_.erase(it);
      spdlog::info("unload of model '{}': not loaded, nothing to do", LogSafe(name));
      return Status::Ok();
    }
    versions = std::move(it->second.versions);
    it->second.state = ModelState::kUnloading;
  }
  for (auto& [version, mv] : versions) {
    mv->Shutdown();
    if (cache_) cache_->Purge(mv->cache_owner_id());
    spdlog::info("unloaded model '{}' version {}", LogSafe(name), version);
  }
  MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) {
    it->second.state = ModelState::kUnavailable;
    it->second.reason = "unloaded";
    it->second.unloaded_on_request = true;
  }
  return Status::Ok();
}

Status Server::PollRepository() {
  MutexLock load_lock(&load_mu_);
  ASSIGN_OR_RETURN(auto entries, repository::ScanRepository(options_.model_repository));
  std::vector<std::string> changed, removed;
  {
    MutexLock lock(&mu_);
    if (shutting_down_) return Unavailable("the server is shutting down");
    for (const auto& e : entries) {
      auto it = models_.find(e.name);
      if (it == models_.end() || it->second.fingerprint != e.fingerprint) changed.push_back(e.name);
    }
    for (const auto& model : models_) {
      const std::string& name =
          model.first;  // not a structured binding: clang 14 cannot capture one
      if (std::none_of(entries.begin(), entries.end(),
                       [&](const auto& e) { return e.name == name; })) {
        removed.push_back(name);
      }
    }
  }
  for (const auto& name : changed) (void)LoadModelLocked(name);
  for (const auto& name : removed) {
    (void)UnloadModelLocked(name);
    MutexLock lock(&mu_);
    models_.erase(name);
  }
  return Status::Ok();
}

namespace {

// Wraps `callback` so that the outputs `request` asks to classify are replaced by their
// top K classes. Checks the request first, leaving `callback` as it was on error:
// INVALID_ARGUMENT for an output the model does not have or a count below 1.
Status WrapForClassification(const ModelVersion& mv, const InferRequest& request,
                             InferCallback& callback) {
  const ModelSignature& sig = mv.signature();
  for (const auto& entry : request.classification) {
    // Not a structured binding: clang 14 cannot capture one in the lambda below.
    const std::string& output = entry.first;
    const auto k = entry.second;
    const bool known = std::any_of(sig.outputs.begin(), sig.outputs.end(),
                                   [&](const auto& o) { return o.name == output; });
    if (!known) {
      return InvalidArgument("classification requested for unknown output '" + output +
                             "' of model '" + mv.name() + "'");
    }
    if (k < 1) {
      return InvalidArgument("output '" + output + "': classification count must be >= 1; was " +
                             std::to_string(k));
    }
  }
  const bool batched = sig.max_batch_size > 0;
  callback = InferCallback([classification = request.classification, batched,
                            labels = mv.options().output_labels,
                            callback = std::move(callback)](InferResponse r) mutable {
    if (r.status.ok()) {
      for (auto& out : r.outputs) {
        auto it = classification.find(out.name);
        if (it == classification.end()) continue;
        auto l = labels.find(out.name);
        auto classified = Classify(out.tensor, it->second, batched,
                                   l == labels.end() ? nullptr : l->second.get());
        if (!classified.ok()) {
          r.status = classified.status().WithPrefix("output '" + out.name + "'");
          r.outputs.clear();
          break;
        }
        out.tensor = std::move(classified).value();
      }
    }
    callback(std::move(r));
  });
  return Status::Ok();
}

}  // namespace

std::shared_ptr<RequestHandle> Server::Infer(InferRequest request, InferCallback callback) {
  auto answer_now = [&](const Status& status) -> std::shared_ptr<RequestHandle> {
    InferResponse response;
    response.model_name = request.model_name;
    response.model_version = request.model_version;
    response.id = request.id;
    response.status = status;
    callback(std::move(response));
    struct Noop : RequestHandle {
      void Cancel() override {}
    };
    return std::make_shared<Noop>();
  };
  auto mv = GetModel(request.model_name, request.model_version);
  if (!mv.ok()) return answer_now(mv.status());
  if ((*mv)->device_lost()) return answer_now(DeviceLostStatus(**mv));
  if (!request.classification.empty()) {
    if (Status s = WrapForClassification(**mv, request, callback); !s.ok()) return answer_now(s);
  }
  const int64_t cap = options_.max_inflight_requests;
  if (cap <= 0) return (*mv)->Infer(std::move(request), std::move(callback));
  if (inflight_->fetch_add(1, std::memory_order_acq_rel) >= cap) {
    inflight_->fetch_sub(1, std::memory_order_acq_rel);
    return answer_now(ResourceExhausted("the server has " + std::to_string(cap) +
                                        " requests in flight, its limit; retry after 1000 ms")
                          .WithRetryAfterMs(1000));
  }
  // The counter outlives the server: a callback may run after it is destroyed.
  return (*mv)->Infer(std::move(request),
                      [inflight = inflight_, callback = std::move(callback)](InferResponse r) {
                        inflight->fetch_sub(1, std::memory_order_acq_rel);
                        callback(std::move(r));
                      });
}

StatusOr<std::shared_ptr<ModelVersion>> Server::GetModel(const std::string& name,
                                                         int64_t version) const {
  MutexLock lock(&mu_);
  return GetModelLocked(name, version);
}

StatusOr<std::shared_ptr<ModelVersion>> Server::GetModelLocked(const std::string& name,
                                                               int64_t version,
                                                               bool draining) const {
  if (shutting_down_ && !draining) return Unavailable("the server is shutting down");
  auto it = models_.find(name);
  // Triton's wording, which client code matches on.
  if (it == models_.end())
    return NotFound("Request for unknown model: '" + name + "' is not found");
  const Record& r = it->second;
  if (r.versions.empty() && r.state == ModelState::kLoading) {
    return Unavailable("model '" + name + "' is not ready: it is still loading");
  }
  if (r.versions.empty()) {
    return Unavailable("model '" + name + "' is not ready" +
                       (r.reason.empty() ? "" : ": " + r.reason));
  }
  if (IsEnsemble(r.config)) RETURN_IF_ERROR(EnsembleStepsReadyLocked(r.config, 0));
  auto v = version < 0 ? std::prev(r.versions.end()) : r.versions.find(version);
  if (v == r.versions.end()) {
    return NotFound("model '" + name + "' has no loaded version " + std::to_string(version));
  }
  return v->second;
}

Status Server::ModelReady(const std::string& name, int64_t version) const {
  auto mv = GetModel(name, version);
  if (!mv.ok()) return mv.status();
  return (*mv)->device_lost() ? DeviceLostStatus(**mv) : Status::Ok();
}

StatusOr<inference::ModelConfig> Server::GetModelConfig(const std::string& name,
                                                        int64_t version) const {
  // One look under one lock: a model unloaded or removed from the repository between two
  // looks made the second one throw (a 500 where the client should see 404).
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(GetModelLocked(name, version).status());
  return models_.find(name)->second.config;
}

std::vector<ModelStatus> Server::RepositoryIndex() const {
  std::vector<ModelStatus> out;
  std::vector<std::string> names;
  if (auto entries = repository::ScanRepository(options_.model_repository); entries.ok()) {
    for (const auto& e : *entries) names.push_back(e.name);
  }
  MutexLock lock(&mu_);
  for (const auto& [name, r] : models_) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    auto it = models_.find(name);
    if (it == models_.end()) {
      out.push_back({name, 0, ModelState::kUnavailable, "not loaded"});
      continue;
    }
    const Record& r = it->second;
    if (r.versions.empty()) {
      out.push_back({name, 0, r.state, r.reason});
    } else {
      ModelState state = r.state;
      std::string reason = r.reason;
      if (state == ModelState::kReady && IsEnsemble(r.config)) {
        if (Status s = EnsembleStepsReadyLocked(r.config, 0); !s.ok()) {
          state = ModelState::kUnavailable;
          reason = s.message();
        }
      }
      for (const auto& [v, mv] : r.versions) out.push_back({name, v, state, reason});
    }
  }
  return out;
}

std::vector<std::shared_ptr<ModelVersion>> Server::ReadyVersions() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<ModelVersion>> out;
  for (const auto& [name, r] : models_) {
    for (const auto& [v, mv] : r.versions) out.push_back(mv);
  }
  return out;
}

bool Server::ready() const {
  MutexLock lock(&mu_);
  if (shutting_down_ || !startup_finished() || !live()) return false;
  if (!options_.strict_readiness) return true;
  for (const auto& [name, r] : models_) {
    // A model unloaded on request is not a failure (Triton stays ready too).
    if (r.state != ModelState::kReady && !r.unloaded_on_request) return false;
    if (r.state == ModelState::kReady && IsEnsemble(r.config) &&
        !EnsembleStepsReadyLocked(r.config, 0).ok())
      return false;
  }
  return true;
}

void Server::Shutdown() {
  CancelStartupLoading();  // before waiting for the model loading now, if any
  MutexLock load_lock(&load_mu_);
  std::map<std::string, Record> models;
  // Per ensemble model: its versions, and the models its steps name.
  struct EnsembleEntry {
    std::vector<std::shared_ptr<ModelVersion>> versions;
    std::set<std::string> steps;
  };
  std::map<std::string, EnsembleEntry> ensembles;
  {
    MutexLock lock(&mu_);
    if (shutting_down_ && models_.empty()) return;
    shutting_down_ = true;
    for (const auto& [name, r] : models_) {
      for (const auto& [v, mv] : r.versions) {
        if (!mv->is_ensemble()) continue;
        EnsembleEntry& e = ensembles[name];
        e.versions.push_back(mv);
        for (const auto& step : r.config.ensemble_scheduling().step())
          e.steps.insert(step.model_name());
      }
    }
  }
  // Ensembles first, while their steps still serve (InferStep finds them while draining):
  // what they accepted finishes, then no step request comes from them any more. Outer
  // ensembles before the ensembles they use as steps, so a nested one still serves the
  // requests its callers drain.
  while (!ensembles.empty()) {
    std::vector<std::string> outer;
    for (const auto& [name, e] : ensembles) {
      bool used = false;
      for (const auto& [other, oe] : ensembles) used |= other != name && oe.steps.count(name) > 0;
      if (!used) outer.push_back(name);
    }
    if (outer.empty()) outer.push_back(ensembles.begin()->first);  // a cycle: load refuses it
    for (const std::string& name : outer) {
      for (auto& mv : ensembles[name].versions) mv->Shutdown();
      ensembles.erase(name);
    }
  }
  {
    MutexLock lock(&mu_);
    models = std::move(models_);
    models_.clear();
  }
  for (auto& [name, r] : models) {
    for (auto& [v, mv] : r.versions) mv->Shutdown();
  }
}

}  // namespace shoal::runtime
