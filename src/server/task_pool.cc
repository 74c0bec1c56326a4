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
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    queue_.emplace_back(std::move(work), std::move(refused));
  }
  cv_.notify_one();
  return true;
}

int64_t TaskPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

void TaskPool::Shutdown() {
  std::deque<std::pair<std::function<void()>, std::function<void()>>> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    refused.swap(queue_);
  }
  cv_.notify_all();
  for (auto& [work, refuse] : refused) {
    if (refuse) refuse();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void TaskPool::Run(int index) {
  NameCurrentThread(name_ + ":" + std::to_string(index));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped
    auto task = std::move(queue_.front());
    queue_.pop_front();
    started_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    task.first();
    task = {};  // captured state is released outside the lock
    lock.lock();
  }
}

}  // namespace shoal::server
