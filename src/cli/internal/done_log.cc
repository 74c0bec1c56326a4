#include "cli/internal/done_log.h"

#include <simdjson.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "proto/json_writer.h"

namespace shoal::cli::internal {
namespace {

constexpr std::string_view kHeaderPrefix = "# shoal run ";

// What to tell a user whose log cannot be used: how to go on, and that nothing changed.
std::string Remedy() {
  return "; nothing was changed. Delete it, or pass --no-resume, to compute every row again";
}

// `line` for a message: quoted, and cut if long.
std::string Quote(std::string_view line) {
  constexpr size_t kMax = 40;
  std::string out = "'" + std::string(line.substr(0, kMax));
  if (line.size() > kMax) out += "...";
  return out + "'";
}

// The identity a header holds; INVALID_ARGUMENT if it is not one this version writes.
StatusOr<JobIdentity> ParseHeader(std::string_view line) {
  if (line.substr(0, kHeaderPrefix.size()) != kHeaderPrefix ||
      line.size() == kHeaderPrefix.size() || line[kHeaderPrefix.size()] != '{') {
    return InvalidArgument("no header");
  }
  line.remove_prefix(kHeaderPrefix.size());
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(line.data(), line.size()).get(doc)) return InvalidArgument("bad header");
  JobIdentity id;
  std::string_view input, hash, model;
  if (doc["input"].get(input) || doc["bytes"].get(id.input_bytes) || doc["xxh3_128"].get(hash) ||
      doc["model"].get(model)) {
    return InvalidArgument("bad header");
  }
  id.input_path = std::string(input);
  id.input_hash = std::string(hash);
  id.model = std::string(model);
  return id;
}

std::string Describe(const JobIdentity& id) {
  return "'" + id.input_path + "', " + std::to_string(id.input_bytes) + " bytes, xxh3 " +
         id.input_hash;
}

}  // namespace

std::string DoneLogHeader(const JobIdentity& identity) {
  std::string json;
  proto::JsonWriter(&json)
      .BeginObject()
      .Member("input", identity.input_path)
      .MemberUint("bytes", identity.input_bytes)
      .Member("xxh3_128", identity.input_hash)
      .Member("model", identity.model)
      .EndObject();
  return std::string(kHeaderPrefix) + json;
}

StatusOr<std::unique_ptr<DoneLog>> DoneLog::Read(const std::string& path,
                                                 const JobIdentity& identity, int64_t rows,
                                                 bool resume) {
  auto log = std::unique_ptr<DoneLog>(new DoneLog());
  log->path_ = path;
  log->header_ = DoneLogHeader(identity);
  if (!resume) return log;
  std::ifstream f(path, std::ios::binary);
  if (!f) return log;  // no earlier run
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  if (text.empty()) return log;

  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) break;  // torn last line: not a finished row
    const std::string_view line(text.data() + start, end - start);
    ++line_no;
    if (line_no == 1) {
      auto recorded = ParseHeader(line);
      if (!recorded.ok()) {
        return FailedPrecondition(
            "'" + path + "' does not start with the header of this version of shoal run" +
            (line.substr(0, kHeaderPrefix.size()) == kHeaderPrefix
                 ? " (an older one identified the input by its modification time, which "
                   "cannot tell a replaced file apart)"
                 : " (it is damaged, or not a .done file)") +
            Remedy());
      }
      if (recorded->model != identity.model) {
        return FailedPrecondition("'" + path + "' records rows computed by another model (" +
                                  recorded->model + "; now " + identity.model + ")" + Remedy());
      }
      if (recorded->input_bytes != identity.input_bytes ||
          recorded->input_hash != identity.input_hash) {
        return FailedPrecondition("'" + path +
                                  "' records rows of different input data, a different or "
                                  "changed file (" +
                                  Describe(*recorded) + "; now " + Describe(identity) + ")" +
                                  Remedy());
      }
    } else {
      int64_t index = -1;
      const char* first = line.data();
      const char* last = line.data() + line.size();
      const auto [ptr, ec] = std::from_chars(first, last, index);
      if (line.empty() || ec != std::errc() || ptr != last || index < 0 || index >= rows) {
        return FailedPrecondition("'" + path + "' line " + std::to_string(line_no) + " is " +
                                  Quote(line) + ", not a row index of this input (0 to " +
                                  std::to_string(rows - 1) + "): the file is damaged" + Remedy());
      }
      log->done_.insert(index);
    }
    start = end + 1;
  }
  if (line_no == 0) return log;  // not even a whole header: nothing was recorded
  log->keep_bytes_ = static_cast<int64_t>(start);
  return log;
}

DoneLog::~DoneLog() {
  if (file_) std::fclose(file_);
}

Status DoneLog::Start() {
  const bool append = !done_.empty();
  if (append && truncate(path_.c_str(), static_cast<off_t>(keep_bytes_)) != 0) {
    return Internal("cannot write '" + path_ + "': " + std::strerror(errno));
  }
  file_ = std::fopen(path_.c_str(), append ? "a" : "w");
  if (file_ == nullptr) return Internal("cannot write '" + path_ + "': " + std::strerror(errno));
  if (!append && (std::fprintf(file_, "%s\n", header_.c_str()) < 0 || std::fflush(file_) != 0)) {
    return Internal("cannot write '" + path_ + "'");
  }
  return Status::Ok();
}

Status DoneLog::Append(int64_t i) {
  if (std::fprintf(file_, "%lld\n", static_cast<long long>(i)) < 0 || std::fflush(file_) != 0)
    return Internal("cannot write '" + path_ + "'");
  return Status::Ok();
}

}  // namespace shoal::cli::internal
