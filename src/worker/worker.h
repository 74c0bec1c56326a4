// Worker: consumes inference requests from a Redis stream through a consumer group, runs
// them through the in-process runtime (batching, instances, SLO) and writes each result
// under its request id, then acknowledges the entry (docs/worker.md).
//
// Delivery: at least once, answered once. Redis keeps every entry read by a consumer in
// the group's pending list until it is acknowledged; entries left pending by a consumer
// that died are claimed by the living ones (XAUTOCLAIM) once idle for claim_idle_ms. A
// result is written by one Lua script that stores it only if no result exists for that
// request id, appends it to the result stream only then, and acknowledges the entry in
// the same atomic step, so a request that runs twice (its worker died after writing,
// before acknowledging; or it was claimed while slow) still has exactly one result.
// A claimed entry whose result already exists is acknowledged without running.
//
// Poison: a malformed entry, one that fails permanently, and one delivered more than
// max_deliveries times go to the dead-letter stream with the reason (policy.h), with
// an error result when the entry has a usable request id.
//
// Backpressure: the worker holds at most CapacityWindow::limit() entries (read and not
// yet acknowledged or released), at most max_inflight; XREADGROUP and XAUTOCLAIM ask
// for no more than the free room. The window shrinks when the runtime says the SLO
// cannot be met (policy.h).
//
// Threads: Run() reads (XREADGROUP, XAUTOCLAIM, XINFO) on the calling thread; a writer
// thread writes results, dead letters and acknowledgements (its own connection,
// pipelined); runtime callbacks only queue the answer for the writer. Stop() may be
// called from any thread (a signal handler thread). Lock order: mu_ only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "runtime/server.h"
#include "worker/entry.h"
#include "worker/payload_codec.h"
#include "worker/policy.h"
#include "worker/redis_client.h"

namespace shoal::worker {

struct WorkerOptions {
  RedisAddress redis;
  std::string stream;  // the request stream; required
  std::string group;   // the consumer group; required. Created if missing, reading the
                       // stream from its start (entries added before any worker ran too)
  // This worker's name in the group; must be unique among live workers. Default:
  // "<hostname>-<pid>".
  std::string consumer;
  // Where results go: a hash <result_prefix><request id> with fields status, body,
  // error, header_length; and one entry (id, status) per result in result_stream.
  // Defaults: "<stream>:result:" and "<stream>:results".
  std::string result_prefix;
  std::string result_stream;
  // Default "<stream>:dead".
  std::string dead_letter_stream;
  // Result hashes expire after this many seconds; 0 = never. Default one day.
  int64_t result_ttl_s = 86400;
  // The result stream is trimmed to about this many entries; 0 = never. Default 1,000,000.
  int64_t result_stream_maxlen = 1000000;
  // Most entries held at once (the top of the capacity window). Default 64.
  int64_t max_inflight = 64;
  // An entry pending this long (ms) without being acknowledged is claimed from its
  // consumer, presumed dead. Must exceed the longest time a request runs. Default 30 s.
  int64_t claim_idle_ms = 30000;
  // How often (ms) to look for such entries. Default 1 s.
  int64_t claim_interval_ms = 1000;
  // Deliveries after which an entry that still has no answer is dead-lettered. Default 5.
  int64_t max_deliveries = 5;
  // XREADGROUP BLOCK time (ms): how long a read waits for new entries; also bounds how
  // long Stop() waits for the reader to notice. Default 100.
  int64_t block_ms = 100;
  // Largest payload accepted; larger entries are dead-lettered. Default 64 MiB.
  int64_t max_payload_bytes = int64_t{64} << 20;
  // How often (ms) the group's lag and pending count are read for the metrics. Default 1 s.
  int64_t lag_interval_ms = 1000;
};

// Counters for the metrics (RenderWorkerMetrics) and tests.
struct WorkerStats {
  int64_t read_new = 0;           // entries read with XREADGROUP >
  int64_t claimed = 0;            // entries claimed from idle consumers (XAUTOCLAIM)
  int64_t results_written = 0;    // results stored (first answer for their request id)
  int64_t results_duplicate = 0;  // answers dropped: the request id had a result already
  int64_t acked = 0;              // entries acknowledged
  int64_t dead_malformed = 0;     // dead-lettered: malformed entry or payload
  int64_t dead_failed = 0;        // dead-lettered: failed permanently, or transiently too often
  int64_t dead_deliveries = 0;    // dead-lettered: delivered more than max_deliveries times
  int64_t retries_here = 0;       // re-run here after the runtime refused it (SLO)
  int64_t retries_later = 0;      // left pending for a later delivery (transient failure)
  int64_t redis_errors = 0;       // failed round trips to Redis
  int64_t held = 0;               // entries held now (read, not acknowledged or released)
  int64_t capacity = 0;           // the capacity window now
  int64_t group_lag = -1;         // entries of the stream not yet read by the group; -1 unknown
  int64_t group_pending = -1;     // entries read by the group, not yet acknowledged
};

class Worker {
 public:
  // Checks the options (INVALID_ARGUMENT naming the bad value), connects twice (reader,
  // writer) and creates the group if it does not exist (UNAVAILABLE when Redis cannot
  // be reached). `server` must outlive the Worker.
  static StatusOr<std::unique_ptr<Worker>> Create(WorkerOptions options, runtime::Server* server,
                                                  std::shared_ptr<const PayloadCodec> codec);
  ~Worker();  // Stop() and waits for Run() to return
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Consumes until Stop(); then stops reading, waits until every entry it runs is
  // answered, written and acknowledged, and returns. Entries it holds but could not
  // finish (waiting for a retry) stay pending for the other workers. Call once.
  void Run();
  // Any thread; returns at once.
  void Stop();

  const WorkerOptions& options() const { return options_; }
  WorkerStats stats() const;

 private:
  // One entry from the moment it is read until it is released (acknowledged, or left
  // pending for another delivery).
  struct Job {
    enum class Kind { kRun, kDead, kAckOnly };
    StreamEntry entry;
    Kind kind = Kind::kRun;
    std::string request_id;   // "" when the entry has no usable one
    std::string dead_reason;  // kDead
    StatusCode dead_code = StatusCode::kInvalidArgument;
    int local_retries = 0;
    std::chrono::steady_clock::time_point not_before;
    std::shared_ptr<const void> encoding;
    runtime::InferResponse response;
  };
  using JobPtr = std::shared_ptr<Job>;
  Worker(WorkerOptions options, runtime::Server* server, std::shared_ptr<const PayloadCodec> codec);

  // Reader thread.
  void ReadNew(int64_t room);
  void ClaimIdle(int64_t room);
  void RefreshLag();
  // Parses, decodes and submits one entry the reader got (already counted in held_).
  void Dispatch(JobPtr job);
  void Complete(JobPtr job) EXCLUDES(mu_);
  // Room to read: the window minus what is held, or 0. Moves retries that are due to `due`.
  int64_t WaitForRoom(std::vector<JobPtr>* due) EXCLUDES(mu_);
  // Counts `entries` as held (skipping those already held here) and returns their jobs.
  std::vector<JobPtr> Hold(std::vector<StreamEntry> entries) EXCLUDES(mu_);
  void NoteRedisError(const Status& status);

  // Writer thread.
  void WriterLoop();
  void WriteBatch(std::vector<JobPtr> jobs);
  std::vector<std::string> ResultScript(const Job& job, std::string_view status,
                                        std::string_view error, std::string_view body,
                                        std::string_view header_length,
                                        std::string_view dead_reason) const;

  const WorkerOptions options_;
  runtime::Server* const server_;
  const std::shared_ptr<const PayloadCodec> codec_;
  std::unique_ptr<RedisClient> reader_;
  std::unique_ptr<RedisClient> writer_;
  std::thread writer_thread_;

  mutable Mutex mu_;
  CondVar reader_cv_;  // room freed, a retry due, or Stop
  CondVar writer_cv_;  // done_ non-empty, or the writer may exit
  CondVar run_cv_;     // Run() returned
  bool stopping_ GUARDED_BY(mu_) = false;
  bool writer_exit_ GUARDED_BY(mu_) = false;
  bool running_ GUARDED_BY(mu_) = false;
  CapacityWindow window_ GUARDED_BY(mu_);
  int64_t held_ GUARDED_BY(mu_) = 0;
  std::set<std::string> held_ids_ GUARDED_BY(mu_);
  std::deque<JobPtr> done_ GUARDED_BY(mu_);
  std::vector<JobPtr> retry_ GUARDED_BY(mu_);

  std::string claim_cursor_ = "0-0";  // reader thread only
  std::atomic<int64_t> read_new_{0}, claimed_{0}, results_written_{0}, results_duplicate_{0},
      acked_{0}, dead_malformed_{0}, dead_failed_{0}, dead_deliveries_{0}, retries_here_{0},
      retries_later_{0}, redis_errors_{0}, group_lag_{-1}, group_pending_{-1};
  std::atomic<int64_t> last_error_log_ns_{0};
};

// The worker's metrics in the Prometheus text format (docs/metrics.md), labelled with
// its stream and group.
std::string RenderWorkerMetrics(const Worker& worker);

}  // namespace shoal::worker
