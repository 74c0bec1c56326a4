// Test helpers shared by the gRPC front end's tests (not part of shoal_grpc): a model
// repository in a temporary folder, configs for the example plugins, and a
// runtime::Server over them.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/server.h"
#include "server/held_model.h"

namespace shoal::server::testing {

class TempRepo {
 public:
  TempRepo() {
    std::random_device rd;
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal_grpc_test_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(dir_);
  }
  ~TempRepo() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void AddModel(const std::string& name, const std::string& config) const {
    std::filesystem::create_directories(dir_ / name / "1");
    std::ofstream(dir_ / name / "config.pbtxt") << config;
  }
  std::string path() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
};

// The example plugins, built into <build>/backends.
inline std::string PluginDir() {
  const char* b = std::getenv("SHOAL_BINARY_DIR");
  return std::string(b ? b : ".") + "/backends";
}

// INPUT0 -> OUTPUT0, FP32, batching up to 8, one variable dimension.
inline constexpr char kIdentityConfig[] = R"(
name: "identity"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
)";

// BYTES identity without batching.
inline constexpr char kStringsConfig[] = R"(
name: "strings"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
)";

// OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1; INT32 [4], no batching.
inline constexpr char kAddSubConfig[] = R"(
name: "add_sub"
backend: "add_sub"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
)";

// A slow model: each execution takes `a_us` microseconds; one instance; a queue of at
// most `max_queue` requests (0: unbounded).
inline std::string SlowConfig(const std::string& name, int a_us, int max_queue = 0) {
  return "name: \"" + name + "\"\nbackend: \"cost_model\"\nmax_batch_size: 1\n" +
         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
         "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
         "dynamic_batching { default_queue_policy { max_queue_size: " +
         std::to_string(max_queue) + " } }\n" +
         "parameters { key: \"a_us\" value { string_value: \"" + std::to_string(a_us) +
         "\" } }\nparameters { key: \"b_us\" value { string_value: \"0\" } }\n";
}

inline std::unique_ptr<runtime::Server> MakeServer(
    const TempRepo& repo, runtime::ModelControlMode mode = runtime::ModelControlMode::kNone,
    std::vector<std::string> startup_models = {}) {
  runtime::ServerOptions o;
  o.model_repository = repo.path();
  o.backend_directories = {PluginDir()};
  o.control_mode = mode;
  o.startup_models = std::move(startup_models);
  auto server = runtime::Server::Create(std::move(o));
  return server.ok() ? std::move(server).value() : nullptr;
}

}  // namespace shoal::server::testing
