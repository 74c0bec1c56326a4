#include "repository/repository.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

namespace shoal::repository {
namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFileName = "config.pbtxt";
constexpr std::string_view kDefaultOnnxFile = "model.onnx";
// Bounds on the fingerprint walk, so a symlink loop or a huge folder cannot stall a scan.
constexpr int kMaxFingerprintDepth = 8;
constexpr size_t kMaxFingerprintEntries = 100000;

bool IsHidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// Positive decimal without a leading zero that fits int64; nullopt otherwise.
std::optional<int64_t> ParseVersion(const std::string& name) {
  if (name.empty() || name.size() > 18 || name[0] == '0') return std::nullopt;
  if (!std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  int64_t version = 0;
  const char* end = name.data() + name.size();
  const auto [ptr, ec] = std::from_chars(name.data(), end, version);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return version;
}

// FNV-1a, 64 bit: stable across runs and builds, unlike std::hash.
class Fnv1a {
 public:
  void Add(std::string_view bytes) {
    for (unsigned char c : bytes) {
      hash_ ^= c;
      hash_ *= 1099511628211ull;
    }
    hash_ ^= 0xff;  // field separator, so ("ab","c") and ("a","bc") differ
    hash_ *= 1099511628211ull;
  }
  void Add(uint64_t value) { Add(std::string_view(reinterpret_cast<const char*>(&value), 8)); }
  std::string Hex() const {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 0; i < 16; ++i) out[15 - i] = kDigits[(hash_ >> (4 * i)) & 0xf];
    return out;
  }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

// Names, kinds, sizes and mtimes of everything under `dir` except hidden entries.
std::string Fingerprint(const fs::path& dir) {
  struct Record {
    std::string relative;
    uint64_t size;
    int64_t mtime;
    bool is_dir;
    bool operator<(const Record& o) const { return relative < o.relative; }
  };
  std::vector<Record> records;
  bool truncated = false;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir,
                                      fs::directory_options::follow_directory_symlink |
                                          fs::directory_options::skip_permission_denied,
                                      ec);
  const fs::recursive_directory_iterator end;
  for (; !ec && it != end; it.increment(ec)) {
    if (records.size() >= kMaxFingerprintEntries) {
      truncated = true;
      break;
    }
    const fs::directory_entry& entry = *it;
    if (IsHidden(entry.path())) {
      it.disable_recursion_pending();
      continue;
    }
    if (it.depth() >= kMaxFingerprintDepth) it.disable_recursion_pending();
    std::error_code entry_ec;
    const bool is_dir = entry.is_directory(entry_ec);
    uint64_t size = 0;
    int64_t mtime = 0;
    if (!is_dir) {
      const uintmax_t file_size = entry.file_size(entry_ec);
      size = entry_ec ? 0 : static_cast<uint64_t>(file_size);
      const auto time = fs::last_write_time(entry.path(), entry_ec);
      mtime = entry_ec ? 0 : static_cast<int64_t>(time.time_since_epoch().count());
    }
    records.push_back({entry.path().lexically_relative(dir).generic_string(), size, mtime, is_dir});
  }
  std::sort(records.begin(), records.end());
  Fnv1a hash;
  for (const Record& r : records) {
    hash.Add(r.relative);
    hash.Add(r.is_dir ? uint64_t{1} : uint64_t{0});
    hash.Add(r.size);
    hash.Add(static_cast<uint64_t>(r.mtime));
  }
  if (ec) hash.Add(std::string_view("walk-error"));
  if (truncated) hash.Add(std::string_view("truncated"));
  return hash.Hex();
}

StatusOr<std::string> ReadConfigFile(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return InvalidArgument(path.string() + ": cannot read: " + ec.message());
  if (size > kMaxConfigFileBytes) {
    return InvalidArgument(path.string() + ": config file must be at most " +
                           std::to_string(kMaxConfigFileBytes) + " bytes; was " +
                           std::to_string(size));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(path.string() + ": cannot open: " + std::strerror(errno));
  std::string text;
  text.reserve(static_cast<size_t>(size));
  text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) return InvalidArgument(path.string() + ": read failed");
  if (text.size() > kMaxConfigFileBytes) {  // grew while we read it
    return InvalidArgument(path.string() + ": config file must be at most " +
                           std::to_string(kMaxConfigFileBytes) + " bytes");
  }
  return text;
}

// The ONNX file a version folder must hold for the platform to be inferred:
// default_model_filename when it names an .onnx file, else model.onnx.
std::string OnnxFileName(const inference::ModelConfig& config) {
  const std::string& name = config.default_model_filename();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".onnx") == 0) return name;
  return std::string(kDefaultOnnxFile);
}

bool AnyVersionHolds(const fs::path& dir, const std::vector<int64_t>& versions,
                     const std::string& file) {
  for (int64_t version : versions) {
    std::error_code ec;
    if (fs::exists(dir / std::to_string(version) / file, ec)) return true;
  }
  return false;
}

std::string VersionList(const std::vector<int64_t>& versions) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < versions.size(); ++i) out << (i ? ", " : "") << versions[i];
  out << ']';
  return out.str();
}

// Fills entry.config, has_config_file and platform_inferred; returns the config's status.
// With an override, uses it in place of config.pbtxt.
Status LoadConfig(const std::vector<int64_t>& available, ModelEntry& entry,
                  const inference::ModelConfig* config_override) {
  const fs::path config_path = entry.dir / kConfigFileName;
  const std::string shown =
      config_override != nullptr ? entry.dir.string() + " (config override)" : config_path.string();
  std::error_code ec;
  const fs::file_status file = fs::status(config_path, ec);
  if (config_override != nullptr) {
    entry.config = *config_override;
    entry.has_config_file = true;
  } else if (fs::exists(file)) {
    if (!fs::is_regular_file(file)) return InvalidArgument(shown + ": must be a regular file");
    ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(config_path));
    ASSIGN_OR_RETURN(entry.config, ParseModelConfig(text, shown));
    entry.has_config_file = true;
  } else {
    if (!AnyVersionHolds(entry.dir, available, std::string(kDefaultOnnxFile))) {
      return InvalidArgument(shown +
                             ": missing; a model without config.pbtxt needs a version "
                             "folder holding model.onnx (versions found: " +
                             VersionList(available) + ")");
    }
    entry.config.set_name(entry.name);
    entry.config.set_platform(std::string(kOnnxPlatform));
    entry.platform_inferred = true;
    return Status::Ok();
  }

  if (entry.config.name().empty()) {
    entry.config.set_name(entry.name);
  } else if (entry.config.name() != entry.name) {
    return InvalidArgument(shown + ": name must match the model folder \"" + entry.name +
                           "\" (or be left out); was \"" + entry.config.name() + "\"");
  }
  if (entry.config.platform().empty() && entry.config.backend().empty() &&
      !entry.config.has_ensemble_scheduling() &&
      AnyVersionHolds(entry.dir, available, OnnxFileName(entry.config))) {
    entry.config.set_platform(std::string(kOnnxPlatform));
    entry.platform_inferred = true;
  }
  return ValidateModelConfig(entry.config, shown);
}

Status SelectEntryVersions(const std::vector<int64_t>& available, ModelEntry& entry) {
  const auto& policy = entry.config.version_policy();
  entry.versions = SelectVersions(policy, available);
  const std::string shown = entry.dir.string();
  if (policy.has_specific()) {
    std::vector<int64_t> missing;
    for (int64_t version : policy.specific().versions()) {
      if (!std::binary_search(available.begin(), available.end(), version)) {
        missing.push_back(version);
      }
    }
    if (!missing.empty()) {
      return InvalidArgument(shown +
                             ": version_policy.specific.versions lists versions with no "
                             "version folder: " +
                             VersionList(missing) + " (found " + VersionList(available) + ")");
    }
  }
  if (entry.versions.empty()) {
    return InvalidArgument(shown +
                           ": no version to serve; a model needs a version folder "
                           "named by a positive number (e.g. " +
                           shown + "/1); found " + VersionList(available));
  }
  return Status::Ok();
}

ModelEntry ScanModelDir(const fs::path& dir, const std::string& name,
                        const inference::ModelConfig* config_override = nullptr) {
  ModelEntry entry;
  entry.name = name;
  entry.dir = dir;
  entry.fingerprint = Fingerprint(dir);
  const std::vector<int64_t> available = ListVersions(dir);
  entry.status = LoadConfig(available, entry, config_override);
  if (entry.status.ok()) entry.status = SelectEntryVersions(available, entry);
  return entry;
}

Status CheckRepository(const fs::path& repo) {
  std::error_code ec;
  const fs::file_status status = fs::status(repo, ec);
  if (!fs::exists(status)) {
    return NotFound("model repository " + repo.string() + " does not exist");
  }
  if (!fs::is_directory(status)) {
    return InvalidArgument("model repository " + repo.string() + " is not a folder");
  }
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> ListVersions(const fs::path& model_dir) {
  std::vector<int64_t> versions;
  std::error_code ec;
  fs::directory_iterator it(model_dir, ec);
  const fs::directory_iterator end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    if (!it->is_directory(entry_ec)) continue;
    if (auto version = ParseVersion(it->path().filename().string())) {
      versions.push_back(*version);
    }
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

std::vector<int64_t> SelectVersions(const inference::ModelVersionPolicy& policy,
                                    std::vector<int64_t> available) {
  std::sort(available.begin(), available.end());
  available.erase(std::unique(available.begin(), available.end()), available.end());
  switch (policy.policy_choice_case()) {
    case inference::ModelVersionPolicy::kAll:
      return available;
    case inference::ModelVersionPolicy::kSpecific: {
      const std::set<int64_t> wanted(policy.specific().versions().begin(),
                                     policy.specific().versions().end());
      std::vector<int64_t> selected;
      for (int64_t version : available) {
        if (wanted.count(version) != 0) selected.push_back(version);
      }
      return selected;
    }
    case inference::ModelVersionPolicy::kLatest:
    case inference::ModelVersionPolicy::POLICY_CHOICE_NOT_SET: {
      const size_t count =
          policy.has_latest() ? static_cast<size_t>(policy.latest().num_versions()) : 1;
      if (available.size() > count) {
        available.erase(available.begin(), available.end() - static_cast<ptrdiff_t>(count));
      }
      return available;
    }
  }
  return {};
}

StatusOr<std::vector<ModelEntry>> ScanRepository(const fs::path& repo) {
  RETURN_IF_ERROR(CheckRepository(repo));
  std::error_code ec;
  fs::directory_iterator it(repo, ec);
  if (ec) {
    return InvalidArgument("model repository " + repo.string() +
                           " cannot be read: " + ec.message());
  }
  std::vector<std::string> names;
  const fs::directory_iterator end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    if (IsHidden(it->path()) || !it->is_directory(entry_ec)) continue;
    names.push_back(it->path().filename().string());
  }
  if (ec) {
    return InvalidArgument("model repository " + repo.string() +
                           " cannot be read: " + ec.message());
  }
  std::sort(names.begin(), names.end());
  std::vector<ModelEntry> entries;
  entries.reserve(names.size());
  for (const std::string& name : names) entries.push_back(ScanModelDir(repo / name, name));
  return entries;
}

StatusOr<ModelEntry> ScanModel(const fs::path& repo, const std::string& name,
                               const inference::ModelConfig* config_override) {
  if (name.empty() || name[0] == '.' ||
      name.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
    return InvalidArgument(
        "model name must be a plain folder name (not empty, not hidden, no "
        "path separators); was \"" +
        name + "\"");
  }
  RETURN_IF_ERROR(CheckRepository(repo));
  const fs::path dir = repo / name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return NotFound("model \"" + name + "\" has no folder " + dir.string());
  }
  return ScanModelDir(dir, name, config_override);
}

}  // namespace shoal::repository
