// PipelineSession: runs a model cut into stages (pipeline_split.h) as a pipeline: one
// thread per stage, each with its own Session pinned to its share of the cores, and a
// batch cut into micro-batches that flow through bounded queues (StagePipeline), so the
// stages work on different micro-batches at once. Outputs equal the whole model's up to
// floating-point reassociation inside kernels (a micro-batch's rows are computed by the
// same operators as the whole batch's).
//
// Micro-batches: a batch of B rows (the first dimension of every input, when the model
// batches) is cut into m micro-batches of B/m rows (sizes differ by at most one) and the
// outputs are joined in order. `micro_batches` fixes m (capped at B); 0 lets
// MicroBatchTuner choose m per batch size from measured run times: more micro-batches
// shrink the pipeline bubble ((K-1)/(m+K-1) with balanced stages), fewer keep each
// kernel's batch large; the tuner settles on the fastest.
//
// Threads: Create and Run from any thread; one Run at a time (an instance's thread).
// Errors: Run answers INVALID_ARGUMENT for inputs that do not fit the model (checked by
// the first stage's Session, and here for a missing input or a ragged batch), otherwise the
// first failing stage's error, prefixed with the stage.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "engine/model.h"
#include "engine/pipeline_split.h"
#include "engine/stage_pipeline.h"

namespace shoal::engine {

// Chooses micro-batch counts by hill climbing on measured run time, per batch size:
// it starts at min(B, 2 * stages) (a bubble of (K-1)/(3K-1) with balanced stages), runs the current
// count, and every `explore_every`-th run of that size tries a neighbour (one more, then one fewer,
// in turn); a neighbour whose averaged time is below the current's by `margin` becomes current.
// Thread-safe.
class MicroBatchTuner {
 public:
  explicit MicroBatchTuner(int stages, int explore_every = 4, double margin = 0.03);
  int Choose(int64_t batch);
  void Observe(int64_t batch, int micro_batches, double seconds);
  // The count the tuner settled on for this batch size so far (the start when unseen).
  int Current(int64_t batch) const;

 private:
  struct PerBatch {
    int current = 1;
    int64_t runs = 0;
    bool explore_up = true;
    std::map<int, double> avg_seconds;  // exponentially weighted
  };
  PerBatch& StateLocked(int64_t batch) const REQUIRES(mu_);

  const int stages_;
  const int explore_every_;
  const double margin_;
  mutable Mutex mu_;
  mutable std::map<int64_t, PerBatch> state_ GUARDED_BY(mu_);
};

struct PipelineOptions {
  // Per stage: the logical CPUs its thread and OpenMP workers are pinned to; empty
  // (or an empty entry): unpinned. SplitCores shares an instance's cores out.
  std::vector<std::vector<int>> stage_cores;
  // OpenMP threads per stage; 0: one per core of the stage, or all CPUs / K unpinned.
  int threads_per_stage = 0;
  // Items each queue between stages holds (>= 1; default 2).
  int queue_capacity = 2;
  // Micro-batches per Run: 0 (default) adaptive (MicroBatchTuner), else fixed, >= 0.
  int micro_batches = 0;
  // Passed to every stage's Session (max_cached_plans, single_thread_below_flops);
  // its threads and cpu_cores are set per stage from the fields above.
  SessionOptions session;
};

// `cores` shared among `stages` stages in order: contiguous equal shares when there are
// at least as many cores as stages (the first stages take one more when it does not
// divide), else stage s takes core s % cores.size(). Empty cores: every share is empty.
std::vector<std::vector<int>> SplitCores(const std::vector<int>& cores, int stages);

class PipelineSession {
 public:
  // `whole` is the model `stages` was cut from; both must outlive the session.
  static StatusOr<std::unique_ptr<PipelineSession>> Create(const Model& whole,
                                                           const ModelStages& stages,
                                                           const PipelineOptions& options);
  ~PipelineSession();

  // As Session::Run: inputs by name, outputs in the model's output order.
  Status Run(const std::vector<NamedTensor>& inputs, std::vector<NamedTensor>* outputs);

  StagePipelineStats stats() const { return pipeline_->stats(); }
  int stages() const { return static_cast<int>(sessions_.size()); }
  // Micro-batches the last Run used.
  int last_micro_batches() const;
  const MicroBatchTuner& tuner() const { return tuner_; }

 private:
  PipelineSession(const Model& whole, const ModelStages& stages, const PipelineOptions& options);
  Status RunStage(int stage, MicroBatch* item);

  const Model& whole_;
  const ModelStages& stages_;
  PipelineOptions options_;
  MicroBatchTuner tuner_;
  // Each entry is created, used and (before the pipeline's threads are joined) owned by
  // its stage's thread only.
  std::vector<std::unique_ptr<Session>> sessions_;
  std::unique_ptr<StagePipeline> pipeline_;  // declared last: stops before the sessions go
  mutable Mutex mu_;
  int last_micro_batches_ GUARDED_BY(mu_) = 0;
};

}  // namespace shoal::engine
