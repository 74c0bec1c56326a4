// JsonWriter: appends compact JSON to a std::string, for the front ends' replies.
//
// It writes what it is told, in order, and handles commas and string escaping; it does
// not check that objects and arrays are balanced or that keys alternate with values
// (the callers are a handful of fixed shapes, covered by tests). Numbers:
//   Int/Uint    exact decimal integers (statistics must be plain JSON integers);
//   Double      shortest round-trip form (std::to_chars); NaN and the infinities are
//               written as NaN / Infinity / -Infinity, which Python's json module and
//               the Triton Python client accept, since JSON has no spelling for them.
// Strings are written as given, with ", \ and control characters escaped; bytes >= 0x80
// are copied unchanged, so the caller must pass valid UTF-8 (ValidUtf8 checks).
//
// Not thread-safe; one writer per reply.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::proto {

class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : out_(out) {}

  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // Appends `json` as one value, unchecked (for pre-rendered fragments).
  JsonWriter& Raw(std::string_view json);

  // Convenience: Key(k) followed by the value.
  JsonWriter& Member(std::string_view key, std::string_view value) {
    return Key(key).String(value);
  }
  JsonWriter& MemberInt(std::string_view key, int64_t value) { return Key(key).Int(value); }
  JsonWriter& MemberUint(std::string_view key, uint64_t value) { return Key(key).Uint(value); }
  JsonWriter& MemberBool(std::string_view key, bool value) { return Key(key).Bool(value); }

 private:
  void Separate();

  std::string* out_;
  // One entry per open container: true until its first element is written.
  std::vector<bool> first_;
  bool after_key_ = false;
};

// Appends `s` as a quoted, escaped JSON string.
void AppendJsonString(std::string* out, std::string_view s);
// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool ValidUtf8(std::string_view s);
// {"error":"<message>"}
std::string JsonError(std::string_view message);

}  // namespace shoal::proto
