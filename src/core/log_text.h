// LogSafe: untrusted text made safe to write into a log line.
//
// Model names (from load/unload requests), request ids, HTTP headers, status messages
// that quote them and exception texts come from clients. Written raw, a newline forges a
// log line, an ANSI escape rewrites the terminal, and a bidi override hides what a line
// says. Every log call that includes such text passes it through LogSafe.
//
// Escapes: backslash as \\, \n \r \t, other ASCII controls and DEL as \xNN, bytes that
// are not valid UTF-8 as \xNN, and the Unicode controls that reorder or break lines
// (C1 controls U+0080..U+009F, U+2028, U+2029, bidi embeddings and isolates
// U+202A..U+202E, U+2066..U+2069) as \u{XXXX}. Printable ASCII and other valid UTF-8
// pass through. Text longer than `max_bytes` is cut there (at a character boundary) and
// ends with "...(N more bytes)".
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace shoal {

inline constexpr size_t kLogSafeDefaultMaxBytes = 1024;

std::string LogSafe(std::string_view text, size_t max_bytes = kLogSafeDefaultMaxBytes);

}  // namespace shoal
