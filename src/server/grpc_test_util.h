// Test helpers shared by the gRPC front end's tests (not part of shoal_grpc): the shared
// repository fixture (a model repository in a temporary folder and configs for the
// example plugins, from runtime/testing/test_repository.h), a slow model, and a
// runtime::Server over them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/server.h"
#include "runtime/testing/test_repository.h"
#include "server/held_model.h"

namespace shoal::server::testing {

// The shared repository fixture (runtime/testing/test_repository.h).
using runtime::testing::kAddSubConfig;
using runtime::testing::kIdentityConfig;
using runtime::testing::kStringsConfig;
using runtime::testing::TempRepository;

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

// A runtime::Server over `repo` with the example plugins; nullptr if it cannot start.
inline std::unique_ptr<runtime::Server> MakeServer(
    const TempRepository& repo, runtime::ModelControlMode mode = runtime::ModelControlMode::kNone,
    std::vector<std::string> startup_models = {}) {
  runtime::ServerOptions o = runtime::testing::RepositoryOptions(repo, mode);
  o.startup_models = std::move(startup_models);
  auto server = runtime::Server::Create(std::move(o));
  return server.ok() ? std::move(server).value() : nullptr;
}

}  // namespace shoal::server::testing
