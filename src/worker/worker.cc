#include "worker/worker.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <utility>

namespace shoal::worker {
namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

std::string DefaultConsumer() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return std::string(host[0] ? host : "worker") + "-" + std::to_string(getpid());
}

Status Positive(int64_t value, const char* name) {
  if (value > 0) return Status::Ok();
  return InvalidArgument(std::string(name) + " must be positive; was " + std::to_string(value));
}

}  // namespace

Worker::Worker(WorkerOptions options, runtime::Server* server,
               std::shared_ptr<const PayloadCodec> codec)
    : options_(std::move(options)),
      server_(server),
      codec_(std::move(codec)),
      window_(options_.max_inflight) {}

StatusOr<std::unique_ptr<Worker>> Worker::Create(WorkerOptions o, runtime::Server* server,
                                                 std::shared_ptr<const PayloadCodec> codec) {
  if (o.stream.empty()) return InvalidArgument("the request stream name is empty");
  if (o.group.empty()) return InvalidArgument("the consumer group name is empty");
  if (o.consumer.empty()) o.consumer = DefaultConsumer();
  if (o.result_prefix.empty()) o.result_prefix = o.stream + ":result:";
  if (o.result_stream.empty()) o.result_stream = o.stream + ":results";
  if (o.dead_letter_stream.empty()) o.dead_letter_stream = o.stream + ":dead";
  RETURN_IF_ERROR(Positive(o.max_inflight, "max_inflight"));
  RETURN_IF_ERROR(Positive(o.claim_idle_ms, "claim_idle_ms"));
  RETURN_IF_ERROR(Positive(o.claim_interval_ms, "claim_interval_ms"));
  RETURN_IF_ERROR(Positive(o.max_deliveries, "max_deliveries"));
  RETURN_IF_ERROR(Positive(o.block_ms, "block_ms"));
  RETURN_IF_ERROR(Positive(o.max_payload_bytes, "max_payload_bytes"));
  RETURN_IF_ERROR(Positive(o.lag_interval_ms, "lag_interval_ms"));
  if (o.result_ttl_s < 0) {
    return InvalidArgument("result_ttl_s must be 0 or more; was " + std::to_string(o.result_ttl_s));
  }
  if (o.result_stream_maxlen < 0) {
    return InvalidArgument("result_stream_maxlen must be 0 or more; was " +
                           std::to_string(o.result_stream_maxlen));
  }
  if (server == nullptr || codec == nullptr) return InvalidArgument("no server or codec");
  // Reads block for block_ms; give every round trip ample time beyond that.
  const int timeout_ms = static_cast<int>(std::min<int64_t>(o.block_ms + 10000, 600000));
  std::unique_ptr<Worker> w(new Worker(std::move(o), server, std::move(codec)));
  ASSIGN_OR_RETURN(w->reader_, RedisClient::Connect(w->options_.redis, timeout_ms));
  ASSIGN_OR_RETURN(w->writer_, RedisClient::Connect(w->options_.redis, timeout_ms));
  ASSIGN_OR_RETURN(RedisReply r, w->reader_->Command({"XGROUP", "CREATE", w->options_.stream,
                                                      w->options_.group, "0", "MKSTREAM"}));
  if (r.is_error() && r.str.rfind("BUSYGROUP", 0) != 0) {
    return FailedPrecondition("cannot create group '" + w->options_.group + "' on stream '" +
                              w->options_.stream + "': " + r.str);
  }
  return w;
}

Worker::~Worker() {
  Stop();
  MutexLock lock(&mu_);
  while (running_) run_cv_.Wait(&mu_);
}

void Worker::Stop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  reader_cv_.SignalAll();
}

WorkerStats Worker::stats() const {
  WorkerStats s;
  s.read_new = read_new_;
  s.claimed = claimed_;
  s.results_written = results_written_;
  s.results_duplicate = results_duplicate_;
  s.acked = acked_;
  s.dead_malformed = dead_malformed_;
  s.dead_failed = dead_failed_;
  s.dead_deliveries = dead_deliveries_;
  s.retries_here = retries_here_;
  s.retries_later = retries_later_;
  s.redis_errors = redis_errors_;
  s.group_lag = group_lag_;
  s.group_pending = group_pending_;
  MutexLock lock(&mu_);
  s.held = held_;
  s.capacity = window_.limit();
  return s;
}

void Worker::NoteRedisError(const Status& status) {
  ++redis_errors_;
  // At most one line a second: a Redis outage would otherwise flood the log.
  const int64_t now = NowNs();
  int64_t last = last_error_log_ns_;
  if (now - last > 1000000000 && last_error_log_ns_.compare_exchange_strong(last, now)) {
    spdlog::warn("worker: {}", status.ToString());
  }
}

void Worker::Run() {
  {
    MutexLock lock(&mu_);
    running_ = true;
  }
  spdlog::info("worker {} consuming stream '{}' as group '{}' (at most {} entries held)",
               options_.consumer, options_.stream, options_.group, options_.max_inflight);
  writer_thread_ = std::thread([this] { WriterLoop(); });
  auto next_claim = SteadyClock::now();
  auto next_lag = SteadyClock::now();
  const auto claim_every = std::chrono::milliseconds(options_.claim_interval_ms);
  while (true) {
    std::vector<JobPtr> due;
    const int64_t room = WaitForRoom(&due);
    for (JobPtr& job : due) Dispatch(std::move(job));
    {
      MutexLock lock(&mu_);
      if (stopping_) break;
    }
    const auto now = SteadyClock::now();
    if (now >= next_lag) {
      RefreshLag();
      next_lag = now + std::chrono::milliseconds(options_.lag_interval_ms);
    }
    if (room <= 0) continue;
    if (now >= next_claim) {
      ClaimIdle(room);
      // A scan that did not wrap around continues at once.
      next_claim = claim_cursor_ == "0-0" ? now + claim_every : now;
      continue;
    }
    ReadNew(room);
  }
  // Stopping: release what waits for a retry (it stays pending for another worker),
  // then wait for everything submitted to be answered and written.
  MutexLock lock(&mu_);
  for (const JobPtr& job : retry_) held_ids_.erase(job->entry.id);
  held_ -= static_cast<int64_t>(retry_.size());
  retry_.clear();
  while (held_ > 0) reader_cv_.Wait(&mu_);
  writer_exit_ = true;
  writer_cv_.SignalAll();
  lock.Unlock();
  writer_thread_.join();
  RefreshLag();
  spdlog::info("worker {} stopped: every entry it ran is answered and acknowledged",
               options_.consumer);
  lock.Lock();
  running_ = false;
  run_cv_.SignalAll();
}

int64_t Worker::WaitForRoom(std::vector<JobPtr>* due) {
  MutexLock lock(&mu_);
  // At most one wait, so that a full worker still refreshes the lag for its metrics.
  for (int pass = 0; pass < 2 && !stopping_; ++pass) {
    const auto now = SteadyClock::now();
    auto next_retry = SteadyClock::time_point::max();
    for (size_t i = 0; i < retry_.size();) {
      if (retry_[i]->not_before <= now) {
        due->push_back(std::move(retry_[i]));
        retry_[i] = std::move(retry_.back());
        retry_.pop_back();
      } else {
        next_retry = std::min(next_retry, retry_[i]->not_before);
        ++i;
      }
    }
    const int64_t room = window_.limit() - held_;
    if (room > 0 || !due->empty() || pass == 1) return std::max<int64_t>(room, 0);
    // Full: wake for room, a retry that is due, or after block_ms.
    const auto wake = std::min(next_retry, now + std::chrono::milliseconds(options_.block_ms));
    reader_cv_.WaitUntil(&mu_, wake);
  }
  return 0;
}

std::vector<Worker::JobPtr> Worker::Hold(std::vector<StreamEntry> entries) {
  std::vector<JobPtr> jobs;
  MutexLock lock(&mu_);
  for (StreamEntry& e : entries) {
    // Claimed from ourselves while it still runs here (slower than claim_idle_ms):
    // it will be answered by the run in progress.
    if (!held_ids_.insert(e.id).second) continue;
    auto job = std::make_shared<Job>();
    job->entry = std::move(e);
    jobs.push_back(std::move(job));
    ++held_;
  }
  return jobs;
}

void Worker::ReadNew(int64_t room) {
  auto reply = reader_->Command({"XREADGROUP", "GROUP", options_.group, options_.consumer, "COUNT",
                                 std::to_string(room), "BLOCK", std::to_string(options_.block_ms),
                                 "STREAMS", options_.stream, ">"});
  if (!reply.ok()) {
    NoteRedisError(reply.status());
    MutexLock lock(&mu_);
    if (!stopping_) reader_cv_.WaitFor(&mu_, std::chrono::milliseconds(200));
    return;
  }
  if (reply->is_error()) {
    // NOGROUP: the stream or group was deleted under us; make them again.
    NoteRedisError(Unavailable("XREADGROUP: " + reply->str));
    if (reply->str.rfind("NOGROUP", 0) == 0) {
      (void)reader_->Command(
          {"XGROUP", "CREATE", options_.stream, options_.group, "0", "MKSTREAM"});
      return;
    }
    // Anything else (NOPERM, WRONGTYPE, LOADING...) is not cured by asking again at once.
    MutexLock lock(&mu_);
    if (!stopping_) reader_cv_.WaitFor(&mu_, std::chrono::milliseconds(200));
    return;
  }
  auto entries = EntriesFromReadReply(*reply);
  if (!entries.ok()) {
    NoteRedisError(entries.status());
    MutexLock lock(&mu_);
    if (!stopping_) reader_cv_.WaitFor(&mu_, std::chrono::milliseconds(200));
    return;
  }
  read_new_ += static_cast<int64_t>(entries->size());
  for (JobPtr& job : Hold(std::move(entries).value())) Dispatch(std::move(job));
}

void Worker::ClaimIdle(int64_t room) {
  auto reply = reader_->Command({"XAUTOCLAIM", options_.stream, options_.group, options_.consumer,
                                 std::to_string(options_.claim_idle_ms), claim_cursor_, "COUNT",
                                 std::to_string(room)});
  if (!reply.ok() || reply->is_error()) {
    NoteRedisError(reply.ok() ? Unavailable("XAUTOCLAIM: " + reply->str) : reply.status());
    return;
  }
  auto claimed = EntriesFromAutoClaimReply(*reply);
  if (!claimed.ok()) {
    NoteRedisError(claimed.status());
    return;
  }
  claim_cursor_ = claimed->next_cursor;
  if (claimed->entries.empty()) return;
  // Entries claimed from ourselves while they still run here are not counted again.
  std::vector<JobPtr> jobs = Hold(std::move(claimed->entries));
  claimed_ += static_cast<int64_t>(jobs.size());
  if (jobs.empty()) return;
  // One round trip: each entry's delivery count, and whether its request was answered.
  std::vector<std::vector<std::string>> commands;
  for (const JobPtr& job : jobs) {
    job->request_id = UsableRequestId(job->entry);
    commands.push_back(
        {"XPENDING", options_.stream, options_.group, job->entry.id, job->entry.id, "1"});
    commands.push_back({"EXISTS", options_.result_prefix + job->request_id});
  }
  auto replies = reader_->Pipeline(commands);
  if (!replies.ok()) NoteRedisError(replies.status());
  for (size_t i = 0; i < jobs.size(); ++i) {
    JobPtr& job = jobs[i];
    job->entry.deliveries = 2;  // at least: it was claimed
    if (replies.ok()) {
      if (auto n = DeliveriesFromPendingReply((*replies)[2 * i]); n.ok())
        job->entry.deliveries = *n;
      const RedisReply& exists = (*replies)[2 * i + 1];
      if (!job->request_id.empty() && exists.type == RedisReply::Type::kInteger &&
          exists.integer > 0) {
        job->kind = Job::Kind::kAckOnly;
        Complete(std::move(job));
        continue;
      }
    }
    Dispatch(std::move(job));
  }
}

void Worker::RefreshLag() {
  auto reply = reader_->Command({"XINFO", "GROUPS", options_.stream});
  if (!reply.ok() || reply->is_error()) return;
  auto info = GroupFromInfoReply(*reply, options_.group);
  if (!info.ok()) return;
  group_lag_ = info->lag;
  group_pending_ = info->pending;
}

void Worker::Dispatch(JobPtr job) {
  if (job->kind == Job::Kind::kRun && job->local_retries == 0) {
    job->request_id = UsableRequestId(job->entry);
    if (DeliveriesExhausted(job->entry.deliveries, options_.max_deliveries)) {
      job->kind = Job::Kind::kDead;
      job->dead_code = StatusCode::kUnavailable;
      job->dead_reason = "delivered " + std::to_string(job->entry.deliveries) +
                         " times without an answer (max_deliveries " +
                         std::to_string(options_.max_deliveries) + ")";
      ++dead_deliveries_;
      Complete(std::move(job));
      return;
    }
  }
  auto item = ParseEntry(job->entry, options_.max_payload_bytes);
  StatusOr<PayloadCodec::Decoded> decoded =
      item.ok() ? codec_->Decode(std::move(item->payload), item->header_length)
                : StatusOr<PayloadCodec::Decoded>(item.status());
  if (!decoded.ok()) {
    job->kind = Job::Kind::kDead;
    job->dead_code = decoded.status().code();
    job->dead_reason = "malformed: " + decoded.status().message();
    ++dead_malformed_;
    Complete(std::move(job));
    return;
  }
  runtime::InferRequest request = std::move(decoded->request);
  request.model_name = item->model;
  request.model_version = item->version;
  if (request.id.empty()) request.id = item->request_id;
  job->encoding = std::move(decoded->encoding);
  server_->Infer(std::move(request), [this, job](runtime::InferResponse response) mutable {
    job->response = std::move(response);
    Complete(std::move(job));
  });
}

void Worker::Complete(JobPtr job) {
  MutexLock lock(&mu_);
  done_.push_back(std::move(job));
  writer_cv_.Signal();
}

}  // namespace shoal::worker
