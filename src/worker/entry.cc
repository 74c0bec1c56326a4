#include "worker/entry.h"

#include <charconv>

namespace shoal::worker {
namespace {

Status BadReply(std::string_view what) {
  return InvalidArgument("unexpected redis reply: " + std::string(what));
}

StatusOr<StreamEntry> EntryFromReply(const RedisReply& r) {
  if (!r.is_array() || r.elements.size() != 2 || !r.elements[0].is_string()) {
    return BadReply("a stream entry is not [id, fields]");
  }
  StreamEntry e;
  e.id = r.elements[0].str;
  const RedisReply& fields = r.elements[1];
  if (fields.type == RedisReply::Type::kNil) return e;  // deleted; caller drops it
  if (!fields.is_array() || fields.elements.size() % 2 != 0) {
    return BadReply("the fields of entry " + e.id + " are not pairs");
  }
  for (size_t i = 0; i < fields.elements.size(); i += 2) {
    if (!fields.elements[i].is_string() || !fields.elements[i + 1].is_string()) {
      return BadReply("a field of entry " + e.id + " is not a string");
    }
    e.fields.emplace_back(fields.elements[i].str, fields.elements[i + 1].str);
  }
  return e;
}

StatusOr<std::vector<StreamEntry>> EntryList(const RedisReply& list) {
  std::vector<StreamEntry> out;
  if (list.type == RedisReply::Type::kNil) return out;
  if (!list.is_array()) return BadReply("the entries are not a list");
  for (const RedisReply& r : list.elements) {
    ASSIGN_OR_RETURN(StreamEntry e, EntryFromReply(r));
    const bool deleted = r.elements[1].type == RedisReply::Type::kNil;
    if (!deleted) out.push_back(std::move(e));
  }
  return out;
}

bool ParsePositive(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out > 0;
}

Status CheckRequestId(const std::string& id) {
  if (id.empty()) return InvalidArgument("field 'id': empty");
  if (id.size() > kMaxRequestIdBytes) {
    return InvalidArgument("field 'id': " + std::to_string(id.size()) +
                           " bytes, more than the limit of " + std::to_string(kMaxRequestIdBytes));
  }
  for (unsigned char c : id) {
    if (c <= 0x20 || c >= 0x7f) {
      return InvalidArgument("field 'id': only printable ASCII without spaces is allowed");
    }
  }
  return Status::Ok();
}

}  // namespace

const std::string* StreamEntry::Find(std::string_view name) const {
  for (const auto& [k, v] : fields) {
    if (k == name) return &v;
  }
  return nullptr;
}

StatusOr<std::vector<StreamEntry>> EntriesFromReadReply(const RedisReply& reply) {
  // Nil: BLOCK timed out with nothing new.
  if (reply.type == RedisReply::Type::kNil) return std::vector<StreamEntry>{};
  if (!reply.is_array() || reply.elements.size() != 1) {
    return BadReply("XREADGROUP did not answer one stream");
  }
  const RedisReply& stream = reply.elements[0];
  if (!stream.is_array() || stream.elements.size() != 2) {
    return BadReply("XREADGROUP's stream is not [name, entries]");
  }
  return EntryList(stream.elements[1]);
}

StatusOr<AutoClaimResult> EntriesFromAutoClaimReply(const RedisReply& reply) {
  if (!reply.is_array() || reply.elements.size() < 2 || !reply.elements[0].is_string()) {
    return BadReply("XAUTOCLAIM did not answer [cursor, entries, ...]");
  }
  AutoClaimResult out;
  out.next_cursor = reply.elements[0].str;
  ASSIGN_OR_RETURN(out.entries, EntryList(reply.elements[1]));
  return out;
}

StatusOr<int64_t> DeliveriesFromPendingReply(const RedisReply& reply) {
  if (!reply.is_array()) return BadReply("XPENDING did not answer a list");
  if (reply.elements.empty()) return NotFound("the entry is no longer pending");
  const RedisReply& e = reply.elements[0];
  if (!e.is_array() || e.elements.size() != 4 || e.elements[3].type != RedisReply::Type::kInteger) {
    return BadReply("an XPENDING row is not [id, consumer, idle, deliveries]");
  }
  return e.elements[3].integer;
}

StatusOr<GroupInfo> GroupFromInfoReply(const RedisReply& reply, std::string_view name) {
  if (!reply.is_array()) return BadReply("XINFO GROUPS did not answer a list");
  for (const RedisReply& group : reply.elements) {
    if (!group.is_array() || group.elements.size() % 2 != 0) {
      return BadReply("an XINFO GROUPS row is not key/value pairs");
    }
    GroupInfo info;
    bool named = false;
    for (size_t i = 0; i < group.elements.size(); i += 2) {
      const std::string& key = group.elements[i].str;
      const RedisReply& v = group.elements[i + 1];
      if (key == "name") named = v.is_string() && v.str == name;
      if (key == "pending" && v.type == RedisReply::Type::kInteger) info.pending = v.integer;
      if (key == "lag") info.lag = v.type == RedisReply::Type::kInteger ? v.integer : -1;
    }
    if (named) return info;
  }
  return NotFound("group '" + std::string(name) + "' is not listed");
}

StatusOr<WorkItem> ParseEntry(const StreamEntry& entry, int64_t max_payload_bytes) {
  WorkItem item;
  bool seen_id = false, seen_model = false, seen_version = false, seen_payload = false;
  for (const auto& field : entry.fields) {
    const std::string& key = field.first;
    const std::string& value = field.second;
    auto once = [&](bool* seen) -> Status {
      if (*seen) return InvalidArgument("field '" + key + "' given twice");
      *seen = true;
      return Status::Ok();
    };
    if (key == "id") {
      RETURN_IF_ERROR(once(&seen_id));
      RETURN_IF_ERROR(CheckRequestId(value));
      item.request_id = value;
    } else if (key == "model") {
      RETURN_IF_ERROR(once(&seen_model));
      if (value.empty()) return InvalidArgument("field 'model': empty");
      item.model = value;
    } else if (key == "version") {
      RETURN_IF_ERROR(once(&seen_version));
      if (!ParsePositive(value, &item.version)) {
        return InvalidArgument("field 'version': must be a positive integer; was '" +
                               value.substr(0, 32) + "'");
      }
    } else if (key == "payload") {
      RETURN_IF_ERROR(once(&seen_payload));
      if (static_cast<int64_t>(value.size()) > max_payload_bytes) {
        return InvalidArgument("field 'payload': " + std::to_string(value.size()) +
                               " bytes, more than the limit of " +
                               std::to_string(max_payload_bytes));
      }
      item.payload = value;
    } else if (key == "header_length") {
      if (item.header_length) return InvalidArgument("field 'header_length' given twice");
      item.header_length = value;  // checked by the codec, as the HTTP header is
    }
  }
  if (!seen_id) return InvalidArgument("field 'id': missing");
  if (!seen_model) return InvalidArgument("field 'model': missing");
  if (!seen_payload) return InvalidArgument("field 'payload': missing");
  if (item.payload.empty()) return InvalidArgument("field 'payload': empty");
  return item;
}

std::string UsableRequestId(const StreamEntry& entry) {
  const std::string* id = nullptr;
  for (const auto& [k, v] : entry.fields) {
    if (k != "id") continue;
    if (id != nullptr) return "";  // twice: which one is meant?
    id = &v;
  }
  if (id == nullptr || !CheckRequestId(*id).ok()) return "";
  return *id;
}

}  // namespace shoal::worker
