// Reading a Triton-style model repository from disk:
//
//   <repo>/<model>/config.pbtxt          optional only for ONNX models (see below)
//   <repo>/<model>/<version>/model.onnx  version = positive decimal, no leading zero
//
// ScanRepository reads every model folder; ScanModel reads one (for an explicit load
// request). Both return plain values: nothing is cached and nothing is loaded, so a
// poller can call them as often as it likes and compare ModelEntry::fingerprint with the
// previous scan to decide what to reload. Thread-compatible; the only shared state is
// the file system, which may change under a scan: a model changed mid-scan gets a
// fingerprint that differs from the next scan's, so it is picked up next time.
//
// What a scan fills in before validating (model_config.h):
//   * an empty config `name` becomes the folder name; a different name is an error;
//   * with no platform and no backend, a model whose version folder holds model.onnx
//     (or the .onnx file named by default_model_filename) gets platform
//     "onnxruntime_onnx" and platform_inferred = true;
//   * with no config.pbtxt at all, the same model.onnx rule makes a config of just name
//     and platform (has_config_file = false); the backend fills in inputs and outputs
//     from the model. Without model.onnx a missing config.pbtxt is an error.
//
// Errors: ScanRepository fails only when the repository folder itself is missing
// (kNotFound) or not a readable folder (kInvalidArgument); a broken model never stops
// the others, it comes back with a non-OK ModelEntry::status.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"
#include "repository/model_config.h"
#include "repository/model_config.pb.h"

namespace shoal::repository {

// Config files above this size are rejected rather than read.
inline constexpr uintmax_t kMaxConfigFileBytes = 16u << 20;

struct ModelEntry {
  std::string name;           // the folder name
  std::filesystem::path dir;  // <repo>/<name>
  // OK when the model can be loaded: config parsed and valid, at least one version
  // selected. Otherwise says why not, naming the file.
  Status status;
  // As parsed and completed (name, inferred platform). Meaningful only when status is OK,
  // though it holds whatever could be read otherwise.
  inference::ModelConfig config;
  bool has_config_file = false;
  bool platform_inferred = false;  // platform set from model.onnx, not from the config
  // Versions selected by config.version_policy among the version folders, ascending.
  std::vector<int64_t> versions;
  // Changes when any file under dir (config.pbtxt, version folders, label and warmup
  // files) is added, removed, renamed, resized or has its mtime changed. Filled in even
  // when status is not OK, so fixing a broken model is noticed. Opaque hex text.
  std::string fingerprint;
};

// Every non-hidden folder in `repo` (following symlinks), sorted by name.
StatusOr<std::vector<ModelEntry>> ScanRepository(const std::filesystem::path& repo);

// The model in <repo>/<name>. kInvalidArgument when `name` is not a plain folder name
// (empty, hidden, ".." or containing a path separator); kNotFound when the repository
// or the model folder does not exist. A broken config is not an error here: the entry
// comes back with a non-OK status.
// `config_override` (Triton's load-time `config` parameter), when given, replaces
// config.pbtxt: it is completed (name, platform) and validated as the file would be,
// its messages naming "<dir> (config override)". The fingerprint is the folder's as usual.
StatusOr<ModelEntry> ScanModel(const std::filesystem::path& repo, const std::string& name,
                               const inference::ModelConfig* config_override = nullptr);

// The versions `policy` serves among `available` (any order, duplicates allowed),
// ascending: latest -> the num_versions highest; all -> all; specific -> those listed
// that are available. An unset policy means latest with num_versions 1.
std::vector<int64_t> SelectVersions(const inference::ModelVersionPolicy& policy,
                                    std::vector<int64_t> available);

// The numeric version folders of a model folder, ascending. Folders whose names are not
// a positive decimal without leading zeros ("0", "01", "v1") are ignored, as in Triton.
std::vector<int64_t> ListVersions(const std::filesystem::path& model_dir);

}  // namespace shoal::repository
