// ProcessStats: what this process costs the machine, read from /proc/self, for the
// Prometheus exporter's process_* families and the dashboard's server-wide charts.
//
// Linux only; on a system without /proc (or when a file cannot be read) `ok` is false
// and the fields keep their defaults. Safe from any thread; each call reads the files
// afresh (a few syscalls, no caching).
#pragma once

namespace shoal::server {

struct ProcessStats {
  // True when /proc/self/stat and /proc/self/statm were both read.
  bool ok = false;
  double cpu_seconds = 0;     // user + system CPU time since the process started
  double resident_bytes = 0;  // resident set size
  double virtual_bytes = 0;   // virtual memory size
  double open_fds = -1;       // open file descriptors; -1 when /proc/self/fd cannot be read
  int cpus = 0;               // CPUs the process may run on (its affinity mask); 0 unknown
};

ProcessStats ReadProcessStats();

}  // namespace shoal::server
