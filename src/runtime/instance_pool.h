// InstancePool: the instances of one model version, each on its own thread.
//
// Each instance owns a thread, optionally pinned to its cores, on which its
// BackendInstance is created, warmed up, used for every Execute and destroyed, so the
// backend contract (never concurrent per instance; init on the instance's thread)
// holds by construction.
//
// Dispatch: an instance holds at most one running job and one pending job. The
// scheduler forms a batch only when some instance is idle (so batches grow while all
// instances are busy), then calls Choose(n), which returns the instance with the
// earliest expected finish for n items: now + t_i(n) for an idle instance,
// busy_until_i + t_i(n) for a busy one with a free pending slot, where t_i is the
// instance's online CostModel. Equal estimates go to the lowest index.
//
// Pipelining: an instance whose backend has pipeline_depth() d > 1 (a GPU instance) holds
// up to d jobs, every one launched as soon as it arrives (PoolJob::launch), so the next
// batch's input copies run while the device computes the current one. Such an instance
// counts as idle for HasIdle while it holds fewer than d jobs (the scheduler forms the
// next batch while one is on the device), and as idle in Service only when it holds none.
// Its thread launches a job as soon as it has one and room for it, and finishes the oldest
// (waits for it and answers it) when the backend's on_done says its work has ended, when
// all `d` places are taken (Finish then waits), or, should on_done never come, after four
// times the job's predicted time and at least a second. Jobs finish in the order launched.
// A job's time for the cost model runs from when it could start on the device (its
// launch, or its predecessor's finish when that came later) to its finish, so t(n)
// learns the time each batch adds when batches follow each other, copies hidden.
//
// Idle spin: an instance thread that finds no job waits up to Options::idle_spin_us
// spinning (on an atomic, without the lock) before it sleeps on its condition variable,
// so that a job submitted within that time starts at once: no futex wake for the
// submitter, no wakeup latency for the job (tens of us when it comes from another core,
// more on a busy host). It spins only while jobs have been coming soon after it went idle:
// when its last idle period outlasted the bound, it sleeps at once, so sparse traffic
// burns nothing, and a busy instance (a job pending) never spins. Nor does it spin when
// the last job another thread submitted came from the CPU it is on: that submitter could
// not run while it spun. At most idle_spin_us of CPU per job.
//
// Threading: Choose/Submit/HasIdle are called by any thread holding the model version's
// lock (the one that queued work or finished a job, or the scheduler); jobs run on
// instance threads; `on_idle` is called on an instance thread after each job, without
// any pool lock held. Lock order: the pool's mu_ only; never held while running a job.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/status.h"
#include "runtime/cost_model.h"

namespace shoal::runtime {

struct PoolJob {
  int64_t batch_size = 1;
  // Runs on the instance thread and returns the items it executed (fewer than batch_size
  // when requests were cancelled in the meantime; 0 when none ran). Its duration, with
  // that count, feeds the instance's cost model.
  std::function<int64_t(backends::BackendInstance& instance, int instance_index)> run;
  // The two-phase form, used instead of `run` when set: it runs on the instance thread,
  // queues the job's work (BackendInstance::Launch on an instance that pipelines) and
  // returns the second half, which the same thread calls later, possibly after launching
  // later jobs, and which waits for the work, answers and returns what `run` would.
  // `on_done` must be called once when the work has ended (the backend's Launch takes it),
  // or before `launch` returns when it ran everything itself; it may come from any thread,
  // even after the second half has run. On an instance that does not pipeline the second
  // half is called at once.
  using Finish = std::function<int64_t()>;
  std::function<Finish(backends::BackendInstance& instance, int instance_index,
                       std::function<void()> on_done)>
      launch{};
};

struct InstanceStats {
  std::string name;
  int64_t executions = 0;
  int64_t busy_ns = 0;     // time spent running jobs
  int64_t created_ns = 0;  // when the instance became ready (clock time)
  // Idle periods of its thread: spun for a job (see "Idle spin"), slept on its condition
  // variable (a spin that ended without a job counts in both).
  int64_t idle_spins = 0, idle_sleeps = 0;
  double cost_a_ns = 0, cost_b_ns = 0;
  // BackendInstance::pipeline_bubble_ratio after its last job; -1 when not pipelined.
  double pipeline_bubble_ratio = -1;
  // BackendInstance::pipeline_depth (1: it does not pipeline), and how many of its jobs
  // were launched while another of its jobs was still in flight (their copies could
  // overlap its compute).
  int pipeline_depth = 1;
  int64_t overlapped_executions = 0;
  // BackendInstance::setups after its last job (or its creation): one-time set-ups, such
  // as plans prepared for new shapes.
  int64_t setups = 0;
  // BackendInstance::device_stats after its last job; gpu -1 on CPUs.
  backends::DeviceStats device;
};

class InstancePool {
 public:
  struct Options {
    backends::BackendModel* model = nullptr;  // outlives the pool
    std::vector<backends::InstanceInfo> instances;
    std::shared_ptr<Clock> clock;
    // Run on each instance thread after CreateInstance (warmup); an error fails Create.
    std::function<Status(backends::BackendInstance&, const backends::InstanceInfo&)> on_ready;
    // Called on an instance thread whenever an instance finishes a job.
    std::function<void()> on_idle;
    // Called once, on an instance thread and without the pool's lock, when an instance first
    // reports its device's context lost (backends::DeviceStats::context_lost).
    std::function<void()> on_device_lost;
    // Cost model prior per instance.
    double prior_a_ns = 100'000, prior_b_ns = 10'000;
    // The longest an idle instance thread spins for its next job before it sleeps, in
    // microseconds of real time (not the injected clock: it bounds CPU spent, not a
    // scheduling decision); 0: it sleeps at once. See "Idle spin" above. Default 50: a
    // little over the turnaround of a caller woken on another core (~20-40 us here).
    int64_t idle_spin_us = 50;
  };

  // Starts every instance thread and waits until all are created and warmed up.
  // If any fails, the others are stopped and the first error is returned.
  static StatusOr<std::unique_ptr<InstancePool>> Create(Options options);
  // Stops after running every submitted job; joins the threads.
  ~InstancePool();

  int size() const { return static_cast<int>(instances_.size()); }
  bool HasIdle() const;
  // The instance that would finish n items first, or -1 when none can take a job.
  int Choose(int64_t batch_size) const;
  // Queues a job on instance `index` (which must have come from Choose).
  void Submit(int index, PoolJob job);
  // The lowest predicted time for n items over all instances.
  int64_t PredictNs(int64_t batch_size) const;
  // The instances' cost models averaged, and the work already handed to them: the
  // predicted rest of each running job plus its pending one, averaged over instances.
  ServiceEstimate Service() const;
  std::vector<InstanceStats> Stats() const;
  // Jobs running or pending across instances.
  int busy_count() const;

 private:
  // What an instance's thread owns. Its state under mu_ is the InstanceState of the same
  // index in states_ (kept apart so the lock annotations can name mu_).
  struct Instance {
    backends::InstanceInfo info;
    std::thread thread;
    CondVar cv;
    // Set under mu_ whenever it is handed a job while idle, or stopping_; read without the lock by
    // the thread's idle spin.
    std::atomic<bool> wake{false};
    // Instance thread only: the real ns its last idle period lasted (from finding no job
    // to finding one); it spins only while this stays under the bound.
    int64_t last_idle_ns = 0;
  };
  // A job handed to an instance and not yet finished.
  struct Held {
    PoolJob job;
    uint64_t id = 0;          // for its on_done, which names it (MarkDone)
    bool done = false;        // its work has ended (on_done, or a run that returned)
    int64_t launched_ns = 0;  // when it was
    PoolJob::Finish finish;   // its second half, once launched
    // When its thread stops waiting for its on_done and finishes it anyway (real time;
    // set at the first wait).
    std::chrono::steady_clock::time_point give_up{};
  };
  // The jobs an instance holds, oldest first, in a fixed ring: no allocation per job, and
  // a job stays where it is until popped.
  class HeldJobs {
   public:
    static constexpr size_t kMax = 8;  // the most any instance holds (depth is at most 8)
    size_t size() const { return count_; }
    bool empty() const { return count_ == 0; }
    Held& operator[](size_t k) { return slots_[(head_ + k) % kMax]; }
    const Held& operator[](size_t k) const { return slots_[(head_ + k) % kMax]; }
    Held& front() { return slots_[head_]; }
    const Held& front() const { return slots_[head_]; }
    // The caller keeps size() below kMax (Submit refuses to go past an instance's capacity).
    void push_back(Held held) { slots_[(head_ + count_++) % kMax] = std::move(held); }
    // Drops the front job and what it captured (its batch, its answers' callbacks).
    void pop_front() {
      slots_[head_] = Held{};
      head_ = (head_ + 1) % kMax;
      --count_;
    }

   private:
    std::array<Held, kMax> slots_;
    size_t head_ = 0, count_ = 0;
  };
  struct InstanceState {
    // Oldest first; the front is the running job. At most max(2, depth) (a running and a
    // pending job, or `depth` launched ones); at most `depth` launched.
    HeldJobs jobs;
    size_t launched = 0;  // how many of `jobs` (a prefix) have been launched
    int depth = 1;        // the backend's pipeline_depth(), once created
    uint64_t next_id = 0;
    int64_t started_ns = 0;  // when the front job could begin (submitted to an idle
                             // instance, or its predecessor finished)
    CostModel cost;
    InstanceStats stats;
    Status init_status;
    bool init_done = false;
    int submit_cpu = -1;  // the CPU its last job from another thread was submitted on
    explicit InstanceState(const Options& o) : cost(o.prior_a_ns, o.prior_b_ns) {}
  };

  explicit InstancePool(Options options);
  void Run(size_t index) EXCLUDES(mu_);
  // A job's on_done: marks job `id` done (if it is still held) and wakes its instance's
  // thread. The id's bits from 40 up are the instance's index.
  void MarkDone(uint64_t id) EXCLUDES(mu_);
  // The most jobs instance `state` takes: a running and a pending one, or its depth.
  static size_t Capacity(const InstanceState& state) {
    return static_cast<size_t>(std::max(2, state.depth));
  }
  // Instance thread, without mu_: spins until inst->wake or idle_spin_us have passed.
  void SpinForJob(Instance* inst) const;
  void StopAll() EXCLUDES(mu_);
  bool AllInitDoneLocked() const REQUIRES(mu_);

  Options options_;
  // An instance reported its device's context lost (backends::DeviceStats::context_lost,
  // after a job): logs it and calls on_device_lost, the first time. Instance thread,
  // without mu_.
  void ReportDeviceLost(const Instance& inst);
  std::atomic<bool> device_lost_{false};  // reported already
  mutable Mutex mu_;
  CondVar init_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  // Fixed after Create; instances_[i] and states_[i] are the same instance.
  std::vector<std::unique_ptr<Instance>> instances_;
  std::vector<InstanceState> states_ GUARDED_BY(mu_);
};

}  // namespace shoal::runtime
