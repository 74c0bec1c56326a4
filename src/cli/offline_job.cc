#include "cli/offline_job.h"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "cli/internal/done_log.h"
#include "cli/internal/offline_rows.h"

namespace shoal::cli {
namespace {

using internal::DoneLog;
using internal::EndsWith;
using internal::OpenSource;
using internal::RowSink;

}  // namespace

std::string FormatProgress(const OfflineJobProgress& p, int width) {
  // Progress toward what this run will do: every row, or fewer under --limit.
  const int64_t goal = p.target_rows > 0 ? p.target_rows : p.total_rows;
  const double fraction =
      goal > 0 ? std::min(1.0, static_cast<double>(p.done_rows) / static_cast<double>(goal)) : 1;
  const int filled = static_cast<int>(fraction * width);
  const double rate =
      p.elapsed_s > 0 ? static_cast<double>(p.done_rows - p.resumed_rows) / p.elapsed_s : 0;
  std::string eta = "--:--";
  if (rate > 0) {
    const int64_t s =
        static_cast<int64_t>(static_cast<double>(std::max<int64_t>(goal - p.done_rows, 0)) / rate);
    eta = fmt::format("{}:{:02}", s / 60, s % 60);
  }
  std::string out =
      fmt::format("[{}{}] {:3.0f}%  {}/{} rows", std::string(filled, '#'),
                  std::string(width - filled, '.'), fraction * 100, p.done_rows, goal);
  if (goal < p.total_rows) out += fmt::format(" (of {})", p.total_rows);
  out += fmt::format("  {:.0f} rows/s  ETA {}", rate, eta);
  if (p.failed_rows > 0) out += fmt::format("  {} skipped", p.failed_rows);
  return out;
}

OfflineJobResult RunOfflineJob(runtime::Server& server, const OfflineJobOptions& options,
                               const std::atomic<bool>* interrupted,
                               const std::function<void(const OfflineJobProgress&)>& on_progress) {
  OfflineJobResult result;
  auto mv = server.GetModel(options.model, options.model_version);
  if (!mv.ok()) {
    result.status = mv.status();
    return result;
  }
  const runtime::ModelSignature sig = (*mv)->signature();
  auto source = OpenSource(options.input_path, sig);
  if (!source.ok()) {
    result.status = source.status();
    return result;
  }
  const int64_t rows = (*source)->rows();
  const bool jsonl_out = EndsWith(options.output_path, ".jsonl");
  if (!jsonl_out && !EndsWith(options.output_path, ".npy")) {
    result.status =
        InvalidArgument("output '" + options.output_path + "' must end in .jsonl or .npy");
    return result;
  }
  if (!jsonl_out) {
    for (const auto& o : sig.outputs) {
      if (o.dtype == DataType::kBytes) {
        result.status = InvalidArgument("output '" + o.name +
                                        "' is BYTES, which .npy cannot hold; write .jsonl");
        return result;
      }
    }
  }
  internal::JobIdentity identity;
  identity.input_path = options.input_path;
  identity.input_bytes = (*source)->content_bytes();
  identity.input_hash = (*source)->content_hash();
  identity.model = options.model + ":" + std::to_string((*mv)->version());
  auto done = DoneLog::Read(options.output_path + ".done", identity, rows, options.resume);
  if (!done.ok()) {
    result.status = done.status();
    return result;
  }
  const bool resuming = !(*done)->done().empty();
  if (resuming) {
    // The rows the log records live in these files: without one, resuming would leave
    // them missing (or zero) in the result.
    for (const std::string& file : internal::OutputFiles(options.output_path, sig)) {
      if (!std::filesystem::exists(file)) {
        result.status = FailedPrecondition(
            "cannot resume: '" + file + "' is missing, but '" + (*done)->path() + "' records " +
            std::to_string((*done)->done().size()) +
            " finished rows written to it; nothing was changed. Delete '" + (*done)->path() +
            "', or pass --no-resume, to compute every row again");
        return result;
      }
    }
  }
  std::unique_ptr<RowSink> sink;
  if (jsonl_out) {
    auto s = internal::OpenJsonlSink(options.output_path, resuming);
    if (!s.ok()) {
      result.status = s.status();
      return result;
    }
    sink = std::move(s).value();
  } else {
    sink = internal::MakeNpySink(options.output_path, sig, rows, resuming);
  }
  if (Status s = (*done)->Start(); !s.ok()) {
    result.status = s;
    return result;
  }

  OfflineJobProgress& progress = result.progress;
  progress.total_rows = rows;
  progress.resumed_rows = static_cast<int64_t>((*done)->done().size());
  progress.done_rows = progress.resumed_rows;
  progress.target_rows = rows;
  if (options.limit_rows > 0)
    progress.target_rows = std::min(rows, progress.resumed_rows + options.limit_rows);
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  Status first_error;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto last_report = start;

  // Requires mu.
  auto record_failure = [&](int64_t i, const Status& s) {
    const Status row_error = s.WithPrefix("row " + std::to_string(i));
    if (options.on_error == OfflineJobOptions::OnError::kSkip) {
      ++progress.failed_rows;
      ++progress.done_rows;
      if (Status w = sink->WriteError(i, row_error); !w.ok() && first_error.ok()) first_error = w;
      if (Status w = (*done)->Append(i); !w.ok() && first_error.ok()) first_error = w;
    } else if (first_error.ok()) {
      first_error = row_error;
      result.failed_row = i;
    }
  };

  int64_t submitted = 0;
  bool limited = false;
  for (int64_t i = 0; i < rows; ++i) {
    if ((*done)->done().count(i)) continue;
    if (options.limit_rows > 0 && submitted >= options.limit_rows) {
      limited = true;
      break;
    }
    ++submitted;
    std::unique_lock<std::mutex> lock(mu);
    while (in_flight >= options.concurrency) {
      cv.wait_for(lock, std::chrono::milliseconds(200));
      if (on_progress &&
          std::chrono::steady_clock::now() - last_report > std::chrono::milliseconds(200)) {
        progress.elapsed_s = elapsed();
        on_progress(progress);
        last_report = std::chrono::steady_clock::now();
      }
    }
    if (!first_error.ok() || (interrupted && interrupted->load())) break;
    lock.unlock();
    auto inputs = (*source)->Row(i);
    lock.lock();
    if (!inputs.ok()) {
      record_failure(i, inputs.status());
      continue;
    }
    ++in_flight;
    lock.unlock();
    runtime::InferRequest request;
    request.model_name = options.model;
    request.model_version = options.model_version;
    request.id = std::to_string(i);
    request.best_effort = true;  // offline: no deadline, no admission by predicted wait
    request.inputs = std::move(inputs).value();
    server.Infer(std::move(request), [&, i](runtime::InferResponse response) {
      std::lock_guard<std::mutex> guard(mu);
      if (response.status.ok()) {
        if (Status w = sink->Write(i, response.outputs); w.code() == StatusCode::kInvalidArgument) {
          record_failure(i, w);
        } else if (!w.ok()) {
          if (first_error.ok()) first_error = w;
        } else if (Status a = (*done)->Append(i); !a.ok()) {
          if (first_error.ok()) first_error = a;
        } else {
          ++progress.done_rows;
        }
      } else {
        record_failure(i, response.status);
      }
      --in_flight;
      cv.notify_all();
    });
    if (on_progress &&
        std::chrono::steady_clock::now() - last_report > std::chrono::milliseconds(200)) {
      std::lock_guard<std::mutex> guard(mu);
      progress.elapsed_s = elapsed();
      on_progress(progress);
      last_report = std::chrono::steady_clock::now();
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return in_flight == 0; });
  progress.elapsed_s = elapsed();
  result.status = first_error;
  result.interrupted = interrupted && interrupted->load() && progress.done_rows < rows;
  result.limited = !result.interrupted && limited && progress.done_rows < rows;
  if (on_progress) on_progress(progress);
  return result;
}

}  // namespace shoal::cli
