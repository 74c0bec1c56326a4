#include "server/task_pool.h"

#include "core/thread_util.h"

namespace shoal::server {

TaskPool::TaskPool(int threads, std::string name) : name_(std::move(name)) {
  if (threads < 1) threads = 1;
  threads_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { Run(i); });
}

TaskPool::~TaskPool() { Shutdown(); }

bool TaskPool::Submit(std::function<void()> work, std::function<void()> refused) {
  {
    MutexLock lock(&mu_);
    if (stop_) return false;
    queue_.emplace_back(std::move(work), std::move(refused));
  }
  cv_.Signal();
  return true;
}

int64_t TaskPool::queued() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void TaskPool::Shutdown() {
  std::deque<std::pair<std::function<void()>, std::function<void()>>> refused;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    refused.swap(queue_);
  }
  cv_.SignalAll();
  for (auto& [work, refuse] : refused) {
    if (refuse) refuse();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void TaskPool::Run(int index) {
  NameCurrentThread(name_ + ":" + std::to_string(index));
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) return;  // stopped
    auto task = std::move(queue_.front());
    queue_.pop_front();
    started_.fetch_add(1, std::memory_order_relaxed);
    lock.Unlock();
    task.first();
    task = {};  // captured state is released outside the lock
    lock.Lock();
  }
}

}  // namespace shoal::server
