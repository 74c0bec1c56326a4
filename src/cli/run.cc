#include "cli/run.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/common.h"
#include "cli/offline_job.h"
#include "runtime/server.h"

namespace shoal::cli {
namespace {

struct RunFlags {
  std::string model_repository;
  std::string model;
  int64_t model_version = -1;
  std::string input;
  std::string output;
  std::string on_error = "fail";
  int concurrency = 64;
  bool no_resume = false;
  int64_t limit = 0;
  bool quiet = false;
  std::vector<std::string> backend_directories;
};

// What the signal thread tells the job: whether to stop, and which signal asked.
struct Interrupt {
  std::atomic<bool> requested{false};
  std::atomic<int> signal{SIGINT};
};

// Blocks SIGTERM and SIGINT and takes them on a thread of its own: the first one asks the
// job to stop (it keeps the rows done), a second exits at once. Call once.
const Interrupt& WatchInterrupts() {
  static Interrupt interrupt;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals]() mutable {
    int sig = 0;
    sigwait(&signals, &sig);
    interrupt.signal = sig;
    interrupt.requested = true;
    sigwait(&signals, &sig);  // a second signal: stop at once
    std::_Exit(128 + sig);
  }).detach();
  return interrupt;
}

// An in-process server that loads only the job's model.
StatusOr<std::unique_ptr<runtime::Server>> CreateServer(const RunFlags& f) {
  runtime::ServerOptions options;
  options.model_repository = f.model_repository;
  options.control_mode = runtime::ModelControlMode::kExplicit;
  options.startup_models = {f.model};
  SetUpBackends(f.backend_directories, &options);
  return runtime::Server::Create(options);
}

OfflineJobOptions MakeJobOptions(const RunFlags& f) {
  OfflineJobOptions job;
  job.model = f.model;
  job.model_version = f.model_version;
  job.input_path = f.input;
  job.output_path = f.output;
  job.on_error =
      f.on_error == "skip" ? OfflineJobOptions::OnError::kSkip : OfflineJobOptions::OnError::kFail;
  job.concurrency = f.concurrency;
  job.resume = !f.no_resume;
  job.limit_rows = f.limit;
  return job;
}

// Progress on stderr: on a terminal, a bar redrawn in place; otherwise a line each time
// another tenth of the rows is done.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool tty) : tty_(tty) {}

  void Print(const OfflineJobProgress& p) {
    if (tty_) {
      std::fprintf(stderr, "\r%s ", FormatProgress(p).c_str());
    } else {
      const int decile = p.total_rows > 0 ? static_cast<int>(10 * p.done_rows / p.total_rows) : 10;
      if (decile != last_decile_) {
        std::fprintf(stderr, "%s\n", FormatProgress(p).c_str());
        last_decile_ = decile;
      }
    }
  }

 private:
  const bool tty_;
  int last_decile_ = -1;
};

// Tells how the job ended (the summary on stdout, problems on stderr) and returns the
// exit code: 0 when done or limited, 1 when failed, 128 + the signal when interrupted.
int ReportResult(const RunFlags& f, const OfflineJobResult& r, int interrupt_signal) {
  const auto& p = r.progress;
  const int64_t computed = p.done_rows - p.resumed_rows;
  const double rate = p.elapsed_s > 0 ? static_cast<double>(computed) / p.elapsed_s : 0;
  if (!r.status.ok()) {
    std::fprintf(stderr, "shoal run: failed: %s\n", r.status.message().c_str());
    if (r.failed_row >= 0) {
      // Rerunning the same command resumes after the kept rows; a changed input does not
      // resume (the finished rows would no longer match it).
      std::fprintf(stderr,
                   "%lld of %lld rows are done and kept in '%s'. Rerun with --on-error skip to "
                   "go on past failing rows (each is recorded); after fixing the input, rerun "
                   "with --no-resume.\n",
                   static_cast<long long>(p.done_rows), static_cast<long long>(p.total_rows),
                   f.output.c_str());
    }
    return 1;
  }
  if (r.interrupted) {
    std::fprintf(
        stderr,
        "shoal run: stopped after %lld of %lld rows; they are kept in '%s'. Rerun the same "
        "command to resume.\n",
        static_cast<long long>(p.done_rows), static_cast<long long>(p.total_rows),
        f.output.c_str());
    return 128 + interrupt_signal;
  }
  if (r.limited) {
    std::fprintf(stderr,
                 "shoal run: stopped after --limit %lld rows; %lld of %lld rows are done and kept "
                 "in '%s'. Rerun the same command to continue.\n",
                 static_cast<long long>(f.limit), static_cast<long long>(p.done_rows),
                 static_cast<long long>(p.total_rows), f.output.c_str());
  }
  std::printf("%lld rows in %.2f s: %.1f rows/s", static_cast<long long>(computed), p.elapsed_s,
              rate);
  if (p.resumed_rows > 0)
    std::printf(" (%lld rows done by an earlier run)", static_cast<long long>(p.resumed_rows));
  if (p.failed_rows > 0)
    std::printf(", %lld malformed rows skipped", static_cast<long long>(p.failed_rows));
  std::printf("; output in %s\n", f.output.c_str());
  return 0;
}

int Run(const RunFlags& f) {
  spdlog::set_pattern("%^%l%$ %v");
  spdlog::set_level(f.quiet ? spdlog::level::warn : spdlog::level::info);
  const Interrupt& interrupt = WatchInterrupts();

  auto server = CreateServer(f);
  if (!server.ok()) {
    std::fprintf(stderr, "shoal run: %s\n", server.status().message().c_str());
    return 1;
  }
  if (auto mv = (*server)->GetModel(f.model, f.model_version); !mv.ok()) {
    std::fprintf(stderr, "shoal run: %s\n", mv.status().message().c_str());
    return 1;
  }
  const bool tty = isatty(STDERR_FILENO);
  ProgressPrinter progress(tty);
  OfflineJobResult r = RunOfflineJob(**server, MakeJobOptions(f), &interrupt.requested,
                                     [&](const OfflineJobProgress& p) {
                                       if (!f.quiet) progress.Print(p);
                                     });
  if (tty && !f.quiet) std::fprintf(stderr, "\n");
  (*server)->Shutdown();
  return ReportResult(f, r, interrupt.signal.load());
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run",
                                     "Offline batch inference: run every row of an "
                                     ".npy/.npz/.jsonl file through a model, in process");
  run->add_option("--model-repository", f->model_repository, "Model repository folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  run->add_option("-m,--model", f->model, "Model name")->required();
  run->add_option("--model-version", f->model_version, "Model version (-1: the latest)")
      ->capture_default_str();
  run->add_option("--input", f->input,
                  ".npy (one input), .npz (arrays named as the inputs) or .jsonl")
      ->required()
      ->check(CLI::ExistingFile);
  run->add_option("--output", f->output,
                  ".jsonl, or .npy (one file per output when there are several)")
      ->required();
  run->add_option("--on-error", f->on_error,
                  "A malformed or failing row: skip it (recorded) or fail the job")
      ->capture_default_str()
      ->check(CLI::IsMember({"skip", "fail"}));
  run->add_option("--concurrency", f->concurrency,
                  "Requests in flight (enough to fill the model's batches)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  run->add_option("--limit", f->limit,
                  "Process at most N more rows in this run (0: all); rerun to continue")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  run->add_flag("--no-resume", f->no_resume,
                "Start over even if the output holds rows of an earlier run");
  run->add_flag("-q,--quiet", f->quiet, "No progress bar, no load logs");
  run->add_option("--backend-directory", f->backend_directories,
                  "Folder searched for plugin backends (repeatable)");
  run->callback([f] { std::exit(Run(*f)); });
}

}  // namespace shoal::cli
