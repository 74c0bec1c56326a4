#include "runtime/ensemble.h"

#include <algorithm>
#include <map>
#include <set>

namespace shoal::runtime {

EnsembleOptions EnsembleOptionsFromConfig(const inference::ModelConfig& config) {
  EnsembleOptions o;
  o.name = config.name();
  for (const auto& in : config.input()) o.inputs.push_back(in.name());
  for (const auto& out : config.output()) o.outputs.push_back(out.name());
  for (const auto& s : config.ensemble_scheduling().step()) {
    EnsembleStep step;
    step.model_name = s.model_name();
    // protobuf's default 0 means the latest, as -1 does (model_config.proto).
    step.model_version = s.model_version() > 0 ? s.model_version() : -1;
    step.input_map.assign(s.input_map().begin(), s.input_map().end());
    step.output_map.assign(s.output_map().begin(), s.output_map().end());
    std::sort(step.input_map.begin(), step.input_map.end());
    std::sort(step.output_map.begin(), step.output_map.end());
    o.steps.push_back(std::move(step));
  }
  return o;
}

// One request's walk through the DAG. Guarded by `mu`; see the class comment.
struct Ensemble::RunState final : RequestHandle {
  enum class StepState : char { kIdle, kSubmitted, kAnswered };

  Ensemble* owner = nullptr;  // outlives the run: Shutdown waits for every run
  Mutex mu;
  InferRequest request;  // its inputs moved into `tensors`
  InferCallback done GUARDED_BY(mu);
  // By tensor id: the tensor once it exists; `have`: 0 missing, 1 present, 2 an optional
  // ensemble input the client left out (the steps that read it get no such input).
  std::vector<Tensor> tensors GUARDED_BY(mu);
  std::vector<char> have GUARDED_BY(mu);
  // By step: feeds a requested output. Set before any step runs; points at the
  // ensemble's own table when the request asks for every output (most do), else at
  // own_needed. Likewise `wanted`: the tensor ids to answer, in answer order.
  const std::vector<char>* needed = nullptr;
  const std::vector<int>* wanted = nullptr;
  std::vector<char> own_needed;
  std::vector<int> own_wanted;
  std::vector<int> waiting GUARDED_BY(mu);  // by step: tensors it reads that are missing
  std::vector<StepState> state GUARDED_BY(mu);
  std::vector<std::shared_ptr<RequestHandle>> handles GUARDED_BY(mu);  // steps in flight
  int missing_outputs GUARDED_BY(mu) = 0;                              // of `wanted`
  int outstanding GUARDED_BY(mu) = 0;    // steps submitted (or being) and not answered
  bool finished GUARDED_BY(mu) = false;  // `done` was taken

  // Takes `done` (the caller calls it after unlocking) and the handles of the steps in
  // flight (the caller cancels them).
  InferCallback FinishLocked(std::vector<std::shared_ptr<RequestHandle>>* to_cancel) REQUIRES(mu) {
    finished = true;
    std::vector<Tensor>().swap(tensors);  // a handle kept by the client keeps no data alive
    for (auto& h : handles) {
      if (h) to_cancel->push_back(std::move(h));
    }
    return std::move(done);
  }

  void Cancel() override {
    std::vector<std::shared_ptr<RequestHandle>> to_cancel;
    InferCallback callback;
    bool over = false;
    {
      MutexLock lock(&mu);
      if (finished) return;
      callback = FinishLocked(&to_cancel);
      over = outstanding == 0;
    }
    for (auto& h : to_cancel) h->Cancel();
    InferResponse r;
    r.status = Cancelled("request cancelled by the client");
    callback(std::move(r));
    if (over) owner->RunOver();
  }
};

Ensemble::Ensemble(EnsembleOptions options)
    : options_(std::move(options)), clock_(options_.clock ? options_.clock : Clock::Real()) {}

StatusOr<std::unique_ptr<Ensemble>> Ensemble::Create(EnsembleOptions options) {
  if (!options.step_infer)
    return InvalidArgument("ensemble '" + options.name + "' has no way to run its steps");
  if (options.steps.empty()) return InvalidArgument("ensemble '" + options.name + "' has no steps");
  std::unique_ptr<Ensemble> e(new Ensemble(std::move(options)));
  const EnsembleOptions& o = e->options_;
  std::map<std::string, int> ids;
  auto id_of = [&](const std::string& name) {
    auto [it, added] = ids.emplace(name, static_cast<int>(ids.size()));
    if (added) {
      e->tensor_names_.push_back(name);
      e->producer_.push_back(-2);  // -2: no source yet
      e->readers_.emplace_back();
    }
    return it->second;
  };
  for (const auto& in : o.inputs) e->producer_[id_of(in)] = -1;
  const int steps = static_cast<int>(o.steps.size());
  e->step_inputs_.resize(steps);
  e->step_outputs_.resize(steps);
  e->input_map_ids_.resize(steps);
  e->reads_.resize(steps);
  const std::string where = "ensemble '" + o.name + "' ";
  for (int s = 0; s < steps; ++s) {
    std::set<int> reads;
    for (const auto& [model_input, tensor] : o.steps[s].input_map) reads.insert(id_of(tensor));
    for (const auto& [model_input, tensor] : o.steps[s].input_map)
      e->input_map_ids_[s].push_back(id_of(tensor));
    for (int t : reads) e->readers_[t].push_back(s);
    e->step_inputs_[s].assign(reads.begin(), reads.end());
    e->reads_[s] = static_cast<int>(reads.size());
    for (const auto& [model_output, tensor] : o.steps[s].output_map) {
      const int t = id_of(tensor);
      if (e->producer_[t] != -2) {
        return InvalidArgument(where + "tensor '" + tensor + "' has more than one source");
      }
      e->producer_[t] = s;
      e->step_outputs_[s].push_back(t);
    }
  }
  for (size_t t = 0; t < e->producer_.size(); ++t) {
    if (e->producer_[t] == -2) {
      return InvalidArgument(where + "tensor '" + e->tensor_names_[t] +
                             "' is neither an input nor produced by a step");
    }
  }
  for (const auto& out : o.outputs) {
    if (ids.count(out) == 0 || e->producer_[ids[out]] < 0)
      return InvalidArgument(where + "output '" + out + "' is produced by no step");
  }
  // Acyclic: Kahn's walk from the inputs must reach every step.
  std::vector<int> waiting = e->reads_;
  std::vector<int> ready;
  for (int s = 0; s < steps; ++s) {
    waiting[s] = 0;
    for (int t : e->step_inputs_[s]) waiting[s] += e->producer_[t] >= 0 ? 1 : 0;
    if (waiting[s] == 0) ready.push_back(s);
  }
  int reached = 0;
  while (!ready.empty()) {
    const int s = ready.back();
    ready.pop_back();
    ++reached;
    for (int t : e->step_outputs_[s]) {
      for (int r : e->readers_[t]) {
        if (--waiting[r] == 0) ready.push_back(r);
      }
    }
  }
  if (reached != steps) return InvalidArgument(where + "steps form a cycle");
  for (const auto& out : o.outputs) e->all_wanted_.push_back(ids[out]);
  e->all_needed_ = e->NeededSteps(e->all_wanted_);
  return e;
}

Ensemble::~Ensemble() { Shutdown(); }

std::vector<char> Ensemble::NeededSteps(const std::vector<int>& wanted) const {
  std::vector<char> needed(options_.steps.size(), 0);
  std::vector<int> work = wanted;
  while (!work.empty()) {
    const int t = work.back();
    work.pop_back();
    const int s = producer_[t];
    if (s < 0 || needed[s]) continue;
    needed[s] = 1;
    work.insert(work.end(), step_inputs_[s].begin(), step_inputs_[s].end());
  }
  return needed;
}

void Ensemble::Shutdown() {
  MutexLock lock(&mu_);
  accepting_ = false;
  while (live_runs_ > 0) idle_cv_.Wait(&mu_);
}

int64_t Ensemble::live_runs() const {
  MutexLock lock(&mu_);
  return live_runs_;
}

void Ensemble::RunOver() {
  MutexLock lock(&mu_);
  if (--live_runs_ == 0) idle_cv_.SignalAll();
}

std::shared_ptr<RequestHandle> Ensemble::Run(InferRequest request, InferCallback done) {
  auto fail_now = [&](const Status& s) {
    InferResponse r;
    r.status = s;
    done(std::move(r));
    struct Noop : RequestHandle {
      void Cancel() override {}
    };
    return std::make_shared<Noop>();
  };
  const int tensors = static_cast<int>(tensor_names_.size());
  const int steps = static_cast<int>(options_.steps.size());
  auto run = std::make_shared<RunState>();
  run->owner = this;
  std::vector<int> ready;
  {
    MutexLock lock(&run->mu);  // nobody else sees the run yet; the lock is for the analysis
    run->tensors.resize(tensors);
    run->have.assign(tensors, 0);
    for (int t = 0; t < tensors; ++t) {
      if (producer_[t] == -1) run->have[t] = 2;  // an input the client may have left out
    }
    for (auto& in : request.inputs) {
      auto it = std::find(tensor_names_.begin(), tensor_names_.end(), in.name);
      if (it == tensor_names_.end() || producer_[it - tensor_names_.begin()] != -1) {
        return fail_now(
            InvalidArgument("ensemble '" + options_.name + "' has no input '" + in.name + "'"));
      }
      const auto t = it - tensor_names_.begin();
      run->tensors[t] = std::move(in.tensor);
      run->have[t] = 1;
    }
    request.inputs.clear();
    if (request.requested_outputs.empty()) {
      run->wanted = &all_wanted_;
      run->needed = &all_needed_;
    } else {
      for (const auto& name : request.requested_outputs) {
        auto it = std::find(options_.outputs.begin(), options_.outputs.end(), name);
        if (it == options_.outputs.end()) {
          return fail_now(
              InvalidArgument("ensemble '" + options_.name + "' has no output '" + name + "'"));
        }
        run->own_wanted.push_back(static_cast<int>(
            std::find(tensor_names_.begin(), tensor_names_.end(), name) - tensor_names_.begin()));
      }
      run->own_needed = NeededSteps(run->own_wanted);
      run->wanted = &run->own_wanted;
      run->needed = &run->own_needed;
    }
    run->missing_outputs = static_cast<int>(run->wanted->size());
    run->waiting.assign(steps, 0);
    run->state.assign(steps, RunState::StepState::kIdle);
    run->handles.resize(steps);
    for (int s = 0; s < steps; ++s) {
      for (int t : step_inputs_[s]) run->waiting[s] += run->have[t] == 0 ? 1 : 0;
      if ((*run->needed)[s] && run->waiting[s] == 0) ready.push_back(s);
    }
    run->outstanding = static_cast<int>(ready.size());
    run->done = std::move(done);
    run->request = std::move(request);
  }
  bool refused = false;
  {
    MutexLock lock(&mu_);
    refused = !accepting_;
    if (accepting_) {
      ++live_runs_;
    } else {
      MutexLock run_lock(&run->mu);
      done = std::move(run->done);
      run->finished = true;
    }
  }
  if (refused) {
    return fail_now(Unavailable("ensemble '" + options_.name + "' is shutting down"));
  }
  Submit(run, std::move(ready));
  return run;
}

void Ensemble::Submit(const std::shared_ptr<RunState>& run, std::vector<int> steps) {
  for (int s : steps) {
    const EnsembleStep& step = options_.steps[s];
    InferRequest r;
    Status refuse;
    {
      MutexLock lock(&run->mu);
      run->state[s] = RunState::StepState::kSubmitted;
      const int64_t deadline = run->request.deadline_ns;
      if (run->finished) {
        refuse = Cancelled("the ensemble request is over");
      } else if (deadline > 0 && clock_->NowNs() > deadline) {
        refuse = DeadlineExceeded(
            "ensemble '" + options_.name + "': the request's deadline passed before its step " +
            std::to_string(s) + " (model '" + step.model_name + "') could start; it was not run");
      } else {
        r.model_name = step.model_name;
        r.model_version = step.model_version;
        r.id = run->request.id;
        r.priority = run->request.priority;
        r.deadline_ns = deadline;
        r.best_effort = run->request.best_effort;
        r.ensemble_step = true;  // may wait for the end of the answer loop submitting it
        // As Triton: every step gets the request's parameters (`precision` and the
        // like) and its timeout (the step's queue-timeout override; the absolute
        // deadline above is what bounds the whole request).
        r.parameters = run->request.parameters;
        r.timeout_us = run->request.timeout_us;
        r.inputs.reserve(step.input_map.size());
        for (size_t k = 0; k < step.input_map.size(); ++k) {
          const int t = input_map_ids_[s][k];
          // The tensor itself: a new handle on the same buffer, never a copy of its bytes.
          if (run->have[t] == 1) r.inputs.push_back({step.input_map[k].first, run->tensors[t]});
        }
        r.requested_outputs.reserve(step.output_map.size());
        for (const auto& [model_output, tensor] : step.output_map)
          r.requested_outputs.push_back(model_output);
      }
    }
    if (!refuse.ok()) {
      InferResponse response;
      response.status = refuse;
      OnStepAnswer(run, s, std::move(response));
      continue;
    }
    std::shared_ptr<RequestHandle> handle = options_.step_infer(
        std::move(r),
        [this, run, s](InferResponse response) { OnStepAnswer(run, s, std::move(response)); });
    bool cancel = false;
    {
      MutexLock lock(&run->mu);
      if (run->state[s] == RunState::StepState::kSubmitted) {
        if (run->finished) {
          cancel = true;
        } else {
          run->handles[s] = handle;
        }
      }
    }
    if (cancel && handle) handle->Cancel();
  }
}

void Ensemble::OnStepAnswer(const std::shared_ptr<RunState>& run, int s, InferResponse response) {
  const EnsembleStep& step = options_.steps[s];
  std::vector<int> next;
  std::vector<std::shared_ptr<RequestHandle>> to_cancel;
  InferCallback callback;
  InferResponse answer;
  bool over = false;
  {
    MutexLock lock(&run->mu);
    run->state[s] = RunState::StepState::kAnswered;
    run->handles[s].reset();
    --run->outstanding;
    if (!run->finished) {
      Status status = response.status;
      if (status.ok()) {
        for (size_t k = 0; k < step.output_map.size(); ++k) {
          const std::string& model_output = step.output_map[k].first;
          auto it = std::find_if(response.outputs.begin(), response.outputs.end(),
                                 [&](const NamedTensor& o) { return o.name == model_output; });
          if (it == response.outputs.end()) {
            status = Internal("returned no output '" + model_output + "'");
            break;
          }
          const int t = step_outputs_[s][k];  // output_map[k]'s tensor
          run->tensors[t] = std::move(it->tensor);
          run->have[t] = 1;
          if (std::find(run->wanted->begin(), run->wanted->end(), t) != run->wanted->end())
            --run->missing_outputs;
          for (int reader : readers_[t]) {
            if (--run->waiting[reader] == 0 && (*run->needed)[reader]) next.push_back(reader);
          }
        }
      }
      if (!status.ok()) {
        next.clear();
        answer.status = status.WithPrefix("ensemble '" + options_.name + "' step " +
                                          std::to_string(s) + " (model '" + step.model_name + "')");
        callback = run->FinishLocked(&to_cancel);
      } else if (run->missing_outputs == 0) {
        answer.outputs.reserve(run->wanted->size());
        for (int t : *run->wanted) answer.outputs.push_back({tensor_names_[t], run->tensors[t]});
        callback = run->FinishLocked(&to_cancel);
      }
      run->outstanding += static_cast<int>(next.size());
    }
    over = run->finished && run->outstanding == 0;
  }
  for (auto& h : to_cancel) h->Cancel();
  if (callback) callback(std::move(answer));
  if (!next.empty()) Submit(run, std::move(next));
  if (over) RunOver();
}

}  // namespace shoal::runtime
