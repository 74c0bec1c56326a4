// StagePipeline: K stage threads joined by bounded FIFO queues; work items
// (micro-batches) enter stage 1 and leave stage K in the order they entered, so stage i
// works on micro-batch j+1 while stage i+1 works on micro-batch j.
//
// What a stage does is the caller's: `init(stage)` runs once on each stage's thread
// before any work (where a stage creates what must live on its thread: an engine Session,
// pinned cores), `run(stage, item)` once per item. PipelineSession (pipeline_session.h)
// runs model stages with it; tests give it plain functions.
//
// Threads: Submit and Run may be called from any thread, several at once (items of
// different callers interleave, each caller's stay in order). `done` runs on the last
// stage's thread, or on the destroying thread for an item that never finished.
// Bounds: every queue holds at most `queue_capacity` items; Submit blocks while stage 1's
// queue is full, and a stage blocks while the next queue is full (backpressure, never
// unbounded memory). At most K * (queue_capacity + 1) items are inside at once.
// Errors: an item whose stage fails keeps the first error and passes through the later
// stages without running them; `done` sees it. A failing `init` fails Create.
// Destruction with work inside: items waiting in queues are answered with CANCELLED
// ("pipeline shut down"), stages finish the item they hold, threads are joined. The
// owner must not call Submit or Run once destruction has begun.
//
// Bubble: while at least one item is inside (the pipeline is busy), each stage is either
// running an item or idle; Stats::bubble_ratio is the idle share,
// 1 - sum(stage busy) / (K * busy span). Balanced stages and enough micro-batches make it
// small; a lone item through K equal stages gives (K-1)/K.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "core/tensor.h"

namespace shoal::engine {

// One micro-batch: its named tensors (the stages' inputs and what they add) and status.
struct MicroBatch {
  int index = 0;  // the caller's, untouched by the pipeline
  std::map<std::string, Tensor> tensors;
  Status status;
};

struct StagePipelineStats {
  int64_t items = 0;                   // items that left the last stage
  int64_t busy_span_ns = 0;            // time with at least one item inside
  std::vector<int64_t> stage_busy_ns;  // per stage: time running items
  // 1 - sum(stage_busy_ns) / (K * busy_span_ns), in 0..1; 0 before any work.
  double bubble_ratio() const;
};

class StagePipeline {
 public:
  using InitFn = std::function<Status(int stage)>;
  using RunFn = std::function<Status(int stage, MicroBatch* item)>;
  using DoneFn = std::function<void(MicroBatch item)>;
  using Clock = std::function<int64_t()>;  // nanoseconds from any origin

  struct Options {
    int stages = 2;                     // K, >= 1
    int queue_capacity = 2;             // items per queue, >= 1
    std::string thread_name = "stage";  // threads are named <thread_name><index>
    Clock now_ns;                       // empty: the steady clock
  };

  // Starts the stage threads and waits for every `init`. INVALID_ARGUMENT for bad
  // options; otherwise the first failing init's error (prefixed with its stage).
  static StatusOr<std::unique_ptr<StagePipeline>> Create(const Options& options, InitFn init,
                                                         RunFn run);
  ~StagePipeline();

  // Puts `item` into stage 1 (blocking while its queue is full); `done` gets it back
  // exactly once.
  void Submit(MicroBatch item, DoneFn done);
  // Submits every item in order and waits for all; items come back in place. Returns the
  // first error in item order (each item keeps its own).
  Status Run(std::vector<MicroBatch>* items);

  StagePipelineStats stats() const;
  // True once destruction has begun: a stage function may check it to cut long work short.
  bool shutting_down() const;
  int stages() const { return options_.stages; }
  // Items waiting in each stage's queue now (tests watch the bounds with it).
  std::vector<int> QueueDepths() const;

 private:
  struct Entry {
    MicroBatch item;
    DoneFn done;
  };
  struct Queue {
    std::deque<Entry> items;
  };
  explicit StagePipeline(const Options& options, RunFn run);
  void StageLoop(int stage, const InitFn& init);
  // Blocks while queue `q` is full; false when shutting down (the entry is then answered).
  bool PushLocked(int q, Entry* entry) REQUIRES(mu_);
  int64_t Now() const;

  Options options_;
  RunFn run_;
  std::vector<std::thread> threads_;

  // Lock order: mu_ only.
  mutable Mutex mu_;
  CondVar changed_;  // a queue gained or lost an item, an init finished, or shutdown
  std::vector<Queue> queues_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
  int inits_done_ GUARDED_BY(mu_) = 0;
  Status init_status_ GUARDED_BY(mu_);
  int64_t inside_ GUARDED_BY(mu_) = 0;  // items submitted and not yet done
  int64_t busy_since_ns_ GUARDED_BY(mu_) = 0;
  StagePipelineStats stats_ GUARDED_BY(mu_);
};

}  // namespace shoal::engine
