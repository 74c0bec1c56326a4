// `shoal run`: offline batch inference over a file (see offline_job.h).
#pragma once

#include <CLI/CLI.hpp>

namespace shoal::cli {

void AddRunCommand(CLI::App& app);

}  // namespace shoal::cli
