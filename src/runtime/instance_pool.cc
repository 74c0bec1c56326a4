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
  {
    MutexLock lock(&pool->mu_);
    for (const auto& info : pool->options_.instances) {
      auto inst = std::make_unique<Instance>();
      inst->info = info;
      pool->instances_.push_back(std::move(inst));
      pool->states_.emplace_back(pool->options_);
      pool->states_.back().stats.name = info.name;
    }
  }
  for (size_t i = 0; i < pool->instances_.size(); ++i) {
    pool->instances_[i]->thread = std::thread([p = pool.get(), i] { p->Run(i); });
  }
  Status first_error;
  {
    MutexLock lock(&pool->mu_);
    while (!pool->AllInitDoneLocked()) pool->init_cv_.Wait(&pool->mu_);
    for (size_t i = 0; i < pool->states_.size(); ++i) {
      if (!pool->states_[i].init_status.ok()) {
        first_error =
            pool->states_[i].init_status.WithPrefix("instance " + pool->instances_[i]->info.name);
        break;
      }
    }
  }
  if (!first_error.ok()) return first_error;  // the destructor stops the others
  return pool;
}

InstancePool::~InstancePool() { StopAll(); }

bool InstancePool::AllInitDoneLocked() const {
  for (const auto& state : states_) {
    if (!state.init_done) return false;
  }
  return true;
}

void InstancePool::StopAll() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& inst : instances_) inst->wake.store(true, std::memory_order_release);
  }
  for (auto& inst : instances_) inst->cv.SignalAll();
  for (auto& inst : instances_) {
    if (inst->thread.joinable()) inst->thread.join();
  }
}

void InstancePool::Run(size_t index) {
  Instance* inst = instances_[index].get();
  current_instance = inst;
  NameCurrentThread(inst->info.name);
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
    MutexLock lock(&mu_);
    InstanceState& state = states_[index];
    state.init_status = status;
    state.init_done = true;
    state.stats.created_ns = options_.clock->NowNs();
  }
  init_cv_.SignalAll();
  if (!status.ok()) return;

  MutexLock lock(&mu_);
  while (true) {
    if (!stopping_ && !states_[index].running.has_value()) {
      // Idle. A job submitted from here on sets `wake` (it was cleared under mu_, after
      // the check above, so none is missed).
      inst->wake.store(false, std::memory_order_relaxed);
      const auto idle_since = std::chrono::steady_clock::now();
      if (options_.idle_spin_us > 0 && inst->last_idle_ns < options_.idle_spin_us * 1000 &&
          states_[index].submit_cpu != sched_getcpu()) {
        ++states_[index].stats.idle_spins;
        lock.Unlock();
        SpinForJob(inst);
        lock.Lock();
      }
      if (!stopping_ && !states_[index].running.has_value()) {
        ++states_[index].stats.idle_sleeps;
        while (!stopping_ && !states_[index].running.has_value()) inst->cv.Wait(&mu_);
      }
      inst->last_idle_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - idle_since)
                               .count();
    }
    if (!states_[index].running.has_value()) break;  // stopping with nothing left
    // Stays valid without the lock: only this thread resets `running`, and Submit fills
    // `pending` while a job runs.
    PoolJob& job = *states_[index].running;
    lock.Unlock();
    const int64_t start = options_.clock->NowNs();
    const int64_t ran = job.run(*backend, inst->info.index);
    const int64_t elapsed = options_.clock->NowNs() - start;
    const double bubble = backend->pipeline_bubble_ratio();
    const backends::DeviceStats device = backend->device_stats();
    lock.Lock();
    InstanceState& state = states_[index];
    state.stats.pipeline_bubble_ratio = bubble;
    state.stats.device = device;
    if (ran > 0) state.cost.Observe(ran, elapsed);
    state.stats.executions++;
    state.stats.busy_ns += elapsed;
    state.running.reset();
    if (state.pending.has_value()) {
      state.running = std::move(state.pending);
      state.pending.reset();
      state.started_ns = options_.clock->NowNs();
    }
    lock.Unlock();
    if (options_.on_idle) options_.on_idle();
    lock.Lock();
  }
  lock.Unlock();
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
  MutexLock lock(&mu_);
  for (const auto& state : states_) {
    if (!state.running.has_value()) return true;
  }
  return false;
}

int InstancePool::Choose(int64_t batch_size) const {
  MutexLock lock(&mu_);
  const int64_t now = options_.clock->NowNs();
  int best = -1;
  int64_t best_finish = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < states_.size(); ++i) {
    const InstanceState& inst = states_[i];
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
  Instance& instance = *instances_.at(static_cast<size_t>(index));
  {
    MutexLock lock(&mu_);
    InstanceState& inst = states_[static_cast<size_t>(index)];
    if (!inst.running.has_value()) {
      inst.running = std::move(job);
      inst.started_ns = options_.clock->NowNs();
      instance.wake.store(true, std::memory_order_release);
      // A job the instance's own thread dispatched (when it went idle) says nothing about
      // where other submitters run.
      if (current_instance != &instance) inst.submit_cpu = sched_getcpu();
    } else {
      inst.pending = std::move(job);
    }
  }
  instance.cv.Signal();
}

int64_t InstancePool::PredictNs(int64_t batch_size) const {
  MutexLock lock(&mu_);
  int64_t best = std::numeric_limits<int64_t>::max();
  for (const auto& inst : states_) best = std::min(best, inst.cost.PredictNs(batch_size));
  return best;
}

ServiceEstimate InstancePool::Service() const {
  MutexLock lock(&mu_);
  ServiceEstimate e;
  e.instances = static_cast<int>(instances_.size());
  if (instances_.empty()) return e;
  const int64_t now = options_.clock->NowNs();
  int64_t backlog = 0;
  e.idle_instances = 0;
  for (const auto& inst : states_) {
    if (!inst.running.has_value()) ++e.idle_instances;
    e.a_ns += inst.cost.a_ns();
    e.b_ns += inst.cost.b_ns();
    if (inst.running.has_value()) {
      const int64_t end = inst.started_ns + inst.cost.PredictNs(inst.running->batch_size);
      backlog += std::max<int64_t>(0, end - now);
    }
    if (inst.pending.has_value()) backlog += inst.cost.PredictNs(inst.pending->batch_size);
  }
  e.a_ns /= e.instances;
  e.b_ns /= e.instances;
  e.backlog_ns = backlog / e.instances;
  return e;
}

std::vector<InstanceStats> InstancePool::Stats() const {
  MutexLock lock(&mu_);
  std::vector<InstanceStats> out;
  for (const auto& inst : states_) {
    InstanceStats s = inst.stats;
    s.cost_a_ns = inst.cost.a_ns();
    s.cost_b_ns = inst.cost.b_ns();
    out.push_back(s);
  }
  return out;
}

int InstancePool::busy_count() const {
  MutexLock lock(&mu_);
  int n = 0;
  for (const auto& inst : states_) n += inst.running.has_value() + inst.pending.has_value();
  return n;
}

}  // namespace shoal::runtime
