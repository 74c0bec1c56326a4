// RunBench: the whole of `shoal bench` after flag parsing. It asks the server for the
// model's metadata, builds the request payloads, runs one driver step per load level
// (driver.h), prints the table on stdout (progress and warnings on stderr) and writes
// the requested CSV, JSON and SVG files.
//
// Returns the process exit status: 0 when every step completed requests; 1 for bad
// options, an unreachable server, an unknown model, a missing --shape, unwritable output,
// or a step in which no request succeeded (the message says which).
#pragma once

#include <cstdio>

#include "loadgen/options.h"

namespace shoal::loadgen {

int RunBench(BenchOptions options, std::FILE* out, std::FILE* err);

}  // namespace shoal::loadgen
