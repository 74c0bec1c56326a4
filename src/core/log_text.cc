#include "core/log_text.h"

#include <cstdint>
#include <cstdio>

namespace shoal {
namespace {

// The length of the valid UTF-8 sequence at text[i] and its code point; 0 if invalid.
size_t DecodeUtf8(std::string_view text, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = b(0);
  size_t n;
  uint32_t min;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, min = 0x80, *cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, min = 0x800, *cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, min = 0x10000, *cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    *cp = (*cp << 6) | (b(k) & 0x3f);
  }
  if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff)) return 0;
  return n;
}

bool Reorders(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string LogSafe(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  char buf[16];
  size_t i = 0;
  while (i < text.size() && i < max_bytes) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      if (c == '\\') out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == '\r') {
      out += "\\r", ++i;
    } else if (c == '\t') {
      out += "\\t", ++i;
    } else if (c < 0x80) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf, ++i;
    } else {
      uint32_t cp = 0;
      const size_t n = DecodeUtf8(text, i, &cp);
      if (n == 0) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", c);
        out += buf, ++i;
      } else if (i + n > max_bytes) {
        break;  // cut before a character that does not fit whole
      } else if (Reorders(cp)) {
        std::snprintf(buf, sizeof(buf), "\\u{%04x}", static_cast<unsigned>(cp));
        out += buf, i += n;
      } else {
        out.append(text.substr(i, n)), i += n;
      }
    }
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size() - i) + " more bytes)";
  return out;
}

}  // namespace shoal
