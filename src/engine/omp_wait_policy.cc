#include "engine/omp_wait_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace shoal::engine {
namespace {

std::string Describe(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(name) + "=" + value;
}

}  // namespace

void ExecWithOmpWaitDefault(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  if (setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1) != 0 || setenv(kDefaultMarker, "1", 1) != 0) {
    return;
  }
  execv("/proc/self/exe", argv);
  // Not replaced: go on as started, and say so truthfully.
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kDefaultMarker);
}

OmpWaitPolicy CurrentOmpWaitPolicy() {
  OmpWaitPolicy policy;
  const std::string spin = Describe("GOMP_SPINCOUNT");
  if (std::getenv(kDefaultMarker) != nullptr &&
      spin == std::string("GOMP_SPINCOUNT=") + kDefaultSpinCount &&
      std::getenv("OMP_WAIT_POLICY") == nullptr) {
    policy.shoal_default = true;
    policy.description = spin + " (shoal's default)";
    return policy;
  }
  std::string set = Describe("OMP_WAIT_POLICY");
  if (!spin.empty()) set += (set.empty() ? "" : ", ") + spin;
  policy.description = set.empty() ? "libgomp's default" : set + " (from the environment)";
  return policy;
}

}  // namespace shoal::engine
