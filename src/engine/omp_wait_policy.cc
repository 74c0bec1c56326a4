#include "engine/omp_wait_policy.h"

#include <sys/auxv.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>

namespace shoal::engine {
namespace {

std::string Describe(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(name) + "=" + value;
}

}  // namespace

void ExecWithOmpWaitDefault(char** argv) {
  if (const char* name = std::getenv(kDefaultMarker); name != nullptr && *name != '\0') {
    // The run after the exec: the kernel named it after "/proc/self/exe" ("exe"); give
    // it its name back (ps, pgrep, top and process exporters match on it).
    std::array<char, 17> now{};
    if (prctl(PR_GET_NAME, now.data(), 0, 0, 0) == 0 && std::strcmp(now.data(), "exe") == 0) {
      prctl(PR_SET_NAME, name, 0, 0, 0);
    }
    setenv(kDefaultMarker, "1", 1);  // a process this one starts keeps its own name
    return;
  }
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  // With an affinity setting libgomp has already bound this thread to its first place,
  // and an exec would keep that mask: the engine would run on one CPU.
  for (const char* bind : {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"}) {
    if (std::getenv(bind) != nullptr) return;
  }
  // Started through the dynamic loader (ld.so shoal ...): /proc/self/exe is the loader.
  if (getauxval(AT_BASE) == 0) return;
  std::array<char, 17> name{};
  if (prctl(PR_GET_NAME, name.data(), 0, 0, 0) != 0 || name[0] == '\0') return;
  if (setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1) != 0 ||
      setenv(kDefaultMarker, name.data(), 1) != 0) {
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
