// `shoal serve`: loads a model repository and serves it over HTTP, gRPC and a metrics
// endpoint until SIGTERM/SIGINT (the first signal drains: stop accepting, answer
// everything queued and in flight, exit 0; a second signal exits at once).
#pragma once

#include <CLI/CLI.hpp>

namespace shoal::cli {

// Adds the `serve` subcommand to `app`; its callback runs the server and exits.
void AddServeCommand(CLI::App& app);

}  // namespace shoal::cli
