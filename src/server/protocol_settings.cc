#include "server/protocol_settings.h"

#include <spdlog/spdlog.h>

#include <charconv>

#include "core/log_settings.h"

namespace shoal::server {
namespace {

constexpr char kLogFormat[] = "ISO8601";

struct LogFlags {
  bool info = true;
  bool warning = true;
  bool error = true;
  uint32_t verbose = 0;
};

LogFlags FlagsFromLogger() {
  const auto level = spdlog::get_level();
  LogFlags f;
  f.info = level <= spdlog::level::info;
  f.warning = level <= spdlog::level::warn;
  f.error = level <= spdlog::level::err;
  f.verbose = GetLogVerboseLevel();
  return f;
}

std::string TypeName(const LogSettingValue& v) {
  switch (v.index()) {
    case 0:
      return "a bool";
    case 1:
      return "an unsigned integer";
    default:
      return "a string";
  }
}

Status WrongType(const std::string& key, const LogSettingValue& got, std::string_view want) {
  return InvalidArgument("log setting '" + key + "' must be " + std::string(want) + "; was " +
                         TypeName(got));
}

// Trace settings: name -> (default, check).
const std::map<std::string, std::vector<std::string>>& TraceDefaults() {
  static const auto* d = new std::map<std::string, std::vector<std::string>>{
      {"trace_level", {"OFF"}}, {"trace_rate", {"1000"}}, {"trace_count", {"-1"}},
      {"log_frequency", {"0"}}, {"trace_file", {""}},
  };
  return *d;
}

Status CheckInteger(const std::string& key, const std::vector<std::string>& v, int64_t min) {
  if (v.size() != 1) return InvalidArgument("trace setting '" + key + "' takes one value");
  int64_t n = 0;
  const std::string& s = v[0];
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || n < min) {
    return InvalidArgument("trace setting '" + key + "' must be an integer >= " +
                           std::to_string(min) + "; was '" + s.substr(0, 64) + "'");
  }
  return Status::Ok();
}

Status CheckTraceSetting(const std::string& key, const std::vector<std::string>& v) {
  if (key == "trace_level") {
    if (v.empty()) return InvalidArgument("trace setting 'trace_level' needs a value");
    for (const auto& level : v) {
      if (level != "OFF") {
        return InvalidArgument(
            "trace_level '" + level.substr(0, 32) +
            "' cannot be enabled: this server does not produce traces (only OFF is accepted)");
      }
    }
    return Status::Ok();
  }
  if (key == "trace_rate") return CheckInteger(key, v, 1);
  if (key == "trace_count") return CheckInteger(key, v, -1);
  if (key == "log_frequency") return CheckInteger(key, v, 0);
  if (key == "trace_file") {
    if (v.size() != 1) return InvalidArgument("trace setting 'trace_file' takes one value");
    return Status::Ok();
  }
  return InvalidArgument("unknown trace setting '" + key.substr(0, 64) +
                         "' (known: trace_level, trace_rate, trace_count, log_frequency, "
                         "trace_file)");
}

}  // namespace

LogSettingsMap CurrentLogSettings() {
  const LogFlags f = FlagsFromLogger();
  return {
      {"log_info", f.info},
      {"log_warning", f.warning},
      {"log_error", f.error},
      {"log_verbose_level", f.verbose},
      {"log_format", std::string(kLogFormat)},
      {"log_file", std::string()},
  };
}

Status UpdateLogSettings(const LogSettingsMap& update) {
  LogFlags f = FlagsFromLogger();
  for (const auto& [key, value] : update) {
    if (key == "log_info" || key == "log_warning" || key == "log_error") {
      const bool* b = std::get_if<bool>(&value);
      if (b == nullptr) return WrongType(key, value, "a bool");
      (key == "log_info" ? f.info : key == "log_warning" ? f.warning : f.error) = *b;
    } else if (key == "log_verbose_level") {
      const uint32_t* n = std::get_if<uint32_t>(&value);
      if (n == nullptr) return WrongType(key, value, "an unsigned integer");
      f.verbose = *n;
    } else if (key == "log_format") {
      const std::string* s = std::get_if<std::string>(&value);
      if (s == nullptr) return WrongType(key, value, "a string");
      if (*s != kLogFormat) {
        return InvalidArgument("log_format '" + s->substr(0, 32) +
                               "' is not supported: shoal writes ISO8601 timestamps (the only "
                               "value accepted is \"ISO8601\")");
      }
    } else if (key == "log_file") {
      const std::string* s = std::get_if<std::string>(&value);
      if (s == nullptr) return WrongType(key, value, "a string");
      if (!s->empty()) {
        return InvalidArgument(
            "log_file is not supported: shoal logs to standard error (redirect it, or leave "
            "log_file empty)");
      }
    } else {
      return InvalidArgument("unknown log setting '" + key.substr(0, 64) +
                             "' (known: log_info, log_warning, log_error, log_verbose_level, "
                             "log_format, log_file)");
    }
  }
  // shoal logs by threshold: each severity enabled implies the ones above it.
  if ((f.info && !f.warning) || (f.warning && !f.error)) {
    return InvalidArgument(
        "log settings cannot enable a severity while disabling a higher one (shoal logs by "
        "severity threshold): log_info implies log_warning, which implies log_error");
  }
  if (f.verbose > 0 && !f.info) {
    return InvalidArgument("log_verbose_level > 0 needs log_info true");
  }
  spdlog::level::level_enum level = spdlog::level::off;
  if (f.verbose > 0) {
    level = spdlog::level::debug;
  } else if (f.info) {
    level = spdlog::level::info;
  } else if (f.warning) {
    level = spdlog::level::warn;
  } else if (f.error) {
    level = spdlog::level::err;
  }
  SetLogVerboseLevel(f.verbose);
  spdlog::set_level(level);
  return Status::Ok();
}

TraceSettings::Values TraceSettings::Get(const std::string& model) const {
  Values out = TraceDefaults();
  MutexLock lock(&mu_);
  for (const auto& [k, v] : global_) out[k] = v;
  if (!model.empty()) {
    if (auto it = model_.find(model); it != model_.end()) {
      for (const auto& [k, v] : it->second) out[k] = v;
    }
  }
  return out;
}

StatusOr<TraceSettings::Values> TraceSettings::Apply(const std::string& model,
                                                     const Update& update) {
  for (const auto& [key, value] : update) {
    if (value) {
      RETURN_IF_ERROR(CheckTraceSetting(key, *value));
    } else if (TraceDefaults().count(key) == 0) {
      RETURN_IF_ERROR(CheckTraceSetting(key, {}));  // names the unknown key
    }
  }
  {
    MutexLock lock(&mu_);
    Values& target = model.empty() ? global_ : model_[model];
    for (const auto& [key, value] : update) {
      if (value) {
        target[key] = *value;
      } else {
        target.erase(key);
      }
    }
    if (!model.empty() && target.empty()) model_.erase(model);
  }
  return Get(model);
}

}  // namespace shoal::server
