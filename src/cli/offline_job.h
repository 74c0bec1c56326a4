// The offline batch job behind `shoal run`: every row of an input file through a model,
// in process, with the server's batching and instances, and the results to a file.
//
// Inputs:  .npy (a single-input model; rows along the first dimension),
//          .npz (one array per input, named as the inputs, equal row counts),
//          .jsonl (one JSON object per line mapping input names to nested arrays or
//                  strings; a line that does not parse or fit is a malformed row).
// Outputs: .jsonl (one line per row: {"index": i, "outputs": {NAME: {"shape", "datatype",
//          "data"}}} or {"index": i, "error": "..."}), or .npy (one file per output:
//          the path itself for a single-output model, <stem>.<OUTPUT>.npy otherwise;
//          a skipped row is left as zeros and listed in <output>.errors.jsonl).
// Values convert to the model's input types only when they keep their value (a whole
// number into an integer input, a number within FP32's range into FP32); anything else
// makes the row malformed, with the input, element and value named.
// Progress is kept beside the output (<output>.done, internal/done_log.h: a header naming
// the input by size and XXH3-128 of its bytes and the model, then one finished row index
// per line), written as rows finish, so an interrupted or failed job loses nothing
// computed: a rerun skips finished rows (unless resume is off) when its input has the
// same content (under any path) and its model the same name and version, and every
// output file of the earlier run is there. Otherwise, or when the log is damaged, the job
// fails with FAILED_PRECONDITION before changing any file. A malformed row is reported
// with its index and either skipped or fails the job (OnError).
//
// Threading: RunOfflineJob submits from the calling thread, keeping at most
// `concurrency` requests in flight; completions arrive on runtime threads and are
// written under the job's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "runtime/server.h"

namespace shoal::cli {

struct OfflineJobOptions {
  std::string model;
  int64_t model_version = -1;
  std::string input_path;
  std::string output_path;
  enum class OnError { kSkip, kFail } on_error = OnError::kFail;
  // Requests in flight; enough to fill the model's batches. Default 64.
  int concurrency = 64;
  // Skip rows a previous run of the same job finished.
  bool resume = true;
  // Submit at most this many rows in this run (0: all); a later run resumes after them.
  int64_t limit_rows = 0;
};

struct OfflineJobProgress {
  int64_t total_rows = 0;
  int64_t target_rows = 0;   // the rows done when this run ends: total, or fewer by --limit
  int64_t done_rows = 0;     // including rows finished by an earlier run
  int64_t resumed_rows = 0;  // finished by an earlier run
  int64_t failed_rows = 0;   // malformed or failed, skipped
  double elapsed_s = 0;
};

struct OfflineJobResult {
  OfflineJobProgress progress;
  bool interrupted = false;  // stopped by a signal before every row was done
  bool limited = false;      // stopped by limit_rows before every row was done
  Status status;             // the first error when the job failed
  int64_t failed_row = -1;   // the row whose failure failed the job (-1: not a row's)
};

// Runs the job. `interrupted` (may be null) stops submission when set; rows in flight
// still finish and are recorded. `on_progress` (may be null) is called from the
// submitting thread about every 200 ms and at the end.
OfflineJobResult RunOfflineJob(runtime::Server& server, const OfflineJobOptions& options,
                               const std::atomic<bool>* interrupted,
                               const std::function<void(const OfflineJobProgress&)>& on_progress);

// "[#####.....]  52%  5200/10000 rows  1234 rows/s  ETA 0:04  3 skipped"
std::string FormatProgress(const OfflineJobProgress& p, int width = 30);

}  // namespace shoal::cli
