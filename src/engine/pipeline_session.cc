#include "engine/pipeline_session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "core/thread_util.h"

namespace shoal::engine {

MicroBatchTuner::MicroBatchTuner(int stages, int explore_every, double margin)
    : stages_(std::max(1, stages)), explore_every_(std::max(2, explore_every)), margin_(margin) {}

MicroBatchTuner::PerBatch& MicroBatchTuner::StateLocked(int64_t batch) const {
  auto [it, added] = state_.try_emplace(batch);
  if (added) it->second.current = static_cast<int>(std::clamp<int64_t>(2 * stages_, 1, batch));
  return it->second;
}

int MicroBatchTuner::Choose(int64_t batch) {
  if (batch <= 1) return 1;
  MutexLock lock(&mu_);
  PerBatch& s = StateLocked(batch);
  ++s.runs;
  if (s.runs % explore_every_ != 0) return s.current;
  // Explore a neighbour, alternating up and down; skip one outside 1..batch.
  for (int tries = 0; tries < 2; ++tries) {
    const int next = s.current + (s.explore_up ? 1 : -1);
    s.explore_up = !s.explore_up;
    if (next >= 1 && next <= batch) return next;
  }
  return s.current;
}

void MicroBatchTuner::Observe(int64_t batch, int micro_batches, double seconds) {
  if (batch <= 1 || micro_batches < 1 || !(seconds >= 0)) return;
  MutexLock lock(&mu_);
  PerBatch& s = StateLocked(batch);
  auto [it, added] = s.avg_seconds.try_emplace(micro_batches, seconds);
  if (!added) it->second = 0.75 * it->second + 0.25 * seconds;
  // Move to the fastest count measured next to the current one.
  const auto cur = s.avg_seconds.find(s.current);
  if (cur == s.avg_seconds.end()) return;
  int best = s.current;
  double best_s = cur->second * (1 - margin_);
  for (int n : {s.current - 1, s.current + 1}) {
    auto m = s.avg_seconds.find(n);
    if (m != s.avg_seconds.end() && m->second < best_s) {
      best = n;
      best_s = m->second;
    }
  }
  s.current = best;
}

int MicroBatchTuner::Current(int64_t batch) const {
  if (batch <= 1) return 1;
  MutexLock lock(&mu_);
  return StateLocked(batch).current;
}

std::vector<std::vector<int>> SplitCores(const std::vector<int>& cores, int stages) {
  std::vector<std::vector<int>> out(static_cast<size_t>(std::max(stages, 0)));
  if (cores.empty() || stages < 1) return out;
  const size_t n = cores.size();
  const size_t k = static_cast<size_t>(stages);
  if (n < k) {
    for (size_t s = 0; s < k; ++s) out[s] = {cores[s % n]};
    return out;
  }
  size_t next = 0;
  for (size_t s = 0; s < k; ++s) {
    const size_t take = n / k + (s < n % k ? 1 : 0);
    for (size_t i = 0; i < take; ++i) out[s].push_back(cores[next++]);
  }
  return out;
}

PipelineSession::PipelineSession(const Model& whole, const ModelStages& stages,
                                 const PipelineOptions& options)
    : whole_(whole),
      stages_(stages),
      options_(options),
      tuner_(static_cast<int>(stages.models.size())) {}

PipelineSession::~PipelineSession() { pipeline_.reset(); }

StatusOr<std::unique_ptr<PipelineSession>> PipelineSession::Create(const Model& whole,
                                                                   const ModelStages& stages,
                                                                   const PipelineOptions& options) {
  const int k = static_cast<int>(stages.models.size());
  if (k < 1) return InvalidArgument("a pipeline needs at least one stage");
  if (options.micro_batches < 0) {
    return InvalidArgument("pipeline micro-batches must be >= 0; was " +
                           std::to_string(options.micro_batches));
  }
  if (options.threads_per_stage < 0) {
    return InvalidArgument("pipeline threads per stage must be >= 0; was " +
                           std::to_string(options.threads_per_stage));
  }
  if (!options.stage_cores.empty() && static_cast<int>(options.stage_cores.size()) != k) {
    return InvalidArgument("stage_cores has " + std::to_string(options.stage_cores.size()) +
                           " entries for " + std::to_string(k) + " stages");
  }
  std::unique_ptr<PipelineSession> p(new PipelineSession(whole, stages, options));
  p->sessions_.resize(static_cast<size_t>(k));
  StagePipeline::Options po;
  po.stages = k;
  po.queue_capacity = options.queue_capacity;
  po.thread_name = "pipe";
  const int cpus = AvailableCpuCount();
  PipelineSession* raw = p.get();
  auto init = [raw, k, cpus](int s) -> Status {
    SessionOptions so = raw->options_.session;
    so.cpu_cores.clear();
    if (!raw->options_.stage_cores.empty())
      so.cpu_cores = raw->options_.stage_cores[static_cast<size_t>(s)];
    so.threads = raw->options_.threads_per_stage > 0 ? raw->options_.threads_per_stage
                 : !so.cpu_cores.empty()             ? static_cast<int>(so.cpu_cores.size())
                                                     : std::max(1, cpus / k);
    RETURN_IF_ERROR(PinCurrentThread(so.cpu_cores));
    ASSIGN_OR_RETURN(raw->sessions_[static_cast<size_t>(s)],
                     Session::Create(*raw->stages_.models[static_cast<size_t>(s)], so));
    return Status::Ok();
  };
  auto run = [raw](int s, MicroBatch* item) { return raw->RunStage(s, item); };
  ASSIGN_OR_RETURN(p->pipeline_, StagePipeline::Create(po, init, run));
  return p;
}

Status PipelineSession::RunStage(int stage, MicroBatch* item) {
  const Model& model = *stages_.models[static_cast<size_t>(stage)];
  std::vector<NamedTensor> inputs;
  for (const TensorInfo& info : model.inputs()) {
    auto it = item->tensors.find(info.name);
    if (it == item->tensors.end())
      return Internal("pipeline stage " + std::to_string(stage + 1) + " misses '" + info.name +
                      "'");
    inputs.push_back(NamedTensor{info.name, it->second});
  }
  std::vector<NamedTensor> outputs;
  Status s;
  try {
    s = sessions_[static_cast<size_t>(stage)]->Run(inputs, &outputs);
  } catch (const std::exception& e) {
    s = Internal(e.what());
  }
  if (!s.ok()) {
    return s.WithPrefix("pipeline stage " + std::to_string(stage + 1) + " of " +
                        std::to_string(stages()));
  }
  for (NamedTensor& o : outputs) item->tensors[o.name] = std::move(o.tensor);
  return Status::Ok();
}

int PipelineSession::last_micro_batches() const {
  MutexLock lock(&mu_);
  return last_micro_batches_;
}

namespace {

// Rows of `parts` (each [n_i, ...], same dtype and trailing dims) one after another.
StatusOr<Tensor> JoinRows(const std::vector<const Tensor*>& parts) {
  Shape shape = parts[0]->shape();
  if (shape.empty()) return Internal("a pipeline output has no batch dimension to join on");
  int64_t rows = 0;
  size_t bytes = 0;
  for (const Tensor* t : parts) {
    if (t->dtype() != parts[0]->dtype() || t->shape().size() != shape.size() ||
        !std::equal(t->shape().begin() + 1, t->shape().end(), shape.begin() + 1)) {
      return Internal("micro-batch outputs differ in type or trailing dimensions");
    }
    rows += t->shape()[0];
    bytes += t->byte_size();
  }
  shape[0] = rows;
  Tensor out = Tensor::AllocateUninitialized(parts[0]->dtype(), shape, bytes);
  char* dst = static_cast<char*>(out.mutable_data());
  for (const Tensor* t : parts) {
    if (t->byte_size() > 0) std::memcpy(dst, t->data(), t->byte_size());
    dst += t->byte_size();
  }
  return out;
}

}  // namespace

Status PipelineSession::Run(const std::vector<NamedTensor>& inputs,
                            std::vector<NamedTensor>* outputs) {
  // Inputs in the model's order; the batch is their common first dimension.
  std::vector<const NamedTensor*> ordered;
  for (const TensorInfo& info : whole_.inputs()) {
    const NamedTensor* found = nullptr;
    for (const NamedTensor& in : inputs)
      if (in.name == info.name) found = &in;
    if (!found) return InvalidArgument("input '" + info.name + "' is missing");
    ordered.push_back(found);
  }
  if (inputs.size() != ordered.size()) {
    for (const NamedTensor& in : inputs) {
      bool known = false;
      for (const TensorInfo& info : whole_.inputs()) known |= info.name == in.name;
      if (!known) return InvalidArgument("the model has no input named '" + in.name + "'");
    }
    return InvalidArgument("an input is given twice");
  }
  int64_t batch = 1;
  const bool batching = whole_.batch_dim_symbolic();
  if (batching) {
    batch = ordered[0]->tensor.shape().empty() ? 0 : ordered[0]->tensor.shape()[0];
    for (const NamedTensor* in : ordered) {
      if (in->tensor.shape().empty() || in->tensor.shape()[0] != batch) {
        return InvalidArgument("input '" + in->name +
                               "' differs from the others in its first (batch) dimension");
      }
    }
  }
  const bool adaptive = options_.micro_batches == 0;
  int m = 1;
  if (batching && batch > 1) {
    m = adaptive ? tuner_.Choose(batch)
                 : static_cast<int>(std::min<int64_t>(options_.micro_batches, batch));
  }
  std::vector<MicroBatch> items(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) {
    items[static_cast<size_t>(i)].index = i;
    const int64_t begin = batch * i / m, end = batch * (i + 1) / m;
    for (const NamedTensor* in : ordered) {
      if (m == 1) {
        items[static_cast<size_t>(i)].tensors[in->name] = in->tensor;
        continue;
      }
      ASSIGN_OR_RETURN(items[static_cast<size_t>(i)].tensors[in->name],
                       in->tensor.SliceRows(begin, end));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(pipeline_->Run(&items));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (adaptive && m >= 1 && batch > 1) tuner_.Observe(batch, m, seconds);
  {
    MutexLock lock(&mu_);
    last_micro_batches_ = m;
  }
  outputs->clear();
  for (const TensorInfo& info : whole_.outputs()) {
    std::vector<const Tensor*> parts;
    for (const MicroBatch& item : items) {
      auto it = item.tensors.find(info.name);
      if (it == item.tensors.end()) return Internal("no stage produced output '" + info.name + "'");
      parts.push_back(&it->second);
    }
    if (parts.size() == 1) {
      outputs->push_back(NamedTensor{info.name, *parts[0]});
      continue;
    }
    ASSIGN_OR_RETURN(Tensor joined, JoinRows(parts));
    outputs->push_back(NamedTensor{info.name, std::move(joined)});
  }
  return Status::Ok();
}

}  // namespace shoal::engine
