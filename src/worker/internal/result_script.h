// The Lua script that stores a result and acknowledges its entry (worker.h). Shared by
// the worker's writer and its tests, which run it against a real Redis.
#pragma once

namespace shoal::worker::internal {

// Stores a result only if its request id has none, appends it to the result stream only
// then, dead-letters the entry when asked (unless the request was answered already), and
// acknowledges it: one atomic step (Worker's class comment).
//   KEYS: result hash, result stream, request stream, dead-letter stream
//   ARGV: group, entry id, request id ("" = none), status, error, body, header_length,
//         ttl s, dead reason ("" = not dead), result stream maxlen, deliveries, consumer,
//         then the entry's own fields and values (copied into the dead letter)
// Returns 1 when the result was stored, else 0.
inline constexpr char kResultScript[] = R"lua(
local written = 0
local rid = ARGV[3]
if rid ~= '' and redis.call('EXISTS', KEYS[1]) == 0 then
  local h = {'status', ARGV[4], 'body', ARGV[6]}
  if ARGV[5] ~= '' then h[#h + 1] = 'error'; h[#h + 1] = ARGV[5] end
  if ARGV[7] ~= '' then h[#h + 1] = 'header_length'; h[#h + 1] = ARGV[7] end
  redis.call('HSET', KEYS[1], unpack(h))
  if tonumber(ARGV[8]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[8]) end
  if tonumber(ARGV[10]) > 0 then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[10], '*', 'id', rid, 'status', ARGV[4])
  else
    redis.call('XADD', KEYS[2], '*', 'id', rid, 'status', ARGV[4])
  end
  written = 1
end
if ARGV[9] ~= '' and (rid == '' or written == 1) then
  local d = {'dead_reason', ARGV[9], 'dead_entry_id', ARGV[2], 'dead_deliveries', ARGV[11],
             'dead_consumer', ARGV[12]}
  for i = 13, #ARGV do d[#d + 1] = ARGV[i] end
  redis.call('XADD', KEYS[4], '*', unpack(d))
end
redis.call('XACK', KEYS[3], ARGV[1], ARGV[2])
return written
)lua";

}  // namespace shoal::worker::internal
