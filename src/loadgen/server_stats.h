// ServerStats: the cumulative counters of one model from the server's statistics
// endpoint (GET /v2/models/{m}/stats, or the gRPC ModelStatistics RPC). The driver takes
// one at each measurement-window boundary; the difference of two divided by its counts
// gives the server-side queue and compute time per request over those windows.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace shoal::loadgen {

struct DurationStat {
  uint64_t count = 0;
  uint64_t ns = 0;
  // Mean microseconds per count (0 when none).
  double MeanUs() const { return count == 0 ? 0.0 : static_cast<double>(ns) / count / 1000.0; }
};

struct ServerStats {
  uint64_t inference_count = 0;  // batch elements executed
  uint64_t execution_count = 0;  // backend executions
  DurationStat success;
  DurationStat queue;
  DurationStat compute_input;
  DurationStat compute_infer;
  DurationStat compute_output;
};

// after - before, field by field (counters that went backwards, e.g. after a model
// reload, give 0).
ServerStats Subtract(const ServerStats& after, const ServerStats& before);

// Parses the HTTP statistics body {"model_stats":[...]}, adding up every version listed.
StatusOr<ServerStats> ParseHttpStats(std::string_view json);

}  // namespace shoal::loadgen
