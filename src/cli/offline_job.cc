#include "cli/offline_job.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "cli/internal/offline_rows.h"

namespace shoal::cli {
namespace {

using internal::EndsWith;
using internal::OpenSource;
using internal::RowSink;

// The finished-rows log: "<output>.done", a header line naming the input, then one index
// per line. Appended as rows finish, so it survives an interruption.
class DoneLog {
 public:
  // `model` names the model and version that computed the rows: resuming with another
  // would mix two models' outputs in one file.
  static StatusOr<std::unique_ptr<DoneLog>> Open(const std::string& output,
                                                 const std::string& input, const std::string& model,
                                                 bool resume, bool output_exists) {
    auto log = std::unique_ptr<DoneLog>(new DoneLog());
    log->path_ = output + ".done";
    struct stat st {};
    stat(input.c_str(), &st);
    const std::string header = "# shoal run input=" + input +
                               " bytes=" + std::to_string(st.st_size) +
                               " mtime=" + std::to_string(st.st_mtime) + " model=" + model;
    if (resume && output_exists) {
      std::ifstream f(log->path_);
      std::string line;
      if (f && std::getline(f, line)) {
        if (line != header) {
          return FailedPrecondition("'" + output +
                                    "' was written from a different or changed input, or by "
                                    "another model (" +
                                    line.substr(12) + "; now " + header.substr(12) +
                                    "); delete it or pass --no-resume to start over");
        }
        while (std::getline(f, line)) {
          if (!line.empty()) log->done_.insert(std::stoll(line));
        }
      }
    }
    const bool append = resume && output_exists && !log->done_.empty();
    log->file_ = std::fopen(log->path_.c_str(), append ? "a" : "w");
    if (log->file_ == nullptr) return Internal("cannot write '" + log->path_ + "'");
    if (!append) std::fprintf(log->file_, "%s\n", header.c_str());
    std::fflush(log->file_);
    return log;
  }
  ~DoneLog() {
    if (file_) std::fclose(file_);
  }
  const std::set<int64_t>& done() const { return done_; }
  void Append(int64_t i) {
    std::fprintf(file_, "%lld\n", static_cast<long long>(i));
    std::fflush(file_);
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::set<int64_t> done_;
};

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
  const bool output_exists = std::filesystem::exists(options.output_path);
  auto done = DoneLog::Open(options.output_path, options.input_path,
                            options.model + ":" + std::to_string((*mv)->version()), options.resume,
                            output_exists);
  if (!done.ok()) {
    result.status = done.status();
    return result;
  }
  const bool resuming = !(*done)->done().empty();
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
      (*done)->Append(i);
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
        } else {
          (*done)->Append(i);
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
