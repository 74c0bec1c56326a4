// How long the engine's OpenMP workers spin at the end of a parallel region before they
// sleep, and shoal's default for it.
//
// oneDNN (Debian's build) runs its primitives on libgomp. By default libgomp spins
// 300,000 iterations (milliseconds) before a waiting worker sleeps. That suits a process
// that owns its cores, not a server: the HTTP and gRPC threads, the batcher and other
// processes share the cores with the workers, a worker spinning at a barrier holds a core
// that the worker it waits for needs, and a batch that runs in under a millisecond alone
// takes 20-60 ms once the cores are busy (bench/results/slo.md). The cost model then
// learns those times and admission refuses nearly every request.
//
// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded, before main
// runs. So `shoal` (and the benchmarks) call ExecWithOmpWaitDefault first thing in main:
// when the user set neither variable, it sets GOMP_SPINCOUNT and executes the program
// again, once, with the same arguments and process id.
#pragma once

#include <string>

namespace shoal::engine {

// Spins before sleeping: libgomp's own figure for more threads than CPUs ("throttled").
// At roughly 100 spins per microsecond it covers the gap between two operators of a run
// (the engine's dispatch takes under 2 us), not a wait for a descheduled thread.
inline constexpr const char* kDefaultSpinCount = "1000";

// Set beside GOMP_SPINCOUNT when shoal chose it, so the log can say whose setting it is.
inline constexpr const char* kDefaultMarker = "SHOAL_GOMP_SPINCOUNT_DEFAULT";

// When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set: sets GOMP_SPINCOUNT to
// kDefaultSpinCount (and kDefaultMarker) and replaces the process with /proc/self/exe
// run with `argv`. Returns when either variable was already set, or when the exec failed
// (the process then goes on with libgomp's default).
void ExecWithOmpWaitDefault(char** argv);

struct OmpWaitPolicy {
  bool shoal_default = false;  // GOMP_SPINCOUNT is shoal's default
  std::string description;     // for the log, e.g. "GOMP_SPINCOUNT=1000 (shoal's default)"
};

// What the environment says now (libgomp read the same values when it was loaded).
OmpWaitPolicy CurrentOmpWaitPolicy();

}  // namespace shoal::engine
