// Ensemble: runs one request to an ensemble model (Triton's `platform: "ensemble"`) as a
// DAG of steps, each step an ordinary request to an ordinary model.
//
// Use it through ModelVersion (ModelVersion::CreateEnsemble), which validates the request
// against the ensemble's own inputs and outputs, sets its deadline, keeps its statistics
// and answers it; this class only runs the DAG.
//
// The DAG is the ensemble_scheduling of the config, exactly as Triton reads it: a step's
// input_map maps each input of the step's model to the ensemble tensor that feeds it, its
// output_map each output of the step's model to the ensemble tensor it produces. A step
// is submitted as soon as every tensor it reads exists, so independent branches run
// concurrently; the answer goes out as soon as every requested ensemble output exists.
// Only the steps that the requested outputs need are run.
//
// Every step goes through `step_infer` (in a server: the step model's ModelVersion::Infer),
// so it meets other clients' requests in that model's batcher, on its instances, and is
// counted in its statistics. Tensors pass by shared ownership: a step's input is the very
// tensor (buffer) an earlier step produced or the client sent, and the ensemble's outputs
// are the producing steps' output tensors; the DAG copies no tensor data.
//
// One request, one deadline, one priority, one cancellation: each step carries the
// request's absolute deadline and priority (so its model drops it unrun once the
// deadline passed), no step starts after the deadline or a cancel, and a cancel reaches
// the steps in flight. Each step also gets the request's parameters (`precision`...)
// and `timeout_us`, as Triton forwards them to its composing models. The first step that fails
// fails the request, with its status code (a step's RESOURCE_EXHAUSTED refusal keeps its
// Retry-After) and a message naming the step and its model; the steps still in flight are cancelled
// and their answers dropped. Backpressure is the step models' own bounded queues: a full queue
// refuses the step, which fails the request at once; nothing here queues.
//
// Threads: Run from any thread; step answers arrive on the step models' threads (or on
// the thread that submitted the step, when it is answered before being queued); the
// next steps are submitted from there. `done` runs exactly once on one of those threads.
// A run's state is guarded by its own mutex, which is never held while calling a step
// model or `done`.
//
// Lifetime: Shutdown (and the destructor) refuse new runs and wait until every run is
// over: answered, and every step it submitted answered. `step_infer` must stay callable
// until then.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/mutex.h"
#include "core/status.h"
#include "repository/model_config.pb.h"
#include "runtime/infer_request.h"

namespace shoal::runtime {

struct EnsembleStep {
  std::string model_name;
  int64_t model_version = -1;  // -1: the latest ready version
  // (step model's input, ensemble tensor), sorted by the first.
  std::vector<std::pair<std::string, std::string>> input_map;
  // (step model's output, ensemble tensor), sorted by the first.
  std::vector<std::pair<std::string, std::string>> output_map;
};

// Submits one step's request to its model; answers through the callback exactly once
// (Server passes the model's ModelVersion::Infer, an unknown or unready model answered
// at once with its status).
using StepInfer = std::function<std::shared_ptr<RequestHandle>(InferRequest, InferCallback)>;

struct EnsembleOptions {
  std::string name;  // the ensemble model's name, for messages
  std::vector<EnsembleStep> steps;
  std::vector<std::string> inputs;   // the ensemble's input tensors
  std::vector<std::string> outputs;  // the ensemble's output tensors
  StepInfer step_infer;              // required
  std::shared_ptr<Clock> clock;      // default: the real clock; read for the deadline
};

// The steps of a validated ensemble config (repository::ValidateModelConfig checked
// that every tensor has one source and that the steps are acyclic).
EnsembleOptions EnsembleOptionsFromConfig(const inference::ModelConfig& config);

class Ensemble {
 public:
  // INVALID_ARGUMENT when the steps do not form a DAG whose sources are the inputs and
  // which produces every output (a config that validated always does).
  static StatusOr<std::unique_ptr<Ensemble>> Create(EnsembleOptions options);
  ~Ensemble();
  Ensemble(const Ensemble&) = delete;
  Ensemble& operator=(const Ensemble&) = delete;

  // Runs `request` (already validated against the ensemble's inputs, deadline_ns set
  // when it has one) and answers `done` exactly once with the requested outputs (all
  // outputs when requested_outputs is empty), named as the ensemble names them. The
  // handle cancels it. After Shutdown, answers UNAVAILABLE at once.
  std::shared_ptr<RequestHandle> Run(InferRequest request, InferCallback done);

  // See the class comment. Idempotent. Never call it from a step's or `done`'s thread.
  void Shutdown();

  // Runs not yet over (answered, or with a step still in flight).
  int64_t live_runs() const;

 private:
  struct RunState;
  explicit Ensemble(EnsembleOptions options);
  // Submits `steps` of `run` one after another (outside its lock).
  void Submit(const std::shared_ptr<RunState>& run, std::vector<int> steps);
  void OnStepAnswer(const std::shared_ptr<RunState>& run, int step, InferResponse response);
  // Decrements live_runs_ once per run.
  void RunOver();
  // By step: whether it feeds one of the tensors `wanted` (only those steps run).
  std::vector<char> NeededSteps(const std::vector<int>& wanted) const;

  const EnsembleOptions options_;
  std::shared_ptr<Clock> clock_;
  // For each ensemble tensor, the steps that read it; for each step, how many distinct
  // tensors it reads; for each tensor, the step that produces it (-1: an input).
  std::vector<std::vector<int>> readers_;        // indexed by tensor id
  std::vector<int> reads_;                       // indexed by step
  std::vector<int> producer_;                    // indexed by tensor id
  std::vector<std::string> tensor_names_;        // tensor id -> name
  std::vector<std::vector<int>> step_inputs_;    // step -> tensor ids it reads
  std::vector<std::vector<int>> step_outputs_;   // step -> tensor ids it writes, by output_map
  std::vector<std::vector<int>> input_map_ids_;  // step -> tensor id of each input_map entry
  // For a request that asks for every output: the tensor ids to answer and the steps to run.
  std::vector<int> all_wanted_;
  std::vector<char> all_needed_;

  mutable Mutex mu_;
  CondVar idle_cv_;
  bool accepting_ GUARDED_BY(mu_) = true;
  int64_t live_runs_ GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::runtime
