// Stream entries of the queue worker: reading them out of Redis replies and checking the
// fields of an inference request. Pure functions, tested without a server.
//
// A request is one entry of the request stream with these fields (docs/worker.md):
//   id             request id, 1..kMaxRequestIdBytes printable ASCII bytes, no spaces;
//                  names the result (<result-prefix><id>)                    required
//   model          model name                                                required
//   version        model version, a positive integer (default: latest ready)
//   payload        the KServe v2 infer request body: JSON, or JSON followed by
//                  binary tensor data (Triton's binary extension)           required
//   header_length  with binary data: the length of the JSON part (the HTTP header
//                  Inference-Header-Content-Length)
// Other fields are ignored, so producers may add their own (trace ids, ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "worker/redis_client.h"

namespace shoal::worker {

inline constexpr size_t kMaxRequestIdBytes = 200;

struct StreamEntry {
  std::string id;  // the stream entry id, "1700000000000-0"
  std::vector<std::pair<std::string, std::string>> fields;
  // Times Redis delivered it to a consumer, this delivery included (1: first read).
  int64_t deliveries = 1;

  // The value of the first field named `name`, or null.
  const std::string* Find(std::string_view name) const;
};

// The entries of one stream in an XREADGROUP reply ([[stream, [[id, [f, v, ...]], ...]]]),
// or of an XAUTOCLAIM reply ([cursor, [[id, [f, v, ...]], ...], [deleted ids]]). An
// entry whose fields are nil (deleted from the stream while pending) is left out.
// INVALID_ARGUMENT when the reply does not have that shape.
StatusOr<std::vector<StreamEntry>> EntriesFromReadReply(const RedisReply& reply);
struct AutoClaimResult {
  std::string next_cursor;  // "0-0": the scan of the pending list wrapped around
  std::vector<StreamEntry> entries;
};
StatusOr<AutoClaimResult> EntriesFromAutoClaimReply(const RedisReply& reply);

// The delivery count in the reply of `XPENDING key group id id 1` ([[id, consumer, idle,
// deliveries]]); NOT_FOUND when the entry is no longer pending.
StatusOr<int64_t> DeliveriesFromPendingReply(const RedisReply& reply);

// `name` of the group in an XINFO GROUPS reply: its pending count and lag (Redis 7; -1
// when the server cannot tell). NOT_FOUND when the group is not listed.
struct GroupInfo {
  int64_t pending = 0;
  int64_t lag = -1;
};
StatusOr<GroupInfo> GroupFromInfoReply(const RedisReply& reply, std::string_view name);

struct WorkItem {
  std::string request_id;
  std::string model;
  int64_t version = -1;
  std::string payload;
  std::optional<std::string> header_length;
};

// The request in `entry`. INVALID_ARGUMENT naming the field when a required one is
// missing or empty, a value is malformed, a known field is given twice, or the payload
// is over `max_payload_bytes`.
StatusOr<WorkItem> ParseEntry(const StreamEntry& entry, int64_t max_payload_bytes);

// The request id of `entry` if it is a valid one (to answer a malformed request whose id
// is still usable), else "".
std::string UsableRequestId(const StreamEntry& entry);

}  // namespace shoal::worker
