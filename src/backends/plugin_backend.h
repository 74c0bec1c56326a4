// PluginBackend: a Backend whose code lives in a shared library (libshoal_<name>.so) that
// implements the C ABI of include/shoal/backend_api.h, so users can add a backend without
// rebuilding shoal. Use BackendRegistry::Find to locate plugins by name; use Open directly
// only when you already have the library's path.
//
// Loading. Open dlopens the library (RTLD_NOW | RTLD_LOCAL), checks that it exports
// shoal_backend_api_version and that the major version it reports is
// SHOAL_BACKEND_API_VERSION, then resolves the other five functions. Any minor version
// loads, older or newer than the server's (see "Versioning" in backend_api.h): every
// struct handed to the plugin carries its struct_size, so the plugin can tell which fields
// this server fills. Errors:
//   kNotFound            the file does not exist
//   kFailedPrecondition  dlopen failed (the message carries dlerror()), a function is
//                        missing (named), or the major version differs (both versions
//                        named as major.minor)
//
// Lifetime. The library stays open while anything made from it lives: the backend, every
// model it loaded and every instance of those (each holds a shared reference), so the
// runtime's destruction order (instances, then model, then backend) is not needed for
// safety. An instance also keeps its model's plugin state alive. Output tensors are
// allocated by shoal (Buffer::Allocate) and never point into the library.
//
// Threading. The Backend threading contract (backend.h) is forwarded to the plugin as is:
// PluginBackend adds no locks and no threads. Open and LoadModel may run concurrently.
//
// Errors from the plugin. A non-zero return becomes a Status with the plugin's code
// (INTERNAL when the code is 0 or unknown) and message "plugin '<name>': <message>".
// An exception escaping a plugin function becomes INTERNAL. Outputs are validated (known
// datatype, byte size consistent with the shape for fixed-size types, well-formed BYTES,
// first dimension = batch size for batching models, no duplicates, every requested output
// produced); a violation is INTERNAL naming the plugin and the output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "core/status.h"

namespace shoal::backends {

namespace internal {
struct PluginLibrary;
}  // namespace internal

class PluginBackend final : public Backend {
 public:
  // Largest output one execution may allocate through the callback (64 GiB): a guard
  // against a plugin passing garbage sizes, not a memory policy.
  static constexpr uint64_t kMaxOutputBytes = uint64_t{1} << 36;

  // Opens the plugin at `library_path` and names the backend `name`.
  static StatusOr<std::shared_ptr<Backend>> Open(const std::string& name,
                                                 const std::string& library_path);

  std::string name() const override;
  const std::string& library_path() const;
  // The minor backend API version the plugin was built against; 0 for plugins that
  // predate minor versions.
  uint32_t api_minor_version() const;
  StatusOr<std::unique_ptr<BackendModel>> LoadModel(const ModelInfo& info) override;

 private:
  explicit PluginBackend(std::shared_ptr<const internal::PluginLibrary> library);

  std::shared_ptr<const internal::PluginLibrary> library_;
};

}  // namespace shoal::backends
