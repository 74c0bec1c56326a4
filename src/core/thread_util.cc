#include "core/thread_util.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

namespace shoal {

Status PinCurrentThread(const std::vector<int>& cores) {
  if (cores.empty()) return Status::Ok();
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores) {
    if (core < 0 || core >= configured || core >= CPU_SETSIZE) {
      return InvalidArgument("cpu core " + std::to_string(core) +
                             " does not exist (this machine has " + std::to_string(configured) +
                             ")");
    }
    CPU_SET(core, &set);
  }
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) return Internal("pthread_setaffinity_np failed with error " + std::to_string(rc));
  return Status::Ok();
}

void NameCurrentThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

int AvailableCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

}  // namespace shoal
