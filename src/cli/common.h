// Helpers shared by the `shoal` subcommands. Compiled into the `shoal` binary itself, so
// that they see which backends and front ends it was built with (SHOAL_HAVE_*).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/server.h"

namespace shoal::cli {

// Plugin folders to search when none are given: $SHOAL_BACKEND_DIR, then the build
// tree's <build>/backends (the binary is <build>/src/cli/shoal), then an installed
// <prefix>/lib/shoal/backends.
std::vector<std::string> DefaultBackendDirectories();

// Gives `options` the backends `serve` and `run` offer: a fresh registry holding the
// backends built into this binary (ONNX, when it was built with it), and plugin folders
// `backend_directories`, or DefaultBackendDirectories() when that is empty.
void SetUpBackends(const std::vector<std::string>& backend_directories,
                   runtime::ServerOptions* options);

// Logs (spdlog) how starting the network service called `name` ("HTTP", "gRPC",
// "metrics") on `address` went, and returns it: on success "<name> service listening on
// <address>:<port it got>"; on failure, at critical level, "cannot start the <name> server
// on <address>:<port>: <why>", and nullptr. `port` is the port that was asked for.
template <typename Service>
std::unique_ptr<Service> LogServiceStart(StatusOr<std::unique_ptr<Service>> started,
                                         std::string_view name, const std::string& address,
                                         int port);

// Implementation details follow.

void LogServiceListening(std::string_view name, const std::string& address, int port);
void LogServiceFailed(std::string_view name, const std::string& address, int port,
                      const Status& status);

template <typename Service>
std::unique_ptr<Service> LogServiceStart(StatusOr<std::unique_ptr<Service>> started,
                                         std::string_view name, const std::string& address,
                                         int port) {
  if (!started.ok()) {
    LogServiceFailed(name, address, port, started.status());
    return nullptr;
  }
  std::unique_ptr<Service> service = std::move(started).value();
  LogServiceListening(name, address, service->port());
  return service;
}

}  // namespace shoal::cli
