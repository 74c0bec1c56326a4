#include "engine/stage_pipeline.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/thread_util.h"

namespace shoal::engine {

double StagePipelineStats::bubble_ratio() const {
  if (busy_span_ns <= 0 || stage_busy_ns.empty()) return 0;
  int64_t busy = 0;
  for (int64_t b : stage_busy_ns) busy += b;
  const double capacity =
      static_cast<double>(busy_span_ns) * static_cast<double>(stage_busy_ns.size());
  return std::clamp(1.0 - static_cast<double>(busy) / capacity, 0.0, 1.0);
}

StagePipeline::StagePipeline(const Options& options, RunFn run)
    : options_(options), run_(std::move(run)) {
  MutexLock lock(&mu_);
  queues_.resize(static_cast<size_t>(options.stages));
  stats_.stage_busy_ns.assign(static_cast<size_t>(options.stages), 0);
}

StatusOr<std::unique_ptr<StagePipeline>> StagePipeline::Create(const Options& options, InitFn init,
                                                               RunFn run) {
  if (options.stages < 1)
    return InvalidArgument("pipeline stages must be >= 1; was " + std::to_string(options.stages));
  if (options.queue_capacity < 1) {
    return InvalidArgument("pipeline queue capacity must be >= 1; was " +
                           std::to_string(options.queue_capacity));
  }
  if (!run) return InvalidArgument("a pipeline needs a run function");
  std::unique_ptr<StagePipeline> p(new StagePipeline(options, std::move(run)));
  auto shared_init = std::make_shared<InitFn>(std::move(init));
  for (int s = 0; s < options.stages; ++s) {
    p->threads_.emplace_back([raw = p.get(), s, shared_init] { raw->StageLoop(s, *shared_init); });
  }
  MutexLock lock(&p->mu_);
  while (p->inits_done_ < options.stages) p->changed_.Wait(&p->mu_);
  Status status = p->init_status_;
  lock.Unlock();
  if (!status.ok()) return status;  // the destructor stops the threads
  return p;
}

StagePipeline::~StagePipeline() {
  {
    MutexLock lock(&mu_);
    shutdown_ = true;
    changed_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
  std::vector<Entry> left;
  {
    MutexLock lock(&mu_);
    for (Queue& q : queues_) {
      for (Entry& e : q.items) left.push_back(std::move(e));
      q.items.clear();
    }
    inside_ = 0;
  }
  for (Entry& e : left) {
    if (e.item.status.ok()) e.item.status = Cancelled("pipeline shut down");
    if (e.done) e.done(std::move(e.item));
  }
}

int64_t StagePipeline::Now() const {
  if (options_.now_ns) return options_.now_ns();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool StagePipeline::shutting_down() const {
  MutexLock lock(&mu_);
  return shutdown_;
}

std::vector<int> StagePipeline::QueueDepths() const {
  MutexLock lock(&mu_);
  std::vector<int> depths;
  for (const Queue& q : queues_) depths.push_back(static_cast<int>(q.items.size()));
  return depths;
}

StagePipelineStats StagePipeline::stats() const {
  MutexLock lock(&mu_);
  StagePipelineStats s = stats_;
  if (inside_ > 0) s.busy_span_ns += Now() - busy_since_ns_;
  return s;
}

bool StagePipeline::PushLocked(int q, Entry* entry) {
  Queue& queue = queues_[static_cast<size_t>(q)];
  while (!shutdown_ && static_cast<int>(queue.items.size()) >= options_.queue_capacity)
    changed_.Wait(&mu_);
  if (shutdown_) return false;
  queue.items.push_back(std::move(*entry));
  changed_.SignalAll();
  return true;
}

void StagePipeline::Submit(MicroBatch item, DoneFn done) {
  Entry entry{std::move(item), std::move(done)};
  {
    MutexLock lock(&mu_);
    if (!shutdown_) {
      if (inside_++ == 0) busy_since_ns_ = Now();
      if (PushLocked(0, &entry)) return;
      if (--inside_ == 0) stats_.busy_span_ns += Now() - busy_since_ns_;
    }
  }
  entry.item.status = Cancelled("pipeline shut down");
  if (entry.done) entry.done(std::move(entry.item));
}

void StagePipeline::StageLoop(int stage, const InitFn& init) {
  NameCurrentThread(options_.thread_name + std::to_string(stage));
  Status status = init ? init(stage) : Status::Ok();
  {
    MutexLock lock(&mu_);
    if (!status.ok() && init_status_.ok())
      init_status_ = status.WithPrefix("pipeline stage " + std::to_string(stage + 1));
    ++inits_done_;
    changed_.SignalAll();
    if (!status.ok()) return;
  }
  const bool last = stage + 1 == options_.stages;
  for (;;) {
    Entry entry;
    {
      MutexLock lock(&mu_);
      Queue& queue = queues_[static_cast<size_t>(stage)];
      while (!shutdown_ && queue.items.empty()) changed_.Wait(&mu_);
      if (shutdown_) return;  // the destructor answers what is left in the queues
      entry = std::move(queue.items.front());
      queue.items.pop_front();
      changed_.SignalAll();
    }
    const int64_t start = Now();
    if (entry.item.status.ok()) {
      Status s = run_(stage, &entry.item);
      if (!s.ok()) entry.item.status = std::move(s);
    }
    const int64_t end = Now();
    {
      MutexLock lock(&mu_);
      stats_.stage_busy_ns[static_cast<size_t>(stage)] += end - start;
      if (!last && PushLocked(stage + 1, &entry)) continue;
      if (last) ++stats_.items;
      if (--inside_ == 0) stats_.busy_span_ns += end - busy_since_ns_;
    }
    // The last stage, or shutdown while waiting to pass the item on.
    if (!last && entry.item.status.ok()) entry.item.status = Cancelled("pipeline shut down");
    if (entry.done) entry.done(std::move(entry.item));
    if (!last) return;
  }
}

Status StagePipeline::Run(std::vector<MicroBatch>* items) {
  struct Completion {
    Mutex mu;
    CondVar cv;
    size_t left GUARDED_BY(mu) = 0;
  };
  auto completion = std::make_shared<Completion>();
  {
    MutexLock lock(&completion->mu);
    completion->left = items->size();
  }
  for (size_t i = 0; i < items->size(); ++i) {
    Submit(std::move((*items)[i]), [completion, items, i](MicroBatch done) {
      MutexLock lock(&completion->mu);
      (*items)[i] = std::move(done);
      if (--completion->left == 0) completion->cv.SignalAll();
    });
  }
  {
    MutexLock lock(&completion->mu);
    while (completion->left > 0) completion->cv.Wait(&completion->mu);
  }
  for (const MicroBatch& item : *items) RETURN_IF_ERROR(item.status);
  return Status::Ok();
}

}  // namespace shoal::engine
