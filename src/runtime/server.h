// Server: the in-process API of shoal. It owns the loaded models of one repository and
// routes requests to them. The front ends (HTTP, gRPC), `shoal run` and the benchmarks
// use this class and nothing below it.
//
// Model lifecycle: a model is LOADING while its versions are created and warmed up,
// READY when every selected version loaded, UNAVAILABLE (with a reason) when its
// config or a version failed, UNLOADING while draining. A reload of a READY model
// builds the new versions first and swaps them in only when all loaded, so a broken
// edit never takes a working model down; the replaced versions drain in the background
// of the call (the call returns after they are drained).
//
// Control modes (Triton's): kNone loads everything at start and never changes;
// kExplicit loads `startup_models` (or nothing) and then only on LoadModel/UnloadModel;
// kPoll loads everything and PollRepository() applies changes on disk.
//
// Start-up: Create scans the repository and loads the start-up models before it
// returns. A server that must answer health checks while it loads (`shoal serve`) calls
// Open instead, starts its front ends, then LoadStartupModels: meanwhile live() is true,
// ready() false, and the models still to load are LOADING (inference on them answers
// UNAVAILABLE "... is still loading").
//
// Readiness (Triton's --strict-readiness): never while shutting down or before the
// start-up loading finished; after it, with strict_readiness every model that should be
// loaded must be READY, without it the server is ready however its models fared.
//
// Thread safety: every method may be called from any thread. Infer never blocks on
// inference. Load/Unload/Poll are serialised among themselves.
// Lock order: load_mu_ → mu_; mu_ is never held while a model loads or drains.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend_registry.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/status.h"
#include "repository/model_config.pb.h"
#include "runtime/infer_request.h"
#include "runtime/model_version.h"
#include "runtime/response_cache.h"

namespace shoal::runtime {

enum class ModelControlMode { kNone, kPoll, kExplicit };

struct ServerOptions {
  std::string model_repository;
  ModelControlMode control_mode = ModelControlMode::kNone;
  // kExplicit: models to load at start ("*" = all).
  std::vector<std::string> startup_models;
  // Folders searched for plugin backends (libshoal_<name>.so), after the model's own.
  std::vector<std::string> backend_directories;
  // Shared response cache, in bytes; used by models whose config enables
  // response_cache. 0 disables caching for every model. Default 64 MiB.
  int64_t cache_size_bytes = int64_t{64} << 20;
  RequestLimits limits;
  // Inference requests accepted and not yet answered, over all models; beyond it Infer
  // answers RESOURCE_EXHAUSTED (HTTP 429) at once. Protects the process's memory when
  // many models are overloaded together. 0 = no cap. Default 4096.
  int64_t max_inflight_requests = 4096;
  // Triton's --strict-readiness. true: ready() needs every model that should be loaded
  // READY. false: ready() once the start-up loading finished (and until shutdown), even
  // when some models failed to load. Default true.
  bool strict_readiness = true;
  std::shared_ptr<Clock> clock;  // default: the real clock
  // Default: a registry with only the plugin directories above.
  std::shared_ptr<backends::BackendRegistry> registry;
};

enum class ModelState { kLoading, kReady, kUnavailable, kUnloading };
std::string_view ModelStateName(ModelState state);  // "READY", ...

struct ModelStatus {
  std::string name;
  int64_t version = 0;  // 0 when the model has no loaded version
  ModelState state = ModelState::kUnavailable;
  std::string reason;
};

class Server {
 public:
  // Scans the repository and loads models as the control mode says. Fails only when
  // the repository itself cannot be read; a broken model is recorded UNAVAILABLE.
  static StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  // The first half of Create: scans the repository and records every start-up model
  // LOADING, loading none. Fails as Create does (unreadable repository, or an explicit
  // start-up model the repository lacks). Call LoadStartupModels next.
  static StatusOr<std::unique_ptr<Server>> Open(ServerOptions options);
  // The second half: loads the start-up models one after another (a failed one is
  // recorded UNAVAILABLE, as in Create) and marks the start-up loading finished. Call it
  // once, from any thread; CancelStartupLoading or Shutdown from another thread stops it
  // before the next model (the rest become UNAVAILABLE).
  void LoadStartupModels();
  void CancelStartupLoading();
  // True once LoadStartupModels returned (always, after Create).
  bool startup_finished() const { return startup_finished_.load(std::memory_order_acquire); }
  ~Server();

  std::shared_ptr<RequestHandle> Infer(InferRequest request, InferCallback callback);

  // Loads (or reloads) one model from the repository. NOT_FOUND when the repository
  // has no such folder; otherwise the reason of a failed load. `config`, when given,
  // is used instead of the folder's config.pbtxt (Triton's load-time config override;
  // INVALID_ARGUMENT when it does not validate). A later load without it reads
  // config.pbtxt again.
  Status LoadModel(const std::string& name,
                   const std::optional<inference::ModelConfig>& config = std::nullopt);
  // Drains and removes a model. A model that is not loaded (or unknown) is a no-op
  // success, as in Triton. `unload_dependents` (Triton's parameter): an ensemble's step
  // models are unloaded after it, except those another loaded ensemble still uses.
  Status UnloadModel(const std::string& name, bool unload_dependents = false);
  // Reloads models whose files changed, loads new ones, unloads removed ones.
  Status PollRepository();

  // The ready version (`version` -1: the highest ready), else NOT_FOUND/UNAVAILABLE.
  StatusOr<std::shared_ptr<ModelVersion>> GetModel(const std::string& name,
                                                   int64_t version = -1) const;
  // The completed config of a loaded model.
  StatusOr<inference::ModelConfig> GetModelConfig(const std::string& name,
                                                  int64_t version = -1) const;
  // Every model known to the repository or loaded, with state and reason.
  std::vector<ModelStatus> RepositoryIndex() const;
  std::vector<std::shared_ptr<ModelVersion>> ReadyVersions() const;

  // True until a model's GPU lost its context (a sticky CUDA error, which only a new
  // process clears: ModelVersion::device_lost), and never again after, whatever is
  // unloaded or reloaded since: an orchestrator's liveness probe then restarts the server.
  bool live() const { return !device_lost_->load(std::memory_order_acquire); }
  // A model version's readiness (`version` -1: the highest ready): GetModel's answer, and
  // UNAVAILABLE for one whose GPU has lost its context.
  Status ModelReady(const std::string& name, int64_t version = -1) const;
  // Not shutting down, the start-up loading finished, live(), and (with strict_readiness)
  // every model that should be loaded is READY.
  bool ready() const;

  // Stops accepting (requests get UNAVAILABLE), answers everything queued, unloads
  // every model. Idempotent.
  void Shutdown();
  const ServerOptions& options() const { return options_; }
  std::shared_ptr<ResponseCache> cache() const { return cache_; }

 private:
  struct Record {
    ModelState state = ModelState::kUnavailable;
    std::string reason;
    std::string fingerprint;
    bool unloaded_on_request = false;  // explicit unload: not a failure, not counted by ready()
    inference::ModelConfig config;
    std::map<int64_t, std::shared_ptr<ModelVersion>> versions;
  };
  explicit Server(ServerOptions options);
  // `config_override`: replaces config.pbtxt, or null. `depth`: how many ensembles up
  // this load was asked for (an ensemble loads its steps that are not loaded).
  Status LoadModelLocked(const std::string& name,
                         const inference::ModelConfig* config_override = nullptr, int depth = 0)
      REQUIRES(load_mu_) EXCLUDES(mu_);
  // LoadModelLocked's part for an ensemble: loads the step models not loaded yet, then
  // one ensemble ModelVersion per version.
  Status LoadEnsembleStepsLocked(const inference::ModelConfig& config, int depth) REQUIRES(load_mu_)
      EXCLUDES(mu_);
  StatusOr<std::shared_ptr<ModelVersion>> CreateEnsembleVersion(
      const inference::ModelConfig& config, const std::string& dir, int64_t version);
  // Submits one ensemble step to its model; also while the server drains its ensembles.
  std::shared_ptr<RequestHandle> InferStep(InferRequest request, InferCallback callback)
      EXCLUDES(mu_);
  // OK when every step model of the ensemble `config` (and of its nested ensembles) has a
  // ready version; else UNAVAILABLE naming the first that has none.
  Status EnsembleStepsReadyLocked(const inference::ModelConfig& config, int depth) const
      REQUIRES(mu_);
  // GetModel's lookup.
  // `draining`: also while shutting down (ensemble steps of requests being drained).
  StatusOr<std::shared_ptr<ModelVersion>> GetModelLocked(const std::string& name, int64_t version,
                                                         bool draining = false) const REQUIRES(mu_);
  Status UnloadModelLocked(const std::string& name) REQUIRES(load_mu_) EXCLUDES(mu_);

  const ServerOptions options_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<backends::BackendRegistry> registry_;
  std::shared_ptr<ResponseCache> cache_;

  Mutex load_mu_ ACQUIRED_BEFORE(mu_);  // serialises Load/Unload/Poll/Shutdown
  mutable Mutex mu_;
  std::map<std::string, Record> models_ GUARDED_BY(mu_);
  bool shutting_down_ GUARDED_BY(mu_) = false;
  std::vector<std::string> startup_models_;  // set by Open, read by LoadStartupModels
  std::atomic<bool> startup_finished_{false};
  // Set by any model version whose GPU lost its context (ModelVersionOptions::on_device_lost),
  // never cleared; shared with the versions, which may drain after an unload.
  std::shared_ptr<std::atomic<bool>> device_lost_ = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> startup_cancelled_{false};
  // Inference requests accepted and not yet answered (max_inflight_requests).
  std::shared_ptr<std::atomic<int64_t>> inflight_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace shoal::runtime
