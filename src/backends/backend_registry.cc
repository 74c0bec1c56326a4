#include "backends/backend_registry.h"

#include <filesystem>
#include <utility>

#include "backends/plugin_backend.h"

namespace shoal::backends {
namespace {

// A name is joined into file paths, so it must not be able to leave the directory.
Status ValidatePluginName(const std::string& name) {
  if (name.empty()) return InvalidArgument("backend name is empty");
  if (name.size() > 128) {
    return InvalidArgument("backend name is longer than 128 characters: '" + name.substr(0, 128) +
                           "...'");
  }
  if (name[0] == '.') return InvalidArgument("backend name '" + name + "' starts with '.'");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) {
      return InvalidArgument("backend name '" + name +
                             "' may hold only letters, digits, '_', '-' and '.'");
    }
  }
  return Status::Ok();
}

}  // namespace

void BackendRegistry::Register(std::shared_ptr<Backend> backend) {
  std::string name = backend->name();
  MutexLock lock(&mu_);
  builtins_[std::move(name)] = std::move(backend);
}

void BackendRegistry::RegisterAlias(std::string alias, std::string target) {
  MutexLock lock(&mu_);
  aliases_[std::move(alias)] = std::move(target);
}

void BackendRegistry::AddPluginDirectory(std::string directory) {
  MutexLock lock(&mu_);
  plugin_directories_.push_back(std::move(directory));
}

std::vector<std::string> BackendRegistry::plugin_directories() const {
  MutexLock lock(&mu_);
  return plugin_directories_;
}

std::vector<std::string> BackendRegistry::PluginCandidatesLocked(
    const std::string& name, const std::string& model_dir) const {
  namespace fs = std::filesystem;
  const std::string file = "libshoal_" + name + ".so";
  std::vector<std::string> candidates;
  if (!model_dir.empty()) candidates.push_back((fs::path(model_dir) / file).string());
  for (const std::string& dir : plugin_directories_) {
    candidates.push_back((fs::path(dir) / file).string());
    candidates.push_back((fs::path(dir) / name / file).string());
  }
  return candidates;
}

StatusOr<std::shared_ptr<Backend>> BackendRegistry::Find(const std::string& requested,
                                                         const std::string& model_dir) {
  MutexLock lock(&mu_);
  std::string name = requested;
  std::string described = "'" + requested + "'";
  if (auto alias = aliases_.find(requested); alias != aliases_.end()) {
    name = alias->second;
    described += " (an alias of '" + name + "')";
  }
  if (auto builtin = builtins_.find(name); builtin != builtins_.end()) return builtin->second;

  RETURN_IF_ERROR(ValidatePluginName(name));
  const std::vector<std::string> candidates = PluginCandidatesLocked(name, model_dir);
  for (const std::string& candidate : candidates) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(candidate, ec)) continue;
    std::string path = std::filesystem::weakly_canonical(candidate, ec).string();
    if (ec) path = candidate;
    if (auto cached = plugins_.find(path); cached != plugins_.end()) return cached->second;
    ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, PluginBackend::Open(name, path));
    plugins_.emplace(std::move(path), backend);
    return backend;
  }

  std::string message = "no backend " + described + ": it is not built in";
  if (candidates.empty()) {
    message += ", and there is no model directory or plugin directory to search";
  } else {
    message += ", and no plugin library was found at ";
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (i > 0) message += ", ";
      message += candidates[i];
    }
  }
  return NotFound(std::move(message));
}

}  // namespace shoal::backends
