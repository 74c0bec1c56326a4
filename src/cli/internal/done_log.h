// The finished-rows log of an offline job (`shoal run`, offline_job.h): "<output>.done".
//
// Its first line says what the rows were computed from, as JSON after a fixed prefix:
//   # shoal run {"input":"in.npy","bytes":4128,"xxh3_128":"<32 hex digits>","model":"m:1"}
// then one finished row index per line, appended and flushed as rows finish, so an
// interrupted job loses nothing. The input is identified by its content (size and hash,
// the path only for messages): the same bytes under another path resume, different bytes
// under the same path, size and modification time do not.
//
// Read validates everything before anything is written: a header for other input data
// or another model, a line that is not a row index of this input, or a log from an older
// shoal (which identified inputs by modification time) is FAILED_PRECONDITION naming the
// file (and the line), and the log and the outputs are left as they were. A last line
// without its newline (the job killed while appending) is not a finished row; Start cuts
// it off. Not thread-safe: the job calls Append under its lock.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "core/status.h"

namespace shoal::cli::internal {

struct JobIdentity {
  std::string input_path;  // as given; informational
  uint64_t input_bytes = 0;
  std::string input_hash;  // XXH3-128 of the input's bytes, hex
  std::string model;       // "<name>:<version>"
};

class DoneLog {
 public:
  // Reads `path` when `resume` and it exists; otherwise starts with no rows done. `rows`:
  // the input's row count (a recorded index must be below it).
  static StatusOr<std::unique_ptr<DoneLog>> Read(const std::string& path,
                                                 const JobIdentity& identity, int64_t rows,
                                                 bool resume);
  ~DoneLog();
  DoneLog(const DoneLog&) = delete;
  DoneLog& operator=(const DoneLog&) = delete;

  const std::set<int64_t>& done() const { return done_; }
  const std::string& path() const { return path_; }
  // Opens the log for appending: after the rows read, or (none read) rewritten with this
  // job's header.
  Status Start();
  // Records row i as finished.
  Status Append(int64_t i);

 private:
  DoneLog() = default;
  std::string path_;
  std::string header_;
  std::set<int64_t> done_;
  int64_t keep_bytes_ = 0;  // the complete lines read; Start cuts a torn last line off
  std::FILE* file_ = nullptr;
};

// The log's first line for `identity`.
std::string DoneLogHeader(const JobIdentity& identity);

}  // namespace shoal::cli::internal
