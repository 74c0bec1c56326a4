#include "runtime/model_version.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <limits>

#include "core/thread_util.h"

namespace shoal::runtime {

class ModelVersion::DeferDispatch {
 public:
  DeferDispatch() : outer_(current_ != nullptr) {
    if (!outer_) current_ = this;
  }
  ~DeferDispatch() {
    if (outer_) return;
    current_ = nullptr;
    // Not under any lock: each model takes its own.
    for (auto& [raw, weak] : queued_) {
      if (std::shared_ptr<ModelVersion> mv = weak.lock()) mv->OnInstanceIdle();
    }
  }
  DeferDispatch(const DeferDispatch&) = delete;
  DeferDispatch& operator=(const DeferDispatch&) = delete;

  // The scope in force on this thread, or null.
  static DeferDispatch* Current() { return current_; }
  // Records that `mv` has work queued to dispatch at the end of the scope; false (the
  // caller dispatches now) when `mv` is not owned by a shared_ptr.
  bool Queued(ModelVersion* mv) {
    for (auto& q : queued_) {
      if (q.first != mv) continue;
      if (!q.second.expired()) return true;
      // A model destroyed in this scope, and another created at its address: this one.
      q.second = mv->weak_from_this();
      return !q.second.expired();
    }
    std::weak_ptr<ModelVersion> weak = mv->weak_from_this();
    if (weak.expired()) return false;
    queued_.emplace_back(mv, std::move(weak));
    return true;
  }

 private:
  static thread_local DeferDispatch* current_;
  const bool outer_;
  // Weak: a model may be shut down and destroyed before the scope ends.
  std::vector<std::pair<const ModelVersion*, std::weak_ptr<ModelVersion>>> queued_;
};

thread_local ModelVersion::DeferDispatch* ModelVersion::DeferDispatch::current_ = nullptr;

CacheKey MakeCacheKey(const std::string& model, int64_t version, uint64_t owner,
                      const InferRequest& request) {
  CacheKeyBuilder b(owner);
  b.Add(model).Add(version);
  std::vector<const NamedTensor*> inputs;
  for (const auto& in : request.inputs) inputs.push_back(&in);
  std::sort(inputs.begin(), inputs.end(), [](auto* a, auto* c) { return a->name < c->name; });
  for (const NamedTensor* in : inputs) {
    b.Add(in->name).Add(static_cast<int64_t>(in->tensor.dtype()));
    b.Add(static_cast<int64_t>(in->tensor.shape().size()));
    for (int64_t d : in->tensor.shape()) b.Add(d);
    b.Add(in->tensor.bytes());
  }
  std::vector<std::string> outputs = request.requested_outputs;
  std::sort(outputs.begin(), outputs.end());
  b.Add(static_cast<int64_t>(outputs.size()));
  for (const auto& o : outputs) b.Add(o);
  for (const auto& [key, value] : request.parameters) {
    b.Add(key).Add(static_cast<int64_t>(value.index()));
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) {
            b.Add(v);
          } else if constexpr (std::is_same_v<V, double>) {
            b.Add(std::string_view(reinterpret_cast<const char*>(&v), sizeof(v)));
          } else {
            b.Add(static_cast<int64_t>(v));
          }
        },
        value);
  }
  return b.Finish();
}

ModelVersion::ModelVersion(ModelVersionOptions options,
                           std::unique_ptr<backends::BackendModel> model,
                           std::unique_ptr<Batcher<RequestTask>> batcher)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : Clock::Real()),
      model_(std::move(model)),
      batcher_(std::move(batcher)) {}

StatusOr<std::shared_ptr<ModelVersion>> ModelVersion::Create(
    ModelVersionOptions options, std::unique_ptr<backends::BackendModel> model) {
  if (model == nullptr)
    return InvalidArgument("model version '" + options.name + "' has no backend model");
  if (options.instances.empty()) {
    return InvalidArgument("model version '" + options.name + "' needs at least one instance");
  }
  ASSIGN_OR_RETURN(auto batcher, Batcher<RequestTask>::Create(options.batching));
  std::shared_ptr<ModelVersion> mv(
      new ModelVersion(std::move(options), std::move(model), std::move(batcher)));

  InstancePool::Options pool;
  pool.model = mv->model_.get();
  pool.instances = mv->options_.instances;
  pool.clock = mv->clock_;
  ModelVersion* raw = mv.get();  // the pool is destroyed before *raw
  pool.on_ready = [raw](backends::BackendInstance& inst, const backends::InstanceInfo& info) {
    return raw->RunWarmup(inst, info);
  };
  pool.on_idle = [raw] { raw->OnInstanceIdle(); };
  // Its own flag first (read by the server without a lock, even while this version shuts
  // down), then the server's. The pool is destroyed before *raw.
  pool.on_device_lost = [raw, server = mv->options_.on_device_lost] {
    raw->device_lost_.store(true, std::memory_order_release);
    if (server) server();
  };
  ASSIGN_OR_RETURN(mv->pool_, InstancePool::Create(std::move(pool)));

  if (mv->clock_->is_fake())
    mv->clock_subscription_ = mv->clock_->Subscribe([raw] { raw->Poke(); });
  mv->scheduler_ = std::thread([raw] { raw->SchedulerLoop(); });
  return mv;
}

StatusOr<std::shared_ptr<ModelVersion>> ModelVersion::CreateEnsemble(
    ModelVersionOptions options, std::unique_ptr<Ensemble> ensemble) {
  if (ensemble == nullptr)
    return InvalidArgument("model version '" + options.name + "' has no ensemble");
  options.instances.clear();
  options.warmup.clear();
  options.precision_ladder.clear();
  ASSIGN_OR_RETURN(auto batcher, Batcher<RequestTask>::Create(BatcherOptions{}));
  std::shared_ptr<ModelVersion> mv(
      new ModelVersion(std::move(options), nullptr, std::move(batcher)));
  mv->ensemble_ = std::move(ensemble);
  return mv;
}

ModelVersion::~ModelVersion() { Shutdown(); }

Status ModelVersion::RunWarmup(backends::BackendInstance& instance,
                               const backends::InstanceInfo& info) {
  for (const WarmupSample& sample : options_.warmup) {
    backends::ExecuteRequest req;
    req.batch_size = sample.batch_size;
    req.inputs = sample.inputs;
    for (int i = 0; i < std::max(sample.count, 1); ++i) {
      std::vector<NamedTensor> outputs;
      Status s;
      try {
        s = instance.Execute(req, &outputs);
      } catch (const std::exception& e) {
        s = Internal(std::string("exception: ") + e.what());
      }
      if (s.ok()) continue;
      if (sample.required) return s.WithPrefix("warmup '" + sample.name + "'");
      spdlog::warn(
          "model '{}' instance {}: default warmup '{}' failed, so the model loads "
          "without it (configure model_warmup to choose its inputs): {}",
          options_.name, info.name, sample.name, s.message());
      return Status::Ok();
    }
  }
  return Status::Ok();
}

void ModelVersion::Poke() {
  {
    MutexLock lock(&mu_);
    poked_ = true;
  }
  cv_.Signal();
}

void ModelVersion::OnInstanceIdle() {
  bool wake;
  {
    MutexLock lock(&mu_);
    wake = DispatchOrWake();
  }
  if (wake) cv_.Signal();
}

int64_t ModelVersion::DispatchDue(int64_t now) {
  int64_t wake_at = std::numeric_limits<int64_t>::max();
  while (!batcher_->empty() && pool_->HasIdle()) {
    batcher_->set_service(pool_->Service());
    auto decision = batcher_->FormBatch(now, /*force=*/!accepting_);
    if (decision.batch.empty()) {
      wake_at = decision.wake_at_ns;
      break;
    }
    Dispatch(std::move(decision.batch));
  }
  return std::min(wake_at, batcher_->next_expiry_ns());
}

bool ModelVersion::DispatchOrWake() {
  if (poked_) return false;  // whoever set it wakes the scheduler
  // Waking the scheduler only for it to hand a batch to an instance costs a futex wake and
  // two context switches per batch (per request, when every arrival woke it). So the thread
  // that queued work or finished a job dispatches what is due itself, and wakes the
  // scheduler only when its timer must fire sooner than planned, or for the work only it
  // does: answering expired and cancelled requests, draining.
  const int64_t now = clock_->NowNs();
  if (accepting_ && !stop_scheduler_ && !cancel_pending_ && batcher_->next_expiry_ns() > now) {
    const int64_t wake_at = DispatchDue(now);
    // Not asleep: it re-evaluates everything before it sleeps again.
    if (!sched_sleeping_ || wake_at >= sched_wake_at_) return false;
  }
  poked_ = true;
  return true;
}

std::shared_ptr<RequestControl> ModelVersion::NewRequestControl() {
  std::weak_ptr<ModelVersion> weak = weak_from_this();
  return std::make_shared<RequestControl>([weak] {
    if (auto self = weak.lock()) {
      {
        MutexLock lock(&self->mu_);
        self->cancel_pending_ = true;
        self->poked_ = true;
      }
      self->cv_.Signal();
    }
  });
}

std::shared_ptr<RequestHandle> ModelVersion::Infer(InferRequest request, InferCallback callback) {
  const int64_t now = clock_->NowNs();
  std::shared_ptr<CancelForwarder> forward_cancel;
  std::shared_ptr<RequestControl> control;
  if (ensemble_) {
    forward_cancel = std::make_shared<CancelForwarder>();
    control = std::make_shared<RequestControl>([forward_cancel] { forward_cancel->Cancel(); },
                                               /*notify_while_executing=*/true);
  } else {
    control = NewRequestControl();
  }

  // Requests that do not choose a tier go where the precision ladder stands; the tier is
  // a request parameter, so it enters the batch key and the cache key like a chosen one.
  if (!options_.precision_ladder.empty() && request.parameters.count("precision") == 0) {
    const int tier = tier_.load(std::memory_order_acquire);
    if (tier > 0) request.parameters["precision"] = options_.precision_ladder[tier];
  }
  auto validated = ValidateRequest(options_.signature, request, options_.limits);
  if (!validated.ok()) {
    control->Finish();
    stats_.RecordRejectedInvalid();
    stats_.RecordFailure(clock_->NowNs() - now);
    AnswerDirect(request, callback, validated.status(), {}, false);
    return control;
  }

  if (request.best_effort) {
    request.deadline_ns = 0;
  } else if (request.deadline_ns == 0) {
    uint64_t budget_us = request.timeout_us;
    if (request.client_deadline_us > 0 &&
        (budget_us == 0 || request.client_deadline_us < budget_us))
      budget_us = request.client_deadline_us;
    if (budget_us == 0) budget_us = options_.latency_slo_us;
    if (budget_us > 0) request.deadline_ns = now + static_cast<int64_t>(budget_us) * 1000;
  }

  auto task = std::make_unique<RequestTask>();
  task->items = validated->batch_size;
  task->key = options_.shape_key_for_testing
                  ? options_.shape_key_for_testing(request, validated->shape_key)
                  : validated->shape_key;
  task->received_ns = now;
  task->control = control;
  task->forward_cancel = std::move(forward_cancel);
  task->request = std::move(request);
  task->callback = std::move(callback);
  if (options_.cache) {
    task = AnswerFromCache(std::move(task), now);
    if (task == nullptr) return control;
  }
  Enqueue(std::move(task), now);
  return control;
}

ModelVersion::TaskPtr ModelVersion::AnswerFromCache(TaskPtr task, int64_t now) {
  CacheKey key = MakeCacheKey(options_.name, options_.version, cache_owner_id_, task->request);
  // The task goes into the waiter before the lookup: once joined, the leader may end (and
  // call the waiter) on another thread before Lookup returns here.
  auto held = std::make_shared<TaskPtr>(std::move(task));
  ResponseCache::Waiter waiter = [this, held](bool shared, const Status& status,
                                              const std::vector<NamedTensor>& outputs) {
    TaskPtr joiner = std::move(*held);
    if (!shared) {
      // The leader ended for reasons of its own client (cancelled, timed out, refused):
      // this request runs for itself, as if it had just arrived (or joins another).
      if (TaskPtr t = AnswerFromCache(std::move(joiner), clock_->NowNs()))
        Enqueue(std::move(t), clock_->NowNs());
      return;
    }
    if (!joiner->control->Finish()) return;
    const int64_t e2e = clock_->NowNs() - joiner->received_ns;
    if (status.ok()) {
      stats_.RecordCacheHit(e2e, 0);
    } else {
      stats_.RecordFailure(e2e);
    }
    AnswerDirect(joiner->request, joiner->callback, status,
                 status.ok() ? outputs : std::vector<NamedTensor>{}, status.ok());
  };
  std::vector<NamedTensor> hit;
  const auto outcome = options_.cache->Lookup(key, waiter, &hit);
  const int64_t lookup_ns = clock_->NowNs() - now;
  if (outcome == ResponseCache::Outcome::kJoined) return nullptr;
  task = std::move(*held);
  if (outcome == ResponseCache::Outcome::kHit) {
    task->control->Finish();
    stats_.RecordCacheHit(clock_->NowNs() - task->received_ns, lookup_ns);
    AnswerDirect(task->request, task->callback, Status::Ok(), std::move(hit), true);
    return nullptr;
  }
  stats_.RecordCacheMiss(lookup_ns);
  task->cache_leader = true;
  task->cache_key = std::move(key);
  return task;
}

void ModelVersion::CompleteCacheLeader(const RequestTask& leader, bool ran, const Status& status,
                                       const std::vector<NamedTensor>& outputs) {
  // Only the result of running the request belongs to its content, and so to its joiners.
  // A leader refused at admission, timed out or cancelled (even on the instance, before
  // the merge) ended for its own client's reasons.
  const bool shared = ran && status.code() != StatusCode::kCancelled &&
                      status.code() != StatusCode::kDeadlineExceeded;
  auto waiters = options_.cache->Complete(leader.cache_key, status, outputs);
  for (auto& w : waiters) w(shared, status, outputs);
}

void ModelVersion::RunEnsemble(TaskPtr task, int64_t now) {
  {
    MutexLock lock(&mu_);
    ++in_flight_;
    if (!accepting_) {
      lock.Unlock();
      Answer(std::move(task), Unavailable("model '" + options_.name + "' is shutting down"), {}, 0,
             0, 0, 0);
      return;
    }
  }
  task->control->Transition(RequestState::kReceived, RequestState::kQueued);
  task->control->Transition(RequestState::kQueued, RequestState::kExecuting);
  task->enqueued_ns = now;
  // The DAG takes the inputs; the task keeps what its answer needs (id, deadline, cache key).
  InferRequest request;
  request.id = task->request.id;
  request.inputs = std::move(task->request.inputs);
  request.requested_outputs = task->request.requested_outputs;
  request.priority = task->request.priority;
  request.deadline_ns = task->request.deadline_ns;
  request.best_effort = task->request.best_effort;
  request.timeout_us = task->request.timeout_us;
  request.parameters = task->request.parameters;  // the steps get them (ensemble.h)
  std::shared_ptr<CancelForwarder> forward = task->forward_cancel;
  std::shared_ptr<RequestControl> control = task->control;
  auto held = std::make_shared<TaskPtr>(std::move(task));
  auto handle = ensemble_->Run(std::move(request), [this, held](InferResponse r) {
    TaskPtr t = std::move(*held);
    if (r.status.code() == StatusCode::kCancelled) stats_.RecordCancelled();
    if (r.status.code() == StatusCode::kDeadlineExceeded) stats_.RecordDeadlineMissed();
    const int64_t run_ns = clock_->NowNs() - t->enqueued_ns;
    Answer(std::move(t), r.status, std::move(r.outputs), 0, 0, run_ns, 0);
  });
  if (forward) forward->Set(std::move(handle));
  // A cancel that came before the request executed did not reach the forwarder.
  if (forward && control->cancel_requested()) forward->Cancel();
}

void ModelVersion::Enqueue(TaskPtr task, int64_t now) {
  if (ensemble_) {
    RunEnsemble(std::move(task), now);
    return;
  }
  Status status;
  RejectReason reason = RejectReason::kNone;
  bool wake = false;
  {
    MutexLock lock(&mu_);
    ++in_flight_;
    if (!accepting_) {
      status = Unavailable("model '" + options_.name + "' is shutting down");
    } else {
      task->control->Transition(RequestState::kReceived, RequestState::kQueued);
      task->enqueued_ns = now;
      const bool step = task->request.ensemble_step;  // the batcher takes the task
      batcher_->set_service(pool_->Service());
      status = batcher_->Enqueue(task, now, &reason, &task->predicted_finish_ns);
      if (!options_.precision_ladder.empty())
        UpdatePrecisionTierLocked(now, !status.ok() && reason == RejectReason::kOverload);
      if (status.ok()) {
        // An ensemble step queued by another model's answer loop: dispatched when that
        // loop ends. Anything else is dispatched now, so a callback that submits a
        // request and waits for it does not wait for ever.
        DeferDispatch* defer = step ? DeferDispatch::Current() : nullptr;
        if (defer == nullptr || !defer->Queued(this)) wake = DispatchOrWake();
      }
    }
  }
  if (status.ok()) {
    if (wake) cv_.Signal();
    return;
  }
  if (reason == RejectReason::kQueueFull) stats_.RecordRejectedQueueFull();
  if (reason == RejectReason::kOverload) stats_.RecordRejectedOverload();
  // The batcher refuses a priority outside the model's levels: a request that failed
  // validation against the model, counted as such.
  if (status.code() == StatusCode::kInvalidArgument) stats_.RecordRejectedInvalid();
  Answer(std::move(task), status.WithPrefix("model '" + options_.name + "'"), {}, 0, 0, 0, 0);
}

void ModelVersion::UpdatePrecisionTierLocked(int64_t now, bool refused_overload) {
  const int64_t drain_ns = batcher_->PredictDrainNs();
  const int64_t after_ns = static_cast<int64_t>(options_.degrade_after_us) * 1000;
  const int tier = tier_.load(std::memory_order_relaxed);
  const int last = static_cast<int>(options_.precision_ladder.size()) - 1;
  int next = tier;
  // Refusals for overload are pressure too: a model whose batches take most of the SLO
  // keeps its queue short by refusing, so its drain time swings below the threshold at
  // every dispatch while half the arrivals are turned away.
  if (refused_overload) last_overload_refusal_ns_ = now;
  const bool refusing =
      last_overload_refusal_ns_ >= 0 && now - last_overload_refusal_ns_ <= after_ns / 4;
  if (refusing || drain_ns > static_cast<int64_t>(options_.degrade_above_us) * 1000) {
    drain_below_since_ns_ = -1;
    if (drain_above_since_ns_ < 0) drain_above_since_ns_ = now;
    if (tier < last && now - drain_above_since_ns_ >= after_ns) next = tier + 1;
  } else if (drain_ns < static_cast<int64_t>(options_.restore_below_us) * 1000) {
    drain_above_since_ns_ = -1;
    if (drain_below_since_ns_ < 0) drain_below_since_ns_ = now;
    if (tier > 0 && now - drain_below_since_ns_ >= after_ns) next = tier - 1;
  } else {
    // Between the thresholds: stay (the hysteresis band), and start either count afresh.
    drain_above_since_ns_ = -1;
    drain_below_since_ns_ = -1;
  }
  if (next == tier) return;
  tier_.store(next, std::memory_order_release);
  // A further step needs a further sustained period.
  if (next > tier) drain_above_since_ns_ = now;
  if (next < tier) drain_below_since_ns_ = now;
  stats_.RecordPrecisionSwitch();
  spdlog::info("model '{}' version {}: precision {} -> {} (predicted queue drain {} us)",
               options_.name, options_.version, options_.precision_ladder[tier],
               options_.precision_ladder[next], drain_ns / 1000);
}

const std::string* ModelVersion::TierOf(const InferRequest& request) const {
  auto it = request.parameters.find("precision");
  if (it != request.parameters.end()) return std::get_if<std::string>(&it->second);
  return options_.precision_ladder.empty() ? nullptr : &options_.precision_ladder.front();
}

Status ModelVersion::MissedDeadline(const RequestTask& task, int64_t now, const char* where) const {
  return DeadlineExceeded(
      "model '" + options_.name + "' cannot answer by the request's deadline: " +
      std::to_string(std::max<int64_t>(0, task.request.deadline_ns - now) / 1000) +
      " us were left after " + std::to_string((now - task.received_ns) / 1000) + " us " + where +
      ", and a run takes about " + std::to_string(pool_->PredictNs(task.items) / 1000) +
      " us; it was not run");
}

void ModelVersion::AnswerDirect(const InferRequest& request, InferCallback& callback,
                                const Status& status, std::vector<NamedTensor> outputs,
                                bool cache_hit) {
  InferResponse response;
  response.model_name = options_.name;
  response.model_version = options_.version;
  response.id = request.id;
  response.status = status;
  response.outputs = std::move(outputs);
  response.cache_hit = cache_hit;
  callback(std::move(response));
}

void ModelVersion::Answer(TaskPtr task, const Status& status, std::vector<NamedTensor> outputs,
                          int64_t queue_ns, int64_t input_ns, int64_t infer_ns, int64_t output_ns) {
  const bool ran = task->control->state() == RequestState::kExecuting;  // read before Finish
  if (task->control->Finish()) {
    const int64_t e2e = clock_->NowNs() - task->received_ns;
    if (status.ok()) {
      stats_.RecordSuccess(e2e, queue_ns, input_ns, infer_ns, output_ns);
    } else {
      stats_.RecordFailure(e2e);
    }
    if (task->cache_leader) CompleteCacheLeader(*task, ran, status, outputs);
    InferResponse response;
    response.model_name = options_.name;
    response.model_version = options_.version;
    response.id = task->request.id;
    response.status = status;
    response.outputs = std::move(outputs);
    response.queue_ns = queue_ns;
    response.compute_ns = input_ns + infer_ns + output_ns;
    if (status.ok()) {
      if (const std::string* tier = TierOf(task->request)) {
        response.parameters["precision"] = *tier;
        stats_.RecordPrecision(*tier);
      }
    }
    task->callback(std::move(response));
  }
  task.reset();  // release input tensors before reporting the request gone
  if (in_flight_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    // Shutdown checks in_flight_ under mu_: taking it here means the wake cannot fall
    // between its check and its wait.
    MutexLock lock(&mu_);
    idle_cv_.SignalAll();
  }
}

void ModelVersion::SchedulerLoop() {
  NameCurrentThread("sched:" + options_.name);
  MutexLock lock(&mu_);
  while (true) {
    poked_ = false;
    sched_sleeping_ = false;
    const int64_t now = clock_->NowNs();
    std::vector<Batcher<RequestTask>::Expired> expired = batcher_->TakeExpired(now);
    // A request dropped for its deadline would have been answered at its deadline at the
    // earliest: admission's prediction for it ran at least that late, and leaving it out
    // would hide the worst overruns from the estimate.
    bool observed = false;
    for (const auto& e : expired) {
      if (e.reason != ExpiryReason::kDeadline || e.task->predicted_finish_ns <= 0) continue;
      batcher_->ObserveAnswer(e.task->enqueued_ns, e.task->predicted_finish_ns,
                              e.task->request.deadline_ns,
                              std::max(now, e.task->request.deadline_ns));
      observed = true;
    }
    if (observed) batcher_->RefreshOverrun();
    std::vector<TaskPtr> cancelled;
    if (cancel_pending_) {
      cancel_pending_ = false;
      cancelled =
          batcher_->RemoveIf([](const RequestTask& t) { return t.control->cancel_requested(); });
    }
    const int64_t wake_at = DispatchDue(now);
    if (stop_scheduler_ && batcher_->empty()) break;

    if (!expired.empty() || !cancelled.empty()) {
      lock.Unlock();
      for (auto& e : expired) {
        const int64_t queued_ns = now - e.task->enqueued_ns;
        Status status;
        if (e.reason == ExpiryReason::kDeadline) {
          stats_.RecordDeadlineMissed();
          status = MissedDeadline(*e.task, now, "in its queue");
        } else {
          // The model's queue timeout, not the client's deadline: UNAVAILABLE (retryable),
          // as Triton answers it.
          stats_.RecordTimedOut();
          status = Unavailable("request timed out after " + std::to_string(queued_ns / 1000) +
                               " us in the queue of model '" + options_.name + "'");
        }
        Answer(std::move(e.task), status, {}, queued_ns, 0, 0, 0);
      }
      for (auto& t : cancelled) {
        stats_.RecordCancelled();
        Answer(std::move(t), Cancelled("request cancelled by the client"), {}, 0, 0, 0, 0);
      }
      lock.Lock();
      continue;
    }
    if (poked_) continue;
    sched_wake_at_ = wake_at;
    if (wake_at == std::numeric_limits<int64_t>::max() || clock_->is_fake()) {
      sched_sleeping_ = true;
      while (!poked_) cv_.Wait(&mu_);
    } else {
      const int64_t wait_ns = wake_at - clock_->NowNs();
      if (wait_ns > 0) {
        sched_sleeping_ = true;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
        while (!poked_) {
          if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) break;
        }
      }
    }
  }
}

void ModelVersion::Dispatch(Batch batch) {
  const uint64_t seq = next_batch_seq_++;
  int64_t items = 0;
  for (const auto& t : batch) {
    items += t->items;
    t->control->Transition(RequestState::kQueued, RequestState::kExecuting);
  }
  const int index = pool_->Choose(items);
  auto shared = std::make_shared<Batch>(std::move(batch));
  PoolJob job;
  job.batch_size = items;
  job.launch = [this, shared, seq](backends::BackendInstance& inst, int,
                                   std::function<void()> on_done) {
    return StartBatch(shared, inst, seq, std::move(on_done));
  };
  pool_->Submit(index, std::move(job));
}

struct ModelVersion::BatchJob {
  // The record against its admission of a member that has one (a predicted finish),
  // observed once it is answered (the tasks move into their answers).
  struct Record {
    size_t index;  // in the batch, once the dropped members are gone
    int64_t enqueued_ns, predicted_finish_ns, deadline_ns;
  };
  std::shared_ptr<Batch> batch;  // the members still to run
  uint64_t seq = 0;
  // Members dropped for their deadline before the batch started (answered then), and
  // the records of those left. Without deadlines nothing is allocated.
  std::vector<Record> dropped, records;
  std::vector<const InferRequest*> requests;
  std::vector<int64_t> sizes;
  int64_t items = 0;
  // The batcher grouped the batch by a hash of the shapes; requests whose shapes differ
  // but hash alike are told apart here and run in groups of their true shape.
  std::vector<std::vector<size_t>> groups;
  int64_t t0 = 0;  // when its runs began
  // The instance's setups() when the batch began: if it grew by the end, the batch paid a
  // one-time set-up, and neither the cost model nor admission learns from its time.
  int64_t setups = 0;
};

PoolJob::Finish ModelVersion::StartBatch(std::shared_ptr<Batch> shared,
                                         backends::BackendInstance& instance, uint64_t seq,
                                         std::function<void()> on_done) {
  // On an instance that pipelines, everything but the trimming below happens in the half
  // returned or after the launch: the job lives on the heap, allocated before anything is
  // launched. Otherwise it stays on the stack.
  const bool pipelined = instance.pipeline_depth() > 1;
  std::shared_ptr<BatchJob> held = pipelined ? std::make_shared<BatchJob>() : nullptr;
  BatchJob local;
  BatchJob& job = held ? *held : local;
  job.batch = std::move(shared);
  job.seq = seq;
  Batch& batch = *job.batch;
  // The scheduler removes cancelled requests only while they are queued. A cancel that
  // lands after the batch was formed (or while its flag was set but the scheduler not yet
  // told) still saves the work: such requests leave here, answered, before the merge.
  // Likewise a request whose deadline passed while the batch waited for this instance is
  // answered now, unrun: so one that runs is answered by its deadline plus the batch time
  // (on a pipelining instance, plus what remained of the batch ahead of it on the device,
  // which Choose counted when it was dispatched).
  const int64_t start_ns = clock_->NowNs();
  job.setups = instance.setups();
  size_t kept = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t deadline = batch[i]->request.deadline_ns;
    if (batch[i]->control->cancel_requested()) {
      stats_.RecordCancelled();
      Answer(std::move(batch[i]), Cancelled("request cancelled by the client"), {}, 0, 0, 0, 0);
    } else if (deadline > 0 && start_ns > deadline) {
      stats_.RecordDeadlineMissed();
      if (batch[i]->predicted_finish_ns > 0)
        job.dropped.push_back({0, batch[i]->enqueued_ns, batch[i]->predicted_finish_ns, deadline});
      const Status status = MissedDeadline(*batch[i], start_ns, "before its batch started");
      const int64_t queued_ns = start_ns - batch[i]->enqueued_ns;
      Answer(std::move(batch[i]), status, {}, queued_ns, 0, 0, 0);
    } else if (kept != i) {
      batch[kept++] = std::move(batch[i]);
    } else {
      ++kept;
    }
  }
  batch.resize(kept);
  for (size_t i = 0; i < batch.size(); ++i) {
    const RequestTask& t = *batch[i];
    if (t.predicted_finish_ns > 0)
      job.records.push_back({i, t.enqueued_ns, t.predicted_finish_ns, t.request.deadline_ns});
    job.requests.push_back(&t.request);
    job.sizes.push_back(t.items);
    job.items += t.items;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    auto same =
        std::find_if(job.groups.begin(), job.groups.end(), [&](const std::vector<size_t>& g) {
          return SameBatchShape(options_.signature, *job.requests[g[0]], *job.requests[i]);
        });
    if (same == job.groups.end()) {
      job.groups.push_back({i});
    } else {
      same->push_back(i);
    }
  }
  job.t0 = clock_->NowNs();
  if (!pipelined) {
    const int64_t items = CompleteBatch(job, instance, std::nullopt);
    if (on_done) on_done();
    return [items] { return items; };
  }
  if (!batch.empty() && job.groups.size() == 1) {
    // Launched now, finished by the half returned: the instance's thread launches the next
    // batch meanwhile.
    GroupRun run;
    run.t0 = job.t0;
    auto merged = MergeInputs(options_.signature, job.requests, job.sizes);
    run.t1 = clock_->NowNs();
    run.status = merged.status();
    if (run.status.ok()) {
      try {
        run.status = instance.Launch(*merged, on_done);
      } catch (const std::exception& e) {
        run.status = Internal(std::string("backend threw: ") + e.what());
      } catch (...) {
        run.status = Internal("backend threw a non-standard exception");
      }
    }
    if (run.status.ok()) {
      return [this, held, &instance, run = std::move(run)]() mutable {
        std::vector<NamedTensor> outputs;
        try {
          run.status = instance.Finish(&outputs);
        } catch (const std::exception& e) {
          run.status = Internal(std::string("backend threw: ") + e.what());
        } catch (...) {
          run.status = Internal("backend threw a non-standard exception");
        }
        run.t2 = clock_->NowNs();
        ScatterRun(run, std::move(outputs), held->requests, held->sizes);
        return CompleteBatch(*held, instance, std::move(run));
      };
    }
    // Nothing was launched: answered (or split, for bad data) as a failed run is, in the
    // half returned, after the batches ahead.
    run.t2 = clock_->NowNs();
    ScatterRun(run, {}, held->requests, held->sizes);
    if (on_done) on_done();
    return [this, held, &instance, run = std::move(run)]() mutable {
      return CompleteBatch(*held, instance, std::move(run));
    };
  }
  // Several shapes, or nothing left to run: through Execute, in the half returned, so the
  // answers of the batches ahead do not wait for it (Execute runs after their work).
  if (on_done) on_done();
  return [this, held, &instance] { return CompleteBatch(*held, instance, std::nullopt); };
}

int64_t ModelVersion::CompleteBatch(BatchJob& job, backends::BackendInstance& instance,
                                    std::optional<GroupRun> launched) {
  using Record = BatchJob::Record;
  Batch& batch = *job.batch;
  const uint64_t seq = job.seq;
  // Records the overruns of `rs` (answered at `answered_ns`) and of the dropped members.
  const auto observe = [this, dropped = job.dropped](const std::vector<Record>& rs,
                                                     int64_t answered_ns) {
    if (rs.empty() && dropped.empty()) return;
    MutexLock lock(&mu_);
    for (const Record& r : dropped)
      batcher_->ObserveAnswer(r.enqueued_ns, r.predicted_finish_ns, r.deadline_ns,
                              std::max(answered_ns, r.deadline_ns));
    for (const Record& r : rs)
      batcher_->ObserveAnswer(r.enqueued_ns, r.predicted_finish_ns, r.deadline_ns, answered_ns);
    batcher_->RefreshOverrun();
  };
  if (batch.empty()) {
    if (options_.preserve_ordering) Release(seq, {});
    observe({}, job.t0);
    return 0;
  }
  const int64_t t0 = job.t0;
  // What the answers below submit to other models leaves after the last answer.
  DeferDispatch defer;
  std::vector<GroupRun> runs;
  // Request i's answer is runs[run_of[i]].per_request[slot_of[i]].
  std::vector<size_t> run_of(batch.size()), slot_of(batch.size());
  bool split = job.groups.size() > 1;
  // Runs `group` as one call (or takes `given`, its run already made). When the backend
  // refuses its data (INVALID_ARGUMENT: an index out of range, say) the fault may be one
  // request's: each half is run again (each request, from three down), so that only
  // requests whose own inputs are bad fail, and one bad request among n costs about
  // 2·log2(n) extra runs rather than n.
  // A generic lambda that takes itself: recursive without a std::function's allocation.
  const auto run_group = [&](const auto& self, const std::vector<size_t>& group,
                             GroupRun* given) -> void {
    GroupRun run;
    if (given != nullptr) {
      run = std::move(*given);
    } else {
      std::vector<const InferRequest*> group_requests;
      std::vector<int64_t> group_sizes;
      for (size_t i : group) {
        group_requests.push_back(job.requests[i]);
        group_sizes.push_back(job.sizes[i]);
      }
      run = RunGroup(group_requests, group_sizes, instance);
    }
    if (run.status.code() == StatusCode::kInvalidArgument && group.size() > 1) {
      split = true;
      if (group.size() <= 3) {
        for (size_t i : group) self(self, {i}, nullptr);
        return;
      }
      const auto mid = group.begin() + static_cast<std::ptrdiff_t>(group.size() / 2);
      self(self, std::vector<size_t>(group.begin(), mid), nullptr);
      self(self, std::vector<size_t>(mid, group.end()), nullptr);
      return;
    }
    for (size_t k = 0; k < group.size(); ++k) {
      run_of[group[k]] = runs.size();
      slot_of[group[k]] = k;
    }
    runs.push_back(std::move(run));
  };
  for (size_t g = 0; g < job.groups.size(); ++g)
    run_group(run_group, job.groups[g], g == 0 && launched ? &*launched : nullptr);

  // What a failed run took says nothing of the model's speed: only answers that ran count.
  // Nor does a batch that paid a one-time set-up (a plan prepared for its shapes).
  const bool set_up = instance.setups() != job.setups;
  std::vector<Record> ran;
  for (const Record& r : job.records) {
    if (!set_up && runs[run_of[r.index]].status.ok()) ran.push_back(r);
  }
  if (options_.preserve_ordering) {
    std::vector<std::function<void()>> answers;
    for (size_t i = 0; i < batch.size(); ++i) {
      GroupRun& run = runs[run_of[i]];
      std::vector<NamedTensor> outs =
          run.status.ok() ? std::move(run.per_request[slot_of[i]]) : std::vector<NamedTensor>{};
      const int64_t queue_ns = t0 - batch[i]->enqueued_ns;
      answers.push_back([this, task = std::make_shared<TaskPtr>(std::move(batch[i])),
                         status = run.status, outs = std::move(outs), queue_ns,
                         input_ns = run.t1 - run.t0, infer_ns = run.t2 - run.t1,
                         output_ns = run.t3 - run.t2]() mutable {
        Answer(std::move(*task), status, std::move(outs), queue_ns, input_ns, infer_ns, output_ns);
      });
    }
    // The answers may be held for an earlier batch: observed when they really leave.
    if (!ran.empty() || !job.dropped.empty())
      answers.push_back([this, observe, ran = std::move(ran)] { observe(ran, clock_->NowNs()); });
    Release(seq, std::move(answers));
  } else {
    // Answered in place: no closure and no shared task per request.
    for (size_t i = 0; i < batch.size(); ++i) {
      GroupRun& run = runs[run_of[i]];
      std::vector<NamedTensor> outs =
          run.status.ok() ? std::move(run.per_request[slot_of[i]]) : std::vector<NamedTensor>{};
      const int64_t queue_ns = t0 - batch[i]->enqueued_ns;  // before the task moves
      Answer(std::move(batch[i]), run.status, std::move(outs), queue_ns, run.t1 - run.t0,
             run.t2 - run.t1, run.t3 - run.t2);
    }
  }
  if (!options_.preserve_ordering) observe(ran, clock_->NowNs());
  // After a split the time covers several calls, and a failed run's or a set-up's says
  // nothing of the model's speed: the cost model learns from none of them.
  if (split || set_up) return 0;
  for (const GroupRun& run : runs)
    if (!run.status.ok()) return 0;
  return job.items;
}

ModelVersion::GroupRun ModelVersion::RunGroup(const std::vector<const InferRequest*>& requests,
                                              const std::vector<int64_t>& sizes,
                                              backends::BackendInstance& instance) {
  GroupRun run;
  run.t0 = clock_->NowNs();
  auto merged = MergeInputs(options_.signature, requests, sizes);
  run.t1 = clock_->NowNs();
  std::vector<NamedTensor> outputs;
  run.status = merged.status();
  if (run.status.ok()) {
    try {
      run.status = instance.Execute(*merged, &outputs);
    } catch (const std::exception& e) {
      run.status = Internal(std::string("backend threw: ") + e.what());
    } catch (...) {
      run.status = Internal("backend threw a non-standard exception");
    }
  }
  run.t2 = clock_->NowNs();
  ScatterRun(run, std::move(outputs), requests, sizes);
  return run;
}

void ModelVersion::ScatterRun(GroupRun& run, std::vector<NamedTensor> outputs,
                              const std::vector<const InferRequest*>& requests,
                              const std::vector<int64_t>& sizes) {
  if (run.status.ok()) {
    auto scattered = ScatterOutputs(options_.signature, std::move(outputs), requests, sizes);
    if (scattered.ok()) {
      run.per_request = std::move(scattered).value();
    } else {
      run.status = scattered.status();
    }
  }
  if (!run.status.ok()) {
    run.status = run.status.WithPrefix("model '" + options_.name + "' version " +
                                       std::to_string(options_.version));
  }
  run.t3 = clock_->NowNs();
  if (run.status.ok()) {
    int64_t items = 0;
    for (int64_t n : sizes) items += n;
    stats_.RecordExecution(items, run.t1 - run.t0, run.t2 - run.t1, run.t3 - run.t2);
  }
}

void ModelVersion::Release(uint64_t seq, std::vector<std::function<void()>> answers) {
  MutexLock lock(&order_mu_);
  held_[seq] = std::move(answers);
  while (!held_.empty() && held_.begin()->first == next_release_seq_) {
    auto ready = std::move(held_.begin()->second);
    held_.erase(held_.begin());
    ++next_release_seq_;
    for (auto& a : ready) a();
  }
}

void ModelVersion::Shutdown() {
  if (ensemble_) {
    {
      MutexLock lock(&mu_);
      accepting_ = false;
      while (in_flight_ != 0) idle_cv_.Wait(&mu_);
    }
    ensemble_->Shutdown();  // the steps still in flight of requests already answered
    return;
  }
  {
    MutexLock lock(&mu_);
    if (!scheduler_.joinable()) return;  // never started, or already shut down
    accepting_ = false;
    poked_ = true;
    cv_.Signal();
    while (in_flight_ != 0) idle_cv_.Wait(&mu_);
    stop_scheduler_ = true;
    poked_ = true;
  }
  cv_.Signal();
  scheduler_.join();
  std::unique_ptr<InstancePool> pool;
  {
    MutexLock lock(&pool_mu_);  // not while a reader of instance_stats() holds it
    pool = std::move(pool_);
  }
  pool.reset();  // joins the instance threads, outside the lock
  if (clock_subscription_ >= 0) clock_->Unsubscribe(clock_subscription_);
  clock_subscription_ = -1;
}

size_t ModelVersion::queue_depth() const {
  MutexLock lock(&mu_);
  return batcher_->size();
}

double ModelVersion::admission_reserve() const {
  if (ensemble_) return 0.0;  // its steps admit, each in its own model
  MutexLock lock(&mu_);
  return batcher_ ? batcher_->admission_reserve() : 0.0;
}

int64_t ModelVersion::in_flight() const { return in_flight_.load(std::memory_order_acquire); }

}  // namespace shoal::runtime
