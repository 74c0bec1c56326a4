#include "server/process_stats.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace shoal::server {

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (stat && std::getline(stat, line)) {
    const size_t close = line.rfind(')');
    if (close != std::string::npos) {
      std::istringstream rest(line.substr(close + 1));
      std::string field;
      double utime = 0, stime = 0;
      for (int i = 0; i < 13 && rest >> field; ++i) {
        // After the command name: state(0) ppid(1) ... utime(11) stime(12).
        if (i == 11) utime = std::strtod(field.c_str(), nullptr);
        if (i == 12) stime = std::strtod(field.c_str(), nullptr);
      }
      if (ticks > 0) p.cpu_seconds = (utime + stime) / static_cast<double>(ticks);
      p.ok = true;
    }
  }
  std::ifstream statm("/proc/self/statm");
  double size_pages = 0, resident_pages = 0;
  if (statm >> size_pages >> resident_pages) {
    p.virtual_bytes = size_pages * static_cast<double>(page);
    p.resident_bytes = resident_pages * static_cast<double>(page);
  } else {
    p.ok = false;
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
    p.open_fds = n - 1;  // not counting the directory stream itself
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) p.cpus = CPU_COUNT(&set);
  return p;
}

}  // namespace shoal::server
