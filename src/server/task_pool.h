// TaskPool: a fixed set of worker threads running queued tasks in arrival order, for
// the front ends' work that must not run on an I/O thread (a blocking model load, or
// decoding and encoding a large request).
//
// Every task is queued with a refusal: exactly one of the two runs. Submit runs neither
// and returns false once the pool is shut down; Shutdown refuses what is still queued
// (on the calling thread), lets running tasks finish and joins the threads. Idempotent;
// the destructor calls it. A task must not call Shutdown of its own pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"

namespace shoal::server {

class TaskPool {
 public:
  // `threads` >= 1 workers named <name>:<i>.
  TaskPool(int threads, std::string name);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues `work`; `refused` runs instead if the pool shuts down before `work` starts.
  // False (and neither runs) when the pool is already shut down.
  bool Submit(std::function<void()> work, std::function<void()> refused);
  void Shutdown();

  int threads() const { return static_cast<int>(threads_.size()); }
  // Tasks queued and not yet started.
  int64_t queued() const;
  // Tasks that a worker has started (refused ones not counted).
  int64_t started() const { return started_.load(std::memory_order_relaxed); }

 private:
  void Run(int index) EXCLUDES(mu_);

  const std::string name_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::pair<std::function<void()>, std::function<void()>>> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<int64_t> started_{0};
  std::vector<std::thread> threads_;
};

}  // namespace shoal::server
