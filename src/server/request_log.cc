#include "server/request_log.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "core/log_settings.h"
#include "core/log_text.h"
#include "server/status_map.h"

namespace shoal::server {
namespace {

std::string VersionText(int64_t version) {
  return version > 0 ? " version " + std::to_string(version) : std::string();
}

}  // namespace

int LogVerboseLevel() { return static_cast<int>(GetLogVerboseLevel()); }

void SetLogVerboseLevel(int level) {
  shoal::SetLogVerboseLevel(static_cast<uint32_t>(std::max(level, 0)));
  spdlog::set_level(level > 0 ? spdlog::level::debug : spdlog::level::info);
}

int64_t RequestLogNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void LogInternalError(std::string_view protocol, std::string_view model, const Status& status) {
  if (HttpStatusFor(status.code()) != 500) return;
  spdlog::error("internal error answering a {} request{}: {}", protocol,
                model.empty() ? std::string() : " for model '" + LogSafe(model) + "'",
                LogSafe(status.message()));
}

void LogRequest(const RequestLogEntry& e) {
  if (HttpStatusFor(e.status.code()) == 500) {
    spdlog::error("internal error answering a {} request for model '{}'{}: {}", e.protocol,
                  LogSafe(e.model), VersionText(e.version), LogSafe(e.status.message()));
  }
  if (LogVerboseLevel() < 1) return;
  const std::string id = e.id.empty() ? std::string() : " id '" + LogSafe(e.id, 256) + "'";
  const std::string outcome = e.status.ok() ? std::string("OK")
                                            : std::string(StatusCodeName(e.status.code())) + " (" +
                                                  LogSafe(e.status.message(), 512) + ")";
  spdlog::debug("request model '{}'{}{} over {}: {}; queue {} us, compute {} us, total {} us",
                LogSafe(e.model, 256), VersionText(e.version), id, e.protocol, outcome,
                e.queue_ns / 1000, e.compute_ns / 1000, e.total_ns / 1000);
}

}  // namespace shoal::server
