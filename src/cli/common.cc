#include "cli/common.h"

#include <cstdlib>
#include <filesystem>

namespace shoal::cli {

std::vector<std::string> DefaultBackendDirectories() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SHOAL_BACKEND_DIR")) dirs.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto bin = exe.parent_path();
    for (const auto& candidate : {bin / "../../backends", bin / "../lib/shoal/backends"}) {
      if (std::filesystem::is_directory(candidate, ec)) {
        dirs.push_back(std::filesystem::weakly_canonical(candidate, ec).string());
      }
    }
  }
  return dirs;
}

}  // namespace shoal::cli
