// HTTP endpoints of Triton's shared-memory, logging and trace extensions (the state
// behind them is protocol_settings.h and shared_memory.h; gRPC answers the same from
// grpc_extensions.cc):
//
//   GET  /v2/systemsharedmemory[/region/{r}]/status     [{"name","key","offset","byte_size"}]
//   POST /v2/systemsharedmemory/region/{r}/register     {"key","offset","byte_size"}
//   POST /v2/systemsharedmemory[/region/{r}]/unregister (no region: every region)
//   GET  /v2/cudasharedmemory[/region/{r}]/status       [] (no region can exist)
//   POST /v2/cudasharedmemory/region/{r}/register       400: no GPU
//   POST /v2/cudasharedmemory[/region/{r}]/unregister   200 (nothing to do)
//   GET  /v2/logging, POST /v2/logging                  the settings (after the update)
//   GET  /v2/trace/setting, POST /v2/trace/setting      the settings (after the update)
//   GET|POST /v2/models/{m}/trace/setting               the same for one model
//
// Internal to the HTTP front end: HttpRoutes asks HandleExtension first. Everything here
// is quick (a shm_open + mmap at most) and runs on the loop thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/http_message.h"
#include "runtime/server.h"
#include "server/protocol_settings.h"

namespace shoal::server::internal {

// The answer when `segments` (the percent-decoded path) is one of the endpoints above,
// else nullopt. A wrong method is 405 with Allow.
std::optional<proto::HttpResponse> HandleExtension(const std::vector<std::string>& segments,
                                                   std::string_view method, std::string_view body,
                                                   const runtime::Server& server,
                                                   ExtensionState& state);

}  // namespace shoal::server::internal
