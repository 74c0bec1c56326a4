// `shoal bench`: a load generator for any Open Inference Protocol server, modelled on
// Triton's perf_analyzer (see src/loadgen/bench.h for what it does).
#pragma once

#include <CLI/CLI.hpp>

namespace shoal::cli {

void AddBenchCommand(CLI::App& app);

}  // namespace shoal::cli
