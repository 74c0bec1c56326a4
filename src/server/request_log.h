// The request log: one line per inference request at the verbose level, and an error
// line for every request answered with an internal error (HTTP 500 / gRPC INTERNAL).
//
// The verbose level is Triton's `log_verbose_level`, one per process, held in
// core/log_settings.h (the logging extension reads it there); these wrap it:
//   LogVerboseLevel()      0: no per-request lines; >= 1: one debug line per request.
//   SetLogVerboseLevel(n)  sets it and spdlog's level (debug when n > 0, else info). Called
//                          at start from `shoal serve --log-verbose N`; a run-time setting
//                          (Triton's /v2/logging `log_verbose_level`) calls it too.
//
// Lines (model names, ids and error texts come from clients and pass through LogSafe):
//   debug  request model 'm' version 1 id 'x' over HTTP: OK; queue 12 us, compute 40 us,
//          total 80 us
//   error  internal error answering a HTTP request for model 'm' version 1: <message>
// The error line is written whatever the verbose level.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace shoal::server {

int LogVerboseLevel();
void SetLogVerboseLevel(int level);

// What the request log says about one answered inference request.
struct RequestLogEntry {
  std::string_view protocol;  // "HTTP", "gRPC", "gRPC stream"
  std::string_view model;     // as the client named it
  int64_t version = 0;        // the version that answered; <= 0: none or unknown
  std::string_view id;        // the client's request id; empty: none
  Status status;              // what the client was answered
  int64_t queue_ns = 0;       // runtime::InferResponse's queue_ns and compute_ns
  int64_t compute_ns = 0;
  int64_t total_ns = 0;  // from the front end's start of handling to the answer
};

// Logs `entry` as the header says: the debug line when LogVerboseLevel() >= 1, the error
// line when its status maps to HTTP 500.
void LogRequest(const RequestLogEntry& entry);

// The error line alone, for answers other than inference (model metadata, config,
// statistics): logs when `status` maps to HTTP 500. `model` may be empty.
void LogInternalError(std::string_view protocol, std::string_view model, const Status& status);

// Monotonic nanoseconds, for RequestLogEntry::total_ns.
int64_t RequestLogNowNs();

}  // namespace shoal::server
