// State behind Triton's logging, trace and shared-memory extensions, shared by the HTTP
// and gRPC front ends (they speak the same settings in different encodings).
//
// Logging (GET/POST /v2/logging, gRPC LogSettings) is process-wide, as the log is:
//   log_info, log_warning, log_error  bool: whether lines of that severity are written.
//                                     shoal logs by a severity threshold (spdlog), so
//                                     the enabled severities must be "error and up",
//                                     "warning and up" or "info and up" (or none);
//   log_verbose_level                 uint: 0 off; >= 1 also writes debug lines. Stored
//                                     in core/log_settings.h's LogVerboseLevel(), which
//                                     any code may read;
//   log_format                        "ISO8601" only (shoal's timestamps);
//   log_file                          "" only (shoal logs to standard error).
// Unknown keys, wrong types and values shoal cannot honour are INVALID_ARGUMENT naming
// them, and then nothing is changed.
//
// Trace (GET/POST /v2/trace/setting, /v2/models/{m}/trace/setting, gRPC TraceSetting):
// shoal does not produce traces. The settings (trace_level, trace_rate, trace_count,
// log_frequency, trace_file) can be read and set, globally and per model, so tools that
// configure them work, but trace_level accepts only ["OFF"]: asking for TIMESTAMPS or
// TENSORS is INVALID_ARGUMENT "this server does not produce traces".
//
// Threads: everything here may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "server/shared_memory.h"

namespace shoal::server {

using LogSettingValue = std::variant<bool, uint32_t, std::string>;
using LogSettingsMap = std::map<std::string, LogSettingValue>;

// The current settings, every key above.
LogSettingsMap CurrentLogSettings();
// Checks every entry of `update`, then applies them all (or none).
Status UpdateLogSettings(const LogSettingsMap& update);

class TraceSettings {
 public:
  using Values = std::map<std::string, std::vector<std::string>>;
  // Key -> new value; nullopt clears it (a model's setting then follows the global
  // one; a global one returns to its default).
  using Update = std::map<std::string, std::optional<std::vector<std::string>>>;

  // The settings in effect for `model` ("" = the global ones).
  Values Get(const std::string& model) const;
  // Applies `update` to `model`'s settings ("" = global) after checking all of it.
  StatusOr<Values> Apply(const std::string& model, const Update& update);

 private:
  mutable Mutex mu_;
  Values global_ GUARDED_BY(mu_);  // set keys only
  std::map<std::string, Values> model_ GUARDED_BY(mu_);
};

// What one server's front ends share.
struct ExtensionState {
  SharedMemoryManager shared_memory;
  TraceSettings trace;
};

}  // namespace shoal::server
