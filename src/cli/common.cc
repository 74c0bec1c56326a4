#include "cli/common.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>

#ifdef SHOAL_HAVE_ONNX
#include "backends/onnx/onnx_backend.h"
#endif

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

void SetUpBackends(const std::vector<std::string>& backend_directories,
                   runtime::ServerOptions* options) {
  options->registry = std::make_shared<backends::BackendRegistry>();
#ifdef SHOAL_HAVE_ONNX
  backends::RegisterOnnxBackend(options->registry.get());
#endif
  options->backend_directories =
      backend_directories.empty() ? DefaultBackendDirectories() : backend_directories;
}

void LogServiceListening(std::string_view name, const std::string& address, int port) {
  spdlog::info("{} service listening on {}:{}", name, address, port);
}

void LogServiceFailed(std::string_view name, const std::string& address, int port,
                      const Status& status) {
  spdlog::critical("cannot start the {} server on {}:{}: {}", name, address, port,
                   status.message());
}

}  // namespace shoal::cli
