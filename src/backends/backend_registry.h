// BackendRegistry: finds the Backend that serves a model, by the backend name in its
// config (`backend: "onnx"`), among built-in backends and plugin libraries.
//
// Find(name, model_dir) looks, in this order:
//   1. an alias: RegisterAlias(alias, target) makes Find(alias) behave as Find(target)
//      (one level; aliases of aliases are not followed);
//   2. a built-in backend registered under that name;
//   3. a plugin library libshoal_<name>.so (see plugin_backend.h), first in the model's
//      directory, then in each plugin directory in the order added, as
//      <dir>/libshoal_<name>.so and then <dir>/<name>/libshoal_<name>.so.
// The first library that exists is used; if it fails to open, Find returns that error and
// does not try the next place (a broken plugin is reported, not silently skipped). Opened
// plugins are cached by their canonical path and live as long as the registry, so every
// model of one plugin shares one Backend; failures are not cached.
//
// Errors: kInvalidArgument for a name that cannot be a file name (empty, a '/', a leading
// '.'; allowed: letters, digits, '_', '-', '.'); kNotFound listing every place searched;
// the plugin's own error (kNotFound / kFailedPrecondition) when a library fails to open.
//
// Thread safety: every method may be called concurrently. One mutex, mu_, guards all
// state and is held across a plugin's dlopen, so a library is opened once even when two
// models ask for it together (loads through the registry are serialised; a plugin's
// load-time constructors must not call back into the registry). Under mu_ only the
// dynamic loader's own lock is taken (by dlopen); no shoal lock.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/mutex.h"
#include "core/status.h"

namespace shoal::backends {

class BackendRegistry {
 public:
  // Registers a built-in backend (not null) under backend->name(), replacing one of the
  // same name.
  void Register(std::shared_ptr<Backend> backend);
  // Makes `alias` another name of `target` (a built-in or plugin name), e.g. the ONNX
  // backend registers itself as "onnx" with the alias "onnxruntime_onnx" -> "onnx".
  // Replaces an earlier alias of the same name; an alias hides a backend of that name.
  void RegisterAlias(std::string alias, std::string target);
  // Appends a directory to search for plugin libraries.
  void AddPluginDirectory(std::string directory);

  // The backend called `name` for a model whose directory is `model_dir` (may be empty:
  // then only plugin directories are searched). See the search order above.
  StatusOr<std::shared_ptr<Backend>> Find(const std::string& name, const std::string& model_dir);

  std::vector<std::string> plugin_directories() const;

 private:
  std::vector<std::string> PluginCandidatesLocked(const std::string& name,
                                                  const std::string& model_dir) const REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<std::string, std::string> aliases_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Backend>> builtins_ GUARDED_BY(mu_);
  std::vector<std::string> plugin_directories_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Backend>> plugins_ GUARDED_BY(mu_);  // by path
};

}  // namespace shoal::backends
