#include "runtime/instance_pool.h"

#include <sched.h>

#include <chrono>
#include <exception>
#include <limits>

#include "core/thread_util.h"

namespace shoal::runtime {
namespace {
// The instance whose thread this is (null on other threads).
thread_local const void* current_instance = nullptr;
}  // namespace

InstancePool::InstancePool(Options options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<InstancePool>> InstancePool::Create(Options options) {
  if (options.model == nullptr) return InvalidArgument("instance pool needs a model");
  if (options.instances.empty())
    return InvalidArgument("instance pool needs at least one instance");
  if (!options.clock) options.clock = Clock::Real();
  std::unique_ptr<InstancePool> pool(new InstancePool(std::move(options)));
  for (const auto& info : pool->options_.instances) {
    auto inst = std::make_unique<Instance>(pool->options_);
    inst->info = info;
    inst->stats.name = info.name;
    pool->instances_.push_back(std::move(inst));
  }
  for (auto& inst : pool->instances_) {
    Instance* raw = inst.get();
    inst->thread = std::thread([p = pool.get(), raw] { p->Run(raw); });
  }
  Status first_error;
  {
    std::unique_lock<std::mutex> lock(pool->mu_);
    pool->init_cv_.wait(lock, [&] {
      for (auto& inst : pool->instances_) {
        if (!inst->init_done) return false;
      }
      return true;
    });
    for (auto& inst : pool->instances_) {
      if (!inst->init_status.ok()) {
        first_error = inst->init_status.WithPrefix("instance " + inst->info.name);
        break;
      }
    }
  }
  if (!first_error.ok()) return first_error;  // the destructor stops the others
  return pool;
}

InstancePool::~InstancePool() { StopAll(); }

void InstancePool::StopAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& inst : instances_) inst->wake.store(true, std::memory_order_release);
  }
  for (auto& inst : instances_) inst->cv.notify_all();
  for (auto& inst : instances_) {
    if (inst->thread.joinable()) inst->thread.join();
  }
}

void InstancePool::Run(Instance* inst) {
  NameCurrentThread(inst->info.name);
  current_instance = inst;
  std::unique_ptr<backends::BackendInstance> backend;
  Status status = PinCurrentThread(inst->info.cpu_cores);
  if (status.ok()) {
    try {
      auto created = options_.model->CreateInstance(inst->info);
      if (created.ok()) {
        backend = std::move(created).value();
        if (options_.on_ready) status = options_.on_ready(*backend, inst->info);
      } else {
        status = created.status();
      }
    } catch (const std::exception& e) {
      status = Internal(std::string("exception while creating the instance: ") + e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    inst->init_status = status;
    inst->init_done = true;
    inst->stats.created_ns = options_.clock->NowNs();
  }
  init_cv_.notify_all();
  if (!status.ok()) return;

  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!stopping_ && !inst->running.has_value()) {
      // Idle. A job submitted from here on sets `wake` (it was cleared under mu_, after
      // the check above, so none is missed).
      inst->wake.store(false, std::memory_order_relaxed);
      const auto idle_since = std::chrono::steady_clock::now();
      if (options_.idle_spin_us > 0 && inst->last_idle_ns < options_.idle_spin_us * 1000 &&
          inst->submit_cpu != sched_getcpu()) {
        ++inst->stats.idle_spins;
        lock.unlock();
        SpinForJob(inst);
        lock.lock();
      }
      if (!stopping_ && !inst->running.has_value()) {
        ++inst->stats.idle_sleeps;
        inst->cv.wait(lock, [&] { return stopping_ || inst->running.has_value(); });
      }
      inst->last_idle_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - idle_since)
                               .count();
    }
    if (!inst->running.has_value()) break;  // stopping with nothing left
    PoolJob& job = *inst->running;
    lock.unlock();
    const int64_t start = options_.clock->NowNs();
    const int64_t ran = job.run(*backend, inst->info.index);
    const int64_t elapsed = options_.clock->NowNs() - start;
    lock.lock();
    if (ran > 0) inst->cost.Observe(ran, elapsed);
    inst->stats.executions++;
    inst->stats.busy_ns += elapsed;
    inst->running.reset();
    if (inst->pending.has_value()) {
      inst->running = std::move(inst->pending);
      inst->pending.reset();
      inst->started_ns = options_.clock->NowNs();
    }
    lock.unlock();
    if (options_.on_idle) options_.on_idle();
    lock.lock();
  }
  lock.unlock();
  backend.reset();  // destroyed on its own thread
}

void InstancePool::SpinForJob(Instance* inst) const {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(options_.idle_spin_us);
  while (!inst->wake.load(std::memory_order_acquire)) {
    // A few pauses between clock reads: the pause lets a sibling hyperthread run, and
    // the clock is read about every microsecond, not every iteration.
    for (int i = 0; i < 32; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return;
  }
}

bool InstancePool::HasIdle() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& inst : instances_) {
    if (!inst->running.has_value()) return true;
  }
  return false;
}

int InstancePool::Choose(int64_t batch_size) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = options_.clock->NowNs();
  int best = -1;
  int64_t best_finish = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < instances_.size(); ++i) {
    const Instance& inst = *instances_[i];
    int64_t start;
    if (!inst.running.has_value()) {
      start = now;
    } else if (!inst.pending.has_value()) {
      // Expected end of the running job, never in the past.
      start = std::max(now, inst.started_ns + inst.cost.PredictNs(inst.running->batch_size));
    } else {
      continue;
    }
    const int64_t finish = start + inst.cost.PredictNs(batch_size);
    if (finish < best_finish) {
      best_finish = finish;
      best = static_cast<int>(i);
    }
  }
  return best;
}

void InstancePool::Submit(int index, PoolJob job) {
  Instance& inst = *instances_.at(static_cast<size_t>(index));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!inst.running.has_value()) {
      inst.running = std::move(job);
      inst.started_ns = options_.clock->NowNs();
      inst.wake.store(true, std::memory_order_release);
      // A job the instance's own thread dispatched (when it went idle) says nothing about
      // where other submitters run.
      if (current_instance != &inst) inst.submit_cpu = sched_getcpu();
    } else {
      inst.pending = std::move(job);
    }
  }
  inst.cv.notify_one();
}

int64_t InstancePool::PredictNs(int64_t batch_size) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t best = std::numeric_limits<int64_t>::max();
  for (const auto& inst : instances_) best = std::min(best, inst->cost.PredictNs(batch_size));
  return best;
}

ServiceEstimate InstancePool::Service() const {
  std::lock_guard<std::mutex> lock(mu_);
  ServiceEstimate e;
  e.instances = static_cast<int>(instances_.size());
  if (instances_.empty()) return e;
  const int64_t now = options_.clock->NowNs();
  int64_t backlog = 0;
  e.idle_instances = 0;
  for (const auto& inst : instances_) {
    if (!inst->running.has_value()) ++e.idle_instances;
    e.a_ns += inst->cost.a_ns();
    e.b_ns += inst->cost.b_ns();
    if (inst->running.has_value()) {
      const int64_t end = inst->started_ns + inst->cost.PredictNs(inst->running->batch_size);
      backlog += std::max<int64_t>(0, end - now);
    }
    if (inst->pending.has_value()) backlog += inst->cost.PredictNs(inst->pending->batch_size);
  }
  e.a_ns /= e.instances;
  e.b_ns /= e.instances;
  e.backlog_ns = backlog / e.instances;
  return e;
}

std::vector<InstanceStats> InstancePool::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<InstanceStats> out;
  for (const auto& inst : instances_) {
    InstanceStats s = inst->stats;
    s.cost_a_ns = inst->cost.a_ns();
    s.cost_b_ns = inst->cost.b_ns();
    out.push_back(s);
  }
  return out;
}

int InstancePool::busy_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& inst : instances_) n += inst->running.has_value() + inst->pending.has_value();
  return n;
}

}  // namespace shoal::runtime
