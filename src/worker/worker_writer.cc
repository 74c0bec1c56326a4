// The writer half of Worker (worker.h): results, dead letters and acknowledgements, and
// the worker's metrics.
#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "worker/internal/result_script.h"
#include "worker/worker.h"

namespace shoal::worker {
namespace {

// Jobs written in one pipelined round trip at most.
constexpr size_t kMaxWriteBatch = 512;

}  // namespace

void Worker::WriterLoop() {
  while (true) {
    std::vector<JobPtr> batch;
    {
      MutexLock lock(&mu_);
      while (done_.empty() && !writer_exit_) writer_cv_.Wait(&mu_);
      if (done_.empty()) return;  // writer_exit_: nothing is held any more
      while (!done_.empty() && batch.size() < kMaxWriteBatch) {
        batch.push_back(std::move(done_.front()));
        done_.pop_front();
      }
    }
    WriteBatch(std::move(batch));
  }
}

std::vector<std::string> Worker::ResultScript(const Job& job, std::string_view status,
                                              std::string_view error, std::string_view body,
                                              std::string_view header_length,
                                              std::string_view dead_reason) const {
  std::vector<std::string> argv = {"EVAL",
                                   internal::kResultScript,
                                   "4",
                                   options_.result_prefix + job.request_id,
                                   options_.result_stream,
                                   options_.stream,
                                   options_.dead_letter_stream,
                                   options_.group,
                                   job.entry.id,
                                   job.request_id,
                                   std::string(status),
                                   std::string(error),
                                   std::string(body),
                                   std::string(header_length),
                                   std::to_string(options_.result_ttl_s),
                                   std::string(dead_reason),
                                   std::to_string(options_.result_stream_maxlen),
                                   std::to_string(job.entry.deliveries),
                                   options_.consumer};
  if (!dead_reason.empty()) {
    for (const auto& [k, v] : job.entry.fields) {
      argv.push_back(k);
      argv.push_back(v);
    }
  }
  return argv;
}

void Worker::WriteBatch(std::vector<JobPtr> jobs) {
  std::vector<std::vector<std::string>> commands;
  std::vector<const Job*> commanded;  // the job of each command
  std::vector<JobPtr> released;       // leave this worker (written, or left pending)
  std::vector<JobPtr> retry;          // run here again after a back-off
  int64_t answered = 0;
  const auto now = std::chrono::steady_clock::now();
  for (JobPtr& job : jobs) {
    switch (job->kind) {
      case Job::Kind::kAckOnly:
        commands.push_back({"XACK", options_.stream, options_.group, job->entry.id});
        break;
      case Job::Kind::kDead:
        commands.push_back(ResultScript(*job, StatusCodeName(job->dead_code), job->dead_reason, "",
                                        "", job->dead_reason));
        break;
      case Job::Kind::kRun: {
        const Status& status = job->response.status;
        switch (Decide(status.code(), job->entry.deliveries, job->local_retries,
                       options_.max_deliveries)) {
          case Disposition::kAnswer: {
            auto encoded = codec_->Encode(job->response, job->encoding);
            if (encoded.ok()) {
              ++answered;
              const std::string header_length =
                  encoded->header_length ? std::to_string(*encoded->header_length) : "";
              commands.push_back(ResultScript(*job, "OK", "", encoded->body, header_length, ""));
            } else {
              ++dead_failed_;
              const std::string reason =
                  "failed: cannot encode the response: " + encoded.status().message();
              commands.push_back(ResultScript(*job, StatusCodeName(encoded.status().code()),
                                              encoded.status().message(), "", "", reason));
            }
            break;
          }
          case Disposition::kRetryHere:
            ++retries_here_;
            ++job->local_retries;
            job->not_before =
                now + std::chrono::milliseconds(LocalRetryDelayMs(job->local_retries));
            retry.push_back(std::move(job));
            continue;
          case Disposition::kRetryLater:
            ++retries_later_;
            released.push_back(std::move(job));
            continue;
          case Disposition::kDeadLetter: {
            ++dead_failed_;
            std::string reason = "failed: " + status.ToString();
            if (status.code() != StatusCode::kInvalidArgument &&
                status.code() != StatusCode::kNotFound) {
              reason += " (delivery " + std::to_string(job->entry.deliveries) + ")";
            }
            commands.push_back(ResultScript(*job, StatusCodeName(status.code()), status.message(),
                                            "", "", reason));
            break;
          }
        }
        break;
      }
    }
    commanded.push_back(job.get());
    released.push_back(std::move(job));
  }

  if (!commands.empty()) {
    auto replies = writer_->Pipeline(commands);
    if (!replies.ok()) {
      // Nothing is acknowledged: the entries stay pending and are claimed again later;
      // a result that did get stored makes that a no-op.
      NoteRedisError(replies.status());
    } else {
      for (size_t i = 0; i < replies->size(); ++i) {
        const RedisReply& r = (*replies)[i];
        if (r.is_error() || r.type != RedisReply::Type::kInteger) {
          NoteRedisError(Unavailable("writing entry " + commanded[i]->entry.id + ": " + r.str));
          continue;
        }
        ++acked_;
        if (commands[i][0] == "EVAL" && !commanded[i]->request_id.empty()) {
          if (r.integer == 1) {
            ++results_written_;
          } else {
            ++results_duplicate_;
          }
        }
      }
    }
  }

  MutexLock lock(&mu_);
  for (int64_t i = 0; i < answered; ++i) window_.OnAnswered();
  if (!retry.empty()) window_.OnOverloaded();
  for (JobPtr& job : retry) {
    if (stopping_) {
      released.push_back(std::move(job));  // left pending for another worker
    } else {
      retry_.push_back(std::move(job));
    }
  }
  for (const JobPtr& job : released) held_ids_.erase(job->entry.id);
  held_ -= static_cast<int64_t>(released.size());
  reader_cv_.SignalAll();
}

namespace {

std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string RenderWorkerMetrics(const Worker& worker) {
  const WorkerStats s = worker.stats();
  const std::string labels = "stream=\"" + LabelValue(worker.options().stream) + "\",group=\"" +
                             LabelValue(worker.options().group) + "\"";
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto sample = [&](const char* name, const std::string& extra, int64_t value) {
    out += name;
    out += "{" + labels + (extra.empty() ? "" : "," + extra) + "} " + std::to_string(value) + "\n";
  };
  family("shoal_worker_entries_total", "counter",
         "Stream entries taken by this worker: new ones read, idle ones claimed from others.");
  sample("shoal_worker_entries_total", "source=\"new\"", s.read_new);
  sample("shoal_worker_entries_total", "source=\"claimed\"", s.claimed);
  family("shoal_worker_results_total", "counter",
         "Answers by whether they were stored or dropped because the request id had a result.");
  sample("shoal_worker_results_total", "outcome=\"written\"", s.results_written);
  sample("shoal_worker_results_total", "outcome=\"duplicate\"", s.results_duplicate);
  family("shoal_worker_acked_total", "counter", "Stream entries acknowledged.");
  sample("shoal_worker_acked_total", "", s.acked);
  family("shoal_worker_dead_letters_total", "counter",
         "Entries moved to the dead-letter stream, by reason.");
  sample("shoal_worker_dead_letters_total", "reason=\"malformed\"", s.dead_malformed);
  sample("shoal_worker_dead_letters_total", "reason=\"failed\"", s.dead_failed);
  sample("shoal_worker_dead_letters_total", "reason=\"deliveries\"", s.dead_deliveries);
  family("shoal_worker_retries_total", "counter",
         "Retries: here after the runtime refused for the SLO, or left for a later delivery.");
  sample("shoal_worker_retries_total", "kind=\"here\"", s.retries_here);
  sample("shoal_worker_retries_total", "kind=\"redelivery\"", s.retries_later);
  family("shoal_worker_redis_errors_total", "counter", "Failed round trips to Redis.");
  sample("shoal_worker_redis_errors_total", "", s.redis_errors);
  family("shoal_worker_held_entries", "gauge",
         "Entries read by this worker and not yet acknowledged or released.");
  sample("shoal_worker_held_entries", "", s.held);
  family("shoal_worker_capacity_entries", "gauge",
         "The capacity window: most entries this worker holds at once now.");
  sample("shoal_worker_capacity_entries", "", s.capacity);
  family("shoal_worker_group_lag_entries", "gauge",
         "Entries of the stream not yet read by the group (-1: unknown).");
  sample("shoal_worker_group_lag_entries", "", s.group_lag);
  family("shoal_worker_group_pending_entries", "gauge",
         "Entries read by the group and not yet acknowledged, over all its consumers.");
  sample("shoal_worker_group_pending_entries", "", s.group_pending);
  return out;
}

}  // namespace shoal::worker
