// ModelVersion: one loaded version of a model, serving requests.
//
// It joins the pieces of the request path for one version (design.md):
//   Infer ─▶ validate (batch_io) ─▶ ResponseCache (hit / join / lead)
//         ─▶ Batcher (priority queues, timeouts, shape buckets), driven by this
//            version's scheduler thread
//         ─▶ InstancePool (earliest expected finish) ─▶ instance thread:
//            MergeInputs ─▶ BackendInstance::Execute ─▶ ScatterOutputs ─▶ answers
//
// Threads: callers of Infer (any thread); one scheduler thread; one thread per
// instance. Callbacks run on the instance thread that executed the batch, on the
// scheduler thread (timeouts, cancellations), or on the caller's thread (anything
// answered before queueing).
// Lock order: mu_ → the pool's lock. mu_ is never held while running a backend or a
// callback; an instance thread takes it after a batch's answers, to report how late they
// came against admission's predictions.
//
// Create blocks until every instance is created and warmed up: a ModelVersion that
// exists is ready. Shutdown stops accepting (new requests get UNAVAILABLE), runs
// everything queued, waits for every request to be answered, and stops the instances;
// the destructor does the same if Shutdown was not called.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/status.h"
#include "runtime/batch_io.h"
#include "runtime/batcher.h"
#include "runtime/classification.h"
#include "runtime/ensemble.h"
#include "runtime/infer_request.h"
#include "runtime/instance_pool.h"
#include "runtime/model_stats.h"
#include "runtime/request_task.h"
#include "runtime/response_cache.h"

namespace shoal::runtime {

// One warmup run: inputs with their full (batched) shapes, run `count` times.
struct WarmupSample {
  std::string name;
  int64_t batch_size = 1;
  int count = 1;
  std::vector<NamedTensor> inputs;
  // A configured sample must succeed for the version to load. One made up by default
  // (zeros at each batch size, when the config has no model_warmup) need not: a model
  // may refuse zeros as data, and nobody asked for that warmup; its failure is logged
  // as a warning and the remaining default samples are skipped.
  bool required = true;
};

struct ModelVersionOptions {
  std::string name;
  int64_t version = 1;
  ModelSignature signature;
  // max_batch_size 0 here means no dynamic batching (each request runs alone).
  BatcherOptions batching;
  bool preserve_ordering = false;
  std::vector<backends::InstanceInfo> instances;  // at least one
  std::vector<WarmupSample> warmup;               // run on every instance before ready
  RequestLimits limits;
  // The deadline of a request that brings none (microseconds from arrival); 0 = none.
  uint64_t latency_slo_us = 0;
  // Degrading precision under overload: the precision tiers from the default (first) to
  // the cheapest (last), all loaded by the backend (the onnx backend's precision_tiers);
  // empty: none. When the predicted time to drain the queue stays above
  // degrade_above_us for degrade_after_us, requests that do not choose a tier (their
  // `precision` parameter) go to the next cheaper one; when it stays below
  // restore_below_us as long, to the next dearer one. One step per period.
  std::vector<std::string> precision_ladder;
  uint64_t degrade_above_us = 50'000;
  uint64_t restore_below_us = 10'000;
  uint64_t degrade_after_us = 200'000;
  // Non-null enables the response cache for this version (the cache may be shared).
  std::shared_ptr<ResponseCache> cache;
  std::shared_ptr<Clock> clock;  // default: the real clock
  // Class labels of the outputs whose config names a label_filename, read at load
  // (classification extension, runtime/classification.h).
  std::map<std::string, OutputLabels> output_labels;
  // Called once when one of its instances first reports its device's context lost
  // (InstancePool::Options::on_device_lost): the server's, which then stays not live.
  std::function<void()> on_device_lost;
  // Tests only: replaces each request's batch key (ValidatedRequest::shape_key, the
  // argument), so that a test can make requests of different shapes collide.
  std::function<uint64_t(const InferRequest&, uint64_t)> shape_key_for_testing;
};

class ModelVersion : public std::enable_shared_from_this<ModelVersion> {
 public:
  static StatusOr<std::shared_ptr<ModelVersion>> Create(
      ModelVersionOptions options, std::unique_ptr<backends::BackendModel> model);
  // A version of an ensemble model: no backend, no instances, no batcher of its own;
  // requests are validated, cached, counted and answered here as for any model, and run
  // by `ensemble` (runtime/ensemble.h) as requests to the step models. Shutdown waits for
  // every request, then for every step the ensemble submitted.
  static StatusOr<std::shared_ptr<ModelVersion>> CreateEnsemble(ModelVersionOptions options,
                                                                std::unique_ptr<Ensemble> ensemble);
  bool is_ensemble() const { return ensemble_ != nullptr; }
  ~ModelVersion();
  ModelVersion(const ModelVersion&) = delete;
  ModelVersion& operator=(const ModelVersion&) = delete;

  // Answers through `callback` exactly once. Never blocks on inference.
  std::shared_ptr<RequestHandle> Infer(InferRequest request, InferCallback callback);

  // See the class comment. Idempotent; safe from any thread but a callback's.
  void Shutdown();

  const std::string& name() const { return options_.name; }
  // This loaded instance's owner id in the response cache: unique per ModelVersion object,
  // so a reload under the same version number never hits the old model's entries.
  uint64_t cache_owner_id() const { return cache_owner_id_; }
  int64_t version() const { return options_.version; }
  const ModelSignature& signature() const { return options_.signature; }
  const ModelVersionOptions& options() const { return options_; }
  ModelStatsSnapshot stats() const { return stats_.Snapshot(); }
  // Its instances' figures; none once Shutdown has let the pool go. Any thread, at any time
  // (metrics and the dashboard read versions an unload may be shutting down).
  std::vector<InstanceStats> instance_stats() const {
    MutexLock lock(&pool_mu_);
    return pool_ ? pool_->Stats() : std::vector<InstanceStats>{};
  }
  // Whether one of its instances' device has lost its context (its pool's
  // on_device_lost): the server then answers its requests UNAVAILABLE. Any thread, at any
  // time (its own flag, which Shutdown leaves).
  bool device_lost() const { return device_lost_.load(std::memory_order_acquire); }
  // Requests waiting in the batcher.
  size_t queue_depth() const;
  // The share of a request's time budget that admission keeps in reserve now: the
  // configured reserve, or what its predictions have recently run late by when that is
  // more. 0 for an ensemble and under fixed_window.
  double admission_reserve() const;
  // Requests accepted and not yet answered (queued or executing).
  int64_t in_flight() const;
  // The precision ladder's current step (0 = the default tier).
  int precision_tier() const { return tier_.load(std::memory_order_acquire); }

 private:
  using TaskPtr = std::unique_ptr<RequestTask>;
  using Batch = std::vector<TaskPtr>;

  ModelVersion(ModelVersionOptions options, std::unique_ptr<backends::BackendModel> model,
               std::unique_ptr<Batcher<RequestTask>> batcher);
  void SchedulerLoop() EXCLUDES(mu_);
  void Poke() EXCLUDES(mu_);
  // The handle Infer returns; cancelling through it wakes the scheduler to answer the
  // request (it holds only a weak reference to this version).
  std::shared_ptr<RequestControl> NewRequestControl();
  // Infer's step for a model with a response cache (`now`: when the lookup began). Null
  // when the request is done here: answered from the cache, or joined to an identical
  // request in flight (whose waiter then holds the task). On a miss, returns `task` made
  // the cache's leader for its key, for the caller to enqueue.
  TaskPtr AnswerFromCache(TaskPtr task, int64_t now);
  // Hands a cache leader's outcome to its joiners: its result if it ran (`ran`: it reached
  // an instance) and was not cancelled or timed out; otherwise each joiner runs its own
  // request (AnswerFromCache again).
  void CompleteCacheLeader(const RequestTask& leader, bool ran, const Status& status,
                           const std::vector<NamedTensor>& outputs);
  // Infer's last step: queues `task` (received at `now`) in the batcher, or answers it
  // with the reason it was refused (shutting down, queue full, bad priority).
  void Enqueue(TaskPtr task, int64_t now) EXCLUDES(mu_);
  // Enqueue's step for an ensemble: hands `task` to the DAG.
  void RunEnsemble(TaskPtr task, int64_t now) EXCLUDES(mu_);
  // Called by an instance's thread after each job, and for work queued under a
  // DeferDispatch: dispatches what is due, or wakes the scheduler.
  void OnInstanceIdle() EXCLUDES(mu_);
  // While an instance's thread answers the requests of one batch, the requests those
  // answers submit to other models (an ensemble's next steps) are queued there but not
  // dispatched until the last answer is given: the whole batch then reaches the next
  // model's batcher before any of it leaves, and goes on as one batch, instead of its
  // first request leaving alone for an idle instance (one more execution and one more
  // thread wake per batch and step). Scoped to one thread; nests (the outermost wins).
  class DeferDispatch;
  // Dispatches every batch due at `now` to idle instances; returns when the queue next
  // needs the scheduler (a held batch's release, an expiry; max if never).
  int64_t DispatchDue(int64_t now) REQUIRES(mu_);
  // After work was queued or an instance went idle: dispatches what is due on the calling
  // thread; returns true (with poked_ set) if the scheduler must be notified.
  bool DispatchOrWake() REQUIRES(mu_);
  void Dispatch(Batch batch) REQUIRES(mu_);
  // One call of the backend on `requests` merged: their outputs, one list per request, and
  // the times of its merge, execution and scatter (clock ns).
  struct GroupRun {
    Status status;
    std::vector<std::vector<NamedTensor>> per_request;
    int64_t t0 = 0, t1 = 0, t2 = 0, t3 = 0;
  };
  // A batch on its instance, between StartBatch and CompleteBatch.
  struct BatchJob;
  // Runs `batch` on `instance` and answers its requests, in two halves (PoolJob::launch).
  // This one, on the instance's thread, answers at once the requests cancelled or past
  // their deadline since the batch was formed. On an instance that does not pipeline it
  // then runs and answers the rest, and the half it returns gives the items executed. On
  // one that pipelines (BackendInstance::pipeline_depth() > 1) it merges and launches a
  // batch of one shape, and the half it returns finishes the launch, answers and returns
  // the items executed; a batch of several shapes, or one whose launch failed, is run or
  // answered by the half returned (after the batches ahead: their answers never wait for
  // it). `on_done` goes to the backend's Launch, or is called here when nothing was left
  // running; it may be empty (the pool passes none when the instance does not pipeline).
  PoolJob::Finish StartBatch(std::shared_ptr<Batch> batch, backends::BackendInstance& instance,
                             uint64_t seq, std::function<void()> on_done) EXCLUDES(mu_);
  // Runs every group of `job` (`launched`: the first group's run, already made) and
  // answers; returns the items executed. Takes mu_ once, after the answers, to report
  // their overruns to admission.
  int64_t CompleteBatch(BatchJob& job, backends::BackendInstance& instance,
                        std::optional<GroupRun> launched) EXCLUDES(mu_);
  GroupRun RunGroup(const std::vector<const InferRequest*>& requests,
                    const std::vector<int64_t>& sizes, backends::BackendInstance& instance);
  // A run's second part: `outputs` (its status ok) split per request, its error named
  // after the model, t3 set and the execution counted.
  void ScatterRun(GroupRun& run, std::vector<NamedTensor> outputs,
                  const std::vector<const InferRequest*>& requests,
                  const std::vector<int64_t>& sizes);
  // Answers one task; `result` outputs are per request. Handles cache and stats.
  void Answer(TaskPtr task, const Status& status, std::vector<NamedTensor> outputs,
              int64_t queue_ns, int64_t input_ns, int64_t infer_ns, int64_t output_ns);
  // The precision tier that answers `request`: its `precision` parameter, else the
  // ladder's default tier; null when neither says.
  const std::string* TierOf(const InferRequest& request) const;
  // DEADLINE_EXCEEDED for a task dropped unrun at `now`; `where` says at which step.
  Status MissedDeadline(const RequestTask& task, int64_t now, const char* where) const;
  // Answers a request that never became a task (invalid, hit, rejected).
  void AnswerDirect(const InferRequest& request, InferCallback& callback, const Status& status,
                    std::vector<NamedTensor> outputs, bool cache_hit);
  void Release(uint64_t seq, std::vector<std::function<void()>> answers) EXCLUDES(order_mu_);
  Status RunWarmup(backends::BackendInstance& instance, const backends::InstanceInfo& info);

  const ModelVersionOptions options_;
  const uint64_t cache_owner_id_ = ResponseCache::NewOwnerId();
  std::shared_ptr<Clock> clock_;
  std::unique_ptr<backends::BackendModel> model_;
  // Null for an ensemble. The scheduler thread uses it without a lock (Shutdown joins that
  // thread before letting it go); pool_mu_ orders instance_stats() with its release.
  std::unique_ptr<InstancePool> pool_;
  mutable Mutex pool_mu_;
  std::atomic<bool> device_lost_{false};  // device_lost()
  std::unique_ptr<Ensemble> ensemble_;    // null but for an ensemble
  ModelStats stats_;
  int clock_subscription_ = -1;

  mutable Mutex mu_;
  CondVar cv_;       // scheduler wakeups
  CondVar idle_cv_;  // in_flight_ reached 0
  std::unique_ptr<Batcher<RequestTask>> batcher_ GUARDED_BY(mu_);
  bool poked_ GUARDED_BY(mu_) = false;
  bool cancel_pending_ GUARDED_BY(mu_) = false;
  bool accepting_ GUARDED_BY(mu_) = true;
  bool stop_scheduler_ GUARDED_BY(mu_) = false;
  // While the scheduler sleeps: sched_wake_at_ is when it wakes by itself (max: only when
  // poked). Arrivals and idle instances poke it only if it must wake sooner.
  bool sched_sleeping_ GUARDED_BY(mu_) = false;
  int64_t sched_wake_at_ GUARDED_BY(mu_) = std::numeric_limits<int64_t>::max();
  // Requests accepted and not yet answered. Incremented under mu_; decremented without it
  // (once per answer), taking mu_ only to wake Shutdown when it reaches 0.
  std::atomic<int64_t> in_flight_{0};
  uint64_t next_batch_seq_ GUARDED_BY(mu_) = 0;
  // The precision ladder: the step requests go to (read by Infer without the lock), and
  // since when the predicted drain time has been above / below its thresholds (-1: not).
  std::atomic<int> tier_{0};
  int64_t drain_above_since_ns_ GUARDED_BY(mu_) = -1;
  int64_t drain_below_since_ns_ GUARDED_BY(mu_) = -1;
  int64_t last_overload_refusal_ns_ GUARDED_BY(mu_) = -1;
  // Moves the ladder one step when the drain time predicted at `now` has stayed past a
  // threshold long enough.
  // `refused_overload`: the arrival that calls it was just refused for overload.
  void UpdatePrecisionTierLocked(int64_t now, bool refused_overload) REQUIRES(mu_);
  std::thread scheduler_;

  // preserve_ordering: answers of batch `seq` wait until every earlier batch is answered.
  Mutex order_mu_;
  uint64_t next_release_seq_ GUARDED_BY(order_mu_) = 0;
  std::map<uint64_t, std::vector<std::function<void()>>> held_ GUARDED_BY(order_mu_);
};

// The cache key of a request for a loaded model version (`owner`: its cache_owner_id()).
CacheKey MakeCacheKey(const std::string& model, int64_t version, uint64_t owner,
                      const InferRequest& request);

}  // namespace shoal::runtime
