// `shoal worker`: consumes inference requests from a Redis stream through a consumer
// group (worker/worker.h, docs/worker.md), with the same runtime as `shoal serve` and its
// Prometheus metrics plus the worker's own.
#pragma once

#include <CLI/CLI.hpp>

namespace shoal::cli {

void AddWorkerCommand(CLI::App& app);

}  // namespace shoal::cli
