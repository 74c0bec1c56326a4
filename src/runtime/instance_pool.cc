#include "runtime/instance_pool.h"

#include <sched.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>

#include "core/log_text.h"
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
    if (backend)
      state.depth = std::clamp(backend->pipeline_depth(), 1, static_cast<int>(HeldJobs::kMax));
    state.stats.pipeline_depth = state.depth;
    if (backend) state.stats.setups = backend->setups();  // what its creation did
  }
  init_cv_.SignalAll();
  if (!status.ok()) return;

  MutexLock lock(&mu_);
  // Fixed after Create, and only this thread removes jobs: references into `state.jobs`
  // stay valid while the lock is dropped (a job keeps its place in the ring until popped).
  InstanceState& state = states_[index];
  while (true) {
    if (!stopping_ && state.jobs.empty()) {
      // Idle. A job submitted from here on sets `wake` (it was cleared under mu_, after
      // the check above, so none is missed).
      inst->wake.store(false, std::memory_order_relaxed);
      const auto idle_since = std::chrono::steady_clock::now();
      if (options_.idle_spin_us > 0 && inst->last_idle_ns < options_.idle_spin_us * 1000 &&
          state.submit_cpu != sched_getcpu()) {
        ++state.stats.idle_spins;
        lock.Unlock();
        SpinForJob(inst);
        lock.Lock();
      }
      if (!stopping_ && state.jobs.empty()) {
        ++state.stats.idle_sleeps;
        while (!stopping_ && state.jobs.empty()) inst->cv.Wait(&mu_);
      }
      inst->last_idle_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - idle_since)
                               .count();
    }
    if (state.jobs.empty()) break;  // stopping with nothing left
    // The front job is finished (its second half called, without the lock, since `began_ns`)
    // and returned `ran` items at `end_ns`, after which the backend said `bubble` and
    // `device` (asked without the lock): recorded, dropped, and the next one begins. The
    // caller then calls on_idle without the lock.
    const auto finished = [&](int64_t ran, int64_t began_ns, int64_t end_ns, double bubble,
                              const backends::DeviceStats& device, int64_t setups) REQUIRES(mu_) {
      const int64_t elapsed = end_ns - began_ns;
      state.stats.pipeline_bubble_ratio = bubble;
      state.stats.device = device;
      state.stats.setups = setups;
      if (ran > 0) state.cost.Observe(ran, elapsed);
      state.stats.executions++;
      state.stats.busy_ns += elapsed;
      state.jobs.pop_front();
      --state.launched;
      // The next job begins now: on the device behind this one if launched, else here.
      if (!state.jobs.empty()) state.started_ns = options_.clock->NowNs();
    };
    if (state.launched < state.jobs.size() && state.launched < static_cast<size_t>(state.depth)) {
      // Launch the oldest job not yet launched.
      Held& held = state.jobs[state.launched++];
      const uint64_t id = held.id;
      const bool pipelined = state.depth > 1;
      if (state.launched > 1) ++state.stats.overlapped_executions;
      const int64_t started_ns = state.started_ns;
      PoolJob& job = held.job;
      lock.Unlock();
      const int64_t launched_ns = options_.clock->NowNs();
      if (!pipelined) {
        // Depth 1: this is the front job, and nothing of it stays on a device. Run it (both
        // halves) and record it with one more taking of the lock, as a plain run.
        int64_t ran = 0;
        if (job.launch) {
          PoolJob::Finish finish = job.launch(*backend, inst->info.index, nullptr);
          ran = finish ? finish() : 0;
        } else {
          ran = job.run(*backend, inst->info.index);
        }
        const int64_t end_ns = options_.clock->NowNs();
        const double bubble = backend->pipeline_bubble_ratio();
        const backends::DeviceStats device = backend->device_stats();
        const int64_t setups = backend->setups();
        lock.Lock();
        finished(ran, std::max(started_ns, launched_ns), end_ns, bubble, device, setups);
        lock.Unlock();
        if (device.context_lost) ReportDeviceLost(*inst);
        if (options_.on_idle) options_.on_idle();
        lock.Lock();
        continue;
      }
      PoolJob::Finish finish;
      bool ran = false;
      if (job.launch) {
        // Two words: std::function keeps it without an allocation.
        finish = job.launch(*backend, inst->info.index, [this, id] { MarkDone(id); });
      } else {
        const int64_t items = job.run(*backend, inst->info.index);
        finish = [items] { return items; };
        ran = true;
      }
      lock.Lock();
      held.launched_ns = launched_ns;
      held.finish = std::move(finish);
      if (ran) held.done = true;  // nothing is left on a device
      continue;
    }
    Held& head = state.jobs.front();
    if (!head.done && !stopping_ && state.launched < static_cast<size_t>(state.depth)) {
      // Its work is on the device and there is room for another: wait for either. But not
      // for ever: if its on_done never comes (a backend that drops it on an error path),
      // Finish, which waits for the work or reports its error, answers it after all.
      if (head.give_up == std::chrono::steady_clock::time_point{}) {
        const int64_t patience =
            std::max<int64_t>(1'000'000'000, 4 * state.cost.PredictNs(head.job.batch_size));
        head.give_up = std::chrono::steady_clock::now() + std::chrono::nanoseconds(patience);
      }
      if (inst->cv.WaitUntil(&mu_, head.give_up) != std::cv_status::timeout) continue;
    }
    PoolJob::Finish finish = std::move(head.finish);
    const int64_t began_ns = std::max(state.started_ns, head.launched_ns);
    lock.Unlock();
    const int64_t ran = finish ? finish() : 0;
    const int64_t end_ns = options_.clock->NowNs();
    const double bubble = backend->pipeline_bubble_ratio();
    const backends::DeviceStats device = backend->device_stats();
    const int64_t setups = backend->setups();
    lock.Lock();
    finished(ran, began_ns, end_ns, bubble, device, setups);
    lock.Unlock();
    if (device.context_lost) ReportDeviceLost(*inst);
    if (options_.on_idle) options_.on_idle();
    lock.Lock();
  }
  lock.Unlock();
  backend.reset();  // destroyed on its own thread
}

void InstancePool::MarkDone(uint64_t id) {
  const size_t index = static_cast<size_t>(id >> 40);
  {
    MutexLock lock(&mu_);
    HeldJobs& jobs = states_[index].jobs;
    for (size_t k = 0; k < jobs.size(); ++k) {
      if (jobs[k].id != id) continue;
      jobs[k].done = true;
      break;
    }
  }
  instances_[index]->cv.Signal();
}

void InstancePool::ReportDeviceLost(const Instance& inst) {
  if (device_lost_.exchange(true, std::memory_order_acq_rel)) return;  // said already
  spdlog::error(
      "instance {}: its GPU's context is lost (a sticky CUDA error); the model answers "
      "UNAVAILABLE and the server reports itself not live until it is restarted",
      LogSafe(inst.info.name));
  if (options_.on_device_lost) options_.on_device_lost();
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
    if (state.jobs.size() < static_cast<size_t>(state.depth)) return true;
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
    if (inst.jobs.empty()) {
      start = now;
    } else if (inst.jobs.size() < Capacity(inst)) {
      // Expected end of the running job, never in the past, then of those behind it.
      start =
          std::max(now, inst.started_ns + inst.cost.PredictNs(inst.jobs.front().job.batch_size));
      for (size_t k = 1; k < inst.jobs.size(); ++k)
        start += inst.cost.PredictNs(inst.jobs[k].job.batch_size);
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
    if (inst.jobs.empty()) {
      inst.started_ns = options_.clock->NowNs();
      instance.wake.store(true, std::memory_order_release);
      // A job the instance's own thread dispatched (when it went idle) says nothing about
      // where other submitters run.
      if (current_instance != &instance) inst.submit_cpu = sched_getcpu();
    }
    // Choose never names an instance without room; a caller that did would lose a job.
    if (inst.jobs.size() >= Capacity(inst)) {
      std::fprintf(stderr, "InstancePool::Submit: instance %d already holds %zu jobs\n", index,
                   inst.jobs.size());
      std::abort();
    }
    Held held;
    held.job = std::move(job);
    // The instance's index in the high bits: an id names its instance too.
    held.id = (static_cast<uint64_t>(index) << 40) | (inst.next_id++ & ((uint64_t{1} << 40) - 1));
    inst.jobs.push_back(std::move(held));
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
    e.a_ns += inst.cost.a_ns();
    e.b_ns += inst.cost.b_ns();
    if (inst.jobs.empty()) {
      ++e.idle_instances;
      continue;
    }
    const int64_t end = inst.started_ns + inst.cost.PredictNs(inst.jobs.front().job.batch_size);
    backlog += std::max<int64_t>(0, end - now);
    for (size_t k = 1; k < inst.jobs.size(); ++k)
      backlog += inst.cost.PredictNs(inst.jobs[k].job.batch_size);
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
  for (const auto& inst : states_) n += static_cast<int>(inst.jobs.size());
  return n;
}

}  // namespace shoal::runtime
