// Process-wide logging settings that every layer may read without depending on the
// logging library: today the verbose level, Triton's `log_verbose_level`.
//
// Written by `shoal serve --log-verbose N` at start and by the logging extension
// (HTTP POST /v2/logging, gRPC LogSettings) at any time; read by code that logs only
// when verbose logging is on (for example a per-request line at level >= 1). Reads
// and writes are atomic and never block; a reader sees a change on its next read.
#pragma once

#include <atomic>
#include <cstdint>

namespace shoal {

// The verbose level: 0 = off (the default); >= 1 = verbose lines (per request, ...).
inline std::atomic<uint32_t>& LogVerboseLevel() {
  static std::atomic<uint32_t> level{0};
  return level;
}

inline uint32_t GetLogVerboseLevel() { return LogVerboseLevel().load(std::memory_order_relaxed); }
inline void SetLogVerboseLevel(uint32_t level) {
  LogVerboseLevel().store(level, std::memory_order_relaxed);
}

}  // namespace shoal
