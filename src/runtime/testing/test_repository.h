// The fixture that the in-process server tests share (runtime::Server, the HTTP, gRPC and
// metrics front ends): a model repository in a temporary folder, configs for the example
// plugins, and the ServerOptions that serve it with them. Test-only; header-only, target
// shoal_runtime_testing.
//
// The example plugins (examples/backends) are loaded from <build>/backends; the tests
// find <build> through $SHOAL_BINARY_DIR, which shoal_cc_test sets, and must depend on
// the plugin targets (shoal_identity, shoal_add_sub, shoal_cost_model) so they are built.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/server.h"
#include "runtime/testing/plugin_configs.h"

namespace shoal::runtime::testing {

// A model repository in a fresh temporary folder, removed (with what is in it) when this
// goes away. Not thread-safe; tests fill it before they start a server on it, or between
// polls.
class TempRepository {
 public:
  // The folder is <temp>/<prefix>_<pid>_<random>; `prefix` names the test in leftovers.
  explicit TempRepository(const std::string& prefix = "shoal_test") {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(std::random_device()()));
    std::filesystem::create_directories(dir_);
  }
  ~TempRepository() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempRepository(const TempRepository&) = delete;
  TempRepository& operator=(const TempRepository&) = delete;

  // Writes <name>/config.pbtxt (replacing an earlier one) and an empty folder for each of
  // `versions`.
  void AddModel(const std::string& name, const std::string& config,
                const std::vector<int>& versions = {1}) const {
    std::filesystem::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "config.pbtxt") << config;
    for (int v : versions) std::filesystem::create_directories(dir_ / name / std::to_string(v));
  }
  void Remove(const std::string& name) const { std::filesystem::remove_all(dir_ / name); }
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

// The example plugins' folder: $SHOAL_BINARY_DIR/backends ("./backends" without it).
inline std::string PluginDir() {
  const char* b = std::getenv("SHOAL_BINARY_DIR");
  return std::string(b ? b : ".") + "/backends";
}

// Options that serve `repo` with the example plugins, in control mode `mode`; everything
// else is ServerOptions' default.
inline ServerOptions RepositoryOptions(const TempRepository& repo,
                                       ModelControlMode mode = ModelControlMode::kNone) {
  ServerOptions o;
  o.model_repository = repo.path();
  o.backend_directories = {PluginDir()};
  o.control_mode = mode;
  return o;
}

}  // namespace shoal::runtime::testing
