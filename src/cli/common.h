// Helpers shared by the `shoal` subcommands.
#pragma once

#include <string>
#include <vector>

namespace shoal::cli {

// Plugin folders to search when none are given: $SHOAL_BACKEND_DIR, then the build
// tree's <build>/backends (the binary is <build>/src/cli/shoal), then an installed
// <prefix>/lib/shoal/backends.
std::vector<std::string> DefaultBackendDirectories();

}  // namespace shoal::cli
